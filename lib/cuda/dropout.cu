// CUDA channel dropout (dropout2d): masks drawn as dp::Rng draws them, and the channel scaling.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

// Must equal dp::mix64 (lib/include/dp/rng.hpp): the masks are bit-identical to the host's.
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// mask[s * c + k]: the k-th (0-based) uniform() of dp::Rng(seeds[s]), i.e. of the draw with
// state seeds[s] + k: next() = mix64(state * 0x9E3779B97F4A7C15 + 1), uniform() = (next() >> 40)
// * 2^-24.
__global__ void dropout_mask_kernel(int64_t rows, int c, float p, float keep_scale,
                                    const uint64_t* seeds, float* mask) {
  DP_GRID_STRIDE(i, rows * c) {
    const int64_t s = i / c, k = i % c;
    const uint64_t state = seeds[s] + static_cast<uint64_t>(k);
    const uint64_t bits = mix64(state * 0x9E3779B97F4A7C15ull + 1);
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
    mask[i] = u < p ? 0.0f : keep_scale;
  }
}

// dst[p, k] = src[p, k] * mask[p / hw, k].
template <typename I, typename S>
__global__ void channel_mask_kernel(I pixels, int c, I hw, const float* mask, const S* src,
                                    S* dst) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  DP_PIXEL_STRIDE(I, p, pixels) {
    const int64_t i = static_cast<int64_t>(p) * c + k;
    dst[i] = store_as<S>(widen(src[i]) * mask[static_cast<int64_t>(p / hw) * c + k]);
  }
}

template <typename S>
void apply_channel_mask(cudaStream_t s, const Shape& d, const float* mask, const S* src, S* dst) {
  const int64_t pixels = d.pixels();
  if (pixels == 0 || d.c == 0) return;
  const auto cg = channel_grid(pixels, d.c, kMaxBlocks);
  with_index_type(pixels, [&](auto tag) {
    using I = decltype(tag);
    channel_mask_kernel<I, S><<<cg.grid, cg.block, 0, s>>>(
        static_cast<I>(pixels), d.c, static_cast<I>(int64_t{d.h} * d.w), mask, src, dst);
  });
  DP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename S>
void dropout2d_forward(cudaStream_t s, const Shape& d, float p, const uint64_t* seeds, const S* src,
                       float* mask, S* dst) {
  const float keep_scale = 1.0f / (1.0f - p);  // on the host, as the CPU backend computes it
  if (int64_t{d.n} * d.c > 0) {
    const int64_t entries = int64_t{d.n} * d.c;
    dropout_mask_kernel<<<blocks_for(static_cast<size_t>(entries)), kBlockSize, 0, s>>>(
        d.n, d.c, p, keep_scale, seeds, mask);
    DP_CUDA_CHECK(cudaGetLastError());
  }
  apply_channel_mask(s, d, mask, src, dst);
}

template <typename S>
void dropout2d_backward(cudaStream_t s, const Shape& d, const float* mask, const S* diff_dst,
                        S* diff_src) {
  apply_channel_mask(s, d, mask, diff_dst, diff_src);
}

#define DP_INSTANTIATE(S)                                                                          \
  template void dropout2d_forward<S>(cudaStream_t, const Shape&, float, const uint64_t*, const S*, \
                                     float*, S*);                                                  \
  template void dropout2d_backward<S>(cudaStream_t, const Shape&, const float*, const S*, S*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(__nv_bfloat16)
#undef DP_INSTANTIATE

}  // namespace dp::cuda::kernels
