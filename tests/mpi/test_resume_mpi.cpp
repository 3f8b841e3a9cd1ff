// Preemption and resume under mpiexec -n 2: a SIGUSR1 on one rank mid-epoch makes every rank stop
// at the same step boundary with a mid-epoch checkpoint and exit code 75; resuming from it ends
// with bit-identical weights to an uninterrupted run; a checkpoint resumes on another world size.
//
// Test hook: TrainOptions::test_faults (--test-fault preempt@R:S) makes rank R raise SIGUSR1 after
// optimiser step S of the run (app/train/fault_injection.hpp), so only that rank receives it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

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

app::TrainOptions options(const SharedDir& dir, const std::string& run, int batch) {
  app::TrainOptions o = test::tiny_training(dir.file("data.h5"), dir.file(run), batch);
  o.deterministic = true;  // the bitwise comparisons below are what --deterministic promises
  o.epochs = 2;
  return o;
}

// Runs a Trainer with --test-fault preempt@AT (nullptr: none); returns run()'s exit code.
int run_with_preempt_at(app::TrainOptions o, const char* at, Comm& comm) {
  if (at != nullptr) o.test_faults = {app::parse_planted_fault(std::string("preempt@") + at)};
  app::Trainer t(o, comm, test::quiet_logger());
  return t.run();
}

struct Loaded {
  std::vector<float> weights, momentum;
  CheckpointMeta meta;
};

Loaded load(const std::string& path) {
  auto be = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto m = make_model(mc, *be);
  Loaded l;
  l.momentum.resize(size_t(m->params().arena_size()));
  l.meta = load_checkpoint(path, m->params(), l.momentum.data());
  l.weights.assign(m->params().values(), m->params().values() + m->params().arena_size());
  return l;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ResumeMpi, SignalMidEpochOnOneRankThenResumeEqualsUninterruptedBitwise) {
  ASSERT_EQ(test::world().size(), 2) << "run this test with mpiexec -n 2";
  SharedDir dir;
  // 16 samples, 2 ranks: batch 2 -> 4 steps per epoch; batch 1 x 2 micro-batches -> 4 steps.
  for (const auto& [batch, accumulation] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const std::string tag = str_cat("b", batch, "a", accumulation);
    auto o = options(dir, "straight_" + tag, batch);
    o.accumulation_steps = accumulation;
    EXPECT_EQ(run_with_preempt_at(o, nullptr, test::world()), 0);

    // Rank 1 is signalled after step 2 (epoch 1), then rank 0 after step 7 (epoch 2, step 3).
    o.model_dir = dir.file("preempted_" + tag);
    EXPECT_EQ(run_with_preempt_at(o, "1:2", test::world()), app::kExitPreempted);
    EXPECT_TRUE(std::filesystem::exists(o.model_dir + "/model_epoch_0_step_2.h5"));
    {
      app::Trainer t(o, test::world(), test::quiet_logger());
      EXPECT_EQ(t.start_epoch(), 0);
      EXPECT_EQ(t.state().epoch_step, 2);
      EXPECT_EQ(t.state().epoch_position, 2 * batch * accumulation * 2);
      EXPECT_EQ(t.state().step, 2);
    }
    EXPECT_EQ(run_with_preempt_at(o, "0:7", test::world()), app::kExitPreempted);
    // The finished epoch's checkpoint replaced the mid-epoch one of epoch 1.
    EXPECT_FALSE(std::filesystem::exists(o.model_dir + "/model_epoch_0_step_2.h5"));
    EXPECT_TRUE(std::filesystem::exists(o.model_dir + "/model_epoch_1_step_3.h5"));
    EXPECT_EQ(run_with_preempt_at(o, nullptr, test::world()), 0);

    if (test::world().rank() == 0) {
      const Loaded a = load(dir.file("straight_" + tag + "/model_epoch_2.h5"));
      const Loaded b = load(o.model_dir + "/model_epoch_2.h5");
      EXPECT_TRUE(bitwise_equal(a.weights, b.weights)) << tag;
      EXPECT_TRUE(bitwise_equal(a.momentum, b.momentum)) << tag;
      EXPECT_EQ(a.meta.step, b.meta.step);
      EXPECT_EQ(b.meta.epoch_step, 0);
      ASSERT_EQ(b.meta.train_loss.size(), 2u);
      // The epochs' losses combine the sums before and after the interruption.
      for (size_t e = 0; e < 2; ++e) {
        EXPECT_NEAR(a.meta.train_loss[e], b.meta.train_loss[e], 1e-9 * a.meta.train_loss[e]);
        EXPECT_EQ(a.meta.valid_loss[e], b.meta.valid_loss[e]);
      }
    }
  }
}

// The same with --precision bf16 (bf16 activations; master weights and momentum stay fp32):
// preempted mid-epoch on one rank and resumed, the run ends bit-identical to the uninterrupted one.
TEST(ResumeMpi, Bf16ResumeEqualsUninterruptedBitwise) {
  ASSERT_EQ(test::world().size(), 2) << "run this test with mpiexec -n 2";
  if (!cpu_bf16_support().empty()) GTEST_SKIP() << "no bf16 on this CPU: " << cpu_bf16_support();
  SharedDir dir;
  auto o = options(dir, "bf16_straight", 2);
  o.precision = Precision::kBFloat16;
  EXPECT_EQ(run_with_preempt_at(o, nullptr, test::world()), 0);
  o.model_dir = dir.file("bf16_preempted");
  EXPECT_EQ(run_with_preempt_at(o, "1:2", test::world()), app::kExitPreempted);
  EXPECT_EQ(run_with_preempt_at(o, nullptr, test::world()), 0);
  const auto fp32 = options(dir, "fp32_straight", 2);
  EXPECT_EQ(run_with_preempt_at(fp32, nullptr, test::world()), 0);
  if (test::world().rank() == 0) {
    const Loaded a = load(dir.file("bf16_straight/model_epoch_2.h5"));
    const Loaded b = load(o.model_dir + "/model_epoch_2.h5");
    EXPECT_TRUE(bitwise_equal(a.weights, b.weights));
    EXPECT_TRUE(bitwise_equal(a.momentum, b.momentum));
    EXPECT_EQ(a.meta.step, b.meta.step);
    // bf16 really ran: the weights are not the fp32 run's.
    EXPECT_FALSE(
        bitwise_equal(a.weights, load(dir.file("fp32_straight/model_epoch_2.h5")).weights));
  }
}

// The global sample order is a function of (seed, epoch), so a run checkpointed on 2 ranks x
// batch 2 continues on 1 rank x batch 4 (the same global batch) like the uninterrupted run, up to
// the summation order of the reductions -- after an epoch and mid-epoch.
TEST(ResumeMpi, ResumesOnAnotherWorldSizeWithTheSameGlobalOrder) {
  ASSERT_EQ(test::world().size(), 2) << "run this test with mpiexec -n 2";
  SharedDir dir;
  auto o = options(dir, "straight", 2);
  EXPECT_EQ(run_with_preempt_at(o, nullptr, test::world()), 0);
  // Epoch boundary: stop after epoch 1 (signal at its last step), and mid-epoch (after step 6).
  for (const char* at : {"1:4", "0:6"}) {
    o.model_dir = dir.file(std::string("np2_") + at[0]);
    EXPECT_EQ(run_with_preempt_at(o, at, test::world()), app::kExitPreempted) << at;
    if (test::world().rank() != 0) continue;
    SelfComm self;
    auto one = o;
    one.batch_size = 4;
    EXPECT_EQ(run_with_preempt_at(one, nullptr, self), 0) << at;
    const Loaded a = load(dir.file("straight/model_epoch_2.h5"));
    const Loaded b = load(one.model_dir + "/model_epoch_2.h5");
    const test::Diff d =
        test::compare(b.weights.data(), a.weights.data(), int64_t(a.weights.size()), 1e-2);
    std::printf("[world 2 -> 1 at %s] max rel weight diff %.3e\n", at, d.max_rel);
    EXPECT_LT(d.max_rel, 1e-4) << at;
    EXPECT_EQ(b.meta.step, a.meta.step) << at;
    EXPECT_EQ(b.meta.world_size, 1);
  }
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  return dp::test::mpi_test_main(argc, argv);
}
