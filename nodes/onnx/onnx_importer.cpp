#include "onnx_importer.h"

#include <QJsonArray>
#include <QRegularExpression>
#include <QSet>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "../layer_nodes.h"

namespace gn::nodes::onnx {

using ::onnx::AttributeProto;
using ::onnx::NodeProto;
using nn::LayerKind;

QString supportedOps() {
  return "Conv, BatchNormalization, Relu, Sigmoid, Tanh, GELU in its Erf form (Div, Erf, Add, Mul, Mul), MaxPool, "
         "AveragePool (with a Pad before it), GlobalAveragePool, Flatten, Gemm, MatMul (with an Add of its "
         "bias), Add, Concat, Dropout, Identity, Reshape, Transpose, Softmax, LayerNormalization, and for shapes "
         "Constant, Shape, Gather, Unsqueeze, Squeeze, Slice, Concat and Cast";
}

namespace {

constexpr int64_t kBatch = INT64_MIN;  // the batch axis in shape arithmetic: known to be the batch, not its size

std::string str(int64_t v) { return std::to_string(v); }

std::string shapeStr(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + (s[i] == kBatch ? std::string("N") : str(s[i]));
  return t + "]";
}

// The shortest decimal that reads back as the same float: torch writes 1e-5 as the float 9.99999975e-06, and
// the layer's param should say 1e-05 again.
double shortest(float f) {
  for (int digits = 1; digits <= 9; ++digits) {
    const double d = QString::number(double(f), 'g', digits).toDouble();
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

// A name as the ONNX graph has it, shortened for a message.
std::string quoted(const std::string& s) { return "'" + (s.size() > 200 ? s.substr(0, 200) + "..." : s) + "'"; }

struct Value {
  enum Kind { Layer, Const } kind = Const;
  int layer = -1;          // Layer: index into the network's layers
  int64_t pad = 0;         // Layer: a Pad before an AveragePool that has not met it yet
  std::string padNode;
  TensorValues c;          // Const; integers may hold kBatch
};

class Importer {
 public:
  Importer(OnnxModel& m, const std::function<void(double, const QString&)>& progress)
      : m_(m), g_(*m.proto.mutable_graph()), progress_(progress) {}

  ImportedNetwork run() {
    net_.opset = m_.opset;
    net_.name = QString::fromStdString(g_.name());
    net_.description = QString::fromStdString(g_.doc_string().empty() ? m_.proto.doc_string() : g_.doc_string());
    order();
    readInitializers();
    readInput();
    findPatterns();
    for (size_t k = 0; k < order_.size(); ++k) {
      node_ = &g_.node(order_[k]);
      if (progress_ && k % 16 == 0)
        progress_(0.3 + 0.6 * double(k) / double(order_.size()), QString("operation %1 of %2").arg(k).arg(order_.size()));
      if (const auto it = skip_.find(order_[k]); it != skip_.end()) {
        if (it->second >= 0) emitPattern(it->second);
        continue;
      }
      readNode();
    }
    readOutput();
    return std::move(net_);
  }

 private:
  // --- messages -----------------------------------------------------------------------------------------
  std::string where() const {
    return "node " + quoted(node_->name().empty() ? "(unnamed)" : node_->name()) + " (" + node_->op_type() + ")";
  }
  [[noreturn]] void fail(const std::string& what) const { throw OnnxError(where() + ": " + what); }

  // --- the graph's order, names and producers ---------------------------------------------------------------
  void order() {
    std::set<std::string> known;
    for (const auto& t : g_.initializer()) {
      if (!known.insert(t.name()).second) throw OnnxError("initializer " + quoted(t.name()) + " is defined twice");
    }
    for (const auto& in : g_.input()) known.insert(in.name());  // older files list initializers as inputs too
    std::map<std::string, int> producer;
    for (int i = 0; i < g_.node_size(); ++i) {
      const NodeProto& n = g_.node(i);
      node_ = &n;
      if (!n.domain().empty() && n.domain() != "ai.onnx")
        fail("domain " + quoted(n.domain()) + " is not one gpunodes knows: it imports the default domain's "
             "operators (" + supportedOps().toStdString() + ")");
      for (const AttributeProto& a : n.attribute())
        if (a.type() == AttributeProto::GRAPH || a.type() == AttributeProto::GRAPHS || a.has_g() || a.graphs_size())
          fail("holds a subgraph (attribute " + quoted(a.name()) + "): gpunodes imports flat graphs only, "
               "without If, Loop or Scan");
      for (const std::string& out : n.output()) {
        if (out.empty()) continue;
        if (known.count(out))
          fail("writes " + quoted(out) + ", which is already a graph input or an initializer");
        if (const auto [it, fresh] = producer.emplace(out, i); !fresh)
          fail("writes " + quoted(out) + ", which node " + quoted(g_.node(it->second).name()) + " writes too");
      }
    }
    // Kahn's algorithm, ties in file order; every input must be known or made by some node.
    std::vector<int> waiting(g_.node_size(), 0);
    std::vector<std::vector<int>> next(g_.node_size());
    for (int i = 0; i < g_.node_size(); ++i) {
      const NodeProto& n = g_.node(i);
      node_ = &n;
      for (const std::string& in : n.input()) {
        if (in.empty() || known.count(in)) continue;
        const auto it = producer.find(in);
        if (it == producer.end())
          fail("reads " + quoted(in) + ", which no node, graph input or initializer produces");
        ++waiting[i];
        next[it->second].push_back(i);
        consumers_[in].push_back(i);
      }
      for (const std::string& in : n.input())
        if (!in.empty() && known.count(in)) consumers_[in].push_back(i);
    }
    std::set<int> ready;
    for (int i = 0; i < g_.node_size(); ++i)
      if (waiting[i] == 0) ready.insert(i);
    while (!ready.empty()) {
      const int i = *ready.begin();
      ready.erase(ready.begin());
      order_.push_back(i);
      for (int j : next[i])
        if (--waiting[j] == 0) ready.insert(j);
    }
    if (order_.size() != size_t(g_.node_size()))
      for (int i = 0; i < g_.node_size(); ++i)
        if (waiting[i] > 0) {
          node_ = &g_.node(i);
          fail("is on a cycle: its inputs depend on its own output");
        }
    for (const auto& [name, index] : producer) producer_[name] = index;
    position_.assign(order_.size(), 0);
    for (size_t k = 0; k < order_.size(); ++k) position_[order_[k]] = int(k);
  }

  void readInitializers() {
    const int n = g_.initializer_size();
    for (int k = 0; k < n; ++k) {
      ::onnx::TensorProto& t = *g_.mutable_initializer(k);
      Value v;
      v.c = takeTensor(m_, t, "initializer " + quoted(t.name()));
      values_[t.name()] = std::move(v);
      if (progress_ && k % 8 == 0) progress_(0.05 + 0.25 * double(k) / n, "reading the weights");
    }
  }

  void readInput() {
    const ::onnx::ValueInfoProto* input = nullptr;
    for (const auto& in : g_.input()) {
      if (values_.count(in.name())) continue;
      if (input)
        throw OnnxError("the graph has two inputs, " + quoted(input->name()) + " and " + quoted(in.name()) +
                        ": a gpunodes network has one");
      input = &in;
    }
    if (!input) throw OnnxError("the graph has no input");
    const std::string what = "graph input " + quoted(input->name());
    if (!input->type().has_tensor_type() || input->type().tensor_type().elem_type() != ::onnx::TensorProto::FLOAT)
      throw OnnxError(what + " is not a float tensor");
    const auto& tt = input->type().tensor_type();
    if (!tt.has_shape() || tt.shape().dim_size() < 2 || tt.shape().dim_size() > 5)
      throw OnnxError(what + " needs a shape [batch, ...] of 2 to 5 dims");
    Shape sample;
    for (int d = 1; d < tt.shape().dim_size(); ++d) {
      const auto& dim = tt.shape().dim(d);
      if (!dim.has_dim_value())
        throw OnnxError(what + " has a symbolic dim " + quoted(dim.dim_param()) + " at axis " + str(d) +
                        ": only the batch axis (0) may be dynamic");
      if (dim.dim_value() < 1 || dim.dim_value() > (int64_t(1) << 24))
        throw OnnxError(what + " has dim " + str(dim.dim_value()) + " at axis " + str(d) + ": each must be in [1, 2^24]");
      sample.push_back(dim.dim_value());
    }
    checkedNumel(sample, what);
    if (const auto& d0 = tt.shape().dim(0); d0.has_dim_value() && d0.dim_value() != 1)
      net_.warnings.append(QString("%1 has a fixed batch of %2; the network takes any batch")
                               .arg(QString::fromStdString(what)).arg(d0.dim_value()));
    QJsonArray shape;
    for (int64_t d : sample) shape.append(qint64(d));
    const int i = addLayer(LayerKind::Input, input->name(), {{"shape", shape}}, {}, {}, what);
    Value v;
    v.kind = Value::Layer;
    v.layer = i;
    values_[input->name()] = v;
  }

  void readOutput() {
    if (g_.output_size() != 1)
      throw OnnxError("the graph has " + str(g_.output_size()) + " outputs: a gpunodes network has one");
    const std::string& name = g_.output(0).name();
    const auto it = values_.find(name);
    if (it == values_.end() || it->second.kind != Value::Layer)
      throw OnnxError("graph output " + quoted(name) + " is not computed from the input");
    if (it->second.pad) throw OnnxError("graph output " + quoted(name) + " is a Pad that no AveragePool reads");
    if (it->second.layer == 0) throw OnnxError("graph output " + quoted(name) + " is the input itself");
    // The output's layer goes last (the Network reads it); every layer after its inputs still holds.
    const int out = it->second.layer;
    if (out != net_.layers.size() - 1) {
      // Layers after it that the output does not need are dropped with a warning.
      std::vector<bool> needed(net_.layers.size(), false);
      needed[out] = true;
      for (int i = out; i >= 0; --i)
        if (needed[i])
          for (const QString& in : net_.layers[i].inputs) needed[indexOf_.value(in)] = true;
      QList<ImportedLayer> kept;
      for (int i = 0; i < net_.layers.size(); ++i)
        if (needed[i]) kept.append(std::move(net_.layers[i]));
        else net_.warnings.append("dropped " + net_.layers[i].id + ": the output does not depend on it");
      net_.layers = std::move(kept);
    }
  }

  // --- values ---------------------------------------------------------------------------------------------
  bool has(int k) const { return node_->input_size() > k && !node_->input(k).empty(); }
  Value& value(int k) {
    if (!has(k)) fail("input " + str(k) + " is missing");
    auto it = values_.find(node_->input(k));
    if (it == values_.end()) fail("reads " + quoted(node_->input(k)) + ", which is not computed yet");
    return it->second;
  }
  // A layer's activation on input k, with its shape per sample.
  int layerIn(int k, bool padOk = false) {
    Value& v = value(k);
    if (v.kind != Value::Layer)
      fail("input " + str(k) + " " + quoted(node_->input(k)) + " is a constant; gpunodes needs the activation there");
    if (v.pad && !padOk)
      fail("reads the output of Pad " + quoted(v.padNode) + ": gpunodes takes a Pad only right before an AveragePool");
    return v.layer;
  }
  const TensorValues& constIn(int k, const char* what) {
    Value& v = value(k);
    if (v.kind != Value::Const) fail(std::string(what) + " (input " + str(k) + ") must be a constant or an initializer");
    return v.c;
  }
  const Shape& shapeOf(int layer) const { return net_.layers[layer].out; }
  void setOutput(int k, Value v) {
    if (node_->output_size() <= k || node_->output(k).empty()) return;
    values_[node_->output(k)] = std::move(v);
  }
  void setLayer(int layer) {
    Value v;
    v.kind = Value::Layer;
    v.layer = layer;
    setOutput(0, v);
  }
  void alias(int k) { setOutput(0, value(k)); }
  void onlyFirstOutput() {
    for (int k = 1; k < node_->output_size(); ++k)
      if (!node_->output(k).empty() && consumers_.count(node_->output(k)))
        fail("its output " + str(k) + " " + quoted(node_->output(k)) + " is read, and gpunodes only has the first");
  }

  // --- attributes -----------------------------------------------------------------------------------------
  const AttributeProto* attr(const char* name) const {
    for (const AttributeProto& a : node_->attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  int64_t attrInt(const char* name, int64_t def) const {
    const AttributeProto* a = attr(name);
    if (!a) return def;
    if (a->type() != AttributeProto::INT) fail(std::string("attribute ") + name + " must be an integer");
    return a->i();
  }
  double attrFloat(const char* name, double def) const {
    const AttributeProto* a = attr(name);
    if (!a) return def;
    if (a->type() != AttributeProto::FLOAT) fail(std::string("attribute ") + name + " must be a float");
    return shortest(a->f());
  }
  std::vector<int64_t> attrInts(const char* name) const {
    const AttributeProto* a = attr(name);
    if (!a) return {};
    if (a->type() != AttributeProto::INTS) fail(std::string("attribute ") + name + " must be a list of integers");
    if (a->ints_size() > 16) fail(std::string("attribute ") + name + " has " + str(a->ints_size()) + " values");
    return {a->ints().begin(), a->ints().end()};
  }
  std::string attrString(const char* name, const std::string& def) const {
    const AttributeProto* a = attr(name);
    if (!a) return def;
    if (a->type() != AttributeProto::STRING) fail(std::string("attribute ") + name + " must be a string");
    return a->s();
  }

  // --- layers ---------------------------------------------------------------------------------------------
  QString makeId(const std::string& onnxName, const std::string& op) {
    QStringList parts = QString::fromStdString(onnxName.substr(0, 400)).split('/', Qt::SkipEmptyParts);
    const QString opq = QString::fromStdString(op);
    if (parts.size() > 1 && (parts.last() == opq || parts.last().startsWith(opq + "_"))) parts.removeLast();
    // torch's nested scopes repeat their parent's name ("layer1", "layer1.0"): the longer one stands for both.
    QStringList kept;
    for (const QString& p : parts)
      if (!kept.isEmpty() && p.startsWith(kept.last())) kept.last() = p;
      else kept.append(p);
    QString base = kept.join('_');
    if (base == opq || base.startsWith(opq + "_")) base = base.toLower();
    static const QRegularExpression bad("[^A-Za-z0-9_-]");
    base.replace(bad, "_");
    while (base.startsWith('_')) base.remove(0, 1);
    if (base.isEmpty()) base = opq.toLower().replace(bad, "_");
    if (base.isEmpty()) base = "layer";
    base = base.left(56);
    QString id = base;
    for (int k = 2; ids_.contains(id); ++k) id = base + "_" + QString::number(k);
    ids_.insert(id);
    return id;
  }

  int addLayer(LayerKind kind, const std::string& name, QJsonObject params, const std::vector<int>& inputs,
               std::vector<std::pair<std::string, TensorValues>> weights, const std::string& source) {
    ImportedLayer l;
    l.id = makeId(name, node_ ? node_->op_type() : "Input");
    l.kind = kind;
    l.params = std::move(params);
    l.source = source;
    std::vector<nn::LayerNodePtr> in;
    for (int i : inputs) {
      l.inputs.append(net_.layers[i].id);
      in.push_back(nodes_[i]);
    }
    nn::LayerNodePtr made;
    try {
      made = nn::make_layer(layerSpecOf(kind, l.id, l.params), std::move(in));
    } catch (const std::exception& e) {
      throw OnnxError(source + ": as a " + nn::layer_kind_name(kind) + " layer: " + e.what());
    }
    l.out = made->info.out;
    l.weights = std::move(weights);
    indexOf_.insert(l.id, net_.layers.size());
    net_.layers.append(std::move(l));
    nodes_.push_back(std::move(made));
    return net_.layers.size() - 1;
  }
  int addLayer(LayerKind kind, QJsonObject params, const std::vector<int>& inputs,
               std::vector<std::pair<std::string, TensorValues>> weights = {}) {
    return addLayer(kind, node_->name().empty() ? node_->op_type() : node_->name(), std::move(params), inputs,
                    std::move(weights), where());
  }

  void needDims(const TensorValues& t, const std::vector<int64_t>& dims, const char* what) const {
    if (t.dims != dims) {
      std::string got = "[", want = "[";
      for (size_t i = 0; i < t.dims.size(); ++i) got += (i ? ", " : "") + str(t.dims[i]);
      for (size_t i = 0; i < dims.size(); ++i) want += (i ? ", " : "") + str(dims[i]);
      fail(std::string(what) + " has dims " + got + "], expected " + want + "]");
    }
    if (t.integer) fail(std::string(what) + " must hold floats");
  }

  // --- patterns found before the walk ------------------------------------------------------------------------
  struct Pattern {
    LayerKind kind;
    std::string input;        // the activation read
    std::string output;       // the value made
    int first = -1;           // the node whose name names the layer
    int matmul = -1, add = -1;  // MatMul + Add: the nodes, for the weights
  };

  const NodeProto* soleConsumer(const std::string& value) const {
    const auto it = consumers_.find(value);
    if (it == consumers_.end() || it->second.size() != 1) return nullptr;
    for (const auto& o : g_.output())
      if (o.name() == value) return nullptr;  // a graph output is read outside too
    return &g_.node(it->second[0]);
  }
  // The nodes of a RepeatedPtrField are not contiguous: their indices come from a map.
  int indexOfNode(const NodeProto* n) const { return nodeIndex_.at(n); }
  // A constant scalar's value: an initializer or a Constant node's, of one element.
  std::optional<double> scalar(const std::string& name) const {
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
    int64_t n = 1;
    for (int64_t d : t->dims()) n *= d;
    if (n != 1) return std::nullopt;
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
  bool isConstName(const std::string& name) const {
    for (const auto& init : g_.initializer())
      if (init.name() == name) return true;
    const auto p = producer_.find(name);
    return p != producer_.end() && g_.node(p->second).op_type() == "Constant";
  }
  static bool near(std::optional<double> v, double want) { return v && std::abs(*v - want) <= 1e-5 * std::abs(want); }
  // The operand of a two-input node that is not `value`.
  static const std::string* other(const NodeProto& n, const std::string& value) {
    if (n.input_size() != 2) return nullptr;
    if (n.input(0) == value) return &n.input(1);
    if (n.input(1) == value) return &n.input(0);
    return nullptr;
  }

  void findPatterns() {
    for (int i = 0; i < g_.node_size(); ++i) nodeIndex_[&g_.node(i)] = i;
    for (int i = 0; i < g_.node_size(); ++i) {
      const NodeProto& n = g_.node(i);
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
      if (n.op_type() == "MatMul" && n.input_size() == 2 && isConstName(n.input(1))) {
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
  void addPattern(Pattern p, const std::vector<int>& nodes) {
    for (int k : nodes)
      if (skip_.count(k)) return;  // a node in two patterns: the first keeps it
    // The pattern's layer is made at the last of its nodes in the walk's order, when its input is known.
    int last = nodes.front();
    for (int k : nodes)
      if (position_[k] > position_[last]) last = k;
    patterns_.push_back(std::move(p));
    for (int k : nodes) skip_[k] = k == last ? int(patterns_.size()) - 1 : -1;
  }

  void emitPattern(int index) {
    const Pattern& p = patterns_[index];
    const NodeProto* last = node_;
    node_ = &g_.node(p.first);
    const auto it = values_.find(p.input);
    if (it == values_.end() || it->second.kind != Value::Layer)
      fail("reads " + quoted(p.input) + ", which is not an activation");
    if (it->second.pad) fail("reads the output of Pad " + quoted(it->second.padNode));
    const int in = it->second.layer;
    int made = -1;
    if (p.kind == LayerKind::GELU) {
      made = addLayer(LayerKind::GELU, {}, {in});
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

  // A Linear from a weight [in, out] (MatMul, Gemm without transB) or [out, in] (transposed), times alpha, and a
  // bias [out] (or [1, out], or one value for all) times beta.
  int linear(int in, const TensorValues& w, bool transposed, double alpha, const TensorValues* b, double beta,
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

  // --- one operation --------------------------------------------------------------------------------------
  void readNode() {
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
    if (op == "MatMul") {
      const int in = layerIn(0);
      return setLayer(linear(in, constIn(1, "the weight"), false, 1.0, nullptr, 1.0, "the weight"));
    }
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
      if (v.kind != Value::Const) fail("casts an activation; gpunodes computes in float32 only");
      return setOutput(0, std::move(v));
    }
    fail("operator " + op + " (opset " + str(m_.opset) + ") is not supported: gpunodes imports " +
         supportedOps().toStdString() + " (see docs/onnx.md)");
  }

  // Square windows, the same padding on every side, no dilation: gpunodes' Conv2d and pools.
  struct Window {
    int64_t kernel = 1, stride = 1, pad = 0;
  };
  Window window(const std::vector<int64_t>& kernelDefault) const {
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

  void conv() {
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

  void batchNorm() {
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

  void pool(bool max) {
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

  // Zero padding of H and W, which torch writes before an AveragePool that counts padded cells; the pool
  // takes it as its padding.
  void pad() {
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
        pads[2] != pads[7] || pads[2] < 0)
      fail("pads only H and W by the same amount on every side, before an AveragePool");
    v.pad = pads[2];
    v.padNode = node_->name();
    setOutput(0, v);
  }

  void gemm() {
    const int in = layerIn(0);
    if (attrInt("transA", 0) != 0) fail("transA 1 is not supported");
    if (shapeOf(in).size() != 1) fail("needs a flat [features] input, got " + shapeStr(shapeOf(in)));
    const TensorValues& w = constIn(1, "B (the weight)");
    const TensorValues* c = has(2) ? &constIn(2, "C (the bias)") : nullptr;
    setLayer(linear(in, w, attrInt("transB", 0) != 0, attrFloat("alpha", 1.0), c, attrFloat("beta", 1.0),
                    "B (the weight)"));
  }

  void add() {
    Value &a = value(0), &b = value(1);
    if (a.kind == Value::Const && b.kind == Value::Const) return setOutput(0, arithmetic(a.c, b.c, '+'));
    if (a.kind != Value::Layer || b.kind != Value::Layer)
      fail("adds a constant to an activation: gpunodes' Add takes two activations (a bias belongs to the "
           "MatMul, Conv or Gemm before it)");
    setLayer(addLayer(LayerKind::Add, {}, {layerIn(0), layerIn(1)}));
  }

  Value arithmetic(const TensorValues& a, const TensorValues& b, char op) const {
    if (!a.integer || !b.integer) fail("computes with float constants, which gpunodes does not fold");
    if (a.numel() != b.numel() && a.numel() != 1 && b.numel() != 1) fail("constants of different sizes");
    Value v;
    v.c.integer = true;
    v.c.dims = a.numel() >= b.numel() ? a.dims : b.dims;
    const int64_t n = std::max(a.numel(), b.numel());
    for (int64_t k = 0; k < n; ++k) {
      const int64_t x = a.i[a.numel() == 1 ? 0 : k], y = b.i[b.numel() == 1 ? 0 : k];
      if (x == kBatch || y == kBatch) fail("computes with the batch size, which a gpunodes network does not fix");
      v.c.i.push_back(op == '+' ? x + y : x);
    }
    return v;
  }

  void concat() {
    bool allConst = true;
    for (int k = 0; k < node_->input_size(); ++k) allConst = allConst && value(k).kind == Value::Const;
    const int64_t axis = attrInt("axis", 0);
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

  void dropout() {
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

  std::vector<int64_t> ints(const TensorValues& t, const char* what) const {
    if (!t.integer) fail(std::string(what) + " must be integers");
    if (t.dims.size() > 1) fail(std::string(what) + " must be a 1-D vector");
    return t.i;
  }

  void reshape() {
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
      if (d < -1) fail("reshapes to " + shapeStr(target));
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

  void transpose() {
    const int in = layerIn(0);
    const size_t rank = shapeOf(in).size() + 1;
    std::vector<int64_t> perm = attrInts("perm");
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

  void softmax() {
    const int in = layerIn(0);
    const int64_t rank = int64_t(shapeOf(in).size()) + 1;
    const int64_t axis = attrInt("axis", m_.opset >= 13 ? -1 : 1);
    if (axis != -1 && axis != rank - 1) fail("axis " + str(axis) + ": gpunodes' Softmax is over the last axis");
    setLayer(addLayer(LayerKind::Softmax, {{"causal", false}}, {in}));
  }

  void layerNorm() {
    const int in = layerIn(0);
    onlyFirstOutput();
    const Shape& s = shapeOf(in);
    const int64_t rank = int64_t(s.size()) + 1;
    const int64_t axis = attrInt("axis", -1);
    if (axis != -1 && axis != rank - 1) fail("axis " + str(axis) + ": gpunodes' LayerNorm normalises the last axis");
    const int64_t e = s.back();
    const TensorValues& w = constIn(1, "Scale");
    needDims(w, {e}, "Scale");
    TensorValues b;
    if (has(2)) {
      b = constIn(2, "B");
      needDims(b, {e}, "B");
    } else {
      b.dims = {e};
      b.f.assign(size_t(e), 0.0f);
    }
    setLayer(addLayer(LayerKind::LayerNorm,
                      {{"normalized_shape", qint64(e)}, {"eps", attrFloat("epsilon", 1e-5)}, {"elementwise_affine", true}},
                      {in}, {{"weight", w}, {"bias", std::move(b)}}));
  }

  // --- constants and shape arithmetic ------------------------------------------------------------------------
  void constant() {
    Value v;
    for (AttributeProto& a : *const_cast<NodeProto*>(node_)->mutable_attribute()) {
      if (a.name() == "value" && a.has_t()) v.c = takeTensor(m_, *a.mutable_t(), where() + " value");
      else if (a.name() == "value_float") v.c.f = {a.f()};
      else if (a.name() == "value_int") v.c.i = {a.i()}, v.c.integer = true;
      else if (a.name() == "value_ints") {
        v.c.i.assign(a.ints().begin(), a.ints().end());
        v.c.integer = true;
        v.c.dims = {int64_t(v.c.i.size())};
      } else if (a.name() == "value_floats") {
        v.c.f.assign(a.floats().begin(), a.floats().end());
        v.c.dims = {int64_t(v.c.f.size())};
      } else
        fail("attribute " + quoted(a.name()) + " is not supported");
    }
    setOutput(0, std::move(v));
  }

  void shape() {
    const int in = layerIn(0);
    Value v;
    v.c.integer = true;
    v.c.i.push_back(kBatch);
    for (int64_t d : shapeOf(in)) v.c.i.push_back(d);
    int64_t n = int64_t(v.c.i.size()), start = attrInt("start", 0), end = attrInt("end", n);
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp<int64_t>(start, 0, n);
    end = std::clamp<int64_t>(end, start, n);
    v.c.i = std::vector<int64_t>(v.c.i.begin() + start, v.c.i.begin() + end);
    v.c.dims = {int64_t(v.c.i.size())};
    setOutput(0, std::move(v));
  }

  void gather() {
    const TensorValues& data = constIn(0, "the data");
    const std::vector<int64_t> data1 = ints(data, "the data");
    const TensorValues& idx = constIn(1, "the indices");
    if (attrInt("axis", 0) != 0) fail("gathers along an axis other than 0 of a shape");
    const std::vector<int64_t> at = ints(idx, "the indices");
    Value v;
    v.c.integer = true;
    for (int64_t k : at) {
      if (k < 0) k += int64_t(data1.size());
      if (k < 0 || k >= int64_t(data1.size())) fail("index " + str(k) + " outside the " + str(data1.size()) + " values");
      v.c.i.push_back(data1[size_t(k)]);
    }
    v.c.dims = idx.dims;
    setOutput(0, std::move(v));
  }

  void squeeze(bool unsqueeze) {
    const TensorValues& t = constIn(0, "the data");
    const std::vector<int64_t> data = ints(t, "the data");
    Value v;
    v.c.integer = true;
    v.c.i = data;
    if (unsqueeze) {
      if (!t.dims.empty()) fail("unsqueezes a vector; gpunodes folds scalars to vectors only");
      v.c.dims = {int64_t(data.size())};
    } else {
      if (data.size() != 1) fail("squeezes a constant of " + str(data.size()) + " values");
      v.c.dims = {};
    }
    setOutput(0, std::move(v));
  }

  void slice() {
    const std::vector<int64_t> data = ints(constIn(0, "the data"), "the data");
    const std::vector<int64_t> starts = ints(constIn(1, "starts"), "starts"), ends = ints(constIn(2, "ends"), "ends");
    if (has(3)) {
      const std::vector<int64_t> axes = ints(constIn(3, "axes"), "axes");
      if (axes.size() != 1 || (axes[0] != 0 && axes[0] != -1)) fail("slices along an axis other than 0 of a shape");
    }
    int64_t step = 1;
    if (has(4)) {
      const std::vector<int64_t> steps = ints(constIn(4, "steps"), "steps");
      if (steps.size() != 1 || steps[0] != 1) fail("slices with a step other than 1");
    }
    if (starts.size() != 1 || ends.size() != 1) fail("slices more than one axis");
    const int64_t n = int64_t(data.size());
    int64_t b = starts[0], e = ends[0];
    if (b < 0) b += n;
    if (e < 0) e += n;
    b = std::clamp<int64_t>(b, 0, n);
    e = std::clamp<int64_t>(e, b, n);
    Value v;
    v.c.integer = true;
    for (int64_t k = b; k < e; k += step) v.c.i.push_back(data[size_t(k)]);
    v.c.dims = {int64_t(v.c.i.size())};
    setOutput(0, std::move(v));
  }

  OnnxModel& m_;
  ::onnx::GraphProto& g_;
  std::function<void(double, const QString&)> progress_;
  ImportedNetwork net_;
  std::vector<nn::LayerNodePtr> nodes_;  // net_.layers' shapes, for the inference of the next ones
  QHash<QString, int> indexOf_;
  QSet<QString> ids_;
  std::map<std::string, Value> values_;
  std::map<std::string, std::vector<int>> consumers_;
  std::map<std::string, int> producer_;
  std::vector<int> order_, position_;  // the walk's order of the nodes, and each node's place in it
  std::vector<Pattern> patterns_;
  std::map<const NodeProto*, int> nodeIndex_;
  std::map<int, int> skip_;  // node -> its pattern's index where the layer is made, -1 for the others
  const NodeProto* node_ = nullptr;
};

}  // namespace

ImportedNetwork importNetwork(OnnxModel& model, const std::function<void(double, const QString&)>& progress) {
  return Importer(model, progress).run();
}

}  // namespace gn::nodes::onnx
