// MPI test: loader crops and scale jitter depend on (seed, epoch, index) only, not on the ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/loader.hpp"
#include "dp/mpi_comm.hpp"
#include "dp/rng.hpp"
#include "dp/sampler.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

constexpr int64_t kSamples = 10;
constexpr int kHeight = 24, kWidth = 40;

// FNV-1a over the bytes of a sample's image and mask: what every rank compares.
uint64_t digest(const float* image, const float* mask, size_t pixels) {
  uint64_t h = 1469598103934665603ull;
  auto feed = [&](const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  feed(image, pixels * 3 * sizeof(float));
  feed(mask, pixels * sizeof(float));
  return h;
}

// Digest of every sample (by dataset index) that `loader` delivers for `indices` in `epoch`.
std::vector<uint64_t> digests(data::Loader& loader, std::vector<int64_t> indices, int64_t epoch) {
  std::vector<uint64_t> out(kSamples, 0);
  loader.start(std::move(indices), epoch);
  while (const data::Batch* b = loader.next()) {
    const size_t px = size_t(b->height) * b->width;
    for (int k = 0; k < b->n; ++k)
      out[static_cast<size_t>(b->indices[k])] =
          digest(b->images + k * px * 3, b->masks + k * px, px);
  }
  return out;
}

TEST(LoaderCropMpi, EveryRankCropsEachSampleAsOneProcessDoes) {
  mpi::MpiComm& comm = test::world();
  test::SharedDir dir;
  const std::string path = dir.file("d.h5");
  if (comm.rank() == 0) {
    data::DatasetWriter writer(path, kHeight, kWidth, kSamples, 0);
    std::vector<uint8_t> image(size_t(kHeight) * kWidth * 3), mask(size_t(kHeight) * kWidth);
    for (int64_t i = 0; i < kSamples; ++i) {
      Rng rng(key(91, uint64_t(i)));
      for (uint8_t& v : image) v = uint8_t(rng.below(256));
      for (uint8_t& m : mask) m = rng.uniform() < 0.3f ? 1 : 0;
      writer.write("train", i, image.data(), mask.data());
    }
    writer.commit();
  }
  comm.barrier();

  data::LoaderOptions o;
  o.batch_size = 2;
  o.workers = 2;
  o.augment = data::Augment::kFull;
  o.seed = 17;
  data::parse_crop("16x16", "0.8-1.25", o);
  data::Loader mine(path, "train", o);
  // The reference: one process, every index, another batch size and worker count.
  data::LoaderOptions ro = o;
  ro.batch_size = 3;
  ro.workers = 1;
  data::Loader reference(path, "train", ro);
  std::vector<int64_t> all(kSamples);
  std::iota(all.begin(), all.end(), 0);

  data::DistributedSampler sampler(kSamples, comm.rank(), comm.size(), {true, false, false, 3});
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<uint64_t> local = digests(mine, sampler.indices(epoch), epoch);
    // Each index is loaded on exactly one rank (0 elsewhere): a sum gathers them.
    std::vector<uint64_t> gathered(kSamples, 0);
    MPI_Allreduce(local.data(), gathered.data(), kSamples, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    const std::vector<uint64_t> expected = digests(reference, all, epoch);
    for (int64_t i = 0; i < kSamples; ++i) {
      EXPECT_NE(expected[static_cast<size_t>(i)], 0u);
      EXPECT_EQ(gathered[static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
          << "sample " << i << ", epoch " << epoch << ", " << comm.size() << " rank(s)";
    }
  }
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
