// Dragging a wire out of a port: which port it would go to (snapping to a node's first fitting port), why it
// cannot go somewhere, lifting a wire off an input and dropping it, and the dashed wire that follows the
// mouse. The rules come from GraphEditor::connectionProblem; this class only asks and shows.
// Include: graph_scene.h, the canvas items, Qt Widgets. Must not include the view or the actions: the view
// feeds it mouse positions and opens the node search where it says so.
#pragma once
#include <QObject>
#include <QString>
#include <optional>

#include "gpunodes/core/graph_document.h"

class QGraphicsPathItem;
class QWidget;

namespace gn::editor {

class GraphScene;
class NodeItem;

class WireDragController : public QObject {
  Q_OBJECT
 public:
  // Drags on `scene`; tooltips about a port that cannot take the wire are shown over `tooltipWidget`.
  // The controller is a child of `tooltipWidget`.
  WireDragController(GraphScene* scene, QWidget* tooltipWidget);

  // Whether a wire is being dragged.
  bool active() const { return active_; }
  // A press at `scenePos` on a port of `node` starts a drag (true); elsewhere it does nothing (false).
  // Pressing a wired input lifts its wire off, as in Blender: drop it elsewhere or on nothing.
  bool pressAt(NodeItem* node, QPointF scenePos);
  // The mouse moved to `scenePos` (at `globalPos` on the screen): the dashed wire follows, snapping to the
  // port it would go to; a port that cannot take it explains why.
  void moveTo(QPointF scenePos, QPoint globalPos);

  // The end of a wire dropped on empty canvas: where it came from, for the node search to wire the new
  // node to.
  struct LooseEnd {
    core::Endpoint origin;
    bool fromOutput = true;
  };
  // The button was released at `scenePos`: connects, reconnects, disconnects a lifted wire or says why not.
  // A new wire dropped on nothing returns its loose end.
  std::optional<LooseEnd> releaseAt(QPointF scenePos);
  // Ends the drag without changing the document (Escape).
  void cancel();

 signals:
  // A line for the status bar: why a wire did not connect (error) or cannot go where it is now.
  void message(const QString& text, bool error);

 private:
  // What the wire would go to at a scene point: a node, its port (-1 for none) and why it cannot, if so.
  struct Target {
    NodeItem* node = nullptr;
    int port = -1;
    QString problem;
  };
  Target targetAt(QPointF scenePos) const;
  QString problemFor(const NodeItem* target, int port) const;
  void begin(NodeItem* node, bool output, int index, std::optional<core::GraphConnection> picked);
  core::Endpoint originEndpoint() const;

  GraphScene* scene_;
  QWidget* tooltipWidget_;
  QGraphicsPathItem* pending_ = nullptr;  // the dashed wire under the mouse
  bool active_ = false;
  NodeItem* node_ = nullptr;  // the node and port the wire comes from
  int port_ = -1;
  bool fromOutput_ = true;
  std::optional<core::GraphConnection> picked_;  // the wire lifted off an input, if any
};

}  // namespace gn::editor
