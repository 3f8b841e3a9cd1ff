// The run's record in its checkpoints: the per-epoch history, the best epoch, early stopping.
#include "train/run_state.hpp"

#include <cmath>

#include "dp/log.hpp"

namespace dp::app {

double best_key(BestMetric metric, double loss, double iou, double dice, double ods) {
  switch (metric) {
    case BestMetric::kOds:
      return -ods;
    case BestMetric::kIou:
      return -iou;
    case BestMetric::kDice:
      return -dice;
    case BestMetric::kValidLoss:
      break;
  }
  return loss;
}

bool record_epoch(CheckpointMeta& state, const TrainOptions& o, const EpochMetrics& train,
                  const EpochMetrics& valid, bool has_validation_split, double seconds) {
  state.epoch += 1;
  state.train_loss.push_back(train.loss);
  state.valid_loss.push_back(valid.loss);
  state.valid_iou.push_back(valid.iou);
  state.valid_dice.push_back(valid.dice);
  state.valid_precision.push_back(valid.precision);
  state.valid_recall.push_back(valid.recall);
  state.valid_ods_threshold.push_back(valid.ods_threshold);
  state.valid_ods.push_back(valid.ods);
  state.valid_iou_at_ods.push_back(valid.at_ods.iou);
  state.valid_cldice.push_back(valid.cldice);
  state.epoch_seconds.push_back(seconds);
  const EpochMetrics& judged = has_validation_split ? valid : train;
  const double key = best_key(o.best_metric, judged.loss, judged.iou, judged.dice, judged.ods);
  const double best_so_far = higher_is_better(o.best_metric) ? -state.best_score : state.best_score;
  const bool best = std::isfinite(key) && (state.best_epoch == 0 || key < best_so_far);
  if (best) {
    state.best_valid_loss = judged.loss;
    state.best_score = higher_is_better(o.best_metric) ? -key : key;
    state.best_epoch = state.epoch;
  }
  // Kept in the checkpoint: a resumed job stops where an uninterrupted one would.
  if (std::isfinite(key)) {
    if (std::isnan(state.early_stop_key) || key < state.early_stop_key - o.min_delta) {
      state.early_stop_key = key;
      state.early_stop_wait = 0;
    } else {
      ++state.early_stop_wait;
    }
  }
  state.epoch_step = 0;  // an epoch boundary
  state.epoch_position = 0;
  state.epoch_partial.clear();
  return best;
}

bool stopping_early(const CheckpointMeta& state, const TrainOptions& o) {
  return o.patience > 0 && state.early_stop_wait >= o.patience;
}

std::string best_epoch_summary(const CheckpointMeta& state, BestMetric best_metric) {
  return str_cat("best epoch ", state.best_epoch, " (", best_metric_name(best_metric), " ",
                 fixed(state.best_score, 4),
                 best_metric == BestMetric::kValidLoss
                     ? ""
                     : str_cat(", loss ", fixed(state.best_valid_loss, 4)),
                 ")");
}

}  // namespace dp::app
