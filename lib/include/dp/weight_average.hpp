// dp::WeightAverage: an exponential moving average of a model's weights and batch-norm buffers
// (--ema), updated after every optimiser step and swapped into the model for validation.
#pragma once

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/checkpoint.hpp"
#include "dp/model.hpp"

namespace dp {

// avg = decay * avg + (1 - decay) * w after every optimiser step, for every parameter and every
// batch-norm buffer (running mean and variance), as timm's ModelEmaV2. The weights are the same
// on every rank after a step, so every rank updates its own copy without communication. The
// arenas are backend memory of the stores' layouts (one pass each per step).
class WeightAverage {
 public:
  // The model is set up (its arenas exist); the averages start as zeros until reset().
  WeightAverage(Model& model, Backend& backend, float decay);

  float decay() const { return decay_; }
  // The averages become the model's current weights (a fresh run, or a checkpoint without them).
  void reset();
  // After an optimiser step.
  void update();
  // Exchanges the model's weights and buffers with the averages; calling it again undoes it.
  void swap();
  // For checkpoints: where the averages are.
  AveragedWeights arenas() const { return {params_.f32(), buffers_.f32()}; }

 private:
  Model& model_;
  Backend& backend_;
  float decay_;
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
