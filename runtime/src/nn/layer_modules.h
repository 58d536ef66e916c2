// The layer modules that the built-in architectures (model.cpp) and drawn networks (graph_module.cpp) are
// made of: Linear, Conv2d, BatchNorm2d (with the fused ReLU and shortcut add), the activations, pooling and
// Flatten. Internal to the runtime.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpunodes/nn/layers.h"
#include "module.h"

namespace gn::nn {

class LinearM final : public Module {
 public:
  // The values of a biased Linear(in, out): the weight and the bias.
  static double elements(double in, double out) { return out * in + out; }
  LinearM(Builder& b, int64_t in, int64_t out, bool bias = true) : in_(in), out_(out) {
    w_.value = b.weight({out, in}, in, out);
    if (bias) b_.value = b.constant({out}, 0.0f);
  }
  // A sequence [N, T, F] is viewed as N*T rows, so the layer acts on the last axis as PyTorch's does.
  Tensor forward(const Tensor& x, Mode mode) override {
    const Tensor rows = x.shape().size() == 3 ? x.reshaped({x.shape()[0] * x.shape()[1], x.shape()[2]}) : x;
    if (mode == Mode::Train) x_ = rows, x_shape_ = x.shape();
    const Tensor y = linear(rows, w_.value, b_.value);
    return x.shape().size() == 3 ? y.reshaped({x.shape()[0], x.shape()[1], out_}) : y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    const Tensor dy_rows = dy.shape().size() == 3 ? dy.reshaped({x_.shape()[0], out_}) : dy;
    LinearGrads g = linear_backward(x_, w_.value, dy_rows, need_dx, b_.value.defined());
    w_.grad = g.dw;
    b_.grad = g.db;
    x_ = Tensor();
    return g.dx.defined() ? g.dx.reshaped(x_shape_) : g.dx;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, w_, "weight");
    if (b_.value.defined()) push_param(out, prefix, b_, "bias");
  }
  bool has_params() const override { return true; }
  void clear() override { x_ = Tensor(); }
  Shape out_shape(const Shape& in) const override {
    Shape s = in.size() == 3 ? in : Shape{in[0], 0};
    s.back() = out_;
    return s;
  }
  std::string describe() const override {
    return "Linear(" + std::to_string(in_) + ", " + std::to_string(out_) +
           (b_.value.defined() ? "" : ", bias=False") + ")";
  }

 private:
  int64_t in_, out_;
  Parameter w_, b_;
  Tensor x_;  // the input as rows
  Shape x_shape_;
};

class Conv2dM final : public Module {
 public:
  // The values of a biased Conv2d(in, out, kernel, groups): the weight and the bias.
  static double elements(double in, double out, int64_t kernel, int64_t groups) {
    const double k = static_cast<double>(kernel);
    return out * (in / static_cast<double>(groups)) * k * k + out;
  }
  Conv2dM(Builder& b, int64_t in, int64_t out, int64_t kernel, const Conv2dOptions& opts, bool bias = true)
      : in_(in), out_(out), kernel_(kernel), opts_(opts) {
    // PyTorch's fans: the weight's dimension 1 (in / groups) and 0 (out), times the window.
    const int64_t groups = opts.groups;
    w_.value =
        b.weight({out, in / groups, kernel, kernel}, in / groups * kernel * kernel, out * kernel * kernel);
    if (bias) b_.value = b.constant({out}, 0.0f);
  }
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Train) x_ = x;
    return conv2d(x, w_.value, b_.value, opts_);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    Conv2dGrads g = conv2d_backward(x_, w_.value, dy, opts_, need_dx, b_.value.defined());
    w_.grad = g.dw;
    b_.grad = g.db;
    x_ = Tensor();
    return g.dx;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, w_, "weight");
    if (b_.value.defined()) push_param(out, prefix, b_, "bias");
  }
  bool has_params() const override { return true; }
  void clear() override { x_ = Tensor(); }
  Shape out_shape(const Shape& in) const override {
    return {in[0], out_, (in[2] + 2 * opts_.padding - kernel_) / opts_.stride + 1,
            (in[3] + 2 * opts_.padding - kernel_) / opts_.stride + 1};
  }
  std::string describe() const override {
    return "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
           ", kernel_size=" + std::to_string(kernel_) + ", stride=" + std::to_string(opts_.stride) +
           ", padding=" + std::to_string(opts_.padding) +
           (opts_.groups > 1 ? ", groups=" + std::to_string(opts_.groups) : "") +
           (b_.value.defined() ? "" : ", bias=False") + ")";
  }

 private:
  int64_t in_, out_, kernel_;
  Conv2dOptions opts_;
  Parameter w_, b_;
  Tensor x_;
};

// BatchNorm2d on [N, C, H, W], or BatchNorm1d on [N, C] (flat = true): the same statistics per channel. With
// relu, a ReLU fused after it (and after the residual add, when forward is given one).
class BatchNorm2dM final : public Module {
 public:
  // Weight, bias, running mean and running variance.
  static double elements(double channels) { return 4 * channels; }
  BatchNorm2dM(Builder& b, int64_t channels, float eps = 1e-5f, float momentum = 0.1f, bool flat = false,
               Layout layout = Layout::Nchw, bool relu = false)
      : c_(channels), flat_(flat) {
    options_.eps = eps;
    options_.momentum = momentum;
    options_.layout = layout;
    options_.relu = relu;
    gamma_.value = b.constant({channels}, 1.0f);
    beta_.value = b.constant({channels}, 0.0f);
    mean_.value = b.constant({channels}, 0.0f);
    var_.value = b.constant({channels}, 1.0f);
    mean_.trainable = var_.trainable = false;
  }
  Tensor forward(const Tensor& x, Mode mode) override { return forward(x, Tensor(), mode); }
  // relu(bn(x) + residual) (without relu: bn(x) + residual); residual may be undefined.
  Tensor forward(const Tensor& x, const Tensor& residual, Mode mode) {
    BatchNormOptions o = options_;
    o.training = mode == Mode::Train;
    BatchNormResult r = batchnorm2d(x, gamma_.value, beta_.value, mean_.value, var_.value, o, residual);
    if (o.training) {
      x_ = x;
      if (o.relu) y_ = r.y;
      save_mean_ = r.save_mean;
      save_invstd_ = r.save_invstd;
    }
    return r.y;
  }
  Tensor backward(const Tensor& dy, bool) override { return backward_with_residual(dy, false).dx; }
  // The gradients of x and, when need_dresidual, of forward's residual.
  BatchNormGrads backward_with_residual(const Tensor& dy, bool need_dresidual) {
    BatchNormGrads g =
        batchnorm2d_backward(x_, dy, gamma_.value, save_mean_, save_invstd_, options_, y_, need_dresidual);
    gamma_.grad = g.dgamma;
    beta_.grad = g.dbeta;
    clear();
    return g;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, gamma_, "weight");
    push_param(out, prefix, beta_, "bias");
    push_param(out, prefix, mean_, "running_mean");
    push_param(out, prefix, var_, "running_var");
  }
  bool has_params() const override { return true; }
  void clear() override { x_ = y_ = save_mean_ = save_invstd_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override {
    return std::string(flat_ ? "BatchNorm1d(" : "BatchNorm2d(") + std::to_string(c_) + ")";
  }

 private:
  int64_t c_;
  bool flat_;
  BatchNormOptions options_;
  Parameter gamma_, beta_, mean_, var_;
  Tensor x_, y_, save_mean_, save_invstd_;
};

class ActivationM final : public Module {
 public:
  explicit ActivationM(Activation kind) : kind_(kind) {}
  Tensor forward(const Tensor& x, Mode mode) override {
    Tensor y = activation(kind_, x);
    if (mode == Mode::Train) {
      // GELU's derivative needs its input; the others' follow from the output.
      (kind_ == Activation::Gelu ? x_ : y_) = kind_ == Activation::Gelu ? x : y;
    }
    return y;
  }
  Tensor backward(const Tensor& dy, bool) override {
    Tensor dx = activation_backward(kind_, x_, y_, dy);
    clear();
    return dx;
  }
  void clear() override { x_ = y_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override { return std::string(activation_name(kind_)) + "()"; }

 private:
  Activation kind_;
  Tensor x_, y_;
};

class PoolM final : public Module {
 public:
  explicit PoolM(Pool2dOptions o) : o_(o) {}
  Tensor forward(const Tensor& x, Mode mode) override {
    Tensor y = pool2d(x, o_);
    if (mode == Mode::Train) x_ = x, y_ = y;
    return y;
  }
  Tensor backward(const Tensor& dy, bool) override {
    Tensor dx = pool2d_backward(x_, y_, dy, o_);
    clear();
    return dx;
  }
  void clear() override { x_ = y_ = Tensor(); }
  Shape out_shape(const Shape& in) const override {
    return {in[0], in[1], (in[2] + 2 * o_.padding - o_.kernel) / o_.stride + 1,
            (in[3] + 2 * o_.padding - o_.kernel) / o_.stride + 1};
  }
  std::string describe() const override {
    return std::string(o_.kind == PoolKind::Max ? "MaxPool2d" : "AvgPool2d") +
           "(kernel_size=" + std::to_string(o_.kernel) + ", stride=" + std::to_string(o_.stride) + ")";
  }

 private:
  Pool2dOptions o_;
  Tensor x_, y_;
};

// Reads its input in `layout`; its output is NCHW (a blocked network's last edge).
class GlobalAvgPoolM final : public Module {
 public:
  explicit GlobalAvgPoolM(Layout layout = Layout::Nchw) : layout_(layout) {}
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Train) in_shape_ = x.shape();
    return global_avg_pool(x, layout_);
  }
  Tensor backward(const Tensor& dy, bool) override {
    return global_avg_pool_backward(dy, in_shape_, layout_);
  }
  Shape out_shape(const Shape& in) const override { return {in[0], in[1], 1, 1}; }
  std::string describe() const override { return "AdaptiveAvgPool2d((1, 1))"; }

 private:
  Layout layout_;
  Shape in_shape_;
};

class FlattenM final : public Module {
 public:
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Train) in_shape_ = x.shape();
    return flatten(x);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    return need_dx ? reshape(dy, in_shape_) : Tensor();
  }
  Shape out_shape(const Shape& in) const override {
    int64_t rest = 1;
    for (size_t i = 1; i < in.size(); ++i) rest *= in[i];
    return {in[0], rest};
  }
  std::string describe() const override { return "Flatten()"; }

 private:
  Shape in_shape_;
};

}  // namespace gn::nn
