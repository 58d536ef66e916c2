// Networks drawn from layers: a description of a layer graph, shape inference over it (a pure function, so
// that validation and the editor can call it on every edit), and the canonical text that is the model
// signature of a drawn network. Model::create builds a NetworkSpec into the same modules the built-in
// architectures use (model.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/shape.h"

namespace gn::nn {

// The layer types, named as PyTorch's nn modules (GlobalAvgPool2d is AdaptiveAvgPool2d((1, 1)); OneHot is
// F.one_hot as floats; Reshape and Transpose act on the per-sample axes; LastStep is x[:, -1], FirstStep
// x[:, 0]; BatchMatMul is torch.bmm, Mul and Scale element-wise products; the positional layers and the
// class token are d2l 11.6 and 11.8's).
enum class LayerKind {
  Input,
  Conv2d,
  BatchNorm2d,
  BatchNorm1d,
  ReLU,
  Sigmoid,
  Tanh,
  GELU,
  MaxPool2d,
  AvgPool2d,
  GlobalAvgPool2d,
  Flatten,
  Linear,
  Dropout,
  Add,
  Concat,
  // Sequences: a Layer wire may carry [T, F] per sample (steps x features) or [T] token ids.
  Embedding,
  OneHot,
  RNN,
  GRU,
  LSTM,
  Reshape,
  Transpose,
  LastStep,
  // Attention and transformers (d2l chapter 11).
  LayerNorm,
  MultiheadAttention,
  BatchMatMul,
  Softmax,
  Mul,
  Scale,
  PositionalEncoding,
  PositionEmbedding,
  ClassToken,
  FirstStep,
  NadarayaWatson,  // d2l 11.2's NWKernelRegression: rows (query, key, value) [T, 3] -> [T]
  ValidLength,     // token ids [T] -> [1], the count of ids that are not pad_id (d2l's (X != pad).sum(1))
};
const char* layer_kind_name(LayerKind kind);  // "Conv2d": also the node type's name
std::optional<LayerKind> parse_layer_kind(const std::string& name);
// The input ports' names, in order: {} for Input, {"a", "b"} for Add, Concat, BatchMatMul and Mul, {"q", "k",
// "v", "valid_lens"} for MultiheadAttention, {"in"} otherwise.
std::vector<std::string> layer_ports(LayerKind kind);
// How many of those ports must be wired: all but MultiheadAttention's k, v and valid_lens (self-attention
// without k and v; v without k is refused). An open optional port before a wired one is a hole: -1 in
// LayerSpec::inputs, a null pointer in LayerNode::inputs, an empty Shape for infer_layer and an empty name in
// the canonical text ("<-x,,,lens"); trailing open ports are left out, so a prefix reads as before.
int layer_required_ports(LayerKind kind);

// One layer: its kind and the params that kind reads (the others keep their defaults and are ignored).
struct LayerSpec {
  std::string id;  // the node id: parameter names are "<id>.weight"
  LayerKind kind = LayerKind::ReLU;
  std::vector<int> inputs;  // NetworkSpec only: indices of earlier layers, in port order (-1: an open port)
  Shape shape;              // Input: the shape per sample, [C, H, W], [T, F] or [features]; Reshape: the
                            // shape per sample wanted, one -1 allowed
  int64_t features = 0;     // Conv2d out_channels, Linear out_features, RNN/GRU/LSTM hidden_size,
                            // Embedding embedding_dim, OneHot num_classes, LayerNorm normalized_shape (0:
                            // the input's last axis, whatever it is)
  int64_t vocab = 0;        // Embedding num_embeddings
  int64_t num_layers = 1;   // RNN, GRU, LSTM
  bool bidirectional = false;  // RNN, GRU, LSTM
  bool relu = false;           // RNN: nonlinearity relu instead of tanh
  double dropout = 0;          // RNN, GRU, LSTM: between stacked layers, in training; MultiheadAttention: on
                               // the attention weights; PositionalEncoding: after the addition
  int64_t dim0 = 0, dim1 = 1;  // Transpose: the per-sample axes swapped
  int64_t kernel = 1;       // Conv2d, pools: kernel_size
  int64_t stride = 1;       // Conv2d, pools (pools: 0 means kernel_size, PyTorch's default)
  int64_t padding = 0;      // Conv2d, pools
  int64_t groups = 1;       // Conv2d
  bool bias = true;         // Conv2d, Linear, RNN, GRU, LSTM, MultiheadAttention
  double eps = 1e-5;        // BatchNorm, LayerNorm
  double momentum = 0.1;    // BatchNorm
  double p = 0.5;           // Dropout
  int64_t heads = 1;        // MultiheadAttention num_heads
  bool causal = false;      // MultiheadAttention, Softmax: a query sees no later step
  bool transpose_b = false; // BatchMatMul: b is [N, K] per sample, torch.bmm(a, b.transpose(1, 2))
  bool affine = true;       // LayerNorm elementwise_affine
  double scale = 1;         // Scale: the factor
  int64_t max_len = 1000;   // PositionalEncoding: the longest sequence its table covers
  int64_t pad_id = 1;       // ValidLength: the id that pads a sequence, not counted
  // The pool stride in effect.
  int64_t pool_stride() const { return stride > 0 ? stride : kernel; }
  // The per-sample output of Reshape for an input of `values` values: `shape` with its -1 resolved. Throws
  // LayerError naming both shapes when they cannot agree.
  Shape reshape_target(const Shape& in) const;
};
// Whether a kind is one of the recurrent layers (RNN, GRU, LSTM).
bool is_recurrent(LayerKind kind);

// What a layer makes of its inputs: the output shape per sample and its cost.
struct LayerInfo {
  Shape out;
  double params = 0;   // trainable scalars (doubles: absurd params give huge numbers, never overflow)
  double buffers = 0;  // BatchNorm running statistics
  double flops = 0;    // forward, per sample (a multiply-add counts 2)
};

// A layer that cannot take its inputs, or whose params make no sense: says which input port.
class LayerError : public ShapeError {
 public:
  LayerError(std::string port, const std::string& message) : ShapeError(message), port_(std::move(port)) {}
  const std::string& port() const { return port_; }  // "in", "a", "b"; empty for a param problem

 private:
  std::string port_;
};

// The shape inference of one layer, pure: `inputs` are the per-sample shapes on its ports, in port order.
// Throws LayerError naming the port and both shapes where they conflict, or the param that is wrong.
LayerInfo infer_layer(const LayerSpec& layer, const std::vector<Shape>& inputs);

// A layer with its inputs, as wires hand it on: what the Layer port carries, before and during a run.
// Built by make_layer, which runs the inference, so a LayerNode always has a valid shape.
struct LayerNode {
  LayerSpec spec;  // spec.inputs unused: the inputs are the pointers below
  std::vector<std::shared_ptr<const LayerNode>> inputs;
  LayerInfo info;
  // Frees a chain of layers one by one: a hostile file may chain 100,000, too deep for nested destructors.
  ~LayerNode();
};
using LayerNodePtr = std::shared_ptr<const LayerNode>;
LayerNodePtr make_layer(LayerSpec spec, std::vector<LayerNodePtr> inputs);

// A whole network: layers in construction order (every layer after its inputs; the last is the output).
struct NetworkSpec {
  std::vector<LayerSpec> layers;

  // The network that ends at `out`: every layer reachable upstream from it, ordered by a depth-first walk
  // that takes inputs in port order (so a drawn network draws its weights in the order the built-in one
  // does). Throws Error when it has no Input or more than one (naming them).
  static NetworkSpec ending_at(const LayerNode& out);

  // Canonical text, "network " then each layer as "id:Kind(param=value,...)<-input,input" joined by "; ":
  // the model signature of a drawn network, so a parameter file carries its whole architecture.
  std::string text() const;
  // The inverse; checks everything (names, numbers, input references, one Input, shapes) and throws Error.
  static NetworkSpec parse(const std::string& text);

  const LayerSpec& input() const;        // the one Input layer
  std::vector<LayerInfo> infer() const;  // every layer's info, in order; throws LayerError as make_layer
};

}  // namespace gn::nn
