// dppredict: crack masks from a trained checkpoint for images of any size, or metrics on a
// dataset split ([mpirun -np N] dppredict -c model_best.h5 -o out images/).
#include "mpi_main.hpp"
#include "predict/options.hpp"
#include "predict/run.hpp"

int main(int argc, char** argv) {
  return dp::app::run_program("dppredict", argc, argv, [&](dp::Comm& world) {
    const auto options = dp::app::parse_predict_options(argc, argv, world.rank() == 0);
    if (!options) return 0;
    return dp::app::run_predict(*options, world, dp::Logger(world.rank()));
  });
}
