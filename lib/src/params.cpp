// Arena layout and initialisation of model parameters.
#include "dp/params.hpp"

#include <cmath>

#include "dp/error.hpp"
#include "dp/rng.hpp"

namespace dp {

namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes
}

int ParamStore::add(std::string name, std::vector<int64_t> shape, int64_t fan_in) {
  DP_CHECK(!finalized_, "ParamStore::add('", name, "') after finalize()");
  DP_CHECK(find(name) == nullptr, "duplicate parameter name '", name, "'");
  ParamView v;
  v.name = std::move(name);
  v.numel = 1;
  for (int64_t d : shape) v.numel *= d;
  v.shape = std::move(shape);
  v.fan_in = fan_in;
  views_.push_back(std::move(v));
  return static_cast<int>(views_.size() - 1);
}

void ParamStore::finalize() {
  DP_CHECK(!finalized_, "ParamStore::finalize() called twice");
  int64_t offset = 0;
  for (auto it = views_.rbegin(); it != views_.rend(); ++it) {
    it->offset = offset;
    offset += (it->numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  arena_size_ = offset;
  values_ = Buffer(static_cast<size_t>(arena_size_) * sizeof(float));
  grads_ = Buffer(static_cast<size_t>(arena_size_) * sizeof(float));
  for (auto& v : views_) {
    v.value = values_.f32() + v.offset;
    v.grad = grads_.f32() + v.offset;
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

void ParamStore::init_pytorch_default(uint64_t seed) {
  DP_CHECK(finalized_, "ParamStore::init before finalize()");
  for (auto& v : views_) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(v.fan_in));
    Rng rng(key(seed, hash_name(v.name)));
    for (int64_t i = 0; i < v.numel; ++i) v.value[i] = rng.uniform(-bound, bound);
  }
}

}  // namespace dp
