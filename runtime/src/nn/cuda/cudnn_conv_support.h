// What cuda_nn_kernels.cu's cuDNN calls stand on: RAII descriptors (tensors, filters, convolutions, pooling,
// activations) and the convolution algorithms, found once per shape with cuDNN's Find and cached. Included by
// cuda_nn_kernels.cu only, after cuda_kernel_support.h; everything is inline or in an anonymous namespace of
// the including file.
#pragma once
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "../../cuda/cuda_check.h"
#include "../kernels.h"
#include "cuda_kernel_support.h"
#include "gpunodes/errors.h"
#include "gpunodes/precision.h"

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

}  // namespace
}  // namespace gn::nn
