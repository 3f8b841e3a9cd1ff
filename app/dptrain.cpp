// dptrain: data-parallel training of crack-segmentation UNets (mpirun -np N dptrain [options]).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "mpi_main.hpp"
#include "train/options.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  // From the first instruction: a preemption signal (--preempt-signal, default SIGTERM/SIGUSR1)
  // during start-up is acted on at the first step boundary (checkpoint, exit 75) instead of
  // killing the rank.
  std::unique_ptr<dp::app::PreemptionHandlers> preemption;
  try {
    preemption =
        std::make_unique<dp::app::PreemptionHandlers>(dp::app::preempt_signals_in_argv(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dptrain: error: %s\n", e.what());
    return 1;
  }
  if (dp::app::preempt_at_start_in_argv(argc, argv))  // --test-fault preempt-at-start
    std::raise(dp::app::preemption_signals().front());
  return dp::app::run_mpi_program("dptrain", argc, argv, [&](dp::mpi::MpiComm& world) {
    const auto options = dp::app::parse_train_options(argc, argv, world.rank() == 0);
    if (!options) return 0;
    dp::app::Trainer trainer(*options, world, dp::Logger(world.rank(), options->log_all_ranks));
    return trainer.run();
  });
}
