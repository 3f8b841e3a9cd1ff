// GradReducer under mpiexec -n 1..4: bucketed, overlapped all-reduces give exactly the sums of a
// plain blocking all-reduce (integer-valued data, so exact in fp32), for several bucket sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "dp/error.hpp"
#include "dp/grad_reducer.hpp"
#include "dp/mpi_comm.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

using mpi::Bucket;
using mpi::ReducerOptions;

// Tensors of assorted sizes (declared in forward order; the arena holds them reversed). The
// largest is bigger than the small buckets below, so buckets cut tensors.
const std::vector<int64_t> kSizes = {3, 100, 5000, 40000, 1, 70000, 17, 200000, 64, 9};

ParamStore make_store(const std::vector<int64_t>& sizes = kSizes) {
  ParamStore ps;
  int i = 0;
  for (int64_t n : sizes) ps.add(str_cat("t", i++, ".weight"), {n}, 1);
  ps.finalize();
  return ps;
}

const char* name(mpi::ReduceAlgorithm a) {
  return a == mpi::ReduceAlgorithm::kRing ? "ring" : "MPI_Iallreduce";
}

// Views in arena order: the order in which backward reports them.
std::vector<const ParamView*> arena_order(const ParamStore& ps) {
  std::vector<const ParamView*> v;
  for (const ParamView& p : ps.views()) v.push_back(&p);
  std::sort(v.begin(), v.end(),
            [](const ParamView* a, const ParamView* b) { return a->offset < b->offset; });
  return v;
}

// Small integers: every partial sum over <= 4 ranks is exact in fp32, whatever the order.
float value(int64_t i, int rank, int iteration) {
  return float((i * 7 + rank * 13 + iteration * 5) % 61 - 30);
}

// Fills each tensor just before reporting it (as backward does), in arena order or reversed,
// reduces, and counts wrong elements over all ranks against a blocking all-reduce of the same
// data. Padding must stay zero. Both algorithms.
void expect_exact_with(const ReducerOptions& o, bool reverse_order, int iterations,
                       const std::vector<int64_t>& sizes) {
  Comm& comm = test::world();
  ParamStore ps = make_store(sizes);
  auto reducer = mpi::make_grad_reducer(comm, ps, o);
  std::vector<const ParamView*> order = arena_order(ps);
  if (reverse_order) std::reverse(order.begin(), order.end());
  const auto n = size_t(ps.arena_size());
  std::vector<float> reference(n);
  for (int it = 0; it < iterations; ++it) {
    std::fill(reference.begin(), reference.end(), 0.0f);
    for (const ParamView* p : order)
      for (int64_t j = 0; j < p->numel; ++j)
        reference[size_t(p->offset + j)] = value(p->offset + j, comm.rank(), it);
    comm.allreduce_sum(reference.data(), n);

    // Stale values that backward overwrites; the padding between tensors stays zero.
    for (const ParamView* p : order) std::fill(p->grad, p->grad + p->numel, -1.0f);
    reducer->begin();
    for (const ParamView* p : order) {
      for (int64_t j = 0; j < p->numel; ++j) p->grad[j] = value(p->offset + j, comm.rank(), it);
      reducer->grad_ready(*p);
    }
    reducer->wait();

    int64_t wrong[2] = {0, 0};  // [0]: differs from the blocking all-reduce, [1]: padding != 0
    std::vector<bool> covered(n, false);
    for (const ParamView* p : order)
      for (int64_t j = 0; j < p->numel; ++j) covered[size_t(p->offset + j)] = true;
    for (size_t i = 0; i < n; ++i) {
      if (covered[i])
        wrong[0] += ps.grads()[i] != reference[i];
      else
        wrong[1] += ps.grads()[i] != 0.0f;
    }
    comm.allreduce_sum(wrong, 2);
    EXPECT_EQ(wrong[0], 0) << name(o.algorithm) << ": wrong elements over all ranks, iteration "
                           << it;
    EXPECT_EQ(wrong[1], 0) << name(o.algorithm) << ": non-zero padding over all ranks, iteration "
                           << it;
  }
  if (comm.rank() == 0)
    std::printf("[np %d] %s: exact over %d iterations\n", comm.size(), reducer->describe().c_str(),
                iterations);
}

void expect_exact(ReducerOptions o, bool reverse_order, int iterations = 3,
                  const std::vector<int64_t>& sizes = kSizes) {
  for (const auto algorithm : {mpi::ReduceAlgorithm::kRing, mpi::ReduceAlgorithm::kIallreduce}) {
    o.algorithm = algorithm;
    expect_exact_with(o, reverse_order, iterations, sizes);
  }
}

ReducerOptions buckets_of(double mib) {
  ReducerOptions o;
  o.bucket_mib = mib;
  o.first_bucket_mib = mib;
  return o;
}

TEST(GradReducer, DefaultBucketsAreExact) {
  expect_exact(ReducerOptions{}, false);
}

TEST(GradReducer, BucketsSmallerThanOneTensorAreExact) {
  expect_exact(buckets_of(0.1), false);  // 26,208 floats < the 40k, 70k and 200k tensors
}

TEST(GradReducer, ManyTinyBucketsAreExact) {
  expect_exact(buckets_of(0.004), false);  // 1,040 floats: ~300 buckets in flight
}

TEST(GradReducer, PiecesWithinABucketAreExact) {
  ReducerOptions o = buckets_of(0.5);
  o.piece_elements = 1000;  // several MPI_Iallreduce calls per bucket
  expect_exact(o, false);
}

TEST(GradReducer, PiecesSmallerThanTheWorldAreExact) {
  // Pieces of 2 elements: with 3 or 4 ranks some ring chunks are empty.
  ReducerOptions o = buckets_of(0.001);
  o.piece_elements = 2;
  expect_exact(o, false, 2, {1, 2, 3, 40});
}

TEST(GradReducer, NoOverlapIsExact) {
  ReducerOptions o = buckets_of(0.05);
  o.overlap = false;
  expect_exact(o, false);
}

TEST(GradReducer, OutOfOrderReadinessReleasesBucketsInOrder) {
  // Every bucket becomes complete only at the end; they must still be issued 0, 1, 2, ...
  expect_exact(buckets_of(0.05), true);
}

TEST(GradReducer, ProgressThreadPollingEveryMicrosecondIsExact) {
  ReducerOptions o = buckets_of(0.004);
  o.progress_us = 1;  // the thread takes the lock as often as it can, between grad_ready calls
  expect_exact(o, false);
  o.progress_us = 0;  // no thread: grad_ready and wait() alone
  expect_exact(o, false);
}

// Backward's long convolutions make no MPI call: the progress thread alone must finish the sums
// of buckets released before them. Every bucket is released, then no rank calls MPI until the
// arena holds the sums (or 20 s pass).
TEST(GradReducer, ProgressThreadFinishesTheSumsDuringALongLayer) {
  Comm& comm = test::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  for (const auto algorithm : {mpi::ReduceAlgorithm::kRing, mpi::ReduceAlgorithm::kIallreduce}) {
    ReducerOptions o = buckets_of(0.1);
    o.algorithm = algorithm;
    o.piece_elements = 20000;  // several ring pieces, each of 2(p-1) steps
    ParamStore ps = make_store();
    auto reducer = mpi::make_grad_reducer(comm, ps, o);
    const auto n = size_t(ps.arena_size());
    std::vector<float> reference(n, 0.0f);
    const std::vector<const ParamView*> order = arena_order(ps);
    for (const ParamView* p : order)
      for (int64_t j = 0; j < p->numel; ++j)
        reference[size_t(p->offset + j)] = value(p->offset + j, comm.rank(), 0);
    comm.allreduce_sum(reference.data(), n);

    reducer->begin();
    for (const ParamView* p : order) {
      for (int64_t j = 0; j < p->numel; ++j) p->grad[j] = value(p->offset + j, comm.rank(), 0);
      reducer->grad_ready(*p);
    }
    // The "long layer": the sums land while this thread only reads (every value, once written
    // by the progress thread, is final).
    const auto start = std::chrono::steady_clock::now();
    bool summed = false;
    while (!summed && std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      summed = std::equal(reference.begin(), reference.end(), ps.grads());
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    reducer->wait();
    EXPECT_TRUE(summed) << name(algorithm)
                        << ": the arena did not hold the sums 20 s after the last grad_ready; "
                           "nothing advanced the all-reduce between grad_ready and wait()";
    EXPECT_TRUE(std::equal(reference.begin(), reference.end(), ps.grads())) << name(algorithm);
    if (comm.rank() == 0)
      std::printf("[np %d] %s: summed %.1f ms after the last grad_ready, before wait()\n",
                  comm.size(), reducer->describe().c_str(), ms);
  }
}

TEST(GradReducer, NonMpiCommReducesTheWholeArena) {
  SelfComm self;
  ParamStore ps = make_store();
  auto reducer = mpi::make_grad_reducer(self, ps, ReducerOptions{});
  reducer->begin();
  for (const ParamView* p : arena_order(ps)) {
    std::fill(p->grad, p->grad + p->numel, 2.0f);
    reducer->grad_ready(*p);
  }
  reducer->wait();
  EXPECT_EQ(ps.grads()[0], 2.0f);
}

TEST(BucketPlan, BucketsCoverTheArenaAlignedAndCapped) {
  ParamStore ps = make_store();
  constexpr double kMiB = 0.1;
  const int64_t cap = 26208;  // 0.1 MiB in floats, rounded down to a multiple of 16
  mpi::BucketPlan plan(ps, 0.01, kMiB);
  const std::vector<Bucket>& b = plan.buckets();
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b.front().begin, 0);
  EXPECT_EQ(b.front().size(), 2608);  // the small first bucket: 0.01 MiB
  EXPECT_EQ(b.back().end, ps.arena_size());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].begin % 16, 0);
    EXPECT_GT(b[i].params, 0);
    if (i > 0) {
      EXPECT_EQ(b[i].begin, b[i - 1].end);
    }
    if (i > 0 && i + 1 < b.size()) {
      EXPECT_EQ(b[i].size(), cap);
    }
  }
  // The first bucket larger than the others is capped at their size.
  EXPECT_EQ(mpi::BucketPlan(ps, 25.0, kMiB).buckets().front().size(), cap);

  // Buckets are released in order: reporting the arena's last tensor first releases nothing.
  const std::vector<const ParamView*> order = arena_order(ps);
  plan.reset();
  auto released = plan.mark_ready(*order.back());
  EXPECT_EQ(released.first, released.second);
  // Reporting the first tensor (entirely inside bucket 0 with other tensors) releases bucket 0
  // only once every tensor overlapping it is in.
  int total = 0;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    released = plan.mark_ready(*order[i]);
    EXPECT_EQ(released.first, total);
    total = released.second;
  }
  EXPECT_EQ(total, int(b.size()));
  EXPECT_TRUE(plan.all_released());
}

TEST(GradReducer, MisuseIsAnErrorNamingTheTensor) {
  Comm& comm = test::world();
  ParamStore ps = make_store();
  const std::vector<const ParamView*> order = arena_order(ps);
  {
    // The first tensor in arena order is never reported: nothing may be sent, and wait() says
    // which gradient is missing (every rank throws the same; no collective is left pending).
    auto reducer = mpi::make_grad_reducer(comm, ps, buckets_of(0.05));
    reducer->begin();
    for (size_t i = 1; i < order.size(); ++i) reducer->grad_ready(*order[i]);
    try {
      reducer->wait();
      ADD_FAILURE() << "wait() accepted a missing gradient";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + order[0]->name + "'"), std::string::npos)
          << e.what();
    }
  }
  {
    auto reducer = mpi::make_grad_reducer(comm, ps, buckets_of(25));
    reducer->begin();
    reducer->grad_ready(*order[0]);
    EXPECT_THROW(reducer->grad_ready(*order[0]), Error);  // twice in one pass
    ParamStore other;
    other.add("stranger", {5}, 1);
    other.finalize();
    EXPECT_THROW(reducer->grad_ready(other.view(0)), Error);
  }
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
