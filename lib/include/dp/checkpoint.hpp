// Checkpoint v1 (HDF5): parameters in PyTorch layout, optimiser state and training metadata.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "dp/optim_state.hpp"
#include "dp/params.hpp"

namespace dp {

inline constexpr const char* kCheckpointFormat = "dp-checkpoint-v1";

// An option's value as a checkpoint records it: an integer (switches 0 or 1), a number or a word.
using OptionValue = std::variant<int64_t, double, std::string>;

// Layout: /params/<name> (float32, PyTorch shape), /buffers/<name> (batch-norm running
// statistics), /optim/momentum_buffer/<name>; root attributes below. `checksum` covers every
// dataset, in name order, so a torn or altered file is detected.
struct CheckpointMeta {
  int64_t epoch = 0;  // epochs completed; training resumes at this epoch index
  int64_t step = 0;   // optimizer steps taken
  std::string model;
  int64_t width_divisor = 1;
  int64_t deconv = 0;  // decoder with transposed convolutions
  int64_t height = 0, width = 0;
  // The training set's pixels per pixel of its source photographs, along y and x (its dpprep
  // build --resize; data::PixelScale); 0: not known (a dataset that did not record it, or a file
  // written before it was recorded).
  double scale_y = 0, scale_x = 0;
  int64_t world_size = 1;
  int64_t global_batch = 0;
  int64_t seed = 0;
  double lr = 0;               // learning rate of the last completed epoch
  double best_valid_loss = 0;  // valid_loss of the best epoch so far, including this epoch
  int64_t best_epoch = 0;
  std::string best_metric =
      "valid_loss";       // how the best epoch is chosen (valid_loss, iou, dice, ods)
  double best_score = 0;  // that metric's value at the best epoch
  std::string options;    // effective configuration, one "key = value" per line
  // The same configuration typed, as root attributes "options.<key>"; empty in files written
  // before it was recorded (their `options` text has it).
  std::map<std::string, OptionValue> option_values;
  // The input statistics training normalised with, (v / 255 - mean) / std per RGB channel: 3
  // values each; empty in files written before they were recorded (their `options` text says).
  std::vector<double> normalize_mean, normalize_std;
  // One entry per completed epoch.
  std::vector<double> train_loss, valid_loss, valid_iou, epoch_seconds;
  // Also one per epoch; NaN for an epoch without validation (--val-every), like valid_loss.
  std::vector<double> valid_dice, valid_precision, valid_recall;
  // Also one per epoch (NaN without validation): the threshold of the validation's ODS F-measure
  // (dppredict --threshold ods); NaN for the epochs of files written before it was recorded.
  std::vector<double> valid_ods_threshold;
  // Also one per epoch, NaN likewise: the validation's ODS F-measure (--best-metric ods), its
  // IoU at the ODS threshold and its centreline Dice (clDice) at the threshold.
  std::vector<double> valid_ods, valid_iou_at_ods, valid_cldice;
  // Early stopping (--patience): validated epochs since --best-metric last improved by more than
  // --min-delta, and its value then (oriented lower-is-better; NaN: none yet). Files written
  // before it was recorded read as the epochs since best_epoch and the best score.
  int64_t early_stop_wait = 0;
  double early_stop_key = std::numeric_limits<double>::quiet_NaN();
  // Mid-epoch (preemption) checkpoints: optimiser steps done in epoch `epoch` (0 = at its start),
  // the positions of that epoch's global sample order consumed by them, and the epoch's partial
  // training sums over all ranks (loss, pixels, TP, FP, FN, samples, seconds).
  int64_t epoch_step = 0;
  int64_t epoch_position = 0;
  std::vector<double> epoch_partial;
  // Read only (save_checkpoint writes it from its `state`): the optimiser state arenas in the
  // file, e.g. {"momentum_buffer"} (SGD) or {"exp_avg", "exp_avg_sq"} (AdamW); empty: weights.
  std::vector<std::string> optimizer_state;
  // Read only (written from save_checkpoint's `averaged`): the file holds averaged weights.
  bool has_averaged_weights = false;
};

// --ema: the moving averages of the parameters and of the batch-norm buffers, arenas of the
// layouts of the model's ParamStores (backend memory), stored beside the raw weights as
// /ema/params/<name> and /ema/buffers/<name>.
struct AveragedWeights {
  float* params = nullptr;
  float* buffers = nullptr;  // may be null when the model has no buffers
};

// Writes atomically (temporary file, flush, fsync, rename, directory fsync). `momentum` may be
// null (weights-only file); `buffers` may be null or empty (no batch norm).
void save_checkpoint(const std::string& path, const ParamStore& params, const float* momentum,
                     const CheckpointMeta& meta, const ParamStore* buffers = nullptr);

// The same with any optimiser's named state arenas (/optim/<arena>/<name>, attribute
// `optimizer_state` lists the arena names in order); an empty `state` writes weights only.
// `averaged` (--ema), when given, is written too.
void save_checkpoint(const std::string& path, const ParamStore& params, const OptimizerState& state,
                     const CheckpointMeta& meta, const ParamStore* buffers = nullptr,
                     const AveragedWeights* averaged = nullptr);

// Reads only the attributes and checks the format; throws dp::Error naming the file otherwise.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Loads parameters (every name and shape must match; checksum verified), the buffers if
// `buffers` is not null, and the optimiser state if `momentum` is not null. Returns the metadata.
CheckpointMeta load_checkpoint(const std::string& path, ParamStore& params, float* momentum,
                               ParamStore* buffers = nullptr);
// The same for any optimiser: every arena of `state` must be in the file (a checkpoint of
// another optimiser is an error naming both); an empty `state` loads weights only. `averaged`,
// when given and the file has averaged weights (meta.has_averaged_weights), receives them, after
// the raw weights: arenas that alias the model's (dppredict) end up holding the averages. A load
// without `state` of a file that has the partial checksums (checksum_weights, checksum_averaged)
// reads and verifies only the weights it keeps (the raw ones are skipped where `averaged` aliases
// `params` and `buffers`, as dppredict's and dpexport's arenas do); any other load reads every
// tensor of the file against the full checksum.
CheckpointMeta load_checkpoint(const std::string& path, ParamStore& params,
                               const OptimizerState& state, ParamStore* buffers = nullptr,
                               const AveragedWeights* averaged = nullptr);

std::string epoch_checkpoint_name(int64_t epoch);  // "model_epoch_<N>.h5"

// Epoch and mid-epoch checkpoints (model_epoch_<N>_step_<S>.h5: N epochs and S steps of the next
// done) in `dir`, newest first by (N, S); an epoch checkpoint has step 0.
struct CheckpointFile {
  int64_t epoch = 0;
  int64_t step = 0;
  std::string path;
};
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);
std::string mid_epoch_checkpoint_name(int64_t epoch, int64_t step);
inline constexpr const char* kBestCheckpointName = "model_best.h5";

}  // namespace dp
