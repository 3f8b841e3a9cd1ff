// Counter-based, platform-independent random numbers (SplitMix64) for init, data and augmentation.
#pragma once

#include <cstdint>
#include <string_view>

namespace dp {

__extension__ typedef unsigned __int128 uint128_t;

// SplitMix64 finaliser: a good 64-bit mix of one word.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Combines words into one stream key, e.g. key(seed, epoch, sample).
constexpr uint64_t key(uint64_t a) {
  return mix64(a);
}
template <typename... Rest>
constexpr uint64_t key(uint64_t a, Rest... rest) {
  return mix64(a ^ (key(static_cast<uint64_t>(rest)...) + 0x632BE59BD9B4E019ull));
}

// FNV-1a of a string, to derive a stream from a name (e.g. a parameter name).
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// Sequential generator over one stream; identical on every platform and compiler
// (std::uniform_*_distribution is not, so it is never used for anything that must reproduce).
class Rng {
 public:
  explicit Rng(uint64_t stream) : state_(stream) {}
  uint64_t next() { return mix64(state_++ * 0x9E3779B97F4A7C15ull + 1); }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; negligible bias for small n).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<uint128_t>(next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace dp
