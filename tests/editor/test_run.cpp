// Runs through the editor with the real GPU node set on CPU devices: statuses, plots, timeline, a refused
// second run, Cancel, exports, and the device-mismatch fix.
#include <QAction>
#include <QElapsedTimer>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QUndoStack>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "main_window.h"
#include "plots.h"
#include "run_controller.h"
#include "subgraph_navigator.h"
#include "timeline.h"

using namespace gn;
using editor::MainWindow;
using editor::RunStatus;

class TestRun : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  // The example at a size a CPU runs in moments.
  void openShrunk(const QString& example, int n, int repeat) {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/" + example));
    for (const core::GraphNode& node : w_->document()->nodes()) {
      if (node.params.contains("shape")) w_->document()->setParam(node.id, "shape", QJsonArray{n, n});
      if (node.params.contains("repeat")) w_->document()->setParam(node.id, "repeat", repeat);
    }
    w_->document()->setSettings(QJsonObject{{"schedule", "parallel"}, {"cpu_devices", 2}});
  }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
    if (!QFile::exists(QString(GN_EXAMPLES_DIR) + "/two-device-parallel.json"))
      QSKIP("no two-device-parallel example");
  }

  void init() {
    w_ = testing::discardingWindow(&registry_);
  }
  void cleanup() {
    w_.reset();
  }

  void runUpdatesStatusesPlotsAndTimeline() {
    openShrunk("two-device-parallel.json", 96, 3);
    QSet<QString> started, finished;  // from the batches the UI was handed
    int batches = 0;
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [&](const QList<core::RunEvent>& events) {
          ++batches;
          for (const core::RunEvent& e : events) {
            if (e.kind == core::RunEvent::Kind::NodeStarted) started.insert(e.node);
            if (e.kind == core::RunEvent::Kind::NodeFinished) finished.insert(e.node);
          }
        });
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    // A second Run while one is going is refused with a message (not queued).
    QVERIFY(!w_->runGraph());
    QVERIFY(w_->lastMessage().contains("already going"));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 60000);
    QCOMPARE(w_->runStateText(), QString("Done"));
    for (const core::GraphNode& n : w_->document()->nodes()) {
      editor::NodeItem* item = w_->scene()->nodeItem(n.id);
      QVERIFY2(item->runStatus() == RunStatus::Done,
               qPrintable(n.id + " " + editor::runStatusName(item->runStatus())));
    }
    disconnect(c);
    QVERIFY(batches >= 1);
    QCOMPARE(started.size(), int(w_->document()->nodes().size()));
    QCOMPARE(finished, started);
    QVERIFY(w_->plots()->timingBars() >= 5);
    QVERIFY(w_->plots()->memoryPoints() > 0);
    QVERIFY(w_->timeline()->spanCount() > 0);
    QVERIFY2(w_->timeline()->laneNames().size() >= 2, qPrintable(w_->timeline()->laneNames().join(", ")));
    const int span = w_->timeline()->spanAt(w_->timeline()->spanCenter(0));
    QVERIFY(span >= 0);
    QVERIFY(w_->timeline()->describe(span).contains(w_->timeline()->spans()[span].node));
    QVERIFY(w_->findChild<QLabel*>("devicesInUse")->text().contains("cpu"));

    // A second run joins the timing history, for side-by-side comparison.
    w_->document()->setSettings(QJsonObject{{"schedule", "sequential"}, {"cpu_devices", 2}});
    QVERIFY(w_->runGraph());
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 60000);
    QCOMPARE(w_->plots()->runCount(), 2);

    // Exports.
    QTemporaryDir dir;
    QVERIFY(w_->exportTrace(dir.filePath("t.json")));
    QFile trace(dir.filePath("t.json"));
    QVERIFY(trace.open(QIODevice::ReadOnly));
    const QJsonDocument tj = QJsonDocument::fromJson(trace.readAll());
    QVERIFY(tj.isObject() ? !tj.object().value("traceEvents").toArray().isEmpty() : !tj.array().isEmpty());
    QVERIFY(w_->exportReport(dir.filePath("r.json")));
    QFile report(dir.filePath("r.json"));
    QVERIFY(report.open(QIODevice::ReadOnly));
    QVERIFY(QJsonDocument::fromJson(report.readAll()).object().value("nodes").toObject().contains("mm1"));
    QVERIFY(w_->exportMetricsCsv(dir.filePath("m.csv")));
    QFile csv(dir.filePath("m.csv"));
    QVERIFY(csv.open(QIODevice::ReadOnly));
    QCOMPARE(csv.readLine().trimmed(), QByteArray("series,t,value"));
    QVERIFY(w_->exportPlot(dir.filePath("p.png")));
    QVERIFY(QFileInfo(dir.filePath("p.png")).size() > 1000);
    // A path ending in .svg gets SVG; the File ▸ Export menu offers both.
    QVERIFY(w_->exportPlot(dir.filePath("p.svg")));
    QFile svg(dir.filePath("p.svg"));
    QVERIFY(svg.open(QIODevice::ReadOnly));
    QVERIFY(svg.readAll().contains("<svg"));
    QStringList exportActions;
    for (QAction* a : w_->findChildren<QAction*>()) exportActions << a->text();
    QVERIFY(exportActions.contains("Visible plot as PNG…") && exportActions.contains("Visible plot as SVG…"));
  }

  void aRunShowsOnSubgraphsAndInside() {
    openShrunk("two-device-parallel.json", 96, 3);
    w_->scene()->selectNodes({"x1", "mm1"});
    QCOMPARE(w_->groupSelection(), QString("block1"));
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 60000);
    QCOMPARE(w_->runStateText(), QString("Done"));
    // The block's time is its nodes' times in the report, summed.
    const QJsonObject nodes = w_->runner()->report().value("nodes").toObject();
    const double inner = nodes.value("block1/x1").toObject().value("wall_ms").toDouble() +
                         nodes.value("block1/mm1").toObject().value("wall_ms").toDouble();
    editor::NodeItem* block = w_->scene()->nodeItem("block1");
    QCOMPARE(block->runStatus(), RunStatus::Done);
    QVERIFY(inner > 0);
    QCOMPARE(block->runTimeMs(), inner);
    QVERIFY(w_->navigator()->enter("block1"));
    for (const QString id : {"x1", "mm1"}) {
      editor::NodeItem* item = w_->navigator()->currentScene()->nodeItem(id);
      QCOMPARE(item->runStatus(), RunStatus::Done);
      QCOMPARE(item->runTimeMs(), nodes.value("block1/" + id).toObject().value("wall_ms").toDouble());
    }
  }

  void cancelStopsALongRun() {
    openShrunk("two-device-parallel.json", 1200, 100000);
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTest::qWait(400);
    QVERIFY(w_->runner()->isRunning());
    // Mid-run, the canvas shows which nodes work and which wait, and the status bar says it runs.
    QTRY_VERIFY(w_->scene()->nodeItem("mm1")->runStatus() == RunStatus::Running ||
                w_->scene()->nodeItem("mm2")->runStatus() == RunStatus::Running);
    QCOMPARE(w_->runStateText(), QString("Running…"));
    QElapsedTimer t;
    t.start();
    w_->cancelRun();
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 5000);
    qInfo("cancel took %lld ms", t.elapsed());
    QVERIFY2(t.elapsed() < 1500, "Cancel must take effect within a second (plus one UI tick)");
    QCOMPARE(w_->runStateText(), QString("Cancelled"));
    bool cancelledShown = false;
    for (const core::GraphNode& n : w_->document()->nodes())
      cancelledShown = cancelledShown || w_->scene()->nodeItem(n.id)->runStatus() == RunStatus::Cancelled;
    QVERIFY(cancelledShown);
  }

  void deviceMismatchCanBeFixedWithACopy() {
    // x on device 0 and y on device 1 go into one Elementwise add: the same-device rule fails it.
    editor::GraphEditor* ed = w_->editor();
    w_->document()->setSettings(QJsonObject{{"schedule", "parallel"}, {"cpu_devices", 2}});
    const QString d0 = ed->addNode("Device", {0, 0}), d1 = ed->addNode("Device", {0, 250});
    ed->setParam(d0, "kind", "cpu");
    ed->setParam(d1, "kind", "cpu");
    ed->setParam(d1, "index", 1);
    const QString x = ed->addNode("Tensor", {250, 0}), y = ed->addNode("Tensor", {250, 250});
    ed->setParam(x, "shape", QJsonArray{8, 8});
    ed->setParam(y, "shape", QJsonArray{8, 8});
    const QString add = ed->addNode("Elementwise", {550, 100});
    QVERIFY(ed->connect({d0, "device"}, {x, "device"}));
    QVERIFY(ed->connect({d1, "device"}, {y, "device"}));
    QVERIFY(ed->connect({x, "out"}, {add, "a"}));
    QVERIFY(ed->connect({y, "out"}, {add, "b"}));
    // Caught by validation or by the run: either way the node carries the error.
    if (w_->runGraph()) QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 30000);
    editor::NodeItem* item = w_->scene()->nodeItem(add);
    std::optional<core::IssueFix> fix;
    for (const QString& e : item->errors())
      if (!fix) fix = ed->fixFor(add, e);
    QVERIFY2(fix, qPrintable(item->errors().join(" | ")));
    QString why;
    QVERIFY2(ed->applyFix(*fix, &why), qPrintable(why));
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 30000);
    QCOMPARE(w_->runStateText(), QString("Done"));
    QCOMPARE(item->runStatus(), RunStatus::Done);
  }
};

QTEST_MAIN(TestRun)
#include "test_run.moc"
