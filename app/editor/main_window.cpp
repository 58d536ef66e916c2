#include "main_window.h"

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
#include <QToolBar>
#include <QUndoStack>
#include <QVBoxLayout>

#include "attention_view.h"
#include "canvas/graph_view.h"
#include "gpunodes/core/executor.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/report_format.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/subgraph.h"
#include "graph_editor.h"
#include "inspector.h"
#include "minimap.h"
#include "palette.h"
#include "plots.h"
#include "process_dialog.h"
#include "file_consent.h"
#include "run_controller.h"
#include "subgraph_navigator.h"
#include "style.h"
#include "timeline.h"

namespace gn::editor {

namespace {
constexpr int kMaxRecent = 10;
constexpr int kNodeRole = Qt::UserRole;
constexpr int kMessageRole = Qt::UserRole + 1;

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

MainWindow::MainWindow(const core::NodeTypeRegistry* registry, QWidget* parent)
    : QMainWindow(parent), registry_(registry) {
  setObjectName("mainWindow");
  editor_ = new GraphEditor(&doc_, registry_, this);
  scene_ = new GraphScene(editor_, this);
  view_ = new GraphView(scene_, this);
  // The canvas under the breadcrumb; a subgraph being edited in place gets a canvas of its own in the stack.
  auto* central = new QWidget(this);
  auto* centralLayout = new QVBoxLayout(central);
  centralLayout->setContentsMargins(0, 0, 0, 0);
  centralLayout->setSpacing(0);
  auto* crumbs = new Breadcrumb(central);
  auto* canvases = new QStackedWidget(central);
  canvases->addWidget(view_);
  centralLayout->addWidget(crumbs);
  centralLayout->addWidget(canvases, 1);
  setCentralWidget(central);
  navigator_ = new SubgraphNavigator(editor_, view_, canvases, crumbs, this);
  run_ = new RunController(registry_, this);

  buildDocks();
  buildActions();
  buildStatusBar();
  restoreLayout();

  connect(navigator_, &SubgraphNavigator::levelChanged, this, [this] {
    inspector_->setEditor(navigator_->currentEditor());
    inspector_->showNodes(navigator_->currentScene()->selectedNodeIds());
    inspector_->setValidation(navigator_->reportFor(navigator_->depth()));
    showCanvasActions();
  });
  connect(navigator_, &SubgraphNavigator::selectionChanged, this, [this](const QStringList& ids) {
    inspector_->showNodes(ids);
    showSelectedEvaluation();
  });
  connect(navigator_, &SubgraphNavigator::viewOpened, this, &MainWindow::connectView);
  connect(inspector_, &InspectorPanel::enterRequested, navigator_, &SubgraphNavigator::enter);
  connect(palette_, &PalettePanel::blockRequested, this, [this](const core::subgraph::LibraryBlock& block) {
    GraphView* view = navigator_->currentView();
    // At the cursor, or beside the last node added, never on another node (as a node type's entry).
    addBlock(block, view->newNodePosition(view->newNodeSize(core::subgraph::kType)));
  });
  connect(palette_, &PalettePanel::libraryChanged, inspector_, &InspectorPanel::refresh);

  connect(editor_->undoStack(), &QUndoStack::cleanChanged, this, &MainWindow::updateTitle);
  connect(&doc_, &core::GraphDocument::changed, this, [this] { validateTimer_.start(); });
  connect(&doc_, &core::GraphDocument::metadataChanged, this, [this] {
    syncToolbar();
    devicesTimer_.start();
    updateTitle();
  });
  connect(&doc_, &core::GraphDocument::reset, this, [this] {
    syncToolbar();
    validateTimer_.start();
    devicesTimer_.start();
  });
  connect(scene_, &QGraphicsScene::selectionChanged, this, &MainWindow::onSelectionChanged);
  connectView(view_);
  connect(palette_, &PalettePanel::addRequested, this, [this](const QString& type) {
    GraphView* view = navigator_->currentView();
    // At the cursor when it is over the canvas, else beside the node added last, never on another node: a
    // fixed spot stacked every double-clicked node exactly on the one before.
    const QPointF at = view->newNodePosition(view->newNodeSize(type));
    const QString id = navigator_->currentEditor()->addNode(type, at);
    navigator_->currentScene()->selectNodes({id});
    view->ensureNodeVisible(id);
  });
  connect(run_, &RunController::batch, this, &MainWindow::onBatch);
  connect(run_, &RunController::finished, this, &MainWindow::onRunFinished);
  connect(run_, &RunController::output, this, [this](ProcessRun::Level level, const QString& text) {
    logMessage(level == ProcessRun::Level::Error     ? LogLevel::Error
               : level == ProcessRun::Level::Warning ? LogLevel::Warning
                                                     : LogLevel::Info,
               text);
  });

  // Validation repaints node errors and facts after edits; debounced so a drag or typing costs one pass.
  validateTimer_.setSingleShot(true);
  validateTimer_.setInterval(150);
  connect(&validateTimer_, &QTimer::timeout, this, [this] {
    const QSet<QString> before = issueKeys_;
    logNewIssues(before, validateNow());
  });
  devicesTimer_.setSingleShot(true);
  devicesTimer_.setInterval(300);
  connect(&devicesTimer_, &QTimer::timeout, this, &MainWindow::refreshDevices);
  // Precise: a coarse timer may fire 5% late, and unsaved work is promised to be at most 30 s old.
  autosaveTimer_.setTimerType(Qt::PreciseTimer);
  autosaveTimer_.setInterval(30000);
  connect(&autosaveTimer_, &QTimer::timeout, this, &MainWindow::writeRecovery);
  autosaveTimer_.start();

  if (registry_)
    for (const core::NodeTypeRegistry::LoadError& e : registry_->loadErrors())
      logMessage(LogLevel::Warning, QString("Plugin %1 did not load: %2").arg(e.path, e.reason));
  if (!registry_ || registry_->types().isEmpty())
    logMessage(LogLevel::Warning,
               "No node plugins were found: the palette is empty. Set GPUNODES_PLUGIN_PATH.");
  newGraph();
  refreshDevices();
}

MainWindow::~MainWindow() {
  navigator_->exitTo(0);  // inner canvases before the stack that holds them
  // The scene observes doc_, which dies after the scene's parent (this) deletes it: disconnect first.
  doc_.disconnect(scene_);
  doc_.disconnect(inspector_);
  // Children die in ~QWidget, after this object's members and its MainWindow part: a signal they send on the
  // way (the undo stack's cleanChanged as it is destroyed) must not reach a slot of what is no longer a
  // MainWindow (UBSan's "downcast of address ... not a MainWindow").
  editor_->undoStack()->disconnect(this);
  for (QObject* child : findChildren<QObject*>()) child->disconnect(this);
}

// ---------------------------------------------------------------------------------------------- layout

void MainWindow::buildDocks() {
  setDockOptions(AnimatedDocks | AllowTabbedDocks | AllowNestedDocks);
  auto dock = [this](const QString& title, const QString& name, QWidget* w, Qt::DockWidgetArea area) {
    auto* d = new QDockWidget(title, this);
    d->setObjectName(name);
    d->setWidget(w);
    addDockWidget(area, d);
    docks_ << d;
    return d;
  };
  palette_ = new PalettePanel(registry_, this);
  inspector_ = new InspectorPanel(editor_, this);
  plots_ = new PlotsPanel(this);
  connect(plots_, &PlotsPanel::exportRequested, this, &MainWindow::exportPlotAs);
  timeline_ = new TimelineView(this);
  log_ = new QListWidget(this);
  log_->setObjectName("log");
  log_->setWordWrap(true);
  log_->setContextMenuPolicy(Qt::CustomContextMenu);
  devices_ = new QPlainTextEdit(this);
  devices_->setObjectName("devices");
  devices_->setReadOnly(true);
  devices_->setLineWrapMode(QPlainTextEdit::NoWrap);
  devices_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));

  QDockWidget* pal = dock("Palette", "paletteDock", palette_, Qt::LeftDockWidgetArea);
  QDockWidget* dev = dock("Devices", "devicesDock", devices_, Qt::BottomDockWidgetArea);
  QDockWidget* insp = dock("Inspector", "inspectorDock", inspector_, Qt::RightDockWidgetArea);
  palette_->setMinimumWidth(190);
  inspector_->setMinimumWidth(270);
  QDockWidget* tl = dock("Timeline", "timelineDock", timeline_, Qt::BottomDockWidgetArea);
  QDockWidget* pl = dock("Plots", "plotsDock", plots_, Qt::BottomDockWidgetArea);
  QDockWidget* lg = dock("Log", "logDock", log_, Qt::BottomDockWidgetArea);
  splitDockWidget(tl, pl, Qt::Horizontal);
  tabifyDockWidget(tl, lg);
  tabifyDockWidget(tl, dev);
  tl->raise();
  resizeDocks({pal, insp}, {230, 320}, Qt::Horizontal);
  resizeDocks({tl}, {280}, Qt::Vertical);
  resizeDocks({tl, pl}, {700, 600}, Qt::Horizontal);

  connect(log_, &QListWidget::itemClicked, this, [this](QListWidgetItem* item) {
    const QString node = item->data(kNodeRole).toString();
    if (!node.isEmpty()) navigator_->reveal(node);
  });
  connect(log_, &QListWidget::customContextMenuRequested, this, [this](QPoint pos) {
    QListWidgetItem* item = log_->itemAt(pos);
    if (!item) return;
    const QString node = item->data(kNodeRole).toString(), msg = item->data(kMessageRole).toString();
    QMenu menu(this);
    // The fix a plugin offers for this problem (an Insert Copy for operands on two devices), as it labels it.
    if (const std::optional<core::IssueFix> fix = node.isEmpty() ? std::nullopt : editor_->fixFor(node, msg))
      menu.addAction(fix->label, this, [this, node, fix = *fix] {
        QString why;
        if (!editor_->applyFix(fix, &why)) logMessage(LogLevel::Warning, fix.label + ": " + why, node);
      });
    menu.addAction("Clear log", log_, &QListWidget::clear);
    menu.exec(log_->viewport()->mapToGlobal(pos));
  });
  connect(timeline_, &TimelineView::spanClicked, this,
          [this](const QString& node) { navigator_->reveal(node); });
}

void MainWindow::buildActions() {
  QMenu* file = menuBar()->addMenu("&File");
  file->addAction("&New", QKeySequence::New, this, [this] {
    if (maybeSave()) newGraph();
  });
  file->addAction("&Open…", QKeySequence::Open, this, [this] {
    if (!maybeSave()) return;
    const QString path = QFileDialog::getOpenFileName(this, "Open graph", QFileInfo(file_).absolutePath(),
                                                      "gpunodes graphs (*.json);;All files (*)");
    if (!path.isEmpty()) loadFile(path);
  });
  recentMenu_ = file->addMenu("Open &Recent");
  connect(recentMenu_, &QMenu::aboutToShow, this, &MainWindow::rebuildRecentMenu);
  examplesMenu_ = file->addMenu("&Examples");
  rebuildExamplesMenu();
  file->addSeparator();
  file->addAction("&Save", QKeySequence::Save, this, [this] { save(); });
  file->addAction("Save &As…", QKeySequence::SaveAs, this, [this] { saveAs(); });
  QMenu* exp = file->addMenu("E&xport");
  exp->addAction("Trace (Chrome JSON)…", this, [this] {
    const QString p = exportPath("Export trace", "trace.json", "Chrome trace (*.json)");
    if (!p.isEmpty()) exportTrace(p);
  });
  exp->addAction("Metrics CSV…", this, [this] {
    const QString p = exportPath("Export metrics", "metrics.csv", "CSV (*.csv)");
    if (!p.isEmpty()) exportMetricsCsv(p);
  });
  exp->addAction("Report JSON…", this, [this] {
    const QString p = exportPath("Export report", "report.json", "JSON (*.json)");
    if (!p.isEmpty()) exportReport(p);
  });
  exp->addAction("Visible plot as PNG…", this, [this] { exportPlotAs("png"); });
  exp->addAction("Visible plot as SVG…", this, [this] { exportPlotAs("svg"); });
  exp->addAction("Timeline as PNG…", this, [this] {
    const QString p = exportPath("Export timeline", "timeline.png", "PNG (*.png)");
    if (!p.isEmpty() && !timeline_->grab().save(p)) showError("Export", "Could not write " + p);
  });
  file->addSeparator();
  file->addAction("&Quit", QKeySequence::Quit, this, &QWidget::close);

  QMenu* edit = menuBar()->addMenu("&Edit");
  QAction* undo = editor_->undoStack()->createUndoAction(this, "&Undo");
  undo->setShortcuts(QKeySequence::Undo);
  QAction* redo = editor_->undoStack()->createRedoAction(this, "&Redo");
  redo->setShortcuts({QKeySequence::Redo, QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_Z)});
  edit->addAction(undo);
  edit->addAction(redo);
  edit->addSeparator();
  // The canvas's own actions, of the canvas being looked at (showCanvasActions), go before this.
  editMenu_ = edit;
  canvasActionsEnd_ = edit->addSeparator();
  // Subgraphs act on the graph level being edited: the root, or the subgraph entered.
  edit->addAction("&Group into Subgraph", QKeySequence(Qt::CTRL | Qt::Key_G), this,
                  [this] { groupSelection(); });
  edit->addAction("&Ungroup Subgraph", QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_G), this,
                  [this] { ungroupSelection(); });
  edit->addAction("Save Subgraph to &Library…", this, [this] {
    const QStringList ids = navigator_->currentScene()->selectedNodeIds();
    const core::GraphDocument* doc = navigator_->currentEditor()->document();
    const core::GraphNode* n = ids.size() == 1 ? doc->node(ids[0]) : nullptr;
    if (!n || !core::subgraph::isSubgraph(*n)) {
      showError("Save to library", "Select one subgraph node to save it to the library.");
      return;
    }
    bool ok = false;
    const QString block = core::subgraph::of(*n).block.name;
    const QString suggested = block.isEmpty() ? n->id : block;
    const QString name = QInputDialog::getText(this, "Save to library",
                                               "Block name (letters, digits, _ or -):", QLineEdit::Normal,
                                               suggested, &ok);
    if (ok) saveToLibrary(n->id, name);
  });
  edit->addAction("Update from Li&brary", this, [this] {
    for (const QString& id : navigator_->currentScene()->selectedNodeIds()) updateFromLibrary(id);
  });

  viewMenu_ = menuBar()->addMenu("&View");
  fitAction_ = new QAction("Fit view", this);
  fitAction_->setToolTip("Frame the whole graph (F frames the selection)");
  connect(fitAction_, &QAction::triggered, this, [this] { navigator_->currentView()->frame(false); });
  viewMenu_->addAction(fitAction_);
  viewMenu_->addAction("Zoom 100%", this, [this] { navigator_->currentView()->setZoom(1); });
  QAction* minimap = viewMenu_->addAction("Minimap");
  minimap->setCheckable(true);
  minimap->setChecked(QSettings().value("view/minimap", true).toBool());
  view_->minimap()->setVisible(minimap->isChecked());
  connect(minimap, &QAction::toggled, this, [this](bool on) {
    view_->minimap()->setVisible(on);
    navigator_->currentView()->minimap()->setVisible(on);
    QSettings().setValue("view/minimap", on);
  });
  viewMenu_->addSeparator();
  for (QDockWidget* d : docks_) viewMenu_->addAction(d->toggleViewAction());

  QMenu* runMenu = menuBar()->addMenu("&Run");
  runAction_ = new QAction("▶ Run", this);
  runAction_->setShortcut(Qt::Key_F5);
  runAction_->setToolTip("Run the graph (F5): nodes whose params, inputs and settings did not change since "
                         "their last run reuse its outputs");
  connect(runAction_, &QAction::triggered, this, [this] { runGraph(); });
  runAllAction_ = new QAction("Run all", this);
  runAllAction_->setObjectName("runAllAction");
  runAllAction_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_F5));
  runAllAction_->setToolTip("Run every node again, ignoring the run cache (Shift+Ctrl+F5)");
  connect(runAllAction_, &QAction::triggered, this, [this] { runAll(); });
  runToHereAction_ = new QAction("Run to here", this);
  runToHereAction_->setObjectName("runToHereAction");
  runToHereAction_->setShortcut(QKeySequence(Qt::Key_F6));
  runToHereAction_->setToolTip("Run only the selected nodes and the nodes they need (F6)");
  connect(runToHereAction_, &QAction::triggered, this, [this] {
    QStringList paths;
    for (const QString& id : navigator_->currentScene()->selectedNodeIds())
      paths << navigator_->prefix(navigator_->depth()) + id;
    runToHere(paths);
  });
  cancelAction_ = new QAction("■ Cancel", this);
  cancelAction_->setShortcut(QKeySequence(Qt::SHIFT | Qt::Key_F5));
  cancelAction_->setToolTip("Cancel the run (Shift+F5); it stops within a second");
  connect(cancelAction_, &QAction::triggered, this, &MainWindow::cancelRun);
  processRunAction_ = new QAction("Run on processes…", this);
  processRunAction_->setObjectName("runOnProcessesAction");
  processRunAction_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_R));
  processRunAction_->setToolTip(
      "Run the graph on several processes under mpirun (Ctrl+Shift+R): data-parallel training across ranks "
      "or machines");
  connect(processRunAction_, &QAction::triggered, this, [this] { runOnProcessesDialog(); });
  runMenu->addAction(runAction_);
  runMenu->addAction(runAllAction_);
  runMenu->addAction(runToHereAction_);
  runMenu->addAction(processRunAction_);
  runMenu->addAction(cancelAction_);
  runMenu->addAction("Validate", QKeySequence(Qt::Key_F7), this, [this] {
    const core::ValidationReport r = validateNow();
    for (const core::Issue& i : r.issues())
      logMessage(i.severity == core::Issue::Severity::Error ? LogLevel::Error : LogLevel::Warning, i.text(),
                 i.node);
    if (r.issues().isEmpty()) logMessage(LogLevel::Info, "The graph is valid.");
  });
  runMenu->addAction("Clear run history", this, [this] { plots_->clearHistory(); });
  runMenu->addAction("Clear run cache", this, [this] { clearRunCache(); });
  runMenu->addAction("Run cache limit…", this, [this] {
    bool ok = false;
    const int mib = QInputDialog::getInt(this, "Run cache limit",
                                         "Memory the outputs of earlier runs may keep (MiB); 0 keeps none:",
                                         int(run_->cache().maxBytes() >> 20), 0, 1 << 20, 256, &ok);
    if (ok) setCacheLimit(qint64(mib) << 20);
  });
  nodeMenu_ = menuBar()->addMenu("&Node");
  showCanvasActions();

  QToolBar* tb = addToolBar("Main");
  tb->setObjectName("mainToolbar");
  tb->addAction(runAction_);
  tb->addAction(cancelAction_);
  tb->addSeparator();
  tb->addWidget(new QLabel(" Schedule "));
  schedule_ = new QComboBox(this);
  schedule_->setObjectName("scheduleCombo");
  schedule_->addItems({"parallel", "sequential"});
  schedule_->setToolTip(
      "parallel: independent nodes overlap; sequential: wait after every node (the "
      "\"waitall between\" baseline)");
  connect(schedule_, &QComboBox::activated, this,
          [this](int) { editor_->setSetting("schedule", schedule_->currentText()); });
  tb->addWidget(schedule_);
  tb->addWidget(new QLabel("  CPU devices "));
  cpuDevices_ = new QSpinBox(this);
  cpuDevices_->setObjectName("cpuDevicesSpin");
  cpuDevices_->setRange(1, 64);
  cpuDevices_->setKeyboardTracking(false);
  cpuDevices_->setToolTip(
      "Split the CPU into N devices, each with its own worker threads and 1/N of the cores");
  connect(cpuDevices_, &QSpinBox::valueChanged, this,
          [this](int v) { editor_->setSetting("cpu_devices", v); });
  tb->addWidget(cpuDevices_);
  tb->addSeparator();
  tb->addAction(fitAction_);
  viewMenu_->addAction(tb->toggleViewAction());
  updateRunActions();
}

void MainWindow::buildStatusBar() {
  stateLabel_ = new QLabel("Idle", this);
  stateLabel_->setObjectName("runState");
  stateLabel_->setMinimumWidth(90);
  wallLabel_ = new QLabel(this);
  wallLabel_->setObjectName("wallTime");
  devicesLabel_ = new QLabel(this);
  devicesLabel_->setObjectName("devicesInUse");
  progress_ = new QProgressBar(this);
  progress_->setRange(0, 1000);
  progress_->setMaximumWidth(160);
  progress_->setMaximumHeight(14);
  progress_->setTextVisible(false);
  progress_->hide();
  statusBar()->addPermanentWidget(progress_);
  statusBar()->addPermanentWidget(stateLabel_);
  statusBar()->addPermanentWidget(wallLabel_);
  statusBar()->addPermanentWidget(devicesLabel_);
  cacheLabel_ = new QLabel(this);
  cacheLabel_->setObjectName("runCache");
  statusBar()->addPermanentWidget(cacheLabel_);
  run_->cache().setMaxBytes(
      QSettings().value("run/cacheLimitBytes", core::RunCache::kDefaultMaxBytes).toLongLong());
  updateCacheLabel();
}

void MainWindow::updateCacheLabel() {
  const core::RunCache& cache = run_->cache();
  cacheLabel_->setText("cache " + style::formatBytes(double(cache.bytes())));
  cacheLabel_->setToolTip(QString("The outputs of %1 node%2 from earlier runs, kept so that Run re-runs only "
                                  "what changed; at most %3 (Run ▸ Run cache limit…)")
                              .arg(cache.size())
                              .arg(cache.size() == 1 ? "" : "s")
                              .arg(style::formatBytes(double(cache.maxBytes()))));
}

void MainWindow::setCacheLimit(qint64 bytes) {
  run_->cache().setMaxBytes(bytes);
  QSettings().setValue("run/cacheLimitBytes", bytes);
  updateCacheLabel();
}

void MainWindow::clearRunCache() {
  run_->cache().clear();
  updateCacheLabel();
  logMessage(LogLevel::Info, "Run cache cleared: the next run runs every node");
}

void MainWindow::restoreLayout() {
  QSettings s;
  resize(1500, 920);
  if (s.contains("window/geometry")) restoreGeometry(s.value("window/geometry").toByteArray());
  if (s.contains("window/state")) restoreState(s.value("window/state").toByteArray());
}

// ---------------------------------------------------------------------------------------------- prompts, log

QMessageBox::StandardButton MainWindow::ask(QMessageBox::Icon icon, const QString& title, const QString& text,
                                            QMessageBox::StandardButtons buttons) {
  lastMessage_ = text;
  if (prompt_) return prompt_(icon, title, text, buttons);
  QMessageBox box(icon, title, text, buttons, this);
  return QMessageBox::StandardButton(box.exec());
}

void MainWindow::showError(const QString& title, const QString& text) {
  logMessage(LogLevel::Error, text);
  ask(QMessageBox::Warning, title, text, QMessageBox::Ok);
}

void MainWindow::logMessage(LogLevel level, const QString& text, const QString& node) {
  const QString stamp = QTime::currentTime().toString("HH:mm:ss");
  const char* tag = level == LogLevel::Error ? "error" : level == LogLevel::Warning ? "warning" : "info";
  auto* item =
      new QListWidgetItem(QString("%1  %2%3").arg(stamp, node.isEmpty() ? QString() : node + ": ", text));
  item->setData(kNodeRole, node);
  item->setData(kMessageRole, text);
  item->setData(Qt::UserRole + 2, QString(tag));
  item->setForeground(level == LogLevel::Error     ? QColor(0xff, 0x7b, 0x7b)
                      : level == LogLevel::Warning ? QColor(0xe6, 0xc4, 0x6c)
                                                   : QColor(0xc8, 0xcc, 0xd2));
  if (!node.isEmpty()) item->setToolTip("Click to select " + node);
  log_->addItem(item);
  // The log is a window on recent events, not an archive: keep it bounded for very chatty runs.
  while (log_->count() > 5000) delete log_->takeItem(0);
  log_->scrollToBottom();
}

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

// ---------------------------------------------------------------------------------------------- toolbar,
// devices

void MainWindow::syncToolbar() {
  const QJsonObject s = doc_.settings();
  QSignalBlocker b1(schedule_), b2(cpuDevices_);
  schedule_->setCurrentText(s.value("schedule").toString("parallel"));
  cpuDevices_->setValue(s.value("cpu_devices").toInt(1));
}

void MainWindow::refreshDevices() {
  QString text;
  const core::RunSettings settings = core::RunSettings::fromGraph(doc_.settings());
  if (registry_)
    for (core::NodeSetPlugin* p : registry_->plugins()) {
      const QJsonObject env = p->environment(settings);
      if (env.isEmpty()) continue;
      text += QString("== %1 (cpu_devices=%2) ==\n").arg(p->setName()).arg(settings.cpuDevices);
      const QString table = env.value("table").toString();
      text +=
          table.isEmpty() ? QString::fromUtf8(QJsonDocument(env.value("devices").toArray()).toJson()) : table;
      if (!text.endsWith('\n')) text += '\n';
    }
  if (registry_)
    for (const core::NodeTypeRegistry::LoadError& e : registry_->loadErrors())
      text += QString("\nplugin not loaded: %1\n  %2\n").arg(e.path, e.reason);
  if (text.isEmpty()) text = "No loaded plugin reports devices.";
  devices_->setPlainText(text);
}

// ---------------------------------------------------------------------------------------------- running

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

QString MainWindow::groupSelection() {
  QString why;
  const QString id = navigator_->currentEditor()->group(navigator_->currentScene()->selectedNodeIds(), &why);
  if (id.isEmpty())
    statusBar()->showMessage("Group into subgraph: " + why, 4000);
  else
    navigator_->currentScene()->selectNodes({id});
  return id;
}

QStringList MainWindow::ungroupSelection() {
  QStringList added;
  GraphEditor* editor = navigator_->currentEditor();
  for (const QString& id : navigator_->currentScene()->selectedNodeIds())
    if (const core::GraphNode* n = editor->document()->node(id); n && core::subgraph::isSubgraph(*n))
      added += editor->ungroup(id);
  if (added.isEmpty())
    statusBar()->showMessage("Ungroup: select a subgraph node", 4000);
  else
    navigator_->currentScene()->selectNodes(added);
  return added;
}

bool MainWindow::saveToLibrary(const QString& nodeId, const QString& name) {
  GraphEditor* editor = navigator_->currentEditor();
  const core::GraphNode* n = editor->document()->node(nodeId);
  if (!n) return false;
  core::subgraph::LibraryBlock saved;
  QString error;
  if (!core::subgraph::saveBlock(*n, name, &saved, &error)) {
    showError("Save to library", error);
    return false;
  }
  // The instance now refers to the block it was saved as, so later changes to the file can be offered.
  editor->setSubgraph(nodeId, core::subgraph::instantiate(saved, nodeId, n->position).subgraph,
                      QString("Save %1 to the library as %2").arg(nodeId, name));
  palette_->reloadBlocks();
  logMessage(LogLevel::Info, QString("Saved %1 to the library as %2 (%3)").arg(nodeId, name, saved.path),
             nodeId);
  return true;
}

bool MainWindow::updateFromLibrary(const QString& nodeId) {
  GraphEditor* editor = navigator_->currentEditor();
  const core::GraphNode* n = editor->document()->node(nodeId);
  if (!n || !core::subgraph::isSubgraph(*n)) return false;
  for (const core::subgraph::LibraryBlock& b : palette_->blocks())
    if (b.name == core::subgraph::of(*n).block.name) {
      editor->updateFromLibrary(nodeId, b);
      return true;
    }
  return false;
}

namespace {
// The library blocks a node is, or holds an instance of, at any depth.
void blockNames(const core::GraphNode& node, QSet<QString>& into, int depth = 0) {
  if (!core::subgraph::isSubgraph(node) || depth > core::subgraph::kMaxDepth) return;
  const core::Subgraph& sub = core::subgraph::of(node);
  if (!sub.block.name.isEmpty()) into.insert(sub.block.name);
  for (const core::GraphNode& n : sub.nodes) blockNames(n, into, depth + 1);
}
}  // namespace

QString MainWindow::addBlock(const core::subgraph::LibraryBlock& block, QPointF at) {
  // Inside an instance of a block, that block (or one holding it) would contain itself: refused here rather
  // than left for validation to find.
  QSet<QString> held;
  blockNames(block.node, held);
  held.insert(block.name);
  const QStringList path = navigator_->path();
  for (int k = 1; k <= path.size(); ++k) {
    const QString outerPath = path.mid(0, k).join(core::subgraph::kPathSeparator);
    const core::GraphNode* outer = core::subgraph::nodeAt(doc_, outerPath);
    const QString outerBlock = outer ? core::subgraph::of(*outer).block.name : QString();
    if (outerBlock.isEmpty() || !held.contains(outerBlock)) continue;
    const QString why = QString(
                            "Cannot add block %1 here: %2 is an instance of block %3, which cannot "
                            "contain itself")
                            .arg(block.name, outerPath, outerBlock);
    statusBar()->showMessage(why, 6000);
    logMessage(LogLevel::Warning, why);
    lastMessage_ = why;
    return {};
  }
  const QString id = navigator_->currentEditor()->addBlock(block, at);
  navigator_->currentScene()->selectNodes({id});
  return id;
}

void MainWindow::connectView(GraphView* view) {
  // An inner canvas's ids are local to its level; runs know nodes by their path from the root.
  const QString prefix = navigator_->prefix(navigator_->depth());
  connect(view, &GraphView::runToHereRequested, this, [this, prefix](const QStringList& ids) {
    QStringList paths;
    for (const QString& id : ids) paths << prefix + id;
    runToHere(paths);
  });
  connect(view, &GraphView::message, this, [this](const QString& text, bool error) {
    statusBar()->showMessage(text, 4000);
    if (error) logMessage(LogLevel::Warning, text);
  });
  connect(view, &GraphView::blockDropped, this, [this](const QString& path, QPointF at) {
    core::subgraph::LibraryBlock block;
    QString error;
    if (core::subgraph::readBlock(path, block, &error)) {
      addBlock(block, at);
      return;
    }
    statusBar()->showMessage(error, 6000);
    logMessage(LogLevel::Error, error);
    lastMessage_ = error;
  });
  view->minimap()->setVisible(QSettings().value("view/minimap", true).toBool());
}

void MainWindow::showCanvasActions() {
  // Each canvas has its own actions, whose shortcuts work while it has the focus; the menus offer those of
  // the canvas on screen, the root graph's or the open subgraph's.
  GraphView* view = navigator_->currentView();
  // An inner canvas that has closed took its actions with it (and out of the menus).
  for (QAction* a : std::as_const(canvasMenuActions_)) {
    if (!a) continue;
    editMenu_->removeAction(a);
    nodeMenu_->removeAction(a);
    viewMenu_->removeAction(a);
    if (a->parent() == editMenu_) delete a;  // a separator of the menu's own
  }
  canvasMenuActions_.clear();
  delete arrangeMenu_;
  arrangeMenu_ = view->arrangeMenu(editMenu_);
  const auto add = [this](QMenu* menu, QAction* before, const QList<QAction*>& actions) {
    menu->insertActions(before, actions);
    for (QAction* a : actions) canvasMenuActions_ << a;
  };
  add(editMenu_, canvasActionsEnd_,
      {view->cutAction(), view->copyAction(), view->pasteAction(), view->duplicateAction(),
       view->deleteAction(), view->selectAllAction(), view->commentAction()});
  canvasMenuActions_ << editMenu_->insertSeparator(canvasActionsEnd_);
  add(editMenu_, canvasActionsEnd_, {view->findAction(), view->collapseAction(), arrangeMenu_->menuAction()});
  add(nodeMenu_, nullptr, {view->bypassAction(), view->muteAction()});
  add(viewMenu_, fitAction_, {view->frameAction()});
}

void MainWindow::onSelectionChanged() {
  inspector_->showNodes(scene_->selectedNodeIds());
  showSelectedEvaluation();
}

void MainWindow::showSelectedEvaluation() {
  const QString prefix = navigator_->prefix(navigator_->depth());
  QStringList paths;
  for (const QString& id : navigator_->currentScene()->selectedNodeIds()) paths << prefix + id;
  for (const QString& path : paths)
    if (plots_->showEvaluation(path)) break;
  plots_->showAttention(paths);
}

// ---------------------------------------------------------------------------------------------- exports

QString MainWindow::exportPath(const QString& title, const QString& suffix, const QString& filter) {
  const QString base = file_.isEmpty()
                           ? QDir::home().filePath("gpunodes")
                           : QFileInfo(file_).absolutePath() + "/" + QFileInfo(file_).completeBaseName();
  return QFileDialog::getSaveFileName(this, title, base + "-" + suffix, filter);
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
