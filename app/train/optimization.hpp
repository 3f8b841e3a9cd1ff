// dptrain's optimiser and learning rate from its options: --optimizer, --lr-schedule,
// --warmup-epochs, --warmup-steps, --lr-scaling.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dp/backend.hpp"
#include "dp/optim.hpp"
#include "dp/params.hpp"
#include "train/options.hpp"

namespace dp::app {

// SGD (momentum, nesterov, weight decay) or AdamW (betas, eps, decoupled weight decay).
std::unique_ptr<Optimizer> make_optimizer(const TrainOptions& o, ParamStore& params,
                                          Backend& backend);

// --lr-schedule auto: cosine where a run sees at least kCosineMinImages training images in all
// (`train_images` x --epochs; independent of the world size, so a resume on another one keeps
// the schedule), else constant. In the recipe search (docs/real-data.md) AdamW with cosine was
// the best on DeepCrack (240 images x 15 epochs) and the worst on CrackForest (72 x 15), whose
// 135 steps at batch 8 do not reach a good model before the decay; a constant rate there won.
inline constexpr int64_t kCosineMinImages = 2000;
LrScheduleKind auto_lr_schedule(int64_t train_images, int epochs);

// The epochs of --lr-schedule cooldown's decay: --cooldown-epochs, or a fifth of --epochs
// rounded up (at least 1).
int64_t cooldown_epochs(const TrainOptions& o);

// The LR of epoch `epoch` (0-based) on `world` ranks: --lr times the --lr-scaling factor of
// world x --accumulation-steps, then the schedule (per epoch) with its warm-up.
double epoch_lr(const TrainOptions& o, int64_t epoch, int world);

// The LR of optimiser step `step` (1-based over the run) in an epoch at `lr`: --warmup-steps'
// linear ramp on top of the epoch's LR.
double step_lr(const TrainOptions& o, double lr, int64_t step);

}  // namespace dp::app
