#include "onnx_importer.h"

#include <QRegularExpression>
#include <algorithm>
#include <cstring>

#include "../layer_nodes.h"
#include "onnx_importer_internal.h"

namespace gn::nodes::onnx {

QString supportedOps() {
  return "Conv, BatchNormalization, Relu, Sigmoid, Tanh, GELU in its Erf form (Div, Erf, Add, Mul, Mul), MaxPool, "
         "AveragePool (with a Pad before it), GlobalAveragePool, Flatten, Gemm, MatMul (with an Add of its "
         "bias; of two activations: BatchMatMul), Add (of a [T, E] constant: PositionEmbedding, "
         "PositionalEncoding, a causal mask before a Softmax), Mul (of two activations, or by one constant: "
         "Scale), Concat, Expand (a ClassToken's token), Dropout, Identity, Reshape, Transpose, Softmax, "
         "LayerNormalization (or its opset-13 form: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), "
         "gpunodes' own export of MultiheadAttention (with its key padding mask), ValidLength and NadarayaWatson, "
         "RNN, GRU and LSTM (between the Transposes of batch_first), Gather of an initializer's rows (Embedding) "
         "or of one step (x[:, -1], x[:, 0]), OneHot, and for shapes and constants Constant, ConstantOfShape, Shape, Gather, Unsqueeze, "
         "Squeeze, Slice, Split, Concat, Transpose and Cast";
}

ImportedNetwork importNetwork(OnnxModel& model, const std::function<void(double, const QString&)>& progress) {
  return import_detail::Importer(model, progress).run();
}

namespace import_detail {

std::string Importer::where() const {
  return "node " + quoted(node_->name().empty() ? "(unnamed)" : node_->name()) + " (" + node_->op_type() + ")";
}

void Importer::order() {
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

void Importer::readInitializers() {
  const int n = g_.initializer_size();
  for (int k = 0; k < n; ++k) {
    ::onnx::TensorProto& t = *g_.mutable_initializer(k);
    Value v;
    v.c = takeTensor(m_, t, "initializer " + quoted(t.name()));
    values_[t.name()] = std::move(v);
    if (progress_ && k % 8 == 0) progress_(0.05 + 0.25 * double(k) / n, "reading the weights");
  }
}

void Importer::readInput() {
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

void Importer::readOutput() {
  if (g_.output_size() != 1)
    throw OnnxError("the graph has " + str(g_.output_size()) + " outputs: a gpunodes network has one");
  const std::string& name = g_.output(0).name();
  const auto it = values_.find(name);
  if (it == values_.end() || it->second.kind != Value::Layer)
    throw OnnxError("graph output " + quoted(name) + " is not computed from the input");
  if (it->second.pad) throw OnnxError("graph output " + quoted(name) + " is a Pad that no AveragePool reads");
  if (!it->second.maskNode.empty() || it->second.transposedB)
    throw OnnxError("graph output " + quoted(name) + " is " +
                    (it->second.transposedB ? "a transposed sequence that no MatMul reads"
                                            : "scores with a causal mask added that no Softmax reads"));
  if (it->second.form != Value::Batch || it->second.depth != depthOf(it->second.layer))
    throw OnnxError("graph output " + quoted(name) + " is a recurrent op's inner or time-major value, not "
                    "the batch-first output of a layer");
  if (it->second.layer == 0) throw OnnxError("graph output " + quoted(name) + " is the input itself");
  // The output's layer goes last (the Network reads it); every layer after its inputs still holds.
  const int out = it->second.layer;
  if (out != net_.layers.size() - 1) {
    // Layers after it that the output does not need are dropped with a warning.
    std::vector<bool> needed(net_.layers.size(), false);
    needed[out] = true;
    for (int i = out; i >= 0; --i)
      if (needed[i])
        for (const QString& in : net_.layers[i].inputs)
          if (!in.isEmpty()) needed[indexOf_.value(in)] = true;
    QList<ImportedLayer> kept;
    for (int i = 0; i < net_.layers.size(); ++i)
      if (needed[i]) kept.append(std::move(net_.layers[i]));
      else net_.warnings.append("dropped " + net_.layers[i].id + ": the output does not depend on it");
    net_.layers = std::move(kept);
  }
}

Value& Importer::value(int k) {
  if (!has(k)) fail("input " + str(k) + " is missing");
  auto it = values_.find(node_->input(k));
  if (it == values_.end()) fail("reads " + quoted(node_->input(k)) + ", which is not computed yet");
  checkDepth(it->second, node_->input(k));
  return it->second;
}

int Importer::depthOf(int layer) const {
  const auto it = depth_.find(layer);
  return it == depth_.end() ? 0 : it->second;
}

void Importer::checkDepth(const Value& v, const std::string& name) const {
  if (v.kind == Value::Layer && v.depth != depthOf(v.layer))
    fail("reads " + quoted(name) + ", the output of an inner layer of the stacked " +
         net_.layers[v.layer].id.toStdString() + ", which gpunodes' layer does not hand on");
}

Value Importer::layerValue(int layer, Value::Form form) const {
  Value v;
  v.kind = Value::Layer;
  v.layer = layer;
  v.form = form;
  v.depth = depthOf(layer);
  return v;
}

int Importer::layerIn(int k, bool padOk) {
  Value& v = value(k);
  if (v.kind != Value::Layer)
    fail("input " + str(k) + " " + quoted(node_->input(k)) + " is a constant; gpunodes needs the activation there");
  if (v.pad && !padOk)
    fail("reads the output of Pad " + quoted(v.padNode) + ": gpunodes takes a Pad only right before an AveragePool");
  if (!v.maskNode.empty())
    fail("reads the output of Add " + quoted(v.maskNode) + ", which adds a causal mask: gpunodes takes that only "
         "right before a Softmax (a causal Softmax)");
  if (v.transposedB) fail("reads a transposed sequence that gpunodes keeps for a BatchMatMul's b");
  if (v.form != Value::Batch) {
    static const char* forms[] = {"", "a sequence in time-major order [T, N, F]", "a recurrent op's Y [T, D, N, H]",
                                  "a recurrent op's Y as [T, N, D, H]", "a recurrent op's Y as [N, T, D, H]",
                                  "one step sliced from a sequence"};
    fail("input " + str(k) + " " + quoted(node_->input(k)) + " is " + forms[v.form] +
         ", which gpunodes only follows through the Transposes, Reshapes and Squeezes torch writes around "
         "RNN, GRU and LSTM (and x[:, -1])");
  }
  return v.layer;
}

const TensorValues& Importer::constIn(int k, const char* what) {
  Value& v = value(k);
  if (v.kind != Value::Const) fail(std::string(what) + " (input " + str(k) + ") must be a constant or an initializer");
  if (v.expanded)
    fail(std::string(what) + " (input " + str(k) + ") is a parameter expanded over the batch, which gpunodes reads "
         "only as a ClassToken's token (a Concat before the steps)");
  return v.c;
}

void Importer::setOutput(int k, Value v) {
  if (node_->output_size() <= k || node_->output(k).empty()) return;
  values_[node_->output(k)] = std::move(v);
}

void Importer::onlyFirstOutput() {
  for (int k = 1; k < node_->output_size(); ++k)
    if (!node_->output(k).empty() && consumers_.count(node_->output(k)))
      fail("its output " + str(k) + " " + quoted(node_->output(k)) + " is read, and gpunodes only has the first");
}

const AttributeProto* Importer::attr(const char* name) const {
  for (const AttributeProto& a : node_->attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t Importer::attrInt(const char* name, int64_t def) const {
  const AttributeProto* a = attr(name);
  if (!a) return def;
  if (a->type() != AttributeProto::INT) fail(std::string("attribute ") + name + " must be an integer");
  return a->i();
}

double Importer::attrFloat(const char* name, double def) const {
  const AttributeProto* a = attr(name);
  if (!a) return def;
  if (a->type() != AttributeProto::FLOAT) fail(std::string("attribute ") + name + " must be a float");
  return shortest(a->f());
}

std::vector<int64_t> Importer::attrInts(const char* name) const {
  const AttributeProto* a = attr(name);
  if (!a) return {};
  if (a->type() != AttributeProto::INTS) fail(std::string("attribute ") + name + " must be a list of integers");
  if (a->ints_size() > 16) fail(std::string("attribute ") + name + " has " + str(a->ints_size()) + " values");
  return {a->ints().begin(), a->ints().end()};
}

std::string Importer::attrString(const char* name, const std::string& def) const {
  const AttributeProto* a = attr(name);
  if (!a) return def;
  if (a->type() != AttributeProto::STRING) fail(std::string("attribute ") + name + " must be a string");
  return a->s();
}

QString Importer::makeId(const std::string& onnxName, const std::string& op) {
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
  // The next suffix per base is remembered: 100,000 unnamed Relus would otherwise try 2, 3, ... each time.
  QString id = base;
  if (ids_.contains(id)) {
    int& k = nextSuffix_[base];
    k = std::max(k, 2);
    do id = base + "_" + QString::number(k++);
    while (ids_.contains(id));
  }
  ids_.insert(id);
  return id;
}

int Importer::addLayer(LayerKind kind, const std::string& name, QJsonObject params, const std::vector<int>& inputs,
             std::vector<std::pair<std::string, TensorValues>> weights, const std::string& source) {
  ImportedLayer l;
  l.id = makeId(name, node_ ? node_->op_type() : "Input");
  l.kind = kind;
  l.params = std::move(params);
  l.source = source;
  std::vector<nn::LayerNodePtr> in;
  for (int i : inputs) {
    l.inputs.append(i < 0 ? QString() : net_.layers[i].id);
    in.push_back(i < 0 ? nullptr : nodes_[i]);
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

int Importer::addLayer(LayerKind kind, QJsonObject params, const std::vector<int>& inputs,
             std::vector<std::pair<std::string, TensorValues>> weights) {
  return addLayer(kind, node_->name().empty() ? node_->op_type() : node_->name(), std::move(params), inputs,
                  std::move(weights), where());
}

void Importer::needDims(const TensorValues& t, const std::vector<int64_t>& dims, const char* what) const {
  if (t.dims != dims) {
    std::string got = "[", want = "[";
    for (size_t i = 0; i < t.dims.size(); ++i) got += (i ? ", " : "") + str(t.dims[i]);
    for (size_t i = 0; i < dims.size(); ++i) want += (i ? ", " : "") + str(dims[i]);
    fail(std::string(what) + " has dims " + got + "], expected " + want + "]");
  }
  if (t.integer) fail(std::string(what) + " must hold floats");
}

}  // namespace import_detail

}  // namespace gn::nodes::onnx
