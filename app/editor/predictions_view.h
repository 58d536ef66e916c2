// What a regression predicted, from an Evaluate node's report entry ("task": "regression"): the Plots
// dock's Predictions tab. A scatter of each sample's prediction against its true value, with the line y = x
// that a perfect model's points would sit on and the MSE, MAE and R² in its title; and for a time series the
// picture of d2l 9.1: the series as a line, the one-step predictions (each from the τ values before it) and
// the multistep predictions (from the test split's start on, each fed the model's own earlier predictions)
// over it, a marker where the test split's targets start. The fields are in docs/events.md.
#pragma once
#include <QJsonObject>
#include <QString>
#include <QVector>
#include <QWidget>
#include <optional>

class QCustomPlot;
class QCPGraph;
class QCPItemStraightLine;
class QCPTextElement;
class QLabel;

namespace gn::editor {

struct RegressionResults {
  // A time series and the model's predictions of it, index by index: NaN where there is none.
  struct Series {
    QVector<double> values, oneStep, multistep;
    int tau = 0;       // how many earlier values each prediction reads
    int trainEnd = 0;  // the index of the first test target: multistep predictions start here
  };
  QString node, split;
  QString note;  // said after the title: that other evaluations can be shown
  qint64 samples = 0;
  double loss = 0, mse = 0, mae = 0, r2 = 0;  // NaN where the report has none
  QVector<double> truth, predicted;           // one pair per sample shown (the report keeps at most 5000)
  std::optional<Series> series;

  // Null when the entry is no regression's evaluation (see evaluationTask()).
  static std::optional<RegressionResults> fromReport(const QString& node, const QJsonObject& entry);
  // "Evaluate node test (test split): MSE 0.0412 · MAE 0.153 · R² 0.93 on 1,000 samples", and the note.
  QString title() const;
  // "MSE 0.0412 · MAE 0.153 · R² 0.93": the scatter's title.
  QString scores() const;
};

class PredictionsView : public QWidget {
  Q_OBJECT
 public:
  explicit PredictionsView(QWidget* parent = nullptr);
  void setResults(const RegressionResults& r);
  void clear(const QString& message);

  QString headerText() const;
  QCustomPlot* scatterPlot() const { return scatter_; }
  // The series picture: hidden when the results have no series.
  QCustomPlot* seriesPlot() const { return series_; }
  // Predicted (value) against true (key), one point per sample.
  QCPGraph* scatterGraph() const { return points_; }
  // The line y = x, through two points of the scatter's range.
  QCPItemStraightLine* identityLine() const { return identity_; }
  QString scatterTitle() const;
  // The series picture's curves: the values, the one-step and the multistep predictions (keys are indices).
  QCPGraph* valuesGraph() const { return values_; }
  QCPGraph* oneStepGraph() const { return oneStep_; }
  QCPGraph* multistepGraph() const { return multistep_; }
  // The vertical line at the test split's first target; hidden without a series.
  QCPItemStraightLine* trainEndMarker() const { return trainEnd_; }

 private:
  QLabel* header_;
  QCustomPlot *scatter_, *series_;
  QCPTextElement* scatterTitle_;
  QCPGraph *points_, *values_, *oneStep_, *multistep_;
  QCPItemStraightLine *identity_, *trainEnd_;
};

}  // namespace gn::editor
