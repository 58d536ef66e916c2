// cuda_nn_kernels.cu's own device kernels, where no library call fits: bias broadcast and sums, global average
// pooling, the fused softmax cross-entropy, GELU, dropout, the optimizers and the gradient norm, and the
// narrowing and widening of operand copies for bf16 and fp16 products. Included by cuda_nn_kernels.cu only;
// everything is in an anonymous namespace of the including file.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstdint>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_math.h"
#include "../kernels.h"
#include "cuda_kernel_support.h"
#include "gpunodes/random.h"

namespace gn::nn {
namespace {

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

}  // namespace
}  // namespace gn::nn
