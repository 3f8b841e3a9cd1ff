// AdamW (PyTorch torch.optim.AdamW semantics: decoupled weight decay, bias correction), gradient
// clipping by global L2 norm, LR schedules and LR scaling.
#pragma once

#include <cstdint>
#include <string>

#include "dp/buffer.hpp"
#include "dp/optim.hpp"
#include "dp/params.hpp"

namespace dp {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

// Per element, step t (1-based), as torch.optim.AdamW (amsgrad off):
//   p -= lr*wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// m and v are arenas of the parameter layout: optim/exp_avg/<name>, optim/exp_avg_sq/<name>.
class AdamW : public Optimizer {
 public:
  AdamW(ParamStore& params, Backend& backend, AdamWOptions options);
  void update(float lr, int64_t t) override;
  OptimizerState state() const override {
    return {{kExpAvg, exp_avg_.f32()}, {kExpAvgSq, exp_avg_sq_.f32()}};
  }
  const char* name() const override { return "adamw"; }
  static constexpr const char* kExpAvg = "exp_avg";
  static constexpr const char* kExpAvgSq = "exp_avg_sq";

 private:
  ParamStore& params_;
  Backend& backend_;
  AdamWOptions options_;
  Buffer exp_avg_, exp_avg_sq_;
};

// torch.nn.utils.clip_grad_norm_(norm_type=2): the L2 norm of all `count` gradients together;
// if it exceeds max_norm, every gradient is multiplied by max_norm / (norm + 1e-6). Returns the
// norm before clipping. `grads` is backend memory.
double clip_grad_norm(Backend& backend, float* grads, int64_t count, double max_norm);
// The same when the L2 norm of the gradients is already known.
void scale_to_max_norm(Backend& backend, float* grads, int64_t count, double norm, double max_norm);

// LR of epoch `epoch` (0-based), constant within an epoch (the schedule advances per epoch, as
// PyTorch schedulers stepped once an epoch):
//   constant: base                                                         (ConstantLR, factor 1)
//   step:   base * gamma^floor(epoch / step_size)                       (StepLR)
//   cosine: base * (1 + cos(pi * (epoch - warmup) / (epochs - warmup))) / 2 (CosineAnnealingLR,
//           eta_min 0, T_max the epochs after warm-up)
//   cooldown: base, then linearly towards 0 over the last `cooldown` epochs: epoch e >=
//           epochs - cooldown runs at base * (epochs - e) / (cooldown + 1) (ConstantLR then
//           LinearLR; the warm-up-stable-decay schedule of Hu et al. 2024, Hägele et al. 2024)
// During the first `warmup` epochs the LR is base * (epoch + 1) / (warmup + 1) (LinearLR with
// start_factor 1/(warmup+1), reaching base at epoch `warmup`).
// kAuto is a caller's choice between the others (dptrain's --lr-schedule auto), resolved before
// scheduled_lr, which refuses it.
enum class LrScheduleKind { kAuto, kConstant, kStep, kCosine, kCooldown };
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kStep;
  double base = 0.01;
  int64_t epochs = 1;
  int64_t warmup = 0;
  int64_t step_size = 30;
  double gamma = 0.1;
  int64_t cooldown = 1;  // epochs of the cooldown's linear decay
};
double scheduled_lr(const LrSchedule& s, int64_t epoch);

// Per-step linear warm-up on top of the epoch schedule: the factor of optimiser step `step`
// (1-based over the run) is step / warmup_steps until it reaches 1 (0 steps: always 1). Adam's
// first updates move every weight by about the LR whatever its gradient's size, which can
// switch off a network without batch norm before it has learnt anything; short runs have too
// few steps for a whole warm-up epoch.
double warmup_factor(int64_t step, int64_t warmup_steps);

// --lr-scaling: the factor for --lr with `world` ranks and `accumulation` micro-batches per step
// (the global batch grows by world x accumulation): none 1, linear n, sqrt sqrt(n).
enum class LrScaling { kNone, kLinear, kSqrt };
double lr_scale(LrScaling scaling, int world, int accumulation);

}  // namespace dp
