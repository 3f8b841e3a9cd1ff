// dppredict: crack masks from a trained checkpoint for images of any size, or metrics on a
// dataset split ([mpirun -np N] dppredict -c model_best.h5 -o out images/).
#include <cstdio>
#include <exception>
#include <memory>

#include "dp/mpi_comm.hpp"
#include "predict/options.hpp"
#include "predict/run.hpp"
#include "train/options.hpp"
#include "train/trainer.hpp"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

void report(int rank, const char* what) {
  std::fprintf(stderr, "dppredict: error: [rank %d] %s\n", rank, what);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<dp::mpi::Env> env;
  try {
    env = std::make_unique<dp::mpi::Env>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dppredict: error: %s\n", e.what());
    return kExitFailure;
  }
  int rank = 0;
  try {
    dp::mpi::MpiComm comm;
    rank = comm.rank();
    // Every rank parses the same argv: a usage error is reported once, by rank 0.
    const auto options = dp::app::parse_predict_options(argc, argv, rank == 0);
    if (!options) return 0;
    return dp::app::run_predict(*options, comm, dp::Logger(rank));
  } catch (const dp::app::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "dppredict: error: %s\n", e.what());
    return kExitUsage;
  } catch (const dp::app::AgreedFailure& e) {
    // Every rank knows; the rank that saw the problem says what it was.
    if (e.report()) report(rank, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    // Seen by this rank alone: end the whole job so no peer waits for it.
    report(rank, e.what());
    dp::mpi::Env::abort(kExitFailure);
  }
}
