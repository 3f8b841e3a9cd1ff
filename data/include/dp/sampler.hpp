// DistributedSampler: which sample indices each rank visits in an epoch (PyTorch semantics).
#pragma once

#include <cstdint>
#include <vector>

namespace dp::data {

// With shuffle the global order is a permutation that is a function of (seed, epoch) only.
// With pad (training) the order is padded by repeating its start to a multiple of the world
// size, so every rank gets the same count; rank r takes positions r, r+W, r+2W, ...
// drop_last instead truncates to a multiple of the world size. Without pad and drop_last
// (validation) rank r takes r, r+W, ... < N, so every sample is seen exactly once overall.
// With fixed_shard (and shuffle) the global order is the permutation of the seed alone, so each
// rank keeps the same shard every epoch (what a per-rank cache needs), and the rank's indices
// are reshuffled within the shard per (seed, epoch, rank). The padding and drop_last rules hold.
class DistributedSampler {
 public:
  struct Options {
    bool shuffle = true;
    bool pad = true;
    bool drop_last = false;
    uint64_t seed = 0;
    bool fixed_shard = false;
  };
  DistributedSampler(int64_t dataset_size, int rank, int world_size, Options options);

  std::vector<int64_t> indices(int64_t epoch) const;  // this rank's indices, in visiting order
  int64_t num_samples() const;                        // this rank's count per epoch
  int64_t total_size() const;                         // count over all ranks per epoch

 private:
  int64_t n_;
  int rank_, world_;
  Options opt_;
};

}  // namespace dp::data
