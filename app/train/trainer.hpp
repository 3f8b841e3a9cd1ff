// dp::app::Trainer: data-parallel training loop, validation, checkpointing and resume.
#pragma once

#include <memory>
#include <string>

#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/loader.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "train/options.hpp"

namespace dp::app {

// An error that every rank has agreed on (see Trainer::collectively): the rank that saw it
// reports it and every rank exits with `exit_code`, without MPI_Abort.
class AgreedFailure : public Error {
 public:
  AgreedFailure(const std::string& what, int exit_code, bool report)
      : Error(what), exit_code_(exit_code), report_(report) {}
  int exit_code() const { return exit_code_; }
  bool report() const { return report_; }  // false on the ranks that only learnt of it

 private:
  int exit_code_;
  bool report_;
};

struct EpochMetrics {
  double loss = 0;  // mean per pixel, from sums over all ranks
  double iou = 0;   // TP / (TP + FP + FN) over the whole split
  int64_t samples = 0;
};

class Trainer {
 public:
  // Sets up data (creating the synthetic dataset on rank 0 if needed), model, optimiser, and
  // the starting state: a checkpoint (--resume) or fresh weights broadcast from rank 0.
  Trainer(TrainOptions options, Comm& comm, Logger log);
  ~Trainer();

  // Trains the remaining epochs, validating and checkpointing after each. Returns 0.
  int run();

  // Pieces of run(), public for tests.
  EpochMetrics train_epoch(int64_t epoch);
  EpochMetrics validate();
  Model& model() { return *model_; }
  const CheckpointMeta& state() const { return state_; }
  int64_t start_epoch() const { return state_.epoch; }
  const std::string& data_path() const { return data_path_; }

 private:
  void prepare_data();
  void restore_or_init();
  void save_epoch(const EpochMetrics& train, const EpochMetrics& valid, double seconds, float lr);
  // Runs `fn` on rank 0 only; every rank learns whether it succeeded (no rank waits forever).
  template <typename F>
  void on_root(const char* what, F&& fn);
  // Every rank runs `fn`; if any rank fails, every rank throws AgreedFailure, with report() true
  // only on the lowest failing rank.
  template <typename F>
  void collectively(F&& fn);

  TrainOptions opt_;
  Comm& comm_;
  Logger log_;
  std::string data_path_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Sgd> sgd_;
  std::unique_ptr<data::Loader> train_loader_, val_loader_;
  Buffer diff_logits_;
  float pos_weight_ = 1.0f;
  int height_ = 0, width_ = 0;
  CheckpointMeta state_;  // epochs done, steps, best, history
};

}  // namespace dp::app
