// The arithmetic that matrix products and convolutions may use. Tensors always hold float32; a lower
// precision is a permission for the math inside one op, as PyTorch's autocast and allow_tf32 are:
//  - fp32: full float32 products (no TF32, no down-conversion).
//  - tf32: CUDA tensor cores with TF32 inputs (10-bit mantissa), float32 accumulation.
//  - bf16 / fp16: the op rounds its inputs to bfloat16 / float16, runs on tensor cores and accumulates in
//    float32; its result is float32 again. Everything between those ops (batch norm, activations, the loss,
//    the optimizer and its master weights) stays float32.
// CUDA devices compute in every precision. A CPU computes in fp32, and in bf16 where oneDNN's effective ISA
// has bf16 instructions (AVX512_BF16 or AMX): linear, conv2d and matmul then run oneDNN's bf16 kernels with
// bf16 operands and float32 accumulation and results; the ops that have no bf16 CPU kernel (the recurrent
// layers, attention's bmm) compute in float32 there, as autocast leaves the ops off its list in float32.
// check_precision says what a device refuses and why.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "gpunodes/device.h"

namespace gn {

enum class Precision { Fp32, Tf32, Bf16, Fp16 };

const char* precision_name(Precision p);  // "fp32", "tf32", "bf16", "fp16"
// Accepts the names above; nullopt otherwise.
std::optional<Precision> parse_precision(std::string_view text);

// Throws Error, naming `what` and the device, when `device` cannot compute in `p`: tf32 and fp16 need a CUDA
// device; bf16 needs a CUDA device or a CPU with native bf16 (cpu_native_bf16), and on a CPU without it the
// message says which bf16 instructions the CPU has and the ISA oneDNN found.
void check_precision(Precision p, Device device, const std::string& what);
// Whether check_precision lets `device` compute in `p`.
bool precision_supported(Precision p, Device device);

// Whether this CPU computes bf16 products natively: oneDNN's effective ISA is avx512_core_bf16 or above
// (AVX512_BF16, or AMX). DNNL_MAX_CPU_ISA, read once by oneDNN, can lower it.
bool cpu_native_bf16();
// oneDNN's effective ISA on this CPU, as oneDNN's verbose output names it ("avx512_core_bf16", "avx2", ...).
std::string cpu_dnnl_isa();

// The bf16 instructions this CPU has ("avx512_bf16", "amx_bf16", comma separated), or "" when none.
std::string cpu_bf16_features();

}  // namespace gn
