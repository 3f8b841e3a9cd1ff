// Test helpers for dpprep: folders of real-looking JPEG/PNG image/mask pairs and broken HDF5 files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "dp/h5.hpp"
#include "dp/image_io.hpp"
#include "dp/synth.hpp"

namespace dp::test {

// How write_pairs() encodes a folder of pairs.
struct PairFolderOptions {
  int count = 8;
  int width = 64, height = 64;
  int negatives = 0;           // the last `negatives` masks are empty (no crack pixel)
  bool jpeg_masks = false;     // masks as JPEG (0/255 plus compression noise), else PNG
  int jpeg_quality = 92;       // images (and JPEG masks)
  uint64_t seed = 5;           // of the synthetic content
  std::string prefix = "img";  // file stems are prefix + 3-digit number
};

inline std::string pair_stem(const PairFolderOptions& o, int i) {
  char num[16];
  std::snprintf(num, sizeof num, "%03d", i);
  return o.prefix + num;
}

// Renders synthetic crack images (data::render_synthetic) and writes them to
// <dir>/images/<stem>.jpg and <dir>/masks/<stem>.png|.jpg (mask pixels 0 or 255).
inline void write_pairs(const std::string& dir, const PairFolderOptions& o) {
  namespace fs = std::filesystem;
  fs::create_directories(dir + "/images");
  fs::create_directories(dir + "/masks");
  data::SynthOptions so;
  so.height = o.height;
  so.width = o.width;
  const size_t pixels = static_cast<size_t>(o.width) * o.height;
  std::vector<uint8_t> image(pixels * 3), mask(pixels);
  for (int i = 0; i < o.count; ++i) {
    // Streams with a crack pixel, so the negatives below are the only empty masks.
    for (uint64_t stream = o.seed * 1000 + static_cast<uint64_t>(i) * 7;; ++stream) {
      data::render_synthetic(so, stream, image.data(), mask.data());
      bool crack = false;
      for (uint8_t m : mask) crack = crack || m != 0;
      if (crack) break;
    }
    const bool negative = i >= o.count - o.negatives;
    for (uint8_t& m : mask) m = negative ? 0 : static_cast<uint8_t>(m ? 255 : 0);
    const std::string stem = pair_stem(o, i);
    data::write_jpeg(dir + "/images/" + stem + ".jpg", image.data(), o.width, o.height,
                     data::PixelFormat::kRgb, o.jpeg_quality);
    if (o.jpeg_masks) {
      data::write_jpeg(dir + "/masks/" + stem + ".jpg", mask.data(), o.width, o.height,
                       data::PixelFormat::kGray, o.jpeg_quality);
    } else {
      data::write_png(dir + "/masks/" + stem + ".png", mask.data(), o.width, o.height, 1);
    }
  }
}

// A dataset-like HDF5 file with chosen parts, for bad-input tests. Shapes are [N,H,W,3] and
// [N,H,W] unless overridden; contents are zeros except `mask_value` in the first mask pixel.
struct RawDataset {
  std::string format = "dp-crack-v1";
  bool pos_weight = true;
  std::vector<int64_t> image_shape = {4, 32, 32, 3}, mask_shape = {4, 32, 32};
  h5::Type image_type = h5::Type::kUint8;
  bool images = true, masks = true;
  uint8_t mask_value = 1;
  int64_t bad_mask_sample = -1;    // this sample's first mask pixel is `mask_value` (-1: none)
  std::vector<int64_t> val_shape;  // [N,H,W]: a /val split of this shape (empty: none)
  bool val_masks = true;
};

inline void write_raw_dataset(const std::string& path, const RawDataset& r) {
  h5::File f(path, h5::Mode::kTruncate);
  if (!r.format.empty()) f.set_attr("format", r.format);
  if (r.pos_weight) f.set_attr("pos_weight", 2.0);
  auto numel = [](const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  };
  if (r.images) {
    h5::Dataset d = h5::Dataset::create(f, "train/images", r.image_type, r.image_shape);
    if (r.image_type == h5::Type::kUint8) {
      d.write(std::vector<uint8_t>(static_cast<size_t>(numel(r.image_shape)), 100).data());
    } else {
      d.write(std::vector<float>(static_cast<size_t>(numel(r.image_shape)), 0.5f).data());
    }
  }
  if (r.masks) {
    std::vector<uint8_t> m(static_cast<size_t>(numel(r.mask_shape)), 0);
    for (size_t i = 0; i < m.size(); i += 7) m[i] = 1;  // some crack pixels everywhere
    if (r.bad_mask_sample >= 0 && r.mask_shape.size() == 3) {
      m[static_cast<size_t>(r.bad_mask_sample * r.mask_shape[1] * r.mask_shape[2])] = r.mask_value;
    }
    h5::Dataset::create(f, "train/masks", h5::Type::kUint8, r.mask_shape).write(m.data());
  }
  if (r.val_shape.size() == 3) {
    const std::vector<int64_t> image_shape = {r.val_shape[0], r.val_shape[1], r.val_shape[2], 3};
    h5::Dataset::create(f, "val/images", h5::Type::kUint8, image_shape)
        .write(std::vector<uint8_t>(static_cast<size_t>(numel(image_shape)), 50).data());
    if (r.val_masks) {
      h5::Dataset::create(f, "val/masks", h5::Type::kUint8, r.val_shape)
          .write(std::vector<uint8_t>(static_cast<size_t>(numel(r.val_shape)), 0).data());
    }
  }
}

}  // namespace dp::test
