// dppredict's inputs: listed, paired with their true masks, read one at a time.
#include "predict/inputs.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "dp/error.hpp"
#include "dp/log.hpp"
#include "predict/measurements.hpp"

namespace dp::app {
namespace {

namespace fs = std::filesystem;

// Mask files (--masks, --measure-only): pixels above this are crack, as dpprep build reads them.
constexpr uint8_t kMaskFileThreshold = 127;

bool is_listed_image(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  return e.is_regular_file() && !name.empty() && name[0] != '.' && data::has_image_extension(name);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string padded(int64_t v, int64_t largest) {
  const std::string digits = std::to_string(largest);
  std::string s = std::to_string(v);
  return std::string(digits.size() > s.size() ? digits.size() - s.size() : 0, '0') + s;
}

// The true mask of every image input, by stem, from the --masks folder (any image type).
void find_masks(const std::string& folder, std::vector<Input>& inputs) {
  std::map<std::string, std::string> by_stem;
  for (const auto& e : fs::directory_iterator(folder))
    if (is_listed_image(e)) by_stem.emplace(e.path().stem().string(), e.path().string());
  for (Input& in : inputs) {
    const auto it = by_stem.find(in.name);
    DP_CHECK(it != by_stem.end(), "--masks '", folder, "' has no mask for '", in.path,
             "' (expected ", in.name, ".png or another image file of that stem)");
    in.mask = it->second;
  }
}

}  // namespace

std::vector<std::string> list_inputs(const PredictOptions& options) {
  std::vector<std::string> files;
  for (const std::string& p : options.inputs) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(p))
        if (is_listed_image(e)) found.push_back(e.path().string());
      DP_CHECK(!found.empty(), "folder '", p, "' holds no images (.jpg .jpeg .png)");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      DP_CHECK(fs::is_regular_file(p, ec), "input '", p, "' does not exist or is not a file");
      files.push_back(p);
    }
  }
  if (!options.list.empty()) {
    std::ifstream list(options.list);
    DP_CHECK(list.good(), "cannot read --list '", options.list, "'");
    int line_no = 0;
    for (std::string line; std::getline(list, line);) {
      ++line_no;
      line = trim(line);
      if (line.empty() || line[0] == '#') continue;
      std::error_code ec;
      DP_CHECK(fs::is_regular_file(line, ec), "--list '", options.list, "' line ", line_no, ": '",
               line, "' does not exist or is not a file");
      files.push_back(line);
    }
    DP_CHECK(!options.inputs.empty() || !files.empty(), "--list '", options.list,
             "' names no images");
  }
  std::map<std::string, std::string> by_stem;
  for (const std::string& f : files) {
    const std::string stem = fs::path(f).stem().string();
    const auto [it, fresh] = by_stem.emplace(stem, f);
    DP_CHECK(fresh, "inputs '", it->second, "' and '", f, "' would both write masks/", stem,
             ".png; rename one");
  }
  return files;
}

data::Image read_mask_file(const std::string& path) {
  data::Image mask = data::read_image(path, data::PixelFormat::kGray);
  for (uint8_t& v : mask.pixels) v = v > kMaskFileThreshold ? 1 : 0;
  return mask;
}

InputSource::InputSource(const PredictOptions& options) : options_(options) {
  if (options.from_dataset()) {
    dataset_ = std::make_unique<data::Dataset>(options.dataset, options.split);
    for (int64_t i = 0; i < dataset_->size(); ++i)
      inputs_.push_back({str_cat(options.split, "_", padded(i, dataset_->size() - 1)), "", i, {}});
    if (!options.per_image.empty()) sources_ = dataset_->read_sources();
  } else {
    for (std::string& f : list_inputs(options))
      inputs_.push_back({fs::path(f).stem().string(), std::move(f), -1, {}});
    if (!options.masks.empty()) find_masks(options.masks, inputs_);
  }
}

InputSource::~InputSource() = default;

bool InputSource::use_photo_size() {
  photo_size_ = dataset_ && dataset_->has_native_masks();
  return photo_size_;
}

std::string InputSource::scored_set() const {
  return dataset_ ? str_cat(options_.dataset, " /", options_.split) : options_.masks;
}

InputImage InputSource::read(size_t id) const {
  const Input& in = inputs_[id];
  InputImage r;
  if (dataset_) {
    data::Image& image = r.image;
    image.width = dataset_->width();
    image.height = dataset_->height();
    image.channels = 3;
    image.pixels.resize(size_t(image.width) * size_t(image.height) * 3);
    r.truth.resize(size_t(image.width) * size_t(image.height));
    dataset_->read(in.index, image.pixels.data(), r.truth.data());
    if (photo_size_) {
      const int h = dataset_->native_height(), w = dataset_->native_width();
      r.photo = data::resize_bilinear(image, w, h);
      r.truth.resize(size_t(h) * size_t(w));
      dataset_->read_native_mask(in.index, r.truth.data());
    }
    return r;
  }
  // Gray, palette and 16-bit files are converted to 8-bit RGB; transparency is refused.
  r.image = data::read_image(in.path, data::PixelFormat::kRgb);
  if (!in.mask.empty()) {
    data::Image mask = read_mask_file(in.mask);
    DP_CHECK(mask.width == r.image.width && mask.height == r.image.height, in.mask, ": mask is ",
             mask.width, "x", mask.height, " but its image '", in.path, "' is ", r.image.width, "x",
             r.image.height, " (WxH); expected the same size");
    r.truth = std::move(mask.pixels);
  }
  return r;
}

std::string InputSource::source_fields(size_t id) const {
  const Input& in = inputs_[id];
  if (!sources_.empty()) {
    const data::SampleSource& s = sources_[size_t(in.index)];
    return str_cat(csv_field(s.name), ",", s.y, ",", s.x);
  }
  if (!in.path.empty()) return str_cat(csv_field(fs::path(in.path).filename().string()), ",0,0");
  return ",,";
}

}  // namespace dp::app
