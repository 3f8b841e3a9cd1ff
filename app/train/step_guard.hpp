// What the ranks agree on around each optimiser step: preemption, non-finite values, parameter
// sync (--check-sync-every) and the stall watch on collectives (--stall-timeout).
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
  // all-reduce: whether a signal asks for preemption, and which ranks saw a non-finite loss or
  // gradient norm. `run_step`: the optimiser step of the run it concludes.
  struct Agreement {
    bool preempt = false;
    std::vector<int> nonfinite_loss, nonfinite_grad;  // ranks
    bool finite() const { return nonfinite_loss.empty() && nonfinite_grad.empty(); }
  };
  Agreement agree(int64_t run_step, bool loss_finite, bool grad_finite);

  // A step the agreement found non-finite: skipped with one warning (--skip-nonfinite-steps),
  // or every rank throws AgreedFailure (kExitNonFinite) with one line from rank 0 naming the
  // newest checkpoint. `step_in_epoch` and `run_step` are 1-based.
  void on_nonfinite(const Agreement& agreed, int64_t epoch, int64_t step_in_epoch, int64_t run_step,
                    double grad_norm);

  // Compares a hash of every parameter tensor with rank 0's; on a mismatch every rank throws
  // AgreedFailure naming the first tensor (declaration order) that differs.
  void check_sync(ParamStore& params, int64_t run_step);

 private:
  const TrainOptions& opt_;
  Comm& comm_;
  Logger log_;
  TrainProgress& progress_;
  std::unique_ptr<mpi::StallWatchdog> watchdog_;
  int skipped_steps_ = 0;  // --skip-nonfinite-steps used in this run
};

}  // namespace dp::app
