// Training equivalences under mpiexec -n 2: np=2 x batch b == np=1 x batch 2b (also with an
// uneven last batch), world-size-independent metrics, and resume == uninterrupted training.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>

#include "dp/checkpoint.hpp"
#include "dp/mpi_comm.hpp"
#include "test_util.hpp"
#include "train/trainer.hpp"

namespace dp {
namespace {

using test::SharedDir;

app::TrainOptions options(const std::string& data, const std::string& model_dir, int batch) {
  return test::tiny_training(data, model_dir, batch);
}

void write_dataset_on_root(const std::string& path, int64_t train, int64_t val, int size = 32) {
  if (test::world().rank() == 0) test::write_tiny_dataset(path, train, val, size);
  test::world().barrier();
}

// Runs one epoch (optionally capped) on the MPI world and, on rank 0, the same epoch on one
// rank with twice the batch; compares the weights and the validation metrics.
// Returns the max relative weight difference on rank 0 (0 elsewhere); with expect_equal it must
// be below 1e-4 and the metrics must agree.
double compare_np2_np1(const std::string& data, int64_t max_steps, const SharedDir& dir,
                       const std::function<void(app::TrainOptions&)>& customize,
                       bool expect_equal) {
  EXPECT_EQ(test::world().size(), 2) << "run this test with mpiexec -n 2";
  auto o2 = options(data, dir.file("np2"), 2);
  o2.max_steps = max_steps;
  if (customize) customize(o2);
  app::Trainer t2(o2, test::world(), test::quiet_logger());
  const app::EpochMetrics train2 = t2.train_epoch(0);
  const app::EpochMetrics valid2 = t2.validate();
  if (test::world().rank() != 0) return 0;

  SelfComm self;
  auto o1 = options(data, dir.file("np1"), 4);
  o1.max_steps = max_steps;
  if (customize) customize(o1);
  app::Trainer t1(o1, self, test::quiet_logger());
  const app::EpochMetrics train1 = t1.train_epoch(0);
  const app::EpochMetrics valid1 = t1.validate();

  const ParamStore& p1 = t1.model().params();
  const ParamStore& p2 = t2.model().params();
  const test::Diff d = test::compare(p2.values(), p1.values(), p1.arena_size(), 1e-2);
  std::printf("[np2 vs np1] max abs weight diff %.3e, max rel %.3e; train loss %.8f vs %.8f\n",
              d.max_abs, d.max_rel, train2.loss, train1.loss);
  if (!expect_equal) return d.max_rel;
  EXPECT_LT(d.max_rel, 1e-4);
  EXPECT_EQ(train2.samples, train1.samples);
  EXPECT_NEAR(train2.loss, train1.loss, 1e-5 * train1.loss);
  // Validation metrics come from sums reduced over ranks: independent of the world size.
  EXPECT_EQ(valid2.samples, valid1.samples);
  EXPECT_NEAR(valid2.loss, valid1.loss, 1e-5 * valid1.loss);
  EXPECT_NEAR(valid2.iou, valid1.iou, 1e-6);
  return d.max_rel;
}

void expect_np2_equals_np1(const std::string& data, int64_t max_steps, const SharedDir& dir,
                           const std::function<void(app::TrainOptions&)>& customize = {}) {
  compare_np2_np1(data, max_steps, dir, customize, true);
}

TEST(TrainMpi, TwoRanksEqualOneRankWithDoubleBatchAfterThreeSteps) {
  SharedDir dir;
  write_dataset_on_root(dir.file("data.h5"), 24, 7);
  expect_np2_equals_np1(dir.file("data.h5"), 3, dir);
}

TEST(TrainMpi, UnevenLastBatchIsAveragedExactly) {
  // 10 samples: np=2 x b=2 gives batches 2,2,1 per rank; np=1 x b=4 gives 4,4,2.
  SharedDir dir;
  write_dataset_on_root(dir.file("data.h5"), 10, 5);
  expect_np2_equals_np1(dir.file("data.h5"), -1, dir);
}

// Batch norm with --sync-bn normalises over the global batch, so two ranks still equal one rank
// with the double batch; dropout masks follow the sample, not the rank.
TEST(TrainMpi, SyncBatchNormTwoRanksEqualOneRankWithDoubleBatch) {
  SharedDir dir;
  write_dataset_on_root(dir.file("data.h5"), 16, 5, 64);
  auto resnet = [](bool sync) {
    return [sync](app::TrainOptions& o) {
      o.model = "unet_resnet34";
      o.width_divisor = 4;  // narrower, the untrained decoder may be dead (constant logits)
      o.sync_bn = sync;
    };
  };
  expect_np2_equals_np1(dir.file("data.h5"), 3, dir, resnet(true));
  // Control: with per-rank statistics the two runs differ, so the equality above is not vacuous.
  const double differs = compare_np2_np1(dir.file("data.h5"), 3, dir, resnet(false), false);
  if (test::world().rank() == 0) {
    EXPECT_GT(differs, 1e-3);
  }
}

TEST(TrainMpi, ResumeEqualsUninterrupted) {
  SharedDir dir;
  write_dataset_on_root(dir.file("data.h5"), 12, 4);
  auto straight = options(dir.file("data.h5"), dir.file("straight"), 2);
  straight.epochs = 2;
  app::Trainer(straight, test::world(), test::quiet_logger()).run();

  auto first = options(dir.file("data.h5"), dir.file("resumed"), 2);
  first.epochs = 1;
  app::Trainer(first, test::world(), test::quiet_logger()).run();
  auto second = first;
  second.epochs = 2;
  {  // destroyed before the next Trainer: one holds --model-dir's lock at a time
    app::Trainer resumed(second, test::world(), test::quiet_logger());
    EXPECT_EQ(resumed.start_epoch(), 1);
    resumed.run();
  }

  if (test::world().rank() == 0) {
    auto be = make_cpu_backend();
    ModelConfig mc;
    mc.width_divisor = 16;
    auto a = make_model(mc, *be), b = make_model(mc, *be);
    std::vector<float> ma(size_t(a->params().arena_size())), mb(ma.size());
    const CheckpointMeta meta_a =
        load_checkpoint(dir.file("straight/model_epoch_2.h5"), a->params(), ma.data());
    const CheckpointMeta meta_b =
        load_checkpoint(dir.file("resumed/model_epoch_2.h5"), b->params(), mb.data());
    const test::Diff dw =
        test::compare(b->params().values(), a->params().values(), a->params().arena_size());
    const test::Diff dm = test::compare(mb.data(), ma.data(), int64_t(ma.size()));
    std::printf("[resume] max abs diff: weights %.3e, momentum %.3e\n", dw.max_abs, dm.max_abs);
    EXPECT_LT(dw.max_abs, 1e-6);
    EXPECT_LT(dm.max_abs, 1e-6);
    EXPECT_EQ(meta_a.step, meta_b.step);
    EXPECT_EQ(meta_a.valid_loss, meta_b.valid_loss);
    EXPECT_EQ(meta_b.epoch, 2);
  }

  // Asking for no more epochs than done trains nothing.
  app::Trainer done(second, test::world(), test::quiet_logger());
  EXPECT_EQ(done.start_epoch(), 2);
  EXPECT_EQ(done.run(), 0);
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
