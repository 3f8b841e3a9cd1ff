// Unit tests of the data layer: HDF5 wrapper, dataset v1 reader/writer, sampler, loader, synth.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "dp/loader.hpp"
#include "dp/rng.hpp"
#include "dp/sampler.hpp"
#include "dp/synth.hpp"
#include "test_util.hpp"

namespace {

using dp::test::contains;
using dp::test::error_of;

namespace fs = std::filesystem;
using dp::data::DistributedSampler;

// A fresh directory under /tmp, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/dp-test-data-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename());
    return names;
  }

 private:
  std::string path_;
};

// Runs `f` and returns the dp::Error message it throws (fails the test if it does not throw).
// Deterministic, position-dependent test content for sample i.
uint8_t pixel_value(int64_t i, int y, int x, int c) {
  return static_cast<uint8_t>((i * 37 + y * 11 + x * 5 + c * 3) % 256);
}
uint8_t mask_value(int64_t i, int y, int x) {
  return (i + 2 * y + x) % 4 == 0 ? 1 : 0;
}

void make_sample(int64_t i, int h, int w, std::vector<uint8_t>& image, std::vector<uint8_t>& mask) {
  image.resize(static_cast<size_t>(h) * w * 3);
  mask.resize(static_cast<size_t>(h) * w);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) image[(y * w + x) * 3 + c] = pixel_value(i, y, x, c);
      mask[y * w + x] = mask_value(i, y, x);
    }
  }
}

// Writes a valid dataset v1 with the test content; returns the number of crack pixels in train.
int64_t write_test_dataset(const std::string& path, int64_t n_train, int64_t n_val, int h, int w,
                           int gzip = 0) {
  dp::data::DatasetWriter writer(path, h, w, n_train, n_val, gzip);
  std::vector<uint8_t> image, mask;
  int64_t crack = 0;
  for (int64_t i = 0; i < n_train; ++i) {
    make_sample(i, h, w, image, mask);
    for (uint8_t m : mask) crack += m;
    writer.write("train", i, image.data(), mask.data());
  }
  for (int64_t i = 0; i < n_val; ++i) {
    make_sample(i + 1000, h, w, image, mask);
    writer.write("val", i, image.data(), mask.data());
  }
  writer.commit();
  return crack;
}

// Writes a file by hand (possibly invalid): given format attribute, shapes and image type.
void write_raw(const std::string& path, const std::string& format,
               const std::vector<int64_t>& image_shape, const std::vector<int64_t>& mask_shape,
               dp::h5::Type image_type = dp::h5::Type::kUint8) {
  dp::h5::File f(path, dp::h5::Mode::kTruncate);
  if (!format.empty()) f.set_attr("format", format);
  f.set_attr("pos_weight", 2.0);
  dp::h5::Dataset::create(f, "train/images", image_type, image_shape);
  dp::h5::Dataset::create(f, "train/masks", dp::h5::Type::kUint8, mask_shape);
}

// ---------------------------------------------------------------------------------------------
// HDF5 wrapper

TEST(H5, RoundTripAttributesAndDatasets) {
  TempDir dir;
  const std::string path = dir.file("rt.h5");
  const std::vector<float> floats = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
  std::vector<uint8_t> bytes(4 * 2 * 3);
  std::iota(bytes.begin(), bytes.end(), uint8_t{200});  // wraps past 255
  {
    dp::h5::File f(path, dp::h5::Mode::kTruncate);
    f.set_attr("name", std::string("héllo wörld"));
    f.set_attr("empty", std::string());
    f.set_attr("count", int64_t{-42});
    f.set_attr("ratio", 0.125);
    f.set_attr("list", std::vector<double>{1.0, 2.5, -3.0});
    f.set_attr("none", std::vector<double>{});
    f.set_attr("count", int64_t{43});  // overwrite
    dp::h5::Group g = f.group("a/b");
    g.set_attr("inner", int64_t{7});
    auto d = dp::h5::Dataset::create(f, "a/floats", dp::h5::Type::kFloat32, {2, 3});
    d.write(floats.data());
    d.attrs().set_attr("unit", std::string("m"));
    auto u = dp::h5::Dataset::create(g, "bytes", dp::h5::Type::kUint8, {4, 2, 3}, {1, 2, 3}, 4);
    u.write_rows(0, 2, bytes.data());
    u.write_rows(2, 2, bytes.data() + 12);
    f.flush();
  }
  dp::h5::File f(path, dp::h5::Mode::kRead);
  EXPECT_EQ(f.attr_string("name"), "héllo wörld");
  EXPECT_EQ(f.attr_string("empty"), "");
  EXPECT_EQ(f.attr_int("count"), 43);
  EXPECT_DOUBLE_EQ(f.attr_double("ratio"), 0.125);
  EXPECT_DOUBLE_EQ(f.attr_double("count"), 43.0);  // integers read as numbers too
  EXPECT_EQ(f.attr_doubles("list"), (std::vector<double>{1.0, 2.5, -3.0}));
  EXPECT_TRUE(f.attr_doubles("none").empty());
  EXPECT_TRUE(f.has_attr("ratio"));
  EXPECT_FALSE(f.has_attr("nope"));
  EXPECT_TRUE(f.exists("a"));
  EXPECT_TRUE(f.exists("a/b/bytes"));
  EXPECT_TRUE(f.exists("/a/b"));
  EXPECT_FALSE(f.exists("a/c"));
  EXPECT_FALSE(f.exists("x/y/z"));
  EXPECT_EQ(f.children(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(f.open_group("a").children(), (std::vector<std::string>{"b", "floats"}));
  EXPECT_EQ(f.open_group("a/b").attr_int("inner"), 7);

  auto d = dp::h5::Dataset::open(f, "a/floats");
  EXPECT_EQ(d.type(), dp::h5::Type::kFloat32);
  EXPECT_EQ(d.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(d.numel(), 6);
  EXPECT_EQ(d.name(), path + ":/a/floats");
  EXPECT_EQ(d.attrs().attr_string("unit"), "m");
  std::vector<float> fback(6);
  d.read(fback.data());
  EXPECT_EQ(fback, floats);
  std::vector<float> row(3);
  d.read_rows(1, 1, row.data());
  EXPECT_EQ(row, (std::vector<float>{0.0f, 1e-3f, 7.0f}));

  auto u = dp::h5::Dataset::open(f.open_group("a/b"), "bytes");
  EXPECT_EQ(u.type(), dp::h5::Type::kUint8);
  EXPECT_EQ(u.shape(), (std::vector<int64_t>{4, 2, 3}));
  std::vector<uint8_t> bback(bytes.size());
  u.read(bback.data());
  EXPECT_EQ(bback, bytes);
  std::vector<uint8_t> two(12);
  u.read_rows(1, 2, two.data());
  EXPECT_TRUE(std::equal(two.begin(), two.end(), bytes.begin() + 6));
}

TEST(H5, ReadsVariableLengthStringAttribute) {
  TempDir dir;
  const std::string path = dir.file("vlen.h5");
  {
    dp::h5::File f(path, dp::h5::Mode::kTruncate);
    std::lock_guard<std::recursive_mutex> lock(dp::h5::mutex());
    dp::h5::Id type(H5Tcopy(H5T_C_S1));
    DP_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
    dp::h5::Id space(H5Screate(H5S_SCALAR));
    dp::h5::Id attr(H5Acreate2(f.id(), "v", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_TRUE(attr.valid());
    const char* text = "variable length";
    DP_H5_CHECK(H5Awrite(attr.get(), type.get(), &text));
  }
  dp::h5::File f(path, dp::h5::Mode::kRead);
  EXPECT_EQ(f.attr_string("v"), "variable length");
}

TEST(H5, ErrorMessagesNamePathAndObject) {
  TempDir dir;
  const std::string missing = dir.file("missing.h5");
  std::string msg = error_of([&] { dp::h5::File f(missing, dp::h5::Mode::kRead); });
  EXPECT_TRUE(contains(msg, missing)) << msg;
  EXPECT_TRUE(contains(msg, "No such file")) << msg;
  EXPECT_FALSE(contains(msg, "\n")) << msg;

  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "this is not HDF5\n";
  msg = error_of([&] { dp::h5::File f(text, dp::h5::Mode::kRead); });
  EXPECT_TRUE(contains(msg, text)) << msg;
  EXPECT_TRUE(contains(msg, "not an HDF5 file")) << msg;

  msg = error_of([&] { dp::h5::File f(dir.file("no/such/dir.h5"), dp::h5::Mode::kTruncate); });
  EXPECT_TRUE(contains(msg, "no/such/dir.h5")) << msg;

  const std::string path = dir.file("e.h5");
  {
    dp::h5::File f(path, dp::h5::Mode::kTruncate);
    dp::h5::Dataset::create(f, "grp/data", dp::h5::Type::kFloat32, {3});
    f.set_attr("text", std::string("abc"));
  }
  dp::h5::File f(path, dp::h5::Mode::kRead);
  msg = error_of([&] { f.attr_int("nope"); });
  EXPECT_TRUE(contains(msg, "'nope'")) << msg;
  EXPECT_TRUE(contains(msg, path)) << msg;
  msg = error_of([&] { f.attr_int("text"); });
  EXPECT_TRUE(contains(msg, "'text'") && contains(msg, "string")) << msg;
  msg = error_of([&] { f.attr_string("nope"); });
  EXPECT_TRUE(contains(msg, "'nope'") && contains(msg, path)) << msg;

  msg = error_of([&] { dp::h5::Dataset::open(f, "grp/missing"); });
  EXPECT_TRUE(contains(msg, path + ":/grp/missing")) << msg;
  msg = error_of([&] { dp::h5::Dataset::open(f, "grp"); });
  EXPECT_TRUE(contains(msg, "is a group, expected a dataset")) << msg;
  msg = error_of([&] { f.open_group("grp/data"); });
  EXPECT_TRUE(contains(msg, "is a dataset, expected a group")) << msg;

  auto d = dp::h5::Dataset::open(f, "grp/data");
  std::vector<uint8_t> bytes(3);
  msg = error_of([&] { d.read(bytes.data()); });
  EXPECT_TRUE(contains(msg, path + ":/grp/data")) << msg;
  EXPECT_TRUE(contains(msg, "float32") && contains(msg, "uint8")) << msg;
  std::vector<float> floats(3);
  msg = error_of([&] { d.read_rows(2, 2, floats.data()); });
  EXPECT_TRUE(contains(msg, "out of range") && contains(msg, "grp/data")) << msg;

  // DP_H5_CHECK carries the call, HDF5's own message and file:line.
  msg = error_of([&] {
    std::lock_guard<std::recursive_mutex> lock(dp::h5::mutex());
    DP_H5_CHECK(H5Gopen2(f.id(), "absent", H5P_DEFAULT));
  });
  EXPECT_TRUE(contains(msg, "H5Gopen2")) << msg;
  EXPECT_TRUE(contains(msg, "test_data.cpp:")) << msg;
  EXPECT_GT(msg.size(), std::string("H5Gopen2(f.id(), \"absent\", H5P_DEFAULT): ").size() + 10)
      << msg;
}

// The stored chunk of `row` of dataset `name` in `path` (row-sized chunks) and its filter mask,
// through HDF5's direct chunk calls.
std::vector<uint8_t> raw_chunk(const std::string& path, const std::string& name, int64_t row,
                               uint32_t& filters) {
  std::lock_guard<std::recursive_mutex> lock(dp::h5::mutex());
  dp::h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  dp::h5::Id dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
  const hsize_t offset[H5S_MAX_RANK] = {static_cast<hsize_t>(row)};
  hsize_t size = 0;
  filters = 0;
  if (H5Dget_chunk_storage_size(dset.get(), offset, &size) < 0 || size == 0) {  // no chunk
    H5Eclear2(H5E_DEFAULT);
    return {};
  }
  std::vector<uint8_t> bytes(size);
  DP_H5_CHECK(H5Dread_chunk(dset.get(), H5P_DEFAULT, offset, &filters, bytes.data()));
  return bytes;
}

// Replaces the stored chunk of `row` by `bytes` with HDF5's filter mask `filters` (1: deflate
// skipped, `bytes` are the raw row).
void write_raw_chunk(const std::string& path, const std::string& name, int64_t row,
                     const std::vector<uint8_t>& bytes, uint32_t filters = 0) {
  std::lock_guard<std::recursive_mutex> lock(dp::h5::mutex());
  dp::h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  dp::h5::Id dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
  const hsize_t offset[H5S_MAX_RANK] = {static_cast<hsize_t>(row)};
  DP_H5_CHECK(H5Dwrite_chunk(dset.get(), H5P_DEFAULT, filters, offset, bytes.size(), bytes.data()));
}

// One-row reads of a gzip dataset (inflated outside the HDF5 lock) match H5Dread's multi-row and
// whole-dataset reads: compressed rows, a row stored with deflate skipped (filter mask 1) and a
// row never written (the fill value, 0).
TEST(H5, DeflatedRowsMatchH5Dread) {
  TempDir dir;
  const std::string path = dir.file("gz.h5");
  const int h = 9, w = 11;
  const int64_t n = 6, row = h * w * 3;
  std::vector<uint8_t> want(n * row, 0), image, mask;
  for (int64_t i = 0; i < 4; ++i) {
    make_sample(i, h, w, image, mask);
    std::copy(image.begin(), image.end(), want.begin() + i * row);
  }
  dp::Rng rng(7);
  for (int64_t k = 0; k < row; ++k) want[4 * row + k] = static_cast<uint8_t>(rng.next());
  {
    dp::h5::File f(path, dp::h5::Mode::kTruncate);
    auto d = dp::h5::Dataset::create(f, "d", dp::h5::Type::kUint8, {n, h, w, 3}, {1, h, w, 3}, 6);
    d.write_rows(0, 4, want.data());  // row 5 stays unallocated
  }
  write_raw_chunk(path, "d", 4, {want.begin() + 4 * row, want.begin() + 5 * row}, 1);
  uint32_t filters = 0;
  EXPECT_FALSE(raw_chunk(path, "d", 0, filters).empty());
  EXPECT_EQ(filters, 0u);  // deflated
  EXPECT_EQ(raw_chunk(path, "d", 4, filters).size(), static_cast<size_t>(row));
  EXPECT_EQ(filters, 1u);
  EXPECT_TRUE(raw_chunk(path, "d", 5, filters).empty());

  dp::h5::File f(path, dp::h5::Mode::kRead);
  auto d = dp::h5::Dataset::open(f, "d");
  std::vector<uint8_t> whole(want.size()), one(row), two(2 * row);
  d.read(whole.data());
  EXPECT_EQ(whole, want);
  for (int64_t i = 0; i < n; ++i) {
    d.read_rows(i, 1, one.data());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), want.begin() + i * row)) << i;
    if (i + 1 < n) {
      d.read_rows(i, 2, two.data());
      EXPECT_TRUE(std::equal(two.begin(), two.end(), want.begin() + i * row)) << i;
    }
  }
  EXPECT_TRUE(contains(error_of([&] { d.read_rows(n, 1, one.data()); }), "out of range"));
}

// Threads reading one gzip dataset v1 (DatasetWriter's layout) at once all get the right bytes.
TEST(H5, DeflatedRowsReadConcurrently) {
  TempDir dir;
  const std::string path = dir.file("gz.h5");
  const int h = 64, w = 96, n = 16, threads = 4, rounds = 8;
  write_test_dataset(path, n, 1, h, w, 1);
  dp::data::Dataset train(path, "train");
  std::vector<std::string> problems(threads);  // each thread's first wrong sample or error
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<uint8_t> image(h * w * 3), mask(h * w), want_image, want_mask;
      for (int k = 0; k < rounds * n && problems[t].empty(); ++k) {
        const int64_t i = (k * (2 * t + 1) + t) % n;  // a different order in each thread
        try {
          train.read(i, image.data(), mask.data());
        } catch (const dp::Error& e) {
          problems[t] = e.what();
        }
        make_sample(i, h, w, want_image, want_mask);
        if (problems[t].empty() && (image != want_image || mask != want_mask)) {
          problems[t] = dp::str_cat("sample ", i, " differs");
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(problems, std::vector<std::string>(threads));
}

// A damaged compressed chunk is one line naming the dataset, the row and the expected size.
TEST(H5, CorruptDeflatedRowIsOneLineError) {
  TempDir dir;
  const std::string path = dir.file("gz.h5");
  const int h = 12, w = 10;
  write_test_dataset(path, 4, 1, h, w, 4);
  uint32_t filters = 0;
  std::vector<uint8_t> chunk = raw_chunk(path, "train/images", 1, filters);
  ASSERT_EQ(filters, 0u);
  ASSERT_GT(chunk.size(), 8u);
  for (size_t k = 2; k < chunk.size(); k += 2) chunk[k] ^= 0x5a;
  write_raw_chunk(path, "train/images", 1, chunk);
  // A valid stream of the wrong size: the mask of row 2 (h*w bytes) as image row 3 (h*w*3).
  write_raw_chunk(path, "train/images", 3, raw_chunk(path, "train/masks", 2, filters));

  dp::data::Dataset train(path, "train");
  std::vector<uint8_t> image(h * w * 3), mask(h * w);
  train.read(0, image.data(), mask.data());
  train.read(2, image.data(), mask.data());
  for (int64_t i : {1, 3}) {
    const std::string msg = error_of([&] { train.read(i, image.data(), mask.data()); });
    EXPECT_TRUE(contains(msg, path + ":/train/images")) << msg;
    EXPECT_TRUE(contains(msg, dp::str_cat("cannot inflate row ", i))) << msg;
    EXPECT_TRUE(contains(msg, dp::str_cat("expected a zlib stream of ", h * w * 3, " bytes")))
        << msg;
    EXPECT_FALSE(contains(msg, "\n")) << msg;
    EXPECT_EQ(contains(msg, dp::str_cat("inflates to ", h * w, " bytes")), i == 3) << msg;
  }
}

// ---------------------------------------------------------------------------------------------
// Dataset v1

class DatasetRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(DatasetRoundTrip, WriterThenReader) {
  TempDir dir;
  const std::string path = dir.file("ds.h5");
  const int h = 5, w = 7;
  const int64_t crack = write_test_dataset(path, 6, 3, h, w, GetParam());
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ds.h5"}));  // no temporary left

  dp::data::Dataset train(path, "train");
  EXPECT_EQ(train.size(), 6);
  EXPECT_EQ(train.height(), h);
  EXPECT_EQ(train.width(), w);
  EXPECT_EQ(train.path(), path);
  EXPECT_EQ(train.split(), "train");
  const int64_t total = 6 * h * w;
  EXPECT_FLOAT_EQ(train.pos_weight(), static_cast<float>(total - crack) / crack);
  std::vector<uint8_t> image(h * w * 3), mask(h * w), want_image, want_mask;
  for (int64_t i = 0; i < 6; ++i) {
    train.read(i, image.data(), mask.data());
    make_sample(i, h, w, want_image, want_mask);
    EXPECT_EQ(image, want_image) << i;
    EXPECT_EQ(mask, want_mask) << i;
  }
  dp::data::Dataset val(path, "val");
  EXPECT_EQ(val.size(), 3);
  val.read(2, image.data(), mask.data());
  make_sample(1002, h, w, want_image, want_mask);
  EXPECT_EQ(image, want_image);
  EXPECT_EQ(val.pos_weight(), train.pos_weight());

  EXPECT_TRUE(dp::data::Dataset::has_split(path, "val"));
  EXPECT_FALSE(dp::data::Dataset::has_split(path, "test"));
  std::string msg = error_of([&] { train.read(6, image.data(), mask.data()); });
  EXPECT_TRUE(contains(msg, "out of range") && contains(msg, path)) << msg;

  // Move keeps the open file usable.
  dp::data::Dataset moved = std::move(train);
  moved.read(0, image.data(), mask.data());
}

INSTANTIATE_TEST_SUITE_P(Gzip, DatasetRoundTrip, ::testing::Values(0, 4));

TEST(Dataset, EmptySplitIsNotCreatedAndNoCracksGivesPosWeightOne) {
  TempDir dir;
  const std::string path = dir.file("nocrack.h5");
  {
    dp::data::DatasetWriter writer(path, 2, 2, 2, 0);
    const std::vector<uint8_t> image(12, 9), mask(4, 0);
    writer.write("train", 0, image.data(), mask.data());
    writer.write("train", 1, image.data(), mask.data());
    writer.commit();
  }
  EXPECT_FALSE(dp::data::Dataset::has_split(path, "val"));
  dp::data::Dataset train(path, "train");
  EXPECT_EQ(train.pos_weight(), 1.0f);
  const std::string msg = error_of([&] { dp::data::Dataset d(path, "val"); });
  EXPECT_TRUE(contains(msg, path) && contains(msg, "val")) << msg;
}

TEST(Dataset, WriterWithoutCommitLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("never.h5");
  {
    dp::data::DatasetWriter writer(path, 4, 4, 3, 1);
    std::vector<uint8_t> image, mask;
    make_sample(0, 4, 4, image, mask);
    writer.write("train", 0, image.data(), mask.data());
    EXPECT_EQ(dir.entries().size(), 1u);  // the temporary exists while writing
    EXPECT_FALSE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(Dataset, CommitWithMissingSampleFailsAndLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("partial.h5");
  {
    dp::data::DatasetWriter writer(path, 4, 4, 2, 0);
    std::vector<uint8_t> image, mask;
    make_sample(0, 4, 4, image, mask);
    writer.write("train", 0, image.data(), mask.data());
    const std::string msg = error_of([&] { writer.commit(); });
    EXPECT_TRUE(contains(msg, "sample 1") && contains(msg, "never written")) << msg;
    mask[0] = 3;
    EXPECT_THROW(writer.write("train", 1, image.data(), mask.data()), dp::Error);
    EXPECT_THROW(writer.write("test", 0, image.data(), mask.data()), dp::Error);
    EXPECT_THROW(writer.write("train", 2, image.data(), mask.data()), dp::Error);
  }
  EXPECT_TRUE(dir.entries().empty());
}

// /val/native_masks: each validation sample's mask at its photograph's size, read back as written;
// a writer refuses another size or a split where only some samples have one, and a reader a
// file whose native masks do not match the split.
TEST(Dataset, NativeMasksRoundTripAndAreChecked) {
  TempDir dir;
  const std::string path = dir.file("native.h5");
  const std::vector<uint8_t> image(4 * 4 * 3, 7), mask(4 * 4, 0);
  std::vector<uint8_t> native0(6 * 8, 0), native1(6 * 8, 0);
  native0[5] = native1[47] = 1;
  {
    dp::data::DatasetWriter writer(path, 4, 4, 1, 2);
    writer.write("train", 0, image.data(), mask.data());
    for (int i = 0; i < 2; ++i) writer.write("val", i, image.data(), mask.data());
    writer.write_native_mask("val", 0, native0.data(), 6, 8);
    std::string msg = error_of([&] { writer.commit(); });
    EXPECT_TRUE(contains(msg, "sample 1") && contains(msg, "no native mask")) << msg;
    msg = error_of([&] { writer.write_native_mask("val", 1, native1.data(), 8, 6); });
    EXPECT_TRUE(contains(msg, "8x6") && contains(msg, "6x8")) << msg;
    std::vector<uint8_t> bad = native1;
    bad[0] = 255;
    EXPECT_THROW(writer.write_native_mask("val", 1, bad.data(), 6, 8), dp::Error);
    writer.write_native_mask("val", 1, native1.data(), 6, 8);
    writer.commit();
  }
  dp::data::Dataset val(path, "val");
  ASSERT_TRUE(val.has_native_masks());
  EXPECT_EQ(val.native_height(), 6);
  EXPECT_EQ(val.native_width(), 8);
  std::vector<uint8_t> read(6 * 8);
  val.read_native_mask(1, read.data());
  EXPECT_EQ(read, native1);
  val.read_native_mask(0, read.data());
  EXPECT_EQ(read, native0);
  EXPECT_THROW(val.read_native_mask(2, read.data()), dp::Error);
  dp::data::Dataset train(path, "train");
  EXPECT_FALSE(train.has_native_masks());
  EXPECT_THROW(train.read_native_mask(0, read.data()), dp::Error);

  // Native masks of another sample count than the split's images.
  const std::string wrong = dir.file("wrong.h5");
  {
    dp::h5::File f(wrong, dp::h5::Mode::kTruncate);
    f.set_attr("format", std::string("dp-crack-v1"));
    f.set_attr("pos_weight", 2.0);
    dp::h5::Dataset::create(f, "train/images", dp::h5::Type::kUint8, {2, 4, 4, 3})
        .write(std::vector<uint8_t>(2 * 4 * 4 * 3, 0).data());
    dp::h5::Dataset::create(f, "train/masks", dp::h5::Type::kUint8, {2, 4, 4})
        .write(std::vector<uint8_t>(2 * 4 * 4, 0).data());
    dp::h5::Dataset::create(f, "train/native_masks", dp::h5::Type::kUint8, {3, 6, 8});
  }
  const std::string msg = error_of([&] { dp::data::Dataset d(wrong, "train"); });
  EXPECT_TRUE(contains(msg, "/train/native_masks") && contains(msg, "[3,6,8]") &&
              contains(msg, "expected uint8 [2,H,W]"))
      << msg;
}

TEST(Dataset, ReaderRejectsInvalidFiles) {
  TempDir dir;
  const std::string bad_format = dir.file("format.h5");
  write_raw(bad_format, "other-v9", {2, 4, 4, 3}, {2, 4, 4});
  std::string msg = error_of([&] { dp::data::Dataset d(bad_format, "train"); });
  EXPECT_TRUE(contains(msg, bad_format) && contains(msg, "other-v9") &&
              contains(msg, "dp-crack-v1"))
      << msg;

  const std::string no_format = dir.file("noformat.h5");
  write_raw(no_format, "", {2, 4, 4, 3}, {2, 4, 4});
  msg = error_of([&] { dp::data::Dataset d(no_format, "train"); });
  EXPECT_TRUE(contains(msg, no_format) && contains(msg, "'format'")) << msg;

  const std::string mask_shape = dir.file("maskshape.h5");
  write_raw(mask_shape, "dp-crack-v1", {2, 4, 4, 3}, {2, 4, 5});
  msg = error_of([&] { dp::data::Dataset d(mask_shape, "train"); });
  EXPECT_TRUE(contains(msg, mask_shape + ":/train/masks") && contains(msg, "[2,4,5]")) << msg;

  const std::string count = dir.file("count.h5");
  write_raw(count, "dp-crack-v1", {2, 4, 4, 3}, {3, 4, 4});
  msg = error_of([&] { dp::data::Dataset d(count, "train"); });
  EXPECT_TRUE(contains(msg, "/train/masks") && contains(msg, "[3,4,4]")) << msg;

  const std::string channels = dir.file("channels.h5");
  write_raw(channels, "dp-crack-v1", {2, 4, 4, 4}, {2, 4, 4});
  msg = error_of([&] { dp::data::Dataset d(channels, "train"); });
  EXPECT_TRUE(contains(msg, "/train/images") && contains(msg, "expected [N,H,W,3]")) << msg;

  const std::string type = dir.file("type.h5");
  write_raw(type, "dp-crack-v1", {2, 4, 4, 3}, {2, 4, 4}, dp::h5::Type::kFloat32);
  msg = error_of([&] { dp::data::Dataset d(type, "train"); });
  EXPECT_TRUE(
      contains(msg, "dataset '" + type + ":/train/images' has type float32, expected uint8"))
      << msg;

  msg = error_of([&] { dp::data::Dataset d(dir.file("absent.h5"), "train"); });
  EXPECT_TRUE(contains(msg, dir.file("absent.h5"))) << msg;

  // Mask values other than 0/1 are caught when the sample is read.
  const std::string values = dir.file("values.h5");
  {
    dp::h5::File f(values, dp::h5::Mode::kTruncate);
    f.set_attr("format", std::string("dp-crack-v1"));
    f.set_attr("pos_weight", 2.0);
    dp::h5::Dataset::create(f, "train/images", dp::h5::Type::kUint8, {1, 2, 2, 3})
        .write(std::vector<uint8_t>(12, 0).data());
    dp::h5::Dataset::create(f, "train/masks", dp::h5::Type::kUint8, {1, 2, 2})
        .write(std::vector<uint8_t>{0, 1, 255, 0}.data());
  }
  dp::data::Dataset d(values, "train");
  std::vector<uint8_t> image(12), mask(4);
  msg = error_of([&] { d.read(0, image.data(), mask.data()); });
  EXPECT_TRUE(contains(msg, "255") && contains(msg, "/train/masks")) << msg;
}

// ---------------------------------------------------------------------------------------------
// DistributedSampler

std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  return DistributedSampler(n, 0, 1, {true, false, false, seed}).indices(epoch);
}

TEST(Sampler, PermutationIsAFunctionOfSeedAndEpoch) {
  const auto a = permutation(50, 7, 3);
  EXPECT_EQ(a, permutation(50, 7, 3));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(50);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(a, iota);
  EXPECT_NE(a, permutation(50, 7, 4));
  EXPECT_NE(a, permutation(50, 8, 3));
  // The global order does not depend on the world size: rank r of W sees positions r, r+W, ...
  DistributedSampler r1(50, 1, 5, {true, true, false, 7});
  const auto mine = r1.indices(3);
  ASSERT_EQ(mine.size(), 10u);
  for (size_t k = 0; k < mine.size(); ++k) EXPECT_EQ(mine[k], a[1 + 5 * k]);
  // No shuffle: identity order.
  EXPECT_EQ(DistributedSampler(50, 0, 1, {false, true, false, 7}).indices(9), iota);
}

TEST(Sampler, PadsByRepeatingTheStart) {
  const int64_t n = 10;
  const int world = 3;
  const auto perm = permutation(n, 11, 2);
  std::vector<int64_t> global(12, -1);
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, {true, true, false, 11});
    EXPECT_EQ(s.num_samples(), 4);
    EXPECT_EQ(s.total_size(), 12);
    const auto idx = s.indices(2);
    ASSERT_EQ(idx.size(), 4u);
    for (size_t k = 0; k < idx.size(); ++k) global[r + world * k] = idx[k];
  }
  for (int64_t p = 0; p < n; ++p) EXPECT_EQ(global[p], perm[p]);
  EXPECT_EQ(global[10], perm[0]);
  EXPECT_EQ(global[11], perm[1]);

  // Padding longer than the dataset repeats it cyclically.
  DistributedSampler tiny(2, 4, 5, {false, true, false, 0});
  EXPECT_EQ(tiny.indices(0), (std::vector<int64_t>{0}));
}

TEST(Sampler, DropLastTruncates) {
  const auto perm = permutation(10, 3, 0);
  std::vector<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(10, r, 3, {true, true, true, 3});
    EXPECT_EQ(s.num_samples(), 3);
    EXPECT_EQ(s.total_size(), 9);
    const auto idx = s.indices(0);
    ASSERT_EQ(idx.size(), 3u);
    for (size_t k = 0; k < idx.size(); ++k) EXPECT_EQ(idx[k], perm[r + 3 * k]);
    seen.insert(seen.end(), idx.begin(), idx.end());
  }
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 9u);
}

TEST(Sampler, ValidationWithoutPadSeesEverySampleOnce) {
  for (int64_t n : {0, 1, 2, 10, 11, 12}) {
    std::vector<int64_t> seen;
    int64_t total = 0;
    for (int r = 0; r < 3; ++r) {
      DistributedSampler s(n, r, 3, {false, false, false, 0});
      const auto idx = s.indices(5);
      EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
      EXPECT_EQ(s.total_size(), n);
      total += s.num_samples();
      seen.insert(seen.end(), idx.begin(), idx.end());
    }
    EXPECT_EQ(total, n);
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> iota(static_cast<size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(seen, iota) << "n=" << n;
  }
  EXPECT_EQ(DistributedSampler(10, 0, 3, {true, false, false, 0}).num_samples(), 4);
  EXPECT_EQ(DistributedSampler(10, 2, 3, {true, false, false, 0}).num_samples(), 3);
}

TEST(Sampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(-1, 0, 1, {}), dp::Error);
  EXPECT_THROW(DistributedSampler(5, 0, 0, {}), dp::Error);
  EXPECT_THROW(DistributedSampler(5, 3, 3, {}), dp::Error);
}

// ---------------------------------------------------------------------------------------------
// Loader

dp::data::LoaderOptions loader_options(int batch, int prefetch, bool augment, uint64_t seed = 0) {
  dp::data::LoaderOptions o;
  o.batch_size = batch;
  o.prefetch = prefetch;
  o.augment = augment ? dp::data::Augment::kFlips : dp::data::Augment::kNone;
  o.seed = seed;
  return o;
}

std::vector<int64_t> iota_indices(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(Loader, YieldsAllIndicesInOrderNormalised) {
  TempDir dir;
  const std::string path = dir.file("l.h5");
  const int h = 4, w = 5;
  write_test_dataset(path, 7, 0, h, w);
  const auto opt = loader_options(3, 2, false);
  dp::data::Loader loader(path, "train", opt);
  EXPECT_EQ(loader.dataset_size(), 7);
  EXPECT_EQ(loader.height(), h);
  EXPECT_EQ(loader.width(), w);
  EXPECT_GT(loader.pos_weight(), 1.0f);
  EXPECT_EQ(loader.next(), nullptr);  // nothing started

  for (int64_t epoch = 0; epoch < 2; ++epoch) {  // start() again begins a new epoch
    loader.start(iota_indices(7), epoch);
    std::vector<int> sizes;
    std::vector<int64_t> seen;
    while (const dp::data::Batch* b = loader.next()) {
      sizes.push_back(b->n);
      EXPECT_EQ(b->height, h);
      EXPECT_EQ(b->width, w);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->images) % 64, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->masks) % 64, 0u);
      for (int k = 0; k < b->n; ++k) {
        const int64_t i = b->indices[k];
        seen.push_back(i);
        for (int y = 0; y < h; ++y) {
          for (int x = 0; x < w; ++x) {
            for (int c = 0; c < 3; ++c) {
              const float want = (pixel_value(i, y, x, c) / 255.0f - dp::data::kImagenetMean[c]) /
                                 dp::data::kImagenetStd[c];
              EXPECT_NEAR(b->images[((k * h + y) * w + x) * 3 + c], want, 1e-5f);
            }
            EXPECT_EQ(b->masks[(k * h + y) * w + x], static_cast<float>(mask_value(i, y, x)));
          }
        }
      }
    }
    EXPECT_EQ(sizes, (std::vector<int>{3, 3, 1}));
    EXPECT_EQ(seen, iota_indices(7));
    EXPECT_EQ(loader.next(), nullptr);  // stays at the end
  }
  // A known pixel: sample 2, y=1, x=3, channel 2.
  loader.start({2}, 0);
  const dp::data::Batch* b = loader.next();
  ASSERT_NE(b, nullptr);
  const float v = (static_cast<float>((2 * 37 + 11 + 15 + 6) % 256) / 255.0f - 0.406f) / 0.225f;
  EXPECT_NEAR(b->images[(1 * w + 3) * 3 + 2], v, 1e-6f);
  EXPECT_EQ(loader.next(), nullptr);
}

TEST(Loader, StopMidEpochAndDestroyDoNotDeadlock) {
  TempDir dir;
  const std::string path = dir.file("s.h5");
  write_test_dataset(path, 20, 0, 3, 3);
  for (int prefetch : {0, 1, 3}) {
    dp::data::Loader loader(path, "train", loader_options(2, prefetch, true, 1));
    loader.start(iota_indices(20), 0);
    ASSERT_NE(loader.next(), nullptr);
    loader.stop();
    EXPECT_EQ(loader.next(), nullptr);
    loader.stop();  // idempotent
    loader.start(iota_indices(20), 1);
    int batches = 0;
    while (loader.next()) ++batches;
    EXPECT_EQ(batches, 10);
    loader.start(iota_indices(20), 2);  // restart while the previous epoch is running
    loader.next();
    loader.start(iota_indices(20), 3);  // and leave this one running for the destructor
  }
  {
    dp::data::Loader loader(path, "train", loader_options(4, 2, false));
    loader.start(iota_indices(20), 0);  // destroyed without reading
  }
  {
    dp::data::Loader loader(path, "train", loader_options(4, 2, false));
    loader.start({}, 0);  // empty epoch
    EXPECT_EQ(loader.next(), nullptr);
  }
}

// Which of the four flips turns the unaugmented sample `plain` into `aug` (-1: none of them).
int flip_kind(const std::vector<float>& plain, const float* aug, const float* aug_mask,
              const std::vector<float>& plain_mask, int h, int w) {
  for (int kind = 0; kind < 4; ++kind) {
    const bool hflip = kind & 1, vflip = kind & 2;
    bool same = true;
    for (int y = 0; y < h && same; ++y) {
      for (int x = 0; x < w && same; ++x) {
        const int sy = vflip ? h - 1 - y : y, sx = hflip ? w - 1 - x : x;
        for (int c = 0; c < 3; ++c)
          same &= aug[(y * w + x) * 3 + c] == plain[(sy * w + sx) * 3 + c];
        same &= aug_mask[y * w + x] == plain_mask[sy * w + sx];
      }
    }
    if (same) return kind;
  }
  return -1;
}

// Runs one epoch over `order` and returns, per dataset index, the flip kind of each sample.
std::vector<int> epoch_flips(const std::string& path, const std::vector<int64_t>& order, int batch,
                             int64_t epoch, uint64_t seed, int h, int w) {
  dp::data::Loader plain(path, "train", loader_options(1, 0, false));
  dp::data::Loader aug(path, "train", loader_options(batch, 2, true, seed));
  std::vector<int> kinds(order.size(), -2);
  aug.start(order, epoch);
  while (const dp::data::Batch* b = aug.next()) {
    for (int k = 0; k < b->n; ++k) {
      const int64_t i = b->indices[k];
      plain.start({i}, 0);
      const dp::data::Batch* p = plain.next();
      std::vector<float> pimg(p->images, p->images + h * w * 3), pmask(p->masks, p->masks + h * w);
      kinds[static_cast<size_t>(i)] =
          flip_kind(pimg, b->images + k * h * w * 3, b->masks + k * h * w, pmask, h, w);
    }
  }
  return kinds;
}

TEST(Loader, FlipsAreAFunctionOfSeedEpochAndIndex) {
  TempDir dir;
  const std::string path = dir.file("f.h5");
  const int h = 4, w = 6, n = 40;
  write_test_dataset(path, n, 0, h, w);
  const auto order = iota_indices(n);
  std::vector<int64_t> reversed(order.rbegin(), order.rend());
  const auto a = epoch_flips(path, order, 3, 5, 99, h, w);
  const auto b = epoch_flips(path, reversed, 7, 5, 99, h, w);  // other order and batch size
  EXPECT_EQ(a, b);
  std::array<int, 4> counts{};
  for (int k : a) {
    ASSERT_GE(k, 0) << "a sample is neither the original nor a flip of it";
    ++counts[k];
  }
  for (int kind = 0; kind < 4; ++kind) EXPECT_GT(counts[kind], 0) << "flip kind " << kind;
  EXPECT_NE(a, epoch_flips(path, order, 3, 6, 99, h, w));  // another epoch
  EXPECT_NE(a, epoch_flips(path, order, 3, 5, 98, h, w));  // another seed
}

TEST(Loader, ReaderErrorsAreRethrownFromNext) {
  TempDir dir;
  const std::string path = dir.file("err.h5");
  write_test_dataset(path, 4, 0, 2, 2);
  dp::data::Loader loader(path, "train", loader_options(1, 1, false));
  loader.start({0, 1, 99, 2}, 0);
  ASSERT_NE(loader.next(), nullptr);
  ASSERT_NE(loader.next(), nullptr);
  const std::string msg = error_of([&] { loader.next(); });
  EXPECT_TRUE(contains(msg, "99") && contains(msg, "out of range") && contains(msg, path)) << msg;
  EXPECT_EQ(loader.next(), nullptr);
  loader.start({-1}, 0);
  EXPECT_THROW(loader.next(), dp::Error);
  loader.start({3}, 1);  // usable again afterwards
  const dp::data::Batch* b = loader.next();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->indices[0], 3);

  EXPECT_THROW(dp::data::Loader(dir.file("absent.h5"), "train", loader_options(1, 1, false)),
               dp::Error);
  EXPECT_THROW(dp::data::Loader(path, "train", loader_options(0, 1, false)), dp::Error);
}

// ---------------------------------------------------------------------------------------------
// Synthetic data

TEST(Synth, RenderIsDeterministicAndPlausible) {
  dp::data::SynthOptions opt;
  opt.height = 64;
  opt.width = 64;
  opt.seed = 3;
  const size_t pixels = 64 * 64;
  std::vector<uint8_t> image(pixels * 3), mask(pixels), image2(pixels * 3), mask2(pixels);
  const int samples = 64;
  double fraction_sum = 0;
  int without_crack = 0;
  double crack_mean_sum = 0, background_mean_sum = 0;
  int with_both = 0;
  for (int i = 0; i < samples; ++i) {
    const uint64_t stream = dp::key(opt.seed, 0, i);
    dp::data::render_synthetic(opt, stream, image.data(), mask.data());
    dp::data::render_synthetic(opt, stream, image2.data(), mask2.data());
    ASSERT_EQ(image, image2);
    ASSERT_EQ(mask, mask2);
    int64_t crack = 0;
    double crack_sum = 0, background_sum = 0;
    for (size_t p = 0; p < pixels; ++p) {
      ASSERT_LE(mask[p], 1);
      crack += mask[p];
      const double grey = (image[3 * p] + image[3 * p + 1] + image[3 * p + 2]) / 3.0;
      (mask[p] ? crack_sum : background_sum) += grey;
    }
    if (crack == 0) ++without_crack;
    if (crack > 0) {
      crack_mean_sum += crack_sum / crack;
      background_mean_sum += background_sum / (pixels - crack);
      ++with_both;
    }
    fraction_sum += static_cast<double>(crack) / pixels;
    // Not constant: a textured background.
    const auto [lo, hi] = std::minmax_element(image.begin(), image.end());
    EXPECT_GT(*hi - *lo, 20) << i;
  }
  const double fraction = fraction_sum / samples;
  EXPECT_GT(fraction, 0.005);
  EXPECT_LT(fraction, 0.20);
  EXPECT_GT(without_crack, 0);
  EXPECT_LT(without_crack, samples / 4);
  EXPECT_LT(crack_mean_sum / with_both, background_mean_sum / with_both - 5);  // cracks are darker

  dp::data::render_synthetic(opt, dp::key(opt.seed, 0, 1), image2.data(), mask2.data());
  dp::data::render_synthetic(opt, dp::key(opt.seed, 0, 2), image.data(), mask.data());
  EXPECT_NE(image, image2);
}

TEST(Synth, WriteIsDeterministicAndMatches) {
  TempDir dir;
  dp::data::SynthOptions opt;
  opt.train_count = 6;
  opt.val_count = 2;
  opt.height = 16;
  opt.width = 24;
  opt.seed = 12;
  const std::string a = dir.file("a.h5"), b = dir.file("b.h5");
  dp::data::write_synthetic(a, opt);
  dp::data::write_synthetic(b, opt);
  EXPECT_EQ(dir.entries().size(), 2u);
  for (const char* split : {"train", "val"}) {
    dp::data::Dataset da(a, split), db(b, split);
    ASSERT_EQ(da.size(), split == std::string("train") ? 6 : 2);
    EXPECT_EQ(da.height(), 16);
    EXPECT_EQ(da.width(), 24);
    EXPECT_EQ(da.pos_weight(), db.pos_weight());
    std::vector<uint8_t> ia(16 * 24 * 3), ma(16 * 24), ib(ia.size()), mb(ma.size());
    std::vector<uint8_t> ir(ia.size()), mr(ma.size());
    for (int64_t i = 0; i < da.size(); ++i) {
      da.read(i, ia.data(), ma.data());
      db.read(i, ib.data(), mb.data());
      EXPECT_EQ(ia, ib);
      EXPECT_EQ(ma, mb);
      // Train sample i is stream key(seed, 0, i); val sample i is key(seed, 1, i).
      const uint64_t stream = dp::key(opt.seed, split == std::string("train") ? 0 : 1, i);
      dp::data::render_synthetic(opt, stream, ir.data(), mr.data());
      EXPECT_EQ(ia, ir);
      EXPECT_EQ(ma, mr);
    }
  }
  dp::h5::File f(a, dp::h5::Mode::kRead);
  EXPECT_EQ(f.attr_int("synth_seed"), 12);
  EXPECT_EQ(f.attr_int("synth_train"), 6);
  EXPECT_EQ(f.attr_int("synth_val"), 2);
  EXPECT_EQ(f.attr_int("synth_height"), 16);
  EXPECT_EQ(f.attr_int("synth_width"), 24);

  EXPECT_TRUE(dp::data::synthetic_matches(a, opt));
  auto other = opt;
  other.seed = 13;
  EXPECT_FALSE(dp::data::synthetic_matches(a, other));
  other = opt;
  other.val_count = 3;
  EXPECT_FALSE(dp::data::synthetic_matches(a, other));
  other = opt;
  other.width = 16;
  EXPECT_FALSE(dp::data::synthetic_matches(a, other));
  EXPECT_FALSE(dp::data::synthetic_matches(dir.file("absent.h5"), opt));
  EXPECT_FALSE(dp::data::synthetic_matches(dir.path(), opt));
  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "not hdf5";
  EXPECT_FALSE(dp::data::synthetic_matches(text, opt));
  const std::string plain = dir.file("plain.h5");
  write_test_dataset(plain, 6, 2, 16, 24);
  EXPECT_FALSE(dp::data::synthetic_matches(plain, opt));

  // A split with count 0 is not created.
  opt.val_count = 0;
  const std::string c = dir.file("c.h5");
  dp::data::write_synthetic(c, opt);
  EXPECT_FALSE(dp::data::Dataset::has_split(c, "val"));
  EXPECT_TRUE(dp::data::synthetic_matches(c, opt));
}

}  // namespace
