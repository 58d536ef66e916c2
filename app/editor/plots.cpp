#include "plots.h"

#include <qcustomplot.h>

#include <QFileInfo>
#include <QMenu>
#include <QSettings>
#include <QSvgGenerator>
#include <QToolButton>
#include <algorithm>
#include <cmath>
#include <memory>

#include "attention_view.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/report_format.h"
#include "predictions_view.h"
#include "recent.h"
#include "results_views.h"
#include "style.h"

namespace gn::editor {

namespace {

constexpr int kHistory = 6;  // runs kept: side by side in the timing plot, overlaid on the Training panes
constexpr int kEpochLabels = 12;      // more epochs than this: only every n-th mark is numbered
constexpr int kDifferencesShown = 3;  // settings named in an overlay's description, then "+N more"

const QColor kForeground(0xc8, 0xcc, 0xd2);
const QColor kGrid(0x3a, 0x3f, 0x46);

const QList<MetricPane> kAllPanes{MetricPane::Loss,       MetricPane::Perplexity, MetricPane::Accuracy,
                                  MetricPane::Regression, MetricPane::Throughput, MetricPane::LearningRate,
                                  MetricPane::Devices,    MetricPane::Other};

void styleAxis(QCPAxis* a) {
  a->setBasePen(QPen(kForeground));
  a->setTickPen(QPen(kForeground));
  a->setSubTickPen(QPen(kForeground));
  a->setTickLabelColor(kForeground);
  a->setLabelColor(kForeground);
  a->grid()->setPen(QPen(kGrid, 0, Qt::DotLine));
}

void styleLegend(QCPLegend* legend, const QFont& base) {
  legend->setBrush(QColor(0x2a, 0x2d, 0x32, 220));
  legend->setBorderPen(QPen(kGrid));
  legend->setTextColor(kForeground);
  QFont f = base;
  f.setPointSizeF(8);
  legend->setFont(f);
  legend->setMargins(QMargins(4, 2, 4, 2));
  legend->setRowSpacing(0);
  legend->setIconSize(24, 14);  // no lower: the item is as tall as the icon, and an underscore needs room
}

// The part of a series' name after the node id, without a "/device" suffix: "train.memory_mb/cpu:1" is a
// "memory_mb"; a series without a node id ("norm1", a Norm's log) is its own kind.
QString seriesKind(const QString& series) {
  const qsizetype dot = series.indexOf('.');
  return (dot < 0 ? series : series.mid(dot + 1)).section('/', 0, 0);
}

// Whether a series' kind is `measure` on some split: "test_mse" and "mse" are MSEs, "layer2" is no R².
bool measures(const QString& kind, const QString& measure) {
  return kind == measure || kind.endsWith("_" + measure);
}

// Within a pane, the series in another unit than the pane's own, on the pane's right axis.
bool onRightAxis(const QString& series) {
  const QString kind = seriesKind(series);
  return kind == "epoch_seconds" || kind == "share" || measures(kind, "r2");
}

// Room at the top of an axis for the epoch labels: a share of the range as it is drawn, on a log axis too.
void addHeadroom(QCPAxis* y, double share) {
  const QCPRange r = y->range();
  if (y->scaleType() == QCPAxis::stLogarithmic && r.lower > 0)
    y->setRangeUpper(r.upper * std::pow(r.upper / r.lower, share));
  else
    y->setRangeUpper(r.upper + share * r.size());
}

// A param's value in a legend or a menu: a network's layers or a long path would crowd out the rest.
QString elided(const QString& value) {
  constexpr int kLongest = 24;
  return value.size() > kLongest ? value.left(kLongest - 1) + "…" : value;
}

// Earlier runs overlaid on the current one: the colour of the same series, fainter, dashed differently per
// run so that two overlays of the same series stay apart.
QPen overlayPen(const QColor& c, int rank) {
  static const Qt::PenStyle styles[] = {Qt::DashLine, Qt::DotLine, Qt::DashDotLine, Qt::DashDotDotLine};
  QColor faint = c;
  faint.setAlpha(150);
  return QPen(faint, 1.3, styles[rank % 4]);
}

// A legend in column 1 of a plot's row: at the top of the cell, its entries packed rather than spread over
// the row's height. Beside the plot, not over the curves.
void putLegendBeside(QCustomPlot* p, QCPLegend* legend, int row) {
  auto* box = new QCPLayoutGrid;
  p->plotLayout()->addElement(row, 1, box);
  box->addElement(0, 0, legend);
  box->addElement(1, 0, new QCPLayoutElement(p));
  box->setRowStretchFactor(0, 0.001);
  box->setRowSpacing(0);
  p->plotLayout()->setColumnStretchFactor(1, 0.001);
}

}  // namespace

void applyPlotTheme(QCustomPlot* p) {
  p->setBackground(QColor(0x1e, 0x20, 0x24));
  for (QCPAxis* a : {p->xAxis, p->yAxis, p->xAxis2, p->yAxis2}) styleAxis(a);
  styleLegend(p->legend, p->font());
  p->legend->setVisible(true);
  p->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
}

bool savePlotSvg(QCustomPlot* plot, const QString& path, int width, int height) {
  if (width <= 0) width = plot->width();
  if (height <= 0) height = plot->height();
  QSvgGenerator svg;
  svg.setFileName(path);
  svg.setSize(QSize(width, height));
  svg.setViewBox(QRect(0, 0, width, height));
  svg.setResolution(plot->logicalDpiX());  // a viewer shows it at the size it had on screen
  svg.setTitle(plot->objectName());
  svg.setDescription("gpunodes plot");
  QCPPainter painter;
  if (!painter.begin(&svg)) return false;
  // As QCustomPlot's own PDF export: no cached pixmaps, so curves stay paths and labels stay text.
  painter.setMode(QCPPainter::pmVectorized);
  painter.setMode(QCPPainter::pmNoCaching);
  plot->toPainter(&painter, width, height);
  return painter.end() && QFileInfo(path).size() > 0;
}

ColumnEnvelope stepEnvelope(const QCPGraphDataContainer& samples, double from, double to, int columns) {
  ColumnEnvelope e;
  if (columns <= 0 || !(to > from) || samples.isEmpty()) return e;
  const double width = (to - from) / columns;
  auto it = std::lower_bound(samples.constBegin(), samples.constEnd(), from,
                             [](const QCPGraphData& d, double key) { return d.key < key; });
  // The value in force where the view begins: the last sample at or before `from`.
  bool defined = it != samples.constBegin();
  double carried = defined ? (it - 1)->value : 0;
  for (int c = 0; c < columns; ++c) {
    const double lo = from + c * width;
    const bool lastColumn = c + 1 == columns;
    const double hi = lastColumn ? to : from + (c + 1) * width;
    // The value at the column's left edge is the carried one unless a sample sits exactly there.
    bool any = defined && (it == samples.constEnd() || it->key > lo);
    double mn = carried, mx = carried, last = carried;
    for (; it != samples.constEnd() && (it->key < hi || (lastColumn && it->key <= to)); ++it) {
      const double v = it->value;
      mn = any ? std::min(mn, v) : v;
      mx = any ? std::max(mx, v) : v;
      last = v;
      any = true;
    }
    if (!any) continue;  // the series has not started yet
    e.keys << lo;
    e.min << mn;
    e.max << mx;
    e.last << last;
    carried = last;
    defined = true;
  }
  return e;
}

QMap<QString, QString> runSettings(const core::GraphDocument& doc) {
  QMap<QString, QString> settings;
  for (const core::GraphNode& n : doc.nodes())
    for (auto it = n.params.begin(); it != n.params.end(); ++it)
      settings.insert(n.id + "." + it.key(), core::paramValueText(it.value()));
  return settings;
}

MetricPane paneOf(const QString& series) {
  const QString kind = seriesKind(series);
  if (measures(kind, "loss")) return MetricPane::Loss;
  if (kind.contains("perplexity")) return MetricPane::Perplexity;
  if (measures(kind, "mse") || measures(kind, "mae") || measures(kind, "r2")) return MetricPane::Regression;
  if (kind == "lr") return MetricPane::LearningRate;
  if (kind == "images_per_second" || kind == "epoch_seconds") return MetricPane::Throughput;
  if (kind == "memory_mb" || kind == "peak_memory_mb" || kind == "share") return MetricPane::Devices;
  if (kind.contains("acc", Qt::CaseInsensitive)) return MetricPane::Accuracy;
  return MetricPane::Other;
}

QString paneName(MetricPane pane) {
  switch (pane) {
    case MetricPane::Loss:
      return "loss";
    case MetricPane::Perplexity:
      return "perplexity";
    case MetricPane::Accuracy:
      return "accuracy";
    case MetricPane::Regression:
      return "regression";
    case MetricPane::Throughput:
      return "images/s";
    case MetricPane::LearningRate:
      return "learning rate";
    case MetricPane::Devices:
      return "devices";
    case MetricPane::Other:
      break;
  }
  return "other";
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
  predictions_ = new PredictionsView(this);
  addTab(confusion_, "Confusion");
  addTab(mistakes_, "Mistakes");
  addTab(predictions_, "Predictions");
  attention_ = new AttentionView(this);
  addTab(attention_, "Attention");
  for (QWidget* page : {static_cast<QWidget*>(confusion_), static_cast<QWidget*>(mistakes_),
                        static_cast<QWidget*>(predictions_), static_cast<QWidget*>(attention_)}) {
    page->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(page, &QWidget::customContextMenuRequested, this, [this, page](const QPoint& pos) {
      std::unique_ptr<QMenu> menu(contextMenuFor(page));
      menu->exec(page->mapToGlobal(pos));
    });
  }

  timing_->yAxis->setLabel("wall time per node (ms)");
  timing_->xAxis->setTickLabelRotation(30);
  timing_->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
  group_ = new QCPBarsGroup(timing_);
  group_->setSpacingType(QCPBarsGroup::stAbsolute);
  group_->setSpacing(1);

  memory_->xAxis->setLabel("time (ms)");
  memory_->yAxis->setLabel("MiB");
  // Three curves per device make a long legend.
  putLegendBeside(memory_, memory_->legend, 0);
  // Every replot (new samples, a zoom, a drag, a resize) fits the curves to the pixels it will fill, once the
  // layout has given the plot its width.
  connect(memory_, &QCustomPlot::afterLayout, this, &PlotsPanel::updateMemoryCurves);

  // The Training tab is laid out from its series (rebuildTraining): one pane per kind, sharing the x axis.
  metrics_->setAutoAddPlottableToLegend(false);
  metrics_->plotLayout()->setRowSpacing(2);
  metrics_->addLayer("overlays", metrics_->layer("main"), QCustomPlot::limBelow);
  paneMargins_ = new QCPMarginGroup(metrics_);
  // Double-click: back to the whole run after a zoom or drag.
  connect(metrics_, &QCustomPlot::mouseDoubleClick, this, [this] {
    rescaleTraining();
    metrics_->replot();
  });
  const QStringList hidden = QSettings().value("plots/hiddenPanes", QStringList{"devices"}).toStringList();
  for (MetricPane p : kAllPanes)
    if (hidden.contains(paneName(p))) hiddenPanes_.insert(p);

  compare_ = new QToolButton(this);
  compare_->setObjectName("compareRunsButton");
  compare_->setText("Compare runs");
  compare_->setToolTip("Overlay the same series of an earlier run on the Training panes (dashed)");
  compare_->setPopupMode(QToolButton::InstantPopup);
  compare_->setAutoRaise(true);
  auto* compareMenu = new QMenu(compare_);
  connect(compareMenu, &QMenu::aboutToShow, this, [this, compareMenu] {
    compareMenu->clear();
    addRunToggles(compareMenu);
  });
  compare_->setMenu(compareMenu);
  setCornerWidget(compare_, Qt::TopRightCorner);
  connect(this, &QTabWidget::currentChanged, this, &PlotsPanel::refreshCompareButton);
  refreshCompareButton();
  rebuildTraining();
}

QCustomPlot* PlotsPanel::makePlot(const QString& name) {
  auto* p = new QCustomPlot(this);
  p->setObjectName(name);
  p->setMinimumHeight(160);
  applyPlotTheme(p);
  p->setContextMenuPolicy(Qt::CustomContextMenu);
  connect(p, &QWidget::customContextMenuRequested, this, [this, p](const QPoint& pos) {
    std::unique_ptr<QMenu> menu(contextMenuFor(p));
    menu->exec(p->mapToGlobal(pos));
  });
  return p;
}

QMenu* PlotsPanel::contextMenuFor(QWidget* page) {
  auto* menu = new QMenu(this);
  const auto exportAs = [this, page](const QString& format) {
    setCurrentWidget(page);  // the export writes the visible tab
    emit exportRequested(format);
  };
  menu->addAction("Export as PNG…", this, [exportAs] { exportAs("png"); });
  menu->addAction("Export as SVG…", this, [exportAs] { exportAs("svg"); });
  if (page != metrics_) return menu;

  QMenu* panes = menu->addMenu("Panes");
  const QSet<MetricPane> used = usedPanes();
  for (MetricPane pane : kAllPanes) {
    if (!used.contains(pane)) continue;
    QAction* a = panes->addAction(pane == MetricPane::LearningRate ? "learning rate (while it varies)"
                                  : pane == MetricPane::Devices ? "devices (memory and batch share per epoch)"
                                  : pane == MetricPane::Regression ? "regression (MSE, MAE and R²)"
                                                                   : paneName(pane));
    a->setCheckable(true);
    a->setChecked(!paneHidden(pane));
    connect(a, &QAction::toggled, this, [this, pane](bool on) { setPaneHidden(pane, !on); });
  }
  panes->setEnabled(!panes->isEmpty());
  QMenu* runs = menu->addMenu("Compare with earlier runs");
  addRunToggles(runs);
  runs->setEnabled(!runs->isEmpty());
  return menu;
}

void PlotsPanel::addRunToggles(QMenu* menu) {
  for (int seq : earlierRuns()) {
    QAction* a = menu->addAction(runDescription(seq));
    a->setCheckable(true);
    a->setChecked(runOverlaid(seq));
    connect(a, &QAction::toggled, this, [this, seq](bool on) { setRunOverlaid(seq, on); });
  }
}

void PlotsPanel::refreshCompareButton() {
  compare_->setVisible(currentWidget() == metrics_);
  compare_->setEnabled(!earlierRuns().isEmpty());
}

void PlotsPanel::beginRun(const QString& label, const QStringList& nodeOrder,
                          const QMap<QString, QString>& settings) {
  nodeOrder_ = nodeOrder;
  Run run;
  run.label = label;
  run.seq = runSeq_++;
  run.settings = settings;
  runs_.append(run);
  while (runs_.size() > kHistory) {
    overlaid_.remove(runs_.first().seq);
    runs_.removeFirst();
  }
  memory_->clearGraphs();
  devices_.clear();
  memoryEnvelope_ = false;
  evaluationNodes_ = {};
  evaluationOrder_.clear();
  shownEvaluation_.clear();
  confusion_->clear("Running: the confusion matrix shows when an Evaluate node has finished.");
  mistakes_->clear("Running: the mistakes show when an Evaluate node has finished.");
  predictions_->clear("Running: a regression's predictions show when an Evaluate node has finished.");
  attention_->clear(
      "Running: attention weights show when an Evaluate node with its attention param on has finished.");
  timingDirty_ = memoryDirty_ = metricsDirty_ = trainingLayoutDirty_ = true;
  refreshCompareButton();
}

void PlotsPanel::clearHistory() {
  if (runs_.size() > 1) runs_.remove(0, runs_.size() - 1);
  overlaid_.clear();
  timingDirty_ = metricsDirty_ = trainingLayoutDirty_ = true;
  refreshCompareButton();
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
    for (const Run& r : runs_)
      if (r.ms.contains(n)) {
        cats << n;
        break;
      }
  for (const Run& r : runs_)
    for (auto it = r.ms.begin(); it != r.ms.end(); ++it)
      if (!cats.contains(it.key())) cats << it.key();
  QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
  for (int i = 0; i < cats.size(); ++i) ticker->addTick(i + 1, cats[i]);
  timing_->xAxis->setTicker(ticker);
  timing_->xAxis->setRange(0.4, cats.size() + 0.6);
  const double width = 0.8 / qMax(1, int(runs_.size()));
  double maxV = 0;
  for (int ri = 0; ri < runs_.size(); ++ri) {
    const Run& r = runs_[ri];
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
      DeviceMemory d;
      d.allocated = Series::create();
      d.reserved = Series::create();
      d.peak = Series::create();
      // The band first, so the curves draw over it; out of the legend until it shows.
      d.bandLow = memory_->addGraph();
      d.bandHigh = memory_->addGraph();
      for (QCPGraph* g : {d.bandLow, d.bandHigh}) {
        g->setPen(Qt::NoPen);
        g->setLineStyle(QCPGraph::lsStepLeft);
        g->removeFromLegend();
      }
      QColor fill = c;
      fill.setAlpha(90);
      d.bandHigh->setBrush(fill);
      d.bandHigh->setChannelFillGraph(d.bandLow);
      d.bandHigh->setName(s.device + " allocated min–max per pixel");
      d.allocatedCurve = memory_->addGraph();
      d.allocatedCurve->setName(s.device + " allocated");
      d.allocatedCurve->setPen(QPen(c, 2));
      d.reservedCurve = memory_->addGraph();
      d.reservedCurve->setName(s.device + " reserved");
      d.reservedCurve->setPen(QPen(c.lighter(140), 1.5, Qt::DashLine));
      d.peakCurve = memory_->addGraph();
      d.peakCurve->setName(s.device + " peak");
      d.peakCurve->setPen(QPen(c.darker(110), 1, Qt::DotLine));
      for (QCPGraph* g : {d.allocatedCurve, d.reservedCurve, d.peakCurve})
        g->setLineStyle(QCPGraph::lsStepLeft);
      it = devices_.insert(s.device, d);
    }
    const double t = s.tUs / 1000.0, mib = 1024.0 * 1024.0;
    it->peakBytes = qMax(it->peakBytes, double(s.allocated));
    it->allocated->add(QCPGraphData(t, s.allocated / mib));
    it->reserved->add(QCPGraphData(t, s.reserved / mib));
    it->peak->add(QCPGraphData(t, it->peakBytes / mib));
  }
  // Every allocation is a sample: a long run keeps the newest, as the timeline keeps the newest spans.
  for (const DeviceMemory& d : devices_) {
    const int count = d.allocated->size();
    if (count <= kKeptRunItems + kKeptRunItems / 4) continue;
    const double from = (d.allocated->constBegin() + (count - kKeptRunItems))->key;
    for (const Series& s : {d.allocated, d.reserved, d.peak}) s->removeBefore(from);
  }
  if (!samples.isEmpty()) {
    memoryDirty_ = true;
    envelopeColumns_ = 0;  // the curves are computed again at the next replot
  }
}

int PlotsPanel::memoryPoints() const {
  int n = 0;
  for (const DeviceMemory& d : devices_) n += d.allocated->size();
  return n;
}

QCPGraph* PlotsPanel::memoryBand(const QString& device, bool upper) const {
  const auto it = devices_.find(device);
  return it == devices_.end() ? nullptr : upper ? it->bandHigh : it->bandLow;
}

QCPGraph* PlotsPanel::memoryCurve(const QString& device) const {
  const auto it = devices_.find(device);
  return it == devices_.end() ? nullptr : it->allocatedCurve;
}

void PlotsPanel::updateMemoryCurves() {
  const QCPRange view = memory_->xAxis->range();
  const int columns = qMax(1, memory_->axisRect()->width());
  if (envelopeColumns_ == columns && envelopeFrom_ == view.lower && envelopeTo_ == view.upper) return;
  envelopeColumns_ = columns;
  envelopeFrom_ = view.lower;
  envelopeTo_ = view.upper;
  memoryEnvelope_ = false;
  // Computed curves get containers of their own: the samples' containers are shared with nothing else.
  const auto setCurve = [](QCPGraph* g, const QVector<double>& keys, const QVector<double>& values) {
    g->setData(Series::create());
    g->setData(keys, values, true);
  };
  for (DeviceMemory& d : devices_) {
    const auto first = d.allocated->findBegin(view.lower), last = d.allocated->findEnd(view.upper);
    if (last - first <= columns) {
      d.allocatedCurve->setData(d.allocated);
      d.reservedCurve->setData(d.reserved);
      d.peakCurve->setData(d.peak);
      d.bandLow->data()->clear();
      d.bandHigh->data()->clear();
      if (d.bandHigh->removeFromLegend()) memory_->replot(QCustomPlot::rpQueuedReplot);
      continue;
    }
    // More samples than pixels: a band from each column's least to its greatest allocation, so a spike
    // shorter than a pixel still shows; the curve follows each column's last value. Reserved memory keeps
    // each column's greatest value, the peak (never falling) its last.
    memoryEnvelope_ = true;
    const ColumnEnvelope alloc = stepEnvelope(*d.allocated, view.lower, view.upper, columns);
    const ColumnEnvelope reserved = stepEnvelope(*d.reserved, view.lower, view.upper, columns);
    const ColumnEnvelope peak = stepEnvelope(*d.peak, view.lower, view.upper, columns);
    setCurve(d.bandLow, alloc.keys, alloc.min);
    setCurve(d.bandHigh, alloc.keys, alloc.max);
    setCurve(d.allocatedCurve, alloc.keys, alloc.last);
    setCurve(d.reservedCurve, reserved.keys, reserved.max);
    setCurve(d.peakCurve, peak.keys, peak.last);
    if (!memory_->legend->hasItemWithPlottable(d.bandHigh)) {
      d.bandHigh->addToLegend();
      memory_->replot(QCustomPlot::rpQueuedReplot);  // the longer legend narrows the plot: fit again
    }
  }
}

void PlotsPanel::addMetric(const QString& series, double t, double value) {
  if (runs_.isEmpty()) beginRun({}, {});
  Run& run = runs_.last();
  Series& data = run.metrics[series];
  if (!data) {
    data = Series::create();
    run.metricOrder << series;
    trainingLayoutDirty_ = true;
  }
  // A rate that starts to vary brings its pane.
  if (paneOf(series) == MetricPane::LearningRate && !data->isEmpty() && data->constBegin()->value != value &&
      !panes_.contains(MetricPane::LearningRate) && !paneHidden(MetricPane::LearningRate))
    trainingLayoutDirty_ = true;
  if (seriesKind(series) == "epoch_seconds" && !epochMarks().contains(t)) trainingLayoutDirty_ = true;
  data->add(QCPGraphData(t, value));
  if (data->size() > kKeptRunItems + kKeptRunItems / 4)
    data->removeBefore((data->constBegin() + (data->size() - kKeptRunItems))->key);
  metricsDirty_ = true;
}

QList<double> PlotsPanel::epochMarks() const {
  QList<double> marks;
  if (runs_.isEmpty()) return marks;
  const Run& run = runs_.last();
  for (auto it = run.metrics.begin(); it != run.metrics.end(); ++it) {
    if (seriesKind(it.key()) != "epoch_seconds") continue;
    for (auto p = it.value()->constBegin(); p != it.value()->constEnd(); ++p)
      if (std::isfinite(p->key) && !marks.contains(p->key)) marks << p->key;
  }
  std::sort(marks.begin(), marks.end());
  return marks;
}

bool PlotsPanel::learningRateVaries() const {
  for (const Run& r : runs_) {
    if (&r != &runs_.last() && !overlaid_.contains(r.seq)) continue;
    for (auto it = r.metrics.begin(); it != r.metrics.end(); ++it) {
      if (paneOf(it.key()) != MetricPane::LearningRate || it.value()->isEmpty()) continue;
      const double first = it.value()->constBegin()->value;
      for (auto p = it.value()->constBegin(); p != it.value()->constEnd(); ++p)
        if (p->value != first) return true;
    }
  }
  return false;
}

QSet<MetricPane> PlotsPanel::usedPanes() const {
  QSet<MetricPane> used;
  for (const Run& r : runs_)
    if (&r == &runs_.last() || overlaid_.contains(r.seq))
      for (const QString& s : r.metricOrder) used.insert(paneOf(s));
  return used;
}

QList<MetricPane> PlotsPanel::shownPanes() const {
  QSet<MetricPane> used = usedPanes();
  // A constant rate says nothing over time: its pane waits until some rate varies.
  if (used.contains(MetricPane::LearningRate) && !learningRateVaries()) used.remove(MetricPane::LearningRate);
  QList<MetricPane> shown;
  for (MetricPane p : kAllPanes)
    if (used.contains(p) && !hiddenPanes_.contains(p)) shown << p;
  return shown;
}

QStringList PlotsPanel::trainingPanes() const {
  QStringList names;
  for (MetricPane p : kAllPanes)
    if (panes_.contains(p)) names << paneName(p);
  return names;
}

QCPAxisRect* PlotsPanel::paneRect(MetricPane pane) const {
  return panes_.value(pane).rect;
}

QCPAxis* PlotsPanel::learningRateAxis() const {
  const QCPAxisRect* rect = paneRect(MetricPane::LearningRate);
  return rect ? rect->axis(QCPAxis::atLeft) : nullptr;
}

QCPGraph* PlotsPanel::metricGraph(const QString& series, int runSeq) const {
  if (runSeq < 0) return currentGraphs_.value(series);
  return overlayGraphs_.value(runSeq).value(series);
}

void PlotsPanel::setPaneHidden(MetricPane pane, bool hidden) {
  if (hidden == hiddenPanes_.contains(pane)) return;
  if (hidden)
    hiddenPanes_.insert(pane);
  else
    hiddenPanes_.remove(pane);
  QStringList names;
  for (MetricPane p : kAllPanes)
    if (hiddenPanes_.contains(p)) names << paneName(p);
  QSettings().setValue("plots/hiddenPanes", names);
  metricsDirty_ = trainingLayoutDirty_ = true;
  refresh();
}

QList<int> PlotsPanel::earlierRuns() const {
  QList<int> seqs;
  for (int i = 0; i + 1 < runs_.size(); ++i)
    if (!runs_[i].metricOrder.isEmpty()) seqs << runs_[i].seq;
  return seqs;
}

QString PlotsPanel::runDescription(int runSeq) const {
  const Run* run = nullptr;
  for (const Run& r : runs_)
    if (r.seq == runSeq) run = &r;
  if (!run) return {};
  return (run->label.isEmpty() ? QString("run %1").arg(runSeq + 1) : run->label) + differenceText(*run);
}

QString PlotsPanel::differenceText(const Run& run) const {
  // What was set differently from the current run: the earlier run's values.
  const QMap<QString, QString>& now = runs_.last().settings;
  QStringList differences;
  QStringList keys = run.settings.keys() + now.keys();
  keys.removeDuplicates();
  std::sort(keys.begin(), keys.end());
  for (const QString& k : keys)
    if (run.settings.value(k) != now.value(k))
      differences << (run.settings.contains(k) ? k + "=" + elided(run.settings.value(k)) : k + " default");
  if (differences.isEmpty()) return {};
  const qsizetype more = differences.size() - kDifferencesShown;
  return " (" + QStringList(differences.mid(0, kDifferencesShown)).join(", ") +
         (more > 0 ? QString(", +%1 more").arg(more) : QString()) + ")";
}

void PlotsPanel::setRunOverlaid(int runSeq, bool on) {
  if (on == overlaid_.contains(runSeq) || (on && !earlierRuns().contains(runSeq))) return;
  if (on)
    overlaid_.insert(runSeq);
  else
    overlaid_.remove(runSeq);
  metricsDirty_ = trainingLayoutDirty_ = true;
  refresh();
}

QCPGraph* PlotsPanel::addMetricGraph(MetricPane pane, const QString& series, const Series& data,
                                     const QColor& color, int overlayRank) {
  const Pane& p = panes_[pane];
  QCPAxis* value = onRightAxis(series) && p.right ? p.right : p.rect->axis(QCPAxis::atLeft);
  QCPGraph* g = metrics_->addGraph(p.rect->axis(QCPAxis::atBottom), value);
  g->setData(data);  // shared: points that come later show without touching the graph
  g->setName(series);
  if (overlayRank >= 0) {
    g->setLayer("overlays");
    g->setPen(overlayPen(color, overlayRank));
  } else if (pane == MetricPane::LearningRate) {
    g->setPen(QPen(color, 1.5));
    g->setLineStyle(QCPGraph::lsStepLeft);
  } else {
    g->setPen(QPen(color, onRightAxis(series) ? 1.2 : 2, onRightAxis(series) ? Qt::DashLine : Qt::SolidLine));
    g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, 4));
  }
  return g;
}

void PlotsPanel::rebuildTraining() {
  metrics_->clearPlottables();
  metrics_->clearItems();
  metrics_->plotLayout()->clear();
  panes_.clear();
  currentGraphs_.clear();
  overlayGraphs_.clear();
  trainingLayoutDirty_ = false;
  const QList<MetricPane> shown = shownPanes();
  if (shown.isEmpty()) {
    auto* hint = new QCPTextElement(metrics_,
                                    "Loss, accuracy, images/s and the learning rate show here while a "
                                    "Train node runs.");
    hint->setTextColor(kForeground);
    metrics_->plotLayout()->addElement(0, 0, hint);
    return;
  }
  const QFont font = metrics_->font();
  for (int row = 0; row < shown.size(); ++row) {
    const MetricPane kind = shown[row];
    const bool bottom = row + 1 == shown.size();
    Pane pane;
    pane.rect = new QCPAxisRect(metrics_);
    metrics_->plotLayout()->addElement(row, 0, pane.rect);
    pane.rect->setMarginGroup(QCP::msLeft | QCP::msRight, paneMargins_);
    pane.rect->setRangeDrag(Qt::Horizontal);
    pane.rect->setRangeZoom(Qt::Horizontal);
    for (QCPAxis* a : pane.rect->axes()) styleAxis(a);
    pane.rect->axis(QCPAxis::atTop)->setVisible(false);
    QCPAxis* x = pane.rect->axis(QCPAxis::atBottom);
    // One epoch axis for every pane: numbered at the bottom only, moved together.
    x->setTickLabels(bottom);
    if (bottom) x->setLabel("epoch");
    connect(x, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this, x](const QCPRange& r) {
      if (syncingX_) return;
      syncingX_ = true;
      for (const Pane& other : std::as_const(panes_))
        if (other.rect->axis(QCPAxis::atBottom) != x) other.rect->axis(QCPAxis::atBottom)->setRange(r);
      syncingX_ = false;
      metrics_->replot(QCustomPlot::rpQueuedReplot);
    });
    QCPAxis* y = pane.rect->axis(QCPAxis::atLeft);
    y->setLabel(kind == MetricPane::Devices      ? "MiB"
                : kind == MetricPane::Other      ? "value"
                : kind == MetricPane::Regression ? "MSE, MAE"
                                                 : paneName(kind));
    if (kind == MetricPane::Perplexity) {
      // Perplexity is exp(loss): on a log axis it falls as the loss does, and the first epochs' values near
      // the vocabulary's size do not flatten the later ones.
      y->setScaleType(QCPAxis::stLogarithmic);
      y->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    }
    QCPAxis* right = pane.rect->axis(QCPAxis::atRight);
    right->setVisible(false);
    if (kind == MetricPane::Throughput || kind == MetricPane::Devices || kind == MetricPane::Regression) {
      pane.right = right;
      right->setLabel(kind == MetricPane::Throughput   ? "s / epoch"
                      : kind == MetricPane::Regression ? "R²"
                                                       : "batch share");
    }
    pane.legend = new QCPLegend;
    putLegendBeside(metrics_, pane.legend, row);
    pane.legend->setLayer("legend");
    styleLegend(pane.legend, font);
    panes_.insert(kind, pane);
  }

  // The current run's curves, each pane's series in its own colours in the order they came.
  QHash<MetricPane, int> colours;
  QHash<QString, QColor> colourOf;
  const Run& current = runs_.last();
  for (const QString& s : current.metricOrder) {
    const MetricPane pane = paneOf(s);
    colourOf.insert(s, style::seriesColor(colours[pane]++));
    if (!panes_.contains(pane)) continue;
    QCPGraph* g = addMetricGraph(pane, s, current.metrics.value(s), colourOf.value(s), -1);
    g->addToLegend(panes_[pane].legend);
    currentGraphs_.insert(s, g);
  }
  // Earlier runs, fainter and dashed: the same series in the same colour. The top pane's legend has one key
  // per run, its dash in grey; a series only an earlier run has is named in its pane's legend.
  int rank = 0;
  const Pane& top = panes_[shown.first()];
  for (const Run& r : runs_) {
    if (!overlaid_.contains(r.seq) || &r == &current) continue;
    // "#1 (train.lr=0.3)": the run's number and what it set differently, short enough for a legend.
    const QString label =
        (r.label.isEmpty() ? QString("run %1").arg(r.seq + 1) : r.label.section(' ', 0, 0)) +
        differenceText(r);
    for (const QString& s : r.metricOrder) {
      const MetricPane pane = paneOf(s);
      if (!colourOf.contains(s)) colourOf.insert(s, style::seriesColor(colours[pane]++));
      if (!panes_.contains(pane)) continue;
      QCPGraph* g = addMetricGraph(pane, s, r.metrics.value(s), colourOf.value(s), rank);
      g->setName(s + " " + label);
      if (!currentGraphs_.contains(s)) g->addToLegend(panes_[pane].legend);
      overlayGraphs_[r.seq].insert(s, g);
    }
    QCPGraph* key = metrics_->addGraph(top.rect->axis(QCPAxis::atBottom), top.rect->axis(QCPAxis::atLeft));
    key->setName(label);
    key->setPen(overlayPen(kForeground, rank));
    key->addToLegend(top.legend);
    ++rank;
  }
  for (Pane& p : panes_) {
    bool rightUsed = false;
    for (QCPGraph* g : p.rect->graphs()) rightUsed = rightUsed || g->valueAxis() == p.right;
    if (p.right) p.right->setVisible(rightUsed);
  }

  // Each epoch's end: a faint line through every pane, numbered in the top one.
  const QList<double> marks = epochMarks();
  const int every = (int(marks.size()) + kEpochLabels - 1) / kEpochLabels;
  QFont small = font;
  small.setPointSizeF(7.5);
  for (int i = 0; i < marks.size(); ++i) {
    const double t = marks[i];
    for (const Pane& p : std::as_const(panes_)) {
      auto* line = new QCPItemStraightLine(metrics_);
      line->setLayer("grid");  // behind the curves
      line->setClipAxisRect(p.rect);
      line->setPen(QPen(QColor(0xc8, 0xcc, 0xd2, 60), 1, Qt::DashLine));
      // Top to bottom of the pane whatever its value axis (a log axis has no 0).
      for (QCPItemPosition* pos : {line->point1, line->point2}) {
        pos->setAxes(p.rect->axis(QCPAxis::atBottom), p.rect->axis(QCPAxis::atLeft));
        pos->setAxisRect(p.rect);
        pos->setTypeX(QCPItemPosition::ptPlotCoords);
        pos->setTypeY(QCPItemPosition::ptAxisRectRatio);
      }
      line->point1->setCoords(t, 0);
      line->point2->setCoords(t, 1);
    }
    if (every > 1 && (i + 1) % every != 0) continue;
    QCPAxisRect* top = panes_.value(shown.first()).rect;
    auto* label = new QCPItemText(metrics_);
    label->setLayer("grid");
    label->setClipToAxisRect(true);
    label->setClipAxisRect(top);
    label->position->setAxes(top->axis(QCPAxis::atBottom), top->axis(QCPAxis::atLeft));
    label->position->setAxisRect(top);
    label->position->setTypeX(QCPItemPosition::ptPlotCoords);
    label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    label->position->setCoords(t, 0);
    label->setPositionAlignment(Qt::AlignTop | Qt::AlignRight);
    label->setPadding(QMargins(2, 2, 3, 0));
    label->setColor(QColor(0xc8, 0xcc, 0xd2, 150));
    label->setFont(small);
    label->setText(QString("epoch %1").arg(t));
  }
  refreshCompareButton();
}

void PlotsPanel::rescaleTraining() {
  if (panes_.isEmpty()) return;
  // The x range every pane shares: all the curves shown, in every pane.
  bool any = false;
  QCPRange x;
  for (const Pane& p : std::as_const(panes_))
    for (QCPGraph* g : p.rect->graphs()) {
      bool found = false;
      const QCPRange r = g->getKeyRange(found);
      if (!found) continue;
      x = any ? QCPRange(qMin(x.lower, r.lower), qMax(x.upper, r.upper)) : r;
      any = true;
    }
  if (any) {
    if (x.size() <= 0) x = QCPRange(x.lower - 0.5, x.upper + 0.5);
    syncingX_ = true;
    for (const Pane& p : std::as_const(panes_)) p.rect->axis(QCPAxis::atBottom)->setRange(x);
    syncingX_ = false;
  }
  for (auto it = panes_.cbegin(); it != panes_.cend(); ++it) {
    QCPAxis* y = it.value().rect->axis(QCPAxis::atLeft);
    switch (it.key()) {
      case MetricPane::Accuracy:
        y->setRange(0, 1);  // one fixed scale: train and test read against each other and across runs
        break;
      case MetricPane::Loss:
      case MetricPane::Perplexity:  // on its log axis the margins are shares of the decades shown
      case MetricPane::Other:
        y->rescale();
        y->scaleRange(1.1);
        break;
      default:
        // Rates, throughput and memory from zero, so a change reads in proportion.
        y->rescale();
        y->setRange(0, y->range().upper > 0 ? y->range().upper * 1.1 : 1);
    }
    if (QCPAxis* right = it.value().right; right && right->visible()) {
      if (it.key() == MetricPane::Devices) {
        right->setRange(0, 1);
      } else if (it.key() == MetricPane::Regression) {
        // R² up to its best, 1, and down to 0 or below where a model does worse than the mean.
        right->rescale();
        const double lowest = qMin(0.0, right->range().lower);
        right->setRange(lowest < 0 ? lowest - 0.05 * (1 - lowest) : 0.0, 1.05);
      } else {
        right->rescale();
        right->setRange(0, right->range().upper > 0 ? right->range().upper * 1.1 : 1);
      }
    }
  }
  // The epoch labels sit at the top of the top pane: room above its curves (a loss starts at its highest),
  // except on the fixed 0-1 accuracy axis.
  const MetricPane top = panes_.firstKey();
  if (top != MetricPane::Accuracy && !epochMarks().isEmpty())
    addHeadroom(panes_.first().rect->axis(QCPAxis::atLeft), 0.12);
}

void PlotsPanel::setEvaluations(const QJsonObject& nodes, const QStringList& finishedOrder) {
  evaluationNodes_ = nodes;
  evaluationOrder_.clear();
  // An entry whose fields do not hold together (a confusion matrix that is not square) is no evaluation.
  const auto readable = [&nodes](const QString& n) {
    const QJsonObject entry = nodes.value(n).toObject();
    return evaluationTask(entry) == EvaluationTask::Regression
               ? RegressionResults::fromReport(n, entry).has_value()
               : EvaluationResults::fromReport(n, entry).has_value();
  };
  for (const QString& n : finishedOrder)
    if (!evaluationOrder_.contains(n) && readable(n)) evaluationOrder_ << n;
  shownEvaluation_.clear();
  // The attention of the last evaluation to finish that recorded some.
  std::optional<AttentionResults> attention;
  for (const QString& n : finishedOrder)
    if (auto r = AttentionResults::fromReport(n, nodes.value(n).toObject())) attention = r;
  if (attention) {
    attention_->setResults(*attention);
  } else if (evaluationOrder_.isEmpty()) {
    attention_->clear(
        "No Evaluate node finished in the last run. An Evaluate node whose attention param is on records "
        "what "
        "each MultiheadAttention layer attends to for one sample (attention_sample) of its split.");
  } else {
    const QStringList& named = evaluationOrder_;
    attention_->clear(
        QString(
            "Evaluate node%1 %2 recorded no attention weights: turn on %3 attention param (attention_sample "
            "picks the sample of the split) and run again, then select a MultiheadAttention node or a "
            "block holding one.")
            .arg(named.size() > 1 ? "s" : "", named.join(", "), named.size() > 1 ? "one's" : "its"));
  }
  if (evaluationOrder_.isEmpty()) {
    confusion_->clear("No Evaluate node finished in the last run: its confusion matrix would show here.");
    mistakes_->clear("No Evaluate node finished in the last run: the images it got wrong would show here.");
    predictions_->clear(
        "No Evaluate node finished in the last run: a regression's predictions against the truth would show "
        "here.");
    return;
  }
  showEvaluation(evaluationOrder_.last());
}

bool PlotsPanel::showEvaluation(const QString& node) {
  if (!evaluationOrder_.contains(node)) return false;
  if (node == shownEvaluation_) return true;
  const QJsonObject entry = evaluationNodes_.value(node).toObject();
  const QString note = evaluationOrder_.size() > 1
                           ? QString("one of %1 evaluations: select another Evaluate node to see its results")
                                 .arg(evaluationOrder_.size())
                           : QString();
  if (evaluationTask(entry) == EvaluationTask::Regression) {
    std::optional<RegressionResults> r = RegressionResults::fromReport(node, entry);
    if (!r) return false;
    r->note = note;
    predictions_->setResults(*r);
    const QString elsewhere = "Evaluate node " + node +
                              " evaluated a regression: its predictions against the truth are on the "
                              "Predictions tab.";
    confusion_->clear(elsewhere);
    mistakes_->clear(elsewhere);
  } else {
    std::optional<EvaluationResults> r = EvaluationResults::fromReport(node, entry);
    if (!r) return false;
    r->note = note;
    confusion_->setResults(*r);
    mistakes_->setResults(*r);
    predictions_->clear(QString("Evaluate node %1 evaluated %2: predictions against the truth show for a "
                                "regression.")
                            .arg(node, r->languageModel() ? "a language model" : "a classifier"));
  }
  shownEvaluation_ = node;
  return true;
}

bool PlotsPanel::showAttention(const QStringList& paths) {
  if (paths.isEmpty()) return false;
  // An Evaluate node that recorded attention shows its own, all its layers.
  for (const QString& p : paths) {
    std::optional<AttentionResults> own =
        AttentionResults::fromReport(p, evaluationNodes_.value(p).toObject());
    if (!own) continue;
    if (!attention_->results() || attention_->results()->node != p) attention_->setResults(*own);
    return attention_->showNode(p);
  }
  if (!attention_->hasResults()) return false;
  for (const QString& p : paths)
    if (!attention_->results()->layersOf(p).isEmpty()) return attention_->showNode(p);
  attention_->showNode(paths.first());
  return false;
}

int PlotsPanel::metricPoints() const {
  int n = 0;
  if (runs_.isEmpty()) return n;
  for (const Series& s : runs_.last().metrics) n += s->size();
  return n;
}

void PlotsPanel::refresh() {
  if (timingDirty_) {
    rebuildTiming();
    timing_->replot(QCustomPlot::rpQueuedReplot);
  }
  if (memoryDirty_) {
    // The whole run in view, from the samples themselves (the curves may show only the last view's columns).
    bool any = false;
    double from = 0, to = 0, top = 0;
    for (const DeviceMemory& d : std::as_const(devices_)) {
      if (d.allocated->isEmpty()) continue;
      const double first = d.allocated->constBegin()->key, last = (d.allocated->constEnd() - 1)->key;
      from = any ? qMin(from, first) : first;
      to = any ? qMax(to, last) : last;
      any = true;
      bool found = false;
      top = qMax(top, qMax(d.peak->valueRange(found).upper, d.reserved->valueRange(found).upper));
    }
    if (any) memory_->xAxis->setRange(from, to > from ? to : from + 1);
    memory_->yAxis->setRange(0, top * 1.1 + 1e-6);
    memory_->replot(QCustomPlot::rpQueuedReplot);
  }
  if (trainingLayoutDirty_) rebuildTraining();
  if (metricsDirty_) {
    rescaleTraining();
    metrics_->replot(QCustomPlot::rpQueuedReplot);
  }
  timingDirty_ = memoryDirty_ = metricsDirty_ = false;
}

bool PlotsPanel::exportVisible(const QString& path, QString* error) const {
  const bool svg = path.endsWith(".svg", Qt::CaseInsensitive);
  QWidget* page = currentWidget();
  bool ok = false;
  if (auto* plot = qobject_cast<QCustomPlot*>(page)) {
    plot->replot();
    const int w = qMax(plot->width(), 800), h = qMax(plot->height(), 500);
    ok = svg ? savePlotSvg(plot, path, w, h) : plot->savePng(path, w, h);
  } else if (svg) {
    // The Confusion and Mistakes tabs are more than a plot: their header and the grid go in the picture too.
    QSvgGenerator gen;
    gen.setFileName(path);
    gen.setSize(page->size());
    gen.setViewBox(page->rect());
    QPainter painter;
    if (painter.begin(&gen)) {
      page->render(&painter);
      ok = painter.end() && QFileInfo(path).size() > 0;
    }
  } else {
    ok = page->grab().save(path, "PNG");
  }
  if (!ok && error) *error = QString("could not write %1").arg(path);
  return ok;
}

}  // namespace gn::editor
