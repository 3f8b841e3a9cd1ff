// SGD step over the arena and the step learning-rate schedule.
#include "dp/optim.hpp"

#include <cmath>

namespace dp {

Sgd::Sgd(ParamStore& params, Backend& backend, SgdOptions options)
    : params_(params),
      backend_(backend),
      options_(options),
      momentum_(static_cast<size_t>(params.arena_size()) * sizeof(float),
                params.value_buffer().device()) {}

void Sgd::step(float lr) {
  backend_.sgd_update(params_.arena_size(), params_.values(), params_.grads(), momentum_.f32(), lr,
                      options_.momentum, options_.weight_decay, options_.nesterov);
}

float step_lr(float base, int64_t epoch, int64_t step_size, float gamma) {
  return base * std::pow(gamma, static_cast<float>(epoch / step_size));
}

}  // namespace dp
