// The canvas's scene: a mirror of one GraphDocument (it observes the document's and the GraphEditor's
// signals and never owns graph data), with the selection, the run state drawn on the nodes and the state of a
// wire being dragged. Moves made with the mouse go back to the document as undo steps.
// Include: the canvas items, gpunodes/core, graph_editor.h, Qt Widgets. Must not include the view, the
// wire-drag controller or the actions: the scene works without a view (tests, benchmarks).
#pragma once
#include <QGraphicsScene>
#include <QHash>
#include <QJsonObject>

#include "canvas/comment_item.h"
#include "canvas/node_item.h"
#include "canvas/wire_item.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/validation.h"
#include "graph_editor.h"

namespace gn::editor {

class GraphScene : public QGraphicsScene {
  Q_OBJECT
 public:
  // Mirrors `editor`'s document from now on; `editor` must outlive the scene.
  explicit GraphScene(GraphEditor* editor, QObject* parent = nullptr);
  ~GraphScene() override;
  GraphEditor* editor() const { return editor_; }
  core::GraphDocument* document() const { return editor_->document(); }

  // The items of a node, a comment frame and a wire of the document; null when there is none.
  NodeItem* nodeItem(const QString& id) const { return nodes_.value(id); }
  CommentItem* commentItem(const QString& id) const { return comments_.value(id); }
  WireItem* wireItem(const core::GraphConnection& c) const { return wires_.value(key(c)); }
  // The node the document added last (by an edit, an undo or a redo) that is still there; null after a
  // reset (a file opened) until a node is added.
  NodeItem* lastAddedNode() const { return nodes_.value(lastAdded_); }
  // The selected comment frames' ids, sorted.
  QStringList selectedCommentIds() const;
  // Writes the frames as the canvas shows them (after a drag or resize) as one undo step.
  void commitComments(const QString& text);
  // The wires a cut along `line` (scene coordinates) removes, in document order.
  QList<core::GraphConnection> wiresCrossing(const QLineF& line) const;
  int nodeCount() const { return int(nodes_.size()); }
  int wireCount() const { return int(wires_.size()); }
  // The selected nodes' ids in document order, so copies and deletes are deterministic.
  QStringList selectedNodeIds() const;
  QList<core::GraphConnection> selectedConnections() const;
  // Selects exactly these nodes.
  void selectNodes(const QStringList& ids);
  // The scene rectangle of all nodes, or of the selected ones; null when there are none.
  QRectF nodesRect(bool selectedOnly) const;

  void resetRunState();  // every node idle again; also hides the previews of the last run
  // The previews of a finished run, from its report.
  void setPreviews(const QJsonObject& report);
  // A node's run status, time and error, as run events report them; unknown ids are ignored.
  void setRunStatus(const QString& node, RunStatus s, double timeMs = 0, const QString& error = {});
  void setCached(const QString& node);  // done, from the run cache
  void setProgress(const QString& node, double p);
  void setRunWarning(const QString& node, const QString& message);
  // Validation's issues and facts onto the nodes: each node shows its own, each issue once.
  void setValidation(const core::ValidationReport& report);

  // While a wire is being dragged, ports that cannot take it are dimmed and the port it would go to grows.
  struct WireDrag {
    bool active = false;
    bool fromOutput = true;
    core::PortType type = core::PortType::Tensor;
    QString node;
    NodeItem* hoverNode = nullptr;
    int hoverPort = -1;
  };
  const WireDrag& wireDrag() const { return drag_; }
  // Starts, changes or (with a default WireDrag) ends the drag the nodes draw.
  void setWireDrag(const WireDrag& d);
  // The port the dragged wire would go to now; -1 for none.
  void setWireHover(NodeItem* node, int port);
  // Whether `node`'s port cannot take the wire being dragged (false while none is).
  bool portDimmed(const NodeItem* node, bool output, int index) const;

 signals:
  void nodeDoubleClicked(const QString& id);

 protected:
  // A press remembers where the selection (and the nodes inside selected frames) started...
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;
  // ...and the release records the move as one undo step.
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* e) override;
  // On a reroute point: removes it. On a node: nodeDoubleClicked. On a wire: a reroute point there.
  void mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) override;

 private:
  static QString key(const core::GraphConnection& c) { return c.from.str() + '>' + c.to.str(); }
  QList<CommentFrame> framesAsShown() const;
  void rebuildAll();
  void rebuildComments();
  void addNodeItem(const QString& id);
  void addWireItem(const core::GraphConnection& c);
  void removeWire(WireItem* w);
  void onNodeAdded(const QString& id);
  void onNodeRemoved(const QString& id);
  void onNodeMoved(const QString& id);
  void onParamsChanged(const QString& id);
  void onSubgraphChanged(const QString& id);
  void onConnectionRemoved(const core::GraphConnection& c);
  void onConnectionChanged(const core::GraphConnection& c);
  void onCollapsedChanged();

  GraphEditor* editor_;
  QHash<QString, NodeItem*> nodes_;
  QHash<QString, WireItem*> wires_;
  QHash<QString, CommentItem*> comments_;
  QString lastAdded_;
  QHash<QString, QPointF> dragStart_;
  QHash<QString, QPointF> commentStart_;
  QStringList carried_;  // keys of the wires whose points follow a drag
  WireDrag drag_;
};

}  // namespace gn::editor
