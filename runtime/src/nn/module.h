// What the modules behind Model share (model.cpp's built-in layers, sequence_modules.cpp's): the Module
// interface and the Builder that hands out initialised parameters in construction order. Internal to the
// runtime.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/model.h"

namespace gn::nn {

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x, Mode mode) = 0;
  // Returns dx, undefined when !need_dx. Releases what forward kept.
  virtual Tensor backward(const Tensor& dy, bool need_dx) = 0;
  // A layer with more than one input port (MultiheadAttention's q, k, v; BatchMatMul; Mul) takes them all
  // here, in port order; the others take their only one through forward().
  virtual Tensor forward_inputs(const std::vector<Tensor>& xs, Mode mode) { return forward(xs.at(0), mode); }
  // The gradient of every input, each undefined where need[i] is false. Releases what forward kept.
  virtual std::vector<Tensor> backward_inputs(const Tensor& dy, const std::vector<bool>& need) {
    return {backward(dy, need.at(0))};
  }
  virtual void collect(const std::string& prefix, std::vector<Parameter*>& out) { (void)prefix, (void)out; }
  // The attention weights of the first sample of the last Eval-mode forward, [heads, Tq, Tk], under the
  // layer's id; layers without attention add nothing.
  virtual void collect_attention(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
    (void)prefix, (void)out;
  }
  // Whether backward produces parameter gradients: only then does what comes before need an input gradient.
  virtual bool has_params() const { return false; }
  virtual void clear() {}
  // Recurrent state across batches (d2l's sequential partition): with carry on, a recurrent layer starts each
  // Train-mode batch from the state the previous one ended in (detached), as long as the batch size stays
  // the same; reset_state() makes the next batch start from zeros again.
  virtual void carry_state(bool on) { (void)on; }
  virtual void reset_state() {}
  virtual Shape out_shape(const Shape& in) const = 0;
  virtual std::string describe() const = 0;
  // Appends one line per leaf layer.
  virtual void summarize(const std::string& prefix, Shape& shape, std::ostringstream& out) const {
    shape = out_shape(shape);
    out << (prefix.empty() ? "" : prefix + " ") << describe() << " -> " << shape_str(shape) << "\n";
  }
};

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The seed of a layer's dropout mask in the model's train_forwards-th Train-mode forward: the same run
// drops the same values, and a run resumed from a checkpoint (which restores the count) those the
// uninterrupted run would have.
inline uint64_t dropout_seed(uint64_t layer_seed, int64_t train_forwards) {
  return splitmix64(layer_seed ^ splitmix64(static_cast<uint64_t>(train_forwards)));
}

// Dropout: a fresh mask per training forward, from a Philox stream of the layer's seed and the model's count
// of training forwards, so that a run with the same seed drops the same values, and a run resumed from a
// checkpoint (which restores the count) drops what the uninterrupted run would have.
class DropoutM final : public Module {
 public:
  DropoutM(float p, uint64_t seed, const int64_t& train_forwards)
      : p_(p), seed_(seed), train_forwards_(train_forwards) {}
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Eval || p_ == 0) return x;
    DropoutResult r = dropout(x, p_, dropout_seed(seed_, train_forwards_));
    mask_ = r.mask;
    return r.y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    Tensor dx = need_dx ? (mask_.defined() ? dropout_backward(dy, mask_) : dy) : Tensor();
    clear();
    return dx;
  }
  void clear() override { mask_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override { return "Dropout(p=" + p_text() + ")"; }
  std::string p_text() const { return std::to_string(p_).substr(0, 4); }

 private:
  float p_;
  uint64_t seed_;
  const int64_t& train_forwards_;
  Tensor mask_;
};

// Hands out initialised tensors in construction order, each weight from its own Philox stream.
class Builder {
 public:
  Builder(Runtime& rt, Device device, const ModelOptions& o, const int64_t& train_forwards)
      : rt_(rt), device_(device), o_(o), train_forwards_(train_forwards) {}

  Tensor weight(const Shape& shape, int64_t fan_in, int64_t fan_out) {
    const uint64_t seed = next_seed();
    switch (o_.init) {
      case Init::Normal:
        return normal(rt_, shape, device_, seed, 0.0f, o_.init_std);
      case Init::Xavier: {
        const float a = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
        return uniform(rt_, shape, device_, seed, -a, a);
      }
      case Init::Kaiming:
        return normal(rt_, shape, device_, seed, 0.0f, std::sqrt(2.0f / static_cast<float>(fan_in)));
    }
    throw Error("unknown initialiser");
  }
  Tensor constant(const Shape& shape, float v) { return full(rt_, shape, device_, v); }
  // A weight with PyTorch's own default for its layer, whatever the model's init: U(-bound, bound) (the
  // recurrent layers' 1 / sqrt(hidden_size)) or N(0, std) (Embedding's N(0, 1)). Each draws the next stream.
  Tensor uniform_weight(const Shape& shape, float bound) {
    return uniform(rt_, shape, device_, next_seed(), -bound, bound);
  }
  Tensor normal_weight(const Shape& shape, float std) { return normal(rt_, shape, device_, next_seed(), 0.0f, std); }
  // How a built-in network passes its activations between layers: the device's blocked layout where it has
  // one (the CPU's nChw8c / nChw16c, NHWC on CUDA), which saves the reorders around every convolution.
  Layout activation_layout() const { return has_blocked_layout(device_) ? Layout::Blocked : Layout::Nchw; }
  // The device the parameters are made on.
  Device device() const { return device_; }
  // The model's count of Train-mode forwards (Model::batches_tracked()), which numbers dropout's masks.
  const int64_t& train_forwards() const { return train_forwards_; }

 private:
  uint64_t next_seed() { return splitmix64(o_.seed ^ splitmix64(static_cast<uint64_t>(counter_++))); }

  Runtime& rt_;
  Device device_;
  const ModelOptions& o_;
  const int64_t& train_forwards_;
  int counter_ = 0;
};

// Names parameter `p` prefix + leaf and lists it.
inline void push_param(std::vector<Parameter*>& out, const std::string& prefix, Parameter& p, const char* leaf) {
  p.name = prefix + leaf;
  out.push_back(&p);
}

// The module of one drawn sequence layer (Embedding, OneHot, RNN, GRU, LSTM, Reshape, Transpose, LastStep;
// sequence_modules.cpp); `in` is its input's shape per sample. Null for any other kind.
std::unique_ptr<Module> make_sequence_module(Builder& b, const LayerSpec& layer, const Shape& in, uint64_t seed);
// The same for the attention layers (LayerNorm, MultiheadAttention, BatchMatMul, Softmax, Mul, Scale, the
// positional layers, ClassToken, FirstStep; attention_modules.cpp).
std::unique_ptr<Module> make_attention_module(Builder& b, const LayerSpec& layer, const Shape& in, uint64_t seed);
// A drawn network's module (graph_module.cpp): its layers as a graph, with the built-in networks' layouts and
// fusions where it has their structure.
std::unique_ptr<Module> make_graph_module(Builder& b, const NetworkSpec& net, uint64_t seed);

}  // namespace gn::nn
