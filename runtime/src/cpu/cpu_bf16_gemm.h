// bf16 products on the CPU, for the MatMul op and the linear layers under Precision::Bf16: oneDNN's matmul
// with bf16 operands and float32 accumulation and result. The operands stay float32 in memory (tensors are
// float32); each call rounds them to bf16 (round to nearest even) into per-thread scratch on its way in.
// Only call where cpu_native_bf16() holds (check_precision has let the op through).
#pragma once
#include <cstdint>

namespace gn::cpu {

// C[m, n] = op(A)[m, k] op(B)[k, n] (+ bias[n] broadcast over the rows, when bias is not null), every matrix
// row-major and contiguous: A is [m, k] ([k, m] when trans_a), B [k, n] ([n, k] when trans_b), as GemmArgs.
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
               const float* bias, float* c);

}  // namespace gn::cpu
