#include "subgraph_navigator.h"

#include <QHBoxLayout>
#include <QPointer>
#include <QStackedWidget>
#include <QTimer>
#include <QToolButton>
#include <QUndoStack>

#include "canvas/graph_view.h"
#include "graph_editor.h"

namespace gn::editor {

using core::GraphDocument;
using core::GraphNode;
namespace subgraph = core::subgraph;

namespace {
const QString kSeparator = QStringLiteral(" \u203a ");  // ›
// Inner warnings and failures listed on their subgraph node, at most this many; the rest are counted.
constexpr int kListedInner = 3;

// "conv2: message" lines, the first kListedInner of them, then how many more.
QString listed(const QStringList& lines) {
  QStringList out = lines.mid(0, kListedInner);
  if (lines.size() > kListedInner)
    out.append(QStringLiteral("(and %1 more inside)").arg(lines.size() - kListedInner));
  return out.join(u'\n');
}
}  // namespace

NodeRunState summarizeRunStates(const QMap<QString, NodeRunState>& inner) {
  int taking = 0, running = 0, queued = 0, done = 0, cached = 0;
  double progress = 0, timeMs = 0;
  QStringList failures, cancels, warnings;
  for (auto it = inner.begin(); it != inner.end(); ++it) {
    const NodeRunState& s = it.value();
    if (!s.warning.isEmpty()) warnings.append(it.key() + QStringLiteral(": ") + s.warning);
    if (s.status == RunStatus::Idle) continue;
    ++taking;
    switch (s.status) {
      case RunStatus::Idle:
        break;
      case RunStatus::Queued:
        ++queued;
        break;
      case RunStatus::Running:
        ++running;
        progress += s.progress;
        break;
      case RunStatus::Done:
        ++done;
        progress += 1;
        if (s.cached)
          ++cached;
        else
          timeMs += s.timeMs;
        break;
      case RunStatus::Failed:
        failures.append(it.key() + QStringLiteral(": ") + s.error);
        progress += 1;
        break;
      case RunStatus::Cancelled:
        cancels.append(it.key());
        progress += 1;
        break;
    }
  }
  NodeRunState out;
  out.warning = listed(warnings);
  if (taking == 0) return out;
  if (running > 0 || (queued > 0 && done > 0)) {
    out.status = RunStatus::Running;
    out.progress = progress / taking;
  } else if (!failures.isEmpty()) {
    out.status = RunStatus::Failed;
    out.error = listed(failures);
  } else if (!cancels.isEmpty()) {
    out.status = RunStatus::Cancelled;
  } else if (queued > 0) {
    out.status = RunStatus::Queued;
  } else {
    out.status = RunStatus::Done;
    out.timeMs = timeMs;
    out.cached = cached == done;
    out.progress = 1;
  }
  return out;
}

// ---- Breadcrumb --------------------------------------------------------------------------------------

Breadcrumb::Breadcrumb(QWidget* parent) : QWidget(parent) {
  setObjectName("breadcrumb");
  auto* row = new QHBoxLayout(this);
  row->setContentsMargins(8, 3, 8, 3);
  row->setSpacing(2);
  crumbs_ = new QHBoxLayout;
  crumbs_->setSpacing(2);
  row->addLayout(crumbs_);
  row->addStretch(1);
  ports_ = new QLabel(this);
  ports_->setObjectName("breadcrumbPorts");
  row->addWidget(ports_);
  setAutoFillBackground(true);
}

void Breadcrumb::setPath(const QStringList& crumbs, const QString& ports) {
  shown_ = crumbs;
  while (QLayoutItem* item = crumbs_->takeAt(0)) {
    delete item->widget();
    delete item;
  }
  for (int i = 0; i < crumbs.size(); ++i) {
    if (i > 0) crumbs_->addWidget(new QLabel(QStringLiteral("\u203a"), this));
    auto* b = new QToolButton(this);
    b->setText(crumbs[i]);
    b->setAutoRaise(true);
    const bool current = i + 1 == crumbs.size();
    b->setEnabled(!current);
    b->setToolTip(current ? QStringLiteral("Editing %1").arg(crumbs[i])
                          : QStringLiteral("Back to %1").arg(crumbs[i]));
    if (current) {
      QFont f = b->font();
      f.setBold(true);
      b->setFont(f);
    }
    connect(b, &QToolButton::clicked, this, [this, i] { emit levelClicked(i); });
    crumbs_->addWidget(b);
  }
  ports_->setText(ports);
}

QString Breadcrumb::text() const {
  return shown_.join(kSeparator);
}

// ---- SubgraphNavigator -------------------------------------------------------------------------------

struct SubgraphNavigator::Level {
  QString nodeId;
  std::unique_ptr<GraphDocument> doc;
  GraphEditor* editor = nullptr;
  GraphScene* scene = nullptr;
  QPointer<GraphView> view;  // a child of the stack, which may be gone first when the window closes
  core::SubgraphPtr shown;   // what the level's document was made from, or last wrote up
  int index = 0;             // its undo stack's index after the last edit written up
  ~Level() {
    delete view;
    delete scene;
    delete editor;
  }
};

SubgraphNavigator::SubgraphNavigator(GraphEditor* root, GraphView* rootView, QStackedWidget* stack,
                                     Breadcrumb* crumbs, QObject* parent)
    : QObject(parent), root_(root), rootView_(rootView), stack_(stack), crumbs_(crumbs) {
  connect(rootView_->graphScene(), &GraphScene::nodeDoubleClicked, this, [this](const QString& id) {
    if (depth() == 0) enter(id);
  });
  connect(root_->document(), &GraphDocument::changed, this, &SubgraphNavigator::refresh);
  // The canvas makes a subgraph's item anew when the subgraph changes: it shows the run's state again.
  connect(root_->document(), &GraphDocument::subgraphChanged, this,
          [this](const QString& id) { paintNode(0, id); });
  // A document replaced (opened, new) has other subgraphs: back to its top.
  connect(root_->document(), &GraphDocument::reset, this, [this] { exitTo(0); });
  connect(crumbs_, &Breadcrumb::levelClicked, this, &SubgraphNavigator::exitTo);
  updateCrumbs();
}

SubgraphNavigator::~SubgraphNavigator() {
  levels_.clear();
}

QStringList SubgraphNavigator::path() const {
  QStringList out;
  for (const auto& l : levels_) out.append(l->nodeId);
  return out;
}

GraphEditor* SubgraphNavigator::currentEditor() const {
  return levels_.empty() ? root_ : levels_.back()->editor;
}

GraphScene* SubgraphNavigator::currentScene() const {
  return levels_.empty() ? rootView_->graphScene() : levels_.back()->scene;
}

GraphView* SubgraphNavigator::currentView() const {
  return levels_.empty() ? rootView_ : levels_.back()->view.data();
}

bool SubgraphNavigator::enter(const QString& nodeId) {
  GraphDocument* parent = currentEditor()->document();
  const GraphNode* n = parent->node(nodeId);
  if (!n || !subgraph::isSubgraph(*n)) return false;
  auto level = std::make_unique<Level>();
  level->nodeId = nodeId;
  level->shown = n->subgraph;
  level->doc = std::make_unique<GraphDocument>();
  GraphDocument inner;
  subgraph::innerDocument(subgraph::of(*n), inner);
  level->doc->replaceAll(inner);
  level->editor = new GraphEditor(level->doc.get(), root_->registry());
  level->scene = new GraphScene(level->editor);
  level->view = new GraphView(level->scene, stack_);
  const int number = depth() + 1;
  connect(level->editor->undoStack(), &QUndoStack::indexChanged, this,
          [this, number](int index) { onInnerEdit(number, index); });
  connect(level->scene, &GraphScene::nodeDoubleClicked, this, [this, number](const QString& id) {
    if (depth() == number) enter(id);
  });
  connect(level->doc.get(), &GraphDocument::subgraphChanged, this,
          [this, number](const QString& id) { paintNode(number, id); });
  GraphScene* scene = level->scene;
  connect(scene, &QGraphicsScene::selectionChanged, this,
          [this, scene] { emit selectionChanged(scene->selectedNodeIds()); });
  GraphView* view = level->view;
  stack_->addWidget(view);
  stack_->setCurrentWidget(view);
  levels_.push_back(std::move(level));
  scene->setValidation(reportFor(number));
  paintLevel(number);
  emit viewOpened(view);
  view->frame(false);
  // Framed again once the view has its size (the first frame may come before the layout).
  QTimer::singleShot(0, view, [view] { view->frame(false); });
  view->setFocus();
  updateCrumbs();
  emit levelChanged();
  return true;
}

bool SubgraphNavigator::reveal(const QString& nodePath) {
  if (!subgraph::nodeAt(*root_->document(), nodePath)) return false;
  const QStringList parts = nodePath.split(subgraph::kPathSeparator);
  const QStringList parents = parts.mid(0, parts.size() - 1), open = path();
  int common = 0;
  while (common < parents.size() && common < open.size() && parents[common] == open[common]) ++common;
  exitTo(common);
  for (int i = common; i < parents.size(); ++i) enter(parents[i]);
  currentScene()->selectNodes({parts.last()});
  currentView()->centerOnNode(parts.last());
  return true;
}

void SubgraphNavigator::exitTo(int level) {
  if (level < 0 || level >= depth()) return;
  while (depth() > level) {
    stack_->removeWidget(levels_.back()->view);
    levels_.pop_back();
  }
  stack_->setCurrentWidget(currentView());
  currentView()->setFocus();
  updateCrumbs();
  emit levelChanged();
}

void SubgraphNavigator::onInnerEdit(int number, int index) {
  if (writing_ || number > depth()) return;
  Level& level = *levels_[number - 1];
  // An index that did not move: the inner stack merged this edit into its last one (typing a value), so
  // the root's step for that edit grows instead of a new one starting.
  if (index != level.index) ++step_;
  level.index = index;
  const QString text = level.editor->undoStack()->text(index - 1);
  // The subgraph of each level's node, rebuilt from this level up to the root.
  core::SubgraphPtr sub = subgraph::withInner(level.shown ? *level.shown : core::Subgraph(), *level.doc);
  level.shown = sub;
  writing_ = true;
  for (int k = number - 1; k >= 1; --k) {
    Level& parent = *levels_[k - 1];
    parent.doc->setSubgraph(levels_[k]->nodeId, sub);
    sub = subgraph::withInner(parent.shown ? *parent.shown : core::Subgraph(), *parent.doc);
    parent.shown = sub;
  }
  const QString where = path().mid(0, number).join(subgraph::kPathSeparator);
  root_->setSubgraph(levels_[0]->nodeId, sub, QStringLiteral("%1: %2").arg(where, text),
                     QStringLiteral("%1#%2").arg(where).arg(step_));
  writing_ = false;
  updateCrumbs();  // the ports' targets may have moved
}

void SubgraphNavigator::refresh() {
  if (writing_) return;
  for (int number = 1; number <= depth(); ++number) {
    GraphDocument* parent = number == 1 ? root_->document() : levels_[number - 2]->doc.get();
    Level& level = *levels_[number - 1];
    const GraphNode* n = parent->node(level.nodeId);
    if (!n || !subgraph::isSubgraph(*n)) {
      exitTo(number - 1);
      return;
    }
    if (n->subgraph == level.shown) continue;
    // Undo or redo changed the subgraph: the level shows it as it is now, and its own stack starts over.
    level.shown = n->subgraph;
    GraphDocument inner;
    subgraph::innerDocument(subgraph::of(*n), inner);
    writing_ = true;
    level.doc->replaceAll(inner);
    level.editor->undoStack()->clear();
    level.index = 0;
    writing_ = false;
    paintLevel(number);
  }
  updateCrumbs();
}

void SubgraphNavigator::updateCrumbs() {
  crumbs_->setVisible(depth() > 0);
  if (depth() == 0) return;
  const QString rootName = root_->document()->name();
  QStringList crumbs{rootName.isEmpty() ? QStringLiteral("graph") : rootName};
  crumbs += path();
  // The current subgraph's boundary: what each port feeds or shows.
  const core::Subgraph& sub = levels_.back()->shown ? *levels_.back()->shown : core::Subgraph();
  QStringList ins, outs;
  for (const core::SubgraphInput& in : sub.inputs) {
    QStringList targets;
    for (const core::Endpoint& t : in.targets) targets.append(t.str());
    ins.append(QStringLiteral("%1 \u2192 %2").arg(in.name, targets.join(", ")));
  }
  for (const core::SubgraphOutput& out : sub.outputs)
    outs.append(QStringLiteral("%1 \u2190 %2").arg(out.name, out.source.str()));
  QStringList parts;
  if (!ins.isEmpty()) parts.append(QStringLiteral("inputs: ") + ins.join(QStringLiteral("; ")));
  if (!outs.isEmpty()) parts.append(QStringLiteral("outputs: ") + outs.join(QStringLiteral("; ")));
  crumbs_->setPath(crumbs, parts.join(QStringLiteral("   ")));
}

void SubgraphNavigator::setValidation(const core::ValidationReport& report) {
  report_ = report;
  rootView_->graphScene()->setValidation(reportFor(0));
  for (int number = 1; number <= depth(); ++number)
    levels_[number - 1]->scene->setValidation(reportFor(number));
}

QString SubgraphNavigator::prefix(int level) const {
  return level == 0 ? QString()
                    : path().mid(0, level).join(subgraph::kPathSeparator) + subgraph::kPathSeparator;
}

core::ValidationReport SubgraphNavigator::reportFor(int level) const {
  const QString prefix = this->prefix(level);
  core::ValidationReport out;
  for (const core::Issue& issue : report_.issues()) {
    if (!issue.node.startsWith(prefix) || (level > 0 && issue.node.size() == prefix.size())) continue;
    const QString local = issue.node.mid(prefix.size());
    const qsizetype slash = local.indexOf(subgraph::kPathSeparator);
    const auto add = [&](const QString& node, const QString& field, const QString& message) {
      if (issue.severity == core::Issue::Severity::Error)
        out.error(node, field, message);
      else
        out.warning(node, field, message);
    };
    if (slash < 0) {
      add(local, issue.field, issue.message);
      continue;
    }
    // Deeper inside: shown on the subgraph node of this level that holds it, naming the rest of the path.
    core::Issue inner = issue;
    inner.node = local.mid(slash + 1);
    add(local.left(slash), QString(), inner.text());
  }
  for (auto it = report_.facts().begin(); it != report_.facts().end(); ++it)
    if (it.key().startsWith(prefix) && !it.key().mid(prefix.size()).contains(subgraph::kPathSeparator))
      out.setFacts(it.key().mid(prefix.size()), it.value());
  return out;
}

// ---- run state ---------------------------------------------------------------------------------------

NodeRunState SubgraphNavigator::runState(const QString& path) const {
  return storedRunState(path).value_or(NodeRunState{});
}

std::optional<NodeRunState> SubgraphNavigator::storedRunState(const QString& path) const {
  if (const auto it = runStates_.constFind(path); it != runStates_.constEnd()) return it.value();
  const QString inside = path + subgraph::kPathSeparator;
  QMap<QString, NodeRunState> inner;
  for (auto it = runStates_.lowerBound(inside); it != runStates_.constEnd() && it.key().startsWith(inside);
       ++it)
    inner.insert(it.key().mid(inside.size()), it.value());
  if (inner.isEmpty()) return std::nullopt;
  return summarizeRunStates(inner);
}

GraphScene* SubgraphNavigator::sceneAt(int level) const {
  return level == 0 ? rootView_->graphScene() : levels_[level - 1]->scene;
}

void SubgraphNavigator::paintNode(int level, const QString& id) {
  if (level > depth()) return;
  NodeItem* item = sceneAt(level)->nodeItem(id);
  // A node the run said nothing about keeps what it shows.
  const std::optional<NodeRunState> s = storedRunState(prefix(level) + id);
  if (!item || !s) return;
  item->setRunState(s->status, s->timeMs, s->error);
  item->setCached(s->cached);
  if (s->status == RunStatus::Running) item->setProgress(s->progress);
  item->setRunWarning(s->warning);
}

void SubgraphNavigator::paintPath(const QString& path) {
  for (int level = 0; level <= depth(); ++level) {
    const QString before = prefix(level);
    if (!path.startsWith(before)) return;  // deeper levels have longer prefixes of the same path
    const QString local = path.mid(before.size());
    const qsizetype slash = local.indexOf(subgraph::kPathSeparator);
    paintNode(level, slash < 0 ? local : local.left(slash));
  }
}

void SubgraphNavigator::paintLevel(int level) {
  GraphScene* scene = sceneAt(level);
  for (const GraphNode& n : scene->document()->nodes()) paintNode(level, n.id);
  const QString before = prefix(level);
  if (before.isEmpty() || runReport_.isEmpty()) {
    scene->setPreviews(runReport_);
    return;
  }
  // The level's view of the report: its nodes' entries and series under their ids there.
  const auto local = [&](const QJsonObject& byPath) {
    QJsonObject out;
    for (auto it = byPath.begin(); it != byPath.end(); ++it)
      if (it.key().startsWith(before)) out.insert(it.key().mid(before.size()), it.value());
    return out;
  };
  QJsonObject report = runReport_;
  report.insert(QStringLiteral("nodes"), local(runReport_.value(QStringLiteral("nodes")).toObject()));
  report.insert(QStringLiteral("metrics"), local(runReport_.value(QStringLiteral("metrics")).toObject()));
  scene->setPreviews(report);
}

void SubgraphNavigator::resetRunState() {
  runStates_.clear();
  runReport_ = {};
  for (int level = 0; level <= depth(); ++level) sceneAt(level)->resetRunState();
}

void SubgraphNavigator::setRunStatus(const QString& path, RunStatus s, double timeMs, const QString& error) {
  NodeRunState& state = runStates_[path];
  state.status = s;
  state.timeMs = timeMs;
  state.error = error;
  if (s != RunStatus::Done) state.cached = false;
  if (s != RunStatus::Running) state.progress = s == RunStatus::Done ? 1 : 0;
  if (s == RunStatus::Idle) state.warning.clear();
  paintPath(path);
}

void SubgraphNavigator::setCached(const QString& path) {
  NodeRunState& state = runStates_[path];
  state = NodeRunState{RunStatus::Done, 0, 1, true, {}, state.warning};
  paintPath(path);
}

void SubgraphNavigator::setProgress(const QString& path, double p) {
  runStates_[path].progress = p;
  paintPath(path);
}

void SubgraphNavigator::setRunWarning(const QString& path, const QString& message) {
  runStates_[path].warning = message;
  paintPath(path);
}

void SubgraphNavigator::setPreviews(const QJsonObject& report) {
  runReport_ = report;
  for (int level = 0; level <= depth(); ++level) paintLevel(level);
}

}  // namespace gn::editor
