// Hostile files: what a file claims is checked before anything is allocated from it.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "dp/image_io.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/prepare.hpp"
#include "dp/weights.hpp"
#include "predict/options.hpp"
#include "test_util.hpp"
#include "train/options.hpp"

namespace {

using dp::test::contains;
using dp::test::error_of;

using dp::test::TempDir;

// A dataset v1 file whose splits are declared with `n` samples of `side` x `side` and no data
// written: HDF5 allocates nothing, so the file is a few KB whatever it claims.
void write_claim(const std::string& path, int64_t n, int64_t side) {
  dp::h5::File f(path, dp::h5::Mode::kTruncate);
  f.set_attr("format", std::string(dp::data::kDatasetFormat));
  f.set_attr("pos_weight", 2.0);
  dp::h5::Dataset::create(f, "train/images", dp::h5::Type::kUint8, {n, side, side, 3});
  dp::h5::Dataset::create(f, "train/masks", dp::h5::Type::kUint8, {n, side, side});
}

int64_t file_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return static_cast<int64_t>(in.tellg());
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

void put_be16(uint8_t* p, unsigned v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

void put_be32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}

TEST(Hostile, DatasetClaimingTenToTheTwelveImagesIsOneErrorLine) {
  TempDir dir;
  const std::string path = dir.file("claims.h5");
  constexpr int64_t kClaimed = 1000000000000;  // 10^12 images of 4x4 in a file of a few KB
  write_claim(path, kClaimed, 4);
  EXPECT_LT(file_size(path), 16384);
  const std::string msg = error_of([&] { dp::data::Dataset d(path, "train"); });
  EXPECT_TRUE(contains(msg, path) && contains(msg, "claims 1000000000000 samples")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  // dpprep info reads every mask: it stops at the same check.
  EXPECT_TRUE(contains(error_of([&] { dp::data::inspect_dataset(path); }), "1000000000000"));
}

TEST(Hostile, DatasetWithoutItsDataIsRefused) {
  TempDir dir;
  const std::string path = dir.file("empty.h5");
  write_claim(path, 1000000, 32);  // a plausible count, but the file holds none of the rows
  const std::string msg = error_of([&] { dp::data::Dataset d(path, "train"); });
  EXPECT_TRUE(contains(msg, path + ":/train/images") && contains(msg, "holds 0 bytes of data") &&
              contains(msg, "need at least 3072000000"))
      << msg;
}

TEST(Hostile, DatasetShapeBeyondTheElementLimitIsRefused) {
  TempDir dir;
  const std::string path = dir.file("shape.h5");
  {
    // Straight through the C API: the wrapper itself refuses to create such a shape.
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[4] = {hsize_t{1} << 40, 1 << 20, 1 << 20, 3};
    const hid_t space = H5Screate_simple(4, dims, nullptr);
    const hid_t dset =
        H5Dcreate2(file, "d", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(dset, 0);
    H5Dclose(dset);
    H5Sclose(space);
    H5Fclose(file);
  }
  dp::h5::File f(path, dp::h5::Mode::kRead);
  const std::string msg = error_of([&] { dp::h5::Dataset::open(f, "d"); });
  EXPECT_TRUE(contains(msg, "[1099511627776,1048576,1048576,3]") &&
              contains(msg, "more than 1125899906842624 elements"))
      << msg;
}

TEST(Hostile, ImageClaimingMorePixelsThanItsBytesCanHoldIsRefused) {
  TempDir dir;
  std::vector<uint8_t> gray(16 * 16, 128);
  // PNG: IHDR's width and height (at bytes 16 and 20) set to 30000x30000, its CRC recomputed.
  const std::string png = dir.file("big.png");
  dp::data::write_png(png, gray.data(), 16, 16, 1);
  std::vector<uint8_t> bytes = read_bytes(png);
  put_be32(&bytes[16], 30000);
  put_be32(&bytes[20], 30000);
  put_be32(&bytes[29], static_cast<uint32_t>(crc32(0, &bytes[12], 17)));
  write_bytes(png, bytes);
  std::string msg = error_of([&] { dp::data::read_image(png, dp::data::PixelFormat::kRgb); });
  EXPECT_TRUE(contains(msg, "PNG '" + png + "' claims 30000x30000 pixels in a file of")) << msg;
  // JPEG: the baseline frame header's height and width (SOF0: FF C0, length, precision, H, W).
  const std::string jpg = dir.file("big.jpg");
  dp::data::write_jpeg(jpg, gray.data(), 16, 16, dp::data::PixelFormat::kGray, 90);
  bytes = read_bytes(jpg);
  size_t sof = 2;
  while (sof + 9 < bytes.size() && !(bytes[sof] == 0xFF && bytes[sof + 1] == 0xC0)) ++sof;
  ASSERT_LT(sof + 9, bytes.size());
  put_be16(&bytes[sof + 5], 30000);
  put_be16(&bytes[sof + 7], 30000);
  write_bytes(jpg, bytes);
  msg = error_of([&] { dp::data::read_image_header(jpg); });
  EXPECT_TRUE(contains(msg, "JPEG '" + jpg + "' claims 30000x30000 pixels in a file of")) << msg;
}

// Rewrites root attribute `name` of an existing file as a string or an integer.
void set_root_attr(const std::string& path, const std::string& name, const std::string* text,
                   int64_t number) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  if (H5Aexists(file, name.c_str()) > 0) H5Adelete(file, name.c_str());
  const hid_t space = H5Screate(H5S_SCALAR);
  hid_t type = H5Tcopy(text != nullptr ? H5T_C_S1 : H5T_STD_I64LE);
  if (text != nullptr) H5Tset_size(type, text->size() + 1);
  const hid_t attr = H5Acreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (text != nullptr) {
    H5Awrite(attr, type, text->c_str());
  } else {
    H5Awrite(attr, H5T_NATIVE_INT64, &number);
  }
  H5Aclose(attr);
  H5Tclose(type);
  H5Sclose(space);
  H5Fclose(file);
}

TEST(Hostile, CheckpointMetadataOutOfRangeIsRefused) {
  TempDir dir;
  dp::ParamStore params;
  params.add("w", {2}, 1);
  params.finalize();
  std::vector<float> momentum(static_cast<size_t>(params.arena_size()), 0.0f);
  dp::CheckpointMeta meta;
  meta.model = "unet16";
  const std::string path = dir.file("ck.h5");
  dp::save_checkpoint(path, params, momentum.data(), meta);
  // The same arena listed twice would be read twice (a file could list it thousands of times).
  const std::string twice = "momentum_buffer,momentum_buffer";
  set_root_attr(path, "optimizer_state", &twice, 0);
  std::string msg = error_of([&] { dp::read_checkpoint_meta(path); });
  EXPECT_TRUE(contains(msg, "bad optimizer state list 'momentum_buffer,momentum_buffer'")) << msg;
  // An image size no model could be set up for.
  dp::save_checkpoint(path, params, momentum.data(), meta);
  set_root_attr(path, "height", nullptr, int64_t{1} << 40);
  msg = error_of([&] { dp::read_checkpoint_meta(path); });
  EXPECT_TRUE(contains(msg, "image size 1099511627776x0 out of range")) << msg;
}

TEST(Hostile, WeightsWithAHugeLayerIndexAreIgnoredNotAnException) {
  TempDir dir;
  const std::string path = dir.file("w.h5");
  {
    dp::h5::File f(path, dp::h5::Mode::kTruncate);
    const std::vector<float> v(2, 1.0f);
    dp::h5::Dataset::create(f, "features.99999999999.weight", dp::h5::Type::kFloat32, {2})
        .write(v.data());
  }
  auto backend = dp::make_cpu_backend();
  dp::ModelConfig mc;
  mc.width_divisor = 32;
  auto model = dp::make_model(mc, *backend);
  // Was std::out_of_range from std::stoi; now the key names no layer and the import says what
  // is missing.
  const std::string msg = error_of(
      [&] { dp::import_weights(path, "unet16", model->params(), model->buffers(), false); });
  EXPECT_TRUE(contains(msg, "lack conv1.0.weight")) << msg;
}

TEST(Hostile, ConfigWithABoostPlaceholderIsAnErrorNotAHang) {
  TempDir dir;
  // Boost.Program_options 1.74 loops forever formatting the error about such a value or key.
  for (const std::string text :
       {"epochs = %value%\n", "%original_token% = 1\n", "%invalid_line%\n"}) {
    const std::string path = dir.file("run.ini");
    std::ofstream(path) << text;
    const char* argv[] = {"dptrain", "--config", path.c_str()};
    const std::string msg = error_of([&] { dp::app::parse_train_options(3, argv, false); });
    EXPECT_TRUE(contains(msg, "--config '" + path + "': '%") && contains(msg, "is not allowed"))
        << msg;
  }
  const char* argv[] = {"dptrain", "--epochs", "%value%"};
  EXPECT_TRUE(contains(error_of([&] { dp::app::parse_train_options(3, argv, false); }),
                       "argument '%value%': '%value%' is not allowed"));
  // dppredict's options (dpprep's: e2e/data_cli).
  const char* predict_argv[] = {"dppredict", "--threshold", "x%value%"};
  EXPECT_TRUE(contains(error_of([&] { dp::app::parse_predict_options(3, predict_argv, false); }),
                       "argument 'x%value%': '%value%' is not allowed"));
}

}  // namespace
