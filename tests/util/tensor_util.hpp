// Random test tensors and their relative comparison, for tests of backend ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dp/rng.hpp"

namespace dp::test {

// n values uniform in [-1, 1), a function of `seed` only.
inline std::vector<float> random_vec(size_t n, uint64_t seed) {
  Rng rng(key(seed, 777));
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

// max |a - b| / max |b|; infinite where a value is NaN (e.g. an output poisoned, never written).
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace dp::test
