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
#include "graph_editor.h"

namespace gn::editor {

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

  QList<WireItem*>& wires() { return wires_; }

 protected:
  QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;
  void hoverMoveEvent(QGraphicsSceneHoverEvent* e) override;

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
  double timeMs_ = 0, progress_ = 0;
  QString runError_, runWarning_;
  QStringList issueErrors_, issueWarnings_;
  QString facts_;
  QList<WireItem*> wires_;
};

class WireItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 2 };
  WireItem(NodeItem* from, int fromPort, NodeItem* to, int toPort, const core::GraphConnection& c);
  int type() const override { return Type; }
  const core::GraphConnection& connection() const { return conn_; }
  NodeItem* fromNode() const { return from_; }
  NodeItem* toNode() const { return to_; }
  void setPorts(int fromPort, int toPort);
  void updatePath();
  QRectF boundingRect() const override { return bounds_; }
  QPainterPath shape() const override;
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  static QPainterPath bezier(QPointF a, QPointF b);

 private:
  NodeItem *from_, *to_;
  int fromPort_, toPort_;
  core::GraphConnection conn_;
  QColor color_;
  QPainterPath path_;
  mutable QPainterPath shape_;
  QRectF bounds_;
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
  int nodeCount() const { return int(nodes_.size()); }
  int wireCount() const { return int(wires_.size()); }
  QStringList selectedNodeIds() const;
  QList<core::GraphConnection> selectedConnections() const;
  void selectNodes(const QStringList& ids);
  QRectF nodesRect(bool selectedOnly) const;

  void resetRunState();
  void setRunStatus(const QString& node, RunStatus s, double timeMs = 0, const QString& error = {});
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

  GraphEditor* editor_;
  QHash<QString, NodeItem*> nodes_;
  QHash<QString, WireItem*> wires_;
  QHash<QString, CommentItem*> comments_;
  QHash<QString, QPointF> dragStart_;
  QHash<QString, QPointF> commentStart_;
  WireDrag drag_;
};

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

  GraphScene* scene_;
  QGraphicsPathItem* pending_ = nullptr;
  bool wiring_ = false;
  NodeItem* wireNode_ = nullptr;
  int wirePort_ = -1;
  bool wireFromOutput_ = true;
  std::optional<core::GraphConnection> picked_;  // the wire lifted off an input, if any
  bool panning_ = false, spaceHeld_ = false;
  QPoint lastPan_;
  Minimap* minimap_ = nullptr;
  QAction *delete_, *duplicate_, *copy_, *cut_, *paste_, *frame_, *selectAll_, *comment_;
};

}  // namespace gn::editor
