// dp::app::Trainer: data-parallel training loop, validation, checkpointing and resume.
#pragma once

#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "agreement.hpp"
#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/grad_reducer.hpp"
#include "dp/loader.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/stall_watchdog.hpp"
#include "dp/weight_average.hpp"
#include "train/metrics.hpp"
#include "train/options.hpp"
#include "train/progress.hpp"
#include "train/signals.hpp"

namespace dp::app {

class TrainingReport;     // train/report.hpp
class TensorBoardLog;     // train/tensorboard.hpp
class ValidationSamples;  // train/validation_samples.hpp
class Checkpoints;        // train/checkpoints.hpp
class Loss;               // train/loss.hpp
class ModelDirLock;       // train/model_dir_lock.hpp

// The GPU a rank uses with --device cuda: its node-local rank modulo the visible GPUs (>= 1).
// More ranks on the node than visible GPUs is a UsageError unless allow_sharing.
int gpu_for_rank(int local_rank, int local_size, int visible_gpus, bool allow_sharing);

struct EpochMetrics {
  double loss = 0;                             // mean per pixel, from sums over all ranks
  double iou = 0;                              // TP / (TP + FP + FN) over the whole split
  double dice = 0, precision = 0, recall = 0;  // likewise from the reduced counts
  int64_t samples = 0;
  double allreduce_wait_ms = 0;  // training: per step, rank 0's wait after backward
  // Validation only: ODS, OIS and AP over the threshold sweep (--tolerance); NaN otherwise.
  double ods = std::numeric_limits<double>::quiet_NaN(), ods_threshold = ods, ois = ods, ap = ods;
  MaskScores at_ods;       // Validation only: IoU, Dice, precision, recall at ods_threshold
  double cldice = ods;     // Validation only: centreline Dice of the masks at --threshold
  bool preempted = false;  // training only: stopped mid-epoch by a signal (checkpoint written)
};

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
  // --check-sync-every: compares a hash of every parameter tensor with rank 0's; on a mismatch
  // every rank throws AgreedFailure naming the first tensor (declaration order) that differs.
  void check_sync();
  Model& model() { return *model_; }
  const CheckpointMeta& state() const { return state_; }
  int64_t start_epoch() const { return state_.epoch; }
  const std::string& data_path() const { return data_path_; }

 private:
  void prepare_data();
  // Usage errors: fewer training samples than ranks; --drop-last leaving no full batch.
  void check_train_size() const;
  // Records the epoch; writes model_epoch_<N>.h5 if --save-every says so (returns whether it
  // did) and model_best.h5 if the epoch is the best; then --keep-last deletes older epoch files.
  bool save_epoch(const EpochMetrics& train, const EpochMetrics& valid, double seconds, float lr);
  // --tensorboard (rank 0): the epoch's scalars and, when validated, the samples' predictions;
  // written before the epoch's checkpoint, so a resume from it never repeats them.
  void log_epoch_events(const EpochMetrics& train, const EpochMetrics& valid, bool validated,
                        double seconds, double images_per_s, float lr);
  // --patience: the validations since the last improvement reached it.
  bool stopping_early() const;
  std::string best_epoch_summary() const;  // "best epoch B (metric value[, loss L])"
  // Fills the configuration fields of state_ (model, sizes, world, options) before a save.
  void stamp_state(float lr);
  // What every rank learns at the end of each optimiser step, before its update, from one small
  // all-reduce: whether a signal asks for preemption (issue 6), and which ranks saw a non-finite
  // loss or gradient norm. `run_step`: the optimiser step of the run it concludes.
  struct StepAgreement {
    bool preempt = false;
    std::vector<int> nonfinite_loss, nonfinite_grad;  // ranks
  };
  StepAgreement agree_step(int64_t run_step, bool loss_finite, bool grad_finite);
  // A step the agreement found non-finite: skipped (--skip-nonfinite-steps), or every rank throws
  // AgreedFailure (kExitNonFinite) with one line from rank 0.
  void on_nonfinite_step(const StepAgreement& agreed, int64_t epoch, int64_t step_in_epoch,
                         double grad_norm);
  // Rank 0 writes model_epoch_<E>_step_<S>.h5; `partial` holds the epoch's reduced sums so far.
  void save_mid_epoch(int64_t step_in_epoch, int64_t position, std::vector<double> partial,
                      float lr);
  // --stall-timeout: the watchdog's scope for a collective of the current step (empty when off).
  std::optional<mpi::StallWatchdog::Scope> watch(const char* collective);
  // The CPU backend, or the CUDA one on the selected GPU (then device_ holds its helpers).
  std::unique_ptr<Backend> make_backend(bool use_gpu);
  void setup_device();  // after the model's set-up: the batch uploader; logs the GPU memory
  // The MPI reducer on host gradients, or the NCCL one on device gradients.
  std::unique_ptr<mpi::GradReducer> make_reducer(const mpi::ReducerOptions& ro);
  // A batch's images and masks in backend memory (uploaded on a copy stream for the GPU).
  struct BatchTensors {
    const float* images = nullptr;
    const float* masks = nullptr;
  };
  BatchTensors to_backend(const data::Batch& b);

  TrainOptions opt_;
  Comm& comm_;
  Logger log_;
  TrainProgress progress_;  // rank 0: bar on a terminal, or a line every --log-every steps
  std::string data_path_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optim_;        // --optimizer: SGD or AdamW
  std::unique_ptr<WeightAverage> average_;  // --ema: validated, chooses model_best.h5
  // --device cuda: NCCL communicator, batch uploader. Destroyed before the model's and the
  // optimiser's device memory: freeing memory waits for the device, so after a failure the NCCL
  // communicator must be aborted first (NcclComm does that while an exception unwinds).
  struct DeviceState;
  std::unique_ptr<DeviceState> device_;
  std::unique_ptr<mpi::GradReducer> reducer_;  // sums gradients over ranks during backward
  bool kernels_logged_ = false;  // Backend::kernel_choices(), once after the run's first step
  // DP_TEST_FAIL_AT=rank:step (tests of the failure semantics): that rank throws in that step.
  int fail_rank_ = -1;
  int64_t fail_step_ = -1;
  // SIGTERM/SIGUSR1 -> flag, while the trainer lives; DP_TEST_PREEMPT_AT=rank:step raises SIGUSR1
  // on that rank in that optimiser step of the run, before its agreement (tests).
  PreemptionHandlers preemption_;
  int preempt_rank_ = -1;
  int64_t preempt_step_ = -1;
  // DP_TEST_NONFINITE_AT=rank:step: that rank's loss is NaN in that step (tests).
  int nonfinite_rank_ = -1;
  int64_t nonfinite_step_ = -1;
  std::unique_ptr<data::Loader> train_loader_, val_loader_;
  Buffer diff_logits_;
  std::vector<uint64_t> dropout_seeds_;  // one per sample of a batch, sized once
  float pos_weight_ = 1.0f;
  std::unique_ptr<Loss> loss_;  // --loss
  int height_ = 0, width_ = 0;
  CheckpointMeta state_;                              // epochs done, steps, best, history
  std::unique_ptr<ModelDirLock> model_dir_lock_;      // rank 0: one dptrain per --model-dir
  std::unique_ptr<Checkpoints> checkpoints_;          // starting state, writing, retention
  std::unique_ptr<mpi::StallWatchdog> watchdog_;      // --stall-timeout
  int skipped_steps_ = 0;                             // --skip-nonfinite-steps used in this run
  std::shared_ptr<const ValidationSamples> samples_;  // rank 0, for --report and --tensorboard
  std::unique_ptr<TrainingReport> report_;            // --report, rank 0 only
  std::unique_ptr<TensorBoardLog> tensorboard_;       // --tensorboard, rank 0 only
  std::unique_ptr<MetricsCsv> metrics_csv_;           // rank 0 only
};

}  // namespace dp::app
