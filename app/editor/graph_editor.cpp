#include "graph_editor.h"

#include <QJsonArray>
#include <QSet>
#include <QUndoCommand>
#include <limits>

#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/subgraph.h"

namespace gn::editor {

using core::Endpoint;
using core::GraphConnection;
using core::GraphDocument;
using core::GraphNode;

namespace {

void applyForward(GraphDocument* doc, const GraphDelta& d) {
  for (const GraphConnection& c : d.removeConnections) doc->removeConnection(c);
  for (const GraphNode& n : d.removeNodes) doc->removeNode(n.id);
  for (const GraphNode& n : d.addNodes) doc->addNode(n);
  for (const GraphConnection& c : d.addConnections) doc->addConnection(c);
}

GraphDelta inverse(const GraphDelta& d) {
  GraphDelta inv;
  inv.removeNodes = d.addNodes;
  inv.addNodes = d.removeNodes;
  inv.removeConnections = d.addConnections;
  inv.addConnections = d.removeConnections;
  return inv;
}

enum CommandId { kMove = 1, kParam = 2, kSetting = 3, kSubgraph = 4 };

QJsonArray commentsJson(const QList<CommentFrame>& frames) {
  QJsonArray a;
  for (const CommentFrame& f : frames)
    a.append(QJsonObject{{"id", f.id},
                         {"rect", QJsonArray{f.rect.x(), f.rect.y(), f.rect.width(), f.rect.height()}},
                         {"text", f.text},
                         {"color", f.color.name()}});
  return a;
}

class CommentsCommand : public QUndoCommand {
 public:
  CommentsCommand(GraphEditor* editor, QJsonArray before, QJsonArray after, const QString& text)
      : QUndoCommand(text), editor_(editor), before_(std::move(before)), after_(std::move(after)) {}
  void redo() override { apply(after_); }
  void undo() override { apply(before_); }

 private:
  void apply(const QJsonArray& a) {
    QJsonObject extra = editor_->document()->extra();
    if (a.isEmpty())
      extra.remove("comments");
    else
      extra.insert("comments", a);
    editor_->document()->setExtra(extra);
    emit editor_->commentsChanged();
  }
  GraphEditor* editor_;
  QJsonArray before_, after_;
};

class DeltaCommand : public QUndoCommand {
 public:
  DeltaCommand(GraphDocument* doc, GraphDelta delta, const QString& text, bool alreadyApplied)
      : QUndoCommand(text), doc_(doc), delta_(std::move(delta)), skip_(alreadyApplied) {}
  void redo() override {
    if (skip_) {
      skip_ = false;  // paste has already changed the document; later redos replay the recorded delta
      return;
    }
    applyForward(doc_, delta_);
  }
  void undo() override { applyForward(doc_, inverse(delta_)); }

 private:
  GraphDocument* doc_;
  GraphDelta delta_;
  bool skip_;
};

class MoveCommand : public QUndoCommand {
 public:
  // A named move (align, distribute) stays a step of its own; an unnamed one (a drag) merges with the next
  // drag of the same nodes.
  MoveCommand(GraphDocument* doc, QHash<QString, QPair<QPointF, QPointF>> moves, const QString& text = {})
      : doc_(doc), moves_(std::move(moves)), mergeable_(text.isEmpty()) {
    setText(!text.isEmpty()      ? text
            : moves_.size() == 1 ? QString("Move %1").arg(moves_.begin().key())
                                 : QString("Move %1 nodes").arg(moves_.size()));
  }
  int id() const override { return mergeable_ ? kMove : -1; }
  bool mergeWith(const QUndoCommand* other) override {
    auto* o = static_cast<const MoveCommand*>(other);
    if (o->moves_.size() != moves_.size()) return false;
    for (auto it = o->moves_.begin(); it != o->moves_.end(); ++it)
      if (!moves_.contains(it.key())) return false;
    for (auto it = o->moves_.begin(); it != o->moves_.end(); ++it)
      moves_[it.key()].second = it.value().second;
    return true;
  }
  void redo() override {
    for (auto it = moves_.begin(); it != moves_.end(); ++it) doc_->setPosition(it.key(), it.value().second);
  }
  void undo() override {
    for (auto it = moves_.begin(); it != moves_.end(); ++it) doc_->setPosition(it.key(), it.value().first);
  }

 private:
  GraphDocument* doc_;
  QHash<QString, QPair<QPointF, QPointF>> moves_;
  bool mergeable_;
};

// Changes one wire's extra fields (its reroute points).
class ConnectionExtraCommand : public QUndoCommand {
 public:
  ConnectionExtraCommand(GraphDocument* doc, GraphConnection c, QJsonObject before, QJsonObject after,
                         const QString& text)
      : QUndoCommand(text),
        doc_(doc),
        conn_(std::move(c)),
        before_(std::move(before)),
        after_(std::move(after)) {}
  void redo() override { doc_->setConnectionExtra(conn_, after_); }
  void undo() override { doc_->setConnectionExtra(conn_, before_); }

 private:
  GraphDocument* doc_;
  GraphConnection conn_;
  QJsonObject before_, after_;
};

// Replaces the view's "collapsed" list. The view is not an edit to the document (no signal), so the editor
// tells the canvas.
class CollapseCommand : public QUndoCommand {
 public:
  CollapseCommand(GraphEditor* editor, QJsonArray before, QJsonArray after, const QString& text)
      : QUndoCommand(text), editor_(editor), before_(std::move(before)), after_(std::move(after)) {}
  void redo() override { apply(after_); }
  void undo() override { apply(before_); }

 private:
  void apply(const QJsonArray& a) {
    QJsonObject view = editor_->document()->view();
    if (a.isEmpty())
      view.remove("collapsed");
    else
      view.insert("collapsed", a);
    editor_->document()->setView(view);
    emit editor_->collapsedChanged();
  }
  GraphEditor* editor_;
  QJsonArray before_, after_;
};

class ParamCommand : public QUndoCommand {
 public:
  ParamCommand(GraphDocument* doc, QString node, QString param, QJsonValue before, QJsonValue after)
      : QUndoCommand(QString("Set %1.%2").arg(node, param)),
        doc_(doc),
        node_(std::move(node)),
        param_(std::move(param)),
        before_(std::move(before)),
        after_(std::move(after)) {}
  int id() const override { return kParam; }
  // Typing into a spin box makes one step per param, not one per keystroke.
  bool mergeWith(const QUndoCommand* other) override {
    auto* o = static_cast<const ParamCommand*>(other);
    if (o->node_ != node_ || o->param_ != param_) return false;
    after_ = o->after_;
    setObsolete(after_ == before_);
    return true;
  }
  void redo() override { doc_->setParam(node_, param_, after_); }
  void undo() override { doc_->setParam(node_, param_, before_); }

 private:
  GraphDocument* doc_;
  QString node_, param_;
  QJsonValue before_, after_;
};

// Bypass or mute on several nodes at once: one step.
class RunModeCommand : public QUndoCommand {
 public:
  enum class Mode { Bypass, Mute };
  RunModeCommand(GraphDocument* doc, Mode mode, QStringList nodes, QList<bool> before, bool after)
      : QUndoCommand(QString("%1 %2 %3")
                         .arg(after ? "" : "Un-", mode == Mode::Bypass ? "bypass" : "mute")
                         .arg(nodes.size() == 1 ? nodes.front() : QString("%1 nodes").arg(nodes.size()))
                         .trimmed()),
        doc_(doc),
        mode_(mode),
        nodes_(std::move(nodes)),
        before_(std::move(before)),
        after_(after) {}
  void redo() override {
    for (const QString& n : nodes_) set(n, after_);
  }
  void undo() override {
    for (int i = 0; i < nodes_.size(); ++i) set(nodes_[i], before_[i]);
  }

 private:
  void set(const QString& node, bool on) {
    if (mode_ == Mode::Bypass)
      doc_->setBypassed(node, on);
    else
      doc_->setMuted(node, on);
  }
  GraphDocument* doc_;
  Mode mode_;
  QStringList nodes_;
  QList<bool> before_;
  bool after_;
};

class SettingCommand : public QUndoCommand {
 public:
  SettingCommand(GraphDocument* doc, QString key, QJsonValue before, QJsonValue after)
      : QUndoCommand(QString("Set %1").arg(key)),
        doc_(doc),
        key_(std::move(key)),
        before_(std::move(before)),
        after_(std::move(after)) {}
  int id() const override { return kSetting; }
  bool mergeWith(const QUndoCommand* other) override {
    auto* o = static_cast<const SettingCommand*>(other);
    if (o->key_ != key_) return false;
    after_ = o->after_;
    setObsolete(after_ == before_);
    return true;
  }
  void redo() override { apply(after_); }
  void undo() override { apply(before_); }

 private:
  void apply(const QJsonValue& v) {
    QJsonObject s = doc_->settings();
    if (v.isUndefined())
      s.remove(key_);
    else
      s.insert(key_, v);
    doc_->setSettings(s);
  }
  GraphDocument* doc_;
  QString key_;
  QJsonValue before_, after_;
};

// Reroute points as the file keeps them: whole scene units, so the file stays readable and a save and a
// load give the same points.
QJsonArray pointsJson(const QList<QPointF>& points, QPointF offset = {}) {
  QJsonArray a;
  for (const QPointF& p : points)
    a.append(QJsonArray{qRound(p.x() + offset.x()), qRound(p.y() + offset.y())});
  return a;
}

class SubgraphCommand : public QUndoCommand {
 public:
  SubgraphCommand(GraphDocument* doc, QString node, core::SubgraphPtr before, core::SubgraphPtr after,
                  const QString& text, QString mergeKey)
      : QUndoCommand(text),
        doc_(doc),
        node_(std::move(node)),
        before_(std::move(before)),
        after_(std::move(after)),
        mergeKey_(std::move(mergeKey)) {}
  int id() const override { return mergeKey_.isEmpty() ? -1 : kSubgraph; }
  bool mergeWith(const QUndoCommand* other) override {
    auto* o = static_cast<const SubgraphCommand*>(other);
    if (o->node_ != node_ || o->mergeKey_ != mergeKey_) return false;
    after_ = o->after_;
    return true;
  }
  void redo() override { doc_->setSubgraph(node_, after_); }
  void undo() override { doc_->setSubgraph(node_, before_); }

 private:
  GraphDocument* doc_;
  QString node_;
  core::SubgraphPtr before_, after_;
  QString mergeKey_;
};

GraphDelta deltaOf(const core::subgraph::Change& change) {
  return {change.removeNodes, change.addNodes, change.removeConnections, change.addConnections};
}

QList<GraphConnection> touching(const GraphDocument& doc, const QString& id) {
  QList<GraphConnection> out = doc.connectionsTo(id);
  for (const GraphConnection& c : doc.connectionsFrom(id))
    if (!out.contains(c)) out << c;
  return out;
}

}  // namespace

GraphEditor::GraphEditor(GraphDocument* doc, const core::NodeTypeRegistry* registry, QObject* parent)
    : QObject(parent), doc_(doc), registry_(registry) {}

const core::NodeTypeSpec* GraphEditor::specOf(const QString& nodeId) const {
  const GraphNode* n = doc_->node(nodeId);
  if (!n || !registry_) return nullptr;
  if (core::subgraph::isSubgraph(*n)) {
    SubgraphSpec& cached = subgraphSpecs_[nodeId];
    if (!cached.spec || cached.subgraph != n->subgraph)
      cached = {n->subgraph, std::make_shared<core::NodeTypeSpec>(core::subgraph::spec(*n, *registry_))};
    return cached.spec.get();
  }
  core::NodeTypePtr t = registry_->find(n->type);
  return t ? &t->spec() : nullptr;
}

NodePorts GraphEditor::portsOf(const QString& nodeId) const {
  NodePorts p;
  if (const core::NodeTypeSpec* s = specOf(nodeId)) {
    p.inputs = s->inputs;
    p.outputs = s->outputs;
    return p;
  }
  p.missing = true;
  QSet<QString> seen;
  for (const GraphConnection& c : doc_->connectionsTo(nodeId))
    if (!seen.contains("i" + c.to.port)) {
      seen.insert("i" + c.to.port);
      p.inputs << core::PortSpec{c.to.port, core::PortType::Tensor, false, {}};
    }
  for (const GraphConnection& c : doc_->connectionsFrom(nodeId))
    if (!seen.contains("o" + c.from.port)) {
      seen.insert("o" + c.from.port);
      p.outputs << core::PortSpec{c.from.port, core::PortType::Tensor, false, {}};
    }
  return p;
}

bool GraphEditor::wouldCycle(const QString& fromNode, const QString& toNode,
                             const GraphConnection* ignore) const {
  // Adding from -> to closes a cycle when `from` is already downstream of `to`.
  QSet<QString> seen{toNode};
  QList<QString> stack{toNode};
  while (!stack.isEmpty()) {
    const QString n = stack.takeLast();
    if (n == fromNode) return true;
    for (const GraphConnection& c : doc_->connectionsFrom(n))
      if (!seen.contains(c.to.node) && !(ignore && c == *ignore)) {
        seen.insert(c.to.node);
        stack << c.to.node;
      }
  }
  return false;
}

QString GraphEditor::connectionProblem(const Endpoint& from, const Endpoint& to,
                                       const GraphConnection* ignore) const {
  const GraphNode* a = doc_->node(from.node);
  const GraphNode* b = doc_->node(to.node);
  if (!a || !b) return "that node no longer exists";
  if (from.node == to.node) return "a node cannot feed itself";
  if (!specOf(from.node)) return QString("%1's type '%2' is not loaded").arg(from.node, a->type);
  if (!specOf(to.node)) return QString("%1's type '%2' is not loaded").arg(to.node, b->type);
  const core::PortSpec* out = specOf(from.node)->output(from.port);
  const core::PortSpec* in = specOf(to.node)->input(to.port);
  if (!out) return QString("%1 has no output '%2'").arg(from.node, from.port);
  if (!in) return QString("%1 has no input '%2'").arg(to.node, to.port);
  if (!core::portAccepts(in->type, out->type))
    return QString("%1 gives a %2, but %3 takes a %4")
        .arg(from.str(), core::portTypeName(out->type), to.str(), core::portTypeName(in->type));
  const GraphConnection wire{from, to, {}};
  if (doc_->connections().contains(wire) && !(ignore && wire == *ignore)) return "already connected";
  if (wouldCycle(from.node, to.node, ignore))
    return QString("this wire would make a cycle (%1 already depends on %2)").arg(from.node, to.node);
  return {};
}

void GraphEditor::applyDelta(const GraphDelta& delta, const QString& text) {
  if (delta.empty()) return;
  undo_.push(new DeltaCommand(doc_, delta, text, false));
}

QString GraphEditor::addNode(const QString& type, QPointF pos) {
  GraphNode n;
  n.id = doc_->makeId(type);
  n.type = type;
  n.position = pos;
  GraphDelta d;
  d.addNodes << n;
  applyDelta(d, QString("Add %1").arg(n.id));
  return n.id;
}

QString GraphEditor::addNodeWired(const QString& type, QPointF pos, const Endpoint& dragged,
                                  bool draggedIsOutput) {
  core::NodeTypePtr t = registry_ ? registry_->find(type) : nullptr;
  const core::NodeTypeSpec* draggedSpec = specOf(dragged.node);
  if (!t || !draggedSpec) return {};
  GraphNode n;
  n.id = doc_->makeId(type);
  n.type = type;
  n.position = pos;
  GraphDelta d;
  d.addNodes << n;
  if (draggedIsOutput) {
    const core::PortSpec* out = draggedSpec->output(dragged.port);
    for (const core::PortSpec& in : t->spec().inputs)
      if (out && core::portAccepts(in.type, out->type)) {
        d.addConnections << GraphConnection{dragged, {n.id, in.name}, {}};
        break;
      }
  } else {
    const core::PortSpec* in = draggedSpec->input(dragged.port);
    for (const core::PortSpec& out : t->spec().outputs)
      if (in && core::portAccepts(in->type, out.type)) {
        // The input takes one wire: the new one replaces whatever fed it.
        d.removeConnections = doc_->connectionsTo(dragged.node);
        d.removeConnections.erase(
            std::remove_if(d.removeConnections.begin(), d.removeConnections.end(),
                           [&](const GraphConnection& c) { return c.to.port != dragged.port; }),
            d.removeConnections.end());
        d.addConnections << GraphConnection{{n.id, out.name}, dragged, {}};
        break;
      }
  }
  applyDelta(d, QString("Add %1").arg(n.id));
  return n.id;
}

bool GraphEditor::connect(const Endpoint& from, const Endpoint& to, QString* why) {
  const QString problem = connectionProblem(from, to);
  if (!problem.isEmpty()) {
    if (why) *why = problem;
    return false;
  }
  GraphDelta d;
  for (const GraphConnection& c : doc_->connectionsTo(to.node))
    if (c.to.port == to.port) d.removeConnections << c;
  d.addConnections << GraphConnection{from, to, {}};
  applyDelta(d, QString("Connect %1 → %2").arg(from.str(), to.str()));
  return true;
}

bool GraphEditor::reconnect(const GraphConnection& old, const Endpoint& newFrom, const Endpoint& to,
                            QString* why) {
  if (to.node.isEmpty()) {
    disconnect(old);
    return true;
  }
  if (old.from == newFrom && old.to == to) return true;
  // Check against the graph without the old wire, which is being moved, not kept.
  const QString p = connectionProblem(newFrom, to, &old);
  if (!p.isEmpty()) {
    if (why) *why = p;
    return false;
  }
  GraphDelta d;
  d.removeConnections << old;
  for (const GraphConnection& c : doc_->connectionsTo(to.node))
    if (c.to.port == to.port && !(c == old)) d.removeConnections << c;
  d.addConnections << GraphConnection{newFrom, to, {}};
  applyDelta(d, QString("Connect %1 → %2").arg(newFrom.str(), to.str()));
  return true;
}

void GraphEditor::disconnect(const GraphConnection& c) {
  const qsizetype i = doc_->connections().indexOf(c);
  if (i < 0) return;
  GraphDelta d;
  d.removeConnections << doc_->connections()[i];  // as stored, with its reroute points, for undo
  applyDelta(d, QString("Disconnect %1 → %2").arg(c.from.str(), c.to.str()));
}

void GraphEditor::remove(const QStringList& nodeIds, const QList<GraphConnection>& connections) {
  GraphDelta d;
  for (const GraphConnection& c : connections)
    if (const qsizetype i = doc_->connections().indexOf(c); i >= 0 && !d.removeConnections.contains(c))
      d.removeConnections << doc_->connections()[i];
  for (const QString& id : nodeIds) {
    const GraphNode* n = doc_->node(id);
    if (!n) continue;
    d.removeNodes << *n;
    for (const GraphConnection& c : touching(*doc_, id))
      if (!d.removeConnections.contains(c)) d.removeConnections << c;
  }
  QString text = d.removeNodes.size() == 1 ? QString("Delete %1").arg(d.removeNodes.first().id)
                                           : QString("Delete %1 nodes").arg(d.removeNodes.size());
  if (d.removeNodes.isEmpty()) text = "Delete wires";
  // A deleted node leaves the collapsed list too, or a later node given its id would start collapsed.
  QStringList collapsed;
  for (const GraphNode& n : d.removeNodes)
    if (isCollapsed(n.id)) collapsed << n.id;
  if (collapsed.isEmpty()) {
    applyDelta(d, text);
    return;
  }
  undo_.beginMacro(text);
  applyDelta(d, text);
  setCollapsed(collapsed, false);
  undo_.endMacro();
}

void GraphEditor::recordMove(const QHash<QString, QPair<QPointF, QPointF>>& oldAndNew) {
  QHash<QString, QPair<QPointF, QPointF>> moved;
  for (auto it = oldAndNew.begin(); it != oldAndNew.end(); ++it)
    if (it.value().first != it.value().second) moved.insert(it.key(), it.value());
  if (!moved.isEmpty()) undo_.push(new MoveCommand(doc_, moved));
}

void GraphEditor::moveNodes(const QHash<QString, QPointF>& positions, const QString& text) {
  QHash<QString, QPair<QPointF, QPointF>> moves;
  for (auto it = positions.begin(); it != positions.end(); ++it)
    if (const GraphNode* n = doc_->node(it.key()); n && n->position != it.value())
      moves.insert(it.key(), {n->position, it.value()});
  if (!moves.isEmpty()) undo_.push(new MoveCommand(doc_, moves, text));
}

QList<QPointF> GraphEditor::reroutePoints(const GraphConnection& c) {
  QList<QPointF> points;
  for (const QJsonValue& v : c.extra.value("points").toArray()) {
    const QJsonArray xy = v.toArray();
    // A hand-edited file's bad entry is skipped rather than drawn at the origin.
    if (xy.size() != 2 || !xy[0].isDouble() || !xy[1].isDouble()) continue;
    points << QPointF(xy[0].toDouble(), xy[1].toDouble());
  }
  return points;
}

void GraphEditor::setReroutePoints(const GraphConnection& c, const QList<QPointF>& points,
                                   const QString& text) {
  const qsizetype i = doc_->connections().indexOf(c);
  if (i < 0) return;
  const QJsonObject before = doc_->connections()[i].extra;
  QJsonObject after = before;
  if (points.isEmpty())
    after.remove("points");
  else
    after.insert("points", pointsJson(points));
  if (after == before) return;
  undo_.push(new ConnectionExtraCommand(doc_, doc_->connections()[i], before, after, text));
}

void GraphEditor::cutWires(const QList<GraphConnection>& wires) {
  GraphDelta d;
  for (const GraphConnection& c : wires)
    if (const qsizetype i = doc_->connections().indexOf(c); i >= 0 && !d.removeConnections.contains(c))
      d.removeConnections << doc_->connections()[i];  // with its points, which undo brings back
  applyDelta(d, d.removeConnections.size() == 1 ? QString("Cut 1 wire")
                                                : QString("Cut %1 wires").arg(d.removeConnections.size()));
}

bool GraphEditor::isCollapsed(const QString& nodeId) const {
  return doc_->view().value("collapsed").toArray().contains(nodeId);
}

void GraphEditor::setCollapsed(const QStringList& nodeIds, bool collapsed) {
  const QJsonArray before = doc_->view().value("collapsed").toArray();
  QStringList ids;
  for (const QJsonValue& v : before) ids << v.toString();
  for (const QString& id : nodeIds) {
    if (collapsed && !ids.contains(id) && doc_->hasNode(id)) ids << id;
    if (!collapsed) ids.removeAll(id);
  }
  ids.sort();  // the same set always saves the same bytes
  const QJsonArray after = QJsonArray::fromStringList(ids);
  if (after == before) return;
  const QString what = nodeIds.size() == 1 ? nodeIds.first() : QString("%1 nodes").arg(nodeIds.size());
  undo_.push(new CollapseCommand(this, before, after, (collapsed ? "Collapse " : "Expand ") + what));
}

void GraphEditor::setParam(const QString& nodeId, const QString& param, const QJsonValue& value) {
  const GraphNode* n = doc_->node(nodeId);
  if (!n) return;
  const QJsonValue before = n->params.value(param);
  if (before == value) return;
  undo_.push(new ParamCommand(doc_, nodeId, param, before, value));
}

void GraphEditor::toggleBypassed(const QStringList& nodeIds) {
  toggleRunMode(nodeIds, true);
}

void GraphEditor::toggleMuted(const QStringList& nodeIds) {
  toggleRunMode(nodeIds, false);
}

void GraphEditor::toggleRunMode(const QStringList& nodeIds, bool bypass) {
  QStringList nodes;
  QList<bool> before;
  bool all = true;
  for (const QString& id : nodeIds)
    if (const GraphNode* n = doc_->node(id)) {
      nodes << id;
      before << (bypass ? n->bypassed : n->muted);
      all = all && before.back();
    }
  if (nodes.isEmpty()) return;
  undo_.push(new RunModeCommand(doc_, bypass ? RunModeCommand::Mode::Bypass : RunModeCommand::Mode::Mute,
                                nodes, before, !all));
}

void GraphEditor::setSetting(const QString& key, const QJsonValue& value) {
  const QJsonValue before = doc_->settings().value(key);
  if (before == value) return;
  undo_.push(new SettingCommand(doc_, key, before, value));
}

QList<CommentFrame> GraphEditor::comments() const {
  QList<CommentFrame> out;
  for (const QJsonValue& v : doc_->extra().value("comments").toArray()) {
    const QJsonObject o = v.toObject();
    const QJsonArray r = o.value("rect").toArray();
    if (r.size() != 4) continue;
    const QColor color(o.value("color").toString());
    out << CommentFrame{o.value("id").toString(),
                        QRectF(r[0].toDouble(), r[1].toDouble(), r[2].toDouble(), r[3].toDouble()),
                        o.value("text").toString(), color.isValid() ? color : commentColors().first().second};
  }
  return out;
}

void GraphEditor::setComments(const QList<CommentFrame>& frames, const QString& text) {
  const QJsonArray before = doc_->extra().value("comments").toArray(), after = commentsJson(frames);
  if (before == after) return;
  undo_.push(new CommentsCommand(this, before, after, text));
}

QString GraphEditor::addComment(const QRectF& rect, const QString& text) {
  QList<CommentFrame> frames = comments();
  int n = 1;
  auto taken = [&](const QString& id) {
    for (const CommentFrame& f : frames)
      if (f.id == id) return true;
    return false;
  };
  while (taken(QString("c%1").arg(n))) ++n;
  const QString id = QString("c%1").arg(n);
  frames << CommentFrame{id, rect.normalized(), text, commentColors().first().second};
  setComments(frames, "Add comment frame");
  return id;
}

void GraphEditor::removeComments(const QStringList& ids) {
  QList<CommentFrame> frames = comments();
  const qsizetype before = frames.size();
  frames.erase(
      std::remove_if(frames.begin(), frames.end(), [&](const CommentFrame& f) { return ids.contains(f.id); }),
      frames.end());
  if (frames.size() != before) setComments(frames, "Delete comment frame");
}

QList<QPair<QString, QColor>> GraphEditor::commentColors() {
  return {{"Blue", QColor(0x5b, 0x8b, 0xd0)},   {"Green", QColor(0x4c, 0xa8, 0x6b)},
          {"Yellow", QColor(0xd6, 0xb0, 0x3c)}, {"Orange", QColor(0xe0, 0x7b, 0x39)},
          {"Red", QColor(0xd0, 0x4f, 0x4f)},    {"Purple", QColor(0x9a, 0x6b, 0xd0)},
          {"Teal", QColor(0x3a, 0xa8, 0xb0)},   {"Grey", QColor(0x8a, 0x90, 0x98)}};
}

void GraphEditor::setCommentColor(const QString& id, const QColor& color) {
  QList<CommentFrame> frames = comments();
  for (CommentFrame& f : frames)
    if (f.id == id) f.color = color;
  setComments(frames, "Colour comment frame");
}

QByteArray GraphEditor::copy(const QStringList& nodeIds) const {
  return core::serializer::copyNodes(*doc_, nodeIds);
}

QStringList GraphEditor::paste(const QByteArray& clipboard, QPointF at, QString* error) {
  GraphDocument parsed;
  if (!core::serializer::load(clipboard, parsed, error)) return {};
  if (parsed.nodes().isEmpty()) {
    if (error) *error = "the clipboard holds no nodes";
    return {};
  }
  QPointF topLeft(std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
  for (const GraphNode& n : parsed.nodes())
    topLeft = QPointF(qMin(topLeft.x(), n.position.x()), qMin(topLeft.y(), n.position.y()));
  const QStringList ids = core::serializer::pasteNodes(*doc_, clipboard, at - topLeft, error);
  if (ids.isEmpty()) return {};
  // Reroute points are scene positions: they move with the pasted nodes. Not an undo step of its own: the
  // delta below records the wires as they are now.
  const QSet<QString> idSet(ids.begin(), ids.end());
  QList<GraphConnection> bent;
  for (const GraphConnection& c : doc_->connections())
    if (idSet.contains(c.from.node) && idSet.contains(c.to.node) && c.extra.contains("points")) bent << c;
  for (const GraphConnection& c : bent) {
    QJsonObject extra = c.extra;
    extra.insert("points", pointsJson(reroutePoints(c), at - topLeft));
    doc_->setConnectionExtra(c, extra);
  }
  // Record what the paste added so undo removes it all and redo restores the same ids.
  GraphDelta d;
  for (const QString& id : ids) {
    if (const GraphNode* n = doc_->node(id)) d.addNodes << *n;
    for (const GraphConnection& c : doc_->connectionsFrom(id))
      if (idSet.contains(c.to.node)) d.addConnections << c;
  }
  undo_.push(new DeltaCommand(
      doc_, d,
      ids.size() == 1 ? QString("Paste %1").arg(ids.first()) : QString("Paste %1 nodes").arg(ids.size()),
      true));
  return ids;
}

QStringList GraphEditor::duplicate(const QStringList& nodeIds) {
  QPointF topLeft(std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
  bool any = false;
  for (const QString& id : nodeIds)
    if (const GraphNode* n = doc_->node(id)) {
      topLeft = QPointF(qMin(topLeft.x(), n->position.x()), qMin(topLeft.y(), n->position.y()));
      any = true;
    }
  if (!any) return {};
  return paste(copy(nodeIds), topLeft + QPointF(40, 40));
}

QList<core::IssueFix> GraphEditor::fixesFor(const QString& nodeId) const {
  QList<core::IssueFix> out;
  if (!registry_) return out;
  const core::ValidationReport report = core::validate(*doc_, *registry_);
  for (const core::Issue& i : report.forNode(nodeId))
    if (i.fix && std::none_of(out.begin(), out.end(), [&](const core::IssueFix& f) { return f.label == i.fix->label; }))
      out << *i.fix;
  return out;
}

std::optional<core::IssueFix> GraphEditor::fixFor(const QString& nodeId, const QString& message) const {
  if (!registry_) return std::nullopt;
  const core::ValidationReport report = core::validate(*doc_, *registry_);
  std::optional<core::IssueFix> first;
  for (const core::Issue& i : report.forNode(nodeId)) {
    if (!i.fix) continue;
    if (i.message == message || i.field + ": " + i.message == message) return i.fix;
    if (!first) first = i.fix;
  }
  return first;
}

bool GraphEditor::applyFix(const core::IssueFix& fix, QString* why) {
  auto fail = [&](const QString& m) {
    if (why) *why = m;
    return false;
  };
  const GraphNode* target = doc_->node(fix.input.node);
  if (!target) return fail(QString("no node \"%1\"").arg(fix.input.node));
  const core::NodeTypePtr type = registry_ ? registry_->find(fix.nodeType) : nullptr;
  if (!type) return fail(QString("no loaded plugin provides a %1 node").arg(fix.nodeType));
  const core::NodeTypeSpec& spec = type->spec();
  if (!spec.input(fix.throughInput) || !spec.output(fix.throughOutput))
    return fail(QString("%1 has no input \"%2\" and output \"%3\"")
                    .arg(spec.name, fix.throughInput, fix.throughOutput));
  std::optional<GraphConnection> old;
  for (const GraphConnection& c : doc_->connectionsTo(fix.input.node))
    if (c.to.port == fix.input.port) old = c;
  if (!old) return fail(QString("%1 is not wired").arg(fix.input.str()));
  for (const core::IssueFix::Wire& w : fix.alsoWired) {
    if (!spec.input(w.port)) return fail(QString("%1 has no input \"%2\"").arg(spec.name, w.port));
    if (!doc_->node(w.source.node)) return fail(QString("no node \"%1\"").arg(w.source.node));
  }

  GraphNode node;
  node.type = spec.name;
  node.id = doc_->makeId(spec.name);
  node.params = fix.params;
  // Between the wire's source and the input it feeds, a little below both.
  const GraphNode* src = doc_->node(old->from.node);
  const QPointF srcPos = src ? src->position : target->position - QPointF(250, 0);
  node.position =
      QPointF((srcPos.x() + target->position.x()) / 2, qMax(srcPos.y(), target->position.y()) + 120);
  GraphDelta d;
  d.addNodes << node;
  d.removeConnections << *old;
  d.addConnections << GraphConnection{old->from, {node.id, fix.throughInput}, {}};
  d.addConnections << GraphConnection{{node.id, fix.throughOutput}, old->to, {}};
  for (const core::IssueFix::Wire& w : fix.alsoWired)
    d.addConnections << GraphConnection{w.source, {node.id, w.port}, {}};
  applyDelta(d, QString("Insert %1 before %2").arg(node.id, old->to.str()));
  return true;
}

QString GraphEditor::group(const QStringList& nodeIds, QString* why) {
  const QString id = core::subgraph::freeBlockId(*doc_);
  const core::subgraph::Change change = core::subgraph::group(*doc_, nodeIds, id);
  if (!change.error.isEmpty()) {
    if (why) *why = change.error;
    return {};
  }
  applyDelta(deltaOf(change), QString("Group %1 nodes into %2").arg(change.removeNodes.size()).arg(id));
  return id;
}

QStringList GraphEditor::ungroup(const QString& nodeId, QString* why) {
  const core::subgraph::Change change = core::subgraph::ungroup(*doc_, nodeId);
  if (!change.error.isEmpty()) {
    if (why) *why = change.error;
    return {};
  }
  applyDelta(deltaOf(change), QString("Ungroup %1").arg(nodeId));
  QStringList ids;
  for (const GraphNode& n : change.addNodes) ids.append(n.id);
  return ids;
}

void GraphEditor::setSubgraph(const QString& nodeId, core::SubgraphPtr subgraph, const QString& text,
                              const QString& mergeKey) {
  const GraphNode* n = doc_->node(nodeId);
  if (!n || !core::subgraph::isSubgraph(*n) || n->subgraph == subgraph) return;
  undo_.push(new SubgraphCommand(doc_, nodeId, n->subgraph, std::move(subgraph), text, mergeKey));
}

QString GraphEditor::promote(const QString& nodeId, const QString& innerNode, const QString& param) {
  const GraphNode* n = doc_->node(nodeId);
  if (!n || !core::subgraph::isSubgraph(*n) || !registry_) return {};
  const core::Subgraph& sub = core::subgraph::of(*n);
  const GraphNode* inner = sub.node(innerNode);
  const std::optional<core::NodeTypeSpec> innerSpec =
      inner ? core::subgraph::specOf(*inner, *registry_) : std::nullopt;
  if (!innerSpec || !innerSpec->param(param)) return {};
  for (const core::PromotedParam& p : sub.promoted)
    if (p.node == innerNode && p.param == param) return p.name;  // already promoted
  QString name = param;
  for (int k = 2; sub.promotedParam(name); ++k) name = param + QString::number(k);
  auto changed = std::make_shared<core::Subgraph>(sub);
  changed->promoted.append({name, innerNode, param, {}});
  setSubgraph(nodeId, changed, QString("Promote %1.%2 to %3.%4").arg(innerNode, param, nodeId, name));
  return name;
}

void GraphEditor::unpromote(const QString& nodeId, const QString& name) {
  const GraphNode* n = doc_->node(nodeId);
  if (!n || !core::subgraph::isSubgraph(*n) || !core::subgraph::of(*n).promotedParam(name)) return;
  auto changed = std::make_shared<core::Subgraph>(core::subgraph::of(*n));
  changed->promoted.removeIf([&](const core::PromotedParam& p) { return p.name == name; });
  undo_.beginMacro(QString("Unpromote %1.%2").arg(nodeId, name));
  if (n->params.contains(name)) setParam(nodeId, name, QJsonValue::Undefined);
  setSubgraph(nodeId, changed, QString("Unpromote %1.%2").arg(nodeId, name));
  undo_.endMacro();
}

void GraphEditor::updateFromLibrary(const QString& nodeId, const core::subgraph::LibraryBlock& block) {
  const GraphNode* n = doc_->node(nodeId);
  if (!n || !core::subgraph::isSubgraph(*n)) return;
  const GraphNode fresh = core::subgraph::updated(*n, block);
  undo_.beginMacro(QString("Update %1 from the library").arg(nodeId));
  setSubgraph(nodeId, fresh.subgraph, QString("Update %1 from the library").arg(nodeId));
  if (fresh.params != n->params) {
    const QJsonObject before = n->params;
    for (auto it = before.begin(); it != before.end(); ++it)
      if (!fresh.params.contains(it.key())) setParam(nodeId, it.key(), QJsonValue::Undefined);
  }
  undo_.endMacro();
}

QString GraphEditor::addBlock(const core::subgraph::LibraryBlock& block, QPointF pos) {
  GraphDelta d;
  d.addNodes.append(core::subgraph::instantiate(block, core::subgraph::freeBlockId(*doc_), pos));
  applyDelta(d, QString("Add block %1").arg(block.name));
  return d.addNodes.first().id;
}

}  // namespace gn::editor
