// dppredict's inputs: image files (paths, folders, --list) or a dataset split, each with its true
// mask where there is one (--masks, the dataset's), read one at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/image_io.hpp"
#include "predict/options.hpp"

namespace dp::app {

// The images the options name, in order: each positional file; each positional folder's image
// files (.jpg .jpeg .png in any case, hidden files skipped), sorted by name; then each line of
// --list (blank lines and # comments skipped; relative paths from the current directory).
// A missing path, a folder without images or two inputs with one file stem (they would write
// the same mask) are dp::Errors naming them.
std::vector<std::string> list_inputs(const PredictOptions& options);

// One input: the stem of its output files and where its pixels come from.
struct Input {
  std::string name;
  std::string path;    // image file; empty for a dataset sample
  int64_t index = -1;  // dataset sample
  std::string mask;    // --masks: the image file's true mask
};

// An input as read: 8-bit RGB pixels and, where given, the true mask (0/1, the image's size).
struct InputImage {
  data::Image image;
  std::vector<uint8_t> truth;
  data::Image photo;  // where set, `image` at its photograph's size, which `truth` is of
};

// A mask file as dpprep build reads masks: gray, pixels above 127 crack (1), the others 0.
data::Image read_mask_file(const std::string& path);

class InputSource {
 public:
  // Lists the inputs (a dataset split's samples, or the image files with their --masks) and
  // checks they exist; dp::Error naming what is missing.
  explicit InputSource(const PredictOptions& options);
  ~InputSource();

  const std::vector<Input>& inputs() const { return inputs_; }
  const data::Dataset* dataset() const { return dataset_.get(); }
  // What the scores are of: "FILE /split" or the --masks folder.
  std::string scored_set() const;
  // Reads input `id`. An image file or mask that cannot be read or decoded, or a mask of another
  // size than its image, is a dp::Error naming the file (that input's failure, see file_inputs);
  // a dataset that cannot be read is the run's.
  InputImage read(size_t id) const;
  bool file_inputs() const { return dataset_ == nullptr; }
  // A dataset that keeps its masks at the photographs' size (/<split>/native_masks, dpprep build
  // --resize): from now on read() gives each sample's `photo` (bilinear) and truth at that size,
  // as dptrain's validation scores them. False, and nothing changes, where it keeps none.
  bool use_photo_size();
  // --per-image: "source,origin_y_px,origin_x_px" of input `id` (CSV fields): the dataset's
  // record of the sample's source (empty where it has none), or the image file at 0, 0.
  std::string source_fields(size_t id) const;

 private:
  const PredictOptions& options_;
  std::unique_ptr<data::Dataset> dataset_;
  std::vector<data::SampleSource> sources_;  // --per-image of a dataset
  std::vector<Input> inputs_;
  bool photo_size_ = false;
};

}  // namespace dp::app
