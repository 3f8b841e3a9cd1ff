// Helpers of the CUDA kernel files (internal): strides, vectors, storage types, sums, launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "launch.cuh"

// Notes for every kernel of the family files (elementwise.cu, conv_kernels.cu, batchnorm.cu, ...):
// - 1-D element-wise kernels use grid-stride loops over int64 indices.
// - Per-channel NHWC kernels use detail::channel_grid: each thread owns one channel (its
//   per-channel constants load once into registers) and strides over pixels.
// - Spatial kernels (max-pool, upsample, dropout) decompose pixel indices with 32-bit integer
//   division when the pixel count allows (64-bit division is a long emulated sequence on GPUs).
// - Reductions accumulate per thread, reduce per block (warp shuffles or shared memory) and end
//   with one atomicAdd per block and output value into a zeroed result: the order of the
//   floating-point additions, hence the last bits of a sum, can change from run to run.
// - Activation kernels are templates over the storage type S of their tensors: float or
//   __nv_bfloat16, or (vectorised) float4 or Bf16x4 (4 channels). They widen each element to its
//   compute type (float, float4), compute in fp32 and store the result as S (bf16: rounded to
//   nearest even, once per op).
// - nvcc contracts a * b + c into FMAs (its default -fmad=true), so element-wise results may
//   differ from the CPU backend's in the last bit; batchnorm_prepare avoids contraction on purpose
//   (its running statistics match the CPU's bit for bit where the CPU build does not contract
//   either, as on x86-64 without -march).
namespace dp::cuda::kernels {

namespace {

using detail::blocks_for;
using detail::channel_grid;
using detail::kBlockSize;
using detail::kMaxBlocks;
using detail::kReduceBlocks;

constexpr unsigned kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Grid-stride loop over [0, n).
#define DP_GRID_STRIDE(i, n)                                                \
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// Grid-stride loop over the pixels [0, n) of a channel_grid launch (index type I).
#define DP_PIXEL_STRIDE(I, p, n) \
  for (I p = I(blockIdx.y) * blockDim.y + threadIdx.y; p < (n); p += I(gridDim.y) * blockDim.y)

// Runs f(I{}) with I = uint32_t when every index below `n` fits (with room for a grid stride),
// else with I = uint64_t.
template <typename F>
void with_index_type(int64_t n, F&& f) {
  if (n <= INT32_MAX)
    f(uint32_t{});
  else
    f(uint64_t{});
}

// ---------------------------------------------------------------------------------------------
// 16-byte vectors. Memory-bound kernels move float4 (or 4 bf16) per thread where the channel
// count (or element count) and every pointer allow it: 4x fewer memory instructions and index
// computations, and 4x the bytes in flight per thread. Each component is computed by the same
// expression as the scalar kernel's.

__device__ __forceinline__ float4 operator+(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float4 operator*(float s, float4 a) {
  return make_float4(s * a.x, s * a.y, s * a.z, s * a.w);
}

template <typename T>
__device__ __forceinline__ T zero_value();
template <>
__device__ __forceinline__ float zero_value<float>() {
  return 0.0f;
}
template <>
__device__ __forceinline__ float4 zero_value<float4>() {
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ float relu_of(float v) {
  return fmaxf(v, 0.0f);
}
__device__ __forceinline__ float4 relu_of(float4 v) {
  return make_float4(fmaxf(v.x, 0.0f), fmaxf(v.y, 0.0f), fmaxf(v.z, 0.0f), fmaxf(v.w, 0.0f));
}

// The ReLU's backward: g where the ReLU's output y is positive, else 0.
__device__ __forceinline__ float relu_mask(float y, float g) {
  return y > 0.0f ? g : 0.0f;
}
__device__ __forceinline__ float4 relu_mask(float4 y, float4 g) {
  return make_float4(y.x > 0.0f ? g.x : 0.0f, y.y > 0.0f ? g.y : 0.0f, y.z > 0.0f ? g.z : 0.0f,
                     y.w > 0.0f ? g.w : 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Storage types.

// 4 bf16 as one 8-byte word.
struct alignas(8) Bf16x4 {
  __nv_bfloat162 lo, hi;
};

// The compute type of a storage type, and its 4-channel vector.
template <typename S>
struct Storage;
template <>
struct Storage<float> {
  using compute = float;
  using vec4 = float4;
};
template <>
struct Storage<float4> {
  using compute = float4;
};
template <>
struct Storage<__nv_bfloat16> {
  using compute = float;
  using vec4 = Bf16x4;
};
template <>
struct Storage<Bf16x4> {
  using compute = float4;
};
template <typename S>
using compute_t = typename Storage<S>::compute;
template <typename S>
using vec4_t = typename Storage<S>::vec4;

__device__ __forceinline__ Bf16x4 to_bf16x4(float4 v) {
  return {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
}
__device__ __forceinline__ float4 from_bf16x4(Bf16x4 v) {
  const float2 lo = __bfloat1622float2(v.lo), hi = __bfloat1622float2(v.hi);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// A stored element as its compute type (exact).
__device__ __forceinline__ float widen(float v) {
  return v;
}
__device__ __forceinline__ float4 widen(float4 v) {
  return v;
}
__device__ __forceinline__ float widen(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float4 widen(Bf16x4 v) {
  return from_bf16x4(v);
}

// A computed value stored as S (bf16: rounded to nearest even, NaN kept, beyond range +-inf).
template <typename S>
__device__ __forceinline__ S store_as(compute_t<S> v);
template <>
__device__ __forceinline__ float store_as<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float4 store_as<float4>(float4 v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 store_as<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ Bf16x4 store_as<Bf16x4>(float4 v) {
  return to_bf16x4(v);
}

// Whether every pointer suits the 4-channel vector of storage type S (16 bytes for float4, 8 for
// Bf16x4).
template <typename S, typename... P>
bool aligned_vec4(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % alignof(vec4_t<S>) == 0) && ...);
}
template <typename S, typename P>
const vec4_t<S>* as_vec4(const P* p) {
  return reinterpret_cast<const vec4_t<S>*>(p);
}
template <typename S, typename P>
vec4_t<S>* as_vec4(P* p) {
  return reinterpret_cast<vec4_t<S>*>(p);
}

// ---------------------------------------------------------------------------------------------
// Block reductions.

// Sum of v over the block (blockDim.x == kBlockSize, 1-D); the result is valid in thread 0.
// Every thread must call it; it may be called repeatedly (it synchronises before returning).
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[kBlockSize / kWarp];
  for (unsigned o = kWarp / 2; o > 0; o /= 2) v += __shfl_down_sync(kFullMask, v, o);
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / kWarp ? warp_sums[lane] : T(0);
    for (unsigned o = kWarp / 2; o > 0; o /= 2) v += __shfl_down_sync(kFullMask, v, o);
  }
  __syncthreads();
  return v;
}

// Per-channel reduction of a channel_grid block: acc[v] of every thread (channel k) summed over
// threadIdx.y, then out[v * c + k] += that sum (one atomic per block, channel and value).
// Every thread must call it, including those with k >= c (their acc is zero).
template <typename T, int V>
__device__ void channel_block_sum(const T (&acc)[V], T* out, int c, int k) {
  __shared__ T smem[V][kBlockSize];
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int v = 0; v < V; ++v) smem[v][t] = acc[v];
  __syncthreads();
  for (unsigned half = blockDim.y / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
#pragma unroll
      for (int v = 0; v < V; ++v) smem[v][t] += smem[v][t + half * blockDim.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && k < c) {
#pragma unroll
    for (int v = 0; v < V; ++v) atomicAdd(out + int64_t{v} * c + k, smem[v][threadIdx.x]);
  }
}

// 1-D launch of `kernel` over n elements; n == 0 launches nothing.
template <typename Kernel, typename... Args>
void launch_1d(cudaStream_t s, int64_t n, size_t max_blocks, Kernel kernel, Args... args) {
  if (n <= 0) return;
  kernel<<<blocks_for(static_cast<size_t>(n), max_blocks), kBlockSize, 0, s>>>(n, args...);
  DP_CUDA_CHECK(cudaGetLastError());
}

// channel_grid launch of `kernel` over pixels x c; nothing when either is 0.
template <typename Kernel, typename... Args>
void launch_channels(cudaStream_t s, int64_t pixels, int c, size_t max_blocks, Kernel kernel,
                     Args... args) {
  if (pixels <= 0 || c <= 0) return;
  const auto cg = channel_grid(pixels, c, max_blocks);
  kernel<<<cg.grid, cg.block, 0, s>>>(pixels, c, args...);
  DP_CUDA_CHECK(cudaGetLastError());
}

inline void zero(cudaStream_t s, void* p, size_t bytes) {
  if (bytes > 0) DP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
}

}  // namespace

}  // namespace dp::cuda::kernels
