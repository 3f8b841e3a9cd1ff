// The fixed validation samples that --report and --tensorboard show: read once from the dataset,
// predicted with the model's current weights whenever asked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/image_io.hpp"
#include "dp/model.hpp"
#include "normalization.hpp"
#include "train/metrics.hpp"

namespace dp::app {

class ValidationSamples {
 public:
  static constexpr int kCount = 4;  // fewer if the split is smaller

  struct Sample {
    int64_t index = 0;          // in the validation split
    data::Image image;          // 8-bit RGB
    std::vector<uint8_t> mask;  // ground truth, 0/1
    std::vector<float> input;   // normalised NHWC, as the loader feeds the model
  };
  struct Prediction {
    std::vector<uint8_t> mask;  // 0/1 at the threshold
    Confusion counts;           // against the ground truth
  };

  // Reads kCount samples evenly spaced over the "val" split of `data_path` (the same every
  // epoch), normalised as training does, and keeps their centred height x width crop (the
  // validation loader's window with --random-crop; the whole image otherwise). Throws dp::Error
  // naming the file on a read error.
  ValidationSamples(const std::string& data_path, const Normalization& normalization,
                    double threshold, int height, int width);

  const std::vector<Sample>& samples() const { return samples_; }
  // Predictions of `model` in evaluation mode (its mode is restored), one per sample.
  std::vector<Prediction> predict(Model& model) const;

 private:
  std::vector<Sample> samples_;
  float logit_threshold_ = 0;
};

// A 0/1 mask as an 8-bit grey image (0 and 255).
data::Image mask_image(const std::vector<uint8_t>& mask, int width, int height);

// An image shrunk to at most `side` pixels on its longer side for display: bilinear, or nearest
// for masks (which stay 0/255).
data::Image display_size(data::Image image, int side, bool mask);

// image | ground truth | prediction side by side (RGB, a grey gap between), each panel at most
// `side` pixels on its longer side.
data::Image sample_strip(const ValidationSamples::Sample& sample,
                         const ValidationSamples::Prediction& prediction, int side = 256);

// "IoU 0.731", or what it is when there are no crack pixels in the ground truth or the prediction
// (IoU undefined): "no crack, none predicted" (right) or "no crack, N px predicted".
std::string describe_sample_iou(const Confusion& c);

}  // namespace dp::app
