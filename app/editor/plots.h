// Live plots (QCustomPlot): time per node as bars with a history of runs side by side (parallel vs
// sequential, blocking vs non-blocking), memory per device over time (allocated, reserved, peak), and any
// metric series the nodes emit (loss, train and test accuracy).
#pragma once
#include <QHash>
#include <QMap>
#include <QTabWidget>

#include "gpunodes/core/run_events.h"

class QCustomPlot;
class QCPBarsGroup;
class QCPGraph;

namespace gn::editor {

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
  int runCount() const { return int(runs_.size()); }
  int timingBars() const;  // bars with data in the current run
  int memoryPoints() const;
  int metricPoints() const;
  bool exportPng(const QString& path, QString* error) const;  // the visible plot

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
  QCustomPlot* makePlot(const QString& name);

  QCustomPlot *timing_, *memory_, *metrics_;
  QCPBarsGroup* group_ = nullptr;
  QList<RunTiming> runs_;
  QStringList nodeOrder_;
  QMap<QString, DeviceGraphs> devices_;
  QMap<QString, QCPGraph*> series_;
  int runSeq_ = 0;
  bool timingDirty_ = false, memoryDirty_ = false, metricsDirty_ = false;
};

}  // namespace gn::editor
