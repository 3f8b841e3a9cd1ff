// Element-wise CUDA kernels (fill, axpy) with grid-stride loops; exercise the .cu build path.
#include "dp/cuda/device.hpp"
#include "launch.cuh"

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
