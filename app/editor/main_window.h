// The editor's main window: the canvas in the centre; Palette, Inspector, Plots, Timeline, Log and Devices
// docks (their layout is restored at start); files with a dirty marker, recent files, examples, autosave
// and crash recovery; and runs that stream into the canvas, plots and timeline without blocking.
#pragma once
#include <QMainWindow>
#include <QMessageBox>
#include <QPointer>
#include <QSet>
#include <QTimer>
#include <functional>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"
#include "file_consent.h"
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
class FormatConverter;
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
class SubgraphNavigator;
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
  // Every file dialog of the model import and export goes through this (title, suggested path, filter,
  // whether the file is to be written); it returns the chosen path, empty when cancelled. Tests answer it.
  using ChooseFileFn = std::function<QString(const QString& title, const QString& suggested,
                                             const QString& filter, bool forWriting)>;
  void setFileChooser(ChooseFileFn fn) { chooseFile_ = std::move(fn); }

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

  // Runs. runGraph (Run, F5) reuses the outputs of nodes whose cache key did not change; runAll (Run all,
  // Shift+Ctrl+F5) runs every node; runToHere (F6, and a node's context menu) runs the nodes and what they
  // need, reusing the cache.
  bool runGraph();
  bool runAll();
  bool runToHere(const QStringList& nodeIds);
  // The run cache's bound in bytes, kept in the settings ("run/cacheLimitBytes"); empties beyond it.
  void setCacheLimit(qint64 bytes);
  void clearRunCache();
  // The same on several processes under mpirun (Run ▸ Run on processes…, which asks for the options first);
  // its events reach the plots, timeline, canvas and log as a local run's do.
  bool runOnProcesses(const ProcessRunOptions& options);
  bool runOnProcessesDialog();
  void cancelRun();
  core::ValidationReport validateNow();
  // The folder a graph without a file of its own resolves its paths against (file_consent.h): the examples
  // folder for an opened example, else the working directory.
  QString documentFolder() const;
  // Subgraphs, on the graph level being edited (core/subgraph.h): group the selection (Ctrl+G; returns the
  // new node's id), ungroup the selected subgraphs (Ctrl+Shift+G; returns the inner nodes' ids), save a
  // subgraph to the user's library under a name (the instance then refers to the block), and update an
  // instance from its block's current file.
  QString groupSelection();
  QStringList ungroupSelection();
  bool saveToLibrary(const QString& nodeId, const QString& name);
  // Adds an instance of a library block to the level being edited at `at` (the palette's double-click and
  // drop); refused, saying why, inside an instance of that block. Returns the new node's id.
  QString addBlock(const core::subgraph::LibraryBlock& block, QPointF at);
  bool updateFromLibrary(const QString& nodeId);
  SubgraphNavigator* navigator() const { return navigator_; }

  // Exports (from the last run).
  bool exportTrace(const QString& path);
  bool exportMetricsCsv(const QString& path);
  bool exportReport(const QString& path);
  bool exportPlot(const QString& path);  // the visible plot tab: SVG for a path ending in .svg, else PNG
  // Model files (core/format_converter.h; the ONNX of the GPU node set). importModel asks to save unsaved
  // changes, imports `modelPath` into a graph saved at `graphPath` with its weights beside it, and opens it;
  // a model the converter refuses leaves the document as it was, with the error in the log and a message.
  // exportModel writes the network ending at `networkNode` of the document with the parameters in
  // `paramsFile` (empty: the weights its init and seed give) to `outPath` in the format `format` ("ONNX").
  // Both show a progress dialog for a big model and put the converter's warnings in the log.
  bool importModel(const QString& modelPath, const QString& graphPath);
  bool exportModel(const QString& format, const QString& networkNode, const QString& paramsFile,
                   const QString& outPath);

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
  // processes null: in this process, with the run cache (reuse) and, when given, only the targets.
  bool startRun(const ProcessRunOptions* processes, bool reuse = true, const QStringList& targets = {});
  void updateCacheLabel();
  void onBatch(const QList<core::RunEvent>& events);
  void onRunFinished(bool ok, bool cancelled, const QString& message);
  void onSelectionChanged();
  void showSelectedEvaluation();
  void updateRunActions();
  // The signals of a canvas (the root's, or an inner level's as it opens) reach the window.
  void connectView(GraphView* view);
  // The Edit, Node and View menus' canvas entries: the actions of the canvas on screen.
  void showCanvasActions();
  QMessageBox::StandardButton ask(QMessageBox::Icon icon, const QString& title, const QString& text,
                                  QMessageBox::StandardButtons buttons);
  void showError(const QString& title, const QString& text);
  QString exportPath(const QString& title, const QString& suffix, const QString& filter);
  void exportPlotAs(const QString& format);  // "png" or "svg": asks where, then exportPlot()
  QString chooseFile(const QString& title, const QString& suggested, const QString& filter, bool forWriting);
  // File > Import (and a model file dropped on a canvas): asks where the graph goes, then importModel().
  void importModelAs(const QString& modelPath);
  // File > Export > <format> model…: asks for the network, the file and the parameters, then exportModel().
  void exportModelDialog(const core::FormatConverter& converter);

  const core::NodeTypeRegistry* registry_;
  core::GraphDocument doc_;
  GraphEditor* editor_;
  GraphScene* scene_;
  GraphView* view_;
  SubgraphNavigator* navigator_;
  PalettePanel* palette_;
  InspectorPanel* inspector_;
  PlotsPanel* plots_;
  TimelineView* timeline_;
  QListWidget* log_;
  QPlainTextEdit* devices_;
  RunController* run_;
  QList<QDockWidget*> docks_;

  QAction *runAction_, *runAllAction_, *runToHereAction_, *processRunAction_, *cancelAction_, *fitAction_;
  QComboBox* schedule_;
  QSpinBox* cpuDevices_;
  QMenu *recentMenu_, *examplesMenu_, *viewMenu_, *editMenu_, *nodeMenu_;
  QMenu* arrangeMenu_ = nullptr;         // the current canvas's, in the Edit menu
  QAction* canvasActionsEnd_ = nullptr;  // the Edit menu's canvas entries go before it
  QList<QPointer<QAction>> canvasMenuActions_;  // the entries showCanvasActions put in the menus
  QLabel *stateLabel_, *wallLabel_, *devicesLabel_, *cacheLabel_;
  QProgressBar* progress_;

  QString file_;
  QString fromExample_;  // the example file the document was opened from, until it is saved somewhere
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
  ChooseFileFn chooseFile_;
};

}  // namespace gn::editor
