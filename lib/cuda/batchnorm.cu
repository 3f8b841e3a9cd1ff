// CUDA batch-norm kernels: sums, moments and running statistics, apply, the backward steps.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

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

}  // namespace

template <typename S>
void batchnorm_stats(cudaStream_t s, const Shape& d, const S* src, double* sums) {
  if (d.c <= 0) return;
  zero(s, sums, 2 * sizeof(double) * static_cast<size_t>(d.c));
  launch_channels(s, d.pixels(), d.c, kReduceBlocks, batchnorm_stats_kernel<S>, src, sums);
}

namespace {

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

}  // namespace

void batchnorm_prepare(cudaStream_t s, int channels, bool training, const double* sums,
                       double count, float eps, float momentum, float* running_mean,
                       float* running_var, float* mean, float* invstd) {
  // As the CPU backend: the unbiasing factor in double, then rounded to float.
  const float unbias = count > 1 ? static_cast<float>(count / (count - 1)) : 1.0f;
  launch_1d(s, channels, kMaxBlocks, batchnorm_prepare_kernel, training, sums, count, eps, momentum,
            unbias, running_mean, running_var, mean, invstd);
}

namespace {

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

}  // namespace

template <typename S>
void batchnorm_apply(cudaStream_t s, const Shape& d, const S* src, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, bool relu,
                     S* dst) {
  launch_channels(s, d.pixels(), d.c, kMaxBlocks, batchnorm_apply_kernel<S>, src, mean, invstd,
                  gamma, beta, relu, dst);
}

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

template <typename S>
void batchnorm_backward_apply(cudaStream_t s, const Shape& d, const S* src, const S* diff_dst,
                              const float* mean, const float* invstd, const float* gamma,
                              const double* sums, double count, bool training, S* diff_src,
                              bool accumulate) {
  launch_channels(s, d.pixels(), d.c, kMaxBlocks, batchnorm_backward_apply_kernel<S>, src, diff_dst,
                  mean, invstd, gamma, sums, count, training, diff_src, accumulate);
}

#define DP_INSTANTIATE(S)                                                                         \
  template void batchnorm_stats<S>(cudaStream_t, const Shape&, const S*, double*);                \
  template void batchnorm_apply<S>(cudaStream_t, const Shape&, const S*, const float*,            \
                                   const float*, const float*, const float*, bool, S*);           \
  template void batchnorm_backward_stats<S>(cudaStream_t, const Shape&, const S*, const S*, bool, \
                                            S*, const float*, const float*, double*, float*,      \
                                            float*);                                              \
  template void batchnorm_backward_apply<S>(cudaStream_t, const Shape&, const S*, const S*,       \
                                            const float*, const float*, const float*,             \
                                            const double*, double, bool, S*, bool);
DP_INSTANTIATE(float)
DP_INSTANTIATE(__nv_bfloat16)
#undef DP_INSTANTIATE

}  // namespace dp::cuda::kernels
