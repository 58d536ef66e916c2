// When the CPU kernels' OpenMP loops go parallel. Internal to the runtime.
#pragma once
#include <cstdint>

namespace gn::nn {

// Loops go parallel only when the work pays for waking the team: memory-bound loops of fewer elements finish
// in about the time a parallel region costs, and far faster than one costs on a busy machine.
inline constexpr int64_t kCpuParallelMin = 1 << 17;

}  // namespace gn::nn
