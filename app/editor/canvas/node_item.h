// A node on the canvas: the document's node as the scene mirrors it, plus what validation and the last run
// said about it. It holds the state; NodeGeometry lays it out and NodePainter draws it.
// Include: node_geometry.h, Qt Widgets, gpunodes/core, graph_editor.h, node_preview.h. Must not include the
// view, the wire-drag controller or the actions: a node hears of a drag only through its scene.
#pragma once
#include <QGraphicsItem>

#include "canvas/node_geometry.h"
#include "gpunodes/core/graph_document.h"
#include "graph_editor.h"
#include "node_preview.h"

namespace gn::editor {

class GraphScene;
class WireItem;

enum class RunStatus { Idle, Queued, Running, Done, Failed, Cancelled };
// The status as the run report and the style's status colours name it: "idle", "running", "error", ...
QString runStatusName(RunStatus s);

class NodeItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 1 };
  using PortHit = NodeGeometry::PortHit;

  // The item of document node `id`, laid out from the document as it is now; `scene` must outlive it.
  NodeItem(GraphScene* scene, const QString& id);
  int type() const override { return Type; }
  const QString& id() const { return id_; }
  GraphScene* graphScene() const { return scene_; }

  // Re-reads ports, params and type from the document (after a param change or a new connection) and moves
  // the item to the document's position.
  void rebuild();
  QRectF boundingRect() const override { return geometry_.bounds(); }
  // The whole bounding rectangle, port dots included, so a press on a dot reaches the node.
  QPainterPath shape() const override;
  // Hands the drawing to NodePainter.
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;

  // The node's ports as drawn, the geometry that places them and the colour of its title bar.
  const NodePorts& ports() const { return ports_; }
  const QList<core::PortSpec>& inputs() const { return ports_.inputs; }
  const QList<core::PortSpec>& outputs() const { return ports_.outputs; }
  const NodeGeometry& geometry() const { return geometry_; }
  QColor headerColor() const { return headerColor_; }
  // The index of the input or output called `name`; -1 when the node has none.
  int portIndex(bool output, const QString& name) const;
  // A port's centre in item or scene coordinates.
  QPointF portPos(bool output, int index) const { return geometry_.portPos(output, index); }
  QPointF portScenePos(bool output, int index) const { return mapToScene(portPos(output, index)); }
  // The port within `slack` of `itemPos` (item coordinates), if any; none on a collapsed node.
  std::optional<PortHit> portAt(QPointF itemPos, qreal slack = 8) const {
    return geometry_.portAt(itemPos, slack);
  }

  // What the last run did with the node: its status, time, progress (0..1) and error.
  RunStatus runStatus() const { return status_; }
  double runTimeMs() const { return timeMs_; }
  double progress() const { return progress_; }
  QString runError() const { return runError_; }
  // Sets the status; a Done node's progress is full, any other but Running's empty; Idle drops the warning.
  void setRunState(RunStatus s, double timeMs = 0, const QString& error = {});
  // Done without running: its outputs came from the run cache (a "cached" badge).
  void setCached(bool cached);
  bool cached() const { return cached_; }
  // The document's bypass and mute flags, as of the last rebuild.
  bool bypassed() const { return bypassed_; }
  bool muted() const { return muted_; }
  void setProgress(double p);
  void setRunWarning(const QString& w);
  // Validation's errors and warnings about the node; the first error is drawn in its error strip.
  void setIssues(const QStringList& errors, const QStringList& warnings);
  // What validation learned about the node (an output shape, a parameter count): drawn in the body under
  // the ports, wrapped at its " · " separators to the node's width. Empty hides it.
  // The plugin's facts: the badge drawn on the node, and what it means for the tooltip.
  void setFacts(const QString& badge, const QString& detail = QString());
  const QString& factsText() const { return facts_; }
  QStringList factsLines() const;  // the badge as drawn, line by line
  QStringList errors() const;      // validation and run errors, for tooltips and the fixes offered
  QStringList warnings() const;    // validation and run warnings
  bool hasWarnings() const { return !issueWarnings_.isEmpty() || !runWarning_.isEmpty(); }
  // The status badge's text ("12.3 ms", "running 40%", "bypassed"); empty when none is shown.
  QString badgeText() const;

  // A collapsed node shows only its title bar; its wires meet the bar's ends.
  bool collapsed() const { return collapsed_; }
  void setCollapsed(bool collapsed);
  QRectF collapseToggleRect() const { return geometry_.collapseToggleRect(); }  // item coordinates
  QRectF sceneBodyRect() const { return mapRectToScene(geometry_.body()); }
  // What the last run showed about the node (values, a heatmap, an accuracy, a loss sparkline), drawn under
  // its params. Empty hides it.
  void setPreview(const NodePreview& preview);
  const NodePreview& preview() const { return preview_; }
  QRectF previewRect() const { return geometry_.previewRect(); }  // item coordinates; null when none

  // The wires that end at this node; the scene and the wires keep it up to date.
  QList<WireItem*>& wires() { return wires_; }

 protected:
  QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;
  void hoverMoveEvent(QGraphicsSceneHoverEvent* e) override;
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;

 private:
  void layout();
  // The title bar again, after a change of what its badge says.
  void relayoutHeader();
  QString tooltipAt(QPointF itemPos) const;
  GraphScene* scene_;
  QString id_;
  QString typeName_;
  NodePorts ports_;
  QColor headerColor_;
  NodeGeometry geometry_;
  RunStatus status_ = RunStatus::Idle;
  bool cached_ = false, bypassed_ = false, muted_ = false;
  double timeMs_ = 0, progress_ = 0;
  QString runError_, runWarning_;
  QStringList issueErrors_, issueWarnings_;
  QString facts_;
  QString factsDetail_;
  QList<WireItem*> wires_;
  bool collapsed_ = false;
  NodePreview preview_;
};

}  // namespace gn::editor
