// Preemption as a user sees it (dptrain under mpiexec -n 2): SIGUSR1 or the --preempt-signal one
// (sent to mpiexec, which forwards it, or raised on one rank by the hidden --test-fault
// preempt@R:S) ends the job with exit code 75 after a mid-epoch checkpoint; rerunning the same
// command resumes at that step.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>

#include "test_util.hpp"

namespace dp {
namespace {

using app::kExitPreempted;

std::string dptrain(int np, const std::string& args) {
  return test::mpiexec_command(test::mpiexec(), np, test::program("dptrain"), args);
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

class Preempt : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 16, 4, 32);
  }
  std::string common(int epochs, const std::string& run = "run") const {
    return "--data " + data_ + " --width-divisor 16 --batch-size 2 --epochs " +
           std::to_string(epochs) + " --model-dir " + dir_.file(run);
  }
  test::TempDir dir_;
  std::string data_;
};

TEST_F(Preempt, SignalOnOneRankCheckpointsMidEpochExits75AndTheRerunResumes) {
  const auto p = test::run_command(dptrain(2, common(2) + " --test-fault preempt@1:3"));
  std::printf("%s", p.output.c_str());
  EXPECT_EQ(p.status, kExitPreempted) << p.output;
  EXPECT_TRUE(has(p.output, "received by 1 of 2 rank(s); stopping after step 3")) << p.output;
  EXPECT_TRUE(has(p.output, "preempted in epoch 1 after step 3")) << p.output;
  EXPECT_FALSE(has(p.output, "error")) << p.output;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("run/model_epoch_0_step_3.h5")));

  const auto r = test::run_command(dptrain(2, common(2)));
  std::printf("%s", r.output.c_str());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "resumed from epoch 0 (" + dir_.file("run/model_epoch_0_step_3.h5") +
                                ", step 3); epoch 1 continues after its step 3"))
      << r.output;
  EXPECT_TRUE(has(r.output, "epoch 2/2")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("run/model_epoch_0_step_3.h5")));
}

// A signal during start-up (here raised on every rank before MPI starts) is not lost and does not
// kill the ranks: the job stops resumably at the first step boundary.
TEST_F(Preempt, SignalDuringStartUpStopsAtTheFirstStep) {
  const auto p = test::run_command(dptrain(2, common(2) + " --test-fault preempt-at-start"));
  std::printf("%s", p.output.c_str());
  EXPECT_EQ(p.status, kExitPreempted) << p.output;
  EXPECT_TRUE(has(p.output, "received by 2 of 2 rank(s); stopping after step 1")) << p.output;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("run/model_epoch_0_step_1.h5")));
}

// A signal sent to mpiexec, which forwards it: SIGUSR1 by default, SIGUSR2 with
// --preempt-signal USR2 (what a job script uses where NCCL 2.12 takes SIGUSR1; Open MPI's mpiexec
// forwards it, Hydra's does not).
TEST_F(Preempt, SignalToMpiexecStopsTheJobResumably) {
  for (const auto& [args, signal] :
       {std::pair<std::string, std::string>{"", "USR1"}, {" --preempt-signal USR2", "USR2"}}) {
    if (signal == "USR2" && test::mpi_family() == "mpich") {
      // Hydra's mpiexec forwards SIGUSR1 but dies of SIGUSR2 (exit 140) without passing it on:
      // under MPICH, USR2 must reach the ranks themselves (srun, or Slurm's --signal without B:).
      std::printf("[preempt] USR2 to mpiexec not tried: Hydra does not forward it\n");
      continue;
    }
    // A long run; once its first epoch is logged, mpiexec gets the signal and forwards it.
    const std::string log = dir_.file("log_" + signal + ".txt");
    // (popen's shell runs it; built with append: GCC 12's -Wrestrict misfires on operator+.)
    // $P is mpiexec itself (exec; coreutils timeout would not forward it), bounded by ctest.
    std::string script = "(exec ";
    script.append(test::mpiexec()).append(" -n 2 ").append(test::program("dptrain")).append(" ");
    script.append(common(1000, "run_" + signal)).append(args);
    script.append(") > ").append(log);
    script.append(" 2>&1 & P=$!; for i in $(seq 600); do grep -q 'epoch 1/' ").append(log);
    script.append(" && break; sleep 0.1; done; kill -").append(signal).append(" $P; wait $P; ");
    script.append("echo exit=$?; cat ").append(log);
    const auto r = test::run_command(script);
    // Hydra (MPICH 4.0's mpiexec) exits 0 after forwarding a SIGUSR1 although every rank exits
    // 75; the ranks' line says it (INSTALL.md: launch with srun under MPICH).
    if (test::mpi_family() == "mpich")
      EXPECT_TRUE(has(r.output, "exit=75") || has(r.output, "exit=0")) << r.output;
    else
      EXPECT_TRUE(has(r.output, "exit=75")) << signal << "\n" << r.output;
    EXPECT_TRUE(has(r.output, "exiting with 75")) << r.output;
    EXPECT_TRUE(has(r.output, "preempted")) << signal << "\n" << r.output;
    EXPECT_TRUE(has(r.output, "SIG" + signal + " received by ")) << r.output;  // Hydra: 1 rank
  }
}

// --preempt-signal names the signals (several allowed; the start-up line lists them); the test
// hook raises the first; an unknown name is one usage error.
TEST_F(Preempt, PreemptSignalOptionChoosesTheSignals) {
  const auto p = test::run_command(dptrain(
      2, common(2) + " --preempt-signal USR2 --preempt-signal=term --test-fault preempt@1:3"));
  EXPECT_EQ(p.status, kExitPreempted) << p.output;
  EXPECT_TRUE(has(p.output, "preemption: SIGUSR2, SIGTERM -> checkpoint at the next step, exit 75"))
      << p.output;
  EXPECT_TRUE(has(p.output, "preemption: SIGUSR2, SIGTERM received by 1 of 2 rank(s)")) << p.output;
  const auto bad = test::run_command(dptrain(1, common(2) + " --preempt-signal KILL"));
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_TRUE(has(bad.output, "--preempt-signal: unknown signal 'KILL'")) << bad.output;
}

}  // namespace
}  // namespace dp
