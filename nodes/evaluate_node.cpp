// Evaluate: a trained model's accuracy on a split of a dataset, with the confusion matrix, per-class accuracy
// and the mistakes it made, for the editor's Confusion and Mistakes views.
#include <QBuffer>
#include <QImage>
#include <cmath>

#include "gpunodes/errors.h"
#include "gpunodes/nn/predict.h"
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
                "editor's Confusion and Mistakes tabs.",
            .inputs = {inPort("model", PortType::Model, "The model."),
                       inPort("data", PortType::Dataset, "The data, read in its batch size.")},
            .outputs = {outPort("accuracy", PortType::Scalar, "The fraction classified correctly.")},
            .params = {enumParam("split", {"test", "train"}, "test", "Which split to measure."),
                       intParam("mistakes_shown", 48, 0, 1000,
                                "How many of the mistakes (the most confident first) the report carries with "
                                "their images, for the Mistakes view; 0 for none.")},
        }, Reuse::Pure) {}

  // The split must exist in the dataset, and the model must take its images.
  Outputs check(NodeCheck& check) const override {
    const Known model = check.inputOrUnknown("model"), data = check.inputOrUnknown("data");
    const QString split = check.params()["split"].toString();
    if (!(split == "train" ? data.hasTrain : data.hasTest))
      check.error("params.split",
                  "the dataset has no " + split + " split (set its split to both or " + split + ")");
    check.checkImages(model, data);
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
    const QString mismatch = imageMismatch(model->model().options(), data->channels(), data->side());
    if (!mismatch.isEmpty()) throw Error(mismatch.toStdString());

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
                                      {"image", samplePng(*set, m.index)}});
    }

    ctx.metric(ctx.nodeId() + ".accuracy", model->epochsTrained(), accuracy);
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
};

}  // namespace

core::NodeTypePtr makeEvaluateNode() {
  return std::make_shared<EvaluateNode>();
}

}  // namespace gn::nodes
