// Faults a week-long run must survive: divergence stops with its own exit status and
// leaves only finite checkpoints, a stopped rank ends the job through the stall watchdog, a second
// dptrain on a held --model-dir is refused, and a full disk loses no checkpoint.
//
// Test hook: the hidden option --test-fault nonfinite@R:S makes rank R's loss NaN in optimiser
// step S of the run (app/train/fault_injection.hpp). The tiny run below has 4 optimiser steps per
// epoch on 2 ranks.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dp/checkpoint.hpp"
#include "dp/model.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

namespace fs = std::filesystem;

// A hung job is killed after this long (coreutils timeout), so a test fails instead of hanging.
constexpr int kKillAfterSeconds = 120;

std::string mpiexec(int np) {
  return "timeout -k 5 " + std::to_string(kKillAfterSeconds) + " " + test::mpiexec() + " -n " +
         std::to_string(np) + " ";
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Loads a checkpoint of the tiny model (UNet16 / 16) and says whether its weights and momentum
// are all finite (the checksum is verified by load_checkpoint).
bool checkpoint_is_finite(const std::string& path) {
  auto backend = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto model = make_model(mc, *backend);
  std::vector<float> momentum(size_t(model->params().arena_size()));
  load_checkpoint(path, model->params(), momentum.data());
  const float* w = model->params().values();
  for (int64_t i = 0; i < model->params().arena_size(); ++i)
    if (!std::isfinite(w[i]) || !std::isfinite(momentum[size_t(i)])) return false;
  return true;
}

std::vector<std::string> h5_files(const std::string& dir) {
  std::vector<std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  return files;
}

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 16, 4, 32);
  }
  // SGD: the checks below read and write its one-tensor state (momentum) beside the weights.
  std::string args(const std::string& model_dir, int epochs) const {
    return std::string(test::program("dptrain")) + " --data " + data_ +
           " --width-divisor 16 --batch-size 2 --optimizer sgd --epochs " + std::to_string(epochs) +
           " --model-dir " + model_dir;
  }
  test::TempDir dir_;
  std::string data_;
};

TEST_F(Faults, DivergenceStopsWithItsOwnStatusAndWritesNoNonFiniteCheckpoint) {
  // The real thing: a learning rate that makes the gradients overflow.
  const std::string diverged = dir_.file("diverged");
  const auto r = test::run_command(mpiexec(2) + args(diverged, 3) + " --lr 1e4");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "dptrain: error: [rank 0] training diverged in epoch"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "non-finite")) << r.output;
  for (const std::string& f : h5_files(diverged)) EXPECT_TRUE(checkpoint_is_finite(f)) << f;

  // A NaN loss on rank 1 in the 2nd step of epoch 2: the line names the rank, epoch and step;
  // epoch 1's checkpoints stay and are finite, epoch 2 writes none.
  const std::string hooked = dir_.file("hooked");
  const auto h = test::run_command(mpiexec(2) + args(hooked, 3) + " --test-fault nonfinite@1:6");
  EXPECT_EQ(h.status, 3) << h.output;
  EXPECT_EQ(count(h.output, "dptrain: error:"), 1) << h.output;
  EXPECT_TRUE(contains(h.output,
                       "training diverged in epoch 2, step 2 (optimiser step 6 of the "
                       "run): non-finite loss on rank(s) 1;"))
      << h.output;
  EXPECT_TRUE(contains(h.output, "model_epoch_1.h5")) << h.output;  // the newest is named
  EXPECT_TRUE(checkpoint_is_finite(hooked + "/model_epoch_1.h5"));
  EXPECT_TRUE(checkpoint_is_finite(hooked + "/model_best.h5"));
  EXPECT_FALSE(fs::exists(hooked + "/model_epoch_2.h5"));
}

TEST_F(Faults, SkipNonFiniteStepsSkipsThenStops) {
  const auto r = test::run_command(mpiexec(2) + args(dir_.file("skip"), 3) +
                                   " --skip-nonfinite-steps 1 --test-fault nonfinite@1:6");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "warning: skipped epoch 2, step 2"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "epoch 3/3")) << r.output;
  // The skipped step's loss is not in the epoch's mean.
  EXPECT_FALSE(contains(r.output, "train_loss nan")) << r.output;
  EXPECT_TRUE(checkpoint_is_finite(dir_.file("skip/model_epoch_3.h5")));
}

TEST_F(Faults, ResumeSkipsANonFiniteCheckpoint) {
  const std::string run = dir_.file("run");
  ASSERT_EQ(test::run_command(mpiexec(2) + args(run, 2)).status, 0);
  // Plant model_epoch_3.h5: epoch 2's checkpoint with one NaN weight (a valid file otherwise).
  {
    auto backend = make_cpu_backend();
    ModelConfig mc;
    mc.width_divisor = 16;
    auto model = make_model(mc, *backend);
    std::vector<float> momentum(size_t(model->params().arena_size()));
    CheckpointMeta meta =
        load_checkpoint(run + "/model_epoch_2.h5", model->params(), momentum.data());
    meta.epoch = 3;
    model->params().values()[model->params().views().front().offset] = std::nanf("");
    save_checkpoint(run + "/model_epoch_3.h5", model->params(), momentum.data(), meta);
    save_checkpoint(dir_.file("bad.h5"), model->params(), momentum.data(), meta);
  }
  const auto r = test::run_command(mpiexec(2) + args(run, 4));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "model_epoch_3.h5' holds non-finite values (parameter '"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from epoch 2")) << r.output;
  EXPECT_TRUE(checkpoint_is_finite(run + "/model_epoch_3.h5"));  // rewritten by the resumed run
  EXPECT_TRUE(checkpoint_is_finite(run + "/model_epoch_4.h5"));
  // Named explicitly, such a file is an error, not a silent fresh start.
  const auto bad = test::run_command(mpiexec(2) + args(dir_.file("other"), 4) + " --resume " +
                                     dir_.file("bad.h5"));
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_EQ(count(bad.output, "dptrain: error:"), 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, "bad.h5' holds non-finite values")) << bad.output;
}

// Runs a 2-rank job in the background, each rank's pid in <dir>/pid.<rank>, until `action`
// (shell, with $P1 = rank 1's pid) has run; returns the job's log, then its exit status and the
// milliseconds from the action to the end of the job in a last line "status S ms T".
test::CommandResult run_with_action(const std::string& dir, const std::string& job,
                                    const std::string& action) {
  const std::string script = dir + "/job.sh";
  std::ofstream(script) << "#!/bin/sh\necho $$ > " << dir
                        << "/pid.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\nexec " << job << "\n";
  const std::string log = dir + "/job.log";
  std::ostringstream cmd;
  cmd << "cd " << dir << "; (" << mpiexec(2) << "sh " << script << " > " << log
      << " 2>&1; echo $? > status) & "
      << "for i in $(seq 1000); do grep -q 'epoch 1/' " << log
      << " 2>/dev/null && test -s pid.1 && break; sleep 0.1; done; P1=$(cat pid.1); " << action
      << "; t0=$(date +%s%N); while ! test -s status; do sleep 0.2; done; "
      << "t1=$(date +%s%N); kill -KILL $P1 2>/dev/null; cat " << log
      << "; echo status $(cat status) ms $(( (t1 - t0) / 1000000 ))";
  return test::run_command(cmd.str());
}

double seconds_of(const std::string& output) {
  const size_t at = output.rfind(" ms ");
  return at == std::string::npos ? 1e9 : std::stod(output.substr(at + 4)) / 1000;
}

TEST_F(Faults, StalledRankEndsTheJobNamingIt) {
  // Rank 1 stopped (SIGSTOP) mid-run; rank 0 waits in a collective: after --stall-timeout 20 the
  // job ends with the stall line and status 4, within 40 s of the stop.
  const auto r = run_with_action(
      dir_.path(),
      args(dir_.file("stalled"), 100000) + " --stall-timeout 20 --val-every 1000 --save-every 1000",
      "sleep 1; kill -STOP $P1");
  std::printf("[stall] %s\n", r.output.substr(r.output.rfind("status")).c_str());
  EXPECT_TRUE(contains(r.output, "status 4 ms")) << r.output;
  EXPECT_LT(seconds_of(r.output), 40.0) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "dptrain: error: [rank 0] stalled: waited 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank(s) 1 of 2 did not answer")) << r.output;
}

TEST_F(Faults, SlowRankWithinTheLimitIsNotKilled) {
  // Stopped for 6 s with --stall-timeout 20, then continued and preempted: the job ends with the
  // preemption status (75), not the stall status.
  const auto r = run_with_action(
      dir_.path(),
      args(dir_.file("slow"), 100000) + " --stall-timeout 20 --val-every 1000 --save-every 1000",
      "sleep 1; kill -STOP $P1; sleep 6; kill -CONT $P1; sleep 1; kill -USR1 $P1");
  EXPECT_TRUE(contains(r.output, "status 75 ms")) << r.output;
  EXPECT_FALSE(contains(r.output, "stalled")) << r.output;
}

TEST_F(Faults, SecondJobOnAHeldModelDirIsRefused) {
  const std::string run = dir_.file("held");
  const std::string first_log = dir_.file("first.log");
  // The holder: a long run, killed with SIGKILL once the second job has been refused.
  const std::string start = std::string("(") + mpiexec(1) + "env SLURM_JOB_ID=4242 " +
                            args(run, 100000) + " --val-every 1000 --save-every 1000 > " +
                            first_log + " 2>&1 &) ; for i in $(seq 1000); do grep -q 'epoch 1/' " +
                            first_log + " 2>/dev/null && break; sleep 0.1; done";
  ASSERT_EQ(test::run_command(start).status, 0);
  const std::string holder = read_file(run + "/.dptrain.lock");
  ASSERT_TRUE(contains(holder, "Slurm job 4242")) << holder;
  const std::string pid =
      holder.substr(holder.find(" pid ") + 5, holder.find(" Slurm") - holder.find(" pid ") - 5);

  const auto second = test::run_command(mpiexec(2) + args(run, 2));
  EXPECT_EQ(second.status, 5) << second.output;
  EXPECT_EQ(count(second.output, "dptrain: error:"), 1) << second.output;
  EXPECT_TRUE(contains(second.output, "is in use by another dptrain (host ")) << second.output;
  EXPECT_TRUE(contains(second.output, " pid " + pid + " Slurm job 4242")) << second.output;

  // The holder dies without cleaning up: the kernel released its lock, the directory is usable.
  ASSERT_EQ(test::run_command("kill -KILL " + pid).status, 0);
  test::run_command("for i in $(seq 100); do kill -0 " + pid +
                    " 2>/dev/null || break; sleep 0.1; done");
  const auto again = test::run_command(mpiexec(2) + args(run, 1) + " --resume never");
  EXPECT_EQ(again.status, 0) << again.output;
}

// A tmpfs of `kib` KiB at `dir` (root only), unmounted on destruction.
class Tmpfs {
 public:
  Tmpfs(const std::string& dir, int kib) : dir_(dir) {
    fs::create_directories(dir);
    mounted_ =
        mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + std::to_string(kib) + "k").c_str()) == 0;
  }
  ~Tmpfs() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  bool resize(int kib) const {
    return mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT,
                 ("size=" + std::to_string(kib) + "k").c_str()) == 0;
  }

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST_F(Faults, FullDiskLosesNoCheckpointAndTheRerunResumes) {
  // Room for epoch 1's two checkpoints (model_epoch_1.h5 and model_best.h5, ~0.95 MB each) but
  // not for epoch 2's.
  const std::string run = dir_.file("small_disk");
  Tmpfs disk(run, 2500);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const auto r = test::run_command(mpiexec(2) + args(run, 3));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "writing checkpoint")) << r.output;
  EXPECT_TRUE(checkpoint_is_finite(run + "/model_epoch_1.h5"));
  EXPECT_FALSE(fs::exists(run + "/model_epoch_2.h5"));
  for (const auto& e : fs::directory_iterator(run)) {  // no temporary or partial file
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "model_epoch_1.h5" || name == "model_best.h5" || name == "metrics.csv" ||
                name == ".dptrain.lock")
        << name;
  }
  ASSERT_TRUE(disk.resize(16 * 1024));
  const auto again = test::run_command(mpiexec(2) + args(run, 3));
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "resumed from epoch 1")) << again.output;
  EXPECT_TRUE(checkpoint_is_finite(run + "/model_epoch_3.h5"));
}

}  // namespace
}  // namespace dp
