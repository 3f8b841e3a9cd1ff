// dptrain: data-parallel training of crack-segmentation UNets (mpirun -np N dptrain [options]).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "dp/mpi_comm.hpp"
#include "train/options.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"

namespace {

void report(int rank, const char* what) {
  std::fprintf(stderr, "dptrain: error: [rank %d] %s\n", rank, what);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<dp::app::PreemptionHandlers> preemption;
  std::unique_ptr<dp::mpi::Env> env;
  try {
    // From the first instruction: a SIGTERM/SIGUSR1 during start-up is acted on at the first
    // step boundary (checkpoint, exit 75) instead of killing the rank.
    preemption = std::make_unique<dp::app::PreemptionHandlers>();
    if (std::getenv("DP_TEST_PREEMPT_AT_START") != nullptr) std::raise(SIGUSR1);  // test hook
    env = std::make_unique<dp::mpi::Env>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dptrain: error: %s\n", e.what());
    return 1;
  }
  int rank = 0;
  try {
    dp::mpi::MpiComm comm;
    rank = comm.rank();
    // Every rank parses the same argv: a usage error is reported once, by rank 0.
    const auto options = dp::app::parse_train_options(argc, argv, rank == 0);
    if (!options) return 0;
    dp::app::Trainer trainer(*options, comm, dp::Logger(rank, options->log_all_ranks));
    return trainer.run();
  } catch (const dp::app::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "dptrain: error: %s\n", e.what());
    return 2;
  } catch (const dp::app::AgreedFailure& e) {
    // Every rank knows; the rank that saw the problem says what it was.
    if (e.report()) report(rank, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    // Seen by this rank alone (e.g. a read error mid-epoch): end the whole job so no peer hangs.
    report(rank, e.what());
    dp::mpi::Env::abort(1);
  }
}
