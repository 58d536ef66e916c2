#include "canvas/graph_scene.h"

#include <QGraphicsSceneMouseEvent>
#include <QUndoStack>

#include "canvas/item_at.h"

namespace gn::editor {

using core::GraphConnection;

GraphScene::GraphScene(GraphEditor* editor, QObject* parent) : QGraphicsScene(parent), editor_(editor) {
  setSceneRect(-100000, -100000, 200000, 200000);
  setItemIndexMethod(BspTreeIndex);
  core::GraphDocument* doc = editor_->document();
  connect(doc, &core::GraphDocument::nodeAdded, this, &GraphScene::onNodeAdded);
  connect(doc, &core::GraphDocument::nodeRemoved, this, &GraphScene::onNodeRemoved);
  connect(doc, &core::GraphDocument::nodeMoved, this, &GraphScene::onNodeMoved);
  connect(doc, &core::GraphDocument::paramsChanged, this, &GraphScene::onParamsChanged);
  connect(doc, &core::GraphDocument::runModeChanged, this, &GraphScene::onParamsChanged);
  connect(doc, &core::GraphDocument::subgraphChanged, this, &GraphScene::onSubgraphChanged);
  connect(doc, &core::GraphDocument::connectionAdded, this, &GraphScene::addWireItem);
  connect(doc, &core::GraphDocument::connectionRemoved, this, &GraphScene::onConnectionRemoved);
  connect(doc, &core::GraphDocument::connectionChanged, this, &GraphScene::onConnectionChanged);
  connect(doc, &core::GraphDocument::reset, this, &GraphScene::rebuildAll);
  connect(editor_, &GraphEditor::commentsChanged, this, &GraphScene::rebuildComments);
  connect(editor_, &GraphEditor::collapsedChanged, this, &GraphScene::onCollapsedChanged);
  rebuildAll();
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

QList<CommentFrame> GraphScene::framesAsShown() const {
  QList<CommentFrame> frames;
  for (const CommentFrame& f : editor_->comments())
    frames << (comments_.contains(f.id) ? comments_.value(f.id)->frame() : f);
  return frames;
}

void GraphScene::commitComments(const QString& text) {
  const QList<CommentFrame> frames = framesAsShown();
  // Deferred: the frames are rebuilt from the document, and the item that asked may still be in its handler.
  QMetaObject::invokeMethod(
      this, [this, frames, text] { editor_->setComments(frames, text); }, Qt::QueuedConnection);
}

void GraphScene::rebuildAll() {
  drag_ = {};
  lastAdded_.clear();
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
  for (const GraphConnection& c : doc->connections()) addWireItem(c);
  rebuildComments();
}

void GraphScene::addNodeItem(const QString& id) {
  if (nodes_.contains(id)) return;
  auto* item = new NodeItem(this, id);
  item->setCollapsed(editor_->isCollapsed(id));
  nodes_.insert(id, item);
  addItem(item);
}

void GraphScene::onNodeAdded(const QString& id) {
  addNodeItem(id);
  lastAdded_ = id;
}

void GraphScene::onSubgraphChanged(const QString& id) {
  // A subgraph's ports may have changed: its item and wires are made again.
  const bool selected = nodes_.value(id) && nodes_.value(id)->isSelected();
  onNodeRemoved(id);
  addNodeItem(id);
  for (const GraphConnection& c : document()->connections())
    if (c.from.node == id || c.to.node == id) addWireItem(c);
  if (NodeItem* n = nodes_.value(id)) n->setSelected(selected);
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

void GraphScene::addWireItem(const GraphConnection& c) {
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
  for (const core::GraphNode& n : document()->nodes())
    if (NodeItem* item = nodes_.value(n.id); item && item->isSelected()) ids << n.id;
  return ids;
}

QList<GraphConnection> GraphScene::selectedConnections() const {
  QList<GraphConnection> out;
  for (QGraphicsItem* i : selectedItems())
    if (auto* w = qgraphicsitem_cast<WireItem*>(i)) out << w->connection();
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
    if (n->runStatus() != RunStatus::Idle || !n->runError().isEmpty() || n->hasWarnings())
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
    QStringList& into = (i.severity == core::Issue::Severity::Error ? errs : warns)[i.node];
    if (!into.contains(text)) into << text;
  }
  for (NodeItem* n : std::as_const(nodes_)) {
    n->setIssues(errs.value(n->id()), warns.value(n->id()));
    // A node the report says nothing about (its upstream has an error) loses what it showed before.
    const core::NodeFacts facts = report.facts().value(n->id());
    n->setFacts(facts.badge, facts.detail);
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
    if (auto* n = qgraphicsitem_cast<NodeItem*>(i)) dragStart_.insert(n->id(), n->pos());
    if (auto* c = qgraphicsitem_cast<CommentItem*>(i)) {
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
  if (framesMoved) editor_->setComments(framesAsShown(), "Move comment frame");
  editor_->undoStack()->endMacro();
}

void GraphScene::mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) {
  const bool left = e->button() == Qt::LeftButton;
  if (RerouteItem* r = left ? editor::itemAt<RerouteItem>(this, e->scenePos()) : nullptr) {
    // Double-clicking a reroute point removes it.
    QList<QPointF> points = r->wire()->points();
    points.removeAt(r->index());
    editor_->setReroutePoints(r->wire()->connection(), points, "Remove reroute point");
    return;
  }
  if (NodeItem* n = editor::itemAt<NodeItem>(this, e->scenePos())) {
    emit nodeDoubleClicked(n->id());
    return;
  }
  if (WireItem* w = left ? editor::itemAt<WireItem>(this, e->scenePos()) : nullptr) {
    // Double-clicking a wire bends it there: a reroute point where the click was.
    QList<QPointF> points = w->points();
    points.insert(w->insertionIndex(e->scenePos()), e->scenePos());
    editor_->setReroutePoints(w->connection(), points, "Add reroute point");
    return;
  }
  QGraphicsScene::mouseDoubleClickEvent(e);
}

}  // namespace gn::editor
