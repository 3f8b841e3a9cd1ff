// Dataset format v1 (HDF5): reader of one split and a writer, with validation of the layout.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp::h5 {
class File;
class Dataset;
}  // namespace dp::h5

namespace dp::data {

inline constexpr const char* kDatasetFormat = "dp-crack-v1";

// Where a sample came from (dpprep build): the source image's file name and the top-left
// corner of the sample in it (0, 0 unless the image was cut into tiles with --tile).
struct SampleSource {
  std::string name;
  int y = 0, x = 0;
};

// Pixels of a dataset's samples per pixel of its source photographs, along y and x: what dpprep
// build --resize did to them (1 and 1 for photographs kept at their size, cut into tiles or
// padded). Unknown (0) where a file was resized without recording it (dpprep before version 3) or
// from photographs of several sizes. dptrain copies it into its checkpoints; dppredict resizes
// photographs by it.
struct PixelScale {
  double y = 1, x = 1;
  bool known() const { return y > 0 && x > 0; }
  bool operator==(const PixelScale&) const = default;
};
inline constexpr PixelScale kUnknownScale{0, 0};

// Per-channel (R, G, B) statistics of the training images, in units of pixel / 255.
using ChannelStats = std::array<float, 3>;

// One split ("train" or "val") of a dataset v1 file:
//   /<split>/images uint8 [N,H,W,3], /<split>/masks uint8 [N,H,W] with values {0,1}, N >= 1;
//   root attributes format = "dp-crack-v1", pos_weight (float); optional mean and std (3 floats
//   each, the training images' per-channel statistics); optional scale_y and scale_x (floats,
//   PixelScale).
// Optional per split (dpprep writes them; readers of older files find none): /<split>/source,
//   variable-length UTF-8 strings [N] (the source file name of each sample), and
//   /<split>/origin int32 [N,2] (y, x of the sample's top-left pixel in that source).
// Optional, val only (dpprep build --resize from photographs of one size): /val/native_masks
//   uint8 [N,H0,W0] with values {0,1}, each sample's mask at its photograph's own size, which
//   dptrain's validation scores against (the way dppredict scores photographs).
// The constructor validates the layout and throws dp::Error naming the file, the object and what
// was expected. Not thread-safe by itself: all HDF5 access is serialised by dp::h5::mutex().
class Dataset {
 public:
  Dataset(const std::string& path, const std::string& split);
  ~Dataset();
  Dataset(Dataset&&) noexcept;
  Dataset& operator=(Dataset&&) noexcept;

  // True if the file has the group /<split> (whose layout the constructor then checks: a
  // broken split is an error, never silently ignored).
  static bool has_split(const std::string& path, const std::string& split);

  int64_t size() const { return size_; }
  int height() const { return height_; }
  int width() const { return width_; }
  float pos_weight() const { return pos_weight_; }
  bool has_stats() const { return has_stats_; }  // the file has mean and std attributes
  const ChannelStats& mean() const { return mean_; }
  const ChannelStats& std() const { return std_; }
  const PixelScale& scale() const { return scale_; }
  const std::string& path() const { return path_; }
  const std::string& split() const { return split_; }
  // Reads sample `index` (reads only that sample's chunk): image H*W*3, mask H*W (0/1).
  void read(int64_t index, uint8_t* image, uint8_t* mask) const;
  // Reads only the mask of sample `index` (checked to be 0/1).
  void read_mask(int64_t index, uint8_t* mask) const;
  // The source of every sample (size() entries), or none if the file has no /<split>/source.
  std::vector<SampleSource> read_sources() const;
  // /<split>/native_masks: whether the file has them, their size, and sample `index`'s
  // (native_height() * native_width() values, checked to be 0/1).
  bool has_native_masks() const { return native_masks_ != nullptr; }
  int native_height() const { return native_height_; }
  int native_width() const { return native_width_; }
  void read_native_mask(int64_t index, uint8_t* mask) const;

 private:
  std::string path_, split_;
  int64_t size_ = 0;
  int height_ = 0, width_ = 0;
  int native_height_ = 0, native_width_ = 0;
  float pos_weight_ = 1.0f;
  bool has_stats_ = false;
  ChannelStats mean_{}, std_{};
  PixelScale scale_;
  std::unique_ptr<h5::File> file_;
  std::unique_ptr<h5::Dataset> images_, masks_, native_masks_;
};

// Writes a dataset v1 file to `<path>.tmp.<pid>` and renames it to `path` on commit(): an
// interrupted or failed writer leaves no file that looks valid (the temporary is removed).
class DatasetWriter {
 public:
  DatasetWriter(const std::string& path, int height, int width, int64_t train_count,
                int64_t val_count, int gzip_level = 0);
  ~DatasetWriter();  // removes the temporary file unless commit() succeeded
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  void write(const std::string& split, int64_t index, const uint8_t* image, const uint8_t* mask);
  // Records where sample `index` of `split` came from; if any sample of a split has a source,
  // commit() requires one for every sample of it and writes /<split>/source and /<split>/origin.
  void set_source(const std::string& split, int64_t index, const SampleSource& source);
  // Sample `index`'s mask (0/1) at its photograph's size, height x width, the same for every
  // sample; if any sample of a split has one, commit() requires one for every sample of it and
  // the file has /<split>/native_masks.
  void write_native_mask(const std::string& split, int64_t index, const uint8_t* mask, int height,
                         int width);
  // Extra root attributes (e.g. the generator's parameters).
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, double value);
  void set_scale(const PixelScale& scale);  // scale_y and scale_x
  // Computes pos_weight from the written train masks (background / crack pixels) and the train
  // images' per-channel mean and std, writes the attributes, flushes, closes, fsyncs and renames
  // into place.
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dp::data
