#include "run_controller.h"

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/validation.h"
#include "recent.h"

namespace gn::editor {

RunController::RunController(const core::NodeTypeRegistry* registry, QObject* parent)
    : QObject(parent), registry_(registry) {
  timer_.setInterval(50);  // 20 Hz: smooth enough for plots, cheap enough to never stall editing
  connect(&timer_, &QTimer::timeout, this, &RunController::poll);
}

RunController::~RunController() {
  if (exec_) exec_->cancel();  // the executor's destructor then waits for its thread
  // A job under mpirun is stopped by the ProcessRun's destructor, which waits for it.
}

bool RunController::start(const core::GraphDocument& doc, const core::FilePolicy& files,
                          core::ValidationReport* validation, QString* why, bool reuse,
                          const QStringList& targets) {
  if (active_) {
    if (why) *why = "A run is already going: cancel it or wait for it to finish before starting another.";
    return false;
  }
  // A fresh executor per run: the previous one's report stays readable until this point.
  proc_.reset();
  exec_ = std::make_unique<core::Executor>(*registry_);
  core::RunSettings settings = core::RunSettings::fromGraph(doc.settings());
  settings.files = files;
  core::ValidationReport report;
  if (!exec_->start(doc, settings, &report, {.cache = &cache_, .reuse = reuse, .targets = targets})) {
    if (validation) *validation = report;
    if (why) {
      const QList<core::Issue> errors = report.errors();
      *why = errors.isEmpty() ? QString("The executor refused to start.")
                              : QString("Not started: %1 problem(s), first: %2")
                                    .arg(errors.size())
                                    .arg(errors.first().text());
    }
    return false;
  }
  if (validation) *validation = report;
  began();
  return true;
}

bool RunController::startProcesses(const core::GraphDocument& doc, const ProcessRunOptions& options,
                                   core::ValidationReport* validation, QString* why) {
  if (active_) {
    if (why) *why = "A run is already going: cancel it or wait for it to finish before starting another.";
    return false;
  }
  core::RunSettings settings = core::RunSettings::fromGraph(doc.settings());
  settings.files = options.files;
  const core::ValidationReport report = core::validate(doc, *registry_, settings);
  if (validation) *validation = report;
  // Without a host file every rank runs on this machine, so what validation finds here holds for each of
  // them: refused before a job is started, as a local run would be.
  if (!report.ok() && options.hostFile.isEmpty()) {
    const QList<core::Issue> errors = report.errors();
    if (why)
      *why = QString("Not started: %1 problem(s), first: %2").arg(errors.size()).arg(errors.first().text());
    return false;
  }
  auto job = std::make_unique<ProcessRun>();
  connect(job.get(), &ProcessRun::output, this, &RunController::output);
  if (!job->start(doc, options, why)) return false;
  exec_.reset();
  proc_ = std::move(job);
  began();
  return true;
}

void RunController::began() {
  spans_.clear();
  memory_.clear();
  droppedSpans_ = 0;
  active_ = true;
  cancelling_ = false;
  ++runs_;
  clock_.start();
  timer_.start();
  emit started();
}

void RunController::cancel() {
  if (!active_) return;
  if (proc_) {
    cancelling_ = true;
    proc_->cancel();
    return;
  }
  if (!exec_) return;
  cancelling_ = true;
  exec_->cancel();
}

QJsonObject RunController::report() const {
  if (proc_) return proc_->report();
  return exec_ ? exec_->report() : QJsonObject();
}

bool RunController::keep(const QList<core::RunEvent>& events, bool* ok, QString* message) {
  QList<core::TraceSpan> spans;
  QList<core::MemorySampleEvent> memory;
  bool done = false;
  for (const core::RunEvent& e : events) {
    if (e.kind == core::RunEvent::Kind::Span) spans.append(e.span);
    if (e.kind == core::RunEvent::Kind::Memory) memory.append(e.memory);
    if (e.kind == core::RunEvent::Kind::RunFinished) {
      done = true;
      *ok = e.ok;
      *message = e.message;
    }
  }
  droppedSpans_ += appendKeepingNewest(spans_, spans);
  appendKeepingNewest(memory_, memory);
  return done;
}

void RunController::pollProcesses() {
  // Asked before the events are taken: once the job has ended, every event it sent is already queued.
  const bool ended = proc_->hasEnded();
  const QList<core::RunEvent> events = proc_->takeEvents();
  bool ok = true;
  QString message;
  keep(events, &ok, &message);
  if (!events.isEmpty()) emit batch(events);
  // Rank 0's RunFinished is not the end: its report is written after it, and mpirun's exit code (a rank
  // lost after rank 0 finished) can still fail the run.
  if (!ended) return;
  timer_.stop();
  lastWallMs_ = proc_->report().value("wall_ms").toDouble(double(clock_.nsecsElapsed()) / 1e6);
  active_ = false;
  cancelling_ = false;
  const bool cancelled = proc_->cancelled();
  emit finished(proc_->ok() && !cancelled, cancelled, proc_->message());
}

void RunController::poll() {
  if (proc_) {
    pollProcesses();
    return;
  }
  if (!exec_) return;
  QList<core::RunEvent> events = exec_->events().drain();
  bool ok = true;
  QString message;
  bool done = keep(events, &ok, &message);
  if (!done && !exec_->isRunning()) {
    // The thread has ended: whatever it pushed last is in the channel now.
    const QList<core::RunEvent> rest = exec_->events().drain();
    keep(rest, &ok, &message);
    events += rest;
    done = true;
  }
  if (!events.isEmpty()) emit batch(events);
  if (done) {
    exec_->wait();
    timer_.stop();
    lastWallMs_ = exec_->report().value("wall_ms").toDouble(double(clock_.nsecsElapsed()) / 1e6);
    active_ = false;
    const bool cancelled = exec_->wasCancelled() || cancelling_;
    cancelling_ = false;
    emit finished(ok && !cancelled, cancelled, message);
  }
}

}  // namespace gn::editor
