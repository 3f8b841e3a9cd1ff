// CPU losses on fp32 logits (BCE with pos_weight, focal, soft Dice) and the confusion counts.
#include <cmath>
#include <cstdint>

#include "ops.hpp"

namespace dp::cpu {

double bce_with_logits(int64_t count, const float* x, const float* y, float pos_weight,
                       float grad_scale, float* dx) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    // loss = (1-y) x + (1 + (pw-1) y) * softplus(-x); softplus(-x) = log1p(exp(-|x|)) + max(-x,
    // 0)
    const float w = 1.0f + (pos_weight - 1.0f) * y[i];
    const float softplus = std::log1p(std::exp(-std::fabs(x[i]))) + std::fmax(-x[i], 0.0f);
    sum += static_cast<double>((1.0f - y[i]) * x[i] + w * softplus);
    const float sig_neg = 1.0f / (1.0f + std::exp(x[i]));  // sigmoid(-x)
    dx[i] = ((1.0f - y[i]) - w * sig_neg) * grad_scale;
  }
  return sum;
}

double focal_with_logits(int64_t count, const float* x, const float* y, float alpha, float gamma,
                         float grad_scale, float* dx) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    // z = +x for a crack pixel, -x for background: p_t = sigmoid(z), BCE = softplus(-z).
    const bool crack = y[i] > 0.5f;
    const float z = crack ? x[i] : -x[i];
    const float a = alpha < 0.0f ? 1.0f : crack ? alpha : 1.0f - alpha;
    const float ce = std::log1p(std::exp(-std::fabs(z))) + std::fmax(-z, 0.0f);
    const float q = 1.0f / (1.0f + std::exp(z));  // 1 - p_t
    const float pt = 1.0f - q;
    const float qg = gamma == 0.0f ? 1.0f : std::pow(q, gamma);
    sum += static_cast<double>(a * qg * ce);
    // d/dz [q^gamma ce] = -q^gamma (gamma p_t ce + q), since dq/dz = -q p_t and dce/dz = -q.
    const float dz = -a * qg * (gamma * pt * ce + q);
    dx[i] = (crack ? dz : -dz) * grad_scale;
  }
  return sum;
}

double dice_with_logits(int images, int64_t pixels, const float* x, const float* y, float smooth,
                        float grad_scale, float* dx, bool accumulate) {
  double total = 0.0;
  for (int img = 0; img < images; ++img) {
    const float* xi = x + int64_t(img) * pixels;
    const float* yi = y + int64_t(img) * pixels;
    float* di = dx + int64_t(img) * pixels;
    double inter = 0.0, card = 0.0;
#pragma omp parallel for reduction(+ : inter, card) schedule(static)
    for (int64_t j = 0; j < pixels; ++j) {
      const double p = 1.0 / (1.0 + std::exp(-double(xi[j])));
      inter += p * yi[j];
      card += p + yi[j];
    }
    const double den = card + smooth, num = 2.0 * inter + smooth;
    total += 1.0 - num / den;
    // d(1 - num/den)/dp_j = -(2 t_j den - num) / den^2; dp/dx = p (1 - p).
    const float a = float(2.0 / den * grad_scale), b = float(num / (den * den) * grad_scale);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < pixels; ++j) {
      const float p = 1.0f / (1.0f + std::exp(-xi[j]));
      const float g = (b - a * yi[j]) * p * (1.0f - p);
      di[j] = accumulate ? di[j] + g : g;
    }
  }
  return total;
}

void confusion_counts(int64_t count, const float* x, const float* y, float threshold,
                      int64_t* counts) {
  int64_t tp = 0, fp = 0, fn = 0;
#pragma omp parallel for reduction(+ : tp, fp, fn) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const bool pred = x[i] > threshold, truth = y[i] > 0.5f;
    tp += pred && truth;
    fp += pred && !truth;
    fn += !pred && truth;
  }
  counts[0] += tp;
  counts[1] += fp;
  counts[2] += fn;
}

}  // namespace dp::cpu
