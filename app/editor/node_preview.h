// What a node shows in its body after a run, read from its entry in the run's report: the host knows no node
// types, so any node type gets a preview from these report fields:
// - "inspect" (the Inspect node): the first tensor's first values, or a heatmap of its "heatmap" grid when
//   the tensor is 2-d;
// - "accuracy" with "samples" (the Evaluate node): the accuracy as a number and a bar;
// - a metric series "<node id>.loss" (the Train node), else "epochs"[].loss: a sparkline of the loss.
#pragma once
#include <QJsonObject>
#include <QList>
#include <QRectF>
#include <QString>
#include <utility>

class QPainter;

namespace gn::editor {

struct NodePreview {
  enum class Kind { None, Values, Heatmap, Accuracy, Sparkline };
  Kind kind = Kind::None;
  QString caption;       // the line above the picture: a shape, a sample count, the loss from first to last
  QList<double> values;  // Values: the first values; Heatmap: rows × cols, row-major; Sparkline: the losses
  int rows = 0, cols = 0;  // Heatmap: the sampled grid's size
  double accuracy = 0;     // Accuracy: in 0..1, NaN when the report has none

  bool empty() const { return kind == Kind::None; }
  // `entry` is report.nodes.<id>, `metrics` is report.metrics.
  static NodePreview fromReport(const QString& nodeId, const QJsonObject& entry, const QJsonObject& metrics);
  // The height it takes in a node's body.
  qreal height() const;
  void paint(QPainter* p, const QRectF& r) const;
  // The value range a heatmap's colours span, NaNs left out: {min, max}.
  std::pair<double, double> range() const;
};

}  // namespace gn::editor
