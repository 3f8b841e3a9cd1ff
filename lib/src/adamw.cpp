// AdamW update, global-norm gradient clipping, LR schedules and scaling (PyTorch semantics).
#include "dp/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dp/error.hpp"

namespace dp {
namespace {

constexpr double kClipEpsilon = 1e-6;  // torch.nn.utils.clip_grad_norm_'s

}  // namespace

AdamW::AdamW(ParamStore& params, AdamWOptions options)
    : params_(params),
      options_(options),
      exp_avg_(static_cast<size_t>(params.arena_size()) * sizeof(float)),
      exp_avg_sq_(static_cast<size_t>(params.arena_size()) * sizeof(float)) {}

void AdamW::update(float lr, int64_t t) {
  DP_CHECK(t >= 1, "AdamW::update: step number must be >= 1, got ", t);
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const float decay = 1.0f - lr * options_.weight_decay;
  const float step_size = lr / float(1.0 - std::pow(double(b1), double(t)));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(b2), double(t))));
  const int64_t n = params_.arena_size();
  float* p = params_.values();
  const float* g = params_.grads();
  float* m = exp_avg_.f32();
  float* v = exp_avg_sq_.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    p[i] *= decay;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

double clip_grad_norm(float* grads, int64_t count, double max_norm) {
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < count; ++i) sum += double(grads[i]) * double(grads[i]);
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + kClipEpsilon);
  if (coef < 1.0) {
    const auto c = float(coef);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) grads[i] *= c;
  }
  return norm;
}

double scheduled_lr(const LrSchedule& s, int64_t epoch) {
  DP_CHECK(epoch >= 0 && s.warmup >= 0 && s.step_size >= 1, "scheduled_lr: epoch ", epoch,
           ", warm-up ", s.warmup, ", step size ", s.step_size);
  if (epoch < s.warmup) return s.base * double(epoch + 1) / double(s.warmup + 1);
  if (s.kind == "cosine") {
    const double span = double(std::max<int64_t>(s.epochs - s.warmup, 1));
    return s.base * 0.5 * (1.0 + std::cos(std::numbers::pi * double(epoch - s.warmup) / span));
  }
  DP_CHECK(s.kind == "step", "unknown LR schedule '", s.kind, "' (step or cosine)");
  return s.base * std::pow(s.gamma, double(epoch / s.step_size));
}

double lr_scale(const std::string& scaling, int world, int accumulation) {
  const double n = double(world) * double(accumulation);
  if (scaling == "linear") return n;
  if (scaling == "sqrt") return std::sqrt(n);
  DP_CHECK(scaling == "none", "unknown LR scaling '", scaling, "' (none, linear or sqrt)");
  return 1.0;
}

}  // namespace dp
