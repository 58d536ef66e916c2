// MainWindow's files: the document (new, open, save, recent, examples), the crash-recovery copy, and the
// exports of a run (trace, metrics, report, plot). Kept apart from main_window.cpp, which holds the window's
// other jobs.
#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QComboBox>
#include <QCoreApplication>
#include <QDateTime>
#include <QDir>
#include <QDockWidget>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontDatabase>
#include <QInputDialog>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenu>
#include <QMenuBar>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QSaveFile>
#include <QSet>
#include <QSettings>
#include <QSpinBox>
#include <QStackedWidget>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>
#include <QUndoStack>
#include <QVBoxLayout>

#include "attention_view.h"
#include "canvas/graph_view.h"
#include "file_consent.h"
#include "gpunodes/core/executor.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/report_format.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/subgraph.h"
#include "graph_editor.h"
#include "inspector.h"
#include "main_window.h"
#include "main_window.h"
#include "minimap.h"
#include "model_conversion.h"
#include "palette.h"
#include "plots.h"
#include "process_dialog.h"
#include "run_controller.h"
#include "style.h"
#include "subgraph_navigator.h"
#include "timeline.h"

namespace gn::editor {

namespace {
constexpr int kMaxRecent = 10;

QString metaPath() {
  return MainWindow::recoveryDir() + "/recovery.meta.json";
}

bool writeBytes(const QString& path, const QByteArray& bytes, QString* error) {
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly) || f.write(bytes) != bytes.size() || !f.commit()) {
    if (error) *error = QString("%1: %2").arg(path, f.errorString());
    return false;
  }
  return true;
}
}  // namespace

// ---------------------------------------------------------------------------------------------- files

bool MainWindow::isDirty() const {
  return forcedDirty_ || !editor_->undoStack()->isClean();
}

void MainWindow::updateTitle() {
  const QString name = !file_.isEmpty()         ? QFileInfo(file_).fileName()
                       : !doc_.name().isEmpty() ? doc_.name()
                                                : QString("Untitled");
  setWindowTitle(QString("%1[*] — gpunodes").arg(name));
  setWindowModified(isDirty());
}

void MainWindow::setDocumentFrom(core::GraphDocument& loaded, const QString& file) {
  if (run_->isRunning()) {
    run_->cancel();
    staleRun_ = true;
  }
  scene_->clearSelection();
  doc_.replaceAll(loaded);
  editor_->undoStack()->clear();
  editor_->undoStack()->setClean();
  forcedDirty_ = false;
  file_ = file;
  fromExample_.clear();
  navigator_->resetRunState();
  // Frame the graph rather than trust the file's view: node sizes differ between versions and screens.
  view_->frame(false, 1.0);
  inspector_->showNodes({});
  updateTitle();
  validateNow();
}

void MainWindow::newGraph() {
  core::GraphDocument empty;
  empty.setSettings(QJsonObject{{"schedule", "parallel"}, {"cpu_devices", 2}});
  setDocumentFrom(empty, {});
  view_->setZoom(1);
  view_->centerOn(300, 150);
}

bool MainWindow::maybeSave() {
  if (!isDirty()) return true;
  // Name the graph as the title bar does, and say where it came from when it has no file of its own.
  const QString name = doc_.name().isEmpty() ? QString() : QString("\u201c%1\u201d").arg(doc_.name());
  const QString what = !file_.isEmpty()        ? QString("the changes to %1").arg(QFileInfo(file_).fileName())
                       : !fromExample_.isEmpty() ? QString("%1, an unsaved copy of the example %2")
                                                     .arg(name.isEmpty() ? QString("this graph") : name,
                                                          fromExample_)
                       : !name.isEmpty()         ? QString("%1, which has not been saved yet").arg(name)
                                                 : QString("the untitled graph");
  const auto answer = ask(QMessageBox::Question, "Unsaved changes", QString("Save %1?").arg(what),
                          QMessageBox::Save | QMessageBox::Discard | QMessageBox::Cancel);
  if (answer == QMessageBox::Save) return save();
  return answer == QMessageBox::Discard;
}

bool MainWindow::openFile(const QString& path) {
  if (!maybeSave()) return false;
  return loadFile(path);
}

bool MainWindow::loadFile(const QString& path) {
  core::GraphDocument loaded;
  QString error;
  if (!core::serializer::loadFile(path, loaded, &error)) {
    showError("Cannot open graph", error.isEmpty() ? QString("%1: unreadable").arg(path) : error);
    return false;
  }
  // Examples are templates: saving one asks for a new place instead of writing into the install.
  const bool example = QFileInfo(path).absolutePath() == QFileInfo(examplesDir()).absoluteFilePath();
  setDocumentFrom(loaded, example ? QString() : QFileInfo(path).absoluteFilePath());
  fromExample_ = example ? QFileInfo(path).fileName() : QString();
  if (!example) addRecent(QFileInfo(path).absoluteFilePath());
  logMessage(LogLevel::Info, QString("Opened %1 (%2 nodes, %3 wires)")
                                 .arg(path)
                                 .arg(doc_.nodes().size())
                                 .arg(doc_.connections().size()));
  for (const core::GraphNode& n : doc_.nodes())
    if (!editor_->specOf(n.id))
      logMessage(
          LogLevel::Warning,
          QString("type '%1' is not provided by any loaded plugin; kept as a missing node").arg(n.type),
          n.id);
  logProblems(QFileInfo(path).fileName());
  return true;
}

void MainWindow::logProblems(const QString& fileName) {
  // A file that opens can still be one a run refuses (a cycle, a bad param, a bad setting): say so when it
  // opens, in the log and the status bar, not first at Run. Graph-level problems have no node to paint.
  constexpr int kMaxLogged = 50;  // a hostile file holds thousands; the rest are painted on their nodes
  QSet<QString> cycles;           // one cycle is one message on each of its nodes
  int problems = 0;
  for (const core::Issue& i : validation_.errors()) {
    if (i.message.startsWith("cycle: ")) {
      if (cycles.contains(i.message)) continue;
      cycles.insert(i.message);
    }
    if (problems++ < kMaxLogged)
      logMessage(LogLevel::Error, i.field.isEmpty() ? i.message : i.field + ": " + i.message, i.node);
  }
  if (problems == 0) return;
  if (problems > kMaxLogged)
    logMessage(LogLevel::Error,
               QString("... and %1 more problems, marked on their nodes").arg(problems - kMaxLogged));
  // The log comes to the front of its dock, so the messages are in view without a click.
  if (auto* logDock = findChild<QDockWidget*>("logDock")) logDock->raise();
  statusBar()->showMessage(QString("%1 has %2 problem%3 a run would refuse: see the log and the marked nodes")
                               .arg(fileName)
                               .arg(problems)
                               .arg(problems == 1 ? "" : "s"),
                           10000);
}

bool MainWindow::saveFile(const QString& path) {
  // Remember where the user was looking.
  const QPointF c = view_->mapToScene(view_->viewport()->rect().center());
  // Merged into the view object: it also holds the collapsed nodes.
  QJsonObject view = doc_.view();
  view.insert("zoom", view_->zoom());
  view.insert("center", QJsonArray{qRound(c.x()), qRound(c.y())});
  doc_.setView(view);
  QString error;
  if (!core::serializer::saveFile(path, doc_, &error)) {
    showError("Cannot save graph", error);
    return false;
  }
  file_ = QFileInfo(path).absoluteFilePath();
  fromExample_.clear();
  editor_->undoStack()->setClean();
  forcedDirty_ = false;
  addRecent(file_);
  updateTitle();
  statusBar()->showMessage("Saved " + file_, 3000);
  QFile::remove(recoveryPath());
  QFile::remove(metaPath());
  return true;
}

bool MainWindow::save() {
  return file_.isEmpty() ? saveAs() : saveFile(file_);
}

bool MainWindow::saveAs() {
  QString suggested = file_;
  if (suggested.isEmpty())
    suggested = QDir::home().filePath(
        (doc_.name().isEmpty() ? QString("graph") : doc_.name()).toLower().replace(' ', '-') + ".json");
  const QString path =
      QFileDialog::getSaveFileName(this, "Save graph", suggested, "gpunodes graphs (*.json)");
  if (path.isEmpty()) return false;
  return saveFile(path.endsWith(".json") ? path : path + ".json");
}

void MainWindow::addRecent(const QString& path) {
  QSettings s;
  QStringList recent = s.value("recentFiles").toStringList();
  recent.removeAll(path);
  recent.prepend(path);
  while (recent.size() > kMaxRecent) recent.removeLast();
  s.setValue("recentFiles", recent);
}

void MainWindow::rebuildRecentMenu() {
  recentMenu_->clear();
  const QStringList recent = QSettings().value("recentFiles").toStringList();
  for (const QString& path : recent)
    recentMenu_->addAction(QFileInfo(path).fileName() + "   " + QFileInfo(path).absolutePath(), this,
                           [this, path] { openFile(path); });
  if (recent.isEmpty()) recentMenu_->addAction("No recent files")->setEnabled(false);
}

QString MainWindow::examplesDir() {
  const QString env = qEnvironmentVariable("GPUNODES_EXAMPLES");
  if (!env.isEmpty() && QDir(env).exists()) return QDir(env).absolutePath();
  const QString bin = QCoreApplication::applicationDirPath();
  for (const char* rel :
       {"/../resources/examples", "/../share/gpunodes/examples", "/../../resources/examples"})
    if (QDir(bin + rel).exists()) return QDir(bin + QString(rel)).absolutePath();
  return QDir(GPUNODES_SOURCE_EXAMPLES_DIR).absolutePath();
}

void MainWindow::rebuildExamplesMenu() {
  examplesMenu_->clear();
  const QDir dir(examplesDir());
  const QStringList files = dir.entryList({"*.json"}, QDir::Files, QDir::Name);
  for (const QString& f : files) {
    const QString path = dir.filePath(f);
    QString title = QFileInfo(f).completeBaseName(), tip;
    QFile file(path);
    if (file.size() < (1 << 20) && file.open(QIODevice::ReadOnly)) {
      const QJsonObject o = QJsonDocument::fromJson(file.readAll()).object();
      if (!o.value("name").toString().isEmpty()) title = o.value("name").toString() + "   (" + f + ")";
      tip = o.value("description").toString();
    }
    QAction* a = examplesMenu_->addAction(title, this, [this, path] { openFile(path); });
    a->setToolTip(tip);
  }
  examplesMenu_->setToolTipsVisible(true);
  if (files.isEmpty()) examplesMenu_->addAction("No examples in " + dir.path())->setEnabled(false);
}

// ---------------------------------------------------------------------------------------------- recovery

QString MainWindow::recoveryDir() {
  QString dir = qEnvironmentVariable("GPUNODES_RECOVERY_DIR");
  if (dir.isEmpty()) dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
  QDir().mkpath(dir);
  return dir;
}

QString MainWindow::recoveryPath() {
  return recoveryDir() + "/recovery.json";
}

void MainWindow::setAutosaveIntervalMs(int ms) {
  autosaveTimer_.start(ms);
}

bool MainWindow::writeRecovery() {
  if (!isDirty()) {
    QFile::remove(recoveryPath());
    QFile::remove(metaPath());
    return false;
  }
  QString error;
  if (!core::serializer::saveFile(recoveryPath(), doc_, &error)) {
    logMessage(LogLevel::Warning, "Autosave failed: " + error);
    return false;
  }
  const QJsonObject meta{{"file", file_}, {"saved", QDateTime::currentDateTime().toString(Qt::ISODate)}};
  writeBytes(metaPath(), QJsonDocument(meta).toJson(), nullptr);
  return true;
}

bool MainWindow::offerRecovery() {
  if (!QFile::exists(recoveryPath())) return false;
  QJsonObject meta;
  QFile mf(metaPath());
  if (mf.open(QIODevice::ReadOnly)) meta = QJsonDocument::fromJson(mf.readAll()).object();
  const QString original = meta.value("file").toString();
  const QString when =
      QDateTime::fromString(meta.value("saved").toString(), Qt::ISODate).toString("yyyy-MM-dd HH:mm");
  const auto answer =
      ask(QMessageBox::Question, "Restore unsaved work?",
          QString("gpunodes did not close cleanly last time. Restore the unsaved graph%1%2?")
              .arg(original.isEmpty() ? QString() : " (" + QFileInfo(original).fileName() + ")",
                   when.isEmpty() ? QString() : " from " + when),
          QMessageBox::Yes | QMessageBox::No);
  if (answer != QMessageBox::Yes) {
    QFile::remove(recoveryPath());
    QFile::remove(metaPath());
    return false;
  }
  core::GraphDocument loaded;
  QString error;
  if (!core::serializer::loadFile(recoveryPath(), loaded, &error)) {
    showError("Cannot restore", error);
    return false;
  }
  setDocumentFrom(loaded, original);
  forcedDirty_ = true;  // restored work is not saved anywhere yet
  updateTitle();
  logMessage(LogLevel::Info, "Restored unsaved work from the recovery file.");
  return true;
}

void MainWindow::closeEvent(QCloseEvent* e) {
  if (!maybeSave()) {
    e->ignore();
    return;
  }
  if (run_->isRunning()) run_->cancel();
  QSettings s;
  s.setValue("window/geometry", saveGeometry());
  s.setValue("window/state", saveState());
  // A clean exit leaves nothing to recover.
  QFile::remove(recoveryPath());
  QFile::remove(metaPath());
  e->accept();
}

// ---------------------------------------------------------------------------------------------- exports

QString MainWindow::exportPath(const QString& title, const QString& suffix, const QString& filter) {
  const QString base = file_.isEmpty()
                           ? QDir::home().filePath("gpunodes")
                           : QFileInfo(file_).absolutePath() + "/" + QFileInfo(file_).completeBaseName();
  return chooseFile(title, base + "-" + suffix, filter, true);
}

QString MainWindow::chooseFile(const QString& title, const QString& suggested, const QString& filter,
                               bool forWriting) {
  if (chooseFile_) return chooseFile_(title, suggested, filter, forWriting);
  return forWriting ? QFileDialog::getSaveFileName(this, title, suggested, filter)
                    : QFileDialog::getOpenFileName(this, title, suggested, filter);
}

bool MainWindow::exportTrace(const QString& path) {
  QString error;
  if (!writeBytes(path, core::chromeTrace(run_->spans(), run_->memory()), &error)) {
    showError("Export trace", error);
    return false;
  }
  const QString kept = run_->droppedSpans() > 0 ? QString("the newest %L1 spans; %L2 older were not kept")
                                                      .arg(run_->spans().size())
                                                      .arg(run_->droppedSpans())
                                                : QString("%1 spans").arg(run_->spans().size());
  logMessage(LogLevel::Info,
             QString("Wrote the trace (%1) to %2; open it in Perfetto or chrome://tracing").arg(kept, path));
  return true;
}

bool MainWindow::exportMetricsCsv(const QString& path) {
  // The same bytes as `gpunodes run --metrics` writes for the same run.
  const QByteArray csv = core::metricsCsv(run_->report().value("metrics").toObject());
  QString error;
  if (!writeBytes(path, csv, &error)) {
    showError("Export metrics", error);
    return false;
  }
  logMessage(LogLevel::Info, "Wrote metrics to " + path);
  return true;
}

bool MainWindow::exportReport(const QString& path) {
  const QJsonObject report = run_->report();
  if (report.isEmpty()) {
    showError("Export report", "There is no run to report yet: run the graph first.");
    return false;
  }
  QString error;
  if (!writeBytes(path, QJsonDocument(report).toJson(QJsonDocument::Indented), &error)) {
    showError("Export report", error);
    return false;
  }
  logMessage(LogLevel::Info, "Wrote the report to " + path);
  return true;
}

void MainWindow::exportPlotAs(const QString& format) {
  const QString p = exportPath("Export plot", "plot." + format, format.toUpper() + " (*." + format + ")");
  if (!p.isEmpty()) exportPlot(p);
}

bool MainWindow::exportPlot(const QString& path) {
  QString error;
  if (!plots_->exportVisible(path, &error)) {
    showError("Export plot", error);
    return false;
  }
  logMessage(LogLevel::Info, "Wrote the plot to " + path);
  return true;
}

}  // namespace gn::editor
