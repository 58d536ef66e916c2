// Subgraphs in the editor: Ctrl+G groups the selection as one undo step and Ctrl+Shift+G ungroups; a
// double-click enters a subgraph (the breadcrumb shows the path, its crumbs go back up); an edit inside
// changes the subgraph node in the root document as one undoable step; the inspector promotes inner params
// and edits promoted ones; the palette lists the library under "Blocks"; an instance whose block file
// changed shows as out of date and updates from the library; "Blocks" entries drop onto any level's canvas
// (but not into an instance of themselves); a run's states, reported by path id, show on the inner nodes at
// every open level and summed up on their Subgraph node; the Edit, Node and View menus act on the canvas on
// screen; a log line naming an inner node opens its level.
#include <QComboBox>
#include <QDir>
#include <QDragEnterEvent>
#include <QLabel>
#include <QListWidget>
#include <QMenuBar>
#include <QMimeData>
#include <QPushButton>
#include <QSpinBox>
#include <QTreeWidget>
#include <QUndoStack>
#include <QtTest>

#include "editor_test_util.h"
#include "fake_nodes.h"
#include "gpunodes/core/subgraph.h"
#include "graph_editor.h"
#include "inspector.h"
#include "find_bar.h"
#include "palette.h"
#include "run_controller.h"
#include "subgraph_navigator.h"

using namespace gn::editor;
using namespace gn::testing;
namespace core = gn::core;
namespace subgraph = gn::core::subgraph;

class SubgraphEditorTest : public QObject {
  Q_OBJECT

  IsolatedEnv env_;
  FakeNodeSet fake_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  // dev0 -> x1 -> mm1 (a and b) -> mm2 (a), x1 -> mm2 (b)
  void buildGraph() {
    GraphEditor* ed = w_->editor();
    ed->addNode("Device", {0, 0});
    ed->addNode("Tensor", {220, 0});
    ed->addNode("MatMul", {440, 0});
    ed->addNode("MatMul", {660, 0});
    QVERIFY(ed->connect({"d1", "device"}, {"t1", "device"}));
    QVERIFY(ed->connect({"t1", "out"}, {"mm1", "a"}));
    QVERIFY(ed->connect({"t1", "out"}, {"mm1", "b"}));
    QVERIFY(ed->connect({"mm1", "out"}, {"mm2", "a"}));
    QVERIFY(ed->connect({"t1", "out"}, {"mm2", "b"}));
  }

  QAction* action(const QString& text) {
    for (QAction* a : w_->findChildren<QAction*>())
      if (a->text().remove('&') == text) return a;
    return nullptr;
  }

  // An entry of a menu bar menu (or of a submenu in it), by its text without '&'.
  QAction* menuAction(const QString& menu, const QString& text) {
    for (QAction* m : w_->menuBar()->actions())
      if (m->text().remove('&') == menu && m->menu())
        for (QAction* a : m->menu()->actions()) {
          if (a->text().remove('&') == text) return a;
          if (a->menu())
            for (QAction* sub : a->menu()->actions())
              if (sub->text().remove('&') == text) return sub;
        }
    return nullptr;
  }

  static core::RunEvent event(core::RunEvent::Kind kind, const QString& node, double value = 0,
                              const QString& message = {}, core::NodeStatus status = core::NodeStatus::Ok) {
    core::RunEvent e;
    e.kind = kind;
    e.node = node;
    e.value = value;
    e.message = message;
    e.status = status;
    return e;
  }

  // Drops a palette entry's drag payload on a canvas at a viewport point.
  static void dropOn(GraphView* view, QMimeData* mime, QPoint at) {
    QDragEnterEvent enter(at, Qt::CopyAction, mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(view->viewport(), &enter);
    QVERIFY(enter.isAccepted());
    QDropEvent drop(QPointF(at), Qt::CopyAction, mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(view->viewport(), &drop);
  }

 private slots:
  void initTestCase() {
    registry_.addPlugin(&fake_, "fake");
    QDir(subgraph::libraryDir()).removeRecursively();
  }
  void cleanupTestCase() { QDir(subgraph::libraryDir()).removeRecursively(); }
  void init() {
    w_ = std::make_unique<MainWindow>(&registry_);
    w_->show();
    buildGraph();
  }
  void cleanup() { w_.reset(); }

  void ctrlGGroupsTheSelectionAsOneUndoStep() {
    const QByteArray before = normalized(*w_->document());
    w_->scene()->selectNodes({"t1", "mm1"});
    QAction* group = action("Group into Subgraph");
    QVERIFY(group);
    QCOMPARE(group->shortcut(), QKeySequence(Qt::CTRL | Qt::Key_G));
    const int steps = w_->editor()->undoStack()->count();
    group->trigger();
    QCOMPARE(w_->editor()->undoStack()->count(), steps + 1);
    const core::GraphNode* block = w_->document()->node("block1");
    QVERIFY(block && subgraph::isSubgraph(*block));
    QCOMPARE(w_->document()->nodes().size(), 3);
    // The canvas shows it with the ports the border wires made: device in; t1.out and mm1.out out.
    NodeItem* item = w_->scene()->nodeItem("block1");
    QVERIFY(item);
    QCOMPARE(item->inputs().size(), 1);
    QCOMPARE(item->outputs().size(), 2);
    QVERIFY(w_->scene()->wireItem({{"block1", "out"}, {"mm2", "a"}, {}}));
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{"block1"});

    // Ctrl+Shift+G ungroups; undo twice gives the graph back exactly.
    QAction* ungroup = action("Ungroup Subgraph");
    QCOMPARE(ungroup->shortcut(), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_G));
    ungroup->trigger();
    QVERIFY(!w_->document()->hasNode("block1"));
    QCOMPARE(normalized(*w_->document()), before);
    w_->editor()->undoStack()->undo();
    QVERIFY(w_->document()->hasNode("block1"));
    w_->editor()->undoStack()->undo();
    QCOMPARE(normalized(*w_->document()), before);
  }

  void doubleClickEntersAndTheBreadcrumbGoesBack() {
    w_->scene()->selectNodes({"t1", "mm1"});
    QCOMPARE(w_->groupSelection(), QStringLiteral("block1"));
    SubgraphNavigator* nav = w_->navigator();
    auto* crumbs = w_->findChild<Breadcrumb*>();
    QVERIFY(crumbs);
    QVERIFY(crumbs->isHidden());
    emit w_->scene()->nodeDoubleClicked("block1");
    QCOMPARE(nav->depth(), 1);
    QVERIFY(crumbs->isVisible());
    QCOMPARE(crumbs->text(), QStringLiteral("graph \u203a block1"));
    QVERIFY(nav->currentScene() != w_->scene());
    QVERIFY(nav->currentScene()->nodeItem("mm1"));
    QVERIFY(nav->currentView()->isVisible());
    QVERIFY(!w_->view()->isVisible());  // the inner canvas takes the root's place
    // Double-clicking a plain node inside enters nothing.
    QVERIFY(!nav->enter("mm1"));
    emit crumbs->levelClicked(0);
    QCOMPARE(nav->depth(), 0);
    QCOMPARE(nav->currentView(), w_->view());
    QVERIFY(w_->view()->isVisible());
  }

  void anEditInsideChangesTheNodeInTheRootAndUndoes() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    SubgraphNavigator* nav = w_->navigator();
    QVERIFY(nav->enter("block1"));
    const int steps = w_->editor()->undoStack()->count();
    nav->currentEditor()->setParam("mm1", "repeat", 7);
    nav->currentEditor()->setParam("mm1", "repeat", 8);  // typing on: one step
    QCOMPARE(subgraph::nodeAt(*w_->document(), "block1/mm1")->params.value("repeat").toInt(), 8);
    QCOMPARE(w_->editor()->undoStack()->count(), steps + 1);
    QVERIFY(w_->editor()->undoStack()->undoText().startsWith("block1: "));
    nav->currentEditor()->addNode("MatMul", {300, 200});
    QVERIFY(subgraph::nodeAt(*w_->document(), "block1/mm2"));
    QCOMPARE(w_->editor()->undoStack()->count(), steps + 2);
    QVERIFY(w_->isDirty());

    // Undo on the root stack reaches inside, and the open level shows it.
    w_->editor()->undoStack()->undo();
    QVERIFY(!subgraph::nodeAt(*w_->document(), "block1/mm2"));
    QVERIFY(!nav->currentScene()->nodeItem("mm2"));
    w_->editor()->undoStack()->undo();
    QVERIFY(!subgraph::nodeAt(*w_->document(), "block1/mm1")->params.contains("repeat"));  // as before
    QVERIFY(!nav->currentEditor()->document()->node("mm1")->params.contains("repeat"));
    // Undoing the grouping itself takes the node away: the level closes.
    w_->editor()->undoStack()->undo();
    QCOMPARE(nav->depth(), 0);
  }

  void nestedLevelsWriteThroughToTheRoot() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    SubgraphNavigator* nav = w_->navigator();
    QVERIFY(nav->enter("block1"));
    nav->currentScene()->selectNodes({"mm1"});
    QCOMPARE(w_->groupSelection(), QStringLiteral("block1"));  // ids are per level
    QVERIFY(subgraph::nodeAt(*w_->document(), "block1/block1/mm1"));
    QVERIFY(nav->enter("block1"));
    QCOMPARE(nav->path(), (QStringList{"block1", "block1"}));
    QCOMPARE(w_->findChild<Breadcrumb*>()->text(), QStringLiteral("graph \u203a block1 \u203a block1"));
    nav->currentEditor()->setParam("mm1", "repeat", 5);
    QCOMPARE(subgraph::nodeAt(*w_->document(), "block1/block1/mm1")->params.value("repeat").toInt(), 5);
    // Validation of the root is painted on every level: an issue deep inside shows on its node there.
    nav->currentEditor()->setParam("mm1", "repeat", 0);
    w_->validateNow();
    QVERIFY(!nav->currentScene()->nodeItem("mm1")->errors().isEmpty());
    QVERIFY2(w_->scene()->nodeItem("block1")->errors().join("\n").contains("block1/mm1: params.repeat: 0"),
             qPrintable(w_->scene()->nodeItem("block1")->errors().join("\n")));
  }

  void theInspectorPromotesAndEditsPromotedParams() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    InspectorPanel* insp = w_->inspector();
    insp->showNodes({"block1"});
    QVERIFY(insp->innerParams());
    const int index = insp->innerParams()->findText("mm1.repeat");
    QVERIFY(index >= 0);
    insp->innerParams()->setCurrentIndex(index);
    insp->promoteButton()->click();
    const core::Subgraph& sub = subgraph::of(*w_->document()->node("block1"));
    QCOMPARE(sub.promoted.size(), 1);
    QCOMPARE(sub.promoted[0].name, QStringLiteral("repeat"));
    // Now an editor of its own, with the inner param's range; setting it sets the promoted value.
    auto* spin = qobject_cast<QSpinBox*>(insp->editorFor("repeat"));
    QVERIFY(spin);
    QCOMPARE(spin->maximum(), 1000000);
    spin->setValue(42);
    QCOMPARE(w_->document()->node("block1")->params.value("repeat").toInt(), 42);
    QCOMPARE(insp->innerParams()->findText("mm1.repeat"), -1);  // promoted ones leave the list
    w_->editor()->unpromote("block1", "repeat");
    QVERIFY(subgraph::of(*w_->document()->node("block1")).promoted.isEmpty());
    QVERIFY(!w_->document()->node("block1")->params.contains("repeat"));
  }

  void theLibraryListsBlocksAndUpdatesInstances() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    QVERIFY(w_->saveToLibrary("block1", "TwoMats"));
    QTreeWidgetItem* entry = w_->palette()->itemForBlock("TwoMats");
    QVERIFY(entry);
    QCOMPARE(entry->parent()->text(0), QStringLiteral("Blocks"));
    QCOMPARE(subgraph::of(*w_->document()->node("block1")).block.name, QStringLiteral("TwoMats"));

    // Adding from the palette: a new instance, up to date.
    emit w_->palette()->tree()->itemDoubleClicked(entry, 0);
    QVERIFY(w_->document()->hasNode("block2"));
    InspectorPanel* insp = w_->inspector();
    insp->showNodes({"block2"});
    QVERIFY(insp->libraryState()->text().contains("up to date"));
    QVERIFY(!insp->updateButton());

    // The block file changes on disk: the instance is out of date and "Update from library" updates it.
    core::GraphDocument blockDoc;
    QString error;
    const QString path = QDir(subgraph::libraryDir()).filePath("TwoMats.json");
    QVERIFY(core::serializer::loadFile(path, blockDoc, &error));
    QVERIFY(subgraph::setParamAt(blockDoc, "TwoMats/mm1", "repeat", 9));
    QVERIFY(core::serializer::saveFile(path, blockDoc, &error));
    w_->palette()->reloadBlocks();
    insp->showNodes({"block2"});
    QVERIFY2(insp->libraryState()->text().contains("out of date"), qPrintable(insp->libraryState()->text()));
    QVERIFY(insp->updateButton());
    insp->updateButton()->click();
    QCOMPARE(subgraph::nodeAt(*w_->document(), "block2/mm1")->params.value("repeat").toInt(), 9);
    insp->showNodes({"block2"});
    QVERIFY(insp->libraryState()->text().contains("up to date"));
    w_->editor()->undoStack()->undo();  // one step
    QVERIFY(!subgraph::nodeAt(*w_->document(), "block2/mm1")->params.contains("repeat"));
  }

  void summarizeRunStatesFollowsTheInnerNodes() {
    using S = RunStatus;
    const auto state = [](S s, double ms = 0, const QString& error = {}) {
      NodeRunState r;
      r.status = s;
      r.timeMs = ms;
      r.error = error;
      return r;
    };
    QCOMPARE(summarizeRunStates({}).status, S::Idle);
    QCOMPARE(summarizeRunStates({{"a", state(S::Idle)}}).status, S::Idle);
    QCOMPARE(summarizeRunStates({{"a", state(S::Queued)}, {"b", state(S::Queued)}}).status, S::Queued);
    // One done and one still queued: the block is under way.
    NodeRunState s = summarizeRunStates({{"a", state(S::Done, 3)}, {"b", state(S::Queued)}});
    QCOMPARE(s.status, S::Running);
    QCOMPARE(s.progress, 0.5);
    // Running wins over a failure elsewhere inside; once nothing runs, the failure shows, named by path.
    QCOMPARE(summarizeRunStates({{"a", state(S::Running)}, {"b/c", state(S::Failed, 0, "boom")}}).status,
             S::Running);
    s = summarizeRunStates({{"a", state(S::Done, 2)}, {"b/c", state(S::Failed, 0, "boom")}});
    QCOMPARE(s.status, S::Failed);
    QCOMPARE(s.error, QStringLiteral("b/c: boom"));
    s = summarizeRunStates({{"a", state(S::Done, 2)}, {"b", state(S::Cancelled)}});
    QCOMPARE(s.status, S::Cancelled);
    // Done: the times summed; idle nodes (not in this run) count for nothing.
    s = summarizeRunStates({{"a", state(S::Done, 2.5)}, {"b", state(S::Done, 4)}, {"c", state(S::Idle)}});
    QCOMPARE(s.status, S::Done);
    QCOMPARE(s.timeMs, 6.5);
    QVERIFY(!s.cached);
    NodeRunState cached = state(S::Done);
    cached.cached = true;
    QVERIFY(summarizeRunStates({{"a", cached}, {"b", cached}}).cached);
    QVERIFY(!summarizeRunStates({{"a", cached}, {"b", state(S::Done, 1)}}).cached);
    // Warnings are listed by path, a few of them, and the rest counted.
    NodeRunState warned;
    warned.warning = "careful";
    s = summarizeRunStates({{"a", warned}, {"b", warned}, {"c", warned}, {"d", warned}, {"e", warned}});
    QCOMPARE(s.warning, QStringLiteral("a: careful\nb: careful\nc: careful\n(and 2 more inside)"));
  }

  void runStatesShowAtEveryLevel() {
    // block1 holds t1 and mm1, and block1 inside it holds mm1 again: paths block1/t1, block1/block1/mm1.
    w_->scene()->selectNodes({"t1", "mm1"});
    QCOMPARE(w_->groupSelection(), QStringLiteral("block1"));
    SubgraphNavigator* nav = w_->navigator();
    QVERIFY(nav->enter("block1"));
    nav->currentScene()->selectNodes({"mm1"});
    QCOMPARE(w_->groupSelection(), QStringLiteral("block1"));
    nav->exitTo(0);
    using K = core::RunEvent::Kind;
    RunController* run = w_->runner();
    NodeItem* block = w_->scene()->nodeItem("block1");
    emit run->batch({event(K::NodeQueued, "d1"), event(K::NodeQueued, "block1/t1"),
                     event(K::NodeQueued, "block1/block1/mm1"), event(K::NodeQueued, "mm2")});
    QCOMPARE(block->runStatus(), RunStatus::Queued);
    emit run->batch({event(K::NodeStarted, "block1/t1"), event(K::Progress, "block1/t1", 0.5)});
    QCOMPARE(block->runStatus(), RunStatus::Running);
    QCOMPARE(block->progress(), 0.25);  // half of one of two
    emit run->batch({event(K::NodeFinished, "block1/t1", 5)});
    QCOMPARE(block->runStatus(), RunStatus::Running);  // mm1 is still to come
    // Entering shows each inner node's own state, and the nested block's summary.
    QVERIFY(nav->enter("block1"));
    QCOMPARE(nav->currentScene()->nodeItem("t1")->runStatus(), RunStatus::Done);
    QCOMPARE(nav->currentScene()->nodeItem("t1")->runTimeMs(), 5.0);
    QCOMPARE(nav->currentScene()->nodeItem("block1")->runStatus(), RunStatus::Queued);
    // Events while inside reach the open level and the root at once.
    emit run->batch({event(K::NodeStarted, "block1/block1/mm1")});
    QCOMPARE(nav->currentScene()->nodeItem("block1")->runStatus(), RunStatus::Running);
    emit run->batch({event(K::NodeFinished, "block1/block1/mm1", 7.5)});
    QCOMPARE(nav->currentScene()->nodeItem("block1")->runStatus(), RunStatus::Done);
    QCOMPARE(nav->currentScene()->nodeItem("block1")->runTimeMs(), 7.5);
    QCOMPARE(block->runStatus(), RunStatus::Done);
    QCOMPARE(block->runTimeMs(), 12.5);
    QVERIFY(nav->enter("block1"));
    QCOMPARE(nav->currentScene()->nodeItem("mm1")->runStatus(), RunStatus::Done);
    QCOMPARE(nav->currentScene()->nodeItem("mm1")->runTimeMs(), 7.5);

    // Previews come from the report's entries under their paths.
    const QJsonObject inspect{{"shape", QJsonArray{2}}, {"device", "cpu"}, {"values", QJsonArray{1.5, 2.5}}};
    nav->setPreviews(QJsonObject{
        {"nodes", QJsonObject{{"block1/block1/mm1", QJsonObject{{"inspect", QJsonArray{inspect}}}}}}});
    QCOMPARE(nav->currentScene()->nodeItem("mm1")->preview().kind, NodePreview::Kind::Values);
    QCOMPARE(nav->currentScene()->nodeItem("mm1")->preview().values, (QList<double>{1.5, 2.5}));
    nav->exitTo(1);
    QCOMPARE(nav->currentScene()->nodeItem("t1")->preview().kind, NodePreview::Kind::None);

    // A failure deep inside: red on its node, and on each block above with the error named by path.
    emit run->batch({event(K::NodeFailed, "block1/block1/mm1", 0, "out of memory", core::NodeStatus::Failed)});
    QCOMPARE(nav->currentScene()->nodeItem("block1")->runStatus(), RunStatus::Failed);
    QCOMPARE(nav->currentScene()->nodeItem("block1")->runError(), QStringLiteral("mm1: out of memory"));
    QCOMPARE(block->runStatus(), RunStatus::Failed);
    QCOMPARE(block->runError(), QStringLiteral("block1/mm1: out of memory"));
    QVERIFY(w_->log()->item(w_->log()->count() - 1)->text().contains("block1/block1/mm1: out of memory"));
    // Skipped inside: grey, with the reason as a warning naming the node.
    emit run->batch({event(K::NodeFailed, "block1/t1", 0, "skipped: input a is muted", core::NodeStatus::Skipped)});
    QCOMPARE(nav->currentScene()->nodeItem("t1")->runStatus(), RunStatus::Cancelled);
    QVERIFY(block->warnings().contains("t1: skipped: input a is muted"));

    // An edit inside remakes block1's item at the root: it still shows the run.
    nav->currentEditor()->setParam("t1", "seed", 3);
    block = w_->scene()->nodeItem("block1");
    QCOMPARE(block->runStatus(), RunStatus::Failed);
    // A new run starts from nothing at every level.
    nav->resetRunState();
    QCOMPARE(w_->scene()->nodeItem("block1")->runStatus(), RunStatus::Idle);
    QCOMPARE(nav->currentScene()->nodeItem("t1")->runStatus(), RunStatus::Idle);
    QVERIFY(nav->currentScene()->nodeItem("t1")->warnings().isEmpty());
    // Cached inside: the block shows cached when all of it was.
    emit run->batch({event(K::NodeCached, "block1/t1"), event(K::NodeCached, "block1/block1/mm1")});
    QVERIFY(w_->scene()->nodeItem("block1")->cached());
    QVERIFY(nav->currentScene()->nodeItem("t1")->cached());
  }

  void aLogLineOrSpanOpensTheLevelOfItsNode() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    w_->logMessage(MainWindow::LogLevel::Error, "boom", "block1/mm1");
    QListWidgetItem* line = w_->log()->item(w_->log()->count() - 1);
    emit w_->log()->itemClicked(line);
    SubgraphNavigator* nav = w_->navigator();
    QCOMPARE(nav->path(), QStringList{"block1"});
    QCOMPARE(nav->currentScene()->selectedNodeIds(), QStringList{"mm1"});
    // A top-level node goes back up.
    QVERIFY(nav->reveal("mm2"));
    QCOMPARE(nav->depth(), 0);
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{"mm2"});
    QVERIFY(!nav->reveal("block1/nothing"));
    QCOMPARE(nav->depth(), 0);
  }

  void theMenusActOnTheCanvasOnScreen() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    SubgraphNavigator* nav = w_->navigator();
    QCOMPARE(menuAction("Edit", "Select all"), w_->view()->selectAllAction());
    QVERIFY(nav->enter("block1"));
    GraphView* inner = nav->currentView();
    for (const QString& text : {"Cut", "Copy", "Paste", "Duplicate", "Delete", "Select all", "Find…",
                                "Align left edges"})
      QVERIFY2(menuAction("Edit", text) && menuAction("Edit", text)->parent() == inner, qPrintable(text));
    QCOMPARE(menuAction("Node", "Bypass"), inner->bypassAction());
    QCOMPARE(menuAction("View", "Frame all / selection"), inner->frameAction());

    menuAction("Edit", "Select all")->trigger();
    QStringList selected = nav->currentScene()->selectedNodeIds();
    selected.sort();
    QCOMPARE(selected, (QStringList{"mm1", "t1"}));
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{"block1"});  // the root's selection as it was
    // Align acts on the inner nodes, as one step on the root's stack.
    const int steps = w_->editor()->undoStack()->count();
    QVERIFY(subgraph::nodeAt(*w_->document(), "block1/t1")->position.x() !=
            subgraph::nodeAt(*w_->document(), "block1/mm1")->position.x());
    menuAction("Edit", "Align left edges")->trigger();
    QCOMPARE(subgraph::nodeAt(*w_->document(), "block1/t1")->position.x(),
             subgraph::nodeAt(*w_->document(), "block1/mm1")->position.x());
    QCOMPARE(w_->editor()->undoStack()->count(), steps + 1);
    nav->currentScene()->selectNodes({"mm1"});
    menuAction("Edit", "Duplicate")->trigger();
    QCOMPARE(nav->currentEditor()->document()->nodes().size(), 3);
    QCOMPARE(subgraph::of(*w_->document()->node("block1")).nodes.size(), 3);
    menuAction("Node", "Bypass")->trigger();  // the duplicate, selected
    const QString copy = nav->currentScene()->selectedNodeIds().value(0);
    QVERIFY(subgraph::nodeAt(*w_->document(), "block1/" + copy)->bypassed);
    menuAction("Edit", "Delete")->trigger();
    QCOMPARE(subgraph::of(*w_->document()->node("block1")).nodes.size(), 2);
    QCOMPARE(w_->document()->nodes().size(), 3);  // nothing at the root went
    menuAction("Edit", "Find…")->trigger();
    QVERIFY(inner->findBar()->isVisible());
    QVERIFY(!w_->view()->findBar()->isVisible());

    // Back at the root, the menus are the root canvas's again.
    nav->exitTo(0);
    QCOMPARE(menuAction("Edit", "Select all"), w_->view()->selectAllAction());
    QCOMPARE(menuAction("Node", "Mute"), w_->view()->muteAction());
    int selectAlls = 0;
    for (QAction* m : w_->menuBar()->actions())
      if (m->menu())
        for (QAction* a : m->menu()->actions()) selectAlls += a->text().remove('&') == "Select all";
    QCOMPARE(selectAlls, 1);
  }

  void blocksDragOntoTheCanvasAtAnyLevel() {
    w_->scene()->selectNodes({"t1", "mm1"});
    w_->groupSelection();
    QVERIFY(w_->saveToLibrary("block1", "TwoMats"));
    w_->scene()->selectNodes({"mm2"});
    QCOMPARE(w_->groupSelection(), QStringLiteral("block2"));
    PalettePanel* pal = w_->palette();
    QTreeWidgetItem* entry = pal->itemForBlock("TwoMats");
    QVERIFY(entry);
    QVERIFY(entry->flags() & Qt::ItemIsDragEnabled);
    std::unique_ptr<QMimeData> mime(static_cast<PaletteTree*>(pal->tree())->mimeData({entry}));
    QVERIFY(mime);

    // At the root: a new instance where it lands.
    const QPoint at(200, 150);
    dropOn(w_->view(), mime.get(), at);
    const core::GraphNode* added = w_->document()->node("block3");
    QVERIFY(added && subgraph::isSubgraph(*added));
    QCOMPARE(subgraph::of(*added).block.name, QStringLiteral("TwoMats"));
    QVERIFY(QLineF(added->position, w_->view()->mapToScene(at)).length() < 40);
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{"block3"});

    // Inside another subgraph: added there, one step on the root's stack.
    SubgraphNavigator* nav = w_->navigator();
    QVERIFY(nav->enter("block2"));
    const int steps = w_->editor()->undoStack()->count();
    dropOn(nav->currentView(), mime.get(), at);
    const core::GraphNode* inner = subgraph::nodeAt(*w_->document(), "block2/block1");
    QVERIFY(inner && subgraph::of(*inner).block.name == "TwoMats");
    QCOMPARE(w_->editor()->undoStack()->count(), steps + 1);

    // Inside an instance of TwoMats (even nested), TwoMats would contain itself: refused, nothing added.
    QVERIFY(nav->enter("block1"));
    const QByteArray before = normalized(*w_->document());
    dropOn(nav->currentView(), mime.get(), at);
    QCOMPARE(normalized(*w_->document()), before);
    QVERIFY2(w_->lastMessage().contains("block2/block1 is an instance of block TwoMats"),
             qPrintable(w_->lastMessage()));
    // The same from a double-click on the entry.
    emit pal->tree()->itemDoubleClicked(entry, 0);
    QCOMPARE(normalized(*w_->document()), before);

    // A block file gone bad since the palette listed it: the drop says why.
    nav->exitTo(0);
    QFile bad(QDir(subgraph::libraryDir()).filePath("TwoMats.json"));
    QVERIFY(bad.open(QIODevice::WriteOnly | QIODevice::Truncate));
    bad.write("{not json");
    bad.close();
    dropOn(w_->view(), mime.get(), at);
    QVERIFY2(w_->lastMessage().contains("TwoMats.json"), qPrintable(w_->lastMessage()));
    QVERIFY(!w_->document()->hasNode("block4"));
  }
};

QTEST_MAIN(SubgraphEditorTest)
#include "test_subgraph_editor.moc"
