// The results tabs, offscreen. First from fabricated report entries, without the node set: a regression's
// Predictions (the scatter's points, the line y = x, the scores in its title; a time series' picture with its
// three curves, their points and the marker at the test split's start), a language model's accuracy and
// perplexity without a confusion matrix, which tab holds which evaluation, and the Predictions tab's PNG and
// SVG exports; the Attention tab (a heatmap per head whose cells hold the weights, a block that finds the
// layers inside it, the class token's attention over an image's patches, a text sample's tokens on the axes,
// the message that names the param to turn on) and an attention layer's node preview. Then after a run of a
// shrunk mlp-fashion-mnist (two Evaluate nodes: the trained model and the
// untrained one), with the real GPU node set on the CPU: the heatmap's cells, counts and axis names against
// the report, which evaluation shows (the last to finish, or the selected one), the grid of mistakes in the
// report's order, a click that shows the top 5; the Attention tab's message for a run that recorded no
// attention, whatever is selected; and the Training panes' epoch marks and learning-rate pane (a
// cosine schedule).
#include <qcustomplot.h>

#include <QBuffer>
#include <QComboBox>
#include <QDockWidget>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonObject>
#include <QListWidget>
#include <QTableWidget>
#include <QXmlStreamReader>
#include <algorithm>
#include <cmath>

#include "attention_view.h"
#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "node_preview.h"
#include "plots.h"
#include "predictions_view.h"
#include "results_views.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;

namespace {

QStringList tickLabels(QCPAxis* axis) {
  auto ticker = axis->ticker().dynamicCast<QCPAxisTickerText>();
  return ticker ? QStringList(ticker->ticks().values()) : QStringList();
}

// A caption's probability: two decimals, more where two would round a probability below 1 up to 1.00.
QString captionProbability(double p) {
  QString s = QString::number(p, 'f', 2);
  for (int d = 3; p < 1 && s.startsWith("1.") && d <= 6; ++d) s = QString::number(p, 'f', d);
  return s;
}

int tabOf(QTabWidget* tabs, const QString& name) {
  for (int i = 0; i < tabs->count(); ++i)
    if (tabs->tabText(i) == name) return i;
  return -1;
}

QList<QPointF> pointsOf(const QCPGraph* g) {
  QList<QPointF> out;
  for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
    out << QPointF(it->key, it->value);
  return out;
}

// What an Evaluate node of a regression reports: `n` (true, predicted) pairs, and with `seriesLength` a time
// series of that length with its one-step predictions from index `tau` on and its multistep predictions from
// `trainEnd` on (null before).
QJsonObject regressionEntry(int n, int seriesLength = 0, int tau = 4, int trainEnd = 600) {
  QJsonArray truth, predicted;
  for (int i = 0; i < n; ++i) {
    const double t = 2 * std::sin(0.1 * i);
    truth.append(t);
    predicted.append(t + 0.2 * std::cos(0.7 * i));
  }
  QJsonObject entry{
      {"task", "regression"}, {"split", "test"},
      {"samples", 4 * n},     {"loss", 0.041},
      {"mse", 0.041},         {"mae", 0.153},
      {"r2", 0.93},           {"predictions", QJsonObject{{"true", truth}, {"predicted", predicted}}}};
  if (seriesLength > 0) {
    QJsonArray values, oneStep, multistep;
    for (int i = 0; i < seriesLength; ++i) {
      const double x = std::sin(0.01 * i);
      values.append(x);
      oneStep.append(i < tau ? QJsonValue() : QJsonValue(x + 0.05));
      multistep.append(i < trainEnd ? QJsonValue() : QJsonValue(x * std::exp(-0.01 * (i - trainEnd))));
    }
    entry.insert("series", QJsonObject{{"values", values},
                                       {"tau", tau},
                                       {"train_end", trainEnd},
                                       {"one_step", oneStep},
                                       {"k_step", multistep}});
  }
  return entry;
}

QJsonObject languageModelEntry() {
  return QJsonObject{{"task", "language_model"}, {"split", "test"},        {"samples", 20000},
                     {"accuracy", 0.48},         {"loss", std::log(3.21)}, {"perplexity", 3.21}};
}

// A classifier's entry with a 2-class confusion matrix.
QJsonObject classifierEntry() {
  return QJsonObject{{"split", "test"},
                     {"accuracy", 0.75},
                     {"samples", 8},
                     {"confusion", QJsonArray{QJsonArray{3, 1}, QJsonArray{1, 3}}},
                     {"per_class", QJsonArray{0.75, 0.75}},
                     {"class_names", QJsonArray{"cat", "dog"}},
                     {"mistakes_total", 2}};
}

// An attention layer's weights: `heads` x `queries` x `keys`, each row a softmax of made-up scores (distinct
// per head, query and key), the keys after the query masked to 0 when `causal`.
QJsonObject attentionLayer(const QString& id, int heads, int queries, int keys, bool causal = false) {
  QJsonArray weights;
  for (int h = 0; h < heads; ++h)
    for (int q = 0; q < queries; ++q) {
      QVector<double> row(keys);
      double sum = 0;
      for (int k = 0; k < keys; ++k) {
        row[k] = causal && k > q ? 0.0 : std::exp(std::sin(1.0 + h + 0.7 * q + 1.3 * k));
        sum += row[k];
      }
      for (double v : row) weights.append(v / sum);
    }
  return QJsonObject{
      {"layer", id}, {"heads", heads}, {"queries", queries}, {"keys", keys}, {"weights", weights}};
}

double weightOf(const QJsonObject& layer, int h, int q, int k) {
  const int queries = layer["queries"].toInt(), keys = layer["keys"].toInt();
  return layer["weights"].toArray()[(h * queries + q) * keys + k].toDouble();
}

QString pngBase64(const QImage& img) {
  QByteArray bytes;
  QBuffer buffer(&bytes);
  buffer.open(QIODevice::WriteOnly);
  img.save(&buffer, "PNG");
  return QString::fromLatin1(bytes.toBase64());
}

// A ViT's evaluation: a classifier's entry whose attention field holds block1/attn (2 heads, the class token
// and 2 x 2 patches), and block2's two layers, for sample 3, a dog, with its 8 x 8 image.
QJsonObject vitEntry() {
  // Black, so that a patch's tint alone says how much weight it has.
  QImage img(8, 8, QImage::Format_Grayscale8);
  img.fill(0);
  QJsonObject entry = classifierEntry();
  entry.insert("attention",
               QJsonObject{{"sample", 3},
                           {"label", 1},
                           {"image", pngBase64(img)},
                           {"layers", QJsonArray{attentionLayer("block1/attn", 2, 5, 5),
                                                 attentionLayer("block2/attn", 3, 5, 5),
                                                 attentionLayer("block2/inner/attn", 1, 5, 5)}}});
  return entry;
}

}  // namespace

class TestEvaluationKinds : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  std::unique_ptr<editor::PlotsPanel> p_;

 private slots:
  void init() {
    p_ = std::make_unique<editor::PlotsPanel>();
    p_->resize(1200, 600);
    p_->show();
    QVERIFY(QTest::qWaitForWindowExposed(p_.get()));
  }
  void cleanup() { p_.reset(); }

  void aRegressionShowsItsPredictionsAgainstTheTruth() {
    const QJsonObject entry = regressionEntry(300);
    p_->setEvaluations({{"reg", entry}}, {"reg"});
    QCOMPARE(p_->evaluations(), QStringList{"reg"});
    QCOMPARE(p_->shownEvaluation(), QString("reg"));
    QVERIFY(tabOf(p_.get(), "Predictions") >= 0);
    editor::PredictionsView* view = p_->predictionsView();
    QCOMPARE(p_->widget(tabOf(p_.get(), "Predictions")), static_cast<QWidget*>(view));
    p_->setCurrentWidget(view);

    // One point per sample, predicted against true.
    QCPGraph* points = view->scatterGraph();
    QCOMPARE(points->dataCount(), 300);
    QList<QPointF> want;
    const QJsonArray truth = entry["predictions"]["true"].toArray(),
                     predicted = entry["predictions"]["predicted"].toArray();
    for (int i = 0; i < 300; ++i) want << QPointF(truth[i].toDouble(), predicted[i].toDouble());
    QList<QPointF> got = pointsOf(points);
    const auto byKeyThenValue = [](const QPointF& a, const QPointF& b) {
      return a.x() < b.x() || (a.x() == b.x() && a.y() < b.y());
    };
    std::sort(want.begin(), want.end(), byKeyThenValue);
    std::sort(got.begin(), got.end(), byKeyThenValue);
    QCOMPARE(got, want);
    QCOMPARE(points->lineStyle(), QCPGraph::lsNone);
    // The line y = x, on one scale for both axes that holds every point.
    QCPItemStraightLine* identity = view->identityLine();
    QVERIFY(identity->visible());
    const QPointF a = identity->point1->coords(), b = identity->point2->coords();
    QCOMPARE(a.x(), a.y());
    QCOMPARE(b.x(), b.y());
    QVERIFY(a != b);
    QCustomPlot* scatter = view->scatterPlot();
    QCOMPARE(scatter->xAxis->range(), scatter->yAxis->range());
    for (const QPointF& pt : want)
      QVERIFY(scatter->xAxis->range().contains(pt.x()) && scatter->yAxis->range().contains(pt.y()));
    // The scores in the scatter's title and in the header.
    QCOMPARE(view->scatterTitle(), QString("predicted against true · MSE 0.041 · MAE 0.153 · R² 0.93"));
    QVERIFY2(view->headerText().startsWith(
                 QString("Evaluate node reg (test split): MSE 0.041 · MAE 0.153 · R² 0.93 on %L1 samples")
                     .arg(1200)),
             qPrintable(view->headerText()));
    // The report holds fewer pairs than were evaluated: the header says how many the scatter shows.
    QVERIFY(view->headerText().contains(QString("(%L1 of the %L2 samples shown)").arg(300).arg(1200)));
    // No series, no series picture; the classifier's tabs point to this one.
    QVERIFY(view->seriesPlot()->isHidden());
    QVERIFY(!view->trainEndMarker()->visible());
    QVERIFY(p_->confusionView()->headerText().contains("Predictions tab"));
    QVERIFY(p_->mistakesView()->headerText().contains("Predictions tab"));
    QVERIFY(!p_->confusionView()->colorMap()->visible());
  }

  void aTimeSeriesIsDrawnWithItsOneStepAndMultistepPredictions() {
    p_->setEvaluations({{"reg", regressionEntry(50, 1000, 4, 600)}}, {"reg"});
    editor::PredictionsView* view = p_->predictionsView();
    p_->setCurrentWidget(view);
    QCustomPlot* plot = view->seriesPlot();
    QVERIFY(!plot->isHidden());
    QTRY_VERIFY(plot->isVisible());
    // Three curves: the data, the one-step predictions from tau on, the multistep ones from train_end on.
    QCOMPARE(plot->graphCount(), 3);
    QCOMPARE(view->valuesGraph()->dataCount(), 1000);
    QCOMPARE(view->oneStepGraph()->dataCount(), 1000 - 4);
    QCOMPARE(view->multistepGraph()->dataCount(), 1000 - 600);
    QCOMPARE(view->oneStepGraph()->data()->constBegin()->key, 4.0);
    QCOMPARE(view->multistepGraph()->data()->constBegin()->key, 600.0);
    QCOMPARE(view->valuesGraph()->data()->at(250)->value, std::sin(0.01 * 250));
    QCOMPARE(view->oneStepGraph()->data()->at(0)->value, std::sin(0.01 * 4) + 0.05);
    QCOMPARE(view->multistepGraph()->data()->at(0)->value, std::sin(0.01 * 600));
    QSet<QRgb> colours;
    for (int i = 0; i < 3; ++i) colours.insert(plot->graph(i)->pen().color().rgb());
    QCOMPARE(colours.size(), 3);
    // A legend names them.
    QCOMPARE(plot->legend->itemCount(), 3);
    QVERIFY(plot->legend->visible());
    QCOMPARE(view->valuesGraph()->name(), QString("data"));
    QVERIFY(view->oneStepGraph()->name().startsWith("one-step predictions"));
    QVERIFY(view->multistepGraph()->name().contains("600"));
    // The marker: a vertical line at step 600, over the whole plot's height.
    QCPItemStraightLine* marker = view->trainEndMarker();
    QVERIFY(marker->visible());
    QCOMPARE(marker->point1->coords().x(), 600.0);
    QCOMPARE(marker->point2->coords().x(), 600.0);
    plot->replot();
    QCOMPARE(marker->point1->pixelPosition().x(), plot->xAxis->coordToPixel(600));
    QCOMPARE(marker->point2->pixelPosition().x(), plot->xAxis->coordToPixel(600));
    QVERIFY(marker->point1->pixelPosition().y() != marker->point2->pixelPosition().y());
    QVERIFY(plot->xAxis->range().contains(0) && plot->xAxis->range().contains(999));
    // The scatter beside it still has its samples.
    QCOMPARE(view->scatterGraph()->dataCount(), 50);

    // A regression without a series after it hides the picture again.
    p_->setEvaluations({{"reg2", regressionEntry(10)}}, {"reg2"});
    QVERIFY(plot->isHidden());
    QCOMPARE(view->valuesGraph()->dataCount(), 0);
  }

  void aLanguageModelShowsAccuracyAndPerplexityWithoutAMatrix() {
    p_->setEvaluations({{"lm", languageModelEntry()}}, {"lm"});
    QCOMPARE(p_->shownEvaluation(), QString("lm"));
    editor::ConfusionView* confusion = p_->confusionView();
    QVERIFY2(confusion->headerText().startsWith(
                 QString("Evaluate node lm (test split): accuracy 48.0% · perplexity 3.21 on %L1 samples")
                     .arg(20000)),
             qPrintable(confusion->headerText()));
    QVERIFY(confusion->headerText().contains("no confusion matrix"));
    QVERIFY(!confusion->colorMap()->visible());
    QCOMPARE(confusion->cellText(0, 0), QString());
    editor::MistakesView* mistakes = p_->mistakesView();
    QVERIFY(mistakes->headerText().contains("perplexity 3.21"));
    QVERIFY(mistakes->headerText().contains("lists no mistakes"));
    QCOMPARE(mistakes->grid()->count(), 0);
    QVERIFY(p_->predictionsView()->headerText().contains("a language model"));
    QCOMPARE(p_->predictionsView()->scatterGraph()->dataCount(), 0);
  }

  void eachEvaluationGoesToItsTab() {
    // A dataset's entry names a task too, without an evaluation's fields: no evaluation.
    const QJsonObject nodes{{"data", QJsonObject{{"task", "regression"}, {"train_samples", 600}}},
                            {"cls", classifierEntry()},
                            {"reg", regressionEntry(20)},
                            {"lm", languageModelEntry()}};
    p_->setEvaluations(nodes, {"data", "cls", "reg", "lm"});
    QCOMPARE(p_->evaluations(), (QStringList{"cls", "reg", "lm"}));
    QCOMPARE(p_->shownEvaluation(), QString("lm"));
    QVERIFY(!p_->showEvaluation("data"));
    QCOMPARE(p_->shownEvaluation(), QString("lm"));

    QVERIFY(p_->showEvaluation("reg"));
    QCOMPARE(p_->predictionsView()->scatterGraph()->dataCount(), 20);
    QVERIFY(p_->predictionsView()->headerText().contains("one of 3 evaluations"));
    QVERIFY(!p_->confusionView()->colorMap()->visible());

    QVERIFY(p_->showEvaluation("cls"));
    QVERIFY(p_->confusionView()->colorMap()->visible());
    QCOMPARE(p_->confusionView()->cellText(0, 1), QString("1"));
    QCOMPARE(p_->confusionView()->cellText(1, 1), QString("3"));
    QVERIFY(p_->predictionsView()->headerText().contains("a classifier"));
    QCOMPARE(p_->predictionsView()->scatterGraph()->dataCount(), 0);
    QVERIFY(p_->predictionsView()->seriesPlot()->isHidden());
  }

  void anAttentionLayerShowsAHeatmapPerHead() {
    const QJsonObject entry = vitEntry();
    const QJsonObject layer = entry["attention"]["layers"][0].toObject();
    p_->setEvaluations({{"test", entry}}, {"test"});
    editor::AttentionView* view = p_->attentionView();
    QCOMPARE(p_->widget(tabOf(p_.get(), "Attention")), static_cast<QWidget*>(view));
    p_->setCurrentWidget(view);
    // Before a layer is selected: which layers the run recorded.
    QVERIFY2(view->headerText().contains("block1/attn, block2/attn, block2/inner/attn"),
             qPrintable(view->headerText()));
    QVERIFY(view->plot()->isHidden());

    QVERIFY(p_->showAttention({"block1/attn"}));
    QCOMPARE(view->shownLayer(), QString("block1/attn"));
    QCOMPARE(view->headTitles(), (QStringList{"head 1", "head 2"}));
    QCOMPARE(view->headMaps().size(), 2);
    QTRY_VERIFY(view->plot()->isVisible());
    double top = 0;
    for (int h = 0; h < 2; ++h) {
      QCPColorMap* map = view->headMaps()[h];
      QCOMPARE(map->keyAxis()->label(), QString("key"));
      QCOMPARE(map->valueAxis()->label(), QString("query"));
      QCOMPARE(map->data()->keySize(), 5);
      QCOMPARE(map->data()->valueSize(), 5);
      for (int q = 0; q < 5; ++q)
        for (int k = 0; k < 5; ++k) {
          QCOMPARE(map->data()->cell(k, q), weightOf(layer, h, q, k));
          top = std::max(top, weightOf(layer, h, q, k));
        }
      QCOMPARE(map->colorScale(), view->colorScale());
    }
    // One scale for every head, from 0 to the layer's largest weight.
    QCOMPARE(view->colorScale()->dataRange().lower, 0.0);
    QCOMPARE(view->colorScale()->dataRange().upper, top);
    QVERIFY(view->headerText().contains("2 heads, 5 queries × 5 keys"));
    QVERIFY2(view->headerText().contains("sample 3 · dog of the test split"), qPrintable(view->headerText()));
    QVERIFY(!view->layerSelector()->isVisibleTo(view));  // one layer: nothing to choose

    // Five keys are the class token and 2 x 2 patches: its attention over them, laid over the image.
    QVERIFY(view->overlay()->isVisible());
    QCOMPARE(view->overlayTitle(), QString("sample 3 · dog (label 1)"));
    QCOMPARE(view->overlayImage().size(), QSize(224, 224));  // 8 x 8 scaled up 28 times
    const editor::AttentionLayer& shown = view->results()->layers[0];
    const QVector<double> cls = shown.classTokenAttention();
    QCOMPARE(cls.size(), 4);
    for (int k = 1; k < 5; ++k)
      QVERIFY(std::abs(cls[k - 1] - (weightOf(layer, 0, 0, k) + weightOf(layer, 1, 0, k)) / 2) < 1e-12);
    // The patch the class token attends to most is tinted brighter than the one it attends to least.
    const auto most = std::max_element(cls.begin(), cls.end()) - cls.begin();
    const auto least = std::min_element(cls.begin(), cls.end()) - cls.begin();
    const auto tint = [&](qsizetype patch) {
      // Each patch is 112 pixels a side: the pixel at its centre.
      const QPoint at(int(patch % 2) * 112 + 56, int(patch / 2) * 112 + 56);
      return QColor(view->overlayImage().pixel(at)).value();
    };
    QVERIFY2(tint(most) > tint(least) || most == least,
             qPrintable(QString("%1 %2").arg(tint(most)).arg(tint(least))));
  }

  void aBlockShowsTheLayersInsideIt() {
    p_->setEvaluations({{"test", vitEntry()}}, {"test"});
    editor::AttentionView* view = p_->attentionView();
    p_->setCurrentWidget(view);
    // The block's path is a prefix of its layer's: block1 shows block1/attn.
    QVERIFY(p_->showAttention({"block1"}));
    QCOMPARE(view->shownLayer(), QString("block1/attn"));
    QCOMPARE(view->shownNode(), QString("block1"));
    QVERIFY(!view->layerSelector()->isVisibleTo(view));
    // A block with two layers (one in a block inside it) offers both; the first shows.
    QVERIFY(p_->showAttention({"block2"}));
    QCOMPARE(view->shownLayer(), QString("block2/attn"));
    QCOMPARE(view->headMaps().size(), 3);
    QVERIFY(view->layerSelector()->isVisibleTo(view));
    QCOMPARE(view->layerSelector()->count(), 2);
    QCOMPARE(view->layerSelector()->itemText(1), QString("block2/inner/attn"));
    emit view->layerSelector()->activated(1);
    QCOMPARE(view->shownLayer(), QString("block2/inner/attn"));
    QCOMPARE(view->headTitles(), QStringList{"head 1"});
    // Selecting the inner block keeps that layer; a path that only starts like a block's is not inside it.
    QVERIFY(p_->showAttention({"block2/inner"}));
    QCOMPARE(view->shownLayer(), QString("block2/inner/attn"));
    QVERIFY(!p_->showAttention({"block10"}));
    QVERIFY2(view->headerText().startsWith("block10 has no attention weights in the last run"),
             qPrintable(view->headerText()));
    QVERIFY(view->headerText().contains("block1/attn, block2/attn, block2/inner/attn"));
    QVERIFY(view->shownLayer().isEmpty());
    QVERIFY(view->plot()->isHidden());
    // Of several selected nodes, the first with attention; the Evaluate node that recorded it offers all.
    QVERIFY(p_->showAttention({"train", "block1"}));
    QCOMPARE(view->shownLayer(), QString("block1/attn"));
    QVERIFY(p_->showAttention({"test"}));
    QCOMPARE(view->layerSelector()->count(), 3);
  }

  void withoutAttentionTheTabSaysWhichParamToTurnOn() {
    editor::AttentionView* view = p_->attentionView();
    QVERIFY(view->headerText().contains("attention param"));  // before any run
    p_->setEvaluations({{"test", classifierEntry()}}, {"test"});
    QVERIFY2(view->headerText().startsWith("Evaluate node test recorded no attention weights: turn on its "
                                           "attention param"),
             qPrintable(view->headerText()));
    // Selecting a node changes nothing: the message stays, no pane is left empty.
    QVERIFY(!p_->showAttention({"block1/attn"}));
    QVERIFY(view->headerText().contains("turn on its attention param"));
    QVERIFY(view->plot()->isHidden());
    QVERIFY(!view->hasResults());
    p_->setEvaluations({{"train", QJsonObject{{"epochs", QJsonArray{}}}}}, {"train"});
    QVERIFY2(view->headerText().startsWith("No Evaluate node finished in the last run"),
             qPrintable(view->headerText()));
    QVERIFY(view->headerText().contains("attention param"));
    // A run that is under way says so.
    p_->beginRun("#1", {"test"});
    QVERIFY(view->headerText().startsWith("Running"));
  }

  void aTextSampleNamesItsTokensOnTheAxes() {
    QJsonObject entry = languageModelEntry();
    const QStringList tokens{"t", "h", "e", " ", "c", "a", "t", "\n"};
    QJsonArray tokenArray;
    for (const QString& t : tokens) tokenArray.append(t);
    entry.insert("attention",
                 QJsonObject{{"sample", 0},
                             {"tokens", tokenArray},
                             {"layers", QJsonArray{attentionLayer("block1/attn", 2, 8, 8, true)}}});
    p_->setEvaluations({{"test", entry}}, {"test"});
    editor::AttentionView* view = p_->attentionView();
    p_->setCurrentWidget(view);
    QVERIFY(p_->showAttention({"block1/attn"}));
    QTRY_VERIFY(view->plot()->isVisible());
    QVERIFY2(view->headerText().contains("causal"), qPrintable(view->headerText()));
    QVERIFY(view->headerText().contains("The sample: “the cat"));
    QVERIFY(!view->overlay()->isVisible());  // no image, no patches
    // Eight steps in a 1200-pixel-wide tab: a token per cell, whitespace made visible.
    QVERIFY(view->tokenLabelsShown());
    const QStringList shown{"t", "h", "e", "␣", "c", "a", "t", "↵"};
    QCOMPARE(tickLabels(view->headMaps()[0]->keyAxis()), shown);
    QCOMPARE(tickLabels(view->headMaps()[0]->valueAxis()), shown);
    // A masked key holds no weight.
    QCOMPARE(view->headMaps()[1]->data()->cell(5, 2), 0.0);
  }

  void anAttentionLayersNodePreviewsItsWeights() {
    const QJsonObject entry = vitEntry();
    const QJsonObject report{
        {"nodes", QJsonObject{{"test", entry}, {"block1/attn", QJsonObject{{"status", "ok"}}}}}};
    const QJsonObject nodes = editor::withAttentionOnLayers(report)["nodes"].toObject();
    // The layer's node and each block holding it carry its weights; the Evaluate node keeps its own field.
    QCOMPARE(nodes["block1/attn"]["status"].toString(), QString("ok"));
    QCOMPARE(nodes["block1/attn"]["attention"]["layers"].toArray().size(), 1);
    QCOMPARE(nodes["block1"]["attention"]["layers"].toArray().size(), 1);
    QCOMPARE(nodes["block2"]["attention"]["layers"].toArray().size(), 2);
    QCOMPARE(nodes["block2/inner"]["attention"]["layers"].toArray().size(), 1);
    QCOMPARE(nodes["test"], QJsonValue(entry));

    using editor::NodePreview;
    const NodePreview p = NodePreview::fromReport("attn", nodes["block1/attn"].toObject(), {});
    QCOMPARE(p.kind, NodePreview::Kind::Heatmap);
    QCOMPARE(p.rows, 5);
    QCOMPARE(p.cols, 5);
    const QJsonObject layer = entry["attention"]["layers"][0].toObject();
    for (int q = 0; q < 5; ++q)
      for (int k = 0; k < 5; ++k)
        QVERIFY(std::abs(p.values[q * 5 + k] - (weightOf(layer, 0, q, k) + weightOf(layer, 1, q, k)) / 2) <
                1e-12);
    QVERIFY2(p.caption.startsWith("attn 5×5 · mean of 2 heads"), qPrintable(p.caption));
    QVERIFY(NodePreview::fromReport("block2", nodes["block2"].toObject(), {}).caption.endsWith("1 of 2"));
    // The Evaluate node still previews its accuracy.
    QCOMPARE(NodePreview::fromReport("test", entry, {}).kind, NodePreview::Kind::Accuracy);
    // A long sequence is averaged down to a grid the preview can draw.
    const QJsonObject longEntry{
        {"attention", QJsonObject{{"layers", QJsonArray{attentionLayer("attn", 1, 130, 130)}}}}};
    const NodePreview pooled = NodePreview::fromReport("attn", longEntry, {});
    QCOMPARE(pooled.rows, 44);  // 130 steps in blocks of 3
    QVERIFY(pooled.caption.contains("(44×44)"));
  }

  void thePredictionsTabExportsAsPngAndSvg() {
    p_->setEvaluations({{"reg", regressionEntry(200, 400, 4, 300)}}, {"reg"});
    editor::PredictionsView* view = p_->predictionsView();
    p_->setCurrentWidget(view);
    QTRY_VERIFY(view->seriesPlot()->isVisible());
    QTemporaryDir dir;
    QString error;
    const QString png = dir.filePath("predictions.png");
    QVERIFY2(p_->exportVisible(png, &error), qPrintable(error));
    QCOMPARE(QImage(png).size(), view->size());
    const QString svg = dir.filePath("predictions.svg");
    QVERIFY2(p_->exportVisible(svg, &error), qPrintable(error));
    QFile f(svg);
    QVERIFY(f.open(QIODevice::ReadOnly));
    QXmlStreamReader xml(&f);
    QString text;
    while (!xml.atEnd()) {
      xml.readNext();
      if (xml.isCharacters()) text += xml.text();
    }
    QVERIFY2(!xml.hasError(), qPrintable(xml.errorString()));
    // The header is text in the picture.
    QVERIFY2(text.contains("Evaluate node reg"), qPrintable(text.left(300)));
  }
};

class TestResultsViews : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;
  QJsonObject report_;
  QStringList finished_;  // nodes in the order the UI saw them finish

  QJsonObject node(const QString& id) const { return report_["nodes"].toObject()[id].toObject(); }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
    w_ = std::make_unique<MainWindow>(&registry_);
    w_->setPromptHandler([](auto...) { return QMessageBox::Discard; });
    w_->resize(1400, 900);
    w_->show();
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    core::GraphDocument* doc = w_->document();
    // Two short epochs on 1,500 images: seconds on two cores; the trained model still makes mistakes.
    doc->setParam("data", "limit", 1500);
    doc->setParam("data", "batch_size", 100);
    if (!QFileInfo::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      doc->setParam("data", "name", "synthetic");
    doc->setParam("train", "epochs", 2);
    doc->setParam("train", "log_every", 5);
    doc->setParam("train", "schedule", "cosine");
    doc->setParam("untrained", "mistakes_shown", 20);
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [this](const QList<core::RunEvent>& ev) {
          for (const core::RunEvent& e : ev)
            if (e.kind == core::RunEvent::Kind::NodeFinished) finished_ << e.node;
        });
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 300000);
    disconnect(c);
    QCOMPARE(w_->runStateText(), QString("Done"));
    report_ = w_->runner()->report();
  }

  void cleanupTestCase() { w_.reset(); }

  void the_last_evaluation_to_finish_shows() {
    editor::PlotsPanel* plots = w_->plots();
    QVERIFY(tabOf(plots, "Confusion") >= 0 && tabOf(plots, "Mistakes") >= 0);
    QCOMPARE(plots->widget(tabOf(plots, "Confusion")), static_cast<QWidget*>(plots->confusionView()));
    QCOMPARE(plots->widget(tabOf(plots, "Mistakes")), static_cast<QWidget*>(plots->mistakesView()));
    QStringList evals;
    for (const QString& n : finished_)
      if (n == "test" || n == "untrained") evals << n;
    QCOMPARE(evals.size(), 2);
    QCOMPARE(plots->evaluations(), evals);
    QCOMPARE(plots->shownEvaluation(), evals.last());
    QVERIFY(plots->confusionView()->headerText().contains("Evaluate node " + evals.last()));
    QVERIFY(plots->mistakesView()->headerText().contains("Evaluate node " + evals.last()));
  }

  void the_attention_tab_says_which_param_to_turn_on() {
    // Neither Evaluate node records attention here: the tab names them and the param, whatever is selected.
    editor::AttentionView* view = w_->plots()->attentionView();
    QVERIFY2(view->headerText().contains("recorded no attention weights: turn on one's attention param"),
             qPrintable(view->headerText()));
    QVERIFY(view->headerText().contains("test") && view->headerText().contains("untrained"));
    w_->scene()->selectNodes({"train"});
    QVERIFY(view->headerText().contains("attention param"));
    QVERIFY(view->plot()->isHidden());
    w_->scene()->selectNodes({"test"});
    QVERIFY(view->headerText().contains("attention param"));
    QVERIFY(!view->hasResults());
  }

  void the_heatmap_holds_the_confusion_matrix() {
    editor::PlotsPanel* plots = w_->plots();
    w_->scene()->selectNodes({"test"});
    QCOMPARE(plots->shownEvaluation(), QString("test"));
    editor::ConfusionView* view = plots->confusionView();
    QVERIFY(view->headerText().contains("Evaluate node test (test split)"));
    QVERIFY(view->headerText().contains(QString("%L1 samples").arg(1500)));
    const QJsonObject n = node("test");
    const QJsonArray confusion = n["confusion"].toArray(), perClass = n["per_class"].toArray();
    QCOMPARE(confusion.size(), 10);
    QCPColorMapData* data = view->colorMap()->data();
    QCOMPARE(data->keySize(), 10);
    QCOMPARE(data->valueSize(), 10);
    for (int t = 0; t < 10; ++t) {
      const QJsonArray row = confusion[t].toArray();
      double rowSum = 0;
      for (const QJsonValue& c : row) rowSum += c.toDouble();
      for (int p = 0; p < 10; ++p) {
        QCOMPARE(view->cellText(t, p), QString::number(row[p].toInteger()));
        // Colour by the share of the true class: the row sums to 1.
        QCOMPARE(data->cell(p, t), rowSum > 0 ? row[p].toDouble() / rowSum : 0.0);
      }
    }
    QStringList names;
    for (const QJsonValue& v : n["class_names"].toArray()) names << v.toString();
    QCOMPARE(tickLabels(view->plot()->xAxis), names);
    QCOMPARE(tickLabels(view->plot()->yAxis), names);
    if (n["class_names"].toArray()[9].toString() != "class 9") QCOMPARE(names[9], QString("ankle boot"));
    const QStringList acc = tickLabels(view->plot()->yAxis2);
    QCOMPARE(acc.size(), 10);
    for (int t = 0; t < 10; ++t)
      QCOMPARE(acc[t], perClass[t].isNull() ? QString("–")
                                            : QString::number(100 * perClass[t].toDouble(), 'f', 1) + "%");
    // True class 0 is at the top, as a matrix is read.
    QVERIFY(view->plot()->yAxis->rangeReversed());

    // Another Evaluate selected: its matrix; a node that is no Evaluate changes nothing.
    w_->scene()->selectNodes({"untrained"});
    QCOMPARE(plots->shownEvaluation(), QString("untrained"));
    QVERIFY(view->headerText().contains("Evaluate node untrained"));
    const QJsonArray other = node("untrained")["confusion"].toArray();
    QCOMPARE(view->cellText(3, 4), QString::number(other[3].toArray()[4].toInteger()));
    w_->scene()->selectNodes({"data"});
    QCOMPARE(plots->shownEvaluation(), QString("untrained"));
    w_->scene()->selectNodes({"test"});
  }

  void the_mistakes_grid_and_a_click_on_one() {
    editor::PlotsPanel* plots = w_->plots();
    QCOMPARE(plots->shownEvaluation(), QString("test"));
    editor::MistakesView* view = plots->mistakesView();
    w_->findChild<QDockWidget*>("plotsDock")->raise();
    plots->setCurrentWidget(view);
    QTest::qWait(50);
    const QJsonObject n = node("test");
    const QJsonArray mistakes = n["mistakes"].toArray();
    const QJsonArray names = n["class_names"].toArray();
    QCOMPARE(qint64(mistakes.size()), std::min<qint64>(48, n["mistakes_total"].toInteger()));
    QVERIFY2(mistakes.size() >= 3, "the trained model should still make a few mistakes on 1,500 images");
    QListWidget* grid = view->grid();
    QCOMPARE(grid->count(), mistakes.size());
    for (int i = 0; i < grid->count(); ++i) {
      const QJsonObject m = mistakes[i].toObject();
      const QString want =
          QString("%1 → %2  p=%3")
              .arg(names[m["true"].toInt()].toString(), names[m["predicted"].toInt()].toString())
              .arg(captionProbability(m["confidence"].toDouble()));
      QCOMPARE(grid->item(i)->text(), want);
      // 28x28 scaled by a whole factor (3) to stay crisp.
      QCOMPARE(grid->item(i)->icon().availableSizes().value(0), QSize(84, 84));
    }
    QVERIFY(view->headerText().contains(QString("of %L1 mistakes").arg(n["mistakes_total"].toInteger())));
    QCOMPARE(view->top5Table()->rowCount(), 0);
    QVERIFY(view->detailText().startsWith("Click an image"));

    // A click on the third image shows its top 5 beside the grid.
    const int row = 2;
    grid->scrollToItem(grid->item(row));
    const QRect r = grid->visualItemRect(grid->item(row));
    QVERIFY(grid->viewport()->rect().contains(r.center()));
    QTest::mouseClick(grid->viewport(), Qt::LeftButton, {}, r.center());
    const QJsonObject m = mistakes[row].toObject();
    const QJsonArray top5 = m["top5"].toArray();
    QTableWidget* table = view->top5Table();
    QTRY_COMPARE(table->rowCount(), top5.size());
    QCOMPARE(top5.size(), 5);
    for (int i = 0; i < top5.size(); ++i) {
      const int cls = top5[i].toArray()[0].toInt();
      QVERIFY2(table->item(i, 0)->text().startsWith(names[cls].toString()),
               qPrintable(table->item(i, 0)->text()));
      QCOMPARE(table->item(i, 1)->text(), QString::number(top5[i].toArray()[1].toDouble(), 'f', 3));
    }
    QVERIFY(table->item(0, 0)->text().endsWith("(predicted)"));
    QVERIFY(view->detailText().contains("true: " + names[m["true"].toInt()].toString()));
    QVERIFY(view->detailText().contains("predicted: " + names[m["predicted"].toInt()].toString()));
    QVERIFY(view->detailText().contains(QString("Sample %1").arg(m["index"].toInteger())));

    // Exporting the visible tab writes the view as a picture.
    QTemporaryDir dir;
    const QString png = dir.filePath("mistakes.png");
    QVERIFY(w_->exportPlot(png));
    QCOMPARE(QImage(png).size(), view->size());
  }

  void the_training_plot_marks_epochs_and_the_learning_rate() {
    editor::PlotsPanel* plots = w_->plots();
    QCOMPARE(plots->epochMarks(), (QList<double>{1.0, 2.0}));
    QCustomPlot* p = plots->metricsPlot();
    // The cosine schedule varies the rate: it gets a pane of its own, from zero to above its start (0.1).
    QCOMPARE(plots->trainingPanes(), (QStringList{"loss", "accuracy", "images/s", "learning rate"}));
    QCPGraph* lr = plots->metricGraph("train.lr");
    QVERIFY2(lr, "no curve for train.lr");
    QCOMPARE(lr->valueAxis(), plots->learningRateAxis());
    QCOMPARE(plots->learningRateAxis()->axisRect(), plots->paneRect(editor::MetricPane::LearningRate));
    QVERIFY(plots->learningRateAxis()->visible());
    QCOMPARE(plots->learningRateAxis()->range().lower, 0.0);
    QVERIFY(plots->learningRateAxis()->range().upper >= 0.1);
    bool found = false;
    QVERIFY(lr->data()->valueRange(found).lower < 0.1);  // it did fall
    // One faint line per epoch in each of the four panes, and one label per epoch.
    QCOMPARE(p->itemCount(), 2 * 4 + 2);
  }
};

// Two suites in one binary: the fabricated entries need no node set, so they run where the run cannot.
int main(int argc, char** argv) {
  QApplication app(argc, argv);
  app.setAttribute(Qt::AA_Use96Dpi, true);
  QTEST_SET_MAIN_SOURCE_PATH
  TestEvaluationKinds fabricated;
  const int fabricatedFailures = QTest::qExec(&fabricated, argc, argv);
  TestResultsViews run;
  return fabricatedFailures + QTest::qExec(&run, argc, argv);
}
#include "test_results_views.moc"
