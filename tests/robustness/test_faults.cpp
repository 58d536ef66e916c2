// Faults in a run, with the real node set and the real binary: out of memory in the middle of a run, cancel
// while the host blocks in a copy, and exceptions out of node code (a test-only node set that throws what a
// careless plugin might: std exceptions, and values that are not std::exception at all).
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>
#include <QtTest>
#include <chrono>
#include <stdexcept>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/validation.h"
#include "robustness_util.h"

using namespace gn::core;
using namespace gn::robustness;
using namespace std::chrono_literals;

namespace {

// A node set made here: Thrower throws from execute, from validateParams or from its session's endNode, as
// its param says, something that may not be a std::exception.
class ThrowerSession : public RunSession {
 public:
  explicit ThrowerSession(bool throwAtEnd) : throwAtEnd_(throwAtEnd) {}
  void beginNode(const QString&) override {}
  void endNode(const QString&, std::function<void(const QString&)> onDone) override {
    if (throwAtEnd_) throw 7;
    onDone({});
  }
  void cancel() override {}
  void finish() override {}
  QList<TraceSpan> takeSpans() override { return {}; }
  QList<MemorySampleEvent> takeMemory() override { return {}; }
  QJsonArray devices() const override { return {}; }
  QJsonObject memorySummary() const override { return {}; }
  double peakGflops(const QString&) const override { return 0; }

 private:
  bool throwAtEnd_;
};

class Thrower : public NodeType {
 public:
  Thrower() {
    spec_.name = "Thrower";
    spec_.category = "Test";
    spec_.description = "Throws as asked.";
    spec_.inputs = {{.name = "in", .type = PortType::Scalar, .required = false, .doc = "ignored"}};
    spec_.outputs = {{.name = "out", .type = PortType::Scalar, .doc = "nothing useful"}};
    spec_.params = {{.name = "throw",
                     .type = ParamType::Enum,
                     .defaultValue = "none",
                     .enumValues = {"none", "std", "int", "string", "validate"},
                     .doc = "what to throw, and where"}};
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  QStringList validateParams(const QJsonObject& params) const override {
    if (params.value("throw").toString() == "validate") throw 42;
    return {};
  }
  void execute(NodeContext& ctx) const override {
    const QString what = ctx.params().value("throw").toString();
    if (what == "std") throw std::logic_error("Thrower: a std exception");
    if (what == "int") throw 42;
    if (what == "string") throw std::string("a thrown std::string");
    ctx.setOutput("out", nullptr);
  }

 private:
  NodeTypeSpec spec_;
};

class ThrowerSet : public NodeSetPlugin {
 public:
  bool throwAtEnd = false, throwInGraphCheck = false;
  QString setName() const override { return "throwers"; }
  QList<NodeTypePtr> nodeTypes() const override { return {std::make_shared<Thrower>()}; }
  std::unique_ptr<RunSession> createSession(const RunSettings&) override {
    return std::make_unique<ThrowerSession>(throwAtEnd);
  }
  void validateGraph(const GraphDocument&, const NodeTypeRegistry&, const RunSettings&,
                     ValidationReport&) const override {
    if (throwInGraphCheck) throw "a C string";
  }
};

GraphNode makeNode(const QString& id, const QString& type, const QJsonObject& params = {}) {
  GraphNode n;
  n.id = id;
  n.type = type;
  n.params = params;
  return n;
}

void wire(GraphDocument& doc, const QString& from, const QString& to) {
  GraphConnection c;
  c.from = *Endpoint::parse(from);
  c.to = *Endpoint::parse(to);
  doc.addConnection(c);
}

QProcessEnvironment realNodes() {
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.remove("GPUNODES_PLUGIN_PATH");
  env.insert("QT_QPA_PLATFORM", "offscreen");
  return env;
}

QJsonObject readJson(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? QJsonDocument::fromJson(f.readAll()).object() : QJsonObject();
}

double memoryOf(const QJsonObject& report, const QString& device, const char* field) {
  return report["memory"].toObject()[device].toObject()[field].toDouble(-1);
}

QString status(const QJsonObject& report, const QString& node) {
  return report["nodes"].toObject()[node].toObject()["status"].toString();
}

// A graph with a branch on cpu:1, which has 1 MiB (memory_limit): a and b fit, their product does not. The
// branch on cpu:0 is independent of it.
void outOfMemoryGraph(GraphDocument& doc, bool withTheProduct) {
  doc.setSettings(QJsonObject{{"cpu_devices", 2}, {"memory_limit", QJsonObject{{"cpu:1", 1 << 20}}}});
  doc.addNode(makeNode("small", "Device", {{"kind", "cpu"}, {"index", 1}}));
  doc.addNode(makeNode("a", "Tensor", {{"shape", QJsonArray{300, 300}}}));
  doc.addNode(makeNode("b", "Tensor", {{"shape", QJsonArray{300, 300}}}));
  wire(doc, "small.device", "a.device");
  wire(doc, "small.device", "b.device");
  if (withTheProduct) {
    doc.addNode(makeNode("mm_small", "MatMul"));
    wire(doc, "a.out", "mm_small.a");
    wire(doc, "b.out", "mm_small.b");
    doc.addNode(makeNode("after", "Inspect"));
    wire(doc, "mm_small.out", "after.in");
  }
  doc.addNode(makeNode("c", "Tensor", {{"shape", QJsonArray{300, 300}}}));
  doc.addNode(makeNode("mm_host", "MatMul", {{"repeat", 3}}));
  doc.addNode(makeNode("show", "Inspect", {{"max_values", 4}}));
  wire(doc, "c.out", "mm_host.a");
  wire(doc, "c.out", "mm_host.b");
  wire(doc, "mm_host.out", "show.in");
}

}  // namespace

class FaultsTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  NodeTypeRegistry real_;

  QString save(const QString& name, const GraphDocument& doc) {
    const QString path = dir_.filePath(name);
    QString error;
    if (!serializer::saveFile(path, doc, &error)) qFatal("%s", qPrintable(error));
    return path;
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    QVERIFY2(real_.loadPluginFile(GN_NODES_PLUGIN), qPrintable(real_.loadErrors().value(0).reason));
  }

  void outOfMemoryMidRun() {
    // Through the binary, as a batch script runs it: the report is written even though the run failed.
    GraphDocument graph, baseline;
    outOfMemoryGraph(graph, true);
    outOfMemoryGraph(baseline, false);
    const QString file = save("oom.json", graph), report = dir_.filePath("oom-report.json");
    const Run r = runProcess(GN_GPUNODES, {"run", file, "--report", report}, realNodes(), 60000 * kTimeScale);
    QVERIFY2(!r.crashed && r.exitCode == 1, qPrintable(r.describe()));
    QVERIFY2(r.err.contains("[mm_small] failed: Out of memory on cpu:1: tried to allocate 351.56 KiB"),
             qPrintable(r.describe()));
    QVERIFY2(r.err.contains("[after] skipped: input in (mm_small.out) failed"), qPrintable(r.describe()));
    const QJsonObject o = readJson(report);
    QVERIFY2(!o.isEmpty(), "no report");
    QCOMPARE(o["ok"].toBool(), false);
    QCOMPARE(status(o, "mm_small"), QString("failed"));
    QVERIFY(
        o["nodes"].toObject()["mm_small"].toObject()["error"].toString().contains("memory_limit 1.00 MiB"));
    QCOMPARE(status(o, "after"), QString("skipped"));
    // The independent branch completed, with its values.
    for (const char* id : {"a", "b", "c", "mm_host", "show"}) QCOMPARE(status(o, id), QString("ok"));
    QCOMPARE(o["nodes"].toObject()["show"].toObject()["inspect"].toArray().size(), 3);
    QVERIFY(memoryOf(o, "cpu:1", "ooms") >= 1);

    // Memory back to baseline: the failed product left nothing behind. What cpu:1 holds at the end is what
    // the same graph without the product holds (a and b), byte for byte.
    const QString baseFile = save("oom-baseline.json", baseline);
    const QString baseReport = dir_.filePath("oom-baseline-report.json");
    const Run base =
        runProcess(GN_GPUNODES, {"run", baseFile, "--report", baseReport}, realNodes(), 60000 * kTimeScale);
    QVERIFY2(base.exitCode == 0, qPrintable(base.describe()));
    const QJsonObject b = readJson(baseReport);
    for (const QString device : {"cpu", "cpu:1"})
      QCOMPARE(memoryOf(o, device, "current_bytes"), memoryOf(b, device, "current_bytes"));
    QVERIFY(memoryOf(o, "cpu:1", "current_bytes") > 0);
    QVERIFY(memoryOf(o, "cpu:1", "peak_bytes") <= 1 << 20);
  }

  void cancelDuringABlockingCopy() {
    // The Copy waits, on the executor thread, for 20,000 products queued before it; cancel comes meanwhile.
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 2}});
    doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{700, 700}}}));
    doc.addNode(makeNode("mm", "MatMul", {{"repeat", 20000}, {"keep", "last"}}));
    doc.addNode(makeNode("other", "Device", {{"kind", "cpu"}, {"index", 1}}));
    doc.addNode(makeNode("cp", "Copy", {{"non_blocking", false}}));
    doc.addNode(makeNode("show", "Inspect", {{"max_values", 1}}));
    wire(doc, "x.out", "mm.a");
    wire(doc, "x.out", "mm.b");
    wire(doc, "mm.out", "cp.in");
    wire(doc, "other.device", "cp.device");
    wire(doc, "cp.out", "show.in");
    Executor ex(real_);
    ValidationReport validation;
    QVERIFY2(ex.start(doc, RunSettings::fromGraph(doc.settings()), &validation),
             qPrintable(validation.errors().value(0).text()));
    bool copying = false;
    const auto deadline = std::chrono::steady_clock::now() + 30s * kTimeScale;
    while (!copying && ex.isRunning() && std::chrono::steady_clock::now() < deadline)
      for (const RunEvent& e : ex.events().waitAndDrain(20))
        copying = copying || (e.kind == RunEvent::Kind::NodeStarted && e.node == "cp");
    QVERIFY2(copying, "the copy never started");
    std::this_thread::sleep_for(300ms);
    QVERIFY2(ex.isRunning(), "the products finished before the cancel: make them longer");
    const auto t0 = std::chrono::steady_clock::now();
    ex.cancel();
    ex.wait();
    const auto took = std::chrono::steady_clock::now() - t0;
    QVERIFY2(took < 1s * kTimeScale,
             qPrintable(QStringLiteral("cancel took %1 ms")
                            .arg(std::chrono::duration<double, std::milli>(took).count())));
    const QJsonObject report = ex.report();
    QCOMPARE(report["cancelled"].toBool(), true);
    QVERIFY2(status(report, "cp") == "cancelled" || status(report, "cp") == "failed",
             qPrintable(status(report, "cp")));
    QVERIFY(status(report, "show") != "ok");
    // No buffer leaked: nothing the cancelled copy allocated on cpu:1 survives, and cpu:0 holds x and the one
    // product that keep=last reuses, not the 20,000 dropped ones.
    QCOMPARE(memoryOf(report, "cpu:1", "current_bytes"), 0.0);
    QCOMPARE(memoryOf(report, "cpu", "current_bytes"), 2.0 * 700 * 700 * 4);  // cpu:0 prints as "cpu"
  }

  void exceptionsOutOfNodeCodeBecomeThatNodesError() {
    ThrowerSet set;
    NodeTypeRegistry registry;
    registry.addPlugin(&set, "test-only");
    GraphDocument doc;
    for (const char* what : {"std", "int", "string", "none"})
      doc.addNode(makeNode(QString("t_") + what, "Thrower", {{"throw", what}}));
    doc.addNode(makeNode("after", "Thrower"));
    wire(doc, "t_int.out", "after.in");
    Executor ex(registry);
    QVERIFY(ex.start(doc, RunSettings{}));
    ex.wait();
    QJsonObject report = ex.report();
    QCOMPARE(status(report, "t_std"), QString("failed"));
    QCOMPARE(report["nodes"].toObject()["t_std"].toObject()["error"].toString(),
             QString("Thrower: a std exception"));
    QCOMPARE(status(report, "t_int"), QString("failed"));
    QVERIFY(
        report["nodes"].toObject()["t_int"].toObject()["error"].toString().contains("not a std::exception"));
    QCOMPARE(status(report, "t_string"), QString("failed"));
    QCOMPARE(status(report, "after"), QString("skipped"));
    QCOMPARE(status(report, "t_none"), QString("ok"));

    // From the session's endNode: that node's error too.
    set.throwAtEnd = true;
    GraphDocument one;
    one.addNode(makeNode("t", "Thrower"));
    QVERIFY(ex.start(one, RunSettings{}));
    ex.wait();
    QCOMPARE(status(ex.report(), "t"), QString("failed"));
    set.throwAtEnd = false;

    // From validation, the plugin's own checks included: an error in the report, not a terminate().
    GraphDocument bad;
    bad.addNode(makeNode("v", "Thrower", {{"throw", "validate"}}));
    ValidationReport v = validate(bad, registry);
    QVERIFY(!v.ok());
    QVERIFY2(v.errors().value(0).text().contains("v: params: checking params failed"),
             qPrintable(v.errors().value(0).text()));
    set.throwInGraphCheck = true;
    v = validate(one, registry);
    QVERIFY(!v.ok());
    QVERIFY2(v.errors().value(0).text().contains("throwers: graph check failed"),
             qPrintable(v.errors().value(0).text()));
    QVERIFY(!ex.start(one, RunSettings{}));
    set.throwInGraphCheck = false;

    // The process lives on and runs the next graph.
    QVERIFY(ex.start(one, RunSettings{}));
    ex.wait();
    QCOMPARE(ex.report()["ok"].toBool(), true);
  }

  void exceptionsThroughTheBinary() {
    // The test node set's TestAdd throws in execute: that node fails, its downstream is skipped, the other
    // branch completes, and the process exits 1 with a report, not with a signal.
    const QByteArray g = R"({"format": "gpunodes-graph", "version": 1, "nodes": [
      {"id": "c", "type": "TestConst", "params": {"value": 2}},
      {"id": "boom", "type": "TestAdd", "params": {"throw": true}},
      {"id": "down", "type": "TestAdd"},
      {"id": "fine", "type": "TestAdd", "params": {"value": 1}}],
      "connections": [{"from": "c.out", "to": "boom.a"}, {"from": "boom.out", "to": "down.a"},
                      {"from": "c.out", "to": "fine.a"}]})";
    const QString file = dir_.filePath("throws.json"), report = dir_.filePath("throws-report.json");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly) && f.write(g) == g.size());
    f.close();
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("GPUNODES_PLUGIN_PATH", GN_TEST_PLUGIN_DIR);
    const Run r = runProcess(GN_GPUNODES, {"run", file, "--report", report}, env, 60000 * kTimeScale);
    QVERIFY2(!r.crashed && r.exitCode == 1, qPrintable(r.describe()));
    QVERIFY2(r.err.contains("[boom] failed: TestAdd threw as asked"), qPrintable(r.describe()));
    const QJsonObject o = readJson(report);
    QCOMPARE(status(o, "boom"), QString("failed"));
    QCOMPARE(status(o, "down"), QString("skipped"));
    QCOMPARE(status(o, "fine"), QString("ok"));
    QCOMPARE(o["nodes"].toObject()["fine"].toObject()["value"].toDouble(), 3.0);
  }
};

QTEST_GUILESS_MAIN(FaultsTest)
#include "test_faults.moc"
