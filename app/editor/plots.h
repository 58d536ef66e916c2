// Live plots (QCustomPlot): time per node as bars with a history of runs side by side (parallel vs
// sequential, blocking vs non-blocking), memory per device over time (allocated, reserved, peak; a min/max
// band per pixel column when the samples are denser than the pixels), and the metric series the nodes emit
// in stacked panes that share the epoch axis (loss; a language model's perplexity on a log axis; train and
// test accuracy on 0-1; a regression's errors with R² on a second axis; images/s; the learning rate where it
// varies), each epoch marked, with the same series of earlier runs overlaid on request; and after a run, an
// evaluation's confusion matrix and mistakes (results_views.h), or a regression's predictions against the
// truth (predictions_view.h), and what the selected attention layer attends to (attention_view.h). Every plot
// exports as PNG and SVG.
#pragma once
#include <QHash>
#include <QJsonObject>
#include <QMap>
#include <QSet>
#include <QSharedPointer>
#include <QTabWidget>

#include "gpunodes/core/run_events.h"

class QCustomPlot;
class QCPAxis;
class QCPAxisRect;
class QCPBarsGroup;
class QCPGraph;
class QCPLegend;
class QCPMarginGroup;
class QToolButton;
class QMenu;
template <class DataType>
class QCPDataContainer;
class QCPGraphData;
using QCPGraphDataContainer = QCPDataContainer<QCPGraphData>;

namespace gn::core {
class GraphDocument;
}

namespace gn::editor {

class AttentionView;
class ConfusionView;
class MistakesView;
class PredictionsView;

// The editor's dark plot style.
void applyPlotTheme(QCustomPlot* p);

// Writes `plot` as an SVG picture of width x height (its size on screen when 0): vector curves and text.
bool savePlotSvg(QCustomPlot* plot, const QString& path, int width = 0, int height = 0);

// A series of samples held as a step function (each value holds until the next sample), seen through
// `columns` equal pixel columns over [from, to]: for each column that the function covers, its least and
// greatest value there (the value carried in from before the column included) and the value at its end.
// `keys` are the columns' left edges.
struct ColumnEnvelope {
  QVector<double> keys, min, max, last;
};
ColumnEnvelope stepEnvelope(const QCPGraphDataContainer& samples, double from, double to, int columns);

// The settings of a run that tell it from another: the document's settings ("schedule", "cpu_devices") and
// every param the file sets, as "node.param", each value as compact JSON text.
QMap<QString, QString> runSettings(const core::GraphDocument& doc);

// The panes of the Training tab, top to bottom. A series goes to a pane by its name after the node id
// ("train.loss" is a loss, "train.test_perplexity" a perplexity, "train.test_r2" a regression's): see
// paneOf().
enum class MetricPane { Loss, Perplexity, Accuracy, Regression, Throughput, LearningRate, Devices, Other };
MetricPane paneOf(const QString& series);
// "loss", "perplexity", "accuracy", "regression", "images/s", "learning rate", "devices", "other"
QString paneName(MetricPane pane);

class PlotsPanel : public QTabWidget {
  Q_OBJECT
 public:
  explicit PlotsPanel(QWidget* parent = nullptr);

  // A new run: its bars join the history; memory and metric curves start again. `settings` (runSettings())
  // lets an overlay of this run say how it differed from the one shown.
  void beginRun(const QString& label, const QStringList& nodeOrder,
                const QMap<QString, QString>& settings = {});
  void setNodeTime(const QString& node, double ms);
  void setRunWall(double ms);
  void addMemory(const QList<core::MemorySampleEvent>& samples);
  void addMetric(const QString& series, double t, double value);
  // Redraws what changed since the last call; the run controller calls it once per batch of events.
  void refresh();
  // Forgets the runs before the current one: their timing bars and overlays.
  void clearHistory();

  QCustomPlot* timingPlot() const { return timing_; }
  QCustomPlot* memoryPlot() const { return memory_; }
  QCustomPlot* metricsPlot() const { return metrics_; }

  // The Training tab. The panes shown, top to bottom (paneName()); a pane shows when it has a series, is
  // not hidden (setPaneHidden) and, for the learning rate, when some rate varies.
  QStringList trainingPanes() const;
  QCPAxisRect* paneRect(MetricPane pane) const;
  void setPaneHidden(MetricPane pane, bool hidden);  // remembered across sessions
  bool paneHidden(MetricPane pane) const { return hiddenPanes_.contains(pane); }
  // The curve of `series` in the current run, or in the earlier run `runSeq` when it is overlaid; null
  // when there is none.
  QCPGraph* metricGraph(const QString& series, int runSeq = -1) const;
  // The learning rate pane's axis; null while no rate varies.
  QCPAxis* learningRateAxis() const;
  // Where the Training panes mark an epoch's end: every t of a series ending in ".epoch_seconds".
  QList<double> epochMarks() const;

  // Earlier runs whose metric series can be overlaid on the current run's (their seq numbers, oldest
  // first), and what an overlay calls each: its label and the settings that differ from the current run's.
  QList<int> earlierRuns() const;
  QString runDescription(int runSeq) const;
  void setRunOverlaid(int runSeq, bool on);
  bool runOverlaid(int runSeq) const { return overlaid_.contains(runSeq); }

  // The memory plot draws a min/max band per pixel column while the samples in view outnumber the pixels.
  bool memoryEnvelopeShown() const { return memoryEnvelope_; }
  QCPGraph* memoryBand(const QString& device, bool upper) const;  // the band's edges (empty when not shown)
  QCPGraph* memoryCurve(const QString& device) const;  // allocated: the samples, or each column's last

  ConfusionView* confusionView() const { return confusion_; }
  MistakesView* mistakesView() const { return mistakes_; }
  PredictionsView* predictionsView() const { return predictions_; }
  AttentionView* attentionView() const { return attention_; }

  // After a run: the node entries of its report and the order its nodes finished in. The Confusion,
  // Mistakes and Predictions tabs show the evaluation of the last node to finish that has one: a classifier's
  // (an entry with `confusion`) or a language model's in the first two, a regression's in the third (see
  // evaluationTask()).
  void setEvaluations(const QJsonObject& nodes, const QStringList& finishedOrder);
  // Shows `node`'s evaluation instead; false (nothing changes) when it has none in the last run.
  bool showEvaluation(const QString& node);
  QString shownEvaluation() const { return shownEvaluation_; }
  QStringList evaluations() const { return evaluationOrder_; }
  // The Attention tab follows the selection (node paths): the first selected node that is, or holds, a layer
  // whose attention the last run recorded shows it; else the first says it has none. An Evaluate node that
  // recorded attention shows its own. False when none of them has attention to show (nothing changes when
  // the run recorded none, whose message stays).
  bool showAttention(const QStringList& paths);
  int runCount() const { return int(runs_.size()); }
  int timingBars() const;  // bars with data in the current run
  int memoryPoints() const;
  int metricPoints() const;
  // The visible tab as a picture: SVG when `path` ends in .svg, PNG otherwise.
  bool exportVisible(const QString& path, QString* error) const;

  // The menu a plot shows on a right click: export, and for the Training tab its panes and earlier runs.
  QMenu* contextMenuFor(QWidget* page);

 signals:
  // A plot's context menu asked to export the visible tab as "png" or "svg".
  void exportRequested(const QString& format);

 private:
  using Series = QSharedPointer<QCPGraphDataContainer>;
  struct Run {
    QString label;
    QMap<QString, double> ms;
    double wallMs = 0;
    int seq = 0;  // keeps a run's colour as older runs drop out
    QMap<QString, QString> settings;
    QMap<QString, Series> metrics;  // every series of the run, by name, in the order of its name
    QStringList metricOrder;        // the same names in the order they first came
  };
  struct DeviceMemory {
    Series allocated, reserved, peak;  // every sample kept (the newest kKeptRunItems)
    QCPGraph *allocatedCurve = nullptr, *reservedCurve = nullptr, *peakCurve = nullptr;
    QCPGraph *bandLow = nullptr, *bandHigh = nullptr;
    double peakBytes = 0;
  };
  struct Pane {
    QCPAxisRect* rect = nullptr;
    QCPAxis* right = nullptr;  // the second value axis (s/epoch, R², batch share), when the pane has one
    QCPLegend* legend = nullptr;
  };
  void rebuildTiming();
  void rebuildTraining();
  QString differenceText(
      const Run& run) const;  // " (train.lr=0.3, +2 more)": settings unlike the current run's
  void rescaleTraining();
  QSet<MetricPane> usedPanes() const;  // the panes the current and the overlaid runs have series for
  QList<MetricPane> shownPanes() const;
  bool learningRateVaries() const;
  QCPGraph* addMetricGraph(MetricPane pane, const QString& series, const Series& data, const QColor& color,
                           int overlayRank);
  void updateMemoryCurves();
  void refreshCompareButton();
  void addRunToggles(QMenu* menu);  // a checkable entry per earlier run: overlaid or not
  QCustomPlot* makePlot(const QString& name);

  QCustomPlot *timing_, *memory_, *metrics_;
  QToolButton* compare_;
  QCPBarsGroup* group_ = nullptr;
  QList<Run> runs_;
  QStringList nodeOrder_;
  QMap<QString, DeviceMemory> devices_;
  QMap<MetricPane, Pane> panes_;
  QHash<QString, QCPGraph*> currentGraphs_;              // series -> curve of the current run
  QHash<int, QHash<QString, QCPGraph*>> overlayGraphs_;  // run seq -> series -> curve
  QSet<int> overlaid_;
  QSet<MetricPane> hiddenPanes_;
  QCPMarginGroup* paneMargins_ = nullptr;
  ConfusionView* confusion_;
  MistakesView* mistakes_;
  PredictionsView* predictions_;
  AttentionView* attention_;
  QJsonObject evaluationNodes_;
  QStringList evaluationOrder_;  // nodes with an evaluation, in the order they finished
  QString shownEvaluation_;
  int runSeq_ = 0;
  bool memoryEnvelope_ = false;
  // What the memory curves were last computed for: recomputed when the view, the width or the data change.
  double envelopeFrom_ = 0, envelopeTo_ = 0;
  int envelopeColumns_ = 0;
  bool timingDirty_ = false, memoryDirty_ = false, metricsDirty_ = false, trainingLayoutDirty_ = true;
  bool syncingX_ = false;
};

}  // namespace gn::editor
