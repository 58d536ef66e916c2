// What a classifier got right and wrong, from an Evaluate node's report entry: the Plots dock's Confusion tab
// (a heatmap of true against predicted class, coloured by the share of each true class so that per-class
// recall reads at a glance) and its Mistakes tab (the images the model got wrong, the most confident first;
// clicking one shows its top-5 probabilities). The editor knows nothing of node types: any report entry with
// a `confusion` field is an evaluation (see docs/events.md for the fields).
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
  double accuracy = 0;
  qint64 samples = 0, mistakesTotal = 0;
  QStringList classNames;
  QVector<QVector<qint64>> confusion;  // [true][predicted]
  QVector<double> perClass;            // NaN for a class without samples
  QList<Mistake> mistakes;

  // Null when the entry carries no evaluation (no `confusion` field, or one that is not square).
  static std::optional<EvaluationResults> fromReport(const QString& node, const QJsonObject& entry);
  QString className(int cls) const;
  // "Evaluate node test (test split): accuracy 84.1% on 10,000 samples", and the note.
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
