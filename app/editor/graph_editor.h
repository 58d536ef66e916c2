// Every edit the editor makes goes through GraphEditor, which records it on the undo stack. The canvas and
// the inspector are views of the GraphDocument: they call these methods and repaint from the document's
// signals, so undo, redo and scripted edits (tests) look the same to them.
#pragma once
#include <QColor>
#include <QHash>
#include <QJsonValue>
#include <QObject>
#include <QPointF>
#include <QRectF>
#include <QStringList>
#include <QUndoStack>
#include <optional>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"

namespace gn::core {
class NodeTypeRegistry;
}

namespace gn::editor {

// A node's ports as the canvas shows them: the spec's ports, or for a type no plugin provides ("missing"),
// the ports its connections name, so the wires still have somewhere to go.
struct NodePorts {
  QList<core::PortSpec> inputs, outputs;
  bool missing = false;
};

// One structural edit, applied forwards by redo and backwards by undo. Removing a node lists its connections
// too, so undo brings them back.
struct GraphDelta {
  QList<core::GraphNode> removeNodes, addNodes;
  QList<core::GraphConnection> removeConnections, addConnections;
  bool empty() const {
    return removeNodes.isEmpty() && addNodes.isEmpty() && removeConnections.isEmpty() &&
           addConnections.isEmpty();
  }
};

// A comment frame: a labelled box behind a group of nodes. Frames live in the file's top-level "comments"
// array, which the serializer keeps as an unknown field, so the core and the CLI need not know them.
struct CommentFrame {
  QString id;
  QRectF rect;
  QString text;
  QColor color;
};

class GraphEditor : public QObject {
  Q_OBJECT
 public:
  GraphEditor(core::GraphDocument* doc, const core::NodeTypeRegistry* registry, QObject* parent = nullptr);

  core::GraphDocument* document() const { return doc_; }
  const core::NodeTypeRegistry* registry() const { return registry_; }
  QUndoStack* undoStack() { return &undo_; }

  NodePorts portsOf(const QString& nodeId) const;
  const core::NodeTypeSpec* specOf(const QString& nodeId) const;
  // Why `from` (an output) cannot feed `to` (an input); empty when it can. An input that already has a wire
  // can: connecting replaces the old wire.
  // `ignore` is a wire being moved: it does not count as already there.
  QString connectionProblem(const core::Endpoint& from, const core::Endpoint& to,
                            const core::GraphConnection* ignore = nullptr) const;

  QString addNode(const QString& type, QPointF pos);
  // From a wire dropped on empty space: adds `type` at pos and wires its first compatible port to `dragged`
  // (an output when draggedIsOutput, else an input). One undo step.
  QString addNodeWired(const QString& type, QPointF pos, const core::Endpoint& dragged, bool draggedIsOutput);
  bool connect(const core::Endpoint& from, const core::Endpoint& to, QString* why = nullptr);
  // Moves the wire `old` so it ends at `to` instead (one undo step); an empty `to` disconnects it.
  bool reconnect(const core::GraphConnection& old, const core::Endpoint& newFrom, const core::Endpoint& to,
                 QString* why = nullptr);
  void disconnect(const core::GraphConnection& c);
  void remove(const QStringList& nodeIds, const QList<core::GraphConnection>& connections = {});
  // Positions already moved by the view (a drag) are recorded as one step; consecutive drags of the same
  // nodes merge.
  void recordMove(const QHash<QString, QPair<QPointF, QPointF>>& oldAndNew);
  // A named move (align, distribute): one undo step of its own that never merges with a drag.
  void moveNodes(const QHash<QString, QPointF>& positions, const QString& text);
  void setParam(const QString& nodeId, const QString& param, const QJsonValue& value);
  void setSetting(const QString& key, const QJsonValue& value);
  // Bypass (mute) the nodes, or take it off when all of them have it already. One undo step.
  void toggleBypassed(const QStringList& nodeIds);
  void toggleMuted(const QStringList& nodeIds);

  QByteArray copy(const QStringList& nodeIds) const;
  // Pastes clipboard JSON so that the pasted nodes' top-left lands at `at`. One undo step. Returns new ids.
  QStringList paste(const QByteArray& clipboard, QPointF at, QString* error = nullptr);
  QStringList duplicate(const QStringList& nodeIds);

  // Fixes that plugins offer with validation issues (core::IssueFix). The editor applies them without knowing
  // what they mean.
  //
  // Every fix a fresh validation of the document offers on `nodeId`'s issues, in the issues' order, each
  // once; empty when none does (no plugin offers one, or the node has no problem a fix removes).
  QList<core::IssueFix> fixesFor(const QString& nodeId) const;
  // The fix for the problem `message` on `nodeId`: that of the node's issue whose message, or "field:
  // message" as the log shows it, is `message`; else, for an error a run worded (the runtime's words are not
  // validation's), the node's first fix. nullopt when the node is offered none.
  std::optional<core::IssueFix> fixFor(const QString& nodeId, const QString& message) const;
  // Puts a node of fix.nodeType with fix.params on the wire into fix.input, and wires fix.alsoWired into it,
  // as one undo step. False, with *why and nothing changed, when the fix no longer applies (the input is not
  // wired, a node or port is gone, no loaded plugin provides the type).
  bool applyFix(const core::IssueFix& fix, QString* why = nullptr);

  // Applies a structural change as one undo step (used by everything above and by tests).
  void applyDelta(const GraphDelta& delta, const QString& text);

  // Subgraphs (core/subgraph.h), each one undo step. group returns the new Subgraph node's id and ungroup
  // the ids its inner nodes got; both empty, with *why, when nothing changed.
  QString group(const QStringList& nodeIds, QString* why = nullptr);
  QStringList ungroup(const QString& nodeId, QString* why = nullptr);
  // Replaces a Subgraph node's inner graph, ports or promoted params. Consecutive steps with the same
  // non-empty mergeKey become one (an edit inside a subgraph that its own undo stack merged, like typing).
  void setSubgraph(const QString& nodeId, std::shared_ptr<const core::Subgraph> subgraph, const QString& text,
                   const QString& mergeKey = {});
  // Makes `param` of the inner node `innerNode` a param of the subgraph node, named after it (made unique);
  // returns that name, empty when the inner node has no such param.
  QString promote(const QString& nodeId, const QString& innerNode, const QString& param);
  // Takes a promoted param off the subgraph node, with the value set there.
  void unpromote(const QString& nodeId, const QString& name);
  // Replaces an instance with its block's current content (core::subgraph::updated).
  void updateFromLibrary(const QString& nodeId, const core::subgraph::LibraryBlock& block);
  // A new instance of a library block at pos; returns its id.
  QString addBlock(const core::subgraph::LibraryBlock& block, QPointF pos);

  // Reroute points: where a wire bends on its way, in scene coordinates, kept in the connection's "points"
  // field. Setting them is one undo step.
  static QList<QPointF> reroutePoints(const core::GraphConnection& c);
  void setReroutePoints(const core::GraphConnection& c, const QList<QPointF>& points, const QString& text);
  // Removes the wires a cut line crossed, as one undo step.
  void cutWires(const QList<core::GraphConnection>& wires);

  // Collapsed nodes show only their title bar. The set is view state, kept in the file's view object as
  // "collapsed": [ids]; changing it is one undo step.
  bool isCollapsed(const QString& nodeId) const;
  void setCollapsed(const QStringList& nodeIds, bool collapsed);

  QList<CommentFrame> comments() const;
  // Replaces the frames as one undo step.
  void setComments(const QList<CommentFrame>& frames, const QString& text);
  QString addComment(const QRectF& rect, const QString& text);
  void removeComments(const QStringList& ids);
  // The colours the frame's context menu offers, with their names; the first is a new frame's.
  static QList<QPair<QString, QColor>> commentColors();
  void setCommentColor(const QString& id, const QColor& color);

 signals:
  void commentsChanged();
  void collapsedChanged();

 private:
  bool wouldCycle(const QString& fromNode, const QString& toNode, const core::GraphConnection* ignore) const;
  void toggleRunMode(const QStringList& nodeIds, bool bypass);
  core::GraphDocument* doc_;
  const core::NodeTypeRegistry* registry_;
  QUndoStack undo_;
  // A Subgraph node's spec is made from its inner graph: kept per node while its subgraph stays the same.
  struct SubgraphSpec {
    std::shared_ptr<const core::Subgraph> subgraph;
    std::shared_ptr<const core::NodeTypeSpec> spec;
  };
  mutable QHash<QString, SubgraphSpec> subgraphSpecs_;
};

}  // namespace gn::editor
