// dp::WeightAverage: an exponential moving average of a model's weights and batch-norm buffers
// (--ema), updated after every optimiser step and swapped into the model for validation.
#pragma once

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/checkpoint.hpp"
#include "dp/model.hpp"

namespace dp {

// avg = d * avg + (1 - d) * w after every optimiser step, for every parameter and every
// batch-norm buffer (running mean and variance), as timm's ModelEmaV2 (d = decay). With warm-up,
// d = min(decay, (1 + s) / (10 + s)) at optimiser step s (TensorFlow's ExponentialMovingAverage
// with num_updates): early steps are averaged over a window of about s / 9 steps, so the average
// follows a short run instead of holding its first weights. The weights are the same on every
// rank after a step, so every rank updates its own copy without communication. The arenas are
// backend memory of the stores' layouts (one pass each per step).
class WeightAverage {
 public:
  // The model is set up (its arenas exist); the averages start as zeros until reset().
  WeightAverage(Model& model, Backend& backend, float decay, bool warmup = false);

  float decay() const { return decay_; }
  // The decay applied after optimiser step `step` (1-based over the run).
  static float decay_at(float decay, bool warmup, int64_t step);
  // The averages become the model's current weights (a fresh run, or a checkpoint without them).
  void reset();
  // After optimiser step `step` (1-based over the run).
  void update(int64_t step);
  // Exchanges the model's weights and buffers with the averages; calling it again undoes it.
  void swap();
  // For checkpoints: where the averages are.
  AveragedWeights arenas() const { return {params_.f32(), buffers_.f32()}; }

 private:
  Model& model_;
  Backend& backend_;
  float decay_;
  bool warmup_;
  Buffer params_, buffers_;
};

// The model holds the averaged weights while it lives (validation, sample predictions); the raw
// ones return at the end of the scope. No-op for a null average.
class AveragedWeightsScope {
 public:
  explicit AveragedWeightsScope(WeightAverage* average) : average_(average) {
    if (average_ != nullptr) average_->swap();
  }
  ~AveragedWeightsScope() {
    if (average_ != nullptr) average_->swap();
  }
  AveragedWeightsScope(const AveragedWeightsScope&) = delete;
  AveragedWeightsScope& operator=(const AveragedWeightsScope&) = delete;

 private:
  WeightAverage* average_;
};

}  // namespace dp
