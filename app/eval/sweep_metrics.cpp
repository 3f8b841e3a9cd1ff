// ODS, OIS and AP: per-pixel probability bins, a disk tolerance, suffix sums over thresholds.
#include "eval/sweep_metrics.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "dp/error.hpp"

namespace dp::app {
namespace {

constexpr int kBins = ThresholdSweep::kBins;

// The number of thresholds k / 100 (k = 1..99) that p reaches: exactly the comparisons p >= k/100.
int bin_of(double p) {
  int b = std::clamp(int(std::floor(p * 100.0)), 0, kBins - 1);
  while (b + 1 < kBins && p >= ThresholdSweep::threshold(b + 1)) ++b;
  while (b >= 1 && p < ThresholdSweep::threshold(b)) --b;
  return b;
}

double f_measure(double p, double r) {
  return p + r > 0 ? 2 * p * r / (p + r) : 0.0;
}

// Suffix sums of the bins: the counts at one threshold.
struct Counts {
  int64_t good = 0, bad = 0, hit = 0;
};

}  // namespace

ThresholdSweep::ThresholdSweep(int tolerance)
    : tolerance_(tolerance), counts_(4 * kBins + 2, 0), sums_(1, 0.0) {
  DP_CHECK(tolerance >= 0, "ThresholdSweep: tolerance ", tolerance, " < 0");
}

void ThresholdSweep::add_image(const float* logits, const float* mask, int height, int width) {
  const size_t n = size_t(height) * size_t(width);
  std::vector<uint8_t> bin(n), truth(n);
  for (size_t i = 0; i < n; ++i) {
    bin[i] = uint8_t(bin_of(1.0 / (1.0 + std::exp(-double(logits[i])))));
    truth[i] = mask[i] > 0.5f ? 1 : 0;
  }
  add_bins(bin, truth, height, width);
}

void ThresholdSweep::add_probabilities(const float* probability, const uint8_t* mask, int height,
                                       int width) {
  const size_t n = size_t(height) * size_t(width);
  std::vector<uint8_t> bin(n), truth(n);
  for (size_t i = 0; i < n; ++i) {
    bin[i] = uint8_t(bin_of(double(probability[i])));
    truth[i] = mask[i] != 0 ? 1 : 0;
  }
  add_bins(bin, truth, height, width);
}

void ThresholdSweep::add_bins(const std::vector<uint8_t>& bin, const std::vector<uint8_t>& truth,
                              int height, int width) {
  const size_t n = size_t(height) * size_t(width);
  std::vector<uint8_t> near_truth(n, 0);
  std::vector<std::pair<int, int>> disk;  // offsets within the tolerance
  const int r = tolerance_;
  for (int dy = -r; dy <= r; ++dy)
    for (int dx = -r; dx <= r; ++dx)
      if (dy * dy + dx * dx <= r * r) disk.emplace_back(dy, dx);
  std::array<int64_t, kBins> good{}, bad{}, hit{};
  int64_t truths = 0;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const size_t i = size_t(y) * size_t(width) + size_t(x);
      if (!truth[i]) continue;
      ++truths;
      int best = 0;  // the highest bin within the tolerance
      for (const auto& [dy, dx] : disk) {
        const int yy = y + dy, xx = x + dx;
        if (yy < 0 || yy >= height || xx < 0 || xx >= width) continue;
        const size_t j = size_t(yy) * size_t(width) + size_t(xx);
        best = std::max(best, int(bin[j]));
        near_truth[j] = 1;
      }
      ++hit[size_t(best)];
    }
  for (size_t i = 0; i < n; ++i) {
    ++(near_truth[i] ? good : bad)[bin[i]];
    if (truth[i]) ++counts_[size_t(3 * kBins + 2 + bin[i])];
  }
  // This image's best F over the thresholds (suffix sums from the highest threshold down).
  double best_f = 0;
  Counts c;
  for (int k = kBins - 1; k >= 1; --k) {
    c.good += good[size_t(k)], c.bad += bad[size_t(k)], c.hit += hit[size_t(k)];
    double f;
    if (truths == 0)
      f = c.good + c.bad == 0 ? 1.0 : 0.0;
    else
      f = f_measure(c.good + c.bad > 0 ? double(c.good) / double(c.good + c.bad) : 0.0,
                    double(c.hit) / double(truths));
    best_f = std::max(best_f, f);
  }
  for (int b = 0; b < kBins; ++b) {
    counts_[size_t(b)] += good[size_t(b)];
    counts_[size_t(kBins + b)] += bad[size_t(b)];
    counts_[size_t(2 * kBins + b)] += hit[size_t(b)];
  }
  counts_[3 * kBins] += truths;
  counts_[3 * kBins + 1] += 1;
  sums_[0] += best_f;
}

void ThresholdSweep::curve(std::vector<double>& precision, std::vector<double>& recall) const {
  precision.assign(kThresholds, 0.0);
  recall.assign(kThresholds, 0.0);
  const int64_t truths = counts_[3 * kBins];
  Counts c;
  for (int k = kBins - 1; k >= 1; --k) {
    c.good += counts_[size_t(k)];
    c.bad += counts_[size_t(kBins + k)];
    c.hit += counts_[size_t(2 * kBins + k)];
    // No prediction at this threshold: precision 1 (the curve's start), recall 0.
    precision[size_t(k - 1)] = c.good + c.bad > 0 ? double(c.good) / double(c.good + c.bad) : 1.0;
    recall[size_t(k - 1)] = truths > 0 ? double(c.hit) / double(truths) : 0.0;
  }
}

Confusion ThresholdSweep::confusion_at(double threshold) const {
  const int k = std::clamp(int(std::lround(threshold * 100.0)), 0, kBins - 1);
  Confusion c;
  int64_t predicted = 0;
  for (int b = k; b < kBins; ++b) {
    c.tp += counts_[size_t(3 * kBins + 2 + b)];
    predicted += counts_[size_t(b)] + counts_[size_t(kBins + b)];
  }
  c.fp = predicted - c.tp;
  c.fn = counts_[3 * kBins] - c.tp;
  return c;
}

SweepResult ThresholdSweep::result() const {
  std::vector<double> precision, recall;
  curve(precision, recall);
  SweepResult r;
  double previous_recall = 0;
  for (int k = kThresholds; k >= 1; --k) {
    const double p = precision[size_t(k - 1)], rc = recall[size_t(k - 1)];
    const double f = rc > 0 ? f_measure(p, rc) : 0.0;
    if (f > r.ods) r.ods = f, r.ods_threshold = threshold(k);
    r.ap += (rc - previous_recall) * p;
    previous_recall = rc;
  }
  const int64_t images = counts_[3 * kBins + 1];
  r.ois = images > 0 ? sums_[0] / double(images) : 0.0;
  return r;
}

}  // namespace dp::app
