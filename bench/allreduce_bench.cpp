// bench_allreduce: bus bandwidth of the GradReducer against a raw MPI_Allreduce of the same bytes
// (nccl-tests' definition: busbw = algbw * 2(n-1)/n), on UNet16 gradient arenas and plain sizes.
//
//   mpirun -np 2 build/default/bench/bench_allreduce [--iters N] [--warmup N]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/error.hpp"
#include "dp/grad_reducer.hpp"
#include "dp/model.hpp"
#include "dp/mpi_comm.hpp"

namespace {

constexpr int kDefaultIters = 20;
constexpr int kDefaultWarmup = 3;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kUnlimitedPiece = INT32_MAX;

struct Args {
  int iters = kDefaultIters;
  int warmup = kDefaultWarmup;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0)
      a.iters = std::max(1, std::atoi(argv[i + 1]));
    else if (std::strcmp(argv[i], "--warmup") == 0)
      a.warmup = std::max(0, std::atoi(argv[i + 1]));
    else
      dp::fail("bench_allreduce: unknown argument ", argv[i], " (--iters N, --warmup N)");
  }
  return a;
}

// Median over the iterations of the slowest rank's seconds for `op`, each iteration started
// together (barrier) so that the time is the collective's, not a rank's wait for a late peer.
// The median, not the mean: the machine is shared, and a descheduled rank skews a mean.
double time_op(const Args& a, MPI_Comm comm, const std::function<void()>& op) {
  for (int i = 0; i < a.warmup; ++i) op();
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    DP_MPI_CHECK(MPI_Barrier(comm));
    const double t0 = MPI_Wtime();
    op();
    double mine = MPI_Wtime() - t0, slowest = 0;
    DP_MPI_CHECK(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm));
    times.push_back(slowest);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Every gradient of `ps` reported at once (the reducer's bandwidth, without backward to hide it).
void reduce_all(dp::mpi::GradReducer& r, const std::vector<const dp::ParamView*>& order) {
  r.begin();
  for (const dp::ParamView* p : order) r.grad_ready(*p);
  r.wait();
}

void bench_store(const Args& a, dp::mpi::MpiComm& comm, const std::string& label,
                 const dp::ParamStore& ps) {
  const int n = comm.size();
  const auto count = size_t(ps.arena_size());
  const double bytes = double(count) * sizeof(float);
  std::vector<const dp::ParamView*> order;
  for (const dp::ParamView& p : ps.views()) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](auto* x, auto* y) { return x->offset < y->offset; });
  for (size_t i = 0; i < count; ++i) ps.grads()[i] = float(i % 7);

  struct Method {
    std::string name;
    std::function<void()> op;
  };
  std::vector<Method> methods;
  methods.push_back({"MPI_Allreduce, one call", [&] {
                       DP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, ps.grads(), int(count), MPI_FLOAT,
                                                  MPI_SUM, comm.native()));
                     }});
  methods.push_back(
      {"MPI_Allreduce, 1M-element pieces", [&] { comm.allreduce_sum(ps.grads(), count); }});
  std::vector<std::unique_ptr<dp::mpi::GradReducer>> reducers;
  auto add_reducer = [&](const std::string& name, dp::mpi::ReduceAlgorithm algorithm,
                         double bucket_mib, int64_t piece) {
    dp::mpi::ReducerOptions o;
    o.algorithm = algorithm;
    o.bucket_mib = bucket_mib;
    o.piece_elements = piece;
    reducers.push_back(dp::mpi::make_grad_reducer(comm, ps, o));
    dp::mpi::GradReducer* r = reducers.back().get();
    methods.push_back({name, [&, r] { reduce_all(*r, order); }});
  };
  using dp::mpi::ReduceAlgorithm;
  add_reducer("GradReducer ring, 25 MiB buckets, 1M pieces (default)", ReduceAlgorithm::kRing, 25,
              dp::mpi::kDefaultPieceElements);
  add_reducer("GradReducer ring, 25 MiB buckets, one piece each", ReduceAlgorithm::kRing, 25,
              kUnlimitedPiece);
  add_reducer("GradReducer Iallreduce, 25 MiB buckets, 1M pieces", ReduceAlgorithm::kIallreduce, 25,
              dp::mpi::kDefaultPieceElements);
  add_reducer("GradReducer Iallreduce, 25 MiB buckets, one piece each",
              ReduceAlgorithm::kIallreduce, 25, kUnlimitedPiece);

  for (const Method& m : methods) {
    const double seconds = time_op(a, comm.native(), m.op);
    const double algbw = bytes / seconds / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (comm.rank() == 0)
      std::printf("| %-28s | %9.1f | %-56s | %9.2f | %7.2f | %7.2f |\n", label.c_str(),
                  bytes / kMiB, m.name.c_str(), seconds * 1e3, algbw, busbw);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dp::mpi::Env env(&argc, &argv);
  try {
    const Args a = parse(argc, argv);
    dp::mpi::MpiComm comm;
    if (comm.rank() == 0) {
      std::printf(
          "bench_allreduce: %d ranks, median of %d iterations (+%d warm-up), float32 sums in "
          "place\n",
          comm.size(), a.iters, a.warmup);
      std::printf("| %-28s | %9s | %-56s | %9s | %7s | %7s |\n", "gradients", "MiB", "method",
                  "time ms", "algbw", "busbw");
      std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(),
                  std::string(11, '-').c_str(), std::string(58, '-').c_str(),
                  std::string(11, '-').c_str(), std::string(9, '-').c_str(),
                  std::string(9, '-').c_str());
    }
    auto backend = dp::make_cpu_backend();
    for (const int divisor : {8, 1}) {
      dp::ModelConfig mc;
      mc.width_divisor = divisor;
      auto model = dp::make_model(mc, *backend);
      bench_store(a, comm, dp::str_cat("unet16 /", divisor, " arena"), model->params());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: error: %s\n", e.what());
    dp::mpi::Env::abort(1);
  }
  return 0;
}
