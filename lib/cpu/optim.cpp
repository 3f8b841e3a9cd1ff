// CPU ops on fp32 parameters: SGD, AdamW, clipping's sum of squares and scale, EMA, swap.
#include <cmath>
#include <cstdint>
#include <utility>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "ops.hpp"
#include "simd.hpp"

namespace dp::cpu {
namespace {

// Flush-to-zero and denormals-are-zero (MXCSR bits 15 and 6) for this thread while it lives. A
// unit whose gradient has died leaves AdamW's moments decaying into denormals (below 1.2e-38),
// and x86 takes ~100x longer on every instruction that meets one: AdamW took 67% of a UNet16 /16
// step on 32x32 images (perf), 683 img/s against 1916 flushed (2 ranks, Sapphire Rapids).
// Flushed, such a moment counts as 0; next to eps (1e-8) under the square root, the update is
// the same.
class FlushDenormals {
 public:
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFtzDaz);
  }
  ~FlushDenormals() {
    _mm_setcsr(saved_);
  }

 private:
  static constexpr unsigned kFtzDaz = 0x8040;
  unsigned saved_;
#endif
};

}  // namespace

// The updates pass over every parameter each step, with AVX2 clones (simd.hpp): AdamW on 29M
// parameters (full-width UNet16) took 34-37 ms on one Zen 4 core at the baseline, 19-26 ms cloned.
DP_AVX2_CLONES void sgd_update(int64_t count, float* p, const float* grad, float* m, float lr,
                               float momentum, float weight_decay, bool nesterov) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad[i] + weight_decay * p[i];
    const float buf = momentum * m[i] + g;
    m[i] = buf;
    p[i] -= lr * (nesterov ? g + momentum * buf : buf);
  }
}

DP_AVX2_CLONES void adamw_update(int64_t count, float* p, const float* g, float* m, float* v,
                                 float decay, float b1, float b2, float eps, float step_size,
                                 float bc2_sqrt) {
#pragma omp parallel
  {
    const FlushDenormals flush;
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  }
}

// In vectors of partial sums (one chain of dependent adds was latency-bound: 1% of a full-width
// bf16 step).
DP_AVX2_CLONES double sum_squares(int64_t count, const float* src) {
  double sum = 0;
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < count; ++i) sum += double(src[i]) * double(src[i]);
  return sum;
}

DP_AVX2_CLONES void scale(int64_t count, float alpha, float* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] *= alpha;
}

DP_AVX2_CLONES void ema_update(int64_t count, const float* src, float decay, float* avg) {
  const float keep = decay, take = 1.0f - decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) avg[i] = keep * avg[i] + take * src[i];
}

void swap(int64_t count, float* a, float* b) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) std::swap(a[i], b[i]);
}

}  // namespace dp::cpu
