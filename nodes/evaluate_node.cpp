// Evaluate: a trained model's accuracy on a split of a dataset, with the confusion matrix, per-class accuracy
// and the mistakes it made, for the editor's Confusion and Mistakes views.
#include <QBuffer>
#include <QImage>
#include <algorithm>
#include <cmath>

#include "gpunodes/errors.h"
#include "gpunodes/nn/predict.h"
#include "gpunodes/nn/trainer.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

// A NaN (a class without samples, a model gone to NaN) is null in the report, which JSON can carry.
QJsonValue number(double v) {
  return std::isfinite(v) ? QJsonValue(v) : QJsonValue(QJsonValue::Null);
}

// Sample `index` as stored (bytes, at the dataset's own size, before any resize or normalisation) as a base64
// PNG: RGB for three channels, otherwise grey from the first channel.
QString samplePng(const nn::Dataset& d, int64_t index) {
  const int w = static_cast<int>(d.width), h = static_cast<int>(d.height);
  const int64_t plane = d.height * d.width;
  const uint8_t* src = d.images.data() + index * d.sample_numel();
  const bool rgb = d.channels == 3;
  QImage img(w, h, rgb ? QImage::Format_RGB888 : QImage::Format_Grayscale8);
  for (int y = 0; y < h; ++y) {
    uchar* line = img.scanLine(y);
    for (int x = 0; x < w; ++x) {
      const int64_t at = int64_t(y) * d.width + x;
      if (rgb)
        for (int c = 0; c < 3; ++c) line[3 * x + c] = src[c * plane + at];
      else
        line[x] = src[at];
    }
  }
  QByteArray png;
  QBuffer buffer(&png);
  buffer.open(QIODevice::WriteOnly);
  if (!img.save(&buffer, "PNG")) throw Error("could not encode sample " + std::to_string(index) + " as PNG");
  return QString::fromLatin1(png.toBase64());
}

class EvaluateNode final : public GpuNode {
 public:
  EvaluateNode()
      : GpuNode({
            .name = "Evaluate",
            .category = "Models",
            .description =
                "The model's accuracy on a split of the dataset, in evaluation mode (BatchNorm uses its "
                "running statistics), on the model's device: d2l's evaluate_accuracy_gpu. Also a point on "
                "the series <node>.accuracy. The same pass gives the report the confusion matrix (rows: true "
                "class, columns: predicted), the accuracy of each class, the class names and the first "
                "mistakes_shown mistakes, most confident first, each with its image and top-5 classes: the "
                "editor's Confusion and Mistakes tabs. On a text (a language model) it reports the "
                "accuracy of the next token and the perplexity; on a regression the MSE, MAE and R^2 with "
                "every prediction against its target, and for a series d2l 9.1's one-step and k-step-ahead "
                "predictions over the whole series.",
            .inputs = {inPort("model", PortType::Model, "The model."),
                       inPort("data", PortType::Dataset, "The data, read in its batch size.")},
            .outputs = {outPort("accuracy", PortType::Scalar,
                                "The fraction classified correctly (of next tokens, for a text); for a "
                                "regression the mean squared error.")},
            .params = {enumParam("split", {"test", "train"}, "test", "Which split to measure."),
                       intParam("mistakes_shown", 48, 0, 1000,
                                "How many of the mistakes (the most confident first) the report carries with "
                                "their images, for the Mistakes view; 0 for none."),
                       boolParam("attention", false,
                                 "Also report what every MultiheadAttention layer attends to for one sample of "
                                 "the split (its weights per head), for the editor's Attention view and "
                                 "scripts reading --report."),
                       intParam("attention_sample", 0, 0, 1 << 30,
                                "The sample whose attention is reported (its index in the split).")},
        }, Reuse::Pure) {}

  // The split must exist in the dataset, and the model must take its images.
  Outputs check(NodeCheck& check) const override {
    const Known model = check.inputOrUnknown("model"), data = check.inputOrUnknown("data");
    const QString split = check.params()["split"].toString();
    if (!(split == "train" ? data.hasTrain : data.hasTest))
      check.error("params.split",
                  "the dataset has no " + split + " split (set its split to both or " + split + ")");
    check.checkData(model, data);
    return {};
  }

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    auto data = datasetInput(ctx, "data");
    const DatasetSpec& ds = data->spec();
    const QString split = ctx.params()["split"].toString();
    const int64_t shown = ctx.params()["mistakes_shown"].toInteger();
    const nn::DatasetPtr& set = split == "train" ? ds.train : ds.test;
    if (!set || set->count == 0)
      throw Error(
          ("the dataset has no " + split + " split (set its split to both or " + split + ")").toStdString());
    const QString mismatch = dataMismatch(model->model().options(), data->shape());
    if (!mismatch.isEmpty()) throw Error(mismatch.toStdString());
    if (ctx.params()["attention"].toBool())
      reportAttention(ctx, *model, *set, set, ctx.params()["attention_sample"].toInteger(), ds.resize);
    if (set->regression) return evaluateRegression(ctx, *model, set, ds);
    if (set->target_numel() > 1) return evaluateLanguageModel(ctx, *model, set, ds);

    const nn::Predictions p = nn::predict(model->model(), set, ds.batchSize, ds.resize);
    const double accuracy = p.accuracy();
    const nn::ConfusionMatrix confusion = nn::confusion_matrix(p);
    const std::vector<double> perClass = nn::per_class_accuracy(confusion);
    const std::vector<std::string> names = nn::class_names(*set, p.classes);
    const int64_t wrong = p.count - p.correct();

    QJsonArray confusionJson, perClassJson, namesJson, mistakesJson;
    for (const auto& row : confusion) {
      QJsonArray r;
      for (int64_t n : row) r.append(static_cast<double>(n));
      confusionJson.append(r);
    }
    for (double a : perClass) perClassJson.append(number(a));
    for (const std::string& n : names) namesJson.append(qs(n));
    for (const nn::Mistake& m : nn::mistakes(p, shown)) {
      QJsonArray top5;
      for (const nn::ClassProbability& c : m.top5)
        top5.append(QJsonArray{static_cast<double>(c.cls), number(c.p)});
      mistakesJson.append(QJsonObject{{"index", static_cast<double>(m.index)},
                                      {"true", static_cast<double>(m.label)},
                                      {"predicted", static_cast<double>(m.predicted)},
                                      {"confidence", number(m.confidence)},
                                      {"top5", top5},
                                      {"image", set->has_values() ? QString() : samplePng(*set, m.index)}});
    }

    ctx.metric(ctx.nodeId() + ".accuracy", model->epochsTrained(), accuracy);
    ctx.reportField("task", "classification");
    ctx.reportField("accuracy", accuracy);
    ctx.reportField("samples", static_cast<double>(set->count));
    ctx.reportField("split", split);
    ctx.reportField("confusion", confusionJson);
    ctx.reportField("per_class", perClassJson);
    ctx.reportField("class_names", namesJson);
    ctx.reportField("mistakes", mistakesJson);
    ctx.reportField("mistakes_total", static_cast<double>(wrong));
    ctx.setOutput("accuracy", std::make_shared<ScalarValue>(std::vector<double>{accuracy}));
  }

 private:
  // report.attention: the sample (its image, or its tokens), and each attention layer's weights per head.
  static void reportAttention(core::NodeContext& ctx, const ModelValue& model, const nn::Dataset& set,
                              const nn::DatasetPtr& ptr, int64_t index, int64_t resize) {
    if (index >= set.count)
      throw Error("attention_sample " + std::to_string(index) + " is past the split's " +
                  std::to_string(set.count) + " samples");
    QJsonArray layers;
    for (const nn::AttentionMap& m : nn::attention_maps(model.model(), ptr, index, resize)) {
      QJsonArray w;
      for (float v : m.weights) w.append(static_cast<double>(v));
      layers.append(QJsonObject{{"layer", qs(m.layer)},
                                {"heads", static_cast<double>(m.heads)},
                                {"queries", static_cast<double>(m.queries)},
                                {"keys", static_cast<double>(m.keys)},
                                {"weights", w}});
    }
    QJsonObject a{{"sample", static_cast<double>(index)}, {"layers", layers}};
    if (!set.has_values()) {
      a.insert("image", samplePng(set, index));
      a.insert("label", static_cast<double>(set.labels[static_cast<size_t>(index)]));
    } else if (!set.vocabulary.empty()) {
      QJsonArray tokens;
      const int64_t n = set.sample_numel();
      for (int64_t t = 0; t < n; ++t) {
        const auto id = static_cast<size_t>(set.values[static_cast<size_t>(index * n + t)]);
        tokens.append(id < set.vocabulary.size() ? qs(set.vocabulary[id]) : QStringLiteral("?"));
      }
      a.insert("tokens", tokens);
    }
    ctx.reportField("attention", a);
  }

  // The next token's accuracy and d2l's perplexity (exp of the mean per-token cross-entropy).
  static void evaluateLanguageModel(core::NodeContext& ctx, const ModelValue& model, const nn::DatasetPtr& set,
                                    const DatasetSpec& ds) {
    const QString target = targetMismatch(model.model().options(), DataShape{set->sample_dims(), set->target_dims(),
                                                                              set->classes, false, "text"},
                                          nn::LossKind::CrossEntropy);
    if (!target.isEmpty()) throw Error(target.toStdString());
    const nn::EvalMetrics m = nn::evaluate_metrics(model.model(), set, nn::LossKind::CrossEntropy, ds.batchSize);
    ctx.metric(ctx.nodeId() + ".accuracy", model.epochsTrained(), m.accuracy);
    ctx.metric(ctx.nodeId() + ".perplexity", model.epochsTrained(), m.perplexity);
    ctx.reportField("task", "language_model");
    ctx.reportField("accuracy", m.accuracy);
    ctx.reportField("perplexity", m.perplexity);
    ctx.reportField("loss", m.loss);
    ctx.reportField("samples", static_cast<double>(set->count));
    ctx.reportField("split", ctx.params()["split"].toString());
    ctx.setOutput("accuracy", std::make_shared<ScalarValue>(std::vector<double>{m.accuracy}));
  }

  // MSE, MAE and R^2 from every prediction (float64 on the host), the points for the editor's scatter, and
  // for a series d2l's one-step and k-step-ahead predictions.
  static void evaluateRegression(core::NodeContext& ctx, const ModelValue& model, const nn::DatasetPtr& set,
                                 const DatasetSpec& ds) {
    const QString target = targetMismatch(model.model().options(), DataShape{set->sample_dims(), set->target_dims(),
                                                                              1, true, ds.name},
                                          nn::LossKind::Mse);
    if (!target.isEmpty()) throw Error(target.toStdString());
    const std::vector<float> predicted = nn::predict_values(model.model(), set, ds.batchSize);
    const std::vector<float>& truth = set->targets;
    const size_t n = std::min(predicted.size(), truth.size());
    double mean = 0, sse = 0, sae = 0, sst = 0;
    for (size_t i = 0; i < n; ++i) mean += truth[i];
    mean /= static_cast<double>(std::max<size_t>(n, 1));
    QJsonArray trueJson, predictedJson;
    constexpr size_t kPoints = 5000;  // enough to see the cloud; the numbers use every point
    for (size_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(predicted[i]) - truth[i];
      sse += e * e;
      sae += std::abs(e);
      sst += (truth[i] - mean) * (truth[i] - mean);
      if (i < kPoints) {
        trueJson.append(truth[i]);
        predictedJson.append(number(predicted[i]));
      }
    }
    const double mse = sse / static_cast<double>(n), mae = sae / static_cast<double>(n);
    const double r2 = sst > 0 ? 1 - sse / sst : NAN;
    ctx.metric(ctx.nodeId() + ".mse", model.epochsTrained(), mse);
    ctx.reportField("task", "regression");
    ctx.reportField("samples", static_cast<double>(set->count));
    ctx.reportField("split", ctx.params()["split"].toString());
    ctx.reportField("loss", mse);
    ctx.reportField("mse", mse);
    ctx.reportField("mae", mae);
    ctx.reportField("r2", number(r2));
    ctx.reportField("predictions", QJsonObject{{"true", trueJson}, {"predicted", predictedJson}});
    if (set->series) {
      // The test split's first target is where training data ends: the k-step prediction starts there.
      const int64_t trainEnd = ds.test ? ds.test->series_first : static_cast<int64_t>(set->series->size());
      const nn::SeriesPredictions sp = nn::predict_series(model.model(), *set, trainEnd);
      QJsonArray values, one, k;
      for (float v : *set->series) values.append(v);
      for (double v : sp.one_step) one.append(number(v));
      for (double v : sp.k_step) k.append(number(v));
      ctx.reportField("series", QJsonObject{{"values", values},
                                            {"tau", static_cast<double>(set->sample_shape[0])},
                                            {"train_end", static_cast<double>(trainEnd)},
                                            {"one_step", one},
                                            {"k_step", k}});
    }
    ctx.setOutput("accuracy", std::make_shared<ScalarValue>(std::vector<double>{mse}));
  }
};

}  // namespace

core::NodeTypePtr makeEvaluateNode() {
  return std::make_shared<EvaluateNode>();
}

}  // namespace gn::nodes
