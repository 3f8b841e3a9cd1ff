// Distributed training semantics under mpiexec -n 2 and 3: world-size-independent results with
// sampler padding and an uneven last batch, gradient accumulation (K x b == K*b, one reduction
// per optimiser step), and --check-sync-every naming a tensor that differs between ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "dp/mpi_comm.hpp"
#include "test_util.hpp"
#include "train/trainer.hpp"

namespace dp {
namespace {

using test::SharedDir;

// 11 training samples: np=2 pads to 12 (6 per rank), np=3 pads to 12 (4 per rank); with batch 2
// per rank the single-rank runs (batch 4 or 6) end with an uneven batch (3 or 5).
constexpr int64_t kTrain = 11;
constexpr int64_t kVal = 5;  // np=3: 2, 2, 1 validation samples per rank; never padded

// Plain BCE unless told otherwise: the threshold and tolerance below were chosen for it.
app::TrainOptions options(const std::string& data, const std::string& model_dir, int batch,
                          const std::string& precision = "fp32", const std::string& loss = "bce",
                          const std::string& pos_weight = "none") {
  app::TrainOptions o = test::tiny_training(data, model_dir, batch);
  o.precision = app::value_of(app::precision_words(), precision, "precision");
  o.loss = loss;
  o.pos_weight = pos_weight;
  o.threshold = 0.35;  // after one epoch some pixels are above it and some below: IoU not trivial
  o.tolerance = 1;     // ODS/OIS/AP with the tolerance's neighbourhoods
  return o;
}

std::string write_dataset(const SharedDir& dir) {
  const std::string path = dir.file("data.h5");
  if (test::world().rank() == 0) test::write_tiny_dataset(path, kTrain, kVal, 32);
  test::world().barrier();
  return path;
}

std::vector<float> weights(app::Trainer& t) {
  const ParamStore& ps = t.model().params();
  return {ps.values(), ps.values() + ps.arena_size()};
}

// max |(a - a0) - (b - b0)| / max |b - b0|: the difference of two updates from the same start,
// relative to the update's size (stricter than comparing the weights).
double update_error(const std::vector<float>& start, const std::vector<float>& a,
                    const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < start.size(); ++i) {
    const double ua = double(a[i]) - start[i], ub = double(b[i]) - start[i];
    diff = std::max(diff, std::fabs(ua - ub));
    scale = std::max(scale, std::fabs(ub));
  }
  return diff / std::max(scale, 1e-30);
}

// np=W x batch 2 (padding on some ranks in the last step) against, on rank 0, one rank with
// batch 2W in the same process: same weights, and the same train and validation numbers.
void expect_world_size_independent(const std::string& precision, const std::string& loss = "bce",
                                   const std::string& pos_weight = "none",
                                   double update_tolerance = 1e-5) {
  const int W = test::world().size();
  SharedDir dir;
  const std::string data = write_dataset(dir);
  app::Trainer tw(options(data, dir.file("npW"), 2, precision, loss, pos_weight), test::world(),
                  test::quiet_logger());
  const std::vector<float> start = weights(tw);
  const app::EpochMetrics train_w = tw.train_epoch(0);
  const app::EpochMetrics valid_w = tw.validate();
  if (test::world().rank() != 0) return;

  SelfComm self;
  app::Trainer t1(options(data, dir.file("np1"), 2 * W, precision, loss, pos_weight), self,
                  test::quiet_logger());
  const app::EpochMetrics train_1 = t1.train_epoch(0);
  const app::EpochMetrics valid_1 = t1.validate();
  const double err = update_error(start, weights(tw), weights(t1));
  std::printf(
      "[%s %s np %d vs np 1] update error %.3e; train loss %.9f vs %.9f, iou %.9f vs %.9f; "
      "valid loss %.9f vs %.9f, iou %.9f vs %.9f\n",
      precision.c_str(), loss.c_str(), W, err, train_w.loss, train_1.loss, train_w.iou, train_1.iou,
      valid_w.loss, valid_1.loss, valid_w.iou, valid_1.iou);
  EXPECT_LT(err, update_tolerance);
  // Padding duplicates carry no weight: the sample count is the dataset's, not the padded one.
  EXPECT_EQ(train_w.samples, kTrain);
  EXPECT_EQ(train_1.samples, kTrain);
  EXPECT_NEAR(train_w.loss, train_1.loss, 1e-6 * train_1.loss);
  EXPECT_NEAR(train_w.iou, train_1.iou, 1e-6);
  EXPECT_EQ(valid_w.samples, kVal);
  EXPECT_EQ(valid_1.samples, kVal);
  EXPECT_NEAR(valid_w.loss, valid_1.loss, 1e-6 * valid_1.loss);
  EXPECT_NEAR(valid_w.iou, valid_1.iou, 1e-6);
  // The threshold sweep: counts summed over ranks, so only the logits' rounding differs.
  std::printf(
      "[%s %s np %d vs np 1] ods %.9f vs %.9f (t %.2f vs %.2f), ois %.9f vs %.9f, "
      "ap %.9f vs %.9f\n",
      precision.c_str(), loss.c_str(), W, valid_w.ods, valid_1.ods, valid_w.ods_threshold,
      valid_1.ods_threshold, valid_w.ois, valid_1.ois, valid_w.ap, valid_1.ap);
  EXPECT_GT(valid_1.ap, 0.0);
  EXPECT_NEAR(valid_w.ods, valid_1.ods, 1e-6);
  EXPECT_EQ(valid_w.ods_threshold, valid_1.ods_threshold);
  EXPECT_NEAR(valid_w.ois, valid_1.ois, 1e-6);
  EXPECT_NEAR(valid_w.ap, valid_1.ap, 1e-6);
}

TEST(DistTrain, ResultsDoNotDependOnTheWorldSize) {
  expect_world_size_independent("fp32");
}

// Every --loss is a mean over the global batch (Dice per image, the others per pixel), padding
// and the uneven last batch included.
TEST(DistTrain, EveryLossDoesNotDependOnTheWorldSize) {
  // bce+dice as dptrain runs it by default: class-balanced BCE (--pos-weight dataset).
  for (const auto& [loss, pos_weight] :
       {std::pair{"dice", "none"}, std::pair{"bce+dice", "none"}, std::pair{"bce+dice", "dataset"},
        std::pair{"focal", "none"}, std::pair{"bce+dice+cldice", "dataset"}}) {
    SCOPED_TRACE(std::string(loss) + ", pos_weight " + pos_weight);
    // clDice's gradient goes to each window's minimum or maximum, so where two pixels are within
    // the logits' rounding of each other (np 1 runs other batch sizes through the convolutions)
    // it can take the other one: measured 2.4e-5. Per image its arithmetic does not depend on
    // the batch (GoldenLosses.SoftClDice, bit for bit).
    const bool cldice = std::string(loss).find("cldice") != std::string::npos;
    expect_world_size_independent("fp32", loss, pos_weight, cldice ? 1e-4 : 1e-5);
  }
}

// bf16 activations: the per-sample arithmetic does not depend on the batch either (measured
// update error 4e-7 at np=2, 2e-8 at np=3).
TEST(DistTrain, Bf16ResultsDoNotDependOnTheWorldSize) {
  if (!cpu_bf16_support().empty()) GTEST_SKIP() << "no bf16 on this CPU: " << cpu_bf16_support();
  expect_world_size_independent("bf16");
}

TEST(DistTrain, AccumulationEqualsALargerBatch) {
  // batch 2 x 2 micro-batches == batch 4, on the same ranks, over a whole epoch: 11 samples give
  // micro-batches (2,2),(2) per rank and batches (4),(2) for np=2; with padding in the last.
  SharedDir dir;
  const std::string data = write_dataset(dir);
  auto acc_options = options(data, dir.file("acc"), 2);
  acc_options.accumulation_steps = 2;
  acc_options.bucket_mb = 0.01;  // several buckets, some smaller than a tensor
  app::Trainer acc(acc_options, test::world(), test::quiet_logger());
  const std::vector<float> start = weights(acc);
  const app::EpochMetrics m_acc = acc.train_epoch(0);

  app::Trainer big(options(data, dir.file("big"), 4), test::world(), test::quiet_logger());
  ASSERT_EQ(weights(big), start);
  const app::EpochMetrics m_big = big.train_epoch(0);
  EXPECT_EQ(acc.state().step, big.state().step);  // optimiser steps, not micro-batches
  const double err = update_error(start, weights(acc), weights(big));
  if (test::world().rank() == 0)
    std::printf("[np %d] accumulation 2 x 2 vs batch 4: update error %.3e over %lld steps\n",
                test::world().size(), err, static_cast<long long>(acc.state().step));
  EXPECT_LT(err, 1e-5);
  EXPECT_EQ(m_acc.samples, m_big.samples);
  EXPECT_NEAR(m_acc.loss, m_big.loss, 1e-6 * m_big.loss);
}

// A Comm (not MPI) that counts gradient-sized all-reduces: the reducer's one per step.
class CountingComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void allreduce_sum(float*, size_t) override { ++float_reductions; }
  void allreduce_sum(double*, size_t) override {}
  void allreduce_sum(int64_t*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  bool all_true(bool local) override { return local; }
  int float_reductions = 0;
};

TEST(DistTrain, AccumulationReducesOncePerOptimiserStep) {
  SharedDir dir;
  const std::string data = write_dataset(dir);
  if (test::world().rank() != 0) return;
  CountingComm counting;
  auto o = options(data, dir.file("count"), 2);
  o.accumulation_steps = 3;  // 11 samples, batch 2: 6 micro-batches -> 2 optimiser steps
  app::Trainer t(o, counting, test::quiet_logger());
  t.train_epoch(0);
  EXPECT_EQ(t.state().step, 2);
  EXPECT_EQ(counting.float_reductions, 2);
}

TEST(DistTrain, CheckSyncNamesTheFirstTensorThatDiffers) {
  SharedDir dir;
  const std::string data = write_dataset(dir);
  auto o = options(data, dir.file("sync"), 2);
  o.check_sync_every = 1;
  app::Trainer t(o, test::world(), test::quiet_logger());
  t.train_epoch(0);  // checks after every step: in sync
  t.check_sync();
  // Rank 1 alone changes one element of one tensor (the last in the arena, the first declared).
  const ParamView& victim = t.model().params().views().front();
  const ParamView& later = t.model().params().views().back();
  if (test::world().rank() == 1) {
    victim.value[victim.numel - 1] += 1e-3f;
    later.value[0] += 1e-3f;
  }
  try {
    t.check_sync();
    ADD_FAILURE() << "check_sync() missed a difference";
  } catch (const app::AgreedFailure& e) {
    EXPECT_EQ(e.report(), test::world().rank() == 0);
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + victim.name + "' differs from rank 0's on 1 of "), std::string::npos)
        << what;
    EXPECT_NE(what.find("(2 tensor(s) differ)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
