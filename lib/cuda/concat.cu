// CUDA concatenation along channels: forward and backward kernels and launchers.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

#define DP_INSTANTIATE(S)                                                                       \
  template void concat_forward<S>(cudaStream_t, const Shape&, const S*, const Shape&, const S*, \
                                  S*);                                                          \
  template void concat_backward<S>(cudaStream_t, const Shape&, const Shape&, const S*, S*, S*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(__nv_bfloat16)
#undef DP_INSTANTIATE

}  // namespace dp::cuda::kernels
