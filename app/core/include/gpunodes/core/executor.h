// The executor: takes a snapshot of the document, validates it, and runs it on its own thread. Nodes are
// executed in topological order; each enqueues work on its plugin's runtime and returns, so independent
// branches overlap. Under the "sequential" schedule the executor also waits for each node's work to finish
// before it starts the next. Events stream through events(); the report grows as the run goes.
//
// start/cancel/wait/report are called from one controlling thread (the UI thread, the CLI's main loop).
// A node whose input comes from a failed, skipped or cancelled node is skipped ("skipped: input a (x1.out)
// failed"). Each node's status (run_events.h's NodeStatus) is decided here, once, and carried on its last
// event; the report writes its name: pending, running, ok (with "cached": true for a cached node), failed,
// skipped, cancelled, muted, bypassed; after a refused start (validation failed): invalid, or missing for a
// node whose type no plugin provides.
//
// What runs is runGraph(doc) (run_graph.h): bypassed and muted nodes, and a muted node's dependents
// ("skipped: input a (m1.out) is muted"), do not run, and count as intended: the run is still ok. With a
// run cache (run_cache.h) a node whose key is in the cache is not run: its outputs and what it reported come
// from there, the report says "cached": true and no span is recorded for it.
#pragma once
#include <QByteArray>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "gpunodes/core/plugin.h"
#include "gpunodes/core/run_events.h"
#include "gpunodes/core/validation.h"

namespace gn::core {

class GraphDocument;
class NodeTypeRegistry;

class RunCache;

struct RunOptions {
  RunCache* cache = nullptr;  // null: nothing is reused or kept. Must outlive the run.
  bool reuse = true;          // false ("Run all"): every node runs; the cache is still filled
  QStringList targets;        // "Run to here": only these nodes and their ancestors run; empty: all
};

class Executor {
 public:
  explicit Executor(const NodeTypeRegistry& registry);
  ~Executor();  // cancels a run in progress and waits for it

  // Validates a snapshot of doc and starts it. Returns false, running nothing, when validation fails or a
  // run is already going (*validation then holds the issues, or one graph-level error).
  bool start(const GraphDocument& doc, const RunSettings& settings, ValidationReport* validation = nullptr,
             const RunOptions& options = {});
  void cancel();  // returns at once; the run ends within a second
  void wait();    // until the run has finished
  bool isRunning() const { return running_.load(); }
  bool wasCancelled() const { return cancelled_.load(); }
  EventChannel& events() { return events_; }

  // {graph, ok, cancelled, running, wall_ms, devices[], nodes{id: {type, status, cached, device, calls,
  // time_ms, gflops, pct_peak, bytes, flops, wall_ms, error, warnings?, ...fields the node reported}},
  // metrics{series: [[t, v]...]}, memory{device: {peak_bytes, current_bytes}}, validation?: [issues]}.
  // calls, time_ms, bytes and flops add up the node's trace spans; pct_peak is null when the session does
  // not know the device's peak. Partial while running or after cancel; empty before the first start().
  QJsonObject report() const;

 private:
  struct Run;
  const NodeTypeRegistry& registry_;
  EventChannel events_;
  std::unique_ptr<Run> run_;
  std::thread thread_;
  std::atomic<bool> running_{false}, cancelled_{false};
};

// Chrome trace-event JSON ({"traceEvents": [...]}, which chrome://tracing and Perfetto open): one process
// per device, one thread per stream, an "X" event per span with the node id in args, and a memory counter
// per device. The CLI's --trace and the editor's export share it.
QByteArray chromeTrace(const QList<TraceSpan>& spans, const QList<MemorySampleEvent>& memory = {});

}  // namespace gn::core
