// Editing subgraphs in place. Double-clicking a Subgraph node enters it: its inner graph opens on a canvas of
// its own (a level), above the breadcrumb "graph › block1 › inner", whose crumbs go back up. Each level has
// its own document, GraphEditor and canvas; every edit there is written up through the levels into the root
// document at once, as one step on the root's undo stack, so undo, saving and runs see it wherever the user
// is. When the root changes under a level (undo, a load), the level reloads or, when its node is gone,
// closes. What the root's validation and runs report by path id ("block1/conv2") is shown at every level:
// on conv2 inside block1, and summed up on block1 above it.
#pragma once
#include <QJsonObject>
#include <QLabel>
#include <QMap>
#include <QObject>
#include <QStringList>
#include <QWidget>
#include <memory>
#include <optional>

#include "canvas/graph_view.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"

class QHBoxLayout;
class QStackedWidget;

namespace gn::editor {

// What a run showed on one node: its status badge, time, error, warning and progress.
struct NodeRunState {
  RunStatus status = RunStatus::Idle;
  double timeMs = 0, progress = 0;
  bool cached = false;
  QString error, warning;
};

// What a Subgraph node shows for the nodes it holds (`inner`: each one's path below it, "conv2" or
// "block2/conv2", and its state). Running while any of them runs (or some are done and others still queued),
// with their mean progress; failed if any failed, with the first failure's error named by its path; cancelled
// if any were cancelled or skipped; queued while all are; done, with the summed time, when every one that
// ran is done, and cached when each came from the run cache. Nodes that did not take part (idle) count for
// nothing; idle when none did.
NodeRunState summarizeRunStates(const QMap<QString, NodeRunState>& inner);

// The path above the canvas: a button per level, the last one current; the inner graph's ports on the right.
class Breadcrumb : public QWidget {
  Q_OBJECT
 public:
  explicit Breadcrumb(QWidget* parent = nullptr);
  void setPath(const QStringList& crumbs, const QString& ports);
  QString text() const;  // "graph › block1 › inner", as shown
 signals:
  void levelClicked(int level);  // 0 is the root graph

 private:
  QHBoxLayout* crumbs_;
  QLabel* ports_;
  QStringList shown_;
};

class SubgraphNavigator : public QObject {
  Q_OBJECT
 public:
  // The root level is rootView's; inner levels' views are added to `stack`, which holds rootView.
  SubgraphNavigator(GraphEditor* root, GraphView* rootView, QStackedWidget* stack, Breadcrumb* crumbs,
                    QObject* parent = nullptr);
  ~SubgraphNavigator() override;

  // Opens the Subgraph node `nodeId` of the current level; false when it is not one.
  bool enter(const QString& nodeId);
  // Opens the levels down to the node at a path id of the root ("block1/conv2"), selects it there and
  // centres the view on it; false, with the levels as they were, when there is no such node.
  bool reveal(const QString& path);
  // Closes the levels above `level` (0: back to the root graph).
  void exitTo(int level);
  int depth() const { return int(levels_.size()); }
  QStringList path() const;  // the Subgraph node ids from the root down
  // What ids at `level` are prefixed with to make path ids of the root: "" at the root, "block1/" inside.
  QString prefix(int level) const;
  GraphEditor* currentEditor() const;
  GraphScene* currentScene() const;
  GraphView* currentView() const;

  // Paints a validation report of the root graph on every level: an issue of "block1/conv2" shows on block1
  // at the root and on conv2 inside block1. reportFor(level) is the report as that level sees it.
  void setValidation(const core::ValidationReport& report);
  core::ValidationReport reportFor(int level) const;

  // The run as its events and report name nodes, by path id: each open level shows a node's state on it and
  // an inner node's on the Subgraph node of that level that holds it (summarizeRunStates); levels opened
  // later show them too. The setters follow GraphScene's.
  void resetRunState();  // also hides the previews
  void setRunStatus(const QString& path, RunStatus s, double timeMs = 0, const QString& error = {});
  void setCached(const QString& path);
  void setProgress(const QString& path, double p);
  void setRunWarning(const QString& path, const QString& message);
  // The previews of a finished run, from its report (keyed by path id).
  void setPreviews(const QJsonObject& report);
  // A node's state: as the run reported it, or for a Subgraph node, summed up from the nodes inside.
  NodeRunState runState(const QString& path) const;

 signals:
  void levelChanged();
  void viewOpened(GraphView* view);               // an inner level's canvas, just made
  void selectionChanged(const QStringList& ids);  // on an inner level

 private:
  struct Level;
  void onInnerEdit(int level, int index);
  void refresh();
  void updateCrumbs();
  GraphScene* sceneAt(int level) const;
  std::optional<NodeRunState> storedRunState(const QString& path) const;  // none when the run did not say
  void paintPath(const QString& path);                                    // on every open level that shows it
  void paintNode(int level, const QString& id);
  void paintLevel(int level);  // every node's state and preview
  GraphEditor* root_;
  GraphView* rootView_;
  QStackedWidget* stack_;
  Breadcrumb* crumbs_;
  std::vector<std::unique_ptr<Level>> levels_;
  core::ValidationReport report_;
  QMap<QString, NodeRunState> runStates_;  // by path id, ordered: a subgraph's nodes are one range
  QJsonObject runReport_;
  bool writing_ = false;  // an inner edit is being written to the root: the levels are up to date
  int step_ = 0;          // counts inner edits, so that only a merged one joins the root's last step
};

}  // namespace gn::editor
