// The arithmetic that matrix products and convolutions may use. Tensors always hold float32; a lower
// precision is a permission for the math inside one op, as PyTorch's autocast and allow_tf32 are:
//  - fp32: full float32 products (no TF32, no down-conversion).
//  - tf32: CUDA tensor cores with TF32 inputs (10-bit mantissa), float32 accumulation.
//  - bf16 / fp16: the op rounds its inputs to bfloat16 / float16, runs on tensor cores and accumulates in
//    float32; its result is float32 again. Everything between those ops (batch norm, activations, the loss,
//    the optimizer and its master weights) stays float32.
// Only CUDA devices have tensor cores here; check_precision says what a device refuses and why.
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

// Throws Error, naming `what` and the device, when `device` cannot compute in `p`: every precision but fp32
// needs a CUDA device. bf16 on a CPU would need avx512_bf16 or AMX-BF16, and the message says whether this
// CPU has them (gpunodes has no CPU bf16 kernels yet).
void check_precision(Precision p, Device device, const std::string& what);

// The bf16 instructions this CPU has ("avx512_bf16", "amx_bf16", comma separated), or "" when none.
std::string cpu_bf16_features();

}  // namespace gn
