// NCCL gradient reducer: bucket all-reduces on a dedicated stream, ordered after backward's
// kernels by events, with asynchronous-error checks while waiting (compiled with DP_WITH_CUDA).
#include "dp/nccl_grad_reducer.hpp"

#include <chrono>
#include <thread>

#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "dp/log.hpp"

namespace dp::mpi {
namespace {

// How long wait() sleeps between polls of the reductions and of NCCL's asynchronous error.
constexpr std::chrono::microseconds kPollInterval{20};

class NcclGradReducer final : public GradReducer {
 public:
  NcclGradReducer(NcclComm& nccl, const ParamStore& params, float* device_grads,
                  cudaStream_t compute_stream, const ReducerOptions& options)
      : nccl_(nccl),
        grads_(device_grads),
        compute_(compute_stream),
        plan_(params, options.first_bucket_mib, options.bucket_mib),
        options_(options) {
    DP_CHECK(device_grads != nullptr || params.arena_size() == 0,
             "NCCL reducer: no device gradient arena");
  }

  void begin() override { plan_.begin_pass(); }

  void grad_ready(const ParamView& param) override {
    const auto [first, last] = plan_.ready(param);
    if (options_.overlap) issue(first, last);
  }

  void wait() override {
    plan_.end_pass();
    if (!options_.overlap) issue(0, static_cast<int>(plan_.buckets().size()));
    done_.record(stream_.get());
    while (!done_.query()) {
      nccl_.check_async();
      std::this_thread::sleep_for(kPollInterval);
    }
    nccl_.check_async();
    done_.wait_on(compute_);  // already complete; keeps the stream order explicit
  }

  const std::vector<Bucket>& buckets() const override { return plan_.buckets(); }
  std::string describe() const override {
    return str_cat("ncclAllReduce on a dedicated stream, ", plan_.buckets().size(),
                   " bucket(s) of up to ", options_.bucket_mib, " MiB",
                   options_.overlap ? ", overlapping backward" : ", after backward");
  }

 private:
  // Buckets [first, last): after everything enqueued on the compute stream so far.
  void issue(int first, int last) {
    if (first >= last) return;
    ready_.record(compute_);
    ready_.wait_on(stream_.get());
    DP_NCCL_CHECK(ncclGroupStart());
    try {
      for (int b = first; b < last; ++b) {
        const Bucket& bucket = plan_.buckets()[static_cast<size_t>(b)];
        nccl_.allreduce_sum(grads_ + bucket.begin, static_cast<size_t>(bucket.size()),
                            stream_.get());
      }
    } catch (...) {
      (void)ncclGroupEnd();  // never leave the group open: the communicator is aborted later
      throw;
    }
    DP_NCCL_CHECK(ncclGroupEnd());
  }

  NcclComm& nccl_;
  float* grads_;
  cudaStream_t compute_;
  cuda::Stream stream_;  // the reductions' own stream
  cuda::Event ready_, done_;
  BucketPlan plan_;
  ReducerOptions options_;
};

}  // namespace

std::unique_ptr<GradReducer> make_nccl_grad_reducer(NcclComm& nccl, const ParamStore& params,
                                                    float* device_grads,
                                                    cudaStream_t compute_stream,
                                                    const ReducerOptions& options) {
  return std::make_unique<NcclGradReducer>(nccl, params, device_grads, compute_stream, options);
}

}  // namespace dp::mpi
