// Dataset preparation: image + mask folders -> dataset v1 (dpprep build), and inspection (info).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dp/dataset.hpp"

namespace dp::data {

struct BuildOptions {
  std::string images, masks;  // folders of .jpg/.jpeg/.png/.tif/.tiff/.bmp, paired by file stem
  std::string val_images, val_masks;  // explicit validation folders (both or neither)
  std::string out;                    // the dataset file to write
  double val_fraction = 0.1;          // used without explicit validation folders; 0 = no val
  uint64_t seed = 1;                  // of the train/val split
  // ECMAScript regex: pairs whose stems share its first match (the whole stem when it does not
  // match) are one group, kept on one side of the split, e.g. "^[^-]+" for crops named PHOTO-1,
  // PHOTO-2 of one photograph. Empty: every pair is its own group.
  std::string group_by;
  int mask_threshold = 127;                 // mask pixel > threshold -> crack (1), else 0
  int resize_width = 0, resize_height = 0;  // 0: every image must already have one size
  bool skip_unpaired = false;  // unpaired files are skipped (counted) instead of an error
  int gzip_level = 0;          // 0 = uncompressed chunks
  // Tiles (--tile HxW): every image (any size, at least the tile) is cut into tile_height x
  // tile_width samples at multiples of tile_stride (0: the tile's own sides, no overlap), plus a
  // last row/column flush with the bottom/right edge; the split stays by source image.
  int tile_height = 0, tile_width = 0, tile_stride = 0;
  // Tiles whose crack-pixel fraction is below min_crack_fraction are dropped, except a
  // keep_below fraction of them (drawn from (seed, source, tile)) so the model still sees
  // background. 0: keep every tile.
  double min_crack_fraction = 0, keep_below = 0;
  // Padding (--pad-to HxW): every image (no side larger) is padded at the bottom and right with
  // zeros to pad_height x pad_width; its mask with 0 (background).
  int pad_height = 0, pad_width = 0;
};

// Called while working: phase ("reading masks" for the split, "writing"; info: "checking
// masks"), done, total.
// It may throw (e.g. on an interrupt): the build stops and leaves nothing behind.
using ProgressFn = std::function<void(const char* phase, int64_t done, int64_t total)>;

struct BuildReport {
  int64_t train = 0, val = 0;                          // samples written
  int64_t train_with_cracks = 0, val_with_cracks = 0;  // samples whose mask has a crack pixel
  int64_t skipped_images = 0, skipped_masks = 0;       // unpaired files skipped (--skip-unpaired)
  int64_t ignored_files = 0;  // files in the folders without an image extension
  int height = 0, width = 0;
  bool resized = false, padded = false, tiled = false;
  PixelScale scale;           // of the samples; unknown when photographs of several sizes resized
  int64_t sources = 0;        // image/mask pairs read
  int64_t tiles_dropped = 0;  // tiles below min_crack_fraction not kept
  double pos_weight = 1.0;
  std::array<double, 3> mean{}, std{};
};

// Pairs the files, decodes every mask (split stratified by whether it has a crack pixel), then
// decodes, converts and writes every pair to a temporary file that is renamed to options.out at
// the end. Bad input throws dp::Error naming the file and the problem; nothing is left behind.
// Every sample's source file name and position are stored (/<split>/source, /<split>/origin).
// Files that cannot be read or decoded (and pairs whose sizes disagree) do not stop a pass: it
// records each and goes on, then the one dp::Error lists them all, one a line (the first 20,
// then "... and N more"; for more than one a last line counting them).
BuildReport build_dataset(const BuildOptions& options, const ProgressFn& progress = {});

// What `dpprep info` prints about one split.
struct SplitInfo {
  std::string name;
  int64_t count = 0;
  int height = 0, width = 0;
  std::vector<int64_t> image_chunk, mask_chunk;  // empty: contiguous
  int gzip_level = 0;                            // of the images; 0 = none
  int64_t crack_pixels = 0, pixels = 0;          // over every mask of the split
  int64_t with_cracks = 0;                       // samples with at least one crack pixel
  int64_t sources = 0;  // distinct source files (/<split>/source); 0 if the file records none
  int native_height = 0, native_width = 0;  // /<split>/native_masks; 0 if the file has none
};

struct DatasetInfo {
  std::string path, format;
  double pos_weight = 1.0;
  bool has_stats = false;
  std::array<double, 3> mean{}, std{};
  std::vector<SplitInfo> splits;                                // train, then val if present
  std::vector<std::pair<std::string, std::string>> attributes;  // the other root attributes
};

// Validates a dataset v1 file (layout, types, shapes, attributes, every mask value) and
// describes it. Throws dp::Error with the reason if the file is not a valid v1 dataset.
DatasetInfo inspect_dataset(const std::string& path, const ProgressFn& progress = {});

}  // namespace dp::data
