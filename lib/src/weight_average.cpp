// The moving average of a model's weights: arenas beside the model's, updated by backend ops.
#include "dp/weight_average.hpp"

#include <algorithm>
#include <utility>

#include "dp/error.hpp"

namespace dp {
namespace {

Buffer arena_like(const ParamStore& store, Backend& backend) {
  return Buffer(size_t(store.arena_size()) * sizeof(float), backend.device_memory());
}

}  // namespace

WeightAverage::WeightAverage(Model& model, Backend& backend, float decay, bool warmup)
    : model_(model),
      backend_(backend),
      decay_(decay),
      warmup_(warmup),
      params_(arena_like(model.params(), backend)),
      buffers_(arena_like(model.buffers(), backend)) {
  DP_CHECK(decay >= 0.0f && decay < 1.0f, "WeightAverage: decay ", decay, " not in [0, 1)");
}

void WeightAverage::reset() {
  for (auto [store, arena] :
       {std::pair{&model_.params(), &params_}, std::pair{&model_.buffers(), &buffers_}}) {
    if (store->arena_size() == 0) continue;
    store->download();
    arena->upload(store->host_values(), size_t(store->arena_size()) * sizeof(float));
  }
}

float WeightAverage::decay_at(float decay, bool warmup, int64_t step) {
  DP_CHECK(step >= 1, "WeightAverage: optimiser step ", step, " (1-based)");
  if (!warmup) return decay;
  return std::min(decay, float(double(1 + step) / double(10 + step)));
}

void WeightAverage::update(int64_t step) {
  const float d = decay_at(decay_, warmup_, step);
  backend_.ema_update(model_.params().arena_size(), model_.params().values(), d, params_.f32());
  if (model_.buffers().arena_size() > 0)
    backend_.ema_update(model_.buffers().arena_size(), model_.buffers().values(), d,
                        buffers_.f32());
}

void WeightAverage::swap() {
  backend_.swap(model_.params().arena_size(), model_.params().values(), params_.f32());
  if (model_.buffers().arena_size() > 0)
    backend_.swap(model_.buffers().arena_size(), model_.buffers().values(), buffers_.f32());
}

}  // namespace dp
