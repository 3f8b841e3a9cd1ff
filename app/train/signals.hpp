// Preemption: SIGTERM / SIGUSR1 set an async-signal-safe flag that the trainer polls at step
// boundaries (every rank agrees through one tiny all-reduce), then it checkpoints and exits.
#pragma once

#include <csignal>

#include "exit_codes.hpp"  // kExitPreempted: every rank's status after a preemption checkpoint

namespace dp::app {

// While alive, SIGTERM and SIGUSR1 only set the preemption flag; the outermost instance clears it
// on construction and restores the previous handlers on destruction, inner ones change nothing
// (dptrain's main holds one from before MPI start-up, so that an early signal is not lost, and
// each Trainer holds one). Construct and destroy on one thread.
class PreemptionHandlers {
 public:
  PreemptionHandlers();
  ~PreemptionHandlers();
  PreemptionHandlers(const PreemptionHandlers&) = delete;
  PreemptionHandlers& operator=(const PreemptionHandlers&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_usr1_ {};
};

// The signal (SIGTERM or SIGUSR1) received since the handlers were installed, or 0.
int preemption_signal();

}  // namespace dp::app
