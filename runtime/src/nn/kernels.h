// What a device kind implements for the layers: raw-pointer kernels called inside an engine op body, on the
// device's worker (ctx.native_stream is where CUDA work goes). The ops in layers.cpp check shapes and devices
// and pick the kernels with nn_kernels(device).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "gpunodes/backend.h"
#include "gpunodes/engine.h"
#include "gpunodes/memory.h"
#include "gpunodes/nn/layers.h"

namespace gn::nn {

struct ConvShape {
  int64_t n, c, h, w;  // input
  int64_t k, r, s;     // filters [k, c / groups, r, s]
  int64_t stride, pad;
  int64_t oh, ow;
  int64_t groups;
  bool bias;  // forward adds b, backward writes db; without, those pointers are null
};

struct PoolShape {
  int64_t n, c, h, w;
  int64_t kernel, stride, pad;
  int64_t oh, ow;
  PoolKind kind;
};

struct BnShape {
  int64_t n, c, hw;
};

// Everything a kernel call may need besides its pointers: the op's context, and the device's allocator for
// temporary workspace (cuDNN's, taken from the caching allocator).
struct KernelContext {
  OpContext& op;
  Allocator& allocator;
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

  virtual void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b, float* y,
                              KernelContext& kc) = 0;
  // dx may be null; db is null exactly when s.bias is false.
  virtual void conv2d_backward(const ConvShape& s, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, KernelContext& kc) = 0;

  // training: batch statistics, updates running_mean/var, writes save_mean/save_invstd. Eval: running stats.
  virtual void batchnorm_forward(const BnShape& s, const float* x, const float* gamma, const float* beta,
                                 float* running_mean, float* running_var, float* y, float* save_mean,
                                 float* save_invstd, bool training, float momentum, float eps,
                                 KernelContext& kc) = 0;
  virtual void batchnorm_backward(const BnShape& s, const float* x, const float* dy, const float* gamma,
                                  const float* save_mean, const float* save_invstd, float* dx, float* dgamma,
                                  float* dbeta, KernelContext& kc) = 0;

  virtual void activation_forward(Activation kind, const float* x, float* y, int64_t n,
                                  KernelContext& kc) = 0;
  // GELU reads x (y may be null); the others read y (x may be null).
  virtual void activation_backward(Activation kind, const float* x, const float* y, const float* dy,
                                   float* dx, int64_t n, KernelContext& kc) = 0;

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

  // planes = N*C planes of hw values each.
  virtual void global_avg_pool_forward(int64_t planes, int64_t hw, const float* x, float* y,
                                       KernelContext& kc) = 0;
  virtual void global_avg_pool_backward(int64_t planes, int64_t hw, const float* dy, float* dx,
                                        KernelContext& kc) = 0;

  // loss: mean; stats: {sum, correct}; dlogits may be null.
  virtual void softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const float* labels,
                                     float* loss, float* stats, float* dlogits, float grad_scale,
                                     KernelContext& kc) = 0;

  // momentum_buf may be null when momentum == 0.
  virtual void sgd_step(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                        float momentum, float weight_decay, KernelContext& kc) = 0;
};

NnKernels& cpu_nn_kernels();
// Null when the CUDA backend was not built.
NnKernels* cuda_nn_kernels();
// Throws Error when `device` has no kernels.
NnKernels& nn_kernels(Device device);

}  // namespace gn::nn
