// What a device kind implements for the layers: raw-pointer kernels called inside an engine op body, on the
// device's worker (ctx.native_stream is where CUDA work goes). The ops in layers.cpp and optimizer_ops.cpp
// check shapes and devices and pick the kernels with nn_kernels(device).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "gpunodes/backend.h"
#include "gpunodes/engine.h"
#include "gpunodes/memory.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/optim.h"

namespace gn::nn {

struct ConvShape {
  int64_t n, c, h, w;  // input
  int64_t k, r, s;     // filters [k, c / groups, r, s]
  int64_t stride, pad;
  int64_t oh, ow;
  int64_t groups;
  bool bias;  // forward adds b, backward writes db; without, those pointers are null
  // The channel block of the input (x, dx) and of the output (y, dy): 1 for NCHW, otherwise the device's
  // blocked layout [N, C / block, H, W, block] (layers.h's Layout::Blocked, layout_block): on the CPU its
  // constant block; on CUDA block == channels (c for the input, k for the output), which is NHWC.
  int64_t in_block = 1, out_block = 1;
  // How x (and dx) and y (and dy) are stored: float32, or bfloat16 (only on the CPU, in its blocked layout under
  // Precision::Bf16: layers.h's Layout). The CUDA kernels take float32 only.
  DType in_type = DType::Float32, out_type = DType::Float32;
};

struct PoolShape {
  int64_t n, c, h, w;
  int64_t kernel, stride, pad;
  int64_t oh, ow;
  PoolKind kind;
};

struct BnShape {
  int64_t n, c, hw;
  // As ConvShape's: 1 for NCHW, otherwise [N, C / block, HW, block]; on CUDA block == c, which is NHWC.
  int64_t block = 1;
  // The epilogue fused into the layer: y = bn(x) + residual (when a residual is given), then ReLU.
  bool relu = false;
  // The layer's epsilon (BatchNormOptions::eps): the forward takes it as an argument too; cuDNN's backward
  // wants the same value again.
  float eps = 1e-5f;
  // How x, the residual, y and their gradients are stored (as ConvShape's types; the statistics and the
  // parameters are float32 always).
  DType type = DType::Float32;
};

// The scalars of one optimizer update, computed on the host in double and rounded once, so that every device
// gets the same floats and, with the same arithmetic, takes the same step.
struct OptimizerScalars {
  OptimizerKind kind = OptimizerKind::Sgd;
  float lr = 0;            // sgd
  float weight_decay = 0;  // sgd and adam: L2 added to the gradient; adamw: 0 (its decay is `decay`)
  float momentum = 0;      // sgd; 0: no buffer
  float keep = 1;          // sgd: 1 - dampening
  bool nesterov = false;   // sgd
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0, eps = 0;  // adam, adamw
  float step_size = 0;                                                            // lr / (1 - beta1^t)
  float bias2_sqrt = 1;                                                           // sqrt(1 - beta2^t)
  float decay = 1;  // adamw: 1 - lr * weight_decay; 1 otherwise
};

// OptimizerScalars as they lie in a tensor of this many floats (optim.h's optimizer_scalars): the optimizer
// kernels read them from the device's memory, so that a captured step replays with each step's rate.
constexpr int64_t kOptimizerScalarFloats = (sizeof(OptimizerScalars) + sizeof(float) - 1) / sizeof(float);

// One tensor of an optimizer update. a and b are the state (OptimizerState's), null where the optimizer
// keeps none; fresh: the state was made for this step and holds nothing yet (a momentum buffer becomes d,
// Adam's averages count as zero).
struct OptimizerTensor {
  int64_t n = 0;
  float* param = nullptr;
  const float* grad = nullptr;
  float* a = nullptr;
  float* b = nullptr;
  bool fresh = false;
};

struct GradSpan {
  const float* data;
  int64_t n;
};

// The order of grad_clip_coefficient's sum of squares, which both backends follow so that their sums agree
// to the bit: each gradient is cut into chunks of kNormChunk values; in a chunk, lane l (of kNormLanes) sums
// the squares of values l, l + kNormLanes, ... in order, in double (a float's square is exact in double, so
// fused multiply-adds change nothing); the lanes are then added pairwise as a tree (lane t += lane t + s for
// s = kNormLanes / 2, ..., 1); the chunks' sums are added in order, gradient after gradient.
constexpr int kNormLanes = 256;
constexpr int64_t kNormChunk = int64_t{kNormLanes} * 32;

// Everything a kernel call may need besides its pointers: the op's context, and the device's allocator for
// temporary workspace (cuDNN's, taken from the caching allocator).
struct KernelContext {
  OpContext& op;
  Allocator& allocator;
  // The products' precision (linear and convolution kernels): the op's ScopedPrecision, checked for the
  // device when the op was enqueued, so a CPU kernel sees fp32, or bf16 where oneDNN's ISA has it.
  Precision precision = Precision::Fp32;
};

class NnKernels {
 public:
  virtual ~NnKernels() = default;

  // b may be null (no bias).
  virtual void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                              const float* b, float* y, KernelContext& kc) = 0;
  // dx and db may be null (not wanted).
  virtual void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                               const float* dy, float* dx, float* dw, float* db, KernelContext& kc) = 0;

  // The activations (x, y, dy, dx) are stored as s.in_type and s.out_type say; weights, bias and their
  // gradients are float32.
  virtual void conv2d_forward(const ConvShape& s, const void* x, const float* w, const float* b, void* y,
                              KernelContext& kc) = 0;
  // dx may be null; db is null exactly when s.bias is false.
  virtual void conv2d_backward(const ConvShape& s, const void* x, const float* w, const void* dy, void* dx,
                               float* dw, float* db, KernelContext& kc) = 0;

  // training: batch statistics, updates running_mean/var, writes save_mean/save_invstd. Eval: running stats.
  // residual may be null; y = relu(bn(x) + residual) with s.relu, bn(x) + residual without. x, residual and y
  // are stored as s.type says.
  virtual void batchnorm_forward(const BnShape& s, const void* x, const float* gamma, const float* beta,
                                 float* running_mean, float* running_var, const void* residual, void* y,
                                 float* save_mean, float* save_invstd, bool training, float momentum,
                                 float eps, KernelContext& kc) = 0;
  // With s.relu, y is the forward's output and the gradient that reaches the normalisation is dy masked by
  // y > 0; that masked gradient is also the residual's, written to dresidual when it is not null. x, y, dy, dx
  // and dresidual are stored as s.type says.
  virtual void batchnorm_backward(const BnShape& s, const void* x, const void* y, const void* dy,
                                  const float* gamma, const float* save_mean, const float* save_invstd,
                                  void* dx, void* dresidual, float* dgamma, float* dbeta,
                                  KernelContext& kc) = 0;

  // Every array stored as `type` (bfloat16 only on the CPU, as ConvShape's types).
  virtual void activation_forward(Activation kind, DType type, const void* x, void* y, int64_t n,
                                  KernelContext& kc) = 0;
  // GELU reads x (y may be null); the others read y (x may be null).
  virtual void activation_backward(Activation kind, DType type, const void* x, const void* y, const void* dy,
                                   void* dx, int64_t n, KernelContext& kc) = 0;
  // y = a + b over n bfloat16 values, each sum rounded to bfloat16 (the CPU only: a network's activations or
  // their gradients meeting at a residual add).
  virtual void add_bf16(int64_t n, const void* a, const void* b, void* y, KernelContext& kc) = 0;

  // Element i is kept when philox::uniform_at(seed, i, 0, 1) <= 1 - p: mask = 1 / (1 - p) or 0, y = x * mask.
  virtual void dropout_forward(int64_t n, const float* x, float* y, float* mask, float p, uint64_t seed,
                               KernelContext& kc) = 0;

  // Per sample of n: y's row is a's a_row values followed by b's b_row values; split is the inverse.
  virtual void concat_rows(int64_t n, int64_t a_row, int64_t b_row, const float* a, const float* b, float* y,
                           KernelContext& kc) = 0;
  virtual void split_rows(int64_t n, int64_t a_row, int64_t b_row, const float* y, float* a, float* b,
                          KernelContext& kc) = 0;

  virtual void pool_forward(const PoolShape& s, const float* x, float* y, KernelContext& kc) = 0;
  virtual void pool_backward(const PoolShape& s, const float* x, const float* y, const float* dy, float* dx,
                             KernelContext& kc) = 0;

  // planes = N*C planes of hw values each; x and dx in the layout of `block` (as BnShape's: on CUDA 1 or
  // C, so N = planes / block there) and stored as `type`, y and dy [N*C] float32.
  virtual void global_avg_pool_forward(int64_t planes, int64_t hw, int64_t block, DType type, const void* x,
                                       float* y, KernelContext& kc) = 0;
  virtual void global_avg_pool_backward(int64_t planes, int64_t hw, int64_t block, DType type, const float* dy,
                                        void* dx, KernelContext& kc) = 0;

  // loss: the mean over the counted rows (NaN when none is); stats: {sum, correct} over them; dlogits may be
  // null, else (softmax - target) * grad_scale (0: 1 / counted rows) and zeros in an ignored row. The target is
  // (1 - smoothing) * onehot + smoothing / classes. A row whose label equals ignore_index (>= 0; -1: none) is
  // not counted, as torch's CrossEntropyLoss(ignore_index).
  virtual void softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const float* labels,
                                     float* loss, float* stats, float* dlogits, float grad_scale,
                                     float label_smoothing, int64_t ignore_index, KernelContext& kc) = 0;

  // One optimizer update of every tensor (optim.h's formulas) with the step's scalars, which lie in this
  // device's memory (their kind is `kind`). clip is null or grad_clip_coefficient's [2] output; gradients are
  // multiplied by clip[1] as they are read.
  virtual void optimizer_step(const std::vector<OptimizerTensor>& tensors, OptimizerKind kind,
                              const OptimizerScalars* scalars, const float* clip, KernelContext& kc) = 0;
  // out[0] = the 2-norm over all gradients, out[1] = min(1, max_norm / (out[0] + 1e-6)), in the fixed order
  // described at kNormLanes.
  virtual void grad_clip_coefficient(const std::vector<GradSpan>& grads, float max_norm, float* out,
                                     KernelContext& kc) = 0;
};

NnKernels& cpu_nn_kernels();
// The channel block of the CPU's blocked layout: the one oneDNN's convolutions prefer on this machine (8 with
// AVX2, 16 with AVX-512).
int64_t cpu_channel_block();
// Null when the CUDA backend was not built.
NnKernels* cuda_nn_kernels();
// Throws Error when `device` has no kernels.
NnKernels& nn_kernels(Device device);

}  // namespace gn::nn
