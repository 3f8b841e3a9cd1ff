// The shape of a training epoch on each rank: sharding, padding, --max-steps, resume position.
#include "train/epoch_plan.hpp"

#include <algorithm>

#include "dp/sampler.hpp"

namespace dp::app {

int EpochPlan::batch_size(int64_t micro) const {
  return int(std::min<int64_t>(batch, per_rank - micro * batch));
}

int64_t EpochPlan::real_samples(int q) const {
  return std::min(per_rank, q < dataset ? (dataset - q + world - 1) / world : 0);
}

int EpochPlan::real_in_batch(int q, int64_t micro) const {
  return int(std::clamp<int64_t>(real_samples(q) - micro * batch, 0, batch_size(micro)));
}

int64_t EpochPlan::end_micro(int64_t step) const {
  return std::min(micro_steps(), (step + 1) * accumulation);
}

int64_t EpochPlan::step_samples(int64_t step) const {
  int64_t total = 0;
  for (int64_t m = first_micro(step); m < end_micro(step); ++m)
    for (int q = 0; q < world; ++q) total += real_in_batch(q, m);
  return std::max<int64_t>(total, 1);
}

std::vector<int64_t> epoch_indices(const TrainOptions& o, int64_t dataset, int rank, int world,
                                   int64_t epoch, int64_t position) {
  const size_t batch = size_t(o.batch_size);
  std::vector<int64_t> indices;
  if (o.cache) {
    data::DistributedSampler sampler(dataset, rank, world,
                                     {.shuffle = true,
                                      .pad = false,
                                      .drop_last = o.drop_last,
                                      .seed = o.seed,
                                      .fixed_shard = true});
    indices = sampler.indices(epoch);
    const int64_t padded = (dataset + world - 1) / world;
    if (o.drop_last)
      indices.resize(indices.size() / batch * batch);
    else if (dataset > 0)
      indices.resize(size_t(padded), indices.empty() ? 0 : indices.front());
    const auto skip = std::min(indices.size(), size_t(position / world));
    indices.erase(indices.begin(), indices.begin() + static_cast<ptrdiff_t>(skip));
    return indices;
  }
  const std::vector<int64_t> order =
      data::DistributedSampler(dataset, 0, 1,
                               {.shuffle = true, .pad = false, .drop_last = false, .seed = o.seed})
          .indices(epoch);
  const int64_t remaining = std::max<int64_t>(0, dataset - position);
  const int64_t end = o.drop_last ? position + remaining / world * world : dataset;
  for (int64_t p = position + rank; p < end; p += world) indices.push_back(order[size_t(p)]);
  if (o.drop_last)
    indices.resize(indices.size() / batch * batch);
  else if (remaining > 0)
    indices.resize(size_t((remaining + world - 1) / world), order[size_t(rank % dataset)]);
  return indices;
}

EpochShard plan_epoch(const TrainOptions& o, int64_t dataset, int rank, int world, int64_t epoch,
                      EpochStart start) {
  EpochShard s;
  s.indices = epoch_indices(o, dataset, rank, world, epoch, start.position);
  if (o.max_steps > 0) {
    const int64_t per_step = int64_t(o.batch_size) * o.accumulation_steps;
    const int64_t limit = std::max<int64_t>(o.max_steps - start.step, 1) * per_step;
    if (int64_t(s.indices.size()) > limit) s.indices.resize(size_t(limit));
  }
  s.plan = {dataset - start.position, world, int64_t(s.indices.size()), o.batch_size,
            o.accumulation_steps};
  return s;
}

}  // namespace dp::app
