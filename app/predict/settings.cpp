// dppredict's scale and threshold, chosen from the options and the checkpoint.
#include "predict/settings.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dp/error.hpp"

namespace dp::app {

double recorded_ods_threshold(const CheckpointMeta& meta) {
  const size_t epoch = size_t(std::max<int64_t>(meta.epoch, 0));
  const double t = epoch >= 1 && epoch <= meta.valid_ods_threshold.size()
                       ? meta.valid_ods_threshold[epoch - 1]
                       : std::numeric_limits<double>::quiet_NaN();
  return t > 0 && t < 1 ? t : std::numeric_limits<double>::quiet_NaN();
}

Resampling choose_resampling(const PredictOptions& o, const CheckpointMeta& meta,
                             const data::Dataset* dataset) {
  if (o.scale_y > 0) return {o.scale_y, o.scale_x, "--scale"};
  if (meta.scale_y <= 0 || meta.scale_x <= 0)
    return {1, 1, "--scale auto: the checkpoint records no training scale"};
  if (dataset == nullptr)
    return {meta.scale_y, meta.scale_x,
            "--scale auto: as dpprep resized the training photographs, recorded in the "
            "checkpoint"};
  const data::PixelScale& own = dataset->scale();
  if (!own.known()) return {1, 1, "--scale auto: the dataset records no scale of its own"};
  return {meta.scale_y / own.y, meta.scale_x / own.x,
          "--scale auto: the checkpoint's training scale over the dataset's"};
}

Threshold choose_threshold(const PredictOptions& o, const CheckpointMeta& meta) {
  const double recorded = recorded_ods_threshold(meta);
  switch (o.threshold_rule) {
    case PredictOptions::ThresholdRule::kOds:
      return {recorded, "validation ODS"};
    case PredictOptions::ThresholdRule::kAuto:
      if (std::isnan(recorded))
        return {o.threshold,
                str_cat("--threshold auto: the checkpoint records no validation ODS threshold for "
                        "its epoch ",
                        meta.epoch)};
      return {recorded,
              str_cat("--threshold auto: the validation ODS threshold of epoch ", meta.epoch)};
    case PredictOptions::ThresholdRule::kValue:
      break;
  }
  return {o.threshold,
          std::isnan(recorded)
              ? "--threshold"
              : str_cat("--threshold; the checkpoint's validation had its best F-measure at ",
                        recorded, ", which --threshold auto uses")};
}

}  // namespace dp::app
