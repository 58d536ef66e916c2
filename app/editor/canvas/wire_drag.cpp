#include "canvas/wire_drag.h"

#include <QGraphicsPathItem>
#include <QPen>
#include <QToolTip>

#include "canvas/graph_scene.h"
#include "canvas/item_at.h"
#include "canvas/node_item.h"
#include "canvas/wire_item.h"
#include "style.h"

namespace gn::editor {

using core::Endpoint;
using core::GraphConnection;

WireDragController::WireDragController(GraphScene* scene, QWidget* tooltipWidget)
    : QObject(tooltipWidget), scene_(scene), tooltipWidget_(tooltipWidget) {}

Endpoint WireDragController::originEndpoint() const {
  const auto& ports = fromOutput_ ? node_->outputs() : node_->inputs();
  return Endpoint{node_->id(), ports[port_].name};
}

QString WireDragController::problemFor(const NodeItem* target, int port) const {
  GraphEditor* ed = scene_->editor();
  const Endpoint origin = originEndpoint();
  if (fromOutput_)
    return ed->connectionProblem(origin, {target->id(), target->inputs()[port].name},
                                 picked_ ? &*picked_ : nullptr);
  return ed->connectionProblem({target->id(), target->outputs()[port].name}, origin);
}

WireDragController::Target WireDragController::targetAt(QPointF sp) const {
  Target t;
  t.node = itemAt<NodeItem>(scene_, sp);
  if (!t.node) return t;
  if (auto hit = t.node->portAt(t.node->mapFromScene(sp), 12)) {
    t.port = hit->index;
    if (hit->output == fromOutput_)
      t.problem = hit->output ? "both ports are outputs: drag from an output to an input"
                              : "both ports are inputs: drag from an output to an input";
    else
      t.problem = problemFor(t.node, hit->index);
    return t;
  }
  // Over a node's body: snap to its first port that can take the wire.
  const int n = int(fromOutput_ ? t.node->inputs().size() : t.node->outputs().size());
  QString first;
  for (int i = 0; i < n; ++i) {
    const QString p = problemFor(t.node, i);
    if (p.isEmpty()) {
      t.port = i;
      return t;
    }
    if (first.isEmpty()) first = p;
  }
  t.problem = t.node->id() == node_->id() ? QString("a node cannot feed itself")
              : first.isEmpty()
                  ? QString("%1 has no %2").arg(t.node->id(), fromOutput_ ? "inputs" : "outputs")
                  : first;
  return t;
}

bool WireDragController::pressAt(NodeItem* n, QPointF scenePos) {
  if (active_ || !n) return false;
  const auto hit = n->portAt(n->mapFromScene(scenePos));
  if (!hit) return false;
  std::optional<GraphConnection> picked;
  if (!hit->output)
    for (WireItem* w : n->wires())
      if (w->toNode() == n && w->connection().to.port == n->inputs()[hit->index].name)
        picked = w->connection();
  if (picked) {
    WireItem* w = scene_->wireItem(*picked);
    begin(w->fromNode(), true, w->fromNode()->portIndex(true, picked->from.port), picked);
  } else {
    begin(n, hit->output, hit->index, std::nullopt);
  }
  return true;
}

void WireDragController::begin(NodeItem* node, bool output, int index,
                               std::optional<GraphConnection> picked) {
  active_ = true;
  node_ = node;
  port_ = index;
  fromOutput_ = output;
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

void WireDragController::moveTo(QPointF sp, QPoint globalPos) {
  if (!active_) return;
  const Target t = targetAt(sp);
  QPointF end = sp;
  if (t.node && t.port >= 0 && t.problem.isEmpty()) end = t.node->portScenePos(!fromOutput_, t.port);
  const QPointF start = node_->portScenePos(fromOutput_, port_);
  pending_->setPath(fromOutput_ ? WireItem::bezier(start, end) : WireItem::bezier(end, start));
  scene_->setWireHover(t.node, t.problem.isEmpty() ? t.port : -1);
  if (t.node && !t.problem.isEmpty()) {
    QToolTip::showText(globalPos, t.problem, tooltipWidget_);
    emit message(t.problem, false);
  } else {
    QToolTip::hideText();
  }
}

void WireDragController::cancel() {
  active_ = false;
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

std::optional<WireDragController::LooseEnd> WireDragController::releaseAt(QPointF sp) {
  if (!active_) return std::nullopt;
  const Target t = targetAt(sp);
  const Endpoint origin = originEndpoint();
  const bool fromOutput = fromOutput_;
  const std::optional<GraphConnection> picked = picked_;
  cancel();
  GraphEditor* ed = scene_->editor();
  if (t.node) {
    if (t.port < 0 || !t.problem.isEmpty()) {
      // Dropping a lifted wire back on its own input changes nothing.
      if (picked && t.node->id() == picked->to.node && t.port >= 0 &&
          t.node->inputs()[t.port].name == picked->to.port)
        return std::nullopt;
      emit message("Not connected: " + t.problem, true);
      return std::nullopt;
    }
    const Endpoint other{t.node->id(),
                         fromOutput ? t.node->inputs()[t.port].name : t.node->outputs()[t.port].name};
    const Endpoint from = fromOutput ? origin : other, to = fromOutput ? other : origin;
    QString why;
    const bool ok = picked ? ed->reconnect(*picked, from, to, &why) : ed->connect(from, to, &why);
    if (!ok) emit message("Not connected: " + why, true);
    return std::nullopt;
  }
  if (picked) {
    ed->disconnect(*picked);
    return std::nullopt;
  }
  return LooseEnd{origin, fromOutput};
}

}  // namespace gn::editor
