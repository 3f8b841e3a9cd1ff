// Scores of predicted crack maps against true masks, image by image, summed over ranks: the
// confusion counts of the masks, ODS/OIS/AP over thresholds and clDice (dppredict's scores, and
// the same formulas as dptrain's validation).
#pragma once

#include <cstdint>

#include "dp/comm.hpp"
#include "eval/centerline_dice.hpp"
#include "eval/confusion.hpp"
#include "eval/sweep_metrics.hpp"

namespace dp::app {

// The scores of a set of images.
struct SegmentationMetrics : Confusion {
  int64_t pixels = 0, images = 0;
  SweepResult sweep;  // ODS, OIS, AP over the thresholds (eval/sweep_metrics.hpp)
  double cldice = 0;  // centreline Dice of the masks (eval/centerline_dice.hpp)
};

class MaskEvaluation {
 public:
  explicit MaskEvaluation(int tolerance) : sweep_(tolerance) {}
  // One image of height x width: its probabilities, the mask made of them (non-zero: crack) and
  // the true mask (0/1).
  void add(const float* probability, const uint8_t* mask, const uint8_t* truth, int height,
           int width);
  // Sums the counts over the ranks (collective; once, after every rank's last add).
  void reduce(Comm& comm);
  SegmentationMetrics result() const;

 private:
  Confusion confusion_;
  int64_t pixels_ = 0, images_ = 0;
  ThresholdSweep sweep_;
  CenterlineDice centerline_;
};

}  // namespace dp::app
