// Failure semantics of dptrain under mpiexec: an error on one rank mid-training prints one line
// from that rank and ends the whole job, non-zero, within seconds; distribution options' errors.
//
// Test hook: the hidden option --test-fault fail@R:S makes rank R throw a dp::Error in optimiser
// step S of the run (1-based), after its forward pass, while the other ranks are already waiting
// in that step's gradient all-reduce (app/train/fault_injection.hpp).
#include <gtest/gtest.h>

#include <chrono>

#include "test_util.hpp"
#include "train/trainer.hpp"

namespace dp {
namespace {

// The job must end within this long after a rank fails (the documented bound; it takes ~1 s here).
constexpr double kMaxSeconds = 30.0;
// A hung job is killed after this long (coreutils timeout), so the test fails instead of hanging.
constexpr int kKillAfterSeconds = 60;

std::string dptrain(int np, const std::string& args) {
  return test::mpiexec_command(test::mpiexec(), np, test::program("dptrain"), args, "",
                               kKillAfterSeconds);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Timed {
  test::CommandResult result;
  double seconds = 0;
};

Timed run_timed(const std::string& command) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t;
  t.result = test::run_command(command);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

class Failure : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 16, 4, 32);
  }
  std::string common() const {
    return "--data " + data_ + " --width-divisor 16 --batch-size 2 --epochs 3 --model-dir " +
           dir_.file("run");
  }
  test::TempDir dir_;
  std::string data_;
};

TEST_F(Failure, OneRankFailingMidStepEndsTheJobWithOneLine) {
  const Timed t = run_timed(dptrain(2, common() + " --test-fault fail@1:2"));
  std::printf("[failure] mpiexec exited with %d after %.1f s\n", t.result.status, t.seconds);
  EXPECT_NE(t.result.status, 0) << t.result.output;
  EXPECT_LT(t.seconds, kMaxSeconds) << t.result.output;
  EXPECT_EQ(count(t.result.output, "dptrain: error: [rank 1]"), 1) << t.result.output;
  EXPECT_EQ(count(t.result.output, "dptrain: error:"), 1) << t.result.output;
  EXPECT_NE(t.result.output.find("failing on purpose in step 2"), std::string::npos)
      << t.result.output;
}

TEST_F(Failure, RankZeroFailingWithoutOverlapOrWithAccumulationEndsTheJob) {
  for (const char* extra : {" --no-overlap", " --accumulation-steps 2 --bucket-mb 0.01"}) {
    const Timed t = run_timed(dptrain(2, common() + extra + " --test-fault fail@0:3"));
    EXPECT_NE(t.result.status, 0) << extra << "\n" << t.result.output;
    EXPECT_LT(t.seconds, kMaxSeconds) << extra << "\n" << t.result.output;
    EXPECT_EQ(count(t.result.output, "dptrain: error: [rank 0]"), 1) << t.result.output;
    EXPECT_EQ(count(t.result.output, "dptrain: error:"), 1) << t.result.output;
  }
}

TEST_F(Failure, MalformedHookIsAUsageError) {
  const auto r = test::run_command(dptrain(2, common() + " --test-fault fail@one"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_NE(r.output.find("--test-fault must be fail, preempt, nonfinite or hold @RANK:STEP"),
            std::string::npos)
      << r.output;
}

TEST_F(Failure, DistributionOptionErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {" --bucket-mb 0", "--bucket-mb must be positive"},
      {" --accumulation-steps 0", "--accumulation-steps must be at least 1"},
      {" --check-sync-every -1", "--check-sync-every must be >= 0"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = test::run_command(dptrain(2, common() + args));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  // Without a visible GPU (or without CUDA), --device cuda fails at start on every rank with one
  // line, whatever --allow-gpu-sharing says.
  const auto c = test::run_command(dptrain(2, common() + " --device cuda --allow-gpu-sharing"));
  EXPECT_EQ(c.status, 2) << c.output;
  EXPECT_EQ(count(c.output, "dptrain: error:"), 1) << c.output;
  EXPECT_NE(c.output.find("--device cuda"), std::string::npos) << c.output;
}

TEST(GpuForRank, LocalRankModuloVisibleGpusAndSharingNeedsConsent) {
  EXPECT_EQ(app::gpu_for_rank(0, 4, 4, false), 0);
  EXPECT_EQ(app::gpu_for_rank(3, 4, 4, false), 3);
  EXPECT_EQ(app::gpu_for_rank(1, 2, 8, false), 1);  // more GPUs than ranks: the first ones
  EXPECT_EQ(app::gpu_for_rank(5, 8, 4, true), 1);   // shared: modulo
  try {
    app::gpu_for_rank(2, 8, 4, false);
    ADD_FAILURE() << "8 ranks on 4 GPUs accepted without --allow-gpu-sharing";
  } catch (const app::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("8 ranks on this node but 4 visible GPU(s)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--allow-gpu-sharing"), std::string::npos) << e.what();
  }
}

TEST_F(Failure, DistributedOptionsTrainToTheEnd) {
  // The user-facing path of the options above: accumulation, small buckets, sync checks.
  const auto r = test::run_command(
      dptrain(2, common() + " --accumulation-steps 2 --bucket-mb 0.01 --check-sync-every 1"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 0) << r.output;
  EXPECT_NE(r.output.find("2 micro-batches per step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 3/3"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dp
