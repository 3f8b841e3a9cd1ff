// Fixed validation samples: read, normalised and predicted for the report and TensorBoard.
#include "train/validation_samples.hpp"

#include <algorithm>
#include <cmath>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/log.hpp"

namespace dp::app {
namespace {

constexpr int kChannels = 3;
constexpr uint8_t kMaskOn = 255;

}  // namespace

ValidationSamples::ValidationSamples(const std::string& data_path,
                                     const Normalization& normalization, double threshold,
                                     int height, int width)
    : logit_threshold_(float(std::log(threshold / (1.0 - threshold)))) {
  const data::Dataset val(data_path, "val");
  const NormalizationLut lut = normalization_lut(normalization);
  const int64_t n = std::min<int64_t>(kCount, val.size());
  const int sh = val.height(), sw = val.width(), h = height, w = width;
  DP_CHECK(h <= sh && w <= sw, "validation samples: a ", h, "x", w, " crop of ", sh, "x", sw,
           " images");
  const int y0 = (sh - h) / 2, x0 = (sw - w) / 2;  // the loader's centred window
  const size_t pixels = size_t(h) * size_t(w);
  std::vector<uint8_t> stored(size_t(sh) * size_t(sw) * kChannels),
      stored_mask(size_t(sh) * size_t(sw));
  for (int64_t k = 0; k < n; ++k) {
    Sample s;
    s.index = k * val.size() / n;
    s.image = data::Image{w, h, kChannels, std::vector<uint8_t>(pixels * kChannels)};
    s.mask.resize(pixels);
    val.read(s.index, stored.data(), stored_mask.data());
    for (int y = 0; y < h; ++y) {
      const size_t from = size_t(y0 + y) * size_t(sw) + size_t(x0), to = size_t(y) * size_t(w);
      std::copy_n(stored.begin() + ptrdiff_t(from * kChannels), size_t(w) * kChannels,
                  s.image.pixels.begin() + ptrdiff_t(to * kChannels));
      std::copy_n(stored_mask.begin() + ptrdiff_t(from), size_t(w), s.mask.begin() + ptrdiff_t(to));
    }
    s.input.resize(pixels * kChannels);
    for (size_t i = 0; i < pixels * kChannels; ++i)
      s.input[i] = lut[i % kChannels][s.image.pixels[i]];
    samples_.push_back(std::move(s));
  }
}

std::vector<ValidationSamples::Prediction> ValidationSamples::predict(Model& model) const {
  std::vector<Prediction> out;
  const bool was_training = model.training();
  model.set_training(false);  // running statistics, no dropout: as in validation
  for (size_t first = 0; first < samples_.size(); first += size_t(model.max_batch())) {
    const size_t n = std::min(samples_.size() - first, size_t(model.max_batch()));
    const size_t pixels = samples_[first].mask.size();
    std::vector<float> batch(n * pixels * kChannels);
    for (size_t k = 0; k < n; ++k)
      std::copy(samples_[first + k].input.begin(), samples_[first + k].input.end(),
                batch.begin() + ptrdiff_t(k * pixels * kChannels));
    const float* logits = model.forward_host(batch.data(), int(n));
    for (size_t k = 0; k < n; ++k) {
      const Sample& s = samples_[first + k];
      Prediction p;
      p.mask.resize(pixels);
      for (size_t i = 0; i < pixels; ++i) {
        const bool on = logits[k * pixels + i] > logit_threshold_, truth = s.mask[i] != 0;
        p.mask[i] = on ? 1 : 0;
        p.counts.tp += on && truth;
        p.counts.fp += on && !truth;
        p.counts.fn += !on && truth;
      }
      out.push_back(std::move(p));
    }
  }
  model.set_training(was_training);
  return out;
}

data::Image mask_image(const std::vector<uint8_t>& mask, int width, int height) {
  DP_CHECK(mask.size() == size_t(width) * size_t(height), "mask_image: ", mask.size(),
           " values for ", width, "x", height);
  data::Image img{width, height, 1, std::vector<uint8_t>(mask.size())};
  for (size_t i = 0; i < mask.size(); ++i) img.pixels[i] = mask[i] != 0 ? kMaskOn : 0;
  return img;
}

data::Image display_size(data::Image image, int side, bool mask) {
  const int longer = std::max(image.width, image.height);
  if (longer <= side) return image;
  const int w = std::max(1, image.width * side / longer);
  const int h = std::max(1, image.height * side / longer);
  return mask ? data::resize_nearest(image, w, h) : data::resize_bilinear(image, w, h);
}

data::Image sample_strip(const ValidationSamples::Sample& sample,
                         const ValidationSamples::Prediction& prediction, int side) {
  constexpr int kGap = 4;
  constexpr uint8_t kGapGrey = 128;
  const int w = sample.image.width, h = sample.image.height;
  const data::Image panels[] = {display_size(sample.image, side, false),
                                display_size(mask_image(sample.mask, w, h), side, true),
                                display_size(mask_image(prediction.mask, w, h), side, true)};
  const int pw = panels[0].width, ph = panels[0].height;
  data::Image strip{
      3 * pw + 2 * kGap, ph, kChannels,
      std::vector<uint8_t>(size_t(3 * pw + 2 * kGap) * size_t(ph) * kChannels, kGapGrey)};
  for (int p = 0; p < 3; ++p) {
    const data::Image& panel = panels[p];
    DP_CHECK(panel.width == pw && panel.height == ph, "sample_strip: panel sizes differ");
    for (int y = 0; y < ph; ++y)
      for (int x = 0; x < pw; ++x)
        for (int c = 0; c < kChannels; ++c)
          strip.pixels[(size_t(y) * size_t(strip.width) + size_t(p * (pw + kGap) + x)) * kChannels +
                       size_t(c)] =
              panel.pixels[(size_t(y) * size_t(pw) + size_t(x)) * size_t(panel.channels) +
                           size_t(panel.channels == 1 ? 0 : c)];
  }
  return strip;
}

std::string describe_sample_iou(const Confusion& c) {
  if (c.tp + c.fn == 0)  // IoU is undefined or 0 without crack pixels in the truth
    return c.fp == 0 ? "no crack, none predicted" : str_cat("no crack, ", c.fp, " px predicted");
  return str_cat("IoU ", fixed(c.iou(), 3));
}

}  // namespace dp::app
