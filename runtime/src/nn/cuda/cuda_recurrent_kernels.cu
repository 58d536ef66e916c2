// CUDA recurrent kernels: cuBLAS for the products (cublasGemmEx in the op's precision, cuda_math.h), a few
// element-wise kernels for the gate passes, the layout swaps and dropout, and a deterministic column sum for
// the bias gradients. Everything is enqueued on the op's stream (the device worker's), which the worker waits
// for when the op ends; nothing here waits for the stream itself (cuda_kernel_support.h's Stream does only
// outside a worker), so the calls may also be captured into a CUDA graph. Every CUDA and cuBLAS return code
// is checked.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_math.h"
#include "../recurrent_kernels.h"
#include "cuda_kernel_support.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"

namespace gn::nn {
namespace {

// Grid-stride loop over [0, count).
#define GN_FOR_EACH(i, count)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__device__ __forceinline__ float sigmoid(float v) {
  return 1.0f / (1.0f + expf(-v));
}

// --- layout, copies, sums --------------------------------------------------------------------------------

__global__ void scale_rows_kernel(int64_t m, int64_t n, float beta, float* __restrict__ c, int64_t ldc) {
  GN_FOR_EACH(e, m * n) {
    float& v = c[(e / n) * ldc + e % n];
    v = beta == 0.0f ? 0.0f : beta * v;
  }
}

// src [a, b, row] -> dst [b, a, row]; consecutive threads read and write consecutive floats of a row.
__global__ void swap_leading_kernel(int64_t a, int64_t b, int64_t row, const float* __restrict__ src,
                                    float* __restrict__ dst) {
  GN_FOR_EACH(e, a * b * row) {
    const int64_t r = e % row, ij = e / row, i = ij / b, j = ij % b;
    dst[(j * a + i) * row + r] = src[e];
  }
}

// Column sums of a packed [rows, cols] matrix in double: a block sums 32 columns, its 8 thread rows taking
// every 8th row, then adds the 8 partial sums in a fixed order. Deterministic, and coalesced along the rows.
constexpr int kSumCols = 32, kSumSlices = 8;
__global__ void column_sums_kernel(int64_t rows, int64_t cols, const float* __restrict__ x,
                                   float* __restrict__ out) {
  __shared__ double partial[kSumSlices][kSumCols];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  double acc = 0;
  if (j < cols)
    for (int64_t i = threadIdx.y; i < rows; i += kSumSlices) acc += x[i * cols + j];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    double total = 0;
    for (int s = 0; s < kSumSlices; ++s) total += partial[s][threadIdx.x];
    out[j] = static_cast<float>(total);
  }
}

__global__ void multiply_kernel(int64_t count, const float* a, const float* __restrict__ b, float* out) {
  GN_FOR_EACH(i, count) out[i] = __fmul_rn(a[i], b[i]);
}

// The same Philox draw and float comparison as the CPU's loop (and layers.h's dropout), at the element's
// batch-first index.
__global__ void dropout_time_major_kernel(int64_t steps, int64_t n, int64_t width,
                                          const float* __restrict__ x, float* __restrict__ y,
                                          float* __restrict__ mask, float keep, float scale, uint64_t seed,
                                          uint64_t first_index) {
  GN_FOR_EACH(e, steps * n * width) {
    const int64_t j = e % width, ti = e / width, i = ti % n, t = ti / n;
    const uint64_t index = first_index + static_cast<uint64_t>((i * steps + t) * width + j);
    const float m = philox::uniform_at(seed, index, 0.0f, 1.0f) <= keep ? scale : 0.0f;
    mask[e] = m;
    y[e] = __fmul_rn(x[e], m);
  }
}

// --- gate passes: one thread per (row, unit), the math of cpu_recurrent_kernels.cpp's row functions -------

__device__ __forceinline__ float bias_at(const float* b, int64_t k) {
  return b ? b[k] : 0.0f;
}

__global__ void rnn_forward_kernel(bool relu, int64_t n, int64_t h, const float* __restrict__ gates,
                                   const float* __restrict__ gh, const float* __restrict__ b_ih,
                                   const float* __restrict__ b_hh, float* __restrict__ h_out,
                                   int64_t ld_out) {
  GN_FOR_EACH(e, n * h) {
    const int64_t i = e / h, j = e % h;
    const float pre = gates[e] + (gh ? gh[e] : 0.0f) + (bias_at(b_ih, j) + bias_at(b_hh, j));
    h_out[i * ld_out + j] = relu ? fmaxf(pre, 0.0f) : tanhf(pre);
  }
}

__global__ void rnn_backward_kernel(bool relu, int64_t n, int64_t h, const float* __restrict__ dy,
                                    int64_t ld_dy, const float* __restrict__ dh,
                                    const float* __restrict__ h_t, int64_t ld_h, float* __restrict__ dgates) {
  GN_FOR_EACH(e, n * h) {
    const int64_t i = e / h, j = e % h;
    const float d = dy[i * ld_dy + j] + dh[e];
    const float y = h_t[i * ld_h + j];
    dgates[e] = relu ? (y > 0.0f ? d : 0.0f) : d * (1.0f - y * y);
  }
}

__global__ void gru_forward_kernel(int64_t n, int64_t h, float* __restrict__ gates,
                                   const float* __restrict__ gh, const float* __restrict__ b_ih,
                                   const float* __restrict__ b_hh, const float* __restrict__ h_prev,
                                   int64_t ld_prev, float* __restrict__ hn, float* __restrict__ h_out,
                                   int64_t ld_out) {
  GN_FOR_EACH(e, n * h) {
    const int64_t i = e / h, j = e % h;
    float* g = gates + i * 3 * h;
    const float* rec = gh ? gh + i * 3 * h : nullptr;
    const float x_r = g[j] + bias_at(b_ih, j), x_z = g[h + j] + bias_at(b_ih, h + j),
                x_n = g[2 * h + j] + bias_at(b_ih, 2 * h + j);
    const float h_r = (rec ? rec[j] : 0.0f) + bias_at(b_hh, j),
                h_z = (rec ? rec[h + j] : 0.0f) + bias_at(b_hh, h + j),
                h_n = (rec ? rec[2 * h + j] : 0.0f) + bias_at(b_hh, 2 * h + j);
    const float r = sigmoid(x_r + h_r), z = sigmoid(x_z + h_z);
    const float nn = tanhf(x_n + r * h_n);
    const float prev = h_prev ? h_prev[i * ld_prev + j] : 0.0f;
    g[j] = r;
    g[h + j] = z;
    g[2 * h + j] = nn;
    if (hn) hn[e] = h_n;
    h_out[i * ld_out + j] = (1.0f - z) * nn + z * prev;
  }
}

__global__ void gru_backward_kernel(int64_t n, int64_t h, const float* __restrict__ dy, int64_t ld_dy,
                                    float* __restrict__ dh, const float* __restrict__ gates,
                                    const float* __restrict__ hn, const float* __restrict__ h_prev,
                                    int64_t ld_prev, float* __restrict__ dgates,
                                    float* __restrict__ dgates_hh) {
  GN_FOR_EACH(e, n * h) {
    const int64_t i = e / h, j = e % h;
    const float* g = gates + i * 3 * h;
    const float r = g[j], z = g[h + j], nn = g[2 * h + j];
    const float d = dy[i * ld_dy + j] + dh[e];
    const float prev = h_prev ? h_prev[i * ld_prev + j] : 0.0f;
    const float dn_pre = d * (1.0f - z) * (1.0f - nn * nn);
    const float dz_pre = d * (prev - nn) * z * (1.0f - z);
    const float dr_pre = dn_pre * hn[e] * r * (1.0f - r);
    float* dg = dgates + i * 3 * h;
    float* dg_hh = dgates_hh + i * 3 * h;
    dg[j] = dr_pre;
    dg_hh[j] = dr_pre;
    dg[h + j] = dz_pre;
    dg_hh[h + j] = dz_pre;
    dg[2 * h + j] = dn_pre;
    dg_hh[2 * h + j] = dn_pre * r;
    dh[e] = d * z;
  }
}

__global__ void lstm_forward_kernel(int64_t n, int64_t h, float* __restrict__ gates,
                                    const float* __restrict__ gh, const float* __restrict__ b_ih,
                                    const float* __restrict__ b_hh, const float* __restrict__ c_prev,
                                    float* __restrict__ c_out, float* __restrict__ h_out, int64_t ld_out) {
  GN_FOR_EACH(e, n * h) {
    const int64_t i = e / h, j = e % h;
    float* g = gates + i * 4 * h;
    const float* rec = gh ? gh + i * 4 * h : nullptr;
    float pre[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      pre[q] = g[q * h + j] + (rec ? rec[q * h + j] : 0.0f) +
               (bias_at(b_ih, q * h + j) + bias_at(b_hh, q * h + j));
    const float in = sigmoid(pre[0]), forget = sigmoid(pre[1]), cand = tanhf(pre[2]), outg = sigmoid(pre[3]);
    const float cell = forget * (c_prev ? c_prev[e] : 0.0f) + in * cand;
    g[j] = in;
    g[h + j] = forget;
    g[2 * h + j] = cand;
    g[3 * h + j] = outg;
    c_out[e] = cell;
    h_out[i * ld_out + j] = outg * tanhf(cell);
  }
}

__global__ void lstm_backward_kernel(int64_t n, int64_t h, const float* __restrict__ dy, int64_t ld_dy,
                                     const float* __restrict__ dh, float* __restrict__ dc,
                                     const float* __restrict__ gates, const float* __restrict__ c_t,
                                     const float* __restrict__ c_prev, float* __restrict__ dgates) {
  GN_FOR_EACH(e, n * h) {
    const int64_t i = e / h, j = e % h;
    const float* g = gates + i * 4 * h;
    const float in = g[j], forget = g[h + j], cand = g[2 * h + j], outg = g[3 * h + j];
    const float d = dy[i * ld_dy + j] + dh[e];
    const float tc = tanhf(c_t[e]);
    const float dcell = dc[e] + d * outg * (1.0f - tc * tc);
    float* dg = dgates + i * 4 * h;
    dg[j] = dcell * cand * in * (1.0f - in);
    dg[h + j] = dcell * (c_prev ? c_prev[e] : 0.0f) * forget * (1.0f - forget);
    dg[2 * h + j] = dcell * in * (1.0f - cand * cand);
    dg[3 * h + j] = d * tc * outg * (1.0f - outg);
    dc[e] = dcell * forget;
  }
}

// --- the kernels -------------------------------------------------------------------------------------------

class CudaRecurrentKernels final : public RecurrentKernels {
 public:
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
            KernelContext& kc) override {
    Stream s(kc);
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta * C, not left to cuBLAS's handling of an empty product
      scale_rows_kernel<<<blocks_for(m * n), kThreads, 0, s.get()>>>(m, n, beta, c, ldc);
      GN_CUDA_CHECK_LAUNCH();
      return;
    }
    // Row-major C[m, n] is column-major C^T[n, m] = op(B)^T op(A)^T, and a row-major operand read
    // column-major is its transpose: so B goes first, each with its own transpose flag.
    cuda::gemm_f32(s.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                   to_int(n, "matrix dimension"), to_int(m, "matrix dimension"),
                   to_int(k, "matrix dimension"), alpha, b, to_int(ldb, "row stride"), a,
                   to_int(lda, "row stride"), beta, c, to_int(ldc, "row stride"), kc.precision);
  }

  void swap_leading_axes(int64_t a, int64_t b, int64_t row, const float* src, float* dst,
                         KernelContext& kc) override {
    Stream s(kc);
    if (a * b * row == 0) return;
    swap_leading_kernel<<<blocks_for(a * b * row), kThreads, 0, s.get()>>>(a, b, row, src, dst);
    GN_CUDA_CHECK_LAUNCH();
  }

  void copy_rows(int64_t rows, int64_t cols, const float* src, int64_t ld_src, float* dst, int64_t ld_dst,
                 KernelContext& kc) override {
    Stream s(kc);
    if (rows == 0 || cols == 0) return;
    const size_t f = sizeof(float);
    GN_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(ld_dst) * f, src,
                                    static_cast<size_t>(ld_src) * f, static_cast<size_t>(cols) * f,
                                    static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, s.get()));
  }

  void fill_zero(float* dst, int64_t count, KernelContext& kc) override {
    Stream s(kc);
    if (count == 0) return;
    GN_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(count) * sizeof(float), s.get()));
  }

  void column_sums(int64_t rows, int64_t cols, const float* x, float* out, KernelContext& kc) override {
    Stream s(kc);
    if (cols == 0) return;
    const int64_t blocks = (cols + kSumCols - 1) / kSumCols;
    if (blocks > INT_MAX)
      throw ShapeError("a recurrent layer's bias of " + std::to_string(cols) + " is too long");
    column_sums_kernel<<<static_cast<unsigned>(blocks), dim3(kSumCols, kSumSlices), 0, s.get()>>>(rows, cols,
                                                                                                  x, out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void multiply(int64_t count, const float* a, const float* b, float* out, KernelContext& kc) override {
    Stream s(kc);
    if (count == 0) return;
    multiply_kernel<<<blocks_for(count), kThreads, 0, s.get()>>>(count, a, b, out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void dropout_time_major(int64_t steps, int64_t n, int64_t width, const float* x, float* y, float* mask,
                          float p, uint64_t seed, uint64_t first_index, KernelContext& kc) override {
    Stream s(kc);
    const int64_t count = steps * n * width;
    if (count == 0) return;
    // keep and scale rounded on the host, as the CPU computes them.
    const float keep = 1.0f - p, scale = 1.0f / keep;
    dropout_time_major_kernel<<<blocks_for(count), kThreads, 0, s.get()>>>(steps, n, width, x, y, mask, keep,
                                                                           scale, seed, first_index);
    GN_CUDA_CHECK_LAUNCH();
  }

  void rnn_step_forward(bool relu, int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                        const float* b_hh, float* h_out, int64_t ld_out, KernelContext& kc) override {
    Stream s(kc);
    if (n * h == 0) return;
    rnn_forward_kernel<<<blocks_for(n * h), kThreads, 0, s.get()>>>(relu, n, h, gates, gh, b_ih, b_hh, h_out,
                                                                    ld_out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void rnn_step_backward(bool relu, int64_t n, int64_t h, const float* dy, int64_t ld_dy, const float* dh,
                         const float* h_t, int64_t ld_h, float* dgates, KernelContext& kc) override {
    Stream s(kc);
    if (n * h == 0) return;
    rnn_backward_kernel<<<blocks_for(n * h), kThreads, 0, s.get()>>>(relu, n, h, dy, ld_dy, dh, h_t, ld_h,
                                                                     dgates);
    GN_CUDA_CHECK_LAUNCH();
  }

  void gru_step_forward(int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                        const float* b_hh, const float* h_prev, int64_t ld_prev, float* hn, float* h_out,
                        int64_t ld_out, KernelContext& kc) override {
    Stream s(kc);
    if (n * h == 0) return;
    gru_forward_kernel<<<blocks_for(n * h), kThreads, 0, s.get()>>>(n, h, gates, gh, b_ih, b_hh, h_prev,
                                                                    ld_prev, hn, h_out, ld_out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void gru_step_backward(int64_t n, int64_t h, const float* dy, int64_t ld_dy, float* dh, const float* gates,
                         const float* hn, const float* h_prev, int64_t ld_prev, float* dgates,
                         float* dgates_hh, KernelContext& kc) override {
    Stream s(kc);
    if (n * h == 0) return;
    gru_backward_kernel<<<blocks_for(n * h), kThreads, 0, s.get()>>>(n, h, dy, ld_dy, dh, gates, hn, h_prev,
                                                                     ld_prev, dgates, dgates_hh);
    GN_CUDA_CHECK_LAUNCH();
  }

  void lstm_step_forward(int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                         const float* b_hh, const float* c_prev, float* c_out, float* h_out, int64_t ld_out,
                         KernelContext& kc) override {
    Stream s(kc);
    if (n * h == 0) return;
    lstm_forward_kernel<<<blocks_for(n * h), kThreads, 0, s.get()>>>(n, h, gates, gh, b_ih, b_hh, c_prev,
                                                                     c_out, h_out, ld_out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void lstm_step_backward(int64_t n, int64_t h, const float* dy, int64_t ld_dy, const float* dh, float* dc,
                          const float* gates, const float* c_t, const float* c_prev, float* dgates,
                          KernelContext& kc) override {
    Stream s(kc);
    if (n * h == 0) return;
    lstm_backward_kernel<<<blocks_for(n * h), kThreads, 0, s.get()>>>(n, h, dy, ld_dy, dh, dc, gates, c_t,
                                                                      c_prev, dgates);
    GN_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

RecurrentKernels* cuda_recurrent_kernels() {
  static CudaRecurrentKernels kernels;
  return &kernels;
}

}  // namespace gn::nn
