// Shape inference of drawn networks (their canonical text: network_text.cpp).
#include "gpunodes/nn/network.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "network_internal.h"

namespace gn::nn {

std::string dims_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out.empty() ? "scalar" : out;
}

namespace {

struct KindName {
  LayerKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {LayerKind::Input, "Input"},
    {LayerKind::Conv2d, "Conv2d"},
    {LayerKind::BatchNorm2d, "BatchNorm2d"},
    {LayerKind::BatchNorm1d, "BatchNorm1d"},
    {LayerKind::ReLU, "ReLU"},
    {LayerKind::Sigmoid, "Sigmoid"},
    {LayerKind::Tanh, "Tanh"},
    {LayerKind::GELU, "GELU"},
    {LayerKind::MaxPool2d, "MaxPool2d"},
    {LayerKind::AvgPool2d, "AvgPool2d"},
    {LayerKind::GlobalAvgPool2d, "GlobalAvgPool2d"},
    {LayerKind::Flatten, "Flatten"},
    {LayerKind::Linear, "Linear"},
    {LayerKind::Dropout, "Dropout"},
    {LayerKind::Add, "Add"},
    {LayerKind::Concat, "Concat"},
    {LayerKind::Embedding, "Embedding"},
    {LayerKind::OneHot, "OneHot"},
    {LayerKind::RNN, "RNN"},
    {LayerKind::GRU, "GRU"},
    {LayerKind::LSTM, "LSTM"},
    {LayerKind::Reshape, "Reshape"},
    {LayerKind::Transpose, "Transpose"},
    {LayerKind::LastStep, "LastStep"},
    {LayerKind::LayerNorm, "LayerNorm"},
    {LayerKind::MultiheadAttention, "MultiheadAttention"},
    {LayerKind::BatchMatMul, "BatchMatMul"},
    {LayerKind::Softmax, "Softmax"},
    {LayerKind::Mul, "Mul"},
    {LayerKind::Scale, "Scale"},
    {LayerKind::PositionalEncoding, "PositionalEncoding"},
    {LayerKind::PositionEmbedding, "PositionEmbedding"},
    {LayerKind::ClassToken, "ClassToken"},
    {LayerKind::FirstStep, "FirstStep"},
    {LayerKind::NadarayaWatson, "NadarayaWatson"},
    {LayerKind::ValidLength, "ValidLength"},
};

// Far past any real layer, and small enough that products of a few of them stay exact in a double.
constexpr int64_t kMaxDim = int64_t(1) << 24;
constexpr double kMaxValues = 9007199254740992.0;  // 2^53

double numel(const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

std::string num_text(double v) {
  return std::to_string(static_cast<long long>(v));
}

std::string name(const LayerSpec& l) {
  return l.id + " (" + layer_kind_name(l.kind) + ")";
}

// Output side of a window of `kernel` at `stride` over `size` padded by `pad` on each side.
int64_t window_out(const LayerSpec& l, const char* what, int64_t size, int64_t kernel, int64_t stride,
                   int64_t pad, const Shape& in) {
  if (size + 2 * pad < kernel)
    throw LayerError("in", std::string(what) + " window " + std::to_string(kernel) +
                               " is larger than its input " + dims_text(in) +
                               (pad ? " padded by " + std::to_string(pad) : std::string()));
  (void)l;
  return (size + 2 * pad - kernel) / stride + 1;
}

void need_image(const LayerSpec& l, const Shape& in) {
  if (in.size() != 3)
    throw LayerError("in", std::string(layer_kind_name(l.kind)) + " needs a [C, H, W] input, got " +
                               (in.size() == 1 ? "a flat input of " : "") + dims_text(in) +
                               (in.size() == 1 ? ": it cannot follow a Flatten or a Linear" : ""));
}

// A [T, F] sequence: what the recurrent layers and LastStep read.
void need_sequence(const LayerSpec& l, const Shape& in) {
  if (in.size() == 2) return;
  const std::string kind = layer_kind_name(l.kind);
  throw LayerError("in", kind + " needs a [T, F] sequence (steps x features), got " + dims_text(in) +
                             (in.size() == 1 ? ": token ids [T] need an Embedding or a OneHot first, and a "
                                               "flat [features] a Reshape to [T, F]"
                                             : ": put a Reshape to [T, F] before it"));
}

// Token ids [T]: what Embedding and OneHot read.
void need_tokens(const LayerSpec& l, const Shape& in) {
  if (in.size() == 1) return;
  throw LayerError("in", std::string(layer_kind_name(l.kind)) + " needs token ids [T], got " + dims_text(in) +
                             ": wire it to an Input of shape [T] fed by a text dataset");
}

void need_positive(const char* param, int64_t v, int64_t min = 1) {
  if (v < min || v > kMaxDim)
    throw LayerError("", std::string(param) + " must be between " + std::to_string(min) + " and " +
                             std::to_string(kMaxDim) + ", got " + std::to_string(v));
}

// nn.MultiheadAttention(E, num_heads, dropout, bias, batch_first=True) with a fused in_proj of [3E, E]: q
// [Tq, E], k and v [Tk, E] (k = q and v = k where they are not wired), valid_lens [1] (optional).
LayerInfo infer_attention(const LayerSpec& l, const std::vector<Shape>& inputs) {
  auto wired = [&](size_t i) { return inputs.size() > i && !inputs[i].empty(); };
  if (wired(2) && !wired(1))
    throw LayerError("v", "MultiheadAttention's v is wired but k is not: wire k too (v defaults to k, not k to v)");
  const Shape& q = inputs[0];
  const Shape& k = wired(1) ? inputs[1] : q;
  const Shape& v = wired(2) ? inputs[2] : k;
  if (wired(3) && inputs[3] != Shape{1})
    throw LayerError("valid_lens", "MultiheadAttention's valid_lens is one length per sample, [1], got " +
                                       dims_text(inputs[3]) + " (q is " + dims_text(q) + "): a ValidLength layer gives it");
  const char* ports[] = {"q", "k", "v"};
  const Shape* shapes[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (shapes[i]->size() != 2)
      throw LayerError(ports[i], std::string("MultiheadAttention needs a [T, E] sequence on ") + ports[i] +
                                     ", got " + dims_text(*shapes[i]));
  const int64_t e = q[1];
  need_positive("num_heads", l.heads);
  if (e % l.heads != 0)
    throw LayerError("", "num_heads=" + std::to_string(l.heads) + " must divide the embedding width " +
                             std::to_string(e) + " of q " + dims_text(q));
  if (k[1] != e || v[1] != e)
    throw LayerError(k[1] != e ? "k" : "v", "MultiheadAttention's q, k and v share one width: q is " + dims_text(q) +
                                                ", k is " + dims_text(k) + ", v is " + dims_text(v));
  if (v[0] != k[0])
    throw LayerError("v", "MultiheadAttention needs one value per key: k is " + dims_text(k) + ", v is " + dims_text(v));
  if (l.causal && q[0] > k[0])
    throw LayerError("k", "a causal MultiheadAttention needs at least as many keys as queries: q is " + dims_text(q) +
                              ", k is " + dims_text(k));
  if (!(l.dropout >= 0 && l.dropout < 1)) throw LayerError("", "dropout must be at least 0 and below 1");
  LayerInfo info;
  info.out = q;
  const double E = static_cast<double>(e), tq = static_cast<double>(q[0]), tk = static_cast<double>(k[0]);
  info.params = 4 * E * E + (l.bias ? 4 * E : 0);
  info.flops = 2 * E * E * (2 * tq + 2 * tk) + 4 * tq * tk * E + 4 * tq * tk * static_cast<double>(l.heads);
  return info;
}

}  // namespace

const char* layer_kind_name(LayerKind kind) {
  for (const KindName& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

std::optional<LayerKind> parse_layer_kind(const std::string& n) {
  for (const KindName& k : kKinds)
    if (n == k.name) return k.kind;
  return std::nullopt;
}

bool is_recurrent(LayerKind kind) {
  return kind == LayerKind::RNN || kind == LayerKind::GRU || kind == LayerKind::LSTM;
}

Shape LayerSpec::reshape_target(const Shape& in) const {
  if (shape.empty() || shape.size() > 4)
    throw LayerError("", "shape must have 1 to 4 dimensions per sample, got [" + dims_text(shape) + "]");
  double known = 1;
  int free_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (free_at >= 0) throw LayerError("", "shape [" + dims_text(shape) + "] has more than one -1");
      free_at = static_cast<int>(i);
    } else {
      need_positive("every dimension of shape (or one -1)", shape[i]);
      known *= static_cast<double>(shape[i]);
    }
  }
  const double values = numel(in);
  Shape out = shape;
  if (free_at >= 0) {
    const double rest = values / known;
    if (rest != std::floor(rest) || rest < 1)
      throw LayerError("in", "Reshape cannot make [" + dims_text(shape) + "] of the " + dims_text(in) + " input's " +
                                 num_text(values) + " values per sample: " + num_text(values) +
                                 " is not a multiple of " + num_text(known));
    out[static_cast<size_t>(free_at)] = static_cast<int64_t>(rest);
  } else if (known != values) {
    throw LayerError("in", "Reshape to [" + dims_text(shape) + "] holds " + num_text(known) +
                               " values per sample, but its input " + dims_text(in) + " holds " + num_text(values));
  }
  return out;
}

std::vector<std::string> layer_ports(LayerKind kind) {
  switch (kind) {
    case LayerKind::Input:
      return {};
    case LayerKind::Add:
    case LayerKind::Concat:
    case LayerKind::BatchMatMul:
    case LayerKind::Mul:
      return {"a", "b"};
    case LayerKind::MultiheadAttention:
      return {"q", "k", "v", "valid_lens"};
    default:
      return {"in"};
  }
}

int layer_required_ports(LayerKind kind) {
  return kind == LayerKind::MultiheadAttention ? 1 : static_cast<int>(layer_ports(kind).size());
}

LayerInfo infer_layer(const LayerSpec& l, const std::vector<Shape>& inputs) {
  const int wired = static_cast<int>(inputs.size()), ports = static_cast<int>(layer_ports(l.kind).size());
  // An open port (an empty shape) is allowed only past the required ones, and not as the last.
  bool holes_ok = inputs.empty() || !inputs.back().empty();
  for (int i = 0; i < std::min(wired, layer_required_ports(l.kind)); ++i) holes_ok = holes_ok && !inputs[i].empty();
  if (!holes_ok) throw LayerError("", name(l) + " has a required input that is not wired");
  if (wired < layer_required_ports(l.kind) || wired > ports)
    throw LayerError("", name(l) + " takes " +
                             (ports == layer_required_ports(l.kind) ? std::to_string(ports)
                                                                    : std::to_string(layer_required_ports(l.kind)) +
                                                                          " to " + std::to_string(ports)) +
                             " inputs, got " + std::to_string(inputs.size()));
  LayerInfo info;
  const Shape in = inputs.empty() ? Shape{} : inputs[0];
  const double n_in = numel(in);
  switch (l.kind) {
    case LayerKind::Input:
      if (l.shape.empty() || l.shape.size() > 3)
        throw LayerError("", "shape must be [C, H, W], [T, F] (a sequence) or [features] (also token ids [T]), "
                             "got [" + dims_text(l.shape) + "]");
      for (int64_t d : l.shape) need_positive("every dimension of shape", d);
      info.out = l.shape;
      break;
    case LayerKind::Conv2d: {
      need_image(l, in);
      need_positive("out_channels", l.features);
      need_positive("kernel_size", l.kernel);
      need_positive("stride", l.stride);
      need_positive("padding", l.padding, 0);
      need_positive("groups", l.groups);
      if (in[0] % l.groups != 0 || l.features % l.groups != 0)
        throw LayerError("in", "groups=" + std::to_string(l.groups) + " must divide the input's " +
                                   std::to_string(in[0]) +
                                   " channels and out_channels=" + std::to_string(l.features));
      const int64_t oh = window_out(l, "the convolution", in[1], l.kernel, l.stride, l.padding, in);
      const int64_t ow = window_out(l, "the convolution", in[2], l.kernel, l.stride, l.padding, in);
      info.out = {l.features, oh, ow};
      const double per_out = static_cast<double>(in[0] / l.groups) * static_cast<double>(l.kernel * l.kernel);
      info.params =
          static_cast<double>(l.features) * per_out + (l.bias ? static_cast<double>(l.features) : 0);
      info.flops = 2 * per_out * numel(info.out);
      break;
    }
    case LayerKind::BatchNorm2d:
    case LayerKind::BatchNorm1d: {
      if (l.kind == LayerKind::BatchNorm2d) need_image(l, in);
      if (l.kind == LayerKind::BatchNorm1d && in.size() != 1)
        throw LayerError("in", "BatchNorm1d needs a flat [features] input, got " + dims_text(in) +
                                   ": use BatchNorm2d on images, or put a Flatten before it");
      if (!(l.eps > 0 && l.eps < 1)) throw LayerError("", "eps must be above 0 and below 1");
      if (!(l.momentum >= 0 && l.momentum <= 1)) throw LayerError("", "momentum must be between 0 and 1");
      info.out = in;
      info.params = 2 * static_cast<double>(in[0]);
      info.buffers = 2 * static_cast<double>(in[0]);
      info.flops = 4 * n_in;
      break;
    }
    case LayerKind::ReLU:
    case LayerKind::Sigmoid:
    case LayerKind::Tanh:
    case LayerKind::GELU:
      info.out = in;
      info.flops = n_in;
      break;
    case LayerKind::Dropout:
      if (!(l.p >= 0 && l.p < 1)) throw LayerError("", "p must be at least 0 and below 1");
      info.out = in;
      break;
    case LayerKind::MaxPool2d:
    case LayerKind::AvgPool2d: {
      need_image(l, in);
      need_positive("kernel_size", l.kernel);
      need_positive("stride", l.stride, 0);
      need_positive("padding", l.padding, 0);
      // PyTorch's rule: padding beyond half the window would make windows of padding only.
      if (2 * l.padding > l.kernel)
        throw LayerError("", "padding " + std::to_string(l.padding) +
                                 " must be at most half of kernel_size " + std::to_string(l.kernel));
      const int64_t s = l.pool_stride();
      info.out = {in[0], window_out(l, "the pool", in[1], l.kernel, s, l.padding, in),
                  window_out(l, "the pool", in[2], l.kernel, s, l.padding, in)};
      info.flops = numel(info.out) * static_cast<double>(l.kernel * l.kernel);
      break;
    }
    case LayerKind::GlobalAvgPool2d:
      need_image(l, in);
      info.out = {in[0], 1, 1};
      info.flops = n_in;
      break;
    case LayerKind::Flatten:
      info.out = {static_cast<int64_t>(n_in)};
      break;
    case LayerKind::Linear: {
      need_positive("out_features", l.features);
      // PyTorch's Linear acts on the last axis, so a [T, F] sequence gets [T, out_features].
      if (in.size() != 1 && in.size() != 2)
        throw LayerError("in", "Linear needs a flat [features] input or a [T, F] sequence, got " + dims_text(in) +
                                   " (" + std::to_string(static_cast<int64_t>(n_in)) +
                                   " values per sample): put a Flatten before it");
      info.out = in;
      info.out.back() = l.features;
      const double f = static_cast<double>(in.back()), steps = in.size() == 2 ? static_cast<double>(in[0]) : 1;
      info.params = f * static_cast<double>(l.features) + (l.bias ? static_cast<double>(l.features) : 0);
      info.flops = 2 * f * static_cast<double>(l.features) * steps;
      break;
    }
    case LayerKind::Embedding:
      need_tokens(l, in);
      need_positive("num_embeddings", l.vocab);
      need_positive("embedding_dim", l.features);
      info.out = {in[0], l.features};
      info.params = static_cast<double>(l.vocab) * static_cast<double>(l.features);
      break;
    case LayerKind::OneHot:
      need_tokens(l, in);
      need_positive("num_classes", l.features);
      info.out = {in[0], l.features};
      break;
    case LayerKind::RNN:
    case LayerKind::GRU:
    case LayerKind::LSTM: {
      need_sequence(l, in);
      need_positive("hidden_size", l.features);
      if (l.num_layers < 1 || l.num_layers > 64)
        throw LayerError("", "num_layers must be between 1 and 64, got " + std::to_string(l.num_layers));
      if (!(l.dropout >= 0 && l.dropout < 1)) throw LayerError("", "dropout must be at least 0 and below 1");
      const double gates = l.kind == LayerKind::LSTM ? 4 : l.kind == LayerKind::GRU ? 3 : 1;
      const double h = static_cast<double>(l.features), d = l.bidirectional ? 2 : 1;
      const double steps = static_cast<double>(in[0]);
      double in_size = static_cast<double>(in[1]);
      for (int64_t layer = 0; layer < l.num_layers; ++layer) {
        const double per_direction = gates * h * (in_size + h) + (l.bias ? 2 * gates * h : 0);
        info.params += d * per_direction;
        info.flops += d * steps * (2 * gates * h * (in_size + h) + 4 * gates * h);
        in_size = h * d;
      }
      info.out = {in[0], static_cast<int64_t>(h * d)};
      break;
    }
    case LayerKind::Reshape:
      info.out = l.reshape_target(in);
      break;
    case LayerKind::Transpose: {
      const int64_t rank = static_cast<int64_t>(in.size());
      auto axis = [&](const char* param, int64_t v) {
        if (v < -rank || v >= rank)
          throw LayerError("", std::string(param) + "=" + std::to_string(v) + " is not an axis of the " +
                                   dims_text(in) + " input (per sample: 0 to " + std::to_string(rank - 1) + ")");
        return static_cast<size_t>(v < 0 ? v + rank : v);
      };
      const size_t a = axis("dim0", l.dim0), b = axis("dim1", l.dim1);
      info.out = in;
      std::swap(info.out[a], info.out[b]);
      break;
    }
    case LayerKind::LastStep:
      need_sequence(l, in);
      info.out = {in[1]};
      break;
    case LayerKind::FirstStep:
      need_sequence(l, in);
      info.out = {in[1]};
      break;
    case LayerKind::NadarayaWatson:
      if (in.size() != 2 || in[1] != 3)
        throw LayerError("in", "NadarayaWatson reads rows of (query, key, value): [T, 3] per sample, got " +
                                   dims_text(in) + " (a Dataset attention_pooling gives them)");
      info.out = {in[0]};
      info.params = 1;
      info.flops = 10 * static_cast<double>(in[0]) * static_cast<double>(in[0]);
      break;
    case LayerKind::LayerNorm:
      if (!(l.eps > 0 && l.eps < 1)) throw LayerError("", "eps must be above 0 and below 1");
      if (l.features < 0) throw LayerError("", "normalized_shape must be 0 (the last axis) or its size");
      if (l.features != 0 && l.features != in.back())
        throw LayerError("in", "LayerNorm normalizes the last axis, of " + std::to_string(in.back()) +
                                   " in its input " + dims_text(in) + ", but normalized_shape is " +
                                   std::to_string(l.features));
      info.out = in;
      info.params = l.affine ? 2 * static_cast<double>(in.back()) : 0;
      info.flops = 8 * n_in;
      break;
    case LayerKind::MultiheadAttention:
      info = infer_attention(l, inputs);
      break;
    case LayerKind::ValidLength:
      if (in.size() != 1)
        throw LayerError("in", "ValidLength counts token ids [T] per sample, got " + dims_text(in) +
                                   ": wire it to the Input of token ids, before any Embedding");
      if (l.pad_id < 0 || l.pad_id > kMaxDim)
        throw LayerError("", "pad_id must be between 0 and " + std::to_string(kMaxDim) + ", got " +
                                 std::to_string(l.pad_id));
      info.out = {1};
      info.flops = 2 * n_in;
      break;
    case LayerKind::BatchMatMul: {
      const Shape& b = inputs[1];
      if (in.size() != 2 || b.size() != 2)
        throw LayerError(in.size() != 2 ? "a" : "b", "BatchMatMul multiplies a matrix per sample by a matrix per "
                                                     "sample: a is " + dims_text(in) + ", b is " + dims_text(b));
      const int64_t k = l.transpose_b ? b[1] : b[0], n = l.transpose_b ? b[0] : b[1];
      if (in[1] != k)
        throw LayerError("b", "BatchMatMul: a " + dims_text(in) + " has " + std::to_string(in[1]) + " columns but b " +
                                  dims_text(b) + (l.transpose_b ? " transposed" : "") + " has " + std::to_string(k) +
                                  " rows");
      info.out = {in[0], n};
      info.flops = 2 * static_cast<double>(in[0]) * static_cast<double>(n) * static_cast<double>(k);
      break;
    }
    case LayerKind::Softmax:
      if (l.causal && (in.size() != 2 || in[0] > in[1]))
        throw LayerError("in", "a causal Softmax needs [queries, keys] scores per sample with no more queries "
                               "than keys, got " + dims_text(in));
      info.out = in;
      info.flops = 4 * n_in;
      break;
    case LayerKind::Mul:
      if (inputs[0] != inputs[1])
        throw LayerError("b", "Mul needs two inputs of the same shape: a is " + dims_text(inputs[0]) + ", b is " +
                                  dims_text(inputs[1]));
      info.out = in;
      info.flops = n_in;
      break;
    case LayerKind::Scale:
      if (!std::isfinite(l.scale)) throw LayerError("", "scale must be a finite number");
      info.out = in;
      info.flops = n_in;
      break;
    case LayerKind::PositionalEncoding:
      need_sequence(l, in);
      need_positive("max_len", l.max_len);
      if (!(l.dropout >= 0 && l.dropout < 1)) throw LayerError("", "dropout must be at least 0 and below 1");
      if (in[0] > l.max_len)
        throw LayerError("in", "PositionalEncoding covers max_len=" + std::to_string(l.max_len) +
                                   " steps, but its input " + dims_text(in) + " has " + std::to_string(in[0]));
      if (in[1] % 2 != 0)
        throw LayerError("in", "PositionalEncoding pairs a sine and a cosine per frequency, so it needs an even "
                               "number of features, got " + dims_text(in));
      info.out = in;
      info.flops = n_in;
      break;
    case LayerKind::PositionEmbedding:
      need_sequence(l, in);
      info.out = in;
      info.params = n_in;
      info.flops = n_in;
      break;
    case LayerKind::ClassToken:
      need_sequence(l, in);
      info.out = {in[0] + 1, in[1]};
      info.params = static_cast<double>(in[1]);
      break;
    case LayerKind::Add:
      if (inputs[0] != inputs[1])
        throw LayerError("b", "Add needs two inputs of the same shape: a is " + dims_text(inputs[0]) + ", b is " +
                                  dims_text(inputs[1]));
      info.out = in;
      info.flops = n_in;
      break;
    case LayerKind::Concat: {
      const Shape& b = inputs[1];
      bool ok = in.size() == b.size();
      for (size_t i = 1; ok && i < in.size(); ++i) ok = in[i] == b[i];
      if (!ok)
        throw LayerError("b", "Concat joins along the channel axis and needs the other sizes equal: a is " +
                                  dims_text(in) + ", b is " + dims_text(b));
      info.out = in;
      info.out[0] += b[0];
      break;
    }
  }
  for (int64_t d : info.out)
    if (d < 1)
      throw LayerError("in", name(l) + " would make an output of " + dims_text(info.out) + " from " + dims_text(in) +
                                 ": every size must stay at least 1");
  if (numel(info.out) > kMaxValues || info.params > kMaxValues)
    throw LayerError("", name(l) + " makes an output of " + dims_text(info.out) + " per sample: too large");
  return info;
}

LayerNode::~LayerNode() {
  std::vector<LayerNodePtr> pending = std::move(inputs);
  while (!pending.empty()) {
    LayerNodePtr next = std::move(pending.back());
    pending.pop_back();
    // The last owner takes the inputs over before the node goes, so its destructor finds none to free.
    if (next.use_count() == 1) {
      auto& theirs = const_cast<LayerNode&>(*next).inputs;
      for (LayerNodePtr& in : theirs) pending.push_back(std::move(in));
      theirs.clear();
    }
  }
}

LayerNodePtr make_layer(LayerSpec spec, std::vector<LayerNodePtr> inputs) {
  std::vector<Shape> shapes;
  while (!inputs.empty() && !inputs.back()) inputs.pop_back();  // trailing open ports
  for (const LayerNodePtr& i : inputs) shapes.push_back(i ? i->info.out : Shape{});
  auto node = std::make_shared<LayerNode>();
  node->info = infer_layer(spec, shapes);
  spec.inputs.clear();
  node->spec = std::move(spec);
  node->inputs = std::move(inputs);
  return node;
}

NetworkSpec NetworkSpec::ending_at(const LayerNode& out) {
  // Iterative post-order walk: a hostile file may chain 100,000 layers, too deep for recursion.
  NetworkSpec net;
  std::unordered_map<const LayerNode*, int> index;
  std::vector<std::pair<const LayerNode*, size_t>> stack{{&out, 0}};
  std::unordered_set<const LayerNode*> open{&out};
  std::vector<std::string> inputs_found;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const LayerNode* in = node->inputs[next++].get();
      if (!in) continue;  // an open port
      // Layer values are immutable and built from their inputs, so they cannot form a cycle; the check keeps
      // a corrupt structure from looping.
      if (open.count(in)) throw Error("the layer graph has a cycle through " + in->spec.id);
      if (!index.count(in)) {
        stack.emplace_back(in, 0);
        open.insert(in);
      }
      continue;
    }
    LayerSpec spec = node->spec;
    spec.inputs.clear();
    for (const LayerNodePtr& in : node->inputs) spec.inputs.push_back(in ? index.at(in.get()) : -1);
    while (!spec.inputs.empty() && spec.inputs.back() < 0) spec.inputs.pop_back();
    if (spec.kind == LayerKind::Input) inputs_found.push_back(spec.id);
    index[node] = static_cast<int>(net.layers.size());
    net.layers.push_back(std::move(spec));
    open.erase(node);
    stack.pop_back();
  }
  if (inputs_found.empty())
    throw Error("the layers that end at " + out.spec.id + " do not reach an Input: wire an Input node first");
  if (inputs_found.size() > 1)
    throw Error("the network that ends at " + out.spec.id + " has " + std::to_string(inputs_found.size()) +
                " Inputs (" + inputs_found[0] + " and " + inputs_found[1] + "): a network takes exactly one");
  return net;
}

const LayerSpec& NetworkSpec::input() const {
  for (const LayerSpec& l : layers)
    if (l.kind == LayerKind::Input) return l;
  throw Error("the network has no Input layer");
}

std::vector<LayerInfo> NetworkSpec::infer() const {
  std::vector<LayerInfo> out;
  out.reserve(layers.size());
  for (const LayerSpec& l : layers) {
    std::vector<Shape> in;
    for (int i : l.inputs) in.push_back(i < 0 ? Shape{} : out.at(static_cast<size_t>(i)).out);
    try {
      out.push_back(infer_layer(l, in));
    } catch (const LayerError& e) {
      throw LayerError(e.port(), l.id + ": " + e.what());
    }
  }
  return out;
}

}  // namespace gn::nn
