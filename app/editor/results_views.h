// What a classifier got right and wrong, from an Evaluate node's report entry: the Plots dock's Confusion tab
// (a heatmap of true against predicted class, coloured by the share of each true class so that per-class
// recall reads at a glance) and its Mistakes tab (the images the model got wrong, the most confident first;
// clicking one shows its top-5 probabilities). A language model's evaluation has no matrix and no mistakes:
// both tabs show its accuracy and perplexity. The editor knows nothing of node types: any report entry with a
// `confusion` field, or with a `task` and that task's fields, is an evaluation (see docs/events.md for the
// fields; a regression's shows in predictions_view.h).
#pragma once
#include <QImage>
#include <QJsonObject>
#include <QList>
#include <QPair>
#include <QStringList>
#include <QVector>
#include <QWidget>
#include <optional>

class QCustomPlot;
class QCPColorMap;
class QCPItemText;
class QLabel;
class QListWidget;
class QListWidgetItem;
class QTableWidget;

namespace gn::editor {

enum class EvaluationTask { Classification, LanguageModel, Regression };
// What an Evaluate-like report entry evaluated, or nothing when it is no evaluation: a `confusion` is a
// classifier's; "task": "language_model" with a `perplexity`, and "task": "regression" with an `mse`, are the
// others. The fields are asked for besides the task because other entries name a task too (a dataset's).
std::optional<EvaluationTask> evaluationTask(const QJsonObject& entry);

struct EvaluationResults {
  struct Mistake {
    qint64 index = 0;
    int trueClass = 0, predicted = 0;
    double confidence = 0;
    QList<QPair<int, double>> top5;  // (class, probability), the prediction first
    QImage image;
  };
  QString node, split;
  QString note;  // said after the title: that other evaluations can be shown
  EvaluationTask task = EvaluationTask::Classification;
  double accuracy = 0;
  double loss = 0, perplexity = 0;  // a language model's: the mean cross-entropy and its exp
  qint64 samples = 0, mistakesTotal = 0;
  QStringList classNames;
  QVector<QVector<qint64>> confusion;  // [true][predicted]
  QVector<double> perClass;            // NaN for a class without samples
  QList<Mistake> mistakes;

  // Null when the entry carries no classifier's or language model's evaluation (no `confusion` field, or
  // one that is not square, and no language model's fields).
  static std::optional<EvaluationResults> fromReport(const QString& node, const QJsonObject& entry);
  bool languageModel() const { return task == EvaluationTask::LanguageModel; }
  QString className(int cls) const;
  // "Evaluate node test (test split): accuracy 84.1% on 10,000 samples", and the note; a language model's
  // adds "· perplexity 3.21" after the accuracy.
  QString title() const;
};

class ConfusionView : public QWidget {
  Q_OBJECT
 public:
  explicit ConfusionView(QWidget* parent = nullptr);
  void setResults(const EvaluationResults& r);
  void clear(const QString& message);

  QCustomPlot* plot() const { return plot_; }
  QCPColorMap* colorMap() const { return map_; }
  QString headerText() const;
  // The text written in cell (true, predicted): its count; empty when there is no such cell.
  QString cellText(int trueClass, int predicted) const;

 protected:
  void resizeEvent(QResizeEvent* e) override;

 private:
  void fitCellText();

  QLabel* header_;
  QCustomPlot* plot_;
  QCPColorMap* map_;
  QVector<QCPItemText*> cells_;  // row-major, classes x classes
  int classes_ = 0;
};

class MistakesView : public QWidget {
  Q_OBJECT
 public:
  explicit MistakesView(QWidget* parent = nullptr);
  void setResults(const EvaluationResults& r);
  void clear(const QString& message);

  QListWidget* grid() const { return grid_; }
  QTableWidget* top5Table() const { return top5_; }
  QString headerText() const;
  QString detailText() const;
  // Shows mistake `row` (in the grid's order) beside the grid, as a click does.
  void showMistake(int row);

 private:
  QLabel *header_, *picture_, *detail_;
  QListWidget* grid_;
  QTableWidget* top5_;
  EvaluationResults results_;
};

}  // namespace gn::editor
