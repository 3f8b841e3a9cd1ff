// Faults that tests plant in training with the hidden option --test-fault.
#include "train/fault_injection.hpp"

#include <csignal>
#include <cstdio>
#include <limits>
#include <utility>

#include "dp/error.hpp"
#include "train/signals.hpp"

namespace dp::app {
namespace {

constexpr const char* kOption = "--test-fault";

}  // namespace

PlantedFault parse_planted_fault(const std::string& text) {
  const auto at = text.find('@');
  const std::string kind = text.substr(0, at);
  PlantedFault f;
  if (kind == "fail") {
    f.kind = PlantedFault::Kind::kFail;
  } else if (kind == "preempt") {
    f.kind = PlantedFault::Kind::kPreempt;
  } else if (kind == "nonfinite") {
    f.kind = PlantedFault::Kind::kNonFinite;
  }
  long long step = 0;
  char extra = 0;
  const bool known = kind == "fail" || kind == "preempt" || kind == "nonfinite";
  if (!known || at == std::string::npos ||
      std::sscanf(text.c_str() + at + 1, "%d:%lld%c", &f.rank, &step, &extra) != 2 || f.rank < 0 ||
      step < 1) {
    throw UsageError(str_cat(kOption,
                             " must be fail, preempt or nonfinite @RANK:STEP with STEP >= 1",
                             " (or ", kPreemptAtStart, "), got '", text, "'"));
  }
  f.step = step;
  return f;
}

bool preempt_at_start_in_argv(int argc, const char* const* argv) {
  const std::string option = kOption, value = kPreemptAtStart;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == option && i + 1 < argc && argv[i + 1] == value) || a == option + "=" + value)
      return true;
  }
  return false;
}

void FaultInjection::at_step(int64_t run_step, double& loss) const {
  for (const PlantedFault& f : faults_) {
    if (f.rank != rank_ || f.step != run_step) continue;
    switch (f.kind) {
      case PlantedFault::Kind::kFail:
        fail(kOption, " fail@", f.rank, ":", f.step, ": failing on purpose in step ", f.step);
      case PlantedFault::Kind::kNonFinite:
        loss = std::numeric_limits<double>::quiet_NaN();
        break;
      case PlantedFault::Kind::kPreempt:
        std::raise(preemption_signals().front());
        break;
    }
  }
}

}  // namespace dp::app
