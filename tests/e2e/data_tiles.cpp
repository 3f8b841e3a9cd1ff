// Data as it comes: dpprep build --tile/--pad-to on mixed sizes, stored sources, crops.
#include <gtest/gtest.h>
#include <tiffio.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/image_io.hpp"
#include "dp/loader.hpp"
#include "dp/prepare.hpp"
#include "dp/rng.hpp"
#include "prep_util.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

using dp::test::contains;
using dp::test::error_of;

namespace fs = std::filesystem;
using data::BuildOptions;
using data::Dataset;
using data::Image;
using data::Loader;
using data::LoaderOptions;
using data::PixelFormat;

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A folder of pairs of three sizes (HxW): two 64x96 "wide", one 128x64 "tall", one 96x96 "sq".
void write_mixed(const std::string& dir) {
  test::PairFolderOptions o;
  o.count = 2;
  o.height = 64;
  o.width = 96;
  o.prefix = "wide";
  test::write_pairs(dir, o);
  o.count = 1;
  o.height = 128;
  o.width = 64;
  o.prefix = "tall";
  test::write_pairs(dir, o);
  o.height = o.width = 96;
  o.prefix = "sq";
  test::write_pairs(dir, o);
}

BuildOptions options(const test::TempDir& dir) {
  BuildOptions b;
  b.images = dir.file("images");
  b.masks = dir.file("masks");
  b.out = dir.file("out.h5");
  b.val_fraction = 0;
  return b;
}

// ---------------------------------------------------------------------------------------------
// dpprep build --tile / --pad-to

TEST(Tiles, MixedSizesAreCutWithSourcesPositionsAndExactPixels) {
  test::TempDir dir;
  write_mixed(dir.path());
  BuildOptions b = options(dir);
  b.tile_height = b.tile_width = 32;
  b.tile_stride = 24;  // overlapping, with a last tile flush with the far edges
  const data::BuildReport r = data::build_dataset(b);
  // Starts along 64: 0,24 + 32 (flush); along 96: 0,24,48 + 64; along 128: 0,24,48,72 + 96.
  const std::map<std::string, std::vector<int>> rows = {{"wide000.jpg", {0, 24, 32}},
                                                        {"wide001.jpg", {0, 24, 32}},
                                                        {"tall000.jpg", {0, 24, 48, 72, 96}},
                                                        {"sq000.jpg", {0, 24, 48, 64}}};
  const std::map<std::string, std::vector<int>> cols = {{"wide000.jpg", {0, 24, 48, 64}},
                                                        {"wide001.jpg", {0, 24, 48, 64}},
                                                        {"tall000.jpg", {0, 24, 32}},
                                                        {"sq000.jpg", {0, 24, 48, 64}}};
  EXPECT_EQ(r.train, 12 + 12 + 15 + 16);
  EXPECT_EQ(r.val, 0);
  EXPECT_EQ(r.sources, 4);
  EXPECT_TRUE(r.tiled);
  EXPECT_EQ(r.height, 32);
  EXPECT_EQ(r.width, 32);

  const Dataset ds(b.out, "train");
  ASSERT_EQ(ds.size(), r.train);
  const std::vector<data::SampleSource> sources = ds.read_sources();
  ASSERT_EQ(static_cast<int64_t>(sources.size()), ds.size());
  std::map<std::string, std::set<std::pair<int, int>>> seen;
  std::map<std::string, std::pair<Image, Image>> decoded;
  std::vector<uint8_t> image(32 * 32 * 3), mask(32 * 32);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const data::SampleSource& s = sources[static_cast<size_t>(i)];
    seen[s.name].insert({s.y, s.x});
    auto at = decoded.find(s.name);
    if (at == decoded.end()) {
      const std::string stem = fs::path(s.name).stem().string();
      at = decoded
               .emplace(
                   s.name,
                   std::make_pair(
                       data::read_image(dir.file("images/" + s.name), PixelFormat::kRgb),
                       data::read_image(dir.file("masks/" + stem + ".png"), PixelFormat::kGray)))
               .first;
    }
    const Image& src = at->second.first;
    const Image& src_mask = at->second.second;
    ds.read(i, image.data(), mask.data());
    int differ = 0;
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        const size_t p = (static_cast<size_t>(s.y + y) * src.width + s.x + x);
        for (int c = 0; c < 3; ++c) differ += image[(y * 32 + x) * 3 + c] != src.pixels[p * 3 + c];
        differ += mask[y * 32 + x] != (src_mask.pixels[p] > 127 ? 1 : 0);
      }
    }
    EXPECT_EQ(differ, 0) << s.name << " at " << s.y << "," << s.x;
  }
  ASSERT_EQ(seen.size(), 4u);
  for (const auto& [name, positions] : seen) {
    std::set<std::pair<int, int>> expected;
    for (int y : rows.at(name))
      for (int x : cols.at(name)) expected.insert({y, x});
    EXPECT_EQ(positions, expected) << name;
  }
}

TEST(Tiles, MinCrackFractionDropsTilesAndKeepBelowKeepsSome) {
  test::TempDir dir;
  write_mixed(dir.path());
  BuildOptions b = options(dir);
  b.tile_height = b.tile_width = 32;
  const int64_t all = data::build_dataset(b).train;  // 6 + 6 + 8 + 9
  EXPECT_EQ(all, 29);

  b.min_crack_fraction = 0.02;
  const data::BuildReport r = data::build_dataset(b);
  EXPECT_GT(r.tiles_dropped, 0);
  EXPECT_EQ(r.train + r.tiles_dropped, all);
  const Dataset ds(b.out, "train");
  std::vector<uint8_t> image(32 * 32 * 3), mask(32 * 32);
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, image.data(), mask.data());
    int crack = 0;
    for (uint8_t m : mask) crack += m;
    EXPECT_GE(crack, 0.02 * 32 * 32) << "sample " << i;
  }

  b.keep_below = 1;  // every tile below the fraction kept after all
  EXPECT_EQ(data::build_dataset(b).train, all);
  b.keep_below = 0.5;  // some, drawn from the seed: the same on every build
  const data::BuildReport half = data::build_dataset(b);
  EXPECT_GT(half.train, r.train);
  EXPECT_LT(half.train, all);
  EXPECT_EQ(data::build_dataset(b).train, half.train);

  b.min_crack_fraction = 1;  // no tile is all crack
  b.keep_below = 0;
  const std::string e = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(e, "no tile of the training split")) << e;
  EXPECT_TRUE(contains(e, "--min-crack-fraction")) << e;
}

TEST(Tiles, PaddingKeepsPixelsAndPadsWithZerosAndBackground) {
  test::TempDir dir;
  write_mixed(dir.path());
  BuildOptions b = options(dir);
  b.pad_height = 128;
  b.pad_width = 96;
  const data::BuildReport r = data::build_dataset(b);
  EXPECT_EQ(r.train, 4);
  EXPECT_TRUE(r.padded);
  const Dataset ds(b.out, "train");
  const std::vector<data::SampleSource> sources = ds.read_sources();
  ASSERT_EQ(sources.size(), 4u);
  std::vector<uint8_t> image(128 * 96 * 3), mask(128 * 96);
  for (int64_t i = 0; i < 4; ++i) {
    const data::SampleSource& s = sources[static_cast<size_t>(i)];
    EXPECT_EQ(s.y, 0);
    EXPECT_EQ(s.x, 0);
    const Image src = data::read_image(dir.file("images/" + s.name), PixelFormat::kRgb);
    ds.read(i, image.data(), mask.data());
    int differ = 0, padding = 0;
    for (int y = 0; y < 128; ++y) {
      for (int x = 0; x < 96; ++x) {
        const size_t d = static_cast<size_t>(y) * 96 + x;
        if (y < src.height && x < src.width) {
          const size_t p = static_cast<size_t>(y) * src.width + x;
          for (int c = 0; c < 3; ++c) differ += image[d * 3 + c] != src.pixels[p * 3 + c];
        } else {
          padding += image[d * 3] + image[d * 3 + 1] + image[d * 3 + 2] + mask[d];
        }
      }
    }
    EXPECT_EQ(differ, 0) << s.name;
    EXPECT_EQ(padding, 0) << s.name;
  }
}

TEST(Tiles, BadInputsAreOneClearLine) {
  test::TempDir dir;
  write_mixed(dir.path());
  BuildOptions b = options(dir);
  // A mixed-size folder without --tile/--pad-to/--resize names two files and the options.
  std::string e = error_of([&] { data::build_dataset(b); });
  EXPECT_EQ(count(e, "\n"), 0) << e;
  EXPECT_TRUE(contains(e, "images differ in size")) << e;
  EXPECT_TRUE(contains(e, "sq000.jpg' is 96x96")) << e;
  EXPECT_TRUE(contains(e, "tall000.jpg' is 64x128")) << e;
  for (const char* option : {"--tile", "--pad-to", "--resize"})
    EXPECT_TRUE(contains(e, option)) << e;

  // A tile larger than an image: that image, its size and the tile, one line per image (the
  // two 64-high ones) and a count.
  b.tile_height = 65;
  b.tile_width = 32;
  e = error_of([&] { data::build_dataset(b); });
  EXPECT_EQ(count(e, "\n"), 2) << e;
  EXPECT_EQ(count(e, "(HxW), smaller than the tile 65x32; give a smaller --tile"), 2) << e;
  EXPECT_TRUE(contains(e, "wide000.jpg' is 64x96 (HxW)")) << e;
  EXPECT_TRUE(contains(e, "2 problems with the input files; nothing was written")) << e;
  EXPECT_FALSE(fs::exists(b.out));

  // Padding to less than an image.
  b.tile_height = b.tile_width = 0;
  b.pad_height = b.pad_width = 96;
  e = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(e, "tall000.jpg' is 128x64 (HxW), larger than --pad-to 96x96")) << e;
  EXPECT_EQ(count(e, "\n"), 0) << e;

  // A mask of another size than its image.
  b.pad_height = b.pad_width = 0;
  b.tile_height = b.tile_width = 32;
  const std::vector<uint8_t> small(32 * 32, 0);
  data::write_png(dir.file("masks/sq000.png"), small.data(), 32, 32, 1);
  e = error_of([&] { data::build_dataset(b); });
  EXPECT_EQ(count(e, "\n"), 0) << e;
  EXPECT_TRUE(contains(e, "sq000.jpg' is 96x96 but its mask")) << e;

  // Options that do not go together.
  b.resize_width = b.resize_height = 64;
  e = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(e, "at most one of --resize, --tile and --pad-to")) << e;
  EXPECT_FALSE(fs::exists(b.out));
}

// ---------------------------------------------------------------------------------------------
// TIFF and BMP inputs

// Writes an 8-bit RGB (deflate) or a 1-bit (min-is-black) TIFF with libtiff.
void write_tiff(const std::string& path, const uint8_t* pixels, int width, int height, int channels,
                int bits) {
  TIFF* tif = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(tif, nullptr);
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, width);
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, height);
  TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, channels);
  TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, bits);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, channels == 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK);
  TIFFSetField(tif, TIFFTAG_COMPRESSION,
               bits == 1 ? COMPRESSION_PACKBITS : COMPRESSION_ADOBE_DEFLATE);
  TIFFSetField(tif, TIFFTAG_ROWSPERSTRIP, 8);
  std::vector<uint8_t> row(static_cast<size_t>(width) * channels);
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = pixels + static_cast<size_t>(y) * width * channels;
    if (bits == 1) {
      std::fill(row.begin(), row.end(), 0);
      for (int x = 0; x < width; ++x)
        if (src[x]) row[x / 8] |= static_cast<uint8_t>(0x80 >> (x % 8));
    } else {
      std::copy(src, src + row.size(), row.begin());
    }
    ASSERT_EQ(TIFFWriteScanline(tif, row.data(), static_cast<uint32_t>(y), 0), 1);
  }
  TIFFClose(tif);
}

// Writes a 1-bit palette BMP (black, white), the format some crack datasets ship their masks in.
void write_bmp1(const std::string& path, const uint8_t* mask, int width, int height) {
  const int stride = ((width + 31) / 32) * 4;
  const uint32_t data_offset = 14 + 40 + 8,
                 size = data_offset + static_cast<uint32_t>(stride * height);
  std::vector<uint8_t> b(size, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  b[0] = 'B', b[1] = 'M';
  put32(2, size);
  put32(10, data_offset);
  put32(14, 40);
  put32(18, static_cast<uint32_t>(width));
  put32(22, static_cast<uint32_t>(height));  // positive: rows bottom to top
  b[26] = 1;                                 // planes
  b[28] = 1;                                 // bits per pixel
  put32(46, 2);                              // colours used
  put32(58, 0x00FFFFFF);                     // palette: 0 black, 1 white
  for (int y = 0; y < height; ++y) {
    uint8_t* row = &b[data_offset + static_cast<size_t>(height - 1 - y) * stride];
    for (int x = 0; x < width; ++x)
      if (mask[static_cast<size_t>(y) * width + x])
        row[x / 8] |= static_cast<uint8_t>(0x80 >> (x % 8));
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

TEST(TiffBmp, ImagesAndOneBitMasksGoThroughTilesExactly) {
  test::TempDir dir;
  fs::create_directories(dir.file("images"));
  fs::create_directories(dir.file("masks"));
  const int w = 80, h = 48;
  std::vector<uint8_t> image(static_cast<size_t>(w) * h * 3), mask(static_cast<size_t>(w) * h);
  Rng rng(key(3));
  for (uint8_t& v : image) v = static_cast<uint8_t>(rng.below(256));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) mask[static_cast<size_t>(y) * w + x] = (x + y / 2) % 17 == 0;
  write_tiff(dir.file("images/a.tif"), image.data(), w, h, 3, 8);
  write_tiff(dir.file("masks/a.tiff"), mask.data(), w, h, 1, 1);
  write_tiff(dir.file("images/b.TIF"), image.data(), w, h, 3, 8);
  write_bmp1(dir.file("masks/b.bmp"), mask.data(), w, h);

  const Image read = data::read_image(dir.file("images/a.tif"), PixelFormat::kRgb);
  EXPECT_EQ(read.pixels, image);
  for (const char* m : {"masks/a.tiff", "masks/b.bmp"}) {
    const Image gray = data::read_image(dir.file(m), PixelFormat::kGray);
    ASSERT_EQ(gray.pixels.size(), mask.size()) << m;
    int differ = 0;
    for (size_t i = 0; i < mask.size(); ++i) differ += gray.pixels[i] != (mask[i] ? 255 : 0);
    EXPECT_EQ(differ, 0) << m;
    EXPECT_EQ(data::read_image_header(dir.file(m)).width, w) << m;
  }
  EXPECT_STREQ(data::read_image_header(dir.file("masks/b.bmp")).codec, "BMP");
  EXPECT_STREQ(data::read_image_header(dir.file("masks/a.tiff")).codec, "TIFF");

  BuildOptions b = options(dir);
  b.tile_height = b.tile_width = 32;
  const data::BuildReport r = data::build_dataset(b);
  EXPECT_EQ(r.train, 2 * 2 * 3);
  const Dataset ds(b.out, "train");
  const std::vector<data::SampleSource> sources = ds.read_sources();
  std::vector<uint8_t> tile(32 * 32 * 3), tile_mask(32 * 32);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const data::SampleSource& s = sources[static_cast<size_t>(i)];
    ds.read(i, tile.data(), tile_mask.data());
    int differ = 0;
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        const size_t p = static_cast<size_t>(s.y + y) * w + s.x + x;
        for (int c = 0; c < 3; ++c) differ += tile[(y * 32 + x) * 3 + c] != image[p * 3 + c];
        differ += tile_mask[y * 32 + x] != mask[p];
      }
    }
    EXPECT_EQ(differ, 0) << s.name << " at " << s.y << "," << s.x;
  }

  // Corrupt files: one line naming the file and the decoder's message.
  const auto cut = [&](const std::string& path, double keep) {
    fs::resize_file(path, static_cast<uintmax_t>(static_cast<double>(fs::file_size(path)) * keep));
  };
  cut(dir.file("images/a.tif"), 0.5);
  std::string e = error_of([&] { data::read_image(dir.file("images/a.tif"), PixelFormat::kRgb); });
  EXPECT_TRUE(contains(e, "TIFF '" + dir.file("images/a.tif") + "'")) << e;
  EXPECT_TRUE(contains(e, "libtiff")) << e;
  EXPECT_EQ(count(e, "\n"), 0) << e;
  cut(dir.file("masks/b.bmp"), 0.5);
  e = error_of([&] { data::read_image(dir.file("masks/b.bmp"), PixelFormat::kGray); });
  EXPECT_TRUE(contains(e, "corrupt or truncated BMP '" + dir.file("masks/b.bmp") + "'")) << e;
  EXPECT_EQ(count(e, "\n"), 0) << e;
  // Without its file size (bfSize 0), a cut BMP is caught by where its rows end; a BMP whose
  // header claims more pixels than its bytes can hold is refused before it is decoded.
  for (const bool forged : {false, true}) {
    write_bmp1(dir.file("masks/d.bmp"), mask.data(), w, h);
    std::vector<char> d(fs::file_size(dir.file("masks/d.bmp")));
    std::ifstream(dir.file("masks/d.bmp"), std::ios::binary).read(d.data(), d.size());
    std::fill(d.begin() + 2, d.begin() + 6, 0);
    if (forged) {
      d[18] = d[20] = d[22] = d[24] = 0,
      d[19] = d[23] = 0x70;  // 28672 x 28672 (1-bit, uncompressed)
    } else {
      d.resize(d.size() - 10);
    }
    std::ofstream(dir.file("masks/d.bmp"), std::ios::binary).write(d.data(), d.size());
    e = error_of([&] { data::read_image(dir.file("masks/d.bmp"), PixelFormat::kGray); });
    EXPECT_TRUE(contains(e, forged ? "BMP '" + dir.file("masks/d.bmp") + "' claims 28672x28672"
                                   : "corrupt or truncated BMP '" + dir.file("masks/d.bmp") +
                                         "': its 80x48 pixels of 1 bits end at byte"))
        << e;
    EXPECT_EQ(count(e, "\n"), 0) << e;
  }
  fs::remove(dir.file("masks/d.bmp"));
  std::ofstream(dir.file("masks/c.bmp")) << "BMnot really";
  e = error_of([&] { data::read_image(dir.file("masks/c.bmp"), PixelFormat::kGray); });
  EXPECT_TRUE(contains(e, "BMP '" + dir.file("masks/c.bmp") + "'")) << e;
  // dpprep lists both bad files, one a line, and writes nothing.
  fs::remove(dir.file("masks/c.bmp"));
  fs::remove(b.out);
  e = error_of([&] { data::build_dataset(b); });
  EXPECT_TRUE(contains(e, "a.tif")) << e;
  EXPECT_TRUE(contains(e, "b.bmp")) << e;
  EXPECT_FALSE(fs::exists(b.out));
}

// A PNG written byte by byte (libpng's simplified API writes 8-bit only): colour type 0 (grey)
// at `bits` per pixel, or 3 (palette: 0 black, 1 white) at 8, for masks of 0/1 values.
void write_mask_png(const std::string& path, const uint8_t* mask, int width, int height, int type,
                    int bits) {
  std::string raw;
  for (int y = 0; y < height; ++y) {
    raw += '\0';  // filter: none
    std::string row(static_cast<size_t>((width * bits + 7) / 8), '\0');
    for (int x = 0; x < width; ++x) {
      if (!mask[static_cast<size_t>(y) * width + x]) continue;
      if (bits == 1) {
        row[x / 8] = static_cast<char>(row[x / 8] | (0x80 >> (x % 8)));
      } else {
        row[x] = static_cast<char>(type == 3 ? 1 : 255);
      }
    }
    raw += row;
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  ASSERT_EQ(compress(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                     reinterpret_cast<const Bytef*>(raw.data()), raw.size()),
            Z_OK);
  packed.resize(packed_size);
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  std::string file = "\x89PNG\r\n\x1a\n";
  auto chunk = [&](const std::string& type_name, const std::string& data) {
    const std::string body = type_name + data;
    file += be32(static_cast<uint32_t>(data.size())) + body +
            be32(static_cast<uint32_t>(
                crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
  };
  chunk("IHDR", be32(width) + be32(height) +
                    std::string{static_cast<char>(bits), static_cast<char>(type), 0, 0, 0});
  if (type == 3) chunk("PLTE", std::string("\0\0\0\xff\xff\xff", 6));
  chunk("IDAT", packed);
  chunk("IEND", "");
  std::ofstream(path, std::ios::binary) << file;
}

TEST(MaskFormats, OneBitAndPalettePngMasksAreExact) {
  test::TempDir dir;
  test::PairFolderOptions o;
  o.count = 3;
  o.width = 72;
  o.height = 40;
  test::write_pairs(dir.path(), o);
  std::vector<std::vector<uint8_t>> masks;
  for (int i = 0; i < 3; ++i) {
    const std::string png = dir.file("masks/" + test::pair_stem(o, i) + ".png");
    const Image m = data::read_image(png, PixelFormat::kGray);
    std::vector<uint8_t> binary(m.pixels.size());
    for (size_t k = 0; k < binary.size(); ++k) binary[k] = m.pixels[k] > 127;
    masks.push_back(binary);
    if (i == 0) write_mask_png(png, binary.data(), 72, 40, 0, 1);  // 1-bit grey
    if (i == 1) write_mask_png(png, binary.data(), 72, 40, 3, 8);  // palette
  }
  for (int i = 0; i < 2; ++i) {
    const Image m =
        data::read_image(dir.file("masks/" + test::pair_stem(o, i) + ".png"), PixelFormat::kGray);
    int differ = 0;
    for (size_t k = 0; k < m.pixels.size(); ++k)
      differ += m.pixels[k] != (masks[static_cast<size_t>(i)][k] ? 255 : 0);
    EXPECT_EQ(differ, 0) << "mask " << i;
  }
  BuildOptions b = options(dir);
  b.tile_height = 32;
  b.tile_width = 64;
  data::build_dataset(b);
  const Dataset ds(b.out, "train");
  const std::vector<data::SampleSource> sources = ds.read_sources();
  ASSERT_EQ(ds.size(), 3 * 4);  // rows at 0 and 8 (flush), columns at 0 and 8
  std::vector<uint8_t> image(32 * 64 * 3), mask(32 * 64);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const data::SampleSource& s = sources[static_cast<size_t>(i)];
    const auto& m = masks[static_cast<size_t>(s.name[5] - '0')];  // img00N.jpg
    ds.read(i, image.data(), mask.data());
    int differ = 0;
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 64; ++x)
        differ += mask[y * 64 + x] != m[static_cast<size_t>(s.y + y) * 72 + s.x + x];
    EXPECT_EQ(differ, 0) << s.name << " at " << s.y << "," << s.x;
  }
}

// ---------------------------------------------------------------------------------------------
// Loader: --random-crop and --scale-jitter

void write_random_dataset(const std::string& path, int64_t n, int h, int w) {
  data::DatasetWriter writer(path, h, w, n, 0);
  std::vector<uint8_t> image(size_t(h) * w * 3), mask(size_t(h) * w);
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(key(78, uint64_t(i)));
    for (uint8_t& v : image) v = uint8_t(rng.below(256));
    for (uint8_t& m : mask) m = rng.uniform() < 0.3f ? 1 : 0;
    writer.write("train", i, image.data(), mask.data());
  }
  writer.commit();
}

using Samples = std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>;

Samples run_epoch(Loader& loader, const std::vector<int64_t>& order, int64_t epoch) {
  Samples out;
  loader.start(order, epoch);
  while (const data::Batch* b = loader.next()) {
    const size_t px = size_t(b->height) * b->width;
    for (int k = 0; k < b->n; ++k) {
      out[b->indices[k]] = {{b->images + k * px * 3, b->images + (k + 1) * px * 3},
                            {b->masks + k * px, b->masks + (k + 1) * px}};
    }
  }
  return out;
}

LoaderOptions crop_options(int batch, int workers, const std::string& crop,
                           const std::string& jitter) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.augment = data::Augment::kFull;
  o.seed = 5;
  data::parse_crop(crop, jitter, o);
  return o;
}

// The (y, x) where a crop-sized window of the stored mask/image equals the sample, or (-1, -1).
std::pair<int, int> find_window(const std::vector<float>& image, int ch, int cw,
                                const std::vector<float>& stored, int h, int w) {
  for (int y = 0; y + ch <= h; ++y) {
    for (int x = 0; x + cw <= w; ++x) {
      bool same = true;
      for (int r = 0; r < ch && same; ++r) {
        same = std::equal(image.begin() + r * cw * 3, image.begin() + (r + 1) * cw * 3,
                          stored.begin() + (static_cast<size_t>(y + r) * w + x) * 3);
      }
      if (same) return {y, x};
    }
  }
  return {-1, -1};
}

TEST(LoaderCrop, RandomCropsAreWindowsDrawnFromSeedEpochAndIndex) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_random_dataset(path, 6, 24, 40);
  std::vector<int64_t> order = {5, 0, 3, 1, 4, 2};
  LoaderOptions plain = crop_options(6, 1, "", "");
  plain.augment = data::Augment::kNone;
  Loader stored(path, "train", plain);
  EXPECT_TRUE(Dataset(path, "train").read_sources().empty());  // a file without sources
  const Samples full = run_epoch(stored, order, 0);

  LoaderOptions o = crop_options(2, 1, "16x16", "");
  o.augment = data::Augment::kNone;
  Loader a(path, "train", o);
  EXPECT_EQ(a.height(), 16);
  EXPECT_EQ(a.width(), 16);
  o.workers = 3;
  o.batch_size = 4;
  Loader b(path, "train", o);
  std::set<std::pair<int, int>> windows;
  for (int64_t epoch : {0, 1, 2}) {
    const Samples sa = run_epoch(a, order, epoch);
    std::reverse(order.begin(), order.end());
    EXPECT_EQ(sa, run_epoch(b, order, epoch)) << "epoch " << epoch;
    for (const auto& [index, sample] : sa) {
      const auto w = find_window(sample.first, 16, 16, full.at(index).first, 24, 40);
      EXPECT_GE(w.first, 0) << "sample " << index << " is no 16x16 window of the stored one";
      windows.insert(w);
    }
  }
  EXPECT_GT(windows.size(), 6u);  // positions vary with the epoch and the index

  // Validation: the centred window, the same every epoch.
  Loader v(path, "train", data::validation_options(o));
  const Samples sv = run_epoch(v, order, 3);
  for (const auto& [index, sample] : sv) {
    EXPECT_EQ(find_window(sample.first, 16, 16, full.at(index).first, 24, 40),
              std::make_pair(4, 12));
  }
  EXPECT_EQ(sv, run_epoch(v, order, 4));
}

TEST(LoaderCrop, ScaleJitterIsDeterministicAndKeepsMasksBinary) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_random_dataset(path, 5, 32, 32);
  const std::vector<int64_t> order = {0, 1, 2, 3, 4};
  Loader a(path, "train", crop_options(2, 1, "16x24", "0.7-1.3"));
  Loader b(path, "train", crop_options(3, 2, "16x24", "0.7-1.3"));
  const Samples s0 = run_epoch(a, order, 0);
  EXPECT_EQ(s0, run_epoch(b, order, 0));
  EXPECT_NE(s0, run_epoch(a, order, 1));
  for (const auto& [index, sample] : s0) {
    EXPECT_EQ(sample.first.size(), 16u * 24 * 3);
    for (float m : sample.second) EXPECT_TRUE(m == 0.0f || m == 1.0f);
  }
  // Scale jitter alone keeps the stored size.
  Loader c(path, "train", crop_options(2, 1, "", "0.8-1.2"));
  EXPECT_EQ(c.height(), 32);
  EXPECT_EQ(run_epoch(c, order, 0).size(), 5u);
}

TEST(LoaderCrop, BadCropsAreOneClearLine) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_random_dataset(path, 2, 24, 40);
  LoaderOptions o;
  std::string e = error_of([&] { data::parse_crop("16", "", o); });
  EXPECT_TRUE(contains(e, "invalid --random-crop '16', expected HxW")) << e;
  e = error_of([&] { data::parse_crop("16x0", "", o); });
  EXPECT_TRUE(contains(e, "invalid --random-crop '16x0'")) << e;
  e = error_of([&] { data::parse_crop("", "1.2-0.8", o); });
  EXPECT_TRUE(contains(e, "invalid --scale-jitter '1.2-0.8', expected LO-HI")) << e;
  e = error_of([&] { data::parse_crop("", "x-1", o); });
  EXPECT_TRUE(contains(e, "invalid --scale-jitter")) << e;
  e = error_of([&] { Loader l(path, "train", crop_options(2, 1, "32x32", "")); });
  EXPECT_TRUE(contains(e, "crop 32x32 (HxW) is larger than the images of split 'train'")) << e;
  EXPECT_TRUE(contains(e, "(24x40)")) << e;
  EXPECT_EQ(count(e, "\n"), 0) << e;
}

// ---------------------------------------------------------------------------------------------
// End to end: dpprep build --tile, then dptrain on two ranks with crops

class TilesCli : public ::testing::Test {
 protected:
  test::CommandResult run(const std::string& command) const { return test::run_command(command); }
  test::TempDir dir_;
};

TEST_F(TilesCli, MixedSizesAndLargePhotographsTrainOnTwoRanks) {
  // Mixed sizes: tiles of 32x32.
  write_mixed(dir_.file("mixed"));
  auto r =
      run(std::string(test::program("dpprep")) + " build --images " + dir_.file("mixed/images") +
          " --masks " + dir_.file("mixed/masks") + " --out " + dir_.file("mixed.h5") +
          " --tile 32x32 --val-fraction 0.25 --min-crack-fraction 0.01 --keep-below 0.3");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "tiles from 4 image(s)")) << r.output;
  r = run(std::string(test::program("dpprep")) + " info " + dir_.file("mixed.h5"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "tile_height = 32")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "source, origin: the file and position of each sample, from 3 "
                       "source image(s)"))
      << r.output;

  // "Large photographs" (for a unit test: 192x256 and 256x320 JPEGs) cut into 64x64 tiles,
  // trained on 32x32 random crops with scale jitter.
  test::PairFolderOptions o;
  o.count = 2;
  o.height = 192;
  o.width = 256;
  o.prefix = "photo";
  test::write_pairs(dir_.file("large"), o);
  o.count = 1;
  o.height = 256;
  o.width = 320;
  o.prefix = "big";
  test::write_pairs(dir_.file("large"), o);
  r = run(std::string(test::program("dpprep")) + " build --images " + dir_.file("large/images") +
          " --masks " + dir_.file("large/masks") + " --out " + dir_.file("large.h5") +
          " --tile 64x64 --stride 64 --val-fraction 0.34");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "tiles from 3 image(s)")) << r.output;

  const std::string train = test::mpiexec() + " -n 2 " + test::program("dptrain") +
                            " --width-divisor 16 --batch-size 2 --epochs 1 --workers 2";
  r = run(train + " --data " + dir_.file("mixed.h5") + " --model-dir " + dir_.file("run1"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "epoch 1/1"), 1) << r.output;
  EXPECT_TRUE(fs::exists(dir_.file("run1/model_epoch_1.h5")));
  r = run(train + " --data " + dir_.file("large.h5") + " --model-dir " + dir_.file("run2") +
          " --random-crop 32x32 --scale-jitter 0.8-1.2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "images of 32x32")) << r.output;
  EXPECT_TRUE(fs::exists(dir_.file("run2/model_epoch_1.h5")));

  // A crop larger than the stored tiles: one line from dptrain.
  r = run(train + " --data " + dir_.file("large.h5") + " --model-dir " + dir_.file("run3") +
          " --random-crop 96x96");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "crop 96x96 (HxW) is larger than the images")) << r.output;
  r = run(train + " --data " + dir_.file("large.h5") + " --model-dir " + dir_.file("run3") +
          " --random-crop 32");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "invalid --random-crop '32'")) << r.output;

  // dpprep: a tile larger than every image, and --stride without --tile.
  r = run(std::string(test::program("dpprep")) + " build --images " + dir_.file("large/images") +
          " --masks " + dir_.file("large/masks") + " --out " + dir_.file("x.h5") +
          " --tile 512x64");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "smaller than the tile 512x64; give a smaller --tile"))
      << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("x.h5")));
  r = run(std::string(test::program("dpprep")) + " build --images " + dir_.file("large/images") +
          " --masks " + dir_.file("large/masks") + " --out " + dir_.file("x.h5") + " --stride 8");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(count(r.output, "dpprep: error:"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--stride, --min-crack-fraction and --keep-below need --tile"))
      << r.output;
}

}  // namespace
}  // namespace dp
