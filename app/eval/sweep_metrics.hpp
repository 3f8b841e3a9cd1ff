// Threshold-free metrics of crack benchmarks: ODS and OIS F-measure and average precision over a
// sweep of probability thresholds, with a tolerance in pixels, from counts that sum over ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "eval/confusion.hpp"

namespace dp::app {

struct SweepResult {
  double ods = 0;            // best F over the dataset at one threshold
  double ods_threshold = 0;  // that threshold
  double ois = 0;            // mean over images of each image's best F
  double ap = 0;             // average precision: sum over thresholds of (R_k - R_k+1) P_k
};

// Crack where p = sigmoid(logit) >= t, for t = 0.01, 0.02, ..., 0.99. With tolerance r (pixels),
// a predicted crack pixel is right when a true crack pixel lies within Euclidean distance r, and a
// true crack pixel is found when a predicted one does (relaxed precision and recall; r = 0: the
// pixel itself). An image without true crack pixels has F 1 at a threshold where nothing is
// predicted in it, else 0.
class ThresholdSweep {
 public:
  static constexpr int kThresholds = 99;
  static constexpr int kBins = kThresholds + 1;  // bin b: the thresholds k/100 <= p, k <= b

  explicit ThresholdSweep(int tolerance);

  // One image of height x width: logits and its 0/1 mask (dptrain's validation).
  void add_image(const float* logits, const float* mask, int height, int width);
  // One image of height x width: probabilities and its 0/1 mask (dppredict --dataset).
  void add_probabilities(const float* probability, const uint8_t* mask, int height, int width);

  // The state that sums over ranks: counts (all-reduce as int64) and the OIS sum and images.
  std::vector<int64_t>& counts() { return counts_; }
  std::vector<double>& sums() { return sums_; }

  SweepResult result() const;
  // Precision and recall at threshold k / 100, k = 1..99 (index k - 1).
  void curve(std::vector<double>& precision, std::vector<double>& recall) const;
  // The plain pixel counts (no tolerance) where p >= `threshold`, one of the sweep's k / 100:
  // IoU, Dice, precision and recall at the ODS threshold.
  Confusion confusion_at(double threshold) const;

  static double threshold(int k) { return double(k) / 100.0; }

 private:
  // An image as probability bins and 0/1 truth.
  void add_bins(const std::vector<uint8_t>& bin, const std::vector<uint8_t>& truth, int height,
                int width);
  int tolerance_;
  // [0, kBins): predicted pixels near a true crack pixel, by probability bin; [kBins, 2 kBins):
  // the other predicted pixels; [2 kBins, 3 kBins): true crack pixels by the highest probability
  // within the tolerance; [3 kBins]: true crack pixels; [3 kBins + 1]: images; [3 kBins + 2,
  // 4 kBins + 2): true crack pixels by their own probability bin (no tolerance).
  std::vector<int64_t> counts_;
  std::vector<double> sums_;  // [0]: sum of the images' best F
};

}  // namespace dp::app
