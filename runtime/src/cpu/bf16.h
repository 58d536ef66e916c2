// bfloat16 values as the CPU kernels store them (uint16_t: a float's upper 16 bits). Internal to the runtime.
#pragma once
#include <bit>
#include <cstdint>

namespace gn::cpu {

// Exact: every bfloat16 value is a float.
inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Rounded to nearest, ties to even, as oneDNN's and PyTorch's conversions round; a NaN stays a (quiet) NaN.
// Both answers are computed and one masked in, without a branch or a select, so that loops of it vectorise.
inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const uint32_t nan = 0u - static_cast<uint32_t>((bits & 0x7fffffffu) > 0x7f800000u);  // all ones for a NaN
  return static_cast<uint16_t>((quiet_nan & nan) | (rounded & ~nan));
}

// A stored value as a float, and a float stored, for loops over either type (T float or uint16_t: bf16):
// float as it is, bf16 widened exactly or rounded as above.
inline float widen(float v) {
  return v;
}
inline float widen(uint16_t v) {
  return bf16_to_float(v);
}
inline void store_rounded(float& out, float v) {
  out = v;
}
inline void store_rounded(uint16_t& out, float v) {
  out = float_to_bf16(v);
}

}  // namespace gn::cpu
