// The values on Model and Dataset wires, and what the training nodes share: reading them from inputs, and
// the checks that a model can take a dataset's images (used before the run and at run time alike).
#pragma once
#include <QJsonArray>
#include <QJsonObject>
#include <QString>
#include <memory>
#include <vector>

#include "gpunodes/core/node_type.h"
#include "gpunodes/nn/data.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/trainer.h"
#include "gpunodes/runtime.h"

namespace gn::nodes {

// A Model port's value: a model on one device. Values are never changed once made: Train trains a copy and
// outputs that, so the untrained model stays available to other branches (Evaluate before and after).
class ModelValue final : public core::PortValue {
 public:
  ModelValue(std::shared_ptr<Runtime> runtime, std::shared_ptr<nn::Model> model, double epochsTrained = 0)
      : runtime_(std::move(runtime)), model_(std::move(model)), epochsTrained_(epochsTrained) {}
  // Not const: forward() keeps per-call state. Nodes run one at a time on the executor's thread, so the
  // model is never used by two at once.
  nn::Model& model() const { return *model_; }
  const std::shared_ptr<Runtime>& runtime() const { return runtime_; }
  // Epochs of training behind these parameters: the x of an Evaluate's point on the training plot.
  double epochsTrained() const { return epochsTrained_; }
  QString summary() const override;
  qint64 bytes() const override;  // parameters, buffers and gradients

 private:
  // Declared first so that it is destroyed last: the model's tensors free their storage through it.
  std::shared_ptr<Runtime> runtime_;
  std::shared_ptr<nn::Model> model_;
  double epochsTrained_ = 0;
};

// What a dataset serves and what its targets are: what a model must take and give. Known on a Dataset wire
// before the run as far as the Dataset's params tell, and exactly from a DatasetValue.
struct DataShape {
  Shape sample;             // one sample as the loader hands it out (after resize); empty: not known yet
  Shape target;             // one target: {} a label or a value, {T} a token per step
  int64_t classes = 0;      // classes, or a text's vocabulary; 0: not known before the run (or regression)
  bool regression = false;  // targets are values to predict
  QString kind;             // "images", "text", "series", "table"
  bool targetsKnown = true; // false before the run where the rows decide the task (a table's auto)
  bool images() const { return kind == "images"; }
};

// A Dataset port's value: the training and test splits (either may be absent) and how to batch them.
struct DatasetSpec {
  QString name;          // "fashion-mnist", "synthetic", "image_folder", "text", "series", "table"
  nn::DatasetPtr train;  // null when the node loads only the test split; carries the augmentation
  nn::DatasetPtr test;   // null when the node loads only the training split; normalised like train, no more
  int64_t batchSize = 256;
  int64_t resize = 0;  // 0: images as stored (an image folder's are scaled when decoded, so it keeps 0)
  uint64_t shuffleSeed = 0;
};

class DatasetValue final : public core::PortValue {
 public:
  explicit DatasetValue(DatasetSpec spec) : spec_(std::move(spec)) {}
  const DatasetSpec& spec() const { return spec_; }
  // The image side the loader hands out (after resize) and the channels.
  int64_t side() const;
  int64_t channels() const;
  // The samples and targets (from the training split, else the test split).
  DataShape shape() const;
  // The split that is there: the training split, else the test split.
  const nn::DatasetPtr& anySplit() const { return spec_.train ? spec_.train : spec_.test; }
  QString summary() const override;
  qint64 bytes() const override;  // the splits' images and labels

 private:
  DatasetSpec spec_;
};

// The value on a Model / Dataset input; throws gn::Error when the input is open or carries something else.
std::shared_ptr<const ModelValue> modelInput(const core::NodeContext& ctx, const QString& port);
std::shared_ptr<const DatasetValue> datasetInput(const core::NodeContext& ctx, const QString& port);

// The Model node's params as runtime options; throws gn::Error naming a bad arch or init.
nn::ModelOptions modelOptionsOf(const QJsonObject& params);

// Why `model` cannot take images of channels x side x side; empty when it can. ResNet-18 ends in a global
// average pool and takes any size; the MLP and LeNet are built for one size; Linear takes no images.
QString imageMismatch(const nn::ModelOptions& model, int64_t channels, int64_t side);

// Why `model` cannot take the dataset's samples (imageMismatch for images; a drawn network's Input must be a
// value dataset's sample shape); empty when it can, or when the samples are not known yet.
QString dataMismatch(const nn::ModelOptions& model, const DataShape& data);
// Why the model's output cannot be trained with `loss` against the dataset's targets: the task (classes or
// values), the output's shape per sample ([classes], [T, vocab] for a target per step, one value per
// regression target) and too few classes; empty when it fits or is not known yet.
QString targetMismatch(const nn::ModelOptions& model, const DataShape& data, nn::LossKind loss);

// Why `model` cannot take a tensor of this shape (Forward); empty when it can.
QString inputMismatch(const nn::ModelOptions& model, const Shape& shape);

// Every parameter and buffer: [{name, shape, device, trainable}], the seed's net[0].weight.data.device.
QJsonArray describeJson(const nn::Model& model);
// The report fields of a node that makes or holds a model: signature, device, parameter count, parameters.
void reportModel(core::NodeContext& ctx, const nn::Model& model);

// Samples [begin, end) of a dataset, as a dataset of its own (the synthetic set's train/test split).
nn::DatasetPtr sliceDataset(const nn::DatasetPtr& data, int64_t begin, int64_t end, const std::string& name);

}  // namespace gn::nodes
