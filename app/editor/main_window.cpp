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
#include "model_conversion.h"
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
constexpr int kNodeRole = Qt::UserRole;
constexpr int kMessageRole = Qt::UserRole + 1;
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
  // Model formats come from the plugins (core/format_converter.h); the editor names none.
  QMenu* import = file->addMenu("&Import");
  QMenu* exp = file->addMenu("E&xport");
  for (const core::FormatConverterPtr& c : core::formatConverters(*registry_)) {
    if (c->canImport())
      import->addAction(c->name() + " model…", this, [this, c] {
        const QString model = chooseFile("Import " + c->name() + " model", QFileInfo(file_).absolutePath(),
                                         converterFilter(*c) + ";;All files (*)", false);
        if (!model.isEmpty()) importModelAs(model);
      });
    if (c->canExport()) exp->addAction(c->name() + " model…", this, [this, c] { exportModelDialog(*c); });
  }
  if (import->isEmpty()) import->addAction("No plugin imports a model format")->setEnabled(false);
  if (!exp->isEmpty()) exp->addSeparator();
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
  // A model file dropped on any canvas opens as a new graph, as File > Import does.
  QStringList suffixes;
  for (const core::FormatConverterPtr& c : core::formatConverters(*registry_))
    if (c->canImport()) suffixes += c->extensions();
  view->setDroppableSuffixes(suffixes);
  connect(view, &GraphView::fileDropped, this, [this](const QString& path) { importModelAs(path); });
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

}  // namespace gn::editor
