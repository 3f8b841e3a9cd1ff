// Faults that tests plant in training with the hidden option --test-fault.
#include "train/fault_injection.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "dp/error.hpp"
#include "train/signals.hpp"

namespace dp::app {
namespace {

constexpr const char* kOption = "--test-fault";

}  // namespace

PlantedFault parse_planted_fault(const std::string& text) {
  static const std::map<std::string, PlantedFault::Kind> kKinds = {
      {"fail", PlantedFault::Kind::kFail},
      {"preempt", PlantedFault::Kind::kPreempt},
      {"nonfinite", PlantedFault::Kind::kNonFinite},
      {"hold", PlantedFault::Kind::kHold}};
  const auto at = text.find('@');
  const auto kind = kKinds.find(text.substr(0, at));
  PlantedFault f;
  long long step = 0;
  char extra = 0;
  if (kind == kKinds.end() || at == std::string::npos ||
      std::sscanf(text.c_str() + at + 1, "%d:%lld%c", &f.rank, &step, &extra) != 2 || f.rank < 0 ||
      step < 1) {
    throw UsageError(str_cat(kOption,
                             " must be fail, preempt, nonfinite or hold @RANK:STEP with STEP >= 1",
                             " (or ", kPreemptAtStart, "), got '", text, "'"));
  }
  f.kind = kind->second;
  f.step = step;
  return f;
}

bool preempt_at_start_in_argv(int argc, const char* const* argv) {
  const auto values = option_values_in_argv(argc, argv, kOption);
  return std::find(values.begin(), values.end(), kPreemptAtStart) != values.end();
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
      case PlantedFault::Kind::kHold: {
        const auto until =
            std::chrono::steady_clock::now() + std::chrono::seconds(kHoldLimitSeconds);
        while (preemption_signal() == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        break;
      }
    }
  }
}

}  // namespace dp::app
