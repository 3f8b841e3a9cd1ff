// The shape of a training epoch on each rank: its samples, steps and batch sizes (no
// communication).
#pragma once

#include <cstdint>
#include <vector>

#include "train/options.hpp"

namespace dp::app {

// The same on every rank. Rank q visits positions q, q+W, ... < N of the epoch's global order
// (DistributedSampler without padding), then padding up to `per_rank` samples so that every rank
// takes the same number of steps with the same batch sizes; --max-steps may cut every rank's list
// to the same length. Padding samples are computed but carry no weight (no loss, gradient or
// metrics), so a step's weight is its number of real samples over all ranks and the result does
// not depend on the world size.
struct EpochPlan {
  int64_t dataset = 0;   // N: the samples of the epoch still to visit
  int world = 1;         // W
  int64_t per_rank = 0;  // samples every rank visits, padding included
  int batch = 1;
  int accumulation = 1;  // micro-batches per optimiser step

  int64_t micro_steps() const { return (per_rank + batch - 1) / batch; }
  int64_t steps() const { return (micro_steps() + accumulation - 1) / accumulation; }
  int batch_size(int64_t micro) const;
  int64_t real_samples(int q) const;  // rank q's samples that are not padding
  int real_in_batch(int q, int64_t micro) const;
  // Real samples over all ranks in optimiser step `step` (at least 1: never all padding).
  int64_t step_samples(int64_t step) const;
  // The micro-batches [first, end) of optimiser step `step`.
  int64_t first_micro(int64_t step) const { return step * accumulation; }
  int64_t end_micro(int64_t step) const;
};

// Where an epoch starts: at its beginning, or after the `step` optimiser steps and at `position`
// of the epoch's global order where a mid-epoch checkpoint stopped.
struct EpochStart {
  int64_t step = 0;
  int64_t position = 0;
};

// Rank `rank`'s samples for epoch `epoch` from `position` of the epoch's global order on. Rank q
// takes positions position+q, +W, ... of the order (a function of seed and epoch alone), so a
// resume on another world size continues the same order; then the padding (repeating a sample of
// the epoch, zero weight) or the --drop-last cut. --cache pins each rank's shard (reshuffled
// within it every epoch), so there the rank skips its own first position/W samples (same world
// size only, checked on resume).
std::vector<int64_t> epoch_indices(const TrainOptions& o, int64_t dataset, int rank, int world,
                                   int64_t epoch, int64_t position);

// A rank's samples of an epoch and its plan, --max-steps applied.
struct EpochShard {
  std::vector<int64_t> indices;
  EpochPlan plan;
};
EpochShard plan_epoch(const TrainOptions& o, int64_t dataset, int rank, int world, int64_t epoch,
                      EpochStart start);

}  // namespace dp::app
