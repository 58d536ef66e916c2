// The `gpunodes` command line, run as a subprocess: exit codes 0/1/2/130, --set checking, the report,
// metrics and trace files, progress output, Ctrl-C, bad graph files, and the devices and nodes commands.
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QtTest>
#include <csignal>

#include "cli/cli_test_util.h"
#include "gpunodes/core/report_format.h"
#include "gpunodes/core/run_events.h"
#include "time_scale.h"

namespace {

using namespace gn::clitest;

QProcessEnvironment environment(const QString& pluginPath = QStringLiteral(GN_TEST_PLUGIN_DIR)) {
  return pluginEnvironment(pluginPath);
}

Result gpunodes(const QStringList& args, const QProcessEnvironment& env = environment(),
                int timeoutMs = 60000) {
  return runProgram(QStringLiteral(GN_GPUNODES), args, env, timeoutMs);
}

// c1 = 2, c2 = 4 -> a1 = c1 + c2 + 3 (4 jobs of 10 x 100 elements) -> a2 = a1 * 10
const QByteArray kGraph = R"({"format": "gpunodes-graph", "version": 1, "name": "cli test",
  "nodes": [
    {"id": "c1", "type": "TestConst", "params": {"value": 2}},
    {"id": "c2", "type": "TestConst", "params": {"value": 4}},
    {"id": "a1", "type": "TestAdd", "params": {"value": 3, "repeat": 4, "shape": [10, 100]}},
    {"id": "a2", "type": "TestAdd", "params": {"value": 10, "mode": "mul"}}],
  "connections": [{"from": "c1.out", "to": "a1.a"}, {"from": "c2.out", "to": "a1.b"}, {"from": "a1.out", "to": "a2.a"}]})";

int lineCount(const QString& s) {
  return int(s.trimmed().split(u'\n', Qt::SkipEmptyParts).size());
}

}  // namespace

class CliTest : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  QString graph_;

 private slots:
  void eventsStreamAsJsonLinesThatReadBack() {
    QTemporaryDir dir;
    const QString file = write(dir, "g.json", kGraph);
    // On stdout: nothing else there (the summary stays away), one event per line.
    const Result r = gpunodes({"run", file, "--events", "-"});
    EXPECT_EXIT(r, 0);
    QList<gn::core::RunEvent> events;
    for (const QString& line : r.out.split(u'\n', Qt::SkipEmptyParts)) {
      QJsonParseError pe;
      const QJsonDocument d = QJsonDocument::fromJson(line.toUtf8(), &pe);
      QVERIFY2(pe.error == QJsonParseError::NoError && d.isObject(), qPrintable(line));
      gn::core::RunEvent e;
      QString why;
      QVERIFY2(gn::core::eventFromJson(d.object(), &e, &why), qPrintable(why));
      // What is read back writes the same line again.
      QCOMPARE(gn::core::eventToJson(e), d.object());
      events.append(e);
    }
    QVERIFY(events.size() >= 10);
    QCOMPARE(events.first().kind, gn::core::RunEvent::Kind::RunStarted);
    QCOMPARE(events.last().kind, gn::core::RunEvent::Kind::RunFinished);
    QVERIFY(events.last().ok);
    int queued = 0, finished = 0;
    for (const auto& e : events) {
      queued += e.kind == gn::core::RunEvent::Kind::NodeQueued;
      finished += e.kind == gn::core::RunEvent::Kind::NodeFinished;
    }
    QCOMPARE(queued, 4);
    QCOMPARE(finished, 4);
    // To a file: the same stream, and the summary on stdout as usual.
    const Result f = gpunodes({"run", file, "--events", dir.filePath("events.jsonl")});
    EXPECT_EXIT(f, 0);
    QVERIFY(f.out.contains("ok in"));
    QFile lines(dir.filePath("events.jsonl"));
    QVERIFY(lines.open(QIODevice::ReadOnly));
    QCOMPARE(lines.readAll().count('\n'), r.out.count(u'\n'));
    gn::core::RunEvent bad;
    QString why;
    QVERIFY(!gn::core::eventFromJson(QJsonObject{{"kind", "Teleport"}}, &bad, &why));
    QVERIFY(why.contains("Teleport"));
  }

  void initTestCase() {
    QVERIFY(dir_.isValid());
    graph_ = write(dir_, "graph.json", kGraph);
  }

  void helpAndUsageErrors() {
    Result r = gpunodes({"--help"});
    EXPECT_EXIT(r, 0);
    QVERIFY(r.out.contains("gpunodes run FILE"));
    QVERIFY(r.out.contains("130 cancelled"));
    EXPECT_EXIT(gpunodes({"run", "--help"}), 0);
    for (const QStringList& args :
         {QStringList{"run"}, QStringList{"run", graph_, graph_}, QStringList{"run", graph_, "--frobnicate"},
          QStringList{"run", graph_, "--schedule", "fast"}, QStringList{"run", graph_, "--cpu-devices", "0"},
          QStringList{"run", graph_, "--cpu-devices", "x"}, QStringList{"run", graph_, "--report"},
          QStringList{"validate"}, QStringList{"devices", "extra"}, QStringList{"nodes", "--nope"},
          QStringList{"--nope"}, QStringList{graph_, graph_}}) {
      r = gpunodes(args);
      QVERIFY2(r.exitCode == 2, qPrintable(args.join(' ') + "\n" + describe(r)));
      QVERIFY2(r.err.contains("usage: gpunodes"), qPrintable(args.join(' ') + "\n" + describe(r)));
    }
  }

  void noEditorOrNoDisplaySaysHowToRunHeadless() {
    QProcessEnvironment env = environment();
    env.remove("DISPLAY");
    env.remove("WAYLAND_DISPLAY");
    env.remove("QT_QPA_PLATFORM");
    const Result r = gpunodes({graph_}, env);
    EXPECT_EXIT(r, 2);
    QVERIFY2(r.err.contains("gpunodes run " + graph_), qPrintable(describe(r)));
  }

  void aRunPrintsLinesAndASummary() {
    const Result r = gpunodes({"run", graph_});
    EXPECT_EXIT(r, 0);
    // Not a terminal: plain lines, no carriage returns.
    QVERIFY2(r.err.contains("[a1] started\n") &&
                 r.err.contains(QRegularExpression(R"(\[a1\] finished in [0-9.]+ ms\n)")),
             qPrintable(describe(r)));
    QVERIFY(!r.err.contains(u'\r'));
    QVERIFY2(r.out.contains(QRegularExpression(
                 R"(node +type +device +calls +time \(ms\) +GFLOP/s +% peak +bytes +status)")),
             qPrintable(r.out));
    QVERIFY2(r.out.contains(
                 QRegularExpression(R"(a1 +TestAdd +test:0 +4 +[0-9.]+ +[0-9.]+ +[0-9.]+ +31.3 KiB +ok)")),
             qPrintable(r.out));
    QVERIFY(r.out.contains("ok in "));
  }

  void theSummaryPrintsTheTextANodeGenerated() {
    // Any node type's report field generated_text (the Generate node's continuation), under its id.
    QByteArray doc = kGraph;
    doc.replace(R"("params": {"value": 10, "mode": "mul"})",
                R"("params": {"value": 10, "mode": "mul", "label": "say:the time traveller said"})");
    const QString file = dir_.filePath("says.json");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly) && f.write(doc) == doc.size());
    f.close();
    const Result r = gpunodes({"run", file});
    EXPECT_EXIT(r, 0);
    QVERIFY2(r.out.contains("\na2 generated:\nthe time traveller said\n"), qPrintable(r.out));
    QCOMPARE(r.out.count("generated:"), 1);
  }

  void quietPrintsNothing() {
    const Result r = gpunodes({"run", graph_, "--quiet"});
    EXPECT_EXIT(r, 0);
    QCOMPARE(r.out, QString());
    QCOMPARE(r.err, QString());
  }

  void aTerminalGetsAProgressBar() {
    // `script` gives the run a pseudo-terminal, as a person's shell would.
    const QString script = QStandardPaths::findExecutable("script");
    QVERIFY2(!script.isEmpty(), "util-linux's script is needed to give the run a terminal");
    QProcess p;
    p.setProcessEnvironment(environment());
    p.start(script, {"-qec", QStringLiteral("%1 run %2 --set c1.delay_ms=400").arg(GN_GPUNODES, graph_),
                     "/dev/null"});
    QVERIFY(p.waitForFinished(60000));
    const QString all = QString::fromUtf8(p.readAllStandardOutput());
    QCOMPARE(p.exitCode(), 0);
    QVERIFY2(all.contains(QRegularExpression(R"(\r\[[#-]{24}\] [0-4]/4 nodes)")), qPrintable(all));
    QVERIFY2(!all.contains("[a1] started"), qPrintable(all));
    QVERIFY(all.contains("ok in "));
  }

  void theReportHasTheDesignedFields() {
    const QString report = dir_.filePath("report.json");
    const Result r = gpunodes({"run", graph_, "--report", report, "--quiet"});
    EXPECT_EXIT(r, 0);
    const QJsonObject o = readJson(report);
    QCOMPARE(o.value("graph").toString(), QStringLiteral("cli test"));
    QCOMPARE(o.value("file").toString(), graph_);
    QVERIFY(o.value("ok").toBool());
    QVERIFY(o.value("wall_ms").toDouble() > 0);
    QCOMPARE(o.value("devices").toArray().at(0).toObject().value("name").toString(),
             QStringLiteral("test:0"));
    const QJsonObject a1 = o.value("nodes").toObject().value("a1").toObject();
    for (const char* key :
         {"type", "status", "device", "calls", "time_ms", "gflops", "pct_peak", "bytes", "error"})
      QVERIFY2(a1.contains(key), key);
    QCOMPARE(a1.value("status").toString(), QStringLiteral("ok"));
    QCOMPARE(a1.value("calls").toInt(), 4);
    QCOMPARE(a1.value("bytes").toInteger(), 32000);
    QCOMPARE(a1.value("value").toDouble(), 9.0);
    QCOMPARE(o.value("nodes").toObject().value("a2").toObject().value("value").toDouble(), 90.0);
    const QJsonArray series = o.value("metrics").toObject().value("test.value").toArray();
    QCOMPARE(series.size(), 2);
    QCOMPARE(series.at(0).toArray().size(), 2);  // [t, v]
    QVERIFY(o.value("memory").toObject().value("test:0").toObject().contains("peak_bytes"));
    QVERIFY(o.value("memory").toObject().value("test:0").toObject().contains("current_bytes"));
  }

  void metricsCsvAndTrace() {
    const QString csv = dir_.filePath("m.csv"), trace = dir_.filePath("t.json");
    EXPECT_EXIT(gpunodes({"run", graph_, "--metrics", csv, "--trace", trace, "--quiet"}), 0);
    QFile f(csv);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QList<QByteArray> lines = f.readAll().split('\n');
    QCOMPARE(lines.value(0), QByteArray("series,t,value"));
    QVERIFY(lines.contains("test.value,0,9"));
    QVERIFY(lines.contains("test.value,0,90"));

    // Byte for byte what the editor's File ▸ Export ▸ Metrics CSV writes for the same series: both are
    // core::metricsCsv of the report's metrics.
    const QString report = dir_.filePath("m-report.json");
    EXPECT_EXIT(gpunodes({"run", graph_, "--metrics", csv, "--report", report, "--quiet"}), 0);
    QFile again(csv);
    QVERIFY(again.open(QIODevice::ReadOnly));
    QCOMPARE(again.readAll(), gn::core::metricsCsv(readJson(report).value("metrics").toObject()));

    QFile t(trace);
    QVERIFY(t.open(QIODevice::ReadOnly));
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(t.readAll(), &error);
    QCOMPARE(error.error, QJsonParseError::NoError);
    const QJsonArray events = doc.object().value("traceEvents").toArray();
    int a1Spans = 0;
    for (const QJsonValue& v : events) {
      const QJsonObject e = v.toObject();
      QVERIFY(e.contains("ph") && e.contains("pid"));
      if (e.value("ph") == "X") {
        QVERIFY(e.contains("ts") && e.contains("dur") && e.contains("tid"));
        a1Spans += e.value("args").toObject().value("node").toString() == "a1";
      }
    }
    QCOMPARE(a1Spans, 4);
  }

  void setOverridesParams() {
    const QString report = dir_.filePath("set.json");
    EXPECT_EXIT(gpunodes({"run", graph_, "--quiet", "--report", report, "--set", "a1.value=10",
                          "--set=a1.shape=2x3", "--set", "a2.mode=add", "--set", "c1.value=0.5"}),
                0);
    QJsonObject nodes = readJson(report).value("nodes").toObject();
    QCOMPARE(nodes.value("a1").toObject().value("value").toDouble(), 14.5);
    QCOMPARE(nodes.value("a1").toObject().value("bytes").toInteger(), 4 * 8 * 6);
    QCOMPARE(nodes.value("a2").toObject().value("value").toDouble(), 24.5);
    EXPECT_EXIT(gpunodes({"run", graph_, "--quiet", "--report", report, "--set", "a1.shape=[4, 5]", "--set",
                          "a1.repeat=1e1"}),
                0);
    nodes = readJson(report).value("nodes").toObject();
    QCOMPARE(nodes.value("a1").toObject().value("bytes").toInteger(), 10 * 8 * 20);
  }

  void setErrorsAreUsageErrors() {
    const QList<QPair<QString, QString>> cases{
        {"zz.value=1", "--set zz.value=1: no node \"zz\" in " + graph_ + " (nodes: c1, c2, a1, a2)"},
        {"a1.colour=red",
         "--set a1.colour=red: a1 (TestAdd) has no param \"colour\" (params: value, repeat, delay_ms, throw, "
         "fail, label, mode, shape)"},
        {"a1.repeat=abc", "--set a1.repeat=abc: expected an integer, got \"abc\" (int)"},
        {"a1.repeat=2.5", "--set a1.repeat=2.5: expected an integer, got \"2.5\" (int)"},
        {"a1.repeat=0", "--set a1.repeat=0: 0 is below the minimum 1 (int)"},
        {"a1.value=nan", "--set a1.value=nan: must be a finite number, got nan (float)"},
        {"a1.value=", "--set a1.value=: expected a number, got \"\" (float)"},
        {"a1.throw=maybe", "--set a1.throw=maybe: expected true or false, got \"maybe\" (bool)"},
        {"a1.mode=div", "--set a1.mode=div: \"div\" is not one of: add, mul (enum)"},
        {"a1.shape=2xq",
         "--set a1.shape=2xq: expected a shape like 100x100 or [100,100], got \"2xq\" (shape)"},
        {"a1.shape=0x5", "--set a1.shape=0x5: dimension 0: 0 is below the minimum 1 (shape)"},
        {"a1.shape=1000000000x1000000000x1000000000",
         "--set a1.shape=1000000000x1000000000x1000000000: 3 dimensions multiply to more than 2^63 elements "
         "(shape)"},
        {"a1value", "--set a1value: expected NODE.PARAM=VALUE"},
    };
    for (const auto& [set, message] : cases) {
      const Result r = gpunodes({"run", graph_, "--set", set});
      QVERIFY2(r.exitCode == 2, qPrintable(set + "\n" + describe(r)));
      QVERIFY2(r.err.startsWith("gpunodes: " + message + "\n"), qPrintable(set + "\n" + describe(r)));
    }
  }

  void aNodeFailureExitsOne() {
    const QString report = dir_.filePath("fail.json");
    const Result r = gpunodes({"run", graph_, "--set", "a1.throw=true", "--report", report});
    EXPECT_EXIT(r, 1);
    QVERIFY2(r.err.contains("[a1] failed: TestAdd threw as asked\n"), qPrintable(describe(r)));
    QVERIFY(r.err.contains("[a2] skipped: input a (a1.out) failed\n"));
    QVERIFY(r.out.contains(QRegularExpression(R"(a1 +TestAdd .* failed\n)")));
    QVERIFY(r.out.contains("a1: TestAdd threw as asked\n"));
    QVERIFY(r.out.contains("FAILED in "));
    const QJsonObject o = readJson(report);
    QVERIFY(!o.value("ok").toBool());
    QCOMPARE(o.value("nodes").toObject().value("a1").toObject().value("error").toString(),
             QStringLiteral("TestAdd threw as asked"));
    // Quiet drops the progress and the table, not the failure: one line per failed node, on stderr.
    const Result quiet = gpunodes({"run", graph_, "--quiet", "--set", "a1.throw=true"});
    EXPECT_EXIT(quiet, 1);
    QCOMPARE(quiet.out, QString());
    QCOMPARE(quiet.err, QStringLiteral("[a1] failed: TestAdd threw as asked\n"));
  }

  void anInvalidGraphExitsOneWithPerNodeErrors() {
    QByteArray bad = kGraph;
    bad.replace(R"("type": "TestConst", "params": {"value": 4})", R"("type": "Foo", "params": {"value": 4})");
    bad.replace(R"("mode": "mul")", R"("mode": "mul", "repeat": 0)");
    const QString file = write(dir_, "invalid.json", bad), report = dir_.filePath("invalid-report.json");
    for (const QString& command : {QStringLiteral("run"), QStringLiteral("validate")}) {
      QStringList args{command, file};
      if (command == "run") args << "--report" << report;
      const Result r = gpunodes(args);
      EXPECT_EXIT(r, 1);
      QCOMPARE(r.err,
               QStringLiteral("error: %1: c2: type: unknown node type \"Foo\" (no plugin provides it)\n"
                              "error: %1: a2: params.repeat: 0 is below the minimum 1\n")
                   .arg(file));
    }
    const QJsonObject o = readJson(report);
    QVERIFY(!o.value("ok").toBool());
    QCOMPARE(o.value("nodes").toObject().value("c2").toObject().value("status").toString(),
             QStringLiteral("missing"));
    QCOMPARE(o.value("validation").toArray().size(), 2);
  }

  void validatePrintsOkWarningsAndCyclesOnce() {
    Result r = gpunodes({"validate", graph_});
    EXPECT_EXIT(r, 0);
    QCOMPARE(r.out, graph_ + ": ok (4 nodes, 3 connections)\n");
    QByteArray cyclic = kGraph;
    cyclic.replace(R"({"from": "c1.out", "to": "a1.a"})", R"({"from": "a2.out", "to": "a1.a"})");
    cyclic.replace(R"("repeat": 4,)", R"("repeat": 4, "colour": 1,)");
    const QString file = write(dir_, "cyclic.json", cyclic);
    r = gpunodes({"validate", file});
    EXPECT_EXIT(r, 1);
    QCOMPARE(r.err, QStringLiteral(
                        "warning: %1: a1: params.colour: unknown param, ignored (TestAdd has: value, repeat, "
                        "delay_ms, throw, fail, label, mode, shape)\nerror: %1: cycle: a1 -> a2 -> a1\n")
                        .arg(file));
  }

  void badFilesGetOneLineNamingTheFileAndWhere() {
    QByteArray nonUtf8 = kGraph;
    nonUtf8.replace("cli test", "caf\xE9");
    const QList<QPair<QString, QString>> cases{
        {write(dir_, "truncated.json", kGraph.left(120)), ": line 3, column "},
        {write(
             dir_, "types.json",
             R"({"format": "gpunodes-graph", "version": 1, "nodes": [{"id": "a", "type": "T", "position": "here"}]})"),
         ": nodes[0].position: expected [x, y] (node a)"},
        {write(dir_, "format.json", R"({"format": "something-else", "version": 1})"),
         ": format: \"something-else\" is not a gpunodes graph"},
        {write(dir_, "future.json", R"({"format": "gpunodes-graph", "version": 3})"),
         ": version 3 is newer than this build (2)"},
        {write(dir_, "latin1.json", nonUtf8), ": line 1, column 56: invalid UTF-8 (byte 0xe9)"},
        {write(dir_, "deep.json",
               R"({"format": "gpunodes-graph", "version": 1, "x": )" + QByteArray(100000, '[') +
                   QByteArray(100000, ']') + "}"),
         ": line 1, column "},
        {dir_.filePath("missing.json"), ": no such file"},
    };
    for (const auto& [file, message] : cases)
      for (const QString& command : {QStringLiteral("validate"), QStringLiteral("run")}) {
        const Result r = gpunodes({command, file});
        QVERIFY2(r.exitCode == 1, qPrintable(file + "\n" + describe(r)));
        QVERIFY2(r.err.startsWith("error: " + file + message) && lineCount(r.err) == 1,
                 qPrintable(file + "\n" + describe(r)));
        QVERIFY2(r.ms < 2000 * kTimeScale, qPrintable(QString::number(r.ms)));
      }
  }

  void hugeStringsGiveShortMessages() {
    const QByteArray huge(10 * 1000 * 1000, 'x');
    QByteArray bad = kGraph;
    bad.replace(R"("type": "TestConst", "params": {"value": 4})",
                R"("type": ")" + huge + R"(", "params": {"value": 4})");
    bad.replace(R"("mode": "mul")", R"("mode": ")" + huge + R"(")");
    const QString file = write(dir_, "long-strings.json", bad);
    const Result r = gpunodes({"validate", file});
    EXPECT_EXIT(r, 1);
    QCOMPARE(lineCount(r.err), 2);
    QVERIFY2(r.err.size() < 1000, qPrintable(r.err.left(1000)));
    QVERIFY(r.err.contains("c2: type: unknown node type \"xxxx"));
    QVERIFY(r.err.contains("a2: params.mode: \"xxxx"));
    QFile::remove(file);
  }

  void aHugeFileIsRefusedBeforeItIsRead() {
    const QString file = dir_.filePath("huge.json");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly));
    QVERIFY(f.resize(300LL * 1024 * 1024));  // sparse: 300 MB on paper, nothing on disk
    f.close();
    const QString report = dir_.filePath("huge-report.json");
    for (const QString& command : {QStringLiteral("validate"), QStringLiteral("run")}) {
      QStringList args{command, file};
      if (command == "run") args << "--report" << report;
      const Result r = gpunodes(args);
      EXPECT_EXIT(r, 1);
      QCOMPARE(
          r.err,
          QStringLiteral(
              "error: %1: the file is 300.0 MiB, over the 32 MiB limit for graph files (33554432 bytes)\n")
              .arg(file));
      QVERIFY2(r.ms < 2000 * kTimeScale, qPrintable(QString::number(r.ms)));
    }
    const QJsonObject o = readJson(report);  // batch scripts still get a report saying why
    QVERIFY(!o.value("ok").toBool());
    QVERIFY(o.value("error").toString().contains("32 MiB limit"));
    f.remove();
  }

  // Runs the graph with a1 taking ten minutes (and `extra` args), sends Ctrl-C once a1 has started, and
  // returns what the run printed, its exit code (-2: it crashed) and how long it took from the Ctrl-C.
  Result interruptedRun(const QStringList& extra) {
    QProcess p;
    p.setProcessEnvironment(environment());
    p.start(QStringLiteral(GN_GPUNODES), QStringList{"run", graph_, "--set", "a1.delay_ms=600000"} + extra);
    Result r;
    if (!p.waitForStarted()) return r;
    QElapsedTimer timer;
    timer.start();
    while (!r.err.contains("[a1] started") && timer.elapsed() < 20000) {
      p.waitForReadyRead(100);
      r.err += QString::fromUtf8(p.readAllStandardError());
    }
    if (!r.err.contains("[a1] started")) return r;
    timer.restart();
    ::kill(pid_t(p.processId()), SIGINT);
    p.waitForFinished(10000);
    r.ms = timer.elapsed();
    r.err += QString::fromUtf8(p.readAllStandardError());
    r.out = QString::fromUtf8(p.readAllStandardOutput());
    r.exitCode = p.state() != QProcess::NotRunning          ? -1
                 : p.exitStatus() == QProcess::NormalExit ? p.exitCode()
                                                          : -2;
    return r;
  }

  void ctrlCCancelsAndWritesAPartialReport() {
    const QString report = dir_.filePath("cancel.json");
    const Result r = interruptedRun({"--report", report});
    QVERIFY2(r.err.contains("[a1] started"), qPrintable(r.err));
    QVERIFY2(r.ms < 1500 * kTimeScale, qPrintable(QString::number(r.ms)));
    QVERIFY2(r.exitCode == 130, qPrintable(QString::number(r.exitCode) + "\n" + r.err));
    QVERIFY(r.err.contains("cancelling"));
    QVERIFY(r.out.contains("cancelled after"));
    const QJsonObject o = readJson(report);
    QVERIFY(o.value("cancelled").toBool());
    QVERIFY(!o.value("ok").toBool());
    QCOMPARE(o.value("nodes").toObject().value("c1").toObject().value("status").toString(),
             QStringLiteral("ok"));
    QCOMPARE(o.value("nodes").toObject().value("a1").toObject().value("status").toString(),
             QStringLiteral("cancelled"));
    QCOMPARE(o.value("nodes").toObject().value("a2").toObject().value("status").toString(),
             QStringLiteral("cancelled"));
  }

  void aCancelledNodeIsCancelledWhateverItsWorkSays() {
    // a1's work ends a cancel with "stopped before the end": no failure line, and cancelled everywhere.
    const QString report = dir_.filePath("cancel-quiet.json"), events = dir_.filePath("cancel-quiet.jsonl");
    const Result r = interruptedRun({"--set", "a1.label=stop", "--report", report, "--events", events});
    QVERIFY2(r.exitCode == 130, qPrintable(QString::number(r.exitCode) + "\n" + r.err));
    QVERIFY2(r.err.contains("[a1] stopped before the end\n"), qPrintable(r.err));
    QVERIFY2(!r.err.contains("failed"), qPrintable(r.err));
    QCOMPARE(readJson(report).value("nodes").toObject().value("a1").toObject().value("status").toString(),
             QStringLiteral("cancelled"));
    QFile lines(events);
    QVERIFY(lines.open(QIODevice::ReadOnly));
    bool seen = false;
    for (const QByteArray& line : lines.readAll().split('\n')) {
      const QJsonObject e = QJsonDocument::fromJson(line).object();
      if (e.value("kind") != "NodeFailed" || e.value("node") != "a1") continue;
      seen = true;
      QCOMPARE(e.value("status").toString(), QStringLiteral("cancelled"));
      QCOMPARE(e.value("message").toString(), QStringLiteral("stopped before the end"));
    }
    QVERIFY(seen);
  }

  void anUnwritableReportFailsTheRun() {
    const Result r = gpunodes({"run", graph_, "--quiet", "--report", dir_.filePath("no/such/dir/r.json")});
    EXPECT_EXIT(r, 1);
    QVERIFY2(r.err.contains("cannot write the report"), qPrintable(describe(r)));
  }

  void devicesComeFromThePlugins() {
    Result r = gpunodes({"devices", "--cpu-devices", "3"});
    EXPECT_EXIT(r, 0);
    QVERIFY2(r.out.contains("test:0  a device for tests (cpu_devices=3)"), qPrintable(describe(r)));
    r = gpunodes({"devices", "--cpu-devices", "7"});  // a set without a table: its devices, one per line
    EXPECT_EXIT(r, 0);
    QVERIFY2(r.out.contains(R"({"cpu_devices":7,"name":"test:0"})"), qPrintable(describe(r)));
    r = gpunodes({"devices", "--json"});
    EXPECT_EXIT(r, 0);
    const QJsonObject o = QJsonDocument::fromJson(r.out.toUtf8()).object();
    bool found = false;
    for (const QJsonValue& d : o.value("devices").toArray()) found |= d.toObject().value("name") == "test:0";
    QVERIFY2(found, qPrintable(r.out));
    QVERIFY(o.value("node_sets").toObject().contains("test-nodes"));
  }

  void nodesListsTheCatalogue() {
    Result r = gpunodes({"nodes"});
    EXPECT_EXIT(r, 0);
    QVERIFY(r.out.contains("Test\n  TestAdd  a + b + value"));
    QVERIFY2(r.out.contains("    inputs:  a: Scalar, b: Scalar (optional), devices: Devices (optional)"),
             qPrintable(r.out));
    QVERIFY(r.out.contains("    repeat (int 1..1000) = 1  jobs"));
    QVERIFY(r.out.contains("    mode (enum {add|mul}) = add  op"));
    r = gpunodes({"nodes", "--json"});
    EXPECT_EXIT(r, 0);
    const QJsonObject o = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QJsonObject add;
    for (const QJsonValue& t : o.value("node_types").toArray())
      if (t.toObject().value("name") == "TestAdd") add = t.toObject();
    QCOMPARE(add.value("category").toString(), QStringLiteral("Test"));
    QCOMPARE(add.value("plugin").toString(), QStringLiteral("test-nodes"));
    QCOMPARE(add.value("inputs").toArray().at(1).toObject().value("required").toBool(), false);
    QCOMPARE(add.value("outputs").toArray().at(0).toObject().value("type").toString(),
             QStringLiteral("Scalar"));
    const QJsonObject repeat = add.value("params").toArray().at(1).toObject();
    QCOMPARE(repeat.value("name").toString(), QStringLiteral("repeat"));
    QCOMPARE(repeat.value("type").toString(), QStringLiteral("int"));
    QCOMPARE(repeat.value("min").toInt(), 1);
    QCOMPARE(repeat.value("max").toInt(), 1000);
    QCOMPARE(repeat.value("default").toInt(), 1);
    QCOMPARE(repeat.value("doc").toString(), QStringLiteral("jobs"));
    QCOMPARE(add.value("params").toArray().at(6).toObject().value("values").toArray().size(), 2);
    QVERIFY(o.value("load_errors").toArray().isEmpty());
  }

  void aBrokenPluginIsReportedAndTheOthersWork() {
    const QString path =
        QStringLiteral(GN_TEST_PLUGIN_DIR) + ":" + QFileInfo(QStringLiteral(GN_BROKEN_PLUGIN)).absolutePath();
    const Result r = gpunodes({"nodes", "--json"}, environment(path));
    EXPECT_EXIT(r, 0);
    QVERIFY2(
        r.err.contains(QRegularExpression(
            "gpunodes: warning: plugin .*libgn_broken_nodes.so: .*gn_test_symbol_that_no_library_defines")),
        qPrintable(describe(r)));
    const QJsonObject o = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QVERIFY(o.value("load_errors").toArray().size() >= 2);  // the broken set and the foreign plugin
    QVERIFY(r.out.contains("\"TestAdd\""));
  }

#ifdef GN_NODES_PLUGIN
  // The GPU node set, as a user gets it: found next to the binary, no GPUNODES_PLUGIN_PATH needed.
  void theGpuNodeSetIsFoundNextToTheBinary() {
    const Result r = gpunodes({"nodes", "--json"}, QProcessEnvironment::systemEnvironment());
    EXPECT_EXIT(r, 0);
    QStringList names;
    for (const QJsonValue& t : QJsonDocument::fromJson(r.out.toUtf8()).object().value("node_types").toArray())
      names.append(t.toObject().value("name").toString());
    for (const char* type : {"Device", "AllDevices", "Tensor", "Copy", "MatMul", "Elementwise", "Norm",
                             "Synchronize", "Inspect"})
      QVERIFY2(names.contains(type), qPrintable(type + (": " + names.join(", "))));
    const Result d =
        gpunodes({"devices", "--json", "--cpu-devices", "2"}, QProcessEnvironment::systemEnvironment());
    EXPECT_EXIT(d, 0);
    QVERIFY2(QJsonDocument::fromJson(d.out.toUtf8()).object().value("devices").toArray().size() >= 2,
             qPrintable(d.out));
    EXPECT_EXIT(gpunodes({"devices"}, QProcessEnvironment::systemEnvironment()), 0);
  }

  // libgomp reads OMP_WAIT_POLICY when it loads: gpunodes starts itself again with passive waits unless the
  // user chose a policy, which it keeps.
  void openMpWaitsArePassiveUnlessTheUserChose() {
    QProcessEnvironment env = environment();
    env.remove("OMP_WAIT_POLICY");
    Result r = gpunodes({"devices"}, env);
    EXPECT_EXIT(r, 0);
    QVERIFY2(r.out.contains("OpenMP waits: passive (OMP_WAIT_POLICY)"), qPrintable(describe(r)));
    r = gpunodes({"devices", "--json"}, env);
    QCOMPARE(QJsonDocument::fromJson(r.out.toUtf8()).object().value("openmp_wait_policy").toString(),
             QStringLiteral("passive"));
    env.insert("OMP_WAIT_POLICY", "active");
    r = gpunodes({"devices"}, env);
    QVERIFY2(r.out.contains("OpenMP waits: active (OMP_WAIT_POLICY)"), qPrintable(describe(r)));
  }

  void anExampleRunsHeadlessWithEveryOutput() {
    const QString report = dir_.filePath("qs.json"), trace = dir_.filePath("qs-trace.json"),
                  csv = dir_.filePath("qs.csv");
    const Result r = gpunodes({"run", GN_EXAMPLES_DIR "/quickstart.json", "--set", "x0.shape=64x64", "--set",
                               "x1.shape=[64,64]", "--report", report, "--trace", trace, "--metrics", csv},
                              QProcessEnvironment::systemEnvironment());
    EXPECT_EXIT(r, 0);
    const QJsonObject o = readJson(report);
    QVERIFY(o.value("ok").toBool());
    QVERIFY(o.value("devices").toArray().size() >= 2);
    const QJsonObject nodes = o.value("nodes").toObject();
    QVERIFY(nodes.value("mm0").toObject().value("calls").toInt() >= 1);
    QVERIFY(nodes.value("mm0").toObject().value("gflops").toDouble() > 0);
    QVERIFY(nodes.value("show").toObject().value("inspect").toArray().size() >= 1);
    QVERIFY(!o.value("memory").toObject().isEmpty());
    QVERIFY(QJsonDocument::fromJson([&] {
              QFile f(trace);
              f.open(QIODevice::ReadOnly);
              return f.readAll();
            }())
                .object()
                .value("traceEvents")
                .toArray()
                .size() > 0);
  }

  void theSummaryShowsTheLastValueOfEachMetric() {
    const Result r = gpunodes({"run", GN_EXAMPLES_DIR "/log-per-step.json", "--set", "mm_step.repeat=20",
                               "--set", "mm_log.repeat=20"},
                              QProcessEnvironment::systemEnvironment());
    EXPECT_EXIT(r, 0);
    QVERIFY2(r.out.contains("metric (last value of n samples)"), qPrintable(r.out));
    QVERIFY2(QRegularExpression("norm_step = [0-9.e+-]+  \\(n = 20\\)").match(r.out).hasMatch(),
             qPrintable(r.out));
  }

  void ctrlCCancelsARealLongRun() {
    const QString report = dir_.filePath("real-cancel.json");
    QProcess p;
    p.setProcessEnvironment(QProcessEnvironment::systemEnvironment());
    p.start(QStringLiteral(GN_GPUNODES),
            {"run", GN_EXAMPLES_DIR "/quickstart.json", "--set", "x0.shape=[512,512]", "--set",
             "x1.shape=[512,512]", "--set", "mm0.repeat=1000000", "--set", "mm1.repeat=1000000", "--report",
             report});
    QVERIFY(p.waitForStarted());
    QString err;
    QElapsedTimer timer;
    timer.start();
    while (!err.contains("[mm0] started") && timer.elapsed() < 30000) {
      p.waitForReadyRead(100);
      err += QString::fromUtf8(p.readAllStandardError());
    }
    QVERIFY2(err.contains("[mm0] started"), qPrintable(err));
    QTest::qWait(300);
    timer.restart();
    ::kill(pid_t(p.processId()), SIGINT);
    QVERIFY(p.waitForFinished(10000));
    QVERIFY2(timer.elapsed() < 1500 * kTimeScale, qPrintable(QString::number(timer.elapsed())));
    QCOMPARE(p.exitCode(), 130);
    const QJsonObject o = readJson(report);
    QVERIFY(o.value("cancelled").toBool());
    QCOMPARE(o.value("nodes").toObject().value("mm0").toObject().value("status").toString(),
             QStringLiteral("cancelled"));
    QCOMPARE(o.value("nodes").toObject().value("dev0").toObject().value("status").toString(),
             QStringLiteral("ok"));
  }
#endif
};

QTEST_GUILESS_MAIN(CliTest)
#include "test_cli.moc"
