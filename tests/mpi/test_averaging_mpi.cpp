// Weight averaging (--ema) and early stopping (--patience) across preemption, under mpiexec -n 1
// and -n 2: a run preempted mid-epoch and resumed ends with the same raw and averaged weights,
// bit for bit, as an uninterrupted one, and stops early at the same epoch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "dp/checkpoint.hpp"
#include "dp/mpi_comm.hpp"
#include "test_util.hpp"
#include "train/trainer.hpp"

namespace dp {
namespace {

// A shared directory holding the tests' dataset (16 train, 4 val images of 32x32).
class SharedDir : public test::SharedDir {
 public:
  SharedDir() {
    if (test::world().rank() == 0) test::write_tiny_dataset(file("data.h5"), 16, 4, 32);
    test::world().barrier();
  }
};

// The same global batch (4) on any world size: 4 steps per epoch.
app::TrainOptions options(const SharedDir& dir, const std::string& run) {
  app::TrainOptions o =
      test::tiny_training(dir.file("data.h5"), dir.file(run), 4 / test::world().size());
  o.deterministic = true;
  o.seed = 9;
  o.epochs = 2;
  return o;
}

int run(app::TrainOptions o, const char* preempt_at = nullptr) {
  if (preempt_at != nullptr)
    o.test_faults = {app::parse_planted_fault(std::string("preempt@") + preempt_at)};
  app::Trainer t(o, test::world(), test::quiet_logger());
  return t.run();
}

// A checkpoint's raw weights and, when it has them, its averaged weights.
struct Weights {
  std::vector<float> raw, averaged;
  CheckpointMeta meta;
};

Weights read_weights(const std::string& path) {
  auto be = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto m = make_model(mc, *be);
  const size_t n = size_t(m->params().arena_size());
  Weights w;
  w.averaged.assign(n, 0.0f);
  std::vector<float> buffers(size_t(m->buffers().arena_size()));
  const AveragedWeights averaged{w.averaged.data(), buffers.data()};
  w.meta = load_checkpoint(path, m->params(), OptimizerState{}, &m->buffers(), &averaged);
  w.raw.assign(m->params().values(), m->params().values() + n);
  if (!w.meta.has_averaged_weights) w.averaged.clear();
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(AveragingMpi, EmaResumesBitForBitAfterAMidEpochPreemption) {
  SharedDir dir;
  auto o = options(dir, "ema_straight");
  o.ema = 0.9;
  EXPECT_EQ(run(o), 0);
  o.model_dir = dir.file("ema_preempted");
  // The last rank is signalled in step 3 of epoch 1: a mid-epoch checkpoint, then the rest.
  const std::string at = str_cat(test::world().size() - 1, ":3");
  EXPECT_EQ(run(o, at.c_str()), app::kExitPreempted);
  EXPECT_EQ(run(o), 0);
  const auto plain = options(dir, "plain");  // the same run without --ema
  EXPECT_EQ(run(plain), 0);
  if (test::world().rank() == 0) {
    const Weights a = read_weights(dir.file("ema_straight/model_epoch_2.h5"));
    const Weights b = read_weights(o.model_dir + "/model_epoch_2.h5");
    ASSERT_FALSE(a.averaged.empty()) << "no averaged weights in the checkpoint";
    EXPECT_TRUE(same_bits(a.raw, b.raw));
    EXPECT_TRUE(same_bits(a.averaged, b.averaged));
    EXPECT_FALSE(same_bits(a.raw, a.averaged));  // an average, not a copy
    // Validation ran on the averages: an equal validation history.
    EXPECT_EQ(a.meta.valid_loss, b.meta.valid_loss);
    // Without --ema: the same raw weights, validated differently.
    const Weights c = read_weights(dir.file("plain/model_epoch_2.h5"));
    EXPECT_TRUE(c.averaged.empty());
    EXPECT_TRUE(same_bits(a.raw, c.raw));
    EXPECT_NE(a.meta.valid_loss, c.meta.valid_loss);
  }
}

// --min-delta larger than any change: every validation after the first is "no better", so
// --patience 2 stops after epoch 3 of 6, with model_epoch_3.h5 the last checkpoint. A preemption
// in epoch 2 and a resume stop at the same epoch with the same weights; a requeued job that
// finds the run stopped trains nothing and exits 0.
TEST(AveragingMpi, EarlyStoppingSurvivesAPreemptionAndARequeue) {
  SharedDir dir;
  auto o = options(dir, "stop_straight");
  o.epochs = 6;
  o.patience = 2;
  o.min_delta = 1e6;
  EXPECT_EQ(run(o), 0);
  o.model_dir = dir.file("stop_preempted");
  EXPECT_EQ(run(o, "0:6"), app::kExitPreempted);  // epoch 2, step 2
  EXPECT_EQ(run(o), 0);
  EXPECT_EQ(run(o), 0);  // requeued after the stop: nothing to do
  if (test::world().rank() == 0) {
    for (const char* run_dir : {"stop_straight", "stop_preempted"}) {
      SCOPED_TRACE(run_dir);
      const std::string d = dir.file(run_dir);
      EXPECT_TRUE(std::filesystem::exists(d + "/model_epoch_3.h5"));
      EXPECT_FALSE(std::filesystem::exists(d + "/model_epoch_4.h5"));
      const CheckpointMeta m = read_checkpoint_meta(d + "/model_epoch_3.h5");
      EXPECT_EQ(m.epoch, 3);
      EXPECT_EQ(m.early_stop_wait, 2);
    }
    EXPECT_TRUE(same_bits(read_weights(dir.file("stop_straight/model_epoch_3.h5")).raw,
                          read_weights(dir.file("stop_preempted/model_epoch_3.h5")).raw));
  }
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
