// Unit tests of dataset preparation: JPEG/PNG codecs, resizing, dpprep build and dpprep info.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "dp/image_io.hpp"
#include "dp/prepare.hpp"
#include "prep_util.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

using dp::test::contains;
using dp::test::error_of;

namespace fs = std::filesystem;
using data::BuildOptions;
using data::Image;
using data::PixelFormat;

// A smooth RGB test image (JPEG-friendly) and a gradient.
std::vector<uint8_t> smooth_rgb(int w, int h) {
  std::vector<uint8_t> p(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) p[(y * w + x) * 3 + c] = uint8_t(40 + 2 * x + y + 30 * c);
    }
  }
  return p;
}

void truncate_file(const std::string& path, double keep) {
  fs::resize_file(path, static_cast<uintmax_t>(static_cast<double>(fs::file_size(path)) * keep));
}

BuildOptions build_options(const test::TempDir& dir, const std::string& sub = "") {
  BuildOptions b;
  b.images = dir.file(sub + "images");
  b.masks = dir.file(sub + "masks");
  b.out = dir.file("out.h5");
  return b;
}

std::vector<std::string> leftovers(const test::TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    const std::string n = e.path().filename().string();
    if (n.find(".h5") != std::string::npos) names.push_back(n);
  }
  return names;
}

// ---------------------------------------------------------------------------------------------
// Codecs

TEST(ImageIo, JpegRoundTripIsCloseAndConvertsBetweenGrayAndRgb) {
  test::TempDir dir;
  const int w = 40, h = 24;
  const std::vector<uint8_t> rgb = smooth_rgb(w, h);
  data::write_jpeg(dir.file("a.jpg"), rgb.data(), w, h, PixelFormat::kRgb, 95);
  const data::ImageHeader header = data::read_image_header(dir.file("a.jpg"));
  EXPECT_EQ(header.width, w);
  EXPECT_EQ(header.height, h);
  EXPECT_STREQ(header.codec, "JPEG");
  const Image back = data::read_image(dir.file("a.jpg"), PixelFormat::kRgb);
  ASSERT_EQ(back.width, w);
  ASSERT_EQ(back.height, h);
  ASSERT_EQ(back.channels, 3);
  double diff = 0;
  for (size_t i = 0; i < rgb.size(); ++i) diff += std::abs(int(back.pixels[i]) - int(rgb[i]));
  EXPECT_LT(diff / double(rgb.size()), 3.0);
  EXPECT_EQ(data::read_image(dir.file("a.jpg"), PixelFormat::kGray).channels, 1);

  // A grayscale JPEG read as RGB: three equal channels.
  std::vector<uint8_t> gray(static_cast<size_t>(w) * h);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = uint8_t(i % 200);
  data::write_jpeg(dir.file("g.jpg"), gray.data(), w, h, PixelFormat::kGray, 90);
  const Image g = data::read_image(dir.file("g.jpg"), PixelFormat::kRgb);
  for (size_t i = 0; i < gray.size(); ++i) {
    ASSERT_EQ(g.pixels[i * 3], g.pixels[i * 3 + 1]);
    ASSERT_EQ(g.pixels[i * 3], g.pixels[i * 3 + 2]);
  }
}

// PngEffort::kFast (dppredict's masks) is as exact as the default, and is a different encoding:
// the flag reaches libpng.
TEST(ImageIo, FastPngIsExactAndADifferentEncoding) {
  test::TempDir dir;
  const int w = 320, h = 240;
  std::vector<uint8_t> mask(static_cast<size_t>(w) * h, 0);
  for (int x = 0; x < w; ++x) {  // two crack-like lines, 3 px wide
    for (int t = -1; t <= 1; ++t) {
      mask[size_t((h / 3 + x / 4 + t) * w + x)] = 255;
      mask[size_t((2 * h / 3 - x / 5 + t) * w + x)] = 255;
    }
  }
  const auto slow = data::encode_png(mask.data(), w, h, 1);
  const auto fast = data::encode_png(mask.data(), w, h, 1, data::PngEffort::kFast);
  EXPECT_NE(slow, fast);
  for (const auto* bytes : {&slow, &fast}) {
    const std::string path = dir.file(bytes == &fast ? "fast.png" : "slow.png");
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes->data()), std::streamsize(bytes->size()));
    EXPECT_EQ(data::read_image(path, PixelFormat::kGray).pixels, mask) << path;
  }
}

TEST(ImageIo, PngIsExactAndGrayRgba16BitAreConverted) {
  test::TempDir dir;
  const int w = 5, h = 3;
  const std::vector<uint8_t> rgb = smooth_rgb(w, h);
  data::write_png(dir.file("rgb.png"), rgb.data(), w, h, 3);
  EXPECT_EQ(data::read_image(dir.file("rgb.png"), PixelFormat::kRgb).pixels, rgb);
  EXPECT_STREQ(data::read_image_header(dir.file("rgb.png")).codec, "PNG");

  std::vector<uint8_t> gray(w * h);
  for (int i = 0; i < w * h; ++i) gray[i] = uint8_t(17 * i);
  data::write_png(dir.file("gray.png"), gray.data(), w, h, 1);
  const Image g = data::read_image(dir.file("gray.png"), PixelFormat::kRgb);
  for (int i = 0; i < w * h; ++i) {
    EXPECT_EQ(g.pixels[i * 3], gray[i]);
    EXPECT_EQ(g.pixels[i * 3 + 2], gray[i]);
  }
  EXPECT_EQ(data::read_image(dir.file("gray.png"), PixelFormat::kGray).pixels, gray);

  // RGBA: an opaque alpha channel is dropped; a transparent pixel is refused.
  std::vector<uint8_t> rgba(static_cast<size_t>(w) * h * 4);
  for (int i = 0; i < w * h; ++i) {
    std::copy_n(&rgb[i * 3], 3, &rgba[i * 4]);
    rgba[i * 4 + 3] = 255;
  }
  data::write_png(dir.file("opaque.png"), rgba.data(), w, h, 4);
  EXPECT_EQ(data::read_image(dir.file("opaque.png"), PixelFormat::kRgb).pixels, rgb);
  rgba[(1 * w + 2) * 4 + 3] = 10;
  data::write_png(dir.file("clear.png"), rgba.data(), w, h, 4);
  const std::string msg =
      error_of([&] { data::read_image(dir.file("clear.png"), PixelFormat::kRgb); });
  EXPECT_TRUE(contains(msg, "clear.png") && contains(msg, "transparent") &&
              contains(msg, "x 2, y 1"))
      << msg;

  // 16-bit: the extremes map to 0 and 255 (what a 16-bit mask holds).
  std::vector<uint16_t> deep(w * h);
  for (int i = 0; i < w * h; ++i) deep[i] = i % 3 ? 65535 : 0;
  data::write_png16(dir.file("deep.png"), deep.data(), w, h, 1);
  const Image d = data::read_image(dir.file("deep.png"), PixelFormat::kGray);
  for (int i = 0; i < w * h; ++i) EXPECT_EQ(d.pixels[i], i % 3 ? 255 : 0) << i;
}

TEST(ImageIo, BadFilesNameTheFileAndTheProblem) {
  test::TempDir dir;
  const int w = 32, h = 32;
  const std::vector<uint8_t> rgb = smooth_rgb(w, h);
  auto read = [&](const std::string& name) {
    return error_of([&] { data::read_image(dir.file(name), PixelFormat::kRgb); });
  };
  std::ofstream(dir.file("text.jpg")) << "GIF89a is not what this is";
  std::string msg = read("text.jpg");
  EXPECT_TRUE(contains(msg, dir.file("text.jpg")) && contains(msg, "neither JPEG nor PNG") &&
              contains(msg, "47 49 46 38"))
      << msg;
  std::ofstream(dir.file("empty.png")).flush();
  EXPECT_TRUE(contains(read("empty.png"), "is empty")) << read("empty.png");
  msg = read("absent.jpg");
  EXPECT_TRUE(contains(msg, "absent.jpg") && contains(msg, "No such file")) << msg;
  fs::create_directory(dir.file("folder.png"));
  EXPECT_TRUE(contains(read("folder.png"), "not a regular file")) << read("folder.png");

  // A noisy image, so the entropy-coded data is most of the file and a cut leaves the header.
  const int big = 128;
  std::vector<uint8_t> noisy(big * big * 3);
  for (size_t i = 0; i < noisy.size(); ++i) noisy[i] = uint8_t((i * 2654435761u) >> 13);
  data::write_jpeg(dir.file("cut.jpg"), noisy.data(), big, big, PixelFormat::kRgb, 90);
  truncate_file(dir.file("cut.jpg"), 0.6);
  EXPECT_NO_THROW(data::read_image_header(dir.file("cut.jpg")));  // the header is intact
  msg = read("cut.jpg");
  EXPECT_TRUE(contains(msg, "corrupt or truncated JPEG") && contains(msg, "cut.jpg") &&
              contains(msg, "Premature end"))
      << msg;

  data::write_jpeg(dir.file("noise.jpg"), noisy.data(), big, big, PixelFormat::kRgb, 90);
  {  // scramble the entropy-coded data after the headers
    std::fstream f(dir.file("noise.jpg"), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(dir.file("noise.jpg")));
    for (std::streamoff at = size / 2; at < size - 8; at += 3) {
      f.seekp(at);
      f.put(static_cast<char>(0xFF));
    }
  }
  msg = read("noise.jpg");
  EXPECT_TRUE(contains(msg, "noise.jpg") && contains(msg, "JPEG")) << msg;

  data::write_png(dir.file("cut.png"), rgb.data(), w, h, 3);
  truncate_file(dir.file("cut.png"), 0.5);
  msg = read("cut.png");
  EXPECT_TRUE(contains(msg, "cut.png") && contains(msg, "PNG")) << msg;
  std::vector<uint8_t> header_only(8);
  std::ifstream(dir.file("cut.png"), std::ios::binary)
      .read(reinterpret_cast<char*>(header_only.data()), 8);
  std::ofstream(dir.file("sig.png"), std::ios::binary)
      .write(reinterpret_cast<const char*>(header_only.data()), 8);
  EXPECT_TRUE(contains(read("sig.png"), "corrupt PNG")) << read("sig.png");
}

TEST(ImageIo, ExtensionsAndResizing) {
  EXPECT_TRUE(data::has_image_extension("a.jpg"));
  EXPECT_TRUE(data::has_image_extension("a.JPG"));
  EXPECT_TRUE(data::has_image_extension("a.b.jpeg"));
  EXPECT_TRUE(data::has_image_extension("a.png"));
  EXPECT_FALSE(data::has_image_extension("a.gif"));
  EXPECT_FALSE(data::has_image_extension("jpg"));
  EXPECT_FALSE(data::has_image_extension("a.txt"));

  // Bilinear with centres aligned: 2 -> 4 px gives 0, 25, 75, 100 (PyTorch align_corners=False).
  const Image row{2, 1, 1, {0, 100}};
  EXPECT_EQ(data::resize_bilinear(row, 4, 1).pixels, (std::vector<uint8_t>{0, 25, 75, 100}));
  // Down by 2: the mean of each pair of columns.
  const Image four{4, 1, 1, {0, 100, 200, 50}};
  EXPECT_EQ(data::resize_bilinear(four, 2, 1).pixels, (std::vector<uint8_t>{50, 125}));
  // Nearest keeps exactly the source values: 4 -> 2 picks columns 1 and 3; 2 -> 4 repeats.
  EXPECT_EQ(data::resize_nearest(four, 2, 1).pixels, (std::vector<uint8_t>{100, 50}));
  EXPECT_EQ(data::resize_nearest(row, 4, 1).pixels, (std::vector<uint8_t>{0, 0, 100, 100}));
  // A constant image stays constant; channels are kept apart.
  const Image flat{3, 5, 3, std::vector<uint8_t>(45, 0)};
  Image flat2 = flat;
  for (size_t i = 0; i < flat2.pixels.size(); ++i) flat2.pixels[i] = uint8_t(10 + 50 * (i % 3));
  const Image big = data::resize_bilinear(flat2, 7, 2);
  ASSERT_EQ(big.pixels.size(), 7u * 2 * 3);
  for (size_t i = 0; i < big.pixels.size(); ++i) EXPECT_EQ(big.pixels[i], 10 + 50 * (i % 3));
  EXPECT_THROW(data::resize_nearest(flat, 0, 3), Error);
}

// ---------------------------------------------------------------------------------------------
// dpprep build

// Decoded content of every pair: stem -> (RGB image, mask > threshold as 0/1).
struct Decoded {
  std::vector<uint8_t> image, mask;
};
std::map<std::string, Decoded> decode_pairs(const test::TempDir& dir, int threshold = 127) {
  std::map<std::string, Decoded> pairs;
  for (const auto& e : fs::directory_iterator(dir.file("images"))) {
    const std::string stem = e.path().stem().string();
    Decoded d;
    d.image = data::read_image(e.path().string(), PixelFormat::kRgb).pixels;
    for (const auto& m : fs::directory_iterator(dir.file("masks"))) {
      if (m.path().stem() != stem) continue;
      d.mask = data::read_image(m.path().string(), PixelFormat::kGray).pixels;
    }
    for (uint8_t& v : d.mask) v = v > threshold ? 1 : 0;
    pairs[stem] = d;
  }
  return pairs;
}

// Stems of the samples of one split, identified by their exact decoded content.
std::vector<std::string> split_stems(const std::string& path, const std::string& split,
                                     const std::map<std::string, Decoded>& pairs) {
  data::Dataset d(path, split);
  const size_t pixels = size_t(d.height()) * d.width();
  std::vector<uint8_t> image(pixels * 3), mask(pixels);
  std::vector<std::string> stems;
  for (int64_t i = 0; i < d.size(); ++i) {
    d.read(i, image.data(), mask.data());
    std::string found;
    for (const auto& [stem, p] : pairs) {
      if (p.image == image && p.mask == mask) found = stem;
    }
    EXPECT_FALSE(found.empty()) << split << " sample " << i << " matches no pair";
    stems.push_back(found);
  }
  return stems;
}

// 20 image/mask pairs of 40x32 (WxH), img000 .. img019, 6 of them without cracks.
void write_twenty_pairs(const test::TempDir& dir) {
  test::PairFolderOptions o;
  o.count = 20;
  o.negatives = 6;
  o.width = 40;
  o.height = 32;
  test::write_pairs(dir.path(), o);
}

TEST(Build, PairsByStemSplitsStratifiedAndWritesStatistics) {
  test::TempDir dir;
  write_twenty_pairs(dir);
  // Extensions in other letter cases and spellings pair by stem all the same.
  fs::rename(dir.file("images/img000.jpg"), dir.file("images/img000.JPG"));
  fs::rename(dir.file("images/img001.jpg"), dir.file("images/img001.jpeg"));
  BuildOptions b = build_options(dir);
  b.val_fraction = 0.25;
  b.seed = 3;
  const data::BuildReport r = data::build_dataset(b);
  // Stratified: round(0.25 * 14) = 4 of the masks with cracks, round(0.25 * 6) = 2 without.
  EXPECT_EQ(r.train, 14);
  EXPECT_EQ(r.val, 6);
  EXPECT_EQ(r.train_with_cracks, 10);
  EXPECT_EQ(r.val_with_cracks, 4);
  EXPECT_EQ(r.width, 40);
  EXPECT_EQ(r.height, 32);
  EXPECT_EQ(leftovers(dir), std::vector<std::string>{"out.h5"});

  const auto pairs = decode_pairs(dir);
  const auto train = split_stems(b.out, "train", pairs);
  const auto val = split_stems(b.out, "val", pairs);
  std::set<std::string> all(train.begin(), train.end());
  all.insert(val.begin(), val.end());
  EXPECT_EQ(all.size(), 20u);                               // every pair exactly once
  EXPECT_TRUE(std::is_sorted(train.begin(), train.end()));  // stem order within a split

  // pos_weight and the per-channel statistics over the training split.
  data::Dataset d(b.out, "train");
  EXPECT_EQ(d.height(), 32);
  EXPECT_EQ(d.width(), 40);
  double crack = 0, sum[3] = {}, sq[3] = {};
  for (const auto& stem : train) {
    const Decoded& p = pairs.at(stem);
    for (uint8_t m : p.mask) crack += m;
    for (size_t i = 0; i < p.image.size(); ++i) {
      sum[i % 3] += p.image[i];
      sq[i % 3] += double(p.image[i]) * p.image[i];
    }
  }
  const double pixels = 14.0 * 32 * 40;
  EXPECT_NEAR(d.pos_weight(), (pixels - crack) / crack, 1e-4 * d.pos_weight());
  EXPECT_NEAR(r.pos_weight, d.pos_weight(), 1e-4 * d.pos_weight());
  ASSERT_TRUE(d.has_stats());
  for (int c = 0; c < 3; ++c) {
    const double mean = sum[c] / pixels;
    EXPECT_NEAR(d.mean()[c], mean / 255, 1e-6);
    EXPECT_NEAR(d.std()[c], std::sqrt(sq[c] / pixels - mean * mean) / 255, 1e-6);
  }

  // The split is a function of the seed.
  b.out = dir.file("again.h5");
  data::build_dataset(b);
  EXPECT_EQ(split_stems(b.out, "val", pairs), val);
  b.out = dir.file("other.h5");
  b.seed = 4;
  data::build_dataset(b);
  EXPECT_NE(split_stems(b.out, "val", pairs), val);
}

TEST(Build, GroupByKeepsEachPhotographsCropsOnOneSide) {
  test::TempDir dir;
  write_twenty_pairs(dir);
  // Crops of five photographs, named as DeepCrack names them: photoK-1 .. photoK-4.
  std::map<std::string, std::string> photo_of;
  for (const auto& e : fs::directory_iterator(dir.file("images"))) {
    const std::string stem = e.path().stem().string();
    const int i = std::stoi(stem.substr(3));
    const std::string renamed = "photo" + std::to_string(i / 4) + "-" + std::to_string(i % 4 + 1);
    photo_of[renamed] = "photo" + std::to_string(i / 4);
    fs::rename(e.path(), dir.file("images/" + renamed + e.path().extension().string()));
    fs::rename(dir.file("masks/" + stem + ".png"), dir.file("masks/" + renamed + ".png"));
  }
  BuildOptions b = build_options(dir);
  b.val_fraction = 0.25;
  const auto pairs = decode_pairs(dir);
  const auto photos_of = [&](const std::vector<std::string>& stems) {
    std::set<std::string> photos;
    for (const auto& s : stems) photos.insert(photo_of.at(s));
    return photos;
  };
  // Without a group, some seed puts crops of one photograph on both sides.
  bool some_photo_split = false;
  for (b.seed = 1; b.seed <= 4; ++b.seed) {
    data::build_dataset(b);
    const auto train = photos_of(split_stems(b.out, "train", pairs));
    for (const auto& p : photos_of(split_stems(b.out, "val", pairs))) {
      some_photo_split = some_photo_split || train.count(p) > 0;
    }
  }
  EXPECT_TRUE(some_photo_split);
  // With --group-by, never: every photograph is whole in one split, and both splits are used.
  b.group_by = "^[^-]+";
  for (b.seed = 1; b.seed <= 4; ++b.seed) {
    const data::BuildReport r = data::build_dataset(b);
    const auto train_stems = split_stems(b.out, "train", pairs);
    const auto val_stems = split_stems(b.out, "val", pairs);
    const auto train = photos_of(train_stems), val = photos_of(val_stems);
    for (const auto& p : val) EXPECT_EQ(train.count(p), 0u) << p << " seed " << b.seed;
    EXPECT_EQ(r.train + r.val, 20);
    EXPECT_EQ(r.val % 4, 0) << "whole photographs of 4 crops";
    EXPECT_GE(r.val, 4);
    EXPECT_EQ(train_stems.size() + val_stems.size(), 20u);
    EXPECT_EQ(h5::File(b.out, h5::Mode::kRead).attr_string("split_group_by"), "^[^-]+");
  }
  // A pattern that is not a regular expression, or one beside explicit folders, is an error.
  b.group_by = "([";
  EXPECT_THROW(
      {
        try {
          data::build_dataset(b);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("'([' is not a regular expression"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  b.group_by = "^[^-]+";
  b.val_images = b.images;
  b.val_masks = b.masks;
  EXPECT_THROW(data::build_dataset(b), Error);
}

TEST(Build, JpegMasksAreBinarisedAtTheThreshold) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 4;
  o.jpeg_masks = true;
  o.jpeg_quality = 75;  // visible ringing around the cracks
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  data::build_dataset(b);
  EXPECT_FALSE(data::Dataset::has_split(b.out, "val"));
  // The decoded masks are not just 0 and 255 (so the threshold matters).
  const Image noisy = data::read_image(dir.file("masks/img000.jpg"), PixelFormat::kGray);
  EXPECT_TRUE(std::any_of(noisy.pixels.begin(), noisy.pixels.end(),
                          [](uint8_t v) { return v > 10 && v < 245; }));
  // Stored masks are the decoded ones > threshold (split_stems matches them exactly).
  const auto at127 = split_stems(b.out, "train", decode_pairs(dir, 127));
  EXPECT_EQ(at127.size(), 4u);
  b.mask_threshold = 250;
  b.out = dir.file("high.h5");
  data::build_dataset(b);
  EXPECT_EQ(split_stems(b.out, "train", decode_pairs(dir, 250)), at127);
  EXPECT_GT(data::Dataset(b.out, "train").pos_weight(),
            data::Dataset(dir.file("out.h5"), "train").pos_weight());
}

TEST(Build, UnpairedFilesAreListedOrSkippedAndOthersIgnored) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 5;
  test::write_pairs(dir.path(), o);
  fs::copy_file(dir.file("images/img000.jpg"), dir.file("images/lonely.jpg"));
  fs::copy_file(dir.file("masks/img000.png"), dir.file("masks/orphan.png"));
  std::ofstream(dir.file("images/notes.txt")) << "not an image";
  fs::copy_file(dir.file("images/img001.jpg"), dir.file("images/._img001.jpg"));  // macOS
  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  std::string msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "1 image(s) in '" + b.images + "' have no mask") &&
              contains(msg, "lonely.jpg") && contains(msg, "1 mask(s)") &&
              contains(msg, "orphan.png") && contains(msg, "--skip-unpaired"))
      << msg;
  EXPECT_TRUE(leftovers(dir).empty());

  b.skip_unpaired = true;
  const data::BuildReport r = data::build_dataset(b);
  EXPECT_EQ(r.train, 5);
  EXPECT_EQ(r.skipped_images, 1);
  EXPECT_EQ(r.skipped_masks, 1);
  EXPECT_EQ(r.ignored_files, 2);

  // Many offenders: the first few are named.
  for (int i = 0; i < 7; ++i)
    fs::copy_file(dir.file("images/img000.jpg"),
                  dir.file("images/extra" + std::to_string(i) + ".jpg"));
  b.skip_unpaired = false;
  msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "8 image(s)") && contains(msg, "extra0.jpg") && contains(msg, ", ..."))
      << msg;
  // Two files with one stem are ambiguous.
  fs::copy_file(dir.file("masks/img002.png"), dir.file("masks/img002.jpg"));
  msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "stem 'img002'")) << msg;
}

TEST(Build, SizesMustAgreeUnlessResized) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 3;
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  // A mask of another size than its image.
  std::vector<uint8_t> small(64 * 32, 255);
  data::write_png(dir.file("masks/img001.png"), small.data(), 64, 32, 1);
  std::string msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "image '" + dir.file("images/img001.jpg") + "' is 64x64") &&
              contains(msg, "mask '" + dir.file("masks/img001.png") + "' is 64x32"))
      << msg;
  b.resize_width = 32;
  b.resize_height = 32;
  EXPECT_THROW(data::build_dataset(b), Error);  // resizing does not excuse a mismatched pair

  // Pairs of different sizes: an error without --resize, resized (image bilinear, mask nearest)
  // with it.
  test::TempDir mixed;
  o.count = 2;
  test::write_pairs(mixed.path(), o);
  o.prefix = "big";
  o.width = 96;
  o.height = 80;
  test::write_pairs(mixed.path(), o);
  BuildOptions m = build_options(mixed);
  m.val_fraction = 0;
  msg = error_of([&] { data::build_dataset(m); });
  EXPECT_TRUE(contains(msg, "differ in size") && contains(msg, "96x80") && contains(msg, "64x64") &&
              contains(msg, "--resize"))
      << msg;
  m.resize_width = 48;
  m.resize_height = 32;
  const data::BuildReport r = data::build_dataset(m);
  EXPECT_TRUE(r.resized);
  EXPECT_EQ(r.train, 4);
  data::Dataset d(m.out, "train");
  EXPECT_EQ(d.width(), 48);
  EXPECT_EQ(d.height(), 32);
  std::vector<uint8_t> image(48 * 32 * 3), mask(48 * 32);
  d.read(0, image.data(), mask.data());  // checks the mask values are 0/1
  // The stored big001 is the resize of its decoded image and mask.
  const Image big = data::read_image(mixed.file("images/big001.jpg"), PixelFormat::kRgb);
  Image big_mask = data::read_image(mixed.file("masks/big001.png"), PixelFormat::kGray);
  d.read(1, image.data(), mask.data());
  EXPECT_EQ(image, data::resize_bilinear(big, 48, 32).pixels);
  big_mask = data::resize_nearest(big_mask, 48, 32);
  for (uint8_t& v : big_mask.pixels) v = v > 127 ? 1 : 0;
  EXPECT_EQ(mask, big_mask.pixels);
  // Photographs of two sizes have no one scale: none recorded, nor masks at their sizes.
  EXPECT_FALSE(r.scale.known());
  EXPECT_FALSE(d.scale().known());
  EXPECT_FALSE(d.has_native_masks());
}

// The samples' pixels per photograph pixel, recorded for dptrain's checkpoints and dppredict: the
// resize's where the photographs share a size, 1 where they are kept as they are.
TEST(Build, RecordsTheScaleOfItsSamples) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 3;
  o.width = 96;
  o.height = 80;
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  const data::BuildReport kept = data::build_dataset(b);
  EXPECT_EQ(kept.scale, (data::PixelScale{1, 1}));
  EXPECT_EQ(data::Dataset(b.out, "train").scale(), (data::PixelScale{1, 1}));
  b.resize_width = 48;
  b.resize_height = 60;
  b.out = dir.file("resized.h5");
  const data::BuildReport resized = data::build_dataset(b);
  EXPECT_EQ(resized.scale, (data::PixelScale{0.75, 0.5}));
  EXPECT_EQ(data::Dataset(b.out, "train").scale(), (data::PixelScale{0.75, 0.5}));
}

// Resized from photographs of one size, the validation split also keeps each mask at its
// photograph's size (binarised as the resized ones), for dptrain to score as dppredict does; the
// training split, and a split kept at its size, do not.
TEST(Build, ResizedValidationKeepsThePhotographsMasks) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 3;
  o.width = 96;
  o.height = 80;
  test::write_pairs(dir.path(), o);
  o.prefix = "val";
  o.count = 2;
  o.jpeg_masks = true;  // grey levels around the threshold
  test::write_pairs(dir.file("v"), o);
  BuildOptions b = build_options(dir);
  b.val_images = dir.file("v/images");
  b.val_masks = dir.file("v/masks");
  b.resize_width = 48;
  b.resize_height = 60;
  data::build_dataset(b);
  const data::Dataset val(b.out, "val");
  ASSERT_TRUE(val.has_native_masks());
  EXPECT_EQ(val.native_height(), 80);
  EXPECT_EQ(val.native_width(), 96);
  const std::vector<data::SampleSource> sources = val.read_sources();
  ASSERT_EQ(sources.size(), 2u);
  std::vector<uint8_t> native(80 * 96);
  for (int64_t i = 0; i < 2; ++i) {
    const std::string stem = fs::path(sources[size_t(i)].name).stem().string();
    Image want = data::read_image(dir.file("v/masks/" + stem + ".jpg"), PixelFormat::kGray);
    for (uint8_t& v : want.pixels) v = v > 127 ? 1 : 0;
    val.read_native_mask(i, native.data());
    EXPECT_EQ(native, want.pixels) << stem;
  }
  EXPECT_FALSE(data::Dataset(b.out, "train").has_native_masks());

  b.resize_width = b.resize_height = 0;
  b.out = dir.file("kept.h5");
  data::build_dataset(b);
  EXPECT_FALSE(data::Dataset(b.out, "val").has_native_masks());
}

TEST(Build, EmptySplitsAndEmptyFoldersAreErrors) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 3;
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0.1;  // rounds to 0 of 3
  std::string msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "validation split would be empty")) << msg;
  b.val_fraction = 0.9;  // rounds to all 3
  msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "training split would be empty")) << msg;
  EXPECT_TRUE(leftovers(dir).empty());

  test::TempDir empty;
  fs::create_directories(empty.file("images"));
  fs::create_directories(empty.file("masks"));
  msg = error_of([&] { data::build_dataset(build_options(empty)); });
  EXPECT_TRUE(contains(msg, "no image/mask pairs")) << msg;
  BuildOptions missing = build_options(empty);
  missing.masks = empty.file("nowhere");
  msg = error_of([&] { data::build_dataset(missing); });
  EXPECT_TRUE(contains(msg, "mask folder '" + missing.masks + "' does not exist")) << msg;
  missing = build_options(dir);
  missing.out = empty.file("no/such/dir/out.h5");
  msg = error_of([&] { data::build_dataset(missing); });
  EXPECT_TRUE(contains(msg, "does not exist") && contains(msg, "no/such/dir")) << msg;
}

TEST(Build, ExplicitValidationFolders) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 4;
  test::write_pairs(dir.file("t"), o);
  o.count = 2;
  o.prefix = "v";
  test::write_pairs(dir.file("v"), o);
  BuildOptions b = build_options(dir, "t/");
  b.val_images = dir.file("v/images");
  b.val_masks = dir.file("v/masks");
  const data::BuildReport r = data::build_dataset(b);
  EXPECT_EQ(r.train, 4);
  EXPECT_EQ(r.val, 2);
  EXPECT_EQ(data::Dataset(b.out, "val").size(), 2);
}

TEST(Build, ConvertsGrayRgbaAnd16BitButRefusesTransparency) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 3;
  o.width = o.height = 32;
  test::write_pairs(dir.path(), o);
  const Image rgb = data::read_image(dir.file("images/img001.jpg"), PixelFormat::kRgb);
  fs::remove(dir.file("images/img000.jpg"));
  std::vector<uint8_t> gray(32 * 32);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = uint8_t(i * 7);
  data::write_png(dir.file("images/img000.png"), gray.data(), 32, 32, 1);
  fs::remove(dir.file("images/img001.jpg"));
  std::vector<uint8_t> rgba(32 * 32 * 4, 255);
  for (size_t i = 0; i < gray.size(); ++i) std::copy_n(&rgb.pixels[i * 3], 3, &rgba[i * 4]);
  data::write_png(dir.file("images/img001.png"), rgba.data(), 32, 32, 4);
  const Image mask2 = data::read_image(dir.file("masks/img002.png"), PixelFormat::kGray);
  std::vector<uint16_t> deep(mask2.pixels.begin(), mask2.pixels.end());
  for (uint16_t& v : deep) v = v ? 65535 : 0;
  data::write_png16(dir.file("masks/img002.png"), deep.data(), 32, 32, 1);

  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  data::build_dataset(b);
  data::Dataset d(b.out, "train");
  std::vector<uint8_t> image(32 * 32 * 3), mask(32 * 32);
  d.read(0, image.data(), mask.data());
  for (size_t i = 0; i < gray.size(); ++i) {
    ASSERT_EQ(image[i * 3], gray[i]);
    ASSERT_EQ(image[i * 3 + 1], gray[i]);
  }
  d.read(1, image.data(), mask.data());
  EXPECT_EQ(image, rgb.pixels);
  d.read(2, image.data(), mask.data());
  for (size_t i = 0; i < mask.size(); ++i) ASSERT_EQ(mask[i], mask2.pixels[i] > 127 ? 1 : 0);

  rgba[3] = 0;  // one transparent pixel
  data::write_png(dir.file("images/img001.png"), rgba.data(), 32, 32, 4);
  const std::string msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, "img001.png") && contains(msg, "transparent")) << msg;
}

TEST(Build, AFailureLeavesNoFileAndKeepsTheOldOne) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 4;
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  data::build_dataset(b);
  const auto size = fs::file_size(b.out);
  const auto mtime = fs::last_write_time(b.out);
  // Truncated after the header: found only while writing, after the temporary file exists.
  truncate_file(dir.file("images/img002.jpg"), 0.5);
  const std::string msg = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(msg, dir.file("images/img002.jpg")) && contains(msg, "truncated")) << msg;
  EXPECT_EQ(leftovers(dir), std::vector<std::string>{"out.h5"});  // no temporary left
  EXPECT_EQ(fs::file_size(b.out), size);
  EXPECT_EQ(fs::last_write_time(b.out), mtime);

  // A progress callback that throws (dpprep's interrupt) stops the build the same way.
  fs::remove(b.out);
  test::write_pairs(dir.path(), o);
  int64_t calls = 0;
  EXPECT_THROW(data::build_dataset(b,
                                   [&](const char* phase, int64_t done, int64_t total) {
                                     ++calls;
                                     if (std::string(phase) == "writing" && done == 2)
                                       throw Error("interrupted");
                                   }),
               Error);
  EXPECT_EQ(calls, 4 + 2);  // reading masks 4, writing 2
  EXPECT_TRUE(leftovers(dir).empty());
}

// Every bad file is listed, one a line, up to 20 and then how many more; a size difference
// between images is one problem however many differ.
TEST(Build, EveryBadFileIsListedUpToALimit) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 25;
  o.width = o.height = 32;
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0;
  for (int i = 0; i < o.count; ++i)
    std::ofstream(dir.file("masks/" + test::pair_stem(o, i) + ".png")).flush();
  std::string msg = error_of([&] { data::build_dataset(b); });
  std::vector<std::string> lines;
  for (size_t at = 0; at <= msg.size();) {
    const size_t end = std::min(msg.find('\n', at), msg.size());
    lines.push_back(msg.substr(at, end - at));
    at = end + 1;
  }
  ASSERT_EQ(lines.size(), 22u) << msg;
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(contains(lines[i], dir.file("masks/" + test::pair_stem(o, i) + ".png")) &&
                contains(lines[i], "is empty"))
        << lines[i];
  }
  EXPECT_EQ(lines[20], "... and 5 more");
  EXPECT_EQ(lines[21], "25 problems with the input files; nothing was written");
  EXPECT_TRUE(leftovers(dir).empty());

  // Images of two sizes and one empty mask: two problems.
  test::TempDir mixed;
  o.count = 3;
  test::write_pairs(mixed.path(), o);
  o.prefix = "big";
  o.width = 64;
  test::write_pairs(mixed.path(), o);
  std::ofstream(mixed.file("masks/img001.png")).flush();
  BuildOptions m = build_options(mixed);
  m.val_fraction = 0;
  msg = error_of([&] { data::build_dataset(m); });
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 2) << msg;
  EXPECT_EQ(contains(msg, "differ in size") + contains(msg, "is empty"), 2) << msg;
  EXPECT_TRUE(contains(msg, "2 problems with the input files")) << msg;
  EXPECT_TRUE(leftovers(mixed).empty());
}

// ---------------------------------------------------------------------------------------------
// dpprep info

TEST(Info, DescribesSplitsChunksAndCracks) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 10;
  o.negatives = 2;
  o.width = o.height = 32;
  test::write_pairs(dir.path(), o);
  BuildOptions b = build_options(dir);
  b.val_fraction = 0.2;
  b.gzip_level = 4;
  const data::BuildReport r = data::build_dataset(b);
  const data::DatasetInfo info = data::inspect_dataset(b.out);
  EXPECT_EQ(info.format, "dp-crack-v1");
  EXPECT_NEAR(info.pos_weight, r.pos_weight, 1e-3);
  EXPECT_TRUE(info.has_stats);
  ASSERT_EQ(info.splits.size(), 2u);
  const data::SplitInfo& t = info.splits[0];
  EXPECT_EQ(t.name, "train");
  EXPECT_EQ(t.count, r.train);
  EXPECT_EQ(t.with_cracks, r.train_with_cracks);
  EXPECT_EQ(info.splits[1].with_cracks, r.val_with_cracks);
  EXPECT_EQ(t.image_chunk, (std::vector<int64_t>{1, 32, 32, 3}));
  EXPECT_EQ(t.mask_chunk, (std::vector<int64_t>{1, 32, 32}));
  EXPECT_EQ(t.gzip_level, 4);
  EXPECT_EQ(t.pixels, r.train * 32 * 32);
  EXPECT_NEAR(double(t.pixels - t.crack_pixels) / double(t.crack_pixels), r.pos_weight,
              1e-4 * r.pos_weight);
  std::map<std::string, std::string> attrs(info.attributes.begin(), info.attributes.end());
  EXPECT_EQ(attrs["mask_threshold"], "127");
  EXPECT_EQ(attrs["source_images"], fs::absolute(b.images).string());
}

TEST(Info, RejectsFilesThatAreNotValidDatasets) {
  test::TempDir dir;
  std::ofstream(dir.file("text.h5")) << "plain text";
  std::string msg = error_of([&] { data::inspect_dataset(dir.file("text.h5")); });
  EXPECT_TRUE(contains(msg, "not an HDF5 file") && contains(msg, dir.file("text.h5"))) << msg;

  test::RawDataset raw;
  raw.masks = false;
  test::write_raw_dataset(dir.file("nomasks.h5"), raw);
  msg = error_of([&] { data::inspect_dataset(dir.file("nomasks.h5")); });
  EXPECT_TRUE(contains(msg, "/train/masks") && contains(msg, "not found")) << msg;

  raw = {};
  raw.bad_mask_sample = 2;
  raw.mask_value = 7;
  test::write_raw_dataset(dir.file("values.h5"), raw);
  msg = error_of([&] { data::inspect_dataset(dir.file("values.h5")); });
  EXPECT_TRUE(contains(msg, "sample 2") && contains(msg, "value 7")) << msg;

  raw = {};
  raw.val_shape = {2, 32, 32};
  raw.val_masks = false;  // a broken validation split is an error, not ignored
  test::write_raw_dataset(dir.file("noval.h5"), raw);
  msg = error_of([&] { data::inspect_dataset(dir.file("noval.h5")); });
  EXPECT_TRUE(contains(msg, "/val/masks") && contains(msg, "not found")) << msg;
  raw.val_masks = true;
  raw.val_shape = {2, 64, 32};
  test::write_raw_dataset(dir.file("valsize.h5"), raw);
  msg = error_of([&] { data::inspect_dataset(dir.file("valsize.h5")); });
  EXPECT_TRUE(contains(msg, "split 'val' has images of 64x32")) << msg;

  raw = {};
  raw.image_shape = {0, 32, 32, 3};
  raw.mask_shape = {0, 32, 32};
  test::write_raw_dataset(dir.file("empty.h5"), raw);
  msg = error_of([&] { data::inspect_dataset(dir.file("empty.h5")); });
  EXPECT_TRUE(contains(msg, "split 'train' is empty")) << msg;
}

}  // namespace
}  // namespace dp
