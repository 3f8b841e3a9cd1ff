// MpiComm under mpiexec: all-reduce sums with exactly predictable results, broadcast, agreement.
#include <gtest/gtest.h>

#include <vector>

#include "dp/mpi_comm.hpp"
#include "test_util.hpp"

namespace {

dp::Comm& comm() {
  return dp::test::world();
}

TEST(MpiComm, RanksAndLocalRanks) {
  EXPECT_GE(comm().size(), 1);
  EXPECT_LT(comm().rank(), comm().size());
  EXPECT_LT(comm().local_rank(), comm().local_size());
  EXPECT_LE(comm().local_size(), comm().size());
}

TEST(MpiComm, AllreduceSumIsExact) {
  const int W = comm().size(), r = comm().rank();
  // Larger than one internal chunk (1M elements), not a multiple of it.
  const size_t n = (size_t{1} << 20) * 2 + 12345;
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = float((i % 1000) + r);  // small integers: exact in fp32
  comm().allreduce_sum(f.data(), n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const float expected = float(W * (i % 1000) + W * (W - 1) / 2);
    wrong += f[i] != expected;
  }
  EXPECT_EQ(wrong, 0u);
  for (int repeat = 0; repeat < 3; ++repeat) {
    std::vector<double> d{1.5 * r, -2.0};
    std::vector<int64_t> k{int64_t{1} << 40, r};
    comm().allreduce_sum(d.data(), d.size());
    comm().allreduce_sum(k.data(), k.size());
    EXPECT_EQ(d[0], 1.5 * W * (W - 1) / 2);
    EXPECT_EQ(d[1], -2.0 * W);
    EXPECT_EQ(k[0], (int64_t{1} << 40) * W);
    EXPECT_EQ(k[1], int64_t{W} * (W - 1) / 2);
  }
}

TEST(MpiComm, BroadcastFromRootAndAgreement) {
  std::vector<float> v((size_t{1} << 21) + 7, float(comm().rank()));
  if (comm().rank() == 0)
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 4096);
  comm().broadcast(v.data(), v.size() * sizeof(float), 0);
  size_t wrong = 0;
  for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != float(i % 4096);
  EXPECT_EQ(wrong, 0u);
  EXPECT_TRUE(comm().all_true(true));
  EXPECT_FALSE(comm().all_true(comm().rank() != comm().size() - 1));
}

}  // namespace

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
