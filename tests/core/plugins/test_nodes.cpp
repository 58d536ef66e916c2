// A node set for tests only: TestConst and TestAdd on Scalar ports, with a session that runs each node's work
// on its own worker thread, records a trace span per job, and reports completion from that thread, the way
// a real runtime does. Params make a node sleep, throw in execute, or fail in its work, so the executor's
// paths can be driven from tests and from the CLI.
#include <QFile>
#include <QJsonArray>
#include <QObject>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/validation.h"

using namespace gn::core;

namespace {

class ScalarValue : public PortValue {
 public:
  explicit ScalarValue(double v, qint64 size = 0) : value(v), size(size) {}
  QString summary() const override { return QStringLiteral("Scalar %1").arg(value); }
  qint64 bytes() const override { return size; }
  double value;
  qint64 size;  // what it claims to hold, for the run cache's bound
};

double scalarOf(const PortValuePtr& p) {
  auto s = std::dynamic_pointer_cast<const ScalarValue>(p);
  return s ? s->value : 0.0;
}

const QString kDevice = QStringLiteral("test:0");

class TestSession : public RunSession {
 public:
  explicit TestSession(const RunSettings& settings) : settings_(settings), worker_([this] { loop(); }) {}
  ~TestSession() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  struct Job {
    QString node;
    int sleepMs = 0;
    bool fail = false;
    // What the work says when a cancel cuts it short; a runtime's own words need not name the cancel.
    QString cancelledText = QStringLiteral("cancelled");
    qint64 bytes = 0;
    double flops = 0;
    std::function<void(const QString&)> done;  // set on the end-of-node marker
  };

  void enqueue(Job job) {
    job.node = current_;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

  void beginNode(const QString& nodeId) override { current_ = nodeId; }
  void endNode(const QString& nodeId, std::function<void(const QString&)> onDone) override {
    Job marker;
    marker.node = nodeId;
    marker.done = std::move(onDone);
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(marker));
    }
    cv_.notify_all();
  }
  void cancel() override {
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
    }
    cv_.notify_all();
  }
  void finish() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }
  QList<TraceSpan> takeSpans() override {
    std::lock_guard lock(mutex_);
    return std::exchange(spans_, {});
  }
  QList<MemorySampleEvent> takeMemory() override {
    std::lock_guard lock(mutex_);
    return std::exchange(memory_, {});
  }
  QJsonArray devices() const override {
    return QJsonArray{QJsonObject{{"name", kDevice}, {"kind", "test"}, {"schedule", settings_.schedule}}};
  }
  QJsonObject memorySummary() const override {
    std::lock_guard lock(mutex_);
    return QJsonObject{{kDevice, QJsonObject{{"peak_bytes", peak_}, {"current_bytes", 0}}}};
  }
  double peakGflops(const QString& device) const override { return device == kDevice ? 100.0 : 0.0; }

 private:
  double nowUs() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
  }

  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      Job job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      if (job.done) {
        // The end of a node: everything it enqueued ran before this marker.
        const QString error = errors_.value(job.node);
        lock.unlock();
        job.done(error);
        lock.lock();
      } else if (cancelled_) {
        errors_.insert(job.node, job.cancelledText);
      } else {
        const double start = nowUs();
        // Sleeps in a cancellable wait, so cancel() ends a long job at once.
        cv_.wait_for(lock, std::chrono::milliseconds(job.sleepMs), [this] { return cancelled_; });
        if (cancelled_) {
          errors_.insert(job.node, job.cancelledText);
        } else if (job.fail && !errors_.contains(job.node)) {
          errors_.insert(job.node, QStringLiteral("TestAdd work failed as asked"));
        }
        spans_.append(TraceSpan{.node = job.node,
                                .op = QStringLiteral("add"),
                                .device = kDevice,
                                .stream = QStringLiteral("compute"),
                                .startUs = start,
                                .endUs = nowUs(),
                                .bytes = job.bytes,
                                .flops = job.flops});
        memory_.append(MemorySampleEvent{
            .device = kDevice, .tUs = nowUs(), .allocated = job.bytes, .reserved = job.bytes});
        peak_ = std::max(peak_, job.bytes);
      }
      busy_ = false;
      cv_.notify_all();
    }
  }

  RunSettings settings_;
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  QHash<QString, QString> errors_;
  QList<TraceSpan> spans_;
  QList<MemorySampleEvent> memory_;
  qint64 peak_ = 0;
  bool stop_ = false, cancelled_ = false, busy_ = false;
  QString current_;  // executor thread only
  std::thread worker_;
};

class TestConst : public NodeType {
 public:
  TestConst() {
    spec_.name = QStringLiteral("TestConst");
    spec_.category = QStringLiteral("Test");
    spec_.description = QStringLiteral("A constant scalar");
    spec_.outputs = {
        {.name = "out", .type = PortType::Scalar, .doc = "the value"},
        {.name = "dev", .type = PortType::Device, .doc = "a device-typed output, for type checks"}};
    spec_.params = {{.name = "value", .type = ParamType::Float, .defaultValue = 1.0, .doc = "the constant"},
                    {.name = "delay_ms",
                     .type = ParamType::Int,
                     .defaultValue = 0,
                     .min = 0,
                     .max = 60000,
                     .doc = "how long its work takes"}};
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  bool reusable(const QJsonObject&) const override { return true; }
  void execute(NodeContext& ctx) const override {
    const double v = ctx.params().value("value").toDouble();
    ctx.setOutput("out", std::make_shared<ScalarValue>(v));
    ctx.setOutput("dev", std::make_shared<ScalarValue>(0));
    ctx.reportField("value", v);
    if (auto* s = dynamic_cast<TestSession*>(ctx.session()))
      s->enqueue({.sleepMs = ctx.params().value("delay_ms").toInt(), .bytes = 8, .flops = 0});
  }

 private:
  NodeTypeSpec spec_;
};

class TestAdd : public NodeType {
 public:
  TestAdd() {
    spec_.name = QStringLiteral("TestAdd");
    spec_.category = QStringLiteral("Test");
    spec_.description = QStringLiteral("a + b + value (or (a + b) * value in mul mode)");
    spec_.inputs = {{.name = "a", .type = PortType::Scalar, .required = true, .doc = "first operand"},
                    {.name = "b", .type = PortType::Scalar, .required = false, .doc = "second operand"},
                    {.name = "devices", .type = PortType::Devices, .required = false, .doc = "ignored"}};
    spec_.outputs = {{.name = "out", .type = PortType::Scalar, .doc = "the result"}};
    spec_.params = {
        {.name = "value",
         .type = ParamType::Float,
         .defaultValue = 0.0,
         .min = -1e6,
         .max = 1e6,
         .doc = "added"},
        {.name = "repeat", .type = ParamType::Int, .defaultValue = 1, .min = 1, .max = 1000, .doc = "jobs"},
        {.name = "delay_ms",
         .type = ParamType::Int,
         .defaultValue = 0,
         .min = 0,
         .max = 600000,
         .doc = "how long each job takes"},
        {.name = "throw", .type = ParamType::Bool, .defaultValue = false, .doc = "throw in execute"},
        {.name = "fail", .type = ParamType::Bool, .defaultValue = false, .doc = "fail in the work"},
        {.name = "label",
         .type = ParamType::String,
         .defaultValue = "",
         .doc = "\"warn\" warns; \"forbidden\" is refused; \"stop\": a cancel ends the work with "
                "\"stopped before the end\"; \"say:TEXT\" reports TEXT as generated_text"},
        {.name = "mode",
         .type = ParamType::Enum,
         .defaultValue = "add",
         .enumValues = {"add", "mul"},
         .doc = "op"},
        {.name = "shape",
         .type = ParamType::Shape,
         .defaultValue = QJsonArray{1},
         .min = 1,
         .max = 1e9,
         .doc = "elements per job: bytes and flops"},
    };
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  QStringList validateParams(const QJsonObject& params) const override {
    if (params.value("shape").toArray().size() > 4) return {QStringLiteral("shape: at most 4 dimensions")};
    return {};
  }
  bool reusable(const QJsonObject&) const override { return true; }
  void execute(NodeContext& ctx) const override {
    const QJsonObject& p = ctx.params();
    if (p.value("throw").toBool()) throw std::runtime_error("TestAdd threw as asked");
    const double sum = scalarOf(ctx.input("a")) + scalarOf(ctx.input("b"));
    const double v = p.value("mode").toString() == "mul" ? sum * p.value("value").toDouble()
                                                         : sum + p.value("value").toDouble();
    double elements = 1;
    for (const QJsonValue& d : p.value("shape").toArray()) elements *= d.toDouble();
    ctx.setOutput("out", std::make_shared<ScalarValue>(v, qint64(8 * elements)));
    ctx.reportField("value", v);
    ctx.metric("test.value", 0.0, v);
    if (p.value("label").toString() == "warn") ctx.warning(QStringLiteral("asked to warn"));
    if (p.value("label").toString().startsWith("say:"))
      ctx.reportField("generated_text", p.value("label").toString().mid(4));
    auto* session = dynamic_cast<TestSession*>(ctx.session());
    const int repeat = p.value("repeat").toInt();
    for (int i = 0; i < repeat; ++i) {
      session->enqueue({.sleepMs = p.value("delay_ms").toInt(),
                        .fail = p.value("fail").toBool(),
                        .cancelledText = p.value("label").toString() == "stop"
                                             ? QStringLiteral("stopped before the end")
                                             : QStringLiteral("cancelled"),
                        .bytes = qint64(8 * elements),
                        .flops = elements});
      ctx.progress(double(i + 1) / repeat);
    }
  }

 private:
  NodeTypeSpec spec_;
};

// a passed on, timed: a measurement, which always runs (not reusable), like MatMul.
class TestMeasure : public NodeType {
 public:
  TestMeasure() {
    spec_.name = QStringLiteral("TestMeasure");
    spec_.category = QStringLiteral("Test");
    spec_.description = QStringLiteral("Passes a on; always runs");
    spec_.inputs = {{.name = "a", .type = PortType::Scalar, .required = true, .doc = "the value"}};
    spec_.outputs = {{.name = "out", .type = PortType::Scalar, .doc = "a"}};
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  void execute(NodeContext& ctx) const override {
    ctx.setOutput("out", std::make_shared<ScalarValue>(scalarOf(ctx.input("a"))));
    if (auto* s = dynamic_cast<TestSession*>(ctx.session())) s->enqueue({.bytes = 8});
  }

 private:
  NodeTypeSpec spec_;
};

// A device whose identity (what the device is) comes from the environment variable GN_TEST_DEVICE_NAME, so
// tests can play a GPU that vanished between two runs. Its output carries the name's length.
class TestDevice : public NodeType {
 public:
  TestDevice() {
    spec_.name = QStringLiteral("TestDevice");
    spec_.category = QStringLiteral("Test");
    spec_.description = QStringLiteral("A device named by GN_TEST_DEVICE_NAME");
    spec_.outputs = {{.name = "device", .type = PortType::Device, .doc = "the device"}};
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  bool reusable(const QJsonObject&) const override { return true; }
  QByteArray cacheIdentity(const QJsonObject&, RunSession*) const override {
    return qgetenv("GN_TEST_DEVICE_NAME");
  }
  void execute(NodeContext& ctx) const override {
    ctx.setOutput("device", std::make_shared<ScalarValue>(qgetenv("GN_TEST_DEVICE_NAME").size()));
  }

 private:
  NodeTypeSpec spec_;
};

// Declares paths to read, to write and to write into (file_access.h), and writes `out` when it runs, so
// tests see what the host resolved and whether a refused run wrote anything. Reports the paths it saw.
class TestFile : public NodeType {
 public:
  TestFile() {
    spec_.name = QStringLiteral("TestFile");
    spec_.category = QStringLiteral("Test");
    spec_.description = QStringLiteral("Reads, writes and writes into paths");
    spec_.params = {
        {.name = "in", .type = ParamType::String, .defaultValue = "", .doc = "read", .file = FileUse::Read},
        {.name = "out", .type = ParamType::String, .defaultValue = "", .doc = "written",
         .file = FileUse::WriteFile},
        {.name = "folder", .type = ParamType::String, .defaultValue = "", .doc = "written into",
         .file = FileUse::WriteFolder},
        {.name = "note", .type = ParamType::String, .defaultValue = "x.txt", .doc = "not a path"}};
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  void execute(NodeContext& ctx) const override {
    for (const QString& p : {QStringLiteral("in"), QStringLiteral("out"), QStringLiteral("folder"),
                             QStringLiteral("note")})
      ctx.reportField(p, ctx.params().value(p));
    const QString out = ctx.params().value("out").toString();
    if (out.isEmpty()) return;
    QFile f(out);
    if (!f.open(QIODevice::WriteOnly) || f.write("written by TestFile") < 0)
      throw std::runtime_error("cannot write " + out.toStdString());
  }

 private:
  NodeTypeSpec spec_;
};

}  // namespace

class TestNodesPlugin : public QObject, public NodeSetPlugin {
  Q_OBJECT
  Q_PLUGIN_METADATA(IID GN_NODESET_IID)
  Q_INTERFACES(gn::core::NodeSetPlugin)

 public:
  QString setName() const override { return QStringLiteral("test-nodes"); }
  QList<NodeTypePtr> nodeTypes() const override {
    return {std::make_shared<TestConst>(), std::make_shared<TestAdd>(), std::make_shared<TestMeasure>(),
            std::make_shared<TestDevice>(), std::make_shared<TestFile>()};
  }
  std::unique_ptr<RunSession> createSession(const RunSettings& settings) override {
    return std::make_unique<TestSession>(settings);
  }
  void validateGraph(const GraphDocument& doc, const NodeTypeRegistry&, const RunSettings&,
                     ValidationReport& report) const override {
    for (const GraphNode& n : doc.nodes())
      if (n.type == "TestAdd" && n.params.value("label").toString() == "forbidden")
        report.error(n.id, QStringLiteral("params.label"),
                     QStringLiteral("refused by the test plugin's graph check"));
    // A problem that comes with its fix: a TestAdd labelled "needs-offset" wants its a to pass through an
    // offset first, and offers to insert one (a TestAdd adding 10) on that wire.
    for (const GraphNode& n : doc.nodes())
      if (n.type == "TestAdd" && n.params.value("label").toString() == "needs-offset")
        report.error(n.id, QStringLiteral("inputs.a"), QStringLiteral("a needs an offset first"),
                     IssueFix{.label = QStringLiteral("Insert an offset"),
                              .nodeType = QStringLiteral("TestAdd"),
                              .params = {{"value", 10}},
                              .input = {n.id, QStringLiteral("a")},
                              .throughInput = QStringLiteral("a"),
                              .throughOutput = QStringLiteral("out"),
                              .alsoWired = {}});
  }
  QJsonObject environment(const RunSettings& settings) const override {
    QJsonObject env{
        {"devices", QJsonArray{QJsonObject{{"name", kDevice}, {"cpu_devices", settings.cpuDevices}}}}};
    // cpu_devices=7 plays a set that gives no table, so the CLI's fallback listing is tested too.
    if (settings.cpuDevices != 7)
      env.insert("table",
                 QStringLiteral("test:0  a device for tests (cpu_devices=%1)\n").arg(settings.cpuDevices));
    return env;
  }
};

#include "test_nodes.moc"
