// Host bf16 helpers for tests: rounding as the convolutions' operands are rounded, and vectors in
// bf16 storage (what a bf16 backend's activations hold).
#pragma once

#include <vector>

#include "dp/bf16.hpp"

namespace dp::test {

// Round to the nearest bf16 (ties to even), as the f32 -> bf16 conversions of cuDNN and oneDNN.
inline float to_bf16(float x) {
  return to_float(dp::to_bf16(x));
}

inline std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (float& x : v) x = to_bf16(x);
  return v;
}

// A vector in bf16 storage, and back (exact).
inline std::vector<bf16> stored_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = dp::to_bf16(v[i]);
  return out;
}
inline std::vector<float> widened(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

}  // namespace dp::test
