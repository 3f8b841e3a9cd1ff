// bf16 on the host: the storage type of bf16 activations and its conversions to and from fp32.
#pragma once

#include <cstdint>
#include <cstring>

namespace dp {

// The upper 16 bits of an IEEE fp32 (bfloat16), as stored in bf16 activations.
struct bf16 {
  uint16_t bits;
};

inline float to_float(bf16 x) {
  const uint32_t u = uint32_t{x.bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float to_float(float x) {
  return x;
}

// Round to nearest even (as PyTorch, oneDNN and CUDA's __float2bfloat16); NaN stays NaN.
// (A select, not a branch, so that loops of it vectorise.)
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t nan = (u >> 16) | 0x40u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return bf16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}

// Stores an fp32 value as T (float or bf16).
template <typename T>
T from_float(float f) {
  if constexpr (sizeof(T) == sizeof(float))
    return f;
  else
    return to_bf16(f);
}

}  // namespace dp
