// SIGTERM / SIGUSR1 handlers that only record the signal (async-signal-safe).
#include "train/signals.hpp"

#include <cerrno>
#include <cstring>

#include "dp/error.hpp"

namespace dp::app {
namespace {

// Written by the handler, read by the training loop: the only state a handler may touch.
volatile std::sig_atomic_t g_preemption_signal = 0;
int g_depth = 0;  // PreemptionHandlers alive (one thread: dptrain's main, then its Trainer)

extern "C" void on_preemption_signal(int signal) {
  g_preemption_signal = signal;
}

void install(int signal, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and MPI progress continue after the handler
  DP_CHECK(sigaction(signal, &sa, old) == 0, "sigaction(", signal, "): ", std::strerror(errno));
}

}  // namespace

PreemptionHandlers::PreemptionHandlers() {
  if (g_depth++ > 0) return;  // an outer instance (dptrain's main) already records signals
  g_preemption_signal = 0;
  install(SIGTERM, &old_term_);
  install(SIGUSR1, &old_usr1_);
}

PreemptionHandlers::~PreemptionHandlers() {
  if (--g_depth > 0) return;
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

int preemption_signal() {
  return static_cast<int>(g_preemption_signal);
}

}  // namespace dp::app
