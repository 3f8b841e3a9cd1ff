// CUDA element-wise kernels: conversions (and conv epilogue), add, ReLU backward, accumulate, fill.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

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

}  // namespace

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

namespace {

template <typename S>
__global__ void add_kernel(int64_t n, const S* a, const S* b, bool relu, S* dst) {
  DP_GRID_STRIDE(i, n) {
    const float v = widen(a[i]) + widen(b[i]);
    dst[i] = store_as<S>(relu ? fmaxf(v, 0.0f) : v);
  }
}

}  // namespace

template <typename S>
void add_forward(cudaStream_t s, int64_t count, const S* a, const S* b, bool relu, S* dst) {
  launch_1d(s, count, kMaxBlocks, add_kernel<S>, a, b, relu, dst);
}

namespace {

// S scalar or a 4-channel vector (the launcher runs the scalar kernel over the remainder).
template <typename S>
__global__ void relu_backward_kernel(int64_t n, const S* dst, const S* diff_dst, S* diff_src) {
  DP_GRID_STRIDE(i, n) diff_src[i] = store_as<S>(relu_mask(widen(dst[i]), widen(diff_dst[i])));
}

}  // namespace

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

namespace {

template <typename S>
__global__ void accumulate_kernel(int64_t n, const S* src, S* dst) {
  DP_GRID_STRIDE(i, n) dst[i] = store_as<S>(widen(dst[i]) + widen(src[i]));
}

}  // namespace

template <typename S>
void accumulate(cudaStream_t s, int64_t count, const S* src, S* dst) {
  launch_1d(s, count, kMaxBlocks, accumulate_kernel<S>, src, dst);
}

#define DP_INSTANTIATE(S)                                                            \
  template void add_forward<S>(cudaStream_t, int64_t, const S*, const S*, bool, S*); \
  template void relu_backward<S>(cudaStream_t, int64_t, const S*, const S*, S*);     \
  template void accumulate<S>(cudaStream_t, int64_t, const S*, S*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(__nv_bfloat16)
#undef DP_INSTANTIATE

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

namespace dp::cuda {

namespace {

using detail::blocks_for;
using detail::kBlockSize;

__global__ void fill_kernel(float* dst, size_t n, float value) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = value;
}

__global__ void axpy_kernel(float* dst, const float* src, size_t n, float alpha) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] += alpha * src[i];
}

}  // namespace

void fill(float* dst, size_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kBlockSize, 0, stream>>>(dst, n, value);
  DP_CUDA_CHECK(cudaGetLastError());
}

void axpy(float* dst, const float* src, size_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return;
  axpy_kernel<<<blocks_for(n), kBlockSize, 0, stream>>>(dst, src, n, alpha);
  DP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dp::cuda
