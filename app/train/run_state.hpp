// The run's record in its checkpoints: the per-epoch history, the best epoch, early stopping.
#pragma once

#include <string>

#include "dp/checkpoint.hpp"
#include "train/epoch_metrics.hpp"
#include "train/options.hpp"

namespace dp::app {

// The --best-metric value (valid_loss, iou, dice or ods) of an epoch, oriented so that lower is
// better; NaN for an epoch without that metric.
double best_key(BestMetric metric, double loss, double iou, double dice, double ods);

// Counts a finished epoch in `state`: its metrics join the history (`valid` NaN: not validated),
// the best epoch by --best-metric moves to it if it is better (judged on `valid` when the dataset
// has a validation split, else on `train`; a non-finite score is never the best), and the
// early-stopping count of judged epochs since the metric last improved by more than --min-delta
// advances or restarts. Clears the mid-epoch position. Returns whether the epoch is the best.
bool record_epoch(CheckpointMeta& state, const TrainOptions& o, const EpochMetrics& train,
                  const EpochMetrics& valid, bool has_validation_split, double seconds);

// --patience: the validations since the last improvement reached it.
bool stopping_early(const CheckpointMeta& state, const TrainOptions& o);

// "best epoch B (metric value[, loss L])"
std::string best_epoch_summary(const CheckpointMeta& state, BestMetric best_metric);

}  // namespace dp::app
