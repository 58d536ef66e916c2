// The node canvas: a QGraphicsScene that mirrors a GraphDocument (it observes the document's signals and
// never owns graph data) and a QGraphicsView with the usual node-editor gestures. Items are cheap to paint:
// text is pre-laid-out (QStaticText), geometry is computed once per change, and zoomed-out nodes drop detail.
#pragma once
#include <QAction>
#include <QGraphicsItem>
#include <QGraphicsScene>
#include <QGraphicsView>
#include <QHash>
#include <QStaticText>
#include <optional>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/validation.h"
#include "arrange.h"
#include "graph_editor.h"
#include "node_preview.h"

namespace gn::editor {

class FindBar;
class GraphScene;
class Minimap;
class WireItem;

enum class RunStatus { Idle, Queued, Running, Done, Failed, Cancelled };
QString runStatusName(RunStatus s);

class NodeItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 1 };
  NodeItem(GraphScene* scene, const QString& id);
  int type() const override { return Type; }
  const QString& id() const { return id_; }

  // Re-reads ports, params and type from the document (after a param change or a new connection).
  void rebuild();
  QRectF boundingRect() const override { return bounds_; }
  QPainterPath shape() const override;
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;

  const QList<core::PortSpec>& inputs() const { return ports_.inputs; }
  const QList<core::PortSpec>& outputs() const { return ports_.outputs; }
  int portIndex(bool output, const QString& name) const;
  QPointF portPos(bool output, int index) const;  // item coordinates
  QPointF portScenePos(bool output, int index) const { return mapToScene(portPos(output, index)); }
  struct PortHit {
    bool output;
    int index;
  };
  std::optional<PortHit> portAt(QPointF itemPos, qreal slack = 8) const;

  RunStatus runStatus() const { return status_; }
  double runTimeMs() const { return timeMs_; }
  double progress() const { return progress_; }
  QString runError() const { return runError_; }
  void setRunState(RunStatus s, double timeMs = 0, const QString& error = {});
  // Done without running: its outputs came from the run cache (a "cached" badge).
  void setCached(bool cached);
  bool cached() const { return cached_; }
  bool bypassed() const { return bypassed_; }
  bool muted() const { return muted_; }
  void setProgress(double p);
  void setRunWarning(const QString& w);
  void setIssues(const QStringList& errors, const QStringList& warnings);
  // What validation learned about the node (an output shape, a parameter count): drawn in the body under
  // the ports, wrapped at its " · " separators to the node's width. Empty hides it.
  void setFacts(const QString& badge);
  const QString& factsText() const { return facts_; }
  QStringList factsLines() const;  // the badge as drawn, line by line
  QStringList errors() const;      // validation and run errors, for tooltips and the Insert Copy offer
  QStringList warnings() const;

  // A collapsed node shows only its title bar; its wires meet the bar's ends.
  bool collapsed() const { return collapsed_; }
  void setCollapsed(bool collapsed);
  QRectF collapseToggleRect() const;  // the title bar's ▾/▸ button, item coordinates
  QRectF sceneBodyRect() const { return mapRectToScene(body_); }
  // What the last run showed about the node (values, a heatmap, an accuracy, a loss sparkline), drawn under
  // its params. Empty hides it.
  void setPreview(const NodePreview& preview);
  const NodePreview& preview() const { return preview_; }
  QRectF previewRect() const;  // where it is drawn, item coordinates; null when none is shown

  QList<WireItem*>& wires() { return wires_; }

 protected:
  QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;
  void hoverMoveEvent(QGraphicsSceneHoverEvent* e) override;
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;

 private:
  void layout();
  QString badgeText() const;
  GraphScene* scene_;
  QString id_;
  QString typeName_;
  NodePorts ports_;
  QColor headerColor_;
  QStaticText title_, idText_, errorLine_;
  QStaticText titleFit_;     // the type shortened to make room for a status badge
  qreal titleFitRoom_ = -1;  // the width titleFit_ was made for
  QList<QStaticText> inLabels_, outLabels_, summary_, factLines_;
  QRectF body_, bounds_;
  QPainterPath bodyPath_, headerPath_;
  qreal portsTop_ = 0;
  RunStatus status_ = RunStatus::Idle;
  bool cached_ = false, bypassed_ = false, muted_ = false;
  double timeMs_ = 0, progress_ = 0;
  QString runError_, runWarning_;
  QStringList issueErrors_, issueWarnings_;
  QString facts_;
  QList<WireItem*> wires_;
  bool collapsed_ = false;
  NodePreview preview_;
  qreal previewTop_ = 0;
};

class WireItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 2 };
  WireItem(NodeItem* from, int fromPort, NodeItem* to, int toPort, const core::GraphConnection& c);
  int type() const override { return Type; }
  const core::GraphConnection& connection() const { return conn_; }
  // The same wire with other extra fields (its reroute points changed in the document).
  void setConnection(const core::GraphConnection& c);
  NodeItem* fromNode() const { return from_; }
  NodeItem* toNode() const { return to_; }
  void setPorts(int fromPort, int toPort);
  void updatePath();
  QRectF boundingRect() const override { return bounds_; }
  QPainterPath shape() const override;
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  static QPainterPath bezier(QPointF a, QPointF b);

  // Reroute points as drawn, in scene coordinates: the document's, or where a drag has them now.
  const QList<QPointF>& points() const { return points_; }
  void movePoint(int index, QPointF scenePos);  // while a point is dragged
  // Where a point added at `scenePos` goes in points(): after the bend before the nearest stretch of wire.
  int insertionIndex(QPointF scenePos) const;
  // Whether the wire as drawn crosses the segment `line` (scene coordinates).
  bool crosses(const QLineF& line) const;
  // While a selection holding both its ends is dragged, the points follow the nodes.
  void beginCarry();
  void endCarry();

 private:
  void rebuildPointItems();
  NodeItem *from_, *to_;
  int fromPort_, toPort_;
  core::GraphConnection conn_;
  QColor color_;
  QPainterPath path_;
  mutable QPainterPath shape_;
  QRectF bounds_;
  QList<QPointF> points_;
  bool carrying_ = false;
  QList<QPointF> carryBase_;
  QPointF carryAnchor_;
};

// A reroute point: a dot on its wire. Drag it to bend the wire; double-click it to remove it.
class RerouteItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 4 };
  RerouteItem(WireItem* wire, int index, QColor color);
  int type() const override { return Type; }
  WireItem* wire() const { return wire_; }
  int index() const { return index_; }
  QRectF boundingRect() const override { return QRectF(-6, -6, 12, 12); }
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;

 protected:
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseMoveEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* e) override;

 private:
  WireItem* wire_;
  int index_;
  QColor color_;
  QPointF grab_;  // the press position relative to the dot's centre
  bool dragged_ = false;
};

// A comment frame behind a group of nodes. Dragging it carries the nodes inside; the corner handle resizes
// it; double-click renames it.
class CommentItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 3 };
  CommentItem(GraphScene* scene, const CommentFrame& frame);
  int type() const override { return Type; }
  const QString& id() const { return frame_.id; }
  CommentFrame frame() const;  // as it is on the canvas now
  QRectF boundingRect() const override { return QRectF(QPointF(), size_).adjusted(-2, -2, 2, 2); }
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  // Remembers the nodes inside, which then follow the frame while it is dragged.
  void capture();
  const QList<NodeItem*>& captured() const { return captured_; }

 protected:
  QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseMoveEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) override;
  void hoverMoveEvent(QGraphicsSceneHoverEvent* e) override;

 private:
  bool onHandle(QPointF p) const;
  GraphScene* scene_;
  CommentFrame frame_;
  QSizeF size_;
  QPointF lastPos_;
  QList<NodeItem*> captured_;
  bool resizing_ = false;
};

class GraphScene : public QGraphicsScene {
  Q_OBJECT
 public:
  explicit GraphScene(GraphEditor* editor, QObject* parent = nullptr);
  ~GraphScene() override;
  GraphEditor* editor() const { return editor_; }
  core::GraphDocument* document() const { return editor_->document(); }

  NodeItem* nodeItem(const QString& id) const { return nodes_.value(id); }
  CommentItem* commentItem(const QString& id) const { return comments_.value(id); }
  QStringList selectedCommentIds() const;
  // Writes the frames as the canvas shows them (after a drag or resize) as one undo step.
  void commitComments(const QString& text);
  WireItem* wireItem(const core::GraphConnection& c) const { return wires_.value(key(c)); }
  // The wires a cut along `line` (scene coordinates) removes.
  QList<core::GraphConnection> wiresCrossing(const QLineF& line) const;
  int nodeCount() const { return int(nodes_.size()); }
  int wireCount() const { return int(wires_.size()); }
  QStringList selectedNodeIds() const;
  QList<core::GraphConnection> selectedConnections() const;
  void selectNodes(const QStringList& ids);
  QRectF nodesRect(bool selectedOnly) const;

  void resetRunState();  // also hides the previews of the last run
  // The previews of a finished run, from its report.
  void setPreviews(const QJsonObject& report);
  void setRunStatus(const QString& node, RunStatus s, double timeMs = 0, const QString& error = {});
  void setCached(const QString& node);  // done, from the run cache
  void setProgress(const QString& node, double p);
  void setRunWarning(const QString& node, const QString& message);
  void setValidation(const core::ValidationReport& report);

  // While a wire is being dragged, ports that cannot take it are dimmed.
  struct WireDrag {
    bool active = false;
    bool fromOutput = true;
    core::PortType type = core::PortType::Tensor;
    QString node;
    NodeItem* hoverNode = nullptr;
    int hoverPort = -1;
  };
  const WireDrag& wireDrag() const { return drag_; }
  void setWireDrag(const WireDrag& d);
  void setWireHover(NodeItem* node, int port);
  bool portDimmed(const NodeItem* node, bool output, int index) const;

 signals:
  void nodeDoubleClicked(const QString& id);

 protected:
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) override;

 private:
  static QString key(const core::GraphConnection& c) { return c.from.str() + '>' + c.to.str(); }
  void rebuildAll();
  void rebuildComments();
  void addNodeItem(const QString& id);
  void addWireItem(const core::GraphConnection& c);
  void removeWire(WireItem* w);
  void onNodeRemoved(const QString& id);
  void onNodeMoved(const QString& id);
  void onParamsChanged(const QString& id);
  void onConnectionAdded(const core::GraphConnection& c);
  void onConnectionRemoved(const core::GraphConnection& c);
  void onConnectionChanged(const core::GraphConnection& c);
  void onCollapsedChanged();

  GraphEditor* editor_;
  QHash<QString, NodeItem*> nodes_;
  QHash<QString, WireItem*> wires_;
  QHash<QString, CommentItem*> comments_;
  QHash<QString, QPointF> dragStart_;
  QHash<QString, QPointF> commentStart_;
  QStringList carried_;  // keys of the wires whose points follow a drag
  WireDrag drag_;
};

// What the canvas takes dropped (a palette entry dragged): a node type's name, or a library block's file.
inline constexpr char kNodeTypeMime[] = "application/x-gpunodes-node-type";
inline constexpr char kBlockMime[] = "application/x-gpunodes-block";

class GraphView : public QGraphicsView {
  Q_OBJECT
 public:
  explicit GraphView(GraphScene* scene, QWidget* parent = nullptr);
  GraphScene* graphScene() const { return scene_; }
  double zoom() const { return transform().m11(); }
  void setZoom(double z);
  void zoomAt(double factor, QPoint viewportPos);
  void frame(bool selectionOnly, double maxZoom = 1.25);
  void centerOnNode(const QString& id);

  QAction* deleteAction() const { return delete_; }
  QAction* duplicateAction() const { return duplicate_; }
  QAction* copyAction() const { return copy_; }
  QAction* cutAction() const { return cut_; }
  QAction* pasteAction() const { return paste_; }
  QAction* frameAction() const { return frame_; }
  QAction* selectAllAction() const { return selectAll_; }
  QAction* commentAction() const { return comment_; }
  QAction* findAction() const { return find_; }
  QAction* collapseAction() const { return collapse_; }
  // Ctrl+B and Ctrl+M: bypass or mute the selected nodes (off again when all of them are), one undo step.
  QAction* bypassAction() const { return bypass_; }
  QAction* muteAction() const { return mute_; }
  // Align and distribute the selected nodes, in kArrangements order; each is one undo step.
  const QList<QAction*>& arrangeActions() const { return arrange_; }
  FindBar* findBar() const { return findBar_; }
  void arrangeSelection(Arrangement a);
  // A submenu of the arrange actions, for the Edit menu and the node's context menu.
  QMenu* arrangeMenu(QWidget* parent) const;
  // Collapses the selected nodes, or expands them when all of them are collapsed.
  void toggleCollapseSelection();
  // A comment frame around the selected nodes, or at a viewport position when nothing is selected.
  QString addCommentFrame(std::optional<QPoint> at = {});
  void deleteSelection();
  Minimap* minimap() const { return minimap_; }

  void copySelection();
  void pasteClipboard();
  // Opens the node search popup at a viewport position; with a dragged port, it lists only compatible types
  // and wires the new node in.
  QWidget* openNodeSearch(QPoint viewportPos, std::optional<core::Endpoint> dragged = {},
                          bool draggedIsOutput = true);

 signals:
  void message(const QString& text, bool error);
  // "Run to here" from a node's context menu: run these nodes and what they need.
  void runToHereRequested(const QStringList& nodeIds);
  // A library block dropped at scenePos: its file, for the window to add (it knows the level's path).
  void blockDropped(const QString& path, QPointF scenePos);

 protected:
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void wheelEvent(QWheelEvent* e) override;
  void keyPressEvent(QKeyEvent* e) override;
  void keyReleaseEvent(QKeyEvent* e) override;
  void drawBackground(QPainter* p, const QRectF& rect) override;
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dragMoveEvent(QDragMoveEvent* e) override;
  void dropEvent(QDropEvent* e) override;
  void contextMenuEvent(QContextMenuEvent* e) override;
  void focusOutEvent(QFocusEvent* e) override;
  void resizeEvent(QResizeEvent* e) override;

 private:
  struct Target {
    NodeItem* node = nullptr;
    int port = -1;
    QString problem;
  };
  NodeItem* nodeAt(QPoint viewportPos) const;
  Target targetAt(QPointF scenePos) const;
  void beginWire(NodeItem* node, bool output, int index, std::optional<core::GraphConnection> picked);
  void finishWire(QMouseEvent* e);
  void endWireDrag();
  core::Endpoint originEndpoint() const;
  void endCut(bool apply);

  GraphScene* scene_;
  QGraphicsPathItem* pending_ = nullptr;
  bool wiring_ = false;
  NodeItem* wireNode_ = nullptr;
  int wirePort_ = -1;
  bool wireFromOutput_ = true;
  std::optional<core::GraphConnection> picked_;  // the wire lifted off an input, if any
  bool panning_ = false, spaceHeld_ = false;
  QPoint lastPan_;
  QGraphicsLineItem* cutLine_ = nullptr;  // while Ctrl+right-dragging a cut across wires
  Minimap* minimap_ = nullptr;
  FindBar* findBar_ = nullptr;
  QAction *delete_, *duplicate_, *copy_, *cut_, *paste_, *frame_, *selectAll_, *comment_, *find_, *collapse_;
  QAction *bypass_, *mute_;
  QList<QAction*> arrange_;
};

}  // namespace gn::editor
