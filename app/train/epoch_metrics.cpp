// Epoch sums: their reduction over ranks, their metrics, and their form in mid-epoch checkpoints.
#include "train/epoch_metrics.hpp"

#include <algorithm>

namespace dp::app {

void EpochSums::add_batch(Backend& backend, int images, int64_t image_pixels, const float* logits,
                          const float* masks, float logit_threshold, double batch_loss) {
  const int64_t pixels_in_batch = int64_t(images) * image_pixels;
  loss += batch_loss;
  pixels += double(pixels_in_batch);
  int64_t counts[3] = {confusion.tp, confusion.fp, confusion.fn};
  backend.confusion_counts(pixels_in_batch, logits, masks, logit_threshold, counts);
  confusion = {counts[0], counts[1], counts[2]};
  samples += images;
}

void EpochSums::allreduce(Comm& comm) {
  double sums[2] = {loss, pixels};
  int64_t counts[4] = {confusion.tp, confusion.fp, confusion.fn, samples};
  comm.allreduce_sum(sums, 2);
  comm.allreduce_sum(counts, 4);
  loss = sums[0], pixels = sums[1];
  confusion = {counts[0], counts[1], counts[2]};
  samples = counts[3];
}

EpochMetrics EpochSums::metrics() const {
  EpochMetrics m;
  m.loss = loss / std::max(1.0, pixels);
  m.iou = confusion.iou();
  m.dice = confusion.dice();
  m.precision = confusion.precision();
  m.recall = confusion.recall();
  m.samples = samples;
  return m;
}

std::vector<double> EpochSums::partial(double seconds) const {
  return {loss,
          pixels,
          double(confusion.tp),
          double(confusion.fp),
          double(confusion.fn),
          double(samples),
          seconds};
}

EpochSums EpochSums::from_partial(const std::vector<double>& partial, double* seconds) {
  std::vector<double> p = partial;
  p.resize(kPartialSize, 0.0);
  EpochSums s;
  s.loss = p[0], s.pixels = p[1];
  s.confusion = {int64_t(p[2]), int64_t(p[3]), int64_t(p[4])};
  s.samples = int64_t(p[5]);
  if (seconds != nullptr) *seconds = p[6];
  return s;
}

}  // namespace dp::app
