// dp::app::Predictor: a trained checkpoint as a function from images of any size to crack
// probabilities (the model and its config from the checkpoint, tiled inference at a fixed size).
#pragma once

#include <memory>
#include <string>

#include "device.hpp"
#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/model.hpp"
#include "predict/tiling.hpp"

namespace dp::app {

struct PredictorOptions {
  int tile_height = 0, tile_width = 0;  // 0: the size the checkpoint was trained on
  int overlap = -1;                     // pixels shared by neighbouring tiles; -1: tile / 4
  int margin = 0;                       // pixels of reflected context around every image
  int batch = 4;                        // tiles per forward pass
  CpuConvAlgo conv_algo = CpuConvAlgo::kDirect;  // 3x3 convolution kernels (dppredict: kShape)
  Precision precision = Precision::kFloat32;     // bf16: bf16 activations and convolutions
  Device* device = nullptr;  // the CUDA backend on its GPU (TF32 allowed); null: the CPU
  bool raw_weights = false;  // the raw weights even where the checkpoint has averaged ones (--ema)
  Tta tta = Tta::kNone;      // test-time augmentation of every tile
};

class Predictor {
 public:
  // Reads the checkpoint (model name, width divisor, decoder, training size, normalisation,
  // weights and batch-norm statistics). A missing or foreign file is a dp::Error naming it; a
  // tile the model cannot take is a UsageError.
  Predictor(const std::string& checkpoint, const PredictorOptions& options);
  ~Predictor();
  Predictor(const Predictor&) = delete;
  Predictor& operator=(const Predictor&) = delete;

  const CheckpointMeta& meta() const { return meta_; }
  // The model runs the checkpoint's averaged weights (--ema), not its raw ones.
  bool averaged() const { return averaged_; }
  const Normalization& normalization() const { return normalization_; }
  int tile_height() const { return tile_height_; }
  int tile_width() const { return tile_width_; }
  int overlap() const { return overlap_; }
  int margin() const { return margin_; }
  int batch() const {
    return batch_;
  }  // tiles per forward pass (--batch-size, capped for large tiles)
  Model& model() { return *model_; }
  TiledRunner& runner() { return *runner_; }

  // Probabilities (height * width) of one RGB image, alone (see runner() for batches of images).
  std::vector<float> predict(const data::Image& rgb);

 private:
  std::string path_;
  CheckpointMeta meta_;
  Normalization normalization_;
  int tile_height_ = 0, tile_width_ = 0, overlap_ = 0, margin_ = 0, batch_ = 1;
  bool averaged_ = false;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<TiledRunner> runner_;
};

}  // namespace dp::app
