#include "canvas/node_item.h"

#include <QGraphicsSceneHoverEvent>
#include <QGraphicsSceneMouseEvent>

#include "canvas/graph_scene.h"
#include "canvas/node_painter.h"
#include "canvas/wire_item.h"
#include "style.h"

namespace gn::editor {

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
  typeName_ = clippedText(n->type, 60);
  bypassed_ = n->bypassed;
  muted_ = n->muted;
  // Neither runs: both fade, a muted node (which takes its dependents along) more.
  setOpacity(muted_ ? 0.4 : bypassed_ ? 0.6 : 1.0);
  ports_ = scene_->editor()->portsOf(id_);
  const core::NodeTypeSpec* spec = scene_->editor()->specOf(id_);
  headerColor_ = style::categoryColor(spec ? spec->category : QString("missing"));
  layout();
  if (pos() != n->position) setPos(n->position);
  // Ports may have moved (a missing node gains ports from its wires): re-anchor the wires.
  for (WireItem* w : wires_)
    w->setPorts(w->fromNode()->portIndex(true, w->connection().from.port),
                w->toNode()->portIndex(false, w->connection().to.port));
}

void NodeItem::layout() {
  const core::GraphNode* n = scene_->document()->node(id_);
  const core::NodeTypeSpec* spec = scene_->editor()->specOf(id_);
  NodeContent content;
  content.typeName = typeName_;
  content.id = clippedText(id_, 60);
  content.ports = ports_;
  if (spec && n) {
    // Three at most: the geometry keeps as many as the facts leave room for.
    for (const core::ParamSpec& ps : spec->params) {
      if (content.summaryLines.size() == 3) break;
      const QJsonValue v = n->params.contains(ps.name) ? n->params.value(ps.name) : ps.defaultValue;
      content.summaryLines << QString("%1  %2").arg(ps.name, style::formatValue(v));
    }
  } else {
    content.summaryLines << QString("type '%1' is not loaded").arg(typeName_);
  }
  content.facts = facts_;
  content.firstError = errors().value(0);
  content.previewHeight = preview_.empty() ? 0 : preview_.height();
  content.collapsed = collapsed_;
  prepareGeometryChange();
  geometry_.layout(content, badgeText());
  update();
}

void NodeItem::relayoutHeader() {
  const QString badge = badgeText();
  if (badge != geometry_.badge()) geometry_.layoutHeader(badge);
  update();
}

QPainterPath NodeItem::shape() const {
  QPainterPath p;
  p.addRect(geometry_.bounds());
  return p;
}

void NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  NodePainter::paint(p, option, *this);
}

int NodeItem::portIndex(bool output, const QString& name) const {
  const QList<core::PortSpec>& ports = output ? ports_.outputs : ports_.inputs;
  for (int i = 0; i < ports.size(); ++i)
    if (ports[i].name == name) return i;
  return -1;
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
  relayoutHeader();
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
    relayoutHeader();
}

void NodeItem::setProgress(double p) {
  if (p == progress_) return;
  progress_ = p;
  relayoutHeader();
}

void NodeItem::setRunWarning(const QString& w) {
  runWarning_ = w;
  update();
}

void NodeItem::setFacts(const QString& badge, const QString& detail) {
  factsDetail_ = detail;
  if (badge == facts_) return;
  facts_ = badge;
  layout();
}

QStringList NodeItem::factsLines() const {
  QStringList lines;
  for (const QStaticText& t : geometry_.factLines()) lines << t.text();
  return lines;
}

void NodeItem::setIssues(const QStringList& errors, const QStringList& warnings) {
  if (errors == issueErrors_ && warnings == issueWarnings_) return;
  issueErrors_ = errors;
  issueWarnings_ = warnings;
  layout();
}

void NodeItem::setCollapsed(bool collapsed) {
  if (collapsed == collapsed_) return;
  collapsed_ = collapsed;
  layout();
  for (WireItem* w : wires_) w->updatePath();
}

void NodeItem::setPreview(const NodePreview& preview) {
  if (preview.empty() && preview_.empty()) return;
  preview_ = preview;
  layout();
}

void NodeItem::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() == Qt::LeftButton && collapseToggleRect().adjusted(-2, -2, 2, 2).contains(e->pos())) {
    scene_->editor()->setCollapsed({id_}, !collapsed_);
    e->accept();
    return;
  }
  QGraphicsItem::mousePressEvent(e);
}

QVariant NodeItem::itemChange(GraphicsItemChange change, const QVariant& value) {
  if (change == ItemPositionHasChanged) {
    for (WireItem* w : wires_) w->updatePath();
  } else if (change == ItemSelectedHasChanged) {
    setZValue(value.toBool() ? 1 : 0);
  }
  return QGraphicsItem::itemChange(change, value);
}

QString NodeItem::tooltipAt(QPointF itemPos) const {
  if (collapseToggleRect().adjusted(-2, -2, 2, 2).contains(itemPos))
    return collapsed_ ? QString("Expand the node (H)") : QString("Collapse the node to its title bar (H)");
  if (auto hit = portAt(itemPos)) {
    const core::PortSpec& ps = hit->output ? ports_.outputs[hit->index] : ports_.inputs[hit->index];
    QString tip = QString("<b>%1</b> · %2 %3")
                      .arg(ps.name, core::portTypeName(ps.type), hit->output ? "output" : "input");
    if (!hit->output) tip += ps.required ? " (required)" : " (optional)";
    if (!ps.doc.isEmpty()) tip += "<br>" + ps.doc.toHtmlEscaped();
    return tip;
  }
  const QStringList errs = errors(), warns = warnings();
  const core::NodeTypeSpec* spec = scene_->editor()->specOf(id_);
  QString tip = QString("<b>%1</b> (%2)").arg(clippedText(id_, 60), typeName_);
  if (spec && !spec->description.isEmpty()) tip += "<br>" + spec->description.toHtmlEscaped();
  if (!facts_.isEmpty()) tip += "<br><b>" + clippedText(facts_).toHtmlEscaped() + "</b>";
  if (!factsDetail_.isEmpty()) tip += "<br>" + clippedText(factsDetail_).toHtmlEscaped();
  if (status_ != RunStatus::Idle) tip += "<br>status: " + runStatusName(status_);
  if (status_ == RunStatus::Done) tip += ", " + style::formatMs(timeMs_);
  for (const QString& m : errs) tip += "<br><font color='#ff7b7b'>" + m.toHtmlEscaped() + "</font>";
  for (const QString& m : warns) tip += "<br><font color='#e6b43c'>" + m.toHtmlEscaped() + "</font>";
  if (!errs.isEmpty())
    for (const core::IssueFix& fix : scene_->editor()->fixesFor(id_))
      tip += "<br><i>Right-click: " + fix.label.toHtmlEscaped() + "</i>";
  return tip;
}

void NodeItem::hoverMoveEvent(QGraphicsSceneHoverEvent* e) {
  const QString tip = tooltipAt(e->pos());
  if (toolTip() != tip) setToolTip(tip);
  QGraphicsItem::hoverMoveEvent(e);
}

}  // namespace gn::editor
