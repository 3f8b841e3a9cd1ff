// StallWatchdog (--stall-timeout): ends the job when a collective waits too long, naming the
// ranks that have not arrived (as Horovod's stall inspector and PyTorch's NCCL watchdog do).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace dp::mpi {

class MpiComm;

// A thread that sleeps (a wake-up every min(timeout/4, 5 s), no polling of MPI) while the
// watched thread computes or waits inside a collective. When one collective has waited longer
// than the timeout, the watchdog asks every other rank (MPI_Isend on its own duplicate of the
// communicator, so MPI must provide MPI_THREAD_MULTIPLE, which dp::mpi::Env requests) which
// collective it waits in, listens for a grace period, and then the lowest rank that knows prints
// one line:
//   <program>: error: [rank 0] stalled: waited 20.0 s in the gradient all-reduce of step 57;
//   rank(s) 1 did not answer within 5 s (stopped, hung, dead or still computing) ...
// runs `before_abort` (e.g. aborting an NCCL communicator) and ends the job with MPI_Abort and
// `exit_code`. A rank that is slow but within the limit is never killed.
class StallWatchdog {
 public:
  // Collective (duplicates `comm`). timeout_seconds > 0. (The header does not include mpi.h, so
  // that what includes it compiles the same under every MPI.)
  StallWatchdog(const MpiComm& comm, double timeout_seconds, std::string program, int exit_code,
                std::function<void()> before_abort = {});
  ~StallWatchdog();
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  // While alive, the thread that made it waits in collective `what` (a string literal, e.g.
  // "gradient all-reduce") of optimiser step `step`. Scopes do not nest.
  class Scope {
   public:
    explicit Scope(StallWatchdog* watchdog) : watchdog_(watchdog) {}
    ~Scope() {
      if (watchdog_ != nullptr) watchdog_->what_.store(nullptr, std::memory_order_release);
    }
    Scope(Scope&& other) noexcept : watchdog_(other.watchdog_) { other.watchdog_ = nullptr; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;

   private:
    StallWatchdog* watchdog_;
  };
  [[nodiscard]] Scope watch(const char* what, int64_t step);

  // Seconds the other ranks get to answer once the timeout has passed: timeout/4 in [1, 10].
  double grace_seconds() const;

 private:
  void run();
  [[noreturn]] void fire(const char* what, int64_t step, int64_t seq, double waited);

  double timeout_;
  std::string program_;
  int exit_code_;
  std::function<void()> before_abort_;
  struct Channel;  // the watchdog's own duplicate of the communicator
  std::unique_ptr<Channel> channel_;
  // Written by the watched thread (two relaxed stores and two release stores per collective).
  std::atomic<const char*> what_{nullptr};
  std::atomic<int64_t> step_{0}, seq_{0}, since_ns_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dp::mpi
