// Faults that tests plant in training with the hidden option --test-fault, behind one call per
// step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dp::app {

// One --test-fault KIND@RANK:STEP (STEP >= 1: the optimiser step of the run). Not in --help:
//   fail       that rank throws dp::Error, after its forward pass, while its peers wait in the
//              step's gradient all-reduce (tests/e2e/rank_failure.cpp);
//   preempt    that rank raises the first preemption signal, so the job stops after the step
//              (tests/mpi/test_resume_mpi.cpp, tests/e2e/preemption_cli.cpp);
//   nonfinite  that rank's loss becomes NaN, its gradients stay finite (tests/e2e/fault_guards.cpp:
//              the non-finite guard names that rank);
//   hold       that rank waits until a preemption signal arrives (at most kHoldLimit), so that a
//              test signals the job from outside in a known step however late the signal comes
//              (tests/slurm/run_slurm_test.sh: Slurm once took 9 s to deliver one).
// `--test-fault preempt-at-start` raises the signal before MPI starts (app/dptrain.cpp).
struct PlantedFault {
  enum class Kind { kFail, kPreempt, kNonFinite, kHold };
  Kind kind = Kind::kFail;
  int rank = -1;
  int64_t step = -1;
};

// Parses KIND@RANK:STEP; a UsageError names the text and the expected form.
PlantedFault parse_planted_fault(const std::string& text);

// Whether argv holds --test-fault preempt-at-start (read before the options are parsed).
bool preempt_at_start_in_argv(int argc, const char* const* argv);
inline constexpr const char* kPreemptAtStart = "preempt-at-start";

inline constexpr int kHoldLimitSeconds = 240;

class FaultInjection {
 public:
  FaultInjection(std::vector<PlantedFault> faults, int rank)
      : faults_(std::move(faults)), rank_(rank) {}

  // Called once per optimiser step `run_step`, after the forward pass of its last micro-batch
  // and before its backward: injects the faults planted for this rank and step. `loss`: the
  // rank's loss sum so far, which the step's non-finite check reads.
  void at_step(int64_t run_step, double& loss) const;

 private:
  std::vector<PlantedFault> faults_;
  int rank_;
};

}  // namespace dp::app
