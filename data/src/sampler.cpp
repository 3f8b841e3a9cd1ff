// DistributedSampler: per-rank sample indices with PyTorch's padding / drop_last semantics.
#include "dp/sampler.hpp"

#include <numeric>
#include <utility>

#include "dp/error.hpp"
#include "dp/rng.hpp"

namespace dp::data {

namespace {

// Stream tags that keep the fixed-shard permutations apart from the per-epoch ones.
constexpr uint64_t kShardStream = 0x5348415244ull;          // "SHARD"
constexpr uint64_t kWithinShardStream = 0x57495448494eull;  // "WITHIN"

// Fisher-Yates with the platform-independent generator: a function of `stream` only.
void shuffle(std::vector<int64_t>& v, uint64_t stream) {
  Rng rng(stream);
  for (auto i = static_cast<int64_t>(v.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
  }
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size,
                                       Options options)
    : n_(dataset_size), rank_(rank), world_(world_size), opt_(options) {
  DP_CHECK(dataset_size >= 0, "sampler: dataset size ", dataset_size, " is negative");
  DP_CHECK(world_size >= 1, "sampler: world size ", world_size, " must be at least 1");
  DP_CHECK(rank >= 0 && rank < world_size, "sampler: rank ", rank, " out of range [0, ", world_size,
           ")");
}

int64_t DistributedSampler::total_size() const {
  if (opt_.drop_last) return (n_ / world_) * world_;
  if (opt_.pad) return (n_ + world_ - 1) / world_ * world_;
  return n_;
}

int64_t DistributedSampler::num_samples() const {
  if (opt_.drop_last || opt_.pad) return total_size() / world_;
  // Validation: positions rank, rank+W, ... < N.
  return rank_ < n_ ? (n_ - rank_ + world_ - 1) / world_ : 0;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  const bool fixed = opt_.fixed_shard && opt_.shuffle;
  // The global order is a function of (seed, epoch); with fixed shards, of the seed only.
  if (opt_.shuffle) {
    shuffle(order, fixed ? key(opt_.seed, kShardStream) : key(opt_.seed, uint64_t(epoch)));
  }
  const int64_t total = total_size();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples()));
  // Position p of the padded order is order[p mod N] (padding repeats the start, cyclically if
  // the padding is longer than N); drop_last and validation never reach past N.
  for (int64_t p = rank_; p < total; p += world_)
    mine.push_back(order[static_cast<size_t>(p % n_)]);
  if (fixed) shuffle(mine, key(opt_.seed, uint64_t(epoch), kWithinShardStream, uint64_t(rank_)));
  return mine;
}

}  // namespace dp::data
