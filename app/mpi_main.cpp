// run_mpi_program (dptrain) and run_program (dppredict): their main(), MPI start-up and exit codes.
#include "mpi_main.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "agreement.hpp"
#include "exit_codes.hpp"
#include "train/options.hpp"
#include "train/trainer.hpp"

namespace dp::app {
namespace {

// One line, whatever the message holds (HDF5's error texts contain newlines).
std::string one_line(const char* what) {
  std::string line(what);
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

void report(const char* program, int rank, const char* what) {
  std::fprintf(stderr, "%s: error: [rank %d] %s\n", program, rank, one_line(what).c_str());
  std::fflush(stderr);
}

// body()'s exit code, or the exit code of the exception it threw (rank: for the error line).
int guarded(const char* program, int rank, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    // Every rank parses the same argv: a usage error is reported once, by rank 0.
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, one_line(e.what()).c_str());
    return kExitUsage;
  } catch (const AgreedFailure& e) {
    // Every rank knows; the rank that saw the problem says what it was.
    if (e.report()) report(program, rank, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    // Seen by this rank alone (e.g. a read error mid-epoch): end the whole job so no peer hangs.
    report(program, rank, e.what());
    mpi::Env::abort(kExitFailure);
  }
}

}  // namespace

int run_mpi_program(const char* program, int& argc, char**& argv,
                    const std::function<int(mpi::MpiComm& world)>& body) {
  std::unique_ptr<mpi::Env> env;
  try {
    env = std::make_unique<mpi::Env>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, one_line(e.what()).c_str());
    return kExitFailure;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return guarded(program, rank, [&] {
    mpi::MpiComm world;
    return body(world);
  });
}

int run_program(const char* program, int& argc, char**& argv,
                const std::function<int(Comm& world)>& body) {
  if (mpi::launched())
    return run_mpi_program(program, argc, argv, [&](mpi::MpiComm& world) { return body(world); });
  SelfComm world;
  return guarded(program, 0, [&] { return body(world); });
}

}  // namespace dp::app
