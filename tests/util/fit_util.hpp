// A model fitting one fixed random batch with SGD: tests that compare backends by training.
#pragma once

#include <cstdint>
#include <vector>

#include "dp/backend.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "tensor_util.hpp"

namespace dp::test {

struct FitResult {
  std::vector<double> losses;  // mean BCE before each step
  std::vector<float> weights;  // the parameter arena after the last step
};

// `steps` SGD steps (PyTorch defaults but lr) of the model `mc` on `be`, initialised with seed 5,
// on one batch of 2 random 32x32 images with random 0/1 targets (the same for every backend).
inline FitResult fit_one_batch(Backend& be, const ModelConfig& mc, int steps, float lr) {
  constexpr int kBatch = 2, kSize = 32;
  const size_t pixels = size_t(kBatch) * kSize * kSize;
  const std::vector<float> input = random_vec(pixels * 3, 8);
  std::vector<float> target = random_vec(pixels, 9);
  for (float& t : target) t = t > 0.5f ? 1.0f : 0.0f;
  auto model = make_model(mc, be);
  model->setup(kBatch, kSize, kSize);
  model->params().initialize(5);
  Sgd sgd(model->params(), be, {});
  std::vector<float> diff(pixels);
  FitResult r;
  for (int step = 0; step < steps; ++step) {
    const float* logits = model->forward(input.data(), kBatch);
    r.losses.push_back(be.bce_with_logits(int64_t(pixels), logits, target.data(), 1.0f,
                                          1.0f / float(pixels), diff.data()) /
                       double(pixels));
    model->backward(diff.data());
    sgd.step(lr);
  }
  r.weights.assign(model->params().values(),
                   model->params().values() + model->params().arena_size());
  return r;
}

}  // namespace dp::test
