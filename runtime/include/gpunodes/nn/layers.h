// Layers with forward and backward, as tensor ops. NCHW float32 (and bfloat16 activations, see Layout). Like every op, each call checks its inputs
// (same device, shapes), enqueues one engine op on the inputs' device and returns at once; the results live
// on that device. Backward functions return fresh gradient tensors. The CPU runs them with oneDNN and
// OpenBLAS, CUDA with cuDNN and cuBLAS (see runtime/src/nn/).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "gpunodes/ops.h"
#include "gpunodes/precision.h"
#include "gpunodes/tensor.h"

namespace gn::nn {

// --- linear: y = x W^T + b, with x [N, in], W [out, in] (PyTorch's layout), b [out] -------------------
// b may be undefined (bias=False); backward then takes need_db = false and leaves db undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
struct LinearGrads {
  Tensor dx;  // undefined unless asked for: the first layer's input needs none
  Tensor dw, db;
};
LinearGrads linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, bool need_dx = true,
                            bool need_db = true);

// --- layouts -------------------------------------------------------------------------------------------
// Where the values of a 4-d activation [N, C, H, W] lie in memory. Nchw is the layout of every tensor a
// caller sees. Blocked is the device's own, the layout its convolutions run fastest in: channels in blocks of
// layout_block(Layout::Blocked, device, C) lanes, [N, C / block, H, W, block].
//   - CPU: a constant block, the one oneDNN's convolutions prefer on this machine (nChw8c with AVX2,
//     nChw16c with AVX-512); C must be a multiple of it.
//   - CUDA: one block of all C channels, [N, 1, H, W, C], which is channels-last NHWC: cuDNN's tensor-core
//     convolution kernels read and write NHWC, and run NCHW through transposes around them. Any C works.
// A network that passes Blocked activations from layer to layer reorders only at its edges instead of
// around every convolution. The tensor's shape stays [N, C, H, W] either way. Where C is 1 (or H = W = 1)
// every layout is the same memory. Under Precision::Bf16 on a CPU, Blocked also stores the values in bfloat16
// (DType::BFloat16): the layers that write an activation or its gradient in it store bf16, and every layer
// that takes the layout reads it (a network's region from its first convolution to its global pooling).
enum class Layout { Nchw, Blocked };
// Whether `device` has a Blocked layout of its own (CPU and CUDA devices do).
bool has_blocked_layout(Device device);
// The channel block of a tensor of `channels` channels in `layout` on `device`: 1 for Nchw; for Blocked the
// CPU's constant block (ShapeError when `channels` is not a multiple of it) or, on CUDA, `channels` itself
// (NHWC). Throws Error for a device without a Blocked layout.
int64_t layout_block(Layout layout, Device device, int64_t channels);

// --- conv2d: x [N, C, H, W], w [K, C / groups, R, S], b [K] -> y [N, K, OH, OW] ------------------------
// b may be undefined (bias=False); backward then takes need_db = false and leaves db undefined. With groups
// g, C and K are multiples of g and output channel k sees input channels [k / (K/g) * C/g, +C/g) (PyTorch's
// grouped convolution; groups == C is a depthwise convolution).
struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
  // The layouts of x (and dx) and of y (and dy); see Layout.
  Layout input_layout = Layout::Nchw;
  Layout output_layout = Layout::Nchw;
};
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options = {});
struct Conv2dGrads {
  Tensor dx;  // undefined unless asked for
  Tensor dw, db;
};
Conv2dGrads conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                            const Conv2dOptions& options = {}, bool need_dx = true, bool need_db = true);

// --- batchnorm2d over (N, H, W) per channel; also BatchNorm1d: x [N, C] normalises over N per feature ---
// Training: normalises with the batch's mean and biased variance, and updates the running statistics in place
// as PyTorch does: running = (1 - momentum) * running + momentum * batch, with the unbiased variance. Eval:
// normalises with the running statistics.
struct BatchNormOptions {
  bool training = true;
  float momentum = 0.1f;
  float eps = 1e-5f;
  Layout layout = Layout::Nchw;  // of x, y and the residual ([N, C, H, W] only)
  // A ReLU fused after the normalisation (and after the residual add): one pass over the values instead of
  // two or three, as a residual block's bn1 + ReLU and bn2 + shortcut + ReLU need.
  bool relu = false;
};
struct BatchNormResult {
  Tensor y;
  Tensor save_mean, save_invstd;  // [C], training only: what backward needs
};
// y = bn(x), plus `residual` (x's shape) when it is defined, then ReLU when options.relu.
BatchNormResult batchnorm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var,
                            const BatchNormOptions& options = {}, const Tensor& residual = Tensor());
struct BatchNormGrads {
  Tensor dx, dgamma, dbeta;
  Tensor dresidual;  // the residual's gradient, when asked for
};
// The training-mode gradient (the batch statistics depend on x). `options` are the forward's (layout, relu
// and eps, which cuDNN takes again; the rest is not used). With options.relu, y is the forward's output,
// which masks dy; need_dresidual asks for the residual's gradient (dy, masked by the ReLU when there is one).
BatchNormGrads batchnorm2d_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                    const Tensor& save_mean, const Tensor& save_invstd,
                                    const BatchNormOptions& options = {}, const Tensor& y = Tensor(),
                                    bool need_dresidual = false);

// --- activations -----------------------------------------------------------------------------------------
// GELU is PyTorch's default, exact form: x * Phi(x) with the normal CDF (erf), not the tanh approximation.
enum class Activation { Relu, Sigmoid, Tanh, Gelu };
const char* activation_name(Activation kind);  // "ReLU", "Sigmoid", "Tanh", "GELU"
Tensor activation(Activation kind, const Tensor& x);
// relu' = [y > 0], sigmoid' = y (1 - y) and tanh' = 1 - y^2 follow from the output y; gelu' needs the input
// x. Pass both (x may be undefined for the first three, y for GELU).
Tensor activation_backward(Activation kind, const Tensor& x, const Tensor& y, const Tensor& dy);

// --- dropout (training only; in evaluation the layer is the identity) ------------------------------------
// Each value is kept with probability 1 - p and scaled by 1 / (1 - p), as PyTorch does, from a Philox stream
// of `seed`: the same seed gives the same mask on every device. 0 <= p < 1.
struct DropoutResult {
  Tensor y;
  Tensor mask;  // x's shape: 0 or 1 / (1 - p); what backward multiplies by
};
DropoutResult dropout(const Tensor& x, float p, uint64_t seed);
// dx = dy * mask
Tensor dropout_backward(const Tensor& dy, const Tensor& mask);

// --- concat along the channel axis (dim 1) ---------------------------------------------------------------
// a [N, Ca, ...] and b [N, Cb, ...] with the same N and trailing dimensions -> [N, Ca + Cb, ...].
Tensor concat_channels(const Tensor& a, const Tensor& b);
// The inverse, for backward: dy [N, Ca + Cb, ...] -> {[N, Ca, ...], [N, Cb, ...]}.
std::pair<Tensor, Tensor> split_channels(const Tensor& dy, int64_t a_channels);

// --- pooling ---------------------------------------------------------------------------------------------
enum class PoolKind { Max, Avg };
struct Pool2dOptions {
  PoolKind kind = PoolKind::Max;
  int64_t kernel = 2;
  int64_t stride = 2;
  int64_t padding = 0;  // average pooling counts padded cells (PyTorch's count_include_pad)
};
Tensor pool2d(const Tensor& x, const Pool2dOptions& options);
// Max pooling sends each gradient to the first maximum of its window.
Tensor pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Pool2dOptions& options);
// [N, C, H, W] -> [N, C, 1, 1]; x (and dx) in `layout`, the result NCHW: a network's blocked edge.
Tensor global_avg_pool(const Tensor& x, Layout layout = Layout::Nchw);
Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape, Layout layout = Layout::Nchw);

// --- the sum of two activations or their gradients -------------------------------------------------------
// a + b of the same shape, device and type: ops.h's add for float32, and for the bfloat16 activations of the
// CPU's blocked layout under Precision::Bf16 each sum rounded to bfloat16 (a residual add, a gradient read
// twice).
Tensor add_activations(const Tensor& a, const Tensor& b);

// --- shape and residual ------------------------------------------------------------------------------------
// [N, ...] -> [N, rest]. A copy: tensors have no views.
Tensor flatten(const Tensor& x);
Tensor reshape(const Tensor& x, const Shape& shape);  // same element count; a copy
// The residual add is gn::add; its backward hands dy to both branches.

// --- loss --------------------------------------------------------------------------------------------------
// Softmax cross-entropy of logits [N, classes] against labels [N] (class indices stored as floats), or of
// logits [N, T, classes] against labels [N, T], where every position is a row (a language model's loss);
// computed with the log-sum-exp shift so that large logits do not overflow. With label smoothing e (PyTorch's
// CrossEntropyLoss(label_smoothing=e)) the target is (1 - e) * onehot + e / classes: each sample's loss is
// (1 - e) * (-log p[label]) + e * mean over the classes of -log p[j], and its gradient softmax - target.
// A row labelled ignore_index (a class; -1: none) is padding, as in torch's CrossEntropyLoss(ignore_index):
// no loss, no gradient, not counted.
struct CrossEntropy {
  Tensor loss;     // [] mean over the counted rows (NaN when every row is ignored)
  Tensor stats;    // [2] {sum of the counted rows' losses, number of correct argmax predictions among them}
  Tensor dlogits;  // logits' shape: (softmax - target) * grad_scale, zeros in ignored rows; unless asked for,
                   // undefined
};
// grad_scale 0 means 1/(counted rows), the gradient of the mean. Data parallel replicas pass 1/(total batch)
// so that their gradients sum to the whole batch's (with padding: d2l's MaskedSoftmaxCELoss, where every
// position counts in the mean and a padded one as zero). 0 <= label_smoothing <= 1; accuracy ignores it.
CrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad = true,
                                   float grad_scale = 0, float label_smoothing = 0, int64_t ignore_index = -1);

// --- in-place helpers the trainer and loaders use ---------------------------------------------------------
// dst <- src, between any two devices (same shape). Ordered after everything that reads or writes dst.
void copy_into(const Tensor& dst, const Tensor& src);
// dst <- host values, asynchronously: the values are captured.
void write_values(const Tensor& dst, std::vector<float> values);

// --- precision of the products ----------------------------------------------------------------------------
// The precision (precision.h) in which linear and conv2d, forward and backward, enqueued on this thread
// while the scope lives compute their products: torch.autocast's role. fp32 outside any scope. The Trainer
// opens one with TrainOptions::precision around its steps and evaluations. Those ops throw at once
// (check_precision) when their device cannot compute in it.
class ScopedPrecision {
 public:
  explicit ScopedPrecision(Precision precision);
  ~ScopedPrecision();
  ScopedPrecision(const ScopedPrecision&) = delete;
  ScopedPrecision& operator=(const ScopedPrecision&) = delete;

 private:
  Precision previous_;
};
Precision current_precision();

}  // namespace gn::nn
