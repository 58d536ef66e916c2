// What a device kind implements for attention_layers.h: raw-pointer kernels called inside an engine op body
// on the device's worker, as kernels.h's NnKernels are. Every matrix is row-major and contiguous.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace gn::nn {

class AttentionKernels {
 public:
  virtual ~AttentionKernels() = default;

  // For each i < batch: c_i = alpha * op(a_i) op(b_i), c_i [m, n] overwritten. op(a) is [m, k]: a_i is
  // stored [m, k], or [k, m] with trans_a; op(b) is [k, n]: b_i stored [k, n], or [n, k] with trans_b. The
  // batch's matrices follow one another (a_i = a + i * m * k, and so on). In kc.precision (CUDA: bf16 or
  // fp16 operands on tensor cores with fp32 accumulation; the CPU only ever sees fp32).
  virtual void bmm(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                   const float* a, const float* b, float* c, KernelContext& kc) = 0;

  // Softmax along each row of x [batch, rows, cols] into y, where batch = samples * heads. Masked entries get
  // exactly 0: with causal, column j > i + (cols - rows) of row i (the future, keys aligned to the end);
  // with valid_lens (null for none; one float per sample, sample = b / heads), the columns j with
  // !(j < length), compared as floats. A row whose every entry is masked is all zeros. Unmasked entries see max-subtracted exp.
  virtual void masked_softmax(int64_t batch, int64_t heads, int64_t rows, int64_t cols, bool causal,
                              const float* valid_lens, const float* x, float* y, KernelContext& kc) = 0;
  // dx = y * (dy - sum_j dy_j y_j) for each of `rows` rows of `cols` (masked entries, y = 0, get 0).
  virtual void softmax_backward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx,
                                KernelContext& kc) = 0;

  // PyTorch's LayerNorm over rows of `cols`: y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(biased
  // variance + eps); mean and rstd [rows] are saved for backward. gamma and beta are null without affine.
  virtual void layer_norm_forward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                                  const float* beta, float* y, float* mean, float* rstd, KernelContext& kc) = 0;
  // dx (null when not wanted) and, with affine (gamma not null), dgamma and dbeta [cols], overwritten.
  virtual void layer_norm_backward(int64_t rows, int64_t cols, const float* x, const float* dy,
                                   const float* gamma, const float* mean, const float* rstd, float* dx,
                                   float* dgamma, float* dbeta, KernelContext& kc) = 0;

  // x seen as [n, t, groups, heads, d]: out [n, heads, t, d] = x[:, :, group] with its axes t and heads
  // swapped. merge_heads is the inverse: it writes group `group` of y [n, t, groups, heads, d] from `in`
  // and leaves the other groups alone.
  virtual void split_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d,
                           const float* x, float* out, KernelContext& kc) = 0;
  virtual void merge_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d,
                           const float* in, float* y, KernelContext& kc) = 0;

  // y [n, len] = x [n, len] + table [len] on every row.
  virtual void add_broadcast(int64_t n, int64_t len, const float* x, const float* table, float* y,
                             KernelContext& kc) = 0;
  // y [len] = the sum over i < n of x + i * stride [len] (overwritten), accumulated in at least fp32.
  virtual void sum_rows(int64_t n, int64_t len, int64_t stride, const float* x, float* y, KernelContext& kc) = 0;
};

AttentionKernels& cpu_attention_kernels();
// Null when the CUDA backend was not built.
AttentionKernels* cuda_attention_kernels();
// Throws Error when `device` has no kernels.
AttentionKernels& attention_kernels(Device device);

}  // namespace gn::nn
