// CUDA loss kernels (BCE with pos_weight, focal, soft Dice, soft clDice) and the confusion counts.
#include <cstdint>
#include <vector>

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

// Soft clDice, as the CPU backend's soft_cldice_with_logits (lib/cpu/loss.cpp): the same
// windows, first extrema, halves at ties and gathering backward passes, one thread per pixel.
// `n` counts the pixels of all images; each image is h x w.

__device__ int64_t vertical_min(const float* img, int y, int x, int h, int w) {
  int64_t best = int64_t(y > 0 ? y - 1 : y) * w + x;
  for (int yy = (y > 0 ? y : y + 1); yy <= y + 1 && yy < h; ++yy)
    if (img[int64_t(yy) * w + x] < img[best]) best = int64_t(yy) * w + x;
  return best;
}

__device__ int64_t horizontal_min(const float* img, int y, int x, int w) {
  const int64_t row = int64_t(y) * w;
  int64_t best = row + (x > 0 ? x - 1 : x);
  for (int xx = (x > 0 ? x : x + 1); xx <= x + 1 && xx < w; ++xx)
    if (img[row + xx] < img[best]) best = row + xx;
  return best;
}

__device__ int64_t window_max(const float* img, int y, int x, int h, int w) {
  int64_t best = -1;
  for (int yy = y - 1; yy <= y + 1; ++yy) {
    if (yy < 0 || yy >= h) continue;
    for (int xx = x - 1; xx <= x + 1; ++xx) {
      if (xx < 0 || xx >= w) continue;
      const int64_t i = int64_t(yy) * w + xx;
      if (best < 0 || img[i] > img[best]) best = i;
    }
  }
  return best;
}

__global__ void sigmoid_kernel(int64_t n, const float* x, float* p) {
  DP_GRID_STRIDE(i, n) p[i] = 1.0f / (1.0f + expf(-x[i]));
}

__global__ void erode_kernel(int64_t n, int h, int w, const float* in, float* out) {
  const int64_t hw = int64_t(h) * w;
  DP_GRID_STRIDE(i, n) {
    const float* img = in + i / hw * hw;
    const int y = int(i % hw / w), x = int(i % w);
    out[i] = fminf(img[vertical_min(img, y, x, h, w)], img[horizontal_min(img, y, x, w)]);
  }
}

__global__ void dilate_kernel(int64_t n, int h, int w, const float* in, float* out) {
  const int64_t hw = int64_t(h) * w;
  DP_GRID_STRIDE(i, n) {
    const float* img = in + i / hw * hw;
    out[i] = img[window_max(img, int(i % hw / w), int(i % w), h, w)];
  }
}

// skel = prev + relu(d - prev d) (prev == nullptr: skel = d), d = relu(img - opened).
__global__ void skeleton_level_kernel(int64_t n, const float* img, const float* opened,
                                      const float* prev, float* skel) {
  DP_GRID_STRIDE(i, n) {
    const float d = fmaxf(img[i] - opened[i], 0.0f);
    skel[i] = prev == nullptr ? d : prev[i] + fmaxf(d - prev[i] * d, 0.0f);
  }
}

// One image's sums: [0] sum S(p) t, [1] sum S(p), [2] sum S(t) p, [3] sum S(t).
__global__ void cldice_sums_kernel(int64_t n, const float* pred_skel, const float* y,
                                   const float* truth_skel, const float* p, double* sums) {
  double st = 0.0, sp = 0.0, sens = 0.0, sk = 0.0;
  DP_GRID_STRIDE(i, n) {
    st += double(pred_skel[i]) * y[i];
    sp += pred_skel[i];
    sens += double(truth_skel[i]) * p[i];
    sk += truth_skel[i];
  }
  st = block_sum(st);
  sp = block_sum(sp);
  sens = block_sum(sens);
  sk = block_sum(sk);
  if (threadIdx.x == 0) {
    atomicAdd(sums + 0, st);
    atomicAdd(sums + 1, sp);
    atomicAdd(sums + 2, sens);
    atomicAdd(sums + 3, sk);
  }
}

// The loss's derivatives from an image's sums: d/dS(p)_j = a t_j + b, d/dp_j (direct) = c S(t)_j.
struct CldiceCoefficients {
  float a, b, c;
};

__device__ CldiceCoefficients cldice_coefficients(const double* s, float smooth) {
  const double tp = (s[0] + smooth) / (s[1] + smooth), ts = (s[2] + smooth) / (s[3] + smooth);
  const double dl_dtp = -2.0 * ts * ts / ((tp + ts) * (tp + ts));
  const double dl_dts = -2.0 * tp * tp / ((tp + ts) * (tp + ts));
  return {float(dl_dtp / (s[1] + smooth)),
          float(-dl_dtp * (s[0] + smooth) / ((s[1] + smooth) * (s[1] + smooth))),
          float(dl_dts / (s[3] + smooth))};
}

__global__ void cldice_skeleton_grad_kernel(int64_t n, int64_t hw, const float* y,
                                            const double* sums, float smooth, float* g_skel) {
  DP_GRID_STRIDE(i, n) {
    const CldiceCoefficients k = cldice_coefficients(sums + 4 * (i / hw), smooth);
    g_skel[i] = k.a * y[i] + k.b;
  }
}

// Back through one level: updates g_skel to the gradient of prev, writes the gradient of
// opened and the direct part of img's.
__global__ void skeleton_level_backward_kernel(int64_t n, const float* img, const float* opened,
                                               const float* prev, float* g_skel, float* g_opened,
                                               float* g_direct) {
  DP_GRID_STRIDE(i, n) {
    const float d = fmaxf(img[i] - opened[i], 0.0f);
    float gd = g_skel[i];
    if (prev != nullptr) {
      const bool on = d - prev[i] * d > 0.0f;
      gd = on ? g_skel[i] * (1.0f - prev[i]) : 0.0f;
      if (on) g_skel[i] -= g_skel[i] * d;
    }
    const bool pos = img[i] - opened[i] > 0.0f;
    g_opened[i] = pos ? -gd : 0.0f;
    g_direct[i] = pos ? gd : 0.0f;
  }
}

__global__ void dilate_backward_kernel(int64_t n, int h, int w, const float* in, const float* g_out,
                                       const float* add, float* g_in) {
  const int64_t hw = int64_t(h) * w;
  DP_GRID_STRIDE(i, n) {
    const int64_t base = i / hw * hw, q = i - base;
    const float* img = in + base;
    const int y = int(q / w), x = int(q % w);
    float sum = add != nullptr ? add[i] : 0.0f;
    for (int ry = y - 1; ry <= y + 1; ++ry) {
      if (ry < 0 || ry >= h) continue;
      for (int rx = x - 1; rx <= x + 1; ++rx)
        if (rx >= 0 && rx < w && window_max(img, ry, rx, h, w) == q)
          sum += g_out[base + int64_t(ry) * w + rx];
    }
    g_in[i] = sum;
  }
}

__global__ void erode_backward_kernel(int64_t n, int h, int w, const float* in, const float* g_out,
                                      const float* add, float* g_in) {
  const int64_t hw = int64_t(h) * w;
  DP_GRID_STRIDE(i, n) {
    const int64_t base = i / hw * hw, q = i - base;
    const float* img = in + base;
    const int y = int(q / w), x = int(q % w);
    float sum = add != nullptr ? add[i] : 0.0f;
    for (int r = 0; r < 6; ++r) {
      const bool vertical = r < 3;
      const int ry = vertical ? y + r - 1 : y, rx = vertical ? x : x + r - 4;
      if (ry < 0 || ry >= h || rx < 0 || rx >= w) continue;
      const int64_t v = vertical_min(img, ry, rx, h, w), hmin = horizontal_min(img, ry, rx, w);
      if ((vertical ? v : hmin) != q) continue;
      const float a = img[vertical ? v : hmin], b = img[vertical ? hmin : v];
      const float share = a < b ? 1.0f : a == b ? 0.5f : 0.0f;
      sum += share * g_out[base + int64_t(ry) * w + rx];
    }
    g_in[i] = sum;
  }
}

__global__ void cldice_grad_kernel(int64_t n, int64_t hw, const float* g_img,
                                   const float* truth_skel, const float* p, const double* sums,
                                   float smooth, float grad_scale, float* dx, bool accumulate) {
  DP_GRID_STRIDE(i, n) {
    const CldiceCoefficients k = cldice_coefficients(sums + 4 * (i / hw), smooth);
    const float gp = g_img[i] + k.c * truth_skel[i];
    const float gx = gp * p[i] * (1.0f - p[i]) * grad_scale;
    dx[i] = accumulate ? dx[i] + gx : gx;
  }
}

// The soft skeleton of img[0]: fills img[1..K], eroded_last, opened[0..K], skel[0..K].
void soft_skeleton(cudaStream_t s, int64_t n, int h, int w, int iterations, float* const* img,
                   float* eroded_last, float* const* opened, float* const* skel) {
  for (int j = 0; j <= iterations; ++j) {
    float* eroded = j < iterations ? img[j + 1] : eroded_last;
    launch_1d(s, n, kMaxBlocks, erode_kernel, h, w, img[j], eroded);
    launch_1d(s, n, kMaxBlocks, dilate_kernel, h, w, eroded, opened[j]);
    launch_1d(s, n, kMaxBlocks, skeleton_level_kernel, img[j], opened[j],
              j > 0 ? skel[j - 1] : nullptr, skel[j]);
  }
}

}  // namespace

size_t soft_cldice_scratch_floats(int images, int height, int width, int iterations) {
  return size_t(images) * size_t(height) * size_t(width) * (3 * size_t(iterations) + 10);
}

void soft_cldice_with_logits(cudaStream_t s, int images, int height, int width, const float* logits,
                             const float* target, int iterations, float smooth, float grad_scale,
                             float* diff_logits, bool accumulate, float* scratch, double* sums) {
  const int64_t hw = int64_t(height) * width, n = int64_t(images) * hw;
  const size_t k = size_t(iterations);
  float* next = scratch;
  auto take = [&] {
    float* a = next;
    next += n;
    return a;
  };
  std::vector<float*> img(k + 1), opened(k + 1), skel(k + 1);
  for (auto* v : {&img, &opened, &skel})
    for (float*& a : *v) a = take();
  float* eroded_last = take();
  float* truth_skel = take();
  float *g_skel = take(), *g_img = take(), *g_direct = take(), *g_opened = take(),
        *g_eroded = take();

  DP_CUDA_CHECK(
      cudaMemcpyAsync(img[0], target, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, s));
  soft_skeleton(s, n, height, width, iterations, img.data(), eroded_last, opened.data(),
                skel.data());
  DP_CUDA_CHECK(
      cudaMemcpyAsync(truth_skel, skel[k], sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, s));
  float* p = img[0];
  launch_1d(s, n, kMaxBlocks, sigmoid_kernel, logits, p);
  soft_skeleton(s, n, height, width, iterations, img.data(), eroded_last, opened.data(),
                skel.data());
  zero(s, sums, 4 * sizeof(double) * size_t(images));
  for (int i = 0; i < images; ++i)
    launch_1d(s, hw, kReduceBlocks, cldice_sums_kernel, skel[k] + i * hw, target + i * hw,
              truth_skel + i * hw, p + i * hw, sums + 4 * i);
  launch_1d(s, n, kMaxBlocks, cldice_skeleton_grad_kernel, hw, target, sums, smooth, g_skel);
  for (size_t j = k + 1; j-- > 0;) {
    launch_1d(s, n, kMaxBlocks, skeleton_level_backward_kernel, img[j], opened[j],
              j > 0 ? skel[j - 1] : nullptr, g_skel, g_opened, g_direct);
    const float* eroded = j < k ? img[j + 1] : eroded_last;
    launch_1d(s, n, kMaxBlocks, dilate_backward_kernel, height, width, eroded, g_opened,
              j < k ? g_img : nullptr, g_eroded);
    launch_1d(s, n, kMaxBlocks, erode_backward_kernel, height, width, img[j], g_eroded, g_direct,
              g_img);
  }
  launch_1d(s, n, kMaxBlocks, cldice_grad_kernel, hw, g_img, truth_skel, p, sums, smooth,
            grad_scale, diff_logits, accumulate);
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
