#include "onnx_importer_internal.h"

#include <algorithm>
#include <cstring>

#include "../layer_nodes.h"

namespace gn::nodes::onnx::import_detail {

int Importer::stepLayer(int in, int64_t step) {
  const Shape& s = shapeOf(in);
  if (s.size() != 2) fail("takes one step of a " + shapeStr(s) + " input: gpunodes' LastStep and FirstStep read [T, F]");
  const int64_t t = s[0];
  if (step < 0) step += t;
  if (step != t - 1 && step != 0)
    fail("takes step " + str(step) + " of " + str(t) + ": gpunodes takes the last (LastStep) or the first (FirstStep)");
  return addLayer(step == t - 1 ? LayerKind::LastStep : LayerKind::FirstStep, {}, {in});
}

void Importer::gatherStep() {
  const int in = layerIn(0);
  if (attrInt("axis", 0) != 1) fail("gathers an activation along axis " + str(attrInt("axis", 0)) +
                                    ": gpunodes takes one step of a sequence (axis 1)");
  const TensorValues& idx = constIn(1, "the indices");
  if (!idx.integer || !idx.dims.empty() || idx.i.size() != 1)
    fail("gathers steps by a non-scalar index: gpunodes takes one step, the last or the first");
  setLayer(stepLayer(in, idx.i[0]));
}

void Importer::sliceStep() {
  const int in = layerIn(0);
  const Shape& s = shapeOf(in);
  const std::vector<int64_t> starts = ints(constIn(1, "starts"), "starts"), ends = ints(constIn(2, "ends"), "ends");
  const std::vector<int64_t> axes = has(3) ? ints(constIn(3, "axes"), "axes") : std::vector<int64_t>{0};
  const std::vector<int64_t> steps = has(4) ? ints(constIn(4, "steps"), "steps") : std::vector<int64_t>{1};
  if (s.size() != 2 || starts.size() != 1 || ends.size() != 1 || axes.size() != 1 || (axes[0] != 1 && axes[0] != -2) ||
      steps != std::vector<int64_t>{1})
    fail("slices an activation other than along the steps of a sequence [T, F] (axis 1, step 1)");
  const int64_t t = s[0];
  int64_t b = starts[0] < 0 ? starts[0] + t : starts[0], e = ends[0] < 0 ? ends[0] + t : ends[0];
  b = std::clamp<int64_t>(b, 0, t);
  e = std::clamp<int64_t>(e, b, t);
  if (e - b != 1 || (b != 0 && b != t - 1))
    fail("slices steps [" + str(b) + ", " + str(e) + ") of " + str(t) +
         ": gpunodes takes one step, the last or the first (then a Squeeze)");
  Value v = layerValue(in, Value::StepSlice);
  v.step = b;
  setOutput(0, v);
}

void Importer::squeezeLayer() {
  Value& v = value(0);
  const std::vector<int64_t> axes = axesOf(1);
  if (v.form == Value::StepSlice && (axes == std::vector<int64_t>{1} || axes == std::vector<int64_t>{-2}))
    return setLayer(stepLayer(v.layer, v.step));
  if (v.form == Value::RecY && (axes == std::vector<int64_t>{1} || axes == std::vector<int64_t>{-3}) &&
      !net_.layers[v.layer].params["bidirectional"].toBool()) {
    Value w = v;
    w.form = Value::TimeMajor;
    w.fromRec = true;
    return setOutput(0, w);
  }
  fail("squeezes an activation: gpunodes follows only the Squeeze of a one-direction recurrent op's Y (axis 1) "
       "and of one step sliced from a sequence (axis 1)");
}

void Importer::reshapeRecurrent(const Value& v) {
  const std::vector<int64_t> target = ints(constIn(1, "the shape"), "the shape");
  const Shape& s = shapeOf(v.layer);  // [T, D*H]
  auto is = [](int64_t d, std::initializer_list<int64_t> ok) { return std::find(ok.begin(), ok.end(), d) != ok.end(); };
  Value w = v;
  if (v.form == Value::RecYT && target.size() == 3 && is(target[0], {0, s[0]}) && is(target[1], {0, kBatch}) &&
      is(target[2], {-1, s[1]})) {
    w.form = Value::TimeMajor;  // [T, N, D*H], the next stacked layer's input
    w.fromRec = true;
  } else if (v.form == Value::RecNTDH && target.size() == 3 && is(target[0], {0, kBatch, -1}) &&
             is(target[1], {0, s[0]}) && is(target[2], {-1, s[1]})) {
    w.form = Value::Batch;  // [N, T, D*H]: the layer's output
  } else
    fail("reshapes a recurrent op's output to " + shapeStr(target) +
         ": gpunodes follows torch's [0, 0, -1] after Transpose [0, 2, 1, 3], or [0, T, D*H] after [2, 0, 1, 3]");
  setOutput(0, w);
}

void Importer::embedding() {
  const TensorValues& w = constIn(0, "the data (the embedding's weight)");
  const int in = layerIn(1);
  if (attrInt("axis", 0) != 0) fail("gathers an initializer along axis " + str(attrInt("axis", 0)) +
                                    " by an activation: gpunodes' Embedding takes rows (axis 0)");
  if (w.integer || w.dims.size() != 2) fail("gathers rows of a constant that is not a 2-D float matrix");
  if (shapeOf(in).size() != 1) fail("gathers by ids of shape " + shapeStr(shapeOf(in)) + ": gpunodes' Embedding reads [T] ids");
  setLayer(addLayer(LayerKind::Embedding,
                    {{"num_embeddings", qint64(w.dims[0])}, {"embedding_dim", qint64(w.dims[1])}}, {in},
                    {{"weight", w}}));
}

void Importer::oneHot() {
  const int in = layerIn(0);
  const TensorValues& depth = constIn(1, "depth");
  if (depth.numel() != 1) fail("depth must be one value");
  const int64_t n = depth.integer ? depth.i[0] : int64_t(depth.f[0]);
  const TensorValues& values = constIn(2, "values");
  auto at = [&](int k) { return values.integer ? double(values.i[k]) : double(values.f[k]); };
  if (values.numel() != 2 || at(0) != 0 || at(1) != 1)
    fail("values other than [0, 1]: gpunodes' OneHot writes 0 and 1");
  const int64_t axis = attrInt("axis", -1), rank = int64_t(shapeOf(in).size()) + 2;
  if (axis != -1 && axis != rank - 1) fail("axis " + str(axis) + ": gpunodes' OneHot adds the last axis");
  if (n < 1 || n > (int64_t(1) << 24)) fail("depth " + str(n) + " outside [1, 2^24]");
  setLayer(addLayer(LayerKind::OneHot, {{"num_classes", qint64(n)}}, {in}));
}

void Importer::recurrent() {
  const std::string& op = node_->op_type();
  const LayerKind kind = op == "LSTM" ? LayerKind::LSTM : op == "GRU" ? LayerKind::GRU : LayerKind::RNN;
  const std::vector<int64_t> fromOnnx = kind == LayerKind::LSTM  ? std::vector<int64_t>{0, 2, 3, 1}
                                        : kind == LayerKind::GRU ? std::vector<int64_t>{1, 0, 2}
                                                                 : std::vector<int64_t>{0};
  const int64_t gates = int64_t(fromOnnx.size());
  const Value x = value(0);
  if (x.kind != Value::Layer || x.form != Value::TimeMajor)
    fail("input X " + quoted(node_->input(0)) + " is not a time-major sequence: gpunodes reads the [T, N, F] "
         "that torch's Transpose of a batch_first input makes (layout 0)");
  for (const AttributeProto& a : node_->attribute()) {
    const std::string& n = a.name();
    if (n == "hidden_size" || n == "direction" || n == "activations") continue;
    if (n == "layout" && a.i() != 0)
      fail("attribute layout " + str(a.i()) + " (batch-major X and Y) is not supported: gpunodes reads layout 0, "
           "as torch writes it");
    if (n == "input_forget" && a.i() != 0)
      fail("attribute input_forget " + str(a.i()) + " (coupled input and forget gates) is not supported");
    if (n == "linear_before_reset" && kind == LayerKind::GRU && a.i() != 1)
      fail("attribute linear_before_reset " + str(a.i()) + " is not supported: gpunodes' GRU (as PyTorch's) "
           "applies the reset gate after the recurrent product, linear_before_reset 1");
    if (n == "layout" || n == "input_forget" || (n == "linear_before_reset" && kind == LayerKind::GRU)) continue;
    if (n == "clip") fail("attribute clip is not supported: gpunodes' " + op + " does not clip its cell inputs");
    fail("attribute " + quoted(n) + " is not supported: gpunodes' " + op +
         " takes hidden_size, direction and the default activations");
  }
  if (kind == LayerKind::GRU && attrInt("linear_before_reset", 0) != 1)
    fail("attribute linear_before_reset 0 (the default) is not supported: gpunodes' GRU (as PyTorch's) "
         "applies the reset gate after the recurrent product, linear_before_reset 1");
  const std::string direction = attrString("direction", "forward");
  if (direction != "forward" && direction != "bidirectional")
    fail("attribute direction " + quoted(direction) + " is not supported: gpunodes runs forward or bidirectional");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  bool relu = false;
  if (attr("activations")) {
    const AttributeProto* a = attr("activations");
    std::vector<std::string> acts(a->strings().begin(), a->strings().end());
    std::vector<std::string> want;
    if (kind == LayerKind::RNN && !acts.empty() && acts[0] == "Relu") relu = true;
    for (int64_t d = 0; d < dirs; ++d)
      for (const char* f : kind == LayerKind::LSTM  ? std::vector<const char*>{"Sigmoid", "Tanh", "Tanh"}
                           : kind == LayerKind::GRU ? std::vector<const char*>{"Sigmoid", "Tanh"}
                                                    : std::vector<const char*>{relu ? "Relu" : "Tanh"})
        want.push_back(f);
    if (acts != want) {
      std::string got;
      for (const std::string& s : acts) got += (got.empty() ? "" : ", ") + s;
      fail("attribute activations [" + got + "] is not supported: gpunodes' " + op + " uses " +
           (kind == LayerKind::LSTM ? "Sigmoid, Tanh, Tanh" : kind == LayerKind::GRU ? "Sigmoid, Tanh"
                                                                                      : "Tanh or Relu") +
           " per direction");
    }
  }
  if (has(4)) fail("input sequence_lens is given: gpunodes' recurrent layers run every sequence to its full length");
  for (int k : {5, 6}) {
    if (!has(k) || (k == 6 && kind != LayerKind::LSTM)) continue;
    const Value& s = value(k);
    bool zero = s.kind == Value::Const && s.zeros;
    if (s.kind == Value::Const && !s.zeros && !s.c.integer) {
      zero = true;
      for (float f : s.c.f) zero = zero && f == 0.0f;
    }
    if (!zero)
      fail(std::string("input ") + (k == 5 ? "initial_h" : "initial_c") + " " + quoted(node_->input(k)) +
           " is not zeros: gpunodes' recurrent layers start from a zero state");
  }
  if (kind == LayerKind::LSTM && has(7))
    fail("input P (peepholes) is given: gpunodes' LSTM has no peephole connections");
  onlyFirstOutput();
  const Shape& s = shapeOf(x.layer);
  if (s.size() != 2) fail("reads a " + shapeStr(s) + " sequence: gpunodes' recurrent layers read [T, F]");
  const TensorValues& w = constIn(1, "W");
  const TensorValues& r = constIn(2, "R");
  const TensorValues* b = has(3) ? &constIn(3, "B") : nullptr;
  if (r.dims.size() != 3) fail("R must be 3-D [num_directions, gates * hidden_size, hidden_size]");
  const int64_t h = attrInt("hidden_size", r.dims[2]);
  if (h < 1 || h > (int64_t(1) << 20)) fail("hidden_size " + str(h) + " out of range");
  needDims(w, {dirs, gates * h, s[1]}, "W");
  needDims(r, {dirs, gates * h, h}, "R");
  if (b) needDims(*b, {dirs, 2 * gates * h}, "B");
  // One direction's gate blocks in torch's order: rows of `cols` values from tensor t, direction d, starting at
  // block `first` (B's second half is R's bias).
  auto torchOrder = [&](const TensorValues& t, int64_t d, int64_t first, int64_t cols, bool matrix) {
    TensorValues o;
    o.dims = matrix ? std::vector<int64_t>{gates * h, cols} : std::vector<int64_t>{gates * h};
    o.f.resize(size_t(gates * h * cols));
    const int64_t perDir = t.numel() / dirs;
    for (int64_t g = 0; g < gates; ++g) {
      const float* src = t.f.data() + d * perDir + (first + fromOnnx[size_t(g)]) * h * cols;
      std::copy(src, src + h * cols, o.f.begin() + g * h * cols);
    }
    return o;
  };
  // Stack on the recurrent layer whose Y this reads, when it is of the same kind and nothing else reads it.
  int target = -1;
  int64_t level = 0;
  if (x.fromRec && net_.layers[x.layer].kind == kind) {
    const QJsonObject& p = net_.layers[x.layer].params;
    bool readElsewhere = false;
    for (const ImportedLayer& l : net_.layers) readElsewhere = readElsewhere || l.inputs.contains(net_.layers[x.layer].id);
    if (!readElsewhere && p["hidden_size"].toInteger() == h && p["bidirectional"].toBool() == (dirs == 2) &&
        p["bias"].toBool() == (b != nullptr) && (kind != LayerKind::RNN || (p["nonlinearity"].toString() == "relu") == relu)) {
      target = x.layer;
      level = p["num_layers"].toInteger();
    }
  }
  std::vector<std::pair<std::string, TensorValues>> weights;
  for (int64_t d = 0; d < dirs; ++d) {
    const std::string sfx = "_l" + str(level) + (d ? "_reverse" : "");
    weights.emplace_back("weight_ih" + sfx, torchOrder(w, d, 0, s[1], true));
    weights.emplace_back("weight_hh" + sfx, torchOrder(r, d, 0, h, true));
    if (b) {
      weights.emplace_back("bias_ih" + sfx, torchOrder(*b, d, 0, 1, false));
      weights.emplace_back("bias_hh" + sfx, torchOrder(*b, d, gates, 1, false));
    }
  }
  if (target < 0) {
    QJsonObject params{{"hidden_size", qint64(h)}, {"num_layers", 1}, {"bidirectional", dirs == 2},
                       {"bias", b != nullptr}};
    if (kind == LayerKind::RNN) params["nonlinearity"] = relu ? "relu" : "tanh";
    target = addLayer(kind, params, {x.layer}, std::move(weights));
    depth_[target] = 1;
  } else {
    ImportedLayer& l = net_.layers[target];
    l.params["num_layers"] = qint64(level + 1);
    for (auto& wt : weights) l.weights.push_back(std::move(wt));
    std::vector<nn::LayerNodePtr> in;
    for (const QString& id : l.inputs) in.push_back(nodes_[size_t(indexOf_.value(id))]);
    try {
      nodes_[size_t(target)] = nn::make_layer(layerSpecOf(kind, l.id, l.params), std::move(in));
    } catch (const std::exception& e) {
      fail("as the stacked " + l.id.toStdString() + ": " + e.what());
    }
    depth_[target] = int(level + 1);
  }
  setOutput(0, layerValue(target, Value::RecY));
}

}  // namespace gn::nodes::onnx::import_detail
