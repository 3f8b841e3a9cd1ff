// Confusion counts of predicted against true crack pixels and the scores derived from them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace dp::app {

// Pixel counts at one threshold, summed over images and ranks (never averaged per rank). An
// empty denominator gives 0.
struct Confusion {
  int64_t tp = 0, fp = 0, fn = 0;
  // Adds `pixels` pixels of a predicted and a true mask (non-zero: crack).
  void add(const uint8_t* predicted, const uint8_t* truth, size_t pixels);
  double iou() const;        // TP / (TP + FP + FN)
  double dice() const;       // 2TP / (2TP + FP + FN) = F1
  double precision() const;  // TP / (TP + FP)
  double recall() const;     // TP / (TP + FN)
};

// A mask's IoU, Dice, precision and recall at one threshold; NaN where not measured.
struct MaskScores {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  double iou = kNaN, dice = kNaN, precision = kNaN, recall = kNaN;
  static MaskScores of(const Confusion& c) {
    return {c.iou(), c.dice(), c.precision(), c.recall()};
  }
};

}  // namespace dp::app
