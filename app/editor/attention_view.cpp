#include "attention_view.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QEvent>
#include <QHBoxLayout>
#include <QJsonArray>
#include <QLabel>
#include <QPainter>
#include <QToolTip>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>

#include "gpunodes/core/subgraph.h"
#include "plots.h"

namespace gn::editor {

namespace {

const QColor kForeground(0xc8, 0xcc, 0xd2);
const QColor kDim(0x9a, 0xa3, 0xad);

// The Confusion tab's colours, dark for no weight and bright yellow for the most, spaced as the square root
// of the weight: a softmax over 50 keys puts most weights near 1/50, which a linear ramp from 0 to a peak of
// 0.6 would paint all alike. The colour scale beside the heatmaps is drawn with the same gradient, so it
// reads true.
QCPColorGradient attentionGradient() {
  QCPColorGradient g;
  g.clearColorStops();
  g.setColorStopAt(0.0, QColor(0x26, 0x29, 0x30));
  g.setColorStopAt(0.15 * 0.15, QColor(0x3b, 0x2a, 0x5c));
  g.setColorStopAt(0.45 * 0.45, QColor(0x21, 0x80, 0x8d));
  g.setColorStopAt(0.75 * 0.75, QColor(0x5e, 0xc9, 0x62));
  g.setColorStopAt(1.0, QColor(0xfd, 0xe7, 0x25));
  return g;
}

QColor gradientColor(double t) {
  return QColor::fromRgb(attentionGradient().color(std::clamp(t, 0.0, 1.0), QCPRange(0, 1)));
}

// A token as an axis names it: whitespace made visible.
QString tokenLabel(const QString& t) {
  if (t.isEmpty()) return QStringLiteral("∅");
  if (t == " ") return QStringLiteral("␣");
  if (t == "\n") return QStringLiteral("↵");
  if (t == "\t") return QStringLiteral("⇥");
  QString s = t;
  s.replace('\n', QStringLiteral("↵"));
  return s.size() > 12 ? s.left(11) + "…" : s;
}

// Integer ticks, about `wanted` of them over 0..n-1, at 1, 2, 5, 10, 20, 50, ... apart.
QSharedPointer<QCPAxisTicker> indexTicker(int n, int wanted) {
  double step = 1;
  for (double decade = 1; n / step > wanted; decade *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      step = m * decade;
      if (n / step <= wanted) break;
    }
  QSharedPointer<QCPAxisTickerFixed> t(new QCPAxisTickerFixed);
  t->setTickStep(step);
  t->setScaleStrategy(QCPAxisTickerFixed::ssNone);
  return t;
}

QString formatWeight(double v) {
  return QString::number(v, 'f', v < 0.01 ? 4 : 3);
}

// A colour map's data with `keys` x `queries` cells at integer coordinates. A side of one is drawn as two
// cells a quarter apart (QCustomPlot spaces cells by range / (size - 1)), as the Confusion tab does.
void sizeMap(QCPColorMap* map, int keys, int queries) {
  const auto range = [](int n) { return n == 1 ? QCPRange(-0.25, 0.25) : QCPRange(0, n - 1); };
  map->data()->setSize(qMax(2, keys), qMax(2, queries));
  map->data()->setRange(range(keys), range(queries));
}

void setMapCell(QCPColorMap* map, int keys, int queries, int k, int q, double v) {
  for (int i = k; i < (keys == 1 ? 2 : k + 1); ++i)
    for (int j = q; j < (queries == 1 ? 2 : q + 1); ++j) map->data()->setCell(i, j, v);
}

}  // namespace

// ------------------------------------------------------------------------------------------------- overlay

// The sample and, beside it, the sample with the class token's attention over its patches: each patch
// tinted by its weight on the view's colour scale, more opaque where the weight is higher.
class PatchOverlay : public QWidget {
 public:
  explicit PatchOverlay(QWidget* parent) : QWidget(parent) { setObjectName("attentionOverlay"); }

  void setData(const QImage& image, const QVector<double>& weights, int side, const QString& title,
               const QString& caption) {
    title_ = title;
    caption_ = caption;
    plain_ = QImage();
    composed_ = QImage();
    max_ = 0;
    if (image.isNull() || side <= 0 || weights.size() != side * side) {
      update();
      return;
    }
    for (double w : weights) max_ = std::max(max_, w);
    // Scaled up by a whole factor so the image's pixels stay sharp, to about 224 pixels.
    const int longer = std::max(image.width(), image.height());
    const int f = std::max(1, 224 / longer);
    plain_ =
        image.convertToFormat(QImage::Format_RGB32)
            .scaled(image.width() * f, image.height() * f, Qt::IgnoreAspectRatio, Qt::FastTransformation);
    composed_ = plain_.copy();
    QPainter p(&composed_);
    const double pw = double(composed_.width()) / side, ph = double(composed_.height()) / side;
    for (int r = 0; r < side; ++r)
      for (int c = 0; c < side; ++c) {
        const double t = max_ > 0 ? weights[r * side + c] / max_ : 0;
        QColor colour = gradientColor(t);
        colour.setAlphaF(float(0.35 + 0.45 * t));
        p.fillRect(QRectF(c * pw, r * ph, pw, ph), colour);
      }
    p.setPen(QPen(QColor(0, 0, 0, 70), 1));
    for (int i = 1; i < side; ++i) {
      p.drawLine(QPointF(i * pw, 0), QPointF(i * pw, composed_.height()));
      p.drawLine(QPointF(0, i * ph), QPointF(composed_.width(), i * ph));
    }
    p.end();
    update();
  }

  QImage composed() const { return composed_; }
  QString title() const { return title_; }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), QColor(0x1e, 0x20, 0x24));
    if (composed_.isNull()) return;
    QFont f = font();
    f.setPointSizeF(9);
    p.setFont(f);
    const QFontMetrics fm(f);
    const int line = fm.height() + 4, gap = 10;
    const QRect inner = rect().adjusted(8, 6, -8, -6);
    p.setPen(kForeground);
    p.drawText(QRect(inner.left(), inner.top(), inner.width(), line), Qt::AlignLeft | Qt::AlignVCenter,
               fm.elidedText(title_, Qt::ElideRight, inner.width()));
    // Under the title the overlay, as large as the height allows, and the plain sample at half its size
    // beside it; the captions and the tint's scale under them.
    const int below = 2 * line + 14;
    const int side = std::max(16, std::min((inner.width() - gap) * 2 / 3, inner.height() - line - below));
    const QRect left(inner.left(), inner.top() + line + 2, side / 2, side / 2);
    const QRect right(left.right() + 1 + gap, left.top(), side, side);
    p.setRenderHint(QPainter::SmoothPixmapTransform, false);
    p.drawImage(left, plain_);
    p.drawImage(right, composed_);
    p.setPen(QPen(QColor(0x3a, 0x3f, 0x46), 1));
    p.setBrush(Qt::NoBrush);
    p.drawRect(left.adjusted(0, 0, -1, -1));
    p.drawRect(right.adjusted(0, 0, -1, -1));
    QFont small = f;
    small.setPointSizeF(8);
    p.setFont(small);
    const QFontMetrics sm(small);
    p.setPen(kDim);
    p.drawText(QRect(left.left(), left.bottom() + 3, left.width(), line), Qt::AlignHCenter | Qt::AlignTop,
               sm.elidedText("the sample", Qt::ElideRight, left.width()));
    p.drawText(QRect(right.left(), right.bottom() + 3, side, line), Qt::AlignHCenter | Qt::AlignTop,
               sm.elidedText(caption_, Qt::ElideRight, side));
    // The tint's scale: from no weight to the largest patch's.
    const QRect ramp(right.left(), right.bottom() + 3 + line, side, 8);
    for (int x = 0; x < ramp.width(); ++x) {
      const double t = ramp.width() > 1 ? double(x) / (ramp.width() - 1) : 0;
      QColor c = gradientColor(t);
      p.fillRect(QRect(ramp.left() + x, ramp.top(), 1, ramp.height()), c);
    }
    p.setPen(kDim);
    const QRect labels(ramp.left(), ramp.bottom() + 1, ramp.width(), sm.height());
    p.drawText(labels, Qt::AlignLeft | Qt::AlignTop, "0");
    p.drawText(labels, Qt::AlignRight | Qt::AlignTop, formatWeight(max_));
  }

 private:
  QString title_, caption_;
  QImage plain_, composed_;
  double max_ = 0;
};

// ------------------------------------------------------------------------------------------------- results

QVector<double> AttentionLayer::meanOverHeads() const {
  QVector<double> mean(qsizetype(queries) * keys, 0.0);
  if (heads <= 0) return mean;
  for (int h = 0; h < heads; ++h)
    for (qsizetype i = 0; i < mean.size(); ++i) mean[i] += weights[h * mean.size() + i];
  for (double& v : mean) v /= heads;
  return mean;
}

int AttentionLayer::patchSide() const {
  const int n = int(std::lround(std::sqrt(double(keys - 1))));
  return keys > 1 && n * n == keys - 1 ? n : 0;
}

QVector<double> AttentionLayer::classTokenAttention() const {
  const int n = patchSide();
  if (n == 0 || queries < 1 || heads < 1) return {};
  QVector<double> out(n * n, 0.0);
  for (int h = 0; h < heads; ++h)
    for (int k = 1; k < keys; ++k) out[k - 1] += weight(h, 0, k) / heads;
  return out;
}

std::optional<AttentionResults> AttentionResults::fromReport(const QString& node, const QJsonObject& entry) {
  const QJsonObject a = entry.value("attention").toObject();
  AttentionResults r;
  r.node = node;
  for (const QJsonValue& v : a.value("layers").toArray()) {
    const QJsonObject o = v.toObject();
    AttentionLayer l;
    l.layer = o.value("layer").toString();
    l.heads = o.value("heads").toInt();
    l.queries = o.value("queries").toInt();
    l.keys = o.value("keys").toInt();
    const QJsonArray w = o.value("weights").toArray();
    // A layer whose weights do not fill its heads x queries x keys is left out, not guessed at.
    if (l.layer.isEmpty() || l.heads <= 0 || l.queries <= 0 || l.keys <= 0 ||
        w.size() != qsizetype(l.heads) * l.queries * l.keys)
      continue;
    l.weights.reserve(w.size());
    for (const QJsonValue& x : w) l.weights << (x.isDouble() ? x.toDouble() : NAN);
    r.layers << l;
  }
  if (r.layers.isEmpty()) return std::nullopt;
  r.sample = a.value("sample").toInteger();
  r.split = entry.value("split").toString();
  if (a.value("label").isDouble()) {
    r.label = a.value("label").toInt();
    const QJsonArray names = entry.value("class_names").toArray();
    if (r.label >= 0 && r.label < names.size()) r.labelName = names[r.label].toString();
  }
  if (a.value("image").isString())
    r.image = QImage::fromData(QByteArray::fromBase64(a.value("image").toString().toLatin1()), "PNG");
  for (const QJsonValue& t : a.value("tokens").toArray()) r.tokens << t.toString();
  return r;
}

QList<int> AttentionResults::layersOf(const QString& path) const {
  QList<int> out;
  const QString inside = path + core::subgraph::kPathSeparator;
  for (int i = 0; i < layers.size(); ++i)
    if (path == node || layers[i].layer == path || layers[i].layer.startsWith(inside)) out << i;
  return out;
}

QString AttentionResults::text() const {
  const bool chars =
      std::all_of(tokens.begin(), tokens.end(), [](const QString& t) { return t.size() == 1; });
  return tokens.join(chars ? QString() : QString(" "));
}

QString AttentionResults::sampleText() const {
  QString s = QString("sample %1").arg(sample);
  if (!labelName.isEmpty())
    s += " · " + labelName;
  else if (label >= 0)
    s += QString(" · label %1").arg(label);
  return s;
}

QJsonObject withAttentionOnLayers(const QJsonObject& report) {
  QJsonObject nodes = report.value("nodes").toObject();
  QMap<QString, QJsonArray> layersOf;  // node path -> the layers it is or holds
  QMap<QString, QJsonValue> sampleOf;
  QSet<QString> seen;
  for (auto it = nodes.begin(); it != nodes.end(); ++it) {
    const QJsonObject a = it.value().toObject().value("attention").toObject();
    for (const QJsonValue& v : a.value("layers").toArray()) {
      const QString id = v.toObject().value("layer").toString();
      if (id.isEmpty() || seen.contains(id)) continue;  // two evaluations of one layer: the first one's
      seen.insert(id);
      const QStringList parts = id.split(core::subgraph::kPathSeparator);
      for (int n = 1; n <= parts.size(); ++n) {
        const QString path = parts.mid(0, n).join(core::subgraph::kPathSeparator);
        layersOf[path].append(v);
        sampleOf.insert(path, a.value("sample"));
      }
    }
  }
  if (layersOf.isEmpty()) return report;
  for (auto it = layersOf.begin(); it != layersOf.end(); ++it) {
    QJsonObject entry = nodes.value(it.key()).toObject();
    if (entry.contains("attention")) continue;  // the node that recorded them keeps its own field
    entry.insert("attention", QJsonObject{{"sample", sampleOf.value(it.key())}, {"layers", it.value()}});
    nodes.insert(it.key(), entry);
  }
  QJsonObject out = report;
  out.insert("nodes", nodes);
  return out;
}

// --------------------------------------------------------------------------------------------------- view

AttentionView::AttentionView(QWidget* parent) : QWidget(parent) {
  setObjectName("attentionView");
  header_ = new QLabel(this);
  header_->setObjectName("resultsHeader");
  header_->setWordWrap(true);
  header_->setTextFormat(Qt::PlainText);
  header_->setContentsMargins(6, 4, 6, 2);

  selectorRow_ = new QWidget(this);
  auto* row = new QHBoxLayout(selectorRow_);
  row->setContentsMargins(6, 0, 6, 2);
  auto* label = new QLabel("layer:", selectorRow_);
  layers_ = new QComboBox(selectorRow_);
  layers_->setObjectName("attentionLayer");
  layers_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  row->addWidget(label);
  row->addWidget(layers_);
  row->addStretch(1);
  connect(layers_, &QComboBox::activated, this, [this](int i) {
    if (i >= 0 && i < nodeLayers_.size()) showLayer(nodeLayers_[i]);
  });

  area_ = new QWidget(this);
  area_->setMinimumSize(200, 150);
  area_->installEventFilter(this);
  plot_ = new QCustomPlot(area_);
  plot_->installEventFilter(this);
  plot_->setObjectName("attentionPlot");
  applyPlotTheme(plot_);
  plot_->setInteractions({});
  plot_->setMouseTracking(true);
  plot_->setAutoAddPlottableToLegend(false);
  connect(plot_, &QCustomPlot::mouseMove, this,
          [this](QMouseEvent* e) { showTooltip(e->position().toPoint()); });
  overlay_ = new PatchOverlay(this);

  auto* body = new QHBoxLayout;
  body->setContentsMargins(0, 0, 0, 0);
  body->setSpacing(4);
  body->addWidget(area_, 1);
  body->addWidget(overlay_);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(header_);
  layout->addWidget(selectorRow_);
  layout->addLayout(body, 1);
  clear(
      "Turn on an Evaluate node's attention param (attention_sample picks the sample of the split) and run "
      "the graph, then select a MultiheadAttention node, or a block holding one: its attention weights "
      "show here, one heatmap per head.");
}

QString AttentionView::headerText() const {
  return header_->text();
}

QString AttentionView::shownLayer() const {
  return results_ && shown_ >= 0 ? results_->layers[shown_].layer : QString();
}

QStringList AttentionView::headTitles() const {
  QStringList out;
  for (QCPTextElement* t : titles_) out << t->text();
  return out;
}

QWidget* AttentionView::overlay() const {
  return overlay_;
}

QImage AttentionView::overlayImage() const {
  return overlay_->composed();
}

QString AttentionView::overlayTitle() const {
  return overlay_->title();
}

void AttentionView::setResults(const AttentionResults& r) {
  results_ = r;
  nodeLayers_.clear();
  shown_ = -1;
  shownNode_.clear();
  QStringList ids;
  for (const AttentionLayer& l : r.layers) ids << l.layer;
  header_->setText(
      QString("Evaluate node %1 recorded the attention of %2 (%3): select one of them, or a block "
              "holding one, to see its weights per head.")
          .arg(r.node, ids.join(", "), r.sampleText()));
  selectorRow_->hide();
  overlay_->hide();
  plot_->hide();
  rebuildHeads();
}

void AttentionView::clear(const QString& message) {
  results_.reset();
  nodeLayers_.clear();
  shown_ = -1;
  shownNode_.clear();
  header_->setText(message);
  selectorRow_->hide();
  overlay_->setData({}, {}, 0, {}, {});
  overlay_->hide();
  plot_->hide();
  rebuildHeads();
}

bool AttentionView::showNode(const QString& path) {
  if (!results_) return false;
  const QList<int> found = results_->layersOf(path);
  if (found.isEmpty()) {
    QStringList ids;
    for (const AttentionLayer& l : results_->layers) ids << l.layer;
    nodeLayers_.clear();
    shown_ = -1;
    shownNode_.clear();
    header_->setText(
        QString("%1 has no attention weights in the last run. Evaluate node %2 recorded those of "
                "%3 (%4): select one of them, or a block holding one.")
            .arg(path, results_->node, ids.join(", "), results_->sampleText()));
    selectorRow_->hide();
    overlay_->hide();
    plot_->hide();
    rebuildHeads();
    return false;
  }
  shownNode_ = path;
  nodeLayers_ = found;
  {
    const QSignalBlocker block(layers_);
    layers_->clear();
    for (int i : found) layers_->addItem(results_->layers[i].layer);
  }
  selectorRow_->setVisible(found.size() > 1);
  showLayer(found.contains(shown_) ? shown_ : found.first());
  return true;
}

void AttentionView::showLayer(int index) {
  if (!results_ || index < 0 || index >= results_->layers.size()) return;
  shown_ = index;
  if (const qsizetype at = nodeLayers_.indexOf(index); at >= 0) {
    const QSignalBlocker block(layers_);
    layers_->setCurrentIndex(int(at));
  }
  const AttentionResults& r = *results_;
  const AttentionLayer& l = r.layers[index];
  // Causal when no query gives weight to a later key.
  bool causal = l.queries == l.keys && l.queries > 1;
  for (int h = 0; causal && h < l.heads; ++h)
    for (int q = 0; causal && q < l.queries; ++q)
      for (int k = q + 1; causal && k < l.keys; ++k) causal = l.weight(h, q, k) == 0;
  const bool grid = l.patchSide() > 0 && !r.image.isNull();
  QString head = QString(
                     "Layer %1 on %2%3 (recorded by Evaluate node %4): %5 head%6, %7 queries × %8 keys. "
                     "Each row is a query; its weights over the keys sum to 1")
                     .arg(l.layer, r.sampleText(),
                          r.split.isEmpty() ? QString() : " of the " + r.split + " split", r.node)
                     .arg(l.heads)
                     .arg(l.heads == 1 ? "" : "s")
                     .arg(l.queries)
                     .arg(l.keys);
  if (causal) head += "; causal: no query attends to a later step";
  head += ".";
  if (grid)
    head += QString(
                " Key 0 is the class token, keys 1–%1 the %2 × %2 patches row by row; on the right the "
                "class token's attention over them.")
                .arg(l.keys - 1)
                .arg(l.patchSide());
  if (!r.tokens.isEmpty()) {
    QString text = r.text();
    text.replace('\n', QStringLiteral("↵"));
    if (text.size() > 240) text = text.left(239) + "…";
    head += " The sample: “" + text + "”.";
  }
  header_->setText(head);
  if (grid) {
    overlay_->setData(
        r.image, l.classTokenAttention(), l.patchSide(),
        r.sampleText() + (r.labelName.isEmpty() ? QString() : QString(" (label %1)").arg(r.label)),
        QString("class token's attention, mean of %1 heads").arg(l.heads));
    overlay_->show();
  } else {
    overlay_->setData({}, {}, 0, {}, {});
    overlay_->hide();
  }
  fitOverlay();
  rebuildHeads();  // sized before it shows: a plot shown at no size draws into no buffer
  plot_->show();
}

void AttentionView::rebuildHeads() {
  plot_->clearPlottables();
  plot_->clearItems();
  plot_->plotLayout()->clear();
  maps_.clear();
  titles_.clear();
  heads_ = nullptr;
  scale_ = nullptr;
  columns_ = 0;
  tokenLabels_ = false;
  if (!results_ || shown_ < 0) return;  // the plot is hidden
  const AttentionLayer& l = results_->layers[shown_];
  const QCPColorGradient gradient = attentionGradient();
  double top = 0;
  for (double w : l.weights)
    if (std::isfinite(w)) top = std::max(top, w);
  heads_ = new QCPLayoutGrid;
  plot_->plotLayout()->addElement(0, 0, heads_);
  heads_->setRowSpacing(0);
  heads_->setColumnSpacing(0);
  scale_ = new QCPColorScale(plot_);
  scale_->setType(QCPAxis::atRight);
  scale_->setGradient(gradient);
  scale_->setDataRange(QCPRange(0, top > 0 ? top : 1));
  scale_->setBarWidth(10);
  scale_->axis()->setLabel("attention weight");
  QCPAxis* sa = scale_->axis();
  sa->setBasePen(QPen(kForeground));
  sa->setTickPen(QPen(kForeground));
  sa->setSubTickPen(QPen(kForeground));
  sa->setTickLabelColor(kForeground);
  sa->setLabelColor(kForeground);
  plot_->plotLayout()->addElement(0, 1, scale_);
  plot_->plotLayout()->setColumnSpacing(8);

  QFont titleFont = plot_->font();
  titleFont.setPointSizeF(9);
  for (int h = 0; h < l.heads; ++h) {
    auto* cell = new QCPLayoutGrid;
    cell->setRowSpacing(0);
    auto* title = new QCPTextElement(plot_, QString("head %1").arg(h + 1), titleFont);
    title->setTextColor(kForeground);
    title->setSizeConstraintRect(QCPLayoutElement::scrOuterRect);
    cell->addElement(0, 0, title);
    auto* rect = new QCPAxisRect(plot_);
    rect->setAutoMargins(QCP::msNone);
    for (QCPAxis* a : rect->axes()) {
      a->setBasePen(QPen(kForeground));
      a->setTickPen(QPen(kForeground));
      a->setSubTickPen(QPen(kForeground));
      a->setTickLabelColor(kForeground);
      a->setLabelColor(kForeground);
      a->grid()->setVisible(false);
      a->setSubTicks(false);
      a->setTickLength(0, 3);
    }
    QCPAxis* x = rect->axis(QCPAxis::atBottom);
    QCPAxis* y = rect->axis(QCPAxis::atLeft);
    x->setLabel("key");
    y->setLabel("query");
    y->setRangeReversed(true);  // query 0 at the top, as a matrix reads
    x->setRange(-0.5, l.keys - 0.5);
    y->setRange(-0.5, l.queries - 0.5);
    cell->addElement(1, 0, rect);
    heads_->addElement(0, h, cell);
    auto* map = new QCPColorMap(x, y);
    map->setInterpolate(false);
    map->setTightBoundary(false);
    map->setColorScale(scale_);
    map->setGradient(gradient);
    map->setDataRange(scale_->dataRange());
    sizeMap(map, l.keys, l.queries);
    for (int q = 0; q < l.queries; ++q)
      for (int k = 0; k < l.keys; ++k) setMapCell(map, l.keys, l.queries, k, q, l.weight(h, q, k));
    maps_ << map;
    titles_ << title;
  }
  columns_ = l.heads;  // one row, until layoutHeads() arranges them
  layoutHeads();
}

void AttentionView::layoutHeads() {
  if (!results_ || shown_ < 0 || !heads_) return;
  const AttentionLayer& l = results_->layers[shown_];
  const int n = int(maps_.size());
  const QFont tickFont = plot_->font();  // an axis's own default
  QFont tokenFont = tickFont;
  tokenFont.setPointSizeF(6.5);
  const QFontMetrics tm(tickFont), km(tokenFont), lm(maps_.first()->keyAxis()->labelFont());
  QFont titleFont = plot_->font();
  titleFont.setPointSizeF(9);
  const int titleHeight = QFontMetrics(titleFont).height() + 6;
  const int scaleWidth = 78, spacing = 8;
  const int W = area_->width(), H = area_->height();

  // The margins around a heatmap: its tick labels (numbers, or the longest token) and the axis label.
  const bool tokensFit = !results_->tokens.isEmpty() && results_->tokens.size() == l.keys &&
                         results_->tokens.size() == l.queries;
  int longestToken = 0;
  double meanAdvance = 0;
  if (tokensFit) {
    for (const QString& t : results_->tokens) {
      const int w = km.horizontalAdvance(tokenLabel(t));
      longestToken = std::max(longestToken, w);
      meanAdvance += w;
    }
    meanAdvance /= results_->tokens.size();
  }
  const bool words = longestToken > km.horizontalAdvance("MM");  // drawn turned on the key axis
  const auto margins = [&](bool tokens) {
    const int numbers = tm.horizontalAdvance(QString::number(std::max(l.keys, l.queries)));
    const int left = (tokens ? longestToken : numbers) + lm.height() + 20;
    const int bottom = (tokens ? (words ? longestToken : km.height()) : tm.height()) + lm.height() + 8;
    return QMargins(left, 2, 10, bottom);
  };
  // The columns that give the largest square heatmaps.
  const auto fit = [&](const QMargins& m, int* columns) {
    int best = 0;
    for (int c = 1; c <= n; ++c) {
      const int r = (n + c - 1) / c;
      const int side = std::min((W - scaleWidth - spacing) / c - m.left() - m.right(),
                                H / r - titleHeight - m.top() - m.bottom());
      if (side > best) {
        best = side;
        *columns = c;
      }
    }
    return best;
  };
  int columns = 1;
  QMargins m = margins(false);
  int side = fit(m, &columns);
  // The tokens on the axes when each cell has room for one: a character side by side with the next on the
  // key axis and above the next on the query axis (lower case is as tall as the font's x-height, ascenders a
  // little more), a word turned on the key axis and as tall as the font on the query axis.
  bool tokens = false;
  if (tokensFit) {
    int c = 1;
    const QMargins withTokens = margins(true);
    const int s = fit(withTokens, &c);
    const double needed = words ? km.height() - 2 : std::max(meanAdvance + 1, km.xHeight() + 2.0);
    if (s > 0 && double(s) / std::max(l.keys, l.queries) >= needed) {
      tokens = true;
      m = withTokens;
      side = s;
      columns = c;
    }
  }
  side = std::max(side, 24);
  const int rows = (n + columns - 1) / columns;
  tokenLabels_ = tokens;
  if (columns != columns_) {
    QList<QCPLayoutElement*> cells;
    for (int i = 0; i < n; ++i) cells << heads_->takeAt(heads_->rowColToIndex(i / columns_, i % columns_));
    heads_->simplify();
    for (int i = 0; i < n; ++i) heads_->addElement(i / columns, i % columns, cells[i]);
    columns_ = columns;
  }
  const bool rotate = tokens && words;
  for (int i = 0; i < n; ++i) {
    QCPAxisRect* rect = maps_[i]->keyAxis()->axisRect();
    rect->setMargins(m);
    titles_[i]->setMinimumSize(0, titleHeight);
    titles_[i]->setMaximumSize(QWIDGETSIZE_MAX, titleHeight);
    QCPAxis* x = rect->axis(QCPAxis::atBottom);
    QCPAxis* y = rect->axis(QCPAxis::atLeft);
    if (tokens) {
      QSharedPointer<QCPAxisTickerText> kt(new QCPAxisTickerText), qt(new QCPAxisTickerText);
      for (int t = 0; t < l.keys; ++t) kt->addTick(t, tokenLabel(results_->tokens[t]));
      for (int t = 0; t < l.queries; ++t) qt->addTick(t, tokenLabel(results_->tokens[t]));
      x->setTicker(kt);
      y->setTicker(qt);
      x->setTickLabelFont(tokenFont);
      y->setTickLabelFont(tokenFont);
    } else {
      const int wanted = std::max(2, side / 40);
      x->setTicker(indexTicker(l.keys, wanted));
      y->setTicker(indexTicker(l.queries, wanted));
      x->setTickLabelFont(tickFont);
      y->setTickLabelFont(tickFont);
    }
    x->setTickLabelRotation(rotate ? 90 : 0);
  }
  // The colour scale as tall as the heatmaps' rows, beside them.
  scale_->setSizeConstraintRect(QCPLayoutElement::scrOuterRect);
  scale_->setMinimumSize(scaleWidth, 0);
  scale_->setMaximumSize(scaleWidth, QWIDGETSIZE_MAX);
  scale_->setAutoMargins(QCP::msLeft | QCP::msRight);
  scale_->setMargins(QMargins(0, titleHeight + m.top(), 0, m.bottom()));
  // Centred across the area; what is left of its height stays below.
  const int width = columns * (side + m.left() + m.right()) + spacing + scaleWidth;
  plot_->setGeometry(std::max(0, (W - width) / 2), 0, width,
                     rows * (titleHeight + side + m.top() + m.bottom()));
  // A hidden plot (another tab is current) is drawn when it shows: see eventFilter().
  if (plot_->isVisible()) plot_->replot(QCustomPlot::rpQueuedReplot);
}

void AttentionView::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  fitOverlay();
}

// The overlay as tall as the body allows, at most 240 pixels, and the sample at half its size beside it.
void AttentionView::fitOverlay() {
  const int body = height() - header_->sizeHint().height() -
                   (selectorRow_->isVisibleTo(this) ? selectorRow_->sizeHint().height() : 0);
  const int side = std::clamp(body - 70, 80, 240);
  overlay_->setFixedWidth(side + side / 2 + 28);
}

bool AttentionView::eventFilter(QObject* watched, QEvent* e) {
  if (watched == area_ && e->type() == QEvent::Resize) layoutHeads();
  if (watched == plot_ && e->type() == QEvent::Show) plot_->replot(QCustomPlot::rpQueuedReplot);
  return QWidget::eventFilter(watched, e);
}

void AttentionView::showTooltip(const QPoint& pos) {
  if (!results_ || shown_ < 0) return;
  const AttentionLayer& l = results_->layers[shown_];
  for (int h = 0; h < maps_.size(); ++h) {
    QCPAxisRect* rect = maps_[h]->keyAxis()->axisRect();
    if (!rect->rect().contains(pos)) continue;
    const int k = int(std::lround(maps_[h]->keyAxis()->pixelToCoord(pos.x())));
    const int q = int(std::lround(maps_[h]->valueAxis()->pixelToCoord(pos.y())));
    if (k < 0 || q < 0 || k >= l.keys || q >= l.queries) break;
    const auto name = [this, &l](int i) {
      return results_->tokens.size() == l.keys ? QString(" “%1”").arg(tokenLabel(results_->tokens[i]))
                                               : QString();
    };
    QToolTip::showText(plot_->mapToGlobal(pos),
                       QString("head %1: query %2%3 → key %4%5: %6")
                           .arg(h + 1)
                           .arg(q)
                           .arg(name(q))
                           .arg(k)
                           .arg(name(k))
                           .arg(formatWeight(l.weight(h, q, k))),
                       plot_);
    return;
  }
  QToolTip::hideText();
}

}  // namespace gn::editor
