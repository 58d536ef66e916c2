#include "canvas/node_geometry.h"

#include <QApplication>
#include <cmath>

namespace gn::editor {

CanvasFonts::CanvasFonts(const QFont& t, const QFont& b, const QFont& s)
    : title(t), body(b), small(s), titleMetrics(t), bodyMetrics(b), smallMetrics(s) {}

const CanvasFonts& canvasFonts() {
  static const CanvasFonts fonts = [] {
    const QFont base = QApplication::font();
    QFont title = base;
    title.setPointSizeF(9.5);
    title.setBold(true);
    QFont body = base;
    body.setPointSizeF(8.5);
    QFont small = base;
    small.setPointSizeF(7.5);
    return CanvasFonts(title, body, small);
  }();
  return fonts;
}

QString clippedText(const QString& text, qsizetype max) {
  return text.size() <= max ? text : text.left(max) + QChar(0x2026);
}

QStaticText staticText(const QString& text) {
  QStaticText t(text);
  t.setTextFormat(Qt::PlainText);
  t.setPerformanceHint(QStaticText::AggressiveCaching);
  // Not prepared here: it is laid out in the painter's font when first drawn, so a graph of thousands of
  // nodes shapes text only for the nodes on screen. Widths come from the fonts' metrics instead of size(),
  // which before a paint measures in the default font: a bold title measured so was narrower than drawn,
  // and the id placed after it ran into it.
  return t;
}

int NodeGeometry::portRows() const {
  return qMax(inputs_, outputs_);
}

void NodeGeometry::layout(const NodeContent& c, const QString& badge) {
  const CanvasFonts& f = canvasFonts();
  typeName_ = c.typeName;
  collapsed_ = c.collapsed;
  inputs_ = int(c.ports.inputs.size());
  outputs_ = int(c.ports.outputs.size());
  fullTitle_ = staticText(c.typeName);
  idText_ = staticText(c.id);
  inLabels_.clear();
  outLabels_.clear();
  qreal maxIn = 0, maxOut = 0;
  for (const core::PortSpec& p : c.ports.inputs) {
    inLabels_ << staticText(p.name);
    maxIn = qMax(maxIn, f.bodyMetrics.horizontalAdvance(p.name));
  }
  for (const core::PortSpec& p : c.ports.outputs) {
    outLabels_ << staticText(p.name);
    maxOut = qMax(maxOut, f.bodyMetrics.horizontalAdvance(p.name));
  }
  const qreal typeW = f.titleMetrics.horizontalAdvance(c.typeName),
              idW = f.smallMetrics.horizontalAdvance(c.id);
  fullTitleWidth_ = typeW;
  idWidth_ = idW;
  // Room for the type and the id; and for the id, a few letters of the type and a status badge ("12.3 ms")
  // side by side. While a run shows one, the type is shortened rather than every node widened for it:
  // graphs are laid out for nodes of about this width (the layer examples place them 200 apart).
  const qreal titleW = typeW + idW + 22 + kNodeToggle;
  const qreal runTitleW = qMin<qreal>(typeW, 40) + idW + 82 + kNodeToggle;
  const qreal w = std::ceil(qMax<qreal>(170, qMax(qMax(titleW, runTitleW), maxIn + maxOut + 44)));

  // The facts wrap at their separators rather than widen the node: example graphs are laid out for nodes
  // of the usual width, and a wider node would run into its neighbour.
  factLines_.clear();
  if (!c.facts.isEmpty()) {
    const qreal room = w - 20;
    QStringList wrapped;
    for (const QString& part : clippedText(c.facts).split(QStringLiteral(" · "), Qt::SkipEmptyParts)) {
      const QString joined = wrapped.isEmpty() ? QString() : wrapped.last() + QStringLiteral(" · ") + part;
      if (!wrapped.isEmpty() && f.bodyMetrics.horizontalAdvance(joined) <= room)
        wrapped.last() = joined;
      else
        wrapped << part;
    }
    for (const QString& l : wrapped)
      factLines_ << staticText(f.bodyMetrics.elidedText(l, Qt::ElideRight, room));
  }

  // Three lines of text under the ports, facts first: a node keeps the height the graph was laid out for,
  // and the params the facts push out are in the inspector. One param line stays in any case.
  const qsizetype maxParams = qMax<qsizetype>(1, 3 - factLines_.size());
  summary_.clear();
  for (const QString& l : c.summaryLines.mid(0, maxParams))
    summary_ << staticText(f.smallMetrics.elidedText(clippedText(l), Qt::ElideRight, w - 16));

  qreal h = kNodePortTop + portRows() * kNodePortRow + summary_.size() * kNodeSummaryRow + 10;
  if (!factLines_.isEmpty()) h += factLines_.size() * kNodeFactRow + 6;
  // The preview goes under the params, where the eye already reads the node's values.
  previewTop_ = h - 4;
  previewHeight_ = c.previewHeight;
  if (previewHeight_ > 0) h += previewHeight_ + 6;
  hasError_ = !c.firstError.isEmpty();
  if (hasError_) {
    errorLine_ = staticText(f.smallMetrics.elidedText(clippedText(c.firstError), Qt::ElideRight, w - 12));
    h += kNodeErrorStrip;
  }
  if (collapsed_) h = kNodeHeader;
  body_ = QRectF(0, 0, w, h);
  bounds_ = body_.adjusted(-kPortRadius - 2, -2, kPortRadius + 2, 2);
  bodyPath_ = QPainterPath();
  bodyPath_.addRoundedRect(body_, 6, 6);
  if (collapsed_) {
    headerPath_ = bodyPath_;
  } else {
    QPainterPath top;
    top.addRoundedRect(QRectF(0, 0, w, kNodeHeader + 6), 6, 6);
    QPainterPath cut;
    cut.addRect(QRectF(0, kNodeHeader, w, 6));
    headerPath_ = top.subtracted(cut);
  }
  shortTitleRoom_ = -1;
  badge_ = QString();
  layoutHeader(badge);
}

void NodeGeometry::layoutHeader(const QString& badge) {
  const CanvasFonts& f = canvasFonts();
  badge_ = badge;
  const qreal titleX = collapseToggleRect().right() + 2;
  const qreal badgeWidth = badge.isEmpty() ? 0 : f.smallMetrics.horizontalAdvance(badge) + 12;
  const qreal badgeLeft = body_.width() - badgeWidth - 6;
  const qreal idW = idWidth_;
  // Beside a status badge, the type gives way before the id does. The shortened type is kept until the room
  // changes, so a progress tick does not shape text.
  shortened_ = !badge.isEmpty() && titleX + 6 + fullTitleWidth_ + idW > badgeLeft - 4;
  if (shortened_) {
    const qreal room = qMax<qreal>(0, badgeLeft - 4 - idW - titleX - 6);
    if (room != shortTitleRoom_) {
      shortTitleRoom_ = room;
      const QString elided = f.titleMetrics.elidedText(typeName_, Qt::ElideRight, room);
      shortTitle_ = staticText(elided);
      shortTitleWidth_ = f.titleMetrics.horizontalAdvance(elided);
    }
  }
  const QStaticText& shown = title();
  const qreal shownWidth = shortened_ ? shortTitleWidth_ : fullTitleWidth_;
  titleRect_ = shown.text().isEmpty() ? QRectF()
                                      : QRectF(titleX, (kNodeHeader - f.titleMetrics.height()) / 2,
                                               shownWidth, f.titleMetrics.height());
  const qreal idX = titleX + 6 + (shown.text().isEmpty() ? -6 : shownWidth);
  idRect_ = QRectF(idX, (kNodeHeader - f.smallMetrics.height()) / 2 + 1, idW, f.smallMetrics.height());
  badgeRect_ = badge.isEmpty() ? QRectF() : QRectF(badgeLeft, 5, badgeWidth, kNodeHeader - 10);
  headerTextClip_ =
      !badge.isEmpty() && idX + idW > badgeLeft - 4 ? QRectF(0, 0, badgeLeft - 4, kNodeHeader) : QRectF();
}

QPointF NodeGeometry::portPos(bool output, int index) const {
  if (collapsed_) return QPointF(output ? body_.width() : 0, kNodeHeader / 2);
  return QPointF(output ? body_.width() : 0, kNodePortTop + kNodePortRow / 2 + index * kNodePortRow);
}

std::optional<NodeGeometry::PortHit> NodeGeometry::portAt(QPointF p, qreal slack) const {
  if (collapsed_) return std::nullopt;
  for (int i = 0; i < inputs_; ++i)
    if (QLineF(p, portPos(false, i)).length() <= slack) return PortHit{false, i};
  for (int i = 0; i < outputs_; ++i)
    if (QLineF(p, portPos(true, i)).length() <= slack) return PortHit{true, i};
  return std::nullopt;
}

QRectF NodeGeometry::collapseToggleRect() const {
  return QRectF(4, (kNodeHeader - kNodeToggle) / 2, kNodeToggle, kNodeToggle);
}

QRectF NodeGeometry::previewRect() const {
  if (previewHeight_ <= 0 || collapsed_) return {};
  return QRectF(8, previewTop_, body_.width() - 16, previewHeight_);
}

QRectF NodeGeometry::errorStripRect() const {
  if (!hasError_) return {};
  return QRectF(0, body_.height() - kNodeErrorStrip, body_.width(), kNodeErrorStrip);
}

qreal NodeGeometry::summaryTop() const {
  return kNodePortTop + portRows() * kNodePortRow + 2;
}

}  // namespace gn::editor
