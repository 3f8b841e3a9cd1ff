// Faults that tests inject into training through environment variables (DP_TEST_*_AT).
#include "train/fault_injection.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "agreement.hpp"
#include "train/signals.hpp"

namespace dp::app {
namespace {

constexpr const char* kFailAt = "DP_TEST_FAIL_AT";
constexpr const char* kPreemptAt = "DP_TEST_PREEMPT_AT";
constexpr const char* kNonFiniteAt = "DP_TEST_NONFINITE_AT";

void parse_at(const char* variable, int& rank, int64_t& step) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return;
  long long s = 0;
  char extra = 0;
  if (std::sscanf(v, "%d:%lld%c", &rank, &s, &extra) != 2 || rank < 0 || s < 1)
    throw UsageError(str_cat(variable, " must be RANK:STEP with STEP >= 1, got '", v, "'"));
  step = s;
}

}  // namespace

FaultInjection::FaultInjection(Comm& comm) : rank_(comm.rank()) {
  collectively(comm, [&] { parse_at(kFailAt, fail_.rank, fail_.step); });
  collectively(comm, [&] { parse_at(kPreemptAt, preempt_.rank, preempt_.step); });
  collectively(comm, [&] { parse_at(kNonFiniteAt, nonfinite_.rank, nonfinite_.step); });
}

void FaultInjection::at_step(int64_t run_step, double& loss) const {
  if (fail_.now(rank_, run_step))
    fail(kFailAt, "=", fail_.rank, ":", fail_.step, ": failing on purpose in step ", fail_.step);
  if (nonfinite_.now(rank_, run_step)) loss = std::numeric_limits<double>::quiet_NaN();
  if (preempt_.now(rank_, run_step)) std::raise(preemption_signals().front());
}

}  // namespace dp::app
