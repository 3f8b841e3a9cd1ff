// Optimiser construction and the per-epoch learning rate from dptrain's options.
#include "train/optimization.hpp"

#include <algorithm>

#include "dp/adamw.hpp"

namespace dp::app {

std::unique_ptr<Optimizer> make_optimizer(const TrainOptions& o, ParamStore& params,
                                          Backend& backend) {
  if (o.optimizer == OptimizerKind::kAdamW)
    return std::make_unique<AdamW>(params, backend,
                                   AdamWOptions{float(o.adam_beta1), float(o.adam_beta2),
                                                float(o.adam_eps), float(o.weight_decay)});
  return std::make_unique<Sgd>(
      params, backend,
      SgdOptions{float(o.lr), float(o.momentum), float(o.weight_decay), o.nesterov});
}

LrScheduleKind auto_lr_schedule(int64_t train_images, int epochs) {
  return train_images * int64_t(epochs) >= kCosineMinImages ? LrScheduleKind::kCosine
                                                            : LrScheduleKind::kConstant;
}

int64_t cooldown_epochs(const TrainOptions& o) {
  return o.cooldown_epochs > 0 ? o.cooldown_epochs : std::max<int64_t>((o.epochs + 4) / 5, 1);
}

double epoch_lr(const TrainOptions& o, int64_t epoch, int world) {
  LrSchedule s;
  s.kind = o.lr_schedule;
  s.base = o.lr * lr_scale(o.lr_scaling, world, o.accumulation_steps);
  s.epochs = o.epochs;
  s.warmup = o.warmup_epochs;
  s.step_size = o.lr_step;
  s.gamma = o.lr_gamma;
  s.cooldown = cooldown_epochs(o);
  return scheduled_lr(s, epoch);
}

double step_lr(const TrainOptions& o, double lr, int64_t step) {
  return lr * warmup_factor(step, o.warmup_steps);
}

}  // namespace dp::app
