// Where a finished epoch is reported: the epoch line, metrics.csv, TensorBoard and the HTML report.
#include "train/epoch_outputs.hpp"

#include "agreement.hpp"
#include "train/metrics.hpp"
#include "train/report.hpp"
#include "train/tensorboard.hpp"
#include "train/validation_samples.hpp"

namespace dp::app {

EpochOutputs::EpochOutputs(const TrainOptions& options, Comm& comm, Logger log,
                           const std::string& data_path, const Normalization& normalization,
                           int height, int width, bool has_validation, int64_t start_step)
    : opt_(options), comm_(comm), log_(log) {
  if ((opt_.report || opt_.tensorboard) && has_validation)
    on_root(comm_, "validation samples", [&] {
      samples_ = std::make_shared<ValidationSamples>(data_path, normalization, opt_.threshold,
                                                     height, width);
    });
  if (opt_.report)
    on_root(comm_, "--report",
            [&] { report_ = std::make_unique<TrainingReport>(opt_, data_path, samples_); });
  if (opt_.tensorboard)
    on_root(comm_, "--tensorboard", [&] {
      tensorboard_ =
          std::make_unique<TensorBoardLog>(opt_.model_dir, start_step, opt_.log_every, log_);
      tensorboard_->config(start_step,
                           str_cat("dptrain on ", comm_.size(), " rank(s)\n", opt_.describe()));
      log_.info("tensorboard: events in ", tensorboard_->path(),
                " (watch with: tensorboard "
                "--logdir ",
                opt_.model_dir, ")");
    });
}

EpochOutputs::~EpochOutputs() = default;

void EpochOutputs::start_epoch() {
  if (tensorboard_) tensorboard_->start_window();
}

void EpochOutputs::step(int64_t run_step, double loss_sum, double pixels, int64_t images,
                        float lr) {
  if (tensorboard_) tensorboard_->step(run_step, loss_sum, pixels, images, lr);
}

void EpochOutputs::before_checkpoint(const EpochRecord& r, int64_t run_step, Model& model) {
  if (!tensorboard_) return;
  const EpochMetrics& train = r.train;
  const EpochMetrics& valid = r.valid;
  tensorboard_->scalars(run_step, {{"epoch/train_loss", train.loss},
                                   {"epoch/lr", r.lr},
                                   {"epoch/seconds", r.seconds},
                                   {"epoch/images_per_s", r.images_per_s},
                                   {"epoch/allreduce_wait_ms", train.allreduce_wait_ms}});
  if (!r.validated) return;
  tensorboard_->scalars(run_step, {{"valid/loss", valid.loss},
                                   {"valid/iou", valid.iou},
                                   {"valid/dice", valid.dice},
                                   {"valid/precision", valid.precision},
                                   {"valid/recall", valid.recall},
                                   {"valid/cldice", valid.cldice},
                                   {"valid/ods", valid.ods},
                                   {"valid/ods_threshold", valid.ods_threshold},
                                   {"valid/ois", valid.ois},
                                   {"valid/ap", valid.ap},
                                   {"valid_at_ods/iou", valid.at_ods.iou},
                                   {"valid_at_ods/dice", valid.at_ods.dice},
                                   {"valid_at_ods/precision", valid.at_ods.precision},
                                   {"valid_at_ods/recall", valid.at_ods.recall}});
  if (!samples_) return;
  const std::vector<ValidationSamples::Prediction> predictions = samples_->predict(model);
  for (size_t k = 0; k < predictions.size(); ++k) {
    const data::Image strip = sample_strip(samples_->samples()[k], predictions[k]);
    tensorboard_->image(run_step, str_cat("samples/", samples_->samples()[k].index),
                        strip.pixels.data(), strip.width, strip.height, strip.channels);
  }
}

void EpochOutputs::after_checkpoint(const EpochRecord& r, const CheckpointMeta& state,
                                    Model& model) {
  if (report_) report_->update(model, state, r.lr, r.images_per_s, log_);  // warns on failure
  const EpochMetrics& train = r.train;
  const EpochMetrics& valid = r.valid;
  if (comm_.rank() == 0) {  // a row that cannot be written is a warning
    try {
      // Opened at the first finished epoch (a failed start leaves no file); it keeps the rows
      // of the epochs done before this one, so a resumed run continues it.
      if (!metrics_csv_) metrics_csv_ = std::make_unique<MetricsCsv>(opt_.model_dir, r.epoch);
      metrics_csv_->append({r.epoch + 1, r.lr, train.loss, valid.loss, valid.iou, valid.dice,
                            valid.precision, valid.recall, r.images_per_s, r.seconds, valid.ods,
                            valid.ods_threshold, valid.ois, valid.ap, valid.at_ods, valid.cldice});
    } catch (const std::exception& e) {
      log_.warn(e.what());
    }
  }
  log_.info(
      "epoch ", r.epoch + 1, "/", opt_.epochs, "  lr ", r.lr, "  train_loss ", fixed(train.loss, 4),
      r.validated
          ? str_cat("  valid_loss ", fixed(valid.loss, 4), "  valid_iou ", fixed(valid.iou, 4),
                    "  dice ", fixed(valid.dice, 4), "  precision ", fixed(valid.precision, 4),
                    "  recall ", fixed(valid.recall, 4), "  cldice ", fixed(valid.cldice, 4),
                    "  ods ", fixed(valid.ods, 4), " (t ", fixed(valid.ods_threshold, 2), ")  ois ",
                    fixed(valid.ois, 4), "  ap ", fixed(valid.ap, 4), "  at t ",
                    fixed(valid.ods_threshold, 2), ": iou ", fixed(valid.at_ods.iou, 4), "  dice ",
                    fixed(valid.at_ods.dice, 4), "  precision ", fixed(valid.at_ods.precision, 4),
                    "  recall ", fixed(valid.at_ods.recall, 4))
          : std::string("  (not validated)"),
      "  ", fixed(r.seconds, 1), " s  ", fixed(r.images_per_s, 1), " img/s",
      state.best_epoch == state.epoch ? "  *best" : "");
}

}  // namespace dp::app
