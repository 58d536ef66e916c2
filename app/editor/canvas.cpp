#include "canvas.h"

#include <QApplication>
#include <QClipboard>
#include <QCursor>
#include <QGraphicsSceneHoverEvent>
#include <QGraphicsSceneMouseEvent>
#include <QIcon>
#include <QInputDialog>
#include <QKeyEvent>
#include <QLineEdit>
#include <QMenu>
#include <QMimeData>
#include <QPainter>
#include <QPixmap>
#include <QScrollBar>
#include <QStyleOptionGraphicsItem>
#include <QToolTip>
#include <QVarLengthArray>
#include <cmath>
#include <limits>

#include "find_bar.h"
#include "gpunodes/core/registry.h"
#include "minimap.h"
#include "node_search.h"
#include "style.h"

namespace gn::editor {

using core::Endpoint;
using core::GraphConnection;

namespace {

const char* kClipboardMime = "application/x-gpunodes-graph";

constexpr qreal kHeader = 26, kPortTop = 32, kPortRow = 20, kSummaryRow = 15, kFactRow = 15, kErrorStrip = 18,
                kRadius = 5, kToggle = 14;
// Below kLodSimple a node is a coloured box: text would be unreadable and costs most of the frame. Below
// kLodNoDetail it keeps its port dots but loses text and antialiasing.
constexpr qreal kLodSimple = 0.4, kLodNoDetail = 0.65;

struct Fonts {
  QFont title, body, small;
  QFontMetricsF titleM, bodyM, smallM;
  Fonts(QFont t, QFont b, QFont s) : title(t), body(b), small(s), titleM(t), bodyM(b), smallM(s) {}
};

const Fonts& fonts() {
  static const Fonts f = [] {
    QFont base = QApplication::font();
    QFont title = base;
    title.setPointSizeF(9.5);
    title.setBold(true);
    QFont body = base;
    body.setPointSizeF(8.5);
    QFont small = base;
    small.setPointSizeF(7.5);
    return Fonts(title, body, small);
  }();
  return f;
}

// Text a node shows, cut to what could ever be visible on it: a hostile file's 10 MB param or type name
// would otherwise be shaped whole on every layout, which takes seconds.
QString clipped(const QString& s, qsizetype max = 160) {
  return s.size() <= max ? s : s.left(max) + QChar(0x2026);
}

QStaticText staticText(const QString& s) {
  QStaticText t(s);
  t.setTextFormat(Qt::PlainText);
  t.setPerformanceHint(QStaticText::AggressiveCaching);
  return t;
}

const QColor kBody(0x2c, 0x2f, 0x35, 242), kText(0xe8, 0xea, 0xee), kDimText(0x9a, 0xa3, 0xad);
const QColor kError(0xe5, 0x48, 0x48), kWarn(0xe6, 0xb4, 0x3c), kSelect(0xff, 0xd1, 0x66);
// Facts (shapes, parameter counts) in a light tint of the Layer wire colour, on a band darker than the body.
const QColor kFactText(0xf4, 0xd2, 0xea), kFactBand(0x1f, 0x21, 0x26);

}  // namespace

QString runStatusName(RunStatus s) {
  switch (s) {
    case RunStatus::Idle:
      return "idle";
    case RunStatus::Queued:
      return "queued";
    case RunStatus::Running:
      return "running";
    case RunStatus::Done:
      return "done";
    case RunStatus::Failed:
      return "error";
    case RunStatus::Cancelled:
      return "cancelled";
  }
  return {};
}

// ----------------------------------------------------------------------------------------------------
// NodeItem

NodeItem::NodeItem(GraphScene* scene, const QString& id) : scene_(scene), id_(id) {
  setFlags(ItemIsMovable | ItemIsSelectable | ItemSendsGeometryChanges);
  setAcceptHoverEvents(true);
  // No item cache: measured (tests/bench/editor_bench), blitting a thousand cached pixmaps when zoomed out
  // and re-rendering them on every zoom step cost more than painting, which is cheap with pre-laid-out text
  // and level-of-detail cut-offs.
  rebuild();
}

void NodeItem::rebuild() {
  const core::GraphNode* n = scene_->document()->node(id_);
  if (!n) return;
  typeName_ = clipped(n->type, 60);
  bypassed_ = n->bypassed;
  muted_ = n->muted;
  // Neither runs: both fade, a muted node (which takes its dependents along) more.
  setOpacity(muted_ ? 0.4 : bypassed_ ? 0.6 : 1.0);
  ports_ = scene_->editor()->portsOf(id_);
  const core::NodeTypeSpec* spec = scene_->editor()->specOf(id_);
  headerColor_ = style::categoryColor(spec ? spec->category : QString("missing"));
  title_ = staticText(typeName_);
  idText_ = staticText(clipped(id_, 60));
  inLabels_.clear();
  outLabels_.clear();
  for (const core::PortSpec& p : ports_.inputs) inLabels_ << staticText(p.name);
  for (const core::PortSpec& p : ports_.outputs) outLabels_ << staticText(p.name);
  layout();
  if (pos() != n->position) setPos(n->position);
  // Ports may have moved (a missing node gains ports from its wires): re-anchor the wires.
  for (WireItem* w : wires_)
    w->setPorts(w->fromNode()->portIndex(true, w->connection().from.port),
                w->toNode()->portIndex(false, w->connection().to.port));
}

void NodeItem::layout() {
  const Fonts& f = fonts();
  const core::GraphNode* n = scene_->document()->node(id_);
  const core::NodeTypeSpec* spec = scene_->editor()->specOf(id_);
  qreal maxIn = 0, maxOut = 0;
  for (const core::PortSpec& p : ports_.inputs) maxIn = qMax(maxIn, f.bodyM.horizontalAdvance(p.name));
  for (const core::PortSpec& p : ports_.outputs) maxOut = qMax(maxOut, f.bodyM.horizontalAdvance(p.name));
  const qreal typeW = f.titleM.horizontalAdvance(typeName_), idW = f.smallM.horizontalAdvance(idText_.text());
  // Room for the type and the id; and for the id, a few letters of the type and a status badge ("12.3 ms")
  // side by side. While a run shows one, the type is shortened rather than every node widened for it:
  // graphs are laid out for nodes of about this width (the layer examples place them 200 apart).
  const qreal titleW = typeW + idW + 22 + kToggle;
  const qreal runTitleW = qMin<qreal>(typeW, 40) + idW + 82 + kToggle;
  const qreal w = std::ceil(qMax<qreal>(170, qMax(qMax(titleW, runTitleW), maxIn + maxOut + 44)));
  titleFitRoom_ = -1;

  // The facts wrap at their separators rather than widen the node: example graphs are laid out for nodes
  // of the usual width, and a wider node would run into its neighbour.
  factLines_.clear();
  if (!facts_.isEmpty()) {
    const qreal room = w - 20;
    QStringList wrapped;
    for (const QString& part : clipped(facts_).split(QStringLiteral(" · "), Qt::SkipEmptyParts)) {
      const QString joined = wrapped.isEmpty() ? QString() : wrapped.last() + QStringLiteral(" · ") + part;
      if (!wrapped.isEmpty() && f.bodyM.horizontalAdvance(joined) <= room)
        wrapped.last() = joined;
      else
        wrapped << part;
    }
    for (const QString& l : wrapped) factLines_ << staticText(f.bodyM.elidedText(l, Qt::ElideRight, room));
  }

  // Three lines of text under the ports, facts first: a node keeps the height the graph was laid out for,
  // and the params the facts push out are in the inspector. One param line stays in any case.
  const qsizetype maxParams = qMax<qsizetype>(1, 3 - factLines_.size());
  QStringList lines;
  if (spec && n) {
    for (const core::ParamSpec& ps : spec->params) {
      if (lines.size() == maxParams) break;
      const QJsonValue v = n->params.contains(ps.name) ? n->params.value(ps.name) : ps.defaultValue;
      lines << QString("%1  %2").arg(ps.name, style::formatValue(v));
    }
  } else {
    lines << QString("type '%1' is not loaded").arg(typeName_);
  }
  summary_.clear();
  for (const QString& l : lines)
    summary_ << staticText(f.smallM.elidedText(clipped(l), Qt::ElideRight, w - 16));

  const QStringList errs = errors();
  const int rows = int(qMax(ports_.inputs.size(), ports_.outputs.size()));
  qreal h = kPortTop + rows * kPortRow + summary_.size() * kSummaryRow + 10;
  if (!factLines_.isEmpty()) h += factLines_.size() * kFactRow + 6;
  // The preview goes under the params, where the eye already reads the node's values.
  previewTop_ = h - 4;
  if (!preview_.empty()) h += preview_.height() + 6;
  if (!errs.isEmpty()) {
    errorLine_ = staticText(f.smallM.elidedText(clipped(errs.first()), Qt::ElideRight, w - 12));
    h += kErrorStrip;
  }
  if (collapsed_) h = kHeader;
  prepareGeometryChange();
  body_ = QRectF(0, 0, w, h);
  bounds_ = body_.adjusted(-kRadius - 2, -2, kRadius + 2, 2);
  bodyPath_ = QPainterPath();
  bodyPath_.addRoundedRect(body_, 6, 6);
  if (collapsed_) {
    headerPath_ = bodyPath_;
  } else {
    QPainterPath top;
    top.addRoundedRect(QRectF(0, 0, w, kHeader + 6), 6, 6);
    QPainterPath cut;
    cut.addRect(QRectF(0, kHeader, w, 6));
    headerPath_ = top.subtracted(cut);
  }
  portsTop_ = kPortTop;
  update();
}

QPainterPath NodeItem::shape() const {
  QPainterPath p;
  p.addRect(bounds_);
  return p;
}

int NodeItem::portIndex(bool output, const QString& name) const {
  const QList<core::PortSpec>& ports = output ? ports_.outputs : ports_.inputs;
  for (int i = 0; i < ports.size(); ++i)
    if (ports[i].name == name) return i;
  return -1;
}

QPointF NodeItem::portPos(bool output, int index) const {
  if (collapsed_) return QPointF(output ? body_.width() : 0, kHeader / 2);
  return QPointF(output ? body_.width() : 0, portsTop_ + kPortRow / 2 + index * kPortRow);
}

std::optional<NodeItem::PortHit> NodeItem::portAt(QPointF p, qreal slack) const {
  // A collapsed node's ports all sit at the ends of its bar: dragging from there would pick one by chance.
  if (collapsed_) return std::nullopt;
  for (int i = 0; i < ports_.inputs.size(); ++i)
    if (QLineF(p, portPos(false, i)).length() <= slack) return PortHit{false, i};
  for (int i = 0; i < ports_.outputs.size(); ++i)
    if (QLineF(p, portPos(true, i)).length() <= slack) return PortHit{true, i};
  return std::nullopt;
}

QString NodeItem::badgeText() const {
  switch (status_) {
    case RunStatus::Idle:
      return muted_ ? QString("muted") : bypassed_ ? QString("bypassed") : QString();
    case RunStatus::Queued:
      return "queued";
    case RunStatus::Running:
      return progress_ > 0 ? QString("running %1%").arg(int(progress_ * 100)) : QString("running");
    case RunStatus::Done:
      return cached_ ? QString("cached") : style::formatMs(timeMs_);
    case RunStatus::Failed:
      return "error";
    case RunStatus::Cancelled:
      return "cancelled";
  }
  return {};
}

void NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  const bool selected = isSelected();
  const bool hasErrors = !issueErrors_.isEmpty() || !runError_.isEmpty();
  const bool hasWarnings = !issueWarnings_.isEmpty() || !runWarning_.isEmpty();
  const QColor border = hasErrors     ? kError
                        : selected    ? kSelect
                        : hasWarnings ? kWarn
                                      : QColor(0x15, 0x16, 0x18);
  const QColor statusColor = style::statusColor(runStatusName(status_));

  if (lod < kLodSimple) {
    p->setRenderHint(QPainter::Antialiasing, false);
    p->setPen(selected || hasErrors ? QPen(border, 0) : Qt::NoPen);
    p->setBrush(kBody);
    p->drawRect(body_);
    p->fillRect(QRectF(0, 0, body_.width(), kHeader), headerColor_);
    if (status_ != RunStatus::Idle) p->fillRect(QRectF(body_.width() - 40, 0, 40, kHeader), statusColor);
    return;
  }
  const Fonts& f = fonts();
  if (lod < kLodNoDetail) {
    // Zoomed out: boxes and port dots. Text under ~6 px is unreadable, and antialiasing costs more than it
    // shows here.
    p->setRenderHint(QPainter::Antialiasing, false);
    p->setPen(QPen(border, 0));
    p->setBrush(kBody);
    p->drawRect(body_);
    p->fillRect(QRectF(0, 0, body_.width(), kHeader),
                ports_.missing ? QColor(0x55, 0x55, 0x55) : headerColor_);
    if (status_ != RunStatus::Idle) p->fillRect(QRectF(body_.width() - 40, 4, 34, kHeader - 8), statusColor);
    for (int out = 0; out < 2 && !collapsed_; ++out) {
      const QList<core::PortSpec>& ports = out ? ports_.outputs : ports_.inputs;
      for (int i = 0; i < ports.size(); ++i) {
        QColor col = style::portColor(ports[i].type);
        if (scene_->portDimmed(this, out, i)) col.setAlpha(45);
        p->fillRect(QRectF(portPos(out, i) - QPointF(kRadius, kRadius), QSizeF(2 * kRadius, 2 * kRadius)),
                    col);
      }
    }
    if (hasErrors && !collapsed_)
      p->fillRect(QRectF(0, body_.height() - kErrorStrip, body_.width(), kErrorStrip),
                  QColor(0x6b, 0x1f, 0x22));
    return;
  }
  p->setRenderHint(QPainter::Antialiasing, true);
  p->setPen(QPen(border, selected || hasErrors ? 2 : 1));
  p->setBrush(kBody);
  p->drawPath(bodyPath_);
  p->setPen(Qt::NoPen);
  p->setBrush(ports_.missing || muted_ ? QColor(0x55, 0x55, 0x55) : headerColor_);
  p->drawPath(headerPath_);

  // The collapse toggle: a triangle pointing down (open) or right (collapsed), as in a tree.
  const QRectF toggle = collapseToggleRect();
  {
    const QPointF c = toggle.center();
    QPolygonF tri;
    if (collapsed_)
      tri << c + QPointF(-2.5, -4) << c + QPointF(3.5, 0) << c + QPointF(-2.5, 4);
    else
      tri << c + QPointF(-4, -2.5) << c + QPointF(4, -2.5) << c + QPointF(0, 3.5);
    p->setPen(Qt::NoPen);
    p->setBrush(QColor(255, 255, 255, 170));
    p->drawPolygon(tri);
  }
  const qreal titleX = toggle.right() + 2;

  const QString badge = badgeText();
  const qreal bw = badge.isEmpty() ? 0 : f.smallM.horizontalAdvance(badge) + 12;
  const qreal badgeLeft = body_.width() - bw - 6;
  // Beside a status badge, the type gives way before the id does: runs, the timeline and the log name
  // nodes by id. The shortened type is kept until the room changes, so a frame does not shape text.
  const QStaticText* title = &title_;
  const qreal idW = idText_.size().width();
  if (!badge.isEmpty() && titleX + 6 + title_.size().width() + idW > badgeLeft - 4) {
    const qreal room = qMax<qreal>(0, badgeLeft - 4 - idW - titleX - 6);
    if (room != titleFitRoom_) {
      titleFitRoom_ = room;
      titleFit_ = staticText(f.titleM.elidedText(typeName_, Qt::ElideRight, room));
    }
    title = &titleFit_;
  }
  const qreal idX = titleX + 6 + (title->text().isEmpty() ? -6 : title->size().width());
  // A badge wider than the whole header still leaves the text under it cut at its edge.
  const bool clipTitle = !badge.isEmpty() && idX + idW > badgeLeft - 4;
  if (clipTitle) {
    p->save();  // the view's own clip (the exposed area) comes back with restore
    p->setClipRect(QRectF(0, 0, badgeLeft - 4, kHeader), Qt::IntersectClip);
  }
  p->setFont(f.title);
  p->setPen(kText);
  if (!title->text().isEmpty()) p->drawStaticText(QPointF(titleX, (kHeader - f.titleM.height()) / 2), *title);
  p->setFont(f.small);
  p->setPen(QColor(255, 255, 255, 150));
  p->drawStaticText(QPointF(idX, (kHeader - f.smallM.height()) / 2 + 1), idText_);
  if (clipTitle) p->restore();

  if (!badge.isEmpty()) {
    const QRectF r(badgeLeft, 5, bw, kHeader - 10);
    p->setPen(Qt::NoPen);
    p->setBrush(statusColor);
    p->drawRoundedRect(r, 7, 7);
    p->setPen(QColor(0x10, 0x10, 0x10));
    p->drawText(r, Qt::AlignCenter, badge);
  }
  // Collapsed: the title bar is all there is; the wires meet its ends.
  if (collapsed_) return;

  for (int out = 0; out < 2; ++out) {
    const QList<core::PortSpec>& ports = out ? ports_.outputs : ports_.inputs;
    const QList<QStaticText>& labels = out ? outLabels_ : inLabels_;
    for (int i = 0; i < ports.size(); ++i) {
      const QPointF c = portPos(out, i);
      QColor col = style::portColor(ports[i].type);
      const bool dimmed = scene_->portDimmed(this, out, i);
      const bool hovered = scene_->wireDrag().hoverNode == this && scene_->wireDrag().hoverPort == i &&
                           bool(out) != scene_->wireDrag().fromOutput;
      if (dimmed) col.setAlpha(45);
      p->setPen(QPen(col.darker(160), 1));
      // Optional inputs are rings, so a required one left open stands out.
      p->setBrush(!out && !ports[i].required ? QColor(kBody) : col);
      if (!out && !ports[i].required) p->setPen(QPen(col, 2));
      const qreal r = hovered && !dimmed ? kRadius + 2 : kRadius;
      p->drawEllipse(c, r, r);
      p->setFont(f.body);
      p->setPen(dimmed ? QColor(255, 255, 255, 60) : kText);
      const qreal ty = c.y() - f.bodyM.height() / 2;
      p->drawStaticText(QPointF(out ? body_.width() - 11 - labels[i].size().width() : 11, ty), labels[i]);
    }
  }

  {
    const int rows = int(qMax(ports_.inputs.size(), ports_.outputs.size()));
    qreal y = portsTop_ + rows * kPortRow + 2;
    if (!factLines_.isEmpty()) {
      const QRectF band(6, y, body_.width() - 12, factLines_.size() * kFactRow + 3);
      p->setPen(Qt::NoPen);
      p->setBrush(kFactBand);
      p->drawRoundedRect(band, 3, 3);
      p->setFont(f.body);
      p->setPen(kFactText);
      qreal fy = y + 1.5 + (kFactRow - f.bodyM.height()) / 2;
      for (const QStaticText& s : factLines_) {
        p->drawStaticText(QPointF(10, fy), s);
        fy += kFactRow;
      }
      y += factLines_.size() * kFactRow + 6;
    }
    p->setFont(f.small);
    p->setPen(kDimText);
    for (const QStaticText& s : summary_) {
      p->drawStaticText(QPointF(8, y), s);
      y += kSummaryRow;
    }
  }
  if (!preview_.empty()) preview_.paint(p, previewRect());

  const qreal bottom = body_.height() - (hasErrors ? kErrorStrip : 0);
  if (status_ == RunStatus::Running || status_ == RunStatus::Queued) {
    const QRectF bar(8, bottom - 7, body_.width() - 16, 4);
    p->setPen(Qt::NoPen);
    p->setBrush(QColor(0x44, 0x48, 0x4f));
    p->drawRoundedRect(bar, 2, 2);
    p->setBrush(statusColor);
    p->drawRoundedRect(QRectF(bar.topLeft(), QSizeF(bar.width() * qBound(0.0, progress_, 1.0), 4)), 2, 2);
  }
  if (bypassed_ && !muted_) {
    // The pass-through: each output from the first input of its type, as the run wires it.
    p->setBrush(Qt::NoBrush);
    for (int o = 0; o < ports_.outputs.size(); ++o)
      for (int i = 0; i < ports_.inputs.size(); ++i)
        if (ports_.inputs[i].type == ports_.outputs[o].type) {
          p->setPen(QPen(style::portColor(ports_.outputs[o].type), 2, Qt::DashLine));
          p->drawPath(WireItem::bezier(portPos(false, i), portPos(true, o)));
          break;
        }
  }
  if (hasErrors) {
    const QRectF strip(1, body_.height() - kErrorStrip, body_.width() - 2, kErrorStrip - 1);
    p->setPen(Qt::NoPen);
    p->setBrush(QColor(0x6b, 0x1f, 0x22));
    p->drawRect(strip);
    p->setFont(f.small);
    p->setPen(QColor(0xff, 0xc9, 0xc9));
    p->drawStaticText(QPointF(6, strip.top() + (kErrorStrip - f.smallM.height()) / 2), errorLine_);
  }
}

QStringList NodeItem::errors() const {
  QStringList e = issueErrors_;
  if (!runError_.isEmpty()) e.prepend(runError_);
  return e;
}

QStringList NodeItem::warnings() const {
  QStringList w = issueWarnings_;
  if (!runWarning_.isEmpty()) w.prepend(runWarning_);
  return w;
}

void NodeItem::setCached(bool cached) {
  cached_ = cached;
  update();
}

void NodeItem::setRunState(RunStatus s, double timeMs, const QString& error) {
  const bool relayout = error != runError_;
  if (s != RunStatus::Done) cached_ = false;
  status_ = s;
  timeMs_ = timeMs;
  if (s != RunStatus::Running) progress_ = s == RunStatus::Done ? 1 : 0;
  runError_ = error;
  if (s == RunStatus::Idle) runWarning_.clear();
  if (relayout)
    layout();
  else
    update();
}

void NodeItem::setProgress(double p) {
  if (p == progress_) return;
  progress_ = p;
  update();
}

void NodeItem::setRunWarning(const QString& w) {
  runWarning_ = w;
  update();
}

void NodeItem::setFacts(const QString& badge) {
  if (badge == facts_) return;
  facts_ = badge;
  layout();
}

void NodeItem::setCollapsed(bool collapsed) {
  if (collapsed == collapsed_) return;
  collapsed_ = collapsed;
  layout();
  for (WireItem* w : wires_) w->updatePath();
}

QRectF NodeItem::collapseToggleRect() const {
  return QRectF(4, (kHeader - kToggle) / 2, kToggle, kToggle);
}

void NodeItem::setPreview(const NodePreview& preview) {
  if (preview.empty() && preview_.empty()) return;
  preview_ = preview;
  layout();
}

QRectF NodeItem::previewRect() const {
  if (preview_.empty() || collapsed_) return {};
  return QRectF(8, previewTop_, body_.width() - 16, preview_.height());
}

void NodeItem::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() == Qt::LeftButton && collapseToggleRect().adjusted(-2, -2, 2, 2).contains(e->pos())) {
    scene_->editor()->setCollapsed({id_}, !collapsed_);
    e->accept();
    return;
  }
  QGraphicsItem::mousePressEvent(e);
}

QStringList NodeItem::factsLines() const {
  QStringList lines;
  for (const QStaticText& t : factLines_) lines << t.text();
  return lines;
}

void NodeItem::setIssues(const QStringList& errors, const QStringList& warnings) {
  if (errors == issueErrors_ && warnings == issueWarnings_) return;
  issueErrors_ = errors;
  issueWarnings_ = warnings;
  layout();
}

QVariant NodeItem::itemChange(GraphicsItemChange change, const QVariant& value) {
  if (change == ItemPositionHasChanged) {
    for (WireItem* w : wires_) w->updatePath();
  } else if (change == ItemSelectedHasChanged) {
    setZValue(value.toBool() ? 1 : 0);
  }
  return QGraphicsItem::itemChange(change, value);
}

void NodeItem::hoverMoveEvent(QGraphicsSceneHoverEvent* e) {
  QString tip;
  if (collapseToggleRect().adjusted(-2, -2, 2, 2).contains(e->pos())) {
    tip = collapsed_ ? QString("Expand the node (H)") : QString("Collapse the node to its title bar (H)");
  } else if (auto hit = portAt(e->pos())) {
    const core::PortSpec& ps = hit->output ? ports_.outputs[hit->index] : ports_.inputs[hit->index];
    tip = QString("<b>%1</b> · %2 %3")
              .arg(ps.name, core::portTypeName(ps.type), hit->output ? "output" : "input");
    if (!hit->output) tip += ps.required ? " (required)" : " (optional)";
    if (!ps.doc.isEmpty()) tip += "<br>" + ps.doc.toHtmlEscaped();
  } else {
    const QStringList errs = errors(), warns = warnings();
    const core::NodeTypeSpec* spec = scene_->editor()->specOf(id_);
    tip = QString("<b>%1</b> (%2)").arg(clipped(id_, 60), typeName_);
    if (spec && !spec->description.isEmpty()) tip += "<br>" + spec->description.toHtmlEscaped();
    if (!facts_.isEmpty()) tip += "<br><b>" + clipped(facts_).toHtmlEscaped() + "</b>";
    if (status_ != RunStatus::Idle) tip += "<br>status: " + runStatusName(status_);
    if (status_ == RunStatus::Done) tip += ", " + style::formatMs(timeMs_);
    for (const QString& m : errs) tip += "<br><font color='#ff7b7b'>" + m.toHtmlEscaped() + "</font>";
    for (const QString& m : warns) tip += "<br><font color='#e6b43c'>" + m.toHtmlEscaped() + "</font>";
    for (const QString& m : errs)
      if (GraphEditor::isDeviceMismatch(m)) {
        tip += "<br><i>Right-click: Insert Copy node</i>";
        break;
      }
  }
  if (toolTip() != tip) setToolTip(tip);
  QGraphicsItem::hoverMoveEvent(e);
}

// ----------------------------------------------------------------------------------------------------
// WireItem

WireItem::WireItem(NodeItem* from, int fromPort, NodeItem* to, int toPort, const GraphConnection& c)
    : from_(from), to_(to), fromPort_(fromPort), toPort_(toPort), conn_(c) {
  setFlags(ItemIsSelectable);
  setZValue(-1);
  from_->wires() << this;
  to_->wires() << this;
  points_ = GraphEditor::reroutePoints(conn_);
  setPorts(fromPort, toPort);
}

void WireItem::setConnection(const GraphConnection& c) {
  conn_ = c;
  carrying_ = false;
  points_ = GraphEditor::reroutePoints(conn_);
  updatePath();
}

void WireItem::rebuildPointItems() {
  QList<RerouteItem*> items;
  for (QGraphicsItem* child : childItems())
    if (child->type() == RerouteItem::Type) items << static_cast<RerouteItem*>(child);
  // The same number of points: the dots stay (one may be handling the mouse release that moved it).
  if (items.size() != points_.size()) {
    qDeleteAll(items);
    items.clear();
    for (int i = 0; i < points_.size(); ++i) items << new RerouteItem(this, i, color_);
  }
  for (int i = 0; i < points_.size(); ++i) items[i]->setPos(points_[i]);
}

void WireItem::movePoint(int index, QPointF scenePos) {
  if (index < 0 || index >= points_.size()) return;
  points_[index] = scenePos;
  updatePath();
}

void WireItem::beginCarry() {
  carrying_ = true;
  carryBase_ = points_;
  carryAnchor_ = from_->pos();
}

void WireItem::endCarry() {
  carrying_ = false;
}

void WireItem::setPorts(int fromPort, int toPort) {
  fromPort_ = fromPort;
  toPort_ = toPort;
  color_ = fromPort >= 0 && fromPort < from_->outputs().size()
               ? style::portColor(from_->outputs()[fromPort].type)
               : QColor(Qt::gray);
  updatePath();
}

namespace {

// A wire leaves an output and enters an input horizontally; a reroute point is passed the same way, as a
// port would be.
void appendBezier(QPainterPath& path, QPointF a, QPointF b) {
  const qreal dx = qMax<qreal>(40, std::abs(b.x() - a.x()) * 0.5);
  path.cubicTo(a + QPointF(dx, 0), b - QPointF(dx, 0), b);
}

qreal distanceToSegment(QPointF p, QPointF a, QPointF b) {
  const QPointF ab = b - a;
  const qreal len2 = QPointF::dotProduct(ab, ab);
  const qreal t = len2 > 0 ? qBound<qreal>(0, QPointF::dotProduct(p - a, ab) / len2, 1) : 0;
  return QLineF(p, a + t * ab).length();
}

}  // namespace

QPainterPath WireItem::bezier(QPointF a, QPointF b) {
  QPainterPath path(a);
  appendBezier(path, a, b);
  return path;
}

void WireItem::updatePath() {
  prepareGeometryChange();
  if (carrying_) {
    const QPointF moved = from_->pos() - carryAnchor_;
    for (int i = 0; i < points_.size() && i < carryBase_.size(); ++i) points_[i] = carryBase_[i] + moved;
  }
  QPointF at = from_->portScenePos(true, qMax(0, fromPort_));
  path_ = QPainterPath(at);
  for (const QPointF& p : std::as_const(points_)) {
    appendBezier(path_, at, p);
    at = p;
  }
  appendBezier(path_, at, to_->portScenePos(false, qMax(0, toPort_)));
  bounds_ = path_.boundingRect().adjusted(-4, -4, 4, 4);
  shape_ = QPainterPath();
  rebuildPointItems();
}

int WireItem::insertionIndex(QPointF scenePos) const {
  QList<QPointF> stops{from_->portScenePos(true, qMax(0, fromPort_))};
  stops << points_ << to_->portScenePos(false, qMax(0, toPort_));
  int best = 0;
  qreal bestDistance = std::numeric_limits<qreal>::max();
  for (int k = 0; k + 1 < stops.size(); ++k) {
    // The stretch between two stops, flattened as it is drawn.
    const QPolygonF line = bezier(stops[k], stops[k + 1]).toSubpathPolygons().value(0);
    for (int i = 0; i + 1 < line.size(); ++i) {
      const qreal d = distanceToSegment(scenePos, line[i], line[i + 1]);
      if (d < bestDistance) {
        bestDistance = d;
        best = k;
      }
    }
  }
  return best;
}

bool WireItem::crosses(const QLineF& line) const {
  for (const QPolygonF& poly : path_.toSubpathPolygons())
    for (int i = 0; i + 1 < poly.size(); ++i)
      if (QLineF(poly[i], poly[i + 1]).intersects(line) == QLineF::BoundedIntersection) return true;
  return false;
}

QPainterPath WireItem::shape() const {
  // Built only when hit-testing needs it (clicks, rubber band), not on every move.
  if (shape_.isEmpty()) {
    QPainterPathStroker s;
    s.setWidth(10);
    shape_ = s.createStroke(path_);
  }
  return shape_;
}

void WireItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  p->setBrush(Qt::NoBrush);
  if (isSelected()) {
    p->setRenderHint(QPainter::Antialiasing, true);
    p->setPen(QPen(kSelect, 4.5));
    p->drawPath(path_);
  }
  // Wires are drawn with cosmetic (one device pixel) pens: the raster engine strokes those on a fast path,
  // while a wide antialiased pen costs most of a frame once hundreds of long wires cross the view. Two
  // strokes a pixel apart read as a 2 px wire, the same width at every zoom.
  const bool detail = lod >= kLodSimple;
  p->setRenderHint(QPainter::Antialiasing, detail);
  p->setPen(QPen(color_, 0));
  p->drawPath(path_);
  if (detail) {
    p->translate(0, 1 / lod);
    p->drawPath(path_);
    p->translate(0, -1 / lod);
  }
}

// ----------------------------------------------------------------------------------------------------
// RerouteItem

RerouteItem::RerouteItem(WireItem* wire, int index, QColor color)
    : QGraphicsItem(wire), wire_(wire), index_(index), color_(color) {
  setCursor(Qt::SizeAllCursor);
  setToolTip("Reroute point: drag to move it, double-click to remove it");
}

void RerouteItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  p->setRenderHint(QPainter::Antialiasing, true);
  p->setPen(QPen(QColor(0x15, 0x16, 0x18), 1.5));
  p->setBrush(wire_->isSelected() ? kSelect : color_);
  p->drawEllipse(QPointF(), 4.5, 4.5);
}

void RerouteItem::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() != Qt::LeftButton) {
    e->ignore();
    return;
  }
  grab_ = e->pos();
  dragged_ = false;
  e->accept();
}

void RerouteItem::mouseMoveEvent(QGraphicsSceneMouseEvent* e) {
  dragged_ = true;
  wire_->movePoint(index_, e->scenePos() - grab_);
}

void RerouteItem::mouseReleaseEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() != Qt::LeftButton || !dragged_) return;
  dragged_ = false;
  auto* scene = static_cast<GraphScene*>(this->scene());
  scene->editor()->setReroutePoints(wire_->connection(), wire_->points(), "Move reroute point");
}

// ----------------------------------------------------------------------------------------------------
// CommentItem

namespace {
constexpr qreal kCommentHeader = 28, kHandle = 14;
}

CommentItem::CommentItem(GraphScene* scene, const CommentFrame& frame)
    : scene_(scene), frame_(frame), size_(frame.rect.size()) {
  setFlags(ItemIsMovable | ItemIsSelectable | ItemSendsGeometryChanges);
  setAcceptHoverEvents(true);
  setZValue(-2);
  setPos(frame.rect.topLeft());
  lastPos_ = pos();
  setToolTip(
      QString("%1\nDrag to move the frame and its nodes; drag the corner to resize; double-click to rename")
          .arg(frame.text));
}

CommentFrame CommentItem::frame() const {
  CommentFrame f = frame_;
  f.rect = QRectF(pos(), size_);
  return f;
}

void CommentItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  const QRectF r(QPointF(), size_);
  QColor fill = frame_.color, border = frame_.color, head = frame_.color;
  fill.setAlpha(34);
  border.setAlpha(isSelected() ? 255 : 140);
  head.setAlpha(80);
  p->setRenderHint(QPainter::Antialiasing, lod >= kLodSimple);
  p->setPen(QPen(isSelected() ? kSelect : border, 0));
  p->setBrush(fill);
  p->drawRoundedRect(r, 8, 8);
  p->setPen(Qt::NoPen);
  p->setBrush(head);
  p->drawRoundedRect(QRectF(0, 0, r.width(), kCommentHeader), 8, 8);
  if (lod >= 0.25) {
    QFont f = fonts().title;
    f.setPointSizeF(11);
    p->setFont(f);
    p->setPen(kText);
    p->drawText(QRectF(10, 0, r.width() - 20, kCommentHeader), Qt::AlignVCenter | Qt::AlignLeft, frame_.text);
  }
  // The resize grip.
  p->setPen(QPen(border, 0));
  for (int i = 1; i <= 3; ++i)
    p->drawLine(QPointF(r.right() - 4 * i, r.bottom() - 2), QPointF(r.right() - 2, r.bottom() - 4 * i));
}

bool CommentItem::onHandle(QPointF p) const {
  return p.x() > size_.width() - kHandle && p.y() > size_.height() - kHandle;
}

void CommentItem::capture() {
  captured_.clear();
  const QRectF area = sceneBoundingRect();
  for (QGraphicsItem* i : scene_->items(area, Qt::ContainsItemBoundingRect))
    if (i->type() == NodeItem::Type && !i->isSelected()) captured_ << static_cast<NodeItem*>(i);
  lastPos_ = pos();
}

QVariant CommentItem::itemChange(GraphicsItemChange change, const QVariant& value) {
  if (change == ItemPositionHasChanged) {
    const QPointF delta = pos() - lastPos_;
    lastPos_ = pos();
    for (NodeItem* n : captured_) n->moveBy(delta.x(), delta.y());
  }
  return QGraphicsItem::itemChange(change, value);
}

void CommentItem::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() == Qt::LeftButton && onHandle(e->pos())) {
    resizing_ = true;
    e->accept();
    return;
  }
  QGraphicsItem::mousePressEvent(e);
}

void CommentItem::mouseMoveEvent(QGraphicsSceneMouseEvent* e) {
  if (resizing_) {
    prepareGeometryChange();
    size_ = QSizeF(qMax<qreal>(120, e->pos().x()), qMax<qreal>(70, e->pos().y()));
    update();
    return;
  }
  QGraphicsItem::mouseMoveEvent(e);
}

void CommentItem::mouseReleaseEvent(QGraphicsSceneMouseEvent* e) {
  if (resizing_) {
    resizing_ = false;
    scene_->commitComments("Resize comment frame");
    return;
  }
  QGraphicsItem::mouseReleaseEvent(e);
}

void CommentItem::mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) {
  if (e->pos().y() > kCommentHeader) {
    QGraphicsItem::mouseDoubleClickEvent(e);
    return;
  }
  bool ok = false;
  const QString text =
      QInputDialog::getText(nullptr, "Comment frame", "Text:", QLineEdit::Normal, frame_.text, &ok);
  if (!ok) return;
  frame_.text = text;
  scene_->commitComments("Rename comment frame");
}

void CommentItem::hoverMoveEvent(QGraphicsSceneHoverEvent* e) {
  setCursor(onHandle(e->pos()) ? Qt::SizeFDiagCursor : Qt::ArrowCursor);
  QGraphicsItem::hoverMoveEvent(e);
}

// ----------------------------------------------------------------------------------------------------
// GraphScene

GraphScene::GraphScene(GraphEditor* editor, QObject* parent) : QGraphicsScene(parent), editor_(editor) {
  setSceneRect(-100000, -100000, 200000, 200000);
  setItemIndexMethod(BspTreeIndex);
  core::GraphDocument* doc = editor_->document();
  connect(doc, &core::GraphDocument::nodeAdded, this, &GraphScene::addNodeItem);
  connect(doc, &core::GraphDocument::nodeRemoved, this, &GraphScene::onNodeRemoved);
  connect(doc, &core::GraphDocument::nodeMoved, this, &GraphScene::onNodeMoved);
  connect(doc, &core::GraphDocument::paramsChanged, this, &GraphScene::onParamsChanged);
  connect(doc, &core::GraphDocument::runModeChanged, this, &GraphScene::onParamsChanged);
  // A subgraph's ports may have changed: its item and wires are made again.
  connect(doc, &core::GraphDocument::subgraphChanged, this, [this](const QString& id) {
    const bool selected = nodes_.value(id) && nodes_.value(id)->isSelected();
    onNodeRemoved(id);
    addNodeItem(id);
    for (const GraphConnection& c : document()->connections())
      if (c.from.node == id || c.to.node == id) onConnectionAdded(c);
    if (NodeItem* n = nodes_.value(id)) n->setSelected(selected);
  });
  connect(doc, &core::GraphDocument::connectionAdded, this, &GraphScene::onConnectionAdded);
  connect(doc, &core::GraphDocument::connectionRemoved, this, &GraphScene::onConnectionRemoved);
  connect(doc, &core::GraphDocument::connectionChanged, this, &GraphScene::onConnectionChanged);
  connect(doc, &core::GraphDocument::reset, this, &GraphScene::rebuildAll);
  connect(editor_, &GraphEditor::commentsChanged, this, &GraphScene::rebuildComments);
  connect(editor_, &GraphEditor::collapsedChanged, this, &GraphScene::onCollapsedChanged);
  rebuildAll();
}

void GraphScene::rebuildComments() {
  for (CommentItem* c : std::as_const(comments_)) {
    removeItem(c);
    delete c;
  }
  comments_.clear();
  for (const CommentFrame& f : editor_->comments()) {
    auto* item = new CommentItem(this, f);
    comments_.insert(f.id, item);
    addItem(item);
  }
}

QStringList GraphScene::selectedCommentIds() const {
  QStringList ids;
  for (CommentItem* c : comments_)
    if (c->isSelected()) ids << c->id();
  ids.sort();
  return ids;
}

void GraphScene::commitComments(const QString& text) {
  QList<CommentFrame> frames;
  for (const CommentFrame& f : editor_->comments())
    frames << (comments_.contains(f.id) ? comments_.value(f.id)->frame() : f);
  // Deferred: the frames are rebuilt from the document, and the item that asked may still be in its handler.
  QMetaObject::invokeMethod(
      this, [this, frames, text] { editor_->setComments(frames, text); }, Qt::QueuedConnection);
}

GraphScene::~GraphScene() {
  // Items go before the maps that index them; no selection signals from a scene being torn down.
  blockSignals(true);
  for (CommentItem* c : std::as_const(comments_)) delete c;
  comments_.clear();
  for (WireItem* w : std::as_const(wires_)) delete w;
  wires_.clear();
  for (NodeItem* n : std::as_const(nodes_)) delete n;
  nodes_.clear();
}

void GraphScene::rebuildAll() {
  drag_ = {};
  // Removing a selected item emits selectionChanged at once, and its slots read the items being deleted.
  clearSelection();
  for (WireItem* w : std::as_const(wires_)) {
    removeItem(w);
    delete w;
  }
  wires_.clear();
  for (NodeItem* n : std::as_const(nodes_)) {
    removeItem(n);
    delete n;
  }
  nodes_.clear();
  const core::GraphDocument* doc = document();
  nodes_.reserve(doc->nodes().size());
  for (const core::GraphNode& n : doc->nodes()) addNodeItem(n.id);
  for (const GraphConnection& c : doc->connections()) onConnectionAdded(c);
  rebuildComments();
}

void GraphScene::addNodeItem(const QString& id) {
  if (nodes_.contains(id)) return;
  auto* item = new NodeItem(this, id);
  item->setCollapsed(editor_->isCollapsed(id));
  nodes_.insert(id, item);
  addItem(item);
}

void GraphScene::onCollapsedChanged() {
  for (NodeItem* n : std::as_const(nodes_)) n->setCollapsed(editor_->isCollapsed(n->id()));
}

void GraphScene::onConnectionChanged(const GraphConnection& c) {
  if (WireItem* w = wires_.value(key(c))) w->setConnection(c);
}

QList<GraphConnection> GraphScene::wiresCrossing(const QLineF& line) const {
  QList<GraphConnection> out;
  // Document order, so the undo step lists them the same way every time.
  for (const GraphConnection& c : document()->connections())
    if (WireItem* w = wires_.value(key(c)); w && w->isVisible() && w->crosses(line)) out << c;
  return out;
}

void GraphScene::removeWire(WireItem* w) {
  wires_.remove(key(w->connection()));
  w->fromNode()->wires().removeOne(w);
  w->toNode()->wires().removeOne(w);
  removeItem(w);
  delete w;
}

void GraphScene::onNodeRemoved(const QString& id) {
  NodeItem* n = nodes_.take(id);
  if (!n) return;
  const QList<WireItem*> wires = n->wires();
  for (WireItem* w : wires) removeWire(w);
  if (drag_.hoverNode == n) drag_.hoverNode = nullptr;
  removeItem(n);
  delete n;
}

void GraphScene::onNodeMoved(const QString& id) {
  NodeItem* n = nodes_.value(id);
  const core::GraphNode* gn = document()->node(id);
  if (n && gn && n->pos() != gn->position) n->setPos(gn->position);
}

void GraphScene::onParamsChanged(const QString& id) {
  if (NodeItem* n = nodes_.value(id)) n->rebuild();
}

void GraphScene::onConnectionAdded(const GraphConnection& c) {
  NodeItem* from = nodes_.value(c.from.node);
  NodeItem* to = nodes_.value(c.to.node);
  if (!from || !to || wires_.contains(key(c))) return;
  if (from->portIndex(true, c.from.port) < 0) from->rebuild();
  if (to->portIndex(false, c.to.port) < 0) to->rebuild();
  const int fi = from->portIndex(true, c.from.port), ti = to->portIndex(false, c.to.port);
  if (fi < 0 || ti < 0) return;  // a port the type does not have: validation reports it
  auto* w = new WireItem(from, fi, to, ti, c);
  wires_.insert(key(c), w);
  addItem(w);
}

void GraphScene::onConnectionRemoved(const GraphConnection& c) {
  if (WireItem* w = wires_.value(key(c))) {
    NodeItem *from = w->fromNode(), *to = w->toNode();
    removeWire(w);
    if (editor_->portsOf(from->id()).missing) from->rebuild();
    if (editor_->portsOf(to->id()).missing) to->rebuild();
  }
}

QStringList GraphScene::selectedNodeIds() const {
  QStringList ids;
  // Document order, so copies and deletes are deterministic.
  for (const core::GraphNode& n : document()->nodes())
    if (NodeItem* item = nodes_.value(n.id); item && item->isSelected()) ids << n.id;
  return ids;
}

QList<GraphConnection> GraphScene::selectedConnections() const {
  QList<GraphConnection> out;
  for (QGraphicsItem* i : selectedItems())
    if (i->type() == WireItem::Type) out << static_cast<WireItem*>(i)->connection();
  return out;
}

void GraphScene::selectNodes(const QStringList& ids) {
  clearSelection();
  for (const QString& id : ids)
    if (NodeItem* n = nodes_.value(id)) n->setSelected(true);
}

QRectF GraphScene::nodesRect(bool selectedOnly) const {
  QRectF r;
  for (NodeItem* n : nodes_)
    if (!selectedOnly || n->isSelected()) r = r.united(n->sceneBoundingRect());
  return r;
}

void GraphScene::resetRunState() {
  for (NodeItem* n : std::as_const(nodes_)) {
    if (n->runStatus() != RunStatus::Idle || !n->runError().isEmpty() || !n->warnings().isEmpty())
      n->setRunState(RunStatus::Idle);
    n->setPreview({});
  }
}

void GraphScene::setPreviews(const QJsonObject& report) {
  const QJsonObject nodes = report.value("nodes").toObject(), metrics = report.value("metrics").toObject();
  for (NodeItem* n : std::as_const(nodes_))
    n->setPreview(NodePreview::fromReport(n->id(), nodes.value(n->id()).toObject(), metrics));
}

void GraphScene::setRunStatus(const QString& node, RunStatus s, double timeMs, const QString& error) {
  if (NodeItem* n = nodes_.value(node)) n->setRunState(s, timeMs, error);
}

void GraphScene::setCached(const QString& node) {
  if (NodeItem* n = nodes_.value(node)) {
    n->setRunState(RunStatus::Done);
    n->setCached(true);
  }
}

void GraphScene::setProgress(const QString& node, double p) {
  if (NodeItem* n = nodes_.value(node)) n->setProgress(p);
}

void GraphScene::setRunWarning(const QString& node, const QString& message) {
  if (NodeItem* n = nodes_.value(node)) n->setRunWarning(message);
}

void GraphScene::setValidation(const core::ValidationReport& report) {
  QHash<QString, QStringList> errs, warns;
  for (const core::Issue& i : report.issues()) {
    if (i.node.isEmpty()) continue;
    const QString text = i.field.isEmpty() ? i.message : i.field + ": " + i.message;
    (i.severity == core::Issue::Severity::Error ? errs : warns)[i.node] << text;
  }
  for (NodeItem* n : std::as_const(nodes_)) {
    n->setIssues(errs.value(n->id()), warns.value(n->id()));
    // A node the report says nothing about (its upstream has an error) loses what it showed before.
    n->setFacts(report.facts().value(n->id()).badge);
  }
}

void GraphScene::setWireDrag(const WireDrag& d) {
  drag_ = d;
  for (NodeItem* n : std::as_const(nodes_)) n->update();
}

void GraphScene::setWireHover(NodeItem* node, int port) {
  if (drag_.hoverNode == node && drag_.hoverPort == port) return;
  NodeItem* old = drag_.hoverNode;
  drag_.hoverNode = node;
  drag_.hoverPort = port;
  if (old) old->update();
  if (node) node->update();
}

bool GraphScene::portDimmed(const NodeItem* node, bool output, int index) const {
  if (!drag_.active) return false;
  if (node->id() == drag_.node || output == drag_.fromOutput) return true;
  if (editor_->portsOf(node->id()).missing) return true;
  if (drag_.fromOutput) return !core::portAccepts(node->inputs()[index].type, drag_.type);
  return !core::portAccepts(drag_.type, node->outputs()[index].type);
}

void GraphScene::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  QGraphicsScene::mousePressEvent(e);
  dragStart_.clear();
  commentStart_.clear();
  if (e->button() != Qt::LeftButton) return;
  for (QGraphicsItem* i : selectedItems()) {
    if (i->type() == NodeItem::Type) dragStart_.insert(static_cast<NodeItem*>(i)->id(), i->pos());
    if (i->type() == CommentItem::Type) {
      auto* c = static_cast<CommentItem*>(i);
      c->capture();
      commentStart_.insert(c->id(), c->pos());
      for (NodeItem* n : c->captured()) dragStart_.insert(n->id(), n->pos());
    }
  }
  // A wire whose both ends move keeps its bends where they were relative to the nodes. Only when the press
  // starts a move: not on a reroute point, which is dragged on its own.
  carried_.clear();
  const QGraphicsItem* grabber = mouseGrabberItem();
  if (!grabber || (grabber->type() != NodeItem::Type && grabber->type() != CommentItem::Type)) return;
  for (auto it = wires_.begin(); it != wires_.end(); ++it)
    if (!it.value()->points().isEmpty() && dragStart_.contains(it.value()->fromNode()->id()) &&
        dragStart_.contains(it.value()->toNode()->id())) {
      it.value()->beginCarry();
      carried_ << it.key();
    }
}

void GraphScene::mouseReleaseEvent(QGraphicsSceneMouseEvent* e) {
  QGraphicsScene::mouseReleaseEvent(e);
  QList<QPair<GraphConnection, QList<QPointF>>> bent;  // carried wires whose points moved
  for (const QString& k : std::as_const(carried_))
    if (WireItem* w = wires_.value(k)) {
      if (w->points() != GraphEditor::reroutePoints(w->connection()))
        bent.append({w->connection(), w->points()});
      w->endCarry();
    }
  carried_.clear();
  bool framesMoved = false;
  for (auto it = commentStart_.begin(); it != commentStart_.end(); ++it)
    if (CommentItem* c = comments_.value(it.key()); c && c->pos() != it.value()) framesMoved = true;
  commentStart_.clear();
  if (dragStart_.isEmpty() && !framesMoved) return;
  QHash<QString, QPair<QPointF, QPointF>> moves;
  for (auto it = dragStart_.begin(); it != dragStart_.end(); ++it)
    if (NodeItem* n = nodes_.value(it.key()); n && n->pos() != it.value())
      moves.insert(it.key(), {it.value(), n->pos()});
  dragStart_.clear();
  if (!framesMoved && bent.isEmpty()) {
    editor_->recordMove(moves);
    return;
  }
  // Frames, the nodes they carried and the bends of the wires between moved nodes move back together on
  // undo.
  editor_->undoStack()->beginMacro(framesMoved         ? QString("Move comment frame")
                                   : moves.size() == 1 ? QString("Move %1").arg(moves.begin().key())
                                                       : QString("Move %1 nodes").arg(moves.size()));
  editor_->recordMove(moves);
  for (const auto& [c, points] : std::as_const(bent))
    editor_->setReroutePoints(c, points, "Move reroute points");
  if (framesMoved) {
    QList<CommentFrame> frames;
    for (const CommentFrame& f : editor_->comments())
      frames << (comments_.contains(f.id) ? comments_.value(f.id)->frame() : f);
    editor_->setComments(frames, "Move comment frame");
  }
  editor_->undoStack()->endMacro();
}

void GraphScene::mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() == Qt::LeftButton)
    for (QGraphicsItem* i : items(e->scenePos()))
      if (i->type() == RerouteItem::Type) {
        // Double-clicking a reroute point removes it.
        auto* r = static_cast<RerouteItem*>(i);
        QList<QPointF> points = r->wire()->points();
        points.removeAt(r->index());
        editor_->setReroutePoints(r->wire()->connection(), points, "Remove reroute point");
        return;
      }
  for (QGraphicsItem* i : items(e->scenePos()))
    if (i->type() == NodeItem::Type) {
      emit nodeDoubleClicked(static_cast<NodeItem*>(i)->id());
      return;
    }
  if (e->button() == Qt::LeftButton)
    for (QGraphicsItem* i : items(e->scenePos()))
      if (i->type() == WireItem::Type) {
        // Double-clicking a wire bends it there: a reroute point where the click was.
        auto* w = static_cast<WireItem*>(i);
        QList<QPointF> points = w->points();
        points.insert(w->insertionIndex(e->scenePos()), e->scenePos());
        editor_->setReroutePoints(w->connection(), points, "Add reroute point");
        return;
      }
  QGraphicsScene::mouseDoubleClickEvent(e);
}

// ----------------------------------------------------------------------------------------------------
// GraphView

GraphView::GraphView(GraphScene* scene, QWidget* parent) : QGraphicsView(scene, parent), scene_(scene) {
  setObjectName("canvas");
  setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
  setViewportUpdateMode(SmartViewportUpdate);
  // Items set their own pen, brush, font and hints each paint, so the view need not save and restore them.
  setOptimizationFlags(DontSavePainterState | DontAdjustForAntialiasing);
  setDragMode(RubberBandDrag);
  setRubberBandSelectionMode(Qt::IntersectsItemShape);
  setTransformationAnchor(NoAnchor);
  setResizeAnchor(AnchorViewCenter);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setFrameShape(QFrame::NoFrame);
  setAcceptDrops(true);
  setFocusPolicy(Qt::StrongFocus);
  setMouseTracking(true);

  auto make = [this](const QString& text, const QList<QKeySequence>& keys, auto slot) {
    auto* a = new QAction(text, this);
    a->setShortcuts(keys);
    // Only while the canvas has focus: Delete or F in a text field belongs to the field.
    a->setShortcutContext(Qt::WidgetWithChildrenShortcut);
    addAction(a);
    connect(a, &QAction::triggered, this, slot);
    return a;
  };
  delete_ =
      make("Delete", {QKeySequence::Delete, QKeySequence(Qt::Key_Backspace)}, [this] { deleteSelection(); });
  comment_ = make("Comment frame", {QKeySequence(Qt::Key_C)}, [this] { addCommentFrame(); });
  duplicate_ = make("Duplicate", {QKeySequence(Qt::CTRL | Qt::Key_D)}, [this] {
    const QStringList ids = scene_->editor()->duplicate(scene_->selectedNodeIds());
    if (!ids.isEmpty()) scene_->selectNodes(ids);
  });
  copy_ = make("Copy", {QKeySequence::Copy}, [this] { copySelection(); });
  cut_ = make("Cut", {QKeySequence::Cut}, [this] {
    copySelection();
    deleteSelection();
  });
  paste_ = make("Paste", {QKeySequence::Paste}, [this] { pasteClipboard(); });
  bypass_ = make("Bypass", {QKeySequence(Qt::CTRL | Qt::Key_B)},
                 [this] { scene_->editor()->toggleBypassed(scene_->selectedNodeIds()); });
  mute_ = make("Mute", {QKeySequence(Qt::CTRL | Qt::Key_M)},
               [this] { scene_->editor()->toggleMuted(scene_->selectedNodeIds()); });
  frame_ = make("Frame all / selection", {QKeySequence(Qt::Key_F)}, [this] { frame(true); });
  selectAll_ = make("Select all", {QKeySequence::SelectAll}, [this] {
    for (QGraphicsItem* i : scene_->items())
      if (i->type() == NodeItem::Type) i->setSelected(true);
  });
  collapse_ = make("Collapse / expand", {QKeySequence(Qt::Key_H)}, [this] { toggleCollapseSelection(); });
  for (Arrangement a : kArrangements) {
    QAction* action = make(arrangementName(a), {}, [this, a] { arrangeSelection(a); });
    action->setToolTip(QString("%1 (%2 or more selected nodes; one undo step)")
                           .arg(arrangementName(a))
                           .arg(arrangementMinimum(a)));
    arrange_ << action;
  }
  connect(scene_, &QGraphicsScene::selectionChanged, this, [this] {
    int nodes = 0;
    for (const QGraphicsItem* i : scene_->selectedItems()) nodes += i->type() == NodeItem::Type;
    for (int i = 0; i < arrange_.size(); ++i)
      arrange_[i]->setEnabled(nodes >= arrangementMinimum(kArrangements[i]));
  });
  for (QAction* a : arrange_) a->setEnabled(false);
  findBar_ = new FindBar(this);
  find_ = make("Find…", {QKeySequence::Find}, [this] { findBar_->open(); });
  // Anywhere in the window: the find bar searches the canvas wherever the focus was.
  find_->setShortcutContext(Qt::WindowShortcut);
  minimap_ = new Minimap(this);
  auto* search = new QAction("Add node…", this);
  search->setShortcuts({QKeySequence(Qt::Key_Tab), QKeySequence(Qt::SHIFT | Qt::Key_A)});
  search->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  addAction(search);
  connect(search, &QAction::triggered, this, [this] {
    QPoint p = viewport()->mapFromGlobal(QCursor::pos());
    if (!viewport()->rect().contains(p)) p = viewport()->rect().center();
    openNodeSearch(p);
  });
}

void GraphView::arrangeSelection(Arrangement a) {
  QList<NodeRect> rects;
  for (const QString& id : scene_->selectedNodeIds())
    if (NodeItem* n = scene_->nodeItem(id)) rects << NodeRect{id, n->sceneBodyRect()};
  if (rects.size() < arrangementMinimum(a)) {
    emit message(
        QString("%1 needs %2 or more selected nodes").arg(arrangementName(a)).arg(arrangementMinimum(a)),
        false);
    return;
  }
  scene_->editor()->moveNodes(arrange(rects, a), arrangementName(a));
}

void GraphView::toggleCollapseSelection() {
  const QStringList ids = scene_->selectedNodeIds();
  if (ids.isEmpty()) return;
  bool allCollapsed = true;
  for (const QString& id : ids) allCollapsed = allCollapsed && scene_->editor()->isCollapsed(id);
  scene_->editor()->setCollapsed(ids, !allCollapsed);
}

QMenu* GraphView::arrangeMenu(QWidget* parent) const {
  auto* menu = new QMenu("&Arrange", parent);
  for (QAction* a : arrange_) {
    menu->addAction(a);
    if (a == arrange_[3]) menu->addSeparator();  // align above, distribute below
  }
  return menu;
}

void GraphView::resizeEvent(QResizeEvent* e) {
  QGraphicsView::resizeEvent(e);
  if (findBar_->isVisible()) findBar_->place();
}

void GraphView::deleteSelection() {
  GraphEditor* ed = scene_->editor();
  const QStringList nodes = scene_->selectedNodeIds(), frames = scene_->selectedCommentIds();
  const QList<GraphConnection> wires = scene_->selectedConnections();
  if (frames.isEmpty()) {
    ed->remove(nodes, wires);
    return;
  }
  ed->undoStack()->beginMacro("Delete");
  ed->remove(nodes, wires);
  ed->removeComments(frames);
  ed->undoStack()->endMacro();
}

QString GraphView::addCommentFrame(std::optional<QPoint> at) {
  QRectF r = scene_->nodesRect(true);
  if (r.isNull()) {
    QPoint vp = at.value_or(viewport()->mapFromGlobal(QCursor::pos()));
    if (!viewport()->rect().contains(vp)) vp = viewport()->rect().center();
    r = QRectF(mapToScene(vp), QSizeF(320, 200));
  } else {
    r.adjust(-30, -30 - 28, 30, 30);  // room for the frame's title above the nodes
  }
  return scene_->editor()->addComment(r, "Comment");
}

void GraphView::setZoom(double z) {
  QTransform t;
  t.scale(z, z);
  setTransform(t);
}

void GraphView::zoomAt(double factor, QPoint vp) {
  const double target = qBound(0.05, zoom() * factor, 4.0);
  factor = target / zoom();
  if (std::abs(factor - 1) < 1e-9) return;
  // Keep the scene point under the cursor where it is.
  const QPointF before = mapToScene(vp);
  scale(factor, factor);
  const QPointF delta = mapFromScene(before) - QPointF(vp);
  horizontalScrollBar()->setValue(horizontalScrollBar()->value() + qRound(delta.x()));
  verticalScrollBar()->setValue(verticalScrollBar()->value() + qRound(delta.y()));
}

void GraphView::frame(bool selectionOnly, double maxZoom) {
  QRectF r = selectionOnly ? scene_->nodesRect(true) : QRectF();
  if (r.isNull()) r = scene_->nodesRect(false);
  if (r.isNull()) {
    setZoom(1);
    centerOn(0, 0);
    return;
  }
  r.adjust(-40, -40, 40, 40);
  fitInView(r, Qt::KeepAspectRatio);
  if (zoom() > maxZoom) setZoom(maxZoom);
  if (zoom() < 0.05) setZoom(0.05);
  centerOn(r.center());
}

void GraphView::centerOnNode(const QString& id) {
  if (NodeItem* n = scene_->nodeItem(id)) centerOn(n->sceneBoundingRect().center());
}

NodeItem* GraphView::nodeAt(QPoint vp) const {
  for (QGraphicsItem* i : items(vp))
    if (i->type() == NodeItem::Type) return static_cast<NodeItem*>(i);
  return nullptr;
}

Endpoint GraphView::originEndpoint() const {
  const auto& ports = wireFromOutput_ ? wireNode_->outputs() : wireNode_->inputs();
  return Endpoint{wireNode_->id(), ports[wirePort_].name};
}

GraphView::Target GraphView::targetAt(QPointF sp) const {
  Target t;
  for (QGraphicsItem* i : scene_->items(sp))
    if (i->type() == NodeItem::Type) {
      t.node = static_cast<NodeItem*>(i);
      break;
    }
  if (!t.node) return t;
  GraphEditor* ed = scene_->editor();
  const Endpoint origin = originEndpoint();
  auto problemFor = [&](int port) {
    if (wireFromOutput_)
      return ed->connectionProblem(origin, {t.node->id(), t.node->inputs()[port].name},
                                   picked_ ? &*picked_ : nullptr);
    return ed->connectionProblem({t.node->id(), t.node->outputs()[port].name}, origin);
  };
  if (auto hit = t.node->portAt(t.node->mapFromScene(sp), 12)) {
    t.port = hit->index;
    if (hit->output == wireFromOutput_)
      t.problem = hit->output ? "both ports are outputs: drag from an output to an input"
                              : "both ports are inputs: drag from an output to an input";
    else
      t.problem = problemFor(hit->index);
    return t;
  }
  // Over a node's body: snap to its first port that can take the wire.
  const int n = int(wireFromOutput_ ? t.node->inputs().size() : t.node->outputs().size());
  QString first;
  for (int i = 0; i < n; ++i) {
    const QString p = problemFor(i);
    if (p.isEmpty()) {
      t.port = i;
      return t;
    }
    if (first.isEmpty()) first = p;
  }
  t.problem = t.node->id() == wireNode_->id() ? QString("a node cannot feed itself")
              : first.isEmpty()
                  ? QString("%1 has no %2").arg(t.node->id(), wireFromOutput_ ? "inputs" : "outputs")
                  : first;
  return t;
}

void GraphView::beginWire(NodeItem* node, bool output, int index, std::optional<GraphConnection> picked) {
  wiring_ = true;
  wireNode_ = node;
  wirePort_ = index;
  wireFromOutput_ = output;
  picked_ = picked;
  if (picked_)
    if (WireItem* w = scene_->wireItem(*picked_)) w->setVisible(false);
  const core::PortType type = output ? node->outputs()[index].type : node->inputs()[index].type;
  pending_ = new QGraphicsPathItem;
  pending_->setPen(QPen(style::portColor(type), 2.2, Qt::DashLine));
  pending_->setZValue(5);
  scene_->addItem(pending_);
  GraphScene::WireDrag d;
  d.active = true;
  d.fromOutput = output;
  d.type = type;
  d.node = node->id();
  scene_->setWireDrag(d);
}

void GraphView::endWireDrag() {
  wiring_ = false;
  if (pending_) {
    scene_->removeItem(pending_);
    delete pending_;
    pending_ = nullptr;
  }
  if (picked_)
    if (WireItem* w = scene_->wireItem(*picked_)) w->setVisible(true);
  picked_.reset();
  scene_->setWireDrag({});
  QToolTip::hideText();
}

void GraphView::finishWire(QMouseEvent* e) {
  const QPointF sp = mapToScene(e->position().toPoint());
  const Target t = targetAt(sp);
  const Endpoint origin = originEndpoint();
  const bool fromOutput = wireFromOutput_;
  const std::optional<GraphConnection> picked = picked_;
  endWireDrag();
  GraphEditor* ed = scene_->editor();
  if (t.node) {
    if (t.port < 0 || !t.problem.isEmpty()) {
      // Dropping a lifted wire back on its own input changes nothing.
      if (picked && t.node->id() == picked->to.node && t.port >= 0 &&
          t.node->inputs()[t.port].name == picked->to.port)
        return;
      emit message("Not connected: " + t.problem, true);
      return;
    }
    const Endpoint other{t.node->id(),
                         fromOutput ? t.node->inputs()[t.port].name : t.node->outputs()[t.port].name};
    const Endpoint from = fromOutput ? origin : other, to = fromOutput ? other : origin;
    QString why;
    const bool ok = picked ? ed->reconnect(*picked, from, to, &why) : ed->connect(from, to, &why);
    if (!ok) emit message("Not connected: " + why, true);
    return;
  }
  if (picked) {
    ed->disconnect(*picked);
    return;
  }
  openNodeSearch(e->position().toPoint(), origin, fromOutput);
}

void GraphView::endCut(bool apply) {
  if (!cutLine_) return;
  const QLineF line = cutLine_->line();
  scene_->removeItem(cutLine_);
  delete cutLine_;
  cutLine_ = nullptr;
  if (!apply) return;
  const QList<GraphConnection> crossed = scene_->wiresCrossing(line);
  if (!crossed.isEmpty()) scene_->editor()->cutWires(crossed);
}

void GraphView::mousePressEvent(QMouseEvent* e) {
  // Ctrl+right-drag cuts: every wire the line crosses goes on release (Blender's gesture).
  if (e->button() == Qt::RightButton && (e->modifiers() & Qt::ControlModifier) && !wiring_) {
    const QPointF sp = mapToScene(e->position().toPoint());
    cutLine_ = new QGraphicsLineItem(QLineF(sp, sp));
    cutLine_->setPen(QPen(kError, 0, Qt::DashLine));
    cutLine_->setZValue(6);
    scene_->addItem(cutLine_);
    viewport()->setCursor(Qt::CrossCursor);
    e->accept();
    return;
  }
  if (e->button() == Qt::MiddleButton || (e->button() == Qt::LeftButton && spaceHeld_)) {
    panning_ = true;
    lastPan_ = e->position().toPoint();
    viewport()->setCursor(Qt::ClosedHandCursor);
    e->accept();
    return;
  }
  if (e->button() == Qt::LeftButton && !wiring_) {
    if (NodeItem* n = nodeAt(e->position().toPoint())) {
      if (auto hit = n->portAt(n->mapFromScene(mapToScene(e->position().toPoint())))) {
        std::optional<GraphConnection> picked;
        if (!hit->output) {
          // Dragging from a wired input lifts its wire off, as in Blender: drop it elsewhere or on nothing.
          for (WireItem* w : n->wires())
            if (w->toNode() == n && w->connection().to.port == n->inputs()[hit->index].name)
              picked = w->connection();
        }
        if (picked) {
          WireItem* w = scene_->wireItem(*picked);
          beginWire(w->fromNode(), true, w->fromNode()->portIndex(true, picked->from.port), picked);
        } else {
          beginWire(n, hit->output, hit->index, std::nullopt);
        }
        e->accept();
        return;
      }
    }
  }
  QGraphicsView::mousePressEvent(e);
}

void GraphView::mouseMoveEvent(QMouseEvent* e) {
  if (cutLine_) {
    cutLine_->setLine(QLineF(cutLine_->line().p1(), mapToScene(e->position().toPoint())));
    e->accept();
    return;
  }
  if (panning_) {
    const QPoint d = e->position().toPoint() - lastPan_;
    lastPan_ = e->position().toPoint();
    horizontalScrollBar()->setValue(horizontalScrollBar()->value() - d.x());
    verticalScrollBar()->setValue(verticalScrollBar()->value() - d.y());
    e->accept();
    return;
  }
  if (wiring_) {
    const QPointF sp = mapToScene(e->position().toPoint());
    const Target t = targetAt(sp);
    QPointF end = sp;
    if (t.node && t.port >= 0 && t.problem.isEmpty()) end = t.node->portScenePos(!wireFromOutput_, t.port);
    const QPointF start = wireNode_->portScenePos(wireFromOutput_, wirePort_);
    pending_->setPath(wireFromOutput_ ? WireItem::bezier(start, end) : WireItem::bezier(end, start));
    scene_->setWireHover(t.node, t.problem.isEmpty() ? t.port : -1);
    if (t.node && !t.problem.isEmpty()) {
      QToolTip::showText(e->globalPosition().toPoint(), t.problem, this);
      emit message(t.problem, false);
    } else {
      QToolTip::hideText();
    }
    e->accept();
    return;
  }
  QGraphicsView::mouseMoveEvent(e);
}

void GraphView::mouseReleaseEvent(QMouseEvent* e) {
  if (cutLine_ && e->button() == Qt::RightButton) {
    cutLine_->setLine(QLineF(cutLine_->line().p1(), mapToScene(e->position().toPoint())));
    viewport()->unsetCursor();
    endCut(true);
    e->accept();
    return;
  }
  if (panning_ && (e->button() == Qt::MiddleButton || e->button() == Qt::LeftButton)) {
    panning_ = false;
    if (spaceHeld_)
      viewport()->setCursor(Qt::OpenHandCursor);
    else
      viewport()->unsetCursor();
    e->accept();
    return;
  }
  if (wiring_ && e->button() == Qt::LeftButton) {
    finishWire(e);
    e->accept();
    return;
  }
  QGraphicsView::mouseReleaseEvent(e);
}

void GraphView::wheelEvent(QWheelEvent* e) {
  const int dy = e->angleDelta().y() != 0 ? e->angleDelta().y() : e->angleDelta().x();
  zoomAt(std::pow(1.0015, dy), e->position().toPoint());
  e->accept();
}

void GraphView::keyPressEvent(QKeyEvent* e) {
  if (e->key() == Qt::Key_Space && !e->isAutoRepeat()) {
    spaceHeld_ = true;
    viewport()->setCursor(Qt::OpenHandCursor);
    e->accept();
    return;
  }
  if (e->key() == Qt::Key_Escape && wiring_) {
    endWireDrag();
    e->accept();
    return;
  }
  if (e->key() == Qt::Key_Escape && cutLine_) {
    viewport()->unsetCursor();
    endCut(false);
    e->accept();
    return;
  }
  QGraphicsView::keyPressEvent(e);
}

void GraphView::keyReleaseEvent(QKeyEvent* e) {
  if (e->key() == Qt::Key_Space && !e->isAutoRepeat()) {
    spaceHeld_ = false;
    if (!panning_) viewport()->unsetCursor();
    e->accept();
    return;
  }
  QGraphicsView::keyReleaseEvent(e);
}

void GraphView::focusOutEvent(QFocusEvent* e) {
  spaceHeld_ = false;
  QGraphicsView::focusOutEvent(e);
}

void GraphView::drawBackground(QPainter* p, const QRectF& rect) {
  p->fillRect(rect, QColor(0x1b, 0x1d, 0x21));
  p->setRenderHint(QPainter::Antialiasing, false);
  const double z = zoom();
  // Grid lines closer than 10 px on screen are noise (and cost): skip that level.
  for (const auto& [step, color] :
       {std::pair{20.0, QColor(0x23, 0x26, 0x2b)}, std::pair{100.0, QColor(0x2d, 0x31, 0x37)}}) {
    if (step * z < 10) continue;
    QVarLengthArray<QLineF, 512> lines;
    const double left = std::floor(rect.left() / step) * step, top = std::floor(rect.top() / step) * step;
    for (double x = left; x < rect.right(); x += step) lines.append(QLineF(x, rect.top(), x, rect.bottom()));
    for (double y = top; y < rect.bottom(); y += step) lines.append(QLineF(rect.left(), y, rect.right(), y));
    p->setPen(QPen(color, 0));
    p->drawLines(lines.data(), int(lines.size()));
  }
}

namespace {
bool droppable(const QMimeData* mime) {
  return mime->hasFormat(kNodeTypeMime) || mime->hasFormat(kBlockMime);
}
}  // namespace

void GraphView::dragEnterEvent(QDragEnterEvent* e) {
  if (droppable(e->mimeData()))
    e->acceptProposedAction();
  else
    QGraphicsView::dragEnterEvent(e);
}

void GraphView::dragMoveEvent(QDragMoveEvent* e) {
  if (droppable(e->mimeData()))
    e->acceptProposedAction();
  else
    QGraphicsView::dragMoveEvent(e);
}

void GraphView::dropEvent(QDropEvent* e) {
  if (!droppable(e->mimeData())) {
    QGraphicsView::dropEvent(e);
    return;
  }
  const QPointF sp = mapToScene(e->position().toPoint()) - QPointF(20, 13);
  if (e->mimeData()->hasFormat(kBlockMime)) {
    emit blockDropped(QString::fromUtf8(e->mimeData()->data(kBlockMime)), sp);
  } else {
    const QString id = scene_->editor()->addNode(QString::fromUtf8(e->mimeData()->data(kNodeTypeMime)), sp);
    scene_->selectNodes({id});
  }
  e->acceptProposedAction();
  setFocus();
}

QWidget* GraphView::openNodeSearch(QPoint vp, std::optional<Endpoint> dragged, bool draggedIsOutput) {
  GraphEditor* ed = scene_->editor();
  QList<NodeSearchPopup::Entry> entries;
  std::optional<core::PortType> draggedType;
  if (dragged) {
    const NodePorts ports = ed->portsOf(dragged->node);
    for (const core::PortSpec& p : draggedIsOutput ? ports.outputs : ports.inputs)
      if (p.name == dragged->port) draggedType = p.type;
  }
  if (ed->registry())
    for (const core::NodeTypePtr& t : ed->registry()->types()) {
      const core::NodeTypeSpec& s = t->spec();
      if (dragged) {
        bool ok = false;
        if (draggedType)
          for (const core::PortSpec& p : draggedIsOutput ? s.inputs : s.outputs)
            ok = ok || (draggedIsOutput ? core::portAccepts(p.type, *draggedType)
                                        : core::portAccepts(*draggedType, p.type));
        if (!ok) continue;
      }
      entries << NodeSearchPopup::Entry{s.name, s.category, s.description};
    }
  const QString heading = dragged && draggedType
                              ? QString("Nodes that %1 a %2")
                                    .arg(draggedIsOutput ? "take" : "give", core::portTypeName(*draggedType))
                              : QString();
  auto* popup = new NodeSearchPopup(entries, heading, this);
  const QPointF sp = mapToScene(vp);
  connect(popup, &NodeSearchPopup::chosen, this, [this, sp, dragged, draggedIsOutput](const QString& type) {
    GraphEditor* ed = scene_->editor();
    QString id;
    if (dragged)
      id = ed->addNodeWired(type, draggedIsOutput ? sp - QPointF(0, 20) : sp - QPointF(190, 20), *dragged,
                            draggedIsOutput);
    else
      id = ed->addNode(type, sp - QPointF(20, 13));
    if (!id.isEmpty()) scene_->selectNodes({id});
    setFocus();
  });
  popup->popup(viewport()->mapToGlobal(vp));
  return popup;
}

void GraphView::copySelection() {
  const QStringList ids = scene_->selectedNodeIds();
  if (ids.isEmpty()) return;
  const QByteArray bytes = scene_->editor()->copy(ids);
  auto* mime = new QMimeData;
  mime->setData(kClipboardMime, bytes);
  mime->setText(QString::fromUtf8(bytes));  // the same JSON as a file, for pasting into a text editor
  QApplication::clipboard()->setMimeData(mime);
  emit message(QString("Copied %1 node(s)").arg(ids.size()), false);
}

void GraphView::pasteClipboard() {
  const QMimeData* mime = QApplication::clipboard()->mimeData();
  if (!mime) return;
  const QByteArray bytes =
      mime->hasFormat(kClipboardMime) ? mime->data(kClipboardMime) : mime->text().toUtf8();
  if (bytes.trimmed().isEmpty()) return;
  QPoint vp = viewport()->mapFromGlobal(QCursor::pos());
  if (!viewport()->rect().contains(vp)) vp = viewport()->rect().center();
  QString error;
  const QStringList ids = scene_->editor()->paste(bytes, mapToScene(vp), &error);
  if (ids.isEmpty())
    emit message("Paste failed: " + error, true);
  else
    scene_->selectNodes(ids);
}

void GraphView::contextMenuEvent(QContextMenuEvent* e) {
  // A Ctrl+right press starts a cut, not a menu.
  if (e->reason() == QContextMenuEvent::Mouse && ((e->modifiers() & Qt::ControlModifier) || cutLine_)) {
    e->accept();
    return;
  }
  QMenu menu(this);
  GraphEditor* ed = scene_->editor();
  if (NodeItem* n = nodeAt(e->pos())) {
    if (!n->isSelected()) scene_->selectNodes({n->id()});
    for (const QString& err : n->errors())
      if (GraphEditor::isDeviceMismatch(err)) {
        const QString id = n->id();
        menu.addAction("Insert Copy node", this, [this, ed, id, err] {
          QString why;
          if (!ed->insertCopyNode(id, err, &why)) emit message("Insert Copy node: " + why, true);
        });
        menu.addSeparator();
        break;
      }
    menu.addAction("Run to here", this, [this] { emit runToHereRequested(scene_->selectedNodeIds()); });
    menu.addAction(bypass_);
    menu.addAction(mute_);
    menu.addSeparator();
    menu.addAction(duplicate_);
    menu.addAction(copy_);
    menu.addAction(cut_);
    menu.addAction(delete_);
    menu.addAction(comment_);
    menu.addSeparator();
    menu.addAction(collapse_);
    menu.addMenu(arrangeMenu(&menu));
    menu.addAction(frame_);
  } else {
    WireItem* wire = nullptr;
    for (QGraphicsItem* i : items(e->pos()))
      if (i->type() == WireItem::Type) {
        wire = static_cast<WireItem*>(i);
        break;
      }
    CommentItem* frame = nullptr;
    for (QGraphicsItem* i : items(e->pos()))
      if (i->type() == CommentItem::Type) {
        frame = static_cast<CommentItem*>(i);
        break;
      }
    if (wire) {
      const GraphConnection c = wire->connection();
      menu.addAction(QString("Disconnect %1 → %2").arg(c.from.str(), c.to.str()), this,
                     [ed, c] { ed->disconnect(c); });
      const QPointF sp = mapToScene(e->pos());
      menu.addAction("Add reroute point here", this, [ed, c, sp, wire] {
        QList<QPointF> points = wire->points();
        points.insert(wire->insertionIndex(sp), sp);
        ed->setReroutePoints(c, points, "Add reroute point");
      });
      if (!wire->points().isEmpty())
        menu.addAction("Remove reroute points", this,
                       [ed, c] { ed->setReroutePoints(c, {}, "Remove reroute points"); });
    } else if (frame) {
      const QString id = frame->id();
      QMenu* colors = menu.addMenu("Colour");
      for (const auto& [name, color] : GraphEditor::commentColors()) {
        QPixmap swatch(14, 14);
        swatch.fill(color);
        QAction* a =
            colors->addAction(QIcon(swatch), name, this, [ed, id, color] { ed->setCommentColor(id, color); });
        a->setCheckable(true);
        a->setChecked(frame->frame().color == color);
      }
      menu.addAction("Delete frame", this, [ed, id] { ed->removeComments({id}); });
    } else {
      const QPoint vp = e->pos();
      menu.addAction("Add node…", this, [this, vp] { openNodeSearch(vp); });
      menu.addAction("Add comment frame", this, [this, vp] { addCommentFrame(vp); });
      menu.addAction(paste_);
      menu.addAction(selectAll_);
      menu.addAction(frame_);
    }
  }
  menu.exec(e->globalPos());
}

}  // namespace gn::editor
