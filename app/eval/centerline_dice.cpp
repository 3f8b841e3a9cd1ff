// clDice counts: thresholded masks, their skeletons, skeleton pixels inside the other mask.
#include "eval/centerline_dice.hpp"

#include <cstddef>

#include "dp/error.hpp"
#include "dp/skeleton.hpp"

namespace dp::app {
namespace {

size_t pixels(int height, int width) {
  DP_CHECK(height >= 0 && width >= 0, "CenterlineDice: image size ", height, " x ", width);
  return size_t(height) * size_t(width);
}

}  // namespace

void CenterlineDice::add_image(const float* logits, const float* mask, int height, int width,
                               float logit_threshold) {
  const size_t n = pixels(height, width);
  prediction_.resize(n);
  truth_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    prediction_[i] = logits[i] >= logit_threshold ? 1 : 0;
    truth_[i] = mask[i] > 0.5f ? 1 : 0;
  }
  count(height, width);
}

void CenterlineDice::add_probabilities(const float* probability, const uint8_t* mask, int height,
                                       int width, double threshold) {
  const size_t n = pixels(height, width);
  prediction_.resize(n);
  truth_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    prediction_[i] = double(probability[i]) >= threshold ? 1 : 0;
    truth_[i] = mask[i] != 0 ? 1 : 0;
  }
  count(height, width);
}

void CenterlineDice::add_masks(const uint8_t* prediction, const uint8_t* truth, int height,
                               int width) {
  const size_t n = pixels(height, width);
  prediction_.resize(n);
  truth_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    prediction_[i] = prediction[i] != 0 ? 1 : 0;
    truth_[i] = truth[i] != 0 ? 1 : 0;
  }
  count(height, width);
}

void CenterlineDice::count(int height, int width) {
  const size_t n = size_t(height) * size_t(width);
  skeleton_.resize(n);
  int64_t on = 0, inside = 0;
  data::skeletonize(prediction_.data(), height, width, skeleton_.data(), thinning_);
  for (size_t i = 0; i < n; ++i) on += skeleton_[i], inside += skeleton_[i] & truth_[i];
  counts_[kPredictedSkeleton] += on;
  counts_[kPredictedSkeletonInTruth] += inside;
  on = 0, inside = 0;
  data::skeletonize(truth_.data(), height, width, skeleton_.data(), thinning_);
  for (size_t i = 0; i < n; ++i) on += skeleton_[i], inside += skeleton_[i] & prediction_[i];
  counts_[kTrueSkeleton] += on;
  counts_[kTrueSkeletonPredicted] += inside;
}

double CenterlineDice::precision() const {
  const int64_t on = counts_[kPredictedSkeleton];
  return on > 0 ? double(counts_[kPredictedSkeletonInTruth]) / double(on) : 1.0;
}

double CenterlineDice::sensitivity() const {
  const int64_t on = counts_[kTrueSkeleton];
  return on > 0 ? double(counts_[kTrueSkeletonPredicted]) / double(on) : 1.0;
}

double CenterlineDice::value() const {
  const double p = precision(), s = sensitivity();
  return p + s > 0 ? 2 * p * s / (p + s) : 0.0;
}

}  // namespace dp::app
