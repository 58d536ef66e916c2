// Generate: a language model trained on a text continues a prefix, token by token (d2l's predict_ch8), greedy
// or sampled at a temperature.
#include <QJsonArray>
#include <cmath>

#include "gpunodes/errors.h"
#include "gpunodes/nn/sequence_data.h"
#include "gpunodes/ops.h"
#include "gpunodes/random.h"
#include "graph_checks.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

// The next token from the last step's scores: the first maximum at temperature 0, otherwise a draw from
// softmax(z / temperature) with the uniform number u in [0, 1).
int64_t nextToken(const float* z, int64_t vocab, double temperature, double u) {
  int64_t best = 0;
  for (int64_t j = 1; j < vocab; ++j)
    if (z[j] > z[best]) best = j;
  if (temperature <= 0) return best;
  std::vector<double> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += p[static_cast<size_t>(j)] = std::exp((z[j] - z[best]) / temperature);
  double acc = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    acc += p[static_cast<size_t>(j)] / sum;
    if (u < acc) return j;
  }
  return vocab - 1;
}

class GenerateNode final : public GpuNode {
 public:
  GenerateNode()
      : GpuNode({
            .name = "Generate",
            .category = "Models",
            .description =
                "A language model trained on a text dataset continues prefix by num_tokens tokens (d2l's "
                "predict_ch8): the model reads the prefix and what it generated so far and the next token is "
                "the most likely one (temperature 0) or drawn from the scores softened by temperature, from "
                "seed. The text shows on the node, in the report (generated_text) and in gpunodes run's "
                "summary.",
            .inputs = {inPort("model", PortType::Model,
                              "A model that gives a score per vocabulary token at every step: [T, vocab]."),
                       inPort("data", PortType::Dataset,
                              "The text dataset the model was trained on: its vocabulary and how it cuts text.")},
            .outputs = {},
            .params = {stringParam("prefix", "time traveller ", "The text to continue (tokenized as the dataset's)."),
                       intParam("num_tokens", 50, 1, 100000, "How many tokens to generate."),
                       floatParam("temperature", 0.0,
                                  "0: always the most likely token (greedy, as d2l's predict_ch8); above 0: "
                                  "sampled, higher is more varied."),
                       intParam("seed", 0, 0, 9007199254740991.0, "The draws' seed when temperature is above 0.")},
        }, Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& p) const override {
    QStringList problems;
    if (p["prefix"].toString().isEmpty()) problems.append("prefix: give at least one character to continue");
    const double t = p["temperature"].toDouble();
    if (!(t >= 0 && t <= 100)) problems.append("temperature: must be between 0 and 100");
    return problems;
  }

  // A text dataset, and a model whose output is a score per token at every step.
  Outputs check(NodeCheck& check) const override {
    const Known model = check.inputOrUnknown("model"), data = check.inputOrUnknown("data");
    if (data.data && data.data->kind != "text")
      check.error("inputs.data", "Generate continues text: wire a Dataset whose name is text");
    else
      check.checkData(model, data, nn::LossKind::CrossEntropy);
    return {};
  }

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    auto data = datasetInput(ctx, "data");
    const nn::DatasetPtr& text = data->anySplit();
    if (!text || text->vocabulary.empty()) throw Error("Generate needs a text dataset: its vocabulary is missing");
    const QJsonObject& p = ctx.params();
    const std::string prefix = p["prefix"].toString().toStdString();
    const int64_t count = p["num_tokens"].toInteger();
    const double temperature = p["temperature"].toDouble();
    const auto seed = static_cast<uint64_t>(p["seed"].toInteger());
    std::vector<int64_t> ids = nn::encode(*text, prefix);
    if (ids.empty()) throw Error("prefix: '" + prefix + "' holds no token of the dataset's vocabulary");
    const auto vocab = static_cast<int64_t>(text->vocabulary.size());
    nn::Model& m = model->model();
    Runtime& rt = m.runtime();
    for (int64_t k = 0; k < count; ++k) {
      if (ctx.cancelled()) throw CancelledError();
      const auto steps = static_cast<int64_t>(ids.size());
      std::vector<float> x(ids.begin(), ids.end());
      const std::vector<float> z = to_host(m.forward(from_values(rt, {1, steps}, m.device(), std::move(x)), nn::Mode::Eval));
      const int64_t width = static_cast<int64_t>(z.size()) / steps;
      if (width < vocab)
        throw Error("the model gives " + std::to_string(width) + " scores per step, fewer than the vocabulary's " +
                    std::to_string(vocab) + " tokens: it must end in [T, vocab] scores");
      const double u = philox::uniform_at(seed, static_cast<uint64_t>(k), 0.0f, 1.0f);
      ids.push_back(nextToken(z.data() + (steps - 1) * width, vocab, temperature, u));
      ctx.progress(static_cast<double>(k + 1) / static_cast<double>(count));
    }
    const std::string out = nn::decode(*text, ids);
    ctx.reportField("prefix", qs(prefix));
    ctx.reportField("generated_text", qs(out));
    ctx.reportField("tokens", static_cast<double>(count));
  }
};

}  // namespace

core::NodeTypePtr makeGenerateNode() {
  return std::make_shared<GenerateNode>();
}

}  // namespace gn::nodes
