// Scores of predicted crack maps against true masks.
#include "eval/evaluation.hpp"

namespace dp::app {

void MaskEvaluation::add(const float* probability, const uint8_t* mask, const uint8_t* truth,
                         int height, int width) {
  const size_t pixels = size_t(height) * size_t(width);
  confusion_.add(mask, truth, pixels);
  sweep_.add_probabilities(probability, truth, height, width);
  centerline_.add_masks(mask, truth, height, width);
  pixels_ += int64_t(pixels);
  ++images_;
}

void MaskEvaluation::reduce(Comm& comm) {
  int64_t sums[5] = {confusion_.tp, confusion_.fp, confusion_.fn, pixels_, images_};
  comm.allreduce_sum(sums, 5);
  confusion_ = {sums[0], sums[1], sums[2]};
  pixels_ = sums[3];
  images_ = sums[4];
  comm.allreduce_sum(sweep_.counts().data(), sweep_.counts().size());
  comm.allreduce_sum(sweep_.sums().data(), sweep_.sums().size());
  comm.allreduce_sum(centerline_.counts().data(), centerline_.counts().size());
}

SegmentationMetrics MaskEvaluation::result() const {
  SegmentationMetrics m;
  static_cast<Confusion&>(m) = confusion_;
  m.pixels = pixels_;
  m.images = images_;
  m.sweep = sweep_.result();
  m.cldice = centerline_.value();
  return m;
}

}  // namespace dp::app
