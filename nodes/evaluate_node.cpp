// Evaluate: a trained model's accuracy on a split of a dataset.
#include "gpunodes/errors.h"
#include "gpunodes/nn/trainer.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

class EvaluateNode final : public GpuNode {
 public:
  EvaluateNode()
      : GpuNode({
            .name = "Evaluate",
            .category = "Models",
            .description = "The model's accuracy on a split of the dataset, in evaluation mode (BatchNorm "
                           "uses its running statistics), on the model's device: d2l's "
                           "evaluate_accuracy_gpu. Also a point on the series <node>.accuracy.",
            .inputs = {inPort("model", PortType::Model, "The model."),
                       inPort("data", PortType::Dataset, "The data, read in its batch size.")},
            .outputs = {outPort("accuracy", PortType::Scalar, "The fraction classified correctly.")},
            .params = {enumParam("split", {"test", "train"}, "test", "Which split to measure.")},
        }) {}

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    auto data = datasetInput(ctx, "data");
    const DatasetSpec& ds = data->spec();
    const QString split = ctx.params()["split"].toString();
    const nn::DatasetPtr& set = split == "train" ? ds.train : ds.test;
    if (!set || set->count == 0)
      throw Error(
          ("the dataset has no " + split + " split (set its split to both or " + split + ")").toStdString());
    const QString mismatch = imageMismatch(model->model().options(), data->channels(), data->side());
    if (!mismatch.isEmpty()) throw Error(mismatch.toStdString());
    const double accuracy = nn::evaluate(model->model(), set, ds.batchSize, ds.resize);
    ctx.metric(ctx.nodeId() + ".accuracy", model->epochsTrained(), accuracy);
    ctx.reportField("accuracy", accuracy);
    ctx.reportField("samples", static_cast<double>(set->count));
    ctx.setOutput("accuracy", std::make_shared<ScalarValue>(std::vector<double>{accuracy}));
  }
};

}  // namespace

core::NodeTypePtr makeEvaluateNode() {
  return std::make_shared<EvaluateNode>();
}

}  // namespace gn::nodes
