// What a node shows in its body after a run, read from its entry in the run's report: the host knows no node
// types, so any node type gets a preview from these report fields, the first that applies:
// - "inspect" (the Inspect node): the first tensor's first values, or a heatmap of its "heatmap" grid when
//   the tensor is 2-d;
// - "generated_text" (the Generate node), with "prefix" and "tokens": the text wrapped over a few lines,
//   the prefix dimmer than what was generated, the last line elided;
// - "task": "regression" with "samples" (the Evaluate node of a regression): "R² 0.93 · MSE 0.041" from
//   "r2" and "mse";
// - "task": "language_model" with "samples" (the Evaluate node of a language model): "perplexity 3.21 ·
//   accuracy 0.48" from "perplexity" and "accuracy";
// - "accuracy" with "samples" (the Evaluate node of a classifier): the accuracy as a number and a bar;
// - "attention" with "layers" (an attention layer's node, or a block holding one, once
//   withAttentionOnLayers() of attention_view.h has put the weights an Evaluate node recorded there): a
//   heatmap of the first layer's weights averaged over its heads, query against key;
// - a metric series "<node id>.loss" (the Train node), else "epochs"[].loss: a sparkline of the loss.
#pragma once
#include <QFont>
#include <QJsonObject>
#include <QList>
#include <QRectF>
#include <QString>
#include <QStringList>
#include <utility>

class QPainter;

namespace gn::editor {

struct NodePreview {
  enum class Kind { None, Values, Heatmap, Accuracy, Scores, Text, Sparkline };
  Kind kind = Kind::None;
  // The line above the picture: a shape, a sample count, the loss from first to last, the tokens generated.
  QString caption;
  QList<double> values;  // Values: the first values; Heatmap: rows × cols, row-major; Sparkline: the losses
  int rows = 0, cols = 0;  // Heatmap: the sampled grid's size
  double accuracy = 0;     // Accuracy: in 0..1, NaN when the report has none
  QString scores;          // Scores: the line under the caption, "R² 0.93 · MSE 0.041"
  QString text;            // Text: the prefix and what followed, one line break per "\n"
  int prefixLength = 0;    // Text: how much of `text` was the prefix given

  // Text: the lines drawn in a preview `width` wide: `text` wrapped at word boundaries (inside a word too
  // long for a line) and at its line breaks, at most kTextLines; the last ends in "…" when text is left.
  QStringList textLines(qreal width) const;
  static constexpr int kTextLines = 4;

  bool empty() const { return kind == Kind::None; }
  // `entry` is report.nodes.<id>, `metrics` is report.metrics.
  static NodePreview fromReport(const QString& nodeId, const QJsonObject& entry, const QJsonObject& metrics);
  // The font a preview writes in (textLines() wraps in it).
  static QFont font();
  // The height it takes in a node's body.
  qreal height() const;
  void paint(QPainter* p, const QRectF& r) const;
  // The value range a heatmap's colours span, NaNs left out: {min, max}.
  std::pair<double, double> range() const;
};

}  // namespace gn::editor
