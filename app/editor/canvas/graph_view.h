// The canvas widget: a QGraphicsView of a GraphScene with zoom, pan, wire cutting, drops from the palette and
// the node search, and the grid behind it all. Wire drags go to its WireDragController; the actions, menus
// and clipboard live in its CanvasActions; this class routes the mouse and keys between them.
// Include: graph_scene.h, canvas_actions.h, Qt Widgets, gpunodes/core. The other canvas files must not
// include it, except canvas_actions.cpp, which acts on its view.
#pragma once
#include <QGraphicsView>
#include <optional>

#include "canvas/canvas_actions.h"
#include "canvas/drop_formats.h"
#include "canvas/graph_scene.h"
#include "gpunodes/core/graph_document.h"

class QGraphicsLineItem;
class QMimeData;

namespace gn::editor {

class FindBar;
class Minimap;
class WireDragController;

class GraphView : public QGraphicsView {
  Q_OBJECT
 public:
  // Shows `scene`, which must outlive the view.
  explicit GraphView(GraphScene* scene, QWidget* parent = nullptr);
  GraphScene* graphScene() const { return scene_; }

  // The scale of scene to screen (1 = 100%); setZoom keeps nothing in place, zoomAt keeps the scene point
  // under `viewportPos` there. Zoom stays within 5% and 400%.
  double zoom() const { return transform().m11(); }
  void setZoom(double z);
  void zoomAt(double factor, QPoint viewportPos);
  // Fits the selection (or all nodes when nothing is selected, or !selectionOnly) in the view, zoomed in no
  // further than `maxZoom`.
  void frame(bool selectionOnly, double maxZoom = 1.25);
  void centerOnNode(const QString& id);

  // Where a node added without a drop point (a palette double-click) goes, as its top-left corner: under
  // the mouse when the mouse is over the canvas; else beside the node added last when that one is in view,
  // or in the middle of the view. From there it moves down (then right) until a node of `size` covers no
  // other node.
  QPointF newNodePosition(QSizeF size) const;
  // The size a new node of `type` will have (with a nominal id), for newNodePosition; a typical node's size
  // when the type is not loaded.
  QSizeF newNodeSize(const QString& type) const;
  // Scrolls so the node `id` is in view, if it is not.
  void ensureNodeVisible(const QString& id);

  // The canvas's actions, menus and clipboard.
  CanvasActions* canvasActions() const { return actions_; }
  // Shortcuts for the menus of the window, which shows them; they act on this canvas. See CanvasActions.
  QAction* deleteAction() const { return actions_->deleteAction(); }
  QAction* duplicateAction() const { return actions_->duplicateAction(); }
  QAction* copyAction() const { return actions_->copyAction(); }
  QAction* cutAction() const { return actions_->cutAction(); }
  QAction* pasteAction() const { return actions_->pasteAction(); }
  QAction* frameAction() const { return actions_->frameAction(); }
  QAction* selectAllAction() const { return actions_->selectAllAction(); }
  QAction* commentAction() const { return actions_->commentAction(); }
  QAction* findAction() const { return actions_->findAction(); }
  QAction* collapseAction() const { return actions_->collapseAction(); }
  QAction* bypassAction() const { return actions_->bypassAction(); }
  QAction* muteAction() const { return actions_->muteAction(); }
  const QList<QAction*>& arrangeActions() const { return actions_->arrangeActions(); }
  QMenu* arrangeMenu(QWidget* parent) const { return actions_->arrangeMenu(parent); }

  FindBar* findBar() const { return findBar_; }
  Minimap* minimap() const { return minimap_; }
  // Local files with one of these suffixes (no dot, any case) may be dropped on the canvas: fileDropped.
  void setDroppableSuffixes(const QStringList& suffixes) { droppableSuffixes_ = suffixes; }

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
  // A file with a droppable suffix dropped from outside (a file manager): its local path.
  void fileDropped(const QString& path);

 protected:
  // Ctrl+right-drag cuts wires, middle or Space+left drag pans, a left press on a port drags a wire.
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void wheelEvent(QWheelEvent* e) override;  // zooms about the cursor
  // Space held pans; Escape ends a wire drag or a cut.
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
  // The first dropped local file with a droppable suffix, or empty.
  QString droppedFile(const QMimeData* mime) const;
  bool droppable(const QMimeData* mime) const;

  void endCut(bool apply);

  QStringList droppableSuffixes_;
  GraphScene* scene_;
  WireDragController* wireDrag_;
  bool panning_ = false, spaceHeld_ = false;
  QPoint lastPan_;
  QGraphicsLineItem* cutLine_ = nullptr;  // while Ctrl+right-dragging a cut across wires
  FindBar* findBar_ = nullptr;
  Minimap* minimap_ = nullptr;
  CanvasActions* actions_ = nullptr;
};

}  // namespace gn::editor
