// CPU layer kernels. Convolutions (grouped ones too) and activations use oneDNN; linear layers OpenBLAS (as
// PyTorch does here); batch norm, pooling, dropout, channel concat, the loss and the optimizers are OpenMP
// loops, being memory-bound (batch norm in cpu_batchnorm.cpp).
//
// Convolution: oneDNN, chosen by measurement on this machine's 2-core AVX-512 EPYC (tests/bench/train_bench
// prints the table again). Forward + backward, 2 threads, ms, oneDNN vs im2col + OpenBLAS sgemm over the
// whole batch: LeNet conv1 2.5 vs 9.4, LeNet conv2 4.1 vs 8.4, ResNet stem 0.7 vs 1.6, ResNet 3x3 64->64 at
// 28^2 27.5 vs 50.0, 64->128 stride 2 15.6 vs 19.9, 256->256 at 7^2 24.3 vs 33.4, 1x1 projection 2.7 vs 2.9.
// 3x3 and 5x5 use oneDNN's direct JIT kernels in the layout it prefers (format "any": blocked nChw16c,
// reordered from and to our NCHW inside the op), which beat its GEMM path on plain NCHW by 1.5-5x; 1x1
// convolutions use that GEMM path on plain NCHW, 1.3x faster than the blocked kernel plus reorders. The one
// case where im2col wins, backward-data of a 1-channel input, never runs: a first layer's input needs no
// gradient. Callers that keep activations in the blocked layout themselves (layers.h's Layout::Blocked, which
// the built-in ResNet-18 uses from its stem to its pooling) skip those reorders, 1x1 convolutions included:
// on 2 AVX2 cores under load a ResNet-18 step's convolutions took a fifth less time without them.
//
// Under Precision::Bf16 (only where oneDNN's ISA has bf16 instructions) convolutions take bf16 source,
// weights and output gradient in the layouts oneDNN prefers, with float32 weight and bias gradients; y and dx
// are written as the caller stores them (bf16 activations in the blocked layout, float32 in NCHW), and a
// float32 operand is rounded to bf16 by the reorder that stages it. Linear layers then run oneDNN's bf16
// matmul (cpu/cpu_bf16_gemm.h) instead of OpenBLAS.
//
// The oneDNN objects (cpu_dnnl_prims.h) are made once per shape and per worker thread (each CPU device's
// worker has its own OpenMP thread count, which oneDNN bakes into its kernels), and reorders go through
// per-thread scratch.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "gpunodes/errors.h"
#include "../cpu/host_scratch.h"
#include "gpunodes/random.h"
#include "../cpu/bf16.h"
#include "../cpu/cpu_bf16_gemm.h"
#include "cpu_batchnorm.h"
#include "cpu_dnnl_prims.h"
#include "cpu_parallel.h"
#include "kernels.h"
#include "recurrent_kernels.h"

namespace gn::nn {
namespace {

using namespace onednn;

constexpr int64_t kParallelMin = kCpuParallelMin;

// Global average pooling's loops over values stored as T (float or bfloat16): a group is one sample's block
// of channels, hw pixels of `block` lanes, the means of `block` planes.
template <class T>
void plane_means(int64_t planes, int64_t hw, int64_t block, const T* x, float* y) {
  const int64_t groups = planes / block;
#pragma omp parallel for if (planes * hw > kParallelMin)
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t l = 0; l < block; ++l) {
      double acc = 0;
      for (int64_t j = 0; j < hw; ++j) acc += cpu::widen(x[(g * hw + j) * block + l]);
      y[g * block + l] = static_cast<float>(acc / static_cast<double>(hw));
    }
}

template <class T>
void spread_means(int64_t planes, int64_t hw, int64_t block, const float* dy, T* dx) {
  const float inv = 1.0f / static_cast<float>(hw);
  const int64_t groups = planes / block;
#pragma omp parallel for if (planes * hw > kParallelMin)
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < hw; ++j)
      for (int64_t l = 0; l < block; ++l) cpu::store_rounded(dx[(g * hw + j) * block + l], dy[g * block + l] * inv);
}

// --- the kernels -------------------------------------------------------------------------------------------

class CpuNnKernels final : public NnKernels {
 public:
  void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w, const float* b,
                      float* y, KernelContext& kc) override {
    if (kc.precision == Precision::Bf16) return cpu::bf16_gemm(false, true, n, out, in, x, w, b, y);
    // y = b broadcast, then y += x W^T in one sgemm; without a bias the sgemm overwrites y.
    if (b) {
#pragma omp parallel for if (n * out > kParallelMin)
      for (int64_t i = 0; i < n; ++i) std::memcpy(y + i * out, b, static_cast<size_t>(out) * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(n), i32(out), i32(in), 1.0f, x, i32(in), w,
                i32(in), b ? 1.0f : 0.0f, y, i32(out));
  }

  void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w, const float* dy,
                       float* dx, float* dw, float* db, KernelContext& kc) override {
    if (kc.precision == Precision::Bf16) {
      if (dx) cpu::bf16_gemm(false, false, n, in, out, dy, w, nullptr, dx);  // dx = dy W
      cpu::bf16_gemm(true, false, out, in, n, dy, x, nullptr, dw);          // dW = dy^T x
      if (db) cpu_recurrent_kernels().column_sums(n, out, dy, db, kc);      // float32, as in fp32
      return;
    }
    if (dx)  // dx = dy W
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(n), i32(in), i32(out), 1.0f, dy, i32(out), w,
                  i32(in), 0.0f, dx, i32(in));
    // dW = dy^T x
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(out), i32(in), i32(n), 1.0f, dy, i32(out), x,
                i32(in), 0.0f, dw, i32(in));
    // db = column sums of dy: the recurrent kernels' vectorised sums (float groups of rows added in double).
    // A scalar loop in double took about 2 ms of a ViT training step (6,400 rows per product).
    if (db) cpu_recurrent_kernels().column_sums(n, out, dy, db, kc);
  }

  void conv2d_forward(const ConvShape& s, const void* x, const float* w, const float* b, void* y,
                      KernelContext& kc) override {
    kc.op.check_cancelled();
    try {
      ConvPrims& p = conv_prims(s, kc.precision);
      if (p.forward_product) return p.forward_product->forward(s, x, w, s.bias ? b : nullptr, y);
      auto& t = tdnnl();
      memory src = p.f_src.bind(const_cast<void*>(x));
      memory wei = p.f_wei.bind(const_cast<float*>(w));
      memory dst = p.f_dst.bind(y);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                           {DNNL_ARG_WEIGHTS, wei},
                                           {DNNL_ARG_DST, dst},
                                           {DNNL_ARG_SCRATCHPAD, scratchpad(p.fwd_pd.scratchpad_desc())}};
      if (s.bias) args.emplace(DNNL_ARG_BIAS, memory(p.bias_desc(), t.engine, const_cast<float*>(b)));
      p.fwd.execute(t.stream, args);
      p.f_dst.finish(dst, y);
      t.stream.wait();
    } catch (const dnnl::error& e) {
      rethrow_dnnl("convolution forward", e);
    }
  }

  void conv2d_backward(const ConvShape& s, const void* x, const float* w, const void* dy, void* dx,
                       float* dw, float* db, KernelContext& kc) override {
    kc.op.check_cancelled();
    try {
      ConvPrims& p = conv_prims(s, kc.precision);
      p.make_backward(s);
      auto& t = tdnnl();
      std::optional<memory> ddst;  // dy as backward weights read it
      if (p.weight_product) {
        p.weight_product->weight_gradient(s, x, dy, dw, db);
      } else {
        memory src = p.bw_src.bind(const_cast<void*>(x));
        ddst = p.bw_diff_dst.bind(const_cast<void*>(dy));
        memory dwei = p.bw_diff_wei.bind(dw);
        std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                             {DNNL_ARG_DIFF_DST, *ddst},
                                             {DNNL_ARG_DIFF_WEIGHTS, dwei},
                                             {DNNL_ARG_SCRATCHPAD, scratchpad(p.bw_pd.scratchpad_desc())}};
        if (s.bias) args.emplace(DNNL_ARG_DIFF_BIAS, memory(p.bias_desc(), t.engine, db));
        p.bw.execute(t.stream, args);
        p.bw_diff_wei.finish(dwei, dw);
      }
      if (dx && p.data_product) {
        kc.op.check_cancelled();
        p.data_product->data_gradient(s, dy, w, dx);
      } else if (dx) {
        kc.op.check_cancelled();
        // Both backwards read dy in the same layout as a rule (bf16 NHWC on AMX): staged once for both.
        memory ddst2 = ddst && p.bd_diff_dst.prim_desc == p.bw_diff_dst.prim_desc
                           ? *ddst
                           : p.bd_diff_dst.bind(const_cast<void*>(dy));
        memory wei = p.bd_wei.bind(const_cast<float*>(w));
        memory dsrc = p.bd_diff_src.bind(dx);
        p.bd.execute(t.stream, {{DNNL_ARG_DIFF_DST, ddst2},
                                {DNNL_ARG_WEIGHTS, wei},
                                {DNNL_ARG_DIFF_SRC, dsrc},
                                {DNNL_ARG_SCRATCHPAD, scratchpad(p.bd_pd.scratchpad_desc())}});
        p.bd_diff_src.finish(dsrc, dx);
      }
      t.stream.wait();
    } catch (const dnnl::error& e) {
      rethrow_dnnl("convolution backward", e);
    }
  }

  void batchnorm_forward(const BnShape& s, const void* x, const float* gamma, const float* beta,
                         float* running_mean, float* running_var, const void* residual, void* y,
                         float* save_mean, float* save_invstd, bool training, float momentum, float eps,
                         KernelContext&) override {
    cpu_batchnorm_forward(s, {x, gamma, beta, residual, running_mean, running_var, y, save_mean, save_invstd,
                              training, momentum, eps});
  }

  void batchnorm_backward(const BnShape& s, const void* x, const void* y, const void* dy,
                          const float* gamma, const float* save_mean, const float* save_invstd, void* dx,
                          void* dresidual, float* dgamma, float* dbeta, KernelContext&) override {
    cpu_batchnorm_backward(s, {x, y, dy, gamma, save_mean, save_invstd, dx, dresidual, dgamma, dbeta});
  }

  void activation_forward(Activation kind, DType type, const void* x, void* y, int64_t n,
                          KernelContext&) override {
    if (n == 0) return;
    try {
      EltPrims& p = elt_prims(kind, n, type);
      auto& t = tdnnl();
      memory src(p.desc, t.engine, const_cast<void*>(x)), dst(p.desc, t.engine, y);
      p.fwd.execute(t.stream, {{DNNL_ARG_SRC, src},
                               {DNNL_ARG_DST, dst},
                               {DNNL_ARG_SCRATCHPAD, scratchpad(p.fwd_pd.scratchpad_desc())}});
      t.stream.wait();
    } catch (const dnnl::error& e) {
      rethrow_dnnl("eltwise forward", e);
    }
  }

  void activation_backward(Activation kind, DType type, const void* x, const void* y, const void* dy, void* dx,
                           int64_t n, KernelContext&) override {
    if (n == 0) return;
    try {
      EltPrims& p = elt_prims(kind, n, type);
      auto& t = tdnnl();
      const int value_arg = p.backward_from_src ? DNNL_ARG_SRC : DNNL_ARG_DST;
      memory value(p.desc, t.engine, const_cast<void*>(p.backward_from_src ? x : y)),
          ddst(p.desc, t.engine, const_cast<void*>(dy)), dsrc(p.desc, t.engine, dx);
      p.bwd.execute(t.stream, {{value_arg, value},
                               {DNNL_ARG_DIFF_DST, ddst},
                               {DNNL_ARG_DIFF_SRC, dsrc},
                               {DNNL_ARG_SCRATCHPAD, scratchpad(p.bwd_pd.scratchpad_desc())}});
      t.stream.wait();
    } catch (const dnnl::error& e) {
      rethrow_dnnl("eltwise backward", e);
    }
  }

  void add_bf16(int64_t n, const void* a, const void* b, void* y, KernelContext&) override {
    const auto *pa = static_cast<const uint16_t*>(a), *pb = static_cast<const uint16_t*>(b);
    auto* py = static_cast<uint16_t*>(y);
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) py[i] = cpu::float_to_bf16(cpu::bf16_to_float(pa[i]) + cpu::bf16_to_float(pb[i]));
  }

  void dropout_forward(int64_t n, const float* x, float* y, float* mask, float p, uint64_t seed,
                       KernelContext&) override {
    // The same comparison in float as the CUDA kernel, so both keep the same elements.
    const float keep = 1.0f - p, scale = 1.0f / keep;
    // Philox costs tens of operations per element: smaller loops than the memory-bound ones pay for a team.
#pragma omp parallel for if (n > kParallelMin / 8)
    for (int64_t i = 0; i < n; ++i) {
      const float m = philox::uniform_at(seed, static_cast<uint64_t>(i), 0.0f, 1.0f) <= keep ? scale : 0.0f;
      mask[i] = m;
      y[i] = x[i] * m;
    }
  }

  void concat_rows(int64_t n, int64_t a_row, int64_t b_row, const float* a, const float* b, float* y,
                   KernelContext&) override {
    const int64_t y_row = a_row + b_row;
#pragma omp parallel for if (n * y_row > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      copy_floats(y + i * y_row, a + i * a_row, a_row);
      copy_floats(y + i * y_row + a_row, b + i * b_row, b_row);
    }
  }

  void split_rows(int64_t n, int64_t a_row, int64_t b_row, const float* y, float* a, float* b,
                  KernelContext&) override {
    const int64_t y_row = a_row + b_row;
#pragma omp parallel for if (n * y_row > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      copy_floats(a + i * a_row, y + i * y_row, a_row);
      copy_floats(b + i * b_row, y + i * y_row + a_row, b_row);
    }
  }

  void pool_forward(const PoolShape& s, const float* x, float* y, KernelContext&) override {
    const int64_t planes = s.n * s.c;
    if (is_2x2(s)) {
      // LeNet's pooling: non-overlapping 2x2 windows, written out so the compiler can vectorise it.
      const bool is_max = s.kind == PoolKind::Max;
#pragma omp parallel for if (planes * s.h * s.w > kParallelMin)
      for (int64_t pl = 0; pl < planes; ++pl)
        for (int64_t oy = 0; oy < s.oh; ++oy) {
          const float* r0 = x + (pl * s.h + 2 * oy) * s.w;
          const float* r1 = r0 + s.w;
          float* out = y + (pl * s.oh + oy) * s.ow;
          if (is_max) {
            for (int64_t ox = 0; ox < s.ow; ++ox)
              out[ox] = std::max(std::max(r0[2 * ox], r0[2 * ox + 1]), std::max(r1[2 * ox], r1[2 * ox + 1]));
          } else {
            for (int64_t ox = 0; ox < s.ow; ++ox)
              out[ox] = ((r0[2 * ox] + r0[2 * ox + 1]) + (r1[2 * ox] + r1[2 * ox + 1])) * 0.25f;
          }
        }
      return;
    }
    const float inv_area = 1.0f / static_cast<float>(s.kernel * s.kernel);
    const bool is_max = s.kind == PoolKind::Max;
#pragma omp parallel for if (planes * s.h * s.w > kParallelMin)
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* in = x + pl * s.h * s.w;
      float* out = y + pl * s.oh * s.ow;
      for (int64_t oy = 0; oy < s.oh; ++oy) {
        const int64_t y0 = oy * s.stride - s.pad;
        const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min<int64_t>(y0 + s.kernel, s.h);
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          const int64_t x0 = ox * s.stride - s.pad;
          const int64_t xa = std::max<int64_t>(x0, 0), xb = std::min<int64_t>(x0 + s.kernel, s.w);
          float acc = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
          for (int64_t iy = ya; iy < yb; ++iy)
            for (int64_t ix = xa; ix < xb; ++ix) {
              const float v = in[iy * s.w + ix];
              acc = is_max ? (v > acc ? v : acc) : acc + v;
            }
          out[oy * s.ow + ox] = is_max ? acc : acc * inv_area;
        }
      }
    }
  }

  void pool_backward(const PoolShape& s, const float* x, const float* y, const float* dy, float* dx,
                     KernelContext&) override {
    const int64_t planes = s.n * s.c;
    if (is_2x2(s) && s.kind == PoolKind::Avg) {
#pragma omp parallel for if (planes * s.h * s.w > kParallelMin)
      for (int64_t pl = 0; pl < planes; ++pl) {
        float* d = dx + pl * s.h * s.w;
        // Rows or columns beyond the last window (odd sizes) get no gradient.
        if (s.h != 2 * s.oh || s.w != 2 * s.ow) std::fill(d, d + s.h * s.w, 0.0f);
        for (int64_t oy = 0; oy < s.oh; ++oy) {
          const float* g = dy + (pl * s.oh + oy) * s.ow;
          float* d0 = d + 2 * oy * s.w;
          float* d1 = d0 + s.w;
          for (int64_t ox = 0; ox < s.ow; ++ox) {
            const float v = g[ox] * 0.25f;
            d0[2 * ox] = d0[2 * ox + 1] = d1[2 * ox] = d1[2 * ox + 1] = v;
          }
        }
      }
      return;
    }
    const float inv_area = 1.0f / static_cast<float>(s.kernel * s.kernel);
    const bool is_max = s.kind == PoolKind::Max;
#pragma omp parallel for if (planes * s.h * s.w > kParallelMin)
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* in = x + pl * s.h * s.w;
      const float* out = y + pl * s.oh * s.ow;
      const float* g = dy + pl * s.oh * s.ow;
      float* d = dx + pl * s.h * s.w;
      std::fill(d, d + s.h * s.w, 0.0f);
      for (int64_t oy = 0; oy < s.oh; ++oy) {
        const int64_t y0 = oy * s.stride - s.pad;
        const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min<int64_t>(y0 + s.kernel, s.h);
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          const int64_t x0 = ox * s.stride - s.pad;
          const int64_t xa = std::max<int64_t>(x0, 0), xb = std::min<int64_t>(x0 + s.kernel, s.w);
          const float gv = g[oy * s.ow + ox];
          if (is_max) {
            // The first cell equal to the window's maximum gets the gradient.
            const float mv = out[oy * s.ow + ox];
            bool done = false;
            for (int64_t iy = ya; iy < yb && !done; ++iy)
              for (int64_t ix = xa; ix < xb; ++ix)
                if (in[iy * s.w + ix] == mv) {
                  d[iy * s.w + ix] += gv;
                  done = true;
                  break;
                }
          } else {
            const float v = gv * inv_area;
            for (int64_t iy = ya; iy < yb; ++iy)
              for (int64_t ix = xa; ix < xb; ++ix) d[iy * s.w + ix] += v;
          }
        }
      }
    }
  }

  void global_avg_pool_forward(int64_t planes, int64_t hw, int64_t block, DType type, const void* x, float* y,
                               KernelContext&) override {
    if (type == DType::BFloat16)
      plane_means(planes, hw, block, static_cast<const uint16_t*>(x), y);
    else
      plane_means(planes, hw, block, static_cast<const float*>(x), y);
  }

  void global_avg_pool_backward(int64_t planes, int64_t hw, int64_t block, DType type, const float* dy, void* dx,
                                KernelContext&) override {
    if (type == DType::BFloat16)
      spread_means(planes, hw, block, dy, static_cast<uint16_t*>(dx));
    else
      spread_means(planes, hw, block, dy, static_cast<float*>(dx));
  }

  void softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const float* labels,
                             float* loss, float* stats, float* dlogits, float grad_scale,
                             float label_smoothing, int64_t ignore_index, KernelContext&) override {
    const float ignored = ignore_index >= 0 ? static_cast<float>(ignore_index) : NAN;  // NaN equals no label
    // Labels are checked before anything is written, so a bad label leaves no half-made gradient behind.
    int64_t counted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float l = labels[i];
      if (l == ignored) continue;
      if (!(l >= 0 && l < static_cast<float>(classes)) || l != std::floor(l))
        throw Error("softmax_cross_entropy: label " + std::to_string(l) + " at row " + std::to_string(i) +
                    " is not a class index in [0, " + std::to_string(classes) + ")");
      ++counted;
    }
    const float scale = grad_scale != 0 ? grad_scale : 1.0f / static_cast<float>(counted);
    const double eps = label_smoothing, uniform = eps / static_cast<double>(classes);
    double loss_sum = 0, correct = 0;
#pragma omp parallel for reduction(+ : loss_sum, correct) if (n * classes > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float* z = logits + i * classes;
      if (labels[i] == ignored) {
        if (dlogits) std::fill(dlogits + i * classes, dlogits + (i + 1) * classes, 0.0f);
        continue;
      }
      const int64_t label = static_cast<int64_t>(labels[i]);
      int64_t arg = 0;
      float mx = z[0];
      for (int64_t j = 1; j < classes; ++j)
        if (z[j] > mx) mx = z[j], arg = j;
      double se = 0, zsum = 0;
      for (int64_t j = 0; j < classes; ++j) {
        se += std::exp(static_cast<double>(z[j] - mx));
        zsum += z[j];
      }
      const double lse = std::log(se) + mx;
      const double nll = lse - z[label];
      // -mean_j log p_j = lse - mean_j z_j: the uniform part of the smoothed target.
      loss_sum += eps > 0 ? (1 - eps) * nll + eps * (lse - zsum / static_cast<double>(classes)) : nll;
      correct += arg == label ? 1.0 : 0.0;
      if (dlogits) {
        float* g = dlogits + i * classes;
        for (int64_t j = 0; j < classes; ++j) {
          const double p = std::exp(z[j] - lse);
          const double target = (j == label ? 1.0 - eps : 0.0) + uniform;
          g[j] = static_cast<float>((p - target) * scale);
        }
      }
    }
    *loss = counted ? static_cast<float>(loss_sum / static_cast<double>(counted)) : NAN;
    stats[0] = static_cast<float>(loss_sum);
    stats[1] = static_cast<float>(correct);
  }

  // The same float operations in the same order as the CUDA kernels (which spell them with _rn intrinsics),
  // so a CPU replica and a GPU replica take bit-equal steps.
  void optimizer_step(const std::vector<OptimizerTensor>& tensors, OptimizerKind kind,
                      const OptimizerScalars* scalars, const float* clip, KernelContext&) override {
    OptimizerScalars s;
    std::memcpy(&s, scalars, sizeof s);  // the tensor's bytes, whatever their alignment
    s.kind = kind;
    const float coef = clip ? clip[1] : 1.0f;
    for (const OptimizerTensor& t : tensors) {
      const int64_t n = t.n;
      float *p = t.param, *a = t.a, *b = t.b;
      const float* grad = t.grad;
      const bool fresh = t.fresh;
      if (s.kind == OptimizerKind::Sgd) {
#pragma omp parallel for if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) {
          const float g = clip ? grad[i] * coef : grad[i];
          float d = g + s.weight_decay * p[i];
          if (a) {
            const float buf = fresh ? d : s.momentum * a[i] + s.keep * d;
            a[i] = buf;
            d = s.nesterov ? d + s.momentum * buf : buf;
          }
          p[i] = p[i] - s.lr * d;
        }
      } else {
#pragma omp parallel for if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) {
          float v = p[i] * s.decay;
          float g = clip ? grad[i] * coef : grad[i];
          if (s.weight_decay != 0) g = g + s.weight_decay * v;
          const float m1 = s.beta1 * (fresh ? 0.0f : a[i]) + s.one_minus_beta1 * g;
          const float m2 = s.beta2 * (fresh ? 0.0f : b[i]) + (s.one_minus_beta2 * g) * g;
          const float denom = std::sqrt(m2) / s.bias2_sqrt + s.eps;
          v = v - s.step_size * (m1 / denom);
          a[i] = m1;
          b[i] = m2;
          p[i] = v;
        }
      }
    }
  }

  void grad_clip_coefficient(const std::vector<GradSpan>& grads, float max_norm, float* out,
                             KernelContext&) override {
    // Every chunk of every gradient, in order; their sums are independent, then added in that order.
    std::vector<GradSpan> chunks;
    for (const GradSpan& g : grads)
      for (int64_t at = 0; at < g.n; at += kNormChunk)
        chunks.push_back({g.data + at, std::min(kNormChunk, g.n - at)});
    std::vector<double> partial(chunks.size());
    const int64_t count = static_cast<int64_t>(chunks.size());
#pragma omp parallel for if (count * kNormChunk > kParallelMin)
    for (int64_t c = 0; c < count; ++c) {
      double lanes[kNormLanes] = {};
      const float* x = chunks[c].data;
      const int64_t len = chunks[c].n;
      for (int64_t base = 0; base < len; base += kNormLanes) {
        const int64_t m = std::min<int64_t>(kNormLanes, len - base);
        for (int64_t l = 0; l < m; ++l) {
          const double v = x[base + l];
          lanes[l] += v * v;
        }
      }
      for (int stride = kNormLanes / 2; stride > 0; stride >>= 1)
        for (int l = 0; l < stride; ++l) lanes[l] += lanes[l + stride];
      partial[static_cast<size_t>(c)] = lanes[0];
    }
    double total = 0;
    for (double v : partial) total += v;
    const float norm = static_cast<float>(std::sqrt(total));
    const float q = max_norm / (norm + 1e-6f);
    out[0] = norm;
    out[1] = q > 1.0f ? 1.0f : q;  // torch's clamp(max=1): a NaN norm gives a NaN factor, as there
  }

 private:
  // A side with no channels may have no storage at all: memcpy must not see its null pointer.
  static void copy_floats(float* dst, const float* src, int64_t count) {
    if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
  }
  static bool is_2x2(const PoolShape& s) {
    return s.kernel == 2 && s.stride == 2 && s.pad == 0;
  }
  static int i32(int64_t v) {
    if (v > std::numeric_limits<int>::max())
      throw ShapeError("a linear layer dimension exceeds 2^31-1, which BLAS takes");
    return static_cast<int>(v);
  }
};

}  // namespace

int64_t cpu_channel_block() {
  // The layout oneDNN picks for a typical ResNet convolution's output when left free to choose.
  static const int64_t block = [] {
    try {
      dnnl::engine e(dnnl::engine::kind::cpu, 0);
      const memory::desc act({1, 64, 8, 8}, Dt::f32, Tag::any), wei({64, 64, 3, 3}, Dt::f32, Tag::any);
      const dnnl::convolution_forward::primitive_desc pd(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                          dnnl::algorithm::convolution_direct, act, wei, act, {1, 1}, {1, 1},
                                          {1, 1}),
          e);
      const dnnl_memory_desc_t& d = pd.dst_desc().data;
      const auto& b = d.format_desc.blocking;
      if (d.format_kind == dnnl_blocked && b.inner_nblks == 1 && b.inner_idxs[0] == 1 &&
          (b.inner_blks[0] == 8 || b.inner_blks[0] == 16))
        return int64_t{b.inner_blks[0]};
    } catch (const dnnl::error&) {
    }
    return int64_t{1};  // no blocked layout it prefers: blocked tensors are then NCHW
  }();
  return block;
}

NnKernels& cpu_nn_kernels() {
  static CpuNnKernels kernels;
  return kernels;
}

}  // namespace gn::nn
