// CPU kernels of the sequence layers and the regression losses: gathers, strided copies and loops, all
// memory-bound, so plain loops (OpenMP over rows where there are enough of them).
#include <cmath>
#include <cstring>
#include <string>

#include "cpu_parallel.h"
#include "gpunodes/errors.h"
#include "sequence_kernels.h"

namespace gn::nn {
namespace {

constexpr int64_t kParallelMin = kCpuParallelMin;

// Throws for the first id that is not an integer in [0, range), naming its sample and step.
void check_ids(const char* op, int64_t n, int64_t steps, int64_t range, const float* ids) {
  for (int64_t i = 0; i < n; ++i) {
    const float id = ids[i];
    if (!(id >= 0 && id < static_cast<float>(range)) || id != std::floor(id))
      throw Error(std::string(op) + ": token id " + std::to_string(id) + " at sample " +
                  std::to_string(i / steps) + ", step " + std::to_string(i % steps) +
                  " is not an integer in [0, " + std::to_string(range) + ")");
  }
}

class CpuSequenceKernels final : public SequenceKernels {
 public:
  void embedding_forward(int64_t n, int64_t steps, int64_t dim, int64_t vocab, const float* ids, const float* w,
                         float* y, KernelContext&) override {
    check_ids("Embedding", n, steps, vocab, ids);
#pragma omp parallel for if (n * dim > kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(y + i * dim, w + static_cast<int64_t>(ids[i]) * dim, static_cast<size_t>(dim) * sizeof(float));
  }

  void embedding_backward(int64_t n, int64_t dim, int64_t vocab, const float* ids, const float* dy, float* dw,
                          KernelContext&) override {
    std::memset(dw, 0, static_cast<size_t>(vocab * dim) * sizeof(float));
    // In position order, so the sums are the same on every run (rows of one id are added one after another).
    for (int64_t i = 0; i < n; ++i) {
      float* row = dw + static_cast<int64_t>(ids[i]) * dim;
      const float* g = dy + i * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += g[j];
    }
  }

  void one_hot(int64_t n, int64_t steps, int64_t classes, const float* ids, float* y, KernelContext&) override {
    check_ids("OneHot", n, steps, classes, ids);
    std::memset(y, 0, static_cast<size_t>(n * classes) * sizeof(float));
    for (int64_t i = 0; i < n; ++i) y[i * classes + static_cast<int64_t>(ids[i])] = 1.0f;
  }

  void swap_axes(int64_t outer, int64_t a, int64_t mid, int64_t b, int64_t inner, const float* x, float* y,
                 KernelContext&) override {
    const size_t run = static_cast<size_t>(inner) * sizeof(float);
#pragma omp parallel for collapse(2) if (outer * a * mid * b * inner > kParallelMin)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < b; ++j)
        for (int64_t m = 0; m < mid; ++m)
          for (int64_t i = 0; i < a; ++i)
            std::memcpy(y + (((o * b + j) * mid + m) * a + i) * inner,
                        x + (((o * a + i) * mid + m) * b + j) * inner, run);
  }

  void copy_strided(int64_t rows, int64_t count, const float* src, int64_t src_stride, float* dst,
                    int64_t dst_stride, KernelContext&) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(count) * sizeof(float));
  }

  void zero(float* y, int64_t n, KernelContext&) override {
    std::memset(y, 0, static_cast<size_t>(n) * sizeof(float));
  }

  void regression_loss(RegressionLoss kind, int64_t n, const float* pred, const float* target, float delta,
                       float* loss, float* stats, float* dpred, float grad_scale, KernelContext&) override {
    double sum = 0, squares = 0;
#pragma omp parallel for reduction(+ : sum, squares) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
      const double a = std::abs(e);
      double l = 0, g = 0;
      switch (kind) {
        case RegressionLoss::Mse:
          l = e * e, g = 2 * e;
          break;
        case RegressionLoss::L1:
          l = a, g = e > 0 ? 1 : e < 0 ? -1 : 0;
          break;
        case RegressionLoss::Huber:
          if (a < delta)
            l = 0.5 * e * e, g = e;
          else
            l = delta * (a - 0.5 * delta), g = e > 0 ? delta : -static_cast<double>(delta);
          break;
      }
      sum += l;
      squares += e * e;
      if (dpred) dpred[i] = static_cast<float>(g * grad_scale);
    }
    *loss = static_cast<float>(sum / static_cast<double>(n));
    stats[0] = static_cast<float>(sum);
    stats[1] = static_cast<float>(squares);
  }
};

}  // namespace

SequenceKernels& cpu_sequence_kernels() {
  static CpuSequenceKernels kernels;
  return kernels;
}

SequenceKernels& sequence_kernels(Device device) {
  if (device.is_cpu()) return cpu_sequence_kernels();
  if (SequenceKernels* k = cuda_sequence_kernels()) return *k;
  throw Error("no sequence kernels for " + device.str() + ": the CUDA backend was not built");
}

}  // namespace gn::nn
