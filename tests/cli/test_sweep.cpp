// `gpunodes sweep` run as a subprocess: a bad --grid is a usage error before anything runs; a grid runs every
// point, a failing point is recorded and the others still run, and the point reports, summary.json,
// summary.csv and the plots agree with each other; Ctrl-C stops the sweep and leaves the summary.
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QSet>
#include <QTemporaryDir>
#include <QtTest>
#include <csignal>

#include "csv_test_util.h"
#include "cli/cli_test_util.h"
#include "time_scale.h"

namespace {

using namespace gn::clitest;

Result gpunodes(const QStringList& args, const QString& workDir = {}) {
  return runProgram(QStringLiteral(GN_GPUNODES), args, pluginEnvironment(QStringLiteral(GN_TEST_PLUGIN_DIR)),
                    300000 * kTimeScale, workDir);
}

#ifdef GN_MPIRUN
Result mpirun(int ranks, const QStringList& args, const QList<QPair<QString, QString>>& env = {}) {
  QProcessEnvironment e = pluginEnvironment(QStringLiteral(GN_TEST_PLUGIN_DIR));
  e.insert("QT_QPA_PLATFORM", "offscreen");
  for (const auto& [name, value] : env) e.insert(name, value);
  return runProgram(QStringLiteral(GN_MPIRUN), mpirunOptions(ranks) + QStringList{GN_GPUNODES} + args, e,
                    300000 * kTimeScale);
}
#endif

// c1 = value, c2 = 4 -> a1 = c1 + c2 + 3 -> a2 = a1 * 10 (fails in its work when a2.fail)
const QByteArray kTestGraph = R"({"format": "gpunodes-graph", "version": 1, "name": "sweep test",
  "nodes": [
    {"id": "c1", "type": "TestConst", "params": {"value": 2}},
    {"id": "c2", "type": "TestConst", "params": {"value": 4}},
    {"id": "a1", "type": "TestAdd", "params": {"value": 3}},
    {"id": "a2", "type": "TestAdd", "params": {"value": 10, "mode": "mul"}}],
  "connections": [{"from": "c1.out", "to": "a1.a"}, {"from": "c2.out", "to": "a1.b"}, {"from": "a1.out", "to": "a2.a"}]})";

// Synthetic data -> mlp -> one epoch of Train -> Evaluate, on the CPU: seconds per point.
const QByteArray kTrainGraph = R"({"format": "gpunodes-graph", "version": 1, "name": "sweep training",
  "settings": {"cpu_devices": 1},
  "nodes": [
    {"id": "cpu", "type": "Device", "params": {"kind": "cpu"}},
    {"id": "data", "type": "Dataset", "params": {"name": "synthetic", "limit": 200, "batch_size": 50}},
    {"id": "net", "type": "Model", "params": {"arch": "mlp"}},
    {"id": "train", "type": "Train", "params": {"epochs": 1, "lr": 0.1, "log_every": 0}},
    {"id": "eval", "type": "Evaluate", "params": {"split": "test", "mistakes_shown": 0}}],
  "connections": [
    {"from": "cpu.device", "to": "net.device"}, {"from": "cpu.device", "to": "train.devices"},
    {"from": "net.model", "to": "train.model"}, {"from": "data.data", "to": "train.data"},
    {"from": "train.model", "to": "eval.model"}, {"from": "data.data", "to": "eval.data"}]})";

// The rule of docs/cli.md, computed independently: the last value of each metric series, then each node's
// own numeric report fields as node.field (over a series of the same name).
QJsonObject expectedMetrics(const QJsonObject& report) {
  static const QSet<QString> executorFields{"type",  "status", "device",  "calls", "time_ms",  "gflops",
                                            "flops", "bytes",  "wall_ms", "error", "warnings", "pct_peak"};
  QJsonObject m;
  const QJsonObject series = report.value("metrics").toObject();
  for (auto it = series.begin(); it != series.end(); ++it) {
    const QJsonValue last = it.value().toArray().last().toArray().at(1);
    if (last.isDouble()) m.insert(it.key(), last);
  }
  const QJsonObject nodes = report.value("nodes").toObject();
  for (auto n = nodes.begin(); n != nodes.end(); ++n) {
    const QJsonObject fields = n.value().toObject();
    for (auto f = fields.begin(); f != fields.end(); ++f)
      if (f.value().isDouble() && !executorFields.contains(f.key()))
        m.insert(n.key() + "." + f.key(), f.value());
  }
  return m;
}

QStringList csvLines(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  return QString::fromUtf8(f.readAll()).split(u'\n', Qt::SkipEmptyParts);
}


QString plotName(const QString& metric) {
  QString safe = metric;
  for (QChar& c : safe)
    if (!((c.isLetterOrNumber() && c.unicode() < 128) || c == u'.' || c == u'_' || c == u'-')) c = u'_';
  return "plot-" + safe + ".png";
}

}  // namespace

class SweepTest : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  QString testGraph_;

  // What every sweep's files must agree on, whatever the graph: one report per point that ran, named by
  // its number, whose params, metrics and outcome the summary and the CSV repeat; a plot for exactly the
  // metrics that differ between the points that ran ok, each a real picture.
  void checkOutputs(const QString& out, const QJsonObject& summary, const QStringList& gridParams) {
    const QJsonArray points = summary.value("points").toArray();
    QVERIFY(!points.isEmpty());
    QSet<QString> allMetrics;
    for (const QJsonValue& v : points) {
      const QJsonObject p = v.toObject();
      const int n = p.value("point").toInt();
      const QString reportFile = QStringLiteral("point-%1.json").arg(n, 4, 10, QChar(u'0'));
      if (p.value("status").toString() == "not run") {
        QVERIFY(!QFileInfo::exists(QDir(out).filePath(reportFile)));
        continue;
      }
      QCOMPARE(p.value("report").toString(), reportFile);
      const QJsonObject report = readJson(QDir(out).filePath(reportFile));
      QCOMPARE(report.value("point").toInt(), n);
      QCOMPARE(report.value("params").toObject(), p.value("params").toObject());
      QCOMPARE(report.value("ok").toBool(), p.value("ok").toBool());
      QCOMPARE(p.value("ok").toBool(), p.value("error").toString().isEmpty());
      QCOMPARE(p.value("metrics").toObject(), expectedMetrics(report));
      // Point i (from 0) runs on rank i % ranks.
      QCOMPARE(p.value("rank").toInt(), (n - 1) % summary.value("ranks").toInt());
      QVERIFY(p.value("wall_ms").toDouble() > 0);
      for (const QString& param : gridParams)
        QVERIFY2(p.value("params").toObject().contains(param), qPrintable(param));
      for (const QString& m : p.value("metrics").toObject().keys()) allMetrics.insert(m);
    }
    QStringList metrics = allMetrics.values();
    metrics.sort();
    QCOMPARE(summary.value("metrics").toArray(), QJsonArray::fromStringList(metrics));

    const QStringList lines = csvLines(QDir(out).filePath("summary.csv"));
    QCOMPARE(lines.size(), points.size() + 1);
    QCOMPARE(lines[0],
             (QStringList{"point"} + gridParams + QStringList{"ok", "error", "wall_ms"} + metrics).join(","));
    for (qsizetype i = 0; i < points.size(); ++i) {
      const QJsonObject p = points[i].toObject();
      const QStringList cells = gn::test::csvCells(lines[i + 1]);
      QCOMPARE(cells.size(), 1 + gridParams.size() + 3 + metrics.size());
      QCOMPARE(cells[0].toInt(), p.value("point").toInt());
      QCOMPARE(cells[gridParams.size() + 1], p.value("ok").toBool() ? QString("true") : QString("false"));
      QCOMPARE(cells[gridParams.size() + 2], p.value("error").toString());
      for (qsizetype m = 0; m < metrics.size(); ++m) {
        const QString cell = cells[gridParams.size() + 4 + m];
        const QJsonValue v = p.value("metrics").toObject().value(metrics[m]);
        if (v.isUndefined())
          QCOMPARE(cell, QString());
        else
          QVERIFY2(cell.toDouble() == v.toDouble(), qPrintable(metrics[m] + ": " + cell));
      }
    }

#ifdef GN_WITH_GUI
    QStringList expectedPlots;
    for (const QString& m : metrics) {
      QSet<double> values;
      for (const QJsonValue& v : points)
        if (v.toObject().value("ok").toBool() && v.toObject().value("metrics").toObject().contains(m))
          values.insert(v.toObject().value("metrics").toObject().value(m).toDouble());
      const bool exists = QFileInfo::exists(QDir(out).filePath(plotName(m)));
      QVERIFY2(exists == (values.size() > 1), qPrintable(m));
      if (!exists) continue;
      expectedPlots.append(plotName(m));
      const QImage image(QDir(out).filePath(plotName(m)));
      QVERIFY2(!image.isNull(), qPrintable(plotName(m)));
      QCOMPARE(image.size(), QSize(800, 500));
      // A drawn plot, not a blank canvas: lines, dots, axes and text in several colours.
      QSet<QRgb> colours;
      for (int y = 0; y < image.height(); y += 3)
        for (int x = 0; x < image.width(); x += 3) colours.insert(image.pixel(x, y));
      QVERIFY2(colours.size() > 20, qPrintable(QString::number(colours.size())));
    }
    QVERIFY(!expectedPlots.isEmpty());
    QStringList plots;
    for (const QJsonValue& v : summary.value("plots").toArray()) plots.append(v.toString());
    QStringList files = QDir(out).entryList({"plot-*.png"}, QDir::Files);
    plots.sort();
    files.sort();
    expectedPlots.sort();
    QCOMPARE(plots, expectedPlots);
    QCOMPARE(files, expectedPlots);
#else
    QVERIFY(QDir(out).entryList({"plot-*.png"}, QDir::Files).isEmpty());
#endif
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    testGraph_ = write(dir_, "graph.json", kTestGraph);
  }

  void aBadGridIsAUsageErrorBeforeAnythingRuns() {
    const QString out = dir_.filePath("never");
    const QList<QPair<QStringList, QStringList>> cases{
        {{"--grid", "a1.value=1,x"}, {"--grid a1.value=1,x: a1.value=x: expected a number, got \"x\""}},
        {{"--grid", "a1.repeat=1,0"}, {"--grid a1.repeat=1,0: a1.repeat=0:", "minimum 1"}},
        {{"--grid", "nope.value=1,2"}, {"--grid nope.value=1,2: nope.value=1: no node \"nope\""}},
        {{"--grid", "a1.nope=1,2"}, {"--grid a1.nope=1,2: a1.nope=1: a1 (TestAdd) has no param \"nope\""}},
        {{"--grid", "a1.value"}, {"--grid a1.value: expected NODE.PARAM=V1,V2,..."}},
        {{"--grid", "a1.value=1,2,1"}, {"--grid a1.value=1,2,1: the value 1 is given twice"}},
        {{"--grid", "a1.value=1", "--grid", "a1.value=2"}, {"--grid a1.value=2: a1.value is already swept"}},
        {{"--set", "a1.value=x", "--grid", "a1.repeat=1"}, {"--set a1.value=x"}},
        {{"--grid", "a1.value=1", "--schedule", "fast"}, {"--schedule"}},
        {{"--grid", "a1.value=1", "--cpu-devices", "0"}, {"--cpu-devices"}},
        {{}, {"sweep: give at least one --grid"}},
    };
    for (const auto& [extra, expected] : cases) {
      const Result r = gpunodes(QStringList{"sweep", testGraph_, "--out", out} + extra);
      const QString what = extra.join(' ') + "\n" + describe(r);
      QVERIFY2(r.exitCode == 2, qPrintable(what));
      for (const QString& e : expected) QVERIFY2(r.err.contains(e), qPrintable(e + "\n" + what));
      QVERIFY2(r.err.contains("usage: gpunodes"), qPrintable(what));
      QVERIFY2(!QFileInfo::exists(out), qPrintable(what));
    }
    EXPECT_EXIT(gpunodes({"sweep", "--help"}), 0);
    const Result help = gpunodes({"--help"});
    QVERIFY(help.out.contains("gpunodes sweep FILE --grid NODE.PARAM=V1,V2,..."));
  }

  void aGridRunsEveryPointAndRecordsTheFailingOnes() {
    const QString out = dir_.filePath("test-sweep");
    // A stale file of an earlier, bigger sweep must not read as part of this one.
    QVERIFY(QDir().mkpath(out));
    write(dir_, "test-sweep/point-0099.json", "{}");
    write(dir_, "test-sweep/plot-gone.png", "x");
    const Result r = gpunodes(
        {"sweep", testGraph_, "--grid", "c1.value=1,10,100", "--grid", "a2.fail=false,true", "--out", out});
    EXPECT_EXIT(r, 1);
    QVERIFY(!QFileInfo::exists(QDir(out).filePath("point-0099.json")));
    QVERIFY(!QFileInfo::exists(QDir(out).filePath("plot-gone.png")));
    QCOMPARE(QDir(out).entryList({"point-*.json"}, QDir::Files).size(), 6);

    const QJsonObject summary = readJson(QDir(out).filePath("summary.json"));
    QCOMPARE(summary.value("file").toString(), testGraph_);
    QCOMPARE(summary.value("graph").toString(), QStringLiteral("sweep test"));
    QVERIFY(!summary.value("ok").toBool());
    QVERIFY(!summary.value("cancelled").toBool());
    QCOMPARE(summary.value("points_ok").toInt(), 3);
    QCOMPARE(summary.value("points_failed").toInt(), 3);
    const QJsonArray grid = summary.value("grid").toArray();
    QCOMPARE(grid.size(), 2);
    QCOMPARE(grid[0].toObject().value("param").toString(), QStringLiteral("c1.value"));
    QCOMPARE(grid[0].toObject().value("values").toArray(), (QJsonArray{1, 10, 100}));
    QCOMPARE(grid[1].toObject().value("values").toArray(), (QJsonArray{false, true}));

    // The first --grid varies slowest.
    const QJsonArray points = summary.value("points").toArray();
    QCOMPARE(points.size(), 6);
    for (int i = 0; i < 6; ++i) {
      const QJsonObject p = points[i].toObject();
      const double c1 = QList<double>{1, 10, 100}[i / 2];
      const bool fail = i % 2 == 1;
      QCOMPARE(p.value("point").toInt(), i + 1);
      QCOMPARE(p.value("params").toObject(), (QJsonObject{{"c1.value", c1}, {"a2.fail", fail}}));
      QCOMPARE(p.value("ok").toBool(), !fail);
      QCOMPARE(p.value("status").toString(), fail ? QString("failed") : QString("ok"));
      if (fail)
        QVERIFY2(p.value("error").toString().startsWith("a2: "), qPrintable(p.value("error").toString()));
      const QJsonObject metrics = p.value("metrics").toObject();
      QCOMPARE(metrics.value("c1.value").toDouble(), c1);
      QCOMPARE(metrics.value("a1.value").toDouble(), c1 + 4 + 3);
      QCOMPARE(metrics.value("a2.value").toDouble(), (c1 + 4 + 3) * 10);
    }
    checkOutputs(out, summary, {"c1.value", "a2.fail"});
#ifdef GN_WITH_GUI
    // c2.value is 4 at every point: nothing to plot.
    QVERIFY(summary.value("plots").toArray().contains(QJsonValue("plot-a2.value.png")));
    QVERIFY(!QFileInfo::exists(QDir(out).filePath("plot-c2.value.png")));
#endif

#ifndef GN_WITH_GUI
    QVERIFY2(r.err.count("plots need the GUI build") == 1, qPrintable(describe(r)));
#endif
    QVERIFY2(r.out.contains("3 of 6 points ok"), qPrintable(describe(r)));
    QVERIFY2(r.err.contains("[point 2/6] c1.value=1, a2.fail=true: failed in"), qPrintable(describe(r)));
    QVERIFY2(r.out.contains("point 2: a2: "), qPrintable(describe(r)));

    // --quiet: nothing on either stream, the same files.
    const Result quiet = gpunodes({"sweep", testGraph_, "--grid", "c1.value=1,10", "--out", out, "--quiet"});
    EXPECT_EXIT(quiet, 0);
    QCOMPARE(quiet.out, QString());
    QCOMPARE(quiet.err, QString());
    QCOMPARE(QDir(out).entryList({"point-*.json"}, QDir::Files).size(), 2);
    checkOutputs(out, readJson(QDir(out).filePath("summary.json")), {"c1.value"});
  }

  void aPointTheGraphChecksRefuseFailsAlone() {
    // "forbidden" passes --set's checks of the value; the plugin's graph checks refuse it when the point
    // starts. That point fails like one whose node fails; the grid is not a usage error.
    const QString out = dir_.filePath("refused-sweep");
    const Result r = gpunodes({"sweep", testGraph_, "--grid", "a1.label=forbidden,fine", "--out", out});
    EXPECT_EXIT(r, 1);
    const QJsonArray points = readJson(QDir(out).filePath("summary.json")).value("points").toArray();
    QCOMPARE(points.size(), 2);
    QCOMPARE(points[0].toObject().value("status").toString(), QStringLiteral("failed"));
    QVERIFY2(points[0].toObject().value("error").toString().startsWith("a1: params.label: refused"),
             qPrintable(points[0].toObject().value("error").toString()));
    QCOMPARE(points[1].toObject().value("status").toString(), QStringLiteral("ok"));
    const QJsonObject report = readJson(QDir(out).filePath("point-0001.json"));
    QCOMPARE(report.value("nodes").toObject().value("a1").toObject().value("status").toString(),
             QStringLiteral("invalid"));
  }

  void theDefaultOutputDirIsNamedAfterTheGraph() {
    QTemporaryDir work;
    const Result r = gpunodes({"sweep", testGraph_, "--grid", "a1.mode=add,mul", "--quiet"}, work.path());
    EXPECT_EXIT(r, 0);
    const QString out = QDir(work.path()).filePath("sweep-graph");
    const QJsonObject summary = readJson(QDir(out).filePath("summary.json"));
    QVERIFY(summary.value("ok").toBool());
    QCOMPARE(summary.value("points").toArray().size(), 2);
    // A param that is not a number gets categorical ticks; a2.value differs: 90 against 180.
    checkOutputs(out, summary, {"a1.mode"});
  }

  void aTrainingSweep() {
#ifndef GN_NODES_PLUGIN
    QSKIP("the GPU node set is not built");
#else
    const QString graph = write(dir_, "train.json", kTrainGraph), out = dir_.filePath("train-sweep");
    const QString missing = dir_.filePath("no-such-dataset");
    // fashion-mnist from a directory that does not exist fails when the Dataset runs: those points fail,
    // the synthetic ones train.
    const Result r =
        gpunodes({"sweep", graph, "--grid", "train.lr=0.01,0.5", "--grid",
                  "data.name=synthetic,fashion-mnist", "--set", "data.path=" + missing, "--out", out});
    EXPECT_EXIT(r, 1);
    QCOMPARE(QDir(out).entryList({"point-*.json"}, QDir::Files).size(), 4);
    const QJsonObject summary = readJson(QDir(out).filePath("summary.json"));
    const QJsonArray points = summary.value("points").toArray();
    QCOMPARE(points.size(), 4);
    for (int i = 0; i < 4; ++i) {
      const QJsonObject p = points[i].toObject();
      const bool synthetic = i % 2 == 0;
      QCOMPARE(p.value("params").toObject(),
               (QJsonObject{{"train.lr", i < 2 ? 0.01 : 0.5},
                            {"data.name", synthetic ? "synthetic" : "fashion-mnist"}}));
      QCOMPARE(p.value("ok").toBool(), synthetic);
      const QJsonObject metrics = p.value("metrics").toObject();
      if (!synthetic) {
        QVERIFY2(
            p.value("error").toString().startsWith("data: ") && p.value("error").toString().contains(missing),
            qPrintable(p.value("error").toString()));
        continue;
      }
      // The results a sweep is for, named as documented.
      for (const char* m : {"eval.accuracy", "train.test_acc", "train.loss", "train.train_acc",
                            "train.images_per_second", "train.lr"})
        QVERIFY2(metrics.value(m).isDouble(), m);
      QCOMPARE(metrics.value("train.lr").toDouble(), i < 2 ? 0.01 : 0.5);
      const QJsonObject report = readJson(QDir(out).filePath(p.value("report").toString()));
      const QJsonObject nodes = report.value("nodes").toObject();
      QCOMPARE(metrics.value("eval.accuracy").toDouble(),
               nodes.value("eval").toObject().value("accuracy").toDouble());
      QCOMPARE(metrics.value("train.test_acc").toDouble(),
               nodes.value("train").toObject().value("test_acc").toDouble());
      QCOMPARE(metrics.value("train.loss").toDouble(),
               nodes.value("train").toObject().value("loss").toDouble());
    }
    checkOutputs(out, summary, {"train.lr", "data.name"});
#ifdef GN_WITH_GUI
    QVERIFY(QFileInfo::exists(QDir(out).filePath("plot-train.lr.png")));
#endif
#endif
  }

  void pointsShareTheRunCacheSoAnUnchangedDatasetLoadsOnce() {
#ifndef GN_NODES_PLUGIN
    QSKIP("the GPU node set is not built");
#else
    const QString graph = write(dir_, "cached.json", kTrainGraph), out = dir_.filePath("cached-sweep");
    const Result r = gpunodes({"sweep", graph, "--grid", "train.lr=0.01,0.5,0.1", "--out", out});
    EXPECT_EXIT(r, 0);
    const QJsonArray points = readJson(QDir(out).filePath("summary.json")).value("points").toArray();
    QCOMPARE(points.size(), 3);
    for (int i = 0; i < 3; ++i) {
      const QJsonObject nodes = readJson(QDir(out).filePath(points[i].toObject().value("report").toString()))
                                    .value("nodes")
                                    .toObject();
      // The grid changes the Train only: the device, the data and the model come from the first point.
      for (const char* id : {"cpu", "data", "net"}) {
        const QJsonObject n = nodes.value(id).toObject();
        QCOMPARE(n.value("status").toString(), QString("ok"));
        QVERIFY2(n.value("cached").toBool() == (i > 0), id);
      }
      const QJsonObject data = nodes.value("data").toObject();
      QCOMPARE(data.value("train_samples").toInt(), 200);  // what the load reported, reused with its outputs
      if (i > 0) QCOMPARE(data.value("wall_ms").toDouble(), 0.0);
      QVERIFY(!nodes.value("train").toObject().value("cached").toBool());
      QVERIFY(!nodes.value("eval").toObject().value("cached").toBool());
      QVERIFY(points[i].toObject().value("metrics").toObject().value("eval.accuracy").isDouble());
    }
#endif
  }

  void twoRanksUnderMpirunShareThePoints() {
#ifndef GN_MPIRUN
    QSKIP("built without MPI");
#else
    const QString out = dir_.filePath("mpi-sweep");
    const Result r = mpirun(2, {"sweep", testGraph_, "--grid", "c1.value=1,10,100", "--grid",
                                "a2.fail=false,true", "--out", out});
    QVERIFY2(r.exitCode == 1, qPrintable(describe(r)));
    const QJsonObject summary = readJson(QDir(out).filePath("summary.json"));
    QCOMPARE(summary.value("ranks").toInt(), 2);
    // Rank 0 ran the odd points, which pass; rank 1 the even ones, which fail: each wrote its own reports,
    // rank 0 the summary of them all.
    const QJsonArray points = summary.value("points").toArray();
    QCOMPARE(points.size(), 6);
    for (int i = 0; i < 6; ++i) {
      QCOMPARE(points[i].toObject().value("rank").toInt(), i % 2);
      QCOMPARE(points[i].toObject().value("ok").toBool(), i % 2 == 0);
    }
    checkOutputs(out, summary, {"c1.value", "a2.fail"});
    // Rank 0 speaks for the job; rank 1 prints only its errors, prefixed.
    QCOMPARE(r.out.count("3 of 6 points ok"), 1);
    QVERIFY2(r.err.contains("[rank 1] [point 2/6] c1.value=1, a2.fail=true: failed in"),
             qPrintable(describe(r)));
    QVERIFY2(!r.err.contains("[rank 1] [point 2/6] c1.value=1, a2.fail=true: started"),
             qPrintable(describe(r)));
    QVERIFY2(r.err.contains("[point 1/6] c1.value=1, a2.fail=false: ok in"), qPrintable(describe(r)));
#endif
  }

  void aRankThatIsDoneWaitsForTheOthersBeyondTheCommTimeout() {
#ifndef GN_MPIRUN
    QSKIP("built without MPI");
#else
    // Rank 0's points take no time, rank 1's 3 s each; a collective may wait 1 s. The ranks keep exchanging
    // while rank 1 works, so rank 0 waits 6 s without ever taking rank 1 for lost.
    const QString out = dir_.filePath("mpi-wait");
    const Result r = mpirun(2,
                            {"sweep", testGraph_, "--grid", "c1.value=1,2", "--grid", "a1.delay_ms=0,3000",
                             "--out", out, "--quiet"},
                            {{"GPUNODES_COMM_TIMEOUT", "1"}});
    EXPECT_EXIT(r, 0);
    const QJsonObject summary = readJson(QDir(out).filePath("summary.json"));
    QVERIFY(summary.value("ok").toBool());
    QCOMPARE(summary.value("points").toArray().at(3).toObject().value("rank").toInt(), 1);
    QVERIFY(summary.value("points").toArray().at(3).toObject().value("wall_ms").toDouble() >= 3000);
#endif
  }

  void ctrlCStopsTheSweepAndLeavesTheSummary() {
    const QString out = dir_.filePath("cancel-sweep");
    QProcess p;
    p.setProcessEnvironment(pluginEnvironment(QStringLiteral(GN_TEST_PLUGIN_DIR)));
    p.start(QStringLiteral(GN_GPUNODES), {"sweep", testGraph_, "--grid", "c1.value=1,2,3", "--grid",
                                          "a1.delay_ms=0,600000", "--out", out});
    QVERIFY(p.waitForStarted());
    QString err;
    QElapsedTimer timer;
    timer.start();
    while (!err.contains("[point 2/6] c1.value=1, a1.delay_ms=600000: started") && timer.elapsed() < 30000) {
      p.waitForReadyRead(100);
      err += QString::fromUtf8(p.readAllStandardError());
    }
    QVERIFY2(err.contains("[point 2/6]"), qPrintable(err));
    QTest::qWait(300);
    timer.restart();
    ::kill(pid_t(p.processId()), SIGINT);
    QVERIFY(p.waitForFinished(10000));
    QVERIFY2(timer.elapsed() < 3000 * kTimeScale, qPrintable(QString::number(timer.elapsed())));
    err += QString::fromUtf8(p.readAllStandardError());
    QCOMPARE(p.exitStatus(), QProcess::NormalExit);
    QVERIFY2(p.exitCode() == 130, qPrintable(QString::number(p.exitCode()) + "\n" + err));
    QVERIFY(err.contains("cancelling"));
    QVERIFY(QString::fromUtf8(p.readAllStandardOutput()).contains("cancelled after"));

    const QJsonObject summary = readJson(QDir(out).filePath("summary.json"));
    QVERIFY(summary.value("cancelled").toBool());
    const QJsonArray points = summary.value("points").toArray();
    QCOMPARE(points.size(), 6);
    QCOMPARE(points[0].toObject().value("status").toString(), QStringLiteral("ok"));
    QCOMPARE(points[1].toObject().value("status").toString(), QStringLiteral("cancelled"));
    for (int i = 2; i < 6; ++i) {
      QCOMPARE(points[i].toObject().value("status").toString(), QStringLiteral("not run"));
      QVERIFY(!points[i].toObject().value("ok").toBool());
    }
    QCOMPARE(QDir(out).entryList({"point-*.json"}, QDir::Files),
             (QStringList{"point-0001.json", "point-0002.json"}));
    QCOMPARE(readJson(QDir(out).filePath("point-0002.json")).value("cancelled").toBool(), true);
    QCOMPARE(csvLines(QDir(out).filePath("summary.csv")).size(), 7);
  }
};

QTEST_GUILESS_MAIN(SweepTest)
#include "test_sweep.moc"
