// NCCL reducer under mpiexec (one GPU per rank): bucketed ncclAllReduce on its own stream gives
// exactly the sums of MPI's blocking all-reduce; skips, with the reason, without enough GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "dp/mpi_comm.hpp"
#include "dp/nccl_grad_reducer.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

TEST(NcclGradReducer, BucketsAreExactAndOverlapTheComputeStream) {
  mpi::MpiComm& world = test::world();
  // NCCL refuses two ranks of one communicator on the same GPU: one visible GPU per local rank.
  const int visible = cuda::visible_device_count();
  if (visible < world.local_size())
    GTEST_SKIP() << world.local_size() << " rank(s) on this node, " << visible
                 << " GPU(s) visible: " << cuda::no_device_reason();
  cuda::select_device(world.local_rank(), world.local_size(), false);
  mpi::NcclComm nccl(world);

  ParamStore ps;
  const int64_t sizes[] = {3, 100, 5000, 40000, 1, 70000, 17, 200000};
  int i = 0;
  for (int64_t n : sizes) ps.add(str_cat("t", i++, ".weight"), {n}, 1);
  ps.finalize();
  std::vector<const ParamView*> order;
  for (const ParamView& p : ps.views()) order.push_back(&p);
  std::sort(order.begin(), order.end(),
            [](const ParamView* a, const ParamView* b) { return a->offset < b->offset; });

  const auto n = size_t(ps.arena_size());
  cuda::DeviceBuffer<float> device(n);
  cuda::Stream compute;
  for (const bool overlap : {true, false}) {
    mpi::ReducerOptions o;
    o.bucket_mib = o.first_bucket_mib = 0.1;  // buckets smaller than the larger tensors
    o.overlap = overlap;
    auto reducer = mpi::make_nccl_grad_reducer(nccl, ps, device.data(), compute.get(), o);
    for (int iteration = 0; iteration < 3; ++iteration) {
      // Small integers: exact in fp32 whatever the summation order.
      for (size_t k = 0; k < n; ++k)
        ps.grads()[k] = float((int64_t(k) * 7 + world.rank() * 13 + iteration * 5) % 61 - 30);
      std::vector<float> reference(ps.grads(), ps.grads() + n);
      world.allreduce_sum(reference.data(), n);

      reducer->begin();
      for (const ParamView* p : order) {  // "backward": each gradient lands on the compute stream
        DP_CUDA_CHECK(cudaMemcpyAsync(device.data() + p->offset, p->grad,
                                      size_t(p->numel) * sizeof(float), cudaMemcpyHostToDevice,
                                      compute.get()));
        reducer->grad_ready(*p);
      }
      reducer->wait();
      compute.synchronize();
      std::vector<float> result(n);
      device.copy_to_host(result.data());
      int64_t wrong = 0;
      for (const ParamView* p : order)
        for (int64_t j = 0; j < p->numel; ++j)
          wrong += result[size_t(p->offset + j)] != reference[size_t(p->offset + j)];
      world.allreduce_sum(&wrong, 1);
      EXPECT_EQ(wrong, 0) << "overlap " << overlap << ", iteration " << iteration;
    }
  }
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
