// SGD with momentum and weight decay (PyTorch semantics) over the parameter arena, and the LR
// schedule.
#pragma once

#include <cstdint>

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/optim_state.hpp"
#include "dp/params.hpp"

namespace dp {

// An optimiser over the parameter arena: one fused loop per step, state in arenas of the
// parameter layout (see StateArena), updated from the reduced, averaged gradients.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Step number `t` (1-based, over the whole run; AdamW's bias correction uses it).
  virtual void update(float lr, int64_t t) = 0;
  virtual OptimizerState state() const = 0;
  virtual const char* name() const = 0;  // "sgd", "adamw"
};

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 1e-4f;
  bool nesterov = false;
};

// One fused loop over the whole arena per step; the momentum buffer is a third arena with the
// same layout as the parameters (saved in checkpoints as optim/momentum_buffer/<name>).
class Sgd : public Optimizer {
 public:
  Sgd(ParamStore& params, Backend& backend, SgdOptions options);
  void step(float lr);
  void update(float lr, int64_t /*t*/) override { step(lr); }
  OptimizerState state() const override { return {{kStateName, momentum_.f32()}}; }
  const char* name() const override { return "sgd"; }
  float* momentum() const { return momentum_.f32(); }
  const SgdOptions& options() const { return options_; }
  static constexpr const char* kStateName = "momentum_buffer";

 private:
  ParamStore& params_;
  Backend& backend_;
  SgdOptions options_;
  Buffer momentum_;
};

// StepLR: base * gamma^(floor(epoch / step_size)), epoch counted from 0.
float step_lr(float base, int64_t epoch, int64_t step_size = 30, float gamma = 0.1f);

}  // namespace dp
