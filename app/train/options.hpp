// dptrain's options: the TrainOptions record, its Boost.Program_options parser and validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dp/error.hpp"

namespace dp::app {

// A command-line or configuration mistake: reported as one line, exit code 2, no MPI_Abort
// (every rank sees the same mistake).
class UsageError : public Error {
 public:
  using Error::Error;
};

struct TrainOptions {
  // data
  std::string data;         // dataset v1 file; empty = the synthetic demo dataset
  std::string synth_cache;  // where the synthetic dataset is cached (empty = default path)
  int batch_size = 4;       // per rank
  int prefetch = 2;
  bool augment = true;
  // model
  std::string model = "unet16";
  int width_divisor = 0;  // 0 = default: 8 for the synthetic demo, 1 with --data
  // optimisation
  int epochs = 10;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 1e-4;
  int lr_step = 30;  // epochs between x lr_gamma
  double lr_gamma = 0.1;
  double threshold = 0.5;  // for IoU
  bool use_pos_weight = false;
  uint64_t seed = 42;
  int64_t max_steps = -1;  // stop each epoch after this many steps (tests, smoke runs)
  // execution
  std::string device = "auto";  // auto | cpu | cuda
  // checkpointing and output
  std::string model_dir = "runs/dptrain";
  std::string resume = "auto";  // auto | none | PATH
  bool log_all_ranks = false;
  int log_every = 0;  // steps between progress lines (0 = once per epoch)

  bool synthetic() const { return data.empty(); }
  int effective_width_divisor() const {
    return width_divisor > 0 ? width_divisor : (synthetic() ? 8 : 1);
  }
  // "key = value" lines of every effective option (printed at start, stored in checkpoints).
  std::string describe() const;
};

// Parses argv. Returns nullopt after printing --help. Throws UsageError on any bad value.
std::optional<TrainOptions> parse_train_options(int argc, const char* const* argv, bool print_help);

}  // namespace dp::app
