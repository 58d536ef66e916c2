#include "graph_editor.h"

#include <QJsonArray>
#include <QRegularExpression>
#include <QSet>
#include <QUndoCommand>
#include <limits>

#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"

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

enum CommandId { kMove = 1, kParam = 2, kSetting = 3 };

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
  MoveCommand(GraphDocument* doc, QHash<QString, QPair<QPointF, QPointF>> moves)
      : doc_(doc), moves_(std::move(moves)) {
    setText(moves_.size() == 1 ? QString("Move %1").arg(moves_.begin().key())
                               : QString("Move %1 nodes").arg(moves_.size()));
  }
  int id() const override { return kMove; }
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
  if (!doc_->connections().contains(c)) return;
  GraphDelta d;
  d.removeConnections << c;
  applyDelta(d, QString("Disconnect %1 → %2").arg(c.from.str(), c.to.str()));
}

void GraphEditor::remove(const QStringList& nodeIds, const QList<GraphConnection>& connections) {
  GraphDelta d;
  for (const GraphConnection& c : connections)
    if (doc_->connections().contains(c) && !d.removeConnections.contains(c)) d.removeConnections << c;
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
  applyDelta(d, text);
}

void GraphEditor::recordMove(const QHash<QString, QPair<QPointF, QPointF>>& oldAndNew) {
  QHash<QString, QPair<QPointF, QPointF>> moved;
  for (auto it = oldAndNew.begin(); it != oldAndNew.end(); ++it)
    if (it.value().first != it.value().second) moved.insert(it.key(), it.value());
  if (!moved.isEmpty()) undo_.push(new MoveCommand(doc_, moved));
}

void GraphEditor::moveNodes(const QHash<QString, QPointF>& positions) {
  QHash<QString, QPair<QPointF, QPointF>> moves;
  for (auto it = positions.begin(); it != positions.end(); ++it)
    if (const GraphNode* n = doc_->node(it.key())) moves.insert(it.key(), {n->position, it.value()});
  recordMove(moves);
}

void GraphEditor::setParam(const QString& nodeId, const QString& param, const QJsonValue& value) {
  const GraphNode* n = doc_->node(nodeId);
  if (!n) return;
  const QJsonValue before = n->params.value(param);
  if (before == value) return;
  undo_.push(new ParamCommand(doc_, nodeId, param, before, value));
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
                        o.value("text").toString(), color.isValid() ? color : QColor(0x5b, 0x8b, 0xd0)};
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
  frames << CommentFrame{id, rect.normalized(), text, QColor(0x5b, 0x8b, 0xd0)};
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
  // Record what the paste added so undo removes it all and redo restores the same ids.
  GraphDelta d;
  const QSet<QString> idSet(ids.begin(), ids.end());
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

bool GraphEditor::isDeviceMismatch(const QString& message) {
  return message.contains("same device", Qt::CaseInsensitive);
}

std::optional<Endpoint> GraphEditor::deviceSourceUpstream(const QString& nodeId, const QString& port) const {
  // Walk up the wire into `port` until a node whose Device input is wired: that wire's source decides where
  // the data lives.
  QList<QString> frontier;
  for (const GraphConnection& c : doc_->connectionsTo(nodeId))
    if (c.to.port == port) frontier << c.from.node;
  QSet<QString> seen;
  while (!frontier.isEmpty()) {
    const QString n = frontier.takeFirst();
    if (seen.contains(n)) continue;
    seen.insert(n);
    const core::NodeTypeSpec* s = specOf(n);
    if (!s) continue;
    for (const core::PortSpec& out : s->outputs)
      if (out.type == core::PortType::Device) return Endpoint{n, out.name};
    for (const GraphConnection& c : doc_->connectionsTo(n)) {
      const core::PortSpec* in = s->input(c.to.port);
      if (!in) continue;
      if (in->type == core::PortType::Device) return c.from;
      frontier << c.from.node;
    }
  }
  return std::nullopt;
}

bool GraphEditor::insertCopyNode(const QString& nodeId, const QString& errorMessage, QString* why) {
  auto fail = [&](const QString& m) {
    if (why) *why = m;
    return false;
  };
  const GraphNode* node = doc_->node(nodeId);
  const core::NodeTypeSpec* spec = specOf(nodeId);
  if (!node || !spec) return fail("the node's type is not loaded");
  core::NodeTypePtr copyType = registry_ ? registry_->find("Copy") : nullptr;
  if (!copyType) return fail("no loaded plugin provides a Copy node");
  const core::NodeTypeSpec& cs = copyType->spec();
  const core::PortSpec *copyIn = nullptr, *copyDev = nullptr, *copyOut = nullptr;
  for (const core::PortSpec& p : cs.inputs) {
    if (!copyIn && p.type == core::PortType::Tensor) copyIn = &p;
    if (!copyDev && p.type == core::PortType::Device) copyDev = &p;
  }
  for (const core::PortSpec& p : cs.outputs)
    if (!copyOut && p.type == core::PortType::Tensor) copyOut = &p;
  if (!copyIn || !copyOut) return fail("the Copy node has no Tensor input and output");

  // The wired Tensor inputs, in port order, with where their data lives.
  struct Wired {
    GraphConnection conn;
    std::optional<Endpoint> device;
  };
  QList<Wired> wired;
  for (const core::PortSpec& in : spec->inputs) {
    if (in.type != core::PortType::Tensor) continue;
    for (const GraphConnection& c : doc_->connectionsTo(nodeId))
      if (c.to.port == in.name) wired << Wired{c, deviceSourceUpstream(nodeId, in.name)};
  }
  if (wired.size() < 2) return fail(QString("%1 has fewer than two wired Tensor inputs").arg(nodeId));
  // The first input decides the device; the first input on another device gets the copy.
  const Wired& ref = wired.first();
  int fix = -1;
  for (int i = 1; i < wired.size(); ++i)
    if (wired[i].device != ref.device) {
      fix = i;
      break;
    }
  if (fix < 0) fix = wired.size() - 1;
  const GraphConnection old = wired[fix].conn;

  GraphNode copy;
  copy.type = cs.name;
  copy.id = doc_->makeId(cs.name);
  const GraphNode* src = doc_->node(old.from.node);
  const QPointF srcPos = src ? src->position : node->position - QPointF(250, 0);
  copy.position = QPointF((srcPos.x() + node->position.x()) / 2, qMax(srcPos.y(), node->position.y()) + 120);
  // A Copy without a Device port takes the device as a param: name the first input's device when the message
  // says which ("... found at least two devices, cuda:0 and cpu!").
  if (!copyDev && cs.param("device")) {
    static const QRegularExpression re("devices?,?\\s+([\\w:]+)\\s+and\\s+([\\w:]+)");
    const QRegularExpressionMatch m = re.match(errorMessage);
    if (m.hasMatch()) copy.params.insert("device", m.captured(1));
  }
  GraphDelta d;
  d.addNodes << copy;
  d.removeConnections << old;
  d.addConnections << GraphConnection{old.from, {copy.id, copyIn->name}, {}};
  d.addConnections << GraphConnection{{copy.id, copyOut->name}, old.to, {}};
  if (copyDev) {
    if (!ref.device) return fail("cannot tell which device the first input is on");
    d.addConnections << GraphConnection{*ref.device, {copy.id, copyDev->name}, {}};
  }
  applyDelta(d, QString("Insert %1 before %2").arg(copy.id, old.to.str()));
  return true;
}

}  // namespace gn::editor
