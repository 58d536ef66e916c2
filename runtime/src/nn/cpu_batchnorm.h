// The CPU's batch norm (forward with the fused residual add and ReLU, and backward): OpenMP loops over every
// layout the CPU keeps activations in. Internal to the runtime: CpuNnKernels (cpu_kernels.cpp) calls it.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace gn::nn {

// Batch norm runs over NCHW (block 1), the blocked layouts and NHWC (block == C, cpu_layout.h) alike. NCHW
// and the blocked layouts take a group of B channels per thread, side by side: value (n, c, j) of group
// cb = c / B and lane l = c % B sits at n * C * HW + cb * HW * B + j * B + l (B = block; NCHW: B = 1), with B
// a compile-time constant so that the lane loops vectorise. NHWC streams whole rows of C channels, an image
// per thread. The sums are in double, image by image, in the same order in every layout.
// The activations (x, residual, y; dy, dx, dresidual) are stored as BnShape::type says: float or bfloat16
// (uint16_t), read as floats and rounded once when written; the parameters and statistics are float.
struct BnForward {
  const void* x;
  const float *gamma, *beta;
  const void* residual;
  float *running_mean, *running_var;
  void* y;
  float *save_mean, *save_invstd;
  bool training;
  float momentum, eps;
};
struct BnBackward {
  const void *x, *y, *dy;  // y: the output, read with a fused ReLU
  const float *gamma, *save_mean, *save_invstd;
  void *dx, *dresidual;
  float *dgamma, *dbeta;
};

// y = bn(x) (+ residual) (then ReLU), with the batch's statistics in training (running ones updated with
// momentum, save_mean and save_invstd written) or the running ones in evaluation: NnKernels::batchnorm_forward.
void cpu_batchnorm_forward(const BnShape& s, const BnForward& a);
// dx (and dresidual), dgamma and dbeta from dy: NnKernels::batchnorm_backward.
void cpu_batchnorm_backward(const BnShape& s, const BnBackward& g);

}  // namespace gn::nn
