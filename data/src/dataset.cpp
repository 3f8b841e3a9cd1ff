// Dataset format v1 (HDF5): validating reader of one split and the atomic (temp + rename) writer.
#include "dp/dataset.hpp"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

#include "dp/error.hpp"
#include "dp/fs.hpp"
#include "dp/h5.hpp"
#include "dp/image_io.hpp"

namespace dp::data {

namespace {

constexpr int kChannels = 3;
constexpr int kMaxGzip = 9;
constexpr const char* kFormatAttr = "format";
constexpr const char* kPosWeightAttr = "pos_weight";
constexpr const char* kMeanAttr = "mean";
constexpr const char* kStdAttr = "std";
constexpr const char* kScaleYAttr = "scale_y";
constexpr const char* kScaleXAttr = "scale_x";
constexpr const char* kResizedAttr = "resized";  // dpprep build --resize (before scale_y, scale_x)
constexpr double kMaxByte = 255.0;
constexpr int64_t kMaxSamples = int64_t{1} << 31;  // per split

std::string images_path(const std::string& split) {
  return split + "/images";
}
std::string masks_path(const std::string& split) {
  return split + "/masks";
}

std::string native_masks_path(const std::string& split) {
  return split + "/native_masks";
}

std::string source_path(const std::string& split) {
  return split + "/source";
}
std::string origin_path(const std::string& split) {
  return split + "/origin";
}
constexpr int kOriginRank = 2;  // /<split>/origin is [N, 2]: y, x

// An hid_t from an HDF5 call, checked and owned.
h5::Id owned(hid_t id, const char* what) {
  h5::check(id, what, __FILE__, __LINE__);
  return h5::Id(id);
}

// Writes /<split>/source (variable-length UTF-8 strings [N]) and /<split>/origin (int32 [N,2]).
void write_sources(const h5::File& file, const std::string& split,
                   const std::vector<SampleSource>& sources) {
  std::lock_guard<std::recursive_mutex> lock(h5::mutex());
  const auto n = static_cast<hsize_t>(sources.size());
  std::vector<const char*> names(sources.size());
  std::vector<int32_t> origin(sources.size() * kOriginRank);
  for (size_t i = 0; i < sources.size(); ++i) {
    names[i] = sources[i].name.c_str();
    origin[i * kOriginRank] = sources[i].y;
    origin[i * kOriginRank + 1] = sources[i].x;
  }
  const h5::Id type = owned(H5Tcopy(H5T_C_S1), "H5Tcopy");
  DP_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  DP_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const h5::Id space = owned(H5Screate_simple(1, &n, nullptr), "H5Screate_simple");
  const h5::Id names_ds = owned(H5Dcreate2(file.id(), source_path(split).c_str(), type.get(),
                                           space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                "H5Dcreate2 source");
  DP_H5_CHECK(H5Dwrite(names_ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, names.data()));
  const hsize_t dims[kOriginRank] = {n, kOriginRank};
  const h5::Id space2 = owned(H5Screate_simple(kOriginRank, dims, nullptr), "H5Screate_simple");
  const h5::Id origin_ds = owned(H5Dcreate2(file.id(), origin_path(split).c_str(), H5T_STD_I32LE,
                                            space2.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                 "H5Dcreate2 origin");
  DP_H5_CHECK(
      H5Dwrite(origin_ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, origin.data()));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += str_cat(i ? "," : "", shape[i]);
  return s + "]";
}

// Throws unless every mask value is 0 or 1.
void check_mask(const uint8_t* mask, int64_t pixels, const std::string& where, int64_t index) {
  for (int64_t i = 0; i < pixels; ++i) {
    DP_CHECK(mask[i] <= 1, "mask of sample ", index, " in '", where, "' has value ",
             static_cast<int>(mask[i]), ", expected 0 or 1");
  }
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

Dataset::Dataset(const std::string& path, const std::string& split) : path_(path), split_(split) {
  file_ = std::make_unique<h5::File>(path, h5::Mode::kRead);
  DP_CHECK(file_->has_attr(kFormatAttr), "'", path, "' is not a ", kDatasetFormat,
           " dataset: root attribute '", kFormatAttr, "' is missing");
  const std::string format = file_->attr_string(kFormatAttr);
  DP_CHECK(format == kDatasetFormat, "'", path, "' has format '", format, "', expected '",
           kDatasetFormat, "'");
  DP_CHECK(file_->exists(split), "'", path, "' has no split '", split, "' (group '/", split,
           "' not found)");
  images_ = std::make_unique<h5::Dataset>(h5::Dataset::open(*file_, images_path(split)));
  masks_ = std::make_unique<h5::Dataset>(h5::Dataset::open(*file_, masks_path(split)));

  const std::vector<int64_t>& is = images_->shape();
  const std::vector<int64_t>& ms = masks_->shape();
  DP_CHECK(images_->type() == h5::Type::kUint8, "dataset '", images_->name(),
           "' has type float32, expected uint8");
  DP_CHECK(masks_->type() == h5::Type::kUint8, "dataset '", masks_->name(),
           "' has type float32, expected uint8");
  DP_CHECK(is.size() == 4 && is[3] == kChannels && is[1] > 0 && is[2] > 0, "dataset '",
           images_->name(), "' has shape ", shape_str(is), ", expected [N,H,W,3]");
  DP_CHECK(ms.size() == 3, "dataset '", masks_->name(), "' has shape ", shape_str(ms),
           ", expected [N,H,W]");
  DP_CHECK(ms[0] == is[0], "'", path, "': split '", split, "' has ", is[0], " images but ", ms[0],
           " masks ('", images_->name(), "' ", shape_str(is), ", '", masks_->name(), "' ",
           shape_str(ms), ")");
  DP_CHECK(is[0] > 0, "'", path, "': split '", split, "' is empty ('", images_->name(),
           "' has shape ", shape_str(is), ")");
  DP_CHECK(ms[0] == is[0] && ms[1] == is[1] && ms[2] == is[2], "dataset '", masks_->name(),
           "' has shape ", shape_str(ms), ", expected [", is[0], ",", is[1], ",", is[2],
           "] to match '", images_->name(), "' ", shape_str(is));
  DP_CHECK(is[1] <= kMaxImageSide && is[2] <= kMaxImageSide, "dataset '", images_->name(),
           "': image size ", is[1], "x", is[2], " is too large (sides up to ", kMaxImageSide, ")");
  // Before anything is allocated per sample: a sane count, and the data really in the file.
  DP_CHECK(is[0] <= kMaxSamples, "'", path, "': split '", split, "' claims ", is[0],
           " samples, more than ", kMaxSamples, " ('", images_->name(), "' ", shape_str(is), ")");
  images_->check_stored();
  masks_->check_stored();
  size_ = is[0];
  height_ = static_cast<int>(is[1]);
  width_ = static_cast<int>(is[2]);

  DP_CHECK(file_->has_attr(kPosWeightAttr), "'", path, "' is not a valid ", kDatasetFormat,
           " dataset: root attribute '", kPosWeightAttr, "' is missing");
  const double pw = file_->attr_double(kPosWeightAttr);
  DP_CHECK(pw > 0 && pw <= std::numeric_limits<float>::max(), "'", path, "': root attribute '",
           kPosWeightAttr, "' is ", pw, ", expected a positive number");
  pos_weight_ = static_cast<float>(pw);

  has_stats_ = file_->has_attr(kMeanAttr) && file_->has_attr(kStdAttr);
  if (has_stats_) {
    const std::vector<double> mean = file_->attr_doubles(kMeanAttr);
    const std::vector<double> stdev = file_->attr_doubles(kStdAttr);
    DP_CHECK(mean.size() == kChannels && stdev.size() == kChannels, "'", path,
             "': root attributes '", kMeanAttr, "' and '", kStdAttr, "' must have ", kChannels,
             " values each, found ", mean.size(), " and ", stdev.size());
    for (int c = 0; c < kChannels; ++c) {
      DP_CHECK(mean[c] >= 0 && mean[c] <= 1 && stdev[c] > 0 && stdev[c] <= 1, "'", path,
               "': channel ", c, " has mean ", mean[c], " and std ", stdev[c],
               ", expected mean in [0, 1] and std in (0, 1]");
      mean_[c] = static_cast<float>(mean[c]);
      std_[c] = static_cast<float>(stdev[c]);
    }
  }

  if (file_->has_attr(kScaleYAttr) && file_->has_attr(kScaleXAttr)) {
    scale_ = {file_->attr_double(kScaleYAttr), file_->attr_double(kScaleXAttr)};
    DP_CHECK(scale_.known() && scale_.y <= kMaxImageSide && scale_.x <= kMaxImageSide, "'", path,
             "': root attributes '", kScaleYAttr, "' and '", kScaleXAttr, "' are ", scale_.y,
             " and ", scale_.x, ", expected positive numbers (pixels per source pixel)");
  } else if (file_->has_attr(kResizedAttr) && file_->attr_int(kResizedAttr) != 0) {
    scale_ = kUnknownScale;
  }

  if (file_->exists(native_masks_path(split))) {
    native_masks_ =
        std::make_unique<h5::Dataset>(h5::Dataset::open(*file_, native_masks_path(split)));
    const std::vector<int64_t>& ns = native_masks_->shape();
    DP_CHECK(native_masks_->type() == h5::Type::kUint8 && ns.size() == 3 && ns[0] == size_ &&
                 ns[1] > 0 && ns[2] > 0 && ns[1] <= kMaxImageSide && ns[2] <= kMaxImageSide,
             "dataset '", native_masks_->name(), "' has shape ", shape_str(ns),
             ", expected uint8 [", size_, ",H,W] with sides up to ", kMaxImageSide);
    native_masks_->check_stored();
    native_height_ = static_cast<int>(ns[1]);
    native_width_ = static_cast<int>(ns[2]);
  }
}

Dataset::~Dataset() = default;
Dataset::Dataset(Dataset&&) noexcept = default;
Dataset& Dataset::operator=(Dataset&&) noexcept = default;

bool Dataset::has_split(const std::string& path, const std::string& split) {
  h5::File file(path, h5::Mode::kRead);
  return file.exists(split);
}

void Dataset::read(int64_t index, uint8_t* image, uint8_t* mask) const {
  DP_CHECK(index >= 0 && index < size_, "sample index ", index, " out of range [0, ", size_,
           ") for split '", split_, "' of '", path_, "'");
  images_->read_rows(index, 1, image);
  masks_->read_rows(index, 1, mask);
  check_mask(mask, static_cast<int64_t>(height_) * width_, masks_->name(), index);
}

void Dataset::read_mask(int64_t index, uint8_t* mask) const {
  DP_CHECK(index >= 0 && index < size_, "sample index ", index, " out of range [0, ", size_,
           ") for split '", split_, "' of '", path_, "'");
  masks_->read_rows(index, 1, mask);
  check_mask(mask, static_cast<int64_t>(height_) * width_, masks_->name(), index);
}

void Dataset::read_native_mask(int64_t index, uint8_t* mask) const {
  DP_CHECK(native_masks_, "'", path_, "' has no '/", native_masks_path(split_), "'");
  DP_CHECK(index >= 0 && index < size_, "sample index ", index, " out of range [0, ", size_,
           ") for split '", split_, "' of '", path_, "'");
  native_masks_->read_rows(index, 1, mask);
  check_mask(mask, static_cast<int64_t>(native_height_) * native_width_, native_masks_->name(),
             index);
}

std::vector<SampleSource> Dataset::read_sources() const {
  std::vector<SampleSource> sources;
  if (!file_->exists(source_path(split_))) return sources;
  const std::string where = str_cat("'", path_, "': dataset '/", source_path(split_), "'");
  DP_CHECK(file_->exists(origin_path(split_)), where, " has no companion '/", origin_path(split_),
           "'");
  std::lock_guard<std::recursive_mutex> lock(h5::mutex());
  const h5::Id names_ds =
      owned(H5Dopen2(file_->id(), source_path(split_).c_str(), H5P_DEFAULT), "H5Dopen2 source");
  const h5::Id origin_ds =
      owned(H5Dopen2(file_->id(), origin_path(split_).c_str(), H5P_DEFAULT), "H5Dopen2 origin");
  const h5::Id file_type = owned(H5Dget_type(names_ds.get()), "H5Dget_type");
  DP_CHECK(H5Tget_class(file_type.get()) == H5T_STRING && H5Tis_variable_str(file_type.get()) > 0,
           where, " is not of variable-length strings");
  const h5::Id space = owned(H5Dget_space(names_ds.get()), "H5Dget_space");
  const h5::Id space2 = owned(H5Dget_space(origin_ds.get()), "H5Dget_space");
  hsize_t n = 0, dims[kOriginRank] = {};
  DP_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1 &&
               H5Sget_simple_extent_dims(space.get(), &n, nullptr) == 1 &&
               n == static_cast<hsize_t>(size_),
           where, " must have shape [", size_, "]");
  DP_CHECK(H5Sget_simple_extent_ndims(space2.get()) == kOriginRank &&
               H5Sget_simple_extent_dims(space2.get(), dims, nullptr) == kOriginRank &&
               dims[0] == n && dims[1] == kOriginRank,
           "'", path_, "': dataset '/", origin_path(split_), "' must have shape [", size_, ",2]");
  const h5::Id mem_type = owned(H5Tcopy(H5T_C_S1), "H5Tcopy");
  DP_H5_CHECK(H5Tset_size(mem_type.get(), H5T_VARIABLE));
  DP_H5_CHECK(H5Tset_cset(mem_type.get(), H5Tget_cset(file_type.get())));
  std::vector<char*> names(n, nullptr);
  DP_H5_CHECK(H5Dread(names_ds.get(), mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, names.data()));
  std::vector<int32_t> origin(n * kOriginRank);
  const herr_t read_origin =
      H5Dread(origin_ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, origin.data());
  sources.resize(n);
  for (size_t i = 0; i < n; ++i) {
    sources[i] = {names[i] ? names[i] : "", origin[i * kOriginRank], origin[i * kOriginRank + 1]};
  }
  H5Dvlen_reclaim(mem_type.get(), space.get(), H5P_DEFAULT, names.data());
  DP_H5_CHECK(read_origin);
  return sources;
}

// ---------------------------------------------------------------------------------------------
// Writer

struct DatasetWriter::Impl {
  struct Split {
    std::string name;
    int64_t count = 0;
    std::optional<h5::Dataset> images, masks, native_masks;
    std::vector<uint8_t> written;       // per sample: 1 once written
    std::vector<uint8_t> has_native;    // per sample: 1 once its native mask is written
    std::vector<int64_t> crack_pixels;  // per sample (train only: for pos_weight)
    std::vector<SampleSource> sources;  // per sample, if set_source was called
    std::vector<uint8_t> has_source;
  };

  // Exact integer sums over the train images, per channel: sum of values and of squares.
  std::array<uint64_t, kChannels> sum{}, sum_sq{};

  std::string path, tmp_path;
  int height = 0, width = 0;
  int gzip = 0;  // level of every dataset
  std::unique_ptr<h5::File> file;
  Split train, val;
  bool committed = false;

  Split& split(const std::string& name) {
    if (name == "train") return train;
    if (name == "val") return val;
    fail("dataset writer for '", path, "': unknown split '", name, "', expected train or val");
  }

  void create_split(Split& s, const std::string& name, int64_t count, int gzip_level) {
    s.name = name;
    s.count = count;
    if (count == 0) return;  // a split without samples is not created
    const int64_t h = height, w = width;
    s.images = h5::Dataset::create(*file, images_path(name), h5::Type::kUint8,
                                   {count, h, w, kChannels}, {1, h, w, kChannels}, gzip_level);
    s.masks = h5::Dataset::create(*file, masks_path(name), h5::Type::kUint8, {count, h, w},
                                  {1, h, w}, gzip_level);
    s.written.assign(static_cast<size_t>(count), 0);
    s.crack_pixels.assign(static_cast<size_t>(count), 0);
  }

  // Closes every HDF5 object of the file (datasets first, so the file really closes).
  void close() noexcept {
    for (Split* s : {&train, &val}) {
      s->images.reset();
      s->masks.reset();
      s->native_masks.reset();
    }
    file.reset();
  }
};

DatasetWriter::DatasetWriter(const std::string& path, int height, int width, int64_t train_count,
                             int64_t val_count, int gzip_level)
    : impl_(std::make_unique<Impl>()) {
  DP_CHECK(height > 0 && width > 0, "dataset writer for '", path, "': bad image size ", height, "x",
           width);
  DP_CHECK(train_count >= 0 && val_count >= 0, "dataset writer for '", path,
           "': bad sample counts train ", train_count, ", val ", val_count);
  DP_CHECK(gzip_level >= 0 && gzip_level <= kMaxGzip, "dataset writer for '", path,
           "': gzip level ", gzip_level, " out of range [0, ", kMaxGzip, "]");
  const std::string dir = parent_dir(path);
  struct stat st {};
  DP_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "cannot write dataset '", path,
           "': directory '", dir, "' does not exist");
  impl_->path = path;
  impl_->tmp_path = temp_path_for(path);
  impl_->height = height;
  impl_->width = width;
  impl_->gzip = gzip_level;
  try {
    impl_->file = std::make_unique<h5::File>(impl_->tmp_path, h5::Mode::kTruncate);
    impl_->create_split(impl_->train, "train", train_count, gzip_level);
    impl_->create_split(impl_->val, "val", val_count, gzip_level);
  } catch (...) {
    impl_->close();
    std::remove(impl_->tmp_path.c_str());
    throw;
  }
}

DatasetWriter::~DatasetWriter() {
  if (!impl_ || impl_->committed) return;
  impl_->close();
  std::remove(impl_->tmp_path.c_str());
}

void DatasetWriter::write(const std::string& split, int64_t index, const uint8_t* image,
                          const uint8_t* mask) {
  DP_CHECK(!impl_->committed && impl_->file, "dataset writer for '", impl_->path,
           "': write after commit");
  Impl::Split& s = impl_->split(split);
  DP_CHECK(index >= 0 && index < s.count, "dataset writer for '", impl_->path, "': sample index ",
           index, " out of range [0, ", s.count, ") for split '", split, "'");
  const int64_t pixels = static_cast<int64_t>(impl_->height) * impl_->width;
  check_mask(mask, pixels, s.masks->name(), index);
  s.images->write_rows(index, 1, image);
  s.masks->write_rows(index, 1, mask);
  int64_t crack = 0;
  for (int64_t i = 0; i < pixels; ++i) crack += mask[i];
  s.crack_pixels[static_cast<size_t>(index)] = crack;
  if (&s == &impl_->train && !s.written[static_cast<size_t>(index)]) {
    for (int64_t i = 0; i < pixels; ++i) {
      for (int c = 0; c < kChannels; ++c) {
        const uint64_t v = image[i * kChannels + c];
        impl_->sum[c] += v;
        impl_->sum_sq[c] += v * v;
      }
    }
  }
  s.written[static_cast<size_t>(index)] = 1;
}

void DatasetWriter::set_source(const std::string& split, int64_t index,
                               const SampleSource& source) {
  DP_CHECK(!impl_->committed && impl_->file, "dataset writer for '", impl_->path,
           "': set_source after commit");
  Impl::Split& s = impl_->split(split);
  DP_CHECK(index >= 0 && index < s.count, "dataset writer for '", impl_->path, "': sample index ",
           index, " out of range [0, ", s.count, ") for split '", split, "'");
  if (s.sources.empty()) {
    s.sources.resize(static_cast<size_t>(s.count));
    s.has_source.assign(static_cast<size_t>(s.count), 0);
  }
  s.sources[static_cast<size_t>(index)] = source;
  s.has_source[static_cast<size_t>(index)] = 1;
}

void DatasetWriter::write_native_mask(const std::string& split, int64_t index, const uint8_t* mask,
                                      int height, int width) {
  Impl& im = *impl_;
  DP_CHECK(!im.committed && im.file, "dataset writer for '", im.path,
           "': write_native_mask after commit");
  Impl::Split& s = im.split(split);
  DP_CHECK(index >= 0 && index < s.count, "dataset writer for '", im.path, "': sample index ",
           index, " out of range [0, ", s.count, ") for split '", split, "'");
  if (!s.native_masks) {
    DP_CHECK(height > 0 && width > 0 && height <= kMaxImageSide && width <= kMaxImageSide,
             "dataset writer for '", im.path, "': bad native mask size ", height, "x", width);
    s.native_masks = h5::Dataset::create(*im.file, native_masks_path(split), h5::Type::kUint8,
                                         {s.count, height, width}, {1, height, width}, im.gzip);
    s.has_native.assign(static_cast<size_t>(s.count), 0);
  }
  const std::vector<int64_t>& shape = s.native_masks->shape();
  DP_CHECK(shape[1] == height && shape[2] == width, "dataset writer for '", im.path,
           "': native mask of sample ", index, " of split '", split, "' is ", height, "x", width,
           ", the others ", shape[1], "x", shape[2], " (HxW)");
  check_mask(mask, static_cast<int64_t>(height) * width, s.native_masks->name(), index);
  s.native_masks->write_rows(index, 1, mask);
  s.has_native[static_cast<size_t>(index)] = 1;
}

void DatasetWriter::set_attr(const std::string& name, const std::string& value) {
  DP_CHECK(!impl_->committed && impl_->file, "dataset writer for '", impl_->path,
           "': set_attr after commit");
  impl_->file->set_attr(name, value);
}

void DatasetWriter::set_attr(const std::string& name, int64_t value) {
  DP_CHECK(!impl_->committed && impl_->file, "dataset writer for '", impl_->path,
           "': set_attr after commit");
  impl_->file->set_attr(name, value);
}

void DatasetWriter::set_attr(const std::string& name, double value) {
  DP_CHECK(!impl_->committed && impl_->file, "dataset writer for '", impl_->path,
           "': set_attr after commit");
  impl_->file->set_attr(name, value);
}

void DatasetWriter::set_scale(const PixelScale& scale) {
  DP_CHECK(scale.known(), "dataset writer for '", impl_->path, "': scale ", scale.y, "x", scale.x,
           " is not positive");
  set_attr(kScaleYAttr, scale.y);
  set_attr(kScaleXAttr, scale.x);
}

void DatasetWriter::commit() {
  Impl& im = *impl_;
  DP_CHECK(!im.committed && im.file, "dataset writer for '", im.path, "': commit called twice");
  for (Impl::Split* s : {&im.train, &im.val}) {
    for (size_t i = 0; i < s->written.size(); ++i) {
      DP_CHECK(s->written[i], "dataset writer for '", im.path, "': sample ", i, " of split '",
               s->name, "' was never written");
      DP_CHECK(s->has_native.empty() || s->has_native[i], "dataset writer for '", im.path,
               "': sample ", i, " of split '", s->name, "' has no native mask (others have)");
    }
  }
  int64_t crack = 0;
  for (int64_t c : im.train.crack_pixels) crack += c;
  const int64_t total = im.train.count * im.height * im.width;
  const double pos_weight =
      crack > 0 ? static_cast<double>(total - crack) / static_cast<double>(crack) : 1.0;

  im.file->set_attr(kFormatAttr, std::string(kDatasetFormat));
  im.file->set_attr(kPosWeightAttr, pos_weight);
  if (total > 0) {
    std::vector<double> mean(kChannels), stdev(kChannels);
    const auto n = static_cast<double>(total);
    for (int c = 0; c < kChannels; ++c) {
      mean[c] = static_cast<double>(im.sum[c]) / n;
      const double var = static_cast<double>(im.sum_sq[c]) / n - mean[c] * mean[c];
      // A constant channel has std 0; store one grey level instead, so normalising stays finite.
      stdev[c] = std::max(std::sqrt(std::max(var, 0.0)), 1.0) / kMaxByte;
      mean[c] /= kMaxByte;
    }
    im.file->set_attr(kMeanAttr, mean);
    im.file->set_attr(kStdAttr, stdev);
  }
  for (Impl::Split* s : {&im.train, &im.val}) {
    if (s->sources.empty()) continue;
    for (size_t i = 0; i < s->has_source.size(); ++i) {
      DP_CHECK(s->has_source[i], "dataset writer for '", im.path, "': sample ", i, " of split '",
               s->name, "' has no source (others have)");
    }
    write_sources(*im.file, s->name, s->sources);
  }
  im.file->flush();
  im.close();
  commit_file(im.tmp_path, im.path);  // fsync, rename, fsync the directory
  im.committed = true;
}

}  // namespace dp::data
