// What the ranks agree on around each optimiser step: preemption, a diverged step (a non-finite
// value or an exploded loss), parameter sync (--check-sync-every) and the stall watch on
// collectives (--stall-timeout).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dp/comm.hpp"
#include "dp/log.hpp"
#include "dp/params.hpp"
#include "dp/stall_watchdog.hpp"
#include "progress.hpp"
#include "train/options.hpp"

namespace dp::app {

class StepGuard {
 public:
  // `progress` is cleared before a line of the guard's.
  StepGuard(const TrainOptions& options, Comm& comm, Logger log, TrainProgress& progress);
  ~StepGuard();

  // --stall-timeout: starts the watchdog; `before_abort` (may be empty) runs before it ends a
  // stalled job (the NCCL communicator's abort).
  void start_watchdog(std::function<void()> before_abort);
  // The watchdog's scope for a collective of optimiser step `run_step` (empty when off).
  std::optional<mpi::StallWatchdog::Scope> watch(const char* collective, int64_t run_step);

  // What every rank learns at the end of each optimiser step, before its update, from one small
  // all-reduce: whether a signal asks for preemption, which ranks saw a non-finite loss or
  // gradient norm, and the step's loss over all ranks. `run_step`: the optimiser step of the run
  // it concludes; `loss_sum` and `pixels`: this rank's summed per-pixel loss of the step and the
  // pixels it is over (zero for a step that trains nothing, which sets no reference).
  struct Agreement {
    bool preempt = false;
    std::vector<int> nonfinite_loss, nonfinite_grad;  // ranks
    double loss = 0;        // the step's mean loss per pixel over all ranks
    bool exploded = false;  // loss > --divergence-factor x the run's first step's loss
    bool finite() const { return nonfinite_loss.empty() && nonfinite_grad.empty(); }
    bool diverged() const { return !finite() || exploded; }
  };
  Agreement agree(int64_t run_step, double loss_sum, double pixels, bool grad_finite);

  // A diverged step: a non-finite one is skipped with one warning (--skip-nonfinite-steps) while
  // skips are left; otherwise (and always for an exploded loss, whose weights are already lost)
  // every rank throws AgreedFailure (kExitNonFinite) with one line from rank 0 naming the step,
  // the loss and the newest checkpoint. `step_in_epoch` and `run_step` are 1-based.
  void on_divergence(const Agreement& agreed, int64_t epoch, int64_t step_in_epoch,
                     int64_t run_step, double grad_norm);

  // Compares a hash of every parameter tensor with rank 0's; on a mismatch every rank throws
  // AgreedFailure naming the first tensor (declaration order) that differs.
  void check_sync(ParamStore& params, int64_t run_step);

 private:
  const TrainOptions& opt_;
  Comm& comm_;
  Logger log_;
  TrainProgress& progress_;
  std::unique_ptr<mpi::StallWatchdog> watchdog_;
  int skipped_steps_ = 0;      // --skip-nonfinite-steps used in this run
  double reference_loss_ = 0;  // the run's first finite step loss (0: none yet)
};

}  // namespace dp::app
