// CUDA attention kernels (attention_kernels.h): cuBLAS's strided batched products for bmm, in the op's
// precision as the linear layers' products (cuda_math.h); a few small kernels for the rest. Row kernels
// (masked softmax and its backward, layer norm) give one block to a row and loop over its columns, with
// block reductions in a fixed order; column sums (layer norm's parameter gradients, sum_rows) are
// deterministic, without atomics. Everything is enqueued on the op's stream (the device worker's), which the
// worker waits for when the op ends; nothing here waits for the stream itself, so the calls may also be
// captured into a CUDA graph. Every CUDA and cuBLAS return code is checked.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_math.h"
#include "../attention_kernels.h"
#include "cuda_kernel_support.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

// Grid-stride loop over [0, count).
#define GN_FOR_EACH(i, count)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Block-uniform loop of a row kernel's blocks over [0, count) rows: every thread of a block takes the same
// rows, so the block reductions' barriers inside are reached by all of them.
#define GN_FOR_EACH_ROW(r, count) \
  for (int64_t r = blockIdx.x; r < (count); r += gridDim.x)

constexpr int kWarp = 32;
constexpr int kMaxWarps = kThreads / kWarp;

// --- launch sizes of the row kernels ---------------------------------------------------------------------

// A row kernel's block: the warps a row of `cols` fills, at most kThreads (longer rows loop).
inline int row_threads(int64_t cols) {
  int t = kWarp;
  while (t < kThreads && t < cols) t *= 2;
  return t;
}

inline int row_blocks(int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

// --- block reductions ------------------------------------------------------------------------------------

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// The block's reduction of every thread's v, returned to every thread. blockDim.x is a multiple of 32 and at
// most kThreads. Warps reduce by shuffles; each thread then folds the warps' results in the same order, so
// every thread gets the same value and the result does not depend on timing. `shared` holds kMaxWarps
// floats; the first barrier keeps a previous reduction's readers from seeing it overwritten.
template <class Op>
__device__ float block_reduce(float v, Op op, float* shared) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < warps; ++w) r = op(r, shared[w]);
  return r;
}

// --- softmax ---------------------------------------------------------------------------------------------

// The unmasked columns of a row are a prefix [0, limit): causal keeps j <= i + (cols - rows), a valid
// length v keeps j < v. A non-positive or NaN valid length masks the whole row.
__device__ int64_t unmasked_columns(int64_t i, int64_t rows, int64_t cols, bool causal, const float* valid_len) {
  int64_t limit = cols;
  if (causal) {
    const int64_t last = i + (cols - rows);  // the last column row i sees
    if (last + 1 < limit) limit = last + 1;
  }
  if (valid_len) {
    const float v = *valid_len;
    if (!(v > 0.0f))
      limit = 0;
    else if (v < static_cast<float>(cols)) {
      const int64_t len = static_cast<int64_t>(ceilf(v));  // an integer j < v is j < ceil(v)
      if (len < limit) limit = len;
    }
  }
  return limit > 0 ? limit : 0;
}

// One block per row of x [batch, rows, cols]: the row's max and sum of exps over its unmasked prefix, then
// y. x and y may be the same array: a row's entries are all read before any is written.
__global__ void masked_softmax_kernel(int64_t batch, int64_t heads, int64_t rows, int64_t cols, bool causal,
                                      const float* __restrict__ valid_lens, const float* x, float* y) {
  __shared__ float shared[kMaxWarps];
  GN_FOR_EACH_ROW(r, batch * rows) {
    const int64_t b = r / rows, i = r % rows;
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const int64_t limit = unmasked_columns(i, rows, cols, causal, valid_lens ? valid_lens + b / heads : nullptr);
    if (limit == 0) {  // every entry masked: all zeros (block-uniform, so no barrier is skipped by some)
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = 0.0f;
      continue;
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_reduce(m, MaxOp{}, shared);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) sum += expf(xr[j] - m);
    sum = block_reduce(sum, SumOp{}, shared);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = j < limit ? expf(xr[j] - m) * inv : 0.0f;
  }
}

// dx = y * (dy - sum_j dy_j y_j), one block per row. dx may be dy: the dot is complete before any write.
__global__ void softmax_backward_kernel(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx) {
  __shared__ float shared[kMaxWarps];
  GN_FOR_EACH_ROW(r, rows) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += dyr[j] * yr[j];
    dot = block_reduce(dot, SumOp{}, shared);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dxr[j] = yr[j] * (dyr[j] - dot);
  }
}

// --- layer norm ------------------------------------------------------------------------------------------

// One block per row: the mean, then the biased variance around it (two passes, no cancellation), then y.
// y may be x.
__global__ void layer_norm_forward_kernel(int64_t rows, int64_t cols, float eps, const float* x,
                                          const float* __restrict__ gamma, const float* __restrict__ beta,
                                          float* y, float* __restrict__ mean, float* __restrict__ rstd) {
  __shared__ float shared[kMaxWarps];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  GN_FOR_EACH_ROW(r, rows) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += xr[j];
    const float mu = block_reduce(sum, SumOp{}, shared) * inv_cols;
    float sq = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float d = xr[j] - mu;
      sq += d * d;
    }
    const float var = block_reduce(sq, SumOp{}, shared) * inv_cols;
    const float rs = rsqrtf(var + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float xhat = (xr[j] - mu) * rs;
      yr[j] = gamma ? xhat * gamma[j] + (beta ? beta[j] : 0.0f) : xhat;
    }
    if (threadIdx.x == 0) {
      if (mean) mean[r] = mu;
      if (rstd) rstd[r] = rs;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma (dy without affine), one block per
// row. dx may be dy: both means are complete before any write.
__global__ void layer_norm_dx_kernel(int64_t rows, int64_t cols, const float* __restrict__ x, const float* dy,
                                     const float* __restrict__ gamma, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, float* dx) {
  __shared__ float shared[kMaxWarps];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  GN_FOR_EACH_ROW(r, rows) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
      sg += g;
      sgx += g * ((xr[j] - mu) * rs);
    }
    const float mean_g = block_reduce(sg, SumOp{}, shared) * inv_cols;
    const float mean_gx = block_reduce(sgx, SumOp{}, shared) * inv_cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
      const float xhat = (xr[j] - mu) * rs;
      dxr[j] = rs * (g - mean_g - xhat * mean_gx);
    }
  }
}

// Column sums in double over the rows, deterministic: a block of kSumCols x kSumSlices threads takes 32
// columns, its 8 thread rows every 8th row (coalesced along a row), then thread row 0 adds the 8 partial sums
// in a fixed order. Launched with column_sum_grid and column_sum_block.
constexpr int kSumCols = 32, kSumSlices = 8;

inline dim3 column_sum_block() {
  return dim3(kSumCols, kSumSlices);
}
inline dim3 column_sum_grid(int64_t cols) {
  return dim3(static_cast<unsigned>(to_int((cols + kSumCols - 1) / kSumCols, "columns")));
}

// dgamma [cols] = sum over rows of dy * xhat, dbeta [cols] = sum over rows of dy.
__global__ void layer_norm_param_grads_kernel(int64_t rows, int64_t cols, const float* __restrict__ x,
                                              const float* __restrict__ dy, const float* __restrict__ mean,
                                              const float* __restrict__ rstd, float* __restrict__ dgamma,
                                              float* __restrict__ dbeta) {
  __shared__ double pg[kSumSlices][kSumCols], pb[kSumSlices][kSumCols];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  double ag = 0, ab = 0;
  if (j < cols)
    for (int64_t i = threadIdx.y; i < rows; i += kSumSlices) {
      const float d = dy[i * cols + j];
      ag += static_cast<double>(d * ((x[i * cols + j] - mean[i]) * rstd[i]));
      ab += static_cast<double>(d);
    }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    double tg = 0, tb = 0;
    for (int s = 0; s < kSumSlices; ++s) {
      tg += pg[s][threadIdx.x];
      tb += pb[s][threadIdx.x];
    }
    if (dgamma) dgamma[j] = static_cast<float>(tg);
    if (dbeta) dbeta[j] = static_cast<float>(tb);
  }
}

// y [len] = sum over i < n of x [i * stride + j].
__global__ void sum_rows_kernel(int64_t n, int64_t len, int64_t stride, const float* __restrict__ x,
                                float* __restrict__ y) {
  __shared__ double partial[kSumSlices][kSumCols];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  double acc = 0;
  if (j < len)
    for (int64_t i = threadIdx.y; i < n; i += kSumSlices) acc += static_cast<double>(x[i * stride + j]);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < len) {
    double total = 0;
    for (int s = 0; s < kSumSlices; ++s) total += partial[s][threadIdx.x];
    y[j] = static_cast<float>(total);
  }
}

// --- heads and broadcasts --------------------------------------------------------------------------------

// The index in x [n, t, groups, heads, d] of element e of out [n, heads, t, d] for group `group`.
__device__ __forceinline__ int64_t head_source(int64_t e, int64_t t, int64_t groups, int64_t group,
                                               int64_t heads, int64_t d) {
  const int64_t dd = e % d;
  int64_t r = e / d;
  const int64_t ti = r % t;
  r /= t;
  const int64_t h = r % heads;
  const int64_t ni = r / heads;
  return (((ni * t + ti) * groups + group) * heads + h) * d + dd;
}

__global__ void split_heads_kernel(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d,
                                   const float* __restrict__ x, float* __restrict__ out) {
  GN_FOR_EACH(e, n * heads * t * d) out[e] = x[head_source(e, t, groups, group, heads, d)];
}

__global__ void merge_heads_kernel(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d,
                                   const float* __restrict__ in, float* __restrict__ y) {
  GN_FOR_EACH(e, n * heads * t * d) y[head_source(e, t, groups, group, heads, d)] = in[e];
}

// y may be x.
__global__ void add_broadcast_kernel(int64_t n, int64_t len, const float* x, const float* __restrict__ table,
                                     float* y) {
  GN_FOR_EACH(e, n * len) y[e] = x[e] + table[e % len];
}

// --- the kernels -----------------------------------------------------------------------------------------

class CudaAttentionKernels final : public AttentionKernels {
 public:
  void bmm(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
           const float* a, const float* b, float* c, KernelContext& kc) override {
    Stream s(kc);
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {  // an empty product: c = 0, not left to cuBLAS's handling of k = 0
      GN_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(batch * m * n) * sizeof(float), s.get()));
      return;
    }
    const int bi = to_int(batch, "batch"), mi = to_int(m, "matrix dimension"), ni = to_int(n, "matrix dimension"),
              ki = to_int(k, "matrix dimension");
    // Row-major C[m, n] is column-major C^T[n, m] = op(B)^T op(A)^T, and a row-major operand read
    // column-major is its transpose: so B goes first, each with its own transpose flag. The leading
    // dimensions are the row-major row strides: a stored [m, k] (k) or [k, m] (m), b [k, n] (n) or [n, k] (k).
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int lda = trans_a ? mi : ki, ldb = trans_b ? ki : ni, ldc = ni;
    const long long stride_a = static_cast<long long>(m) * k, stride_b = static_cast<long long>(k) * n,
                    stride_c = static_cast<long long>(m) * n;
    const float beta = 0.0f;
    if (kc.precision == Precision::Fp32) {
      GN_CUBLAS_CHECK(cublasSgemmStridedBatched(s.cublas(), op_b, op_a, ni, mi, ki, &alpha, b, ldb, stride_b, a,
                                                lda, stride_a, &beta, c, ldc, stride_c, bi));
      return;
    }
    // tf32, bf16, fp16: float32 in memory, rounded by cuBLAS for the tensor cores, float32 accumulation and
    // output, as the linear layers' and MatMul's products in that precision (cuda_math.h).
    GN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(s.cublas(), op_b, op_a, ni, mi, ki, &alpha, b, CUDA_R_32F, ldb,
                                               stride_b, a, CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F, ldc,
                                               stride_c, bi, cuda::cublas_compute_type(kc.precision),
                                               CUBLAS_GEMM_DEFAULT));
  }

  void masked_softmax(int64_t batch, int64_t heads, int64_t rows, int64_t cols, bool causal,
                      const float* valid_lens, const float* x, float* y, KernelContext& kc) override {
    Stream s(kc);
    if (valid_lens && heads < 1)
      throw ShapeError("masked softmax: " + std::to_string(heads) + " heads; valid lengths need at least one");
    const int64_t total = batch * rows;
    if (total == 0 || cols == 0) return;
    masked_softmax_kernel<<<row_blocks(total), row_threads(cols), 0, s.get()>>>(batch, heads, rows, cols, causal,
                                                                                valid_lens, x, y);
    GN_CUDA_CHECK_LAUNCH();
  }

  void softmax_backward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx,
                        KernelContext& kc) override {
    Stream s(kc);
    if (rows == 0 || cols == 0) return;
    softmax_backward_kernel<<<row_blocks(rows), row_threads(cols), 0, s.get()>>>(rows, cols, y, dy, dx);
    GN_CUDA_CHECK_LAUNCH();
  }

  void layer_norm_forward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                          const float* beta, float* y, float* mean, float* rstd, KernelContext& kc) override {
    Stream s(kc);
    if (rows == 0 || cols == 0) return;
    layer_norm_forward_kernel<<<row_blocks(rows), row_threads(cols), 0, s.get()>>>(rows, cols, eps, x, gamma,
                                                                                   beta, y, mean, rstd);
    GN_CUDA_CHECK_LAUNCH();
  }

  void layer_norm_backward(int64_t rows, int64_t cols, const float* x, const float* dy, const float* gamma,
                           const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta,
                           KernelContext& kc) override {
    Stream s(kc);
    if (cols == 0) return;
    // The parameter gradients first: they read dy, which dx may overwrite. With no rows they are zeros.
    if (gamma && (dgamma || dbeta)) {
      layer_norm_param_grads_kernel<<<column_sum_grid(cols), column_sum_block(), 0, s.get()>>>(
          rows, cols, x, dy, mean, rstd, dgamma, dbeta);
      GN_CUDA_CHECK_LAUNCH();
    }
    if (!dx || rows == 0) return;
    layer_norm_dx_kernel<<<row_blocks(rows), row_threads(cols), 0, s.get()>>>(rows, cols, x, dy, gamma, mean,
                                                                              rstd, dx);
    GN_CUDA_CHECK_LAUNCH();
  }

  void split_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d, const float* x,
                   float* out, KernelContext& kc) override {
    Stream s(kc);
    check_group("split_heads", groups, group);
    const int64_t total = n * heads * t * d;
    if (total == 0) return;
    split_heads_kernel<<<blocks_for(total), kThreads, 0, s.get()>>>(n, t, groups, group, heads, d, x, out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void merge_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d, const float* in,
                   float* y, KernelContext& kc) override {
    Stream s(kc);
    check_group("merge_heads", groups, group);
    const int64_t total = n * heads * t * d;
    if (total == 0) return;
    merge_heads_kernel<<<blocks_for(total), kThreads, 0, s.get()>>>(n, t, groups, group, heads, d, in, y);
    GN_CUDA_CHECK_LAUNCH();
  }

  void add_broadcast(int64_t n, int64_t len, const float* x, const float* table, float* y,
                     KernelContext& kc) override {
    Stream s(kc);
    if (n == 0 || len == 0) return;
    add_broadcast_kernel<<<blocks_for(n * len), kThreads, 0, s.get()>>>(n, len, x, table, y);
    GN_CUDA_CHECK_LAUNCH();
  }

  void sum_rows(int64_t n, int64_t len, int64_t stride, const float* x, float* y, KernelContext& kc) override {
    Stream s(kc);
    if (len == 0) return;
    // With n = 0 the kernel writes zeros.
    sum_rows_kernel<<<column_sum_grid(len), column_sum_block(), 0, s.get()>>>(n, len, stride, x, y);
    GN_CUDA_CHECK_LAUNCH();
  }

 private:
  static void check_group(const char* op, int64_t groups, int64_t group) {
    if (group < 0 || group >= groups)
      throw ShapeError(std::string(op) + ": group " + std::to_string(group) + " is not in [0, " +
                       std::to_string(groups) + ")");
  }
};

}  // namespace

AttentionKernels* cuda_attention_kernels() {
  static CudaAttentionKernels kernels;
  return &kernels;
}

}  // namespace gn::nn
