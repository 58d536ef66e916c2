// What a model's attention layers attend to, from an Evaluate node's report entry (its `attention` field, on
// when the node's `attention` param is: see docs/events.md): the Plots dock's Attention tab. Selecting an
// attention layer's node (the layer id is its path, "block1/attn"), or a block that holds such layers (the
// path is a prefix: selecting block1 shows block1/attn), shows that layer's weights for the reported sample
// of the split: one heatmap per head, query against key, on one colour scale; a text sample's tokens on the
// axes when the cells are wide enough for them. When the layer has 1 + n² keys and the sample is an image (a
// Vision Transformer's class token and its n × n patches), the class token's attention over the patches,
// averaged over the heads, is laid over the image. A block with several layers gets a selector. The editor
// knows no node types: a node "has attention" when the report names it, or a path inside it, as a layer.
#pragma once
#include <QImage>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <QVector>
#include <QWidget>
#include <optional>

class QComboBox;
class QCustomPlot;
class QCPColorMap;
class QCPColorScale;
class QCPLayoutGrid;
class QCPTextElement;
class QLabel;

namespace gn::editor {

class PatchOverlay;

struct AttentionLayer {
  QString layer;  // the layer's id: the flattened path of its node
  int heads = 0, queries = 0, keys = 0;
  QVector<double> weights;  // heads x queries x keys, row-major

  double weight(int head, int query, int key) const {
    return weights[(qsizetype(head) * queries + query) * keys + key];
  }
  // The weights averaged over the heads, queries x keys.
  QVector<double> meanOverHeads() const;
  // n when keys = 1 + n² (a class token, then n × n patches), else 0.
  int patchSide() const;
  // Query 0's weights on keys 1.. (the class token's attention over the patches), averaged over the heads:
  // patchSide()² values, row-major; empty without a patch grid.
  QVector<double> classTokenAttention() const;
};

struct AttentionResults {
  QString node;   // the Evaluate node that recorded them
  QString split;  // the split the sample is from
  qint64 sample = 0;
  int label = -1;      // an image's class, -1 when the report has none
  QString labelName;   // its name, from the entry's class_names
  QImage image;        // the sample, for an image dataset
  QStringList tokens;  // the sample's tokens, for a text dataset
  QList<AttentionLayer> layers;

  // Null when the entry has no readable `attention` field (no layers whose weights fill heads x queries x
  // keys).
  static std::optional<AttentionResults> fromReport(const QString& node, const QJsonObject& entry);
  // The layers the node at `path` shows: the layer with that id, or every layer inside the block at `path`
  // (ids starting with "path/"); for the recording Evaluate node itself, every layer. Indices into `layers`.
  QList<int> layersOf(const QString& path) const;
  // The tokens as one text: joined as they are when every token is one character, with spaces otherwise.
  QString text() const;
  // "sample 3 · ankle boot" (the label's class name), "sample 3 · label 9", "sample 0"
  QString sampleText() const;
};

// The report as the node previews read it: every layer that an entry's `attention` field names is also put
// on the entry of the layer's node, and of each block that holds it, as {"sample", "layers": [its layers]},
// so that the node's own entry gives its preview (node_preview.h). The rest of the report is unchanged.
QJsonObject withAttentionOnLayers(const QJsonObject& report);

class AttentionView : public QWidget {
  Q_OBJECT
 public:
  explicit AttentionView(QWidget* parent = nullptr);

  // What the last run recorded; nothing shows until showNode() picks a layer.
  void setResults(const AttentionResults& r);
  // No attention in view, and `message` saying why (or what to turn on).
  void clear(const QString& message);
  // Shows the layers of the node at `path` (AttentionResults::layersOf): the first, or the one shown before
  // when it is among them. False, with a message naming the layers recorded, when it has none.
  bool showNode(const QString& path);
  // Shows layer `index` of the results' layers.
  void showLayer(int index);

  bool hasResults() const { return results_.has_value(); }
  const std::optional<AttentionResults>& results() const { return results_; }
  QString shownLayer() const;  // empty when no layer shows
  QString shownNode() const { return shownNode_; }
  QString headerText() const;
  QCustomPlot* plot() const { return plot_; }
  // One colour map per head of the layer shown: data cell (key, query) holds the weight.
  const QList<QCPColorMap*>& headMaps() const { return maps_; }
  QStringList headTitles() const;
  QCPColorScale* colorScale() const { return scale_; }
  // The layers of the node shown; visible when it holds more than one.
  QComboBox* layerSelector() const { return layers_; }
  // The image with the class token's attention over it; hidden when the layer has no patch grid or the sample
  // no image.
  QWidget* overlay() const;
  QImage overlayImage() const;
  QString overlayTitle() const;
  // Whether the heatmaps' axes name the tokens (a text sample whose cells are wide enough).
  bool tokenLabelsShown() const { return tokenLabels_; }

 protected:
  void resizeEvent(QResizeEvent* e) override;
  bool eventFilter(QObject* watched, QEvent* e) override;

 private:
  void rebuildHeads();
  void fitOverlay();
  void layoutHeads();  // square heatmaps as large as the plot allows; the token labels when they fit
  void showTooltip(const QPoint& pos);

  QLabel* header_;
  QWidget* selectorRow_;
  QComboBox* layers_;
  QWidget* area_;  // where the heatmaps go: the plot is placed in it at the size that keeps them square
  QCustomPlot* plot_;
  QCPLayoutGrid* heads_ = nullptr;
  QCPColorScale* scale_ = nullptr;
  QList<QCPColorMap*> maps_;
  QList<QCPTextElement*> titles_;
  PatchOverlay* overlay_;
  std::optional<AttentionResults> results_;
  QList<int> nodeLayers_;  // the layers of the node shown, indices into the results' layers
  int shown_ = -1;
  QString shownNode_;
  bool tokenLabels_ = false;
  int columns_ = 0;
};

}  // namespace gn::editor
