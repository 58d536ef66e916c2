#include "onnx_importer_internal.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "../layer_nodes.h"

namespace gn::nodes::onnx::import_detail {

const NodeProto* Importer::soleConsumer(const std::string& value) const {
  const auto it = consumers_.find(value);
  if (it == consumers_.end() || it->second.size() != 1) return nullptr;
  for (const auto& o : g_.output())
    if (o.name() == value) return nullptr;  // a graph output is read outside too
  const NodeProto& n = g_.node(it->second[0]);
  return n.output_size() == 1 ? &n : nullptr;
}

std::optional<double> Importer::scalar(const std::string& name) const {
  const ::onnx::TensorProto* t = nullptr;
  for (const auto& init : g_.initializer())
    if (init.name() == name) t = &init;
  if (!t) {
    const auto p = producer_.find(name);
    if (p == producer_.end()) return std::nullopt;
    const NodeProto& n = g_.node(p->second);
    if (n.op_type() != "Constant") return std::nullopt;
    for (const AttributeProto& a : n.attribute()) {
      if (a.name() == "value" && a.has_t()) t = &a.t();
      if (a.name() == "value_float") return a.f();
    }
  }
  if (!t) return std::nullopt;
  for (int64_t d : t->dims())  // one value: every dim 1 (a product of a stranger's dims could overflow)
    if (d != 1) return std::nullopt;
  if (t->data_type() == ::onnx::TensorProto::FLOAT) {
    if (t->float_data_size() == 1) return t->float_data(0);
    if (t->raw_data().size() == 4) {
      float f;
      std::memcpy(&f, t->raw_data().data(), 4);
      return f;
    }
  }
  return std::nullopt;
}

bool Importer::isConstName(const std::string& name, int depth) const {
  for (const auto& init : g_.initializer())
    if (init.name() == name) return true;
  const auto p = producer_.find(name);
  if (p == producer_.end()) return false;
  const NodeProto& n = g_.node(p->second);
  // gpunodes' own export writes a Linear on a sequence as MatMul by the Transpose of the weight.
  if (n.op_type() == "Transpose" && n.input_size() == 1 && depth < 4) return isConstName(n.input(0), depth + 1);
  return n.op_type() == "Constant";
}

const std::string* Importer::other(const NodeProto& n, const std::string& value) {
  if (n.input_size() != 2) return nullptr;
  if (n.input(0) == value) return &n.input(1);
  if (n.input(1) == value) return &n.input(0);
  return nullptr;
}

std::optional<int64_t> Importer::meanAxis(const NodeProto& n) {
  if (n.op_type() != "ReduceMean" || n.input_size() != 1 || n.output_size() != 1) return std::nullopt;
  std::optional<int64_t> axis;
  for (const AttributeProto& a : n.attribute()) {
    if (a.name() == "keepdims" && a.i() != 1) return std::nullopt;
    if (a.name() == "axes") {
      if (a.ints_size() != 1) return std::nullopt;
      axis = a.ints(0);
    }
  }
  return axis;
}

std::vector<const NodeProto*> Importer::consumersOf(const std::string& value, size_t count) const {
  const auto it = consumers_.find(value);
  if (it == consumers_.end() || it->second.size() != count) return {};
  for (const auto& o : g_.output())
    if (o.name() == value) return {};
  std::vector<const NodeProto*> r;
  for (int k : it->second) {
    if (g_.node(k).output_size() != 1) return {};
    r.push_back(&g_.node(k));
  }
  return r;
}

void Importer::findLayerNorm(int i) {
  const NodeProto& mean = g_.node(i);
  const std::optional<int64_t> axis = meanAxis(mean);
  if (!axis) return;
  const std::string& x = mean.input(0);
  const NodeProto* sub = soleConsumer(mean.output(0));
  if (!sub || sub->op_type() != "Sub" || sub->input_size() != 2 || sub->input(0) != x ||
      sub->input(1) != mean.output(0))
    return;
  const std::vector<const NodeProto*> uses = consumersOf(sub->output(0), 2);
  if (uses.size() != 2) return;
  const NodeProto* pow = uses[0]->op_type() == "Pow" ? uses[0] : uses[1];
  const NodeProto* div = pow == uses[0] ? uses[1] : uses[0];
  if (pow->op_type() != "Pow" || pow->input_size() != 2 || pow->input(0) != sub->output(0) ||
      !near(scalar(pow->input(1)), 2.0))
    return;
  const NodeProto* var = soleConsumer(pow->output(0));
  if (!var || meanAxis(*var) != axis) return;
  const NodeProto* addEps = soleConsumer(var->output(0));
  const std::string* epsName = addEps && addEps->op_type() == "Add" ? other(*addEps, var->output(0)) : nullptr;
  const std::optional<double> eps = epsName ? scalar(*epsName) : std::nullopt;
  if (!eps || !(*eps > 0 && *eps < 1)) return;
  const NodeProto* sqrt = soleConsumer(addEps->output(0));
  if (!sqrt || sqrt->op_type() != "Sqrt" || sqrt->input_size() != 1) return;
  if (div->op_type() != "Div" || div->input_size() != 2 || div->input(0) != sub->output(0) ||
      div->input(1) != sqrt->output(0) || soleConsumer(sqrt->output(0)) != div)
    return;
  std::vector<int> nodes{i, indexOfNode(sub), indexOfNode(pow), indexOfNode(var), indexOfNode(addEps),
                         indexOfNode(sqrt), indexOfNode(div)};
  Pattern pat{LayerKind::LayerNorm, x, div->output(0), i};
  pat.axis = *axis;
  pat.eps = shortest(float(*eps));
  if (const NodeProto* mul = soleConsumer(div->output(0)); mul && mul->op_type() == "Mul") {
    const std::string* scale = other(*mul, div->output(0));
    const NodeProto* addB = soleConsumer(mul->output(0));
    const std::string* bias = addB && addB->op_type() == "Add" ? other(*addB, mul->output(0)) : nullptr;
    if (scale && isConstName(*scale) && bias && isConstName(*bias)) {
      pat.scale = *scale;
      pat.bias = *bias;
      pat.output = addB->output(0);
      nodes.push_back(indexOfNode(mul));
      nodes.push_back(indexOfNode(addB));
    }
  }
  addPattern(std::move(pat), nodes);
}

void Importer::findPatterns() {
  for (int i = 0; i < g_.node_size(); ++i) nodeIndex_[&g_.node(i)] = i;
  // The attention layers first: their projections would otherwise read as Linears (MatMul + Add).
  for (int i = 0; i < g_.node_size(); ++i) {
    const std::string& op = g_.node(i).op_type();
    if (op == "Split") findAttention(i);
    if (op == "Sub") findNadarayaWatson(i);
    if (op == "Equal") findValidLength(i);
    if (op == "Transpose") findTorchAttention(i);
    if (op == "Transpose") findTorchCrossAttention(i);
  }
  for (int i = 0; i < g_.node_size(); ++i) {
    const NodeProto& n = g_.node(i);
    if (n.op_type() == "ReduceMean") findLayerNorm(i);
    // GELU, x * 0.5 * (1 + erf(x / sqrt(2))), as torch writes it: Div (or Mul by 1/sqrt(2)), Erf, Add 1, then
    // two Muls by x and 0.5 in either order.
    if ((n.op_type() == "Div" || n.op_type() == "Mul") && n.input_size() == 2 && n.output_size() == 1) {
      const bool div = n.op_type() == "Div";
      if (!(div ? near(scalar(n.input(1)), std::sqrt(2.0)) : near(scalar(n.input(1)), 1 / std::sqrt(2.0))))
        continue;
      const std::string& x = n.input(0);
      const NodeProto* erf = soleConsumer(n.output(0));
      if (!erf || erf->op_type() != "Erf") continue;
      const NodeProto* add = soleConsumer(erf->output(0));
      const std::string* one = add && add->op_type() == "Add" ? other(*add, erf->output(0)) : nullptr;
      if (!one || !near(scalar(*one), 1.0)) continue;
      const NodeProto* m1 = soleConsumer(add->output(0));
      const std::string* o1 = m1 && m1->op_type() == "Mul" ? other(*m1, add->output(0)) : nullptr;
      if (!o1) continue;
      std::vector<int> nodes{i, indexOfNode(erf), indexOfNode(add), indexOfNode(m1)};
      std::string out;
      if (*o1 == x || near(scalar(*o1), 0.5)) {  // (x * a) * 0.5, or (a * 0.5) * x
        const NodeProto* m2 = soleConsumer(m1->output(0));
        const std::string* o2 = m2 && m2->op_type() == "Mul" ? other(*m2, m1->output(0)) : nullptr;
        if (!o2 || !(*o1 == x ? near(scalar(*o2), 0.5) : *o2 == x)) continue;
        nodes.push_back(indexOfNode(m2));
        out = m2->output(0);
      } else {  // a * (x * 0.5)
        const auto p = producer_.find(*o1);
        if (p == producer_.end()) continue;
        const NodeProto& half = g_.node(p->second);
        const std::string* h = half.op_type() == "Mul" ? other(half, x) : nullptr;
        if (!h || !near(scalar(*h), 0.5) || !soleConsumer(half.output(0))) continue;
        nodes.push_back(p->second);
        out = m1->output(0);
      }
      Pattern pat{LayerKind::GELU, x, out, i};
      addPattern(std::move(pat), nodes);
    }
    // Linear on the last axis: MatMul by a constant [in, out], then Add of a constant [out].
    if (n.op_type() == "MatMul" && n.input_size() == 2 && n.output_size() == 1 && isConstName(n.input(1))) {
      const NodeProto* add = soleConsumer(n.output(0));
      const std::string* bias = add && add->op_type() == "Add" ? other(*add, n.output(0)) : nullptr;
      if (!bias || !isConstName(*bias)) continue;
      Pattern pat{LayerKind::Linear, n.input(0), add->output(0), i};
      pat.matmul = i;
      pat.add = indexOfNode(add);
      addPattern(std::move(pat), {i, indexOfNode(add)});
    }
  }
}

void Importer::addPattern(Pattern p, const std::vector<int>& nodes) {
  for (int k : nodes)
    if (skip_.count(k)) return;  // a node in two patterns: the first keeps it
  // The pattern's layer is made at the last of its nodes in the walk's order, when its input is known.
  int last = nodes.front();
  for (int k : nodes)
    if (position_[k] > position_[last]) last = k;
  patterns_.push_back(std::move(p));
  for (int k : nodes) skip_[k] = k == last ? int(patterns_.size()) - 1 : -1;
}

void Importer::emitPattern(int index) {
  const Pattern& p = patterns_[index];
  const NodeProto* last = node_;
  node_ = &g_.node(p.first);
  const auto it = values_.find(p.input);
  if (it == values_.end() || it->second.kind != Value::Layer)
    fail("reads " + quoted(p.input) + ", which is not an activation");
  if (it->second.pad) fail("reads the output of Pad " + quoted(it->second.padNode));
  if (!it->second.maskNode.empty() || it->second.transposedB)
    fail("reads " + quoted(p.input) + ", which only a Softmax or a MatMul reads");
  checkDepth(it->second, p.input);
  if (it->second.form != Value::Batch) fail("reads " + quoted(p.input) + ", which is not a batch-first activation");
  const int in = it->second.layer;
  int made = -1;
  if (p.kind == LayerKind::GELU) {
    made = addLayer(LayerKind::GELU, {}, {in});
  } else if (p.kind == LayerKind::LayerNorm) {
    made = layerNormLayer(in, p.axis, p.eps, p.scale.empty() ? nullptr : &values_.at(p.scale).c,
                          p.bias.empty() ? nullptr : &values_.at(p.bias).c);
  } else if (p.kind == LayerKind::MultiheadAttention) {
    made = p.torch ? emitTorchAttention(p, in) : emitAttention(p, in);
  } else if (p.kind == LayerKind::NadarayaWatson) {
    made = emitNadarayaWatson(p, in);
  } else if (p.kind == LayerKind::ValidLength) {
    made = emitValidLength(p, in);
  } else {  // MatMul + Add
    const NodeProto& mm = g_.node(p.matmul);
    const NodeProto& add = g_.node(p.add);
    const TensorValues& w = values_.at(mm.input(1)).c;
    const TensorValues& b = values_.at(*other(add, mm.output(0))).c;
    made = linear(in, w, false, 1.0, &b, 1.0, "MatMul's weight");
  }
  node_ = last;
  Value v;
  v.kind = Value::Layer;
  v.layer = made;
  values_[p.output] = v;
}

int Importer::linear(int in, const TensorValues& w, bool transposed, double alpha, const TensorValues* b, double beta,
           const char* what) {
  const Shape& s = shapeOf(in);
  if (s.empty()) fail("reads a scalar");
  if (w.dims.size() != 2 || w.integer) fail(std::string(what) + " must be a 2-D float matrix");
  const int64_t inF = transposed ? w.dims[1] : w.dims[0], outF = transposed ? w.dims[0] : w.dims[1];
  if (inF != s.back())
    fail(std::string(what) + " takes " + str(inF) + " features, but its input is " + shapeStr(s));
  TensorValues weight;
  weight.dims = {outF, inF};
  weight.f.resize(static_cast<size_t>(outF * inF));
  for (int64_t o = 0; o < outF; ++o)
    for (int64_t i = 0; i < inF; ++i)
      weight.f[o * inF + i] = float(alpha * (transposed ? w.f[o * inF + i] : w.f[i * outF + o]));
  std::vector<std::pair<std::string, TensorValues>> weights{{"weight", std::move(weight)}};
  if (b) {
    if (b->integer || !(b->numel() == outF || b->numel() == 1) || b->dims.size() > 2)
      fail("the bias has " + str(b->numel()) + " values for " + str(outF) + " outputs");
    TensorValues bias;
    bias.dims = {outF};
    bias.f.resize(static_cast<size_t>(outF));
    for (int64_t o = 0; o < outF; ++o) bias.f[o] = float(beta * b->f[b->numel() == 1 ? 0 : o]);
    weights.emplace_back("bias", std::move(bias));
  }
  return addLayer(LayerKind::Linear, {{"out_features", qint64(outF)}, {"bias", b != nullptr}}, {in},
                  std::move(weights));
}

}  // namespace gn::nodes::onnx::import_detail
