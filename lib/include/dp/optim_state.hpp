// A named optimiser state arena (same layout as the parameter arena), as checkpoints store it.
#pragma once

#include <string>
#include <vector>

namespace dp {

// Saved in checkpoints as /optim/<name>/<parameter name>: SGD's momentum_buffer, AdamW's
// exp_avg and exp_avg_sq (PyTorch's state_dict names).
struct StateArena {
  std::string name;
  float* data = nullptr;
};
using OptimizerState = std::vector<StateArena>;

}  // namespace dp
