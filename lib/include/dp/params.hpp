// ParamStore: every parameter in one contiguous arena, gradients in a twin arena, named views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/buffer.hpp"

namespace dp {

// How a tensor is initialised (PyTorch's defaults for the module it belongs to).
enum class Init {
  kUniformFanIn,         // Conv2d / ConvTranspose2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  kKaimingNormalFanOut,  // torchvision ResNet convolutions: N(0, 2 / fan_out)
  kOnes,                 // batch-norm weight, running variance
  kZeros,                // batch-norm bias, running mean
};

struct ParamView {
  std::string name;            // PyTorch state_dict key, e.g. "conv1.0.weight"
  std::vector<int64_t> shape;  // PyTorch layout (OIHW for convolution weights)
  int64_t numel = 0;
  int64_t offset = 0;      // in floats, into the arenas
  float* value = nullptr;  // backend memory (device memory for a device backend)
  float* grad = nullptr;   // backend memory
  float* host = nullptr;   // the host copy of value (== value for host arenas)
  int64_t fan = 0;         // fan_in (kUniformFanIn) or fan_out (kKaimingNormalFanOut)
  Init init = Init::kUniformFanIn;
};

// Parameters are declared in forward order; the arena lays them out in REVERSE order so that
// gradients finished early in the backward pass are contiguous at the start (bucketing).
// Each tensor starts on a 64-byte boundary; the padding stays zero in every arena.
// With a device backend the arenas are device memory and a host arena mirrors the values for
// initialisation, checkpoints and weight files: download() before reading `host`, upload() after
// writing it (both no-ops for host arenas).
class ParamStore {
 public:
  // Declares a parameter; returns its index. Only before finalize().
  int add(std::string name, std::vector<int64_t> shape, int64_t fan,
          Init init = Init::kUniformFanIn);
  // Allocates the arenas (in `device` memory when given) and sets the views' pointers.
  void finalize(DeviceMemory* device = nullptr);

  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& view(int index) const { return views_.at(static_cast<size_t>(index)); }
  const ParamView* find(const std::string& name) const;
  float* values() const { return values_.f32(); }
  float* grads() const { return grads_.f32(); }
  float* host_values() const { return host_ != nullptr ? host_ : values_.f32(); }
  const Buffer& value_buffer() const { return values_; }
  const Buffer& grad_buffer() const { return grads_; }
  bool on_device() const { return values_.device() != nullptr; }
  void download();                                    // values -> host mirror
  void upload();                                      // host mirror -> values
  int64_t arena_size() const { return arena_size_; }  // floats, padding included
  int64_t count() const;                              // parameters, padding excluded
  // Initialises every tensor by its Init kind (as PyTorch's init functions: for Conv2d's default
  // kaiming_uniform_ with a=sqrt(5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and
  // bias; kaiming_normal_ N(0, 2 / fan_out)), each from a random stream keyed by (seed, tensor
  // name).
  void initialize(uint64_t seed);

 private:
  std::vector<ParamView> views_;
  Buffer values_, grads_, host_mirror_;
  float* host_ = nullptr;
  int64_t arena_size_ = 0;
  bool finalized_ = false;
};

// An arena of `params`' layout (its values, or optimiser state) where the host can read or write
// it (checkpoints, the start-up broadcast): the arena itself for host stores, else a host copy,
// filled by fetch() (download) and written back by store() (upload).
class HostArena {
 public:
  HostArena(const ParamStore& params, const float* arena);
  float* data() { return device_ != nullptr ? stage_.data() : arena_; }
  size_t bytes() const { return size_t(floats_) * sizeof(float); }
  void fetch();
  void store();

 private:
  DeviceMemory* device_;
  float* arena_;
  int64_t floats_;
  std::vector<float> stage_;
};

}  // namespace dp
