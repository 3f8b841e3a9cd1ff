// CPU 2x2 max-pool and bilinear x2 upsample (align_corners=False), forward and backward.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "dp/bf16.hpp"
#include "ops.hpp"
#include "simd.hpp"

namespace dp::cpu {
namespace {

// One output coordinate of a bilinear x2 upsample: inputs i0, i1 with weights w0, w1.
struct Tap {
  int i0, i1;
  float w0, w1;
};
Tap upsample_tap(int o, int in) {
  const int k = o / 2;
  if (o % 2 == 0) return k == 0 ? Tap{0, 0, 1.0f, 0.0f} : Tap{k - 1, k, 0.25f, 0.75f};
  return k == in - 1 ? Tap{k, k, 1.0f, 0.0f} : Tap{k, k + 1, 0.75f, 0.25f};
}
// The outputs that read input i, with their weights (at most four: 2i-1, 2i, 2i+1, 2i+2).
struct Gather {
  int o;
  float w;
};
constexpr int kGatherTaps = 4;
int upsample_gather(int i, int in, Gather* g) {
  int n = 0;
  for (int o = std::max(0, 2 * i - 1); o <= std::min(2 * in - 1, 2 * i + 2); ++o) {
    const Tap t = upsample_tap(o, in);
    const float w = (t.i0 == i ? t.w0 : 0.0f) + (t.i1 == i ? t.w1 : 0.0f);
    if (w != 0.0f) g[n++] = {o, w};
  }
  return n;
}

}  // namespace

template <typename T>
DP_AVX2_CLONES void maxpool2x2_forward(const Dims& s, const T* src, T* dst, uint8_t* argmax) {
  const int oh = s.h / 2, ow = s.w / 2, c = s.c;
  const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r / oh, y = r % oh;
    for (int x = 0; x < ow; ++x) {
      const T* p00 = src + ((n * s.h + 2 * y) * s.w + 2 * x) * c;
      const T* p01 = p00 + c;
      const T* p10 = p00 + int64_t{s.w} * c;
      const T* p11 = p10 + c;
      T* o = dst + ((n * oh + y) * ow + x) * c;
      if (argmax == nullptr) {  // inference: the same maximum, no index (a vector max)
        for (int k = 0; k < c; ++k) {
          float best = to_float(p00[k]);
          best = to_float(p01[k]) > best ? to_float(p01[k]) : best;
          best = to_float(p10[k]) > best ? to_float(p10[k]) : best;
          best = to_float(p11[k]) > best ? to_float(p11[k]) : best;
          o[k] = from_float<T>(best);
        }
        continue;
      }
      uint8_t* a = argmax + ((n * oh + y) * ow + x) * c;
      for (int k = 0; k < c; ++k) {
        // First maximum in scan order wins, as in PyTorch. (The maximum is one of the inputs, so
        // storing it back as T is exact.)
        float best = to_float(p00[k]);
        uint8_t which = 0;
        if (const float v = to_float(p01[k]); v > best) best = v, which = 1;
        if (const float v = to_float(p10[k]); v > best) best = v, which = 2;
        if (const float v = to_float(p11[k]); v > best) best = v, which = 3;
        o[k] = from_float<T>(best);
        a[k] = which;
      }
    }
  }
}

template <typename T>
DP_AVX2_CLONES void maxpool2x2_backward(const Dims& s, const uint8_t* argmax, const T* diff_dst,
                                        T* diff_src, bool accumulate) {
  const int oh = s.h / 2, ow = s.w / 2, c = s.c;
  const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r / oh, y = r % oh;
    for (int x = 0; x < ow; ++x) {
      T* q[4];
      q[0] = diff_src + ((n * s.h + 2 * y) * s.w + 2 * x) * c;
      q[1] = q[0] + c;
      q[2] = q[0] + int64_t{s.w} * c;
      q[3] = q[2] + c;
      const int64_t o = ((n * oh + y) * ow + x) * c;
      const uint8_t* which = argmax + o;
      const T* g = diff_dst + o;
      // One loop per pixel of the window, each load unconditional: they vectorise.
      for (int j = 0; j < 4; ++j) {
        T* dx = q[j];
        for (int k = 0; k < c; ++k) {
          const float gk = to_float(g[k]), v = which[k] == j ? gk : 0.0f;
          dx[k] = from_float<T>(accumulate ? to_float(dx[k]) + v : v);
        }
      }
    }
  }
}

// Bilinear x2 with align_corners=False has fixed weights: output 2k takes 1/4 of input k-1 and
// 3/4 of input k, output 2k+1 takes 3/4 of k and 1/4 of k+1, clamped at the borders. Per output
// row: the two input rows blended once into a per-thread fp32 row (one long SIMD loop over
// width x channels), then each blended pixel gives its two outputs (channels innermost). Fewer
// operations than blending four pixels per output, which counts at the narrow widths of /8
// models (oneDNN's generic resampling backward took 3x its forward time here).
template <typename T>
DP_AVX2_CLONES void upsample2x_forward(const Dims& s, const T* src, T* dst) {
  const int oh = 2 * s.h, c = s.c;
  const int64_t rows = int64_t{s.n} * oh, row_len = int64_t{s.w} * c;
#pragma omp parallel
  {
    thread_local std::vector<float> blended;
    blended.resize(static_cast<size_t>(row_len));
    float* v = blended.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / oh;
      const Tap y = upsample_tap(int(r % oh), s.h);
      const T* row0 = src + (n * s.h + y.i0) * row_len;
      const T* row1 = src + (n * s.h + y.i1) * row_len;
#pragma omp simd
      for (int64_t j = 0; j < row_len; ++j)
        v[j] = y.w0 * to_float(row0[j]) + y.w1 * to_float(row1[j]);
      T* out = dst + r * 2 * row_len;
      for (int i = 0; i < s.w; ++i) {
        const float* mid = v + int64_t{i} * c;
        // At the borders the outer tap has weight 0 (a copy), as upsample_tap says.
        const Tap even = upsample_tap(2 * i, s.w), odd = upsample_tap(2 * i + 1, s.w);
        const float* left = v + int64_t{even.i0} * c;
        const float* right = v + int64_t{odd.i1} * c;
        T* o = out + int64_t{2 * i} * c;
#pragma omp simd
        for (int k = 0; k < c; ++k) {
          o[k] = from_float<T>(even.w0 * left[k] + even.w1 * mid[k]);
          o[c + k] = from_float<T>(odd.w0 * mid[k] + odd.w1 * right[k]);
        }
      }
    }
  }
}

// The transpose, as a gather: input i collects from outputs 2i-1 .. 2i+2 (upsample_gather), in
// fp32 (one pixel's channels in a per-thread row, kept between calls), stored once.
template <typename T>
DP_AVX2_CLONES void upsample2x_backward(const Dims& s, const T* diff_dst, T* diff_src) {
  const int ow = 2 * s.w, c = s.c;
  const int64_t rows = int64_t{s.n} * s.h;
#pragma omp parallel
  {
    thread_local std::vector<float> row_sum;
    row_sum.resize(static_cast<size_t>(c));
    float* acc = row_sum.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / s.h;
      Gather gy[kGatherTaps];
      const int ny = upsample_gather(int(r % s.h), s.h, gy);
      for (int ix = 0; ix < s.w; ++ix) {
        Gather gx[kGatherTaps];
        const int nx = upsample_gather(ix, s.w, gx);
        std::fill(acc, acc + c, 0.0f);
        for (int j = 0; j < ny; ++j) {
          const T* row = diff_dst + (n * 2 * s.h + gy[j].o) * int64_t{ow} * c;
          for (int i = 0; i < nx; ++i) {
            const float w = gy[j].w * gx[i].w;
            const T* dy = row + int64_t{gx[i].o} * c;
#pragma omp simd
            for (int k = 0; k < c; ++k) acc[k] += w * to_float(dy[k]);
          }
        }
        T* dx = diff_src + (r * s.w + ix) * c;
#pragma omp simd
        for (int k = 0; k < c; ++k) dx[k] = from_float<T>(acc[k]);
      }
    }
  }
}

#define DP_INSTANTIATE(T)                                                                \
  template void maxpool2x2_forward<T>(const Dims&, const T*, T*, uint8_t*);              \
  template void maxpool2x2_backward<T>(const Dims&, const uint8_t*, const T*, T*, bool); \
  template void upsample2x_forward<T>(const Dims&, const T*, T*);                        \
  template void upsample2x_backward<T>(const Dims&, const T*, T*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(bf16)
#undef DP_INSTANTIATE

}  // namespace dp::cpu
