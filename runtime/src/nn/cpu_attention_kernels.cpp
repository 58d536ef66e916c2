// CPU attention kernels: batched products with OpenBLAS, the rest OpenMP loops over rows (memory-bound).
//
// A multi-head attention's products are many small matrices (a ViT on Fashion-MNIST: 512 of 50 x 50 x 16 per
// product). One sgemm each, with the batch split over the worker's threads, beats letting OpenBLAS thread
// each small product (its OpenMP build runs single-threaded inside a parallel region); a batch smaller than
// the thread count leaves the threading to OpenBLAS instead.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_kernels.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

// Loops over rows go parallel from about this many floats of work.
constexpr int64_t kParallelMin = 1 << 15;

int blas_int(int64_t v) {
  if (v > INT_MAX) throw ShapeError("a batched product's dimension " + std::to_string(v) + " exceeds BLAS's 2^31-1");
  return static_cast<int>(v);
}

class CpuAttentionKernels final : public AttentionKernels {
 public:
  void bmm(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha, const float* a,
           const float* b, float* c, KernelContext&) override {
    const int im = blas_int(m), in = blas_int(n), ik = blas_int(k);
    const int lda = trans_a ? im : ik, ldb = trans_b ? ik : in;
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    auto one = [&](int64_t i) {
      cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a + i * m * k, lda, b + i * k * n, ldb, 0.0f,
                  c + i * m * n, in);
    };
    if (k == 0) {  // an empty sum: sgemm with k = 0 may leave c untouched
      std::fill(c, c + batch * m * n, 0.0f);
      return;
    }
    if (batch >= omp_get_max_threads() && batch > 1) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < batch; ++i) one(i);
    } else {
      for (int64_t i = 0; i < batch; ++i) one(i);
    }
  }

  void masked_softmax(int64_t batch, int64_t heads, int64_t rows, int64_t cols, bool causal, const float* valid_lens,
                      const float* x, float* y, KernelContext&) override {
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
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < keep; ++j) mx = std::max(mx, xr[j]);
      float sum = 0;
      for (int64_t j = 0; j < keep; ++j) {
        yr[j] = std::exp(xr[j] - mx);
        sum += yr[j];
      }
      const float inv = keep > 0 ? 1.0f / sum : 0.0f;
      for (int64_t j = 0; j < keep; ++j) yr[j] *= inv;
      for (int64_t j = keep; j < cols; ++j) yr[j] = 0;
    }
  }

  void softmax_backward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx,
                        KernelContext&) override {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float* yr = y + r * cols;
      const float* gr = dy + r * cols;
      float dot = 0;
      for (int64_t j = 0; j < cols; ++j) dot += gr[j] * yr[j];
      float* out = dx + r * cols;
      for (int64_t j = 0; j < cols; ++j) out[j] = yr[j] * (gr[j] - dot);
    }
  }

  void layer_norm_forward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma, const float* beta,
                          float* y, float* mean, float* rstd, KernelContext&) override {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float s = 0;
      for (int64_t j = 0; j < cols; ++j) s += xr[j];
      const float mu = s / static_cast<float>(cols);
      float v = 0;
      for (int64_t j = 0; j < cols; ++j) v += (xr[j] - mu) * (xr[j] - mu);
      const float rs = 1.0f / std::sqrt(v / static_cast<float>(cols) + eps);
      mean[r] = mu;
      rstd[r] = rs;
      float* yr = y + r * cols;
      if (gamma) {
        for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
      } else {
        for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - mu) * rs;
      }
    }
  }

  void layer_norm_backward(int64_t rows, int64_t cols, const float* x, const float* dy, const float* gamma,
                           const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta,
                           KernelContext&) override {
    if (dx) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        const float* gr = dy + r * cols;
        const float mu = mean[r], rs = rstd[r];
        // g = dy * gamma; dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        float sg = 0, sgx = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const float g = gamma ? gr[j] * gamma[j] : gr[j];
          sg += g;
          sgx += g * (xr[j] - mu) * rs;
        }
        const float mg = sg / static_cast<float>(cols), mgx = sgx / static_cast<float>(cols);
        float* out = dx + r * cols;
        for (int64_t j = 0; j < cols; ++j) {
          const float g = gamma ? gr[j] * gamma[j] : gr[j];
          out[j] = rs * (g - mg - (xr[j] - mu) * rs * mgx);
        }
      }
    }
    if (!gamma) return;
    // Column sums in a fixed order (row by row), so every run and thread count gives the same bits.
    std::vector<double> sg(static_cast<size_t>(cols), 0.0), sb(static_cast<size_t>(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* gr = dy + r * cols;
      const float mu = mean[r], rs = rstd[r];
      for (int64_t j = 0; j < cols; ++j) {
        sg[static_cast<size_t>(j)] += static_cast<double>(gr[j]) * ((xr[j] - mu) * rs);
        sb[static_cast<size_t>(j)] += gr[j];
      }
    }
    for (int64_t j = 0; j < cols; ++j) {
      dgamma[j] = static_cast<float>(sg[static_cast<size_t>(j)]);
      dbeta[j] = static_cast<float>(sb[static_cast<size_t>(j)]);
    }
  }

  void split_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d, const float* x,
                   float* out, KernelContext&) override {
    const size_t bytes = static_cast<size_t>(d) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * t * heads * d > kParallelMin)
    for (int64_t s = 0; s < n * t; ++s) {
      const int64_t i = s / t, step = s % t;
      const float* src = x + (s * groups + group) * heads * d;
      for (int64_t h = 0; h < heads; ++h) std::memcpy(out + ((i * heads + h) * t + step) * d, src + h * d, bytes);
    }
  }

  void merge_heads(int64_t n, int64_t t, int64_t groups, int64_t group, int64_t heads, int64_t d, const float* in,
                   float* y, KernelContext&) override {
    const size_t bytes = static_cast<size_t>(d) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * t * heads * d > kParallelMin)
    for (int64_t s = 0; s < n * t; ++s) {
      const int64_t i = s / t, step = s % t;
      float* dst = y + (s * groups + group) * heads * d;
      for (int64_t h = 0; h < heads; ++h) std::memcpy(dst + h * d, in + ((i * heads + h) * t + step) * d, bytes);
    }
  }

  void add_broadcast(int64_t n, int64_t len, const float* x, const float* table, float* y, KernelContext&) override {
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
