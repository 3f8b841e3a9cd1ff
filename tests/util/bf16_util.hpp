// Host bf16 rounding for tests: what a bf16 convolution's operands become (oneDNN and cuDNN).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace dp::test {

// Round to the nearest bf16 (ties to even), as the f32 -> bf16 conversions of cuDNN and oneDNN.
inline float to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float r = 0;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

inline std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (float& x : v) x = to_bf16(x);
  return v;
}

}  // namespace dp::test
