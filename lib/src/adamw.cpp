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

AdamW::AdamW(ParamStore& params, Backend& backend, AdamWOptions options)
    : params_(params),
      backend_(backend),
      options_(options),
      exp_avg_(static_cast<size_t>(params.arena_size()) * sizeof(float),
               params.value_buffer().device()),
      exp_avg_sq_(static_cast<size_t>(params.arena_size()) * sizeof(float),
                  params.value_buffer().device()) {}

void AdamW::update(float lr, int64_t t) {
  DP_CHECK(t >= 1, "AdamW::update: step number must be >= 1, got ", t);
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const float decay = 1.0f - lr * options_.weight_decay;
  const float step_size = lr / float(1.0 - std::pow(double(b1), double(t)));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(b2), double(t))));
  backend_.adamw_update(params_.arena_size(), params_.values(), params_.grads(), exp_avg_.f32(),
                        exp_avg_sq_.f32(), decay, b1, b2, eps, step_size, bc2_sqrt);
}

double clip_grad_norm(Backend& backend, float* grads, int64_t count, double max_norm) {
  const double norm = std::sqrt(backend.sum_squares(count, grads));
  scale_to_max_norm(backend, grads, count, norm, max_norm);
  return norm;
}

void scale_to_max_norm(Backend& backend, float* grads, int64_t count, double norm,
                       double max_norm) {
  const double coef = max_norm / (norm + kClipEpsilon);
  if (coef < 1.0) backend.scale(count, float(coef), grads);
}

double scheduled_lr(const LrSchedule& s, int64_t epoch) {
  DP_CHECK(epoch >= 0 && s.warmup >= 0 && s.step_size >= 1, "scheduled_lr: epoch ", epoch,
           ", warm-up ", s.warmup, ", step size ", s.step_size);
  DP_CHECK(s.kind != LrScheduleKind::kAuto, "scheduled_lr: the auto schedule is not resolved");
  if (epoch < s.warmup) return s.base * double(epoch + 1) / double(s.warmup + 1);
  switch (s.kind) {
    case LrScheduleKind::kCosine: {
      const double span = double(std::max<int64_t>(s.epochs - s.warmup, 1));
      return s.base * 0.5 * (1.0 + std::cos(std::numbers::pi * double(epoch - s.warmup) / span));
    }
    case LrScheduleKind::kCooldown: {
      DP_CHECK(s.cooldown >= 1, "scheduled_lr: cooldown of ", s.cooldown, " epochs");
      const int64_t left = s.epochs - epoch;  // epochs from this one to the end
      return left > s.cooldown ? s.base : s.base * double(left) / double(s.cooldown + 1);
    }
    case LrScheduleKind::kStep:
      return s.base * std::pow(s.gamma, double(epoch / s.step_size));
    case LrScheduleKind::kConstant:
    case LrScheduleKind::kAuto:
      break;
  }
  return s.base;
}

double warmup_factor(int64_t step, int64_t warmup_steps) {
  DP_CHECK(step >= 1 && warmup_steps >= 0, "warmup_factor: step ", step, ", warm-up steps ",
           warmup_steps);
  return step >= warmup_steps ? 1.0 : double(step) / double(warmup_steps);
}

double lr_scale(LrScaling scaling, int world, int accumulation) {
  const double n = double(world) * double(accumulation);
  switch (scaling) {
    case LrScaling::kLinear:
      return n;
    case LrScaling::kSqrt:
      return std::sqrt(n);
    case LrScaling::kNone:
      break;
  }
  return 1.0;
}

}  // namespace dp
