// Fuzz target: a checkpoint read as dppredict and a resume do (metadata, model from it, weights,
// optimiser state, checksum), and as --init-weights imports it.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/model.hpp"
#include "dp/weights.hpp"
#include "fuzz_util.hpp"
#include "normalization.hpp"

namespace {

dp::Backend& backend() {
  static const std::unique_ptr<dp::Backend> b = dp::make_cpu_backend(dp::CpuOptions{});
  return *b;
}

// Models as the checkpoint's metadata names them, built once each. Width divisors below 8 are
// refused here (their parameters take hundreds of MB; the loading code is the same).
dp::Model& model_for(const dp::CheckpointMeta& meta) {
  constexpr int64_t kLeastDivisor = 8;
  if (meta.width_divisor < kLeastDivisor || meta.width_divisor > 32)
    throw dp::Error("fuzz: width divisor out of the harness's range");
  static std::map<std::tuple<std::string, int, bool>, std::unique_ptr<dp::Model>> models;
  dp::ModelConfig mc;
  mc.name = meta.model;
  mc.width_divisor = static_cast<int>(meta.width_divisor);
  mc.deconv = meta.deconv != 0;
  auto& slot = models[{mc.name, mc.width_divisor, mc.deconv}];
  if (!slot) slot = dp::make_model(mc, backend());  // throws for an unknown name or divisor
  return *slot;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = dp::fuzz::input_file(data, size, ".h5");
  dp::fuzz::expect_errors([&] {
    // dppredict: metadata, the input normalisation it records, the model, weights and buffers.
    const dp::CheckpointMeta meta = dp::read_checkpoint_meta(path);
    dp::app::normalization_of(meta, path);
    dp::Model& model = model_for(meta);
    dp::load_checkpoint(path, model.params(), nullptr, &model.buffers());
    // A resume: the optimiser state arenas the file lists (SGD's or AdamW's names).
    std::vector<std::vector<float>> arenas;
    arenas.reserve(meta.optimizer_state.size());  // the pointers below stay valid
    dp::OptimizerState state;
    for (const std::string& name : meta.optimizer_state) {
      if (name != "momentum_buffer" && name != "exp_avg" && name != "exp_avg_sq") continue;
      arenas.emplace_back(static_cast<size_t>(model.params().arena_size()));
      state.push_back({name, arenas.back().data()});
    }
    if (!state.empty()) dp::load_checkpoint(path, model.params(), state, &model.buffers());
  });
  // --init-weights / --encoder-weights: the file as a source of named tensors.
  dp::fuzz::expect_errors([&] {
    dp::CheckpointMeta meta;
    meta.model = "unet16";
    meta.width_divisor = 32;
    dp::Model& model = model_for(meta);
    dp::import_weights(path, meta.model, model.params(), model.buffers(), false);
  });
  dp::fuzz::check_no_open_hdf5_objects();
  return 0;
}
