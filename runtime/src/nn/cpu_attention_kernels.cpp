// CPU attention kernels: batched products with oneDNN (OpenBLAS where it refuses a shape), the rest OpenMP
// loops over rows (memory-bound).
//
// The loops over rows (softmax, its backward, layer norm) call row functions compiled twice, for SSE2 and for
// AVX2 (GN_VECTOR_CLONES, cpu_vector_math.h), with the softmax's exponentials as exp_poly: libm's expf does
// not vectorise. On a ViT step's shapes (512 score matrices of 50 x 50; 6400 rows of 64 for layer norm), one
// core of this machine's EPYC, the scalar loops took 6.4-10.8 ms for the softmax (now 2.0), 1.6 for its
// backward (0.5), 1.1 for layer norm (0.3-0.4) and 1.0-1.4 for its backward (0.3-0.4, whose parameter
// gradients' column sums also go parallel now, in blocks of rows).
//
// A multi-head attention's products are many small matrices (a ViT on Fashion-MNIST: 512 of 50 x 50 x 16 per
// product). oneDNN's batched matmul (one primitive per shape, kept per thread) runs them at 35-58 GFLOP/s on
// one core of this machine's EPYC, where one OpenBLAS sgemm per matrix with the batch split over the
// worker's threads ran at 24-40 (the six products of a ViT block's attention, forward and backward: 5.6
// against 7.8 ms). The OpenBLAS loop stays as the fallback for a shape oneDNN refuses: one sgemm each, with
// the batch split over the threads, beats letting OpenBLAS thread each small product (its OpenMP build runs
// single-threaded inside a parallel region); a batch smaller than the thread count leaves the threading to
// OpenBLAS instead.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_kernels.h"
#include "cpu_vector_math.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

// Loops over rows go parallel from about this many floats of work.
constexpr int64_t kParallelMin = 1 << 15;

int blas_int(int64_t v) {
  if (v > INT_MAX)
    throw ShapeError("a batched product's dimension " + std::to_string(v) + " exceeds BLAS's 2^31-1");
  return static_cast<int>(v);
}

// --- oneDNN's batched matmul ------------------------------------------------------------------------------

// c [batch, m, n] = alpha op(a) op(b) as one primitive: a and b described with the strides of their stored
// orientation, so that no transpose is copied.
struct BmmPrim {
  dnnl::memory::desc a, b, c;
  dnnl::matmul prim;
};

// A thread's engine and stream, and its primitives by shape (alpha by its bits), destroyed before them.
struct ThreadDnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, uint32_t>, std::optional<BmmPrim>> bmms;
};

ThreadDnnl& thread_dnnl() {
  thread_local ThreadDnnl t;
  return t;
}

// The calling thread's primitive for a shape, made on first use; null where oneDNN cannot make one (the
// caller falls back to OpenBLAS). A thread keeps at most kBmmShapes of them: a run that meets ever new
// shapes (generation over a growing prefix) starts again rather than growing without end.
constexpr size_t kBmmShapes = 256;

const BmmPrim* bmm_prim(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                        float alpha) {
  ThreadDnnl& t = thread_dnnl();
  const auto key = std::make_tuple(batch, m, n, k, trans_a, trans_b, std::bit_cast<uint32_t>(alpha));
  auto it = t.bmms.find(key);
  if (it != t.bmms.end()) return it->second ? &*it->second : nullptr;
  if (t.bmms.size() >= kBmmShapes) t.bmms.clear();
  std::optional<BmmPrim> made;
  try {
    using dnnl::memory;
    const memory::dims a_strides = trans_a ? memory::dims{m * k, 1, m} : memory::dims{m * k, k, 1};
    const memory::dims b_strides = trans_b ? memory::dims{k * n, 1, k} : memory::dims{k * n, n, 1};
    BmmPrim p;
    p.a = memory::desc({batch, m, k}, memory::data_type::f32, a_strides);
    p.b = memory::desc({batch, k, n}, memory::data_type::f32, b_strides);
    p.c = memory::desc({batch, m, n}, memory::data_type::f32, memory::dims{m * n, n, 1});
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    p.prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p.a, p.b, p.c), attr, t.engine));
    made = std::move(p);
  } catch (const dnnl::error&) {
    made.reset();
  }
  auto& slot = t.bmms[key] = std::move(made);
  return slot ? &*slot : nullptr;
}

// --- one row of each loop; the kernels below run them over the rows ----------------------------------------

// Softmax of x's first `keep` of `cols` entries into y, the rest 0 (a row with none kept is all zeros).
// e^(x - max) is exp_poly's, except that it is 0 below e^-87 (where exp_poly gives 1.6e-38).
GN_VECTOR_CLONES void softmax_row(int64_t keep, int64_t cols, const float* __restrict x,
                                  float* __restrict y) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < keep; ++j) mx = std::max(mx, x[j]);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < keep; ++j) {
    const float d = x[j] - mx;
    const float e = d < -87.0f ? 0.0f : exp_poly(d);
    y[j] = e;
    sum += e;
  }
  const float inv = keep > 0 ? 1.0f / sum : 0.0f;
#pragma omp simd
  for (int64_t j = 0; j < keep; ++j) y[j] *= inv;
  for (int64_t j = keep; j < cols; ++j) y[j] = 0;
}

// dx = y * (dy - sum(dy * y)) along one row.
GN_VECTOR_CLONES void softmax_backward_row(int64_t cols, const float* __restrict y,
                                           const float* __restrict dy, float* __restrict dx) {
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < cols; ++j) dot += dy[j] * y[j];
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) dx[j] = y[j] * (dy[j] - dot);
}

// One row of layer norm: y, and its mean and rstd. gamma and beta null without affine.
GN_VECTOR_CLONES void layer_norm_row(int64_t cols, float eps, const float* __restrict x,
                                     const float* __restrict gamma, const float* __restrict beta,
                                     float* __restrict y, float* mean, float* rstd) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < cols; ++j) s += x[j];
  const float mu = s / static_cast<float>(cols);
  float v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t j = 0; j < cols; ++j) v += (x[j] - mu) * (x[j] - mu);
  const float rs = 1.0f / std::sqrt(v / static_cast<float>(cols) + eps);
  *mean = mu;
  *rstd = rs;
  if (gamma) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) y[j] = (x[j] - mu) * rs * gamma[j] + beta[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) y[j] = (x[j] - mu) * rs;
  }
}

// One row of layer norm's backward: dx (null: not wanted) = rstd * (g - mean(g) - xhat * mean(g * xhat)) with
// g = dy * gamma (dy without affine), and, where sg is not null, the row's dy * xhat and dy added to sg and
// sb.
GN_VECTOR_CLONES void layer_norm_backward_row(int64_t cols, const float* __restrict x,
                                              const float* __restrict dy, const float* __restrict gamma,
                                              float mu, float rs, float* __restrict dx, double* __restrict sg,
                                              double* __restrict sb) {
  if (dx) {
    float s1 = 0, s2 = 0;
    if (gamma) {
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t j = 0; j < cols; ++j) {
        const float g = dy[j] * gamma[j];
        s1 += g;
        s2 += g * (x[j] - mu) * rs;
      }
    } else {
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t j = 0; j < cols; ++j) {
        s1 += dy[j];
        s2 += dy[j] * (x[j] - mu) * rs;
      }
    }
    const float mg = s1 / static_cast<float>(cols), mgx = s2 / static_cast<float>(cols);
    if (gamma) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dx[j] = rs * (dy[j] * gamma[j] - mg - (x[j] - mu) * rs * mgx);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dx[j] = rs * (dy[j] - mg - (x[j] - mu) * rs * mgx);
    }
  }
  if (sg) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      sg[j] += static_cast<double>(dy[j]) * ((x[j] - mu) * rs);
      sb[j] += dy[j];
    }
  }
}

class CpuAttentionKernels final : public AttentionKernels {
 public:
  void bmm(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
           const float* a, const float* b, float* c, KernelContext&) override {
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: sgemm with k = 0 may leave c untouched
      std::fill(c, c + batch * m * n, 0.0f);
      return;
    }
    if (const BmmPrim* p = bmm_prim(batch, m, n, k, trans_a, trans_b, alpha)) {
      auto& t = thread_dnnl();
      dnnl::memory am(p->a, t.engine, const_cast<float*>(a)), bm(p->b, t.engine, const_cast<float*>(b)),
          cm(p->c, t.engine, c);
      try {
        p->prim.execute(t.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        t.stream.wait();
      } catch (const dnnl::error& e) {
        throw BackendError(std::string("oneDNN batched matmul failed: ") + e.what());
      }
      return;
    }
    const int im = blas_int(m), in = blas_int(n), ik = blas_int(k);
    const int lda = trans_a ? im : ik, ldb = trans_b ? ik : in;
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    auto one = [&](int64_t i) {
      cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a + i * m * k, lda, b + i * k * n, ldb, 0.0f,
                  c + i * m * n, in);
    };
    if (batch >= omp_get_max_threads() && batch > 1) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < batch; ++i) one(i);
    } else {
      for (int64_t i = 0; i < batch; ++i) one(i);
    }
  }

  void masked_softmax(int64_t batch, int64_t heads, int64_t rows, int64_t cols, bool causal,
                      const float* valid_lens, const float* x, float* y, KernelContext&) override {
    const int64_t total = batch * rows;
#pragma omp parallel for schedule(static) if (total * cols > kParallelMin)
    for (int64_t r = 0; r < total; ++r) {
      const int64_t b = r / rows, i = r % rows;
      int64_t keep = cols;  // columns [0, keep) take part
      if (causal) keep = std::min(keep, i + (cols - rows) + 1);
      if (valid_lens) {
        // Column j takes part when j < len, compared as floats (a NaN or non-positive length keeps none).
        const float len = valid_lens[b / heads];
        keep = !(len > 0) ? 0 : std::min(keep, static_cast<int64_t>(std::ceil(std::min(len, float(cols)))));
      }
      softmax_row(keep, cols, x + r * cols, y + r * cols);
    }
  }

  void softmax_backward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx,
                        KernelContext&) override {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) softmax_backward_row(cols, y + r * cols, dy + r * cols, dx + r * cols);
  }

  void layer_norm_forward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                          const float* beta, float* y, float* mean, float* rstd, KernelContext&) override {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t r = 0; r < rows; ++r)
      layer_norm_row(cols, eps, x + r * cols, gamma, beta, y + r * cols, mean + r, rstd + r);
  }

  void layer_norm_backward(int64_t rows, int64_t cols, const float* x, const float* dy, const float* gamma,
                           const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta,
                           KernelContext&) override {
    // The parameter gradients are column sums over the rows: each block of kNormBlock rows sums its own in
    // double, and the blocks' sums are added in block order, so every run and thread count gives the same
    // bits.
    constexpr int64_t kNormBlock = 128;
    const int64_t blocks = (rows + kNormBlock - 1) / kNormBlock;
    std::vector<double> part(gamma ? static_cast<size_t>(blocks * 2 * cols) : 0, 0.0);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      double* sg = gamma ? part.data() + blk * 2 * cols : nullptr;
      double* sb = gamma ? sg + cols : nullptr;
      for (int64_t r = blk * kNormBlock; r < std::min(rows, (blk + 1) * kNormBlock); ++r)
        layer_norm_backward_row(cols, x + r * cols, dy + r * cols, gamma, mean[r], rstd[r],
                                dx ? dx + r * cols : nullptr, sg, sb);
    }
    if (!gamma) return;
    for (int64_t j = 0; j < cols; ++j) {
      double g = 0, b = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        g += part[static_cast<size_t>(blk * 2 * cols + j)];
        b += part[static_cast<size_t>(blk * 2 * cols + cols + j)];
      }
      dgamma[j] = static_cast<float>(g);
      dbeta[j] = static_cast<float>(b);
    }
  }

  void split_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d,
                   const float* x, float* out, KernelContext&) override {
    const size_t bytes = static_cast<size_t>(d) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * t * heads * d > kParallelMin)
    for (int64_t s = 0; s < n * t; ++s) {
      const int64_t i = s / t, step = s % t;
      const float* src = x + (s * groups + group) * heads * d;
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(out + ((i * heads + h) * t + step) * d, src + h * d, bytes);
    }
  }

  void merge_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d,
                   const float* in, float* y, KernelContext&) override {
    const size_t bytes = static_cast<size_t>(d) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * t * heads * d > kParallelMin)
    for (int64_t s = 0; s < n * t; ++s) {
      const int64_t i = s / t, step = s % t;
      float* dst = y + (s * groups + group) * heads * d;
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(dst + h * d, in + ((i * heads + h) * t + step) * d, bytes);
    }
  }

  void add_broadcast(int64_t n, int64_t len, const float* x, const float* table, float* y,
                     KernelContext&) override {
#pragma omp parallel for schedule(static) if (n * len > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float* xr = x + i * len;
      float* yr = y + i * len;
      for (int64_t j = 0; j < len; ++j) yr[j] = xr[j] + table[j];
    }
  }

  void sum_rows(int64_t n, int64_t len, int64_t stride, const float* x, float* y, KernelContext&) override {
    std::vector<double> acc(static_cast<size_t>(len), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const float* xr = x + i * stride;
      for (int64_t j = 0; j < len; ++j) acc[static_cast<size_t>(j)] += xr[j];
    }
    for (int64_t j = 0; j < len; ++j) y[j] = static_cast<float>(acc[static_cast<size_t>(j)]);
  }
};

}  // namespace

AttentionKernels& cpu_attention_kernels() {
  static CpuAttentionKernels kernels;
  return kernels;
}

AttentionKernels& attention_kernels(Device device) {
  if (device.is_cpu()) return cpu_attention_kernels();
  if (AttentionKernels* k = cuda_attention_kernels()) return *k;
  throw Error("no attention kernels for " + device.str() + ": the CUDA backend was not built");
}

}  // namespace gn::nn
