// Live plots (QCustomPlot): time per node as bars with a history of runs side by side (parallel vs
// sequential, blocking vs non-blocking), memory per device over time (allocated, reserved, peak), and any
// metric series the nodes emit (loss, train and test accuracy, the learning rate, each epoch marked); and
// after a run, an evaluation's confusion matrix and mistakes (results_views.h).
#pragma once
#include <QHash>
#include <QJsonObject>
#include <QMap>
#include <QTabWidget>

#include "gpunodes/core/run_events.h"

class QCustomPlot;
class QCPAxis;
class QCPBarsGroup;
class QCPGraph;
class QCPAbstractItem;

namespace gn::editor {

class ConfusionView;
class MistakesView;

// The editor's dark plot style.
void applyPlotTheme(QCustomPlot* p);

class PlotsPanel : public QTabWidget {
  Q_OBJECT
 public:
  explicit PlotsPanel(QWidget* parent = nullptr);

  // A new run: its bars join the history; memory and metric curves start again.
  void beginRun(const QString& label, const QStringList& nodeOrder);
  void setNodeTime(const QString& node, double ms);
  void setRunWall(double ms);
  void addMemory(const QList<core::MemorySampleEvent>& samples);
  void addMetric(const QString& series, double t, double value);
  // Redraws what changed since the last call; the run controller calls it once per batch of events.
  void refresh();
  void clearHistory();

  QCustomPlot* timingPlot() const { return timing_; }
  QCustomPlot* memoryPlot() const { return memory_; }
  QCustomPlot* metricsPlot() const { return metrics_; }
  // The Training plot's axis for series ending in ".lr", on the right beside the accuracies' 0-1 axis.
  QCPAxis* learningRateAxis() const { return lrAxis_; }
  // Where the Training plot marks an epoch's end: every t of a series ending in ".epoch_seconds".
  QList<double> epochMarks() const { return epochLines_.keys(); }
  ConfusionView* confusionView() const { return confusion_; }
  MistakesView* mistakesView() const { return mistakes_; }

  // After a run: the node entries of its report and the order its nodes finished in. The Confusion and
  // Mistakes tabs show the evaluation of the last node to finish that has one (an entry with `confusion`).
  void setEvaluations(const QJsonObject& nodes, const QStringList& finishedOrder);
  // Shows `node`'s evaluation instead; false (nothing changes) when it has none in the last run.
  bool showEvaluation(const QString& node);
  QString shownEvaluation() const { return shownEvaluation_; }
  QStringList evaluations() const { return evaluationOrder_; }
  int runCount() const { return int(runs_.size()); }
  int timingBars() const;  // bars with data in the current run
  int memoryPoints() const;
  int metricPoints() const;
  bool exportPng(const QString& path, QString* error) const;  // the visible tab

 private:
  struct RunTiming {
    QString label;
    QMap<QString, double> ms;
    double wallMs = 0;
    int seq = 0;  // keeps a run's colour as older runs drop out
  };
  struct DeviceGraphs {
    QCPGraph *allocated = nullptr, *reserved = nullptr, *peak = nullptr;
    double peakBytes = 0;
  };
  void rebuildTiming();
  void markEpoch(double t);
  void labelEpochs();
  QCustomPlot* makePlot(const QString& name);

  QCustomPlot *timing_, *memory_, *metrics_;
  QCPBarsGroup* group_ = nullptr;
  QList<RunTiming> runs_;
  QStringList nodeOrder_;
  QMap<QString, DeviceGraphs> devices_;
  QMap<QString, QCPGraph*> series_;
  QCPAxis* lrAxis_ = nullptr;
  QMap<double, QList<QCPAbstractItem*>> epochLines_;
  ConfusionView* confusion_;
  MistakesView* mistakes_;
  QJsonObject evaluationNodes_;
  QStringList evaluationOrder_;  // nodes with an evaluation, in the order they finished
  QString shownEvaluation_;
  int runSeq_ = 0;
  bool timingDirty_ = false, memoryDirty_ = false, metricsDirty_ = false;
};

}  // namespace gn::editor
