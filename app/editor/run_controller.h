// Runs the document through gn::core::Executor without blocking the UI thread: the executor works on its own
// thread and a 20 Hz timer drains its EventChannel, handing the UI one batch per tick. A second start while
// a run is going is refused (not queued): the caller shows why. startProcesses() runs it under mpirun
// instead (process_run.h): rank 0's event stream goes out through the same batches, so the plots, timeline,
// canvas and log cannot tell the two apart.
//
// Local runs share one run cache (run_cache.h), kept for as long as the controller: the outputs of the last
// runs stay in memory, bounded in bytes, least recently used out first, so the next run executes only the
// nodes whose key changed. Runs under mpirun are other processes and use no cache.
#pragma once
#include <QElapsedTimer>
#include <QJsonObject>
#include <QObject>
#include <QTimer>
#include <memory>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/run_cache.h"
#include "process_run.h"

namespace gn::core {
class GraphDocument;
class NodeTypeRegistry;
}  // namespace gn::core

namespace gn::editor {

class RunController : public QObject {
  Q_OBJECT
 public:
  explicit RunController(const core::NodeTypeRegistry* registry, QObject* parent = nullptr);
  ~RunController() override;

  // False when a run is going (why says so) or validation fails (the issues are in *validation). reuse:
  // take unchanged nodes' outputs from the cache (Run) or run everything (Run all). targets: run only these
  // nodes and what they need (Run to here); empty runs the whole graph.
  // files: where the graph's relative paths resolve and what it may write (file_consent.h decides it).
  bool start(const core::GraphDocument& doc, const core::FilePolicy& files, core::ValidationReport* validation,
             QString* why, bool reuse = true, const QStringList& targets = {});
  // The same on options.processes processes under mpirun, with options.files. Validation runs here first, as for a local run;
  // with a host file its errors only warn (the other machines' devices are not this one's), and rank 0's
  // own validation decides.
  bool startProcesses(const core::GraphDocument& doc, const ProcessRunOptions& options,
                      core::ValidationReport* validation, QString* why);
  void cancel();
  bool isRunning() const { return active_; }
  bool isCancelling() const { return cancelling_; }
  double elapsedMs() const { return active_ ? double(clock_.nsecsElapsed()) / 1e6 : lastWallMs_; }
  void setIntervalMs(int ms) { timer_.setInterval(ms); }

  // From the last run (partial while running). Spans and memory samples: the newest kKeptRunItems.
  QJsonObject report() const;
  const QList<core::TraceSpan>& spans() const { return spans_; }
  qsizetype droppedSpans() const { return droppedSpans_; }  // older spans not kept
  const QList<core::MemorySampleEvent>& memory() const { return memory_; }
  int runCount() const { return runs_; }
  core::RunCache& cache() { return cache_; }
  // The last run's number of processes: 0 for a run in this process, N for one under mpirun.
  int worldSize() const { return proc_ ? proc_->worldSize() : 0; }
  const ProcessRun* processRun() const { return proc_.get(); }

 signals:
  void started();
  void batch(const QList<gn::core::RunEvent>& events);
  void finished(bool ok, bool cancelled, const QString& message);
  // A line for the log that is not an event: under mpirun, the job's stderr and malformed event lines.
  void output(gn::editor::ProcessRun::Level level, const QString& text);

 private:
  void poll();
  void pollProcesses();
  void began();
  // Keeps the run's spans and memory samples; returns whether `events` hold its RunFinished.
  bool keep(const QList<core::RunEvent>& events, bool* ok, QString* message);
  const core::NodeTypeRegistry* registry_;
  core::RunCache cache_;  // before exec_: a run going fills it until the executor is gone
  std::unique_ptr<core::Executor> exec_;
  std::unique_ptr<ProcessRun> proc_;  // the last run, when it ran under mpirun (then exec_ is null)
  QTimer timer_;
  QElapsedTimer clock_;
  bool active_ = false, cancelling_ = false;
  double lastWallMs_ = 0;
  int runs_ = 0;
  QList<core::TraceSpan> spans_;
  qsizetype droppedSpans_ = 0;
  QList<core::MemorySampleEvent> memory_;
};

}  // namespace gn::editor
