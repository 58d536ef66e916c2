// CPU recurrent kernels: products with OpenBLAS (its OpenMP build follows the worker's thread count), the
// gate passes as OpenMP loops over the batch rows, vectorised along the hidden units. A step's gate pass is
// small (N * H units, a few exponentials each) but runs T times per layer and direction, so it goes parallel
// from a few thousand units, far below the memory-bound loops' threshold.
//
// The gate passes' exponentials and tanh are polynomials (Cephes' expf and tanhf, within 3 ulp of the exact
// values) instead of libm's calls, which do not vectorise: with libm's, the gate passes took a third of a
// GRU's training step (N = 32, T = 35, H = 256) on one core. This file is compiled with -fno-trapping-math
// (runtime/CMakeLists.txt): otherwise GCC keeps the clamps' comparisons as branches and vectorises nothing.
// The passes' row functions and the bias sums are compiled twice, for baseline x86-64 (SSE2, what the build
// targets) and for x86-64-v3 (AVX2, FMA), and the loader picks the one the CPU runs: AVX2 ran a GRU step's
// forward pass (N = 32, H = 256) three times as fast as SSE2 on this machine's EPYC (60 against 190 us, both
// cores busy). Null operands (a zero state, no bias) read from a buffer of zeros, so that the loops have no
// branches.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_vector_math.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"
#include "recurrent_kernels.h"

namespace gn::nn {
namespace {

// Memory-bound loops (copies, sums) pay for a parallel region from about this many floats.
constexpr int64_t kParallelCopy = 1 << 17;
// Gate passes: units (rows * hidden) from which both cores beat one.
constexpr int64_t kParallelGates = 2048;

int blas_int(int64_t v) {
  if (v > INT_MAX)
    throw ShapeError("a recurrent layer's matrix dimension " + std::to_string(v) +
                     " exceeds 2^31-1, which OpenBLAS takes");
  return static_cast<int>(v);
}

// At least `count` zeros, in a buffer of the calling thread's that grows as needed: they stand in for null
// operands. A call may move the buffer, so a kernel takes one pointer for all of its operands.
const float* zeros(int64_t count) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < count) buffer.assign(static_cast<size_t>(count), 0.0f);
  return buffer.data();
}

// At least `count` floats to write and never read, in a buffer of the calling thread's: where a kernel's
// loop stores a value nobody wants, so that it needs no branch.
float* discarded(int64_t count) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

// exp_poly (cpu_vector_math.h) saturates at 1.7e38 and 1.6e-38, which is exact enough for the gates.
inline float sigmoid(float v) {
  return 1.0f / (1.0f + exp_poly(-v));
}

// tanh within 3 ulp: Cephes' odd polynomial below |x| = 0.625, 1 - 2 / (e^2|x| + 1) with x's sign above.
inline float tanh_poly(float x) {
  const float a = std::fabs(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = std::copysign(1.0f - 2.0f / (exp_poly(2.0f * a) + 1.0f), x);
  return a < 0.625f ? small : large;
}

// --- one row (sample) of each gate pass; the kernels below run them over the batch ----------------------

GN_VECTOR_CLONES void rnn_forward_row(bool relu, int64_t h, const float* __restrict g,
                                      const float* __restrict r, const float* __restrict bi,
                                      const float* __restrict bh, float* __restrict out) {
  if (relu) {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) out[j] = std::max(g[j] + r[j] + (bi[j] + bh[j]), 0.0f);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) out[j] = tanh_poly(g[j] + r[j] + (bi[j] + bh[j]));
  }
}

GN_VECTOR_CLONES void rnn_backward_row(bool relu, int64_t h, const float* __restrict d_out,
                                       const float* __restrict d_rec, const float* __restrict y,
                                       float* __restrict dg) {
  if (relu) {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) {
      const float d = d_out[j] + d_rec[j];  // read unconditionally, so that the select vectorises
      dg[j] = y[j] > 0.0f ? d : 0.0f;
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) dg[j] = (d_out[j] + d_rec[j]) * (1.0f - y[j] * y[j]);
  }
}

GN_VECTOR_CLONES void gru_forward_row(int64_t h, float* __restrict g, const float* __restrict r3,
                                      const float* __restrict bi, const float* __restrict bh,
                                      const float* __restrict prev, float* __restrict hn,
                                      float* __restrict out) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float h_n = r3[2 * h + j] + bh[2 * h + j];
    const float r = sigmoid(g[j] + bi[j] + (r3[j] + bh[j]));
    const float z = sigmoid(g[h + j] + bi[h + j] + (r3[h + j] + bh[h + j]));
    const float nn = tanh_poly(g[2 * h + j] + bi[2 * h + j] + r * h_n);
    g[j] = r;
    g[h + j] = z;
    g[2 * h + j] = nn;
    out[j] = (1.0f - z) * nn + z * prev[j];
    hn[j] = h_n;
  }
}

// In place: g holds r, z, n and gets their gradients; h_n holds W_hn h_prev + b_hn and gets dn_pre * r. Each
// j reads its elements before writing them, and no other j touches them, so the loop stays a SIMD loop.
GN_VECTOR_CLONES void gru_backward_row(int64_t h, const float* __restrict d_out, float* __restrict d_rec,
                                       float* g, float* h_n, const float* __restrict prev) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float r = g[j], z = g[h + j], nn = g[2 * h + j], hn = h_n[j];
    const float d = d_out[j] + d_rec[j];
    const float dn_pre = d * (1.0f - z) * (1.0f - nn * nn);
    const float dz_pre = d * (prev[j] - nn) * z * (1.0f - z);
    const float dr_pre = dn_pre * hn * r * (1.0f - r);
    g[j] = dr_pre;
    g[h + j] = dz_pre;
    g[2 * h + j] = dn_pre;
    h_n[j] = dn_pre * r;
    d_rec[j] = d * z;
  }
}

GN_VECTOR_CLONES void lstm_forward_row(int64_t h, float* __restrict g, const float* __restrict r4,
                                       const float* __restrict bi, const float* __restrict bh,
                                       const float* __restrict cp, float* __restrict c,
                                       float* __restrict out) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float in = sigmoid(g[j] + r4[j] + (bi[j] + bh[j]));
    const float forget = sigmoid(g[h + j] + r4[h + j] + (bi[h + j] + bh[h + j]));
    const float cand = tanh_poly(g[2 * h + j] + r4[2 * h + j] + (bi[2 * h + j] + bh[2 * h + j]));
    const float outg = sigmoid(g[3 * h + j] + r4[3 * h + j] + (bi[3 * h + j] + bh[3 * h + j]));
    const float cell = forget * cp[j] + in * cand;
    g[j] = in;
    g[h + j] = forget;
    g[2 * h + j] = cand;
    g[3 * h + j] = outg;
    c[j] = cell;
    out[j] = outg * tanh_poly(cell);
  }
}

// In place: g holds i, f, g, o and gets their gradients (each j reads its elements before writing them).
GN_VECTOR_CLONES void lstm_backward_row(int64_t h, const float* __restrict d_out,
                                        const float* __restrict d_rec, float* __restrict d_cell, float* g,
                                        const float* __restrict c, const float* __restrict cp) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float in = g[j], forget = g[h + j], cand = g[2 * h + j], outg = g[3 * h + j];
    const float d = d_out[j] + d_rec[j];
    const float tc = tanh_poly(c[j]);
    const float dcell = d_cell[j] + d * outg * (1.0f - tc * tc);
    g[j] = dcell * cand * in * (1.0f - in);
    g[h + j] = dcell * cp[j] * forget * (1.0f - forget);
    g[2 * h + j] = dcell * in * (1.0f - cand * cand);
    g[3 * h + j] = d * tc * outg * (1.0f - outg);
    d_cell[j] = dcell * forget;
  }
}

// The column sums of `width` columns of a [rows, cols] matrix (x points at the first): each group of 8 rows
// is summed in float, vectorised, and the groups' sums are added in double, so that 1,000 rows lose no more
// than a few float roundings and convert to double an eighth as often as summing in double would. Columns
// go in bands of kSumBand, whose accumulators stay in L1 while every row passes.
constexpr int64_t kSumBand = 256, kSumGroup = 8;
GN_VECTOR_CLONES void column_sums_band(int64_t rows, int64_t cols, int64_t width, const float* __restrict x,
                                       float* __restrict out) {
  double acc[kSumBand] = {};
  for (int64_t i0 = 0; i0 < rows; i0 += kSumGroup) {
    float group[kSumBand] = {};
    for (int64_t i = i0; i < std::min(rows, i0 + kSumGroup); ++i) {
      const float* __restrict r = x + i * cols;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) group[j] += r[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) acc[j] += group[j];
  }
  for (int64_t j = 0; j < width; ++j) out[j] = static_cast<float>(acc[j]);
}

class CpuRecurrentKernels final : public RecurrentKernels {
 public:
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
            KernelContext&) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta * C, which BLAS implementations need not do for an empty product
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                blas_int(m), blas_int(n), blas_int(k), alpha, a, blas_int(lda), b, blas_int(ldb), beta, c,
                blas_int(ldc));
  }

  void swap_leading_axes(int64_t a, int64_t b, int64_t row, const float* src, float* dst,
                         KernelContext&) override {
    const auto bytes = static_cast<size_t>(row) * sizeof(float);
#pragma omp parallel for if (a * b * row > kParallelCopy)
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) std::memcpy(dst + (j * a + i) * row, src + (i * b + j) * row, bytes);
  }

  void copy_rows(int64_t rows, int64_t cols, const float* src, int64_t ld_src, float* dst, int64_t ld_dst,
                 KernelContext&) override {
    const auto bytes = static_cast<size_t>(cols) * sizeof(float);
    for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * ld_dst, src + i * ld_src, bytes);
  }

  void fill_zero(float* dst, int64_t count, KernelContext&) override {
    std::memset(dst, 0, static_cast<size_t>(count) * sizeof(float));
  }

  void column_sums(int64_t rows, int64_t cols, const float* x, float* out, KernelContext&) override {
    const int64_t bands = (cols + kSumBand - 1) / kSumBand;
#pragma omp parallel for if (rows * cols > kParallelCopy)
    for (int64_t band = 0; band < bands; ++band) {
      const int64_t j0 = band * kSumBand;
      column_sums_band(rows, cols, std::min(kSumBand, cols - j0), x + j0, out + j0);
    }
  }

  void multiply(int64_t count, const float* a, const float* b, float* out, KernelContext&) override {
#pragma omp parallel for if (count > kParallelCopy)
    for (int64_t i = 0; i < count; ++i) out[i] = a[i] * b[i];
  }

  void dropout_time_major(int64_t steps, int64_t n, int64_t width, const float* x, float* y, float* mask,
                          float p, uint64_t seed, uint64_t first_index, KernelContext&) override {
    // The same float comparison as the CUDA kernel and layers.h's dropout.
    const float keep = 1.0f - p, scale = 1.0f / keep;
#pragma omp parallel for collapse(2) if (steps * n * width > kParallelCopy / 8)
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = (t * n + i) * width;
        const uint64_t first = first_index + static_cast<uint64_t>((i * steps + t) * width);
        for (int64_t j = 0; j < width; ++j) {
          const float m =
              philox::uniform_at(seed, first + static_cast<uint64_t>(j), 0.0f, 1.0f) <= keep ? scale : 0.0f;
          mask[row + j] = m;
          y[row + j] = x[row + j] * m;
        }
      }
  }

  void rnn_step_forward(bool relu, int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                        const float* b_hh, float* h_out, int64_t ld_out, KernelContext&) override {
    const float* zero = zeros(std::max<int64_t>(n, 1) * h);
    const float* rec = gh ? gh : zero;
    const float* bi = b_ih ? b_ih : zero;
    const float* bh = b_hh ? b_hh : zero;
#pragma omp parallel for if (n * h >= kParallelGates)
    for (int64_t i = 0; i < n; ++i)
      rnn_forward_row(relu, h, gates + i * h, rec + i * h, bi, bh, h_out + i * ld_out);
  }

  void rnn_step_backward(bool relu, int64_t n, int64_t h, const float* dy, int64_t ld_dy, const float* dh,
                         const float* h_t, int64_t ld_h, float* dgates, KernelContext&) override {
#pragma omp parallel for if (n * h >= kParallelGates)
    for (int64_t i = 0; i < n; ++i)
      rnn_backward_row(relu, h, dy + i * ld_dy, dh + i * h, h_t + i * ld_h, dgates + i * h);
  }

  void gru_step_forward(int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                        const float* b_hh, const float* h_prev, int64_t ld_prev, float* hn, float* h_out,
                        int64_t ld_out, KernelContext&) override {
    const float* zero = zeros(std::max<int64_t>(n, 1) * 3 * h);
    const float* rec = gh ? gh : zero;
    const float* bi = b_ih ? b_ih : zero;
    const float* bh = b_hh ? b_hh : zero;
    const float* prev = h_prev ? h_prev : zero;
    const int64_t ld_p = h_prev ? ld_prev : h;
    float* hn_rows = hn ? hn : discarded(n * h);
#pragma omp parallel for if (n * h >= kParallelGates)
    for (int64_t i = 0; i < n; ++i)
      gru_forward_row(h, gates + i * 3 * h, rec + i * 3 * h, bi, bh, prev + i * ld_p, hn_rows + i * h,
                      h_out + i * ld_out);
  }

  void gru_step_backward(int64_t n, int64_t h, const float* dy, int64_t ld_dy, float* dh, float* gates,
                         float* hn, const float* h_prev, int64_t ld_prev, KernelContext&) override {
    const float* prev = h_prev ? h_prev : zeros(n * h);
    const int64_t ld_p = h_prev ? ld_prev : h;
#pragma omp parallel for if (n * h >= kParallelGates)
    for (int64_t i = 0; i < n; ++i)
      gru_backward_row(h, dy + i * ld_dy, dh + i * h, gates + i * 3 * h, hn + i * h, prev + i * ld_p);
  }

  void lstm_step_forward(int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                         const float* b_hh, const float* c_prev, float* c_out, float* h_out, int64_t ld_out,
                         KernelContext&) override {
    const float* zero = zeros(std::max<int64_t>(n, 1) * 4 * h);
    const float* rec = gh ? gh : zero;
    const float* bi = b_ih ? b_ih : zero;
    const float* bh = b_hh ? b_hh : zero;
    const float* cp = c_prev ? c_prev : zero;
#pragma omp parallel for if (n * h >= kParallelGates)
    for (int64_t i = 0; i < n; ++i)
      lstm_forward_row(h, gates + i * 4 * h, rec + i * 4 * h, bi, bh, cp + i * h, c_out + i * h,
                       h_out + i * ld_out);
  }

  void lstm_step_backward(int64_t n, int64_t h, const float* dy, int64_t ld_dy, const float* dh, float* dc,
                          float* gates, const float* c_t, const float* c_prev, KernelContext&) override {
    const float* cp = c_prev ? c_prev : zeros(n * h);
#pragma omp parallel for if (n * h >= kParallelGates)
    for (int64_t i = 0; i < n; ++i)
      lstm_backward_row(h, dy + i * ld_dy, dh + i * h, dc + i * h, gates + i * 4 * h, c_t + i * h, cp + i * h);
  }
};

}  // namespace

RecurrentKernels& cpu_recurrent_kernels() {
  static CpuRecurrentKernels kernels;
  return kernels;
}

}  // namespace gn::nn
