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
  int64_t k, r, s;     // filters [k, c, r, s]
  int64_t stride, pad;
  int64_t oh, ow;
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

  virtual void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                              const float* b, float* y, KernelContext& kc) = 0;
  // dx may be null (not wanted).
  virtual void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                               const float* dy, float* dx, float* dw, float* db, KernelContext& kc) = 0;

  virtual void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b, float* y,
                              KernelContext& kc) = 0;
  // dx may be null.
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
  virtual void activation_backward(Activation kind, const float* y, const float* dy, float* dx, int64_t n,
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
