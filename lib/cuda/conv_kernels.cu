// The CUDA convolutions' own kernels (beside cuDNN's conv.cpp): output gradient, bf16 filters.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

// channel_block_sum for a float4 of channels 4k .. 4k+3: out[4k + j] += the block's sum.
__device__ void channel_block_sum4(float4 acc, float* out, int c4, int k) {
  __shared__ float4 smem[kBlockSize];
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
  smem[t] = acc;
  __syncthreads();
  for (unsigned half = blockDim.y / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) smem[t] = smem[t] + smem[t + half * blockDim.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && k < c4) {
    const float4 v = smem[threadIdx.x];
    float* o = out + 4 * int64_t{k};
    atomicAdd(o, v.x);
    atomicAdd(o + 1, v.y);
    atomicAdd(o + 2, v.z);
    atomicAdd(o + 3, v.w);
  }
}

__device__ __forceinline__ void block_sum_into(float acc, float* out, int c, int k) {
  const float a[1] = {acc};
  channel_block_sum(a, out, c, k);
}
__device__ __forceinline__ void block_sum_into(float4 acc, float* out, int c4, int k) {
  channel_block_sum4(acc, out, c4, k);
}

// A convolution's output gradient in one pass over it (S a 4-channel vector: c counts groups):
// g = diff_dst masked by dst > 0 (where dst, written back to diff_dst), diff_bias += the sum of g
// over pixels (where diff_bias; zeroed by the launcher), copy = g as C (where copy).
template <typename S, typename C>
__global__ void output_grad_kernel(int64_t pixels, int c, const S* dst, S* diff_dst,
                                   float* diff_bias, C* copy) {
  using T = compute_t<S>;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  T acc = zero_value<T>();
  if (k < c) {
    DP_PIXEL_STRIDE(int64_t, p, pixels) {
      const int64_t i = p * c + k;
      T g = widen(diff_dst[i]);
      if (dst != nullptr) {
        g = relu_mask(widen(dst[i]), g);
        diff_dst[i] = store_as<S>(g);  // exact: g is a stored value or zero
      }
      if (copy != nullptr) copy[i] = store_as<C>(g);
      acc = acc + g;
    }
  }
  if (diff_bias != nullptr) block_sum_into(acc, diff_bias, c, k);  // uniform: every thread calls
}

}  // namespace

template <typename S>
void output_grad(cudaStream_t s, int64_t pixels, int c, const S* dst, S* diff_dst, float* diff_bias,
                 float* copy) {
  if (pixels <= 0 || c <= 0 || (dst == nullptr && diff_bias == nullptr && copy == nullptr)) return;
  if (diff_bias != nullptr) zero(s, diff_bias, sizeof(float) * static_cast<size_t>(c));
  // Reductions keep to kReduceBlocks (few atomics); the other cases fill the GPU.
  const size_t blocks = diff_bias != nullptr ? kReduceBlocks : kMaxBlocks;
  if (c % 4 == 0 && aligned_vec4<S>(dst, diff_dst) && aligned_vec4<float>(copy))
    launch_channels(s, pixels, c / 4, blocks, output_grad_kernel<vec4_t<S>, float4>,
                    as_vec4<S>(dst), as_vec4<S>(diff_dst), diff_bias, as_vec4<float>(copy));
  else
    launch_channels(s, pixels, c, blocks, output_grad_kernel<S, float>, dst, diff_dst, diff_bias,
                    copy);
}

namespace {

// i runs over the [k, c, rs] elements; with krsc the bf16 side is [k, rs, c].
__device__ int64_t krsc_index(int64_t i, int64_t c, int64_t rs) {
  const int64_t q = i % rs, t = i / rs;
  return (t / c * rs + q) * c + t % c;
}

__global__ void filter_to_bf16_kernel(int64_t n, int c, int rs, const float* src, bool krsc,
                                      __nv_bfloat16* dst) {
  DP_GRID_STRIDE(i, n) dst[krsc ? krsc_index(i, c, rs) : i] = __float2bfloat16_rn(src[i]);
}

__global__ void filter_from_bf16_kernel(int64_t n, int c, int rs, const __nv_bfloat16* src,
                                        bool krsc, float* dst) {
  DP_GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[krsc ? krsc_index(i, c, rs) : i]);
}

}  // namespace

void filter_to_bf16(cudaStream_t s, int k, int c, int rs, const float* src, bool krsc,
                    __nv_bfloat16* dst) {
  if (k <= 0 || c <= 0 || rs <= 0) return;
  launch_1d(s, int64_t{k} * c * rs, kMaxBlocks, filter_to_bf16_kernel, c, rs, src, krsc, dst);
}

void filter_from_bf16(cudaStream_t s, int k, int c, int rs, const __nv_bfloat16* src, bool krsc,
                      float* dst) {
  if (k <= 0 || c <= 0 || rs <= 0) return;
  launch_1d(s, int64_t{k} * c * rs, kMaxBlocks, filter_from_bf16_kernel, c, rs, src, krsc, dst);
}

#define DP_INSTANTIATE(S) \
  template void output_grad<S>(cudaStream_t, int64_t, int, const S*, S*, float*, float*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(__nv_bfloat16)
#undef DP_INSTANTIATE

}  // namespace dp::cuda::kernels
