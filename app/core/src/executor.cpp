#include "gpunodes/core/executor.h"

#include <QHash>
#include <QJsonArray>
#include <QJsonDocument>
#include <QMap>
#include <QSet>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <numeric>
#include <set>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/run_cache.h"
#include "gpunodes/core/run_graph.h"

namespace gn::core {

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

RunEvent event(RunEvent::Kind kind, const QString& node = {}, const QString& message = {}) {
  RunEvent e{.kind = kind};
  e.node = node;
  e.message = message;
  return e;
}

// An issue as a node's own message: the node is already named by where it is shown.
QString withoutNode(const Issue& issue) {
  return issue.field.isEmpty() ? issue.message : issue.field + QStringLiteral(": ") + issue.message;
}

struct NodeState {
  QString id, type;
  NodeStatus status = NodeStatus::Pending;
  QString error;
  QStringList warnings;
  QJsonObject fields;   // from NodeContext::reportField
  bool notRun = false;  // bypassed, muted or a muted node's dependent: not run, as asked
  qint64 calls = 0, bytes = 0;
  double timeUs = 0, flops = 0, peakGflops = 0;
  QStringList devices;
  Clock::time_point started;
  double wallMs = 0;
};

}  // namespace

// State shared by the run thread, completion callbacks from plugin threads, node contexts, and report()
// readers. Held by shared_ptr, and closed at the end of the run, so a completion that arrives late touches
// nothing that is gone.
struct RunShared {
  std::mutex mutex;
  std::condition_variable cv;
  EventChannel* events = nullptr;
  const std::atomic<bool>* cancelled = nullptr;
  bool closed = false;

  QString graph;
  QList<NodeState> nodes;
  QHash<QString, int> index;
  struct Input {
    QString port, from;  // "a", "m1.out"
    int node = 0;
  };
  QList<QList<Input>> inputs;  // per node, where its wires come from
  std::map<QString, QList<QPair<double, double>>> metrics;
  QJsonArray devices;
  QJsonObject memory;
  QList<Issue> validation;
  int awaiting = 0;  // nodes whose session has not called onDone yet
  int done = 0;
  bool finished = false, ok = false;
  Clock::time_point t0 = Clock::now();
  double wallMs = 0;
  QString firstError;

  // Under the lock. Idempotent: the first outcome of a node stands. This is where a node's status is
  // decided: `decided` is an outcome the caller already knows (Skipped, Cancelled, Cached); otherwise no
  // error is Ok, an error during a cancel is Cancelled (whatever its text says), any other is Failed.
  void completeLocked(int i, const QString& error, std::optional<NodeStatus> decided = std::nullopt) {
    NodeState& n = nodes[i];
    if (isFinal(n.status) || closed) return;
    n.wallMs = n.status == NodeStatus::Running
                   ? std::chrono::duration<double, std::milli>(Clock::now() - n.started).count()
                   : 0;
    n.error = error;
    n.status = decided             ? *decided
               : error.isEmpty()   ? NodeStatus::Ok
               : cancelled->load() ? NodeStatus::Cancelled
                                   : NodeStatus::Failed;
    if (n.status == NodeStatus::Failed && firstError.isEmpty())
      firstError = n.id + QStringLiteral(": ") + error;
    ++done;
    using K = RunEvent::Kind;
    const K kind = n.status == NodeStatus::Ok       ? K::NodeFinished
                   : n.status == NodeStatus::Cached ? K::NodeCached
                                                    : K::NodeFailed;
    RunEvent e = event(kind, n.id, kind == K::NodeFailed ? n.error : QString());
    e.status = n.status;
    if (kind == K::NodeFinished) e.value = n.wallMs;
    RunEvent p = event(K::Progress);
    p.value = nodes.isEmpty() ? 1.0 : double(done) / double(nodes.size());
    events->push(QList<RunEvent>{std::move(e), std::move(p)});
  }

  void complete(int i, const QString& error, std::optional<NodeStatus> decided = std::nullopt) {
    std::lock_guard lock(mutex);
    completeLocked(i, error, decided);
  }

  // "skipped: input a (m1.out) failed" when one of node i's inputs comes from a node that did not finish;
  // empty otherwise. Under the lock.
  QString failedInputLocked(int i) const {
    for (const Input& in : inputs[i]) {
      const NodeStatus s = nodes[in.node].status;
      if (s == NodeStatus::Failed || s == NodeStatus::Skipped || s == NodeStatus::Cancelled)
        return QStringLiteral("skipped: input %1 (%2) failed").arg(in.port, in.from);
    }
    return {};
  }

  // Node i's outcome. A node whose work failed because an input's work had failed (an op's error reaches
  // the ops that read its result) was skipped by that failure, as if the input had failed before the node
  // ran: the first failure stays the one reported. Under the lock.
  void endLocked(int i, const QString& error) {
    const QString skipped = error.isEmpty() || cancelled->load() ? QString() : failedInputLocked(i);
    if (skipped.isEmpty())
      completeLocked(i, error);
    else
      completeLocked(i, skipped, NodeStatus::Skipped);
  }

  // A session's onDone: the node's outcome, and one less to wait for.
  void sessionDone(int i, const QString& error) {
    {
      std::lock_guard lock(mutex);
      if (closed) return;
      endLocked(i, error);
      --awaiting;
    }
    cv.notify_all();
  }
};

namespace {

class Context : public NodeContext {
 public:
  Context(std::shared_ptr<RunShared> shared, int index, QString id, QJsonObject params)
      : shared_(std::move(shared)), index_(index), id_(std::move(id)), params_(std::move(params)) {}

  const QString& nodeId() const override { return id_; }
  const QJsonObject& params() const override { return params_; }
  PortValuePtr input(const QString& port) const override {
    std::lock_guard lock(valuesMutex_);
    return inputs_.value(port);
  }
  void setOutput(const QString& port, PortValuePtr value) override {
    std::lock_guard lock(valuesMutex_);
    outputs_.insert(port, std::move(value));
  }
  RunSession* session() const override { return session_; }
  bool cancelled() const override { return shared_->cancelled->load(); }
  void progress(double fraction) override {
    std::lock_guard lock(shared_->mutex);
    if (shared_->closed) return;
    RunEvent e = event(RunEvent::Kind::Progress, id_);
    e.value = std::clamp(fraction, 0.0, 1.0);
    shared_->events->push(e);
  }
  void metric(const QString& series, double t, double value) override {
    std::lock_guard lock(shared_->mutex);
    if (shared_->closed) return;
    points_.append({series, t, value});
    shared_->metrics[series].append({t, value});
    RunEvent e = event(RunEvent::Kind::Metric, id_);
    e.series = series;
    e.t = t;
    e.value = value;
    shared_->events->push(e);
  }
  void warning(const QString& message) override {
    std::lock_guard lock(shared_->mutex);
    if (shared_->closed) return;
    shared_->nodes[index_].warnings.append(message);
    runWarnings_.append(message);
    shared_->events->push(event(RunEvent::Kind::NodeWarning, id_, message));
  }
  void reportField(const QString& key, const QJsonValue& value) override {
    std::lock_guard lock(shared_->mutex);
    if (shared_->closed) return;
    shared_->nodes[index_].fields.insert(key, value);
  }

  void setSession(RunSession* s) { session_ = s; }
  void setInput(const QString& port, PortValuePtr v) {
    std::lock_guard lock(valuesMutex_);
    inputs_.insert(port, std::move(v));
  }
  PortValuePtr output(const QString& port) const {
    std::lock_guard lock(valuesMutex_);
    return outputs_.value(port);
  }
  // What the run cache keeps of the node. Under shared_->mutex, after the run (points_ and runWarnings_
  // are written under it).
  CachedNode cacheEntryLocked(const QString& plugin, const QStringList& devices) const {
    CachedNode entry;
    entry.plugin = plugin;
    {
      std::lock_guard lock(valuesMutex_);
      entry.outputs = outputs_;
    }
    entry.fields = shared_->nodes[index_].fields;
    entry.warnings = runWarnings_;
    entry.metrics = points_;
    entry.devices = devices;
    // One value may sit on two outputs: counted once.
    QSet<const PortValue*> seen;
    for (const PortValuePtr& v : std::as_const(entry.outputs))
      if (v && !seen.contains(v.get())) seen.insert(v.get()), entry.bytes += v->bytes();
    return entry;
  }
  void dropValues() {
    std::lock_guard lock(valuesMutex_);
    inputs_.clear();
    outputs_.clear();
  }

 private:
  std::shared_ptr<RunShared> shared_;
  int index_;
  QString id_;
  QJsonObject params_;
  RunSession* session_ = nullptr;
  mutable std::mutex valuesMutex_;
  QHash<QString, PortValuePtr> inputs_, outputs_;
  QList<CachedNode::Point> points_;  // under shared_->mutex
  QStringList runWarnings_;          // under shared_->mutex; validation's warnings are not the node's own
};

}  // namespace

struct Executor::Run {
  std::shared_ptr<RunShared> shared = std::make_shared<RunShared>();
  // The snapshot: the GUI may edit the document while this runs.
  QList<GraphNode> nodes;
  QList<GraphConnection> connections;
  // Per node, the positions in `connections` of its wires in and out: a scan of every wire per node made a
  // 100,000-node chain take minutes.
  QList<QList<int>> wiresIn, wiresOut;
  RunSettings settings;
  QList<NodeTypePtr> types;
  QList<NodeSetPlugin*> plugins;  // per node
  QList<int> order;               // topological
  RunOptions options;
  QByteArray settingsKey;  // settingsCacheKey(settings)
  QList<QByteArray> keys;  // per node: its cache key, empty when it has none this run

  std::mutex sessionMutex;  // cancel() from the controlling thread vs. creation and teardown here
  std::map<NodeSetPlugin*, std::unique_ptr<RunSession>> sessions;
  QHash<NodeSetPlugin*, QString> sessionErrors;
  QHash<QPair<RunSession*, QString>, double> peaks;
  std::vector<std::unique_ptr<Context>> contexts;

  void execute(const std::atomic<bool>& cancelled);
  void executeNode(int i);
  QByteArray keyOf(int i);
  bool reuse(int i, const QByteArray& key);
  void keepInCache();
  void pump();  // only the pump thread calls it while the run goes, and the executor thread after
  void startPump();
  void stopPumpThread();
  void waitFor(const std::function<bool()>& ready, const std::atomic<bool>& cancelled);
  std::thread pumpThread;
  std::mutex pumpMutex;
  std::condition_variable pumpCv;
  bool stopPump = false;
  RunSession* sessionOf(int i) {
    auto it = sessions.find(plugins[i]);
    return it == sessions.end() ? nullptr : it->second.get();
  }
};

void Executor::Run::pump() {
  QList<RunEvent> out;
  QList<TraceSpan> spans;
  QJsonObject memory;
  QHash<QString, double> newPeaks;  // node -> peak of a device it used for the first time
  for (auto& [plugin, session] : sessions) {
    if (!session) continue;
    const QList<TraceSpan> taken = session->takeSpans();
    for (const TraceSpan& s : taken) {
      const auto key = qMakePair(session.get(), s.device);
      if (!peaks.contains(key)) peaks.insert(key, session->peakGflops(s.device));
      RunEvent e{.kind = RunEvent::Kind::Span};
      e.node = s.node;
      e.span = s;
      out.append(e);
      spans.append(s);
      newPeaks.insert(s.node + QChar(0) + s.device, peaks.value(key));
    }
    for (const MemorySampleEvent& m : session->takeMemory()) {
      RunEvent e{.kind = RunEvent::Kind::Memory};
      e.memory = m;
      out.append(e);
    }
    const QJsonObject summary = session->memorySummary();
    for (auto it = summary.begin(); it != summary.end(); ++it) memory.insert(it.key(), it.value());
  }
  std::lock_guard lock(shared->mutex);
  for (const TraceSpan& s : spans) {
    const auto it = shared->index.constFind(s.node);
    if (it == shared->index.constEnd()) continue;
    NodeState& n = shared->nodes[*it];
    ++n.calls;
    n.timeUs += std::max(0.0, s.endUs - s.startUs);
    n.bytes += s.bytes;
    n.flops += s.flops;
    if (!n.devices.contains(s.device)) {
      n.devices.append(s.device);
      n.peakGflops += newPeaks.value(s.node + QChar(0) + s.device);
    }
  }
  if (!memory.isEmpty()) shared->memory = memory;
  shared->events->push(std::move(out));
}

void Executor::Run::waitFor(const std::function<bool()>& ready, const std::atomic<bool>& cancelled) {
  std::unique_lock lock(shared->mutex);
  while (!shared->cv.wait_for(lock, std::chrono::milliseconds(50),
                              [&] { return ready() || cancelled.load(); })) {
  }
}

void Executor::Run::startPump() {
  // Its own thread, so spans and memory reach the UI every 50 ms even while a node blocks the executor
  // thread (Train, Inspect, a blocking copy).
  pumpThread = std::thread([this] {
    std::unique_lock lock(pumpMutex);
    while (!stopPump) {
      lock.unlock();
      try {
        pump();
      } catch (...) {
        // A session that fails to hand over spans loses trace data, not results; the run goes on.
      }
      lock.lock();
      pumpCv.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopPump; });
    }
  });
}

void Executor::Run::stopPumpThread() {
  {
    std::lock_guard lock(pumpMutex);
    stopPump = true;
  }
  pumpCv.notify_all();
  if (pumpThread.joinable()) pumpThread.join();
}

void Executor::Run::executeNode(int i) {
  const GraphNode& node = nodes[i];
  Context& ctx = *contexts[i];

  // Inputs: a failed upstream skips this node; otherwise its values feed ours.
  QString skipped;
  {
    std::lock_guard lock(shared->mutex);
    skipped = shared->failedInputLocked(i);
  }
  if (!skipped.isEmpty()) {
    shared->complete(i, skipped, NodeStatus::Skipped);
    return;
  }
  for (int w : wiresIn[i]) {
    const GraphConnection& c = connections[w];
    ctx.setInput(c.to.port, contexts[shared->index.value(c.from.node)]->output(c.from.port));
  }
  if (sessionErrors.contains(plugins[i])) {
    shared->complete(i, sessionErrors.value(plugins[i]));
    return;
  }

  RunSession* session = sessionOf(i);
  ctx.setSession(session);
  keys[i] = keyOf(i);
  if (!keys[i].isEmpty() && options.reuse && reuse(i, keys[i])) return;
  {
    std::lock_guard lock(shared->mutex);
    shared->nodes[i].status = NodeStatus::Running;
    shared->nodes[i].started = Clock::now();
    shared->events->push(event(RunEvent::Kind::NodeStarted, node.id));
  }

  QString error;
  try {
    if (session) session->beginNode(node.id);
    types[i]->execute(ctx);
  } catch (const std::exception& e) {
    error = QString::fromUtf8(e.what());
    if (error.isEmpty()) error = QStringLiteral("failed (an exception without a message)");
  } catch (...) {
    error = QStringLiteral("failed (an exception that is not a std::exception)");
  }
  if (error.isEmpty()) {
    // A wire from an output the node never set would hand the next node nothing: a plugin bug, named here.
    for (int w : wiresOut[i])
      if (!ctx.output(connections[w].from.port)) {
        error = QStringLiteral("produced no value on output \"%1\"").arg(connections[w].from.port);
        break;
      }
  }
  // The outcome of a throw stands at once, so downstream nodes are skipped; the session still hears endNode
  // and says when whatever the node enqueued before it threw has finished.
  if (!error.isEmpty()) {
    std::lock_guard lock(shared->mutex);
    shared->endLocked(i, error);
  }
  if (!session) {
    shared->complete(i, {});
    return;
  }
  {
    std::lock_guard lock(shared->mutex);
    ++shared->awaiting;
  }
  auto once = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<RunShared> weak = shared;
  try {
    session->endNode(node.id, [weak, i, once](const QString& err) {
      if (once->exchange(true)) return;  // a second call from a confused session changes nothing
      if (auto s = weak.lock()) s->sessionDone(i, err);
    });
  } catch (const std::exception& e) {
    if (!once->exchange(true)) shared->sessionDone(i, QString::fromUtf8(e.what()));
  } catch (...) {
    if (!once->exchange(true)) shared->sessionDone(i, QStringLiteral("failed at the end of the node"));
  }
}

QByteArray Executor::Run::keyOf(int i) {
  if (!options.cache) return {};
  const QJsonObject& params = contexts[i]->params();
  QByteArray identity;
  try {
    if (!types[i]->reusable(params)) return {};
    identity = types[i]->cacheIdentity(params, sessionOf(i));
  } catch (...) {
    return {};  // a plugin that cannot say what its node depends on: the node runs
  }
  QList<CacheKeyInput> inputs;
  for (int w : wiresIn[i]) {
    const GraphConnection& c = connections[w];
    const QByteArray& upstream = keys[shared->index.value(c.from.node)];
    if (upstream.isEmpty()) return {};  // fed by a node that always runs: this one must run too
    inputs.append({c.to.port, upstream, c.from.port});
  }
  return cacheKey(types[i]->spec().name, nodes[i].id, params, identity, settingsKey, std::move(inputs));
}

bool Executor::Run::reuse(int i, const QByteArray& key) {
  const std::shared_ptr<const CachedNode> hit = options.cache->find(key);
  if (!hit) return false;
  // An entry that lacks a wired output (a plugin that changed what it sets) is no hit.
  for (int w : wiresOut[i])
    if (!hit->outputs.value(connections[w].from.port)) return false;
  Context& ctx = *contexts[i];
  for (auto it = hit->outputs.begin(); it != hit->outputs.end(); ++it) ctx.setOutput(it.key(), it.value());
  std::lock_guard lock(shared->mutex);
  NodeState& n = shared->nodes[i];
  QList<RunEvent> replay;
  for (auto it = hit->fields.begin(); it != hit->fields.end(); ++it) n.fields.insert(it.key(), it.value());
  for (const QString& w : hit->warnings) {
    n.warnings.append(w);
    replay.append(event(RunEvent::Kind::NodeWarning, n.id, w));
  }
  for (const CachedNode::Point& p : hit->metrics) {
    shared->metrics[p.series].append({p.t, p.value});
    RunEvent e = event(RunEvent::Kind::Metric, n.id);
    e.series = p.series;
    e.t = p.t;
    e.value = p.value;
    replay.append(e);
  }
  n.devices = hit->devices;
  shared->events->push(std::move(replay));
  shared->completeLocked(i, {}, NodeStatus::Cached);
  return true;
}

void Executor::Run::keepInCache() {
  if (!options.cache) return;
  QList<QPair<QByteArray, CachedNode>> entries;
  {
    std::lock_guard lock(shared->mutex);
    for (int i = 0; i < nodes.size(); ++i) {
      const NodeState& n = shared->nodes[i];
      if (keys[i].isEmpty() || n.status != NodeStatus::Ok) continue;
      entries.append({keys[i], contexts[i]->cacheEntryLocked(plugins[i]->setName(), n.devices)});
    }
  }
  // Outside the lock: inserting may evict, and an evicted value may be the last to hold a plugin's runtime.
  for (auto& [key, entry] : entries) options.cache->insert(key, std::move(entry));
}

void Executor::Run::execute(const std::atomic<bool>& cancelled) {
  QString runError;
  try {
    // One session per plugin the graph uses, in the order the nodes first use them.
    for (int i : order) {
      NodeSetPlugin* plugin = plugins[i];
      if (sessions.count(plugin) || sessionErrors.contains(plugin)) continue;
      std::unique_ptr<RunSession> session;
      try {
        session = plugin->createSession(settings);
      } catch (const std::exception& e) {
        sessionErrors.insert(plugin,
                             QStringLiteral("%1 could not start: %2").arg(plugin->setName(), e.what()));
        continue;
      } catch (...) {
        // Only this plugin's nodes fail; the other plugins' sessions still run.
        sessionErrors.insert(plugin, QStringLiteral("%1 could not start (an exception that is not a "
                                                    "std::exception)")
                                         .arg(plugin->setName()));
        continue;
      }
      QJsonArray devices = session ? session->devices() : QJsonArray();
      if (options.cache)
        options.cache->useScope(plugin->setName(), session ? session->valueScope() : QString());
      std::lock_guard lock(sessionMutex);
      if (session && cancelled.load()) session->cancel();  // cancel() came before this session existed
      sessions[plugin] = std::move(session);
      std::lock_guard sharedLock(shared->mutex);
      for (const QJsonValue& d : devices) shared->devices.append(d);
    }

    startPump();
    const bool sequential = settings.schedule == "sequential";
    for (int i : order) {
      if (cancelled.load()) break;
      if (sequential) waitFor([&] { return shared->awaiting == 0; }, cancelled);
      if (cancelled.load()) break;
      executeNode(i);
    }
    waitFor([&] { return shared->awaiting == 0; }, cancelled);
  } catch (const std::exception& e) {
    runError = QString::fromUtf8(e.what());
  } catch (...) {
    runError = QStringLiteral("the run stopped on an unknown exception");
  }
  if (!runError.isEmpty()) {
    std::lock_guard lock(sessionMutex);
    for (auto& [plugin, session] : sessions)
      if (session) session->cancel();
  }
  stopPumpThread();  // before finish(): the sessions' last spans are taken below, on this thread
  // After a cancel the sessions drop their queued work, so this returns within the second.
  for (auto& [plugin, session] : sessions) {
    if (!session) continue;
    try {
      session->finish();
    } catch (const std::exception& e) {
      if (runError.isEmpty()) runError = QStringLiteral("%1: %2").arg(plugin->setName(), e.what());
    } catch (...) {
      if (runError.isEmpty()) runError = QStringLiteral("%1: failed to finish").arg(plugin->setName());
    }
  }
  try {
    pump();
  } catch (...) {
    // The sessions are done; a failure to read their last spans loses trace data, not results.
  }

  {
    std::lock_guard lock(shared->mutex);
    const bool wasCancelled = cancelled.load();
    for (int i = 0; i < shared->nodes.size(); ++i) {
      NodeState& n = shared->nodes[i];
      if (isFinal(n.status)) continue;
      if (wasCancelled) {
        shared->completeLocked(i, QStringLiteral("cancelled"), NodeStatus::Cancelled);
      } else {
        const QString why = runError.isEmpty() ? QStringLiteral("did not finish") : runError;
        shared->completeLocked(i, n.status == NodeStatus::Running ? why : QStringLiteral("not run: ") + why);
      }
    }
    bool allOk = runError.isEmpty() && !wasCancelled;
    for (const NodeState& n : shared->nodes)
      allOk = allOk && (n.status == NodeStatus::Ok || n.status == NodeStatus::Cached || n.notRun);
    if (shared->firstError.isEmpty() && !runError.isEmpty()) shared->firstError = runError;
    shared->ok = allOk;
    shared->finished = true;
    shared->wallMs = msSince(shared->t0);
    RunEvent e = event(RunEvent::Kind::RunFinished, {},
                       allOk          ? QString()
                       : wasCancelled ? QStringLiteral("cancelled")
                                      : shared->firstError);
    e.ok = allOk;
    e.status = allOk ? NodeStatus::Ok : wasCancelled ? NodeStatus::Cancelled : NodeStatus::Failed;
    e.value = shared->wallMs;
    shared->events->push(e);
    shared->closed = true;  // late callbacks and context calls from here on do nothing
  }
  keepInCache();
  // Values may hold the sessions' tensors, which need their runtime: drop them first.
  for (auto& c : contexts) c->dropValues();
  contexts.clear();
  std::lock_guard lock(sessionMutex);
  sessions.clear();
}

Executor::Executor(const NodeTypeRegistry& registry) : registry_(registry) {}

Executor::~Executor() {
  cancel();
  wait();
}

bool Executor::start(const GraphDocument& doc, const RunSettings& settings, ValidationReport* validation,
                     const RunOptions& options) {
  if (running_.load()) {
    if (validation) {
      *validation = ValidationReport();
      validation->error({}, {}, QStringLiteral("a run is already going; cancel it or wait for it to finish"));
    }
    return false;
  }
  if (thread_.joinable()) thread_.join();

  const RunGraph graph = runGraph(doc, registry_, options.targets, settings.files.folder);
  const ValidationReport report = validate(graph, registry_, settings);
  if (validation) *validation = report;

  auto run = std::make_unique<Run>();
  RunShared& shared = *run->shared;
  shared.events = &events_;
  shared.cancelled = &cancelled_;
  shared.graph = doc.name();
  shared.validation = report.issues();
  // Issues by node, in one pass: a hostile graph has thousands of nodes and issues.
  QHash<QString, QStringList> warnings;
  QHash<QString, QString> firstError;
  for (const Issue& issue : report.issues()) {
    if (issue.severity == Issue::Severity::Warning)
      warnings[issue.node].append(withoutNode(issue));
    else if (!firstError.contains(issue.node))
      firstError.insert(issue.node, withoutNode(issue));
  }
  const GraphDocument& runnable = graph.graph();
  for (const GraphNode& n : runnable.nodes()) {
    NodeState s;
    s.id = n.id;
    s.type = n.type;
    s.warnings = warnings.value(n.id);
    if (!shared.index.contains(n.id)) shared.index.insert(n.id, int(shared.nodes.size()));
    shared.nodes.append(s);
  }
  // After the nodes that run, so that those keep their document order and index.
  for (const RunGraph::NotRun& r : graph.notRun) {
    NodeState s;
    s.id = r.id;
    s.type = r.type;
    s.status = r.status;
    s.error = r.message;
    s.notRun = true;
    s.warnings = warnings.value(r.id);
    if (!shared.index.contains(r.id)) shared.index.insert(r.id, int(shared.nodes.size()));
    shared.nodes.append(s);
    ++shared.done;
  }

  if (!report.ok()) {
    // Nothing runs, but the report says why, per node: the editor and --report show it.
    for (NodeState& n : shared.nodes) {
      if (n.notRun) continue;
      n.error = firstError.value(n.id);
      n.status = registry_.find(n.type) ? NodeStatus::Invalid : NodeStatus::Missing;
    }
    shared.finished = true;
    shared.ok = false;
    shared.firstError = report.errors().value(0).text();
    cancelled_ = false;
    run_ = std::move(run);
    return false;
  }

  run->nodes = runnable.nodes();
  run->connections = runnable.connections();
  run->settings = settings;
  run->options = options;
  run->settingsKey = settingsCacheKey(settings);
  const int n = int(run->nodes.size());
  run->keys.resize(n);
  for (int i = 0; i < n; ++i) {
    const GraphNode& node = run->nodes[i];
    NodeTypePtr type = registry_.find(node.type);
    run->types.append(type);
    run->plugins.append(registry_.pluginOf(node.type));
    run->contexts.push_back(
        std::make_unique<Context>(run->shared, i, node.id, withDefaults(type->spec(), node.params)));
  }
  // Kahn's algorithm; ties go to document order, so runs are reproducible. Validation ruled out cycles.
  QList<QList<int>> next(n);
  QList<int> indegree(n, 0);
  run->wiresIn.resize(n);
  run->wiresOut.resize(n);
  shared.inputs.resize(n);
  for (int w = 0; w < run->connections.size(); ++w) {
    const GraphConnection& c = run->connections[w];
    const int from = shared.index.value(c.from.node), to = shared.index.value(c.to.node);
    next[from].append(to);
    ++indegree[to];
    run->wiresIn[to].append(w);
    run->wiresOut[from].append(w);
    shared.inputs[to].append({c.to.port, c.from.str(), from});
  }
  std::set<int> ready;
  for (int i = 0; i < n; ++i)
    if (indegree[i] == 0) ready.insert(i);
  while (!ready.empty()) {
    const int i = *ready.begin();
    ready.erase(ready.begin());
    run->order.append(i);
    for (int j : next[i])
      if (--indegree[j] == 0) ready.insert(j);
  }

  QList<RunEvent> first{event(RunEvent::Kind::RunStarted, {}, doc.name())};
  for (int i : run->order) first.append(event(RunEvent::Kind::NodeQueued, run->nodes[i].id));
  for (const RunGraph::NotRun& r : graph.notRun) {
    RunEvent e =
        event(RunEvent::Kind::NodeFailed, r.id, r.message.isEmpty() ? nodeStatusName(r.status) : r.message);
    e.status = r.status;
    first.append(e);
  }
  for (const Issue& issue : report.issues())
    if (issue.severity == Issue::Severity::Warning)
      first.append(event(RunEvent::Kind::NodeWarning, issue.node,
                         issue.node.isEmpty() ? issue.text() : withoutNode(issue)));
  events_.push(std::move(first));

  cancelled_ = false;
  running_ = true;
  run_ = std::move(run);
  Run* r = run_.get();
  thread_ = std::thread([this, r] {
    r->execute(cancelled_);
    running_ = false;
  });
  return true;
}

void Executor::cancel() {
  if (!running_.load() || !run_) return;
  cancelled_ = true;
  {
    std::lock_guard lock(run_->sessionMutex);
    for (auto& [plugin, session] : run_->sessions)
      if (session) session->cancel();
  }
  run_->shared->cv.notify_all();
}

void Executor::wait() {
  if (thread_.joinable()) thread_.join();
}

QJsonObject Executor::report() const {
  if (!run_) return {};
  RunShared& s = *run_->shared;
  std::lock_guard lock(s.mutex);
  // Inserted in key order: QJsonObject keeps its keys sorted, so inserting in document order moved the tail
  // of the object on every insert, quadratic in a graph of 100,000 nodes.
  QList<qsizetype> order(s.nodes.size());
  std::iota(order.begin(), order.end(), qsizetype(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](qsizetype a, qsizetype b) { return s.nodes[a].id < s.nodes[b].id; });
  QJsonObject nodes;
  for (qsizetype k = 0; k < order.size(); ++k) {
    const NodeState& n = s.nodes[order[k]];
    // A duplicate id (an invalid graph) keeps its first entry: stable, so that one comes first.
    if (k > 0 && s.nodes[order[k - 1]].id == n.id) continue;
    QJsonObject o = n.fields;
    o.insert("type", n.type);
    // A cached node is an ok one whose outputs came from the cache: the report's format has a flag for it.
    const bool cached = n.status == NodeStatus::Cached;
    o.insert("status", nodeStatusName(cached ? NodeStatus::Ok : n.status));
    o.insert("cached", cached);
    o.insert("device", n.devices.join(", "));
    o.insert("calls", n.calls);
    o.insert("time_ms", n.timeUs / 1000.0);
    const double gflops = n.timeUs > 0 ? n.flops / (n.timeUs * 1e3) : 0.0;
    o.insert("gflops", gflops);
    o.insert("pct_peak",
             n.peakGflops > 0 && n.flops > 0 ? QJsonValue(gflops / n.peakGflops * 100.0) : QJsonValue());
    o.insert("bytes", n.bytes);
    o.insert("flops", n.flops);
    o.insert("wall_ms", n.status == NodeStatus::Running ? msSince(n.started) : n.wallMs);
    o.insert("error", n.error);
    if (!n.warnings.isEmpty()) o.insert("warnings", QJsonArray::fromStringList(n.warnings));
    nodes.insert(n.id, o);
  }
  QJsonObject metrics;
  for (const auto& [series, samples] : s.metrics) {
    QJsonArray a;
    for (const auto& [t, v] : samples) a.append(QJsonArray{t, v});
    metrics.insert(series, a);
  }
  QJsonObject out{
      {"graph", s.graph},
      {"ok", s.finished && s.ok},
      {"cancelled", cancelled_.load()},
      {"running", !s.finished},
      {"wall_ms", s.finished ? s.wallMs : msSince(s.t0)},
      {"devices", s.devices},
      {"nodes", nodes},
      {"metrics", metrics},
      {"memory", s.memory},
  };
  if (!s.firstError.isEmpty()) out.insert("error", s.firstError);
  if (!s.validation.isEmpty()) {
    QJsonArray issues;
    for (const Issue& i : s.validation)
      issues.append(QJsonObject{{"severity", i.severity == Issue::Severity::Error ? "error" : "warning"},
                                {"node", i.node},
                                {"field", i.field},
                                {"message", i.message}});
    out.insert("validation", issues);
  }
  return out;
}

QByteArray chromeTrace(const QList<TraceSpan>& spans, const QList<MemorySampleEvent>& memory) {
  auto deviceName = [](const QString& d) { return d.isEmpty() ? QStringLiteral("host") : d; };
  // Sorted maps: the same spans give the same pid/tid numbering.
  std::map<QString, int> pids;
  std::map<QString, std::map<QString, int>> tids;
  for (const TraceSpan& s : spans)
    tids[deviceName(s.device)][s.stream.isEmpty() ? QStringLiteral("main") : s.stream];
  for (const MemorySampleEvent& m : memory) tids[deviceName(m.device)];
  QJsonArray events;
  int pid = 0;
  for (auto& [device, streams] : tids) {
    pids[device] = ++pid;
    events.append(QJsonObject{{"name", "process_name"},
                              {"ph", "M"},
                              {"pid", pid},
                              {"tid", 0},
                              {"args", QJsonObject{{"name", device}}}});
    int tid = 0;
    for (auto& [stream, id] : streams) {
      id = ++tid;
      events.append(QJsonObject{{"name", "thread_name"},
                                {"ph", "M"},
                                {"pid", pid},
                                {"tid", id},
                                {"args", QJsonObject{{"name", stream}}}});
    }
  }
  for (const TraceSpan& s : spans) {
    const QString device = deviceName(s.device);
    const QString stream = s.stream.isEmpty() ? QStringLiteral("main") : s.stream;
    events.append(QJsonObject{
        {"name", s.op.isEmpty() ? QStringLiteral("op") : s.op},
        {"cat", s.node.isEmpty() ? QStringLiteral("op") : s.node},
        {"ph", "X"},
        {"pid", pids[device]},
        {"tid", tids[device][stream]},
        {"ts", s.startUs},
        {"dur", std::max(0.0, s.endUs - s.startUs)},
        {"args", QJsonObject{{"node", s.node},
                             {"device", device},
                             {"stream", stream},
                             {"bytes", s.bytes},
                             {"flops", s.flops},
                             {"host_blocking", s.hostBlocking}}},
    });
  }
  for (const MemorySampleEvent& m : memory)
    events.append(QJsonObject{{"name", "memory"},
                              {"ph", "C"},
                              {"pid", pids[deviceName(m.device)]},
                              {"ts", m.tUs},
                              {"args", QJsonObject{{"allocated", m.allocated}, {"reserved", m.reserved}}}});
  return QJsonDocument(QJsonObject{{"displayTimeUnit", "ms"}, {"traceEvents", events}})
      .toJson(QJsonDocument::Compact);
}

}  // namespace gn::core
