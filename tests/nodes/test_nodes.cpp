// The GPU node set on its own: the catalogue, checks before a run, the same-device rule, fallbacks, the run
// session (tags, completion, cancel, memory), out-of-memory, and the device table.
#include <QtTest>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "gpunodes/core/run_cache.h"
#include "nodes_test_util.h"

using namespace nodes_test;
using namespace std::chrono_literals;

namespace {

const QString kMismatch =
    "Expected all tensors to be on the same device, but found at least two devices, cpu:1 and cpu!";

int cudaCount() {
  int n = 0;
  for (const QJsonValue& d : plugin()->environment(RunSettings{})["devices"].toArray())
    n += d.toObject()["kind"].toString() == "cuda";
  return n;
}

QStringList messagesFor(const ValidationReport& report, const QString& node, Issue::Severity severity) {
  QStringList out;
  for (const Issue& i : report.forNode(node))
    if (i.severity == severity) out.append(i.field + ": " + i.message);
  return out;
}

// y on try_gpu(1) (cpu:1 without GPUs), x on the CPU, and add(y, x): the seed's X + Y that must fail.
void mismatchGraph(GraphDocument& doc) {
  doc.setSettings(QJsonObject{{"cpu_devices", 2}});
  doc.addNode(makeNode("dev1", "Device", {{"kind", "gpu"}, {"index", 1}}));
  doc.addNode(makeNode("y", "Tensor", {{"shape", QJsonArray{2, 3}}}));
  doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{2, 3}}, {"init", "ones"}}));
  doc.addNode(makeNode("add", "Elementwise", {{"op", "add"}}));
  wire(doc, "dev1.device", "y.device");
  wire(doc, "y.out", "add.a");
  wire(doc, "x.out", "add.b");
}

}  // namespace

class NodesTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QVERIFY2(plugin(), "the GPU node set did not load from " GN_NODES_PLUGIN);
    if (cudaCount() > 0) qInfo("a GPU is present: CPU-fallback expectations are skipped where they differ");
  }

  void catalogue_has_every_node_with_docs() {
    const QStringList names{
        "Device", "AllDevices", "Tensor", "Copy", "MatMul", "Elementwise", "Norm", "Synchronize", "Inspect",
        "Model", "Forward", "Parameters", "SaveParams", "LoadParams", "Dataset", "Train", "Evaluate", "Generate",
        "ExportONNX",
        // the Layers category
        "Input", "Conv2d", "BatchNorm2d", "BatchNorm1d", "ReLU", "Sigmoid", "Tanh", "GELU", "MaxPool2d",
        "AvgPool2d", "GlobalAvgPool2d", "Flatten", "Linear", "Dropout", "Add", "Concat", "Embedding", "OneHot",
        "RNN", "GRU", "LSTM", "Reshape", "Transpose", "LastStep", "FirstStep", "LayerNorm", "MultiheadAttention",
        "BatchMatMul", "Softmax", "Mul", "Scale", "PositionalEncoding", "PositionEmbedding", "ClassToken",
        "NadarayaWatson", "ValidLength", "Network"};
    QCOMPARE(plugin()->nodeTypes().size(), names.size());
    for (const QString& name : names) {
      NodeTypePtr t = registry().find(name);
      QVERIFY2(t, qPrintable(name));
      QVERIFY2(!t->spec().description.isEmpty(), qPrintable(name));
      QVERIFY2(!t->spec().category.isEmpty(), qPrintable(name));
      for (const ParamSpec& p : t->spec().params) {
        QVERIFY2(!p.doc.isEmpty(), qPrintable(name + "." + p.name + " has no doc string"));
        QVERIFY2(checkParam(p, p.defaultValue).isEmpty(),
                 qPrintable(name + "." + p.name + " default is invalid"));
        // Node code reads numbers without a fallback (p["lr"].toDouble()): params arrive filled with these
        // defaults, so each number needs a real one, or a missing param would read as 0.
        if (p.type == ParamType::Int || p.type == ParamType::Float)
          QVERIFY2(p.defaultValue.isDouble(), qPrintable(name + "." + p.name + " has no numeric default"));
      }
      for (const PortSpec& p : t->spec().inputs + t->spec().outputs)
        QVERIFY2(!p.doc.isEmpty(), qPrintable(name + "." + p.name + " has no doc string"));
    }
    QCOMPARE(registry().find("MatMul")->spec().param("keep")->enumValues, (QStringList{"all", "last"}));
    QCOMPARE(registry().find("Copy")->spec().param("mode")->enumValues, (QStringList{"copy", "to"}));
    for (const char* type : {"MatMul", "Train"})
      QCOMPARE(registry().find(type)->spec().param("precision")->enumValues,
               (QStringList{"fp32", "tf32", "bf16", "fp16"}));
    QCOMPARE(registry().find("Train")->spec().param("loss_scale")->enumValues,
             (QStringList{"auto", "dynamic", "off"}));
    QCOMPARE(registry().find("Model")->spec().param("arch")->enumValues,
             (QStringList{"linear", "mlp", "lenet", "resnet18"}));
    QCOMPARE(registry().find("Model")->spec().param("init")->enumValues,
             (QStringList{"normal", "xavier", "kaiming"}));
    QCOMPARE(registry().find("Model")->spec().param("init_std")->defaultValue.toDouble(), 0.01);
    QVERIFY(registry().find("Train")->spec().description.contains(
        "BatchNorm keeps per-replica batch statistics"));
  }

  void device_mismatch_is_known_before_the_run_with_the_runtime_text() {
    if (cudaCount() > 1) QSKIP("try_gpu(1) is a GPU here");
    GraphDocument doc;
    mismatchGraph(doc);
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QCOMPARE(messagesFor(report, "add", Issue::Severity::Error), QStringList{"inputs.b: " + kMismatch});
    RunResult r = runGraph(doc);
    QVERIFY(!r.started);
    QVERIFY2(r.node("add")["error"].toString().endsWith(kMismatch),
             qPrintable(r.node("add")["error"].toString()));
  }

  void device_mismatch_offers_a_copy_that_makes_the_graph_run() {
    if (cudaCount() > 1) QSKIP("try_gpu(1) is a GPU here");
    GraphDocument doc;
    mismatchGraph(doc);
    const QList<Issue> issues = validate(doc, registry(), settingsOf(doc)).forNode("add");
    QCOMPARE(issues.size(), 1);
    QVERIFY(issues[0].fix.has_value());
    const IssueFix fix = *issues[0].fix;
    // b (x, on the CPU) goes onto a's device (y's, cpu:1), wired from the Device node that put y there.
    QCOMPARE(fix.label, QString("Insert Copy node: b to cpu:1"));
    QCOMPARE(fix.nodeType, QString("Copy"));
    QCOMPARE(fix.input, (Endpoint{"add", "b"}));
    QCOMPARE(fix.alsoWired.size(), 1);
    QCOMPARE(fix.alsoWired[0].source, (Endpoint{"dev1", "device"}));
    // Applied as a host applies any fix, knowing nothing of Copy: the node on the wire, its other inputs
    // wired.
    GraphNode copy = makeNode("fix1", fix.nodeType, fix.params);
    doc.addNode(copy);
    GraphConnection old;
    for (const GraphConnection& c : doc.connectionsTo(fix.input.node))
      if (c.to.port == fix.input.port) old = c;
    doc.removeConnection(old);
    doc.addConnection({old.from, {copy.id, fix.throughInput}, {}});
    doc.addConnection({{copy.id, fix.throughOutput}, fix.input, {}});
    for (const IssueFix::Wire& w : fix.alsoWired) doc.addConnection({w.source, {copy.id, w.port}, {}});
    const ValidationReport after = validate(doc, registry(), settingsOf(doc));
    QVERIFY2(after.ok(), qPrintable(after.errors().isEmpty() ? QString() : after.errors()[0].text()));
    RunResult r = runGraph(doc);
    QVERIFY(r.started);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("; ")));
  }

  void device_mismatch_at_run_time_is_the_nodes_error_and_nothing_is_copied() {
    if (cudaCount() > 1) QSKIP("try_gpu(1) is a GPU here");
    Harness h(RunSettings{.cpuDevices = 2});
    auto dev1 = h.execute("dev1", "Device", {{"kind", "gpu"}, {"index", 1}}, {});
    auto y = h.execute("y", "Tensor", {{"shape", QJsonArray{2, 3}}}, {{"device", dev1->outputs["device"]}});
    auto x = h.execute("x", "Tensor", {{"shape", QJsonArray{2, 3}}}, {});
    QString thrown;
    auto add = h.execute("add", "Elementwise", {{"op", "add"}},
                         {{"a", y->outputs["out"]}, {"b", x->outputs["out"]}}, &thrown);
    QCOMPARE(thrown, kMismatch);
    QVERIFY(!add->outputs.contains("out"));
    QCOMPARE(h.waitDone("add"), QString());  // it enqueued nothing: no copy was made behind the user's back
    h.session().finish();
    int copies = 0;
    for (const TraceSpan& s : h.session().takeSpans()) copies += s.op.contains("copy");
    QCOMPARE(copies, 0);
  }

  void gpu_fallback_is_a_warning_and_without_fallback_an_error() {
    if (cudaCount() > 3) QSKIP("cuda:3 exists here");
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 2}});
    doc.addNode(makeNode("soft", "Device", {{"kind", "gpu"}, {"index", 3}, {"fallback", true}}));
    doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{2, 2}}}));
    wire(doc, "soft.device", "x.device");
    ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QVERIFY(report.ok());
    const QStringList warnings = messagesFor(report, "soft", Issue::Severity::Warning);
    QCOMPARE(warnings.size(), 1);
    QVERIFY2(warnings[0].contains("try_gpu(3) falls back to cpu:1"), qPrintable(warnings[0]));

    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("soft")["resolved"].toString(), QString("cpu:1"));
    QCOMPARE(r.node("soft")["fallback"].toBool(), true);
    bool warned = false;
    for (const RunEvent& e : r.events)
      warned |= e.kind == RunEvent::Kind::NodeWarning && e.node == "soft" && e.message.contains("falls back");
    QVERIFY(warned);
    QCOMPARE(r.node("soft")["warnings"].toArray().size(), 1);  // said once, not again by the node itself
    QCOMPARE(r.node("x")["device"].toString(), QString("cpu:1"));

    doc.setParam("soft", "fallback", false);
    report = validate(doc, registry(), settingsOf(doc));
    QVERIFY(!report.ok());
    const QStringList errors = messagesFor(report, "soft", Issue::Severity::Error);
    QCOMPARE(errors.size(), 1);
    QVERIFY2(errors[0].contains("cuda:3 is not present") && errors[0].contains("fallback is off"),
             qPrintable(errors[0]));
  }

  void tensor_values_are_read_as_people_write_them() {
    // Accepted: commas, spaces, tabs and newlines in any mix, signs, exponents, bare points.
    GraphDocument doc;
    const QString written = "+1,-2.5  3e2\t.5,\n-7.,  ,1E-1 ";
    doc.addNode(
        makeNode("ok", "Tensor", {{"shape", QJsonArray{6}}, {"init", "values"}, {"values", written}}));
    // Refused, each with the token it stopped at.
    const QList<QPair<QString, QString>> refused = {
        {"1, 2, x", "\"x\" is not a finite number"},     {"1, inf", "\"inf\" is not a finite number"},
        {"nan 2", "\"nan\" is not a finite number"},     {"1e999", "\"1e999\" is not a finite number"},
        {"+-1", "\"+-1\" is not a finite number"},       {"1;2", "\"1;2\" is not a finite number"},
        {"0x10", "\"0x10\" is not a finite number"},     {"1,+", "\"+\" is not a finite number"},
        {"1 2 3", "the shape [6] needs 6 values, not 3"}};
    for (int i = 0; i < refused.size(); ++i)
      doc.addNode(makeNode(QString("bad%1").arg(i), "Tensor",
                           {{"shape", QJsonArray{6}}, {"init", "values"}, {"values", refused[i].first}}));
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QVERIFY2(messagesFor(report, "ok", Issue::Severity::Error).isEmpty(),
             qPrintable(messagesFor(report, "ok", Issue::Severity::Error).join("\n")));
    for (int i = 0; i < refused.size(); ++i) {
      const QStringList errors = messagesFor(report, QString("bad%1").arg(i), Issue::Severity::Error);
      QVERIFY2(errors.size() == 1 && errors[0].contains(refused[i].second),
               qPrintable(refused[i].first + " -> " + errors.join(" | ")));
    }

    // The values arrive as written: compared with the C library's own reading of each token.
    Harness h(RunSettings{});
    auto t =
        h.execute("ok", "Tensor", {{"shape", QJsonArray{6}}, {"init", "values"}, {"values", written}}, {});
    auto shown = h.execute("shown", "Inspect", {{"max_values", 6}}, {{"in", t->outputs["out"]}});
    const QJsonArray got = shown->fields["inspect"].toArray()[0].toObject()["values"].toArray();
    const char* tokens[] = {"+1", "-2.5", "3e2", ".5", "-7.", "1E-1"};
    QCOMPARE(got.size(), 6);
    for (int i = 0; i < 6; ++i)
      QCOMPARE(static_cast<float>(got[i].toDouble()), static_cast<float>(std::strtod(tokens[i], nullptr)));
  }

  void problems_are_reported_per_node_all_at_once() {
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 2}, {"memory_limit", QJsonObject{{"cpu:7", 1024}}}});
    doc.addNode(makeNode("cpu5", "Device", {{"kind", "cpu"}, {"index", 5}}));
    doc.addNode(makeNode("a", "Tensor", {{"shape", QJsonArray{2, 3}}}));
    doc.addNode(makeNode("bad_mm", "MatMul"));  // [2, 3] x [2, 3]
    doc.addNode(makeNode("tf32", "MatMul", {{"precision", "tf32"}}));
    doc.addNode(makeNode("sq", "Tensor", {{"shape", QJsonArray{3, 3}}}));
    doc.addNode(
        makeNode("vals", "Tensor", {{"shape", QJsonArray{2, 2}}, {"init", "values"}, {"values", "1, 2, 3"}}));
    doc.addNode(makeNode("huge", "Tensor", {{"shape", QJsonArray{20000, 20000}}}));
    doc.addNode(makeNode("hoard", "MatMul", {{"repeat", 1000000}, {"keep", "all"}}));
    doc.addNode(makeNode("lonely_add", "Elementwise", {{"op", "add"}}));
    doc.addNode(makeNode("absurd", "MatMul", {{"repeat", 1e12}}));
    wire(doc, "a.out", "bad_mm.a");
    wire(doc, "a.out", "bad_mm.b");
    wire(doc, "sq.out", "tf32.a");
    wire(doc, "sq.out", "tf32.b");
    wire(doc, "huge.out", "hoard.a");
    wire(doc, "huge.out", "hoard.b");
    wire(doc, "sq.out", "lonely_add.a");
    wire(doc, "sq.out", "absurd.a");
    wire(doc, "sq.out", "absurd.b");
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    auto has = [&](const QString& node, const QString& text) {
      for (const QString& m : messagesFor(report, node, Issue::Severity::Error))
        if (m.contains(text)) return true;
      return false;
    };
    QVERIFY(has("cpu5", "cpu:5 does not exist"));
    QVERIFY(has("bad_mm", "cannot be multiplied (3 != 2)"));
    if (cudaCount() == 0) QVERIFY(has("tf32", "params.precision: tf32 needs a CUDA device"));
    QVERIFY(has("vals", "needs 4 values, not 3"));
    QVERIFY(has("hoard", "params.repeat: keep=all holds 1000000 x Tensor[20000, 20000]"));
    QVERIFY(has("lonely_add", "inputs.b: op add needs input b"));
    QVERIFY(has("absurd", "params.repeat"));
    bool settingsError = false;
    for (const Issue& i : report.errors()) settingsError |= i.field == "settings.memory_limit.cpu:7";
    QVERIFY(settingsError);
  }

  void a_chain_of_100000_nodes_and_a_cycle_are_checked_without_recursion() {
    QList<GraphNode> nodes{makeNode("x", "Tensor", {{"shape", QJsonArray{2, 2}}})};
    QList<GraphConnection> connections;
    const int n = 100000;
    for (int i = 0; i < n; ++i) {
      nodes.append(makeNode(QString("r%1").arg(i), "Elementwise", {{"op", "relu"}}));
      GraphConnection c;
      c.from = {i == 0 ? QString("x") : QString("r%1").arg(i - 1), "out"};
      c.to = {QString("r%1").arg(i), "a"};
      connections.append(c);
    }
    // Two adds that feed each other: a cycle (the host reports it), whose values stay unknown here.
    nodes.append(makeNode("loop_a", "Elementwise", {{"op", "add"}}));
    nodes.append(makeNode("loop_b", "Elementwise", {{"op", "add"}}));
    for (auto [from, to] : {std::pair{"loop_a.out", "loop_b.a"},
                            {"loop_b.out", "loop_a.a"},
                            {"x.out", "loop_a.b"},
                            {"x.out", "loop_b.b"}}) {
      GraphConnection c;
      c.from = *Endpoint::parse(from);
      c.to = *Endpoint::parse(to);
      connections.append(c);
    }
    GraphDocument doc;
    doc.setContents(nodes, connections);
    ValidationReport report;
    plugin()->validateGraph(doc, registry(), RunSettings{}, report);
    QVERIFY2(report.ok(), report.errors().isEmpty() ? "" : qPrintable(report.errors()[0].text()));
  }

  void absurd_sizes_fail_before_anything_is_allocated() {
    GraphDocument doc;
    // 2^31-1 cubed elements: the element count overflows 64 bits.
    doc.addNode(makeNode("t", "Tensor", {{"shape", QJsonArray{2147483647.0, 2147483647.0, 2147483647.0}}}));
    ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QVERIFY(!report.ok());
    QVERIFY(!report.forNode("t").isEmpty());

    // Fits the 64-bit count but not the machine: refused at run time, before the allocator is asked.
    Harness h(RunSettings{});
    QString thrown;
    auto t = h.execute("t", "Tensor", {{"shape", QJsonArray{1 << 20, 1 << 20}}, {"count", 4}}, {}, &thrown);
    QVERIFY2(thrown.contains("needs 4 x") && thrown.contains("free"), qPrintable(thrown));
    QCOMPARE(h.session().memorySummary()["cpu"].toObject()["allocations"].toDouble(), 0.0);
  }

  void every_op_is_tagged_and_completion_comes_after_the_work() {
    Harness h(RunSettings{});
    auto x = h.execute("x", "Tensor", {{"shape", QJsonArray{200, 200}}}, {});
    auto mm = h.execute("mm", "MatMul", {{"repeat", 20}, {"keep", "all"}},
                        {{"a", x->outputs["out"]}, {"b", x->outputs["out"]}});
    QCOMPARE(h.waitDone("mm"), QString());
    // onDone came after every product was computed: all 20 matmul spans exist by then, with no wait_all.
    const QList<TraceSpan> spans = h.session().takeSpans();
    int matmuls = 0;
    for (const TraceSpan& s : spans) {
      QVERIFY2(s.node == "x" || s.node == "mm",
               qPrintable("untagged or mistagged span: " + s.op + " " + s.node));
      matmuls += s.op == "matmul" && s.node == "mm";
      QVERIFY(s.endUs >= s.startUs);
      QCOMPARE(s.device, QString("cpu"));
    }
    QCOMPARE(matmuls, 20);
    h.session().finish();
    QVERIFY(h.session().takeSpans().isEmpty());  // the cursor moved on
    QVERIFY(!h.session().takeMemory().isEmpty());
  }

  void matmul_keep_last_holds_one_result() {
    Harness h(RunSettings{});
    auto x = h.execute("x", "Tensor", {{"shape", QJsonArray{64, 64}}}, {});
    auto mm = h.execute("mm", "MatMul", {{"repeat", 30}, {"keep", "last"}},
                        {{"a", x->outputs["out"]}, {"b", x->outputs["out"]}});
    QCOMPARE(h.waitDone("mm"), QString());
    QCOMPARE(mm->outputs["out"]->summary(), QString("1 x Tensor[64, 64] float32 on cpu"));
    QCOMPARE(mm->fields["products"].toDouble(), 30.0);
    const QJsonObject mem = h.session().memorySummary()["cpu"].toObject();
    QVERIFY2(mem["peak_bytes"].toDouble() <= 2 * 64 * 64 * 4 + 1024,
             "keep=last held more than x and one result");
    auto all =
        h.execute("all", "MatMul", {{"repeat", 30}}, {{"a", x->outputs["out"]}, {"b", x->outputs["out"]}});
    QCOMPARE(all->outputs["out"]->summary(), QString("30 x Tensor[64, 64] float32 on cpu"));
  }

  void cancel_in_a_long_matmul_returns_within_a_second_and_frees_everything() {
    Harness h(RunSettings{});
    {
      auto x = h.execute("x", "Tensor", {{"shape", QJsonArray{1000, 1000}}}, {});
      auto mm = h.execute("mm", "MatMul", {{"repeat", 20000}, {"keep", "last"}},
                          {{"a", x->outputs["out"]}, {"b", x->outputs["out"]}});
      std::this_thread::sleep_for(300ms);
      const auto t0 = std::chrono::steady_clock::now();
      h.session().cancel();
      QCOMPARE(h.waitDone("mm"), QString("cancelled"));
      h.session().finish();
      QVERIFY2(std::chrono::steady_clock::now() - t0 < 1s, "cancel took longer than a second");
    }  // the node contexts, and with them every tensor, are gone
    const QJsonObject mem = h.session().memorySummary()["cpu"].toObject();
    QCOMPARE(mem["current_bytes"].toDouble(), 0.0);
    QVERIFY(mem["peak_bytes"].toDouble() > 0);
  }

  void cancel_through_the_executor() {
    GraphDocument doc;
    doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{1000, 1000}}}));
    doc.addNode(makeNode("mm", "MatMul", {{"repeat", 20000}, {"keep", "last"}}));
    doc.addNode(makeNode("show", "Inspect"));
    wire(doc, "x.out", "mm.a");
    wire(doc, "x.out", "mm.b");
    wire(doc, "mm.out", "show.in");
    std::chrono::steady_clock::duration took{};
    RunResult r = runGraph(doc, std::nullopt, [&](Executor& ex) {
      std::this_thread::sleep_for(400ms);
      const auto t0 = std::chrono::steady_clock::now();
      ex.cancel();
      ex.wait();
      took = std::chrono::steady_clock::now() - t0;
    });
    QVERIFY(r.started);
    QVERIFY2(took < 1s, "the run took longer than a second to stop");
    QCOMPARE(r.report["cancelled"].toBool(), true);
    QCOMPARE(r.report["ok"].toBool(), false);
    QVERIFY(r.node("mm")["status"].toString() == "cancelled");
    QVERIFY(r.node("show")["status"].toString() != "ok");
  }

  void out_of_memory_fails_the_node_and_independent_branches_complete() {
    GraphDocument doc;
    // 1 MiB on cpu:1: each tensor fits, the product's result does not.
    doc.setSettings(QJsonObject{{"cpu_devices", 2}, {"memory_limit", QJsonObject{{"cpu:1", 1 << 20}}}});
    doc.addNode(makeNode("small", "Device", {{"kind", "cpu"}, {"index", 1}}));
    doc.addNode(makeNode("a", "Tensor", {{"shape", QJsonArray{300, 300}}}));
    doc.addNode(makeNode("b", "Tensor", {{"shape", QJsonArray{300, 300}}}));
    doc.addNode(makeNode("mm_small", "MatMul"));
    doc.addNode(makeNode("c", "Tensor", {{"shape", QJsonArray{300, 300}}}));
    doc.addNode(makeNode("mm_host", "MatMul"));
    wire(doc, "small.device", "a.device");
    wire(doc, "small.device", "b.device");
    wire(doc, "a.out", "mm_small.a");
    wire(doc, "b.out", "mm_small.b");
    wire(doc, "c.out", "mm_host.a");
    wire(doc, "c.out", "mm_host.b");
    RunResult r = runGraph(doc);
    QVERIFY2(r.started, qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("mm_small")["status"].toString(), QString("failed"));
    QVERIFY2(r.node("mm_small")["error"].toString().startsWith("Out of memory on cpu:1"),
             qPrintable(r.node("mm_small")["error"].toString()));
    QCOMPARE(r.node("mm_host")["status"].toString(), QString("ok"));
    QVERIFY(r.report["memory"].toObject()["cpu:1"].toObject()["ooms"].toDouble() >= 1);
  }

  void synchronize_is_a_visible_host_wait() {
    Harness h(RunSettings{.cpuDevices = 2});
    auto dev1 = h.execute("dev1", "Device", {{"kind", "cpu"}, {"index", 1}}, {});
    auto x = h.execute("x", "Tensor", {{"shape", QJsonArray{300, 300}}}, {});
    auto y =
        h.execute("y", "Tensor", {{"shape", QJsonArray{300, 300}}}, {{"device", dev1->outputs["device"]}});
    auto mx =
        h.execute("mx", "MatMul", {{"repeat", 5}}, {{"a", x->outputs["out"]}, {"b", x->outputs["out"]}});
    auto my =
        h.execute("my", "MatMul", {{"repeat", 5}}, {{"a", y->outputs["out"]}, {"b", y->outputs["out"]}});
    auto sync =
        h.execute("sync", "Synchronize", {}, {{"in", mx->outputs["out"]}, {"also", my->outputs["out"]}});
    QVERIFY(sync->outputs["out"] == mx->outputs["out"]);  // passed on, not copied
    // Returning from execute means both branches are computed.
    QList<TraceSpan> spans = h.session().takeSpans();
    int matmuls = 0, waits = 0;
    double lastMatmulEnd = 0, waitEnd = 0;
    for (const TraceSpan& s : spans) {
      if (s.op == "matmul") ++matmuls, lastMatmulEnd = std::max(lastMatmulEnd, s.endUs);
      if (s.node == "sync") {
        QCOMPARE(s.op, QString("synchronize"));
        QVERIFY(s.hostBlocking);
        ++waits;
        waitEnd = std::max(waitEnd, s.endUs);
      }
    }
    QCOMPARE(matmuls, 10);
    QCOMPARE(waits, 2);  // one per device waited for
    QVERIFY(waitEnd >= lastMatmulEnd);
    QVERIFY(sync->fields.contains("waited_ms") && sync->fields.contains("at_ms"));
  }

  void norm_each_step_reads_once_per_step() {
    Harness h(RunSettings{});
    auto x = h.execute("x", "Tensor", {{"shape", QJsonArray{10, 10}}, {"init", "ones"}}, {});
    auto mm =
        h.execute("mm", "MatMul", {{"repeat", 7}}, {{"a", x->outputs["out"]}, {"b", x->outputs["out"]}});
    auto each = h.execute("each", "Norm", {{"log", "each_step"}}, {{"in", mm->outputs["out"]}});
    auto end = h.execute("end", "Norm", {{"log", "at_end"}, {"op", "sum"}}, {{"in", mm->outputs["out"]}});
    int eachReads = 0, endReads = 0;
    for (const TraceSpan& s : h.session().takeSpans()) {
      if (!s.hostBlocking) continue;
      eachReads += s.node == "each";
      endReads += s.node == "end";
    }
    QCOMPARE(eachReads, 7);
    QCOMPARE(endReads, 1);
    // ones(10,10)^2 is all 10s: Frobenius norm 100, sum 1000.
    QCOMPARE(each->fields["values"].toArray().size(), 7);
    for (const QJsonValue& v : each->fields["values"].toArray()) QCOMPARE(v.toDouble(), 100.0);
    for (const QJsonValue& v : end->fields["values"].toArray()) QCOMPARE(v.toDouble(), 1000.0);
    QCOMPARE(end->outputs["out"]->summary(), QString("1 x Tensor[7] float32 on cpu"));
    QCOMPARE(each->outputs["out"]->summary(), QString("7 x Tensor[] float32 on cpu"));
  }

  void tensor_inits_and_batches() {
    Harness h(RunSettings{.cpuDevices = 2});
    auto all = h.execute("all", "AllDevices", {}, {});
    auto ar = h.execute("ar", "Tensor",
                        {{"shape", QJsonArray{2, 3}}, {"init", "arange"}, {"start", 1}, {"step", 2}},
                        {{"device", all->outputs["devices"]}});
    auto show = h.execute("show", "Inspect", {}, {{"in", ar->outputs["out"]}});
    const QJsonArray entries = show->fields["inspect"].toArray();
    QCOMPARE(entries.size(), cudaCount() > 0 ? cudaCount() : 2);
    for (const QJsonValue& e : entries) {
      QCOMPARE(e.toObject()["shape"].toArray(), (QJsonArray{2, 3}));
      QCOMPARE(e.toObject()["dtype"].toString(), QString("float32"));
      QCOMPARE(e.toObject()["values"].toArray(), (QJsonArray{1, 3, 5, 7, 9, 11}));
    }
    auto vals = h.execute(
        "vals", "Tensor",
        {{"shape", QJsonArray{2, 2}}, {"init", "values"}, {"values", "1 2, 3.5 -4"}, {"count", 3}}, {});
    auto seen = h.execute("seen", "Inspect", {{"max_values", 3}}, {{"in", vals->outputs["out"]}});
    QCOMPARE(seen->fields["inspect"].toArray().size(), 3);
    QCOMPARE(seen->fields["inspect"].toArray()[2].toObject()["values"].toArray(), (QJsonArray{1, 2, 3.5}));
    // Element i of a random batch uses seed + i: elements differ, and the same seed repeats on another
    // device.
    auto r = h.execute("r", "Tensor", {{"shape", QJsonArray{4}}, {"count", 2}, {"seed", 5}}, {});
    auto r1 = h.execute("r1", "Tensor", {{"shape", QJsonArray{4}}, {"seed", 6}},
                        {{"device", all->outputs["devices"]}});
    auto rs = h.execute("rs", "Inspect", {}, {{"in", r->outputs["out"]}});
    auto r1s = h.execute("r1s", "Inspect", {}, {{"in", r1->outputs["out"]}});
    const QJsonArray e = rs->fields["inspect"].toArray(), e1 = r1s->fields["inspect"].toArray();
    QVERIFY(e[0].toObject()["values"] != e[1].toObject()["values"]);
    QCOMPARE(e[1].toObject()["values"], e1[e1.size() - 1].toObject()["values"]);
  }

  void inspect_samples_a_2d_tensor_for_its_heatmap() {
    Harness h(RunSettings{});
    // Small: every row and column. Large: 16 evenly spaced of each, floor(i * n / 16), the first included.
    auto small = h.execute("small", "Tensor",
                           {{"shape", QJsonArray{2, 3}}, {"init", "arange"}, {"start", 1}, {"step", 2}}, {});
    auto big = h.execute("big", "Tensor", {{"shape", QJsonArray{100, 37}}, {"init", "arange"}}, {});
    auto line = h.execute("line", "Tensor", {{"shape", QJsonArray{50}}, {"init", "arange"}}, {});
    auto showSmall = h.execute("ss", "Inspect", {}, {{"in", small->outputs["out"]}});
    const QJsonObject sg = showSmall->fields["inspect"].toArray()[0].toObject()["heatmap"].toObject();
    QCOMPARE(sg["rows"].toArray(), (QJsonArray{0, 1}));
    QCOMPARE(sg["cols"].toArray(), (QJsonArray{0, 1, 2}));
    QCOMPARE(sg["values"].toArray(), (QJsonArray{1, 3, 5, 7, 9, 11}));
    auto showBig = h.execute("sb", "Inspect", {{"max_values", 2}}, {{"in", big->outputs["out"]}});
    const QJsonObject bg = showBig->fields["inspect"].toArray()[0].toObject()["heatmap"].toObject();
    const QJsonArray rows = bg["rows"].toArray(), cols = bg["cols"].toArray(),
                     values = bg["values"].toArray();
    QCOMPARE(rows.size(), 16);
    QCOMPARE(cols.size(), 16);
    QCOMPARE(values.size(), 256);
    for (int i = 0; i < 16; ++i) {
      QCOMPARE(rows[i].toInt(), i * 100 / 16);
      QCOMPARE(cols[i].toInt(), i * 37 / 16);
    }
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        QCOMPARE(values[i * 16 + j].toDouble(), double((i * 100 / 16) * 37 + j * 37 / 16));
    // A 1-d tensor has no heatmap, and max_values 0 reads nothing at all.
    auto showLine = h.execute("sl", "Inspect", {}, {{"in", line->outputs["out"]}});
    QVERIFY(!showLine->fields["inspect"].toArray()[0].toObject().contains("heatmap"));
    auto showNone = h.execute("sn", "Inspect", {{"max_values", 0}}, {{"in", big->outputs["out"]}});
    QVERIFY(!showNone->fields["inspect"].toArray()[0].toObject().contains("heatmap"));
  }

  void environment_is_a_device_table_with_try_gpu() {
    RunSettings s;
    s.cpuDevices = 2;
    const QJsonObject env = plugin()->environment(s);
    const QJsonArray devices = env["devices"].toArray();
    QCOMPARE(devices.size(), cudaCount() + 2);
    for (const QJsonValue& d : devices) {
      const QJsonObject o = d.toObject();
      QVERIFY(!o["name"].toString().isEmpty());
      QVERIFY(o["memory_total"].toDouble() > 0);
      QVERIFY(o["peak_gflops"].toDouble() > 0);
      QVERIFY(!o["peak_source"].toString().isEmpty());
      QVERIFY(o["kind"].toString() == "cuda" ? o.contains("compute_capability") : o["cores"].toInt() >= 1);
    }
    const QString table = env["table"].toString();
    QVERIFY2(table.contains("try_gpu(0) = ") && table.contains("try_gpu(10) = ") &&
                 table.contains("try_all_gpus() = ["),
             qPrintable(table));
    QVERIFY(table.contains("cpu:1"));
    QVERIFY(table.contains("peak GFLOP/s"));
    if (cudaCount() == 0) {
      QCOMPARE(env["try_gpu(10)"].toString(), QString("cpu"));
      QCOMPARE(env["try_all_gpus()"].toArray(), (QJsonArray{"cpu", "cpu:1"}));
      QVERIFY(table.contains("try_gpu(10) = cpu (fallback)"));
    }
  }

  void bad_settings_are_reported_and_refused() {
    GraphDocument doc;
    doc.setSettings(
        QJsonObject{{"memory_limit", QJsonObject{{"gpu-ish", 5}, {"cpu", -3}}}, {"use_cuda", "yes"}});
    doc.addNode(makeNode("x", "Tensor"));
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QStringList fields;
    for (const Issue& i : report.errors()) fields.append(i.field);
    QVERIFY(fields.contains("settings.memory_limit.gpu-ish"));
    QVERIFY(fields.contains("settings.memory_limit.cpu"));
    QVERIFY(fields.contains("settings.use_cuda"));
    QVERIFY_THROWS_EXCEPTION(std::exception, plugin()->createSession(settingsOf(doc)));
  }

  // The run cache across runs of the GPU node set: a cached tensor feeds the next run's MatMul on the same
  // runtime (the plugin lends it again while the devices' settings stay the same), on a timeline that starts
  // with that run; other devices' settings run everything again.
  void cached_values_feed_the_next_run_on_the_same_runtime() {
    GraphDocument doc;
    doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{4, 4}}, {"init", "ones"}}));
    doc.addNode(makeNode("mm", "MatMul"));
    wire(doc, "x.out", "mm.a");
    wire(doc, "x.out", "mm.b");
    addInspect(doc, "show", "mm.out");
    RunCache cache;
    auto run = [&](const RunSettings& settings) { return runGraph(doc, settings, {}, {.cache = &cache}); };
    const RunResult first = run(settingsOf(doc));
    QVERIFY2(first.failures().isEmpty(), qPrintable(first.failures().join("\n")));
    QVERIFY(!first.node("x")["cached"].toBool());
    QTest::qWait(300);  // so that a timeline not restarted per run would show it
    const RunResult second = run(settingsOf(doc));
    QVERIFY2(second.failures().isEmpty(), qPrintable(second.failures().join("\n")));
    QVERIFY(second.node("x")["cached"].toBool());
    QVERIFY(!second.node("mm")["cached"].toBool());  // a measurement: it always runs
    QVERIFY(second.node("mm")["calls"].toInt() > 0);
    // The same product as the run that made the tensor: the cached ones are what they were.
    QCOMPARE(first.inspected("show").size(), size_t(16));
    QCOMPARE(second.inspected("show"), first.inspected("show"));
    QVERIFY(!second.spans.isEmpty());
    for (const TraceSpan& span : second.spans) {
      QVERIFY2(span.node != "x", "a cached node has no span");
      QVERIFY2(span.startUs >= 0 && span.startUs < 250000, qPrintable(QString::number(span.startUs)));
    }
    RunSettings two = settingsOf(doc);
    two.cpuDevices = 2;
    const RunResult third = run(two);
    QVERIFY2(third.failures().isEmpty(), qPrintable(third.failures().join("\n")));
    QVERIFY(!third.node("x")["cached"].toBool());
  }

  // A runtime that serves several runs reports each run's own peak: 8 kept 256x256 products in one run, then
  // one, on the same runtime with the input cached.
  void each_run_reports_its_own_peak_memory() {
    GraphDocument doc;
    doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{256, 256}}, {"init", "ones"}}));
    doc.addNode(makeNode("mm", "MatMul", {{"repeat", 8}, {"keep", "all"}}));
    wire(doc, "x.out", "mm.a");
    wire(doc, "x.out", "mm.b");
    RunCache cache;
    auto peak = [&] {
      const RunResult r = runGraph(doc, std::nullopt, {}, {.cache = &cache});
      return r.report["memory"].toObject()["cpu"].toObject()["peak_bytes"].toDouble();
    };
    const double product = 256.0 * 256 * 4;
    const double eight = peak();
    QVERIFY2(eight >= 8 * product, qPrintable(QString::number(eight)));
    doc.setParam("mm", "repeat", 1);
    const double one = peak();
    // The cached input and one product; not the earlier run's eight.
    QVERIFY2(one >= 2 * product && one < 4 * product, qPrintable(QString::number(one)));
  }
};

QTEST_GUILESS_MAIN(NodesTest)
#include "test_nodes.moc"
