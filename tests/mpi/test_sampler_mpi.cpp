// MPI test of DistributedSampler: across ranks every sample is visited exactly once per epoch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "dp/sampler.hpp"

namespace {

using dp::data::DistributedSampler;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Every rank's indices, concatenated in rank order (counts may differ between ranks). The
// collectives run unconditionally so a failed expectation on one rank cannot hang the others.
std::vector<int64_t> gather_all(const std::vector<int64_t>& mine) {
  const int size = world_size();
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size), 0);
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::partial_sum(counts.begin(), counts.end() - 1, offsets.begin() + 1);
  std::vector<int64_t> all(static_cast<size_t>(offsets.back() + counts.back()));
  MPI_Allgatherv(mine.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(SamplerMpi, TrainSamplerSeesEverySampleOnceWhenEven) {
  const int rank = world_rank(), size = world_size();
  for (int64_t per_rank : {1, 5, 8}) {
    const int64_t n = per_rank * size;
    DistributedSampler sampler(n, rank, size, {true, true, false, 1234});
    EXPECT_EQ(sampler.num_samples(), per_rank);
    EXPECT_EQ(sampler.total_size(), n);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const auto mine = sampler.indices(epoch);
      EXPECT_EQ(static_cast<int64_t>(mine.size()), per_rank);
      // Allgather: rank r's k-th index is at position r*per_rank + k.
      std::vector<int64_t> all(static_cast<size_t>(n), -1);
      std::vector<int64_t> send(static_cast<size_t>(per_rank), -1);
      std::copy_n(mine.begin(), std::min<size_t>(mine.size(), send.size()), send.begin());
      MPI_Allgather(send.data(), static_cast<int>(per_rank), MPI_INT64_T, all.data(),
                    static_cast<int>(per_rank), MPI_INT64_T, MPI_COMM_WORLD);
      // The ranks agree on one global permutation: position r + W*k belongs to rank r.
      const auto global = DistributedSampler(n, 0, 1, {true, false, false, 1234}).indices(epoch);
      for (int r = 0; r < size; ++r) {
        for (int64_t k = 0; k < per_rank; ++k) {
          EXPECT_EQ(all[static_cast<size_t>(r * per_rank + k)],
                    global[static_cast<size_t>(r + size * k)]);
        }
      }
      std::sort(all.begin(), all.end());
      EXPECT_EQ(all, iota(n)) << "n=" << n << " epoch=" << epoch;
    }
  }
}

TEST(SamplerMpi, ValSamplerSeesEverySampleOnceWhenUneven) {
  const int rank = world_rank(), size = world_size();
  for (int64_t n : {int64_t{1}, int64_t{size} + 1, int64_t{3} * size + 1, int64_t{7} * size - 1}) {
    DistributedSampler sampler(n, rank, size, {false, false, false, 0});
    auto all = gather_all(sampler.indices(0));
    EXPECT_EQ(static_cast<int64_t>(all.size()), n);
    std::sort(all.begin(), all.end());
    EXPECT_EQ(all, iota(n)) << "n=" << n;
    // Shuffled validation order covers everything once as well.
    DistributedSampler shuffled(n, rank, size, {true, false, false, 5});
    all = gather_all(shuffled.indices(3));
    std::sort(all.begin(), all.end());
    EXPECT_EQ(all, iota(n)) << "n=" << n << " (shuffled)";
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int local = RUN_ALL_TESTS();
  // Every rank exits non-zero if any rank failed.
  int global = local;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return global;
}
