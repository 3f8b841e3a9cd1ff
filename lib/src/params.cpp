// Arena layout and initialisation of model parameters.
#include "dp/params.hpp"

#include <algorithm>
#include <cmath>

#include "dp/error.hpp"
#include "dp/rng.hpp"

namespace dp {

namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes
}

int ParamStore::add(std::string name, std::vector<int64_t> shape, int64_t fan, Init init) {
  DP_CHECK(!finalized_, "ParamStore::add('", name, "') after finalize()");
  DP_CHECK(find(name) == nullptr, "duplicate parameter name '", name, "'");
  ParamView v;
  v.name = std::move(name);
  v.numel = 1;
  for (int64_t d : shape) v.numel *= d;
  v.shape = std::move(shape);
  v.fan = fan;
  v.init = init;
  views_.push_back(std::move(v));
  return static_cast<int>(views_.size() - 1);
}

void ParamStore::finalize(DeviceMemory* device) {
  DP_CHECK(!finalized_, "ParamStore::finalize() called twice");
  int64_t offset = 0;
  for (auto it = views_.rbegin(); it != views_.rend(); ++it) {
    it->offset = offset;
    offset += (it->numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  arena_size_ = offset;
  const size_t bytes = static_cast<size_t>(arena_size_) * sizeof(float);
  values_ = Buffer(bytes, device);
  grads_ = Buffer(bytes, device);
  if (device != nullptr) {
    host_mirror_ = Buffer(bytes);
    host_ = host_mirror_.f32();
  }
  for (auto& v : views_) {
    v.value = values_.f32() + v.offset;
    v.grad = grads_.f32() + v.offset;
    v.host = host_values() + v.offset;
  }
  finalized_ = true;
}

const ParamView* ParamStore::find(const std::string& name) const {
  for (const auto& v : views_)
    if (v.name == name) return &v;
  return nullptr;
}

int64_t ParamStore::count() const {
  int64_t n = 0;
  for (const auto& v : views_) n += v.numel;
  return n;
}

void ParamStore::download() {
  if (on_device()) values_.download(host_, values_.bytes());
}

void ParamStore::upload() {
  if (on_device()) values_.upload(host_, values_.bytes());
}

void ParamStore::initialize(uint64_t seed) {
  DP_CHECK(finalized_, "ParamStore::init before finalize()");
  constexpr float kTwoPi = 6.283185307179586f;
  for (auto& v : views_) {
    Rng rng(key(seed, hash_name(v.name)));
    switch (v.init) {
      case Init::kUniformFanIn: {
        const float bound = 1.0f / std::sqrt(static_cast<float>(v.fan));
        for (int64_t i = 0; i < v.numel; ++i) v.host[i] = rng.uniform(-bound, bound);
        break;
      }
      case Init::kKaimingNormalFanOut: {
        const float std_dev = std::sqrt(2.0f / static_cast<float>(v.fan));
        for (int64_t i = 0; i < v.numel; ++i) {  // Box-Muller
          const float u1 = 1.0f - rng.uniform(), u2 = rng.uniform();
          v.host[i] = std_dev * std::sqrt(-2.0f * std::log(u1)) * std::cos(kTwoPi * u2);
        }
        break;
      }
      case Init::kOnes:
        std::fill(v.host, v.host + v.numel, 1.0f);
        break;
      case Init::kZeros:
        std::fill(v.host, v.host + v.numel, 0.0f);
        break;
    }
  }
  upload();
}

HostArena::HostArena(const ParamStore& params, const float* arena)
    : device_(params.value_buffer().device()),
      arena_(const_cast<float*>(arena)),
      floats_(params.arena_size()) {
  if (device_ != nullptr) stage_.resize(static_cast<size_t>(floats_));
}

void HostArena::fetch() {
  if (device_ != nullptr) device_->download(stage_.data(), arena_, bytes());
}

void HostArena::store() {
  if (device_ != nullptr) device_->upload(arena_, stage_.data(), bytes());
}

}  // namespace dp
