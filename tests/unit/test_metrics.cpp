// Validation metrics (IoU, Dice/F1, precision, recall from counts), metrics.csv, the new checkpoint
// fields, and dptrain's --val-every / --best-metric / --resume never as a user runs them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "dp/checkpoint.hpp"
#include "dp/model.hpp"
#include "eval/sweep_metrics.hpp"
#include "golden_util.hpp"
#include "test_util.hpp"
#include "train/metrics.hpp"

namespace dp {
namespace {

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

TEST(Metrics, FromConfusionCounts) {
  const app::Confusion c{6, 2, 4};  // TP, FP, FN
  EXPECT_DOUBLE_EQ(c.iou(), 6.0 / 12.0);
  EXPECT_DOUBLE_EQ(c.dice(), 12.0 / 18.0);
  EXPECT_DOUBLE_EQ(c.precision(), 6.0 / 8.0);
  EXPECT_DOUBLE_EQ(c.recall(), 6.0 / 10.0);
  // Dice is the harmonic mean of precision and recall (F1).
  EXPECT_NEAR(c.dice(), 2 * c.precision() * c.recall() / (c.precision() + c.recall()), 1e-15);
  const app::Confusion empty;
  EXPECT_EQ(empty.iou(), 0.0);
  EXPECT_EQ(empty.dice(), 0.0);
  EXPECT_EQ(empty.precision(), 0.0);
  EXPECT_EQ(empty.recall(), 0.0);
}

// ODS, OIS, AP and the precision-recall curve against the NumPy/SciPy reference
// (tools/reference/sweep_metrics.py -> tests/golden/sweep_metrics.h5), tolerance 0, 1 and 2 px;
// the counts summed from two halves of the images (two ranks) give the same result.
TEST(Metrics, ThresholdSweepMatchesTheReference) {
  const test::Golden g{std::string(DP_GOLDEN_DIR) + "/sweep_metrics.h5"};
  const std::vector<float> logits = g.read("logits"), mask = g.read("mask");
  const std::vector<int64_t> shape = g.shape("logits");
  const int n = int(shape[0]), h = int(shape[1]), w = int(shape[2]);
  const size_t image = size_t(h) * size_t(w);
  for (const int r : {0, 1, 2}) {
    SCOPED_TRACE(r);
    const std::string c = "tolerance" + std::to_string(r);
    app::ThresholdSweep all(r), first(r), second(r);
    for (int i = 0; i < n; ++i) {
      all.add_image(logits.data() + i * image, mask.data() + i * image, h, w);
      (i < n / 2 ? first : second)
          .add_image(logits.data() + i * image, mask.data() + i * image, h, w);
    }
    for (size_t k = 0; k < first.counts().size(); ++k) first.counts()[k] += second.counts()[k];
    first.sums()[0] += second.sums()[0];
    for (const app::ThresholdSweep* s : {&all, &first}) {
      const app::SweepResult got = s->result();
      std::printf("[sweep] tolerance %d: ods %.6f at %.2f, ois %.6f, ap %.6f\n", r, got.ods,
                  got.ods_threshold, got.ois, got.ap);
      EXPECT_NEAR(got.ods, g.attr_double(c, "ods"), 1e-12);
      EXPECT_EQ(got.ods_threshold, g.attr_double(c, "ods_threshold"));
      EXPECT_NEAR(got.ois, g.attr_double(c, "ois"), 1e-12);
      EXPECT_NEAR(got.ap, g.attr_double(c, "ap"), 1e-12);
      std::vector<double> precision, recall;
      s->curve(precision, recall);
      const std::vector<float> want_p = g.read(c + "/precision"), want_r = g.read(c + "/recall");
      ASSERT_EQ(precision.size(), want_p.size());
      for (size_t k = 0; k < precision.size(); ++k) {
        EXPECT_NEAR(precision[k], want_p[k], 1e-6) << "threshold " << k + 1;
        EXPECT_NEAR(recall[k], want_r[k], 1e-6) << "threshold " << k + 1;
      }
    }
  }
}

// IoU, Dice, precision and recall at the ODS threshold: plain pixel counts whatever the sweep's
// tolerance, equal to counting p >= t directly, and the same from two halves (two ranks).
TEST(Metrics, ConfusionAtAThresholdCountsPixelsWithoutTolerance) {
  const test::Golden g{std::string(DP_GOLDEN_DIR) + "/sweep_metrics.h5"};
  const std::vector<float> logits = g.read("logits"), mask = g.read("mask");
  const std::vector<int64_t> shape = g.shape("logits");
  const int n = int(shape[0]), h = int(shape[1]), w = int(shape[2]);
  const size_t image = size_t(h) * size_t(w);
  app::ThresholdSweep all(2), first(2), second(2);
  for (int i = 0; i < n; ++i) {
    all.add_image(logits.data() + i * image, mask.data() + i * image, h, w);
    (i < n / 2 ? first : second)
        .add_image(logits.data() + i * image, mask.data() + i * image, h, w);
  }
  for (size_t k = 0; k < first.counts().size(); ++k) first.counts()[k] += second.counts()[k];
  for (const double t : {0.01, 0.3, 0.5, 0.77, 0.99}) {
    app::Confusion want;
    for (size_t i = 0; i < logits.size(); ++i) {
      const bool predicted = 1.0 / (1.0 + std::exp(-double(logits[i]))) >= t;
      const bool crack = mask[i] > 0.5f;
      want.tp += predicted && crack;
      want.fp += predicted && !crack;
      want.fn += !predicted && crack;
    }
    for (const app::ThresholdSweep* s : {&all, &first}) {
      const app::Confusion got = s->confusion_at(t);
      EXPECT_EQ(got.tp, want.tp) << "t " << t;
      EXPECT_EQ(got.fp, want.fp) << "t " << t;
      EXPECT_EQ(got.fn, want.fn) << "t " << t;
    }
  }
}

TEST(Metrics, CsvHeaderOnceAndRowsKeptInStepWithTheCheckpoint) {
  test::TempDir dir;
  {
    app::MetricsCsv csv(dir.path(), 0);
    csv.append({1, 0.05, 0.7, 0.6, 0.1, 0.2, 0.3, 0.4, 50.0, 1.5, 0.45, 0.3, 0.5, 0.35});
    const double nan = std::nan("");
    csv.append({2, 0.05, 0.6, nan, nan, nan, nan, nan, 50.0, 1.5, nan, nan, nan, nan});
  }
  auto l = lines(dir.file("metrics.csv"));
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0], app::MetricsCsv::kHeader);
  EXPECT_EQ(l[1], "1,0.05,0.7,0.6,0.1,0.2,0.3,0.4,50,1.5,0.45,0.3,0.5,0.35,,,,,");
  EXPECT_EQ(l[2], "2,0.05,0.6,,,,,,50,1.5,,,,,,,,,");  // not validated: empty fields
  // Resuming from epoch 1 drops epoch 2's row; a fresh start (0 done) keeps only the header.
  app::MetricsCsv(dir.path(), 1).append({2, 0.05, 0.5, 0.4, 0.1, 0.2, 0.3, 0.4, 60.0, 1.0});
  l = lines(dir.file("metrics.csv"));
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[2].substr(0, 9), "2,0.05,0.");
  app::MetricsCsv(dir.path(), 0);
  EXPECT_EQ(lines(dir.file("metrics.csv")).size(), 1u);
  // A file of an older dptrain (no ods..ap columns): its rows get empty fields for them.
  std::ofstream(dir.file("metrics.csv"))
      << "epoch,lr,train_loss,valid_loss,iou,dice,precision,recall,img_per_s,seconds\n"
      << "1,0.05,0.7,0.6,0.1,0.2,0.3,0.4,50,1.5\n";
  app::MetricsCsv(dir.path(), 1);
  l = lines(dir.file("metrics.csv"));
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0], app::MetricsCsv::kHeader);
  EXPECT_EQ(l[1], "1,0.05,0.7,0.6,0.1,0.2,0.3,0.4,50,1.5,,,,,,,,,");
}

TEST(Metrics, CheckpointKeepsBestMetricHistoriesAndMidEpochPosition) {
  test::TempDir dir;
  auto be = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto m = make_model(mc, *be);
  m->params().initialize(1);
  std::vector<float> momentum(size_t(m->params().arena_size()), 0.5f);
  CheckpointMeta meta;
  meta.model = "unet16";
  meta.epoch = 1;
  meta.train_loss = meta.valid_loss = meta.valid_iou = meta.epoch_seconds = {0.5};
  meta.valid_dice = {0.25};
  meta.valid_precision = {0.125};
  meta.valid_recall = {0.75};
  meta.valid_ods_threshold = {0.375};
  meta.best_metric = "dice";
  meta.best_score = 0.25;
  meta.epoch_step = 3;
  meta.epoch_position = 12;
  meta.epoch_partial = {1, 2, 3, 4, 5, 6, 7};
  const std::string path = dir.file(mid_epoch_checkpoint_name(1, 3));
  save_checkpoint(path, m->params(), momentum.data(), meta);
  const CheckpointMeta r = load_checkpoint(path, m->params(), momentum.data());
  EXPECT_EQ(r.best_metric, "dice");
  EXPECT_EQ(r.best_score, 0.25);
  EXPECT_EQ(r.valid_dice, meta.valid_dice);
  EXPECT_EQ(r.valid_precision, meta.valid_precision);
  EXPECT_EQ(r.valid_recall, meta.valid_recall);
  EXPECT_EQ(r.valid_ods_threshold, meta.valid_ods_threshold);
  EXPECT_EQ(r.epoch_step, 3);
  EXPECT_EQ(r.epoch_position, 12);
  EXPECT_EQ(r.epoch_partial, meta.epoch_partial);
  // Listed newest first by (epochs done, step): model_epoch_1_step_3 is after model_epoch_1.
  save_checkpoint(dir.file(epoch_checkpoint_name(1)), m->params(), momentum.data(), meta);
  save_checkpoint(dir.file(epoch_checkpoint_name(2)), m->params(), momentum.data(), meta);
  const auto found = list_checkpoints(dir.path());
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].path, dir.file("model_epoch_2.h5"));
  EXPECT_EQ(found[1].path, path);
  EXPECT_EQ(found[2].path, dir.file("model_epoch_1.h5"));
}

std::string dptrain(int np, const std::string& args) {
  return test::mpiexec() + " -n " + std::to_string(np) + " " + test::program("dptrain") + " " +
         args;
}

TEST(MetricsCli, ValEveryBestMetricAndMetricsCsv) {
  test::TempDir dir;
  test::write_tiny_dataset(dir.file("tiny.h5"), 8, 4, 32);
  const std::string common = "--data " + dir.file("tiny.h5") +
                             " --width-divisor 16 --batch-size 2 --model-dir " + dir.file("run");
  const auto r =
      test::run_command(dptrain(2, common + " --epochs 3 --val-every 2 --best-metric valid_loss"));
  EXPECT_EQ(r.status, 0) << r.output;
  // The defaults: AdamW at 0.003 (He-initialised weights), and auto's constant rate for 8 images
  // x 3 epochs.
  EXPECT_NE(r.output.find("LR schedule: constant (auto: 8 training images x 3 epochs = 24 < 2000)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("epoch 1/3  lr 0.003  train_loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(not validated)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dice "), std::string::npos) << r.output;
  // The validation loss chooses epoch 3 (1.652 against 1.678); ODS, the default metric, would
  // choose epoch 2 (0.1445 against 0.1426).
  EXPECT_NE(r.output.find("done: best epoch 3 (valid_loss "), std::string::npos) << r.output;
  const auto l = lines(dir.file("run/metrics.csv"));
  ASSERT_EQ(l.size(), 4u) << r.output;
  EXPECT_EQ(l[0], app::MetricsCsv::kHeader);
  EXPECT_EQ(l[1].find("1,0.003,"), 0u) << l[1];
  EXPECT_NE(l[1].find(",,,,,"), std::string::npos) << l[1];  // epoch 1 not validated
  EXPECT_EQ(l[2].find(",,"), std::string::npos) << l[2];
  EXPECT_EQ(l[3].find(",,"), std::string::npos) << l[3];
  const CheckpointMeta meta = read_checkpoint_meta(dir.file("run/model_epoch_3.h5"));
  EXPECT_EQ(meta.best_metric, "valid_loss");
  ASSERT_EQ(meta.valid_dice.size(), 3u);
  EXPECT_TRUE(std::isnan(meta.valid_dice[0]));

  // Bad values are usage errors; --resume none is an alias of never (starts over, says so).
  for (const char* bad : {" --best-metric f1", " --val-every 0"}) {
    const auto b = test::run_command(dptrain(1, common + bad));
    EXPECT_EQ(b.status, 2) << b.output;
  }
  const auto n = test::run_command(dptrain(1, common + " --epochs 1 --resume none"));
  EXPECT_EQ(n.status, 0) << n.output;
  EXPECT_NE(n.output.find("--resume never: starting over"), std::string::npos) << n.output;
  EXPECT_EQ(lines(dir.file("run/metrics.csv")).size(), 2u);
}

}  // namespace
}  // namespace dp
