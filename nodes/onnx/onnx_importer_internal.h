// The ONNX importer's state and steps, shared by the files that hold them: onnx_importer.cpp (the graph's
// order, values, attributes and layers), onnx_import_patterns.cpp (multi-node forms found before the walk),
// onnx_import_torch_attention.cpp (torch's own nn.MultiheadAttention, self- and cross-attention),
// onnx_import_torch_mask.cpp (the masks torch adds to its scores: causal, key padding), onnx_import_torch_shapes.cpp
// (torch's shape arithmetic, evaluated), onnx_import_ops.cpp (one operation each), onnx_import_constants.cpp (constant folding and shape arithmetic),
// onnx_import_sequence.cpp (the sequence layers) and onnx_import_attention.cpp (the attention layers, as
// gpunodes' own export writes them). Private to nodes/onnx.
#pragma once
#include <QHash>
#include <QJsonArray>
#include <QSet>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "onnx_importer.h"

namespace gn::nodes::onnx::import_detail {

using ::onnx::AttributeProto;
using ::onnx::NodeProto;
using nn::LayerKind;

inline constexpr int64_t kBatch = INT64_MIN;  // the batch axis in shape arithmetic: known to be the batch, not its size

inline std::string str(int64_t v) { return std::to_string(v); }

inline std::string shapeStr(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + (s[i] == kBatch ? std::string("N") : str(s[i]));
  return t + "]";
}

// The shortest decimal that reads back as the same float: torch writes 1e-5 as the float 9.99999975e-06, and
// the layer's param should say 1e-05 again.
inline double shortest(float f) {
  for (int digits = 1; digits <= 9; ++digits) {
    const double d = QString::number(double(f), 'g', digits).toDouble();
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

// A name as the ONNX graph has it, shortened for a message.
inline std::string quoted(const std::string& s) { return "'" + (s.size() > 200 ? s.substr(0, 200) + "..." : s) + "'"; }

// Node tests the patterns share: an op with that many inputs and one output, an attribute by name, a Transpose's
// perm, and an integer attribute that is absent (def) or an integer equal to want.
inline bool isOp(const NodeProto* n, const char* op, int inputs) {
  return n && n->op_type() == op && n->input_size() == inputs && n->output_size() == 1;
}
inline const AttributeProto* attrOf(const NodeProto& n, const char* name) {
  for (const AttributeProto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
inline std::vector<int64_t> permOf(const NodeProto& n) {
  const AttributeProto* a = attrOf(n, "perm");
  if (!a || a->type() != AttributeProto::INTS) return {};
  return {a->ints().begin(), a->ints().end()};
}
inline bool intIs(const NodeProto& n, const char* name, int64_t def, int64_t want) {
  const AttributeProto* a = attrOf(n, name);
  return a ? a->type() == AttributeProto::INT && a->i() == want : def == want;
}

struct Value {
  enum Kind { Layer, Const } kind = Const;
  // Layer: how the ONNX tensor holds the layer's output (a sample [T, F], or the recurrent layer's [T, D*H]):
  // as it is ([N, ...]), time-major ([T, N, F], between torch's Transposes around a recurrent op), a recurrent
  // op's Y ([T, D, N, H]), Y with N and D swapped ([T, N, D, H]), Y batch-major ([N, T, D, H]), or one step of
  // the sequence kept ([N, 1, F]: a Slice before the Squeeze of x[:, -1]).
  enum Form { Batch, TimeMajor, RecY, RecYT, RecNTDH, StepSlice } form = Batch;
  int layer = -1;          // Layer: index into the network's layers
  int depth = 0;           // Layer: the layer's stacked count when this value was made (recurrent layers grow)
  bool fromRec = false;    // TimeMajor: a recurrent op's output, which the next op of the same kind may stack on
  int64_t step = 0;        // StepSlice: the step kept
  bool zeros = false;      // Const: ConstantOfShape's zeros (the shape may hold the batch): a zero state
  int64_t pad = 0;         // Layer: a Pad before an AveragePool that has not met it yet
  std::string padNode;
  // Layer: values that only one reader takes (onnx_import_attention.cpp): scores with gpunodes' causal mask
  // added, for the Softmax after them (maskNode: the Add, which names the causal Softmax), and a sequence with
  // its two axes swapped, for the MatMul that reads it as its b (a BatchMatMul with transpose_b).
  std::string maskNode;
  bool transposedB = false;
  // Const: a parameter expanded over the batch ([N, 1, E], a ClassToken's token), for the Concat that puts it
  // before the steps; param names the initializer.
  bool expanded = false;
  std::string param;
  TensorValues c;          // Const; integers may hold kBatch
};

// torch's exporter computes its reshapes' shapes from the tensors' Shape, so they hold the dynamic batch N: each
// entry is a * N + b (n * heads, T * N), and `scalar` says the value has rank 0 (a Gather of one index).
struct Lin {
  int64_t a = 0, b = 0;
  bool operator==(const Lin&) const = default;
};
struct Sym {
  std::vector<Lin> v;
  bool scalar = false;
};
inline std::string symStr(const std::vector<Lin>& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.size(); ++k) {
    std::string e = v[k].a ? (v[k].a == 1 ? "N" : std::to_string(v[k].a) + "N") : "";
    if (v[k].b || !v[k].a) e += (v[k].a && v[k].b > 0 ? "+" : "") + std::to_string(v[k].b);
    s += (k ? ", " : "") + e;
  }
  return s + "]";
}

// torch's shape arithmetic evaluated (onnx_import_torch_shapes.cpp): a value that Shape nodes of tensors whose
// shapes are known (`shapes`) and integer constants make through Gather, Slice, Squeeze, Unsqueeze, Concat, Add, Sub,
// Mul, Div, Cast, ConstantOfShape, Equal and Where; nullopt for anything else. Apart from the Importer because a
// torch layer's checks fill `shapes` as they learn them, and only then read the values.
class TorchShapes {
 public:
  TorchShapes(const ::onnx::GraphProto& g, const std::map<std::string, int>& producer,
              const std::map<std::string, Value>& values)
      : g_(g), producer_(producer), values_(values) {}
  std::map<std::string, std::vector<Lin>> shapes;  // a tensor's shape, as a * N + b per axis
  std::optional<Sym> eval(const std::string& name, int depth = 0) const;

 private:
  std::optional<Sym> constant(const std::string& name) const;
  const ::onnx::GraphProto& g_;
  const std::map<std::string, int>& producer_;
  const std::map<std::string, Value>& values_;
};

// One ONNX graph's import: run() walks the nodes in topological order and builds the layers.
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
  std::string where() const;
  [[noreturn]] void fail(const std::string& what) const { throw OnnxError(where() + ": " + what); }

  // --- the graph's order, names and producers ---------------------------------------------------------------
  void order();

  void readInitializers();

  void readInput();

  void readOutput();

  // --- values ---------------------------------------------------------------------------------------------
  bool has(int k) const { return node_->input_size() > k && !node_->input(k).empty(); }
  Value& value(int k);
  // A value made by a recurrent layer before the next ONNX op was stacked on it is that inner layer's output,
  // which the stacked layer no longer hands on.
  int depthOf(int layer) const;
  void checkDepth(const Value& v, const std::string& name) const;
  Value layerValue(int layer, Value::Form form = Value::Batch) const;
  // A layer's activation on input k, with its shape per sample.
  int layerIn(int k, bool padOk = false);
  const TensorValues& constIn(int k, const char* what);
  const Shape& shapeOf(int layer) const { return net_.layers[layer].out; }
  void setOutput(int k, Value v);
  void setLayer(int layer) { setOutput(0, layerValue(layer)); }
  void alias(int k) { setOutput(0, value(k)); }
  void onlyFirstOutput();

  // --- attributes -----------------------------------------------------------------------------------------
  const AttributeProto* attr(const char* name) const;
  int64_t attrInt(const char* name, int64_t def) const;
  double attrFloat(const char* name, double def) const;
  std::vector<int64_t> attrInts(const char* name) const;
  std::string attrString(const char* name, const std::string& def) const;

  // --- layers ---------------------------------------------------------------------------------------------
  QString makeId(const std::string& onnxName, const std::string& op);

  // An input of -1 is an open port before a wired one (MultiheadAttention's k and v before valid_lens).
  int addLayer(LayerKind kind, const std::string& name, QJsonObject params, const std::vector<int>& inputs,
               std::vector<std::pair<std::string, TensorValues>> weights, const std::string& source);
  int addLayer(LayerKind kind, QJsonObject params, const std::vector<int>& inputs,
               std::vector<std::pair<std::string, TensorValues>> weights = {});

  void needDims(const TensorValues& t, const std::vector<int64_t>& dims, const char* what) const;

  // --- patterns found before the walk ------------------------------------------------------------------------
  struct Pattern {
    LayerKind kind;
    std::string input;        // the activation read
    std::string output;       // the value made
    int first = -1;           // the node whose name names the layer
    int matmul = -1, add = -1;  // MatMul + Add: the nodes, for the weights
    // LayerNorm written out (opsets below 17): the reductions' axis, epsilon, and the scale and bias (empty:
    // none, 1 and 0).
    int64_t axis = -1;
    double eps = 1e-5;
    std::string scale, bias;
    // MultiheadAttention and NadarayaWatson (onnx_import_attention.cpp, and torch's cross-attention): the other
    // activations read (k and v), the constants by their role, checked against the shapes when the layer is
    // made ("in_w", "q_shape", "mask", ...), a scalar factor read from the file (the scores' 1/sqrt(d)), and
    // whether it has biases.
    std::vector<std::string> more;
    std::map<std::string, std::string> consts;
    double factor = 0;
    bool biased = false;
    std::string lens;  // MultiheadAttention: the valid lengths its key padding mask reads (none: empty)
  // torch's nn.MultiheadAttention whose key padding mask is torch's but for one node (`refused`, the reason in
  // `refusal`): refused once the rest of the layer is found (onnx_import_torch_mask.cpp).
  const NodeProto* refused = nullptr;
  std::string refusal;
    // MultiheadAttention as torch.onnx.export writes nn.MultiheadAttention (onnx_import_torch_attention.cpp): its
    // consts name the values by role, and `gemm` says out_proj is a Gemm (its weight as torch holds it) rather
    // than a MatMul by the transposed weight.
    bool torch = false, gemm = false;
  };

  // The one node reading `value`, when it has exactly one output (the patterns follow output(0) from it: a
  // node of a stranger's file may have none).
  const NodeProto* soleConsumer(const std::string& value) const;
  // The nodes of a RepeatedPtrField are not contiguous: their indices come from a map.
  int indexOfNode(const NodeProto* n) const { return nodeIndex_.at(n); }
  // The producer of `value` when it is that op with that many inputs and one output (the patterns follow a value
  // back to its node).
  const NodeProto* madeBy(const std::string& value, const char* op, int inputs) const {
    const auto it = producer_.find(value);
    return it != producer_.end() && isOp(&g_.node(it->second), op, inputs) ? &g_.node(it->second) : nullptr;
  }
  // A constant scalar's value: an initializer or a Constant node's, of one element.
  std::optional<double> scalar(const std::string& name) const;
  bool isConstName(const std::string& name, int depth = 0) const;
  static bool near(std::optional<double> v, double want) { return v && std::abs(*v - want) <= 1e-5 * std::abs(want); }
  // The operand of a two-input node that is not `value`.
  static const std::string* other(const NodeProto& n, const std::string& value);

  // The single axis a ReduceMean that keeps its dims reduces, or nullopt.
  static std::optional<int64_t> meanAxis(const NodeProto& n);
  // The nodes reading `value`, when there are exactly `count` and the graph's output is not among them.
  std::vector<const NodeProto*> consumersOf(const std::string& value, size_t count) const;

  // LayerNorm over the last axis as torch writes it below opset 17: m = ReduceMean(x), d = Sub(x, m),
  // v = ReduceMean(Pow(d, 2)), Div(d, Sqrt(Add(v, eps))), then Mul by the scale and Add of the bias (both
  // constants; an un-affine LayerNorm stops at the Div).
  void findLayerNorm(int i);

  void findPatterns();
  // nn.MultiheadAttention(batch_first=True) self-attention as torch 1.13's exporter decomposes it, found from
  // the Transpose to time-major; its shape arithmetic is evaluated when the layer is made, when the sample's
  // [T, E] is known.
  void findTorchAttention(int i);
  // Cross-attention (q from one tensor, k and v from another or two), found from q's Transpose to time-major:
  // torch writes each projection apart, its weight sliced from in_proj_weight in the graph or folded into an
  // initializer of its own (onnx_import_torch_attention.cpp).
  void findTorchCrossAttention(int i);
  // The shared end of both (Softmax, MatMul by v's heads, the merge, out_proj, back to batch-first), the
  // shape arithmetic behind `roots` and the check that nothing outside reads the pattern's values.
  void finishTorchAttention(Pattern pat, const NodeProto* sm, const std::string& vHeads, std::vector<int> nodes,
                            std::vector<std::string> roots, std::set<std::string> shaped);
  std::vector<const NodeProto*> torchReaders(const std::string& value) const;
  const NodeProto* torchOnly(const std::string& value) const;
  int emitTorchAttention(const Pattern& p, int in);
  // A refusal of a torch layer's check names the node that makes the value of `role`; the values of a role as the
  // shape arithmetic computes them, or a refusal naming the producer of `reader`'s value.
  void blame(const Pattern& p, const std::string& role) { node_ = &g_.node(producer_.at(p.consts.at(role))); }
  std::vector<Lin> torchValues(const TorchShapes& sh, const Pattern& p, const std::string& role, const char* what,
                               const std::string& reader);
  // The masks torch adds to the scores (onnx_import_torch_mask.cpp): from the scores, the causal mask, the key
  // padding mask or both; the masked scores, the scores when there is no mask, empty when the nodes are not torch's.
  std::string findTorchMask(Pattern& pat, const std::string& scores, std::vector<int>& nodes,
                            std::vector<std::string>& roots, std::set<std::string>& shaped);
  bool findTorchCausal(const NodeProto* unsqueeze, Pattern& pat, std::vector<int>& nodes, std::vector<std::string>& roots);
  void findTorchKeyPadding(const NodeProto* flat, Pattern& pat, std::vector<int>& nodes, std::vector<std::string>& roots);
  // A Transpose of k's heads into [N * heads, Tk, d] that only Shape nodes read: torch takes the keys' count for the
  // key padding mask from it.
  bool torchShapeOnly(const NodeProto* n) const;
  // The one reader of k's heads but such a Transpose.
  const NodeProto* torchKeyHeadsReader(const std::string& heads) const;
  // After the layer's output (tb): the Transpose above, the keys' Shape and the guard's Where, which then is the
  // layer's output.
  void finishTorchKeyPadding(Pattern& pat, const NodeProto* tb, std::vector<int>& nodes, std::vector<std::string>& roots,
                             std::set<std::string>& shaped);
  // The masks' values checked when the layer is made: causal or not, and the valid lengths' layer (-1: none).
  bool torchCausal(const Pattern& p, TorchShapes& sh, int64_t t, int64_t tk, int64_t e);
  int torchKeyPadding(const Pattern& p, TorchShapes& sh, int64_t e, int64_t heads, int64_t d, int64_t tk);
  void addPattern(Pattern p, const std::vector<int>& nodes);

  void emitPattern(int index);

  // A Linear from a weight [in, out] (MatMul, Gemm without transB) or [out, in] (transposed), times alpha, and a
  // bias [out] (or [1, out], or one value for all) times beta.
  int linear(int in, const TensorValues& w, bool transposed, double alpha, const TensorValues* b, double beta,
             const char* what);

  // --- one operation --------------------------------------------------------------------------------------
  void readNode();

  // Square windows, the same padding on every side, no dilation: gpunodes' Conv2d and pools.
  struct Window {
    int64_t kernel = 1, stride = 1, pad = 0;
  };
  Window window(const std::vector<int64_t>& kernelDefault) const;

  void conv();

  void batchNorm();

  void pool(bool max);

  // Zero padding of H and W, which torch writes before an AveragePool that counts padded cells; the pool
  // takes it as its padding.
  void pad();

  void gemm();

  void add();

  Value arithmetic(const TensorValues& a, const TensorValues& b, char op) const;

  void concat();

  void dropout();

  std::vector<int64_t> ints(const TensorValues& t, const char* what) const;

  void reshape();

  void transpose();

  void softmax();

  void layerNorm();
  // A LayerNorm over the last axis with the scale and bias given (none: 1 and 0), from the operator or the
  // pattern torch writes below opset 17.
  int layerNormLayer(int in, int64_t axis, double eps, const TensorValues* scale, const TensorValues* bias,
                     bool affine = true);

  // --- constants and shape arithmetic ------------------------------------------------------------------------
  void constant();

  void shape();

  void gather();

  void squeeze(bool unsqueeze);

  void slice();

  // --- the attention layers (onnx_import_attention.cpp) -------------------------------------------------------
  // An initializer: a constant no node makes (export writes the parameters, and only those, as initializers).
  bool isInitializer(const std::string& name) const;
  // A value a Constant node makes.
  bool isConstantNode(const std::string& name) const;
  // gpunodes' own decompositions, found before the walk: MultiheadAttention from the Split of its
  // in_proj_weight, NadarayaWatson from its Sub of keys from queries.
  void findAttention(int i);
  void findNadarayaWatson(int i);
  // ValidLength from its Equal of the ids to pad_id.
  void findValidLength(int i);
  int emitValidLength(const Pattern& p, int in);
  int emitAttention(const Pattern& p, int q);
  int emitNadarayaWatson(const Pattern& p, int in);
  // Add of an activation (input k) and a constant: PositionEmbedding, PositionalEncoding or a causal mask.
  void addConstant(int k);
  void mul();
  void matMul();
  void expand();
  void classToken();
  // A Transpose of a sequence's two axes that only a MatMul reads, as its b: kept for that MatMul.
  bool transposedForMatMul(const Value& v, const std::vector<int64_t>& perm);
  // The value `name` as a constant, for a pattern's checks.
  const TensorValues& constAt(const std::string& name, const char* what);
  // The layer whose batch-first output `name` is, read as an attention layer's `what` (its keys, its valid lengths).
  int activationOf(const std::string& name, const char* what);

  // --- the sequence layers -------------------------------------------------------------------------------------
  std::vector<int64_t> axesOf(int input);

  // A 2-D float constant transposed (gpunodes' export transposes a Linear's weight in the graph).
  void transposeConst(const TensorValues& c);

  // Constants joined along axis 0 (gpunodes' export puts a recurrent layer's gate blocks in ONNX's order so).
  void concatConst(int64_t axis);

  void unsqueezeFloats();

  // Split of a constant along axis 0.
  void split();

  // Zeros of a shape (torch's initial state of a recurrent op: [D, N, H]).
  void constantOfShape();

  // x[:, -1] or x[:, 0] of a sequence [T, F]: Gather along axis 1 with a scalar index.
  int stepLayer(int in, int64_t step);
  void gatherStep();
  void sliceStep();
  void squeezeLayer();
  void reshapeRecurrent(const Value& v);

  // nn.Embedding as torch writes it: Gather of the weight's rows by the (Cast) ids.
  void embedding();

  void oneHot();

  // ONNX's RNN, GRU and LSTM as torch writes nn.RNN / GRU / LSTM (batch_first): time-major X, zero initial
  // state, the default activations; W [D, G*H, F], R [D, G*H, H], B [D, 2*G*H] in ONNX's gate order (LSTM
  // i o f c, GRU z r h), put back in torch's (i f g o, r z n). The next op of the same kind on this one's Y (torch's
  // num_layers > 1) stacks on the same layer.
  void recurrent();

  OnnxModel& m_;
  ::onnx::GraphProto& g_;
  std::function<void(double, const QString&)> progress_;
  ImportedNetwork net_;
  std::vector<nn::LayerNodePtr> nodes_;  // net_.layers' shapes, for the inference of the next ones
  QHash<QString, int> indexOf_;
  QSet<QString> ids_;
  QHash<QString, int> nextSuffix_;
  std::map<std::string, Value> values_;
  std::map<int, int> depth_;  // recurrent layers: their num_layers so far
  std::map<std::string, std::vector<int>> consumers_;
  std::map<std::string, int> producer_;
  std::vector<int> order_, position_;  // the walk's order of the nodes, and each node's place in it
  std::vector<Pattern> patterns_;
  std::map<const NodeProto*, int> nodeIndex_;
  std::map<int, int> skip_;  // node -> its pattern's index where the layer is made, -1 for the others
  const NodeProto* node_ = nullptr;
};

}  // namespace gn::nodes::onnx::import_detail
