// What a canvas offers as commands: the 13 actions with their shortcuts (active while the canvas has focus),
// align and distribute, the context menus of a node, a wire, a comment frame and the empty canvas, and the
// clipboard. Each command is one undo step on the view's GraphEditor.
// Include: Qt Widgets, arrange.h, gpunodes/core. Must not be included by the canvas items or the scene; its
// .cpp includes the view it acts on.
#pragma once
#include <QList>
#include <QObject>
#include <optional>

#include "arrange.h"

class QAction;
class QContextMenuEvent;
class QMenu;
class QWidget;

namespace gn::editor {

class GraphView;
class NodeItem;

class CanvasActions : public QObject {
  Q_OBJECT
 public:
  // Makes the actions and adds them to `view` (their shortcuts work while it has focus; Find anywhere in
  // the window). A child of `view`.
  explicit CanvasActions(GraphView* view);

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
  // Align and distribute the selected nodes, in kArrangements order; each is one undo step. Enabled while
  // enough nodes are selected.
  const QList<QAction*>& arrangeActions() const { return arrange_; }
  // A submenu of the arrange actions, for the Edit menu and the node's context menu; owned by `parent`.
  QMenu* arrangeMenu(QWidget* parent) const;

  void arrangeSelection(Arrangement a);
  // Collapses the selected nodes, or expands them when all of them are collapsed.
  void toggleCollapseSelection();
  // A comment frame around the selected nodes, or at a viewport position (the cursor's by default) when
  // nothing is selected. Returns its id.
  QString addCommentFrame(std::optional<QPoint> at = {});
  // Deletes the selected nodes, wires and frames.
  void deleteSelection();
  // The selected nodes to the clipboard, as the same JSON as a file.
  void copySelection();
  // The clipboard's nodes, pasted at the cursor (or the view's middle), selected.
  void pasteClipboard();
  // The menu for what is under `e`'s position (a node, a wire, a frame, or nothing), run until closed.
  void execContextMenu(QContextMenuEvent* e);

 signals:
  void message(const QString& text, bool error);
  void runToHereRequested(const QStringList& nodeIds);

 private:
  // The menu of the node under the mouse (selected first if it was not).
  void fillNodeMenu(QMenu& menu, NodeItem* node);
  GraphView* view_;
  QAction *delete_, *duplicate_, *copy_, *cut_, *paste_, *frame_, *selectAll_, *comment_, *find_, *collapse_;
  QAction *bypass_, *mute_;
  QList<QAction*> arrange_;
};

}  // namespace gn::editor
