// The stall watchdog's thread: wakes a few times per timeout, and when a collective has waited
// too long, asks the other ranks where they are, prints one line and ends the job.
#include "dp/stall_watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "dp/error.hpp"
#include "dp/mpi_comm.hpp"

namespace dp::mpi {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTag = 7301;  // on the watchdog's own communicator
constexpr double kMaxWakePeriodSeconds = 5.0;
constexpr auto kListenPause = std::chrono::milliseconds(20);
// A rank that answered but is not the one to print waits this long, then ends the job itself
// (in case the printing rank died meanwhile).
constexpr auto kSilentRankPause = std::chrono::seconds(2);

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// What a rank tells the others when its watchdog fires.
struct Where {
  int64_t seq = 0;   // collectives watched so far on that rank (the same order on every rank)
  int64_t step = 0;  // optimiser step
  double waited = 0;
  char what[48] = {};
};

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream s;
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? "," : "") << ranks[i];
  return s.str();
}

}  // namespace

struct StallWatchdog::Channel {
  MPI_Comm comm = MPI_COMM_NULL;
};

StallWatchdog::StallWatchdog(const MpiComm& comm, double timeout_seconds, std::string program,
                             int exit_code, std::function<void()> before_abort)
    : timeout_(timeout_seconds),
      program_(std::move(program)),
      exit_code_(exit_code),
      before_abort_(std::move(before_abort)),
      channel_(std::make_unique<Channel>()) {
  DP_CHECK(timeout_seconds > 0, "StallWatchdog: timeout ", timeout_seconds, " s");
  DP_MPI_CHECK(MPI_Comm_dup(comm.native(), &channel_->comm));
  thread_ = std::thread([this] { run(); });
}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
  MPI_Comm_free(&channel_->comm);
}

StallWatchdog::Scope StallWatchdog::watch(const char* what, int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  since_ns_.store(now_ns(), std::memory_order_relaxed);
  seq_.fetch_add(1, std::memory_order_release);
  what_.store(what, std::memory_order_release);
  return Scope(this);
}

double StallWatchdog::grace_seconds() const {
  return std::clamp(timeout_ / 4, 1.0, 10.0);
}

void StallWatchdog::run() {
  const auto period = std::chrono::duration<double>(std::min(timeout_ / 4, kMaxWakePeriodSeconds));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, period);
    if (stop_) break;
    // A consistent snapshot: the sequence number is the same before and after the reads.
    const int64_t seq = seq_.load(std::memory_order_acquire);
    const char* what = what_.load(std::memory_order_acquire);
    const int64_t step = step_.load(std::memory_order_relaxed);
    const int64_t since = since_ns_.load(std::memory_order_relaxed);
    if (what == nullptr || seq != seq_.load(std::memory_order_acquire)) continue;
    const double waited = double(now_ns() - since) * 1e-9;
    if (waited < timeout_) continue;
    lock.unlock();
    fire(what, step, seq, waited);
  }
}

void StallWatchdog::fire(const char* what, int64_t step, int64_t seq, double waited) {
  int rank = 0, size = 1, level = MPI_THREAD_SINGLE;
  MPI_Comm_rank(channel_->comm, &rank);
  MPI_Comm_size(channel_->comm, &size);
  MPI_Query_thread(&level);
  static Where mine;  // sent without waiting for completion: it must outlive this call
  mine.seq = seq, mine.step = step, mine.waited = waited;
  std::strncpy(mine.what, what, sizeof mine.what - 1);
  std::vector<Where> heard(static_cast<size_t>(size));
  std::vector<bool> answered(size_t(size), false);
  const bool can_ask = level >= MPI_THREAD_MULTIPLE;
  if (can_ask) {
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(&mine, sizeof mine, MPI_BYTE, q, kTag, channel_->comm, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(grace_seconds());
    int count = 0;
    while (count < size - 1 && Clock::now() < deadline) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kTag, channel_->comm, &flag, &status);
      if (flag == 0) {
        std::this_thread::sleep_for(kListenPause);
        continue;
      }
      Where w;
      MPI_Recv(&w, sizeof w, MPI_BYTE, status.MPI_SOURCE, kTag, channel_->comm, MPI_STATUS_IGNORE);
      w.what[sizeof w.what - 1] = '\0';
      if (!answered[size_t(status.MPI_SOURCE)]) ++count;
      heard[size_t(status.MPI_SOURCE)] = w;
      answered[size_t(status.MPI_SOURCE)] = true;
    }
  }
  std::vector<int> silent, elsewhere;
  int lowest = rank;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    if (!answered[size_t(q)]) {
      silent.push_back(q);
      continue;
    }
    lowest = std::min(lowest, q);
    if (heard[size_t(q)].seq != seq) elsewhere.push_back(q);
  }
  if (rank == lowest) {
    std::ostringstream line;
    line << program_ << ": error: [rank " << rank << "] stalled: waited " << std::fixed;
    line.precision(1);
    line << waited << " s in the " << what << " of step " << step;
    if (!can_ask)
      line << "; cannot ask the other ranks (MPI without MPI_THREAD_MULTIPLE)";
    else if (!silent.empty())
      line << "; rank(s) " << rank_list(silent) << " of " << size << " did not answer within "
           << grace_seconds() << " s (stopped, hung, dead or still computing)";
    for (int q : elsewhere)
      line << "; rank " << q << " waits in the " << heard[size_t(q)].what << " of step "
           << heard[size_t(q)].step;
    if (can_ask && silent.empty() && elsewhere.empty())
      line << "; every rank waits in it (a network or MPI failure?)";
    line << std::defaultfloat << "; ending the job (--stall-timeout " << timeout_
         << ", exit status " << exit_code_ << ")\n";
    const std::string text = line.str();
    std::fputs(text.c_str(), stderr);
    Env::drain_output();
  } else {
    std::this_thread::sleep_for(kSilentRankPause);
  }
  if (before_abort_) before_abort_();
  MPI_Abort(MPI_COMM_WORLD, exit_code_);
  std::_Exit(exit_code_);
}

}  // namespace dp::mpi
