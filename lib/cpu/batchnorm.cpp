// CPU batch norm: per-channel sums, moments and running statistics, apply, the backward steps.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dp/bf16.hpp"
#include "ops.hpp"

namespace dp {

void batchnorm_moments(const double* sums, int channels, double count, float eps, float* mean,
                       float* var, float* invstd) {
  for (int k = 0; k < channels; ++k) {
    const double m = sums[k] / count;
    const double v = std::max(0.0, sums[channels + k] / count - m * m);
    mean[k] = float(m);
    var[k] = float(v);
    invstd[k] = float(1.0 / std::sqrt(v + double(eps)));
  }
}

namespace cpu {
namespace {

template <typename T>
void batchnorm_backward_stats_loop(const Dims& d, const T* src, const T* dst, bool relu,
                                   T* diff_dst, const float* mean, const float* invstd,
                                   double* sums) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
  std::fill(sums, sums + 2 * c, 0.0);
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
    T* dy = diff_dst + p * c;
    if (relu) {
      const T* y = dst + p * c;
      for (int k = 0; k < c; ++k)
        if (!(to_float(y[k]) > 0.0f)) dy[k] = from_float<T>(0.0f);
    }
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const double g = to_float(dy[k]);
      sums[k] += g;
      sums[c + k] += g * (to_float(x[k]) - mean[k]) * invstd[k];
    }
  }
}

template <typename T>
void batchnorm_backward_apply_loop(const Dims& d, const T* src, const T* diff_dst,
                                   const float* mean, const float* invstd, const float* gamma,
                                   const float* mean_dy, const float* mean_dy_xhat, T* diff_src,
                                   bool accumulate) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
    const T* dy = diff_dst + p * c;
    T* dx = diff_src + p * c;
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const float xhat = (to_float(x[k]) - mean[k]) * invstd[k];
      const float v =
          gamma[k] * invstd[k] * (to_float(dy[k]) - mean_dy[k] - xhat * mean_dy_xhat[k]);
      dx[k] = from_float<T>(accumulate ? to_float(dx[k]) + v : v);
    }
  }
}

}  // namespace

template <typename T>
void batchnorm_stats(const Dims& d, const T* src, double* sums) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
  std::fill(sums, sums + 2 * c, 0.0);
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const double v = to_float(x[k]);
      sums[k] += v;
      sums[c + k] += v * v;
    }
  }
}

void batchnorm_prepare(int channels, bool training, const double* sums, double count, float eps,
                       float momentum, float* running_mean, float* running_var, float* mean,
                       float* invstd, std::vector<float>& var) {
  if (!training) {
    for (int k = 0; k < channels; ++k) {
      mean[k] = running_mean[k];
      invstd[k] = 1.0f / std::sqrt(running_var[k] + eps);
    }
    return;
  }
  var.resize(size_t(channels));
  batchnorm_moments(sums, channels, count, eps, mean, var.data(), invstd);
  const float unbias = count > 1 ? float(count / (count - 1)) : 1.0f;
  for (int k = 0; k < channels; ++k) {
    running_mean[k] = (1 - momentum) * running_mean[k] + momentum * mean[k];
    running_var[k] = (1 - momentum) * running_var[k] + momentum * var[size_t(k)] * unbias;
  }
}

template <typename T>
void batchnorm_apply(const Dims& d, const T* src, const float* mean, const float* invstd,
                     const float* gamma, const float* beta, bool relu, T* dst) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
    T* y = dst + p * c;
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const float v = gamma[k] * (to_float(x[k]) - mean[k]) * invstd[k] + beta[k];
      y[k] = from_float<T>(relu ? std::fmax(v, 0.0f) : v);
    }
  }
}

template <typename T>
void batchnorm_backward_stats(const Dims& d, const T* src, const T* dst, bool relu, T* diff_dst,
                              const float* mean, const float* invstd, double* sums,
                              float* diff_gamma, float* diff_beta) {
  batchnorm_backward_stats_loop(d, src, dst, relu, diff_dst, mean, invstd, sums);
  for (int k = 0; k < d.c; ++k) {
    diff_gamma[k] = float(sums[d.c + k]);
    diff_beta[k] = float(sums[k]);
  }
}

template <typename T>
void batchnorm_backward_apply(const Dims& d, const T* src, const T* diff_dst, const float* mean,
                              const float* invstd, const float* gamma, const double* sums,
                              double count, bool training, T* diff_src, bool accumulate,
                              std::vector<float>& mean_dy, std::vector<float>& mean_dy_xhat) {
  const int c = d.c;
  mean_dy.resize(size_t(c));
  mean_dy_xhat.resize(size_t(c));
  for (int k = 0; k < c; ++k) {
    mean_dy[size_t(k)] = training ? float(sums[k] / count) : 0.0f;
    mean_dy_xhat[size_t(k)] = training ? float(sums[c + k] / count) : 0.0f;
  }
  batchnorm_backward_apply_loop(d, src, diff_dst, mean, invstd, gamma, mean_dy.data(),
                                mean_dy_xhat.data(), diff_src, accumulate);
}

#define DP_INSTANTIATE(T)                                                                         \
  template void batchnorm_stats<T>(const Dims&, const T*, double*);                               \
  template void batchnorm_apply<T>(const Dims&, const T*, const float*, const float*,             \
                                   const float*, const float*, bool, T*);                         \
  template void batchnorm_backward_stats<T>(const Dims&, const T*, const T*, bool, T*,            \
                                            const float*, const float*, double*, float*, float*); \
  template void batchnorm_backward_apply<T>(                                                      \
      const Dims&, const T*, const T*, const float*, const float*, const float*, const double*,   \
      double, bool, T*, bool, std::vector<float>&, std::vector<float>&);
DP_INSTANTIATE(float)
DP_INSTANTIATE(bf16)
#undef DP_INSTANTIATE

}  // namespace cpu
}  // namespace dp
