// The CUDA backend's own kernels: every op that is not a cuDNN call, as lib/cpu/cpu_backend.cpp.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernels.cuh"
#include "launch.cuh"

// Notes for every kernel here:
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

// ---------------------------------------------------------------------------------------------
// Element-wise kernels.

template <typename S>
__global__ void add_kernel(int64_t n, const S* a, const S* b, bool relu, S* dst) {
  DP_GRID_STRIDE(i, n) {
    const float v = widen(a[i]) + widen(b[i]);
    dst[i] = store_as<S>(relu ? fmaxf(v, 0.0f) : v);
  }
}

// S scalar or a 4-channel vector (the launcher runs the scalar kernel over the remainder).
template <typename S>
__global__ void relu_backward_kernel(int64_t n, const S* dst, const S* diff_dst, S* diff_src) {
  DP_GRID_STRIDE(i, n) diff_src[i] = store_as<S>(relu_mask(widen(dst[i]), widen(diff_dst[i])));
}

template <typename S>
__global__ void accumulate_kernel(int64_t n, const S* src, S* dst) {
  DP_GRID_STRIDE(i, n) dst[i] = store_as<S>(widen(dst[i]) + widen(src[i]));
}

__global__ void scale_kernel(int64_t n, float alpha, float* dst) {
  DP_GRID_STRIDE(i, n) dst[i] *= alpha;
}

__global__ void ema_update_kernel(int64_t n, const float* src, float decay, float* avg) {
  const float keep = decay, take = 1.0f - decay;
  DP_GRID_STRIDE(i, n) avg[i] = __fadd_rn(__fmul_rn(keep, avg[i]), __fmul_rn(take, src[i]));
}

__global__ void swap_kernel(int64_t n, float* a, float* b) {
  DP_GRID_STRIDE(i, n) {
    const float t = a[i];
    a[i] = b[i];
    b[i] = t;
  }
}

__global__ void sum_squares_kernel(int64_t n, const float* src, double* result) {
  double sum = 0.0;
  DP_GRID_STRIDE(i, n) {
    const double v = src[i];
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) atomicAdd(result, sum);
}

// ---------------------------------------------------------------------------------------------
// Conversions between storage types, with the convolutions' epilogue (bias, ReLU).

// dst[i] = act(widen(src[i])) stored as Out (In, Out: scalar or 4-channel vectors of one compute
// type). May run in place when In == Out.
template <typename In, typename Out>
__global__ void convert_kernel(int64_t n, const In* src, bool relu, Out* dst) {
  DP_GRID_STRIDE(i, n) {
    const compute_t<Out> v = widen(src[i]);
    dst[i] = store_as<Out>(relu ? relu_of(v) : v);
  }
}

// The same with a per-channel bias over NHWC [pixels, c] (c counts 4-channel groups for vectors).
template <typename In, typename Out>
__global__ void convert_bias_kernel(int64_t pixels, int c, const In* src,
                                    const compute_t<Out>* bias, bool relu, Out* dst) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  const compute_t<Out> b = bias[k];
  DP_PIXEL_STRIDE(int64_t, p, pixels) {
    const compute_t<Out> v = widen(src[p * c + k]) + b;
    dst[p * c + k] = store_as<Out>(relu ? relu_of(v) : v);
  }
}

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

// ---------------------------------------------------------------------------------------------
// Batch norm.

template <typename S>
__global__ void batchnorm_stats_kernel(int64_t pixels, int c, const S* src, double* sums) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  double acc[2] = {0.0, 0.0};
  if (k < c) {
    DP_PIXEL_STRIDE(int64_t, p, pixels) {
      const double x = widen(src[p * c + k]);
      acc[0] += x;
      acc[1] += x * x;
    }
  }
  channel_block_sum(acc, sums, c, k);
}

// The double arithmetic of dp::batchnorm_moments and the float arithmetic of the CPU backend's
// running-statistics update, with explicit roundings (no FMA contraction) so that the results
// are the CPU's bit for bit.
__global__ void batchnorm_prepare_kernel(int64_t c, bool training, const double* sums, double count,
                                         float eps, float momentum, float unbias,
                                         float* running_mean, float* running_var, float* mean,
                                         float* invstd) {
  DP_GRID_STRIDE(k, c) {
    if (!training) {
      mean[k] = running_mean[k];
      invstd[k] = 1.0f / sqrtf(__fadd_rn(running_var[k], eps));
      continue;
    }
    const double m = __ddiv_rn(sums[k], count);
    const double v = fmax(0.0, __dsub_rn(__ddiv_rn(sums[c + k], count), __dmul_rn(m, m)));
    const float mean_f = static_cast<float>(m), var_f = static_cast<float>(v);
    mean[k] = mean_f;
    invstd[k] = static_cast<float>(1.0 / sqrt(__dadd_rn(v, static_cast<double>(eps))));
    const float keep = 1.0f - momentum;
    running_mean[k] = __fadd_rn(__fmul_rn(keep, running_mean[k]), __fmul_rn(momentum, mean_f));
    running_var[k] =
        __fadd_rn(__fmul_rn(keep, running_var[k]), __fmul_rn(__fmul_rn(momentum, var_f), unbias));
  }
}

template <typename S>
__global__ void batchnorm_apply_kernel(int64_t pixels, int c, const S* src, const float* mean,
                                       const float* invstd, const float* gamma, const float* beta,
                                       bool relu, S* dst) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  const float m = mean[k], is = invstd[k], g = gamma[k], b = beta[k];
  DP_PIXEL_STRIDE(int64_t, p, pixels) {
    const int64_t i = p * c + k;
    const float v = g * (widen(src[i]) - m) * is + b;
    dst[i] = store_as<S>(relu ? fmaxf(v, 0.0f) : v);
  }
}

template <typename S>
__global__ void batchnorm_backward_stats_kernel(int64_t pixels, int c, const S* src, const S* dst,
                                                bool relu, S* diff_dst, const float* mean,
                                                const float* invstd, double* sums) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  double acc[2] = {0.0, 0.0};
  if (k < c) {
    const float m = mean[k];
    const double is = invstd[k];
    DP_PIXEL_STRIDE(int64_t, p, pixels) {
      const int64_t i = p * c + k;
      float dy = widen(diff_dst[i]);
      if (relu) {
        if (!(widen(dst[i]) > 0.0f)) dy = 0.0f;
        diff_dst[i] = store_as<S>(dy);  // exact
      }
      acc[0] += dy;
      acc[1] += static_cast<double>(dy) * static_cast<double>(widen(src[i]) - m) * is;
    }
  }
  channel_block_sum(acc, sums, c, k);
}

__global__ void batchnorm_param_grads_kernel(int64_t c, const double* sums, float* diff_gamma,
                                             float* diff_beta) {
  DP_GRID_STRIDE(k, c) {
    diff_gamma[k] = static_cast<float>(sums[c + k]);
    diff_beta[k] = static_cast<float>(sums[k]);
  }
}

template <typename S>
__global__ void batchnorm_backward_apply_kernel(int64_t pixels, int c, const S* src,
                                                const S* diff_dst, const float* mean,
                                                const float* invstd, const float* gamma,
                                                const double* sums, double count, bool training,
                                                S* diff_src, bool accumulate) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  const float m = mean[k], is = invstd[k];
  const float g_is = gamma[k] * is;
  const float mean_dy = training ? static_cast<float>(sums[k] / count) : 0.0f;
  const float mean_dy_xhat = training ? static_cast<float>(sums[c + k] / count) : 0.0f;
  DP_PIXEL_STRIDE(int64_t, p, pixels) {
    const int64_t i = p * c + k;
    const float xhat = (widen(src[i]) - m) * is;
    const float v = g_is * (widen(diff_dst[i]) - mean_dy - xhat * mean_dy_xhat);
    diff_src[i] = store_as<S>(accumulate ? widen(diff_src[i]) + v : v);
  }
}

// ---------------------------------------------------------------------------------------------
// Dropout2d.

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

// ---------------------------------------------------------------------------------------------
// Max-pool 2x2 / 2.

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
    argmax[o] = which;
  }
}

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

// ---------------------------------------------------------------------------------------------
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
// CPU backend's expression ty.w0 (tx.w0 a + tx.w1 b) + ty.w1 (tx.w0 d + tx.w1 e).
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
    out[0] = store_as<S>(ty0.w0 * (tx0.w0 * s00 + tx0.w1 * s01) +
                         ty0.w1 * (tx0.w0 * s10 + tx0.w1 * s11));
    out[c] = store_as<S>(ty0.w0 * (tx1.w0 * s01 + tx1.w1 * s02) +
                         ty0.w1 * (tx1.w0 * s11 + tx1.w1 * s12));
    out += ow * c;
    out[0] = store_as<S>(ty1.w0 * (tx0.w0 * s10 + tx0.w1 * s11) +
                         ty1.w1 * (tx0.w0 * s20 + tx0.w1 * s21));
    out[c] = store_as<S>(ty1.w0 * (tx1.w0 * s11 + tx1.w1 * s12) +
                         ty1.w1 * (tx1.w0 * s21 + tx1.w1 * s22));
  }
}

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

// ---------------------------------------------------------------------------------------------
// Concat along channels.

// c = ca + cb channels in dst. Moves elements as they are stored (T: float, __nv_bfloat16, or a
// 4-channel vector: c and cb count groups of 4 channels).
template <typename T>
__global__ void concat_forward_kernel(int64_t pixels, int c, int cb, const T* a, const T* b,
                                      T* dst) {
  const int ca = c - cb;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  DP_PIXEL_STRIDE(int64_t, p, pixels) {
    dst[p * c + k] = k < ca ? a[p * ca + k] : b[p * cb + (k - ca)];
  }
}

template <typename T>
__global__ void concat_backward_kernel(int64_t pixels, int c, int cb, const T* diff_dst, T* diff_a,
                                       T* diff_b) {
  const int ca = c - cb;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= c) return;
  DP_PIXEL_STRIDE(int64_t, p, pixels) {
    const T v = diff_dst[p * c + k];
    if (k < ca)
      diff_a[p * ca + k] = v;
    else
      diff_b[p * cb + (k - ca)] = v;
  }
}

// ---------------------------------------------------------------------------------------------
// Loss and metrics.

// loss = (1 - y) x + (1 + (pw - 1) y) softplus(-x), softplus(-x) = log1p(exp(-|x|)) + max(-x, 0);
// d loss / dx = (1 - y) - w sigmoid(-x).
__global__ void bce_kernel(int64_t n, const float* x, const float* y, float pos_weight,
                           float grad_scale, float* dx, double* loss_sum) {
  double sum = 0.0;
  DP_GRID_STRIDE(i, n) {
    const float xi = x[i], yi = y[i];
    const float w = 1.0f + (pos_weight - 1.0f) * yi;
    const float softplus = log1pf(expf(-fabsf(xi))) + fmaxf(-xi, 0.0f);
    sum += static_cast<double>((1.0f - yi) * xi + w * softplus);
    const float sig_neg = 1.0f / (1.0f + expf(xi));
    dx[i] = ((1.0f - yi) - w * sig_neg) * grad_scale;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) atomicAdd(loss_sum, sum);
}

// Focal loss, as CpuBackend::focal_with_logits (z = +-x: the logit of the true class).
__global__ void focal_kernel(int64_t n, const float* x, const float* y, float alpha, float gamma,
                             float grad_scale, float* dx, double* loss_sum) {
  double sum = 0.0;
  DP_GRID_STRIDE(i, n) {
    const bool crack = y[i] > 0.5f;
    const float z = crack ? x[i] : -x[i];
    const float a = alpha < 0.0f ? 1.0f : crack ? alpha : 1.0f - alpha;
    const float ce = log1pf(expf(-fabsf(z))) + fmaxf(-z, 0.0f);
    const float q = 1.0f / (1.0f + expf(z));
    const float pt = 1.0f - q;
    const float qg = gamma == 0.0f ? 1.0f : powf(q, gamma);
    sum += static_cast<double>(a * qg * ce);
    const float dz = -a * qg * (gamma * pt * ce + q);
    dx[i] = (crack ? dz : -dz) * grad_scale;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) atomicAdd(loss_sum, sum);
}

// One image's Dice sums: sums[0] += sum(p t), sums[1] += sum(p) + sum(t).
__global__ void dice_sums_kernel(int64_t n, const float* x, const float* y, double* sums) {
  double inter = 0.0, card = 0.0;
  DP_GRID_STRIDE(i, n) {
    const double p = 1.0 / (1.0 + exp(-static_cast<double>(x[i])));
    inter += p * y[i];
    card += p + y[i];
  }
  inter = block_sum(inter);
  card = block_sum(card);
  if (threadIdx.x == 0) {
    atomicAdd(sums + 0, inter);
    atomicAdd(sums + 1, card);
  }
}

__global__ void dice_grad_kernel(int64_t n, int64_t pixels, const float* x, const float* y,
                                 const double* sums, float smooth, float grad_scale, float* dx,
                                 bool accumulate) {
  DP_GRID_STRIDE(i, n) {
    const double* s = sums + 2 * (i / pixels);
    const double den = s[1] + smooth, num = 2.0 * s[0] + smooth;
    const float a = static_cast<float>(2.0 / den * grad_scale);
    const float b = static_cast<float>(num / (den * den) * grad_scale);
    const float p = 1.0f / (1.0f + expf(-x[i]));
    const float g = (b - a * y[i]) * p * (1.0f - p);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void confusion_kernel(int64_t n, const float* x, const float* y, float threshold,
                                 unsigned long long* counts) {
  unsigned long long tp = 0, fp = 0, fn = 0;
  DP_GRID_STRIDE(i, n) {
    const bool pred = x[i] > threshold, truth = y[i] > 0.5f;
    tp += pred && truth;
    fp += pred && !truth;
    fn += !pred && truth;
  }
  tp = block_sum(tp);
  fp = block_sum(fp);
  fn = block_sum(fn);
  if (threadIdx.x == 0) {
    if (tp) atomicAdd(counts + 0, tp);
    if (fp) atomicAdd(counts + 1, fp);
    if (fn) atomicAdd(counts + 2, fn);
  }
}

// ---------------------------------------------------------------------------------------------
// Optimisers.

__global__ void sgd_kernel(int64_t n, float* param, const float* grad, float* momentum_buf,
                           float lr, float momentum, float weight_decay, bool nesterov) {
  DP_GRID_STRIDE(i, n) {
    const float p = param[i];
    const float g = grad[i] + weight_decay * p;
    const float buf = momentum * momentum_buf[i] + g;
    momentum_buf[i] = buf;
    param[i] = p - lr * (nesterov ? g + momentum * buf : buf);
  }
}

__global__ void adamw_kernel(int64_t n, float* param, const float* grad, float* exp_avg,
                             float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                             float step_size, float bc2_sqrt) {
  DP_GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - step_size * m / (sqrtf(v) / bc2_sqrt + eps);
  }
}

#undef DP_GRID_STRIDE
#undef DP_PIXEL_STRIDE

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

void zero(cudaStream_t s, void* p, size_t bytes) {
  if (bytes > 0) DP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers.

template <typename S>
void add_forward(cudaStream_t s, int64_t count, const S* a, const S* b, bool relu, S* dst) {
  launch_1d(s, count, kMaxBlocks, add_kernel<S>, a, b, relu, dst);
}

template <typename S>
void relu_backward(cudaStream_t s, int64_t count, const S* dst, const S* diff_dst, S* diff_src) {
  int64_t done = 0;
  if (aligned_vec4<S>(dst, diff_dst, diff_src)) {
    done = count / 4 * 4;
    launch_1d(s, count / 4, kMaxBlocks, relu_backward_kernel<vec4_t<S>>, as_vec4<S>(dst),
              as_vec4<S>(diff_dst), as_vec4<S>(diff_src));
  }
  launch_1d(s, count - done, kMaxBlocks, relu_backward_kernel<S>, dst + done, diff_dst + done,
            diff_src + done);
}

template <typename S>
void accumulate(cudaStream_t s, int64_t count, const S* src, S* dst) {
  launch_1d(s, count, kMaxBlocks, accumulate_kernel<S>, src, dst);
}

void scale(cudaStream_t s, int64_t count, float alpha, float* dst) {
  launch_1d(s, count, kMaxBlocks, scale_kernel, alpha, dst);
}

void ema_update(cudaStream_t s, int64_t count, const float* src, float decay, float* avg) {
  launch_1d(s, count, kMaxBlocks, ema_update_kernel, src, decay, avg);
}

void swap(cudaStream_t s, int64_t count, float* a, float* b) {
  launch_1d(s, count, kMaxBlocks, swap_kernel, a, b);
}

void sum_squares(cudaStream_t s, int64_t count, const float* src, double* result) {
  zero(s, result, sizeof(double));
  launch_1d(s, count, kReduceBlocks, sum_squares_kernel, src, result);
}

template <typename In, typename Out>
void convert(cudaStream_t s, int64_t pixels, int c, const In* src, const float* bias, bool relu,
             Out* dst) {
  if (pixels <= 0 || c <= 0) return;
  const bool v4 = aligned_vec4<In>(src) && aligned_vec4<Out>(dst);
  if (bias != nullptr) {
    if (v4 && c % 4 == 0 && aligned_vec4<float>(bias))
      launch_channels(s, pixels, c / 4, kMaxBlocks, convert_bias_kernel<vec4_t<In>, vec4_t<Out>>,
                      as_vec4<In>(src), as_vec4<float>(bias), relu, as_vec4<Out>(dst));
    else
      launch_channels(s, pixels, c, kMaxBlocks, convert_bias_kernel<In, Out>, src, bias, relu, dst);
    return;
  }
  const int64_t count = pixels * c;
  int64_t done = 0;
  if (v4) {
    done = count / 4 * 4;
    launch_1d(s, count / 4, kMaxBlocks, convert_kernel<vec4_t<In>, vec4_t<Out>>, as_vec4<In>(src),
              relu, as_vec4<Out>(dst));
  }
  launch_1d(s, count - done, kMaxBlocks, convert_kernel<In, Out>, src + done, relu, dst + done);
}

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

template <typename S>
void batchnorm_stats(cudaStream_t s, const Shape& d, const S* src, double* sums) {
  if (d.c <= 0) return;
  zero(s, sums, 2 * sizeof(double) * static_cast<size_t>(d.c));
  launch_channels(s, d.pixels(), d.c, kReduceBlocks, batchnorm_stats_kernel<S>, src, sums);
}

void batchnorm_prepare(cudaStream_t s, int channels, bool training, const double* sums,
                       double count, float eps, float momentum, float* running_mean,
                       float* running_var, float* mean, float* invstd) {
  // As the CPU backend: the unbiasing factor in double, then rounded to float.
  const float unbias = count > 1 ? static_cast<float>(count / (count - 1)) : 1.0f;
  launch_1d(s, channels, kMaxBlocks, batchnorm_prepare_kernel, training, sums, count, eps, momentum,
            unbias, running_mean, running_var, mean, invstd);
}

template <typename S>
void batchnorm_apply(cudaStream_t s, const Shape& d, const S* src, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, bool relu,
                     S* dst) {
  launch_channels(s, d.pixels(), d.c, kMaxBlocks, batchnorm_apply_kernel<S>, src, mean, invstd,
                  gamma, beta, relu, dst);
}

template <typename S>
void batchnorm_backward_stats(cudaStream_t s, const Shape& d, const S* src, const S* dst, bool relu,
                              S* diff_dst, const float* mean, const float* invstd, double* sums,
                              float* diff_gamma, float* diff_beta) {
  if (d.c <= 0) return;
  zero(s, sums, 2 * sizeof(double) * static_cast<size_t>(d.c));
  launch_channels(s, d.pixels(), d.c, kReduceBlocks, batchnorm_backward_stats_kernel<S>, src, dst,
                  relu, diff_dst, mean, invstd, sums);
  launch_1d(s, d.c, kMaxBlocks, batchnorm_param_grads_kernel, sums, diff_gamma, diff_beta);
}

template <typename S>
void batchnorm_backward_apply(cudaStream_t s, const Shape& d, const S* src, const S* diff_dst,
                              const float* mean, const float* invstd, const float* gamma,
                              const double* sums, double count, bool training, S* diff_src,
                              bool accumulate) {
  launch_channels(s, d.pixels(), d.c, kMaxBlocks, batchnorm_backward_apply_kernel<S>, src, diff_dst,
                  mean, invstd, gamma, sums, count, training, diff_src, accumulate);
}

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

template <typename S>
void concat_forward(cudaStream_t s, const Shape& a_dims, const S* a, const Shape& b_dims,
                    const S* b, S* dst) {
  DP_CHECK(a_dims.n == b_dims.n && a_dims.h == b_dims.h && a_dims.w == b_dims.w,
           "concat: shapes differ: [", a_dims.n, ",", a_dims.h, ",", a_dims.w, ",", a_dims.c,
           "] vs [", b_dims.n, ",", b_dims.h, ",", b_dims.w, ",", b_dims.c, "]");
  if (a_dims.c % 4 == 0 && b_dims.c % 4 == 0 && aligned_vec4<S>(a, b, dst))
    launch_channels(s, a_dims.pixels(), (a_dims.c + b_dims.c) / 4, kMaxBlocks,
                    concat_forward_kernel<vec4_t<S>>, b_dims.c / 4, as_vec4<S>(a), as_vec4<S>(b),
                    as_vec4<S>(dst));
  else
    launch_channels(s, a_dims.pixels(), a_dims.c + b_dims.c, kMaxBlocks, concat_forward_kernel<S>,
                    b_dims.c, a, b, dst);
}

template <typename S>
void concat_backward(cudaStream_t s, const Shape& a_dims, const Shape& b_dims, const S* diff_dst,
                     S* diff_a, S* diff_b) {
  DP_CHECK(a_dims.n == b_dims.n && a_dims.h == b_dims.h && a_dims.w == b_dims.w,
           "concat: shapes differ: [", a_dims.n, ",", a_dims.h, ",", a_dims.w, ",", a_dims.c,
           "] vs [", b_dims.n, ",", b_dims.h, ",", b_dims.w, ",", b_dims.c, "]");
  if (a_dims.c % 4 == 0 && b_dims.c % 4 == 0 && aligned_vec4<S>(diff_dst, diff_a, diff_b))
    launch_channels(s, a_dims.pixels(), (a_dims.c + b_dims.c) / 4, kMaxBlocks,
                    concat_backward_kernel<vec4_t<S>>, b_dims.c / 4, as_vec4<S>(diff_dst),
                    as_vec4<S>(diff_a), as_vec4<S>(diff_b));
  else
    launch_channels(s, a_dims.pixels(), a_dims.c + b_dims.c, kMaxBlocks, concat_backward_kernel<S>,
                    b_dims.c, diff_dst, diff_a, diff_b);
}

void bce_with_logits(cudaStream_t s, int64_t count, const float* logits, const float* target,
                     float pos_weight, float grad_scale, float* diff_logits, double* loss_sum) {
  zero(s, loss_sum, sizeof(double));
  launch_1d(s, count, kReduceBlocks, bce_kernel, logits, target, pos_weight, grad_scale,
            diff_logits, loss_sum);
}

void focal_with_logits(cudaStream_t s, int64_t count, const float* logits, const float* target,
                       float alpha, float gamma, float grad_scale, float* diff_logits,
                       double* loss_sum) {
  zero(s, loss_sum, sizeof(double));
  launch_1d(s, count, kReduceBlocks, focal_kernel, logits, target, alpha, gamma, grad_scale,
            diff_logits, loss_sum);
}

void dice_with_logits(cudaStream_t s, int images, int64_t pixels, const float* logits,
                      const float* target, float smooth, float grad_scale, float* diff_logits,
                      bool accumulate, double* sums) {
  zero(s, sums, 2 * sizeof(double) * size_t(images));
  for (int i = 0; i < images; ++i)
    launch_1d(s, pixels, kReduceBlocks, dice_sums_kernel, logits + int64_t(i) * pixels,
              target + int64_t(i) * pixels, sums + 2 * i);
  launch_1d(s, int64_t(images) * pixels, kMaxBlocks, dice_grad_kernel, pixels, logits, target,
            static_cast<const double*>(sums), smooth, grad_scale, diff_logits, accumulate);
}

void confusion_counts(cudaStream_t s, int64_t count, const float* logits, const float* target,
                      float logit_threshold, unsigned long long* counts) {
  launch_1d(s, count, kReduceBlocks, confusion_kernel, logits, target, logit_threshold, counts);
}

void sgd_update(cudaStream_t s, int64_t count, float* param, const float* grad, float* momentum_buf,
                float lr, float momentum, float weight_decay, bool nesterov) {
  launch_1d(s, count, kMaxBlocks, sgd_kernel, param, grad, momentum_buf, lr, momentum, weight_decay,
            nesterov);
}

void adamw_update(cudaStream_t s, int64_t count, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                  float step_size, float bc2_sqrt) {
  launch_1d(s, count, kMaxBlocks, adamw_kernel, param, grad, exp_avg, exp_avg_sq, decay, beta1,
            beta2, eps, step_size, bc2_sqrt);
}

// ---------------------------------------------------------------------------------------------
// The activation storage types the backend uses.

#define DP_INSTANTIATE_ACTIVATION_OPS(S)                                                           \
  template void add_forward<S>(cudaStream_t, int64_t, const S*, const S*, bool, S*);               \
  template void relu_backward<S>(cudaStream_t, int64_t, const S*, const S*, S*);                   \
  template void accumulate<S>(cudaStream_t, int64_t, const S*, S*);                                \
  template void output_grad<S>(cudaStream_t, int64_t, int, const S*, S*, float*, float*);          \
  template void batchnorm_stats<S>(cudaStream_t, const Shape&, const S*, double*);                 \
  template void batchnorm_apply<S>(cudaStream_t, const Shape&, const S*, const float*,             \
                                   const float*, const float*, const float*, bool, S*);            \
  template void batchnorm_backward_stats<S>(cudaStream_t, const Shape&, const S*, const S*, bool,  \
                                            S*, const float*, const float*, double*, float*,       \
                                            float*);                                               \
  template void batchnorm_backward_apply<S>(cudaStream_t, const Shape&, const S*, const S*,        \
                                            const float*, const float*, const float*,              \
                                            const double*, double, bool, S*, bool);                \
  template void dropout2d_forward<S>(cudaStream_t, const Shape&, float, const uint64_t*, const S*, \
                                     float*, S*);                                                  \
  template void dropout2d_backward<S>(cudaStream_t, const Shape&, const float*, const S*, S*);     \
  template void maxpool2x2_forward<S>(cudaStream_t, const Shape&, const S*, S*, uint8_t*);         \
  template void maxpool2x2_backward<S>(cudaStream_t, const Shape&, const uint8_t*, const S*, S*,   \
                                       bool);                                                      \
  template void upsample2x_forward<S>(cudaStream_t, const Shape&, const S*, S*);                   \
  template void upsample2x_backward<S>(cudaStream_t, const Shape&, const S*, S*);                  \
  template void concat_forward<S>(cudaStream_t, const Shape&, const S*, const Shape&, const S*,    \
                                  S*);                                                             \
  template void concat_backward<S>(cudaStream_t, const Shape&, const Shape&, const S*, S*, S*);

DP_INSTANTIATE_ACTIVATION_OPS(float)
DP_INSTANTIATE_ACTIVATION_OPS(__nv_bfloat16)
#undef DP_INSTANTIATE_ACTIVATION_OPS

template void convert<float, float>(cudaStream_t, int64_t, int, const float*, const float*, bool,
                                    float*);
template void convert<float, __nv_bfloat16>(cudaStream_t, int64_t, int, const float*, const float*,
                                            bool, __nv_bfloat16*);
template void convert<__nv_bfloat16, float>(cudaStream_t, int64_t, int, const __nv_bfloat16*,
                                            const float*, bool, float*);
template void convert<__nv_bfloat16, __nv_bfloat16>(cudaStream_t, int64_t, int,
                                                    const __nv_bfloat16*, const float*, bool,
                                                    __nv_bfloat16*);

}  // namespace dp::cuda::kernels
