// Preemption: the --preempt-signal signals (default SIGTERM, SIGUSR1) set an async-signal-safe
// flag that the trainer polls at step boundaries (every rank agrees through one tiny all-reduce),
// then it checkpoints and exits.
#pragma once

#include <csignal>
#include <string>
#include <vector>

#include "exit_codes.hpp"  // kExitPreempted: every rank's status after a preemption checkpoint

namespace dp::app {

// dptrain's default: SIGTERM (what Slurm and most schedulers send first) and SIGUSR1.
std::vector<std::string> default_preempt_signal_names();
// Signal numbers of names as --preempt-signal takes them (TERM, USR1, USR2, HUP, INT, QUIT,
// XCPU, ALRM; "SIG" prefix and case optional; repeats ignored). Anything else is a UsageError.
std::vector<int> parse_preempt_signals(const std::vector<std::string>& names);
// The values of `option` in argv ("--option X" and "--option=X", every occurrence, in order),
// read before the options are parsed.
std::vector<std::string> option_values_in_argv(int argc, const char* const* argv,
                                               const std::string& option);
// The signals that argv's --preempt-signal options name (both "--preempt-signal X" and
// "--preempt-signal=X", every occurrence), or the default when it names none or a bad one (the
// option parser reports that later): for the handlers installed before MPI start-up.
std::vector<int> preempt_signals_in_argv(int argc, const char* const* argv);
// "SIGTERM, SIGUSR1".
std::string signal_names(const std::vector<int>& signals);
// The warning to print where NCCL `nccl_version` ("2.12.10"; empty: none loaded) is known to take
// one of `signals` for itself (NCCL 2.12 installs a SIGUSR1 handler: NVIDIA/nccl#704), else "".
std::string nccl_signal_warning(const std::string& nccl_version, const std::vector<int>& signals);

// While alive, the given signals (and no others) only set the preemption flag; the outermost
// instance clears the flag; destruction gives back the set of the instance outside it, or the
// signals' original actions. dptrain's main holds one from before MPI start-up with the signals
// of argv (so that an early signal is not lost), each Trainer one with its options' (which may
// come from a --config file). Construct and destroy on one thread, innermost first.
class PreemptionHandlers {
 public:
  explicit PreemptionHandlers(const std::vector<int>& signals);
  ~PreemptionHandlers();
  PreemptionHandlers(const PreemptionHandlers&) = delete;
  PreemptionHandlers& operator=(const PreemptionHandlers&) = delete;

 private:
  std::vector<int> outer_;  // the set handled before this instance
};

// The signal received since the handlers were installed, or 0.
int preemption_signal();
// The signals the innermost live PreemptionHandlers handles (empty without one).
const std::vector<int>& preemption_signals();

}  // namespace dp::app
