// Test tool: runs one evaluation-mode forward pass of a dptrain model with weights imported from
// a file (PyTorch keys or a dptrain checkpoint) and writes the logits; optionally saves the model
// as a dptrain checkpoint. Used by torch_roundtrip.py to compare dptrain with PyTorch.
#include <cstdio>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/h5.hpp"
#include "dp/model.hpp"
#include "dp/weights.hpp"

int main(int argc, char** argv) {
  if (argc != 7 && argc != 8) {
    std::fprintf(stderr,
                 "usage: %s MODEL WIDTH_DIVISOR DECONV(0|1) WEIGHTS INPUT.h5 LOGITS.h5 "
                 "[CHECKPOINT.h5]\n",
                 argv[0]);
    return 2;
  }
  try {
    dp::ModelConfig c;
    c.name = argv[1];
    c.width_divisor = std::stoi(argv[2]);
    c.deconv = std::string(argv[3]) == "1";
    auto be = dp::make_cpu_backend();
    auto m = dp::make_model(c, *be);
    dp::import_weights(argv[4], c.name, m->params(), m->buffers(), false);
    std::vector<float> x;
    std::vector<int64_t> shape;
    {
      std::lock_guard lock(dp::h5::mutex());
      dp::h5::File in(argv[5], dp::h5::Mode::kRead);
      dp::h5::Dataset d = dp::h5::Dataset::open(in, "input");
      shape = d.shape();
      x.resize(size_t(d.numel()));
      d.read(x.data());
    }
    const int n = int(shape[0]), h = int(shape[1]), w = int(shape[2]);
    m->setup(n, h, w);
    m->set_training(false);
    const float* y = m->forward(x.data(), n);
    {
      std::lock_guard lock(dp::h5::mutex());
      dp::h5::File out(argv[6], dp::h5::Mode::kTruncate);
      dp::h5::Dataset::create(out, "logits", dp::h5::Type::kFloat32, {n, h, w, 1}).write(y);
    }
    if (argc == 8) {
      dp::CheckpointMeta meta;
      meta.model = c.name;
      meta.width_divisor = c.width_divisor;
      meta.deconv = c.deconv;
      meta.height = h;
      meta.width = w;
      dp::save_checkpoint(argv[7], m->params(), nullptr, meta, &m->buffers());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_forward: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
