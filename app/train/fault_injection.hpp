// Faults that tests inject into training through environment variables, behind one call per step.
#pragma once

#include <cstdint>

#include "dp/comm.hpp"

namespace dp::app {

// Each variable is "RANK:STEP" (STEP >= 1: the optimiser step of the run); unset in normal runs.
//   DP_TEST_FAIL_AT       that rank throws dp::Error, after its forward pass, while its peers wait
//                         in the step's gradient all-reduce (tests/e2e/rank_failure.cpp);
//   DP_TEST_PREEMPT_AT    that rank raises SIGUSR1, so the job stops after the step
//                         (tests/mpi/test_resume_mpi.cpp, tests/e2e/preemption_cli.cpp);
//   DP_TEST_NONFINITE_AT  that rank's loss becomes NaN, its gradients stay finite
//                         (tests/e2e/fault_guards.cpp: the non-finite guard names that rank).
class FaultInjection {
 public:
  // Reads the variables on every rank; a malformed one is a UsageError on every rank.
  explicit FaultInjection(Comm& comm);

  // Called once per optimiser step `run_step`, after the forward pass of its last micro-batch
  // and before its backward: injects what the variables ask for this rank and step. `loss`: the
  // rank's loss sum so far, which the step's non-finite check reads.
  void at_step(int64_t run_step, double& loss) const;

 private:
  struct At {
    int rank = -1;
    int64_t step = -1;
    bool now(int r, int64_t s) const { return r == rank && s == step; }
  };
  int rank_;
  At fail_, preempt_, nonfinite_;
};

}  // namespace dp::app
