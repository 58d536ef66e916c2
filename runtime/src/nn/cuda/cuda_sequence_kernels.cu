// CUDA kernels of the sequence layers and the regression losses: gathers and one-hot rows are small kernels,
// axis swaps one kernel, strided copies and zeros library calls (cudaMemcpy2DAsync, cudaMemsetAsync). Token
// ids are checked on the device and the first bad one read back, as the cross-entropy checks its labels.
#include <cuda_runtime.h>

#include <string>

#include "../sequence_kernels.h"
#include "cuda_kernel_support.h"

namespace gn::nn {
namespace {

// Bytes of 0x7f: a position no batch reaches, set by a memset, which a graph can capture too.
constexpr long long kNoBadId = 0x7f7f7f7f7f7f7f7fLL;

__device__ bool bad_id(float id, int64_t range) {
  return !(id >= 0.0f && id < static_cast<float>(range)) || id != floorf(id);
}

// Writes the smallest bad position into *first_bad.
__global__ void check_ids_kernel(const float* __restrict__ ids, int64_t n, int64_t range, long long* first_bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (bad_id(ids[i], range)) atomicMin(first_bad, static_cast<long long>(i));
}

__global__ void gather_rows_kernel(const float* __restrict__ ids, const float* __restrict__ w, float* y,
                                   int64_t n, int64_t dim, int64_t vocab) {
  const int64_t total = n * dim;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / dim, j = k % dim;
    const float id = ids[i];
    // A bad id (reported by the check) reads nothing out of range.
    y[k] = bad_id(id, vocab) ? 0.0f : w[static_cast<int64_t>(id) * dim + j];
  }
}

// Atomic adds: the order of a row's sums varies from run to run, in the last bits only.
__global__ void scatter_add_rows_kernel(const float* __restrict__ ids, const float* __restrict__ dy, float* dw,
                                        int64_t n, int64_t dim) {
  const int64_t total = n * dim;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / dim, j = k % dim;
    atomicAdd(dw + static_cast<int64_t>(ids[i]) * dim + j, dy[k]);
  }
}

__global__ void one_hot_kernel(const float* __restrict__ ids, float* y, int64_t n, int64_t classes) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (!bad_id(ids[i], classes)) y[i * classes + static_cast<int64_t>(ids[i])] = 1.0f;
}

__global__ void swap_axes_kernel(const float* __restrict__ x, float* y, int64_t outer, int64_t a, int64_t mid,
                                 int64_t b, int64_t inner) {
  const int64_t total = outer * a * mid * b * inner;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    // k indexes y [outer, b, mid, a, inner].
    int64_t r = k;
    const int64_t e = r % inner;
    r /= inner;
    const int64_t i = r % a;
    r /= a;
    const int64_t m = r % mid;
    r /= mid;
    const int64_t j = r % b;
    const int64_t o = r / b;
    y[k] = x[(((o * a + i) * mid + m) * b + j) * inner + e];
  }
}

// One block: per-thread sums in double, then a tree in shared memory, as the cross-entropy's.
__global__ void regression_loss_kernel(RegressionLoss kind, const float* __restrict__ pred,
                                       const float* __restrict__ target, int64_t n, float delta, float* loss,
                                       float* stats, float* dpred, float grad_scale) {
  __shared__ double sums[kThreads], squares[kThreads];
  double sum = 0, sq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double e = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
    const double a = fabs(e);
    double l = 0, g = 0;
    if (kind == RegressionLoss::Mse) {
      l = e * e, g = 2 * e;
    } else if (kind == RegressionLoss::L1) {
      l = a, g = e > 0 ? 1.0 : e < 0 ? -1.0 : 0.0;
    } else if (a < delta) {
      l = 0.5 * e * e, g = e;
    } else {
      l = delta * (a - 0.5 * delta), g = e > 0 ? delta : -static_cast<double>(delta);
    }
    sum += l;
    sq += e * e;
    if (dpred) dpred[i] = static_cast<float>(g * grad_scale);
  }
  sums[threadIdx.x] = sum;
  squares[threadIdx.x] = sq;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      sums[threadIdx.x] += sums[threadIdx.x + s];
      squares[threadIdx.x] += squares[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = static_cast<float>(sums[0] / static_cast<double>(n));
    stats[0] = static_cast<float>(sums[0]);
    stats[1] = static_cast<float>(squares[0]);
  }
}

class CudaSequenceKernels final : public SequenceKernels {
 public:
  void embedding_forward(int64_t n, int64_t steps, int64_t dim, int64_t vocab, const float* ids, const float* w,
                         float* y, KernelContext& kc) override {
    Stream s(kc);
    if (n == 0) return;
    gather_rows_kernel<<<blocks_for(n * dim), kThreads, 0, s.get()>>>(ids, w, y, n, dim, vocab);
    GN_CUDA_CHECK_LAUNCH();
    check_ids("Embedding", n, steps, vocab, ids, s, kc);
  }

  void embedding_backward(int64_t n, int64_t dim, int64_t vocab, const float* ids, const float* dy, float* dw,
                          KernelContext& kc) override {
    Stream s(kc);
    GN_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(vocab * dim) * sizeof(float), s.get()));
    if (n == 0) return;
    scatter_add_rows_kernel<<<blocks_for(n * dim), kThreads, 0, s.get()>>>(ids, dy, dw, n, dim);
    GN_CUDA_CHECK_LAUNCH();
  }

  void one_hot(int64_t n, int64_t steps, int64_t classes, const float* ids, float* y, KernelContext& kc) override {
    Stream s(kc);
    GN_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(n * classes) * sizeof(float), s.get()));
    if (n == 0) return;
    one_hot_kernel<<<blocks_for(n), kThreads, 0, s.get()>>>(ids, y, n, classes);
    GN_CUDA_CHECK_LAUNCH();
    check_ids("OneHot", n, steps, classes, ids, s, kc);
  }

  void swap_axes(int64_t outer, int64_t a, int64_t mid, int64_t b, int64_t inner, const float* x, float* y,
                 KernelContext& kc) override {
    Stream s(kc);
    const int64_t total = outer * a * mid * b * inner;
    if (total == 0) return;
    swap_axes_kernel<<<blocks_for(total), kThreads, 0, s.get()>>>(x, y, outer, a, mid, b, inner);
    GN_CUDA_CHECK_LAUNCH();
  }

  void copy_strided(int64_t rows, int64_t count, const float* src, int64_t src_stride, float* dst,
                    int64_t dst_stride, KernelContext& kc) override {
    Stream s(kc);
    copy_rows(dst, dst_stride, src, src_stride, rows, count, s.get());
  }

  void zero(float* y, int64_t n, KernelContext& kc) override {
    Stream s(kc);
    if (n) GN_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(n) * sizeof(float), s.get()));
  }

  void regression_loss(RegressionLoss kind, int64_t n, const float* pred, const float* target, float delta,
                       float* loss, float* stats, float* dpred, float grad_scale, KernelContext& kc) override {
    Stream s(kc);
    regression_loss_kernel<<<1, kThreads, 0, s.get()>>>(kind, pred, target, n, delta, loss, stats, dpred,
                                                        grad_scale);
    GN_CUDA_CHECK_LAUNCH();
  }

 private:
  // The op's error for the first bad id, read back after the kernels (pageable memory, so the copy completes
  // first). A captured step cannot read back; its ids come from a dataset that made them from its vocabulary.
  static void check_ids(const char* op, int64_t n, int64_t steps, int64_t range, const float* ids, Stream& s,
                        KernelContext& kc) {
    Workspace flag(kc.allocator, s, sizeof(long long));
    auto* bad = static_cast<long long*>(flag.get());
    GN_CUDA_CHECK(cudaMemsetAsync(bad, 0x7f, sizeof(long long), s.get()));
    check_ids_kernel<<<blocks_for(n), kThreads, 0, s.get()>>>(ids, n, range, bad);
    GN_CUDA_CHECK_LAUNCH();
    if (capturing(s.get())) return;
    long long first_bad = kNoBadId;
    GN_CUDA_CHECK(cudaMemcpyAsync(&first_bad, bad, sizeof first_bad, cudaMemcpyDeviceToHost, s.get()));
    s.sync();
    if (first_bad == kNoBadId) return;
    float id = 0;
    GN_CUDA_CHECK(cudaMemcpyAsync(&id, ids + first_bad, sizeof id, cudaMemcpyDeviceToHost, s.get()));
    s.sync();
    throw Error(std::string(op) + ": token id " + std::to_string(id) + " at sample " +
                std::to_string(first_bad / steps) + ", step " + std::to_string(first_bad % steps) +
                " is not an integer in [0, " + std::to_string(range) + ")");
  }
};

}  // namespace

SequenceKernels* cuda_sequence_kernels() {
  static CudaSequenceKernels kernels;
  return &kernels;
}

}  // namespace gn::nn
