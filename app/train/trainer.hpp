// dp::app::Trainer: data-parallel training loop, validation, checkpointing and resume.
#pragma once

#include <memory>
#include <string>

#include "agreement.hpp"  // AgreedFailure: what run() and its pieces throw
#include "device.hpp"
#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/grad_reducer.hpp"
#include "dp/loader.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/weight_average.hpp"
#include "progress.hpp"
#include "train/epoch_metrics.hpp"
#include "train/epoch_plan.hpp"
#include "train/options.hpp"
#include "train/signals.hpp"
#include "train/step_guard.hpp"

namespace dp::app {

class CenterlineDice;  // eval/centerline_dice.hpp
class Checkpoints;     // train/checkpoints.hpp
class EpochOutputs;    // train/epoch_outputs.hpp
struct EpochRecord;    // train/epoch_outputs.hpp
class FaultInjection;  // train/fault_injection.hpp
class Loss;            // train/loss.hpp
class ThresholdSweep;  // eval/sweep_metrics.hpp
class ModelDirLock;    // train/model_dir_lock.hpp

class Trainer {
 public:
  // Sets up data (creating the synthetic dataset on rank 0 if needed), model, optimiser, and
  // the starting state: a checkpoint (--resume) or fresh weights broadcast from rank 0.
  Trainer(TrainOptions options, Comm& comm, Logger log);
  ~Trainer();

  // Trains the remaining epochs, validating and checkpointing after each. Returns 0, or
  // kExitPreempted after a SIGTERM/SIGUSR1 once the resumable checkpoint is written. A
  // non-finite loss or gradient norm (beyond --skip-nonfinite-steps) throws AgreedFailure with
  // kExitNonFinite on every rank, before the optimiser step.
  int run();

  // Pieces of run(), public for tests.
  EpochMetrics train_epoch(int64_t epoch);
  EpochMetrics validate();
  // One validation image's logits (height_ x width_) as probabilities at its photograph's size,
  // scored against photo_masks_'s mask of dataset sample `index`.
  void score_at_photo_size(const float* logits, int64_t index, ThresholdSweep& sweep,
                           CenterlineDice& centerline);
  // --check-sync-every: compares a hash of every parameter tensor with rank 0's; on a mismatch
  // every rank throws AgreedFailure naming the first tensor (declaration order) that differs.
  void check_sync();
  Model& model() { return *model_; }
  const CheckpointMeta& state() const { return state_; }
  int64_t start_epoch() const { return state_.epoch; }
  const std::string& data_path() const { return data_path_; }

 private:
  // One epoch's training as its steps see it.
  struct EpochContext {
    int64_t epoch = 0;
    EpochStart start;
    EpochPlan plan;
    float lr = 0;
  };
  struct StepResult {
    bool preempt = false;       // a rank received a preemption signal
    double reduce_seconds = 0;  // waiting for the gradient all-reduce after backward
  };
  StepResult train_step(const EpochContext& e, int64_t step, EpochSums& sums);
  // The batch's images and masks in backend memory, after the forward pass (training mode:
  // dropout masks from seed, epoch and sample index); returns the logits.
  const float* forward(const data::Batch& b, int64_t epoch, BatchTensors& in);

  // Set-up, in the constructor's order.
  void choose_device();  // device_, threads per rank, the device line
  void prepare_data();
  void resolve_data_choices();  // --best-metric ods without validation, --lr-schedule auto
  void log_configuration();     // every option as it runs
  void set_up_model();          // loaders, loss, model, optimiser, weight average, buffers
  // Usage errors: fewer training samples than ranks; --drop-last leaving no full batch.
  void check_train_size() const;
  void log_set_up() const;

  // Records the epoch; writes model_epoch_<N>.h5 if --save-every says so (returns whether it
  // did) and model_best.h5 if the epoch is the best; then --keep-last deletes older epoch files.
  bool save_epoch(const EpochRecord& r);
  // Rank 0 writes model_epoch_<E>_step_<S>.h5; `partial` holds the epoch's reduced sums so far.
  void save_mid_epoch(int64_t step_in_epoch, int64_t position, std::vector<double> partial,
                      float lr);
  // Fills the configuration fields of state_ (model, sizes, world, options) before a save.
  void stamp_state(float lr);
  // Run() before its first epoch: a run already complete or stopped early says so (exit 0).
  bool already_finished() const;
  // --stall-timeout: the watchdog's scope for a collective of the current step (empty when off).
  std::optional<mpi::StallWatchdog::Scope> watch(const char* collective);

  TrainOptions opt_;
  Comm& comm_;
  Logger log_;
  TrainProgress progress_;  // rank 0: bar on a terminal, or a line every --log-every steps
  StepGuard guard_;         // agreement, non-finite guard, sync check, stall watch
  std::string data_path_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optim_;        // --optimizer: SGD or AdamW
  std::unique_ptr<WeightAverage> average_;  // --ema: validated, chooses model_best.h5
  // Destroyed before the model's and the optimiser's memory (see Device).
  std::unique_ptr<Device> device_;
  std::unique_ptr<mpi::GradReducer> reducer_;  // sums gradients over ranks during backward
  // SIGTERM/SIGUSR1 -> flag, while the trainer lives.
  PreemptionHandlers preemption_;
  std::unique_ptr<FaultInjection> faults_;  // the faults tests plant (--test-fault)
  std::unique_ptr<data::Loader> train_loader_, val_loader_;
  // The validation masks at the photographs' size (dpprep build --resize), where the dataset has
  // them and validation sees whole images: the sweep and clDice score against them.
  std::unique_ptr<data::Dataset> photo_masks_;
  Buffer diff_logits_;
  std::vector<uint64_t> dropout_seeds_;  // one per sample of a batch, sized once
  std::unique_ptr<Loss> loss_;           // --loss
  int height_ = 0, width_ = 0;
  CheckpointMeta state_;                          // epochs done, steps, best, history
  std::unique_ptr<ModelDirLock> model_dir_lock_;  // rank 0: one dptrain per --model-dir
  std::unique_ptr<Checkpoints> checkpoints_;      // starting state, writing, retention
  std::unique_ptr<EpochOutputs> outputs_;         // epoch line, metrics.csv, TensorBoard, report
  bool kernels_logged_ = false;  // Backend::kernel_choices(), once after the run's first step
};

}  // namespace dp::app
