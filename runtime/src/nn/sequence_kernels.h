// What a device kind implements for sequence_layers.h: raw-pointer kernels called inside an engine op body
// on the device's worker, as kernels.h's NnKernels are.
#pragma once
#include <cstdint>

#include "gpunodes/nn/sequence_layers.h"
#include "kernels.h"

namespace gn::nn {

class SequenceKernels {
 public:
  virtual ~SequenceKernels() = default;

  // y [n, dim] = rows of w [vocab, dim] at the n ids. Checks every id before writing and throws Error for
  // the first that is not an integer in [0, vocab), naming it as sample i / steps, step i % steps. (A CUDA
  // graph capture cannot read the check back; it skips it.)
  virtual void embedding_forward(int64_t n, int64_t steps, int64_t dim, int64_t vocab, const float* ids,
                                 const float* w, float* y, KernelContext& kc) = 0;
  // dw [vocab, dim] (overwritten) = for each position i, dy row i added into row ids[i]. The ids were
  // checked by the forward.
  virtual void embedding_backward(int64_t n, int64_t dim, int64_t vocab, const float* ids, const float* dy,
                                  float* dw, KernelContext& kc) = 0;
  // y [n, classes] one-hot rows of the ids, checked as embedding_forward's.
  virtual void one_hot(int64_t n, int64_t steps, int64_t classes, const float* ids, float* y,
                       KernelContext& kc) = 0;
  // x seen as [outer, a, mid, b, inner] -> y [outer, b, mid, a, inner].
  virtual void swap_axes(int64_t outer, int64_t a, int64_t mid, int64_t b, int64_t inner, const float* x,
                         float* y, KernelContext& kc) = 0;
  // For each of `rows` rows: `count` floats from src + r * src_stride to dst + r * dst_stride.
  virtual void copy_strided(int64_t rows, int64_t count, const float* src, int64_t src_stride, float* dst,
                            int64_t dst_stride, KernelContext& kc) = 0;
  // y[0, n) = 0.
  virtual void zero(float* y, int64_t n, KernelContext& kc) = 0;
  // Per value e = pred - target: mse e^2, l1 |e|, huber 0.5 e^2 when |e| < delta else delta (|e| - delta/2).
  // loss = the mean; stats = {sum of the per-value losses, sum of e^2}; dpred (may be null) = the per-value
  // loss's derivative times grad_scale (l1's is sign(e), 0 at 0, as PyTorch's).
  virtual void regression_loss(RegressionLoss kind, int64_t n, const float* pred, const float* target,
                               float delta, float* loss, float* stats, float* dpred, float grad_scale,
                               KernelContext& kc) = 0;
};

SequenceKernels& cpu_sequence_kernels();
// Null when the CUDA backend was not built.
SequenceKernels* cuda_sequence_kernels();
// Throws Error when `device` has no kernels.
SequenceKernels& sequence_kernels(Device device);

}  // namespace gn::nn
