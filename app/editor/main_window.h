// The editor's main window: the canvas in the centre; Palette, Inspector, Plots, Timeline, Log and Devices
// docks (their layout is restored at start); files with a dirty marker, recent files, examples, autosave
// and crash recovery; and runs that stream into the canvas, plots and timeline without blocking.
#pragma once
#include <QMainWindow>
#include <QMessageBox>
#include <QSet>
#include <QTimer>
#include <functional>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/validation.h"
#include "process_run.h"

class QComboBox;
class QLabel;
class QListWidget;
class QPlainTextEdit;
class QProgressBar;
class QSpinBox;
class QDockWidget;

namespace gn::core {
class NodeTypeRegistry;
struct RunEvent;
}  // namespace gn::core

namespace gn::editor {

class GraphEditor;
class GraphScene;
class GraphView;
class InspectorPanel;
class PalettePanel;
class PlotsPanel;
class RunController;
class TimelineView;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(const core::NodeTypeRegistry* registry, QWidget* parent = nullptr);
  ~MainWindow() override;

  // Every question and error message goes through this, so tests can answer without a modal dialog.
  using PromptFn =
      std::function<QMessageBox::StandardButton(QMessageBox::Icon icon, const QString& title,
                                                const QString& text, QMessageBox::StandardButtons buttons)>;
  void setPromptHandler(PromptFn fn) { prompt_ = std::move(fn); }

  // Files. The *File variants take a path and never show a file dialog.
  void newGraph();
  bool openFile(const QString& path);  // asks to save unsaved changes first
  bool loadFile(const QString& path);  // a bad file leaves the current document as it was
  bool saveFile(const QString& path);
  bool save();
  bool saveAs();
  bool maybeSave();  // false when the user cancels
  bool isDirty() const;
  QString currentFile() const { return file_; }
  static QString examplesDir();

  // Crash recovery: the document is written to recoveryPath() every autosave interval while it has unsaved
  // changes, and removed on a clean exit; the next start offers to restore it.
  static QString recoveryDir();
  static QString recoveryPath();
  bool writeRecovery();
  bool offerRecovery();
  void setAutosaveIntervalMs(int ms);

  // Runs.
  bool runGraph();
  // The same on several processes under mpirun (Run ▸ Run on processes…, which asks for the options first);
  // its events reach the plots, timeline, canvas and log as a local run's do.
  bool runOnProcesses(const ProcessRunOptions& options);
  bool runOnProcessesDialog();
  void cancelRun();
  core::ValidationReport validateNow();

  // Exports (from the last run).
  bool exportTrace(const QString& path);
  bool exportMetricsCsv(const QString& path);
  bool exportReport(const QString& path);
  bool exportPlot(const QString& path);

  core::GraphDocument* document() { return &doc_; }
  GraphEditor* editor() const { return editor_; }
  GraphScene* scene() const { return scene_; }
  GraphView* view() const { return view_; }
  PalettePanel* palette() const { return palette_; }
  InspectorPanel* inspector() const { return inspector_; }
  PlotsPanel* plots() const { return plots_; }
  TimelineView* timeline() const { return timeline_; }
  RunController* runner() const { return run_; }
  QListWidget* log() const { return log_; }
  QPlainTextEdit* devicesText() const { return devices_; }
  QString runStateText() const;
  QString lastMessage() const { return lastMessage_; }

  enum class LogLevel { Info, Warning, Error };
  void logMessage(LogLevel level, const QString& text, const QString& node = {});

 protected:
  void closeEvent(QCloseEvent* e) override;

 private:
  void buildActions();
  void buildDocks();
  void buildStatusBar();
  void restoreLayout();
  void updateTitle();
  void syncToolbar();
  void refreshDevices();
  void rebuildRecentMenu();
  void rebuildExamplesMenu();
  void addRecent(const QString& path);
  void setDocumentFrom(core::GraphDocument& loaded, const QString& file);
  void logProblems(const QString& fileName);
  void logNewIssues(const QSet<QString>& before, const core::ValidationReport& report);
  bool startRun(const ProcessRunOptions* processes);  // null: in this process
  void onBatch(const QList<core::RunEvent>& events);
  void onRunFinished(bool ok, bool cancelled, const QString& message);
  void onSelectionChanged();
  void showSelectedEvaluation();
  void updateRunActions();
  QMessageBox::StandardButton ask(QMessageBox::Icon icon, const QString& title, const QString& text,
                                  QMessageBox::StandardButtons buttons);
  void showError(const QString& title, const QString& text);
  QString exportPath(const QString& title, const QString& suffix, const QString& filter);

  const core::NodeTypeRegistry* registry_;
  core::GraphDocument doc_;
  GraphEditor* editor_;
  GraphScene* scene_;
  GraphView* view_;
  PalettePanel* palette_;
  InspectorPanel* inspector_;
  PlotsPanel* plots_;
  TimelineView* timeline_;
  QListWidget* log_;
  QPlainTextEdit* devices_;
  RunController* run_;
  QList<QDockWidget*> docks_;

  QAction *runAction_, *processRunAction_, *cancelAction_, *fitAction_;
  QComboBox* schedule_;
  QSpinBox* cpuDevices_;
  QMenu *recentMenu_, *examplesMenu_, *viewMenu_;
  QLabel *stateLabel_, *wallLabel_, *devicesLabel_;
  QProgressBar* progress_;

  QString file_;
  bool forcedDirty_ = false;
  bool staleRun_ = false;  // a run of a document that has since been replaced: its events are not painted  //
                           // a restored recovery file is unsaved work though the undo stack is clean
  QTimer validateTimer_, autosaveTimer_, devicesTimer_;
  QString lastMessage_;
  core::ValidationReport validation_;  // of the last validateNow()
  QSet<QString> issueKeys_;            // its issues, so an edit logs only the problems it brought
  QStringList devicesInUse_;
  QStringList finishedOrder_;  // the run's nodes in the order they finished: the last evaluation is shown
  PromptFn prompt_;
};

}  // namespace gn::editor
