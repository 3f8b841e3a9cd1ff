// An epoch's metrics, and the per-rank sums they come from (reduced over ranks once per epoch).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "train/metrics.hpp"

namespace dp::app {

struct EpochMetrics {
  double loss = 0;                             // mean per pixel, from sums over all ranks
  double iou = 0;                              // TP / (TP + FP + FN) over the whole split
  double dice = 0, precision = 0, recall = 0;  // likewise from the reduced counts
  int64_t samples = 0;
  double allreduce_wait_ms = 0;  // training: per step, rank 0's wait after backward
  // Validation only: ODS, OIS and AP over the threshold sweep (--tolerance); NaN otherwise.
  double ods = std::numeric_limits<double>::quiet_NaN(), ods_threshold = ods, ois = ods, ap = ods;
  MaskScores at_ods;       // Validation only: IoU, Dice, precision, recall at ods_threshold
  double cldice = ods;     // Validation only: centreline Dice of the masks at --threshold
  bool preempted = false;  // training only: stopped mid-epoch by a signal (checkpoint written)
};

// A split's loss and confusion counts on one rank, or over all ranks once reduced.
struct EpochSums {
  double loss = 0, pixels = 0;  // summed per-pixel loss, and the pixels it is over
  Confusion confusion;          // at --threshold
  int64_t samples = 0;

  // One batch of `images` real images of `image_pixels` each: its summed `batch_loss` and its
  // confusion counts (logit > logit_threshold against the masks, counted by `backend`).
  void add_batch(Backend& backend, int images, int64_t image_pixels, const float* logits,
                 const float* masks, float logit_threshold, double batch_loss);
  void allreduce(Comm& comm);  // sums over every rank, in place
  EpochMetrics metrics() const;
  // A mid-epoch checkpoint's epoch_partial: loss, pixels, TP, FP, FN, samples, then `seconds`.
  static constexpr size_t kPartialSize = 7;
  std::vector<double> partial(double seconds) const;
  // The sums of a partial (zero when it is empty); its seconds in `seconds`.
  static EpochSums from_partial(const std::vector<double>& partial, double* seconds);
};

}  // namespace dp::app
