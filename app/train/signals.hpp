// Preemption: SIGTERM / SIGUSR1 set an async-signal-safe flag that the trainer polls at step
// boundaries (every rank agrees through one tiny all-reduce), then it checkpoints and exits.
#pragma once

#include <csignal>

namespace dp::app {

// Exit status of every rank after a preemption checkpoint was written: "preempted, resumable"
// (EX_TEMPFAIL of sysexits.h). Distinct from 0 (done), 1 (failure) and 2 (usage error).
inline constexpr int kExitPreempted = 75;

// While alive, SIGTERM and SIGUSR1 only set the preemption flag (cleared on construction); the
// previous handlers are restored on destruction. Not nestable across threads; one per Trainer.
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
