// What dppredict settles from its options and the checkpoint before the first image: the scale
// the images are resized by and the mask threshold, each with the reason the start line gives.
#pragma once

#include <string>

#include "dp/checkpoint.hpp"
#include "dp/dataset.hpp"
#include "predict/options.hpp"

namespace dp::app {

// The threshold of the validation's ODS F-measure that dptrain recorded for the checkpoint's last
// epoch (dppredict --threshold ods, dpexport's metadata); NaN if there is none.
double recorded_ods_threshold(const CheckpointMeta& meta);

// --scale: the factor that brings an input to the network's pixel scale (the training set's).
struct Resampling {
  double y = 1, x = 1;
  std::string why;
  bool none() const { return y == 1 && x == 1; }
};
// `dataset` is the --dataset being predicted, or null for image files.
Resampling choose_resampling(const PredictOptions& options, const CheckpointMeta& meta,
                             const data::Dataset* dataset);

// --threshold: the probability above which a pixel is a crack. Weighted crack pixels move the
// best one away from 0.5 (docs/real-data.md, "Thresholds").
struct Threshold {
  double value = 0;
  std::string why;
};
Threshold choose_threshold(const PredictOptions& options, const CheckpointMeta& meta);

}  // namespace dp::app
