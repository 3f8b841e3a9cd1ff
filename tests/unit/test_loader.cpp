// Unit tests of the Loader (workers, augmentation, cache, drop_last, normalisation), fixed shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/loader.hpp"
#include "dp/rng.hpp"
#include "dp/sampler.hpp"
#include "prep_util.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

using dp::test::contains;

namespace fs = std::filesystem;
using data::Augment;
using data::Loader;
using data::LoaderOptions;

// A dataset of random images and random (asymmetric) masks: every flip or rotation of a mask
// differs from the others.
void write_random_dataset(const std::string& path, int64_t n, int h, int w) {
  data::DatasetWriter writer(path, h, w, n, 0);
  std::vector<uint8_t> image(size_t(h) * w * 3), mask(size_t(h) * w);
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(key(77, uint64_t(i)));
    for (uint8_t& v : image) v = uint8_t(rng.below(256));
    for (uint8_t& m : mask) m = rng.uniform() < 0.3f ? 1 : 0;
    writer.write("train", i, image.data(), mask.data());
  }
  writer.commit();
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

LoaderOptions options(int batch, int prefetch, int workers, Augment augment, uint64_t seed = 9) {
  LoaderOptions o;
  o.batch_size = batch;
  o.prefetch = prefetch;
  o.workers = workers;
  o.augment = augment;
  o.seed = seed;
  return o;
}

struct Sample {
  std::vector<float> image, mask;
  bool operator==(const Sample& o) const { return image == o.image && mask == o.mask; }
};

// One epoch over `order`: every sample by dataset index, and the batch sizes seen.
std::map<int64_t, Sample> run_epoch(Loader& loader, const std::vector<int64_t>& order,
                                    int64_t epoch, std::vector<int>* sizes = nullptr) {
  std::map<int64_t, Sample> out;
  loader.start(order, epoch);
  while (const data::Batch* b = loader.next()) {
    if (sizes) sizes->push_back(b->n);
    const size_t px = size_t(b->height) * b->width;
    for (int k = 0; k < b->n; ++k) {
      Sample s;
      s.image.assign(b->images + k * px * 3, b->images + (k + 1) * px * 3);
      s.mask.assign(b->masks + k * px, b->masks + (k + 1) * px);
      out[b->indices[k]] = std::move(s);
    }
  }
  return out;
}

TEST(LoaderWorkers, SamplesDoNotDependOnWorkersBatchSizeOrOrder) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_random_dataset(path, 13, 16, 16);
  const auto order = iota(13);
  std::vector<int64_t> reversed(order.rbegin(), order.rend());
  Loader one(path, "train", options(3, 0, 1, Augment::kFull));
  Loader many(path, "train", options(5, 2, 3, Augment::kFull));
  Loader single(path, "train", options(1, 4, 2, Augment::kFull));
  std::vector<int> sizes;
  const auto a = run_epoch(one, order, 4, &sizes);
  EXPECT_EQ(sizes, (std::vector<int>{3, 3, 3, 3, 1}));
  EXPECT_EQ(a.size(), 13u);
  EXPECT_TRUE(a == run_epoch(many, order, 4));
  EXPECT_TRUE(a == run_epoch(single, reversed, 4));
  EXPECT_FALSE(a == run_epoch(many, order, 5));  // another epoch, other augmentation
  // Indices arrive in the order given, batch by batch.
  many.start(reversed, 0);
  std::vector<int64_t> seen;
  while (const data::Batch* b = many.next()) seen.insert(seen.end(), b->indices, b->indices + b->n);
  EXPECT_EQ(seen, reversed);
}

// The 8 symmetries of a square: rotate k quarter turns (np.rot90) after an optional h-flip.
std::vector<size_t> symmetry(int n, int k, bool hflip) {
  std::vector<size_t> src(size_t(n) * n);
  for (int y = 0; y < n; ++y) {
    for (int x = 0; x < n; ++x) {
      int sy = y, sx = x;
      for (int t = 0; t < k; ++t) {  // out[y][x] = in[x][n-1-y], k times
        const int ny = sx, nx = n - 1 - sy;
        sy = ny, sx = nx;
      }
      if (hflip) sx = n - 1 - sx;
      src[size_t(y) * n + x] = size_t(sy) * n + sx;
    }
  }
  return src;
}

TEST(LoaderAugment, FullIsASquareSymmetryAndAMonotoneJitter) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  const int n = 8, count = 64;
  write_random_dataset(path, count, n, n);
  data::Dataset raw(path, "train");
  Loader loader(path, "train", options(4, 2, 2, Augment::kFull));
  const auto got = run_epoch(loader, iota(count), 1);
  std::set<std::pair<int, bool>> symmetries;
  int jittered = 0;
  std::vector<uint8_t> image(n * n * 3), mask(n * n);
  for (const auto& [index, s] : got) {
    raw.read(index, image.data(), mask.data());
    int found = -1;
    std::vector<size_t> src;
    for (int k = 0; k < 4 && found < 0; ++k) {
      for (bool h : {false, true}) {
        src = symmetry(n, k, h);
        bool same = true;
        for (size_t i = 0; i < src.size(); ++i) same &= s.mask[i] == float(mask[src[i]]);
        if (same) {
          found = k;
          symmetries.insert({k, h});
          break;
        }
      }
    }
    ASSERT_GE(found, 0) << "sample " << index << ": the mask is no symmetry of the original";
    // Image: per channel a monotone function of the original value (brightness, contrast).
    bool identity = true;
    for (int c = 0; c < 3; ++c) {
      std::vector<std::pair<int, float>> xy;
      for (size_t i = 0; i < src.size(); ++i) {
        const float y = (s.image[i * 3 + c] * data::kImagenetStd[c] + data::kImagenetMean[c]) * 255;
        xy.push_back({image[src[i] * 3 + c], y});
        identity &= std::abs(y - image[src[i] * 3 + c]) < 0.01f;
      }
      std::sort(xy.begin(), xy.end());
      for (size_t i = 1; i < xy.size(); ++i) {
        ASSERT_GE(xy[i].second, xy[i - 1].second - 1e-3f) << "sample " << index;
        if (xy[i].first == xy[i - 1].first) {
          ASSERT_NEAR(xy[i].second, xy[i - 1].second, 1e-3f);
        }
      }
      EXPECT_GE(xy.front().second, -1e-3f);
      EXPECT_LE(xy.back().second, 255.001f);
    }
    jittered += !identity;
  }
  EXPECT_EQ(symmetries.size(), 8u) << "every symmetry of the square appears";
  EXPECT_GT(jittered, count / 2);

  // Non-square images are flipped only (a quarter turn would change their shape).
  const std::string wide = dir.file("wide.h5");
  write_random_dataset(wide, 16, 4, 6);
  data::Dataset rw(wide, "train");
  Loader wl(wide, "train", options(4, 1, 1, Augment::kFull));
  std::vector<uint8_t> wi(4 * 6 * 3), wm(4 * 6);
  for (const auto& [index, s] : run_epoch(wl, iota(16), 2)) {
    rw.read(index, wi.data(), wm.data());
    bool any = false;
    for (int kind = 0; kind < 4 && !any; ++kind) {
      bool same = true;
      for (int y = 0; y < 4; ++y) {
        for (int x = 0; x < 6; ++x) {
          const int sy = kind & 2 ? 3 - y : y, sx = kind & 1 ? 5 - x : x;
          same &= s.mask[y * 6 + x] == float(wm[sy * 6 + sx]);
        }
      }
      any = same;
    }
    EXPECT_TRUE(any) << "sample " << index;
  }
}

TEST(LoaderCache, LaterEpochsComeFromMemory) {
  test::TempDir dir;
  const std::string path = dir.file("big.h5");
  // Images larger than HDF5's default chunk cache (1 MiB), so nothing else can serve them.
  const int side = 600;
  const int64_t n = 6;
  write_random_dataset(path, n, side, side);
  LoaderOptions o = options(2, 1, 2, Augment::kNone);
  o.cache = true;
  Loader loader(path, "train", o);
  EXPECT_EQ(loader.cached_samples(), 0);
  const auto first = run_epoch(loader, iota(n), 0);
  EXPECT_EQ(loader.cached_samples(), n);
  fs::resize_file(path, fs::file_size(path) / 3);  // most samples are gone from the file
  LoaderOptions uncached = o;
  uncached.cache = false;
  Loader reader(path, "train", uncached);
  try {
    EXPECT_FALSE(run_epoch(reader, iota(n), 0) == first);  // reads zeros past the end
  } catch (const Error&) {  // or fails: either way the file no longer has the data
  }
  std::vector<int64_t> shuffled = {4, 1, 5, 0, 3, 2};
  EXPECT_TRUE(run_epoch(loader, shuffled, 1) == first);
  EXPECT_TRUE(run_epoch(loader, iota(n), 2) == first);
}

TEST(LoaderOptions, DropLastAndDatasetNormalisation) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_random_dataset(path, 7, 4, 4);
  LoaderOptions o = options(3, 1, 2, Augment::kNone);
  o.drop_last = true;
  Loader dropping(path, "train", o);
  std::vector<int> sizes;
  const auto got = run_epoch(dropping, iota(7), 0, &sizes);
  EXPECT_EQ(sizes, (std::vector<int>{3, 3}));
  EXPECT_EQ(got.size(), 6u);
  dropping.start({0, 1}, 1);  // less than one batch: nothing
  EXPECT_EQ(dropping.next(), nullptr);

  o.drop_last = false;
  o.normalize = data::Normalize::kDataset;
  Loader own(path, "train", o);
  data::Dataset d(path, "train");
  ASSERT_TRUE(d.has_stats());
  EXPECT_EQ(own.mean(), d.mean());
  EXPECT_EQ(own.std(), d.std());
  std::vector<uint8_t> image(4 * 4 * 3), mask(4 * 4);
  d.read(5, image.data(), mask.data());
  const auto s = run_epoch(own, {5}, 0).at(5);
  for (size_t i = 0; i < image.size(); ++i) {
    const int c = int(i % 3);
    EXPECT_NEAR(s.image[i], (image[i] / 255.0f - d.mean()[c]) / d.std()[c], 1e-5f);
  }

  test::RawDataset raw;  // no mean/std attributes
  test::write_raw_dataset(dir.file("plain.h5"), raw);
  try {
    Loader l(dir.file("plain.h5"), "train", o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), dir.file("plain.h5")) && contains(e.what(), "'mean'"))
        << e.what();
  }
  o.workers = 0;
  EXPECT_THROW(Loader(path, "train", o), Error);
}

TEST(LoaderWorkers, ErrorsAreRethrownAndStoppingNeverDeadlocks) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_random_dataset(path, 20, 8, 8);
  for (int workers : {1, 3}) {
    Loader loader(path, "train", options(2, 1, workers, Augment::kFull));
    loader.start({0, 1, 2, 3, 99, 4, 5, 6}, 0);
    int batches = 0;
    try {
      while (loader.next()) ++batches;
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "99") && contains(e.what(), "out of range")) << e.what();
    }
    EXPECT_LE(batches, 2);  // the batches before the bad one, at most
    EXPECT_EQ(loader.next(), nullptr);
    for (int round = 0; round < 5; ++round) {  // restart and abandon epochs mid-way
      loader.start(iota(20), round);
      loader.next();
      if (round % 2) loader.stop();
    }
    EXPECT_EQ(run_epoch(loader, iota(20), 7).size(), 20u);  // usable again
  }
}

TEST(SamplerShards, FixedShardsKeepTheirSamplesAndReshuffle) {
  const int64_t n = 23;
  const int world = 3;
  data::DistributedSampler::Options o{
      .shuffle = true, .pad = false, .drop_last = false, .seed = 5, .fixed_shard = true};
  std::vector<std::set<int64_t>> shards(world);
  std::set<int64_t> all;
  bool reshuffled = false;
  for (int r = 0; r < world; ++r) {
    data::DistributedSampler s(n, r, world, o);
    const auto e0 = s.indices(0);
    shards[size_t(r)] = std::set<int64_t>(e0.begin(), e0.end());
    for (int64_t epoch = 1; epoch < 4; ++epoch) {
      const auto e = s.indices(epoch);
      EXPECT_EQ(std::set<int64_t>(e.begin(), e.end()), shards[size_t(r)]) << "rank " << r;
      reshuffled |= e != e0;
    }
    all.insert(e0.begin(), e0.end());
  }
  EXPECT_TRUE(reshuffled);
  EXPECT_EQ(all.size(), size_t(n));  // disjoint shards covering every sample
  EXPECT_EQ(shards[0].size() + shards[1].size() + shards[2].size(), size_t(n));
  // Without fixed shards a rank's samples change from epoch to epoch.
  o.fixed_shard = false;
  data::DistributedSampler moving(n, 0, world, o);
  const auto a = moving.indices(0), b = moving.indices(1);
  EXPECT_NE(std::set<int64_t>(a.begin(), a.end()), std::set<int64_t>(b.begin(), b.end()));
}

}  // namespace
}  // namespace dp
