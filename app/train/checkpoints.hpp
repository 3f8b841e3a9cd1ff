// dptrain's checkpoints: the starting state (resume or fresh weights), epoch and mid-epoch
// checkpoints written by rank 0, their verification (format, checksum, finite values) and
// retention (--save-every, --keep-last).
#pragma once

#include <map>
#include <string>

#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/weight_average.hpp"
#include "train/options.hpp"

namespace dp::app {

// The first tensor of the model's parameters, batch-norm buffers or optimiser state with a NaN or
// infinite value, as "parameter 'name'", "buffer 'name'" or "<state> of 'name'"; empty if every
// value is finite. Reads the host copies (downloads device arenas).
std::string first_nonfinite_tensor(Model& model, Optimizer& optim);

// The options a checkpoint was trained with, typed: the values it records or, in files written
// before it recorded them, its options text read back (integers, numbers, else words).
std::map<std::string, OptionValue> recorded_options(const CheckpointMeta& meta);

class Checkpoints {
 public:
  // `model` and `optim` are set up (their arenas exist); `height` x `width` is this run's size;
  // `average` (--ema, may be null) is written to and restored from every checkpoint.
  Checkpoints(const TrainOptions& options, Comm& comm, Logger log, Model& model, Optimizer& optim,
              WeightAverage* average, int height, int width);

  // The starting state on every rank. Rank 0 chooses it: --resume auto takes the newest
  // checkpoint in --model-dir that reads, verifies and holds only finite values (the others are
  // reported and skipped), --resume PATH that file, --resume never (or nothing found) fresh
  // weights (--init-weights / --encoder-weights); then its weights, buffers, optimiser state and
  // progress are broadcast. A checkpoint of another model, image size or optimiser is a usage
  // error. The weight average starts as the starting weights where there is none to restore.
  // Returns the progress (epochs and steps done, histories, best epoch).
  CheckpointMeta restore_or_init();

  // Rank 0 writes model_epoch_<state.epoch>.h5 (if `epoch_file`) and model_best.h5 (if `best`),
  // then removes mid-epoch checkpoints older than the new epoch file and what --keep-last allows;
  // every rank learns the outcome. Weights or optimiser state with a non-finite value are never
  // written: that is an error with status kExitNonFinite.
  void write_epoch(const CheckpointMeta& state, bool epoch_file, bool best);
  // Rank 0 writes model_epoch_<E>_step_<S>.h5 of a preempted epoch (the same checks); returns
  // its path.
  std::string write_mid_epoch(const CheckpointMeta& state);

 private:
  // Rank 0: loads `path` if it is compatible with this run (else UsageError); false (with a
  // warning) if it cannot be read or holds non-finite values and `skip_bad` is set.
  bool load(const std::string& path, bool skip_bad, CheckpointMeta& state);
  // Rank 0: throws (kExitNonFinite) before writing `path` if any value is not finite.
  void check_finite(const CheckpointMeta& state, const std::string& path);
  void save(const std::string& path, const CheckpointMeta& state);
  // Another --best-metric than the checkpoint's: the best epoch is chosen again from the
  // validation histories.
  void rechoose_best(CheckpointMeta& state) const;
  // Rank 0's weights, optimiser state, averages (when it restored them) and progress.
  void broadcast_state(CheckpointMeta& state, bool with_average);

  const TrainOptions& opt_;
  Comm& comm_;
  Logger log_;
  Model& model_;
  Optimizer& optim_;
  WeightAverage* average_;
  int height_, width_;
};

}  // namespace dp::app
