// clDice (centreline Dice, Shit et al., CVPR 2021) of a split, from counts that sum over ranks.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace dp::app {

// P: the predicted mask, L: the true mask, S(): their skeletons (dp::data::skeletonize, as
// scikit-image's). Over a split, with every count summed over its images:
//   Tprec = |S(P) & L| / |S(P)|  (1 when S(P) is empty: no predicted centreline to be wrong)
//   Tsens = |S(L) & P| / |S(L)|  (1 when S(L) is empty: no true centreline to miss)
//   clDice = 2 Tprec Tsens / (Tprec + Tsens)  (0 when Tprec + Tsens = 0)
// So a split without true or predicted crack has clDice 1, one with true crack and none
// predicted (or the reverse) 0. The ratios are of the split's sums, not a mean of images' scores.
class CenterlineDice {
 public:
  // The indices of counts().
  enum Count : int {
    kPredictedSkeleton = 0,     // |S(P)|
    kPredictedSkeletonInTruth,  // |S(P) & L|
    kTrueSkeleton,              // |S(L)|
    kTrueSkeletonPredicted,     // |S(L) & P|
    kCounts
  };

  // One image of height x width (dptrain's validation): crack where logit >= logit_threshold;
  // the mask is 0/1 (crack where > 0.5).
  void add_image(const float* logits, const float* mask, int height, int width,
                 float logit_threshold);
  // One image (dppredict): crack where probability >= threshold; the mask is 0/nonzero.
  void add_probabilities(const float* probability, const uint8_t* mask, int height, int width,
                         double threshold);
  // One image as two masks (0/nonzero), prediction and truth.
  void add_masks(const uint8_t* prediction, const uint8_t* truth, int height, int width);

  // The state that sums over ranks (all-reduce as int64), indexed by Count.
  std::array<int64_t, kCounts>& counts() { return counts_; }
  const std::array<int64_t, kCounts>& counts() const { return counts_; }

  double precision() const;    // Tprec
  double sensitivity() const;  // Tsens
  double value() const;        // clDice

 private:
  // Both masks are in prediction_ and truth_ (0/1): skeletons and counts.
  void count(int height, int width);
  std::array<int64_t, kCounts> counts_{};
  // Scratch, resized per image (grown, never shrunk): the masks, a skeleton, thinning's buffer.
  std::vector<uint8_t> prediction_, truth_, skeleton_, thinning_;
};

}  // namespace dp::app
