// CUDA kernels on fp32 parameters: SGD, AdamW, clipping's sum of squares and scale, EMA, swap.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

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

}  // namespace

void sgd_update(cudaStream_t s, int64_t count, float* param, const float* grad, float* momentum_buf,
                float lr, float momentum, float weight_decay, bool nesterov) {
  launch_1d(s, count, kMaxBlocks, sgd_kernel, param, grad, momentum_buf, lr, momentum, weight_decay,
            nesterov);
}

namespace {

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

}  // namespace

void adamw_update(cudaStream_t s, int64_t count, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                  float step_size, float bc2_sqrt) {
  launch_1d(s, count, kMaxBlocks, adamw_kernel, param, grad, exp_avg, exp_avg_sq, decay, beta1,
            beta2, eps, step_size, bc2_sqrt);
}

namespace {

__global__ void sum_squares_kernel(int64_t n, const float* src, double* result) {
  double sum = 0.0;
  DP_GRID_STRIDE(i, n) {
    const double v = src[i];
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) atomicAdd(result, sum);
}

}  // namespace

void sum_squares(cudaStream_t s, int64_t count, const float* src, double* result) {
  zero(s, result, sizeof(double));
  launch_1d(s, count, kReduceBlocks, sum_squares_kernel, src, result);
}

namespace {

__global__ void scale_kernel(int64_t n, float alpha, float* dst) {
  DP_GRID_STRIDE(i, n) dst[i] *= alpha;
}

}  // namespace

void scale(cudaStream_t s, int64_t count, float alpha, float* dst) {
  launch_1d(s, count, kMaxBlocks, scale_kernel, alpha, dst);
}

namespace {

__global__ void ema_update_kernel(int64_t n, const float* src, float decay, float* avg) {
  const float keep = decay, take = 1.0f - decay;
  DP_GRID_STRIDE(i, n) avg[i] = __fadd_rn(__fmul_rn(keep, avg[i]), __fmul_rn(take, src[i]));
}

}  // namespace

void ema_update(cudaStream_t s, int64_t count, const float* src, float decay, float* avg) {
  launch_1d(s, count, kMaxBlocks, ema_update_kernel, src, decay, avg);
}

namespace {

__global__ void swap_kernel(int64_t n, float* a, float* b) {
  DP_GRID_STRIDE(i, n) {
    const float t = a[i];
    a[i] = b[i];
    b[i] = t;
  }
}

}  // namespace

void swap(cudaStream_t s, int64_t count, float* a, float* b) {
  launch_1d(s, count, kMaxBlocks, swap_kernel, a, b);
}

}  // namespace dp::cuda::kernels
