// The editor's run cache, Run all and Run to here on the real GPU node set (CPU devices), with the MLP
// example cut small; and bypass and mute on the canvas (Ctrl+B, Ctrl+M: one undo step each, drawn).
#include <QAction>
#include <QFileInfo>
#include <QLabel>
#include <QSet>
#include <QtTest>

#include "canvas/graph_view.h"
#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "main_window.h"
#include "plots.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;
using editor::RunStatus;

class TestEditorCache : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  // The MLP example, small: a few hundred samples, one epoch.
  void loadSmallMlp() {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    core::GraphDocument* doc = w_->document();
    if (!QFileInfo::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      doc->setParam("data", "name", "synthetic");
    doc->setParam("data", "limit", 512);
    doc->setParam("data", "batch_size", 64);
    doc->setParam("train", "epochs", 1);
    doc->setParam("train", "log_every", 2);
  }

  // Runs with `start` and returns the nodes that started (ran) and the ones reused.
  QPair<QSet<QString>, QSet<QString>> run(const std::function<bool()>& start) {
    QSet<QString> started, cached;
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [&](const QList<core::RunEvent>& events) {
          for (const core::RunEvent& e : events) {
            if (e.kind == core::RunEvent::Kind::NodeStarted) started.insert(e.node);
            if (e.kind == core::RunEvent::Kind::NodeCached) cached.insert(e.node);
          }
        });
    const bool ok = start();
    if (ok && !QTest::qWaitFor([this] { return !w_->runner()->isRunning(); }, 300000))
      qWarning("the run did not end");
    disconnect(c);
    if (!ok) qWarning("not started: %s", qPrintable(w_->lastMessage()));
    return {started, cached};
  }

  QJsonObject reportNode(const QString& id) const {
    return w_->runner()->report()["nodes"].toObject()[id].toObject();
  }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
  }

  void init() {
    w_ = testing::discardingWindow(&registry_);
  }
  void cleanup() {
    w_.reset();
  }

  void changingEvaluatesSplitRerunsOnlyEvaluate() {
    loadSmallMlp();
    const auto first = run([this] { return w_->runGraph(); });
    QCOMPARE(w_->runStateText(), QString("Done"));
    QCOMPARE(first.first, (QSet<QString>{"dev", "data", "net", "train", "test", "untrained"}));
    const double trainAcc = reportNode("train")["loss"].toDouble(-1);
    const double firstWallMs = w_->runner()->report()["wall_ms"].toDouble();
    const int lossPoints = w_->runner()->report()["metrics"].toObject()["train.loss"].toArray().size();
    QVERIFY(lossPoints > 0);
    QVERIFY(w_->runner()->cache().size() >= 6);
    QVERIFY(w_->findChild<QLabel*>("runCache")->text().startsWith("cache "));

    w_->document()->setParam("test", "split", "train");
    const auto second = run([this] { return w_->runGraph(); });
    QCOMPARE(w_->runStateText(), QString("Done"));
    qInfo("first Run %.0f ms; after changing only test.split, Run %.0f ms", firstWallMs,
          w_->runner()->report()["wall_ms"].toDouble());
    QCOMPARE(second.first, (QSet<QString>{"test"}));
    QCOMPARE(second.second, (QSet<QString>{"dev", "data", "net", "train", "untrained"}));
    // The reused Train gives what a run gives: its report fields and its curves, but no span on the timeline.
    QVERIFY(reportNode("train")["cached"].toBool());
    QCOMPARE(reportNode("train")["loss"].toDouble(-1), trainAcc);
    QCOMPARE(w_->runner()->report()["metrics"].toObject()["train.loss"].toArray().size(), lossPoints);
    QVERIFY(w_->plots()->metricGraph("train.loss"));
    for (const core::TraceSpan& s : w_->runner()->spans()) QVERIFY2(s.node == "test", qPrintable(s.node));
    QCOMPARE(reportNode("test")["split"].toString(), QString("train"));
    QVERIFY(!reportNode("test")["cached"].toBool());
    // Drawn: the reused nodes carry a "cached" badge, the one that ran does not.
    QVERIFY(w_->scene()->nodeItem("train")->cached());
    QCOMPARE(w_->scene()->nodeItem("train")->runStatus(), RunStatus::Done);
    QVERIFY(!w_->scene()->nodeItem("test")->cached());

    // Run all ignores the cache.
    const auto all = run([this] { return w_->runAll(); });
    QCOMPARE(all.first, (QSet<QString>{"dev", "data", "net", "train", "test", "untrained"}));
    QVERIFY(all.second.isEmpty());
    QVERIFY(!w_->scene()->nodeItem("train")->cached());
  }

  void runToHereRunsOnlyTheSelectionAndItsAncestors() {
    loadSmallMlp();
    const auto o = run([this] { return w_->runToHere({"untrained"}); });
    QCOMPARE(w_->runStateText(), QString("Done"));
    QCOMPARE(o.first, (QSet<QString>{"dev", "data", "net", "untrained"}));
    const QJsonObject nodes = w_->runner()->report()["nodes"].toObject();
    QVERIFY(!nodes.contains("train") && !nodes.contains("test"));
    // From the context menu's path: the selection.
    w_->scene()->selectNodes({"net"});
    const auto again = run([this] { return w_->runToHere(w_->scene()->selectedNodeIds()); });
    QCOMPARE(again.second, (QSet<QString>{"dev", "net"}));
    QVERIFY(again.first.isEmpty());
  }

  void bypassAndMuteToggleOnTheSelectionAsOneUndoStep() {
    loadSmallMlp();
    core::GraphDocument* doc = w_->document();
    editor::GraphView* view = w_->view();
    QUndoStack* undo = w_->editor()->undoStack();
    w_->scene()->selectNodes({"test", "untrained"});
    const int steps = undo->count();
    // The shortcuts as bound; the offscreen platform has no active window to deliver key presses to.
    QCOMPARE(view->bypassAction()->shortcut(), QKeySequence(Qt::CTRL | Qt::Key_B));
    QCOMPARE(view->muteAction()->shortcut(), QKeySequence(Qt::CTRL | Qt::Key_M));
    view->bypassAction()->trigger();
    QCOMPARE(undo->count(), steps + 1);
    QVERIFY(doc->node("test")->bypassed && doc->node("untrained")->bypassed);
    QVERIFY(w_->scene()->nodeItem("test")->bypassed());
    QVERIFY(w_->scene()->nodeItem("test")->opacity() < 1.0);
    view->bypassAction()->trigger();  // all bypassed: takes it off
    QVERIFY(!doc->node("test")->bypassed && !doc->node("untrained")->bypassed);
    undo->undo();
    QVERIFY(doc->node("test")->bypassed);
    undo->undo();
    QVERIFY(!doc->node("test")->bypassed && !doc->node("untrained")->bypassed);

    w_->scene()->selectNodes({"train"});
    view->muteAction()->trigger();
    QVERIFY(doc->node("train")->muted);
    QVERIFY(w_->scene()->nodeItem("train")->muted());
    QVERIFY(w_->scene()->nodeItem("train")->opacity() < w_->scene()->nodeItem("data")->opacity());
    // The run leaves out the muted Train and the Evaluate that needs it.
    const auto o = run([this] { return w_->runGraph(); });
    QCOMPARE(w_->runStateText(), QString("Done"));
    QCOMPARE(o.first, (QSet<QString>{"dev", "data", "net", "untrained"}));
    QCOMPARE(reportNode("train")["status"].toString(), QString("muted"));
    QCOMPARE(reportNode("test")["error"].toString(), QString("skipped: input model (train.model) is muted"));
    undo->undo();
    QVERIFY(!doc->node("train")->muted);
  }
};

QTEST_MAIN(TestEditorCache)
#include "test_editor_cache.moc"
