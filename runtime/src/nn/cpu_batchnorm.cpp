// cpu_batchnorm.h: batch norm's OpenMP loops (cpu_batchnorm_loops.inc), built twice and picked per CPU: with
// AVX2 and FMA, and for the baseline x86-64 ISA the rest of the runtime is built for. The bf16 activations'
// loops need the wider ISA: built for the baseline, the conversions kept GCC from vectorising them and the
// forward took 3.6x as long as float32's (2.2 ms against 0.61 for 32 x 64 x 28 x 28 on 2 cores); with AVX2
// and FMA it takes 0.52 ms, as float32 does.
#include "cpu_batchnorm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "../cpu/bf16.h"
#include "cpu_parallel.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "cpu_batchnorm_loops.inc"
}  // namespace avx2
#pragma GCC pop_options
bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#define GN_BN_DISPATCH(call) (use_avx2() ? avx2::call : baseline::call)
#else
#define GN_BN_DISPATCH(call) baseline::call
#endif

namespace baseline {
#include "cpu_batchnorm_loops.inc"
}  // namespace baseline

}  // namespace

void cpu_batchnorm_forward(const BnShape& s, const BnForward& a) {
  GN_BN_DISPATCH(forward(s, a));
}

void cpu_batchnorm_backward(const BnShape& s, const BnBackward& g) {
  GN_BN_DISPATCH(backward(s, g));
}

}  // namespace gn::nn
