// What the CPU kernels' vectorised loops share: e^x as a polynomial (libm's expf does not vectorise) and the
// attribute that compiles a row function twice, for baseline x86-64 (SSE2, what the build targets) and for
// x86-64-v3 (AVX2, FMA), the loader picking the one the CPU runs. A file that uses exp_poly in a loop meant
// to vectorise is compiled with -fno-trapping-math (runtime/CMakeLists.txt): otherwise GCC keeps the clamps'
// comparisons as branches and vectorises nothing.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>

namespace gn::nn {

// e^x within 2 ulp (Cephes' expf): x = n ln 2 + r with |r| <= ln 2 / 2, a degree-6 polynomial for e^r, and
// 2^n through the exponent bits. x is clamped to [-87, 88] (NaN passes: comparisons with NaN are false), so
// e^x saturates at 1.7e38 and 1.6e-38.
inline float exp_poly(float x) {
  x = std::max(x, -87.0f);
  x = std::min(x, 88.0f);
  // Round to nearest by the 1.5 * 2^23 trick: a float add, which vectorises where nearbyint does not.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // ln 2 in two parts, so that r is exact.
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace gn::nn

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GN_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GN_VECTOR_CLONES
#endif
