// The CPU's batch norm (forward with the fused residual add and ReLU, and backward): OpenMP loops over every
// layout the CPU keeps activations in. Internal to the runtime: CpuNnKernels (cpu_kernels.cpp) calls it.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace gn::nn {

// Batch norm runs over NCHW (block 1), the blocked layouts and NHWC (block == C, cpu_layout.h) alike, a group
// of B channels side by side: value (n, c, j) of group cb = c / B and lane l = c % B sits at
// n * image + cb * group + j * step + l. Blocked (B = block, NCHW with B = 1): image C * HW, group HW * B,
// step B. NHWC: image HW * C, group B, step C, with B the largest of 16, 8 and 1 that divides C. With B a
// compile-time constant the lane loops vectorise.
struct BnForward {
  const float *x, *gamma, *beta, *residual;
  float *running_mean, *running_var, *y, *save_mean, *save_invstd;
  bool training;
  float momentum, eps;
};
struct BnBackward {
  const float *x, *y, *dy, *gamma, *save_mean, *save_invstd;  // y: the output, read with a fused ReLU
  float *dx, *dresidual, *dgamma, *dbeta;
};

// y = bn(x) (+ residual) (then ReLU), with the batch's statistics in training (running ones updated with
// momentum, save_mean and save_invstd written) or the running ones in evaluation: NnKernels::batchnorm_forward.
void cpu_batchnorm_forward(const BnShape& s, const BnForward& a);
// dx (and dresidual), dgamma and dbeta from dy: NnKernels::batchnorm_backward.
void cpu_batchnorm_backward(const BnShape& s, const BnBackward& g);

}  // namespace gn::nn
