#include "onnx_exporter.h"

#include <onnx/onnx_pb.h>

#include <QSaveFile>
#include <cmath>
#include <cstring>
#include <map>

#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"
#include "gpunodes/ops.h"
#include "onnx_reader.h"

namespace gn::nodes::onnx {

using nn::LayerKind;
using nn::LayerSpec;
using ::onnx::AttributeProto;
using ::onnx::NodeProto;
using ::onnx::TensorProto;

namespace {

constexpr int64_t kOpset = 17;
constexpr int64_t kIrVersion = 8;  // the IR version of opset 17 (ONNX 1.12)

class Exporter {
 public:
  Exporter(const nn::Model& model, const ExportInfo& info) : model_(model), info_(info) {}

  ::onnx::ModelProto run(const std::function<void(double, const QString&)>& progress) {
    const nn::ModelOptions& o = model_.options();
    if (o.arch != nn::Arch::Network || !o.network)
      throw OnnxError(
          std::string("the model is the built-in ") + nn::arch_name(o.arch) +
          " architecture of a Model node: only networks drawn from layer nodes into a Network are "
          "exported (resources/examples/lenet-layers.json and resnet18-layers.json draw LeNet and "
          "ResNet-18)");
    net_ = *o.network;
    info_s_ = net_.infer();
    for (const nn::Parameter* p : model_.state()) params_[p->name] = p;

    ::onnx::ModelProto m;
    m.set_ir_version(kIrVersion);
    m.set_producer_name("gpunodes");
    m.set_producer_version(GPUNODES_VERSION_STRING);
    auto* opset = m.add_opset_import();
    opset->set_domain("");
    opset->set_version(kOpset);
    const std::string name = info_.name.isEmpty() ? "gpunodes network" : info_.name.toStdString();
    const std::string description = info_.description.toStdString();
    m.set_doc_string(description);
    g_ = m.mutable_graph();
    g_->set_name(name);
    g_->set_doc_string(description);
    auto meta = [&](const std::string& k, const std::string& v) {
      auto* p = m.add_metadata_props();
      p->set_key(k);
      p->set_value(v);
    };
    meta("name", name);
    if (!description.empty()) meta("description", description);
    if (!info_.network.isEmpty()) meta("gpunodes.network", info_.network.toStdString());
    meta("gpunodes.signature", model_.signature());

    for (size_t i = 0; i < net_.layers.size(); ++i) {
      if (progress && i % 16 == 0)
        progress(0.1 + 0.6 * double(i) / double(net_.layers.size()),
                 QString("layer %1 of %2").arg(i).arg(net_.layers.size()));
      layer(i);
    }
    // The output: the last layer's value, [batch, ...].
    valueInfo(g_->add_output(), value(net_.layers.size() - 1), info_s_.back().out);
    for (const auto& [pname, p] : params_)
      if (!used_.count(pname))
        warnings_.append(
            QString("parameter %1 is not used by the exported graph").arg(QString::fromStdString(pname)));
    return m;
  }

  QStringList warnings() const { return warnings_; }

 private:
  // --- names and graph pieces ------------------------------------------------------------------------------
  const std::string& id(size_t i) const { return net_.layers[i].id; }
  std::string value(size_t i) const { return net_.layers[i].id; }  // a layer's output value is named its id
  std::string in(size_t i, size_t k = 0) const { return value(size_t(net_.layers[i].inputs[k])); }
  const Shape& inShape(size_t i, size_t k = 0) const { return info_s_[size_t(net_.layers[i].inputs[k])].out; }

  [[noreturn]] void refuse(size_t i, const std::string& why) const {
    throw OnnxError("layer " + id(i) + " (" + nn::layer_kind_name(net_.layers[i].kind) + "): " + why);
  }

  void valueInfo(::onnx::ValueInfoProto* v, const std::string& name, const Shape& sample) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(TensorProto::FLOAT);
    auto* shape = tt->mutable_shape();
    shape->add_dim()->set_dim_param("batch");
    for (int64_t d : sample) shape->add_dim()->set_dim_value(d);
  }

  NodeProto* node(const std::string& op, const std::string& name, const std::vector<std::string>& inputs,
                  const std::vector<std::string>& outputs) {
    NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& s : inputs) n->add_input(s);
    for (const std::string& s : outputs) n->add_output(s);
    return n;
  }
  // A node of a layer's decomposition that is not its first: "<id>/<what>", writing a value of that name.
  std::string step(size_t i, const std::string& op, const std::string& what,
                   const std::vector<std::string>& inputs, NodeProto** made = nullptr) {
    const std::string out = id(i) + "/" + what;
    NodeProto* n = node(op, out, inputs, {out});
    if (made) *made = n;
    return out;
  }
  static void attr(NodeProto* n, const char* name, int64_t v) {
    AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(AttributeProto::INT);
    a->set_i(v);
  }
  static void attr(NodeProto* n, const char* name, float v) {
    AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void attr(NodeProto* n, const char* name, const std::vector<int64_t>& v) {
    AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void attr(NodeProto* n, const char* name, const std::vector<std::string>& v) {
    AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(AttributeProto::STRINGS);
    for (const std::string& x : v) a->add_strings(x);
  }
  static void attr(NodeProto* n, const char* name, const std::string& v) {
    AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(AttributeProto::STRING);
    a->set_s(v);
  }

  // Constants that are no parameter are Constant nodes, so that the initializers are exactly the parameters.
  std::string constFloats(size_t i, const std::string& what, const Shape& shape,
                          const std::vector<float>& v) {
    const std::string out = id(i) + "/" + what;
    NodeProto* n = node("Constant", out, {}, {out});
    AttributeProto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(AttributeProto::TENSOR);
    TensorProto* t = a->mutable_t();
    t->set_data_type(TensorProto::FLOAT);
    for (int64_t d : shape) t->add_dims(d);
    if (v.size() <= 16) {
      for (float f : v) t->add_float_data(f);
    } else {
      t->set_raw_data(rawBytes(v.data(), v.size()));
    }
    return out;
  }
  std::string constInts(size_t i, const std::string& what, const std::vector<int64_t>& v,
                        bool scalar = false) {
    const std::string out = id(i) + "/" + what;
    NodeProto* n = node("Constant", out, {}, {out});
    AttributeProto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(AttributeProto::TENSOR);
    TensorProto* t = a->mutable_t();
    t->set_data_type(TensorProto::INT64);
    if (!scalar) t->add_dims(int64_t(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
    return out;
  }

  static std::string rawBytes(const float* f, size_t n) {
    // ONNX's raw_data is little-endian; so is every machine gpunodes builds for (x86-64, aarch64).
    static_assert(sizeof(float) == 4);
    std::string s(n * 4, '\0');
    std::memcpy(s.data(), f, n * 4);
    return s;
  }

  // The parameter "<id>.<leaf>" as an initializer (once), under its safetensors name.
  std::string param(size_t i, const std::string& leaf) {
    const std::string name = id(i) + "." + leaf;
    const auto it = params_.find(name);
    if (it == params_.end()) refuse(i, "the model has no parameter " + name);
    if (used_.insert(name).second) {
      TensorProto* t = g_->add_initializer();
      t->set_name(name);
      t->set_data_type(TensorProto::FLOAT);
      for (int64_t d : it->second->value.shape()) t->add_dims(d);
      const std::vector<float> v = to_host(it->second->value);
      t->set_raw_data(rawBytes(v.data(), v.size()));
    }
    return name;
  }
  bool hasParam(size_t i, const std::string& leaf) const { return params_.count(id(i) + "." + leaf) > 0; }
  std::vector<float> paramValues(size_t i, const std::string& leaf) {
    const auto it = params_.find(id(i) + "." + leaf);
    if (it == params_.end()) refuse(i, "the model has no parameter " + id(i) + "." + leaf);
    return to_host(it->second->value);
  }

  // --- the layers ------------------------------------------------------------------------------------------
  void layer(size_t i) {
    const LayerSpec& l = net_.layers[i];
    const std::string out = value(i);
    switch (l.kind) {
      case LayerKind::Input:
        valueInfo(g_->add_input(), out, l.shape);
        return;
      case LayerKind::Conv2d: {
        std::vector<std::string> ins{in(i), param(i, "weight")};
        if (l.bias) ins.push_back(param(i, "bias"));
        NodeProto* n = node("Conv", id(i), ins, {out});
        attr(n, "kernel_shape", std::vector<int64_t>{l.kernel, l.kernel});
        attr(n, "strides", std::vector<int64_t>{l.stride, l.stride});
        attr(n, "pads", std::vector<int64_t>{l.padding, l.padding, l.padding, l.padding});
        attr(n, "dilations", std::vector<int64_t>{1, 1});
        attr(n, "group", l.groups);
        return;
      }
      case LayerKind::BatchNorm2d:
      case LayerKind::BatchNorm1d: {
        // Eval form: the running statistics. ONNX's momentum weighs the running value, torch's the batch.
        NodeProto* n = node(
            "BatchNormalization", id(i),
            {in(i), param(i, "weight"), param(i, "bias"), param(i, "running_mean"), param(i, "running_var")},
            {out});
        attr(n, "epsilon", float(l.eps));
        attr(n, "momentum", float(1.0 - l.momentum));
        return;
      }
      case LayerKind::ReLU:
        node("Relu", id(i), {in(i)}, {out});
        return;
      case LayerKind::Sigmoid:
        node("Sigmoid", id(i), {in(i)}, {out});
        return;
      case LayerKind::Tanh:
        node("Tanh", id(i), {in(i)}, {out});
        return;
      case LayerKind::GELU: {
        // x * (1 + erf(x / sqrt(2))) * 0.5, as torch writes it (Gelu is opset 20).
        const std::string root2 = constFloats(i, "sqrt2", {}, {float(std::sqrt(2.0))});
        const std::string one = constFloats(i, "one", {}, {1.0f});
        const std::string half = constFloats(i, "half", {}, {0.5f});
        const std::string div = id(i) + "/div";
        node("Div", id(i), {in(i), root2}, {div});
        const std::string erf = step(i, "Erf", "erf", {div});
        const std::string add = step(i, "Add", "add", {erf, one});
        const std::string mul = step(i, "Mul", "mul", {in(i), add});
        node("Mul", id(i) + "/half_mul", {mul, half}, {out});
        return;
      }
      case LayerKind::MaxPool2d:
      case LayerKind::AvgPool2d: {
        const bool max = l.kind == LayerKind::MaxPool2d;
        NodeProto* n = node(max ? "MaxPool" : "AveragePool", id(i), {in(i)}, {out});
        attr(n, "kernel_shape", std::vector<int64_t>{l.kernel, l.kernel});
        attr(n, "strides", std::vector<int64_t>{l.pool_stride(), l.pool_stride()});
        attr(n, "pads", std::vector<int64_t>{l.padding, l.padding, l.padding, l.padding});
        if (!max && l.padding > 0) attr(n, "count_include_pad", int64_t(1));  // gpunodes counts padded cells
        return;
      }
      case LayerKind::GlobalAvgPool2d:
        node("GlobalAveragePool", id(i), {in(i)}, {out});
        return;
      case LayerKind::Flatten: {
        NodeProto* n = node("Flatten", id(i), {in(i)}, {out});
        attr(n, "axis", int64_t(1));
        return;
      }
      case LayerKind::Linear:
        return linear(i);
      case LayerKind::Dropout: {
        // Evaluation: the identity. Dropout keeps the layer (and its p) for an import.
        const std::string ratio = constFloats(i, "ratio", {}, {float(l.p)});
        node("Dropout", id(i), {in(i), ratio}, {out});
        return;
      }
      case LayerKind::Add:
        node("Add", id(i), {in(i, 0), in(i, 1)}, {out});
        return;
      case LayerKind::Concat: {
        NodeProto* n = node("Concat", id(i), {in(i, 0), in(i, 1)}, {out});
        attr(n, "axis", int64_t(1));
        return;
      }
      case LayerKind::Reshape: {
        // 0 copies the batch axis; the per-sample shape keeps its -1 if it has one.
        std::vector<int64_t> target{0};
        for (int64_t d : l.shape) target.push_back(d);
        node("Reshape", id(i), {in(i), constInts(i, "shape", target)}, {out});
        return;
      }
      case LayerKind::Transpose: {
        const int64_t rank = int64_t(inShape(i).size());
        const int64_t a = (l.dim0 < 0 ? l.dim0 + rank : l.dim0) + 1,
                      b = (l.dim1 < 0 ? l.dim1 + rank : l.dim1) + 1;
        std::vector<int64_t> perm;
        for (int64_t k = 0; k <= rank; ++k) perm.push_back(k);
        std::swap(perm[size_t(a)], perm[size_t(b)]);
        NodeProto* n = node("Transpose", id(i), {in(i)}, {out});
        attr(n, "perm", perm);
        return;
      }
      case LayerKind::Softmax: {
        if (l.causal) return causalSoftmax(i, in(i), out, id(i));
        NodeProto* n = node("Softmax", id(i), {in(i)}, {out});
        attr(n, "axis", int64_t(-1));
        return;
      }
      case LayerKind::LayerNorm: {
        const int64_t e = inShape(i).back();
        std::string scale, bias;
        if (l.affine) {
          scale = param(i, "weight");
          bias = param(i, "bias");
        } else {
          scale = constFloats(i, "scale", {e}, std::vector<float>(size_t(e), 1.0f));
          bias = constFloats(i, "bias", {e}, std::vector<float>(size_t(e), 0.0f));
        }
        NodeProto* n = node("LayerNormalization", id(i), {in(i), scale, bias}, {out});
        attr(n, "axis", int64_t(-1));
        attr(n, "epsilon", float(l.eps));
        return;
      }
      case LayerKind::Embedding: {
        // Token ids arrive as floats: Gather wants integers.
        const std::string ids = castToInt(i, in(i));
        NodeProto* n = node("Gather", id(i), {param(i, "weight"), ids}, {out});
        attr(n, "axis", int64_t(0));
        return;
      }
      case LayerKind::OneHot: {
        const std::string ids = castToInt(i, in(i));
        NodeProto* n = node(
            "OneHot", id(i),
            {ids, constInts(i, "depth", {l.features}), constFloats(i, "values", {2}, {0.0f, 1.0f})}, {out});
        attr(n, "axis", int64_t(-1));
        return;
      }
      case LayerKind::RNN:
      case LayerKind::GRU:
      case LayerKind::LSTM:
        return recurrent(i);
      case LayerKind::LastStep:
      case LayerKind::FirstStep: {
        // x[:, -1] or x[:, 0]: a Gather of one step (a scalar index drops the axis).
        const int64_t step = l.kind == LayerKind::LastStep ? inShape(i)[0] - 1 : 0;
        NodeProto* n = node("Gather", id(i), {in(i), constInts(i, "step", {step}, true)}, {out});
        attr(n, "axis", int64_t(1));
        return;
      }
      case LayerKind::MultiheadAttention:
        return attention(i);
      case LayerKind::BatchMatMul: {
        std::string b = in(i, 1);
        if (l.transpose_b) b = transposed(i, "b_t", b, {0, 2, 1});
        node("MatMul", id(i), {in(i, 0), b}, {out});
        return;
      }
      case LayerKind::Mul:
        node("Mul", id(i), {in(i, 0), in(i, 1)}, {out});
        return;
      case LayerKind::Scale:
        node("Mul", id(i), {in(i), constFloats(i, "scale", {}, {float(l.scale)})}, {out});
        return;
      case LayerKind::PositionalEncoding: {
        // X + P[:T], the table as gpunodes makes it (float32, d2l's formula); dropout is the identity.
        const int64_t t = inShape(i)[0], e = inShape(i)[1];
        std::vector<float> v(size_t(t * e), 0.0f);
        for (int64_t pos = 0; pos < t; ++pos)
          for (int64_t k = 0; k < e / 2; ++k) {
            const float angle = static_cast<float>(pos) /
                                std::pow(10000.0f, static_cast<float>(2 * k) / static_cast<float>(e));
            v[size_t(pos * e + 2 * k)] = std::sin(angle);
            v[size_t(pos * e + 2 * k + 1)] = std::cos(angle);
          }
        node("Add", id(i), {in(i), constFloats(i, "table", {t, e}, v)}, {out});
        return;
      }
      case LayerKind::PositionEmbedding:
        node("Add", id(i), {in(i), param(i, "weight")}, {out});
        return;
      case LayerKind::ClassToken: {
        // The token [1, E] expanded to [N, 1, E] and put before the steps.
        const int64_t e = inShape(i)[1];
        const std::string shape = step(i, "Shape", "shape", {in(i)});
        NodeProto* sl = nullptr;
        const std::string n =
            step(i, "Slice", "batch", {shape, constInts(i, "zero", {0}), constInts(i, "one", {1})}, &sl);
        NodeProto* cat = nullptr;
        const std::string target =
            step(i, "Concat", "target", {n, constInts(i, "token_shape", {1, e})}, &cat);
        attr(cat, "axis", int64_t(0));
        const std::string tokens = step(i, "Expand", "tokens", {param(i, "weight"), target});
        NodeProto* c = node("Concat", id(i), {tokens, in(i)}, {out});
        attr(c, "axis", int64_t(1));
        return;
      }
      case LayerKind::NadarayaWatson:
        return nadarayaWatson(i);
      case LayerKind::ValidLength: {
        // (ids != pad_id).sum(1), keeping the axis: [N, T] ids give [N, 1] lengths, as gpunodes' layer.
        const std::string padded = id(i) + "/is_pad";
        node("Equal", id(i), {in(i), constFloats(i, "pad_id", {}, {float(l.pad_id)})}, {padded});
        const std::string kept = step(i, "Not", "kept", {padded});
        NodeProto* c = nullptr;
        const std::string counted = step(i, "Cast", "counted", {kept}, &c);
        attr(c, "to", int64_t(TensorProto::FLOAT));
        NodeProto* sum = node("ReduceSum", id(i) + "/sum", {counted, constInts(i, "axes", {1})}, {out});
        attr(sum, "keepdims", int64_t(1));
        return;
      }
    }
    refuse(i, "has no ONNX form");
  }

  std::string castToInt(size_t i, const std::string& x) {
    NodeProto* n = nullptr;
    const std::string ids = step(i, "Cast", "ids", {x}, &n);
    attr(n, "to", int64_t(TensorProto::INT64));
    return ids;
  }
  std::string transposed(size_t i, const std::string& what, const std::string& x,
                         const std::vector<int64_t>& perm) {
    NodeProto* n = nullptr;
    const std::string t = step(i, "Transpose", what, {x}, &n);
    attr(n, "perm", perm);
    return t;
  }
  std::string reshaped(size_t i, const std::string& what, const std::string& x,
                       const std::vector<int64_t>& shape) {
    return step(i, "Reshape", what, {x, constInts(i, what + "_shape", shape)});
  }
  std::string unsqueezed(size_t i, const std::string& what, const std::string& x, int64_t axis) {
    return step(i, "Unsqueeze", what, {x, constInts(i, what + "_axes", {axis})});
  }
  // Split of `x` along axis 0 into `parts` equal pieces.
  std::vector<std::string> split(size_t i, const std::string& what, const std::string& x, int64_t parts,
                                 int64_t size) {
    std::vector<std::string> outs;
    for (int64_t k = 0; k < parts; ++k) outs.push_back(id(i) + "/" + what + "_" + std::to_string(k));
    NodeProto* n = node("Split", id(i) + "/" + what,
                        {x, constInts(i, what + "_sizes", std::vector<int64_t>(size_t(parts), size))}, outs);
    attr(n, "axis", int64_t(0));
    return outs;
  }
  // x W^T (+ b) on the last axis.
  std::string project(size_t i, const std::string& what, const std::string& x, const std::string& w,
                      const std::string& b) {
    const std::string mm = step(i, "MatMul", what, {x, transposed(i, what + "_wt", w, {1, 0})});
    return b.empty() ? mm : step(i, "Add", what + "_b", {mm, b});
  }

  // nn.RNN / GRU / LSTM (batch_first) as one ONNX RNN / GRU / LSTM per layer, time-major in between: ONNX's
  // gates are ordered i, o, f, c (LSTM; torch: i, f, g, o) and z, r, h (GRU; torch: r, z, n, with the reset
  // applied after the recurrent product: linear_before_reset), so the weights, read as torch's, are split
  // into gates and put together again in ONNX's order by the graph itself; the initializers stay torch's.
  void recurrent(size_t i) {
    const LayerSpec& l = net_.layers[i];
    const int64_t t = inShape(i)[0], h = l.features, dirs = l.bidirectional ? 2 : 1;
    const char* op = l.kind == LayerKind::LSTM ? "LSTM" : l.kind == LayerKind::GRU ? "GRU" : "RNN";
    const std::vector<int64_t> order = l.kind == LayerKind::LSTM  ? std::vector<int64_t>{0, 3, 1, 2}
                                       : l.kind == LayerKind::GRU ? std::vector<int64_t>{1, 0, 2}
                                                                  : std::vector<int64_t>{0};
    const int64_t gates = int64_t(order.size());
    auto reorder = [&](const std::string& tensor, const std::string& what) -> std::string {
      if (gates == 1) return tensor;
      const std::vector<std::string> parts = split(i, what + "_gates", tensor, gates, h);
      std::vector<std::string> ordered;
      for (int64_t g : order) ordered.push_back(parts[size_t(g)]);
      NodeProto* n = nullptr;
      const std::string r = step(i, "Concat", what + "_onnx", ordered, &n);
      attr(n, "axis", int64_t(0));
      return r;
    };
    auto stacked = [&](const std::vector<std::string>& perDir, const std::string& what) -> std::string {
      std::vector<std::string> u;
      for (size_t d = 0; d < perDir.size(); ++d)
        u.push_back(unsqueezed(i, what + "_d" + std::to_string(d), perDir[d], 0));
      if (u.size() == 1) return u[0];
      NodeProto* n = nullptr;
      const std::string r = step(i, "Concat", what, u, &n);
      attr(n, "axis", int64_t(0));
      return r;
    };
    std::string x = transposed(i, "time_major", in(i), {1, 0, 2});  // [T, N, F]
    std::string y;
    for (int64_t layer = 0; layer < l.num_layers; ++layer) {
      const std::string L = "l" + std::to_string(layer);
      std::vector<std::string> w, r, b;
      for (int64_t d = 0; d < dirs; ++d) {
        const std::string sfx = "_l" + std::to_string(layer) + (d == 0 ? "" : "_reverse");
        const std::string tag = L + (d == 0 ? "" : "_reverse");
        w.push_back(reorder(param(i, "weight_ih" + sfx), "w_" + tag));
        r.push_back(reorder(param(i, "weight_hh" + sfx), "r_" + tag));
        if (l.bias) {
          NodeProto* n = nullptr;
          b.push_back(step(i, "Concat", "b_" + tag,
                           {reorder(param(i, "bias_ih" + sfx), "bi_" + tag),
                            reorder(param(i, "bias_hh" + sfx), "bh_" + tag)},
                           &n));
          attr(n, "axis", int64_t(0));
        }
      }
      std::vector<std::string> ins{x, stacked(w, "W_" + L), stacked(r, "R_" + L)};
      if (l.bias) ins.push_back(stacked(b, "B_" + L));
      y = id(i) + "/Y_" + L;
      NodeProto* n = node(op, layer == 0 ? id(i) : id(i) + "/" + op + "_" + L, ins, {y});
      attr(n, "hidden_size", h);
      attr(n, "direction", std::string(dirs == 2 ? "bidirectional" : "forward"));
      if (l.kind == LayerKind::GRU) attr(n, "linear_before_reset", int64_t(1));
      if (l.kind == LayerKind::RNN)
        attr(n, "activations", std::vector<std::string>(size_t(dirs), l.relu ? "Relu" : "Tanh"));
      // Y is [T, dirs, N, H]; the next layer reads [T, N, dirs * H] (dropout between layers is the identity).
      if (layer + 1 < l.num_layers)
        x = reshaped(i, "x_l" + std::to_string(layer + 1), transposed(i, "y_" + L, y, {0, 2, 1, 3}),
                     {0, 0, dirs * h});
    }
    // [T, dirs, N, H] -> [N, T, dirs * H]: each step's forward features, then the backward ones, as torch.
    step(i, "Reshape", "out",
         {transposed(i, "batch_major", y, {2, 0, 1, 3}), constInts(i, "out_shape", {0, t, dirs * h})});
    // The layer's value is its id: an Identity names it.
    node("Identity", id(i) + "/Identity", {id(i) + "/out"}, {value(i)});
  }

  // nn.MultiheadAttention (batch_first, fused in_proj) as MatMuls and a Softmax: the projections, the heads
  // split apart, scores scaled by 1/sqrt(d) (with the causal mask added), softmax, the weighted values, the
  // heads merged and the output projection. Dropout on the weights is the identity in evaluation. With
  // valid_lens, keys at or past a sample's length get no weight (the key padding mask).
  void attention(size_t i) {
    const LayerSpec& l = net_.layers[i];
    // An open port is -1 (k and v may be open before a wired valid_lens): k defaults to q, v to k.
    auto wired = [&](size_t k) { return l.inputs.size() > k && l.inputs[k] >= 0; };
    const std::string xq = in(i, 0), xk = wired(1) ? in(i, 1) : xq, xv = wired(2) ? in(i, 2) : xk;
    const int64_t e = inShape(i)[1], tq = inShape(i)[0], tk = wired(1) ? inShape(i, 1)[0] : tq;
    const int64_t heads = l.heads, d = e / heads;
    const std::vector<std::string> w = split(i, "in_proj", param(i, "in_proj_weight"), 3, e);
    std::vector<std::string> b(3);
    if (hasParam(i, "in_proj_bias")) b = split(i, "in_proj_b", param(i, "in_proj_bias"), 3, e);
    const std::string q = project(i, "q", xq, w[0], b[0]), k = project(i, "k", xk, w[1], b[1]),
                      v = project(i, "v", xv, w[2], b[2]);
    const std::string qh =
        transposed(i, "q_heads", reshaped(i, "q_split", q, {0, tq, heads, d}), {0, 2, 1, 3});
    const std::string kt =
        transposed(i, "k_heads", reshaped(i, "k_split", k, {0, tk, heads, d}), {0, 2, 3, 1});
    const std::string vh =
        transposed(i, "v_heads", reshaped(i, "v_split", v, {0, tk, heads, d}), {0, 2, 1, 3});
    const std::string raw = step(i, "MatMul", "scores_raw", {qh, kt});
    std::string scores =
        step(i, "Mul", "scores", {raw, constFloats(i, "alpha", {}, {1.0f / std::sqrt(float(d))})});
    if (l.causal) scores = step(i, "Add", "scores_masked", {scores, causalMask(i, tq, tk)});
    std::string keep;  // [N, 1, 1, Tk]: 1 for the keys before the sample's length, else 0
    if (wired(3)) {
      // The masked scores become -1e9 before the Softmax and its weights are multiplied by the mask after
      // it: a sample of length 0 then gets all-zero weights, as gpunodes computes them, not the uniform
      // row of the -1e9 alone or the NaN of a row of -inf.
      std::vector<float> index(static_cast<size_t>(tk));
      for (int64_t k = 0; k < tk; ++k) index[size_t(k)] = float(k);
      const std::string lens = reshaped(i, "lens", in(i, 3), {0, 1, 1, 1});
      const std::string valid = step(i, "Less", "valid", {constFloats(i, "key_index", {tk}, index), lens});
      scores = step(i, "Where", "scores_padded", {valid, scores, constFloats(i, "masked", {}, {-1e9f})});
      NodeProto* c = nullptr;
      keep = step(i, "Cast", "keep", {valid}, &c);
      attr(c, "to", int64_t(TensorProto::FLOAT));
    }
    NodeProto* sm = nullptr;
    std::string weights = step(i, "Softmax", "weights", {scores}, &sm);
    attr(sm, "axis", int64_t(-1));
    if (!keep.empty()) weights = step(i, "Mul", "weights_kept", {weights, keep});
    const std::string heads_out = step(i, "MatMul", "context", {weights, vh});
    const std::string merged =
        reshaped(i, "merged", transposed(i, "context_t", heads_out, {0, 2, 1, 3}), {0, tq, e});
    const std::string y = project(i, "out_proj", merged, param(i, "out_proj.weight"),
                                  hasParam(i, "out_proj.bias") ? param(i, "out_proj.bias") : std::string());
    node("Identity", id(i), {y}, {value(i)});
  }

  // d2l 11.2's Nadaraya-Watson regression on rows (query, key, value): softmax_j(-((q_i - k_j) w)^2 / 2)
  // weighs the values (evaluation: no key is masked).
  void nadarayaWatson(size_t i) {
    const int64_t t = inShape(i)[0];
    auto column = [&](const char* what, int64_t c) {
      NodeProto* n = nullptr;
      const std::string r =
          step(i, "Gather", what, {in(i), constInts(i, std::string(what) + "_index", {c}, true)}, &n);
      attr(n, "axis", int64_t(2));
      return r;
    };
    const std::string q = column("q", 0), k = column("k", 1), v = column("v", 2);
    const std::string diff =
        step(i, "Sub", "diff", {unsqueezed(i, "q_rows", q, 2), unsqueezed(i, "k_cols", k, 1)});
    const std::string scaled = step(i, "Mul", "scaled", {diff, param(i, "w")});
    const std::string squared = step(i, "Mul", "squared", {scaled, scaled});
    const std::string scores = step(i, "Mul", "scores", {squared, constFloats(i, "minus_half", {}, {-0.5f})});
    NodeProto* sm = nullptr;
    const std::string weights = step(i, "Softmax", "weights", {scores}, &sm);
    attr(sm, "axis", int64_t(-1));
    const std::string y = step(i, "MatMul", "pooled", {weights, unsqueezed(i, "v_col", v, 2)});
    node("Reshape", id(i), {y, constInts(i, "out_shape", {0, t})}, {value(i)});
  }

  void linear(size_t i) {
    const LayerSpec& l = net_.layers[i];
    const std::string out = value(i);
    if (inShape(i).size() == 1) {
      // [N, in] x [out, in]^T + [out]: a Gemm with transB, reading the weight as it is stored.
      std::vector<std::string> ins{in(i), param(i, "weight")};
      if (l.bias) ins.push_back(param(i, "bias"));
      NodeProto* n = node("Gemm", id(i), ins, {out});
      attr(n, "transB", int64_t(1));
      return;
    }
    // On the last axis of a sequence: MatMul by the transposed weight, then the bias.
    NodeProto* t = nullptr;
    const std::string wt = step(i, "Transpose", "weight_t", {param(i, "weight")}, &t);
    attr(t, "perm", std::vector<int64_t>{1, 0});
    if (!l.bias) {
      node("MatMul", id(i), {in(i), wt}, {out});
      return;
    }
    const std::string mm = id(i) + "/matmul";
    node("MatMul", id(i), {in(i), wt}, {mm});
    node("Add", id(i) + "/add", {mm, param(i, "bias")}, {out});
  }

  // Softmax over the last axis of [Tq, Tk] scores where query t sees keys 0..t (t + Tk - Tq when there are
  // more keys than queries, as gpunodes' causal mask).
  void causalSoftmax(size_t i, const std::string& x, const std::string& out, const std::string& name) {
    const Shape& s = inShape(i);
    if (s.size() != 2) refuse(i, "a causal Softmax needs [queries, keys] scores");
    const std::string m = causalMask(i, s[0], s[1]);
    const std::string masked = id(i) + "/masked";
    node("Add", name, {x, m}, {masked});
    NodeProto* n = node("Softmax", id(i) + "/softmax", {masked}, {out});
    attr(n, "axis", int64_t(-1));
  }

  std::string causalMask(size_t i, int64_t tq, int64_t tk) {
    std::vector<float> mask(size_t(tq * tk), 0.0f);
    for (int64_t q = 0; q < tq; ++q)
      for (int64_t k = 0; k < tk; ++k)
        if (k > q + (tk - tq)) mask[size_t(q * tk + k)] = -INFINITY;
    return constFloats(i, "causal_mask", {tq, tk}, mask);
  }

  const nn::Model& model_;
  ExportInfo info_;
  nn::NetworkSpec net_;
  std::vector<nn::LayerInfo> info_s_;
  std::map<std::string, const nn::Parameter*> params_;
  std::set<std::string> used_;
  ::onnx::GraphProto* g_ = nullptr;
  QStringList warnings_;
};

}  // namespace

QStringList exportNetwork(const nn::Model& model, const ExportInfo& info, const QString& path,
                          const std::function<void(double, const QString&)>& progress) {
  Exporter e(model, info);
  const ::onnx::ModelProto m = e.run(progress);
  const size_t bytes = m.ByteSizeLong();
  if (bytes >= (size_t(1) << 31) - 1)
    throw OnnxError("the model needs " + std::to_string(bytes >> 20) +
                    " MiB, over protobuf's 2 GiB limit for one file (external data is not written)");
  if (progress) progress(0.8, "writing " + path);
  std::string out;
  if (!m.SerializeToString(&out)) throw OnnxError("the model could not be serialized");
  // Written to a temporary file beside it and renamed: a failure leaves nothing, and no half file.
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly))
    throw OnnxError(path.toStdString() + ": cannot write: " + f.errorString().toStdString());
  if (f.write(out.data(), qint64(out.size())) != qint64(out.size()) || !f.commit())
    throw OnnxError(path.toStdString() + ": cannot write: " + f.errorString().toStdString());
  return e.warnings();
}

}  // namespace gn::nodes::onnx
