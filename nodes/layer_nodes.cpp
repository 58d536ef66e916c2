// The "Layers" category: one node type per nn layer, named and parametrised as PyTorch's modules, and the
// Network node that builds a model from them.
#include "layer_nodes.h"

#include <QJsonArray>
#include <QLocale>

#include "gpunodes/errors.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {

using core::PortType;
using nn::LayerKind;

QString LayerValue::summary() const {
  return QString("Layer %1 (%2): %3 per sample")
      .arg(qs(layer_->spec.id), nn::layer_kind_name(layer_->spec.kind), shapeText(layer_->info.out));
}

nn::LayerSpec layerSpecOf(LayerKind kind, const QString& id, const QJsonObject& p) {
  // Each kind has only some of these params; the others keep LayerSpec's defaults, which the kind ignores.
  nn::LayerSpec l;
  l.id = id.toStdString();
  l.kind = kind;
  auto integer = [&](const char* key, int64_t& field) {
    if (p.contains(key)) field = p[key].toInteger();
  };
  auto real = [&](const char* key, double& field) {
    if (p.contains(key)) field = p[key].toDouble();
  };
  if (auto shape = shapeOf(p["shape"])) l.shape = *shape;
  integer(kind == LayerKind::Linear ? "out_features" : "out_channels", l.features);
  integer("hidden_size", l.features);
  integer("embedding_dim", l.features);
  integer("num_classes", l.features);
  integer("normalized_shape", l.features);
  integer("num_embeddings", l.vocab);
  integer("num_layers", l.num_layers);
  integer("dim0", l.dim0);
  integer("dim1", l.dim1);
  if (p.contains("bidirectional")) l.bidirectional = p["bidirectional"].toBool();
  if (p.contains("nonlinearity")) l.relu = p["nonlinearity"].toString() == "relu";
  real("dropout", l.dropout);
  integer("kernel_size", l.kernel);
  integer("stride", l.stride);
  integer("padding", l.padding);
  integer("groups", l.groups);
  if (p.contains("bias")) l.bias = p["bias"].toBool();
  real("eps", l.eps);
  real("momentum", l.momentum);
  real("p", l.p);
  integer("num_heads", l.heads);
  integer("max_len", l.max_len);
  integer("pad_id", l.pad_id);
  if (p.contains("causal")) l.causal = p["causal"].toBool();
  if (p.contains("transpose_b")) l.transpose_b = p["transpose_b"].toBool();
  if (p.contains("elementwise_affine")) l.affine = p["elementwise_affine"].toBool();
  real("scale", l.scale);
  return l;
}

nn::ModelOptions networkOptionsOf(const nn::LayerNode& out, const QJsonObject& p) {
  nn::ModelOptions o;
  o.arch = nn::Arch::Network;
  o.network = std::make_shared<const nn::NetworkSpec>(nn::NetworkSpec::ending_at(out));
  o.init = nn::parse_init(p["init"].toString().toStdString());
  o.init_std = static_cast<float>(p["init_std"].toDouble());
  o.seed = static_cast<uint64_t>(p["seed"].toInteger());
  return o;
}

QString shapeText(const Shape& shape) {
  QStringList dims;
  for (int64_t d : shape) dims.append(QString::number(d));
  return dims.join(QChar(0x00D7));
}

namespace {

QString count(double n) {
  return QLocale(QLocale::English).toString(static_cast<qlonglong>(n));
}

QString flopsText(double flops) {
  if (flops >= 1e9) return QString::number(flops / 1e9, 'f', 2) + " GFLOPs";
  if (flops >= 1e6) return QString::number(flops / 1e6, 'f', 2) + " MFLOPs";
  if (flops >= 1e3) return QString::number(flops / 1e3, 'f', 1) + " kFLOPs";
  return QString::number(flops, 'f', 0) + " FLOPs";
}

// The axes of a per-sample shape, in words, for the node's tooltip.
QString axesText(const Shape& s, nn::LayerKind kind) {
  switch (s.size()) {
    case 3:
      return QString("%1 channels × %2 × %3 pixels per sample").arg(s[0]).arg(s[1]).arg(s[2]);
    case 2:
      return QString("%1 steps × %2 features per sample").arg(s[0]).arg(s[1]);
    case 1:
      return kind == nn::LayerKind::Input ? QString("%1 values per sample: features, or %1 token ids").arg(s[0])
                                          : QString("%1 features per sample").arg(s[0]);
    default:
      return {};
  }
}

}  // namespace

core::NodeFacts layerFacts(const nn::LayerNode& layer) {
  QString badge = shapeText(layer.info.out);
  if (layer.info.params > 0) badge += " · " + count(layer.info.params) + " params";
  return {.badge = badge, .detail = axesText(layer.info.out, layer.spec.kind)};
}

core::NodeFacts networkFacts(const nn::NetworkSpec& net) {
  const std::vector<nn::LayerInfo> infos = net.infer();
  core::NodeFacts f;
  f.columns = {"Layer", "Type", "Output shape", "Params", "FLOPs"};
  double params = 0, state = 0, flops = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const nn::LayerInfo& info = infos[i];
    params += info.params;
    state += info.params + info.buffers;
    flops += info.flops;
    f.rows.append({qs(net.layers[i].id), nn::layer_kind_name(net.layers[i].kind), shapeText(info.out),
                   count(info.params), flopsText(info.flops)});
  }
  const QString bytes = qs(format_bytes(static_cast<int64_t>(state * sizeof(float))));
  f.rows.append({"Total", QString("%1 layers").arg(infos.size()), shapeText(infos.back().out), count(params),
                 flopsText(flops)});
  f.badge = QString("%1 params · %2/sample · %3").arg(count(params), flopsText(flops), bytes);
  return f;
}

namespace {

class LayerNodeType final : public GpuNode {
 public:
  LayerNodeType(LayerKind kind, const QString& description, QList<core::ParamSpec> params)
      : GpuNode(specOf(kind, description, std::move(params)), Reuse::Pure), kind_(kind) {}

  // A layer whose inputs are known gets its shape (drawn on the node), or the error that names the port and
  // both shapes.
  Outputs check(NodeCheck& check) const override {
    Known k;
    std::vector<nn::LayerNodePtr> inputs;
    const std::vector<std::string> ports = nn::layer_ports(kind_);
    for (size_t i = 0; i < ports.size(); ++i) {
      const std::optional<Known> in = check.input(qs(ports[i]));
      const bool optional = static_cast<int>(i) >= nn::layer_required_ports(kind_);
      if (!in && optional) {
        inputs.push_back(nullptr);  // an open optional port (a hole when a later one is wired; v without k
        continue;                   // is refused by the shape inference)
      }
      if (!in || !in->layer) return {{"out", k}};  // open (the host says so) or unknown upstream
      inputs.push_back(in->layer);
    }
    while (!inputs.empty() && !inputs.back()) inputs.pop_back();
    try {
      k.layer = nn::make_layer(layerSpecOf(kind_, check.id(), check.params()), std::move(inputs));
      check.setFacts(layerFacts(*k.layer));
    } catch (const nn::LayerError& e) {
      check.error(e.port().empty() ? QString("params") : "inputs." + qs(e.port()), qs(e.what()));
    }
    return {{"out", k}};
  }

  void execute(core::NodeContext& ctx) const override {
    std::vector<nn::LayerNodePtr> inputs;
    const std::vector<std::string> ports = nn::layer_ports(kind_);
    for (size_t i = 0; i < ports.size(); ++i) {
      const auto input = ctx.input(qs(ports[i]));
      if (!input && static_cast<int>(i) >= nn::layer_required_ports(kind_)) {
        inputs.push_back(nullptr);  // an open optional port
        continue;
      }
      auto value = std::dynamic_pointer_cast<const LayerValue>(input);
      if (!value) throw Error("input " + ports[i] + " must carry a Layer");
      inputs.push_back(value->layer());
    }
    while (!inputs.empty() && !inputs.back()) inputs.pop_back();
    try {
      auto layer = nn::make_layer(layerSpecOf(kind_, ctx.nodeId(), ctx.params()), std::move(inputs));
      ctx.reportField("shape", shapeText(layer->info.out));
      ctx.reportField("parameter_count", layer->info.params);
      ctx.setOutput("out", std::make_shared<LayerValue>(std::move(layer)));
    } catch (const nn::LayerError& e) {
      throw Error((e.port().empty() ? std::string() : "inputs." + e.port() + ": ") + e.what());
    }
  }

 private:
  static core::NodeTypeSpec specOf(LayerKind kind, const QString& description,
                                   QList<core::ParamSpec> params) {
    core::NodeTypeSpec s;
    s.name = nn::layer_kind_name(kind);
    s.category = "Layers";
    s.description = description;
    const std::vector<std::string> ports = nn::layer_ports(kind);
    for (size_t i = 0; i < ports.size(); ++i)
      s.inputs.append(inPort(qs(ports[i]), PortType::Layer, portDoc(kind, ports[i]),
                             static_cast<int>(i) < nn::layer_required_ports(kind)));
    s.outputs = {
        outPort("out", PortType::Layer, "This layer's activation (its shape per sample is on the node).")};
    s.params = std::move(params);
    return s;
  }

  static QString portDoc(LayerKind kind, const std::string& port) {
    if (port == "in") return "The activation this layer reads.";
    if (port == "q") return "The queries [Tq, E]; with k and v open, also the keys and values (self-attention).";
    if (port == "k") return "The keys [Tk, E]; open: the queries.";
    if (port == "v") return "The values [Tk, E], one per key; open: the keys.";
    if (port == "valid_lens")
      return "Optional: each sample's valid length [1] (a ValidLength layer on the token ids); keys at or past "
             "it get no weight (d2l's masked softmax), a length of 0 gives all-zero weights.";
    if (kind == LayerKind::BatchMatMul)
      return port == "a" ? "The left matrix [M, K] per sample." : "The right matrix [K, N] per sample ([N, K] with transpose_b).";
    return "One of the two activations.";
  }

  LayerKind kind_;
};

core::ParamSpec unitFloat(const QString& name, double def, double max, const QString& doc) {
  core::ParamSpec p = floatParam(name, def, doc);
  p.min = 0;
  p.max = max;
  return p;
}

constexpr double kMaxWidth = 1 << 20;  // channels and features
constexpr double kMaxWindow = 4096;

QList<core::ParamSpec> poolParams() {
  return {
      intParam("kernel_size", 2, 1, kMaxWindow, "The square window's side."),
      intParam("stride", 0, 0, kMaxWindow, "Step between windows; 0 means kernel_size (PyTorch's default)."),
      intParam("padding", 0, 0, kMaxWindow / 2, "Cells added on each side; at most half of kernel_size.")};
}

QList<core::ParamSpec> batchNormParams() {
  return {unitFloat("eps", 1e-5, 1, "Added to the variance before the square root (PyTorch's eps)."),
          unitFloat("momentum", 0.1, 1,
                    "Running statistics: running = (1 - momentum) * running + momentum * batch (PyTorch's "
                    "definition), with the batch's unbiased variance.")};
}

// Reshape's target: dimensions of at least 1, or one -1.
core::ParamSpec reshapeParam() {
  core::ParamSpec p = shapeParam("shape", QJsonArray{28, 28},
                                 "The shape per sample, one dimension may be -1; it must hold the input's values.");
  p.min = -1;
  return p;
}

// RNN, GRU and LSTM: PyTorch's constructor arguments.
QList<core::ParamSpec> recurrentParams(bool nonlinearity) {
  QList<core::ParamSpec> p{
      intParam("hidden_size", 256, 1, kMaxWidth, "Features of the hidden state (d2l's num_hiddens)."),
      intParam("num_layers", 1, 1, 64, "Stacked layers: layer l + 1 reads layer l's outputs."),
      boolParam("bidirectional", false,
                "A second set of weights reads the sequence backwards; outputs are both, side by side."),
      unitFloat("dropout", 0, 0.99, "Dropout on each layer's outputs but the last, in training."),
      boolParam("bias", true, "Whether the layers add the biases b_ih and b_hh.")};
  if (nonlinearity)
    p.append(enumParam("nonlinearity", {"tanh", "relu"}, "tanh", "The activation of the hidden state."));
  return p;
}

class NetworkNode final : public GpuNode {
 public:
  NetworkNode()
      : GpuNode(
            {
                .name = "Network",
                .category = "Layers",
                .description =
                    "A model built from the layer nodes drawn upstream of its out input: exactly one Input, "
                    "any "
                    "branches (Add, Concat) between. Train, Evaluate, Forward, Parameters, SaveParams and "
                    "LoadParams take it like a Model. Weights are drawn in the order a depth-first walk from "
                    "out "
                    "reaches the layers (inputs in port order), so a drawn LeNet or ResNet-18 starts from "
                    "the "
                    "same "
                    "weights as the Model node's with the same seed and init. Parameters are named "
                    "<layer id>.weight, <layer id>.bias, <layer id>.running_mean, ...",
                .inputs = {inPort("out", PortType::Layer, "The network's last activation: its output."),
                           inPort(
                               "device", PortType::Devices,
                               "Where the parameters live: a Device, or Devices whose first device holds the "
                               "model (Train replicates it onto the others). Open: the CPU.",
                               false)},
                .outputs = {outPort("model", PortType::Model, "The initialised model.")},
                .params =
                    {
                        enumParam(
                            "init", {"normal", "xavier", "kaiming"}, "normal",
                            "Weights: normal(0, init_std); xavier (Glorot uniform); kaiming (He normal). "
                            "Biases start at 0, BatchNorm at weight 1 and bias 0."),
                        floatParam("init_std", 0.01, "normal: the standard deviation (above 0)."),
                        intParam("seed", 0, 0, 9007199254740991.0,
                                 "Random seed: the same seed gives the same parameters on every device."),
                    },
            },
            Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& params) const override {
    const double std = params["init_std"].toDouble();
    if (params["init"].toString() == "normal" && !(std > 0 && std < 1e6))
      return {"init_std: must be above 0"};
    return {};
  }

  // The model of the layers upstream of out, on the device wired in (the CPU when open), with its totals and
  // layer table drawn on the node; its parameters and buffers must fit there.
  Outputs check(NodeCheck& check) const override {
    Known m = check.modelDevice("device");
    const Known out = check.inputOrUnknown("out");
    if (!out.layer) return {{"model", m}};
    try {
      m.model = networkOptionsOf(*out.layer, check.params());
    } catch (const Error& e) {  // no Input, or two
      check.error("inputs.out", qs(e.what()));
      return {{"model", m}};
    }
    check.setFacts(networkFacts(*m.model->network));
    if (m.devices.size() == 1) {
      const double values = nn::state_elements(*m.model);
      if (!check.checkFits("inputs.out", m.devices.front(), values * sizeof(float),
                           QString("the network's %1 parameter and buffer values").arg(values, 0, 'g', 4)))
        m.model.reset();
    }
    return {{"model", m}};
  }

  void execute(core::NodeContext& ctx) const override {
    NodesSession& session = sessionOf(ctx);
    auto out = std::dynamic_pointer_cast<const LayerValue>(ctx.input("out"));
    if (!out) throw Error("input out must carry a Layer");
    std::vector<Device> devices = deviceInput(ctx, "device");
    const Device device = devices.empty() ? Device::cpu() : devices.front();
    if (!session.runtime().has(device)) throw Error("no such device: " + device.str());
    const nn::ModelOptions options = networkOptionsOf(*out->layer(), ctx.params());
    std::shared_ptr<nn::Model> model = nn::Model::create(session.runtime(), options, device);
    reportModel(ctx, *model);
    ctx.reportField("layers", qs(model->summary()));
    ctx.setOutput("model", std::make_shared<ModelValue>(session.runtimePtr(), std::move(model)));
  }
};

}  // namespace

QList<core::NodeTypePtr> makeLayerNodes() {
  using P = QList<core::ParamSpec>;
  auto layer = [](LayerKind kind, const QString& doc, P params = {}) -> core::NodeTypePtr {
    return std::make_shared<LayerNodeType>(kind, doc, std::move(params));
  };
  const core::ParamSpec bias = boolParam("bias", true, "Whether the layer adds a learned bias.");
  return {
      layer(LayerKind::Input,
            "Where a network starts: the shape of one sample, [C, H, W] for images, [features] for a table or a "
            "series window, [T] for token ids or [T, F] for a sequence of T steps of F features.",
            {shapeParam("shape", QJsonArray{1, 28, 28},
                        "One sample's shape: [C, H, W] (Fashion-MNIST: [1, 28, 28]), [features], token ids [T] "
                        "(a text dataset's num_steps) or [T, F].")}),
      layer(LayerKind::Conv2d,
            "2-D convolution over a [C, H, W] activation (PyTorch's nn.Conv2d; square kernel).",
            {intParam("out_channels", 16, 1, kMaxWidth, "Output channels (filters)."),
             intParam("kernel_size", 3, 1, kMaxWindow, "The square kernel's side."),
             intParam("stride", 1, 1, kMaxWindow, "Step between windows."),
             intParam("padding", 0, 0, kMaxWindow, "Zeros added on each side."),
             intParam("groups", 1, 1, kMaxWidth,
                      "Channel groups: input and output channels must be multiples; groups = channels is a "
                      "depthwise convolution."),
             bias}),
      layer(LayerKind::BatchNorm2d, "Batch normalisation per channel of a [C, H, W] activation.",
            batchNormParams()),
      layer(LayerKind::BatchNorm1d, "Batch normalisation per feature of a flat [features] activation.",
            batchNormParams()),
      layer(LayerKind::ReLU, "max(x, 0)."),
      layer(LayerKind::Sigmoid, "1 / (1 + exp(-x)), as d2l's LeNet uses."),
      layer(LayerKind::Tanh, "tanh(x)."),
      layer(LayerKind::GELU, "x * Phi(x), the exact (erf) form that is PyTorch's default."),
      layer(LayerKind::MaxPool2d, "The maximum of each window (padding counts as minus infinity).",
            poolParams()),
      layer(LayerKind::AvgPool2d,
            "The mean of each window (padded cells count, as PyTorch's count_include_pad).", poolParams()),
      layer(LayerKind::GlobalAvgPool2d,
            "The mean of each channel: [C, H, W] -> [C, 1, 1] (d2l's "
            "AdaptiveAvgPool2d((1, 1)))."),
      layer(LayerKind::Flatten, "Everything per sample into one axis: [C, H, W] -> [C*H*W]."),
      layer(LayerKind::Linear,
            "y = x W^T + b on a flat [features] activation, or on each step of a [T, F] sequence (PyTorch's "
            "nn.Linear acts on the last axis).",
            {intParam("out_features", 10, 1, kMaxWidth, "Output features (the classes, for the last layer)."),
             bias}),
      layer(LayerKind::Dropout,
            "In training, zeroes each value with probability p and scales the rest by 1 / (1 - p); in "
            "evaluation it passes values through.",
            {unitFloat("p", 0.5, 0.99, "The probability of zeroing a value.")}),
      layer(LayerKind::Add, "a + b, elementwise: the residual connection. Both must have the same shape."),
      layer(LayerKind::Concat,
            "a and b joined along the channel axis (the first per-sample axis); the other sizes must match."),
      layer(LayerKind::Embedding,
            "Token ids [T] to vectors [T, embedding_dim] (PyTorch's nn.Embedding; weight <id>.weight "
            "[num_embeddings, embedding_dim] from N(0, 1)). An id outside [0, num_embeddings) fails the run, "
            "naming the id, its sample and step.",
            {intParam("num_embeddings", 28, 1, 1 << 24, "The vocabulary's size: ids run from 0 to this - 1."),
             intParam("embedding_dim", 32, 1, kMaxWidth, "Features per token.")}),
      layer(LayerKind::OneHot,
            "Token ids [T] to one-hot rows [T, num_classes] (d2l's RNN language model's F.one_hot).",
            {intParam("num_classes", 28, 1, 1 << 24, "The vocabulary's size: ids run from 0 to this - 1.")}),
      layer(LayerKind::RNN,
            "An Elman RNN over a [T, F] sequence, every step's output [T, hidden_size x directions] "
            "(PyTorch's nn.RNN, batch_first): h' = act(W_ih x + b_ih + W_hh h + b_hh). Parameters "
            "<id>.weight_ih_l0, <id>.weight_hh_l0, <id>.bias_ih_l0, <id>.bias_hh_l0 (and _reverse), from "
            "U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)). Starts from zeros; a sequential text dataset "
            "carries the state from batch to batch.",
            recurrentParams(true)),
      layer(LayerKind::GRU,
            "A gated recurrent unit over a [T, F] sequence (PyTorch's nn.GRU: gates r, z, n, the reset "
            "gate applied after the hidden product), every step's output [T, hidden_size x directions]. "
            "Parameters named and initialised as PyTorch's.",
            recurrentParams(false)),
      layer(LayerKind::LSTM,
            "A long short-term memory over a [T, F] sequence (PyTorch's nn.LSTM: gates i, f, g, o), every "
            "step's output [T, hidden_size x directions]. Parameters named and initialised as PyTorch's.",
            recurrentParams(false)),
      layer(LayerKind::Reshape,
            "The same values per sample in another shape (one -1 takes what is left): Input [1, 28, 28] -> "
            "Reshape [28, 28] reads an image's rows as 28 steps.",
            {reshapeParam()}),
      layer(LayerKind::Transpose, "Swaps two per-sample axes (negative ones count from the end).",
            {intParam("dim0", 0, -4, 3, "The first axis (0 is the first per-sample axis)."),
             intParam("dim1", 1, -4, 3, "The second axis.")}),
      layer(LayerKind::LastStep,
            "The last step of a [T, F] sequence: [F] (x[:, -1]), what a classifier reads after a recurrent "
            "layer."),
      layer(LayerKind::FirstStep,
            "The first step of a [T, F] sequence: [F] (x[:, 0]), what a ViT's head reads (its class token)."),
      layer(LayerKind::LayerNorm,
            "Normalises each position over its last axis (PyTorch's nn.LayerNorm): (x - mean) / sqrt(var + "
            "eps) * weight + bias, with <id>.weight (ones) and <id>.bias (zeros) of the last axis's size.",
            {intParam("normalized_shape", 0, 0, kMaxWidth,
                      "The size of the axis normalised, checked against the input's last axis; 0 takes "
                      "whatever the input has."),
             unitFloat("eps", 1e-5, 1, "Added to the variance before the square root."),
             boolParam("elementwise_affine", true, "Whether the layer learns a weight and a bias.")}),
      layer(LayerKind::MultiheadAttention,
            "Scaled dot-product attention with num_heads heads (PyTorch's nn.MultiheadAttention, batch_first; "
            "d2l 11.5): q, k and v [T, E] are projected by <id>.in_proj_weight [3E, E] (and <id>.in_proj_bias), "
            "each head attends with softmax(Q K^T / sqrt(E / heads)), and <id>.out_proj.weight and .bias mix the "
            "heads. Only q wired: self-attention. After a run its attention weights show in the Attention pane.",
            {intParam("num_heads", 4, 1, 4096, "Heads: each attends over E / num_heads features; must divide E."),
             unitFloat("dropout", 0, 0.99, "Dropout on the attention weights, in training."), bias,
             boolParam("causal", false,
                       "Each query sees only its own and earlier keys (a decoder, a language model).")}),
      layer(LayerKind::ValidLength,
            "Each sample's valid length: token ids [T] give [1], the count of ids that are not pad_id (d2l's "
            "valid_len = (X != pad).sum(1)), for MultiheadAttention's valid_lens. No parameters, no gradient.",
            {intParam("pad_id", 1, 0, 1 << 24,
                      "The id that pads a sequence (1: '<pad>' after '<unk>' = 0, as d2l's vocabulary).")}),
      layer(LayerKind::BatchMatMul,
            "a b per sample (torch.bmm): [M, K] by [K, N] gives [M, N]; with transpose_b, b is [N, K] (d2l "
            "11.3's queries by keys).",
            {boolParam("transpose_b", false, "Multiply by b transposed: torch.bmm(a, b.transpose(1, 2)).")}),
      layer(LayerKind::Softmax,
            "Softmax over the last axis (d2l 11.3's masked_softmax with causal: a row's later entries get 0).",
            {boolParam("causal", false, "Row i keeps only columns up to i (plus the extra keys past the rows).")}),
      layer(LayerKind::Mul, "a * b, element-wise; both must have the same shape."),
      layer(LayerKind::Scale, "scale * x (d2l's 1 / sqrt(d) before a softmax).",
            {floatParam("scale", 1.0, "The factor.")}),
      layer(LayerKind::PositionalEncoding,
            "d2l 11.6's sinusoidal positional encoding, added to a [T, E] sequence (E even): P[t, 2i] = "
            "sin(t / 10000^(2i / E)), P[t, 2i + 1] = cos(...), then dropout. No parameters.",
            {unitFloat("dropout", 0, 0.99, "Dropout after the addition, in training."),
             intParam("max_len", 1000, 1, 1 << 20, "The longest sequence it takes.")}),
      layer(LayerKind::PositionEmbedding,
            "A learned position embedding added to a [T, E] sequence: <id>.weight [T, E] from N(0, 1) (d2l 11.8's "
            "pos_embedding); a shorter sequence adds its first rows."),
      layer(LayerKind::ClassToken,
            "Prepends a learned token <id>.weight [1, E] (zeros at first) to a [T, E] sequence: [T + 1, E], d2l "
            "11.8's cls_token; FirstStep reads it back after the blocks."),
      layer(LayerKind::NadarayaWatson,
            "d2l 11.2's Nadaraya-Watson kernel regression with a learned width (its NWKernelRegression): rows "
            "(query, key, value) [T, 3] give [T], for each query i the attention pooling sum_j softmax_j(-((q_i - "
            "k_j) w)^2 / 2) v_j over every row's key and value, with <id>.w [1] from U(0, 1). In training each "
            "query leaves its own row's key out, as d2l's training does. Its attention weights show in the "
            "Attention pane (Evaluate's attention param)."),
      std::make_shared<NetworkNode>(),
  };
}

}  // namespace gn::nodes
