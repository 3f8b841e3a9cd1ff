// CUDA loss kernels (BCE with pos_weight, focal, soft Dice) and the confusion counts.
#include <cstdint>

#include "dp/cuda/device.hpp"
#include "kernel_util.cuh"
#include "kernels.cuh"

namespace dp::cuda::kernels {

namespace {

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

}  // namespace

void bce_with_logits(cudaStream_t s, int64_t count, const float* logits, const float* target,
                     float pos_weight, float grad_scale, float* diff_logits, double* loss_sum) {
  zero(s, loss_sum, sizeof(double));
  launch_1d(s, count, kReduceBlocks, bce_kernel, logits, target, pos_weight, grad_scale,
            diff_logits, loss_sum);
}

namespace {

// Focal loss, as the CPU backend's focal_with_logits (lib/cpu/loss.cpp; z = +-x: the logit of
// the true class).
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

}  // namespace

void focal_with_logits(cudaStream_t s, int64_t count, const float* logits, const float* target,
                       float alpha, float gamma, float grad_scale, float* diff_logits,
                       double* loss_sum) {
  zero(s, loss_sum, sizeof(double));
  launch_1d(s, count, kReduceBlocks, focal_kernel, logits, target, alpha, gamma, grad_scale,
            diff_logits, loss_sum);
}

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

void confusion_counts(cudaStream_t s, int64_t count, const float* logits, const float* target,
                      float logit_threshold, unsigned long long* counts) {
  launch_1d(s, count, kReduceBlocks, confusion_kernel, logits, target, logit_threshold, counts);
}

}  // namespace dp::cuda::kernels
