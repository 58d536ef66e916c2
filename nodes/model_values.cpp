#include "model_values.h"

#include <QStringList>
#include <algorithm>

#include "gpunodes/errors.h"
#include "node_util.h"

namespace gn::nodes {

QString ModelValue::summary() const {
  return QString("%1 on %2 (%3 parameters)")
      .arg(qs(model_->signature()), qs(model_->device().str()))
      .arg(model_->parameter_count());
}

qint64 ModelValue::bytes() const {
  qint64 total = 0;
  for (const nn::Parameter* p : std::as_const(*model_).state()) total += p->value.bytes() + p->grad.bytes();
  return total;
}

qint64 DatasetValue::bytes() const {
  auto size = [](const nn::DatasetPtr& d) { return d ? qint64(d->images.size() + d->labels.size()) : 0; };
  // The splits may be one set (a node that loads only one split hands it on both ways): counted once.
  return size(spec_.train) + (spec_.test == spec_.train ? 0 : size(spec_.test));
}

int64_t DatasetValue::side() const {
  if (spec_.resize > 0) return spec_.resize;
  const nn::DatasetPtr& d = spec_.train ? spec_.train : spec_.test;
  return d ? d->height : 0;
}

int64_t DatasetValue::channels() const {
  const nn::DatasetPtr& d = spec_.train ? spec_.train : spec_.test;
  return d ? d->channels : 0;
}

DataShape DatasetValue::shape() const {
  DataShape d;
  const nn::DatasetPtr& set = anySplit();
  if (!set) return d;
  d.classes = set->classes;
  d.regression = set->regression;
  d.target = set->target_dims();
  if (set->has_values()) {
    d.sample = set->sample_dims();
    d.kind = spec_.name;
  } else {
    d.sample = {set->channels, side(), side()};
    d.kind = "images";
  }
  return d;
}

QString DatasetValue::summary() const {
  QStringList parts;
  if (spec_.train) parts.append(QString("train %1").arg(spec_.train->count));
  if (spec_.test) parts.append(QString("test %1").arg(spec_.test->count));
  if (spec_.train && spec_.train->transform.augments()) parts.append("augmented");
  const nn::DatasetPtr& d = spec_.train ? spec_.train : spec_.test;
  if (d && d->transform.normalizes()) parts.append("normalized");
  if (d && d->has_values()) {
    const QString what = spec_.name == "text" ? QString("windows of %1 tokens, vocabulary %2")
                                                    .arg(d->sample_dims().empty() ? 0 : d->sample_dims()[0])
                                                    .arg(d->classes)
                         : d->regression ? QString("%1 values per sample, regression").arg(d->sample_numel())
                                         : QString("%1 values per sample, %2 classes").arg(d->sample_numel()).arg(d->classes);
    return QString("%1: %2, %3, batch %4").arg(spec_.name, parts.join(", "), what).arg(spec_.batchSize);
  }
  return QString("%1: %2, %3x%4x%4, batch %5")
      .arg(spec_.name, parts.join(", "))
      .arg(channels())
      .arg(side())
      .arg(spec_.batchSize);
}

std::shared_ptr<const ModelValue> modelInput(const core::NodeContext& ctx, const QString& port) {
  core::PortValuePtr v = ctx.input(port);
  if (!v) throw Error(("input " + port + " is not connected").toStdString());
  auto model = std::dynamic_pointer_cast<const ModelValue>(v);
  if (!model) throw Error(("input " + port + " carries " + v->summary() + ", not a model").toStdString());
  return model;
}

std::shared_ptr<const DatasetValue> datasetInput(const core::NodeContext& ctx, const QString& port) {
  core::PortValuePtr v = ctx.input(port);
  if (!v) throw Error(("input " + port + " is not connected").toStdString());
  auto data = std::dynamic_pointer_cast<const DatasetValue>(v);
  if (!data) throw Error(("input " + port + " carries " + v->summary() + ", not a dataset").toStdString());
  return data;
}

nn::ModelOptions modelOptionsOf(const QJsonObject& p) {
  nn::ModelOptions o;
  o.arch = nn::parse_arch(p["arch"].toString().toStdString());
  o.classes = p["classes"].toInteger();
  o.in_channels = p["in_channels"].toInteger();
  o.image_size = p["image_size"].toInteger();
  o.init = nn::parse_init(p["init"].toString().toStdString());
  o.init_std = static_cast<float>(p["init_std"].toDouble());
  o.seed = static_cast<uint64_t>(p["seed"].toInteger());
  return o;
}

QString imageMismatch(const nn::ModelOptions& m, int64_t channels, int64_t side) {
  if (m.arch == nn::Arch::Network) {
    const Shape in = m.network->input().shape, out = m.network->infer().back().out;
    if (in != Shape{channels, side, side})
      return QString(
                 "the network's Input is %1, but the dataset gives %2x%3x%3 images (set the Input's shape "
                 "to [%2, %3, %3], or the Dataset's resize)")
          .arg(qs(shape_str(in)))
          .arg(channels)
          .arg(side);
    if (out.size() != 1)
      return QString(
                 "the network ends in %1 per image, not in [classes] scores: end it with Flatten and Linear")
          .arg(qs(shape_str(out)));
    return {};
  }
  const QString arch = nn::arch_name(m.arch);
  if (m.arch == nn::Arch::Linear)
    return QString("a linear model takes [N, %1] tensors, not %2x%3x%3 images: use mlp, lenet or resnet18")
        .arg(m.in_channels)
        .arg(channels)
        .arg(side);
  if (m.in_channels != channels)
    return QString(
               "the %1 model takes %2-channel images, but the dataset's have %3 channel%4 (set the "
               "Model's in_channels to %3)")
        .arg(arch)
        .arg(m.in_channels)
        .arg(channels)
        .arg(channels == 1 ? "" : "s");
  if (m.arch != nn::Arch::ResNet18 && m.image_size != side)
    return QString(
               "the %1 model is built for %2x%2 images, but the dataset gives %3x%3 (set the Model's "
               "image_size to %3, or the Dataset's resize to %2)")
        .arg(arch)
        .arg(m.image_size)
        .arg(side);
  return {};
}

namespace {

QString bracketed(const Shape& s) {
  QStringList d;
  for (int64_t v : s) d.append(QString::number(v));
  return "[" + d.join(", ") + "]";
}

// The model's output per sample.
Shape outputPerSample(const nn::ModelOptions& m) {
  if (m.arch == nn::Arch::Network) return m.network->infer().back().out;
  return {m.classes};
}

}  // namespace

QString dataMismatch(const nn::ModelOptions& m, const DataShape& data) {
  if (data.sample.empty()) return {};
  if (data.images()) return imageMismatch(m, data.sample[0], data.sample[1]);
  if (m.arch != nn::Arch::Network)
    return QString("the %1 model takes images, and the %2 dataset gives %3 values per sample: draw a Network "
                   "from an Input of shape %4")
        .arg(nn::arch_name(m.arch), data.kind)
        .arg(checked_numel(data.sample))
        .arg(bracketed(data.sample));
  const Shape& in = m.network->input().shape;
  if (in != data.sample)
    return QString("the network's Input is %1, but the %2 dataset gives samples of %3 (set the Input's shape to "
                   "%3)")
        .arg(bracketed(in), data.kind, bracketed(data.sample));
  return {};
}

QString targetMismatch(const nn::ModelOptions& m, const DataShape& data, nn::LossKind loss) {
  if (data.kind.isEmpty() || !data.targetsKnown) return {};
  const QString lossName = nn::loss_kind_name(loss);
  if (data.regression && !nn::is_regression(loss))
    return QString("the %1 dataset's targets are values to predict (a regression), but the loss is %2: set Train's "
                   "loss to mse, l1 or huber")
        .arg(data.kind, lossName);
  if (!data.regression && nn::is_regression(loss))
    return QString("the %1 dataset's targets are classes, but the loss is %2, a regression loss: set Train's loss "
                   "to cross_entropy")
        .arg(data.kind, lossName);
  const Shape out = outputPerSample(m);
  if (data.regression) {
    const int64_t want = data.target.empty() ? 1 : checked_numel(data.target);
    if (checked_numel(out) != want)
      return QString("a regression predicts %1 value%2 per sample, but the model gives %3: end the network with a "
                     "Linear of out_features %1")
          .arg(want)
          .arg(want == 1 ? "" : "s")
          .arg(bracketed(out));
    return {};
  }
  const int64_t classes = out.empty() ? 0 : out.back();
  if (data.target.size() == 1) {  // a target per step: a language model
    const int64_t steps = data.target[0];
    if (out.size() != 2 || out[0] != steps)
      return QString("the %1 dataset has a target token for each of %2 steps, so the network must end in [%2, "
                     "vocabulary] scores (a Linear after the recurrent layer, on every step), but it ends in %3")
          .arg(data.kind)
          .arg(steps)
          .arg(bracketed(out));
  } else if (out.size() != 1) {
    return QString("the network ends in %1 per sample, not in [classes] scores: end it with a Linear (after a "
                   "Flatten or a LastStep)")
        .arg(bracketed(out));
  }
  if (data.classes > 0 && classes < data.classes)
    return QString("the model gives %1 scores per %2, but the %3 dataset has %4 %5: set the last Linear's "
                   "out_features (or the Model's classes) to %4")
        .arg(classes)
        .arg(data.target.size() == 1 ? "step" : "sample")
        .arg(data.kind)
        .arg(data.classes)
        .arg(data.target.size() == 1 ? "tokens in its vocabulary" : "classes");
  return {};
}

QString inputMismatch(const nn::ModelOptions& m, const Shape& shape) {
  const QString arch = nn::arch_name(m.arch);
  const QString got = qs(shape_str(shape));
  if (m.arch == nn::Arch::Network) {
    const Shape& want = m.network->input().shape;
    if (shape.size() == want.size() + 1 && shape[0] >= 1 && Shape(shape.begin() + 1, shape.end()) == want)
      return {};
    QString expect = "[N";
    for (int64_t d : want) expect += QString(", %1").arg(d);
    return QString("the network takes %1] tensors (its Input's shape), got %2").arg(expect, got);
  }
  if (m.arch == nn::Arch::Linear) {
    if (shape.size() == 2 && shape[0] >= 1 && shape[1] == m.in_channels) return {};
    return QString("the linear model takes [N, %1] tensors, got %2").arg(m.in_channels).arg(got);
  }
  const bool anySize = m.arch == nn::Arch::ResNet18;
  if (shape.size() == 4 && shape[0] >= 1 && shape[1] == m.in_channels &&
      (anySize || (shape[2] == m.image_size && shape[3] == m.image_size)))
    return {};
  if (anySize)
    return QString("the %1 model takes [N, %2, H, W] images, got %3").arg(arch).arg(m.in_channels).arg(got);
  return QString("the %1 model takes [N, %2, %3, %3] images, got %4")
      .arg(arch)
      .arg(m.in_channels)
      .arg(m.image_size)
      .arg(got);
}

void reportModel(core::NodeContext& ctx, const nn::Model& m) {
  ctx.reportField("signature", qs(m.signature()));
  ctx.reportField("device_of_model", qs(m.device().str()));
  ctx.reportField("parameter_count", static_cast<double>(m.parameter_count()));
  ctx.reportField("parameters", describeJson(m));
}

QJsonArray describeJson(const nn::Model& model) {
  QJsonArray out;
  for (const nn::ParameterInfo& p : model.describe()) {
    QJsonArray shape;
    for (int64_t d : p.shape) shape.append(static_cast<double>(d));
    out.append(QJsonObject{
        {"name", qs(p.name)}, {"shape", shape}, {"device", qs(p.device.str())}, {"trainable", p.trainable}});
  }
  return out;
}

nn::DatasetPtr sliceDataset(const nn::DatasetPtr& data, int64_t begin, int64_t end, const std::string& name) {
  begin = std::clamp<int64_t>(begin, 0, data->count);
  end = std::clamp<int64_t>(end, begin, data->count);
  auto d = std::make_shared<nn::Dataset>();
  d->name = name;
  d->count = end - begin;
  d->channels = data->channels, d->height = data->height, d->width = data->width;
  d->classes = data->classes;
  d->class_names = data->class_names;
  d->transform = data->transform;
  const int64_t numel = data->sample_numel();
  d->images.assign(data->images.begin() + begin * numel, data->images.begin() + end * numel);
  d->labels.assign(data->labels.begin() + begin, data->labels.begin() + end);
  return d;
}

}  // namespace gn::nodes
