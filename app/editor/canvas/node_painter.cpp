#include "canvas/node_painter.h"

#include <algorithm>

#include <QPainter>
#include <QStyleOptionGraphicsItem>

#include "canvas/graph_scene.h"
#include "canvas/node_item.h"
#include "canvas/wire_item.h"
#include "style.h"

namespace gn::editor {

namespace {

QColor borderOf(const NodeItem& node) {
  if (node.geometry().hasError()) return style::kError;
  if (node.isSelected()) return style::kSelection;
  if (node.hasWarnings()) return style::kWarning;
  return style::kNodeOutline;
}

// A port's colour, faded when the wire being dragged cannot go there.
QColor portColorOf(const NodeItem& node, bool output, int index, bool dimmed) {
  const core::PortSpec& port = output ? node.outputs()[index] : node.inputs()[index];
  QColor color = style::portColor(port.type);
  if (dimmed) color.setAlpha(style::kDimmedPortAlpha);
  return color;
}

}  // namespace

void NodePainter::paint(QPainter* p, const QStyleOptionGraphicsItem* option, const NodeItem& node) {
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  const NodeGeometry& g = node.geometry();
  const bool selected = node.isSelected(), hasErrors = g.hasError();
  const QColor statusColor = style::statusColor(runStatusName(node.runStatus()));
  const qreal width = g.body().width();

  if (lod < kLodSimple) {
    p->setRenderHint(QPainter::Antialiasing, false);
    p->setPen(selected || hasErrors ? QPen(borderOf(node), 0) : Qt::NoPen);
    p->setBrush(style::kNodeBody);
    p->drawRect(g.body());
    p->fillRect(QRectF(0, 0, width, kNodeHeader), node.headerColor());
    if (node.runStatus() != RunStatus::Idle) p->fillRect(QRectF(width - 40, 0, 40, kNodeHeader), statusColor);
    paintOverviewLabel(p, node, lod);
    return;
  }
  if (lod < kLodNoDetail) {
    // Zoomed out: boxes and port dots. Text under ~6 px is unreadable, and antialiasing costs more than it
    // shows here.
    paintBox(p, node);
    if (node.runStatus() != RunStatus::Idle)
      p->fillRect(QRectF(width - 40, 4, 34, kNodeHeader - 8), statusColor);
    for (int out = 0; out < 2 && !g.collapsed(); ++out) {
      const int count = int(out ? node.outputs().size() : node.inputs().size());
      for (int i = 0; i < count; ++i)
        p->fillRect(QRectF(g.portPos(out, i) - QPointF(kPortRadius, kPortRadius),
                           QSizeF(2 * kPortRadius, 2 * kPortRadius)),
                    portColorOf(node, out, i, node.graphScene()->portDimmed(&node, out, i)));
    }
    if (hasErrors && !g.collapsed()) p->fillRect(g.errorStripRect(), style::kErrorStrip);
    paintOverviewLabel(p, node, lod);
    return;
  }
  p->setRenderHint(QPainter::Antialiasing, true);
  p->setPen(QPen(borderOf(node), selected || hasErrors ? 2 : 1));
  p->setBrush(style::kNodeBody);
  p->drawPath(g.bodyPath());
  p->setPen(Qt::NoPen);
  p->setBrush(node.ports().missing || node.muted() ? style::kNodeHeaderInactive : node.headerColor());
  p->drawPath(g.headerPath());
  paintHeader(p, node);
  // Collapsed: the title bar is all there is; the wires meet its ends.
  if (g.collapsed()) return;
  paintPorts(p, node);
  paintSummary(p, node);
  if (!node.preview().empty()) node.preview().paint(p, g.previewRect());
  paintRunMarks(p, node, hasErrors);
}

void NodePainter::paintBox(QPainter* p, const NodeItem& node) {
  const NodeGeometry& g = node.geometry();
  p->setRenderHint(QPainter::Antialiasing, false);
  p->setPen(QPen(borderOf(node), 0));
  p->setBrush(style::kNodeBody);
  p->drawRect(g.body());
  p->fillRect(QRectF(0, 0, g.body().width(), kNodeHeader),
              node.ports().missing ? style::kNodeHeaderInactive : node.headerColor());
}

void NodePainter::paintOverviewLabel(QPainter* p, const NodeItem& node, qreal lod) {
  // Further out a canvas shows hundreds of nodes and a label each would be noise (and cost).
  constexpr qreal kLodNoLabel = 0.15, kLabelPixels = 11;
  const NodeGeometry& g = node.geometry();
  if (lod < kLodNoLabel || g.collapsed()) return;
  const QRectF area = g.body().adjusted(4, kNodeHeader, -4, 0);
  if (area.height() <= 0 || area.width() <= 0) return;
  QFont font = canvasFonts().title;
  font.setPixelSize(std::max(1, int(std::min(kLabelPixels / lod, area.height() * 0.8))));
  p->setFont(font);
  p->setPen(style::kNodeText);
  const QString text = QFontMetricsF(font).elidedText(node.id(), Qt::ElideMiddle, area.width());
  p->drawText(area, Qt::AlignCenter, text);
}

void NodePainter::paintHeader(QPainter* p, const NodeItem& node) {
  const NodeGeometry& g = node.geometry();
  const CanvasFonts& f = canvasFonts();
  // The collapse toggle: a triangle pointing down (open) or right (collapsed), as in a tree.
  const QPointF c = g.collapseToggleRect().center();
  QPolygonF tri;
  if (g.collapsed())
    tri << c + QPointF(-2.5, -4) << c + QPointF(3.5, 0) << c + QPointF(-2.5, 4);
  else
    tri << c + QPointF(-4, -2.5) << c + QPointF(4, -2.5) << c + QPointF(0, 3.5);
  p->setPen(Qt::NoPen);
  p->setBrush(style::kNodeToggle);
  p->drawPolygon(tri);

  const bool clip = !g.headerTextClip().isNull();
  if (clip) {
    p->save();  // the view's own clip (the exposed area) comes back with restore
    p->setClipRect(g.headerTextClip(), Qt::IntersectClip);
  }
  if (!g.titleRect().isNull()) {
    p->setFont(f.title);
    p->setPen(style::kNodeText);
    p->drawStaticText(g.titleRect().topLeft(), g.title());
  }
  p->setFont(f.small);
  p->setPen(style::kNodeIdText);
  p->drawStaticText(g.idRect().topLeft(), g.idText());
  if (clip) p->restore();

  if (!g.badge().isEmpty()) {
    const QRectF r = g.badgeRect();
    p->setPen(Qt::NoPen);
    p->setBrush(style::statusColor(runStatusName(node.runStatus())));
    p->drawRoundedRect(r, 7, 7);
    p->setPen(style::kBadgeText);
    p->drawText(r, Qt::AlignCenter, g.badge());
  }
}

void NodePainter::paintPorts(QPainter* p, const NodeItem& node) {
  const NodeGeometry& g = node.geometry();
  const CanvasFonts& f = canvasFonts();
  const GraphScene::WireDrag& drag = node.graphScene()->wireDrag();
  for (int out = 0; out < 2; ++out) {
    const QList<core::PortSpec>& ports = out ? node.outputs() : node.inputs();
    const QList<QStaticText>& labels = out ? g.outputLabels() : g.inputLabels();
    for (int i = 0; i < ports.size(); ++i) {
      const QPointF c = g.portPos(out, i);
      const bool dimmed = node.graphScene()->portDimmed(&node, out, i);
      const QColor col = portColorOf(node, out, i, dimmed);
      const bool hovered = drag.hoverNode == &node && drag.hoverPort == i && bool(out) != drag.fromOutput;
      // Optional inputs are rings, so a required one left open stands out.
      const bool ring = !out && !ports[i].required;
      p->setPen(ring ? QPen(col, 2) : QPen(col.darker(160), 1));
      p->setBrush(ring ? style::kNodeBody : col);
      const qreal r = hovered && !dimmed ? kPortRadius + 2 : kPortRadius;
      p->drawEllipse(c, r, r);
      p->setFont(f.body);
      p->setPen(dimmed ? style::kDimmedPortLabel : style::kNodeText);
      const qreal ty = c.y() - f.bodyMetrics.height() / 2;
      p->drawStaticText(QPointF(out ? g.body().width() - 11 - labels[i].size().width() : 11, ty), labels[i]);
    }
  }
}

void NodePainter::paintSummary(QPainter* p, const NodeItem& node) {
  const NodeGeometry& g = node.geometry();
  const CanvasFonts& f = canvasFonts();
  qreal y = g.summaryTop();
  if (!g.factLines().isEmpty()) {
    const QRectF band(6, y, g.body().width() - 12, g.factLines().size() * kNodeFactRow + 3);
    p->setPen(Qt::NoPen);
    p->setBrush(style::kFactBand);
    p->drawRoundedRect(band, 3, 3);
    p->setFont(f.body);
    p->setPen(style::kFactText);
    qreal fy = y + 1.5 + (kNodeFactRow - f.bodyMetrics.height()) / 2;
    for (const QStaticText& s : g.factLines()) {
      p->drawStaticText(QPointF(10, fy), s);
      fy += kNodeFactRow;
    }
    y += g.factLines().size() * kNodeFactRow + 6;
  }
  p->setFont(f.small);
  p->setPen(style::kNodeDimText);
  for (const QStaticText& s : g.summary()) {
    p->drawStaticText(QPointF(8, y), s);
    y += kNodeSummaryRow;
  }
}

void NodePainter::paintRunMarks(QPainter* p, const NodeItem& node, bool hasErrors) {
  const NodeGeometry& g = node.geometry();
  const qreal width = g.body().width(), height = g.body().height();
  const qreal bottom = height - (hasErrors ? kNodeErrorStrip : 0);
  if (node.runStatus() == RunStatus::Running || node.runStatus() == RunStatus::Queued) {
    const QRectF bar(8, bottom - 7, width - 16, 4);
    p->setPen(Qt::NoPen);
    p->setBrush(style::kProgressTrack);
    p->drawRoundedRect(bar, 2, 2);
    p->setBrush(style::statusColor(runStatusName(node.runStatus())));
    p->drawRoundedRect(QRectF(bar.topLeft(), QSizeF(bar.width() * qBound(0.0, node.progress(), 1.0), 4)), 2,
                       2);
  }
  if (node.bypassed() && !node.muted()) {
    // The pass-through: each output from the first input of its type, as the run wires it.
    p->setBrush(Qt::NoBrush);
    for (int o = 0; o < node.outputs().size(); ++o)
      for (int i = 0; i < node.inputs().size(); ++i)
        if (node.inputs()[i].type == node.outputs()[o].type) {
          p->setPen(QPen(style::portColor(node.outputs()[o].type), 2, Qt::DashLine));
          p->drawPath(WireItem::bezier(g.portPos(false, i), g.portPos(true, o)));
          break;
        }
  }
  if (hasErrors) {
    const QRectF strip = g.errorStripRect().adjusted(1, 0, -1, -1);
    const CanvasFonts& f = canvasFonts();
    p->setPen(Qt::NoPen);
    p->setBrush(style::kErrorStrip);
    p->drawRect(strip);
    p->setFont(f.small);
    p->setPen(style::kErrorStripText);
    p->drawStaticText(QPointF(6, strip.top() + (kNodeErrorStrip - f.smallMetrics.height()) / 2),
                      g.errorLine());
  }
}

}  // namespace gn::editor
