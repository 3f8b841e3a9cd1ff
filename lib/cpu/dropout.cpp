// CPU channel dropout (dropout2d): the per-sample masks from dp::Rng and the channel scaling.
#include <cstdint>

#include "dp/bf16.hpp"
#include "dp/rng.hpp"
#include "ops.hpp"

namespace dp::cpu {
namespace {

template <typename T>
void channel_mask_loop(const Dims& d, const float* mask, const T* src, T* dst) {
  const int64_t hw = int64_t{d.h} * d.w;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < d.pixels(); ++p) {
    const float* m = mask + (p / hw) * d.c;
#pragma omp simd
    for (int k = 0; k < d.c; ++k)
      dst[p * d.c + k] = from_float<T>(to_float(src[p * d.c + k]) * m[k]);
  }
}

}  // namespace

template <typename T>
void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const T* src, float* mask,
                       T* dst) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (int n = 0; n < d.n; ++n) {
    Rng rng(seeds[n]);
    for (int k = 0; k < d.c; ++k) mask[n * d.c + k] = rng.uniform() < p ? 0.0f : keep_scale;
  }
  dropout2d_backward(d, mask, src, dst);
}

// The same channel scaling as the forward.
template <typename T>
void dropout2d_backward(const Dims& d, const float* mask, const T* diff_dst, T* diff_src) {
  channel_mask_loop(d, mask, diff_dst, diff_src);
}

#define DP_INSTANTIATE(T)                                                                        \
  template void dropout2d_forward<T>(const Dims&, float, const uint64_t*, const T*, float*, T*); \
  template void dropout2d_backward<T>(const Dims&, const float*, const T*, T*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(bf16)
#undef DP_INSTANTIATE

}  // namespace dp::cpu
