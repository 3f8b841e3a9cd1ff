// ParamStore: every parameter in one contiguous arena, gradients in a twin arena, named views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/buffer.hpp"

namespace dp {

struct ParamView {
  std::string name;            // PyTorch state_dict key, e.g. "conv1.0.weight"
  std::vector<int64_t> shape;  // PyTorch layout (OIHW for convolution weights)
  int64_t numel = 0;
  int64_t offset = 0;  // in floats, into the arenas
  float* value = nullptr;
  float* grad = nullptr;
  int64_t fan_in = 0;  // for PyTorch's default initialisation
};

// Parameters are declared in forward order; the arena lays them out in REVERSE order so that
// gradients finished early in the backward pass are contiguous at the start (bucketing).
// Each tensor starts on a 64-byte boundary; the padding stays zero in every arena.
class ParamStore {
 public:
  // Declares a parameter; returns its index. Only before finalize().
  int add(std::string name, std::vector<int64_t> shape, int64_t fan_in);
  // Allocates the arenas and sets the views' pointers.
  void finalize();

  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& view(int index) const { return views_.at(static_cast<size_t>(index)); }
  const ParamView* find(const std::string& name) const;
  float* values() const { return values_.f32(); }
  float* grads() const { return grads_.f32(); }
  int64_t arena_size() const { return arena_size_; }  // floats, padding included
  int64_t count() const;                              // parameters, padding excluded
  // PyTorch's default init for Conv2d: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  // (kaiming_uniform_ with a=sqrt(5)), from a stream keyed by (seed, parameter name).
  void init_pytorch_default(uint64_t seed);

 private:
  std::vector<ParamView> views_;
  Buffer values_, grads_;
  int64_t arena_size_ = 0;
  bool finalized_ = false;
};

}  // namespace dp
