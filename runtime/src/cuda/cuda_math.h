// Float32 matrix products on cuBLAS in a given Precision (precision.h), shared by the MatMul op and the
// linear layers.
#pragma once
#include <cublas_v2.h>

#include "cuda_check.h"
#include "gpunodes/precision.h"

namespace gn::cuda {

// fp32 keeps every product in float32 (cuBLAS's default math mode never picks TF32 for COMPUTE_32F); the
// others let cuBLAS round the float32 inputs to TF32, bfloat16 or half for the tensor cores and accumulate
// in float32.
inline cublasComputeType_t cublas_compute_type(Precision p) {
  switch (p) {
    case Precision::Tf32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case Precision::Bf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case Precision::Fp16:
      return CUBLAS_COMPUTE_32F_FAST_16F;
    case Precision::Fp32:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

// Column-major C[m,n] = alpha op(A) op(B) + beta C, all float32 in memory, computed in `p`.
inline void gemm_f32(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                     float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
                     Precision p) {
  GN_CUBLAS_CHECK(cublasGemmEx(h, op_a, op_b, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &beta, c,
                               CUDA_R_32F, ldc, cublas_compute_type(p), CUBLAS_GEMM_DEFAULT));
}

}  // namespace gn::cuda
