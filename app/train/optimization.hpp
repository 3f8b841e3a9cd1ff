// dptrain's optimiser and learning rate from its options: --optimizer, --lr-schedule,
// --warmup-epochs, --lr-scaling.
#pragma once

#include <cstdint>
#include <memory>

#include "dp/backend.hpp"
#include "dp/optim.hpp"
#include "dp/params.hpp"
#include "train/options.hpp"

namespace dp::app {

// SGD (momentum, nesterov, weight decay) or AdamW (betas, eps, decoupled weight decay).
std::unique_ptr<Optimizer> make_optimizer(const TrainOptions& o, ParamStore& params,
                                          Backend& backend);

// The LR of epoch `epoch` (0-based) on `world` ranks: --lr times the --lr-scaling factor of
// world x --accumulation-steps, then the schedule (per epoch) with its warm-up.
double epoch_lr(const TrainOptions& o, int64_t epoch, int world);

}  // namespace dp::app
