// The executor: takes a snapshot of the document, validates it, and runs it on its own thread. Nodes are
// executed in topological order; each enqueues work on its plugin's runtime and returns, so independent
// branches overlap. Events stream through events(); the report grows as the run goes.
#pragma once
#include <QJsonObject>
#include <QString>
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

class Executor {
 public:
  explicit Executor(const NodeTypeRegistry& registry);
  ~Executor();  // cancels a run in progress and waits for it

  // Validates a snapshot of doc and starts it. Returns false, running nothing, when validation fails or a
  // run is already going (*validation then holds the issues, or one graph-level error).
  bool start(const GraphDocument& doc, const RunSettings& settings, ValidationReport* validation = nullptr);
  void cancel();         // returns at once; the run ends within a second
  void wait();           // until the run has finished
  bool isRunning() const { return running_.load(); }
  bool wasCancelled() const { return cancelled_.load(); }
  EventChannel& events() { return events_; }

  // {graph, ok, cancelled, wall_ms, devices[], nodes{id: {type, status, device, calls, time_ms, gflops,
  // pct_peak, bytes, error, ...}}, metrics{series: [[t, v]...]}, memory{device: {peak_bytes, current_bytes}}}
  // Partial while running or after cancel.
  QJsonObject report() const;

 private:
  struct Run;
  const NodeTypeRegistry& registry_;
  EventChannel events_;
  std::unique_ptr<Run> run_;
  std::thread thread_;
  std::atomic<bool> running_{false}, cancelled_{false};
};

}  // namespace gn::core
