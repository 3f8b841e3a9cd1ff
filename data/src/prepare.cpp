// dpprep build and info: image/mask folders -> dataset v1 (stratified split), and file inspection.
#include "dp/prepare.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <regex>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "dp/image_io.hpp"
#include "dp/rng.hpp"

namespace dp::data {

namespace fs = std::filesystem;

namespace {

constexpr int kChannels = 3;
constexpr size_t kMaxListed = 5;     // offenders named in an error message
constexpr int kMaxRank = 8;          // of a dataset, for chunk queries
constexpr int64_t kPrepVersion = 4;  // 2: per-sample source and origin; tiles, padding; 3: scale;
                                     // 4: validation masks at the photographs' size
// Bad input files listed by a failed build, one a line.
constexpr size_t kMaxProblemsListed = 20;
// Split streams: positives (masks with a crack pixel) and negatives are shuffled separately.
constexpr uint64_t kNegativeStream = 0, kPositiveStream = 1;
// Stream of the draws that keep tiles below --min-crack-fraction (keep_below).
constexpr uint64_t kTileStream = 2;

struct Pair {
  std::string stem, image, mask;
  bool val = false;
  bool crack = false;                       // the (binarised, resized) mask has a crack pixel
  std::vector<std::array<int, 2>> samples;  // (y, x) of each sample cut from it: {0, 0} untiled
};

// Start positions of tiles of side `tile` every `stride` along a side of `size` (>= tile), plus
// one flush with the far edge if the last one does not reach it.
std::vector<int> tile_starts(int size, int tile, int stride) {
  std::vector<int> starts;
  for (int p = 0; p + tile <= size; p += stride) starts.push_back(p);
  if (starts.back() + tile < size) starts.push_back(size - tile);
  return starts;
}

// The height x width rectangle of `src` whose top-left pixel is (y, x).
Image crop(const Image& src, int y, int x, int height, int width) {
  Image dst{width, height, src.channels, {}};
  const auto row = static_cast<size_t>(width) * src.channels;
  dst.pixels.resize(row * height);
  for (int r = 0; r < height; ++r) {
    std::memcpy(dst.pixels.data() + r * row,
                src.pixels.data() + ((static_cast<size_t>(y) + r) * src.width + x) * src.channels,
                row);
  }
  return dst;
}

// `src` padded with zeros at the bottom and right to height x width.
Image pad(const Image& src, int height, int width) {
  Image dst{width, height, src.channels, {}};
  dst.pixels.assign(static_cast<size_t>(width) * height * src.channels, 0);
  const auto row = static_cast<size_t>(src.width) * src.channels;
  for (int r = 0; r < src.height; ++r) {
    std::memcpy(dst.pixels.data() + static_cast<size_t>(r) * width * src.channels,
                src.pixels.data() + r * row, row);
  }
  return dst;
}

struct Folder {
  std::map<std::string, std::string> files;  // stem -> path
  int64_t ignored = 0;
};

Folder list_folder(const std::string& dir, const char* what) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  DP_CHECK(!ec && fs::exists(st), what, " folder '", dir, "' does not exist");
  DP_CHECK(fs::is_directory(st), what, " folder '", dir, "' is not a folder");
  Folder folder;
  fs::directory_iterator it(dir, ec);
  DP_CHECK(!ec, "cannot list ", what, " folder '", dir, "': ", ec.message());
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    // Hidden files (e.g. macOS's "._x.jpg") and other extensions are not images.
    if (name.empty() || name[0] == '.' || !has_image_extension(name) || e.is_directory(ec)) {
      ++folder.ignored;
      continue;
    }
    const std::string stem = e.path().stem().string();
    const auto [at, inserted] = folder.files.emplace(stem, e.path().string());
    DP_CHECK(inserted, "two ", what, " files have the stem '", stem, "': '", at->second, "' and '",
             e.path().string(), "'; pairs are matched by stem, so keep one of them");
  }
  return folder;
}

std::string first_names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < std::min(names.size(), kMaxListed); ++i) {
    s += str_cat(i ? ", " : "", fs::path(names[i]).filename().string());
  }
  if (names.size() > kMaxListed) s += ", ...";
  return s;
}

// Pairs image and mask files by stem, in stem order (never by listing order).
std::vector<Pair> pair_folders(const std::string& image_dir, const std::string& mask_dir,
                               bool skip_unpaired, BuildReport& report) {
  const Folder images = list_folder(image_dir, "image");
  const Folder masks = list_folder(mask_dir, "mask");
  report.ignored_files += images.ignored + masks.ignored;
  std::vector<Pair> pairs;
  std::vector<std::string> lonely_images, lonely_masks;
  for (const auto& [stem, path] : images.files) {
    const auto m = masks.files.find(stem);
    if (m == masks.files.end()) {
      lonely_images.push_back(path);
    } else {
      pairs.push_back({stem, path, m->second, false, false, {}});
    }
  }
  for (const auto& [stem, path] : masks.files) {
    if (!images.files.count(stem)) lonely_masks.push_back(path);
  }
  if (!skip_unpaired && (!lonely_images.empty() || !lonely_masks.empty())) {
    std::string msg = "unpaired files (pairs are matched by file stem):";
    if (!lonely_images.empty()) {
      msg += str_cat(" ", lonely_images.size(), " image(s) in '", image_dir, "' have no mask in '",
                     mask_dir, "' (", first_names(lonely_images), ")");
    }
    if (!lonely_masks.empty()) {
      msg += str_cat(lonely_images.empty() ? " " : "; ", lonely_masks.size(), " mask(s) in '",
                     mask_dir, "' have no image in '", image_dir, "' (", first_names(lonely_masks),
                     ")");
    }
    fail(msg, "; skip them with --skip-unpaired");
  }
  report.skipped_images += static_cast<int64_t>(lonely_images.size());
  report.skipped_masks += static_cast<int64_t>(lonely_masks.size());
  DP_CHECK(!pairs.empty(), "no image/mask pairs: '", image_dir, "' has ", images.files.size(),
           " image file(s), '", mask_dir, "' has ", masks.files.size(),
           " (.jpg, .jpeg, .png, .tif, .tiff or .bmp, paired by file stem)");
  return pairs;
}

// Runs `fn`; a dp::Error it throws (a file that cannot be read or decoded, or a pair whose sizes
// disagree) is recorded in `problems` instead. True if it threw none.
template <typename F>
bool record(std::vector<std::string>& problems, F&& fn) {
  try {
    fn();
    return true;
  } catch (const Error& e) {
    problems.emplace_back(e.what());
    return false;
  }
}

// Fails with every recorded problem, one a line (the first kMaxProblemsListed, then how many
// more), and for more than one a last line counting them; nothing if there is none.
void fail_on(const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string msg;
  for (size_t i = 0; i < std::min(problems.size(), kMaxProblemsListed); ++i)
    msg += str_cat(i ? "\n" : "", problems[i]);
  if (problems.size() > kMaxProblemsListed)
    msg += str_cat("\n... and ", problems.size() - kMaxProblemsListed, " more");
  if (problems.size() > 1)
    msg += str_cat("\n", problems.size(), " problems with the input files; nothing was written");
  fail(msg);
}

// Mask bytes -> {0,1} in place.
void binarise(std::vector<uint8_t>& mask, int threshold) {
  for (uint8_t& v : mask) v = v > threshold ? 1 : 0;
}

class Builder {
 public:
  Builder(const BuildOptions& options, const ProgressFn& progress)
      : opt_(options), progress_(progress) {}

  BuildReport run() {
    check_options();
    std::vector<Pair> pairs = pair_folders(opt_.images, opt_.masks, opt_.skip_unpaired, report_);
    if (explicit_val()) {
      std::vector<Pair> val =
          pair_folders(opt_.val_images, opt_.val_masks, opt_.skip_unpaired, report_);
      for (Pair& p : val) p.val = true;
      pairs.insert(pairs.end(), val.begin(), val.end());
    }
    scan(pairs);
    if (!explicit_val()) split(pairs);
    std::vector<const Pair*> train, val;
    for (const Pair& p : pairs) (p.val ? val : train).push_back(&p);
    check_splits(train.size(), val.size(), pairs.size());
    check_tiles(train, "training");
    check_tiles(val, "validation");
    write(train, val);
    return report_;
  }

 private:
  bool explicit_val() const { return !opt_.val_images.empty(); }

  void check_options() const {
    DP_CHECK(!opt_.images.empty() && !opt_.masks.empty(), "an image and a mask folder are needed");
    DP_CHECK(opt_.val_images.empty() == opt_.val_masks.empty(),
             "validation folders: give both the images and the masks, or neither");
    DP_CHECK(opt_.group_by.empty() || !explicit_val(),
             "a split group pattern needs a drawn split, not explicit validation folders");
    if (!opt_.group_by.empty()) {
      try {
        std::regex{opt_.group_by};
      } catch (const std::regex_error& e) {
        fail("split group pattern '", opt_.group_by, "' is not a regular expression (", e.what(),
             ")");
      }
    }
    DP_CHECK(opt_.val_fraction >= 0 && opt_.val_fraction < 1, "validation fraction ",
             opt_.val_fraction, " out of range [0, 1)");
    DP_CHECK(opt_.mask_threshold >= 0 && opt_.mask_threshold < 255, "mask threshold ",
             opt_.mask_threshold, " out of range [0, 254]");
    DP_CHECK((opt_.resize_width == 0) == (opt_.resize_height == 0) && opt_.resize_width >= 0 &&
                 opt_.resize_height >= 0 && opt_.resize_width <= kMaxImageSide &&
                 opt_.resize_height <= kMaxImageSide,
             "bad resize target ", opt_.resize_width, "x", opt_.resize_height);
    DP_CHECK((opt_.tile_height == 0) == (opt_.tile_width == 0) && opt_.tile_height >= 0 &&
                 opt_.tile_width >= 0 && opt_.tile_height <= kMaxImageSide &&
                 opt_.tile_width <= kMaxImageSide && opt_.tile_stride >= 0 &&
                 opt_.tile_stride <= kMaxImageSide,
             "bad tile ", opt_.tile_height, "x", opt_.tile_width, " (HxW) or stride ",
             opt_.tile_stride);
    DP_CHECK((opt_.pad_height == 0) == (opt_.pad_width == 0) && opt_.pad_height >= 0 &&
                 opt_.pad_width >= 0 && opt_.pad_height <= kMaxImageSide &&
                 opt_.pad_width <= kMaxImageSide,
             "bad padding target ", opt_.pad_height, "x", opt_.pad_width, " (HxW)");
    DP_CHECK(int(resizing()) + int(tiling()) + int(padding()) <= 1,
             "give at most one of --resize, --tile and --pad-to");
    DP_CHECK(opt_.min_crack_fraction >= 0 && opt_.min_crack_fraction <= 1 && opt_.keep_below >= 0 &&
                 opt_.keep_below <= 1,
             "minimum crack fraction ", opt_.min_crack_fraction, " and kept fraction ",
             opt_.keep_below, " must be in [0, 1]");
    DP_CHECK(tiling() || (opt_.min_crack_fraction == 0 && opt_.keep_below == 0),
             "a minimum crack fraction applies to tiles: give --tile HxW");
    DP_CHECK(!opt_.out.empty(), "no output file given");
    // Fail before the long scan if the output cannot be written.
    const fs::path parent = fs::path(opt_.out).parent_path();
    const std::string dir = parent.empty() ? "." : parent.string();
    std::error_code ec;
    DP_CHECK(fs::is_directory(dir, ec), "cannot write '", opt_.out, "': folder '", dir,
             "' does not exist");
    DP_CHECK(::access(dir.c_str(), W_OK) == 0, "cannot write '", opt_.out, "': folder '", dir,
             "' is not writable");
    DP_CHECK(!fs::is_directory(opt_.out, ec), "cannot write '", opt_.out, "': it is a folder");
  }

  // Pass 1: image sizes (headers only) and masks (decoded, for the stratified split). Every bad
  // file is recorded and the pass goes on; if there was one, the other images are decoded too
  // (what pass 2 would find: e.g. a JPEG truncated after its header), then the build fails
  // listing them all.
  void scan(std::vector<Pair>& pairs) {
    const Pair* first = nullptr;
    int first_w = 0, first_h = 0;
    bool sizes_differ = false;          // reported once: the fix (--resize) is one for all
    std::vector<const Pair*> readable;  // pairs without a problem so far
    const auto total = static_cast<int64_t>(pairs.size());
    for (size_t i = 0; i < pairs.size(); ++i) {
      Pair& p = pairs[i];
      int width = 0, height = 0;  // of the image, from its header
      Image mask;
      bool good = record(problems_, [&] {
        const ImageHeader ih = read_image_header(p.image);
        width = ih.width;
        height = ih.height;
      });
      good = record(problems_, [&] { mask = read_image(p.mask, PixelFormat::kGray); }) && good;
      if (good) good = record(problems_, [&] { check_pair(p, width, height, mask); });
      if (good) good = record(problems_, [&] { check_fits(p, width, height); });
      if (good && !first) {
        first = &p;
        first_w = width;
        first_h = height;
      } else if (good && (width != first_w || height != first_h)) {
        if (!sizes_differ && !resizing() && !tiling() && !padding()) {
          problems_.push_back(str_cat("images differ in size: '", first->image, "' is ", first_w,
                                      "x", first_h, " but '", p.image, "' is ", width, "x", height,
                                      " (WxH); all images must share one size, or give --tile HxW "
                                      "(cut into tiles), --pad-to HxW (pad with zeros) or "
                                      "--resize WxH (distorts)"));
        }
        sizes_differ = true;
      }
      if (good) {
        plan_samples(p, i, mask);
        p.crack = has_crack(std::move(mask));
        readable.push_back(&p);
      }
      if (progress_) progress_("reading masks", static_cast<int64_t>(i) + 1, total);
    }
    if (!problems_.empty()) {
      for (size_t i = 0; i < readable.size(); ++i) {
        record(problems_, [&] { read_image(readable[i]->image, PixelFormat::kRgb); });
        if (progress_) {
          progress_("checking images", static_cast<int64_t>(i) + 1,
                    static_cast<int64_t>(readable.size()));
        }
      }
    }
    fail_on(problems_);
    report_.width = resizing()  ? opt_.resize_width
                    : tiling()  ? opt_.tile_width
                    : padding() ? opt_.pad_width
                                : first_w;
    report_.height = resizing()  ? opt_.resize_height
                     : tiling()  ? opt_.tile_height
                     : padding() ? opt_.pad_height
                                 : first_h;
    report_.resized = resizing();
    // Resized from photographs of one size: one scale for all of them.
    report_.scale = !resizing()    ? PixelScale{}
                    : sizes_differ ? kUnknownScale
                                   : PixelScale{double(opt_.resize_height) / first_h,
                                                double(opt_.resize_width) / first_w};
    report_.padded = padding();
    report_.tiled = tiling();
    report_.sources = static_cast<int64_t>(readable.size());
  }

  bool resizing() const { return opt_.resize_width > 0; }
  bool tiling() const { return opt_.tile_width > 0; }
  bool padding() const { return opt_.pad_width > 0; }

  // An image must hold the tile, and fit in the padding target.
  void check_fits(const Pair& p, int width, int height) const {
    DP_CHECK(!tiling() || (width >= opt_.tile_width && height >= opt_.tile_height), "image '",
             p.image, "' is ", height, "x", width, " (HxW), smaller than the tile ",
             opt_.tile_height, "x", opt_.tile_width, "; give a smaller --tile");
    DP_CHECK(!padding() || (width <= opt_.pad_width && height <= opt_.pad_height), "image '",
             p.image, "' is ", height, "x", width, " (HxW), larger than --pad-to ", opt_.pad_height,
             "x", opt_.pad_width, "; give a larger --pad-to, or --tile");
  }

  // The samples cut from pair number `index`: one at (0, 0) without tiles; with tiles, every
  // tile position, less those below the minimum crack fraction (but a keep_below fraction).
  void plan_samples(Pair& p, size_t index, const Image& mask) {
    p.samples.clear();
    if (!tiling()) {
      p.samples.push_back({0, 0});
      return;
    }
    const int th = opt_.tile_height, tw = opt_.tile_width;
    const int64_t area = static_cast<int64_t>(th) * tw;
    uint64_t tile = 0;
    for (const int y : tile_starts(mask.height, th, opt_.tile_stride ? opt_.tile_stride : th)) {
      for (const int x : tile_starts(mask.width, tw, opt_.tile_stride ? opt_.tile_stride : tw)) {
        int64_t crack = 0;
        for (int r = y; r < y + th; ++r) {
          const uint8_t* row = mask.pixels.data() + static_cast<size_t>(r) * mask.width;
          for (int c = x; c < x + tw; ++c) crack += row[c] > opt_.mask_threshold;
        }
        bool keep =
            static_cast<double>(crack) >= opt_.min_crack_fraction * static_cast<double>(area);
        if (!keep && opt_.keep_below > 0) {
          Rng rng(key(opt_.seed, kTileStream, index, tile));
          keep = rng.uniform() < opt_.keep_below;
        }
        if (keep) {
          p.samples.push_back({y, x});
        } else {
          ++report_.tiles_dropped;
        }
        ++tile;
      }
    }
  }

  static void check_pair(const Pair& p, int width, int height, const Image& mask) {
    DP_CHECK(mask.width == width && mask.height == height, "image '", p.image, "' is ", width, "x",
             height, " but its mask '", p.mask, "' is ", mask.width, "x", mask.height, " (WxH)");
  }

  bool has_crack(Image mask) const {
    if (resizing()) mask = resize_nearest(mask, opt_.resize_width, opt_.resize_height);
    return std::any_of(mask.pixels.begin(), mask.pixels.end(),
                       [&](uint8_t v) { return v > opt_.mask_threshold; });
  }

  // Stratified random split by group (see BuildOptions::group_by): in each stratum (groups with a
  // crack pixel, groups without), shuffled groups go to validation until they hold
  // round(val_fraction x the stratum's pairs). Without group_by this is a plain stratified split.
  void split(std::vector<Pair>& pairs) const {
    std::optional<std::regex> pattern;
    if (!opt_.group_by.empty()) pattern.emplace(opt_.group_by);
    std::vector<std::vector<Pair*>> groups;
    std::map<std::string, size_t> index;  // key -> groups[i], in the order pairs first show it
    for (Pair& p : pairs) {
      std::smatch m;
      const bool matched = pattern && std::regex_search(p.stem, m, *pattern);
      const auto [it, added] = index.emplace(matched ? m.str(0) : p.stem, groups.size());
      if (added) groups.emplace_back();
      groups[it->second].push_back(&p);
    }
    const auto has_crack = [](const std::vector<Pair*>& g) {
      return std::any_of(g.begin(), g.end(), [](const Pair* p) { return p->crack; });
    };
    for (const bool crack : {false, true}) {
      std::vector<std::vector<Pair*>*> stratum;
      size_t n_pairs = 0;
      for (auto& g : groups) {
        if (has_crack(g) != crack) continue;
        stratum.push_back(&g);
        n_pairs += g.size();
      }
      Rng rng(key(opt_.seed, crack ? kPositiveStream : kNegativeStream));
      for (auto i = static_cast<int64_t>(stratum.size()) - 1; i > 0; --i) {
        const auto j = static_cast<size_t>(rng.below(static_cast<uint64_t>(i + 1)));
        std::swap(stratum[static_cast<size_t>(i)], stratum[j]);
      }
      const auto n_val =
          static_cast<size_t>(std::llround(opt_.val_fraction * static_cast<double>(n_pairs)));
      size_t taken = 0;
      for (size_t i = 0; i < stratum.size() && taken < n_val; ++i) {
        for (Pair* p : *stratum[i]) p->val = true;
        taken += stratum[i]->size();
      }
    }
  }

  void check_splits(size_t n_train, size_t n_val, size_t n_pairs) const {
    if (explicit_val()) {
      DP_CHECK(n_train > 0, "the training split is empty (no pairs in '", opt_.images, "')");
      return;
    }
    DP_CHECK(n_train > 0, "the training split would be empty: ", n_pairs,
             " pair(s) with validation fraction ", opt_.val_fraction);
    DP_CHECK(opt_.val_fraction == 0 || n_val > 0,
             "the validation split would be empty: ", "validation fraction ", opt_.val_fraction,
             " of ", n_pairs,
             " pair(s) rounds to 0 in both strata (with and without cracks); use a larger "
             "fraction, or 0 for no validation split");
  }

  static int64_t sample_count(const std::vector<const Pair*>& pairs) {
    int64_t n = 0;
    for (const Pair* p : pairs) n += static_cast<int64_t>(p->samples.size());
    return n;
  }

  // A split of sources must keep at least one tile.
  void check_tiles(const std::vector<const Pair*>& pairs, const char* split) const {
    DP_CHECK(pairs.empty() || sample_count(pairs) > 0, "no tile of the ", split, " split (",
             pairs.size(), " image(s)) has a crack fraction of at least ", opt_.min_crack_fraction,
             "; lower --min-crack-fraction or keep some with --keep-below");
  }

  // Pass 2: decode, convert and write every pair; the writer renames the file only at the end.
  // A bad file (one found only here, e.g. a JPEG truncated after its header) is recorded, nothing
  // more is written, and the pass goes on decoding to find the others; then the build fails
  // listing them all and the writer removes its temporary file.
  void write(const std::vector<const Pair*>& train, const std::vector<const Pair*>& val) {
    const int h = report_.height, w = report_.width;
    const int64_t n_train = sample_count(train), n_val = sample_count(val);
    DatasetWriter writer(opt_.out, h, w, n_train, n_val, opt_.gzip_level);
    const auto total = static_cast<int64_t>(train.size() + val.size());
    int64_t done = 0;
    for (const bool is_val : {false, true}) {
      const char* split = is_val ? "val" : "train";
      const std::vector<const Pair*>& items = is_val ? val : train;
      int64_t& with_cracks = is_val ? report_.val_with_cracks : report_.train_with_cracks;
      int64_t index = 0;  // of the next sample in the split
      for (size_t i = 0; i < items.size(); ++i) {
        const Pair& p = *items[i];
        Image image, mask, native_mask;
        const bool good = record(problems_, [&] {
          image = read_image(p.image, PixelFormat::kRgb);
          mask = read_image(p.mask, PixelFormat::kGray);
          check_pair(p, image.width, image.height, mask);
          check_fits(p, image.width, image.height);
          if (padding()) {
            image = pad(image, h, w);
            mask = pad(mask, h, w);
          } else if (!tiling() && (image.width != w || image.height != h)) {
            DP_CHECK(resizing(), "image '", p.image, "' changed size while dpprep was running");
            image = resize_bilinear(image, w, h);
            if (is_val && report_.scale.known()) native_mask = mask;
            mask = resize_nearest(mask, w, h);
          }
        });
        if (good && problems_.empty()) {
          binarise(mask.pixels, opt_.mask_threshold);
          // Validation scores against the photograph's own mask, as dppredict does.
          if (!native_mask.pixels.empty()) {
            binarise(native_mask.pixels, opt_.mask_threshold);
            writer.write_native_mask(split, index, native_mask.pixels.data(), native_mask.height,
                                     native_mask.width);
          }
          const std::string name = fs::path(p.image).filename().string();
          for (const auto& [y, x] : p.samples) {
            const Image tile_image = tiling() ? crop(image, y, x, h, w) : Image{};
            const Image tile_mask = tiling() ? crop(mask, y, x, h, w) : Image{};
            const Image& im = tiling() ? tile_image : image;
            const Image& ma = tiling() ? tile_mask : mask;
            with_cracks +=
                std::any_of(ma.pixels.begin(), ma.pixels.end(), [](uint8_t v) { return v != 0; });
            writer.write(split, index, im.pixels.data(), ma.pixels.data());
            writer.set_source(split, index, SampleSource{name, y, x});
            ++index;
          }
        }
        if (progress_) progress_("writing", ++done, total);
      }
    }
    fail_on(problems_);
    writer.set_attr("dpprep_version", kPrepVersion);
    writer.set_attr("source_images", fs::absolute(opt_.images).string());
    writer.set_attr("source_masks", fs::absolute(opt_.masks).string());
    if (explicit_val()) {
      writer.set_attr("source_val_images", fs::absolute(opt_.val_images).string());
      writer.set_attr("source_val_masks", fs::absolute(opt_.val_masks).string());
    } else {
      writer.set_attr("val_fraction", opt_.val_fraction);
      writer.set_attr("split_seed", static_cast<int64_t>(opt_.seed));  // bit pattern of the seed
      if (!opt_.group_by.empty()) writer.set_attr("split_group_by", opt_.group_by);
    }
    writer.set_attr("mask_threshold", static_cast<int64_t>(opt_.mask_threshold));
    writer.set_attr("resized", static_cast<int64_t>(resizing()));
    if (report_.scale.known()) writer.set_scale(report_.scale);
    if (padding()) {
      writer.set_attr("pad_height", static_cast<int64_t>(opt_.pad_height));
      writer.set_attr("pad_width", static_cast<int64_t>(opt_.pad_width));
    }
    if (tiling()) {
      writer.set_attr("tile_height", static_cast<int64_t>(opt_.tile_height));
      writer.set_attr("tile_width", static_cast<int64_t>(opt_.tile_width));
      writer.set_attr("tile_stride", static_cast<int64_t>(opt_.tile_stride));
      writer.set_attr("min_crack_fraction", opt_.min_crack_fraction);
      writer.set_attr("keep_below", opt_.keep_below);
    }
    writer.commit();
    report_.train = n_train;
    report_.val = n_val;
    const Dataset written(opt_.out, "train");
    report_.pos_weight = written.pos_weight();
    for (int c = 0; c < kChannels; ++c) {
      report_.mean[c] = written.mean()[c];
      report_.std[c] = written.std()[c];
    }
  }

  const BuildOptions& opt_;
  const ProgressFn& progress_;
  BuildReport report_;
  std::vector<std::string> problems_;  // bad input files found so far, one message each
};

// Chunk shape and gzip level of a dataset, from its creation property list.
void chunking(const std::string& path, const std::string& name, std::vector<int64_t>& chunk,
              int& gzip_level) {
  h5::File file(path, h5::Mode::kRead);
  h5::Dataset ds = h5::Dataset::open(file, name);
  std::lock_guard<std::recursive_mutex> lock(h5::mutex());
  const hid_t raw = H5Dget_create_plist(ds.attrs().id());
  DP_H5_CHECK(raw);
  const h5::Id dcpl(raw);
  chunk.clear();
  gzip_level = 0;
  if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
    hsize_t dims[kMaxRank] = {};
    const int rank = H5Pget_chunk(dcpl.get(), kMaxRank, dims);
    DP_H5_CHECK(rank);
    chunk.assign(dims, dims + rank);
  }
  const int filters = H5Pget_nfilters(dcpl.get());
  DP_H5_CHECK(filters);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, values[1] = {};
    size_t n_values = 1;
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &n_values,
                                          values, 0, nullptr, nullptr);
    if (f == H5Z_FILTER_DEFLATE) gzip_level = n_values > 0 ? static_cast<int>(values[0]) : -1;
  }
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

// The value of a root attribute as text: strings as they are, numbers (arrays too) printed.
std::string attr_text(const h5::File& file, const std::string& name) {
  H5T_class_t cls = H5T_NO_CLASS;
  {
    std::lock_guard<std::recursive_mutex> lock(h5::mutex());
    const hid_t a = H5Aopen(file.id(), name.c_str(), H5P_DEFAULT);
    DP_H5_CHECK(a);
    const h5::Id attr(a);
    const hid_t t = H5Aget_type(attr.get());
    DP_H5_CHECK(t);
    const h5::Id type(t);
    cls = H5Tget_class(type.get());
  }
  if (cls == H5T_STRING) return file.attr_string(name);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT) return "(not a string or number)";
  const std::vector<double> values = file.attr_doubles(name);
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) {
    s += str_cat(i ? " " : "", cls == H5T_INTEGER ? str_cat(static_cast<int64_t>(values[i]))
                                                  : str_cat(values[i]));
  }
  return s;
}

}  // namespace

BuildReport build_dataset(const BuildOptions& options, const ProgressFn& progress) {
  return Builder(options, progress).run();
}

DatasetInfo inspect_dataset(const std::string& path, const ProgressFn& progress) {
  DatasetInfo info;
  info.path = path;
  std::vector<Dataset> splits;
  splits.emplace_back(path, "train");  // validates the format, attributes and train layout
  {
    h5::File file(path, h5::Mode::kRead);
    info.format = file.attr_string("format");
    if (file.exists("val")) splits.emplace_back(path, "val");
    std::vector<std::string> names;
    {
      std::lock_guard<std::recursive_mutex> lock(h5::mutex());
      hsize_t at = 0;
      DP_H5_CHECK(
          H5Aiterate2(file.id(), H5_INDEX_NAME, H5_ITER_INC, &at, collect_attr_name, &names));
    }
    for (const std::string& name : names) {
      if (name == "format" || name == "pos_weight" || name == "mean" || name == "std") continue;
      info.attributes.emplace_back(name, attr_text(file, name));
    }
  }
  const Dataset& train = splits.front();
  info.pos_weight = train.pos_weight();
  info.has_stats = train.has_stats();
  for (int c = 0; c < kChannels; ++c) {
    info.mean[c] = train.mean()[c];
    info.std[c] = train.std()[c];
  }
  int64_t total = 0, done = 0;
  for (const Dataset& d : splits) total += d.size();
  for (const Dataset& d : splits) {
    SplitInfo s;
    s.name = d.split();
    s.count = d.size();
    s.height = d.height();
    s.width = d.width();
    DP_CHECK(d.height() == train.height() && d.width() == train.width(), "'", path, "': split '",
             d.split(), "' has images of ", d.height(), "x", d.width(), " but 'train' has ",
             train.height(), "x", train.width(), " (HxW)");
    int mask_gzip = 0;
    chunking(path, s.name + "/images", s.image_chunk, s.gzip_level);
    chunking(path, s.name + "/masks", s.mask_chunk, mask_gzip);
    // Every mask is read: its values are checked (0/1) and its crack pixels counted.
    const int64_t pixels = static_cast<int64_t>(d.height()) * d.width();
    std::vector<uint8_t> mask(static_cast<size_t>(pixels));
    for (int64_t i = 0; i < d.size(); ++i) {
      d.read_mask(i, mask.data());
      int64_t crack = 0;
      for (uint8_t v : mask) crack += v;
      s.crack_pixels += crack;
      s.with_cracks += crack > 0;
      if (progress) progress("checking masks", ++done, total);
    }
    s.pixels = pixels * d.size();
    if (d.has_native_masks()) {  // read to check their values too
      s.native_height = d.native_height();
      s.native_width = d.native_width();
      std::vector<uint8_t> native(static_cast<size_t>(s.native_height) * s.native_width);
      for (int64_t i = 0; i < d.size(); ++i) d.read_native_mask(i, native.data());
    }
    std::vector<std::string> names;
    for (SampleSource& src : d.read_sources()) names.push_back(std::move(src.name));
    std::sort(names.begin(), names.end());
    s.sources = std::unique(names.begin(), names.end()) - names.begin();
    info.splits.push_back(std::move(s));
  }
  return info;
}

}  // namespace dp::data
