#include "run_controller.h"

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "recent.h"

namespace gn::editor {

RunController::RunController(const core::NodeTypeRegistry* registry, QObject* parent)
    : QObject(parent), registry_(registry) {
  timer_.setInterval(50);  // 20 Hz: smooth enough for plots, cheap enough to never stall editing
  connect(&timer_, &QTimer::timeout, this, &RunController::poll);
}

RunController::~RunController() {
  if (exec_) exec_->cancel();  // the executor's destructor then waits for its thread
}

bool RunController::start(const core::GraphDocument& doc, core::ValidationReport* validation, QString* why) {
  if (active_) {
    if (why) *why = "A run is already going: cancel it or wait for it to finish before starting another.";
    return false;
  }
  // A fresh executor per run: the previous one's report stays readable until this point.
  exec_ = std::make_unique<core::Executor>(*registry_);
  const core::RunSettings settings = core::RunSettings::fromGraph(doc.settings());
  core::ValidationReport report;
  if (!exec_->start(doc, settings, &report)) {
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
  spans_.clear();
  memory_.clear();
  droppedSpans_ = 0;
  active_ = true;
  cancelling_ = false;
  ++runs_;
  clock_.start();
  timer_.start();
  emit started();
  return true;
}

void RunController::cancel() {
  if (!active_ || !exec_) return;
  cancelling_ = true;
  exec_->cancel();
}

QJsonObject RunController::report() const {
  return exec_ ? exec_->report() : QJsonObject();
}

void RunController::poll() {
  if (!exec_) return;
  QList<core::RunEvent> events = exec_->events().drain();
  bool done = false, ok = true;
  QString message;
  auto scan = [&](const QList<core::RunEvent>& list) {
    QList<core::TraceSpan> spans;
    QList<core::MemorySampleEvent> memory;
    for (const core::RunEvent& e : list) {
      if (e.kind == core::RunEvent::Kind::Span) spans.append(e.span);
      if (e.kind == core::RunEvent::Kind::Memory) memory.append(e.memory);
      if (e.kind == core::RunEvent::Kind::RunFinished) {
        done = true;
        ok = e.ok;
        message = e.message;
      }
    }
    droppedSpans_ += appendKeepingNewest(spans_, spans);
    appendKeepingNewest(memory_, memory);
  };
  scan(events);
  if (!done && !exec_->isRunning()) {
    // The thread has ended: whatever it pushed last is in the channel now.
    const QList<core::RunEvent> rest = exec_->events().drain();
    scan(rest);
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
