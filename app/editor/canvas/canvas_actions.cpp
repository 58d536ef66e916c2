#include "canvas/canvas_actions.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QContextMenuEvent>
#include <QCursor>
#include <QIcon>
#include <QMenu>
#include <QMimeData>
#include <QPixmap>
#include <QUndoStack>

#include "canvas/graph_view.h"
#include "canvas/item_at.h"
#include "find_bar.h"

namespace gn::editor {

using core::GraphConnection;

namespace {
const char* kClipboardMime = "application/x-gpunodes-graph";
}

CanvasActions::CanvasActions(GraphView* view) : QObject(view), view_(view) {
  GraphScene* scene = view_->graphScene();
  auto make = [this](const QString& text, const QList<QKeySequence>& keys, auto slot) {
    auto* a = new QAction(text, view_);
    a->setShortcuts(keys);
    // Only while the canvas has focus: Delete or F in a text field belongs to the field.
    a->setShortcutContext(Qt::WidgetWithChildrenShortcut);
    view_->addAction(a);
    connect(a, &QAction::triggered, this, slot);
    return a;
  };
  delete_ =
      make("Delete", {QKeySequence::Delete, QKeySequence(Qt::Key_Backspace)}, [this] { deleteSelection(); });
  comment_ = make("Comment frame", {QKeySequence(Qt::Key_C)}, [this] { addCommentFrame(); });
  duplicate_ = make("Duplicate", {QKeySequence(Qt::CTRL | Qt::Key_D)}, [scene] {
    const QStringList ids = scene->editor()->duplicate(scene->selectedNodeIds());
    if (!ids.isEmpty()) scene->selectNodes(ids);
  });
  copy_ = make("Copy", {QKeySequence::Copy}, [this] { copySelection(); });
  cut_ = make("Cut", {QKeySequence::Cut}, [this] {
    copySelection();
    deleteSelection();
  });
  paste_ = make("Paste", {QKeySequence::Paste}, [this] { pasteClipboard(); });
  bypass_ = make("Bypass", {QKeySequence(Qt::CTRL | Qt::Key_B)},
                 [scene] { scene->editor()->toggleBypassed(scene->selectedNodeIds()); });
  mute_ = make("Mute", {QKeySequence(Qt::CTRL | Qt::Key_M)},
               [scene] { scene->editor()->toggleMuted(scene->selectedNodeIds()); });
  frame_ = make("Frame all / selection", {QKeySequence(Qt::Key_F)}, [this] { view_->frame(true); });
  selectAll_ = make("Select all", {QKeySequence::SelectAll}, [scene] {
    for (QGraphicsItem* i : scene->items())
      if (i->type() == NodeItem::Type) i->setSelected(true);
  });
  collapse_ = make("Collapse / expand", {QKeySequence(Qt::Key_H)}, [this] { toggleCollapseSelection(); });
  for (Arrangement a : kArrangements) {
    QAction* action = make(arrangementName(a), {}, [this, a] { arrangeSelection(a); });
    action->setToolTip(QString("%1 (%2 or more selected nodes; one undo step)")
                           .arg(arrangementName(a))
                           .arg(arrangementMinimum(a)));
    arrange_ << action;
  }
  connect(scene, &QGraphicsScene::selectionChanged, this, [this, scene] {
    int nodes = 0;
    for (const QGraphicsItem* i : scene->selectedItems()) nodes += i->type() == NodeItem::Type;
    for (int i = 0; i < arrange_.size(); ++i)
      arrange_[i]->setEnabled(nodes >= arrangementMinimum(kArrangements[i]));
  });
  for (QAction* a : arrange_) a->setEnabled(false);
  find_ = make("Find…", {QKeySequence::Find}, [this] { view_->findBar()->open(); });
  // Anywhere in the window: the find bar searches the canvas wherever the focus was.
  find_->setShortcutContext(Qt::WindowShortcut);
  auto* search = new QAction("Add node…", view_);
  search->setShortcuts({QKeySequence(Qt::Key_Tab), QKeySequence(Qt::SHIFT | Qt::Key_A)});
  search->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  view_->addAction(search);
  connect(search, &QAction::triggered, this, [this] {
    QPoint p = view_->viewport()->mapFromGlobal(QCursor::pos());
    if (!view_->viewport()->rect().contains(p)) p = view_->viewport()->rect().center();
    view_->openNodeSearch(p);
  });
}

void CanvasActions::arrangeSelection(Arrangement a) {
  GraphScene* scene = view_->graphScene();
  QList<NodeRect> rects;
  for (const QString& id : scene->selectedNodeIds())
    if (NodeItem* n = scene->nodeItem(id)) rects << NodeRect{id, n->sceneBodyRect()};
  if (rects.size() < arrangementMinimum(a)) {
    emit message(
        QString("%1 needs %2 or more selected nodes").arg(arrangementName(a)).arg(arrangementMinimum(a)),
        false);
    return;
  }
  scene->editor()->moveNodes(arrange(rects, a), arrangementName(a));
}

void CanvasActions::toggleCollapseSelection() {
  GraphScene* scene = view_->graphScene();
  const QStringList ids = scene->selectedNodeIds();
  if (ids.isEmpty()) return;
  bool allCollapsed = true;
  for (const QString& id : ids) allCollapsed = allCollapsed && scene->editor()->isCollapsed(id);
  scene->editor()->setCollapsed(ids, !allCollapsed);
}

QMenu* CanvasActions::arrangeMenu(QWidget* parent) const {
  auto* menu = new QMenu("&Arrange", parent);
  for (QAction* a : arrange_) {
    menu->addAction(a);
    if (a == arrange_[3]) menu->addSeparator();  // align above, distribute below
  }
  return menu;
}

void CanvasActions::deleteSelection() {
  GraphScene* scene = view_->graphScene();
  GraphEditor* ed = scene->editor();
  const QStringList nodes = scene->selectedNodeIds(), frames = scene->selectedCommentIds();
  const QList<GraphConnection> wires = scene->selectedConnections();
  if (frames.isEmpty()) {
    ed->remove(nodes, wires);
    return;
  }
  ed->undoStack()->beginMacro("Delete");
  ed->remove(nodes, wires);
  ed->removeComments(frames);
  ed->undoStack()->endMacro();
}

QString CanvasActions::addCommentFrame(std::optional<QPoint> at) {
  GraphScene* scene = view_->graphScene();
  QRectF r = scene->nodesRect(true);
  if (r.isNull()) {
    QPoint vp = at.value_or(view_->viewport()->mapFromGlobal(QCursor::pos()));
    if (!view_->viewport()->rect().contains(vp)) vp = view_->viewport()->rect().center();
    r = QRectF(view_->mapToScene(vp), QSizeF(320, 200));
  } else {
    r.adjust(-30, -30 - 28, 30, 30);  // room for the frame's title above the nodes
  }
  return scene->editor()->addComment(r, "Comment");
}

void CanvasActions::copySelection() {
  GraphScene* scene = view_->graphScene();
  const QStringList ids = scene->selectedNodeIds();
  if (ids.isEmpty()) return;
  const QByteArray bytes = scene->editor()->copy(ids);
  auto* mime = new QMimeData;
  mime->setData(kClipboardMime, bytes);
  mime->setText(QString::fromUtf8(bytes));  // the same JSON as a file, for pasting into a text editor
  QApplication::clipboard()->setMimeData(mime);
  emit message(QString("Copied %1 node(s)").arg(ids.size()), false);
}

void CanvasActions::pasteClipboard() {
  const QMimeData* mime = QApplication::clipboard()->mimeData();
  if (!mime) return;
  const QByteArray bytes =
      mime->hasFormat(kClipboardMime) ? mime->data(kClipboardMime) : mime->text().toUtf8();
  if (bytes.trimmed().isEmpty()) return;
  QPoint vp = view_->viewport()->mapFromGlobal(QCursor::pos());
  if (!view_->viewport()->rect().contains(vp)) vp = view_->viewport()->rect().center();
  QString error;
  GraphScene* scene = view_->graphScene();
  const QStringList ids = scene->editor()->paste(bytes, view_->mapToScene(vp), &error);
  if (ids.isEmpty())
    emit message("Paste failed: " + error, true);
  else
    scene->selectNodes(ids);
}

void CanvasActions::fillNodeMenu(QMenu& menu, NodeItem* n) {
  GraphScene* scene = view_->graphScene();
  GraphEditor* ed = scene->editor();
  if (!n->isSelected()) scene->selectNodes({n->id()});
  // What the plugins offer to fix this node's problems, as they label it (an Insert Copy for operands on
  // two devices, say): the canvas applies a fix without knowing what it does.
  const QList<core::IssueFix> fixes = n->errors().isEmpty() ? QList<core::IssueFix>() : ed->fixesFor(n->id());
  for (const core::IssueFix& fix : fixes)
    menu.addAction(fix.label, this, [this, ed, fix] {
      QString why;
      if (!ed->applyFix(fix, &why)) emit message(fix.label + ": " + why, true);
    });
  if (!fixes.isEmpty()) menu.addSeparator();
  menu.addAction("Run to here", this, [this, scene] { emit runToHereRequested(scene->selectedNodeIds()); });
  menu.addAction(bypass_);
  menu.addAction(mute_);
  menu.addSeparator();
  menu.addAction(duplicate_);
  menu.addAction(copy_);
  menu.addAction(cut_);
  menu.addAction(delete_);
  menu.addAction(comment_);
  menu.addSeparator();
  menu.addAction(collapse_);
  menu.addMenu(arrangeMenu(&menu));
  menu.addAction(frame_);
}

void CanvasActions::execContextMenu(QContextMenuEvent* e) {
  QMenu menu(view_);
  GraphEditor* ed = view_->graphScene()->editor();
  if (NodeItem* n = itemAt<NodeItem>(view_, e->pos())) {
    fillNodeMenu(menu, n);
  } else if (WireItem* wire = itemAt<WireItem>(view_, e->pos())) {
    const GraphConnection c = wire->connection();
    menu.addAction(QString("Disconnect %1 → %2").arg(c.from.str(), c.to.str()), this,
                   [ed, c] { ed->disconnect(c); });
    const QPointF sp = view_->mapToScene(e->pos());
    menu.addAction("Add reroute point here", this, [ed, c, sp, wire] {
      QList<QPointF> points = wire->points();
      points.insert(wire->insertionIndex(sp), sp);
      ed->setReroutePoints(c, points, "Add reroute point");
    });
    if (!wire->points().isEmpty())
      menu.addAction("Remove reroute points", this,
                     [ed, c] { ed->setReroutePoints(c, {}, "Remove reroute points"); });
  } else if (CommentItem* frame = itemAt<CommentItem>(view_, e->pos())) {
    const QString id = frame->id();
    QMenu* colors = menu.addMenu("Colour");
    for (const auto& [name, color] : GraphEditor::commentColors()) {
      QPixmap swatch(14, 14);
      swatch.fill(color);
      QAction* a =
          colors->addAction(QIcon(swatch), name, this, [ed, id, color] { ed->setCommentColor(id, color); });
      a->setCheckable(true);
      a->setChecked(frame->frame().color == color);
    }
    menu.addAction("Delete frame", this, [ed, id] { ed->removeComments({id}); });
  } else {
    const QPoint vp = e->pos();
    menu.addAction("Add node…", this, [this, vp] { view_->openNodeSearch(vp); });
    menu.addAction("Add comment frame", this, [this, vp] { addCommentFrame(vp); });
    menu.addAction(paste_);
    menu.addAction(selectAll_);
    menu.addAction(frame_);
  }
  menu.exec(e->globalPos());
}

}  // namespace gn::editor
