#include "onnx_importer_internal.h"

#include <algorithm>
#include <cstring>

#include "../layer_nodes.h"

namespace gn::nodes::onnx::import_detail {

void Importer::readNode() {
  const std::string& op = node_->op_type();
  if (op == "Conv") return conv();
  if (op == "BatchNormalization") return batchNorm();
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh") {
    const LayerKind k = op == "Relu" ? LayerKind::ReLU : op == "Sigmoid" ? LayerKind::Sigmoid : LayerKind::Tanh;
    return setLayer(addLayer(k, {}, {layerIn(0)}));
  }
  if (op == "MaxPool" || op == "AveragePool") return pool(op == "MaxPool");
  if (op == "Pad") return pad();
  if (op == "GlobalAveragePool") return setLayer(addLayer(LayerKind::GlobalAvgPool2d, {}, {layerIn(0)}));
  if (op == "Flatten") {
    const int in = layerIn(0);
    const int64_t axis = attrInt("axis", 1);
    if (axis != 1 && axis != -int64_t(shapeOf(in).size()))
      fail("axis " + str(axis) + ": gpunodes flattens everything after the batch axis (axis 1)");
    return setLayer(addLayer(LayerKind::Flatten, {}, {in}));
  }
  if (op == "Gemm") return gemm();
  if (op == "MatMul") return matMul();
  if (op == "Mul") return mul();
  if (op == "Expand") return expand();
  if (op == "Add") return add();
  if (op == "Concat") return concat();
  if (op == "Dropout") return dropout();
  if (op == "Identity") return alias(0);
  if (op == "Reshape") return reshape();
  if (op == "Transpose") return transpose();
  if (op == "Softmax") return softmax();
  if (op == "LayerNormalization") return layerNorm();
  if (op == "Constant") return constant();
  if (op == "Shape") return shape();
  if (op == "Gather") return gather();
  if (op == "Unsqueeze" || op == "Squeeze") return squeeze(op == "Unsqueeze");
  if (op == "Slice") return slice();
  if (op == "Cast") {
    Value v = value(0);
    if (v.kind != Value::Const) {
      // torch's Embedding and one_hot cast the ids to int64 and one_hot's result back to float: gpunodes'
      // token ids are exact integers held as floats, so both are the identity here.
      const int64_t to = attrInt("to", 0);
      if (to != ::onnx::TensorProto::INT64 && to != ::onnx::TensorProto::INT32 && to != ::onnx::TensorProto::FLOAT)
        fail("casts an activation to type " + str(to) + "; gpunodes computes in float32 (token ids as integers)");
      layerIn(0);
    }
    return setOutput(0, std::move(v));
  }
  if (op == "ConstantOfShape") return constantOfShape();
  if (op == "Split") return split();
  if (op == "OneHot") return oneHot();
  if (op == "RNN" || op == "GRU" || op == "LSTM") return recurrent();
  fail("operator " + op + " (opset " + str(m_.opset) + ") is not supported: gpunodes imports " +
       supportedOps().toStdString() + " (see docs/onnx.md)");
}

Importer::Window Importer::window(const std::vector<int64_t>& kernelDefault) const {
  Window w;
  std::vector<int64_t> k = attrInts("kernel_shape");
  if (k.empty()) k = kernelDefault;
  if (k.size() != 2 || k[0] != k[1]) fail("kernel_shape must be square and 2-D (gpunodes' square kernels)");
  w.kernel = k[0];
  const std::vector<int64_t> s = attrInts("strides");
  if (!s.empty() && (s.size() != 2 || s[0] != s[1])) fail("strides must be equal in both axes");
  w.stride = s.empty() ? 1 : s[0];
  const std::vector<int64_t> p = attrInts("pads");
  if (!p.empty() && (p.size() != 4 || p[0] != p[1] || p[0] != p[2] || p[0] != p[3]))
    fail("pads must be the same on every side");
  w.pad = p.empty() ? 0 : p[0];
  for (int64_t d : attrInts("dilations"))
    if (d != 1) fail("dilations other than 1 are not supported");
  const std::string autoPad = attrString("auto_pad", "NOTSET");
  if (autoPad != "NOTSET" && !(autoPad == "VALID" && w.pad == 0))
    fail("auto_pad " + autoPad + " is not supported: give explicit pads");
  if (w.kernel < 1 || w.kernel > 4096 || w.stride < 1 || w.stride > 4096 || w.pad < 0 || w.pad > 4096)
    fail("kernel " + str(w.kernel) + ", stride " + str(w.stride) + " or pads " + str(w.pad) + " out of range");
  return w;
}

void Importer::conv() {
  const int in = layerIn(0);
  const TensorValues& w = constIn(1, "the weight");
  if (w.dims.size() != 4) fail("the weight must be 4-D [out, in / group, kH, kW]: gpunodes has 2-D convolutions");
  const Window win = window({w.dims[2], w.dims[3]});
  const int64_t groups = attrInt("group", 1);
  const Shape& s = shapeOf(in);
  if (s.size() != 3) fail("needs a [C, H, W] input, got " + shapeStr(s));
  if (groups < 1 || s[0] % groups) fail("group " + str(groups) + " does not divide the " + str(s[0]) + " channels");
  needDims(w, {w.dims[0], s[0] / groups, win.kernel, win.kernel}, "the weight");
  std::vector<std::pair<std::string, TensorValues>> weights{{"weight", w}};
  if (has(2)) {
    const TensorValues& b = constIn(2, "the bias");
    needDims(b, {w.dims[0]}, "the bias");
    weights.emplace_back("bias", b);
  }
  setLayer(addLayer(LayerKind::Conv2d,
                    {{"out_channels", qint64(w.dims[0])}, {"kernel_size", qint64(win.kernel)},
                     {"stride", qint64(win.stride)}, {"padding", qint64(win.pad)}, {"groups", qint64(groups)},
                     {"bias", has(2)}},
                    {in}, std::move(weights)));
}

void Importer::batchNorm() {
  const int in = layerIn(0);
  onlyFirstOutput();
  if (attrInt("training_mode", 0) != 0) fail("training_mode 1: export the model in evaluation mode");
  const Shape& s = shapeOf(in);
  if (s.size() != 3 && s.size() != 1)
    fail("needs a [C, H, W] or [features] input (BatchNorm2d, BatchNorm1d), got " + shapeStr(s));
  const int64_t c = s[0];
  const char* names[] = {"weight", "bias", "running_mean", "running_var"};
  const char* what[] = {"scale", "B", "input_mean", "input_var"};
  std::vector<std::pair<std::string, TensorValues>> weights;
  for (int k = 0; k < 4; ++k) {
    const TensorValues& t = constIn(k + 1, what[k]);
    needDims(t, {c}, what[k]);
    weights.emplace_back(names[k], t);
  }
  // ONNX's momentum weighs the running value (running * momentum + batch * (1 - momentum)); PyTorch's the
  // batch.
  const double momentum = shortest(float(1.0 - attrFloat("momentum", 0.9)));
  setLayer(addLayer(s.size() == 3 ? LayerKind::BatchNorm2d : LayerKind::BatchNorm1d,
                    {{"eps", attrFloat("epsilon", 1e-5)}, {"momentum", std::clamp(momentum, 0.0, 1.0)}}, {in},
                    std::move(weights)));
}

void Importer::pool(bool max) {
  Value& v = value(0);
  const int64_t padBefore = v.kind == Value::Layer ? v.pad : 0;
  const int in = layerIn(0, !max);
  onlyFirstOutput();
  if (shapeOf(in).size() != 3) fail("needs a [C, H, W] input, got " + shapeStr(shapeOf(in)));
  Window w = window({});
  if (attrInt("ceil_mode", 0) != 0) fail("ceil_mode 1 is not supported (PyTorch's default, 0, is)");
  if (max && attrInt("storage_order", 0) != 0) fail("storage_order 1 is not supported");
  if (!max && w.pad > 0 && attrInt("count_include_pad", 0) == 0)
    fail("pads without count_include_pad: gpunodes' AvgPool2d counts padded cells (count_include_pad=1)");
  if (padBefore && w.pad) fail("both a Pad before it and pads of its own");
  w.pad += padBefore;
  setLayer(addLayer(max ? LayerKind::MaxPool2d : LayerKind::AvgPool2d,
                    {{"kernel_size", qint64(w.kernel)}, {"stride", qint64(w.stride)}, {"padding", qint64(w.pad)}},
                    {in}));
}

void Importer::pad() {
  Value v = value(0);
  if (v.kind != Value::Layer) fail("pads a constant");
  const int in = layerIn(0);
  if (attrString("mode", "constant") != "constant") fail("mode " + attrString("mode", "") + ": only constant zero padding");
  std::vector<int64_t> pads;
  if (has(1)) pads = ints(constIn(1, "pads"), "pads");
  else pads = attrInts("pads");
  if (has(2)) {
    const TensorValues& c = constIn(2, "constant_value");
    if (c.numel() != 1 || (c.integer ? c.i[0] : c.f[0]) != 0) fail("pads with a value other than 0");
  }
  if (has(3)) fail("the axes input is not supported");
  const size_t rank = shapeOf(in).size() + 1;
  if (pads.size() != 2 * rank) fail("has " + str(pads.size()) + " pads for a " + str(rank) + "-D input");
  bool zero = true;
  for (int64_t p : pads) zero = zero && p == 0;
  if (zero) return setOutput(0, v);  // torch writes one of zeros before a pool without padding
  if (rank != 4 || pads[0] || pads[1] || pads[4] || pads[5] || pads[2] != pads[3] || pads[2] != pads[6] ||
      pads[2] != pads[7] || pads[2] < 0 || pads[2] > 4096)
    fail("pads only H and W by the same amount on every side, before an AveragePool");
  v.pad = pads[2];
  v.padNode = node_->name();
  setOutput(0, v);
}

void Importer::gemm() {
  const int in = layerIn(0);
  if (attrInt("transA", 0) != 0) fail("transA 1 is not supported");
  if (shapeOf(in).size() != 1) fail("needs a flat [features] input, got " + shapeStr(shapeOf(in)));
  const TensorValues& w = constIn(1, "B (the weight)");
  const TensorValues* c = has(2) ? &constIn(2, "C (the bias)") : nullptr;
  setLayer(linear(in, w, attrInt("transB", 0) != 0, attrFloat("alpha", 1.0), c, attrFloat("beta", 1.0),
                  "B (the weight)"));
}

void Importer::add() {
  Value &a = value(0), &b = value(1);
  if (a.kind == Value::Const && b.kind == Value::Const) return setOutput(0, arithmetic(a.c, b.c, '+'));
  if (a.kind != b.kind) return addConstant(a.kind == Value::Layer ? 0 : 1);
  setLayer(addLayer(LayerKind::Add, {}, {layerIn(0), layerIn(1)}));
}

Value Importer::arithmetic(const TensorValues& a, const TensorValues& b, char op) const {
  if (!a.integer || !b.integer) fail("computes with float constants, which gpunodes does not fold");
  if (a.numel() != b.numel() && a.numel() != 1 && b.numel() != 1) fail("constants of different sizes");
  Value v;
  v.c.integer = true;
  v.c.dims = a.numel() >= b.numel() ? a.dims : b.dims;
  const int64_t n = std::max(a.numel(), b.numel());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t x = a.i[a.numel() == 1 ? 0 : k], y = b.i[b.numel() == 1 ? 0 : k];
    if (x == kBatch || y == kBatch) fail("computes with the batch size, which a gpunodes network does not fix");
    int64_t sum = x;
    if (op == '+' && __builtin_add_overflow(x, y, &sum)) fail("adds constants beyond 64 bits");
    v.c.i.push_back(sum);
  }
  return v;
}

void Importer::concat() {
  // A ClassToken: its token, expanded over the batch, put before the steps.
  if (node_->input_size() == 2 && value(0).kind == Value::Const && value(0).expanded) return classToken();
  bool allConst = true;
  for (int k = 0; k < node_->input_size(); ++k) allConst = allConst && value(k).kind == Value::Const;
  const int64_t axis = attrInt("axis", 0);
  if (allConst && (!value(0).c.integer || value(0).c.dims.size() != 1)) return concatConst(axis);
  if (allConst) {  // shape arithmetic: 1-D integer vectors
    Value v;
    v.c.integer = true;
    for (int k = 0; k < node_->input_size(); ++k) {
      const TensorValues& t = value(k).c;
      if (!t.integer || t.dims.size() != 1) fail("joins constants that are not 1-D integer vectors");
      v.c.i.insert(v.c.i.end(), t.i.begin(), t.i.end());
    }
    v.c.dims = {int64_t(v.c.i.size())};
    return setOutput(0, std::move(v));
  }
  if (node_->input_size() < 2) return alias(0);
  int acc = layerIn(0);
  const int64_t rank = int64_t(shapeOf(acc).size()) + 1;
  if (axis != 1 && axis != 1 - rank)
    fail("axis " + str(axis) + ": gpunodes joins along the channel axis (axis 1)");
  // Three or more inputs: Concats in a chain, each named after the node.
  for (int k = 1; k < node_->input_size(); ++k) acc = addLayer(LayerKind::Concat, {}, {acc, layerIn(k)});
  setLayer(acc);
}

void Importer::dropout() {
  const int in = layerIn(0);
  onlyFirstOutput();
  double p = attrFloat("ratio", 0.5);
  if (has(1)) {
    const TensorValues& r = constIn(1, "ratio");
    if (r.numel() != 1 || r.integer) fail("ratio must be one float");
    p = shortest(r.f[0]);
  }
  if (!(p >= 0 && p <= 0.99)) fail("ratio " + std::to_string(p) + " outside [0, 0.99]");
  setLayer(addLayer(LayerKind::Dropout, {{"p", p}}, {in}));
}

std::vector<int64_t> Importer::ints(const TensorValues& t, const char* what) const {
  if (!t.integer) fail(std::string(what) + " must be integers");
  if (t.dims.size() > 1) fail(std::string(what) + " must be a 1-D vector");
  return t.i;
}

void Importer::reshape() {
  if (Value& v = value(0); v.kind == Value::Layer && v.form != Value::Batch) return reshapeRecurrent(v);
  const int in = layerIn(0);
  const std::vector<int64_t> target = ints(constIn(1, "the shape"), "the shape");
  if (attrInt("allowzero", 0) != 0) fail("allowzero 1 is not supported");
  const Shape& s = shapeOf(in);
  if (target.empty() || !(target[0] == kBatch || target[0] == 0 || target[0] == -1))
    fail("reshapes to " + shapeStr(target) + ", which does not keep the batch axis first");
  QJsonArray per;
  bool minusOne = target[0] == -1;
  for (size_t k = 1; k < target.size(); ++k) {
    int64_t d = target[k];
    if (d == 0) {
      if (k > s.size()) fail("copies axis " + str(k) + " of a " + shapeStr(s) + " input");
      d = s[k - 1];
    }
    if (d == kBatch) fail("puts the batch size at axis " + str(k));
    if (d == -1) {
      if (minusOne) fail("reshapes to " + shapeStr(target) + ", with two axes to infer");
      minusOne = true;
    }
    if (d < -1 || d > kMaxDim) fail("reshapes to " + shapeStr(target));
    per.append(qint64(d));
  }
  if (per.isEmpty() || per.size() > 4) fail("reshapes to " + shapeStr(target) + ": gpunodes takes 1 to 4 axes per sample");
  if (target[0] == -1) {  // [-1, rest...]: the rest is the sample, whatever the batch
    for (const QJsonValue& d : per)
      if (d.toInteger() == -1) fail("reshapes to " + shapeStr(target));
  }
  Shape want;
  for (const QJsonValue& d : per) want.push_back(d.toInteger());
  if (want == s) return setLayer(in);
  setLayer(addLayer(LayerKind::Reshape, {{"shape", per}}, {in}));
}

void Importer::transpose() {
  Value& v = value(0);
  if (v.kind == Value::Const) return transposeConst(v.c);
  std::vector<int64_t> perm = attrInts("perm");
  if (v.form != Value::Batch || (perm == std::vector<int64_t>{1, 0, 2} && !v.pad)) {
    Value w = v;
    w.fromRec = false;
    if (v.form == Value::Batch && shapeOf(v.layer).size() == 2) w.form = Value::TimeMajor;  // batch_first in
    else if (v.form == Value::TimeMajor && perm == std::vector<int64_t>{1, 0, 2}) w.form = Value::Batch;
    else if (v.form == Value::RecY && perm == std::vector<int64_t>{0, 2, 1, 3}) w.form = Value::RecYT;
    else if (v.form == Value::RecY && perm == std::vector<int64_t>{2, 0, 1, 3}) w.form = Value::RecNTDH;
    else if (v.form == Value::Batch) fail("moves the batch axis");
    else fail("permutes " + quoted(node_->input(0)) + " (a recurrent op's output or a time-major sequence) in a "
              "way gpunodes does not follow: it takes torch's and its own Transposes around RNN, GRU and LSTM");
    return setOutput(0, w);
  }
  if (transposedForMatMul(v, perm)) return;
  const int in = layerIn(0);
  const size_t rank = shapeOf(in).size() + 1;
  if (perm.empty())
    for (size_t k = 0; k < rank; ++k) perm.push_back(int64_t(rank - 1 - k));
  if (perm.size() != rank) fail("perm has " + str(perm.size()) + " axes for a " + str(rank) + "-D input");
  if (perm[0] != 0) fail("moves the batch axis");
  std::vector<int64_t> moved;
  for (size_t k = 0; k < rank; ++k)
    if (perm[k] != int64_t(k)) moved.push_back(int64_t(k));
  if (moved.empty()) return setLayer(in);
  if (moved.size() != 2 || perm[moved[0]] != moved[1] || perm[moved[1]] != moved[0])
    fail("perm swaps more than two axes: gpunodes' Transpose swaps two");
  setLayer(addLayer(LayerKind::Transpose, {{"dim0", qint64(moved[0] - 1)}, {"dim1", qint64(moved[1] - 1)}}, {in}));
}

void Importer::softmax() {
  // Scores with gpunodes' causal mask added (addConstant): a causal Softmax, named after that Add.
  const Value& v = value(0);
  const std::string maskNode = v.kind == Value::Layer ? v.maskNode : std::string();
  const int in = maskNode.empty() ? layerIn(0) : v.layer;
  const int64_t rank = int64_t(shapeOf(in).size()) + 1;
  const int64_t axis = attrInt("axis", m_.opset >= 13 ? -1 : 1);
  if (axis != -1 && axis != rank - 1) fail("axis " + str(axis) + ": gpunodes' Softmax is over the last axis");
  if (!maskNode.empty())
    return setLayer(addLayer(LayerKind::Softmax, maskNode, {{"causal", true}}, {in}, {}, where()));
  setLayer(addLayer(LayerKind::Softmax, {{"causal", false}}, {in}));
}

void Importer::layerNorm() {
  const int in = layerIn(0);
  onlyFirstOutput();
  const TensorValues* b = has(2) ? &constIn(2, "B") : nullptr;
  const TensorValues& scale = constIn(1, "Scale");
  // gpunodes' export writes a LayerNorm without affine params with Constant nodes of ones and zeros: the
  // initializers are the parameters, and these are none, so the layer comes back without them.
  auto all = [](const TensorValues& t, float want) {
    return !t.integer && std::all_of(t.f.begin(), t.f.end(), [&](float f) { return f == want; });
  };
  const bool affine = !(isConstantNode(node_->input(1)) && all(scale, 1.0f) &&
                        (!b || (isConstantNode(node_->input(2)) && all(*b, 0.0f))));
  setLayer(layerNormLayer(in, attrInt("axis", -1), attrFloat("epsilon", 1e-5), &scale, b, affine));
}

int Importer::layerNormLayer(int in, int64_t axis, double eps, const TensorValues* scale, const TensorValues* bias,
                             bool affine) {
  const Shape& s = shapeOf(in);
  if (s.empty()) fail("normalises a scalar");
  const int64_t rank = int64_t(s.size()) + 1;
  if (axis != -1 && axis != rank - 1) fail("axis " + str(axis) + ": gpunodes' LayerNorm normalises the last axis");
  const int64_t e = s.back();
  TensorValues w, b;
  if (scale) {
    needDims(*scale, {e}, "Scale");
    w = *scale;
  } else {
    w.dims = {e};
    w.f.assign(size_t(e), 1.0f);
  }
  if (bias) {
    needDims(*bias, {e}, "B");
    b = *bias;
  } else {
    b.dims = {e};
    b.f.assign(size_t(e), 0.0f);
  }
  if (!affine)
    return addLayer(LayerKind::LayerNorm,
                    {{"normalized_shape", qint64(e)}, {"eps", eps}, {"elementwise_affine", false}}, {in});
  return addLayer(LayerKind::LayerNorm,
                  {{"normalized_shape", qint64(e)}, {"eps", eps}, {"elementwise_affine", true}}, {in},
                  {{"weight", std::move(w)}, {"bias", std::move(b)}});
}

}  // namespace gn::nodes::onnx::import_detail
