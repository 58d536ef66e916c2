// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), shared by the CPU and CUDA
// so that the same seed gives the same values on every device. Element i takes lane i%4 of counter i/4.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GN_HD __host__ __device__ __forceinline__
#else
#define GN_HD inline
#endif

namespace gn::philox {

struct U32x4 {
  uint32_t v[4];
};

GN_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

GN_HD U32x4 philox4x32_10(uint64_t counter, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: 24 random bits, never 0 so that log() is safe.
GN_HD float to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// Element i of Uniform(lo, hi). An explicit fused multiply-add: nvcc contracts `lo + d * u` into one by
// default and the host compiler may or may not, which would make devices differ in the last bit.
GN_HD float uniform_at(uint64_t seed, uint64_t i, float lo, float hi) {
  U32x4 r = philox4x32_10(i >> 2, seed);
  return fmaf(hi - lo, to_unit_float(r.v[i & 3]), lo);
}

// Elements 2p and 2p+1 of Normal(mean, std): one Box-Muller draw over the lane pair of counter p. Computed
// in double so that the CPU's libm and CUDA's device math round to the same float.
struct NormalPair {
  float even, odd;
};
GN_HD NormalPair normal_pair(uint64_t seed, uint64_t p, float mean, float std) {
  U32x4 r = philox4x32_10(p, seed ^ 0x5DEECE66DULL);
  double u1 = to_unit_float(r.v[0]), u2 = to_unit_float(r.v[1]);
  double radius = sqrt(-2.0 * log(u1));
  double angle = 6.283185307179586 * u2;
  return {static_cast<float>(mean + std * (radius * cos(angle))),
          static_cast<float>(mean + std * (radius * sin(angle)))};
}

// Element i of Normal(mean, std).
GN_HD float normal_at(uint64_t seed, uint64_t i, float mean, float std) {
  NormalPair z = normal_pair(seed, i >> 1, mean, std);
  return (i & 1) ? z.odd : z.even;
}

}  // namespace gn::philox
