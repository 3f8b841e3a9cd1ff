// Bucketed gradient all-reduce: the bucket plan, the MPI reducer (ring or MPI_Iallreduce, advanced
// during backward) and the plain reducer for non-MPI communicators.
#include "dp/grad_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "dp/error.hpp"
#include "dp/log.hpp"
#include "dp/mpi_comm.hpp"
#include "polling_wait.hpp"
#include "ring_allreduce.hpp"

namespace dp::mpi {
namespace {

constexpr int64_t kAlignFloats = 16;  // bucket boundaries on 64-byte boundaries, like tensors
constexpr double kBytesPerMiB = 1024.0 * 1024.0;
constexpr int kRingLanes = 2;  // pieces in flight at once: one transfers while one is summed

// MiB -> floats, a positive multiple of kAlignFloats.
int64_t mib_to_floats(double mib) {
  const auto floats = static_cast<int64_t>(std::llround(mib * kBytesPerMiB / sizeof(float)));
  return std::max<int64_t>(kAlignFloats, floats / kAlignFloats * kAlignFloats);
}

std::string describe_plan(const char* how, const std::vector<Bucket>& buckets,
                          const ReducerOptions& o) {
  std::string s = str_cat(how, ", ", buckets.size(), " bucket(s)");
  if (!buckets.empty()) {
    s += str_cat(" (first ", format_mib(double(buckets.front().size()) * sizeof(float)));
    if (buckets.size() > 1) s += str_cat(", then up to ", o.bucket_mib, " MiB");
    s += ")";
  }
  s += o.overlap ? ", overlapping backward" : ", after backward (--no-overlap)";
  if (o.overlap && o.progress_us > 0) s += str_cat(", progressed every ", o.progress_us, " us");
  return s;
}

// MPI: each piece of a released bucket is summed by the ring or by one MPI_Iallreduce. Open MPI's
// ob1 moves data, and the ring posts its next step, only inside MPI calls: each grad_ready call
// advances the pieces in flight, and (overlap with progress_us > 0) so does a progress thread
// every progress_us while any are, since one convolution's backward can run for tens of ms
// between two grad_ready calls. Everything that touches MPI state here holds mutex_.
class MpiGradReducer final : public GradReducer {
 public:
  MpiGradReducer(const MpiComm& comm, const ParamStore& params, const ReducerOptions& options)
      : grads_(params.grads()),
        plan_(params, options.first_bucket_mib, options.bucket_mib),
        options_(options) {
    DP_CHECK(options.piece_elements > 0 && options.piece_elements <= INT32_MAX,
             "GradReducer: piece size ", options.piece_elements, " elements is out of range");
    DP_CHECK(options.progress_us >= 0, "GradReducer: progress interval ", options.progress_us,
             " us is negative");
    // Its own communicator: the reducer's messages never mix with the trainer's collectives.
    DP_MPI_CHECK(MPI_Comm_dup(comm.native(), &comm_));
    int64_t largest_piece = 0;
    size_t pieces = 0;
    for (const Bucket& b : plan_.buckets()) {
      largest_piece = std::max(largest_piece, std::min(b.size(), options.piece_elements));
      pieces +=
          static_cast<size_t>((b.size() + options.piece_elements - 1) / options.piece_elements);
    }
    if (options.algorithm == ReduceAlgorithm::kRing)
      ring_ = std::make_unique<RingAllreduce>(comm_, largest_piece, kRingLanes);
    else
      requests_.reserve(pieces);
    int level = MPI_THREAD_SINGLE;
    DP_MPI_CHECK(MPI_Query_thread(&level));
    if (options_.overlap && options_.progress_us > 0) {
      // Other threads (the trainer's, the stall watchdog's) may call MPI at the same time.
      if (level >= MPI_THREAD_MULTIPLE)
        poller_ = std::thread([this] { poll(); });
      else
        options_.progress_us = 0;  // describe() then says nothing of a progress thread
    }
  }

  // Work still pending here means an exception is unwinding the step (this or a peer rank
  // failed): it is neither waited for (a peer may be gone) nor freed (erroneous for
  // collectives); the app ends the job with MPI_Abort.
  ~MpiGradReducer() override {
    if (poller_.joinable()) {
      {
        const std::lock_guard lock(mutex_);
        stop_ = true;
      }
      wake_.notify_one();
      poller_.join();
    }
    const bool pending = in_flight();
    if (pending) (void)ring_.release();  // leaked with its scratch: MPI may still write there
    if (!pending && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiGradReducer(const MpiGradReducer&) = delete;
  MpiGradReducer& operator=(const MpiGradReducer&) = delete;

  void begin() override {
    const std::lock_guard lock(mutex_);
    plan_.begin_pass();
  }

  void grad_ready(const ParamView& param) override {
    bool issued = false;
    {
      const std::lock_guard lock(mutex_);
      rethrow_poller_error();
      const auto [first, last] = plan_.ready(param);
      if (options_.overlap)
        for (int b = first; b < last; ++b) issue(b);
      issued = first < last;
      progress();
    }
    if (issued && poller_.joinable()) wake_.notify_one();
  }

  void wait() override {
    const std::lock_guard lock(mutex_);  // the poller sleeps until the next step's transfers
    rethrow_poller_error();
    plan_.end_pass();
    if (!options_.overlap)
      for (int b = 0; b < static_cast<int>(plan_.buckets().size()); ++b) issue(b);
    if (ring_) ring_->wait();
    if (requests_.empty()) return;
    wait_all_yielding(requests_);
    requests_.clear();
  }

  const std::vector<Bucket>& buckets() const override { return plan_.buckets(); }
  std::string describe() const override {
    return describe_plan(ring_ ? "ring all-reduce (MPI_Isend/Irecv)" : "MPI_Iallreduce",
                         plan_.buckets(), options_);
  }

 private:
  void issue(int bucket) {
    const Bucket& b = plan_.buckets()[static_cast<size_t>(bucket)];
    for (int64_t first = b.begin; first < b.end; first += options_.piece_elements) {
      const int n = static_cast<int>(std::min(options_.piece_elements, b.end - first));
      if (ring_) {
        ring_->start(grads_ + first, n);
        continue;
      }
      MPI_Request request = MPI_REQUEST_NULL;
      DP_MPI_CHECK(
          MPI_Iallreduce(MPI_IN_PLACE, grads_ + first, n, MPI_FLOAT, MPI_SUM, comm_, &request));
      requests_.push_back(request);
    }
  }

  bool in_flight() const { return !requests_.empty() || (ring_ && !ring_->idle()); }

  void progress() {
    if (ring_) ring_->progress();
    if (requests_.empty()) return;
    int done = 0;
    DP_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                             MPI_STATUSES_IGNORE));
    if (done) requests_.clear();
  }

  // The progress thread: while backward runs with pieces in flight, advances them every
  // progress_us (sleeping, not spinning: it shares the rank's cores with backward). A failure is
  // kept for the trainer's thread, which rethrows it from its next call.
  void poll() {
    const auto interval = std::chrono::microseconds(options_.progress_us);
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (!plan_.in_pass() || !in_flight() || poller_error_) {
        wake_.wait(lock);
        continue;
      }
      try {
        progress();
      } catch (...) {
        poller_error_ = std::current_exception();
        continue;
      }
      wake_.wait_for(lock, interval, [this] { return stop_; });
    }
  }

  void rethrow_poller_error() {
    if (poller_error_) std::rethrow_exception(std::exchange(poller_error_, nullptr));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  float* grads_;
  BucketPlan plan_;
  ReducerOptions options_;
  std::unique_ptr<RingAllreduce> ring_;  // ReduceAlgorithm::kRing
  std::vector<MPI_Request> requests_;    // ReduceAlgorithm::kIallreduce: pieces in flight
  std::mutex mutex_;
  std::condition_variable wake_;  // the poller: pieces were issued, or stop
  bool stop_ = false;
  std::exception_ptr poller_error_;
  std::thread poller_;  // last: started after everything it reads
};

// Any other Comm (SelfComm in tests): one blocking all-reduce of the arena in wait(). The plan
// still checks that backward reported every parameter.
class PlainGradReducer final : public GradReducer {
 public:
  PlainGradReducer(Comm& comm, const ParamStore& params, const ReducerOptions& options)
      : comm_(comm),
        grads_(params.grads()),
        size_(params.arena_size()),
        plan_(params, options.first_bucket_mib, options.bucket_mib) {}

  void begin() override { plan_.begin_pass(); }
  void grad_ready(const ParamView& param) override { plan_.ready(param); }
  void wait() override {
    plan_.end_pass();
    comm_.allreduce_sum(grads_, static_cast<size_t>(size_));
  }
  const std::vector<Bucket>& buckets() const override { return plan_.buckets(); }
  std::string describe() const override {
    return str_cat("one Comm::allreduce_sum of ", format_mib(double(size_) * sizeof(float)),
                   " after backward");
  }

 private:
  Comm& comm_;
  float* grads_;
  int64_t size_;
  BucketPlan plan_;
};

}  // namespace

BucketPlan::BucketPlan(const ParamStore& params, double first_bucket_mib, double bucket_mib) {
  DP_CHECK(bucket_mib > 0 && first_bucket_mib > 0, "bucket sizes must be positive, got ",
           first_bucket_mib, " and ", bucket_mib, " MiB");
  const int64_t arena = params.arena_size();
  const int64_t later = mib_to_floats(bucket_mib);
  const int64_t first = std::min(mib_to_floats(first_bucket_mib), later);
  for (int64_t begin = 0; begin < arena;) {
    const int64_t end = std::min(arena, begin + (buckets_.empty() ? first : later));
    buckets_.push_back({begin, end, 0});
    begin = end;
  }
  for (const ParamView& v : params.views()) {
    if (v.numel == 0) continue;  // nothing to wait for
    DP_CHECK(v.offset >= 0 && v.offset + v.numel <= arena, "GradReducer: parameter '", v.name,
             "' lies outside the arena");
    // The bucket holding a float: the last bucket that begins at or before it.
    auto bucket_of = [&](int64_t at) {
      const auto it = std::upper_bound(buckets_.begin(), buckets_.end(), at,
                                       [](int64_t x, const Bucket& b) { return x < b.begin; });
      return static_cast<int>(it - buckets_.begin()) - 1;
    };
    slots_.push_back({&v, bucket_of(v.offset), bucket_of(v.offset + v.numel - 1)});
  }
  std::sort(slots_.begin(), slots_.end(),
            [](const Slot& a, const Slot& b) { return a.view->offset < b.view->offset; });
  for (const Slot& s : slots_)
    for (int b = s.first_bucket; b <= s.last_bucket; ++b) ++buckets_[static_cast<size_t>(b)].params;
  pending_.resize(buckets_.size());
  reported_.resize(slots_.size());
  reset();
}

void BucketPlan::reset() {
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].params;
  std::fill(reported_.begin(), reported_.end(), static_cast<unsigned char>(0));
  next_ = 0;
}

const BucketPlan::Slot& BucketPlan::slot_of(const ParamView& param) const {
  const auto it =
      std::lower_bound(slots_.begin(), slots_.end(), param.offset,
                       [](const Slot& s, int64_t offset) { return s.view->offset < offset; });
  DP_CHECK(it != slots_.end() && it->view->offset == param.offset && it->view->name == param.name,
           "GradReducer: '", param.name, "' is not a parameter of the reduced arena");
  return *it;
}

std::pair<int, int> BucketPlan::mark_ready(const ParamView& param) {
  const int released_from = next_;
  if (param.numel == 0) return {released_from, released_from};
  const Slot& s = slot_of(param);
  unsigned char& seen = reported_[static_cast<size_t>(&s - slots_.data())];
  DP_CHECK(!seen, "GradReducer: the gradient of '", param.name,
           "' was reported twice in one backward pass");
  seen = 1;
  for (int b = s.first_bucket; b <= s.last_bucket; ++b) --pending_[static_cast<size_t>(b)];
  const int n = static_cast<int>(buckets_.size());
  while (next_ < n && pending_[static_cast<size_t>(next_)] == 0) ++next_;
  return {released_from, next_};
}

std::string BucketPlan::first_missing() const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!reported_[i]) return slots_[i].view->name;
  return {};
}

void BucketPlan::begin_pass() {
  DP_CHECK(!in_pass_, "GradReducer::begin() twice without wait()");
  reset();
  in_pass_ = true;
}

std::pair<int, int> BucketPlan::ready(const ParamView& param) {
  DP_CHECK(in_pass_, "GradReducer: gradient of '", param.name, "' reported outside begin/wait");
  return mark_ready(param);
}

void BucketPlan::end_pass() {
  DP_CHECK(in_pass_, "GradReducer::wait() without begin()");
  in_pass_ = false;
  DP_CHECK(all_released(), "GradReducer: backward never reported the gradient of '",
           first_missing(), "' (every layer must call GradListener::grad_ready)");
}

std::unique_ptr<GradReducer> make_grad_reducer(Comm& comm, const ParamStore& params,
                                               const ReducerOptions& options) {
  if (const auto* mpi = dynamic_cast<const MpiComm*>(&comm))
    return std::make_unique<MpiGradReducer>(*mpi, params, options);
  return std::make_unique<PlainGradReducer>(comm, params, options);
}

}  // namespace dp::mpi
