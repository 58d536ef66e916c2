// Run ▸ Run on processes: the editor runs a shrunk mlp-fashion-mnist (synthetic data) as a 2-rank Open MPI
// job on loopback and draws rank 0's event stream like a local run's (node states, timing bars labelled "2
// ranks", training curves, timeline, log), then reads rank 0's report (the Confusion tab); Cancel stops every
// rank within seconds, and so does closing the window; a lost rank fails the run, naming it; a malformed
// line of the stream and a job that dies before its RunFinished reach the log (and the status bar) without
// harm; the dialog says when mpirun is missing and remembers choices.
#include <qcustomplot.h>
#include <signal.h>

#include <QDialogButtonBox>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QJsonArray>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QStatusBar>

#include "cli/cli_test_util.h"
#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "plots.h"
#include "process_dialog.h"
#include "process_run.h"
#include "run_controller.h"
#include "time_scale.h"
#include "timeline.h"

using namespace gn;
using editor::MainWindow;
using editor::ProcessRun;
using editor::ProcessRunOptions;
using editor::RunStatus;

namespace {

QStringList loopbackArgs() {
  return gn::clitest::mpirunLoopbackOptions();
}

ProcessRunOptions twoRanks() {
  ProcessRunOptions o;
  o.processes = 2;
  o.extraArgs = loopbackArgs();
#ifdef GN_MPIRUN
  o.mpirun = GN_MPIRUN;
#endif
#ifdef GN_GPUNODES
  o.program = GN_GPUNODES;  // this test's binary is not gpunodes
#endif
  return o;
}

// The pids of live processes that are ranks of an Open MPI job (OMPI_COMM_WORLD_RANK in their environment)
// and whose command line holds `marker`, by rank.
QMap<int, qint64> ranksOf(const QString& marker) {
  QMap<int, qint64> out;
  for (const QString& pid : QDir("/proc").entryList(QDir::Dirs | QDir::NoDotAndDotDot)) {
    bool isPid = false;
    pid.toLongLong(&isPid);
    if (!isPid) continue;
    QFile cmd("/proc/" + pid + "/cmdline"), env("/proc/" + pid + "/environ"), stat("/proc/" + pid + "/stat");
    if (!cmd.open(QIODevice::ReadOnly) || !env.open(QIODevice::ReadOnly)) continue;
    if (!cmd.readAll().contains(marker.toUtf8())) continue;
    // A zombie has exited; only its parent has not reaped it yet.
    if (stat.open(QIODevice::ReadOnly)) {
      const QByteArray s = stat.readAll();
      if (s.mid(s.lastIndexOf(')') + 2, 1) == "Z") continue;
    }
    for (const QByteArray& kv : env.readAll().split('\0'))
      if (kv.startsWith("OMPI_COMM_WORLD_RANK=")) out.insert(kv.mid(21).toInt(), pid.toLongLong());
  }
  return out;
}

QStringList logLines(MainWindow* w, const QString& tag = {}) {
  QStringList out;
  for (int i = 0; i < w->log()->count(); ++i) {
    QListWidgetItem* item = w->log()->item(i);
    if (tag.isEmpty() || item->data(Qt::UserRole + 2).toString() == tag) out << item->text();
  }
  return out;
}

}  // namespace

class TestProcessRun : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  // mlp-fashion-mnist on a small synthetic set: seconds on two cores.
  void openTraining(int epochs) {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    core::GraphDocument* doc = w_->document();
    doc->setParam("data", "name", "synthetic");
    doc->setParam("data", "limit", 2000);
    doc->setParam("data", "batch_size", 64);
    doc->setParam("train", "epochs", epochs);
    doc->setParam("train", "log_every", 5);
  }

  // Runs training "on one process" whose rank is a shell script printing `lines` (a stand-in for rank 0's
  // stream), and waits for the run to end.
  void runFakeRank(const QByteArray& lines) {
    QTemporaryDir dir;
    const QString script = dir.filePath("fake-rank.sh");
    QFile f(script);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("#!/bin/sh\n" + lines);
    f.close();
    QVERIFY(f.setPermissions(f.permissions() | QFileDevice::ExeOwner));
    openTraining(1);
    ProcessRunOptions o = twoRanks();
    o.processes = 1;
    o.program = script;
    QVERIFY2(w_->runOnProcesses(o), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 60000 * kTimeScale);
  }

 private slots:
  void initTestCase() {
#if !defined(GN_NODES_PLUGIN) || !defined(GN_MPIRUN) || !defined(GN_GPUNODES)
    QSKIP("needs the gpunodes_nodes plugin, the gpunodes binary and mpirun");
#else
    const QString failed = testing::loadPlugin(registry_, GN_NODES_PLUGIN);
    QVERIFY2(failed.isEmpty(), qPrintable(failed));
#endif
  }

  void init() {
    w_ = testing::discardingWindow(&registry_);
  }
  void cleanup() {
    w_.reset();
  }

  void twoRanksStreamIntoThePlotsTimelineAndLog() {
    openTraining(1);
    QSet<QString> started, finished;
    int batches = 0, metrics = 0, spans = 0;
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [&](const QList<core::RunEvent>& events) {
          ++batches;
          for (const core::RunEvent& e : events) {
            if (e.kind == core::RunEvent::Kind::NodeStarted) started.insert(e.node);
            if (e.kind == core::RunEvent::Kind::NodeFinished) finished.insert(e.node);
            metrics += e.kind == core::RunEvent::Kind::Metric;
            spans += e.kind == core::RunEvent::Kind::Span;
          }
        });
    QVERIFY2(w_->runOnProcesses(twoRanks()), qPrintable(w_->lastMessage()));
    QVERIFY(w_->runner()->isRunning());
    QCOMPARE(w_->runner()->worldSize(), 2);
    // A second start while the job runs is refused, as for a local run.
    QVERIFY(!w_->runGraph());
    QVERIFY(w_->lastMessage().contains("already going"));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 180000 * kTimeScale);
    disconnect(c);
    QVERIFY2(w_->runStateText() == "Done", qPrintable(logLines(w_.get()).join('\n')));

    // The events came through the same path as a local run's.
    QVERIFY(batches >= 1);
    const int nodes = int(w_->document()->nodes().size());
    QCOMPARE(started.size(), nodes);
    QCOMPARE(finished, started);
    for (const core::GraphNode& n : w_->document()->nodes())
      QVERIFY2(w_->scene()->nodeItem(n.id)->runStatus() == RunStatus::Done, qPrintable(n.id));
    QVERIFY(metrics > 0);
    QVERIFY(spans > 0);
    QVERIFY(w_->plots()->timingBars() >= nodes - 1);
    QVERIFY(w_->plots()->metricPoints() > 0);
    QVERIFY(w_->timeline()->spanCount() > 0);

    // The run history says where it ran.
    QCustomPlot* timing = w_->plots()->timingPlot();
    QString label;
    for (int i = 0; i < timing->plottableCount(); ++i) label = timing->plottable(i)->name();
    QVERIFY2(label.contains("2 ranks"), qPrintable(label));
    const QStringList log = logLines(w_.get());
    QVERIFY2(log.filter("2 ranks").size() >= 1, qPrintable(log.join('\n')));
    QVERIFY2(log.filter("mpirun").size() >= 1, qPrintable(log.join('\n')));  // the command line
    QVERIFY2(log.filter("Run finished").size() == 1, qPrintable(log.join('\n')));

    // Rank 0's report is the run's report: it trained across both ranks, and the Confusion tab has the
    // evaluations.
    const QJsonObject report = w_->runner()->report();
    QCOMPARE(report.value("world_size").toInt(), 2);
    QVERIFY(report.value("ok").toBool());
    const QJsonObject train = report["nodes"].toObject()["train"].toObject();
    QVERIFY2(train.value("reducer").toString().contains("2 ranks"),
             qPrintable(train.value("reducer").toString()));
    QVERIFY(report["nodes"].toObject()["test"].toObject().contains("confusion"));
    QVERIFY2(w_->plots()->evaluations().contains("test"), qPrintable(w_->plots()->evaluations().join(",")));
    QVERIFY(!w_->plots()->shownEvaluation().isEmpty());

    // A local run afterwards joins the same history, without a rank count.
    QVERIFY(w_->runGraph());
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 180000 * kTimeScale);
    QCOMPARE(w_->runner()->worldSize(), 0);
    QCOMPARE(w_->plots()->runCount(), 2);
  }

  void cancelStopsEveryRank() {
    openTraining(100000);
    QVERIFY2(w_->runOnProcesses(twoRanks()), qPrintable(w_->lastMessage()));
    // The temporary graph file names this job's ranks (and no other test's).
    const QString graph = w_->runner()->processRun()->commandLine().filter("graph.json").value(0);
    QVERIFY(!graph.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(w_->scene()->nodeItem("train")->runStatus() == RunStatus::Running,
                             120000 * kTimeScale);
    QTRY_COMPARE_WITH_TIMEOUT(ranksOf(graph).size(), qsizetype(2), 10000);
    QCOMPARE(w_->runStateText(), QString("Running…"));
    QElapsedTimer t;
    t.start();
    w_->cancelRun();
    QCOMPARE(w_->runStateText(), QString("Cancelling…"));
    // SIGINT to mpirun: it ends every rank within about 1.5 s; 5 s later whatever is left is killed.
    QTRY_VERIFY_WITH_TIMEOUT(ranksOf(graph).isEmpty(), (ProcessRun::kKillAfterMs + 3000) * kTimeScale);
    const qint64 ranksGone = t.elapsed();
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), (ProcessRun::kKillAfterMs + 3000) * kTimeScale);
    qInfo("every rank was gone %lld ms after Cancel; the run ended after %lld ms", ranksGone, t.elapsed());
    QVERIFY2(ranksGone < 4000 * kTimeScale, "the ranks outlived mpirun's own cancel (SIGINT)");
    QCOMPARE(w_->runStateText(), QString("Cancelled"));
    QVERIFY(w_->runner()->processRun()->cancelled());
    const QStringList log = logLines(w_.get());
    QVERIFY2(log.filter("Run cancelled after").size() == 1, qPrintable(log.join('\n')));
    // The node that was training is not left "running".
    QVERIFY(w_->scene()->nodeItem("train")->runStatus() != RunStatus::Running);
  }

  void closingTheEditorEndsTheJob() {
    openTraining(100000);
    QVERIFY2(w_->runOnProcesses(twoRanks()), qPrintable(w_->lastMessage()));
    const QString graph = w_->runner()->processRun()->commandLine().filter("graph.json").value(0);
    QTRY_COMPARE_WITH_TIMEOUT(ranksOf(graph).size(), qsizetype(2), 60000 * kTimeScale);
    // No event loop runs after the window is gone: its destructor stops the job and waits for it.
    QElapsedTimer t;
    t.start();
    w_.reset();
    qInfo("the window closed in %lld ms", t.elapsed());
    QVERIFY2(ranksOf(graph).isEmpty(), "ranks outlived the editor");
    QVERIFY(t.elapsed() < ProcessRun::kKillAfterMs + 3000);
  }

  void aLostRankFailsTheRunNamingIt() {
    openTraining(100000);
    QVERIFY2(w_->runOnProcesses(twoRanks()), qPrintable(w_->lastMessage()));
    const QString graph = w_->runner()->processRun()->commandLine().filter("graph.json").value(0);
    QTRY_VERIFY_WITH_TIMEOUT(w_->scene()->nodeItem("train")->runStatus() == RunStatus::Running,
                             120000 * kTimeScale);
    QTRY_COMPARE_WITH_TIMEOUT(ranksOf(graph).size(), qsizetype(2), 10000);
    ::kill(pid_t(ranksOf(graph).value(1)), SIGKILL);
    // mpirun notices at once and ends rank 0; a rank that cannot reach the other gives up after 30 s.
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 40000 * kTimeScale);
    QTRY_VERIFY_WITH_TIMEOUT(ranksOf(graph).isEmpty(), 5000);
    // Not "Cancelled": nobody cancelled; the job failed, and the status bar says how.
    QCOMPARE(w_->runStateText(), QString("Failed"));
    const QString status = w_->statusBar()->currentMessage();
    qInfo("status bar: %s", qPrintable(status));
    QVERIFY2(status.contains("mpirun exited with code") && status.contains("rank 1") &&
                 status.contains("signal 9"),
             qPrintable(status));
    const QStringList errors = logLines(w_.get(), "error");
    QVERIFY2(errors.filter("Run failed after").size() == 1, qPrintable(errors.join('\n')));
  }

  // A rank frozen (SIGSTOP, as a hung host): nothing tells mpirun, so rank 0 gives up on the exchange after
  // GPUNODES_COMM_TIMEOUT, its watcher ends mpirun, and the editor shows rank 0's message naming the rank
  // that did not answer and the exchange, and ends its job: no rank is left, frozen or not.
  void aFrozenRankEndsTheJobWithRankZerosMessage() {
    qputenv("GPUNODES_COMM_TIMEOUT", "4");
    openTraining(100000);
    QVERIFY2(w_->runOnProcesses(twoRanks()), qPrintable(w_->lastMessage()));
    const QString graph = w_->runner()->processRun()->commandLine().filter("graph.json").value(0);
    QTRY_VERIFY_WITH_TIMEOUT(w_->scene()->nodeItem("train")->runStatus() == RunStatus::Running,
                             120000 * kTimeScale);
    QTRY_COMPARE_WITH_TIMEOUT(ranksOf(graph).size(), qsizetype(2), 10000);
    QElapsedTimer frozen;
    frozen.start();
    ::kill(pid_t(ranksOf(graph).value(1)), SIGSTOP);
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 45000 * kTimeScale);
    qInfo("the job ended %.1f s after rank 1 froze", frozen.elapsed() / 1000.0);
    QTRY_VERIFY_WITH_TIMEOUT(ranksOf(graph).isEmpty(), 10000);
    qunsetenv("GPUNODES_COMM_TIMEOUT");
    QCOMPARE(w_->runStateText(), QString("Failed"));
    const QString log = logLines(w_.get()).join('\n');
    // rank 0's line and the run's failure; Open MPI's MPI_Abort box is not a third error.
    const QStringList errors = logLines(w_.get(), "error");
    QVERIFY2(errors.size() == 2 && errors.filter("did not answer").size() == 2, qPrintable(errors.join('\n')));
    QVERIFY2(log.contains("rank 1") && log.contains("did not answer within 4 s"), qPrintable(log));
  }

  void malformedLinesWarnAndNothingBreaks() {
    // The parser alone: a line split across reads is joined, a malformed line is a warning, the rest goes on.
    ProcessRun parser;
    QStringList warnings;
    connect(&parser, &ProcessRun::output, this, [&](ProcessRun::Level level, const QString& text) {
      QCOMPARE(level, ProcessRun::Level::Warning);
      warnings << text;
    });
    parser.feedStdout("{\"kind\":\"NodeStarted\",\"node\":\"a\"}\nnot json at all\n{\"kind\":\"Bogus\"}\n");
    parser.feedStdout("[1,2]\n{\"kind\":\"Metr");
    parser.feedStdout("ic\",\"series\":\"s\",\"t\":1,\"value\":2}\r\n\n");
    const QList<core::RunEvent> events = parser.takeEvents();
    QCOMPARE(events.size(), 2);
    QCOMPARE(events[0].kind, core::RunEvent::Kind::NodeStarted);
    QCOMPARE(events[0].node, QString("a"));
    QCOMPARE(events[1].kind, core::RunEvent::Kind::Metric);
    QCOMPARE(events[1].value, 2.0);
    QCOMPARE(warnings.size(), 3);
    QVERIFY2(warnings[0].contains("line 2") && warnings[0].contains("not JSON"), qPrintable(warnings[0]));
    QVERIFY2(warnings[1].contains("line 3") && warnings[1].contains("Bogus"), qPrintable(warnings[1]));
    QVERIFY2(warnings[2].contains("line 4"), qPrintable(warnings[2]));
    core::RunEvent e;
    QString why;
    QVERIFY(!ProcessRun::parseLine("{\"kind\":\"NodeFinished\",\"node\":3}", &e, &why));
    QVERIFY(!why.isEmpty());

    // Through the window: a "rank" that sends a RunStarted, a malformed line and dies with an error on
    // stderr. The log warns about the line, quotes the error, and the run is failed with mpirun's last
    // words in the status bar.
    runFakeRank(
        "echo '{\"kind\":\"RunStarted\",\"message\":\"fake\"}'\n"
        "echo '{\"kind\":\"NodeQueued\",\"node\":\"data\"}'\n"
        "echo '{\"kind\":\"NodeStarted\",\"node\":\"data\"}'\n"
        "echo 'this is not an event'\n"
        "echo 'error: the fake rank fell over' >&2\n"
        "exit 3\n");
    const QStringList warned = logLines(w_.get(), "warning");
    QVERIFY2(warned.filter("is not an event").size() == 1, qPrintable(warned.join('\n')));
    QVERIFY2(warned.filter("this is not an event").size() == 1, qPrintable(warned.join('\n')));
    const QStringList errors = logLines(w_.get(), "error");
    QVERIFY2(errors.filter("the fake rank fell over").size() >= 1, qPrintable(errors.join('\n')));
    QCOMPARE(w_->runStateText(), QString("Failed"));
    const QString status = w_->statusBar()->currentMessage();
    QVERIFY2(status.contains("exited with code") && status.contains("fell over"), qPrintable(status));
    QVERIFY2(errors.filter("Run failed after").size() == 1, qPrintable(errors.join('\n')));
    // What the stream told before the job died is kept: the node that had started is no longer "running".
    QCOMPARE(w_->runner()->report()["nodes"].toObject()["data"].toObject()["status"].toString(),
             QString("running"));
    QCOMPARE(w_->scene()->nodeItem("data")->runStatus(), RunStatus::Cancelled);
  }

  void eachOutcomeReachesTheReportAndTheCanvasByItsStatus() {
    // A "rank" whose stream says each outcome once. The words never decide: train's cancel does not say
    // "cancel", and test's failure does.
    runFakeRank(
        "echo '{\"kind\":\"RunStarted\",\"message\":\"fake\"}'\n"
        "for n in dev data net train test untrained; do echo "
        "\"{\\\"kind\\\":\\\"NodeQueued\\\",\\\"node\\\":\\\"$n\\\"}\"; done\n"
        "echo '{\"kind\":\"NodeFinished\",\"node\":\"dev\",\"status\":\"ok\",\"value\":1}'\n"
        "echo '{\"kind\":\"NodeCached\",\"node\":\"data\",\"status\":\"cached\"}'\n"
        "echo '{\"kind\":\"NodeFailed\",\"node\":\"net\",\"status\":\"bypassed\",\"message\":\"bypassed\"}'\n"
        "echo '{\"kind\":\"NodeFailed\",\"node\":\"train\",\"status\":\"cancelled\",\"message\":\"stopped "
        "before the end\"}'\n"
        "echo '{\"kind\":\"NodeFailed\",\"node\":\"test\",\"status\":\"failed\",\"message\":\"could not "
        "cancel the copy\"}'\n"
        "echo '{\"kind\":\"NodeFailed\",\"node\":\"untrained\",\"status\":\"skipped\",\"message\":\"input "
        "model (net.model) is gone\"}'\n"
        "echo '{\"kind\":\"RunFinished\",\"ok\":false,\"status\":\"failed\",\"message\":\"test: could not "
        "cancel the copy\",\"value\":5}'\n");
    const QJsonObject nodes = w_->runner()->report()["nodes"].toObject();
    auto status = [&](const char* id) { return nodes[id].toObject()["status"].toString(); };
    QCOMPARE(status("dev"), QString("ok"));
    QCOMPARE(status("data"), QString("ok"));
    QVERIFY(nodes["data"].toObject()["cached"].toBool());
    QCOMPARE(status("net"), QString("bypassed"));
    QCOMPARE(status("train"), QString("cancelled"));
    QCOMPARE(status("test"), QString("failed"));
    QCOMPARE(status("untrained"), QString("skipped"));
    // On the canvas: the cancelled and the skipped node grey, the failure red, however each was worded.
    QCOMPARE(w_->scene()->nodeItem("train")->runStatus(), RunStatus::Cancelled);
    QCOMPARE(w_->scene()->nodeItem("untrained")->runStatus(), RunStatus::Cancelled);
    QCOMPARE(w_->scene()->nodeItem("test")->runStatus(), RunStatus::Failed);
    QCOMPARE(w_->scene()->nodeItem("dev")->runStatus(), RunStatus::Done);
    QCOMPARE(w_->runStateText(), QString("Failed"));
  }

  void dialogSaysWhenMpirunIsMissingAndRemembers() {
    // Qt Test's settings folder outlives a run of the suite: start from no choices.
    QSettings().remove("processRun");
    const QByteArray path = qgetenv("PATH");
    QTemporaryDir empty;
    qputenv("PATH", empty.path().toUtf8());
    {
      editor::ProcessRunDialog d(w_.get());
      QVERIFY(!d.mpirunFound());
      QVERIFY(d.findChild<QLabel*>("mpirunMissing")->isVisibleTo(&d));
      QVERIFY(!d.findChild<QDialogButtonBox*>()->button(QDialogButtonBox::Ok)->isEnabled());
    }
    qputenv("PATH", path);
    if (ProcessRunOptions::findMpirun().isEmpty()) QSKIP("mpirun is not on PATH here");
    {
      editor::ProcessRunDialog d(w_.get());
      QVERIFY(d.mpirunFound());
      QVERIFY(!d.findChild<QLabel*>("mpirunMissing")->isVisibleTo(&d));
      QVERIFY(d.findChild<QDialogButtonBox*>()->button(QDialogButtonBox::Ok)->isEnabled());
      // Fresh settings: 2 processes and the defaults, which as root are what Open MPI needs to start.
      QCOMPARE(d.options().processes, 2);
      if (::geteuid() == 0) QVERIFY(d.options().extraArgs.contains("--allow-run-as-root"));
      d.findChild<QSpinBox*>("processesSpin")->setValue(3);
      d.findChild<QLineEdit*>("mpirunArgsEdit")
          ->setText("--bind-to none --mca btl_tcp_if_include \"lo eth0\"");
      QVERIFY(d.findChild<QLabel*>("commandPreview")->text().contains("-np 3"));
      d.accept();
    }
    editor::ProcessRunDialog d(w_.get());
    QCOMPARE(d.options().processes, 3);
    QCOMPARE(d.options().extraArgs,
             QStringList({"--bind-to", "none", "--mca", "btl_tcp_if_include", "lo eth0"}));
  }
};

QTEST_MAIN(TestProcessRun)
#include "test_process_run.moc"
