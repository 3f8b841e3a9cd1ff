// CUDA 2x2 max-pool and bilinear x2 upsample kernels and launchers, forward and backward.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

// Window element v (index j in scan order) against the best so far: the first maximum wins.
__device__ __forceinline__ void pool_max(float& best, uint8_t& which, float v, uint8_t j) {
  if (v > best) best = v, which = j;
}
__device__ __forceinline__ void pool_max(float4& best, uchar4& which, float4 v, uint8_t j) {
  pool_max(best.x, which.x, v.x, j);
  pool_max(best.y, which.y, v.y, j);
  pool_max(best.z, which.z, v.z, j);
  pool_max(best.w, which.w, v.w, j);
}
__device__ __forceinline__ float routed(uint8_t which, unsigned j, float g) {
  return which == j ? g : 0.0f;
}
__device__ __forceinline__ float4 routed(uchar4 which, unsigned j, float4 g) {
  return make_float4(routed(which.x, j, g.x), routed(which.y, j, g.y), routed(which.z, j, g.z),
                     routed(which.w, j, g.w));
}

// Over dst pixels q = (n * oh + oy) * ow + ox; the top-left source pixel is (2 r) * w + 2 ox with
// r = q / ow (since h = 2 oh). S a 4-channel vector with A = uchar4: c counts groups of 4
// channels (argmax bytes likewise). The maximum is one of the inputs: stored back exactly.
template <typename I, typename S, typename A>
__global__ void maxpool_forward_kernel(I dst_pixels, int c, I w, I ow, const S* src, S* dst,
                                       A* argmax) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  const int64_t row = static_cast<int64_t>(w) * c;
  DP_PIXEL_STRIDE(I, q, dst_pixels) {
    const I r = q / ow, ox = q - r * ow;
    const S* p00 = src + static_cast<int64_t>(2 * r * w + 2 * ox) * c + k;
    // First maximum in scan order wins, as in PyTorch (and the CPU backend).
    compute_t<S> best = widen(p00[0]);
    A which{};
    pool_max(best, which, widen(p00[c]), 1);
    pool_max(best, which, widen(p00[row]), 2);
    pool_max(best, which, widen(p00[row + c]), 3);
    const int64_t o = static_cast<int64_t>(q) * c + k;
    dst[o] = store_as<S>(best);
    if (argmax != nullptr) argmax[o] = which;
  }
}

}  // namespace

template <typename S>
void maxpool2x2_forward(cudaStream_t s, const Shape& src_dims, const S* src, S* dst,
                        uint8_t* argmax) {
  DP_CHECK(src_dims.h % 2 == 0 && src_dims.w % 2 == 0, "maxpool2x2: input ", src_dims.h, "x",
           src_dims.w, " is not even");
  const int ow = src_dims.w / 2;
  const int64_t dst_pixels = int64_t{src_dims.n} * (src_dims.h / 2) * ow;
  if (dst_pixels == 0 || src_dims.c == 0) return;
  const bool v4 = src_dims.c % 4 == 0 && aligned_vec4<S>(src, dst) &&
                  reinterpret_cast<uintptr_t>(argmax) % sizeof(uchar4) == 0;
  const int c = v4 ? src_dims.c / 4 : src_dims.c;
  const auto cg = channel_grid(dst_pixels, c, kMaxBlocks);
  with_index_type(src_dims.pixels(), [&](auto tag) {
    using I = decltype(tag);
    if (v4)
      maxpool_forward_kernel<I, vec4_t<S>, uchar4><<<cg.grid, cg.block, 0, s>>>(
          static_cast<I>(dst_pixels), c, static_cast<I>(src_dims.w), static_cast<I>(ow),
          as_vec4<S>(src), as_vec4<S>(dst), reinterpret_cast<uchar4*>(argmax));
    else
      maxpool_forward_kernel<I, S, uint8_t>
          <<<cg.grid, cg.block, 0, s>>>(static_cast<I>(dst_pixels), c, static_cast<I>(src_dims.w),
                                        static_cast<I>(ow), src, dst, argmax);
  });
  DP_CUDA_CHECK(cudaGetLastError());
}

namespace {

// A gather over src pixels sp = (n * h + y) * w + x: each reads its one dst element.
template <typename I, typename S, typename A>
__global__ void maxpool_backward_kernel(I src_pixels, int c, I w, I ow, const A* argmax,
                                        const S* diff_dst, S* diff_src, bool accumulate) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  DP_PIXEL_STRIDE(I, sp, src_pixels) {
    const I yrow = sp / w, x = sp - yrow * w;  // yrow = n * h + y; h even: y % 2 == yrow % 2
    const int64_t o = static_cast<int64_t>(yrow / 2 * ow + x / 2) * c + k;
    const unsigned j = static_cast<unsigned>((yrow & 1) * 2 + (x & 1));
    const compute_t<S> v = routed(argmax[o], j, widen(diff_dst[o]));
    const int64_t i = static_cast<int64_t>(sp) * c + k;
    diff_src[i] = store_as<S>(accumulate ? widen(diff_src[i]) + v : v);
  }
}

}  // namespace

template <typename S>
void maxpool2x2_backward(cudaStream_t s, const Shape& src_dims, const uint8_t* argmax,
                         const S* diff_dst, S* diff_src, bool accumulate) {
  const int64_t src_pixels = src_dims.pixels();
  if (src_pixels == 0 || src_dims.c == 0) return;
  const bool v4 = src_dims.c % 4 == 0 && aligned_vec4<S>(diff_dst, diff_src) &&
                  reinterpret_cast<uintptr_t>(argmax) % sizeof(uchar4) == 0;
  const int c = v4 ? src_dims.c / 4 : src_dims.c;
  const auto cg = channel_grid(src_pixels, c, kMaxBlocks);
  with_index_type(src_pixels, [&](auto tag) {
    using I = decltype(tag);
    if (v4)
      maxpool_backward_kernel<I, vec4_t<S>, uchar4><<<cg.grid, cg.block, 0, s>>>(
          static_cast<I>(src_pixels), c, static_cast<I>(src_dims.w), static_cast<I>(src_dims.w / 2),
          reinterpret_cast<const uchar4*>(argmax), as_vec4<S>(diff_dst), as_vec4<S>(diff_src),
          accumulate);
    else
      maxpool_backward_kernel<I, S, uint8_t><<<cg.grid, cg.block, 0, s>>>(
          static_cast<I>(src_pixels), c, static_cast<I>(src_dims.w), static_cast<I>(src_dims.w / 2),
          argmax, diff_dst, diff_src, accumulate);
  });
  DP_CUDA_CHECK(cudaGetLastError());
}

namespace {

// Bilinear x2 upsample, align_corners=False (the CPU backend's upsample_tap / upsample_gather).

struct Tap {
  int i0, i1;
  float w0, w1;
};

// Output coordinate o reads inputs i0, i1 with weights w0, w1 (in = input size).
__device__ __forceinline__ Tap upsample_tap(int o, int in) {
  const int k = o / 2;
  if (o % 2 == 0) return k == 0 ? Tap{0, 0, 1.0f, 0.0f} : Tap{k - 1, k, 0.25f, 0.75f};
  return k == in - 1 ? Tap{k, k, 1.0f, 0.0f} : Tap{k, k + 1, 0.75f, 0.25f};
}

// The outputs that read input i are 2i-1 .. 2i+2 clipped to [0, 2 in - 1] (the CPU backend's
// upsample_gather); gather_weight is the weight of input i in output o (0 when it takes none).
__device__ __forceinline__ int gather_first(int i) {
  return 2 * i - 1 > 0 ? 2 * i - 1 : 0;
}
__device__ __forceinline__ int gather_last(int i, int in) {
  return 2 * in - 1 < 2 * i + 2 ? 2 * in - 1 : 2 * i + 2;
}
__device__ __forceinline__ float gather_weight(int o, int i, int in) {
  const Tap t = upsample_tap(o, in);
  return (t.i0 == i ? t.w0 : 0.0f) + (t.i1 == i ? t.w1 : 0.0f);
}

// Over src pixels sp = (n * h + j) * w + i: each thread writes the 2x2 outputs (2j + a, 2i + b)
// of the [n, 2h, 2w, c] output from the 3x3 inputs around (j, i), clamped at the borders (9 loads
// for 4 outputs). With clamped neighbours jm = max(j - 1, 0), jp = min(j + 1, h - 1), the taps
// of output rows 2j and 2j + 1 read rows (jm, j) and (j, jp) exactly (upsample_tap: the border
// taps read one row twice, the second time with weight 0); columns likewise. Each output is the
// CPU backend's expression, the rows blended first: tx.w0 (ty.w0 a + ty.w1 d) + tx.w1 (ty.w0 b +
// ty.w1 e).
// S a 4-channel vector: c counts groups of 4 channels.
template <typename I, typename S>
__global__ void upsample_forward_kernel(I src_pixels, int c, int h, int w, const S* src, S* dst) {
  using T = compute_t<S>;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  const I hh = static_cast<I>(h), ww = static_cast<I>(w);
  DP_PIXEL_STRIDE(I, sp, src_pixels) {
    const I r = sp / ww, n = r / hh;
    const int j = static_cast<int>(r - n * hh), i = static_cast<int>(sp - r * ww);
    const Tap ty0 = upsample_tap(2 * j, h), ty1 = upsample_tap(2 * j + 1, h);
    const Tap tx0 = upsample_tap(2 * i, w), tx1 = upsample_tap(2 * i + 1, w);
    const int jm = j > 0 ? j - 1 : 0, jp = j + 1 < h ? j + 1 : j;
    const int im = i > 0 ? i - 1 : 0, ip = i + 1 < w ? i + 1 : i;
    const S* image = src + static_cast<int64_t>(n) * h * w * c + k;
    auto at = [&](int y, int x) { return widen(image[(static_cast<int64_t>(y) * w + x) * c]); };
    const T s00 = at(jm, im), s01 = at(jm, i), s02 = at(jm, ip);
    const T s10 = at(j, im), s11 = at(j, i), s12 = at(j, ip);
    const T s20 = at(jp, im), s21 = at(jp, i), s22 = at(jp, ip);
    const int64_t ow = 2 * int64_t{w};
    S* out = dst + ((static_cast<int64_t>(n) * 2 * h + 2 * j) * ow + 2 * i) * c + k;
    // Rows 2j and 2j + 1 blended column by column (im, i, ip), then across the columns.
    const T a0 = ty0.w0 * s00 + ty0.w1 * s10, a1 = ty0.w0 * s01 + ty0.w1 * s11,
            a2 = ty0.w0 * s02 + ty0.w1 * s12;
    const T b0 = ty1.w0 * s10 + ty1.w1 * s20, b1 = ty1.w0 * s11 + ty1.w1 * s21,
            b2 = ty1.w0 * s12 + ty1.w1 * s22;
    out[0] = store_as<S>(tx0.w0 * a0 + tx0.w1 * a1);
    out[c] = store_as<S>(tx1.w0 * a1 + tx1.w1 * a2);
    out += ow * c;
    out[0] = store_as<S>(tx0.w0 * b0 + tx0.w1 * b1);
    out[c] = store_as<S>(tx1.w0 * b1 + tx1.w1 * b2);
  }
}

}  // namespace

template <typename S>
void upsample2x_forward(cudaStream_t s, const Shape& src_dims, const S* src, S* dst) {
  const int64_t src_pixels = src_dims.pixels();
  if (src_pixels == 0 || src_dims.c == 0) return;
  const bool v4 = src_dims.c % 4 == 0 && aligned_vec4<S>(src, dst);
  const int c = v4 ? src_dims.c / 4 : src_dims.c;
  const auto cg = channel_grid(src_pixels, c, kMaxBlocks);
  with_index_type(src_pixels, [&](auto tag) {
    using I = decltype(tag);
    if (v4)
      upsample_forward_kernel<I, vec4_t<S>><<<cg.grid, cg.block, 0, s>>>(
          static_cast<I>(src_pixels), c, src_dims.h, src_dims.w, as_vec4<S>(src), as_vec4<S>(dst));
    else
      upsample_forward_kernel<I, S><<<cg.grid, cg.block, 0, s>>>(static_cast<I>(src_pixels), c,
                                                                 src_dims.h, src_dims.w, src, dst);
  });
  DP_CUDA_CHECK(cudaGetLastError());
}

namespace {

// The transpose as a gather over src pixels sp = (n * h + iy) * w + ix: each input gradient sums
// its (at most 4 x 4) contributions in the CPU backend's order. Overwrites diff_src.
template <typename I, typename S>
__global__ void upsample_backward_kernel(I src_pixels, int c, int h, int w, const S* diff_dst,
                                         S* diff_src) {
  using T = compute_t<S>;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  const I hh = static_cast<I>(h), ww = static_cast<I>(w);
  const int64_t ow = 2 * int64_t{w};
  DP_PIXEL_STRIDE(I, sp, src_pixels) {
    const I r = sp / ww, n = r / hh;
    const int iy = static_cast<int>(r - n * hh), ix = static_cast<int>(sp - r * ww);
    const int x_first = gather_first(ix), x_last = gather_last(ix, w);
    const S* image = diff_dst + static_cast<int64_t>(n) * 2 * h * ow * c + k;
    // The (at most 4) column weights once per input pixel, in registers (unrolled: constant
    // indices); 0 past x_last.
    float wx[4];
#pragma unroll
    for (int t = 0; t < 4; ++t)
      wx[t] = x_first + t <= x_last ? gather_weight(x_first + t, ix, w) : 0.0f;
    // Rows outer, columns inner, zero weights skipped, (wy * wx) * dy: the CPU backend's order.
    T dx = zero_value<T>();
    for (int oy = gather_first(iy); oy <= gather_last(iy, h); ++oy) {
      const float wy = gather_weight(oy, iy, h);
      if (wy == 0.0f) continue;
      const S* row = image + (oy * ow + x_first) * c;
#pragma unroll
      for (int t = 0; t < 4; ++t)
        if (wx[t] != 0.0f) dx = dx + (wy * wx[t]) * widen(row[int64_t{t} * c]);
    }
    diff_src[static_cast<int64_t>(sp) * c + k] = store_as<S>(dx);
  }
}

}  // namespace

template <typename S>
void upsample2x_backward(cudaStream_t s, const Shape& src_dims, const S* diff_dst, S* diff_src) {
  const int64_t src_pixels = src_dims.pixels();
  if (src_pixels == 0 || src_dims.c == 0) return;
  const bool v4 = src_dims.c % 4 == 0 && aligned_vec4<S>(diff_dst, diff_src);
  const int c = v4 ? src_dims.c / 4 : src_dims.c;
  const auto cg = channel_grid(src_pixels, c, kMaxBlocks);
  with_index_type(src_pixels, [&](auto tag) {
    using I = decltype(tag);
    if (v4)
      upsample_backward_kernel<I, vec4_t<S>>
          <<<cg.grid, cg.block, 0, s>>>(static_cast<I>(src_pixels), c, src_dims.h, src_dims.w,
                                        as_vec4<S>(diff_dst), as_vec4<S>(diff_src));
    else
      upsample_backward_kernel<I, S><<<cg.grid, cg.block, 0, s>>>(
          static_cast<I>(src_pixels), c, src_dims.h, src_dims.w, diff_dst, diff_src);
  });
  DP_CUDA_CHECK(cudaGetLastError());
}

#define DP_INSTANTIATE(S)                                                                        \
  template void maxpool2x2_forward<S>(cudaStream_t, const Shape&, const S*, S*, uint8_t*);       \
  template void maxpool2x2_backward<S>(cudaStream_t, const Shape&, const uint8_t*, const S*, S*, \
                                       bool);                                                    \
  template void upsample2x_forward<S>(cudaStream_t, const Shape&, const S*, S*);                 \
  template void upsample2x_backward<S>(cudaStream_t, const Shape&, const S*, S*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(__nv_bfloat16)
#undef DP_INSTANTIATE

}  // namespace dp::cuda::kernels
