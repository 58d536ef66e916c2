// Shared by the node-set suites: load the real plugin, run graphs through the host's executor, and drive
// single nodes by hand (a minimal NodeContext) where a test needs the session itself.
#pragma once
#include <QJsonArray>
#include <QJsonObject>
#include <QtTest>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/validation.h"

namespace nodes_test {

using namespace gn::core;

inline NodeTypeRegistry& registry() {
  static NodeTypeRegistry r;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    if (!r.loadPluginFile(QStringLiteral(GN_NODES_PLUGIN))) {
      for (const auto& e : r.loadErrors())
        qWarning("plugin: %s: %s", qPrintable(e.path), qPrintable(e.reason));
    }
  }
  return r;
}

inline NodeSetPlugin* plugin() {
  return registry().pluginOf(QStringLiteral("MatMul"));
}

inline QString examplePath(const QString& name) {
  return QStringLiteral(GN_EXAMPLES_DIR "/") + name + ".json";
}

// Loads an example; on failure the test fails with the loader's message.
inline bool loadExample(const QString& name, GraphDocument& doc) {
  QString error;
  const bool ok = serializer::loadFile(examplePath(name), doc, &error);
  if (!ok) qWarning("%s", qPrintable(error));
  return ok;
}

inline GraphNode makeNode(const QString& id, const QString& type, const QJsonObject& params = {}) {
  GraphNode n;
  n.id = id;
  n.type = type;
  n.params = params;
  return n;
}

inline void wire(GraphDocument& doc, const QString& from, const QString& to) {
  GraphConnection c;
  c.from = *Endpoint::parse(from);
  c.to = *Endpoint::parse(to);
  doc.addConnection(c);
}

// An Inspect node on `from`, so that a test can read values the example does not show.
inline QString addInspect(GraphDocument& doc, const QString& id, const QString& from) {
  doc.addNode(makeNode(id, "Inspect"));
  wire(doc, from, id + ".in");
  return id;
}

inline RunSettings settingsOf(const GraphDocument& doc) {
  return RunSettings::fromGraph(doc.settings());
}

struct RunResult {
  bool started = false;
  ValidationReport validation;
  QJsonObject report;
  QList<TraceSpan> spans;
  QList<RunEvent> events;

  QJsonObject node(const QString& id) const { return report["nodes"].toObject()[id].toObject(); }
  QList<TraceSpan> spansOf(const QString& node, const QString& op = {}) const {
    QList<TraceSpan> out;
    for (const TraceSpan& s : spans)
      if (s.node == node && (op.isEmpty() || s.op == op)) out.append(s);
    return out;
  }
  // The values an Inspect node read, element i.
  std::vector<double> inspected(const QString& id, int i = 0) const {
    std::vector<double> out;
    for (const QJsonValue& v : node(id)["inspect"].toArray()[i].toObject()["values"].toArray())
      out.push_back(v.toDouble());
    return out;
  }
  QStringList failures() const {
    QStringList out;
    const QJsonObject nodes = report["nodes"].toObject();
    for (auto it = nodes.begin(); it != nodes.end(); ++it)
      if (it.value().toObject()["status"].toString() != "ok")
        out.append(it.key() + ": " + it.value().toObject()["status"].toString() + ": " +
                   it.value().toObject()["error"].toString());
    for (const Issue& i : validation.errors()) out.append(i.text());
    return out;
  }
};

inline RunResult runGraph(const GraphDocument& doc, std::optional<RunSettings> settings = std::nullopt,
                          const std::function<void(Executor&)>& whileRunning = {},
                          const RunOptions& options = {}) {
  Executor executor(registry());
  RunResult r;
  r.started = executor.start(doc, settings.value_or(settingsOf(doc)), &r.validation, options);
  if (r.started && whileRunning) whileRunning(executor);
  executor.wait();
  r.events = executor.events().drain();
  for (const RunEvent& e : r.events)
    if (e.kind == RunEvent::Kind::Span) r.spans.append(e.span);
  r.report = executor.report();
  return r;
}

inline bool overlap(const TraceSpan& a, const TraceSpan& b) {
  return a.startUs < b.endUs && b.startUs < a.endUs;
}

// Row-major n x n product, in double: the independent computation the runtime's results are checked against.
inline std::vector<double> naiveMatmul(const std::vector<double>& a, const std::vector<double>& b, int n) {
  std::vector<double> c(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j) c[size_t(i) * n + j] += a[size_t(i) * n + k] * b[size_t(k) * n + j];
  return c;
}

inline double frobenius(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

// Float32 results against double references: relative to the scale of the values.
inline bool near(const std::vector<double>& got, const std::vector<double>& want, double rel = 1e-4) {
  if (got.size() != want.size()) return false;
  double scale = 1e-6;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > rel * scale) return false;
  return true;
}

// Drives node types by hand against one session: what the executor does, minus the scheduling, so that a test
// can hold the session and look at its allocators after the values are gone.
class Harness {
 public:
  explicit Harness(const RunSettings& settings) : session_(plugin()->createSession(settings)) {}

  class Context : public NodeContext {
   public:
    QString id;
    QJsonObject params_;
    QHash<QString, PortValuePtr> inputs, outputs;
    RunSession* session_ = nullptr;
    QStringList warnings;
    QJsonObject fields;
    const QString& nodeId() const override { return id; }
    const QJsonObject& params() const override { return params_; }
    PortValuePtr input(const QString& port) const override { return inputs.value(port); }
    void setOutput(const QString& port, PortValuePtr value) override { outputs.insert(port, value); }
    RunSession* session() const override { return session_; }
    bool cancelled() const override { return false; }
    void progress(double) override {}
    void metric(const QString&, double, double) override {}
    void warning(const QString& message) override { warnings.append(message); }
    void reportField(const QString& key, const QJsonValue& value) override { fields.insert(key, value); }
  };

  // Executes one node; returns its context (outputs, warnings, fields). *thrown gets what execute threw.
  std::unique_ptr<Context> execute(const QString& id, const QString& type, const QJsonObject& params,
                                   const QHash<QString, PortValuePtr>& inputs, QString* thrown = nullptr) {
    auto ctx = std::make_unique<Context>();
    NodeTypePtr t = registry().find(type);
    ctx->id = id;
    ctx->params_ = withDefaults(t->spec(), params);
    ctx->inputs = inputs;
    ctx->session_ = session_.get();
    session_->beginNode(id);
    try {
      t->execute(*ctx);
    } catch (const std::exception& e) {
      if (thrown) *thrown = QString::fromUtf8(e.what());
    }
    session_->endNode(id, [this, id](const QString& error) {
      std::lock_guard lock(mutex_);
      done_.insert(id, error);
      cv_.notify_all();
    });
    return ctx;
  }

  // The node's onDone error ("" on success); waits for it.
  QString waitDone(const QString& id) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_.contains(id); });
    return done_.value(id);
  }

  RunSession& session() { return *session_; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  QHash<QString, QString> done_;
  std::unique_ptr<RunSession> session_;  // last: it goes first, while the callbacks' state still exists
};

}  // namespace nodes_test
