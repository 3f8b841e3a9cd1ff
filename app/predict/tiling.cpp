// Tiled inference: overlapping tiles, reflect padding and window-weighted blending of
// probabilities.
#include "predict/tiling.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "dp/error.hpp"
#include "exit_codes.hpp"

namespace dp::app {
namespace {

constexpr int kChannels = 3;

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

}  // namespace

std::vector<int> tile_starts(int length, int tile, int overlap, int margin) {
  DP_CHECK(length > 0 && tile > 0 && overlap >= 0 && overlap < tile && margin >= 0,
           "tile_starts: length ", length, ", tile ", tile, ", overlap ", overlap, ", margin ",
           margin, " (need overlap in [0, tile), margin >= 0)");
  const int64_t extended = int64_t{length} + 2 * int64_t{margin};
  if (extended <= tile) return {static_cast<int>(-((tile - extended) / 2) - margin)};
  const int64_t span = extended - tile;  // where the last tile starts, from -margin
  const int64_t stride = tile - overlap;
  const int64_t n = (span + stride - 1) / stride + 1;
  std::vector<int> starts(static_cast<size_t>(n));
  // Rounded even spacing: consecutive starts differ by at most ceil(span / (n - 1)) <= stride.
  for (int64_t i = 0; i < n; ++i)
    starts[static_cast<size_t>(i)] =
        static_cast<int>((2 * i * span + (n - 1)) / (2 * (n - 1)) - margin);
  return starts;
}

int reflect_index(int64_t i, int length) {
  if (length == 1) return 0;
  const int64_t period = 2 * (int64_t{length} - 1);
  int64_t m = i % period;
  if (m < 0) m += period;
  return static_cast<int>(m < length ? m : period - m);
}

std::vector<float> window_weights(int tile) {
  std::vector<float> w(static_cast<size_t>(tile));
  for (int i = 0; i < tile; ++i) {
    const double s = std::sin(std::numbers::pi * (i + 0.5) / tile);
    w[static_cast<size_t>(i)] = static_cast<float>(s * s);
  }
  return w;
}

// One image in flight: its weighted sums, and how many of its tiles are still to come.
struct TiledRunner::Job {
  size_t id = 0;
  data::Image image;
  Done done;
  std::vector<float> acc, weight;  // sum(w * p), sum(w) per pixel
  std::vector<float> uncertainty;  // sum(w * standard deviation) per pixel (augmented runs)
  int64_t remaining = 0;
};

const Words<Tta>& tta_words() {
  static const Words<Tta> words = {
      {"none", Tta::kNone}, {"flips", Tta::kFlips}, {"dihedral", Tta::kDihedral}};
  return words;
}

int tta_variants(Tta tta) {
  constexpr int kFlipVariants = 4, kDihedralVariants = 8;
  return tta == Tta::kNone ? 1 : tta == Tta::kFlips ? kFlipVariants : kDihedralVariants;
}

TiledRunner::TiledRunner(Forward forward, const Normalization& normalization, int tile_height,
                         int tile_width, int overlap, int batch, int margin, Tta tta)
    : forward_(std::move(forward)),
      lut_(normalization_lut(normalization)),
      tile_height_(tile_height),
      tile_width_(tile_width),
      overlap_(overlap),
      batch_(batch),
      margin_(margin),
      tta_(tta) {
  DP_CHECK(tile_height > 0 && tile_width > 0 && batch > 0, "TiledRunner: tile ", tile_height, "x",
           tile_width, ", batch ", batch);
  DP_CHECK(overlap >= 0 && overlap < std::min(tile_height, tile_width), "overlap ", overlap,
           " must be in [0, ", std::min(tile_height, tile_width), ") for tiles of ", tile_height,
           "x", tile_width);
  DP_CHECK(margin >= 0, "TiledRunner: margin ", margin, " must be >= 0");
  window_y_ = window_weights(tile_height);
  window_x_ = window_weights(tile_width);
  input_ =
      Buffer(size_t(batch) * size_t(tile_height) * size_t(tile_width) * kChannels * sizeof(float));
  slots_.reserve(size_t(batch));
  if (tta == Tta::kDihedral && tile_height != tile_width)
    throw UsageError(str_cat("--tta dihedral needs square tiles, got ", tile_height, "x",
                             tile_width, " (give --tile N, or --tta flips)"));
  if (tta != Tta::kNone) {
    variant_input_ = Buffer(input_.bytes());
    mean_.resize(size_t(batch) * size_t(tile_height) * size_t(tile_width));
    deviation_.resize(mean_.size());
  }
}

void TiledRunner::run_variants(int n) {
  const int th = tile_height_, tw = tile_width_;
  const size_t plane = size_t(th) * size_t(tw), count = size_t(n) * plane;
  std::fill(mean_.begin(), mean_.begin() + std::ptrdiff_t(count), 0.0f);
  std::fill(deviation_.begin(), deviation_.begin() + std::ptrdiff_t(count), 0.0f);
  const int variants = tta_variants(tta_);
  std::vector<size_t> where(plane);  // variant tile position of tile pixel (y, x)
  for (int v = 0; v < variants; ++v) {
    // Variant v: flip up-down (bit 1), left-right (bit 0), then transpose (bit 2).
    const bool flip_x = (v & 1) != 0, flip_y = (v & 2) != 0, transpose = (v & 4) != 0;
    for (int y = 0; y < th; ++y) {
      for (int x = 0; x < tw; ++x) {
        const size_t yy = size_t(flip_y ? th - 1 - y : y), xx = size_t(flip_x ? tw - 1 - x : x);
        where[size_t(y) * size_t(tw) + size_t(x)] =
            transpose ? xx * size_t(tw) + yy : yy * size_t(tw) + xx;
      }
    }
    const float* input = input_.f32();
    if (v > 0) {
      float* dst = variant_input_.f32();
      for (size_t k = 0; k < size_t(n); ++k)
        for (size_t i = 0; i < plane; ++i)
          for (size_t c = 0; c < kChannels; ++c)
            dst[(k * plane + where[i]) * kChannels + c] = input[(k * plane + i) * kChannels + c];
      input = dst;
    }
    const float* logits = forward_(input, n);
    for (size_t k = 0; k < size_t(n); ++k) {
      for (size_t i = 0; i < plane; ++i) {
        const float p = sigmoid(logits[k * plane + where[i]]);
        mean_[k * plane + i] += p;
        deviation_[k * plane + i] += p * p;  // the second moment until the end
      }
    }
  }
  const float inv = 1.0f / float(variants);
  for (size_t i = 0; i < count; ++i) {
    const float m = mean_[i] * inv;
    mean_[i] = m;
    deviation_[i] = std::sqrt(std::max(0.0f, deviation_[i] * inv - m * m));
  }
}

TiledRunner::~TiledRunner() = default;

int64_t TiledRunner::tiles_for(int height, int width) const {
  return int64_t(tile_starts(height, tile_height_, overlap_, margin_).size()) *
         int64_t(tile_starts(width, tile_width_, overlap_, margin_).size());
}

void TiledRunner::submit(size_t id, data::Image image, Done done) {
  DP_CHECK(image.channels == kChannels && image.width > 0 && image.height > 0 &&
               image.pixels.size() == size_t(image.width) * size_t(image.height) * kChannels,
           "TiledRunner: expected an RGB image, got ", image.width, "x", image.height, "x",
           image.channels);
  const int h = image.height, w = image.width;
  const std::vector<int> ys = tile_starts(h, tile_height_, overlap_, margin_);
  const std::vector<int> xs = tile_starts(w, tile_width_, overlap_, margin_);
  auto job = std::make_shared<Job>();
  job->id = id;
  job->done = std::move(done);
  job->acc.assign(size_t(h) * size_t(w), 0.0f);
  job->weight.assign(size_t(h) * size_t(w), 0.0f);
  job->remaining = int64_t(ys.size()) * int64_t(xs.size());
  job->image = std::move(image);
  const uint8_t* src = job->image.pixels.data();
  const size_t tile_floats = size_t(tile_height_) * size_t(tile_width_) * kChannels;
  std::vector<int> columns(static_cast<size_t>(tile_width_));
  for (const int y0 : ys) {
    for (const int x0 : xs) {
      for (int tx = 0; tx < tile_width_; ++tx) columns[size_t(tx)] = reflect_index(x0 + tx, w);
      float* const tile = input_.f32() + slots_.size() * tile_floats;
#pragma omp parallel for schedule(static)
      for (int ty = 0; ty < tile_height_; ++ty) {
        const uint8_t* row = src + size_t(reflect_index(y0 + ty, h)) * size_t(w) * kChannels;
        float* dst = tile + size_t(ty) * size_t(tile_width_) * kChannels;
        for (int tx = 0; tx < tile_width_; ++tx, dst += kChannels) {
          const uint8_t* px = row + size_t(columns[size_t(tx)]) * kChannels;
          for (int c = 0; c < kChannels; ++c) dst[c] = lut_[size_t(c)][px[c]];
        }
      }
      slots_.push_back({job, y0, x0});
      if (int(slots_.size()) == batch_) run_batch();
    }
  }
}

void TiledRunner::flush() {
  run_batch();
}

void TiledRunner::run_batch() {
  if (slots_.empty()) return;
  std::vector<Slot> batch;
  batch.swap(slots_);  // the runner is empty again whatever `done` does
  slots_.reserve(size_t(batch_));
  const bool augmented = tta_ != Tta::kNone;
  const float* logits = nullptr;
  if (augmented)
    run_variants(int(batch.size()));
  else
    logits = forward_(input_.f32(), int(batch.size()));
  const size_t plane = size_t(tile_height_) * size_t(tile_width_);
  for (size_t k = 0; k < batch.size(); ++k) {
    Job& job = *batch[k].job;
    const int h = job.image.height, w = job.image.width;
    // The tile's rows go to the threads: they are distinct image rows, and tiles are added in
    // order, so every pixel's sum is the same, in the same order, on any number of threads.
    if (augmented && job.uncertainty.empty()) job.uncertainty.assign(job.acc.size(), 0.0f);
#pragma omp parallel for schedule(static)
    for (int ty = 0; ty < tile_height_; ++ty) {
      const int y = batch[k].y0 + ty;
      if (y < 0 || y >= h) continue;  // reflect padding: computed, not kept
      const float wy = window_y_[size_t(ty)];
      float* acc = job.acc.data() + size_t(y) * size_t(w);
      float* weight = job.weight.data() + size_t(y) * size_t(w);
      const size_t row = k * plane + size_t(ty) * size_t(tile_width_);
      for (int tx = 0; tx < tile_width_; ++tx) {
        const int x = batch[k].x0 + tx;
        if (x < 0 || x >= w) continue;
        const float wt = wy * window_x_[size_t(tx)];
        const size_t i = row + size_t(tx);
        if (augmented) {
          acc[x] += wt * mean_[i];
          job.uncertainty[size_t(y) * size_t(w) + size_t(x)] += wt * deviation_[i];
        } else {
          acc[x] += wt * sigmoid(logits[i]);
        }
        weight[x] += wt;
      }
    }
    if (--job.remaining > 0) continue;
    // Normalised by the summed weight (every pixel has weight > 0), not by the maximum.
    const auto pixels = int64_t(job.acc.size());
    const bool deviation = !job.uncertainty.empty();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < pixels; ++i) {
      job.acc[size_t(i)] /= job.weight[size_t(i)];
      if (deviation) job.uncertainty[size_t(i)] /= job.weight[size_t(i)];
    }
    job.weight = {};
    job.done(job.id, job.image, job.acc, job.uncertainty);
  }
}

}  // namespace dp::app
