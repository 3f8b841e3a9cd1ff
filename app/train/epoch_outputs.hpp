// Where a finished epoch is reported: the epoch line, metrics.csv, TensorBoard and the HTML report.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "normalization.hpp"
#include "train/epoch_metrics.hpp"
#include "train/options.hpp"

namespace dp::app {

class MetricsCsv;         // train/metrics.hpp
class TensorBoardLog;     // train/tensorboard.hpp
class TrainingReport;     // train/report.hpp
class ValidationSamples;  // train/validation_samples.hpp

// One finished epoch as its outputs show it.
struct EpochRecord {
  int64_t epoch = 0;  // 0-based
  float lr = 0;
  EpochMetrics train, valid;  // valid: NaN when not validated
  bool validated = false;
  double seconds = 0;       // the epoch's training and validation, a resumed part included
  double images_per_s = 0;  // training images per second, over all ranks
};

class EpochOutputs {
 public:
  // On every rank (agreeing on set-up failures); only rank 0 writes files. --report and
  // --tensorboard show the fixed validation samples where the dataset has a validation split;
  // TensorBoard events of steps after `start_step` are dropped (a resumed run writes them again).
  EpochOutputs(const TrainOptions& options, Comm& comm, Logger log, const std::string& data_path,
               const Normalization& normalization, int height, int width, bool has_validation,
               int64_t start_step);
  ~EpochOutputs();

  void start_epoch();
  // After each optimiser step of the run (`run_step`): rank 0's loss over `pixels` in it, the
  // step's `images` over all ranks.
  void step(int64_t run_step, double loss_sum, double pixels, int64_t images, float lr);
  // Before the epoch's checkpoint, with the weights that were validated: TensorBoard's scalars
  // and the samples' predictions (written first, so a resume from the checkpoint never repeats
  // them).
  void before_checkpoint(const EpochRecord& r, int64_t run_step, Model& model);
  // After it, with the same weights: the report, the metrics.csv row and the epoch line. A file
  // that cannot be written is a warning.
  void after_checkpoint(const EpochRecord& r, const CheckpointMeta& state, Model& model);

 private:
  const TrainOptions& opt_;
  Comm& comm_;
  Logger log_;
  std::shared_ptr<const ValidationSamples> samples_;  // rank 0, for --report and --tensorboard
  std::unique_ptr<TrainingReport> report_;            // --report, rank 0 only
  std::unique_ptr<TensorBoardLog> tensorboard_;       // --tensorboard, rank 0 only
  std::unique_ptr<MetricsCsv> metrics_csv_;           // rank 0 only, from the first epoch done
};

}  // namespace dp::app
