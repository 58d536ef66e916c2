// A bf16 convolution's weight gradient as one matrix product (im2col, then oneDNN's bf16 matmul), where
// oneDNN 2.6's own backward-weights kernel is slow: NHWC bf16 on AMX with a stride, or with few output
// positions. Measured on 2 AMX cores at batch 32 (ResNet-18's shapes), its direct kernel against the product:
// 512 -> 512 channels at 4x4, 7.9 ms against 1.8; 256 -> 512 at 7x7 stride 2, 7.1 against 0.9; 256 -> 256
// at 7x7, 2.6 against 1.5; the 1x1 projections, 0.8-1.5 against 0.1-0.2; at 128 -> 128 and 14x14 it was the
// faster one (1.6 against 1.9). Internal to the runtime: CpuNnKernels::conv2d_backward calls it.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include "kernels.h"

namespace gn::nn::onednn {

class ConvWeightGradProduct {
 public:
  // Whether a convolution of shape `s` with operands of type `operand` takes this path: bf16 activations in
  // NHWC and bf16 operands, ungrouped, oneDNN's effective ISA AMX, and a stride or at most 49 output
  // positions (where the measurements above had the product ahead).
  static bool suits(const ConvShape& s, dnnl::memory::data_type operand);

  // Makes the product's primitives for `s` (which suits()) on the calling thread's engine.
  explicit ConvWeightGradProduct(const ConvShape& s);

  // dw [k, c, r, s] (float32, plain) = the sum over images and positions of dy x, through cols[position,
  // (r, s, c)] = the input each output position reads (zero in the padding); db (when not null) = the sum
  // of dy per channel, in float. x and dy are this shape's NHWC bf16 tensors. Scratch from this thread's.
  void run(const ConvShape& s, const void* x, const void* dy, float* dw, float* db) const;

 private:
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul product_;
  dnnl::reorder to_plain_;  // dw from [k, (r, s, c)] (dw_ohwi_, the product's dw_rsc_) to [k, c, r, s]
  dnnl::memory::desc dy_t_, cols_, dw_rsc_, dw_ohwi_, dw_plain_;
};

}  // namespace gn::nn::onednn
