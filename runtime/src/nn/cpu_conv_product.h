// bf16 convolutions as matrix products (im2col columns and oneDNN's bf16 matmul), for the passes where oneDNN
// 2.6's own convolution kernels are slow: NHWC bf16 on AMX with a stride, or with few output positions.
// Measured on 2 AMX cores at batch 32 (ResNet-18's shapes), oneDNN's direct kernel against the product,
// weight reorders included:
//   weight gradient: 512 -> 512 channels at 4x4, 7.9 ms against 1.8; 256 -> 512 at 7x7 stride 2, 7.1 against
//     0.9; 256 -> 256 at 7x7, 2.6 against 1.5; the 1x1 projections, 0.8-1.5 against 0.1-0.2; at 128 -> 128
//     and 14x14 the kernel was the faster (1.6 against 1.9).
//   forward and data gradient: 512 at 4x4, 4.7 and 5.7 against 2.4 and 2.8; 256 -> 512 stride 2, 2.2 and 3.9
//     against 1.2 and 1.4; 128 -> 256 stride 2, 1.5 and 1.5 against 0.8 and 1.3; but at 256 -> 256 and 7x7
//     (1.5 and 1.7 against 1.5 and 2.3) and 64 -> 128 stride 2 (0.8 and 1.5 against 0.8 and 2.0) the kernel.
// Internal to the runtime: CpuNnKernels' convolutions call it through ConvPrims.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include "kernels.h"

namespace gn::nn::onednn {

// One pass of one convolution shape as a product: its matmul and the reorders around it, made on the calling
// thread's engine; run() takes its scratch from the same thread's.
class ConvProduct {
 public:
  enum class Pass { Forward, DataGradient, WeightGradient };

  // Whether pass `pass` of a convolution of shape `s` with operands of type `operand` is a product: bf16
  // activations in NHWC and bf16 operands, ungrouped, oneDNN's effective ISA AMX, and the shapes where the
  // measurements above had the product ahead. The weight gradient: a stride, or at most 49 output
  // positions; the forward and the data gradient: at most 16 positions, or a stride from 128 channels or
  // more.
  static bool suits(const ConvShape& s, dnnl::memory::data_type operand, Pass pass);

  // `s` suits `pass`.
  ConvProduct(const ConvShape& s, Pass pass);

  // Pass::Forward: y = conv(x, w) + b (b may be null), rounded to bf16 once.
  void forward(const ConvShape& s, const void* x, const float* w, const float* b, void* y) const;
  // Pass::DataGradient: dx = the transposed convolution of dy with w, summed in float and rounded once.
  void data_gradient(const ConvShape& s, const void* dy, const float* w, void* dx) const;
  // Pass::WeightGradient: dw (float32, [k, c, r, s]) = the sum over images and positions of dy x; db (when
  // not null) = the sum of dy per channel, in float.
  void weight_gradient(const ConvShape& s, const void* x, const void* dy, float* dw, float* db) const;

 private:
  // Forward and data gradient: w rounded to bf16 in the columns' order, in this thread's scratch.
  dnnl::memory weights_in_bf16(const float* w) const;

  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul product_;
  // The product's operands and result (which is which follows the pass).
  dnnl::memory::desc a_, b_, c_, bias_;
  // Forward and data gradient: w from float32 [k, c, r, s] to bf16 [k, (r, s, c)], the columns' order.
  // Weight gradient: dw back from [k, (r, s, c)] to [k, c, r, s].
  dnnl::reorder weights_;
  dnnl::memory::desc weights_from_, weights_to_;
};

}  // namespace gn::nn::onednn
