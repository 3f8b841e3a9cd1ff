// The epoch plan (sharding, padding, --max-steps, the resume position) and the run's record
// (history, best epoch, early stopping): pure functions, checked without training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "train/epoch_plan.hpp"
#include "train/run_state.hpp"

namespace dp::app {
namespace {

TrainOptions options(int batch, int accumulation = 1) {
  TrainOptions o;
  o.batch_size = batch;
  o.accumulation_steps = accumulation;
  o.seed = 5;
  return o;
}

// The real (not padding) samples of each rank's list, as the plan counts them.
std::vector<int64_t> real_of(const EpochShard& s, int rank) {
  const auto n = size_t(s.plan.real_samples(rank));
  return {s.indices.begin(), s.indices.begin() + static_cast<ptrdiff_t>(n)};
}

TEST(EpochPlan, RanksVisitEverySampleOnceAndPadToTheSameSteps) {
  for (int world : {1, 2, 3, 4}) {
    const int64_t dataset = 10;
    const TrainOptions o = options(2);
    std::map<int64_t, int> seen;
    int64_t steps = -1;
    for (int q = 0; q < world; ++q) {
      const EpochShard s = plan_epoch(o, dataset, q, world, 3, {});
      EXPECT_EQ(int64_t(s.indices.size()), (dataset + world - 1) / world) << world;
      if (steps < 0) steps = s.plan.steps();
      EXPECT_EQ(s.plan.steps(), steps) << "world " << world << " rank " << q;
      for (int64_t i : real_of(s, q)) ++seen[i];
    }
    EXPECT_EQ(int64_t(seen.size()), dataset) << world;
    for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << "sample " << index;
  }
}

TEST(EpochPlan, StepWeightsCountTheRealSamplesOfEveryRank) {
  const EpochShard s = plan_epoch(options(2, 2), 11, 0, 3, 0, {});
  int64_t total = 0;
  for (int64_t step = 0; step < s.plan.steps(); ++step) total += s.plan.step_samples(step);
  EXPECT_EQ(total, 11);
  EXPECT_EQ(s.plan.first_micro(1), 2);
  EXPECT_EQ(s.plan.end_micro(s.plan.steps() - 1), s.plan.micro_steps());
}

TEST(EpochPlan, AResumeOnAnotherWorldSizeContinuesTheSameOrder) {
  const TrainOptions o = options(2);
  const int64_t dataset = 13, position = 6;  // a checkpoint after 3 steps of 2 ranks x 1
  const std::vector<int64_t> order = epoch_indices(o, dataset, 0, 1, 4, 0);
  std::vector<int64_t> rest;
  for (int q = 0; q < 3; ++q)
    for (int64_t i : real_of(plan_epoch(o, dataset, q, 3, 4, {3, position}), q)) rest.push_back(i);
  std::vector<int64_t> expected(order.begin() + position, order.end());
  std::sort(rest.begin(), rest.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(rest, expected);
}

TEST(EpochPlan, MaxStepsCutsEveryRankAfterTheResumedSteps) {
  TrainOptions o = options(2, 2);
  o.max_steps = 5;
  const EpochShard s = plan_epoch(o, 100, 1, 2, 0, {3, 24});
  EXPECT_EQ(s.indices.size(), size_t(2 * 2 * 2));  // 5 - 3 steps of 2 micro-batches of 2
  EXPECT_EQ(s.plan.steps(), 2);
}

TEST(EpochPlan, DropLastGivesEveryRankTheSameWholeBatches) {
  TrainOptions o = options(4);
  o.drop_last = true;
  for (int q = 0; q < 3; ++q) {
    const EpochShard s = plan_epoch(o, 29, q, 3, 1, {});
    EXPECT_EQ(s.indices.size(), size_t(8)) << q;  // 9 per rank, cut to 2 batches of 4
    EXPECT_EQ(s.plan.real_samples(q), 8) << q;
  }
}

EpochMetrics validated(double loss, double ods) {
  EpochMetrics m;
  m.loss = loss;
  m.ods = ods;
  return m;
}

TEST(RunState, TheBestEpochFollowsTheBestMetricAndNeverANonFiniteOne) {
  TrainOptions o;
  o.best_metric = app::BestMetric::kOds;
  CheckpointMeta s;
  const EpochMetrics train = validated(1.0, std::nan(""));
  EXPECT_TRUE(record_epoch(s, o, train, validated(0.9, 0.60), true, 1.0));
  EXPECT_TRUE(record_epoch(s, o, train, validated(0.95, 0.70), true, 1.0));  // loss worse
  EXPECT_FALSE(record_epoch(s, o, train, validated(0.5, 0.65), true, 1.0));
  EXPECT_FALSE(record_epoch(s, o, train, validated(0.4, std::nan("")), true, 1.0));
  EXPECT_EQ(s.epoch, 4);
  EXPECT_EQ(s.best_epoch, 2);
  EXPECT_DOUBLE_EQ(s.best_score, 0.70);
  EXPECT_DOUBLE_EQ(s.best_valid_loss, 0.95);
  EXPECT_EQ(s.valid_ods.size(), size_t(4));
  EXPECT_EQ(best_epoch_summary(s, o.best_metric), "best epoch 2 (ods 0.7000, loss 0.9500)");
}

TEST(RunState, WithoutAValidationSplitTheTrainingSplitIsJudged) {
  TrainOptions o;
  o.best_metric = app::BestMetric::kValidLoss;
  CheckpointMeta s;
  const EpochMetrics none = validated(std::nan(""), std::nan(""));
  EXPECT_TRUE(record_epoch(s, o, validated(0.8, 0), none, false, 1.0));
  EXPECT_FALSE(record_epoch(s, o, validated(0.9, 0), none, false, 1.0));
  EXPECT_TRUE(record_epoch(s, o, validated(0.7, 0), none, false, 1.0));
  EXPECT_EQ(s.best_epoch, 3);
}

TEST(RunState, EarlyStoppingCountsEpochsWithoutAnImprovementAboveMinDelta) {
  TrainOptions o;
  o.best_metric = app::BestMetric::kOds;
  o.patience = 2;
  o.min_delta = 0.01;
  CheckpointMeta s;
  s.epoch_step = 7;  // a mid-epoch position is cleared by the epoch's end
  const EpochMetrics train = validated(1.0, std::nan(""));
  record_epoch(s, o, train, validated(1, 0.50), true, 1.0);
  EXPECT_EQ(s.epoch_step, 0);
  record_epoch(s, o, train, validated(1, 0.505), true, 1.0);  // better, but by less than 0.01
  EXPECT_EQ(s.best_epoch, 2);
  EXPECT_EQ(s.early_stop_wait, 1);
  EXPECT_FALSE(stopping_early(s, o));
  record_epoch(s, o, train, validated(1, std::nan("")), true, 1.0);  // not judged
  EXPECT_EQ(s.early_stop_wait, 1);
  record_epoch(s, o, train, validated(1, 0.509), true, 1.0);
  EXPECT_TRUE(stopping_early(s, o));
  o.patience = 0;
  EXPECT_FALSE(stopping_early(s, o));
}

}  // namespace
}  // namespace dp::app
