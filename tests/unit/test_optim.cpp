// AdamW, global-norm gradient clipping, LR schedules and scaling against PyTorch's numbers
// (tools/reference/optim_reference.py, torch 1.13, float64), AdamW state in checkpoints, and
// dptrain's --optimizer adamw resume ≡ an uninterrupted run, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "dp/adamw.hpp"
#include "dp/checkpoint.hpp"
#include "dp/error.hpp"
#include "dp/model.hpp"
#include "dp/weight_average.hpp"
#include "test_util.hpp"
#include "train/optimization.hpp"
#include "train/options.hpp"

namespace dp {
namespace {

constexpr double kFloatTolerance = 2e-6;  // float32 arithmetic against float64 references
constexpr int kKillAfterSeconds = 120;

std::string dptrain(int np, const std::string& args) {
  return "timeout -k 5 " + std::to_string(kKillAfterSeconds) + " " + test::mpiexec() + " -n " +
         std::to_string(np) + " " + test::program("dptrain") + " " + args;
}

TEST(AdamW, ThreeStepsMatchTorch) {
  ParamStore ps;
  ps.add("w", {5}, 1);
  ps.finalize();
  const float init[5] = {0.5f, -1.25f, 2.0f, 0.0f, -0.75f};
  const float grads[3][5] = {{0.3f, -0.2f, 1.5f, 0.0f, -4.0f},
                             {-0.1f, 0.4f, 1.0f, 2.0f, -3.0f},
                             {0.2f, 0.2f, -0.5f, 1.0f, 0.5f}};
  float* p = ps.view(0).value;
  std::memcpy(p, init, sizeof init);
  auto backend = make_cpu_backend();
  AdamW opt(ps, *backend, AdamWOptions{0.9f, 0.99f, 1e-8f, 0.05f});
  for (int t = 1; t <= 3; ++t) {
    std::memcpy(ps.view(0).grad, grads[t - 1], sizeof init);
    opt.update(0.1f, t);
  }
  // tools/reference/optim_reference.py: torch.optim.AdamW(lr=0.1, betas=(0.9, 0.99), eps=1e-8,
  // weight_decay=0.05), three steps with these gradients.
  const double want_p[5] = {0.2932349133, -1.220643578, 1.719180615, -0.1538275037, -0.4725649053};
  const double want_m[5] = {0.0353, 0.0398, 0.1615, 0.28, -0.544};
  const double want_v[5] = {0.00138109, 0.00237604, 0.03445225, 0.0496, 0.248416};
  const OptimizerState st = opt.state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].name, "exp_avg");
  EXPECT_EQ(st[1].name, "exp_avg_sq");
  const int64_t off = ps.view(0).offset;
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(p[i], want_p[i], kFloatTolerance) << i;
    EXPECT_NEAR(st[0].data[off + i], want_m[i], kFloatTolerance) << i;
    EXPECT_NEAR(st[1].data[off + i], want_v[i], kFloatTolerance) << i;
  }
}

TEST(ClipGradNorm, GlobalL2NormAsTorch) {
  // torch.nn.utils.clip_grad_norm_(max_norm=6.5) of [3,0,-4] and [12,0]: norm 13, factor
  // 6.5 / (13 + 1e-6).
  auto backend = make_cpu_backend();
  float g[5] = {3, 0, -4, 12, 0};
  EXPECT_DOUBLE_EQ(clip_grad_norm(*backend, g, 5, 6.5), 13.0);
  const double want[5] = {1.499999885, 0, -1.999999846, 5.999999538, 0};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(g[i], want[i], 1e-6) << i;
  float small[2] = {0.3f, 0.4f};  // norm 0.5 < 1: unchanged
  EXPECT_NEAR(clip_grad_norm(*backend, small, 2, 1.0), 0.5, 1e-7);
  EXPECT_EQ(small[0], 0.3f);
  EXPECT_EQ(small[1], 0.4f);
}

TEST(LrSchedule, CosineWithWarmupAndStepMatchTorch) {
  // SequentialLR(LinearLR(start_factor=1/4, total_iters=3), CosineAnnealingLR(T_max=7)), base
  // 0.1, stepped once an epoch.
  const double cosine[10] = {0.025,         0.05,          0.075,        0.1,
                             0.0950484434,  0.08117449009, 0.0611260467, 0.0388739533,
                             0.01882550991, 0.004951556605};
  LrSchedule s;
  s.kind = LrScheduleKind::kCosine;
  s.base = 0.1;
  s.epochs = 10;
  s.warmup = 3;
  for (int e = 0; e < 10; ++e) EXPECT_NEAR(scheduled_lr(s, e), cosine[e], 1e-10) << e;
  // StepLR(step_size=3, gamma=0.5).
  const double step[7] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  LrSchedule st;
  st.base = 0.1;
  st.step_size = 3;
  st.gamma = 0.5;
  for (int e = 0; e < 7; ++e) EXPECT_NEAR(scheduled_lr(st, e), step[e], 1e-12) << e;
  s.warmup = 0;  // cosine without warm-up starts at base and approaches 0
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0), 0.1);
  EXPECT_NEAR(scheduled_lr(s, 5), 0.05, 1e-12);
}

TEST(LrSchedule, PerStepWarmupRampsToOne) {
  // LambdaLR(lambda s: min(1, (s + 1) / 4)): steps 1-4 at 1/4 .. 4/4 of the epoch's LR.
  const double ramp[6] = {0.25, 0.5, 0.75, 1.0, 1.0, 1.0};
  for (int s = 1; s <= 6; ++s) EXPECT_DOUBLE_EQ(warmup_factor(s, 4), ramp[s - 1]) << s;
  EXPECT_DOUBLE_EQ(warmup_factor(1, 0), 1.0);  // no warm-up
  EXPECT_DOUBLE_EQ(warmup_factor(1, 1), 1.0);
  EXPECT_THROW(warmup_factor(0, 4), std::exception);  // steps are 1-based
}

TEST(WeightAverage, WarmupDecayIsTensorFlowsNumUpdatesRamp) {
  // tf.train.ExponentialMovingAverage(0.99, num_updates=s): min(0.99, (1 + s) / (10 + s)).
  for (int64_t s : {1, 2, 10, 100, 890, 891, 5000}) {
    const double ramp = std::min(0.99, double(1 + s) / double(10 + s));
    EXPECT_NEAR(WeightAverage::decay_at(0.99f, true, s), ramp, 1e-7) << s;
    EXPECT_FLOAT_EQ(WeightAverage::decay_at(0.99f, false, s), 0.99f) << s;
  }
  EXPECT_NEAR(WeightAverage::decay_at(0.99f, true, 1), 2.0 / 11.0, 1e-7);
  EXPECT_THROW(WeightAverage::decay_at(0.99f, true, 0), std::exception);  // steps are 1-based
}

TEST(LrSchedule, AutoIsCosineFromTwoThousandImagesPerRun) {
  EXPECT_EQ(app::auto_lr_schedule(240, 15), LrScheduleKind::kCosine);   // DeepCrack's carved split
  EXPECT_EQ(app::auto_lr_schedule(72, 15), LrScheduleKind::kConstant);  // CrackForest
  EXPECT_EQ(app::auto_lr_schedule(2000, 1),
            LrScheduleKind::kCosine);  // the bound belongs to cosine
  EXPECT_EQ(app::auto_lr_schedule(1999, 1), LrScheduleKind::kConstant);
  LrSchedule c;
  c.kind = LrScheduleKind::kConstant;
  c.base = 0.1;
  c.epochs = 10;
  for (int e = 0; e < 10; ++e) EXPECT_DOUBLE_EQ(scheduled_lr(c, e), 0.1) << e;
}

TEST(LrSchedule, CooldownIsConstantThenLinearToZero) {
  // SequentialLR(ConstantLR(factor=1, total_iters=7), LinearLR(start_factor=3/4,
  // end_factor=1/4, total_iters=2), milestones=[7]), base 0.1, 10 epochs, stepped once an epoch
  // (tools/reference/optim_reference.py).
  const double want[10] = {0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.075, 0.05, 0.025};
  LrSchedule c;
  c.kind = LrScheduleKind::kCooldown;
  c.base = 0.1;
  c.epochs = 10;
  c.cooldown = 3;
  for (int e = 0; e < 10; ++e) EXPECT_NEAR(scheduled_lr(c, e), want[e], 1e-15) << e;
  c.warmup = 2;  // a warm-up epoch ramps as in every schedule, then the plateau
  EXPECT_NEAR(scheduled_lr(c, 0), 0.1 / 3, 1e-15);
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 2), 0.1);
  c.cooldown = 0;
  EXPECT_THROW(scheduled_lr(c, 9), std::exception);
  // --cooldown-epochs 0: a fifth of --epochs, rounded up.
  app::TrainOptions o;
  for (auto [epochs, fifth] : {std::pair{15, 3}, std::pair{10, 2}, std::pair{11, 3},
                               std::pair{1, 1}, std::pair{100, 20}}) {
    o.epochs = epochs;
    EXPECT_EQ(app::cooldown_epochs(o), fifth) << epochs;
  }
  o.cooldown_epochs = 4;
  EXPECT_EQ(app::cooldown_epochs(o), 4);
}

TEST(LrSchedule, ScalingByWorldTimesAccumulation) {
  EXPECT_DOUBLE_EQ(lr_scale(LrScaling::kNone, 4, 2), 1.0);
  EXPECT_DOUBLE_EQ(lr_scale(LrScaling::kLinear, 3, 2), 6.0);
  EXPECT_DOUBLE_EQ(lr_scale(LrScaling::kSqrt, 3, 2), std::sqrt(6.0));
  EXPECT_THROW(app::value_of(app::lr_scaling_words(), "cubic", "lr-scaling"), app::UsageError);
}

TEST(AdamW, StateRoundTripsThroughCheckpointsAndOtherOptimizersAreRefused) {
  test::TempDir dir;
  auto be = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto a = make_model(mc, *be);
  auto b = make_model(mc, *be);
  a->params().initialize(3);
  AdamW oa(a->params(), *be, {}), ob(b->params(), *be, {});
  const int64_t n = a->params().arena_size();
  for (int64_t i = 0; i < n; ++i) {
    oa.state()[0].data[i] = 0.001f * float(i % 101);
    oa.state()[1].data[i] = 0.002f * float(i % 89);
  }
  CheckpointMeta meta;
  meta.model = "unet16";
  const std::string path = dir.file("adamw.h5");
  save_checkpoint(path, a->params(), oa.state(), meta);
  const CheckpointMeta r = load_checkpoint(path, b->params(), ob.state());
  EXPECT_EQ(r.optimizer_state, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  // Every tensor's state (the arena's padding between tensors is not stored).
  for (const ParamView& v : a->params().views())
    for (size_t k = 0; k < 2; ++k)
      EXPECT_EQ(0, std::memcmp(oa.state()[k].data + v.offset, ob.state()[k].data + v.offset,
                               size_t(v.numel) * sizeof(float)))
          << v.name;
  EXPECT_EQ(0, std::memcmp(a->params().values(), b->params().values(), size_t(n) * sizeof(float)));
  // An SGD run cannot take AdamW's state; weights-only loads still work.
  Sgd sgd(b->params(), *be, SgdOptions{});
  EXPECT_THROW(load_checkpoint(path, b->params(), sgd.momentum()), Error);
  EXPECT_NO_THROW(load_checkpoint(path, b->params(), nullptr));
}

TEST(OptimCli, AdamWCosineWarmupClipResumeEqualsUninterrupted) {
  test::TempDir dir;
  test::write_tiny_dataset(dir.file("tiny.h5"), 8, 4, 32);
  const std::string common = "--data " + dir.file("tiny.h5") +
                             " --width-divisor 16 --batch-size 2 --optimizer adamw --lr 0.01"
                             " --weight-decay 0.01 --lr-schedule cosine --warmup-epochs 1"
                             " --lr-scaling linear --clip-grad-norm 0.5 --model-dir ";
  const auto s = test::run_command(dptrain(2, common + dir.file("straight") + " --epochs 3"));
  ASSERT_EQ(s.status, 0) << s.output;
  // The effective configuration, once (rank 0), at start.
  const size_t config = s.output.find("configuration (2 rank(s)):");
  EXPECT_NE(config, std::string::npos) << s.output;
  EXPECT_EQ(s.output.find("configuration (2 rank(s)):", config + 1), std::string::npos);
  EXPECT_NE(s.output.find("\n  optimizer = adamw\n"), std::string::npos) << s.output;
  // Linear scaling by 2 ranks: base 0.02; epoch 1 warms up at half of it; cosine over 2 epochs.
  EXPECT_NE(s.output.find("epoch 1/3  lr 0.01 "), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("epoch 2/3  lr 0.02 "), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("epoch 3/3  lr 0.01 "), std::string::npos) << s.output;
  const auto r1 = test::run_command(dptrain(2, common + dir.file("resumed") + " --epochs 1"));
  ASSERT_EQ(r1.status, 0) << r1.output;
  const auto r2 = test::run_command(dptrain(2, common + dir.file("resumed") + " --epochs 3"));
  ASSERT_EQ(r2.status, 0) << r2.output;
  EXPECT_NE(r2.output.find("resumed from epoch 1"), std::string::npos) << r2.output;

  auto be = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto a = make_model(mc, *be);
  auto b = make_model(mc, *be);
  AdamW oa(a->params(), *be, {}), ob(b->params(), *be, {});
  load_checkpoint(dir.file("straight/model_epoch_3.h5"), a->params(), oa.state());
  load_checkpoint(dir.file("resumed/model_epoch_3.h5"), b->params(), ob.state());
  const size_t bytes = size_t(a->params().arena_size()) * sizeof(float);
  EXPECT_EQ(0, std::memcmp(a->params().values(), b->params().values(), bytes));
  for (size_t k = 0; k < 2; ++k)
    EXPECT_EQ(0, std::memcmp(oa.state()[k].data, ob.state()[k].data, bytes)) << k;

  // Resuming AdamW's checkpoint with SGD is a usage error naming the optimizer.
  const auto mix = test::run_command(
      dptrain(1, "--data " + dir.file("tiny.h5") + " --width-divisor 16 --batch-size 2 --epochs 4" +
                     " --optimizer sgd --model-dir " + dir.file("resumed")));
  EXPECT_EQ(mix.status, 2) << mix.output;
  EXPECT_NE(mix.output.find("--optimizer sgd"), std::string::npos) << mix.output;
}

TEST(OptimOptions, BadValuesAreUsageErrors) {
  const std::vector<std::vector<const char*>> bad{{"--optimizer", "adam"},
                                                  {"--lr-schedule", "linear"},
                                                  {"--warmup-epochs", "-1"},
                                                  {"--warmup-steps", "-1"},
                                                  {"--lr-scaling", "log"},
                                                  {"--clip-grad-norm", "-1"},
                                                  {"--adam-beta2", "1"},
                                                  {"--adam-eps", "0"},
                                                  {"--save-every", "0"},
                                                  {"--keep-last", "-1"},
                                                  {"--optimizer", "adamw", "--nesterov"}};
  for (const auto& args : bad) {
    std::vector<const char*> argv{"dptrain"};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_THROW(app::parse_train_options(int(argv.size()), argv.data(), false), app::UsageError)
        << args[0];
  }
  const char* good[] = {"dptrain", "--optimizer", "adamw", "--lr-schedule", "cosine"};
  const auto o = app::parse_train_options(5, good, false);
  ASSERT_TRUE(o.has_value());
  EXPECT_NE(o->describe().find("optimizer = adamw\n"), std::string::npos);
  EXPECT_NE(o->describe().find("lr_schedule = cosine\n"), std::string::npos);
}

}  // namespace
}  // namespace dp
