// The CPU's Layout::Blocked (layers.h), which depends on the products' precision: the layout oneDNN's
// convolutions prefer for that precision on this machine. Internal to the runtime (layers.cpp asks,
// cpu_kernels.cpp's convolutions and batch norm follow).
#pragma once
#include <cstdint>

#include "gpunodes/precision.h"

namespace gn::nn {

// The channel block of a CPU tensor of `channels` channels in Layout::Blocked while `precision` is the thread's
// (ScopedPrecision), in kernels.h's terms: 8 or 16 for [N, C / block, H, W, block] (fp32 everywhere, and bf16
// on AVX512_BF16 without AMX, where oneDNN's kernels run nChw16c); `channels` itself for NHWC (bf16 where
// oneDNN's bf16 convolutions run channels-last, as its AMX kernels do: a blocked layout there costs a reorder
// around every convolution); 1 where oneDNN prefers neither (blocked tensors are then NCHW). The caller checks
// that `channels` is a multiple of the block.
int64_t cpu_layout_block(Precision precision, int64_t channels);

}  // namespace gn::nn
