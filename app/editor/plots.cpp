#include "plots.h"

#include <qcustomplot.h>

#include <cmath>

#include "recent.h"
#include "results_views.h"
#include "style.h"

namespace gn::editor {

namespace {

constexpr int kHistory = 6;       // runs shown side by side
constexpr int kEpochLabels = 12;  // more epochs than this: only every n-th mark is numbered

const QColor kForeground(0xc8, 0xcc, 0xd2);

void styleAxis(QCPAxis* a) {
  a->setBasePen(QPen(kForeground));
  a->setTickPen(QPen(kForeground));
  a->setSubTickPen(QPen(kForeground));
  a->setTickLabelColor(kForeground);
  a->setLabelColor(kForeground);
}

}  // namespace

void applyPlotTheme(QCustomPlot* p) {
  const QColor fg = kForeground, grid(0x3a, 0x3f, 0x46);
  p->setBackground(QColor(0x1e, 0x20, 0x24));
  for (QCPAxis* a : {p->xAxis, p->yAxis, p->xAxis2, p->yAxis2}) {
    styleAxis(a);
    a->grid()->setPen(QPen(grid, 0, Qt::DotLine));
  }
  p->legend->setBrush(QColor(0x2a, 0x2d, 0x32, 220));
  p->legend->setBorderPen(QPen(grid));
  p->legend->setTextColor(fg);
  p->legend->setVisible(true);
  QFont f = p->font();
  f.setPointSizeF(8);
  p->legend->setFont(f);
  p->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
}

PlotsPanel::PlotsPanel(QWidget* parent) : QTabWidget(parent) {
  setObjectName("plots");
  timing_ = makePlot("timingPlot");
  memory_ = makePlot("memoryPlot");
  metrics_ = makePlot("metricsPlot");
  addTab(timing_, "Timing");
  addTab(memory_, "Memory");
  addTab(metrics_, "Training");
  confusion_ = new ConfusionView(this);
  mistakes_ = new MistakesView(this);
  addTab(confusion_, "Confusion");
  addTab(mistakes_, "Mistakes");

  timing_->yAxis->setLabel("wall time per node (ms)");
  timing_->xAxis->setTickLabelRotation(30);
  timing_->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
  group_ = new QCPBarsGroup(timing_);
  group_->setSpacingType(QCPBarsGroup::stAbsolute);
  group_->setSpacing(1);

  memory_->xAxis->setLabel("time (ms)");
  memory_->yAxis->setLabel("MiB");
  // Three curves per device make a long legend: beside the plot, not over the curves.
  for (QCustomPlot* p : {memory_, metrics_}) {
    p->plotLayout()->addElement(0, 1, p->legend);
    p->plotLayout()->setColumnStretchFactor(1, 0.001);
    p->legend->setMargins(QMargins(4, 2, 4, 2));
  }

  metrics_->xAxis->setLabel("step / epoch");
  metrics_->yAxis->setLabel("value");
  metrics_->yAxis2->setLabel("accuracy");
  metrics_->yAxis2->setRange(0, 1);
  // A rate of 0.1 beside a loss of 2 would be a flat line on the loss's axis: it gets its own.
  lrAxis_ = metrics_->axisRect()->addAxis(QCPAxis::atRight);
  styleAxis(lrAxis_);
  lrAxis_->setLabel("learning rate");
  lrAxis_->grid()->setVisible(false);
  lrAxis_->setVisible(false);
}

QCustomPlot* PlotsPanel::makePlot(const QString& name) {
  auto* p = new QCustomPlot(this);
  p->setObjectName(name);
  p->setMinimumHeight(160);
  applyPlotTheme(p);
  return p;
}

void PlotsPanel::beginRun(const QString& label, const QStringList& nodeOrder) {
  nodeOrder_ = nodeOrder;
  runs_.append(RunTiming{label, {}, 0, runSeq_++});
  while (runs_.size() > kHistory) runs_.removeFirst();
  memory_->clearGraphs();
  devices_.clear();
  metrics_->clearGraphs();
  metrics_->clearItems();
  series_.clear();
  epochLines_.clear();
  lrAxis_->setVisible(false);
  metrics_->yAxis2->setVisible(false);
  evaluationNodes_ = {};
  evaluationOrder_.clear();
  shownEvaluation_.clear();
  confusion_->clear("Running: the confusion matrix shows when an Evaluate node has finished.");
  mistakes_->clear("Running: the mistakes show when an Evaluate node has finished.");
  timingDirty_ = memoryDirty_ = metricsDirty_ = true;
}

void PlotsPanel::clearHistory() {
  runs_.clear();
  timingDirty_ = true;
  refresh();
}

void PlotsPanel::setNodeTime(const QString& node, double ms) {
  if (runs_.isEmpty()) return;
  runs_.last().ms[node] = ms;
  timingDirty_ = true;
}

void PlotsPanel::setRunWall(double ms) {
  if (runs_.isEmpty()) return;
  runs_.last().wallMs = ms;
  timingDirty_ = true;
}

int PlotsPanel::timingBars() const {
  return runs_.isEmpty() ? 0 : int(runs_.last().ms.size());
}

void PlotsPanel::rebuildTiming() {
  timing_->clearPlottables();
  group_->clear();
  // Categories: the run's wall time first, then the nodes any shown run timed, in graph order.
  QStringList cats{"(wall)"};
  for (const QString& n : nodeOrder_)
    for (const RunTiming& r : runs_)
      if (r.ms.contains(n)) {
        cats << n;
        break;
      }
  for (const RunTiming& r : runs_)
    for (auto it = r.ms.begin(); it != r.ms.end(); ++it)
      if (!cats.contains(it.key())) cats << it.key();
  QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
  for (int i = 0; i < cats.size(); ++i) ticker->addTick(i + 1, cats[i]);
  timing_->xAxis->setTicker(ticker);
  timing_->xAxis->setRange(0.4, cats.size() + 0.6);
  const double width = 0.8 / qMax(1, int(runs_.size()));
  double maxV = 0;
  for (int ri = 0; ri < runs_.size(); ++ri) {
    const RunTiming& r = runs_[ri];
    auto* bars = new QCPBars(timing_->xAxis, timing_->yAxis);
    bars->setName(r.label);
    bars->setWidth(width);
    const QColor c = style::seriesColor(r.seq);
    bars->setPen(QPen(c.darker(130)));
    bars->setBrush(c);
    bars->setBarsGroup(group_);
    QVector<double> keys, values;
    keys << 1;
    values << r.wallMs;
    maxV = qMax(maxV, r.wallMs);
    for (int i = 1; i < cats.size(); ++i)
      if (r.ms.contains(cats[i])) {
        keys << i + 1;
        values << r.ms.value(cats[i]);
        maxV = qMax(maxV, r.ms.value(cats[i]));
      }
    bars->setData(keys, values, true);
  }
  // Headroom above the tallest bar keeps the legend (top right) off the bars.
  timing_->yAxis->setRange(0, maxV > 0 ? maxV * 1.4 : 1);
}

void PlotsPanel::addMemory(const QList<core::MemorySampleEvent>& samples) {
  for (const core::MemorySampleEvent& s : samples) {
    auto it = devices_.find(s.device);
    if (it == devices_.end()) {
      const QColor c = style::seriesColor(int(devices_.size()));
      DeviceGraphs g;
      g.allocated = memory_->addGraph();
      g.allocated->setName(s.device + " allocated");
      g.allocated->setPen(QPen(c, 2));
      g.allocated->setLineStyle(QCPGraph::lsStepLeft);
      g.reserved = memory_->addGraph();
      g.reserved->setName(s.device + " reserved");
      g.reserved->setPen(QPen(c.lighter(140), 1.5, Qt::DashLine));
      g.reserved->setLineStyle(QCPGraph::lsStepLeft);
      g.peak = memory_->addGraph();
      g.peak->setName(s.device + " peak");
      g.peak->setPen(QPen(c.darker(110), 1, Qt::DotLine));
      g.peak->setLineStyle(QCPGraph::lsStepLeft);
      it = devices_.insert(s.device, g);
    }
    const double t = s.tUs / 1000.0, mib = 1024.0 * 1024.0;
    it->peakBytes = qMax(it->peakBytes, double(s.allocated));
    it->allocated->addData(t, s.allocated / mib);
    it->reserved->addData(t, s.reserved / mib);
    it->peak->addData(t, it->peakBytes / mib);
  }
  // Every allocation is a sample: a long run keeps the newest, as the timeline keeps the newest spans.
  for (const DeviceGraphs& g : devices_) {
    const int count = g.allocated->dataCount();
    if (count <= kKeptRunItems + kKeptRunItems / 4) continue;
    const double from = (g.allocated->data()->constBegin() + (count - kKeptRunItems))->key;
    for (QCPGraph* graph : {g.allocated, g.reserved, g.peak}) graph->data()->removeBefore(from);
  }
  if (!samples.isEmpty()) memoryDirty_ = true;
}

int PlotsPanel::memoryPoints() const {
  int n = 0;
  for (const DeviceGraphs& g : devices_) n += g.allocated->dataCount();
  return n;
}

void PlotsPanel::addMetric(const QString& series, double t, double value) {
  QCPGraph*& g = series_[series];
  if (!g) {
    // Accuracies live in [0, 1]: on the right axis, so a loss in the tens does not flatten them.
    const bool lr = series.endsWith(".lr");
    const bool acc = !lr && series.contains("acc", Qt::CaseInsensitive);
    g = metrics_->addGraph(metrics_->xAxis, lr ? lrAxis_ : acc ? metrics_->yAxis2 : metrics_->yAxis);
    g->setName(series);
    if (lr) {
      g->setPen(QPen(QColor(0xe0, 0xb0, 0x50), 1.5, Qt::DashLine));
      g->setLineStyle(QCPGraph::lsStepLeft);
    } else {
      g->setPen(QPen(style::seriesColor(int(series_.size()) - 1), 2));
      g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, 4));
    }
    if (acc) metrics_->yAxis2->setVisible(true);
    if (lr) lrAxis_->setVisible(true);
  }
  g->addData(t, value);
  if (series.endsWith(".epoch_seconds")) markEpoch(t);
  metricsDirty_ = true;
}

void PlotsPanel::markEpoch(double t) {
  if (!std::isfinite(t) || epochLines_.contains(t)) return;
  auto* line = new QCPItemStraightLine(metrics_);
  line->setLayer("grid");  // behind the curves
  line->setPen(QPen(QColor(0xc8, 0xcc, 0xd2, 60), 1, Qt::DashLine));
  line->point1->setCoords(t, 0);
  line->point2->setCoords(t, 1);
  auto* label = new QCPItemText(metrics_);
  label->setLayer("grid");
  label->setClipToAxisRect(true);
  label->position->setTypeX(QCPItemPosition::ptPlotCoords);
  label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
  label->position->setCoords(t, 0);
  label->setPositionAlignment(Qt::AlignTop | Qt::AlignRight);
  label->setPadding(QMargins(2, 2, 3, 0));
  label->setColor(QColor(0xc8, 0xcc, 0xd2, 150));
  QFont f = metrics_->font();
  f.setPointSizeF(7.5);
  label->setFont(f);
  label->setText(QString("epoch %1").arg(t));
  epochLines_.insert(t, {line, label});
}

void PlotsPanel::labelEpochs() {
  const int every = (int(epochLines_.size()) + kEpochLabels - 1) / kEpochLabels;
  int i = 0;
  for (auto it = epochLines_.begin(); it != epochLines_.end(); ++it, ++i)
    it.value().last()->setVisible(every <= 1 || (i + 1) % every == 0);
}

void PlotsPanel::setEvaluations(const QJsonObject& nodes, const QStringList& finishedOrder) {
  evaluationNodes_ = nodes;
  evaluationOrder_.clear();
  for (const QString& n : finishedOrder)
    if (!evaluationOrder_.contains(n) && EvaluationResults::fromReport(n, nodes.value(n).toObject()))
      evaluationOrder_ << n;
  shownEvaluation_.clear();
  if (evaluationOrder_.isEmpty()) {
    confusion_->clear("No Evaluate node finished in the last run: its confusion matrix would show here.");
    mistakes_->clear("No Evaluate node finished in the last run: the images it got wrong would show here.");
    return;
  }
  showEvaluation(evaluationOrder_.last());
}

bool PlotsPanel::showEvaluation(const QString& node) {
  if (!evaluationOrder_.contains(node)) return false;
  if (node == shownEvaluation_) return true;
  const std::optional<EvaluationResults> r =
      EvaluationResults::fromReport(node, evaluationNodes_.value(node).toObject());
  if (!r) return false;
  EvaluationResults shown = *r;
  if (evaluationOrder_.size() > 1)
    shown.note = QString("one of %1 evaluations: select another Evaluate node to see its results")
                     .arg(evaluationOrder_.size());
  confusion_->setResults(shown);
  mistakes_->setResults(shown);
  shownEvaluation_ = node;
  return true;
}

int PlotsPanel::metricPoints() const {
  int n = 0;
  for (QCPGraph* g : series_) n += g->dataCount();
  return n;
}

void PlotsPanel::refresh() {
  if (timingDirty_) {
    rebuildTiming();
    timing_->replot(QCustomPlot::rpQueuedReplot);
  }
  if (memoryDirty_) {
    memory_->rescaleAxes();
    memory_->yAxis->setRangeLower(0);
    memory_->yAxis->setRangeUpper(memory_->yAxis->range().upper * 1.1 + 1e-6);
    memory_->replot(QCustomPlot::rpQueuedReplot);
  }
  if (metricsDirty_) {
    metrics_->xAxis->rescale();
    metrics_->yAxis->rescale();
    metrics_->yAxis->scaleRange(1.1);
    if (lrAxis_->visible()) {
      lrAxis_->rescale();
      lrAxis_->setRange(0, lrAxis_->range().upper > 0 ? lrAxis_->range().upper * 1.1 : 1);
    }
    labelEpochs();
    metrics_->replot(QCustomPlot::rpQueuedReplot);
  }
  timingDirty_ = memoryDirty_ = metricsDirty_ = false;
}

bool PlotsPanel::exportPng(const QString& path, QString* error) const {
  auto* plot = qobject_cast<QCustomPlot*>(currentWidget());
  if (!plot) {
    // The Confusion and Mistakes tabs are more than a plot: their header and the grid go in the picture too.
    if (currentWidget()->grab().save(path, "PNG")) return true;
    if (error) *error = QString("could not write %1").arg(path);
    return false;
  }
  plot->replot();
  if (plot->savePng(path, qMax(plot->width(), 800), qMax(plot->height(), 500))) return true;
  if (error) *error = QString("could not write %1").arg(path);
  return false;
}

}  // namespace gn::editor
