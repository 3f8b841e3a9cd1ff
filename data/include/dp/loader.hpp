// Loader: background workers read this rank's samples of one split and prepare batches ahead.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dp/dataset.hpp"

namespace dp::data {

// One batch in the layout the model consumes: NHWC float32.
struct Batch {
  int n = 0;  // samples in this batch (the last one may be smaller)
  int height = 0, width = 0;
  const float* images = nullptr;     // [n,H,W,3], normalised: (x/255 - mean[c]) / std[c]
  const float* masks = nullptr;      // [n,H,W,1], 0 or 1
  const int64_t* indices = nullptr;  // dataset index of each sample
};

// Augmentation, a function of (seed, epoch, dataset index) only:
//   kFlips: horizontal and vertical flips, each with probability 1/2;
//   kFull:  flips, a rotation by a uniform multiple of 90 degrees (square images only), then
//           brightness and contrast jitter (factors uniform in [0.8, 1.2], as torchvision's
//           ColorJitter(0.2, 0.2): x*b, then blended with the mean grey level, clamped to
//           [0, 255]); masks get the same flips and rotation.
enum class Augment { kNone, kFlips, kFull };
// Normalisation statistics: ImageNet's (what the reference's pretrained encoders expect) or the
// dataset's own (root attributes mean and std of the training images, see dataset.hpp).
enum class Normalize { kImagenet, kDataset };
// Where a crop window is taken (see LoaderOptions::crop_height).
enum class Crop { kRandom, kCenter };

inline constexpr std::array<float, 3> kImagenetMean = {0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImagenetStd = {0.229f, 0.224f, 0.225f};

const char* augment_name(Augment a);
const char* normalize_name(Normalize n);

struct LoaderOptions {
  int batch_size = 4;
  int prefetch = 2;  // batches prepared ahead of the consumer
  int workers = 1;   // threads reading (HDF5 reads serialised, gzip rows inflated in parallel)
                     // and preparing samples
  Augment augment = Augment::kNone;
  Normalize normalize = Normalize::kImagenet;
  bool cache = false;      // keep each sample read (uint8) in memory for later epochs
  bool drop_last = false;  // skip the last batch of an epoch if it is smaller than batch_size
  uint64_t seed = 0;
  // Crop and scale jitter, before the augmentation above: the batch is crop_height x crop_width
  // (0: the stored size). kRandom: a factor s uniform in [scale_min, scale_max] and a window of
  // (crop / s) stored pixels (clamped to the stored image: no zooming out past it) at a uniform
  // position, resampled to the crop size (bilinear images, nearest masks; s = 1 copies pixels
  // exactly); drawn from (seed, epoch, index) in a stream of their own. kCenter: the centred
  // window, no scaling (validation).
  int crop_height = 0, crop_width = 0;
  Crop crop = Crop::kRandom;
  float scale_min = 1.0f, scale_max = 1.0f;
};

// Parses dptrain's --random-crop ("HxW", or "" for none) and --scale-jitter ("LO-HI", e.g.
// 0.8-1.2, or "" for none; 0 < LO <= HI <= 4) into `options`; throws dp::Error naming the
// option, the text and what was expected.
void parse_crop(const std::string& random_crop, const std::string& scale_jitter,
                LoaderOptions& options);
// The options of a validation loader that goes with training loader options `train`: no
// augmentation, no scale jitter, the centred crop of the same size (one input size per model).
LoaderOptions validation_options(LoaderOptions train);

// Batch buffers (prefetch + 1 slots of batch_size) are allocated in the constructor and reused.
// Usage per epoch: start(indices, epoch); while (const Batch* b = next()) {...}
// next() returns nullptr at the end of the epoch; a batch stays valid until the next call.
// Each worker takes the next sample position of the epoch, so a batch is filled by several
// workers at once and batches are still delivered in order; a sample's content depends only on
// (seed, epoch, dataset index), not on the worker count, batch size or timing.
// With cache, every sample is read from the file once and kept (image + mask, 4 bytes a pixel):
// memory grows to the number of distinct indices started, so pair it with a fixed shard.
// Errors in a worker are rethrown from next() as dp::Error.
class Loader {
 public:
  Loader(const std::string& path, const std::string& split, LoaderOptions options);
  ~Loader();  // stops and joins the workers
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t dataset_size() const;
  int height() const;  // of the batches: the crop's, or the stored images'
  int width() const;
  float pos_weight() const;
  const PixelScale& scale() const;           // the dataset's (Dataset::scale)
  const std::array<float, 3>& mean() const;  // the normalisation in use
  const std::array<float, 3>& std() const;
  int64_t cached_samples() const;  // samples held in memory (0 without cache)
  void start(std::vector<int64_t> indices, int64_t epoch);
  const Batch* next();
  void stop();  // abandons the rest of the epoch (joins the workers)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dp::data
