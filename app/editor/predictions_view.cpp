#include "predictions_view.h"

#include <qcustomplot.h>

#include <QHBoxLayout>
#include <QJsonArray>
#include <QLabel>
#include <QVBoxLayout>
#include <cmath>

#include "plots.h"
#include "results_views.h"
#include "style.h"

namespace gn::editor {

namespace {

const QColor kMarker(0xc8, 0xcc, 0xd2, 150);

// The report writes a value that is not a number as null.
double number(const QJsonValue& v) {
  return v.isDouble() ? v.toDouble() : NAN;
}

QVector<double> numbers(const QJsonValue& array) {
  QVector<double> out;
  for (const QJsonValue& v : array.toArray()) out << number(v);
  return out;
}

QString r2Text(double r2) {
  return std::isfinite(r2) ? QString::number(r2, 'f', 2) : QString("–");
}

// A series' points where it has a value: a prediction the model did not make (null) leaves no point.
void setSeries(QCPGraph* g, const QVector<double>& values) {
  QVector<double> keys, kept;
  for (int i = 0; i < values.size(); ++i)
    if (std::isfinite(values[i])) {
      keys << i;
      kept << values[i];
    }
  g->setData(keys, kept, true);
}

QCPTextElement* titleElement(QCustomPlot* plot) {
  plot->plotLayout()->insertRow(0);
  auto* title = new QCPTextElement(plot, QString(), QFont(plot->font().family(), 9));
  title->setTextColor(QColor(0xc8, 0xcc, 0xd2));
  plot->plotLayout()->addElement(0, 0, title);
  return title;
}

}  // namespace

// -------------------------------------------------------------------------------------------------- results

std::optional<RegressionResults> RegressionResults::fromReport(const QString& node,
                                                               const QJsonObject& entry) {
  if (evaluationTask(entry) != EvaluationTask::Regression) return std::nullopt;
  RegressionResults r;
  r.node = node;
  r.split = entry.value("split").toString();
  r.samples = entry.value("samples").toInteger();
  r.loss = number(entry.value("loss"));
  r.mse = number(entry.value("mse"));
  r.mae = number(entry.value("mae"));
  r.r2 = number(entry.value("r2"));
  const QJsonObject predictions = entry.value("predictions").toObject();
  r.truth = numbers(predictions.value("true"));
  r.predicted = numbers(predictions.value("predicted"));
  // Pairs only: a report cut short in one of the arrays shows the samples it has both values of.
  const qsizetype pairs = qMin(r.truth.size(), r.predicted.size());
  r.truth.resize(pairs);
  r.predicted.resize(pairs);
  const QJsonObject series = entry.value("series").toObject();
  if (series.value("values").isArray()) {
    Series s;
    s.values = numbers(series.value("values"));
    s.oneStep = numbers(series.value("one_step"));
    s.multistep = numbers(series.value("k_step"));
    // Index by index with the values: a shorter prediction array has nothing past its end.
    s.oneStep.resize(s.values.size(), NAN);
    s.multistep.resize(s.values.size(), NAN);
    s.tau = series.value("tau").toInt();
    s.trainEnd = series.value("train_end").toInt();
    r.series = s;
  }
  return r;
}

QString RegressionResults::scores() const {
  return QString("MSE %1 · MAE %2 · R² %3").arg(style::formatScore(mse), style::formatScore(mae), r2Text(r2));
}

QString RegressionResults::title() const {
  return QString("Evaluate node %1%2: %3 on %L4 samples%5")
      .arg(node, split.isEmpty() ? QString() : " (" + split + " split)", scores())
      .arg(samples)
      .arg(note.isEmpty() ? QString() : " (" + note + ")");
}

// --------------------------------------------------------------------------------------------------- view

PredictionsView::PredictionsView(QWidget* parent) : QWidget(parent) {
  setObjectName("predictionsView");
  header_ = new QLabel(this);
  header_->setObjectName("resultsHeader");
  header_->setWordWrap(true);
  header_->setTextFormat(Qt::PlainText);
  header_->setContentsMargins(6, 4, 6, 2);

  series_ = new QCustomPlot(this);
  series_->setObjectName("seriesPlot");
  scatter_ = new QCustomPlot(this);
  scatter_->setObjectName("scatterPlot");
  for (QCustomPlot* p : {series_, scatter_}) {
    p->setMinimumHeight(160);
    applyPlotTheme(p);
  }

  // Predicted against true: a point per sample, faint so that dense regions read darker.
  scatter_->legend->setVisible(false);
  scatter_->xAxis->setLabel("true value");
  scatter_->yAxis->setLabel("predicted");
  scatterTitle_ = titleElement(scatter_);
  points_ = scatter_->addGraph();
  points_->setName("predictions");
  points_->setLineStyle(QCPGraph::lsNone);
  QColor dot = style::seriesColor(0);
  dot.setAlpha(140);
  points_->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, dot, 4));
  identity_ = new QCPItemStraightLine(scatter_);
  identity_->setPen(QPen(kMarker, 1, Qt::DashLine));
  identity_->setClipAxisRect(scatter_->axisRect());

  // The series, as d2l 9.1 draws it: the data under the predictions, the test split's start marked.
  series_->xAxis->setLabel("time step");
  series_->yAxis->setLabel("value");
  series_->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
  values_ = series_->addGraph();
  values_->setName("data");
  values_->setPen(QPen(style::seriesColor(0), 1.5));
  oneStep_ = series_->addGraph();
  oneStep_->setName("one-step predictions");
  oneStep_->setPen(QPen(style::seriesColor(1), 1.3));
  multistep_ = series_->addGraph();
  multistep_->setPen(QPen(style::seriesColor(2), 1.6));
  trainEnd_ = new QCPItemStraightLine(series_);
  trainEnd_->setPen(QPen(kMarker, 1, Qt::DashLine));
  trainEnd_->setClipAxisRect(series_->axisRect());
  // Vertical from the axis rect's top to its bottom, at a time step.
  for (QCPItemPosition* pos : {trainEnd_->point1, trainEnd_->point2}) {
    pos->setAxes(series_->xAxis, series_->yAxis);
    pos->setAxisRect(series_->axisRect());
    pos->setTypeX(QCPItemPosition::ptPlotCoords);
    pos->setTypeY(QCPItemPosition::ptAxisRectRatio);
  }

  auto* body = new QHBoxLayout;
  body->setContentsMargins(0, 0, 0, 0);
  body->setSpacing(2);
  body->addWidget(series_, 3);
  body->addWidget(scatter_, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(header_);
  layout->addLayout(body, 1);
  clear("Run a graph that evaluates a regression: its predictions against the truth show here.");
}

QString PredictionsView::headerText() const {
  return header_->text();
}

QString PredictionsView::scatterTitle() const {
  return scatterTitle_->text();
}

void PredictionsView::clear(const QString& message) {
  header_->setText(message);
  for (QCPGraph* g : {points_, values_, oneStep_, multistep_}) g->data()->clear();
  scatterTitle_->setText(QString());
  identity_->setVisible(false);
  trainEnd_->setVisible(false);
  series_->hide();
  scatter_->replot();
}

void PredictionsView::setResults(const RegressionResults& r) {
  clear({});
  // The report keeps a bounded number of pairs: say so when the scatter holds fewer than were evaluated.
  const QString shown = r.truth.size() < r.samples
                            ? QString(" (%L1 of the %L2 samples shown)").arg(r.truth.size()).arg(r.samples)
                            : QString();
  header_->setText(
      r.title() +
      ". Each point is a sample's prediction against its true value; a perfect model's points lie "
      "on the dashed line y = x" +
      shown + ".");
  scatterTitle_->setText("predicted against true · " + r.scores());
  points_->setData(r.truth, r.predicted);
  // One scale on both axes, so that the line y = x runs corner to corner and a bias reads as a distance.
  double lo = INFINITY, hi = -INFINITY;
  for (const QVector<double>* v : {&r.truth, &r.predicted})
    for (double x : *v)
      if (std::isfinite(x)) {
        lo = qMin(lo, x);
        hi = qMax(hi, x);
      }
  if (!(lo <= hi)) {  // no finite value: an empty unit square
    lo = 0;
    hi = 1;
  }
  const double pad = hi > lo ? 0.05 * (hi - lo) : 0.5;
  for (QCPAxis* a : {scatter_->xAxis, scatter_->yAxis}) a->setRange(lo - pad, hi + pad);
  identity_->point1->setCoords(lo, lo);
  identity_->point2->setCoords(hi > lo ? hi : lo + 1, hi > lo ? hi : lo + 1);
  identity_->setVisible(true);
  scatter_->replot();

  if (!r.series) return;
  const RegressionResults::Series& s = *r.series;
  series_->show();
  setSeries(values_, s.values);
  setSeries(oneStep_, s.oneStep);
  setSeries(multistep_, s.multistep);
  oneStep_->setName(QString("one-step predictions (from the %1 values before)").arg(s.tau));
  multistep_->setName(QString("multistep predictions (from step %1, fed its own)").arg(s.trainEnd));
  trainEnd_->point1->setCoords(s.trainEnd, 0);
  trainEnd_->point2->setCoords(s.trainEnd, 1);
  trainEnd_->setVisible(true);
  series_->rescaleAxes();
  series_->yAxis->scaleRange(1.1);
  series_->replot();
}

}  // namespace gn::editor
