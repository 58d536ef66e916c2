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
#include "cuda_nn_small_kernels.cuh"
#include "cudnn_conv_support.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"

namespace gn::nn {
namespace {

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
