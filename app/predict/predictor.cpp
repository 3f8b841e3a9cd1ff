// Loading a checkpoint for inference and running it tile by tile.
#include "predict/predictor.hpp"

#include <algorithm>
#include <filesystem>

#include "device.hpp"

namespace dp::app {
namespace {

constexpr int kDefaultOverlapDivisor = 4;  // default overlap: a quarter of the smaller tile side

}  // namespace

Predictor::Predictor(const std::string& checkpoint, const PredictorOptions& options)
    : path_(checkpoint) {
  DP_CHECK(std::filesystem::is_regular_file(checkpoint), "checkpoint '", checkpoint,
           "' does not exist or is not a file");
  meta_ = read_checkpoint_meta(checkpoint);
  normalization_ = normalization_of(meta_, checkpoint);
  tile_height_ = options.tile_height > 0 ? options.tile_height : int(meta_.height);
  tile_width_ = options.tile_width > 0 ? options.tile_width : int(meta_.width);
  if (tile_height_ <= 0 || tile_width_ <= 0)
    throw UsageError(str_cat("checkpoint '", checkpoint,
                             "' does not record the image size it was trained on; give --tile"));
  overlap_ = options.overlap >= 0 ? options.overlap
                                  : std::min(tile_height_, tile_width_) / kDefaultOverlapDivisor;
  if (overlap_ >= std::min(tile_height_, tile_width_))
    throw UsageError(str_cat("--overlap ", overlap_, " must be smaller than the tile (",
                             tile_height_, "x", tile_width_, ")"));

  margin_ = options.margin;
  if (margin_ < 0) throw UsageError(str_cat("--margin must be >= 0, got ", margin_));

  ModelConfig mc;
  mc.name = meta_.model;
  mc.width_divisor = int(meta_.width_divisor);
  mc.deconv = meta_.deconv != 0;
  BackendRequest br;
  br.precision = options.precision;
  br.cpu_conv = options.conv_algo;
  backend_ =
      options.device != nullptr ? options.device->make_backend(br) : Device::make_cpu_backend(br);
  model_ = make_model(mc, *backend_);
  const int m = model_->size_multiple();
  if (tile_height_ % m != 0 || tile_width_ % m != 0)
    throw UsageError(str_cat("--tile ", tile_height_, "x", tile_width_, ": ", meta_.model,
                             " takes tiles whose sides are multiples of ", m));
  // Tiles per forward pass: --batch-size, but no more than fill kMaxBatchPixels, so that a large
  // tile (up to a whole photograph) runs alone instead of reserving room for several.
  constexpr int64_t kMaxBatchPixels = int64_t(1) << 20;
  const int64_t tile_pixels = int64_t(tile_height_) * tile_width_;
  batch_ = int(std::clamp<int64_t>(kMaxBatchPixels / tile_pixels, 1, options.batch));
  model_->setup(batch_, tile_height_, tile_width_, Model::Purpose::kInference);
  model_->set_training(false);  // running batch-norm statistics, no dropout
  // Averaged weights (--ema) load after the raw ones into the same arenas, replacing them.
  averaged_ = meta_.has_averaged_weights && !options.raw_weights;
  const AveragedWeights into_model{model_->params().values(), model_->buffers().values()};
  load_checkpoint(checkpoint, model_->params(), OptimizerState{}, &model_->buffers(),
                  averaged_ ? &into_model : nullptr);
  runner_ = std::make_unique<TiledRunner>(
      [this](const float* input, int n) { return model_->forward_host(input, n); }, normalization_,
      tile_height_, tile_width_, overlap_, batch_, margin_, options.tta);
}

Predictor::~Predictor() = default;

std::vector<float> Predictor::predict(const data::Image& rgb) {
  std::vector<float> out;
  runner_->submit(
      0, rgb, [&](size_t, const data::Image&, std::vector<float>& prob, const std::vector<float>&) {
        out = std::move(prob);
      });
  runner_->flush();
  return out;
}

}  // namespace dp::app
