// dptrain and dpprep as a user runs them (under mpiexec): bad input gives one clear error line and
// a non-zero exit; a run checkpoints, resumes, skips a corrupt checkpoint and says when it is done.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/model.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

std::string dptrain(int np, const std::string& args) {
  return test::mpiexec() + " -n " + std::to_string(np) + " " + test::program("dptrain") + " " +
         args;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 8, 4, 32);
  }
  std::string data_args() const { return "--data " + data_ + " --width-divisor 16 --batch-size 2"; }
  std::string common() const { return data_args() + " --model-dir " + dir_.file("run"); }
  test::TempDir dir_;
  std::string data_;
};

// Ranks, node-local ranks and node names come from MPI alone: with the launchers' informational
// variables removed from every rank's environment (Open MPI's OMPI_COMM_WORLD_*, Hydra's
// MPI_LOCALRANKID/MPI_LOCALNRANKS, Slurm's task ids; the PMI wire-up ones stay, MPI_Init needs
// them) each rank still knows who and where it is, and 3 ranks train.
TEST_F(Cli, RanksAndNodesComeFromMpiNotLauncherVariables) {
  const std::string wrapper = dir_.file("clear_env.sh");
  std::ofstream(wrapper) << "#!/bin/sh\nexec env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE "
                            "-u OMPI_COMM_WORLD_LOCAL_RANK -u OMPI_COMM_WORLD_LOCAL_SIZE "
                            "-u OMPI_COMM_WORLD_NODE_RANK -u MPI_LOCALRANKID -u MPI_LOCALNRANKS "
                            "-u SLURM_PROCID -u SLURM_LOCALID -u SLURM_NTASKS \"$@\"\n";
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  const auto r =
      test::run_command(test::mpiexec() + " -n 3 " + wrapper + " " + test::program("dptrain") +
                        " " + common() + " --epochs 1 --log-all-ranks");
  ASSERT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string line = "rank " + std::to_string(rank) + " of 3 on node ";
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << line << "\n" << r.output;
    const std::string rest = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(rest.find(", node-local rank " + std::to_string(rank) + " of 3"), std::string::npos)
        << rest;
  }
}

TEST_F(Cli, BadOptionValueIsOneLineAndExit2) {
  const auto r = test::run_command(dptrain(2, common() + " --lr -1"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error: --lr must be positive"), 1) << r.output;
  const auto u = test::run_command(dptrain(1, "--no-such-option"));
  EXPECT_EQ(u.status, 2) << u.output;
  EXPECT_EQ(count(u.output, "dptrain: error:"), 1) << u.output;
  // A word that is no option (a forgotten "--data") is refused before anything trains.
  const auto w = test::run_command(dptrain(1, common() + " deepcrack.h5"));
  EXPECT_EQ(w.status, 2) << w.output;
  EXPECT_EQ(count(w.output, "dptrain: error: unexpected argument 'deepcrack.h5' (see --help)"), 1)
      << w.output;
  const auto m = test::run_command(dptrain(1, common() + " --model unet99"));
  EXPECT_EQ(m.status, 2) << m.output;
  EXPECT_NE(
      m.output.find("unknown --model 'unet99' (known: unet16, unet_resnet34, unet_resnet101)"),
      std::string::npos)
      << m.output;
  const auto p = test::run_command(dptrain(2, common() + " --precision fp16"));
  EXPECT_EQ(p.status, 2) << p.output;
  EXPECT_EQ(count(p.output, "dptrain: error: --precision must be fp32 or bf16, got 'fp16'"), 1)
      << p.output;
}

// --ema and --patience: a bad value is one usage-error line; a run with both says once that it
// averages, stops early with one line and exit 0, and a rerun of the same command trains nothing.
TEST_F(Cli, EmaAndEarlyStopping) {
  for (const auto& [args, error] :
       {std::pair{" --ema 1.5",
                  "dptrain: error: --ema must be a decay in [0, 1) (0: off), got 1.5"},
        std::pair{" --patience -1",
                  "dptrain: error: --patience must be >= 0 validations (0: never stop early), "
                  "got -1"}}) {
    const auto r = test::run_command(dptrain(2, common() + args));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "error:"), 1) << r.output;
    EXPECT_EQ(count(r.output, error), 1) << r.output;
  }
  const std::string run = common() + " --epochs 5 --ema 0.9 --patience 1 --min-delta 1e6";
  auto r = test::run_command(dptrain(2, run));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "weights: an exponential moving average with decay 0.9"), 1)
      << r.output;
  EXPECT_EQ(count(r.output, "stopped early at epoch 2: best epoch "), 1) << r.output;
  EXPECT_EQ(count(r.output, "epoch 3/5"), 0) << r.output;
  r = test::run_command(dptrain(2, run));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "run already stopped early at epoch 2: best epoch "), 1) << r.output;
  EXPECT_EQ(count(r.output, "epoch 3/5"), 0) << r.output;
}

// --cpu-conv winograd trains with Winograd where oneDNN has it on this CPU (`isa_cap`: the
// ONEDNN_MAX_CPU_ISA the ranks run under, "" for none) and is one usage-error line where it has
// not; `auto` names Winograd as a candidate only where it exists.
// `common` has every option but --model-dir.
void expect_cpu_conv_choices(const std::string& common, const test::TempDir& dir,
                             const std::string& isa_cap) {
  // Set for mpiexec, whose local ranks inherit it (Open MPI and Hydra alike).
  const std::string env = isa_cap.empty() ? "" : "env ONEDNN_MAX_CPU_ISA=" + isa_cap + " ";
  const auto run = [&](int np, const std::string& model_dir, const std::string& args) {
    return test::run_command(env + test::mpiexec() + " -n " + std::to_string(np) + " " +
                             test::program("dptrain") + " " + common + " --model-dir " +
                             dir.file(model_dir + isa_cap) + " " + args);
  };
  const auto w = run(2, "winograd", "--epochs 1 --cpu-conv winograd");
  const bool has_winograd = w.status == 0;
  if (has_winograd) {
    EXPECT_NE(w.output.find("fp32 convolutions (3x3: Winograd)"), std::string::npos) << w.output;
  } else {
    EXPECT_EQ(w.status, 2) << w.output;
    EXPECT_EQ(
        count(w.output, "--cpu-conv winograd: oneDNN has no Winograd convolution on this CPU"), 1)
        << w.output;
    EXPECT_EQ(w.output.find("(3x3: Winograd)"), std::string::npos) << w.output;
    EXPECT_EQ(count(w.output, "dptrain: error:"), 1) << w.output;
  }
  const auto a = run(1, "auto", "--epochs 1");
  EXPECT_EQ(a.status, 0) << a.output;
  EXPECT_NE(
      a.output.find(has_winograd
                        ? "(3x3: direct, Winograd or GEMMs, timed at first use)"
                        : "(3x3: direct on NHWC or on blocked copies, or GEMMs (shifted or "
                          "Winograd), timed at first use; oneDNN has no Winograd on this CPU)"),
      std::string::npos)
      << (isa_cap.empty() ? "native ISA" : isa_cap) << ":\n"
      << a.output;
}

// --cpu-conv: the choice is logged, a run trains with Winograd forced where the CPU has it (else
// one error line), --deterministic implies direct, an unknown value is refused.
TEST_F(Cli, CpuConvAlgorithmOption) {
  expect_cpu_conv_choices(data_args(), dir_, "");
  const auto d = test::run_command(dptrain(1, common() + " --epochs 1 --deterministic"));
  EXPECT_EQ(d.status, 0) << d.output;
  EXPECT_EQ(d.output.find("Winograd"), std::string::npos) << d.output;  // implies direct
  const auto b = test::run_command(dptrain(2, common() + " --cpu-conv fast"));
  EXPECT_EQ(b.status, 2) << b.output;
  EXPECT_EQ(count(b.output,
                  "dptrain: error: --cpu-conv must be auto, direct, shape, winograd, blocked, gemm "
                  "or gemm-winograd, got 'fast'"),
            1)
      << b.output;
}

// The AVX2 twin: oneDNN 2.6 has Winograd only from AVX-512 up, so on a larger CPU this runs the
// path an AVX2-only machine takes.
TEST_F(Cli, CpuConvAlgorithmOptionCappedAtAvx2) {
  expect_cpu_conv_choices(data_args(), dir_, "AVX2");
}

// --precision bf16 trains (and says so) where the CPU has bf16, else stops with the reason.
TEST_F(Cli, Bf16PrecisionTrainsOrNamesWhatIsMissing) {
  const auto r = test::run_command(dptrain(2, common() + " --epochs 1 --precision bf16"));
  if (dp::cpu_bf16_support().empty()) {
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("bf16 activations and convolutions"), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
    EXPECT_NE(r.output.find("AVX512-BF16"), std::string::npos) << r.output;
  }
}

TEST_F(Cli, MissingDataFileNamesThePath) {
  const auto r = test::run_command(
      dptrain(2, "--data " + dir_.file("absent.h5") + " --model-dir " + dir_.file("run")));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_NE(r.output.find(dir_.file("absent.h5")), std::string::npos) << r.output;
}

TEST_F(Cli, ImageSizeNotMultipleOf32IsRejected) {
  const std::string odd = dir_.file("odd.h5");
  const auto prep = test::run_command(std::string(test::program("dpprep")) + " synth --out " + odd +
                                      " --train 4 --val 2 --size 48x48");
  ASSERT_EQ(prep.status, 0) << prep.output;
  const auto r =
      test::run_command(dptrain(2, "--data " + odd + " --model-dir " + dir_.file("run")));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_NE(r.output.find("multiples of 32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(odd), std::string::npos) << r.output;
  // A crop of such a size is the crop's fault, not the dataset's (whose 32x32 images are fine).
  const auto crop = test::run_command(
      dptrain(2, "--data " + data_ + " --width-divisor 16 --random-crop 16x16 --model-dir " +
                     dir_.file("run2")));
  EXPECT_EQ(crop.status, 2) << crop.output;
  EXPECT_NE(crop.output.find("--random-crop: crops are 16x16"), std::string::npos) << crop.output;
}

TEST_F(Cli, UnwritableModelDirAndCudaWithoutBackend) {
  std::ofstream(dir_.file("plainfile")) << "x";
  const auto r = test::run_command(
      dptrain(2, "--data " + data_ + " --model-dir " + dir_.file("plainfile") + "/sub"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_NE(r.output.find("plainfile"), std::string::npos) << r.output;
  const auto c = test::run_command(dptrain(1, common() + " --device cuda"));
  EXPECT_EQ(c.status, 2) << c.output;
  EXPECT_NE(c.output.find("--device cuda"), std::string::npos) << c.output;
}

TEST_F(Cli, InitAndEncoderWeightsFromACheckpoint) {
  // A checkpoint of one run initialises another (whole model), or just its encoder.
  auto r = test::run_command(dptrain(1, common() + " --epochs 1"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string ckpt = dir_.file("run/model_epoch_1.h5");
  r = test::run_command(dptrain(2, "--data " + data_ + " --width-divisor 16 --batch-size 2 " +
                                       "--epochs 1 --model-dir " + dir_.file("init") +
                                       " --init-weights " + ckpt));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("model weights from " + ckpt + ": 50 tensors"), std::string::npos)
      << r.output;
  r = test::run_command(dptrain(2, "--data " + data_ + " --width-divisor 16 --batch-size 2 " +
                                       "--epochs 1 --model-dir " + dir_.file("enc") +
                                       " --encoder-weights " + ckpt));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("encoder weights from " + ckpt + ": 26 tensors"), std::string::npos)
      << r.output;
  // Another width: the first mismatching tensor is named, one line, exit 1.
  r = test::run_command(dptrain(2, "--data " + data_ + " --width-divisor 8 --batch-size 2 " +
                                       "--epochs 1 --model-dir " + dir_.file("bad") +
                                       " --encoder-weights " + ckpt));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count(r.output, "dptrain: error:"), 1) << r.output;
  EXPECT_NE(r.output.find("'conv1.0.bias' has shape [4] but unet16's conv1.0.bias is [8]"),
            std::string::npos)
      << r.output;
}

// --weight-init reaches the model: after one step at a rate of 1e-30, the checkpoint's weights
// are those of a model initialised here with the same seed and kind, within 1e-20 (He's zero
// biases included), and not those of the other kind.
TEST_F(Cli, WeightInitReachesTheModel) {
  auto be = make_cpu_backend();
  for (const std::string init : {"he", "pytorch"}) {
    SCOPED_TRACE(init);
    const std::string dir = dir_.file(init);
    auto r = test::run_command(dptrain(1, data_args() + " --epochs 1 --max-steps 1 --lr 1e-30 " +
                                              "--seed 9 --model-dir " + dir +
                                              (init == "he" ? "" : " --weight-init pytorch")));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("(--weight-init " + init + ")"), std::string::npos) << r.output;
    ModelConfig c;
    c.name = "unet16";
    c.width_divisor = 16;
    auto trained = make_model(c, *be);
    load_checkpoint(dir + "/model_epoch_1.h5", trained->params(), OptimizerState{});
    for (const bool he : {true, false}) {
      c.relu_init = he ? ModelConfig::ReluInit::kHe : ModelConfig::ReluInit::kPytorch;
      auto fresh = make_model(c, *be);
      fresh->params().initialize(9);
      double worst = 0;
      for (const ParamView& v : fresh->params().views()) {
        const ParamView* t = trained->params().find(v.name);
        for (int64_t i = 0; i < v.numel; ++i)
          worst = std::max(worst, double(std::fabs(v.host[i] - t->host[i])));
      }
      if (he == (init == "he"))
        EXPECT_LT(worst, 1e-20);
      else
        EXPECT_GT(worst, 1e-3);
    }
  }
}

TEST_F(Cli, TrainsCheckpointsResumesAndFinishes) {
  auto r = test::run_command(dptrain(2, common() + " --epochs 1"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("run/model_epoch_1.h5")));
  EXPECT_TRUE(std::filesystem::exists(dir_.file("run/model_best.h5")));
  EXPECT_NE(r.output.find("epoch 1/1"), std::string::npos) << r.output;
  // The printed configuration shows what runs: --lr-schedule auto resolved, before it is printed.
  const size_t schedule = r.output.find("LR schedule: constant (auto: ");
  EXPECT_NE(schedule, std::string::npos) << r.output;
  const size_t printed = r.output.find("\n  lr_schedule = constant\n");
  EXPECT_NE(printed, std::string::npos) << r.output;
  EXPECT_GT(printed, schedule) << r.output;
  EXPECT_EQ(r.output.find("lr_schedule = auto"), std::string::npos) << r.output;

  r = test::run_command(dptrain(2, common() + " --epochs 3"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from epoch 1"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "epoch 2/3"), 1) << r.output;
  EXPECT_EQ(count(r.output, "epoch 4/"), 0) << r.output;  // no extra epoch past --epochs

  r = test::run_command(dptrain(2, common() + " --epochs 3"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("run already complete"), std::string::npos) << r.output;
  // Resuming with another loss is allowed, and said (one line, from rank 0).
  EXPECT_EQ(count(r.output, "another loss"), 0) << r.output;
  r = test::run_command(dptrain(2, common() + " --epochs 3 --loss bce --pos-weight dataset"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output,
                  "was trained with another loss (loss bce+dice -> bce, pos_weight "
                  "sqrt -> dataset); training continues with this run's"),
            1)
      << r.output;

  // A torn newest checkpoint is reported and the previous one is used.
  std::filesystem::resize_file(dir_.file("run/model_epoch_3.h5"), 1000);
  r = test::run_command(dptrain(2, common() + " --epochs 3"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("skipping unreadable checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from epoch 2"), std::string::npos) << r.output;
  // No temporary file is left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir_.file("run")))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  // Another base rate (here --lr's default with --weight-init pytorch) is said, once.
  EXPECT_EQ(count(r.output, "was trained at --lr"), 0) << r.output;
  r = test::run_command(dptrain(2, common() + " --epochs 4 --weight-init pytorch"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output,
                  "was trained at --lr 0.003; training continues at this run's 0.001 "
                  "(give --lr 0.003 to keep it)"),
            1)
      << r.output;
}

// --synth-cache with a bare file name: the synthetic dataset goes to the working directory (it
// used to fail with "cannot create directories: Invalid argument []").
TEST_F(Cli, SyntheticCacheInTheWorkingDirectory) {
  const auto r = test::run_command("cd " + dir_.path() + " && " +
                                   dptrain(1,
                                           "--synth-cache synth.h5 --width-divisor 16 "
                                           "--epochs 1 --max-steps 1 --model-dir run"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("synth.h5")));
}

}  // namespace
}  // namespace dp
