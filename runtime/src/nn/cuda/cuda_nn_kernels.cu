// CUDA layer kernels: cuDNN for convolution, batch norm, pooling and activations; cuBLAS for linear layers;
// small kernels only where no library call fits (bias broadcast and sums, global average pooling, the fused
// softmax cross-entropy, the optimizers and the gradient norm, GELU, dropout); channel concat and split are
// strided copies. Every call enqueues on the op's stream (the device worker's); the worker waits for the
// stream when the op ends. Every library return code is checked. Convolution, batch norm and global average
// pooling also take layers.h's Layout::Blocked, which on CUDA is channels-last NHWC (see "layouts" below);
// pooling windows (pool2d) are NCHW only.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_math.h"
#include "../../cuda/cuda_worker.h"
#include "../kernels.h"
#include "cuda_kernel_support.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"

namespace gn::nn {
namespace {

// cuDNN's Find measures candidate algorithms with at most this much workspace.
constexpr size_t kMaxFindWorkspace = size_t(1) << 30;

// --- cuDNN descriptors -------------------------------------------------------------------------------------

// The dimensions of a 4-d tensor as cuDNN names them: [n, c, h, w] for activations, [k, c / groups, r, s]
// for filters. Which of them varies fastest in memory is the format's business (cudnnTensorFormat_t).
struct Dims4 {
  int64_t n, c, h, w;
  int64_t count() const { return n * c * h * w; }
};

// A packed 4-d tensor in `format`: CUDNN_TENSOR_NCHW, or CUDNN_TENSOR_NHWC (channels-last: the same
// dimensions, with c varying fastest; cuDNN derives the strides).
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(int64_t n, int64_t c, int64_t h, int64_t w, cudnnDataType_t type = CUDNN_DATA_FLOAT,
             cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
    GN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    const cudnnStatus_t st = cudnnSetTensor4dDescriptor(d, format, type, to_int(n, "batch"),
                                                        to_int(c, "channels"), to_int(h, "height"),
                                                        to_int(w, "width"));
    if (st != CUDNN_STATUS_SUCCESS) {
      (void)cudnnDestroyTensorDescriptor(d);
      GN_CUDNN_CHECK(st);
    }
  }
  TensorDesc(const Dims4& dims, cudnnDataType_t type, cudnnTensorFormat_t format)
      : TensorDesc(dims.n, dims.c, dims.h, dims.w, type, format) {}
  ~TensorDesc() { (void)cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

// n elements as a 4-d tensor, for element-wise cuDNN calls (each dimension must fit an int).
TensorDesc flat_desc(int64_t n) {
  int64_t c = 1;
  while (n / c > INT_MAX / 2 || (n % c) != 0) ++c;  // n = (n / c) * c with both parts small enough
  return TensorDesc(n / c, c, 1, 1);
}

// Filters [k, c, r, s]: format NCHW is KCRS (our weights' own layout), NHWC is KRSC.
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(const Dims4& dims, cudnnDataType_t type, cudnnTensorFormat_t format) {
    GN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    const cudnnStatus_t st =
        cudnnSetFilter4dDescriptor(d, type, format, to_int(dims.n, "filters"), to_int(dims.c, "channels"),
                                   to_int(dims.h, "kernel"), to_int(dims.w, "kernel"));
    if (st != CUDNN_STATUS_SUCCESS) {
      (void)cudnnDestroyFilterDescriptor(d);
      GN_CUDNN_CHECK(st);
    }
  }
  ~FilterDesc() { (void)cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

// How a convolution runs in each Precision. fp32 and tf32 read the float32 tensors as they are: FMA math keeps
// full fp32, default math lets cuDNN use TF32 tensor cores. bf16 and fp16 run on copies of the operands
// rounded to that type (HalfOperand), with float32 accumulation (cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16
// configurations) and tensor-core math, and the result is widened back to float32.
struct ConvMath {
  explicit ConvMath(Precision p)
      : precision(p),
        data(p == Precision::Bf16   ? CUDNN_DATA_BFLOAT16
             : p == Precision::Fp16 ? CUDNN_DATA_HALF
                                    : CUDNN_DATA_FLOAT),
        math(p == Precision::Fp32 ? CUDNN_FMA_MATH
             : p == Precision::Tf32 ? CUDNN_DEFAULT_MATH
                                    : CUDNN_TENSOR_OP_MATH) {}
  bool half() const { return data != CUDNN_DATA_FLOAT; }
  Precision precision;
  cudnnDataType_t data;
  cudnnMathType_t math;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(int64_t pad, int64_t stride, int64_t groups, const ConvMath& m) {
    GN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    // Float32 accumulation in every precision.
    cudnnStatus_t st = cudnnSetConvolution2dDescriptor(d, to_int(pad, "padding"), to_int(pad, "padding"),
                                                       to_int(stride, "stride"), to_int(stride, "stride"), 1,
                                                       1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    // The filter descriptor then holds C / groups input channels per filter.
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionGroupCount(d, to_int(groups, "groups"));
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionMathType(d, m.math);
    if (st != CUDNN_STATUS_SUCCESS) {
      (void)cudnnDestroyConvolutionDescriptor(d);
      GN_CUDNN_CHECK(st);
    }
  }
  ~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// A failed cuDNN batch-norm call as the op's error, naming the configuration: the legacy batch-norm API may
// have no kernel for some (NHWC descriptors among them), and "CUDNN_STATUS_NOT_SUPPORTED" alone does not say
// which.
void check_bn(cudnnStatus_t st, const char* call, const BnShape& sh, cudnnTensorFormat_t format) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  throw BackendError(std::string(call) + " failed for batch norm n=" + std::to_string(sh.n) + " c=" +
                     std::to_string(sh.c) + " hw=" + std::to_string(sh.hw) +
                     (format == CUDNN_TENSOR_NHWC ? " NHWC" : " NCHW") + ": " + cudnnGetErrorString(st) +
                     (st == CUDNN_STATUS_NOT_SUPPORTED ? " (cuDNN has no kernel for this configuration)" : ""));
}

struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  explicit PoolDesc(const PoolShape& s) {
    GN_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d));
    const cudnnPoolingMode_t mode = s.kind == PoolKind::Max ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                            : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    const int k = to_int(s.kernel, "window"), p = to_int(s.pad, "padding"), st = to_int(s.stride, "stride");
    const cudnnStatus_t rc =
        cudnnSetPooling2dDescriptor(d, mode, CUDNN_NOT_PROPAGATE_NAN, k, k, p, p, st, st);
    if (rc != CUDNN_STATUS_SUCCESS) {
      (void)cudnnDestroyPoolingDescriptor(d);
      GN_CUDNN_CHECK(rc);
    }
  }
  ~PoolDesc() { (void)cudnnDestroyPoolingDescriptor(d); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
};

// cuDNN's mode for the activations it has; GELU has none in the legacy API and runs as gelu_*_kernel.
cudnnActivationMode_t cudnn_mode(Activation kind) {
  switch (kind) {
    case Activation::Relu:
      return CUDNN_ACTIVATION_RELU;
    case Activation::Sigmoid:
      return CUDNN_ACTIVATION_SIGMOID;
    case Activation::Tanh:
      return CUDNN_ACTIVATION_TANH;
    case Activation::Gelu:
      break;
  }
  throw Error(std::string("cuDNN has no activation mode for ") + activation_name(kind));
}

struct ActDesc {
  cudnnActivationDescriptor_t d = nullptr;
  explicit ActDesc(Activation kind) {
    const cudnnActivationMode_t mode = cudnn_mode(kind);
    GN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&d));
    const cudnnStatus_t rc = cudnnSetActivationDescriptor(d, mode, CUDNN_NOT_PROPAGATE_NAN, 0.0);
    if (rc != CUDNN_STATUS_SUCCESS) {
      (void)cudnnDestroyActivationDescriptor(d);
      GN_CUDNN_CHECK(rc);
    }
  }
  ~ActDesc() { (void)cudnnDestroyActivationDescriptor(d); }
  ActDesc(const ActDesc&) = delete;
  ActDesc& operator=(const ActDesc&) = delete;
};

// --- convolution algorithms: found once per shape ----------------------------------------------------------

enum class Pass { Forward, BackwardData, BackwardFilter };

using AlgoKey = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int, int>;

struct Algo {
  int algo = 0;
  size_t workspace = 0;
  // What Find measured it with. Outside fp32 it goes on the descriptor before running, as cuDNN asks; in
  // fp32 the descriptor keeps FMA math so that nothing can switch to TF32.
  cudnnMathType_t math = CUDNN_FMA_MATH;
};

std::mutex g_algo_mutex;
std::map<AlgoKey, Algo> g_algos;

// `format` is the one the convolution runs in (ConvFormats::conv): an NHWC and an NCHW convolution of one
// shape are different problems to cuDNN.
AlgoKey algo_key(int device, Pass pass, const ConvShape& s, Precision p, cudnnTensorFormat_t format) {
  return {device, static_cast<int>(pass), s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.stride, s.pad, s.groups,
          static_cast<int>(p), static_cast<int>(format)};
}

// The math a found algorithm runs with: Find's own outside fp32, FMA in fp32.
void set_algo_math(const ConvDesc& cd, const ConvMath& m, const Algo& a) {
  if (m.precision != Precision::Fp32) GN_CUDNN_CHECK(cudnnSetConvolutionMathType(cd.d, a.math));
}

bool cached_algo(const AlgoKey& key, Algo& out) {
  std::lock_guard lock(g_algo_mutex);
  auto it = g_algos.find(key);
  if (it == g_algos.end()) return false;
  out = it->second;
  return true;
}

void store_algo(const AlgoKey& key, Algo a) {
  std::lock_guard lock(g_algo_mutex);
  g_algos[key] = a;
}

// The largest workspace any candidate asks for, capped, that the allocator can give: Find then measures every
// algorithm that fits. When the allocator refuses, Find runs with less and only considers what fits.
template <class SizeOf>
size_t find_workspace_bytes(int algo_count, SizeOf size_of) {
  size_t most = 0;
  for (int a = 0; a < algo_count; ++a) {
    size_t bytes = 0;
    if (size_of(a, &bytes) == CUDNN_STATUS_SUCCESS) most = std::max(most, bytes);
  }
  return std::min(most, kMaxFindWorkspace);
}

// The problem a key stands for, for messages: "n=8 c=3 h=32 w=32 k=16 r=3 s=3 stride=1 pad=1 groups=1 fp32
// NHWC".
std::string describe_key(const AlgoKey& key) {
  const auto [device, pass, n, c, h, w, k, r, s, stride, pad, groups, precision, format] = key;
  (void)device, (void)pass;
  return "n=" + std::to_string(n) + " c=" + std::to_string(c) + " h=" + std::to_string(h) + " w=" +
         std::to_string(w) + " k=" + std::to_string(k) + " r=" + std::to_string(r) + " s=" + std::to_string(s) +
         " stride=" + std::to_string(stride) + " pad=" + std::to_string(pad) + " groups=" + std::to_string(groups) +
         " " + precision_name(static_cast<Precision>(precision)) +
         (format == CUDNN_TENSOR_NHWC ? " NHWC" : " NCHW");
}

// The fastest result that succeeded within the workspace. When none did, cuDNN has no kernel for this
// configuration (NHWC float32 under FMA math, for one, may have none): the error names the configuration and
// what cuDNN answered for each algorithm, so that it reads as "not supported here", not as a crash.
template <class Perf>
Algo pick(const Perf* results, int count, size_t workspace_limit, const char* what, const AlgoKey& key) {
  for (int i = 0; i < count; ++i)
    if (results[i].status == CUDNN_STATUS_SUCCESS && results[i].memory <= workspace_limit)
      return {static_cast<int>(results[i].algo), results[i].memory, results[i].mathType};
  std::string answers;
  for (int i = 0; i < count; ++i) {
    answers += (i ? "; algorithm " : "algorithm ") + std::to_string(static_cast<int>(results[i].algo)) + ": ";
    answers += results[i].status == CUDNN_STATUS_SUCCESS
                   ? "needs " + std::to_string(results[i].memory) + " B of workspace, over " +
                         std::to_string(workspace_limit)
                   : std::string(cudnnGetErrorString(results[i].status));
  }
  throw BackendError(std::string("cuDNN has no usable ") + what + " algorithm for " + describe_key(key) + " (" +
                     (count ? answers : std::string("Find returned no candidates")) + ")");
}

// Allocates a workspace for Find, halving on out-of-memory until it fits (or none at all).
void* find_alloc(Allocator& alloc, size_t& bytes) {
  while (bytes > 0) {
    try {
      return alloc.allocate(bytes, StreamKind::Compute);
    } catch (const OutOfMemoryError&) {
      bytes /= 2;
    }
  }
  return nullptr;
}

// The algorithm for `key`: the cached one, or the fastest that cuDNN's Find measures now (then cached).
// size_of(a, &bytes) is the pass's workspace query for algorithm a; find(perf, &count, ws, bytes) its FindEx.
template <class Perf, class SizeOf, class Find>
Algo find_algo(const AlgoKey& key, int algo_count, KernelContext& kc, Stream& s, SizeOf size_of, Find find,
               const char* what) {
  Algo algo;
  if (cached_algo(key, algo)) return algo;
  size_t bytes = find_workspace_bytes(algo_count, size_of);
  void* ws = find_alloc(kc.allocator, bytes);
  std::vector<Perf> perf(static_cast<size_t>(algo_count));
  int count = 0;
  const cudnnStatus_t st = find(perf.data(), &count, ws, bytes);
  (void)cudaStreamSynchronize(s.get());
  if (ws) kc.allocator.deallocate(ws);
  GN_CUDNN_CHECK(st);
  algo = pick(perf.data(), count, bytes, what, key);
  store_algo(key, algo);
  return algo;
}

// --- small kernels -----------------------------------------------------------------------------------------

__global__ void bias_rows_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t rows,
                                 int64_t cols) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = b[i % cols];
}

// Column sums of a [rows, cols] matrix in double, one thread per column (coalesced across the threads).
__global__ void column_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t rows,
                                  int64_t cols) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += stride) {
    double acc = 0;
    for (int64_t i = 0; i < rows; ++i) acc += x[i * cols + j];
    out[j] = static_cast<float>(acc);
  }
}

// One block per plane, a shared-memory tree in double: deterministic.
__global__ void plane_mean_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t planes,
                                  int64_t hw) {
  __shared__ double shared[kThreads];
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    double acc = 0;
    for (int64_t j = threadIdx.x; j < hw; j += blockDim.x) acc += x[p * hw + j];
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) y[p] = static_cast<float>(shared[0] / static_cast<double>(hw));
    __syncthreads();
  }
}

__global__ void plane_broadcast_kernel(const float* __restrict__ dy, float* __restrict__ dx, int64_t planes,
                                       int64_t hw) {
  const int64_t n = planes * hw, stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = dy[i / hw] * inv;
}

// The same two for NHWC x [n, hw, c] (y and dy [n, c] as before). Forward: one thread per (sample, channel),
// adjacent threads on adjacent channels (coalesced), each summing its hw values in order in double:
// deterministic, no atomics.
__global__ void nhwc_mean_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int64_t hw,
                                 int64_t c) {
  const int64_t planes = n * c, stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < planes; p += stride) {
    const float* base = x + (p / c) * hw * c + p % c;  // sample p / c, channel p % c, pixel 0
    double acc = 0;
    for (int64_t j = 0; j < hw; ++j) acc += base[j * c];
    y[p] = static_cast<float>(acc / static_cast<double>(hw));
  }
}

__global__ void nhwc_broadcast_kernel(const float* __restrict__ dy, float* __restrict__ dx, int64_t n,
                                      int64_t hw, int64_t c) {
  const int64_t total = n * hw * c, stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const float inv = 1.0f / static_cast<float>(hw);
  // Element i of dx is sample i / (hw c), channel i % c.
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    dx[i] = dy[(i / (hw * c)) * c + i % c] * inv;
}

// (::exp and ::log: inside gn, plain exp would find gn::exp on tensors.)
// The whole batch in one block: each thread takes rows, the block sums loss and hits in double in a fixed
// order, so the result is the same on every run. `bad` gets the first invalid label's row, or keeps its fill.
// A row labelled `ignored` (NaN: none, which no label equals) counts for nothing and gets zeros;
// with scale 0 the gradient is that of the mean over the counted rows, so they are counted first.
__global__ void softmax_ce_kernel(const float* __restrict__ z, const float* __restrict__ labels, int64_t n,
                                  int64_t classes, float* __restrict__ loss, float* __restrict__ stats,
                                  float* __restrict__ dz, float scale, float smoothing, float ignored,
                                  long long* __restrict__ bad) {
  const double eps = smoothing, uniform = eps / static_cast<double>(classes);
  __shared__ double s_loss[kThreads];
  __shared__ double s_hit[kThreads];
  __shared__ double s_count[kThreads];
  double counted = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) counted += labels[i] == ignored ? 0.0 : 1.0;
  s_count[threadIdx.x] = counted;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) s_count[threadIdx.x] += s_count[threadIdx.x + s];
    __syncthreads();
  }
  const double rows = s_count[0];
  // As the CPU spells it (1.0f / float), so that a CPU and a GPU replica take bit-equal steps.
  const float g = scale != 0.0f ? scale : 1.0f / static_cast<float>(rows);
  double acc = 0, hits = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float lf = labels[i];
    if (lf == ignored) {
      if (dz)
        for (int64_t j = 0; j < classes; ++j) dz[i * classes + j] = 0.0f;
      continue;
    }
    const int64_t label = static_cast<int64_t>(lf);
    if (!(lf >= 0.0f && lf < static_cast<float>(classes)) || static_cast<float>(label) != lf) {
      atomicMin(bad, static_cast<long long>(i));
      continue;
    }
    const float* row = z + i * classes;
    float mx = row[0];
    int64_t arg = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (row[j] > mx) mx = row[j], arg = j;
    double se = 0, zsum = 0;
    for (int64_t j = 0; j < classes; ++j) {
      se += ::exp(static_cast<double>(row[j] - mx));
      zsum += row[j];
    }
    const double lse = ::log(se) + mx;
    const double nll = lse - row[label];
    // With smoothing, the uniform part of the target adds eps * (lse - mean z) = eps * mean(-log p).
    acc += eps > 0 ? (1 - eps) * nll + eps * (lse - zsum / static_cast<double>(classes)) : nll;
    hits += arg == label ? 1.0 : 0.0;
    if (dz)
      for (int64_t j = 0; j < classes; ++j) {
        const double target = (j == label ? 1.0 - eps : 0.0) + uniform;
        dz[i * classes + j] = static_cast<float>((::exp(row[j] - lse) - target) * g);
      }
  }
  s_loss[threadIdx.x] = acc;
  s_hit[threadIdx.x] = hits;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + s];
      s_hit[threadIdx.x] += s_hit[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = rows > 0 ? static_cast<float>(s_loss[0] / rows) : __int_as_float(0x7fc00000);  // NaN
    stats[0] = static_cast<float>(s_loss[0]);
    stats[1] = static_cast<float>(s_hit[0]);
  }
}

// GELU, exact form: y = x Phi(x), dy/dx = Phi(x) + x phi(x), with Phi(x) = (1 + erf(x / sqrt 2)) / 2 and
// phi the normal density. (::erff and ::expf: inside gn, plain names could find the tensor ops.)
__global__ void gelu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + ::erff(v * 0.70710678118654752f));
  }
}

__global__ void gelu_backward_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                     float* __restrict__ dx, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + ::erff(v * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * ::expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

// The same Philox draw and float comparison as the CPU's loop, so every device keeps the same elements.
__global__ void dropout_kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ mask,
                               int64_t n, float keep, float scale, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float m = philox::uniform_at(seed, static_cast<uint64_t>(i), 0.0f, 1.0f) <= keep ? scale : 0.0f;
    mask[i] = m;
    y[i] = __fmul_rn(x[i], m);
  }
}

// n rows of `row` floats from a buffer whose rows are `src_row` floats apart into one whose rows are
// `dst_row` apart: one 2-d copy on the stream.
// The optimizer updates of optim.h with explicit round-to-nearest operations in the CPU loop's order, so
// that no FMA contraction makes a GPU replica's step differ from a CPU replica's in the last bit. One thread
// per element, grid-stride; launched per tensor.
__global__ void sgd_kernel(OptimizerTensor t, const OptimizerScalars* __restrict__ scalars,
                           const float* __restrict__ clip) {
  const OptimizerScalars s = *scalars;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const float coef = clip ? clip[1] : 1.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.n; i += stride) {
    const float p = t.param[i];
    const float g = clip ? __fmul_rn(t.grad[i], coef) : t.grad[i];
    float d = __fadd_rn(g, __fmul_rn(s.weight_decay, p));
    if (t.a) {
      const float buf = t.fresh ? d : __fadd_rn(__fmul_rn(s.momentum, t.a[i]), __fmul_rn(s.keep, d));
      t.a[i] = buf;
      d = s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, buf)) : buf;
    }
    t.param[i] = __fsub_rn(p, __fmul_rn(s.lr, d));
  }
}

__global__ void adam_kernel(OptimizerTensor t, const OptimizerScalars* __restrict__ scalars,
                            const float* __restrict__ clip) {
  const OptimizerScalars s = *scalars;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const float coef = clip ? clip[1] : 1.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.n; i += stride) {
    float p = __fmul_rn(t.param[i], s.decay);
    float g = clip ? __fmul_rn(t.grad[i], coef) : t.grad[i];
    if (s.weight_decay != 0) g = __fadd_rn(g, __fmul_rn(s.weight_decay, p));
    const float m1 = __fadd_rn(__fmul_rn(s.beta1, t.fresh ? 0.0f : t.a[i]), __fmul_rn(s.one_minus_beta1, g));
    const float m2 =
        __fadd_rn(__fmul_rn(s.beta2, t.fresh ? 0.0f : t.b[i]), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(m2), s.bias2_sqrt), s.eps);
    p = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m1, denom)));
    t.a[i] = m1;
    t.b[i] = m2;
    t.param[i] = p;
  }
}

// grad_clip_coefficient's chunk sums in kernels.h's order: one block of kNormLanes threads per chunk, thread
// l summing lane l in double, then the same pairwise tree as the CPU's. Deterministic: no atomics.
__global__ void chunk_sumsq_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partial) {
  __shared__ double lanes[kNormLanes];
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const float* base = x + c * kNormChunk;
    const int64_t len = n - c * kNormChunk < kNormChunk ? n - c * kNormChunk : kNormChunk;
    double acc = 0;
    for (int64_t j = threadIdx.x; j < len; j += kNormLanes) {
      const double v = base[j];
      acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = kNormLanes / 2; stride > 0; stride >>= 1) {
      if (static_cast<int>(threadIdx.x) < stride)
        lanes[threadIdx.x] = __dadd_rn(lanes[threadIdx.x], lanes[threadIdx.x + stride]);
      __syncthreads();
    }
    if (threadIdx.x == 0) partial[c] = lanes[0];
    __syncthreads();
  }
}

// The chunks' sums in order by one thread (a few thousand at most), then the norm and torch's clip factor.
__global__ void clip_finish_kernel(const double* __restrict__ partial, int64_t count, float max_norm,
                                   float* __restrict__ out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0;
  for (int64_t i = 0; i < count; ++i) total = __dadd_rn(total, partial[i]);
  const float norm = __double2float_rn(__dsqrt_rn(total));
  const float q = __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f));
  out[0] = norm;
  out[1] = q > 1.0f ? 1.0f : q;  // torch's clamp(max=1): a NaN norm gives a NaN factor, as there
}

// Float32 to bf16 / fp16 (round to nearest even) and back, for the convolutions' half-precision operands.
__device__ __forceinline__ void narrow_to(float v, __nv_bfloat16& out) {
  out = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void narrow_to(float v, __half& out) {
  out = __float2half_rn(v);
}
__device__ __forceinline__ float widen_from(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float widen_from(__half v) {
  return __half2float(v);
}

template <class T>
__global__ void narrow_kernel(const float* __restrict__ x, T* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    narrow_to(x[i], y[i]);
}

template <class T>
__global__ void widen_kernel(const T* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = widen_from(x[i]);
}

// n floats rounded into `type` (bf16 or half) at y, and back.
void narrow(const float* x, void* y, int64_t n, cudnnDataType_t type, cudaStream_t stream) {
  if (n == 0) return;
  if (type == CUDNN_DATA_BFLOAT16)
    narrow_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y), n);
  else
    narrow_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<__half*>(y), n);
  GN_CUDA_CHECK_LAUNCH();
}

void widen(const void* x, float* y, int64_t n, cudnnDataType_t type, cudaStream_t stream) {
  if (n == 0) return;
  if (type == CUDNN_DATA_BFLOAT16)
    widen_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), y, n);
  else
    widen_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __half*>(x), y, n);
  GN_CUDA_CHECK_LAUNCH();
}

// The activations on CUDA are float32 (bfloat16 storage is the CPU's, in its blocked layout): a bf16 tensor
// reaching a CUDA kernel is a routing error, said as one rather than read as floats.
void need_float32(bool is_float32, const char* what) {
  if (!is_float32) throw Error(std::string(what) + " on CUDA takes float32 activations, not bfloat16");
}

// --- layouts ---------------------------------------------------------------------------------------------
//
// An activation's channel block (kernels.h) is 1 for NCHW; on CUDA the only other block layers.cpp hands out
// is the channel count, [N, C / C = 1, H, W, C]: NHWC, which cuDNN describes with CUDNN_TENSOR_NHWC.
//
// Convolutions run in one format for every operand, filters included (ConvFormats): NHWC when either
// activation is NHWC, NCHW otherwise. What this relies on in cuDNN's documentation (legacy convolution API,
// cudnn_cnn library; cudnn_ops for cudnnTransformTensor):
//   - cudnnSetFilter4dDescriptor takes a format: CUDNN_TENSOR_NCHW means the filter is laid out KCRS,
//     CUDNN_TENSOR_NHWC means KRSC.
//   - The supported-configuration tables of cudnnConvolutionForward, cudnnConvolutionBackwardData and
//     cudnnConvolutionBackwardFilter come in two sets keyed by the filter format (wDesc / dwDesc NCHW or
//     NHWC). With an NHWC filter the data tensors (x and y, dx and dy) are NHWC and fully packed: the
//     configuration of cuDNN's NHWC tensor-core (implicit GEMM) kernels, and the one PyTorch's channels_last
//     convolutions use (it puts the weight in the input's memory format). Which algorithms accept an NCHW
//     filter with NHWC data, or mixed data formats in one call, varies by row; this code depends on none of
//     those rows: each call is NCHW throughout or NHWC throughout.
//   - cudnnTransformTensor copies a tensor into another of the same dimensions and data type but other
//     strides, "to convert a tensor with an unsupported format to a supported one". It reorders the float32
//     KCRS weights into a KRSC workspace before an NHWC convolution (and the KRSC weight gradient back into
//     KCRS), and, in the rare mixed case (an NCHW input and an NHWC output, or the other way round), the
//     activation whose format differs, so that each cuDNN convolution call sees a single format. Where both
//     formats are the same memory (one channel, or one pixel: a 1x1 filter or a depthwise filter's single
//     input channel) nothing is copied.
//   - In bf16 / fp16 the reorder happens in float32 first and the narrowing copy (narrow) is elementwise on
//     the reordered values, so cudnnTransformTensor never needs a type conversion; results are widened and
//     then reordered back the same way.
// Grouped convolutions run NCHW whatever the activations' layout (the NHWC rows of those tables are the
// dense tensor-core kernels; grouped and depthwise NHWC support varies by algorithm and version).

// The cuDNN format of a tensor of `channels` channels with channel block `block`.
cudnnTensorFormat_t layout_format(int64_t block, int64_t channels, const char* what) {
  if (block == 1) return CUDNN_TENSOR_NCHW;
  if (block == channels) return CUDNN_TENSOR_NHWC;
  throw BackendError(std::string(what) + ": a blocked layout on CUDA is NHWC, one block of all " +
                     std::to_string(channels) + " channels, not blocks of " + std::to_string(block));
}

// Whether a tensor of these dimensions lies the same in both formats: one channel, or one pixel.
bool same_memory(const Dims4& d, cudnnTensorFormat_t a, cudnnTensorFormat_t b) {
  return a == b || d.c == 1 || d.h * d.w == 1;
}

// float32 `d` in format `from` at src into format `to` at dst (which must not overlap).
void reorder(Stream& s, const Dims4& d, cudnnTensorFormat_t from, const float* src, cudnnTensorFormat_t to,
             float* dst) {
  if (d.count() == 0) return;
  TensorDesc a(d, CUDNN_DATA_FLOAT, from), b(d, CUDNN_DATA_FLOAT, to);
  const float one = 1.0f, zero = 0.0f;
  GN_CUDNN_CHECK(cudnnTransformTensor(s.cudnn(), &one, a.d, src, &zero, b.d, dst));
}

// The formats of a convolution: of its input (x, dx), of its output (y, dy), and the one it runs in.
struct ConvFormats {
  cudnnTensorFormat_t in, out, conv;
  explicit ConvFormats(const ConvShape& sh)
      : in(layout_format(sh.in_block, sh.c, "convolution input")),
        out(layout_format(sh.out_block, sh.k, "convolution output")),
        conv(sh.groups == 1 && (in == CUDNN_TENSOR_NHWC || out == CUDNN_TENSOR_NHWC) ? CUDNN_TENSOR_NHWC
                                                                                      : CUDNN_TENSOR_NCHW) {}
};

size_t float_bytes(int64_t n) {
  return static_cast<size_t>(n) * sizeof(float);
}

// A float32 operand of dimensions `d`, stored in format `have`, as a convolution in `m` running in format
// `want` reads it: the tensor itself, or a copy reordered into `want` (float32) and / or rounded to
// bf16 / fp16.
class ConvInput {
 public:
  ConvInput(KernelContext& kc, Stream& s, const ConvMath& m, const float* x, const Dims4& d,
            cudnnTensorFormat_t have, cudnnTensorFormat_t want)
      : reordered_(kc.allocator, s, same_memory(d, have, want) ? 0 : float_bytes(d.count())),
        copy_(kc.allocator, s, m.half() ? static_cast<size_t>(d.count()) * 2 : 0),
        ptr_(x) {
    const float* wide = x;
    if (reordered_.get()) {
      auto* r = static_cast<float*>(reordered_.get());
      reorder(s, d, have, x, want, r);
      wide = r;
      ptr_ = r;
    }
    if (!m.half()) return;
    narrow(wide, copy_.get(), d.count(), m.data, s.get());
    ptr_ = copy_.get();
  }
  const void* get() const { return ptr_; }

 private:
  Workspace reordered_;  // float32 in `want`, when the formats differ in memory
  Workspace copy_;       // bf16 / fp16
  const void* ptr_;
};

// Where a convolution in `m` running in format `conv` writes a float32 result of dimensions `d` stored in
// format `have`: the tensor itself, or a buffer (bf16 / fp16, and / or float32 in `conv`) that finish()
// widens and reorders into it.
class ConvOutput {
 public:
  ConvOutput(KernelContext& kc, Stream& s, const ConvMath& m, float* y, const Dims4& d,
             cudnnTensorFormat_t have, cudnnTensorFormat_t conv)
      : reordered_(kc.allocator, s, same_memory(d, have, conv) ? 0 : float_bytes(d.count())),
        narrow_(kc.allocator, s, m.half() ? static_cast<size_t>(d.count()) * 2 : 0),
        s_(s),
        type_(m.data),
        y_(y),
        d_(d),
        have_(have),
        conv_(conv) {}
  void* get() const {
    if (narrow_.get()) return narrow_.get();
    if (reordered_.get()) return reordered_.get();
    return y_;
  }
  void finish() {
    float* wide = reordered_.get() ? static_cast<float*>(reordered_.get()) : y_;
    if (narrow_.get()) widen(narrow_.get(), wide, d_.count(), type_, s_.get());
    if (reordered_.get()) reorder(s_, d_, conv_, wide, have_, y_);
  }

 private:
  Workspace reordered_;  // float32 in `conv`, when the formats differ in memory
  Workspace narrow_;     // bf16 / fp16 in `conv`
  Stream& s_;
  cudnnDataType_t type_;
  float* y_;
  Dims4 d_;
  cudnnTensorFormat_t have_, conv_;
};

// The bias of a convolution's output [n, k, oh, ow] in `format`, as cudnnAddTensor and
// cudnnConvolutionBackwardBias see it: the output itself and b as [1, k, 1, 1]. An NHWC output is the same
// memory as the NCHW tensor [n * oh * ow, k, 1, 1] (pixel-major rows of k channels), which is how it is
// described here: cuDNN's plain broadcast over packed NCHW, whatever its NHWC paths do.
Dims4 bias_view(const Dims4& d, cudnnTensorFormat_t format) {
  return format == CUDNN_TENSOR_NHWC ? Dims4{d.n * d.h * d.w, d.c, 1, 1} : d;
}
struct BiasDescs {
  TensorDesc y, b;
  BiasDescs(const Dims4& d, cudnnTensorFormat_t format)
      : y(bias_view(d, format), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW), b(1, d.c, 1, 1) {}
};

// Global average pooling's channel count when its input is NHWC (block > 1: the block is C), 0 for NCHW.
int64_t nhwc_channels(int64_t planes, int64_t block) {
  if (block == 1) return 0;
  if (block < 1 || planes % block != 0)
    throw BackendError("global average pooling: a blocked layout on CUDA is NHWC, one block of all channels; "
                       "a block of " + std::to_string(block) + " does not divide " + std::to_string(planes) +
                       " planes");
  return block;
}

// --- the kernels -------------------------------------------------------------------------------------------

class CudaNnKernels final : public NnKernels {
 public:
  void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w, const float* b,
                      float* y, KernelContext& kc) override {
    Stream s(kc);
    if (n == 0) return;
    // y = b broadcast, then y += x W^T; without a bias the product overwrites y.
    if (b) {
      bias_rows_kernel<<<blocks_for(n * out), kThreads, 0, s.get()>>>(y, b, n, out);
      GN_CUDA_CHECK_LAUNCH();
    }
    // Row-major y[n,out] is column-major y^T[out,n] = W x^T, with W read column-major as W^T (hence OP_T).
    const int ii = to_int(in, "features");
    cuda::gemm_f32(s.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, to_int(out, "features"), to_int(n, "batch"), ii, 1.0f, w,
                   ii, x, ii, b ? 1.0f : 0.0f, y, to_int(out, "features"), kc.precision);
  }

  void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w, const float* dy,
                       float* dx, float* dw, float* db, KernelContext& kc) override {
    Stream s(kc);
    const int ni = to_int(n, "batch"), ii = to_int(in, "features"), oi = to_int(out, "features");
    if (dx)  // dx^T[in,n] = W^T[in,out] dy^T[out,n]
      cuda::gemm_f32(s.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, ii, ni, oi, 1.0f, w, ii, dy, oi, 0.0f, dx, ii,
                     kc.precision);
    // dW^T[in,out] = x^T[in,n] dy[n,out]
    cuda::gemm_f32(s.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, ii, oi, ni, 1.0f, x, ii, dy, oi, 0.0f, dw, ii,
                   kc.precision);
    if (!db) return;
    column_sum_kernel<<<blocks_for(out), kThreads, 0, s.get()>>>(dy, db, n, out);
    GN_CUDA_CHECK_LAUNCH();
  }

  void conv2d_forward(const ConvShape& sh, const void* xv, const float* w, const float* b, void* yv,
                      KernelContext& kc) override {
    need_float32(sh.in_type == DType::Float32 && sh.out_type == DType::Float32, "convolution");
    const float* x = static_cast<const float*>(xv);
    float* y = static_cast<float*>(yv);
    const ConvFormats f(sh);
    Stream s(kc);
    const ConvMath m(kc.precision);
    const Dims4 xdim{sh.n, sh.c, sh.h, sh.w}, ydim{sh.n, sh.k, sh.oh, sh.ow},
        wdim{sh.k, sh.c / sh.groups, sh.r, sh.s};
    // Every operand in the convolution's format (see "layouts" above); the weights are KCRS (NCHW).
    TensorDesc xd(xdim, m.data, f.conv), yd(ydim, m.data, f.conv);
    FilterDesc wd(wdim, m.data, f.conv);
    ConvDesc cd(sh.pad, sh.stride, sh.groups, m);
    ConvInput hx(kc, s, m, x, xdim, f.in, f.conv), hw(kc, s, m, w, wdim, CUDNN_TENSOR_NCHW, f.conv);
    ConvOutput hy(kc, s, m, y, ydim, f.out, f.conv);
    const AlgoKey key = algo_key(s.device(), Pass::Forward, sh, m.precision, f.conv);
    const Algo algo = find_algo<cudnnConvolutionFwdAlgoPerf_t>(
        key, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, kc, s,
        [&](int a, size_t* out) {
          return cudnnGetConvolutionForwardWorkspaceSize(s.cudnn(), xd.d, wd.d, cd.d, yd.d,
                                                         static_cast<cudnnConvolutionFwdAlgo_t>(a), out);
        },
        [&](cudnnConvolutionFwdAlgoPerf_t* perf, int* count, void* ws, size_t bytes) {
          return cudnnFindConvolutionForwardAlgorithmEx(s.cudnn(), xd.d, hx.get(), wd.d, hw.get(), cd.d, yd.d,
                                                        hy.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, count, perf,
                                                        ws, bytes);
        },
        "forward convolution");
    set_algo_math(cd, m, algo);
    Workspace ws(kc.allocator, s, algo.workspace);
    const float one = 1.0f, zero = 0.0f;
    GN_CUDNN_CHECK(cudnnConvolutionForward(s.cudnn(), &one, xd.d, hx.get(), wd.d, hw.get(), cd.d,
                                           static_cast<cudnnConvolutionFwdAlgo_t>(algo.algo), ws.get(),
                                           ws.size(), &zero, yd.d, hy.get()));
    hy.finish();
    if (b) {  // y, in its own layout, += b
      BiasDescs bd(ydim, f.out);
      GN_CUDNN_CHECK(cudnnAddTensor(s.cudnn(), &one, bd.b.d, b, &one, bd.y.d, y));
    }
  }

  void conv2d_backward(const ConvShape& sh, const void* xv, const float* w, const void* dyv, void* dxv,
                       float* dw, float* db, KernelContext& kc) override {
    need_float32(sh.in_type == DType::Float32 && sh.out_type == DType::Float32, "convolution backward");
    const float *x = static_cast<const float*>(xv), *dy = static_cast<const float*>(dyv);
    float* dx = static_cast<float*>(dxv);
    const ConvFormats f(sh);
    Stream s(kc);
    const ConvMath m(kc.precision);
    const Dims4 xdim{sh.n, sh.c, sh.h, sh.w}, ydim{sh.n, sh.k, sh.oh, sh.ow},
        wdim{sh.k, sh.c / sh.groups, sh.r, sh.s};
    // Every operand in the convolution's format (see "layouts" above); the weights are KCRS (NCHW).
    TensorDesc xd(xdim, m.data, f.conv), yd(ydim, m.data, f.conv);
    FilterDesc wd(wdim, m.data, f.conv);
    ConvDesc cd(sh.pad, sh.stride, sh.groups, m);
    const float one = 1.0f, zero = 0.0f;
    if (db) {  // the bias gradient sums the float32 dy, in its own layout, in float32
      BiasDescs bd(ydim, f.out);
      GN_CUDNN_CHECK(cudnnConvolutionBackwardBias(s.cudnn(), &one, bd.y.d, dy, &zero, bd.b.d, db));
    }
    ConvInput hdy(kc, s, m, dy, ydim, f.out, f.conv);

    const AlgoKey fkey = algo_key(s.device(), Pass::BackwardFilter, sh, m.precision, f.conv);
    {
      ConvInput hx(kc, s, m, x, xdim, f.in, f.conv);
      ConvOutput hdw(kc, s, m, dw, wdim, CUDNN_TENSOR_NCHW, f.conv);
      const Algo falgo = find_algo<cudnnConvolutionBwdFilterAlgoPerf_t>(
          fkey, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, kc, s,
          [&](int a, size_t* out) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                s.cudnn(), xd.d, yd.d, cd.d, wd.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), out);
          },
          [&](cudnnConvolutionBwdFilterAlgoPerf_t* perf, int* count, void* ws, size_t bytes) {
            return cudnnFindConvolutionBackwardFilterAlgorithmEx(s.cudnn(), xd.d, hx.get(), yd.d, hdy.get(), cd.d,
                                                                 wd.d, hdw.get(),
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, count,
                                                                 perf, ws, bytes);
          },
          "backward-filter convolution");
      set_algo_math(cd, m, falgo);
      Workspace ws(kc.allocator, s, falgo.workspace);
      GN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(s.cudnn(), &one, xd.d, hx.get(), yd.d, hdy.get(), cd.d,
                                                    static_cast<cudnnConvolutionBwdFilterAlgo_t>(falgo.algo),
                                                    ws.get(), ws.size(), &zero, wd.d, hdw.get()));
      hdw.finish();
    }
    if (!dx) return;
    ConvInput hw(kc, s, m, w, wdim, CUDNN_TENSOR_NCHW, f.conv);
    ConvOutput hdx(kc, s, m, dx, xdim, f.in, f.conv);
    const AlgoKey dkey = algo_key(s.device(), Pass::BackwardData, sh, m.precision, f.conv);
    const Algo dalgo = find_algo<cudnnConvolutionBwdDataAlgoPerf_t>(
        dkey, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, kc, s,
        [&](int a, size_t* out) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(
              s.cudnn(), wd.d, yd.d, cd.d, xd.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(a), out);
        },
        [&](cudnnConvolutionBwdDataAlgoPerf_t* perf, int* count, void* ws, size_t bytes) {
          return cudnnFindConvolutionBackwardDataAlgorithmEx(s.cudnn(), wd.d, hw.get(), yd.d, hdy.get(), cd.d, xd.d,
                                                             hdx.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, count,
                                                             perf, ws, bytes);
        },
        "backward-data convolution");
    set_algo_math(cd, m, dalgo);
    Workspace ws(kc.allocator, s, dalgo.workspace);
    GN_CUDNN_CHECK(cudnnConvolutionBackwardData(s.cudnn(), &one, wd.d, hw.get(), yd.d, hdy.get(), cd.d,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(dalgo.algo),
                                                ws.get(), ws.size(), &zero, xd.d, hdx.get()));
    hdx.finish();
  }

  void batchnorm_forward(const BnShape& sh, const void* xv, const float* gamma, const float* beta,
                         float* running_mean, float* running_var, const void* residualv, void* yv,
                         float* save_mean, float* save_invstd, bool training, float momentum, float eps,
                         KernelContext& kc) override {
    need_float32(sh.type == DType::Float32, "batch norm");
    const float *x = static_cast<const float*>(xv), *residual = static_cast<const float*>(residualv);
    float* y = static_cast<float*>(yv);
    // x, y and the residual [N, C, HW, 1] in the activation's format (NHWC: [N, HW, C] in memory; cuDNN's
    // spatial batch norm takes NHWC descriptors). The per-channel parameters [1, C, 1, 1] are the same memory
    // in either format and keep the packed NCHW descriptor, as PyTorch's channels_last batch norm does.
    const cudnnTensorFormat_t format = layout_format(sh.block, sh.c, "batch norm");
    Stream s(kc);
    TensorDesc xd(sh.n, sh.c, sh.hw, 1, CUDNN_DATA_FLOAT, format), pd(1, sh.c, 1, 1);
    const float one = 1.0f, zero = 0.0f;
    const double e = std::max<double>(eps, CUDNN_BN_MIN_EPSILON);
    // cuDNN updates the running variance with the unbiased batch variance, as PyTorch does.
    if (training)
      check_bn(cudnnBatchNormalizationForwardTraining(s.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x,
                                                      xd.d, y, pd.d, gamma, beta, momentum, running_mean,
                                                      running_var, e, save_mean, save_invstd),
               "cudnnBatchNormalizationForwardTraining", sh, format);
    else
      check_bn(cudnnBatchNormalizationForwardInference(s.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x,
                                                       xd.d, y, pd.d, gamma, beta, running_mean, running_var, e),
               "cudnnBatchNormalizationForwardInference", sh, format);
    // The fused epilogue, in place: y += residual, then ReLU. Both are elementwise on tensors of one layout,
    // so they run on the flat arrays.
    const int64_t n = sh.n * sh.c * sh.hw;
    if (residual && n > 0) {
      TensorDesc flat = flat_desc(n);
      GN_CUDNN_CHECK(cudnnAddTensor(s.cudnn(), &one, flat.d, residual, &one, flat.d, y));
    }
    if (sh.relu) activation_forward(Activation::Relu, DType::Float32, y, y, n, kc);
  }

  void batchnorm_backward(const BnShape& sh, const void* xv, const void* yv, const void* dyv,
                          const float* gamma, const float* save_mean, const float* save_invstd, void* dxv,
                          void* dresidualv, float* dgamma, float* dbeta, KernelContext& kc) override {
    need_float32(sh.type == DType::Float32, "batch norm backward");
    const float *x = static_cast<const float*>(xv), *y = static_cast<const float*>(yv),
                *dy = static_cast<const float*>(dyv);
    float *dx = static_cast<float*>(dxv), *dresidual = static_cast<float*>(dresidualv);
    const cudnnTensorFormat_t format = layout_format(sh.block, sh.c, "batch norm");  // as forward's
    Stream s(kc);
    TensorDesc xd(sh.n, sh.c, sh.hw, 1, CUDNN_DATA_FLOAT, format), pd(1, sh.c, 1, 1);
    const float one = 1.0f, zero = 0.0f;
    // The gradient past the fused ReLU goes where the residual's is wanted, or to a workspace.
    const int64_t n = sh.n * sh.c * sh.hw;
    Workspace masked(kc.allocator, s, sh.relu && !dresidual ? static_cast<size_t>(n) * sizeof(float) : 0);
    if (sh.relu) {
      float* g = dresidual ? dresidual : static_cast<float*>(masked.get());
      activation_backward(Activation::Relu, DType::Float32, nullptr, y, dy, g, n, kc);
      dy = g;
    } else if (dresidual) {
      GN_CUDA_CHECK(cudaMemcpyAsync(dresidual, dy, static_cast<size_t>(n) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, s.get()));
    }
    // cudnn_ops.h asks for the forward's epsilon here ("Same epsilon as forward pass"), clamped as forward's.
    check_bn(cudnnBatchNormalizationBackward(s.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd.d,
                                             x, xd.d, dy, xd.d, dx, pd.d, gamma, dgamma, dbeta,
                                             std::max<double>(sh.eps, CUDNN_BN_MIN_EPSILON), save_mean,
                                             save_invstd),
             "cudnnBatchNormalizationBackward", sh, format);
  }

  void activation_forward(Activation kind, DType type, const void* xv, void* yv, int64_t n,
                          KernelContext& kc) override {
    need_float32(type == DType::Float32, activation_name(kind));
    const float* x = static_cast<const float*>(xv);
    float* y = static_cast<float*>(yv);
    Stream s(kc);
    if (n == 0) return;
    if (kind == Activation::Gelu) {
      gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s.get()>>>(x, y, n);
      GN_CUDA_CHECK_LAUNCH();
      return;
    }
    TensorDesc d = flat_desc(n);
    ActDesc a(kind);
    const float one = 1.0f, zero = 0.0f;
    GN_CUDNN_CHECK(cudnnActivationForward(s.cudnn(), a.d, &one, d.d, x, &zero, d.d, y));
  }

  void activation_backward(Activation kind, DType type, const void* xv, const void* yv, const void* dyv,
                           void* dxv, int64_t n, KernelContext& kc) override {
    need_float32(type == DType::Float32, activation_name(kind));
    const float *x = static_cast<const float*>(xv), *y = static_cast<const float*>(yv),
                *dy = static_cast<const float*>(dyv);
    float* dx = static_cast<float*>(dxv);
    Stream s(kc);
    if (n == 0) return;
    if (kind == Activation::Gelu) {
      gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s.get()>>>(x, dy, dx, n);
      GN_CUDA_CHECK_LAUNCH();
      return;
    }
    TensorDesc d = flat_desc(n);
    ActDesc a(kind);
    const float one = 1.0f, zero = 0.0f;
    // These derivatives follow from y (relu: y > 0 exactly when x > 0), so y also stands in for x.
    GN_CUDNN_CHECK(cudnnActivationBackward(s.cudnn(), a.d, &one, d.d, y, d.d, dy, d.d, y, &zero, d.d, dx));
  }

  void add_bf16(int64_t, const void*, const void*, void*, KernelContext&) override {
    need_float32(false, "add");
  }

  void dropout_forward(int64_t n, const float* x, float* y, float* mask, float p, uint64_t seed,
                       KernelContext& kc) override {
    Stream s(kc);
    if (n == 0) return;
    const float keep = 1.0f - p, scale = 1.0f / keep;
    dropout_kernel<<<blocks_for(n), kThreads, 0, s.get()>>>(x, y, mask, n, keep, scale, seed);
    GN_CUDA_CHECK_LAUNCH();
  }

  void concat_rows(int64_t n, int64_t a_row, int64_t b_row, const float* a, const float* b, float* y,
                   KernelContext& kc) override {
    Stream s(kc);
    const int64_t y_row = a_row + b_row;
    copy_rows(y, y_row, a, a_row, n, a_row, s.get());
    copy_rows(y + a_row, y_row, b, b_row, n, b_row, s.get());
  }

  void split_rows(int64_t n, int64_t a_row, int64_t b_row, const float* y, float* a, float* b,
                  KernelContext& kc) override {
    Stream s(kc);
    const int64_t y_row = a_row + b_row;
    copy_rows(a, a_row, y, y_row, n, a_row, s.get());
    copy_rows(b, b_row, y + a_row, y_row, n, b_row, s.get());
  }

  void pool_forward(const PoolShape& sh, const float* x, float* y, KernelContext& kc) override {
    Stream s(kc);
    TensorDesc xd(sh.n, sh.c, sh.h, sh.w), yd(sh.n, sh.c, sh.oh, sh.ow);
    PoolDesc p(sh);
    const float one = 1.0f, zero = 0.0f;
    GN_CUDNN_CHECK(cudnnPoolingForward(s.cudnn(), p.d, &one, xd.d, x, &zero, yd.d, y));
  }

  void pool_backward(const PoolShape& sh, const float* x, const float* y, const float* dy, float* dx,
                     KernelContext& kc) override {
    Stream s(kc);
    TensorDesc xd(sh.n, sh.c, sh.h, sh.w), yd(sh.n, sh.c, sh.oh, sh.ow);
    PoolDesc p(sh);
    const float one = 1.0f, zero = 0.0f;
    GN_CUDNN_CHECK(cudnnPoolingBackward(s.cudnn(), p.d, &one, yd.d, y, yd.d, dy, xd.d, x, &zero, xd.d, dx));
  }

  // x and dx NCHW (block 1) or NHWC (block = C, so N = planes / block).
  void global_avg_pool_forward(int64_t planes, int64_t hw, int64_t block, DType type, const void* xv, float* y,
                               KernelContext& kc) override {
    need_float32(type == DType::Float32, "global average pooling");
    const float* x = static_cast<const float*>(xv);
    const int64_t c = nhwc_channels(planes, block);
    Stream s(kc);
    if (planes == 0) return;
    if (c == 0) {
      plane_mean_kernel<<<static_cast<int>(std::min<int64_t>(planes, kMaxBlocks)), kThreads, 0, s.get()>>>(
          x, y, planes, hw);
    } else {
      nhwc_mean_kernel<<<blocks_for(planes), kThreads, 0, s.get()>>>(x, y, planes / c, hw, c);
    }
    GN_CUDA_CHECK_LAUNCH();
  }

  void global_avg_pool_backward(int64_t planes, int64_t hw, int64_t block, DType type, const float* dy,
                                void* dxv, KernelContext& kc) override {
    need_float32(type == DType::Float32, "global average pooling backward");
    float* dx = static_cast<float*>(dxv);
    const int64_t c = nhwc_channels(planes, block);
    Stream s(kc);
    if (planes == 0) return;
    if (c == 0)
      plane_broadcast_kernel<<<blocks_for(planes * hw), kThreads, 0, s.get()>>>(dy, dx, planes, hw);
    else
      nhwc_broadcast_kernel<<<blocks_for(planes * hw), kThreads, 0, s.get()>>>(dy, dx, planes / c, hw, c);
    GN_CUDA_CHECK_LAUNCH();
  }

  void softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const float* labels,
                             float* loss, float* stats, float* dlogits, float grad_scale,
                             float label_smoothing, int64_t ignore_index, KernelContext& kc) override {
    Stream s(kc);
    Workspace flag(kc.allocator, s, sizeof(long long));
    auto* bad = static_cast<long long*>(flag.get());
    // Bytes of 0x7f: a row number no batch reaches, set by a memset, which a graph can capture too.
    constexpr long long none = 0x7f7f7f7f7f7f7f7fLL;
    GN_CUDA_CHECK(cudaMemsetAsync(bad, 0x7f, sizeof(long long), s.get()));
    softmax_ce_kernel<<<1, kThreads, 0, s.get()>>>(logits, labels, n, classes, loss, stats, dlogits,
                                                   grad_scale, label_smoothing,
                                                   ignore_index >= 0 ? static_cast<float>(ignore_index) : NAN,
                                                   bad);
    GN_CUDA_CHECK_LAUNCH();
    // A captured step cannot read the flag back: the trainer checks a captured step's labels on the host.
    if (capturing(s.get())) return;
    // A bad label is the op's error: read the flag back (into pageable memory, so the copy completes first).
    long long first_bad = none;
    GN_CUDA_CHECK(cudaMemcpyAsync(&first_bad, bad, sizeof first_bad, cudaMemcpyDeviceToHost, s.get()));
    s.sync();
    if (first_bad != none)
      throw Error("softmax_cross_entropy: the label at row " + std::to_string(first_bad) +
                  " is not a class index in [0, " + std::to_string(classes) + ")");
  }

  void optimizer_step(const std::vector<OptimizerTensor>& tensors, OptimizerKind kind,
                      const OptimizerScalars* scalars, const float* clip, KernelContext& kc) override {
    Stream s(kc);
    for (const OptimizerTensor& t : tensors) {
      if (t.n == 0) continue;
      if (kind == OptimizerKind::Sgd)
        sgd_kernel<<<blocks_for(t.n), kThreads, 0, s.get()>>>(t, scalars, clip);
      else
        adam_kernel<<<blocks_for(t.n), kThreads, 0, s.get()>>>(t, scalars, clip);
      GN_CUDA_CHECK_LAUNCH();
    }
  }

  void grad_clip_coefficient(const std::vector<GradSpan>& grads, float max_norm, float* out,
                             KernelContext& kc) override {
    static_assert(kNormLanes == kThreads, "one thread per lane");
    Stream s(kc);
    int64_t count = 0;
    for (const GradSpan& g : grads) count += (g.n + kNormChunk - 1) / kNormChunk;
    Workspace partial(kc.allocator, s, static_cast<size_t>(count) * sizeof(double));
    auto* sums = static_cast<double*>(partial.get());
    int64_t offset = 0;
    for (const GradSpan& g : grads) {
      const int64_t chunks = (g.n + kNormChunk - 1) / kNormChunk;
      if (chunks == 0) continue;
      chunk_sumsq_kernel<<<static_cast<int>(std::min(chunks, kMaxBlocks)), kNormLanes, 0, s.get()>>>(
          g.data, g.n, sums + offset);
      GN_CUDA_CHECK_LAUNCH();
      offset += chunks;
    }
    clip_finish_kernel<<<1, 1, 0, s.get()>>>(sums, count, max_norm, out);
    GN_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

NnKernels* cuda_nn_kernels() {
  static CudaNnKernels kernels;
  return &kernels;
}

}  // namespace gn::nn
