// --save-every and --keep-last: the retention decisions, and dptrain's files after a run, a
// preemption at an unsaved epoch boundary and its resume.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.hpp"
#include "train/retention.hpp"

namespace dp {
namespace {

using app::kExitPreempted;

std::string dptrain(int np, const std::string& args) {
  return test::mpiexec_command(test::mpiexec(), np, test::program("dptrain"), args);
}

TEST(Retention, SaveEveryWritesEveryEEpochsAndTheLast) {
  std::vector<int64_t> saved;
  for (int64_t e = 1; e <= 7; ++e)
    if (app::epoch_checkpoint_due(e, 3, 7)) saved.push_back(e);
  EXPECT_EQ(saved, (std::vector<int64_t>{3, 6, 7}));
  for (int64_t e = 1; e <= 3; ++e) EXPECT_TRUE(app::epoch_checkpoint_due(e, 1, 3));
}

TEST(Retention, KeepLastSparesTheNewestAndMidEpochFiles) {
  // Newest first, as list_checkpoints gives them.
  const std::vector<CheckpointFile> files{{5, 2, "e5s2"}, {5, 0, "e5"}, {4, 0, "e4"},
                                          {3, 1, "e3s1"}, {3, 0, "e3"}, {1, 0, "e1"}};
  EXPECT_EQ(app::checkpoints_beyond(files, 2), (std::vector<std::string>{"e3", "e1"}));
  EXPECT_EQ(app::checkpoints_beyond(files, 1), (std::vector<std::string>{"e4", "e3", "e1"}));
  EXPECT_TRUE(app::checkpoints_beyond(files, 0).empty());  // 0 keeps everything
  EXPECT_TRUE(app::checkpoints_beyond(files, 9).empty());
  const std::vector<CheckpointFile> only{{2, 0, "e2"}};
  EXPECT_TRUE(app::checkpoints_beyond(only, 1).empty());
}

TEST(RetentionCli, SaveEveryKeepLastAndAPreemptionAtAnUnsavedEpoch) {
  test::TempDir dir;
  test::write_tiny_dataset(dir.file("tiny.h5"), 8, 4, 32);
  const std::string run = dir.file("run");
  auto exists = [&](const char* name) { return std::filesystem::exists(run + "/" + name); };
  const std::string common = "--data " + dir.file("tiny.h5") +
                             " --width-divisor 16 --batch-size 2 --save-every 2 --keep-last 2 "
                             "--model-dir " +
                             run;
  // 8 samples, batch 2, one rank: 4 steps an epoch. A signal after step 4 (epoch 1's last) is
  // acted on at the end of epoch 1, which --save-every 2 would not save: it is saved anyway.
  const auto p = test::run_command(dptrain(1, common + " --epochs 5 --test-fault preempt@0:4"));
  EXPECT_EQ(p.status, kExitPreempted) << p.output;
  EXPECT_TRUE(exists("model_epoch_1.h5")) << p.output;
  EXPECT_TRUE(exists("model_best.h5")) << p.output;

  const auto r = test::run_command(dptrain(1, common + " --epochs 5"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from epoch 1"), std::string::npos) << r.output;
  // Saved: 1 (preempted), 2, 4, 5 (the last); --keep-last 2 leaves 4 and 5, and model_best.h5.
  EXPECT_FALSE(exists("model_epoch_1.h5")) << r.output;
  EXPECT_FALSE(exists("model_epoch_2.h5")) << r.output;
  EXPECT_FALSE(exists("model_epoch_3.h5")) << r.output;
  EXPECT_TRUE(exists("model_epoch_4.h5")) << r.output;
  EXPECT_TRUE(exists("model_epoch_5.h5")) << r.output;
  EXPECT_TRUE(exists("model_best.h5")) << r.output;
  EXPECT_NE(r.output.find("--keep-last 2: removed"), std::string::npos) << r.output;

  for (const char* bad : {" --save-every 0", " --keep-last -1"}) {
    const auto b = test::run_command(dptrain(1, common + bad));
    EXPECT_EQ(b.status, 2) << b.output;
  }
}

}  // namespace
}  // namespace dp
