// The choice of the best epoch and metrics.csv (one row per epoch).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "eval/confusion.hpp"
#include "words.hpp"

namespace dp::app {

// --best-metric: valid_loss (lower is better), iou, dice or ods (higher is better); its word is
// what logs and checkpoints write.
enum class BestMetric { kValidLoss, kIou, kDice, kOds };
const Words<BestMetric>& best_metric_words();
const std::string& best_metric_name(BestMetric metric);
bool higher_is_better(BestMetric metric);

struct MetricsRow {
  int64_t epoch = 0;  // 1-based
  double lr = 0, train_loss = 0, valid_loss = 0, iou = 0, dice = 0, precision = 0, recall = 0;
  double images_per_s = 0, seconds = 0;
  double ods = 0, ods_threshold = 0, ois = 0, ap = 0;  // eval/sweep_metrics.hpp
  MaskScores at_ods{};                                 // the mask at the epoch's ODS threshold
  double cldice = MaskScores::kNaN;                    // centreline Dice at the threshold
};

// <model_dir>/metrics.csv, appended by rank 0 after every epoch (header written once). On start
// the file keeps only the rows of epochs the resumed checkpoint has done (none when fresh), so a
// resumed or restarted run never repeats an epoch's row; rows of an older dptrain with fewer
// columns get empty fields for the new ones. Throws dp::Error on I/O errors.
class MetricsCsv {
 public:
  static constexpr const char* kFileName = "metrics.csv";
  static constexpr const char* kHeader =
      "epoch,lr,train_loss,valid_loss,iou,dice,precision,recall,img_per_s,seconds,ods,"
      "ods_threshold,ois,ap,iou_at_ods,dice_at_ods,precision_at_ods,recall_at_ods,cldice";
  MetricsCsv(const std::string& model_dir, int64_t epochs_done);
  void append(const MetricsRow& row) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dp::app
