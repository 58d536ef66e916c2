// MainWindow's runs: validation as the graph changes, Run / Run all / Run to here / Run on processes, the
// events a run sends while it goes, and its end. Kept apart from main_window.cpp, which holds the window's
// other jobs (documents, docks, actions, exports).
#include <QDialog>
#include <QDir>
#include <QFileInfo>
#include <QJsonObject>
#include <QLabel>
#include <QProgressBar>
#include <QStatusBar>

#include "gpunodes/core/executor.h"
#include "attention_view.h"
#include "inspector.h"
#include "minimap.h"
#include "main_window.h"
#include "plots.h"
#include "process_dialog.h"
#include "run_controller.h"
#include "style.h"
#include "subgraph_navigator.h"
#include "timeline.h"

namespace gn::editor {


namespace {
// One key per problem as the user reads it: a cycle is one message however many nodes it marks.
QString issueKey(const core::Issue& i) {
  if (i.message.startsWith("cycle: ")) return i.message;
  return QString("%1\n%2\n%3\n%4").arg(int(i.severity)).arg(i.node, i.field, i.message);
}
}  // namespace

QString MainWindow::documentFolder() const {
  // An opened example has no file of its own: its relative paths are its examples folder's.
  return fromExample_.isEmpty() ? QDir::currentPath() : examplesDir();
}

core::ValidationReport MainWindow::validateNow() {
  validateTimer_.stop();
  core::ValidationReport r;
  if (registry_) {
    // With the graph's folder, so that its nodes show what a run would refuse or ask about.
    core::RunSettings settings = core::RunSettings::fromGraph(doc_.settings());
    settings.files = FileConsent::remembered(doc_, *registry_, file_, documentFolder());
    r = core::validate(doc_, *registry_, settings);
  }
  navigator_->setValidation(r);
  inspector_->setValidation(navigator_->reportFor(navigator_->depth()));
  validation_ = r;
  issueKeys_.clear();
  for (const core::Issue& i : r.issues()) issueKeys_.insert(issueKey(i));
  return r;
}

void MainWindow::logNewIssues(const QSet<QString>& before, const core::ValidationReport& report) {
  // After an edit, the log gets each problem once, when it appears: one that stays through later edits (a
  // param stepped through several values) is not repeated. Opening a file and F7 log everything instead.
  constexpr int kMaxLogged = 20;  // a paste of a thousand broken nodes is marked on the canvas, not listed
  QSet<QString> seen;
  int fresh = 0;
  QString first;
  for (const core::Issue& i : report.issues()) {
    const QString key = issueKey(i);
    // An open required input is how every node starts out while it is being wired: marked on the node,
    // not announced each time one is added.
    if (i.message.startsWith("required input is not connected")) continue;
    if (before.contains(key) || seen.contains(key)) continue;
    seen.insert(key);
    const QString text = i.field.isEmpty() ? i.message : i.field + ": " + i.message;
    if (fresh++ < kMaxLogged)
      logMessage(i.severity == core::Issue::Severity::Error ? LogLevel::Error : LogLevel::Warning, text,
                 i.node);
    if (first.isEmpty() && i.severity == core::Issue::Severity::Error)
      first = i.node.isEmpty() ? text : i.node + ": " + text;
  }
  if (fresh > kMaxLogged)
    logMessage(LogLevel::Error,
               QString("... and %1 more new problems, marked on their nodes").arg(fresh - kMaxLogged));
  if (!first.isEmpty()) statusBar()->showMessage(first, 6000);
}

QString MainWindow::runStateText() const {
  return stateLabel_->text();
}

void MainWindow::updateRunActions() {
  // Run stays enabled while running so a second press explains why it is refused.
  cancelAction_->setEnabled(run_->isRunning() && !run_->isCancelling());
}

bool MainWindow::runGraph() {
  return startRun(nullptr);
}

bool MainWindow::runAll() {
  return startRun(nullptr, false);
}

bool MainWindow::runToHere(const QStringList& nodeIds) {
  if (nodeIds.isEmpty()) {
    const QString why = "Run to here: select the nodes to run first";
    statusBar()->showMessage(why, 5000);
    lastMessage_ = why;
    return false;
  }
  return startRun(nullptr, true, nodeIds);
}

bool MainWindow::runOnProcesses(const ProcessRunOptions& options) {
  ProcessRunOptions o = options;
  // Across machines every rank reads the graph from the temporary copy: put it beside the graph's own file,
  // which sits in a folder the hosts share when its data does; the system's temporary folder is local.
  if (!o.hostFile.isEmpty() && o.tempParent.isEmpty() && !file_.isEmpty())
    o.tempParent = QFileInfo(file_).absolutePath();
  else if (!o.hostFile.isEmpty() && o.tempParent.isEmpty() && !run_->isRunning())
    logMessage(LogLevel::Warning,
               "The graph has no file yet, so its copy for the ranks is in this machine's temporary folder, "
               "which the other hosts may not see: save the graph in a shared folder first.");
  return startRun(&o);
}

bool MainWindow::runOnProcessesDialog() {
  if (run_->isRunning()) return startRun(nullptr);  // refused, saying why, before any question is asked
  ProcessRunDialog dialog(this);
  if (dialog.exec() != QDialog::Accepted) return false;
  return runOnProcesses(dialog.options());
}

bool MainWindow::startRun(const ProcessRunOptions* processes, bool reuse, const QStringList& targets) {
  if (run_->isRunning()) {
    const QString why = "A run is already going: cancel it or wait for it to finish before starting another.";
    statusBar()->showMessage(why, 5000);
    logMessage(LogLevel::Warning, why);
    lastMessage_ = why;
    return false;
  }
  const std::optional<core::FilePolicy> files =
      FileConsent::decide(doc_, *registry_, file_, documentFolder(), [this](const QString& title, const QString& text) {
        return ask(QMessageBox::Warning, title, text, QMessageBox::Yes | QMessageBox::Cancel) == QMessageBox::Yes;
      });
  if (!files) {
    const QString why = "Not started: writing outside the graph's folder was not allowed";
    logMessage(LogLevel::Warning, why);
    statusBar()->showMessage(why, 6000);
    lastMessage_ = why;
    return false;
  }
  navigator_->resetRunState();
  staleRun_ = false;
  core::ValidationReport report;
  QString why;
  ProcessRunOptions onProcesses = processes ? *processes : ProcessRunOptions{};
  onProcesses.files = *files;
  const bool started = processes ? run_->startProcesses(doc_, onProcesses, &report, &why)
                                 : run_->start(doc_, *files, &report, &why, reuse, targets);
  if (!started) {
    navigator_->setValidation(report);
    inspector_->setValidation(navigator_->reportFor(navigator_->depth()));
    for (const core::Issue& i : report.issues())
      logMessage(i.severity == core::Issue::Severity::Error ? LogLevel::Error : LogLevel::Warning, i.message,
                 i.node);
    logMessage(LogLevel::Error, why);
    stateLabel_->setText("Not started");
    statusBar()->showMessage(why, 6000);
    lastMessage_ = why;
    return false;
  }
  navigator_->setValidation(report);
  QStringList order;
  for (const core::GraphNode& n : doc_.nodes()) order << n.id;
  const QJsonObject s = doc_.settings();
  // The timing history tells runs apart by this label: a run under mpirun says on how many ranks it ran.
  const int ranks = processes ? processes->processes : 0;
  const QString label =
      QString("#%1 %2%3, %4 cpu")
          .arg(run_->runCount())
          .arg(ranks > 0 ? QString("%1 rank%2, ").arg(ranks).arg(ranks == 1 ? "" : "s") : QString())
          .arg(s.value("schedule").toString("parallel"))
          .arg(s.value("cpu_devices").toInt(1));
  plots_->beginRun(label, order, runSettings(doc_));
  timeline_->clear();
  timeline_->setNodeOrder(order);
  devicesInUse_.clear();
  finishedOrder_.clear();
  devicesLabel_->clear();
  stateLabel_->setText("Running…");
  progress_->setValue(0);
  progress_->show();
  logMessage(LogLevel::Info, QString("Run %1 started").arg(label));
  if (processes) {
    logMessage(LogLevel::Info, ProcessRunOptions::commandText(run_->processRun()->commandLine()));
    if (!report.ok())
      logMessage(LogLevel::Warning,
                 QString("Validation on this machine found %1 problem(s); started anyway, since the host "
                         "file's machines may differ: rank 0 validates the graph where it runs")
                     .arg(report.errors().size()));
  }
  updateRunActions();
  return true;
}

void MainWindow::cancelRun() {
  if (!run_->isRunning()) return;
  run_->cancel();
  stateLabel_->setText("Cancelling…");
  updateRunActions();
}

void MainWindow::onBatch(const QList<core::RunEvent>& events) {
  using K = core::RunEvent::Kind;
  if (staleRun_) return;
  QList<core::TraceSpan> spans;
  QList<core::MemorySampleEvent> memory;
  for (const core::RunEvent& e : events) {
    switch (e.kind) {
      case K::RunStarted:
        break;
      case K::RunFinished:
        break;
      case K::NodeQueued:
        navigator_->setRunStatus(e.node, RunStatus::Queued);
        break;
      case K::NodeStarted:
        navigator_->setRunStatus(e.node, RunStatus::Running);
        break;
      case K::NodeFinished:
        navigator_->setRunStatus(e.node, RunStatus::Done, e.value);
        plots_->setNodeTime(e.node, e.value);
        finishedOrder_ << e.node;
        break;
      case K::NodeCached:
        navigator_->setCached(e.node);
        finishedOrder_ << e.node;
        break;
      case K::NodeFailed:
        // Bypassed and muted nodes are drawn as such from the document: not run, as asked.
        if (e.status == core::NodeStatus::Bypassed || e.status == core::NodeStatus::Muted) break;
        // Skipped and cancelled nodes end on this event too; they are grey, not red.
        if (e.status == core::NodeStatus::Skipped || e.status == core::NodeStatus::Cancelled) {
          navigator_->setRunStatus(e.node, RunStatus::Cancelled);
          navigator_->setRunWarning(e.node, e.message);
          logMessage(LogLevel::Warning, e.message, e.node);
        } else {
          navigator_->setRunStatus(e.node, RunStatus::Failed, 0, e.message);
          logMessage(LogLevel::Error, e.message, e.node);
        }
        break;
      case K::NodeWarning:
        navigator_->setRunWarning(e.node, e.message);
        logMessage(LogLevel::Warning, e.message, e.node);
        break;
      case K::Progress:
        if (e.node.isEmpty())
          progress_->setValue(int(qBound(0.0, e.value, 1.0) * 1000));
        else
          navigator_->setProgress(e.node, e.value);
        break;
      case K::Metric:
        plots_->addMetric(e.series, e.t, e.value);
        break;
      case K::Span:
        spans << e.span;
        if (!e.span.device.isEmpty() && !devicesInUse_.contains(e.span.device))
          devicesInUse_ << e.span.device;
        break;
      case K::Memory:
        memory << e.memory;
        break;
    }
  }
  timeline_->addSpans(spans);
  plots_->addMemory(memory);
  navigator_->currentView()->minimap()->scheduleUpdate();
  plots_->refresh();
  wallLabel_->setText(style::formatMs(run_->elapsedMs()));
  devicesInUse_.sort();
  devicesLabel_->setText(devicesInUse_.isEmpty() ? QString() : "devices: " + devicesInUse_.join(", "));
}

void MainWindow::onRunFinished(bool ok, bool cancelled, const QString& message) {
  if (staleRun_) {
    staleRun_ = false;
    progress_->hide();
    stateLabel_->setText("Idle");
    updateRunActions();
    return;
  }
  const QJsonObject report = run_->report();
  const double wall = report.value("wall_ms").toDouble(run_->elapsedMs());
  plots_->setRunWall(wall);
  const QJsonObject nodes = report.value("nodes").toObject();
  for (auto it = nodes.begin(); it != nodes.end(); ++it) {
    const QJsonObject n = it.value().toObject();
    const QString status = n.value("status").toString();
    if (status == "ok" && n.value("cached").toBool()) {
      if (!finishedOrder_.contains(it.key())) finishedOrder_ << it.key();
      navigator_->setCached(it.key());
    } else if (status == "ok") {
      // A node whose NodeFinished event this window did not see still counts as finished, after the others.
      if (!finishedOrder_.contains(it.key())) finishedOrder_ << it.key();
      navigator_->setRunStatus(it.key(), RunStatus::Done, n.value("wall_ms").toDouble());
      plots_->setNodeTime(it.key(), n.value("wall_ms").toDouble());
    } else if (status == "pending" || status == "running") {
      navigator_->setRunStatus(it.key(), RunStatus::Cancelled);
    }
  }
  plots_->refresh();
  updateCacheLabel();
  plots_->setEvaluations(nodes, finishedOrder_);
  showSelectedEvaluation();
  // An attention layer's node (and a block holding one) previews the weights an Evaluate node recorded.
  navigator_->setPreviews(withAttentionOnLayers(report));
  wallLabel_->setText("wall " + style::formatMs(wall));
  QStringList devs;
  for (const QJsonValue& d : report.value("devices").toArray())
    devs << (d.isObject() ? d.toObject().value("device").toString(d.toObject().value("name").toString())
                          : d.toString());
  devs.removeAll(QString());
  if (!devicesInUse_.isEmpty()) devs = devicesInUse_;
  devicesLabel_->setText(devs.isEmpty() ? QString() : "devices: " + devs.join(", "));
  progress_->hide();
  const QString state = cancelled ? QString("Cancelled") : ok ? QString("Done") : QString("Failed");
  stateLabel_->setText(state);
  if (cancelled)
    logMessage(LogLevel::Warning, QString("Run cancelled after %1").arg(style::formatMs(wall)));
  else if (ok)
    logMessage(LogLevel::Info, QString("Run finished in %1").arg(style::formatMs(wall)));
  else
    logMessage(LogLevel::Error,
               QString("Run failed after %1%2")
                   .arg(style::formatMs(wall), message.isEmpty() ? QString() : ": " + message));
  // Why a run failed belongs where the eye goes after the state turns red (under mpirun, the job's last
  // words: a rank lost, a failed start).
  if (!ok && !cancelled) {
    lastMessage_ = "Run failed" + (message.isEmpty() ? QString() : ": " + message);
    statusBar()->showMessage(lastMessage_, 15000);
  }
  updateRunActions();
}

}  // namespace gn::editor
