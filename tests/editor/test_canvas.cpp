// Canvas, palette, inspector, undo and clipboard, driven through the real widgets with mouse and keyboard.
#include <QClipboard>
#include <QComboBox>
#include <QLineEdit>
#include <QListWidget>
#include <QMimeData>
#include <QScrollBar>
#include <QSpinBox>
#include <QTreeWidget>
#include <QUndoStack>

#include "editor_test_util.h"
#include "fake_nodes.h"
#include "find_bar.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "inspector.h"
#include "main_window.h"
#include "node_search.h"
#include "palette.h"
#include "plots.h"
#include "recent.h"
#include "timeline.h"

using namespace gn;
using editor::GraphView;
using editor::MainWindow;

class TestCanvas : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  testing::FakeNodeSet fake_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;
  QStringList prompts_;

  GraphView* view() { return w_->view(); }
  QWidget* vp() { return w_->view()->viewport(); }
  editor::GraphEditor* ed() { return w_->editor(); }
  core::GraphDocument* doc() { return w_->document(); }

  QString add(const QString& type, QPointF pos) { return ed()->addNode(type, pos); }
  QPoint nodeTitle(const QString& id) {
    editor::NodeItem* n = w_->scene()->nodeItem(id);
    return testing::viewPoint(view(), n->mapToScene(QPointF(n->boundingRect().width() / 2, 12)));
  }
  bool connected(const QString& from, const QString& to) {
    return doc()->connections().contains(
        core::GraphConnection{*core::Endpoint::parse(from), *core::Endpoint::parse(to), {}});
  }

 private slots:
  void initTestCase() { registry_.addPlugin(&fake_, "fake"); }

  void init() {
    w_ = std::make_unique<MainWindow>(&registry_);
    w_->setPromptHandler(
        [this](QMessageBox::Icon, const QString&, const QString& text, QMessageBox::StandardButtons) {
          prompts_ << text;
          return QMessageBox::Discard;
        });
    w_->resize(1400, 900);
    w_->show();
    QVERIFY(QTest::qWaitForWindowExposed(w_.get()));
    view()->setZoom(1);
    view()->centerOn(300, 150);
    prompts_.clear();
  }

  void cleanup() { w_.reset(); }

  void addNodeFromPalette() {
    editor::PalettePanel* pal = w_->palette();
    QTreeWidgetItem* item = pal->itemForType("MatMul");
    QVERIFY(item);
    // The search field filters the catalogue.
    QTest::keyClicks(pal->searchField(), "matm");
    QVERIFY(!item->isHidden());
    QVERIFY(pal->itemForType("Device")->isHidden());
    const QRect r = pal->tree()->visualItemRect(item);
    // A double click is a press and release, then the double-click event.
    QTest::mouseClick(pal->tree()->viewport(), Qt::LeftButton, {}, r.center());
    QTest::mouseDClick(pal->tree()->viewport(), Qt::LeftButton, {}, r.center());
    QCOMPARE(doc()->nodes().size(), 1);
    QCOMPARE(doc()->nodes().first().type, QString("MatMul"));
    QVERIFY(w_->scene()->nodeItem(doc()->nodes().first().id));
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{doc()->nodes().first().id});

    // Drop from the palette: the drag's mime data dropped on the canvas adds the node where it lands.
    std::unique_ptr<QMimeData> mime(
        static_cast<editor::PaletteTree*>(pal->tree())->mimeData({pal->itemForType("MatMul")}));
    QVERIFY(mime);
    const QPoint at(200, 150);
    QDragEnterEvent enter(at, Qt::CopyAction, mime.get(), Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(vp(), &enter);
    QVERIFY(enter.isAccepted());
    QDropEvent drop(QPointF(at), Qt::CopyAction, mime.get(), Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(vp(), &drop);
    QCOMPARE(doc()->nodes().size(), 2);
    const QPointF landed = doc()->nodes().last().position;
    QVERIFY(QLineF(landed, view()->mapToScene(at)).length() < 40);
    QCOMPARE(ed()->undoStack()->count(), 2);
  }

  // Double-clicking palette entries with the mouse away from the canvas: each node goes beside the one
  // added before, none on another (six double-clicks once gave one visible node).
  void paletteAddsNeverStack() {
    editor::PalettePanel* pal = w_->palette();
    QCursor::setPos(pal->mapToGlobal(pal->rect().center()));
    for (int i = 0; i < 6; ++i) {
      QTreeWidgetItem* entry = pal->itemForType(i % 2 ? "Tensor" : "MatMul");
      QVERIFY(entry);
      emit pal->tree()->itemDoubleClicked(entry, 0);
    }
    QCOMPARE(doc()->nodes().size(), 6);
    QList<QRectF> rects;
    const QRectF visible = view()->mapToScene(vp()->rect()).boundingRect();
    for (const core::GraphNode& n : doc()->nodes()) rects << w_->scene()->nodeItem(n.id)->sceneBoundingRect();
    // The view follows: the newest node is in it.
    QVERIFY(visible.contains(rects.last()));
    for (int i = 0; i < rects.size(); ++i) {
      for (int j = i + 1; j < rects.size(); ++j)
        QVERIFY2(!rects[i].intersects(rects[j]),
                 qPrintable(QString("node %1 overlaps node %2").arg(i).arg(j)));
      // Beside the one before: no further than a node's width or so away.
      if (i > 0) QVERIFY(QLineF(rects[i - 1].center(), rects[i].center()).length() < 2.5 * rects[i].width());
    }
    QCOMPARE(ed()->undoStack()->count(), 6);
  }

  // With the mouse over the canvas, the node goes where the mouse is, as a drop would put it; over another
  // node, beside it instead.
  void paletteAddsGoAtTheCursor() {
    editor::PalettePanel* pal = w_->palette();
    const QPoint at(260, 220);
    QCursor::setPos(vp()->mapToGlobal(at));
    if (vp()->mapFromGlobal(QCursor::pos()) != at) QSKIP("this platform does not move the cursor");
    emit pal->tree()->itemDoubleClicked(pal->itemForType("MatMul"), 0);
    QCOMPARE(doc()->nodes().size(), 1);
    const QString first = doc()->nodes().first().id;
    QCOMPARE(doc()->nodes().first().position, view()->mapToScene(at) - QPointF(20, 13));
    // The mouse now over that node: the next one does not cover it.
    emit pal->tree()->itemDoubleClicked(pal->itemForType("MatMul"), 0);
    QCOMPARE(doc()->nodes().size(), 2);
    const QRectF a = w_->scene()->nodeItem(first)->sceneBoundingRect();
    const QRectF b = w_->scene()->nodeItem(doc()->nodes().last().id)->sceneBoundingRect();
    QVERIFY(!a.intersects(b));
    QVERIFY(QLineF(a.center(), b.center()).length() < 2.5 * a.height() + a.width());
  }

  void connectByDragging() {
    const QString dev = add("Device", {0, 0});
    const QString t = add("Tensor", {300, 0});
    const QString mm = add("MatMul", {600, 0});
    QTest::qWait(20);
    // Valid: Device.device -> Tensor.device.
    testing::drag(vp(), testing::portPoint(view(), dev, true, "device"),
                  testing::portPoint(view(), t, false, "device"));
    QVERIFY(connected(dev + ".device", t + ".device"));
    QVERIFY(w_->scene()->wireItem({{dev, "device"}, {t, "device"}, {}}));

    // Invalid: a Device into a Tensor input. While dragging, MatMul's inputs are dimmed.
    const QPoint from = testing::portPoint(view(), dev, true, "device");
    const QPoint to = testing::portPoint(view(), mm, false, "a");
    testing::sendMouse(vp(), QEvent::MouseButtonPress, from, Qt::LeftButton, Qt::LeftButton);
    testing::sendMouse(vp(), QEvent::MouseMove, to, Qt::NoButton, Qt::LeftButton);
    QVERIFY(w_->scene()->portDimmed(w_->scene()->nodeItem(mm), false, 0));
    QVERIFY(!w_->scene()->portDimmed(w_->scene()->nodeItem(t), false, 0));
    testing::sendMouse(vp(), QEvent::MouseButtonRelease, to, Qt::LeftButton, Qt::NoButton);
    QVERIFY(!connected(dev + ".device", mm + ".a"));
    QCOMPARE(doc()->connections().size(), 1);
    // The refusal says why, in the log.
    bool explained = false;
    for (int i = 0; i < w_->log()->count(); ++i)
      explained = explained || w_->log()->item(i)->text().contains("takes a Tensor");
    QVERIFY(explained);

    // Output to output is refused too; a cycle is refused.
    testing::drag(vp(), testing::portPoint(view(), t, true, "out"),
                  testing::portPoint(view(), mm, false, "a"));
    QVERIFY(connected(t + ".out", mm + ".a"));
    const QString mm2 = add("MatMul", {900, 0});
    testing::drag(vp(), testing::portPoint(view(), mm, true, "out"),
                  testing::portPoint(view(), mm2, false, "a"));
    QVERIFY(connected(mm + ".out", mm2 + ".a"));
    testing::drag(vp(), testing::portPoint(view(), mm2, true, "out"),
                  testing::portPoint(view(), mm, false, "b"));
    QVERIFY(!connected(mm2 + ".out", mm + ".b"));
    QVERIFY(ed()->connectionProblem({mm2, "out"}, {mm, "b"}).contains("cycle"));

    // Dragging from a wired input lifts the wire; dropping it on nothing disconnects (one undo step).
    const int before = ed()->undoStack()->count();
    testing::drag(vp(), testing::portPoint(view(), mm2, false, "a"),
                  testing::portPoint(view(), mm2, false, "a") + QPoint(0, 200));
    QVERIFY(!connected(mm + ".out", mm2 + ".a"));
    QCOMPARE(ed()->undoStack()->count(), before + 1);
    ed()->undoStack()->undo();
    QVERIFY(connected(mm + ".out", mm2 + ".a"));
  }

  void wireDroppedOnEmptySpaceOffersCompatibleNodes() {
    const QString t = add("Tensor", {0, 0});
    QTest::qWait(20);
    const QPoint from = testing::portPoint(view(), t, true, "out");
    testing::drag(vp(), from, from + QPoint(250, 60));
    auto* popup = qobject_cast<editor::NodeSearchPopup*>(QApplication::activePopupWidget());
    QVERIFY(popup);
    QStringList offered;
    for (int i = 0; i < popup->list()->count(); ++i)
      offered << popup->list()->item(i)->data(Qt::UserRole).toString();
    QVERIFY(offered.contains("MatMul"));
    QVERIFY(offered.contains("Copy"));
    QVERIFY(!offered.contains("Device"));  // it takes no Tensor
    QTest::keyClicks(popup->searchField(), "matmul");
    QTest::keyClick(popup->searchField(), Qt::Key_Return);
    QTRY_COMPARE(doc()->nodes().size(), 2);
    const QString mm = doc()->nodes().last().id;
    QCOMPARE(doc()->nodes().last().type, QString("MatMul"));
    QVERIFY(connected(t + ".out", mm + ".a"));
    // Adding and wiring is one undo step.
    ed()->undoStack()->undo();
    QCOMPARE(doc()->nodes().size(), 1);
    QVERIFY(doc()->connections().isEmpty());
  }

  void editParamInInspector() {
    const QString mm = add("MatMul", {100, 100});
    QTest::qWait(20);
    QTest::mouseClick(vp(), Qt::LeftButton, {}, nodeTitle(mm));
    QCOMPARE(w_->inspector()->currentNode(), mm);
    auto* spin = qobject_cast<QSpinBox*>(w_->inspector()->editorFor("repeat"));
    QVERIFY(spin);
    QCOMPARE(spin->minimum(), 1);
    QCOMPARE(spin->maximum(), 1000000);
    QVERIFY(spin->toolTip().contains("repeat"));
    spin->setFocus();
    spin->selectAll();
    QTest::keyClicks(spin, "25");
    QTest::keyClick(spin, Qt::Key_Return);
    QCOMPARE(doc()->node(mm)->params.value("repeat").toInt(), 25);
    // The node's summary shows it.
    QVERIFY(w_->scene()->nodeItem(mm));

    auto* combo = qobject_cast<QComboBox*>(w_->inspector()->editorFor("keep"));
    QVERIFY(combo);
    combo->setFocus();
    QTest::keyClick(combo, Qt::Key_Down);
    QCOMPARE(doc()->node(mm)->params.value("keep").toString(), QString("last"));

    // Undo reverts the document and the editor shows it.
    ed()->undoStack()->undo();
    QVERIFY(!doc()->node(mm)->params.contains("keep"));
    ed()->undoStack()->undo();
    QVERIFY(!doc()->node(mm)->params.contains("repeat"));
    QCOMPARE(spin->value(), 1);

    // A bad value in the document (from a file or a script) is shown inline, not hidden by the spin box.
    doc()->setParam(mm, "repeat", 0);
    QVERIFY(!w_->inspector()->errorFor("repeat").isEmpty());
    doc()->setParam(mm, "repeat", 5);
    QVERIFY(w_->inspector()->errorFor("repeat").isEmpty());

    // The shape editor parses "a, b" and rejects nonsense inline.
    const QString t = add("Tensor", {100, 300});
    w_->scene()->selectNodes({t});
    auto* shape = qobject_cast<QLineEdit*>(w_->inspector()->editorFor("shape"));
    QVERIFY(shape);
    shape->setFocus();
    shape->selectAll();
    QTest::keyClicks(shape, "128 x 256");
    QTest::keyClick(shape, Qt::Key_Return);
    QCOMPARE(doc()->node(t)->params.value("shape").toArray(), (QJsonArray{128, 256}));
    shape->selectAll();
    QTest::keyClicks(shape, "12, abc");
    QTest::keyClick(shape, Qt::Key_Return);
    QCOMPARE(doc()->node(t)->params.value("shape").toArray(), (QJsonArray{128, 256}));
    QVERIFY(w_->inspector()->errorFor("shape").contains("abc"));
  }

  void undoRedoSequenceWithPaste() {
    QList<QByteArray> states{testing::normalized(*doc())};
    const QString dev = add("Device", {0, 0});
    states << testing::normalized(*doc());
    const QString t = add("Tensor", {300, 0});
    states << testing::normalized(*doc());
    QTest::qWait(20);
    testing::drag(vp(), testing::portPoint(view(), dev, true, "device"),
                  testing::portPoint(view(), t, false, "device"));
    states << testing::normalized(*doc());
    // Move by dragging the title bar; two consecutive drags of the same node merge into one step.
    const QPoint title = nodeTitle(t);
    testing::drag(vp(), title, title + QPoint(40, 30));
    testing::drag(vp(), title + QPoint(40, 30), title + QPoint(80, 60));
    QCOMPARE(doc()->node(t)->position, QPointF(380, 60));
    states << testing::normalized(*doc());
    ed()->setParam(t, "seed", 7);
    states << testing::normalized(*doc());
    // Copy both and paste: one step, whatever the number of nodes.
    w_->scene()->selectNodes({dev, t});
    view()->setFocus();
    QTest::keyClick(vp(), Qt::Key_C, Qt::ControlModifier);
    QTest::keyClick(vp(), Qt::Key_V, Qt::ControlModifier);
    QCOMPARE(doc()->nodes().size(), 4);
    QCOMPARE(doc()->connections().size(), 2);
    states << testing::normalized(*doc());
    QCOMPARE(ed()->undoStack()->count(), states.size() - 1);

    for (int i = states.size() - 2; i >= 0; --i) {
      ed()->undoStack()->undo();
      QCOMPARE(testing::normalized(*doc()), states[i]);
      QCOMPARE(w_->scene()->nodeCount(), int(doc()->nodes().size()));
      QCOMPARE(w_->scene()->wireCount(), int(doc()->connections().size()));
    }
    for (int i = 1; i < states.size(); ++i) {
      ed()->undoStack()->redo();
      QCOMPARE(testing::normalized(*doc()), states[i]);
    }
    QCOMPARE(w_->scene()->wireCount(), 2);
  }

  void copyPasteDuplicateDelete() {
    const QString dev = add("Device", {0, 0});
    const QString t = add("Tensor", {300, 0});
    ed()->connect({dev, "device"}, {t, "device"});
    ed()->setParam(t, "shape", QJsonArray{8, 8});
    w_->scene()->selectNodes({dev, t});
    view()->setFocus();
    QTest::keyClick(vp(), Qt::Key_C, Qt::ControlModifier);
    // The clipboard holds a graph document's JSON: the same format as files.
    const QJsonObject clip = QJsonDocument::fromJson(QApplication::clipboard()->text().toUtf8()).object();
    QCOMPARE(clip.value("format").toString(), QString("gpunodes-graph"));
    QCOMPARE(clip.value("nodes").toArray().size(), 2);

    QTest::keyClick(vp(), Qt::Key_V, Qt::ControlModifier);
    QCOMPARE(doc()->nodes().size(), 4);
    const QStringList pasted = w_->scene()->selectedNodeIds();
    QCOMPARE(pasted.size(), 2);
    QVERIFY(!pasted.contains(dev) && !pasted.contains(t));
    QString newDev, newT;
    for (const QString& id : pasted) (doc()->node(id)->type == "Device" ? newDev : newT) = id;
    QVERIFY(connected(newDev + ".device", newT + ".device"));
    QCOMPARE(doc()->node(newT)->params.value("shape").toArray(), (QJsonArray{8, 8}));

    // Ctrl+D duplicates the selection next to it.
    w_->scene()->selectNodes({t});
    QTest::keyClick(vp(), Qt::Key_D, Qt::ControlModifier);
    QCOMPARE(doc()->nodes().size(), 5);
    const QString dup = w_->scene()->selectedNodeIds().value(0);
    QCOMPARE(doc()->node(dup)->position, doc()->node(t)->position + QPointF(40, 40));

    // Delete removes the selection and its wires; undo brings both back.
    w_->scene()->selectNodes({dev});
    QTest::keyClick(vp(), Qt::Key_Delete);
    QVERIFY(!doc()->hasNode(dev));
    QVERIFY(!connected(dev + ".device", t + ".device"));
    ed()->undoStack()->undo();
    QVERIFY(doc()->hasNode(dev));
    QVERIFY(connected(dev + ".device", t + ".device"));
    QVERIFY(w_->scene()->wireItem({{dev, "device"}, {t, "device"}, {}}));
  }

  void navigation() {
    add("Device", {0, 0});
    add("Tensor", {2000, 1500});
    QTest::qWait(10);
    // Wheel zooms at the cursor: the scene point under it stays put.
    const QPoint at(300, 200);
    const QPointF before = view()->mapToScene(at);
    QWheelEvent wheel(QPointF(at), QPointF(vp()->mapToGlobal(at)), {}, QPoint(0, 240), Qt::NoButton,
                      Qt::NoModifier, Qt::NoScrollPhase, false);
    QApplication::sendEvent(vp(), &wheel);
    QVERIFY(view()->zoom() > 1.2);
    QVERIFY(QLineF(view()->mapToScene(at), before).length() < 2);
    // Middle-drag pans.
    const QPointF c0 = view()->mapToScene(vp()->rect().center());
    testing::drag(vp(), QPoint(400, 300), QPoint(300, 250), Qt::MiddleButton);
    const QPointF c1 = view()->mapToScene(vp()->rect().center());
    QVERIFY(c1.x() > c0.x() + 50 / view()->zoom());
    // Space + left drag pans too, and does not start a rubber band.
    view()->setFocus();
    QTest::keyPress(vp(), Qt::Key_Space);
    testing::drag(vp(), QPoint(300, 300), QPoint(400, 300));
    QTest::keyRelease(vp(), Qt::Key_Space);
    QVERIFY(view()->mapToScene(vp()->rect().center()).x() < c1.x() - 50 / view()->zoom());
    // F frames everything.
    QTest::keyClick(vp(), Qt::Key_F);
    QVERIFY(view()->mapToScene(vp()->rect()).boundingRect().contains(w_->scene()->nodesRect(false)));
    // Rubber band selects both nodes; dragging one moves both (one undo step).
    w_->scene()->clearSelection();
    testing::drag(vp(), QPoint(2, 2), QPoint(vp()->width() - 3, vp()->height() - 3));
    QCOMPARE(w_->scene()->selectedNodeIds().size(), 2);
    const QString first = doc()->nodes().first().id;
    const QPointF p0 = doc()->nodes().first().position, p1 = doc()->nodes().last().position;
    const QPoint title = nodeTitle(first);
    const int steps = ed()->undoStack()->count();
    testing::drag(vp(), title, title + QPoint(20, 10));
    QVERIFY(doc()->nodes().first().position != p0);
    QCOMPARE(doc()->nodes().last().position - p1, doc()->nodes().first().position - p0);
    QCOMPARE(ed()->undoStack()->count(), steps + 1);
  }

  void deviceMismatchOffersInsertCopy() {
    const QString d0 = add("Device", {0, 0}), d1 = add("Device", {0, 250});
    const QString x = add("Tensor", {250, 0}), y = add("Tensor", {250, 250});
    const QString e = add("Elementwise", {550, 100});
    ed()->connect({d0, "device"}, {x, "device"});
    ed()->connect({d1, "device"}, {y, "device"});
    ed()->connect({x, "out"}, {e, "a"});
    ed()->connect({y, "out"}, {e, "b"});
    const QString msg =
        "Expected all tensors to be on the same device, but found at least two devices, cpu:1 and cpu!";
    w_->scene()->setRunStatus(e, editor::RunStatus::Failed, 0, msg);
    editor::NodeItem* item = w_->scene()->nodeItem(e);
    QVERIFY(item->errors().contains(msg));
    // The error is on the node's tooltip, with the offer.
    testing::sendMouse(vp(), QEvent::MouseMove, nodeTitle(e) + QPoint(1, 1), Qt::NoButton, Qt::NoButton);
    testing::sendMouse(vp(), QEvent::MouseMove, nodeTitle(e), Qt::NoButton, Qt::NoButton);
    QTRY_VERIFY(item->toolTip().contains("Insert Copy node"));
    QVERIFY(item->toolTip().contains("same device"));

    QString why;
    const std::optional<core::IssueFix> fix = ed()->fixFor(e, msg);
    QVERIFY(fix);
    QVERIFY2(ed()->applyFix(*fix, &why), qPrintable(why));
    QString copy;
    for (const core::GraphNode& n : doc()->nodes())
      if (n.type == "Copy") copy = n.id;
    QVERIFY(!copy.isEmpty());
    QVERIFY(connected(y + ".out", copy + ".in"));
    QVERIFY(connected(copy + ".out", e + ".b"));
    QVERIFY(connected(d0 + ".device", copy + ".device"));  // the device of the first input
    QVERIFY(!connected(y + ".out", e + ".b"));
    ed()->undoStack()->undo();
    QVERIFY(!doc()->hasNode(copy));
    QVERIFY(connected(y + ".out", e + ".b"));
  }

  void aFixThePluginOffersIsAppliedAsOneUndoStep() {
    const QString d0 = add("Device", {0, 0}), d1 = add("Device", {0, 250});
    const QString x = add("Tensor", {250, 0}), y = add("Tensor", {250, 250});
    const QString mm = add("MatMul", {550, 100});
    ed()->connect({d0, "device"}, {x, "device"});
    ed()->connect({d1, "device"}, {y, "device"});
    ed()->connect({x, "out"}, {mm, "a"});
    ed()->connect({y, "out"}, {mm, "b"});
    // The fake set reports the operands on two devices with a fix, as the GPU node set does.
    std::optional<core::Issue> issue;
    for (const core::Issue& i : w_->validateNow().forNode(mm))
      if (i.fix) issue = i;
    QVERIFY(issue);
    QCOMPARE(issue->fix->label, "Insert Copy node: b to " + d0);
    // Asked for by the problem's text, as the log shows it ("field: message") or as the issue has it.
    QVERIFY(ed()->fixFor(mm, issue->field + ": " + issue->message));
    QVERIFY(ed()->fixFor(mm, issue->message));
    QCOMPARE(ed()->fixFor(mm, "a run's own words")->label, issue->fix->label);  // a run words it otherwise
    QCOMPARE(ed()->fixesFor(mm).size(), 1);
    QVERIFY(ed()->fixesFor(x).isEmpty());
    QVERIFY(!ed()->fixFor(x, issue->message));

    const int steps = ed()->undoStack()->count();
    QString why;
    QVERIFY2(ed()->applyFix(*issue->fix, &why), qPrintable(why));
    QCOMPARE(ed()->undoStack()->count(), steps + 1);
    QString copy;
    for (const core::GraphNode& n : doc()->nodes())
      if (n.type == "Copy") copy = n.id;
    QVERIFY(!copy.isEmpty());
    QVERIFY(connected(y + ".out", copy + ".in"));
    QVERIFY(connected(copy + ".out", mm + ".b"));
    QVERIFY(connected(d0 + ".device", copy + ".device"));
    QVERIFY(w_->validateNow().ok());
    ed()->undoStack()->undo();
    QVERIFY(!doc()->hasNode(copy));
    QVERIFY(connected(y + ".out", mm + ".b"));

    // Any fix, of any type, with its params: the editor knows none of them.
    const core::IssueFix scale{.label = "Insert a product",
                               .nodeType = "Elementwise",
                               .params = {{"op", "mul"}},
                               .input = {mm, "a"},
                               .throughInput = "a",
                               .throughOutput = "out",
                               .alsoWired = {{.port = "b", .source = {y, "out"}}}};
    QVERIFY2(ed()->applyFix(scale, &why), qPrintable(why));
    QString inserted;
    for (const core::GraphNode& n : doc()->nodes())
      if (n.type == "Elementwise") inserted = n.id;
    QVERIFY(!inserted.isEmpty());
    QCOMPARE(doc()->node(inserted)->params, (QJsonObject{{"op", "mul"}}));
    QVERIFY(connected(x + ".out", inserted + ".a"));
    QVERIFY(connected(y + ".out", inserted + ".b"));
    QVERIFY(connected(inserted + ".out", mm + ".a"));
    QVERIFY(!connected(x + ".out", mm + ".a"));

    // A fix that no longer applies changes nothing and says why.
    const int before = ed()->undoStack()->count();
    core::IssueFix stale = scale;
    stale.input = {inserted, "b"};
    stale.alsoWired = {};
    ed()->disconnect({{y, "out"}, {inserted, "b"}, {}});
    why.clear();
    QVERIFY(!ed()->applyFix(stale, &why));
    QVERIFY(why.contains("not wired"));
    core::IssueFix unknown = scale;
    unknown.nodeType = "NoSuchType";
    why.clear();
    QVERIFY(!ed()->applyFix(unknown, &why));
    QVERIFY(why.contains("NoSuchType"));
    QCOMPARE(ed()->undoStack()->count(), before + 1);  // only the disconnect
  }

  void validationErrorsArePainted() {
    const QString mm = add("MatMul", {0, 0});
    ed()->setParam(mm, "repeat", 0);
    w_->validateNow();
    editor::NodeItem* item = w_->scene()->nodeItem(mm);
    QVERIFY(!item->errors().isEmpty());
    bool range = false;
    for (const QString& e : item->errors()) range = range || e.contains("repeat");
    QVERIFY(range);
    // Run refuses a graph with errors and says so, all at once.
    QVERIFY(!w_->runGraph());
    QVERIFY(w_->lastMessage().contains("problem"));
  }

  void commentFrames() {
    const QString a = add("Device", {0, 0}), b = add("Tensor", {250, 0});
    w_->scene()->selectNodes({a, b});
    view()->setFocus();
    QTest::keyClick(vp(), Qt::Key_C);
    QCOMPARE(ed()->comments().size(), 1);
    const editor::CommentFrame f = ed()->comments().first();
    QVERIFY(f.rect.contains(w_->scene()->nodesRect(false)));
    editor::CommentItem* item = w_->scene()->commentItem(f.id);
    QVERIFY(item);
    // Dragging the frame by its title carries the nodes inside, and undo puts both back in one step.
    w_->scene()->clearSelection();
    const QPoint title = testing::viewPoint(view(), f.rect.topLeft() + QPointF(60, 10));
    const int steps = ed()->undoStack()->count();
    testing::drag(vp(), title, title + QPoint(50, 40));
    QTRY_COMPARE(ed()->comments().first().rect.topLeft(), f.rect.topLeft() + QPointF(50, 40));
    QCOMPARE(doc()->node(a)->position, QPointF(50, 40));
    QCOMPARE(doc()->node(b)->position, QPointF(300, 40));
    QCOMPARE(ed()->undoStack()->count(), steps + 1);
    ed()->undoStack()->undo();
    QCOMPARE(doc()->node(a)->position, QPointF(0, 0));
    QCOMPARE(ed()->comments().first().rect, f.rect);
    // Frames are kept in the file (as the top-level "comments" field) and survive a round trip.
    core::GraphDocument copy;
    QString error;
    QVERIFY2(core::serializer::load(core::serializer::save(*doc()), copy, &error), qPrintable(error));
    QCOMPARE(copy.extra().value("comments").toArray().size(), 1);
    // Delete removes a selected frame (and leaves the nodes).
    w_->scene()->clearSelection();
    w_->scene()->commentItem(f.id)->setSelected(true);
    QTest::keyClick(vp(), Qt::Key_Delete);
    QVERIFY(ed()->comments().isEmpty());
    QCOMPARE(doc()->nodes().size(), 2);
  }

  void findCyclesThroughMatches() {
    // No other action of the window answers Ctrl+F.
    int findShortcuts = 0;
    for (QAction* a : w_->findChildren<QAction*>())
      for (const QKeySequence& k : a->shortcuts()) findShortcuts += k == QKeySequence(Qt::CTRL | Qt::Key_F);
    QCOMPARE(findShortcuts, 1);

    const QString dev = add("Device", {0, 0});
    const QString t1 = add("Tensor", {300, 0});
    const QString t2 = add("Tensor", {2600, 1800});
    const QString mm = add("MatMul", {-1500, 900});
    ed()->setParam(t2, "shape", QJsonArray{128, 7});
    ed()->setParam(mm, "repeat", 17);
    ed()->setParam(t1, "init", "zeros");
    editor::FindBar* bar = view()->findBar();
    QVERIFY(!bar->isVisible());
    view()->setFocus();
    QTest::keyClick(vp(), Qt::Key_F, Qt::ControlModifier);
    QVERIFY(bar->isVisible());
    QVERIFY(bar->field()->hasFocus());

    // "7" is in t2's shape (128×7) and mm's repeat (17), not in an id or a type: both, in document order.
    QTest::keyClicks(bar->field(), "7");
    QCOMPARE(bar->matches(), (QStringList{t2, mm}));
    QCOMPARE(bar->countText(), QString("1 of 2"));
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{t2});
    auto centred = [this](const QString& id) {
      const QPointF c = view()->mapToScene(vp()->rect().center());
      return QLineF(c, w_->scene()->nodeItem(id)->sceneBoundingRect().center()).length() < 2;
    };
    QVERIFY(centred(t2));
    QTest::keyClick(bar->field(), Qt::Key_Return);
    QCOMPARE(bar->countText(), QString("2 of 2"));
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{mm});
    QVERIFY(centred(mm));
    QTest::keyClick(bar->field(), Qt::Key_Return);  // wraps to the first
    QCOMPARE(bar->countText(), QString("1 of 2"));
    QVERIFY(centred(t2));
    QTest::keyClick(bar->field(), Qt::Key_Return, Qt::ShiftModifier);  // and back
    QCOMPARE(bar->countText(), QString("2 of 2"));
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{mm});

    // Types, case-insensitively; a default value ("uniform", t2's init) counts, an overridden one does not
    // (t1 says zeros); ids.
    QCOMPARE(editor::findNodes(ed(), "tENSor"), (QStringList{t1, t2}));
    QCOMPARE(editor::findNodes(ed(), "uniform"), QStringList{t2});
    QCOMPARE(editor::findNodes(ed(), "zeros"), QStringList{t1});
    QCOMPARE(editor::findNodes(ed(), dev), QStringList{dev});
    QCOMPARE(editor::findNodes(ed(), "[128,7]"), QStringList{t2});  // a shape as the file writes it
    QVERIFY(editor::findNodes(ed(), "  ").isEmpty());
    bar->field()->selectAll();
    QTest::keyClicks(bar->field(), "nothing-like-this");
    QCOMPARE(bar->countText(), QString("no matches"));
    QTest::keyClick(bar->field(), Qt::Key_Return);  // nothing to step to
    QCOMPARE(bar->current(), -1);
    // An edit that makes a node match shows at once; the node shown stays the current one.
    ed()->setParam(t2, "init", "ones");
    bar->field()->setText("ones");
    QCOMPARE(bar->matches(), QStringList{t2});
    ed()->setParam(t1, "init", "ones");
    QCOMPARE(bar->matches(), (QStringList{t1, t2}));
    QCOMPARE(bar->countText(), QString("2 of 2"));
    ed()->undoStack()->undo();
    QCOMPARE(bar->countText(), QString("1 of 1"));
    QTest::keyClick(bar->field(), Qt::Key_Escape);
    QVERIFY(!bar->isVisible());
    QVERIFY(view()->hasFocus());
  }

  void alignAndDistributeAreOneStepEach() {
    // Different widths and heights: a Tensor, a MatMul and a Device are not the same size once renamed.
    const QString a = add("MatMul", {0, 0}), b = add("Tensor", {410, 130}), c = add("Device", {980, -70});
    ed()->setParam(b, "shape", QJsonArray{4000, 4000});
    QTest::qWait(10);
    QHash<QString, QRectF> r;
    for (const QString& id : {a, b, c}) r[id] = w_->scene()->nodeItem(id)->sceneBodyRect();
    QCOMPARE(r[a].topLeft(), QPointF(0, 0));
    QList<QAction*> acts = view()->arrangeActions();
    QCOMPARE(acts.size(), 6);
    w_->scene()->selectNodes({a, b});
    QVERIFY(acts[0]->isEnabled());
    QVERIFY(!acts[4]->isEnabled());  // distributing needs three
    w_->scene()->selectNodes({a, b, c});
    QVERIFY(acts[4]->isEnabled());

    const QByteArray start = testing::normalized(*doc());
    auto pos = [this](const QString& id) { return doc()->node(id)->position; };
    auto check = [&](int action, const QHash<QString, QPointF>& expected) {
      const int steps = ed()->undoStack()->index();
      acts[action]->trigger();
      for (auto it = expected.begin(); it != expected.end(); ++it) QCOMPARE(pos(it.key()), it.value());
      QCOMPARE(ed()->undoStack()->index(), steps + 1);
      QCOMPARE(ed()->undoStack()->text(steps), acts[action]->text());
      ed()->undoStack()->undo();
      QCOMPARE(testing::normalized(*doc()), start);
    };
    // Left edges on the leftmost (a at 0), tops on the topmost (c at -70).
    check(0, {{a, {0, 0}}, {b, {0, 130}}, {c, {0, -70}}});
    check(1, {{a, {0, -70}}, {b, {410, -70}}, {c, {980, -70}}});
    // Centres on the selection's centre line: x from 0 to c's right edge, y from -70 to b's bottom.
    const qreal cx = (0 + r[c].right()) / 2, cy = (-70 + r[b].bottom()) / 2;
    check(2, {{a, {cx - r[a].width() / 2, 0}},
              {b, {cx - r[b].width() / 2, 130}},
              {c, {cx - r[c].width() / 2, -70}}});
    check(3, {{a, {0, cy - r[a].height() / 2}},
              {b, {410, cy - r[b].height() / 2}},
              {c, {980, cy - r[c].height() / 2}}});
    // Distributed left to right: a and c stay, b goes where the two gaps are equal.
    const qreal gap = (r[c].right() - 0 - r[a].width() - r[b].width() - r[c].width()) / 2;
    check(4, {{a, {0, 0}}, {b, {r[a].width() + gap, 130}}, {c, {980, -70}}});
    // Top to bottom: c (-70) and b (130) stay; a goes between with equal gaps.
    const qreal vgap = (r[b].bottom() - (-70) - r[a].height() - r[b].height() - r[c].height()) / 2;
    check(5, {{c, {980, -70}}, {a, {0, -70 + r[c].height() + vgap}}, {b, {410, 130}}});

    // Two named steps in a row stay two steps, unlike two drags of the same nodes.
    const int steps = ed()->undoStack()->index();
    acts[0]->trigger();
    acts[1]->trigger();
    QCOMPARE(ed()->undoStack()->index(), steps + 2);
    // The pure function agrees with the actions and leaves too small a selection where it is.
    const QHash<QString, QPointF> one = editor::arrange({{a, r[a]}}, editor::Arrangement::AlignLeft);
    QCOMPARE(one.value(a), r[a].topLeft());
  }

  void rerouteWires() {
    const QString t = add("Tensor", {0, 0}), mm = add("MatMul", {600, 300});
    QVERIFY(ed()->connect({t, "out"}, {mm, "a"}));
    const core::GraphConnection c{{t, "out"}, {mm, "a"}, {}};
    editor::WireItem* w = w_->scene()->wireItem(c);
    QVERIFY(w);
    QTest::qWait(10);
    // Double-click the wire halfway: a point there. The middle of the drawn curve, from its end points.
    const QPointF from = w->fromNode()->portScenePos(true, 0), to = w->toNode()->portScenePos(false, 0);
    const QPointF mid = editor::WireItem::bezier(from, to).pointAtPercent(0.5);
    const int steps = ed()->undoStack()->count();
    QTest::mouseDClick(vp(), Qt::LeftButton, {}, testing::viewPoint(view(), mid));
    QCOMPARE(ed()->undoStack()->count(), steps + 1);
    QList<QPointF> points = editor::GraphEditor::reroutePoints(doc()->connections().first());
    QCOMPARE(points.size(), 1);
    QVERIFY(QLineF(points[0], mid).length() < 2);
    QCOMPARE(w_->scene()->wireItem(c)->points(), points);
    // The wire now passes through it, and the point is a dot that drags.
    QVERIFY(w_->scene()->wireItem(c)->shape().contains(points[0]));
    const QPoint dot = testing::viewPoint(view(), points[0]);
    testing::drag(vp(), dot, dot + QPoint(0, -120));
    points = editor::GraphEditor::reroutePoints(doc()->connections().first());
    QVERIFY(QLineF(points[0], mid + QPointF(0, -120)).length() < 2);
    QCOMPARE(ed()->undoStack()->count(), steps + 2);
    // A second point, between the first and the input: it goes after the first.
    const QPointF second = editor::WireItem::bezier(points[0], to).pointAtPercent(0.5);
    QTest::mouseDClick(vp(), Qt::LeftButton, {}, testing::viewPoint(view(), second));
    points = editor::GraphEditor::reroutePoints(doc()->connections().first());
    QCOMPARE(points.size(), 2);
    QVERIFY(QLineF(points[1], second).length() < 2);

    // Saved on the connection as "points" and loaded back; an older reader keeps the field as an extra.
    core::GraphDocument loaded;
    QString error;
    const QByteArray bytes = core::serializer::save(*doc());
    QVERIFY(bytes.contains("\"points\""));
    QVERIFY2(core::serializer::load(bytes, loaded, &error), qPrintable(error));
    QCOMPARE(editor::GraphEditor::reroutePoints(loaded.connections().first()), points);
    QCOMPARE(core::serializer::save(loaded), bytes);

    // Moving both ends moves the points by as much, one undo step with the move; moving one end does not.
    w_->scene()->selectNodes({t, mm});
    const QPoint title = nodeTitle(t);
    const int beforeMove = ed()->undoStack()->count();
    testing::drag(vp(), title, title + QPoint(70, 30));
    const QPointF moved = doc()->node(t)->position;
    QCOMPARE(moved, QPointF(70, 30));
    const QList<QPointF> shifted = editor::GraphEditor::reroutePoints(doc()->connections().first());
    QCOMPARE(shifted, (QList<QPointF>{points[0] + moved, points[1] + moved}));
    QCOMPARE(w_->scene()->wireItem(c)->points(), shifted);
    QCOMPARE(ed()->undoStack()->count(), beforeMove + 1);
    ed()->undoStack()->undo();
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().first()), points);
    QCOMPARE(doc()->node(t)->position, QPointF(0, 0));
    w_->scene()->selectNodes({t});
    testing::drag(vp(), title, title + QPoint(0, 50));
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().first()), points);

    // Pasting a copy of both nodes moves the copy's points with the copy.
    const QList<QPointF> kept = editor::GraphEditor::reroutePoints(doc()->connections().first());
    const QStringList pasted = ed()->paste(ed()->copy({t, mm}), QPointF(1000, 1000));
    QCOMPARE(pasted.size(), 2);
    const QPointF offset = doc()->node(pasted[0])->position - doc()->node(t)->position;
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().last()),
             (QList<QPointF>{kept[0] + offset, kept[1] + offset}));
    ed()->undoStack()->undo();

    // Double-clicking a point removes it; undo brings it back.
    const QPointF first = editor::GraphEditor::reroutePoints(doc()->connections().first())[0];
    QTest::mouseDClick(vp(), Qt::LeftButton, {}, testing::viewPoint(view(), first));
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().first()).size(), 1);
    ed()->undoStack()->undo();
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().first()).size(), 2);
    // Deleting the wire and undoing brings the points back with it.
    ed()->disconnect(c);
    ed()->undoStack()->undo();
    QCOMPARE(w_->scene()->wireItem(c)->points().size(), 2);
  }

  void cuttingRemovesTheCrossedWires() {
    const QString dev = add("Device", {0, 0});
    const QString t1 = add("Tensor", {300, 0}), t2 = add("Tensor", {300, 700});
    const QString mm = add("MatMul", {900, 0});
    QVERIFY(ed()->connect({dev, "device"}, {t1, "device"}));
    QVERIFY(ed()->connect({dev, "device"}, {t2, "device"}));
    QVERIFY(ed()->connect({t1, "out"}, {mm, "a"}));
    QVERIFY(ed()->connect({t2, "out"}, {mm, "b"}));
    view()->setZoom(0.5);
    view()->centerOn(550, 350);
    QTest::qWait(10);
    // A short vertical cut between t1's output and mm's input, at the height of that wire: t1 → mm.a lies
    // level there (both ports at the top of their nodes); t2's wire crosses that x far lower down.
    const QPointF out1 = w_->scene()->nodeItem(t1)->portScenePos(true, 0);
    const QPointF inA = w_->scene()->nodeItem(mm)->portScenePos(false, 0);
    const qreal x = (out1.x() + inA.x()) / 2;
    const QPointF wire2At = editor::WireItem::bezier(w_->scene()->nodeItem(t2)->portScenePos(true, 0),
                                                     w_->scene()->nodeItem(mm)->portScenePos(false, 1))
                                .pointAtPercent(0.5);
    QVERIFY(wire2At.y() > out1.y() + 150);
    const QPoint p0 = testing::viewPoint(view(), {x, out1.y() - 40}),
                 p1 = testing::viewPoint(view(), {x, out1.y() + 40});
    const int steps = ed()->undoStack()->count();
    testing::sendMouse(vp(), QEvent::MouseButtonPress, p0, Qt::RightButton, Qt::RightButton,
                       Qt::ControlModifier);
    for (int i = 1; i <= 4; ++i)
      testing::sendMouse(vp(), QEvent::MouseMove, p0 + (p1 - p0) * i / 4, Qt::NoButton, Qt::RightButton,
                         Qt::ControlModifier);
    testing::sendMouse(vp(), QEvent::MouseButtonRelease, p1, Qt::RightButton, Qt::NoButton,
                       Qt::ControlModifier);
    QVERIFY(!connected(t1 + ".out", mm + ".a"));
    QVERIFY(connected(t2 + ".out", mm + ".b"));
    QCOMPARE(doc()->connections().size(), 3);
    QCOMPARE(ed()->undoStack()->count(), steps + 1);
    ed()->undoStack()->undo();
    QCOMPARE(doc()->connections().size(), 4);

    // A long cut across both Device wires (left of the Tensors) and nothing else: exactly those two, one
    // step.
    const qreal xd = (w_->scene()->nodeItem(dev)->portScenePos(true, 0).x() + 300) / 2;
    QCOMPARE(w_->scene()->wiresCrossing(QLineF(xd, -100, xd, 900)),
             (QList<core::GraphConnection>{{{dev, "device"}, {t1, "device"}, {}},
                                           {{dev, "device"}, {t2, "device"}, {}}}));
    const QPoint q0 = testing::viewPoint(view(), {xd, -100}), q1 = testing::viewPoint(view(), {xd, 900});
    testing::sendMouse(vp(), QEvent::MouseButtonPress, q0, Qt::RightButton, Qt::RightButton,
                       Qt::ControlModifier);
    testing::sendMouse(vp(), QEvent::MouseMove, q1, Qt::NoButton, Qt::RightButton, Qt::ControlModifier);
    testing::sendMouse(vp(), QEvent::MouseButtonRelease, q1, Qt::RightButton, Qt::NoButton,
                       Qt::ControlModifier);
    QCOMPARE(doc()->connections().size(), 2);
    QVERIFY(connected(t1 + ".out", mm + ".a") && connected(t2 + ".out", mm + ".b"));
    QCOMPARE(ed()->undoStack()->undoText(), QString("Cut 2 wires"));
    ed()->undoStack()->undo();
    QCOMPARE(doc()->connections().size(), 4);
    // A cut that crosses nothing changes nothing.
    const int before = ed()->undoStack()->count();
    testing::sendMouse(vp(), QEvent::MouseButtonPress, QPoint(5, 5), Qt::RightButton, Qt::RightButton,
                       Qt::ControlModifier);
    testing::sendMouse(vp(), QEvent::MouseButtonRelease, QPoint(6, 30), Qt::RightButton, Qt::NoButton,
                       Qt::ControlModifier);
    QCOMPARE(ed()->undoStack()->count(), before);
  }

  void collapseToTitleBar() {
    const QString t = add("Tensor", {0, 0}), mm = add("MatMul", {400, 0});
    QVERIFY(ed()->connect({t, "out"}, {mm, "b"}));
    QTest::qWait(10);
    editor::NodeItem* item = w_->scene()->nodeItem(mm);
    const qreal fullHeight = item->sceneBodyRect().height();
    QVERIFY(fullHeight > 60);
    w_->scene()->selectNodes({mm});
    view()->setFocus();
    const int steps = ed()->undoStack()->count();
    QTest::keyClick(vp(), Qt::Key_H);
    QVERIFY(ed()->isCollapsed(mm));
    QVERIFY(item->collapsed());
    QCOMPARE(item->sceneBodyRect().height(), 26.0);  // the title bar alone
    // The wire meets the bar's left end, halfway down.
    QCOMPARE(item->portScenePos(false, 1), QPointF(400, 13));
    QCOMPARE(ed()->undoStack()->count(), steps + 1);
    // Saved in the file's view state, and collapsed again when loaded.
    const QByteArray bytes = core::serializer::save(*doc());
    core::GraphDocument loaded;
    QVERIFY(core::serializer::load(bytes, loaded, nullptr));
    QCOMPARE(loaded.view().value("collapsed").toArray(), QJsonArray{mm});
    ed()->undoStack()->undo();
    QVERIFY(!item->collapsed());
    QCOMPARE(item->sceneBodyRect().height(), fullHeight);
    doc()->replaceAll(loaded);
    QVERIFY(w_->scene()->nodeItem(mm)->collapsed());
    QVERIFY(!w_->scene()->nodeItem(t)->collapsed());
    // Saving from the window keeps the list next to the zoom and centre.
    const QString path = env_.dir.filePath("collapsed.json");
    QVERIFY(w_->saveFile(path));
    core::GraphDocument saved;
    QVERIFY(core::serializer::loadFile(path, saved, nullptr));
    QCOMPARE(saved.view().value("collapsed").toArray(), QJsonArray{mm});
    QVERIFY(saved.view().contains("zoom"));

    // The title bar's toggle expands it again, as one undo step.
    item = w_->scene()->nodeItem(mm);
    const QPoint toggle = testing::viewPoint(view(), item->mapToScene(item->collapseToggleRect().center()));
    QTest::mouseClick(vp(), Qt::LeftButton, {}, toggle);
    QVERIFY(!ed()->isCollapsed(mm));
    QTest::qWait(QApplication::doubleClickInterval() + 50);  // two clicks, not a double-click
    QTest::mouseClick(vp(), Qt::LeftButton, {}, toggle);
    QVERIFY(ed()->isCollapsed(mm));
    QCOMPARE(doc()->node(mm)->position, QPointF(400, 0));  // a click on the toggle does not move it
    // Deleting a collapsed node takes it off the list (a later node with its id starts expanded); undo puts
    // both back.
    ed()->remove({mm});
    QVERIFY(!doc()->view().contains("collapsed"));
    ed()->undoStack()->undo();
    QVERIFY(w_->scene()->nodeItem(mm)->collapsed());
  }

  void commentFrameColourAndContents() {
    const QString a = add("Tensor", {0, 0}), b = add("MatMul", {300, 100});
    QVERIFY(ed()->connect({a, "out"}, {b, "a"}));
    const QString outside = add("Device", {1200, 0});
    const QString id = ed()->addComment(QRectF(-40, -70, 600, 400), "Block");
    QCOMPARE(ed()->comments().first().color, editor::GraphEditor::commentColors().first().second);
    const QColor green = editor::GraphEditor::commentColors()[1].second;
    ed()->setCommentColor(id, green);
    QCOMPARE(ed()->comments().first().color, green);
    QCOMPARE(ed()->undoStack()->undoText(), QString("Colour comment frame"));
    // Saved and loaded.
    core::GraphDocument loaded;
    QVERIFY(core::serializer::load(core::serializer::save(*doc()), loaded, nullptr));
    QCOMPARE(loaded.extra().value("comments").toArray().first().toObject().value("color").toString(),
             green.name());
    ed()->undoStack()->undo();
    QCOMPARE(ed()->comments().first().color, editor::GraphEditor::commentColors().first().second);
    ed()->undoStack()->redo();
    // Dragging the frame carries the nodes inside it and the bends of the wire between them; the node
    // outside stays.
    const core::GraphConnection c{{a, "out"}, {b, "a"}, {}};
    ed()->setReroutePoints(c, {QPointF(250, 60)}, "Add reroute point");
    w_->scene()->clearSelection();
    QTest::qWait(10);
    const QPoint title = testing::viewPoint(view(), QPointF(200, -60));
    testing::drag(vp(), title, title + QPoint(30, 20));
    QTRY_COMPARE(ed()->comments().first().rect.topLeft(), QPointF(-10, -50));
    QCOMPARE(ed()->comments().first().color, green);
    QCOMPARE(doc()->node(a)->position, QPointF(30, 20));
    QCOMPARE(doc()->node(b)->position, QPointF(330, 120));
    QCOMPARE(doc()->node(outside)->position, QPointF(1200, 0));
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().first()),
             QList<QPointF>{QPointF(280, 80)});
    ed()->undoStack()->undo();
    QCOMPARE(doc()->node(a)->position, QPointF(0, 0));
    QCOMPARE(editor::GraphEditor::reroutePoints(doc()->connections().first()),
             QList<QPointF>{QPointF(250, 60)});
    QCOMPARE(ed()->comments().first().rect.topLeft(), QPointF(-40, -70));
  }

  void logClickSelectsNode() {
    const QString mm = add("MatMul", {800, 600});
    w_->scene()->clearSelection();
    w_->logMessage(MainWindow::LogLevel::Error, "something failed", mm);
    QListWidget* log = w_->log();
    QListWidgetItem* item = log->item(log->count() - 1);
    log->scrollToItem(item);
    QTest::mouseClick(log->viewport(), Qt::LeftButton, {}, log->visualItemRect(item).center());
    QCOMPARE(w_->scene()->selectedNodeIds(), QStringList{mm});
    QVERIFY(view()
                ->mapToScene(vp()->rect())
                .boundingRect()
                .contains(w_->scene()->nodeItem(mm)->sceneBoundingRect().center()));
  }

  void timelineLanesZoomAndHover() {
    editor::TimelineView* tl = w_->timeline();
    tl->resize(800, 200);
    QList<core::TraceSpan> spans;
    spans << core::TraceSpan{"mm1", "matmul", "cpu", "compute", 0, 1000, 4096, 2e6, false}
          << core::TraceSpan{"mm2", "matmul", "cpu:1", "compute", 100, 900, 0, 0, false}
          << core::TraceSpan{"c1", "copy", "cpu", "copy", 200, 300, 1 << 20, 0, false}
          << core::TraceSpan{"done", "synchronize", "cpu", "compute", 0, 1000, 0, 0, true};
    tl->addSpans(spans);
    QCOMPARE(tl->laneNames(), (QStringList{"cpu · compute", "cpu · copy", "cpu:1 · compute"}));
    // Overlapping spans in one lane stack instead of hiding each other.
    QVERIFY(tl->spanAt(tl->spanCenter(0)) == 0);
    QVERIFY(tl->spanAt(tl->spanCenter(3)) == 3);
    QVERIFY(tl->describe(2).contains("1.0 MiB"));
    QVERIFY(tl->describe(1).contains("cpu:1"));
    // Wheel zooms in at the cursor; a drag pans; a double-click fits again.
    const double span0 = tl->viewEndUs() - tl->viewStartUs();
    QWheelEvent wheel(QPointF(400, 60), QPointF(tl->mapToGlobal(QPoint(400, 60))), {}, QPoint(0, 480),
                      Qt::NoButton, Qt::NoModifier, Qt::NoScrollPhase, false);
    QApplication::sendEvent(tl, &wheel);
    QVERIFY(tl->viewEndUs() - tl->viewStartUs() < span0 / 1.5);
    const double start = tl->viewStartUs();
    testing::drag(tl, QPoint(500, 60), QPoint(300, 60));
    QVERIFY(tl->viewStartUs() > start);
    QTest::mouseDClick(tl, Qt::LeftButton, {}, QPoint(400, 60));
    QCOMPARE(tl->viewStartUs(), 0.0);
  }

  void timelineAndMemoryPlotKeepTheNewest() {
    // A run of millions of ops: the editor keeps the newest kKeptRunItems spans and memory samples.
    editor::TimelineView tl;
    tl.resize(800, 200);
    const qsizetype keep = editor::kKeptRunItems, total = keep + keep / 4 + 10000;
    const qsizetype firstKept = total - keep;
    for (qsizetype start = 0; start < total; start += 10000) {
      QList<core::TraceSpan> batch;
      for (qsizetype i = start; i < start + 10000; ++i) {
        core::TraceSpan span{QString("s%1").arg(i),
                             "add",
                             i % 2 ? "cpu:1" : "cpu",
                             "compute",
                             double(i),
                             i + 0.5,
                             0,
                             0,
                             false};
        // The oldest span to be kept is long and alone at the end of its lane: findable once the indices
        // into the kept spans have shifted.
        if (i == firstKept) span.startUs = 1e9, span.endUs = 2e9;
        batch << span;
      }
      tl.addSpans(batch);
    }
    QCOMPARE(tl.spanCount(), int(keep));
    QCOMPARE(tl.droppedSpans(), firstKept);
    QCOMPARE(tl.spans().first().node, QString("s%1").arg(firstKept));
    QCOMPARE(tl.spans().last().node, QString("s%1").arg(total - 1));
    tl.fit();
    QCOMPARE(tl.spanAt(tl.spanCenter(0)), 0);
    QVERIFY(tl.describe(0).contains(QString("s%1").arg(firstKept)));
    QVERIFY(!tl.grab().isNull());  // paints, with the note on what was not kept

    editor::PlotsPanel* plots = w_->plots();
    QList<core::MemorySampleEvent> samples;
    for (qsizetype i = 0; i < total; ++i) samples << core::MemorySampleEvent{"cpu", double(i), i, i};
    plots->addMemory(samples);
    QCOMPARE(plots->memoryPoints(), int(keep));
  }

  void settingsAreUndoableEdits() {
    auto* combo = w_->findChild<QComboBox*>("scheduleCombo");
    auto* spin = w_->findChild<QSpinBox*>("cpuDevicesSpin");
    QVERIFY(combo && spin);
    combo->setFocus();
    QTest::keyClick(combo, Qt::Key_Down);
    QCOMPARE(doc()->settings().value("schedule").toString(), QString("sequential"));
    spin->setValue(3);
    QCOMPARE(doc()->settings().value("cpu_devices").toInt(), 3);
    QVERIFY(w_->isDirty());
    ed()->undoStack()->undo();
    ed()->undoStack()->undo();
    QCOMPARE(doc()->settings().value("schedule").toString(), QString("parallel"));
    QCOMPARE(spin->value(), 2);
    QCOMPARE(combo->currentText(), QString("parallel"));
  }
};

QTEST_MAIN(TestCanvas)
#include "test_canvas.moc"
