// dpexport: every model of the zoo exported, checked by the onnx package and run by ONNX Runtime
// against dppredict's network; the schema subset against onnx's; failures leave no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/cpu/cpu_backend.hpp"
#include "dp/model.hpp"
#include "normalization.hpp"
#include "predict/predictor.hpp"
#include "predict/run.hpp"
#include "predict/settings.hpp"
#include "test_util.hpp"
#include "train/trainer.hpp"

namespace dp {
namespace {

namespace fs = std::filesystem;

constexpr int kTrainSize = 64;  // the fixture's training images (UNetResNet takes multiples of 64)
constexpr double kEma = 0.5;    // a decay that leaves the averages far from the raw weights
constexpr uint64_t kSeed = 11;
constexpr double kTolerance = 1e-4;  // ONNX Runtime against dppredict: max |diff| / max |logit|

// What the exported model takes: 8-bit pixels as floats 0..255 (the default), 0..1
// (--input-scale 1), or the normalised input the network sees (--keep-normalization).
enum class Input { kPixels255, kPixels1, kNormalized };

std::string python_probe() {
  const auto r =
      test::run_command(std::string(DP_TEST_PYTHON) + " -c 'import onnx, onnxruntime, numpy' 2>&1");
  return r.status == 0 ? "" : r.output;
}

std::string format_number(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
}

bool no_file_but(const std::string& dir, const std::string& keep) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != keep) return false;
  return true;
}

// Skips a test that needs the onnx and onnxruntime packages where DP_TEST_PYTHON lacks them.
#define DP_SKIP_WITHOUT_ONNX()                                 \
  if (const std::string why = python_probe(); !why.empty())    \
  GTEST_SKIP() << "no onnx/onnxruntime for " << DP_TEST_PYTHON \
               << " (scripts/install-test-deps.sh installs them): " << why

class Export : public ::testing::Test {
 protected:
  struct Zoo {
    const char* run;
    const char* model;
    int divisor;
    bool deconv;
    double ema;
  };
  static constexpr Zoo kZoo[] = {
      {"unet16", "unet16", 16, false, 0},
      {"unet16_deconv", "unet16", 16, true, 0},
      {"unet_resnet34", "unet_resnet34", 16, false, kEma},
      {"unet_resnet101", "unet_resnet101", 32, false, 0},
  };

  // One epoch of each model on four 64x64 images (two validated: the ODS threshold is recorded).
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const std::string data = dir_->file("tiny.h5");
    test::write_tiny_dataset(data, 4, 2, kTrainSize);
    for (const Zoo& z : kZoo) {
      app::TrainOptions o = test::tiny_training(data, dir_->file(z.run), 2);
      o.model = z.model;
      o.width_divisor = z.divisor;
      o.deconv = z.deconv;
      o.ema = z.ema;
      SelfComm self;
      ASSERT_EQ(app::Trainer(o, self, test::quiet_logger()).run(), 0) << z.run;
      amplify(checkpoint(z.run), z);
    }
  }
  // Rewrites a checkpoint with every PyTorch-default-initialised (uniform fan-in) convolution
  // weight, raw and averaged, times sqrt(6): He's variance-preserving scale for a ReLU network.
  // With PyTorch's default the activations shrink ~2.4x per layer, so after one epoch the deep
  // layers barely reach the logits and a deep layer exported wrong would change them by less than
  // the tolerance; scaled, every layer counts.
  static void amplify(const std::string& path, const Zoo& z) {
    const CheckpointMeta meta = read_checkpoint_meta(path);
    auto backend = make_cpu_backend();
    ModelConfig mc;
    mc.name = z.model;
    mc.width_divisor = z.divisor;
    mc.deconv = z.deconv;
    auto raw = make_model(mc, *backend), avg = make_model(mc, *backend);
    load_checkpoint(path, raw->params(), OptimizerState{}, &raw->buffers());
    const AveragedWeights into_avg{avg->params().values(), avg->buffers().values()};
    load_checkpoint(path, avg->params(), OptimizerState{}, &avg->buffers(),
                    meta.has_averaged_weights ? &into_avg : nullptr);
    const float gain = std::sqrt(6.0f);
    for (Model* m : {raw.get(), avg.get()})
      for (const ParamView& v : m->params().views())
        if (v.init == Init::kUniformFanIn && v.shape.size() == 4)
          for (int64_t i = 0; i < v.numel; ++i) v.host[i] *= gain;
    save_checkpoint(path, raw->params(), OptimizerState{}, meta, &raw->buffers(),
                    meta.has_averaged_weights ? &into_avg : nullptr);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string checkpoint(const std::string& run) {
    return dir_->file(run + "/" + epoch_checkpoint_name(1));
  }

  // dpexport's exit status and output.
  static test::CommandResult dpexport(const std::string& args) {
    return test::run_command(std::string(test::program("dpexport")) + " " + args + " 2>&1");
  }

  // Random 8-bit images of n x h x w as the model takes them, and the logits dppredict's network
  // (app::Predictor: its checkpoint loading, weights and normalisation; one tile of the whole
  // image) computes from them, in files for check_onnx_export.py; returns its --case argument.
  std::string reference(const std::string& ckpt, int n, int h, int w, Input input,
                        bool raw_weights = false) {
    app::PredictorOptions po;
    po.tile_height = h;
    po.tile_width = w;
    po.batch = n;
    po.raw_weights = raw_weights;
    app::Predictor predictor(ckpt, po);
    const app::NormalizationLut lut = app::normalization_lut(predictor.normalization());
    std::mt19937 rng(kSeed + uint64_t(cases_));
    std::uniform_int_distribution<int> byte(0, 255);
    const size_t count = size_t(n) * size_t(h) * size_t(w) * 3;
    std::vector<float> normalized(count), given(count);
    for (size_t i = 0; i < count; ++i) {
      const int v = byte(rng);
      normalized[i] = lut[i % 3][size_t(v)];
      given[i] = input == Input::kPixels255 ? float(v)
                 : input == Input::kPixels1 ? float(v) / 255.0f
                                            : normalized[i];
    }
    const float* logits = predictor.model().forward_host(normalized.data(), n);
    const std::string stem = dir_->file("case" + std::to_string(cases_++));
    write_floats(stem + ".input", given);
    write_floats(stem + ".logits", std::vector<float>(logits, logits + size_t(n) * h * w));
    return " --case " + std::to_string(n) + ":" + std::to_string(h) + ":" + std::to_string(w) +
           ":" + stem + ".input:" + stem + ".logits";
  }

  // dppredict's network's logits on one random normalised 64x64 image, raw or averaged weights.
  static std::vector<float> network_logits(const std::string& ckpt, bool raw_weights) {
    app::PredictorOptions po;
    po.batch = 1;
    po.raw_weights = raw_weights;
    app::Predictor predictor(ckpt, po);
    std::mt19937 rng(kSeed);
    std::normal_distribution<float> normal;
    std::vector<float> x(size_t(kTrainSize) * kTrainSize * 3);
    for (float& v : x) v = normal(rng);
    const float* y = predictor.model().forward_host(x.data(), 1);
    return std::vector<float>(y, y + size_t(kTrainSize) * kTrainSize);
  }

  // Exports `run`'s checkpoint with `flags` and checks the model on `cases`; prints the checks.
  void export_and_check(const std::string& run, const std::string& flags, const std::string& cases,
                        const std::string& check_flags = "") {
    const std::string ckpt = checkpoint(run);
    const std::string onnx = dir_->file(run + std::to_string(cases_) + ".onnx");
    auto r = dpexport("-c " + ckpt + " -o " + onnx + " " + flags);
    ASSERT_EQ(r.status, 0) << r.output;
    std::cout << r.output;
    const CheckpointMeta meta = read_checkpoint_meta(ckpt);
    const double threshold = app::recorded_ods_threshold(meta);
    EXPECT_FALSE(std::isnan(threshold)) << "the fixture's runs validate";
    const std::string metadata = " --meta model=" + meta.model +
                                 " --meta width_divisor=" + std::to_string(meta.width_divisor) +
                                 " --meta training_size=" + std::to_string(kTrainSize) + "x" +
                                 std::to_string(kTrainSize) +
                                 " --meta deconv=" + (meta.deconv != 0 ? "1" : "0") +
                                 " --meta training_scale=1x1" +  // the fixture's set: not resized
                                 " --meta threshold=" + format_number(threshold);
    r = test::run_command(std::string(DP_TEST_PYTHON) + " " + DP_CHECK_ONNX_EXPORT + " " + onnx +
                          cases + metadata + " --tolerance " + format_number(kTolerance) + " " +
                          check_flags + " 2>&1");
    std::cout << r.output;
    EXPECT_EQ(r.status, 0) << r.output;
  }

  static test::TempDir* dir_;
  int cases_ = 0;
};
test::TempDir* Export::dir_ = nullptr;

// Random inputs at the training size (two images) and at a size training never saw (one).
TEST_F(Export, Unet16MatchesDppredict) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet16");
  export_and_check(
      "unet16", "",
      reference(c, 2, 64, 64, Input::kPixels255) + reference(c, 1, 96, 160, Input::kPixels255));
}

TEST_F(Export, Unet16DeconvWithProbMatchesDppredict) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet16_deconv");
  export_and_check(
      "unet16_deconv", "--prob",
      reference(c, 2, 64, 64, Input::kPixels255) + reference(c, 1, 160, 96, Input::kPixels255),
      "--prob");
}

TEST_F(Export, UnetResNet34AveragedWeightsBatchNormFoldedMatchesDppredict) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet_resnet34");
  ASSERT_TRUE(read_checkpoint_meta(c).has_averaged_weights);
  export_and_check(
      "unet_resnet34", "",
      reference(c, 2, 64, 64, Input::kPixels255) + reference(c, 1, 128, 192, Input::kPixels255),
      "--meta weights=averaged --meta batchnorm=folded");
}

TEST_F(Export, UnetResNet34BatchNormKeptMatchesDppredict) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet_resnet34");
  export_and_check("unet_resnet34", "--keep-bn", reference(c, 1, 128, 64, Input::kPixels255),
                   "--meta batchnorm=kept");
}

TEST_F(Export, UnetResNet34RawWeightsMatchDppredictsRawWeights) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet_resnet34");
  export_and_check("unet_resnet34", "--raw-weights --fold-bn",
                   reference(c, 1, 64, 128, Input::kPixels255, true), "--meta weights=raw");
  // The averages are far from the raw weights: a model of the wrong ones would fail the check.
  const std::vector<float> raw = network_logits(c, true), averaged = network_logits(c, false);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    diff = std::max(diff, std::fabs(double(raw[i]) - double(averaged[i])));
    scale = std::max(scale, std::fabs(double(averaged[i])));
  }
  std::cout << "raw against averaged weights: relative " << diff / scale << "\n";
  EXPECT_GT(diff / scale, 100 * kTolerance);
}

TEST_F(Export, UnetResNet34InputScaleOneAndKeptNormalizationMatchDppredict) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet_resnet34");
  export_and_check("unet_resnet34", "--input-scale 1", reference(c, 1, 64, 64, Input::kPixels1),
                   "--meta input='RGB 0..1'");
  export_and_check("unet_resnet34", "--keep-normalization",
                   reference(c, 1, 64, 64, Input::kNormalized));
}

TEST_F(Export, UnetResNet101MatchesDppredict) {
  DP_SKIP_WITHOUT_ONNX();
  const std::string c = checkpoint("unet_resnet101");
  export_and_check(
      "unet_resnet101", "",
      reference(c, 2, 64, 64, Input::kPixels255) + reference(c, 1, 128, 192, Input::kPixels255));
}

// A checkpoint that cannot be exported: one error line, a non-zero exit, no file (not even the
// temporary one) beside the damaged input.
TEST_F(Export, UnexportableCheckpointsAreOneLineAndNoFile) {
  test::TempDir dir;
  auto backend = make_cpu_backend();
  ModelConfig mc;
  mc.name = "unet16";
  mc.width_divisor = 16;
  auto model = make_model(mc, *backend);
  model->params().initialize(kSeed);
  CheckpointMeta meta;
  meta.model = "unet_resnet9000";
  meta.width_divisor = 16;
  meta.height = meta.width = kTrainSize;
  save_checkpoint(dir.file("unknown.h5"), model->params(), nullptr, meta);
  meta.model = "unet16";
  save_checkpoint(dir.file("damaged.h5"), model->params(), nullptr, meta);
  {  // one byte flipped inside conv1.0.weight (found by its raw float bytes)
    std::ifstream in(dir.file("damaged.h5"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const ParamView* w = model->params().find("conv1.0.weight");
    const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(w->host), 32));
    ASSERT_NE(at, std::string::npos);
    bytes[at + 5] = char(bytes[at + 5] ^ 0x40);
    std::ofstream(dir.file("damaged.h5"), std::ios::binary | std::ios::trunc) << bytes;
  }
  std::ofstream(dir.file("foreign.h5")) << "not an HDF5 file\n";
  struct Case {
    std::string name, input, expected;
  };
  const Case cases[] = {
      {"unknown", dir.file("unknown.h5"), "unknown model 'unet_resnet9000'"},
      {"damaged", dir.file("damaged.h5"), "checksum mismatch"},
      {"foreign", dir.file("foreign.h5"), "foreign.h5"},
      {"missing", dir.file("missing.h5"), "does not exist"},
  };
  for (const Case& c : cases) {
    const std::string out_dir = dir.file("out_" + c.name);
    fs::create_directory(out_dir);
    const auto r = dpexport("-c " + c.input + " -o " + out_dir + "/model.onnx");
    EXPECT_EQ(r.status, 1) << c.name << ": " << r.output;
    EXPECT_EQ(r.output.rfind("dpexport: error: ", 0), 0u) << c.name << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.name << ": " << r.output;
    EXPECT_TRUE(fs::is_empty(out_dir)) << c.name;
  }
  // An output that cannot be written: the error names it, nothing is left behind.
  fs::create_directory(dir.file("out_dir_in_the_way"));
  fs::create_directory(dir.file("out_dir_in_the_way/model.onnx"));
  const auto r = dpexport("-c " + checkpoint("unet16") + " -o " + dir.file("out_dir_in_the_way") +
                          "/model.onnx");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_TRUE(no_file_but(dir.file("out_dir_in_the_way"), "model.onnx")) << r.output;
}

TEST_F(Export, UsageErrorsExitTwo) {
  const std::string c = "-c " + checkpoint("unet16");
  const std::string o = " -o " + dir_->file("usage.onnx");
  const std::vector<std::string> mistakes = {
      o,  // no checkpoint
      c,  // no output
      c + o + " --fold-bn --keep-bn",
      c + o + " --input-scale 7",
      c + o + " stray",
      c + o + " --keep-normalization --input-scale 1",
      c + o + " --no-such-option",
  };
  for (const std::string& args : mistakes) {
    const auto r = dpexport(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("dpexport: error: ", 0), 0u) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
    EXPECT_FALSE(fs::exists(dir_->file("usage.onnx"))) << args;
  }
  const auto r = dpexport("--help");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("0..255"), std::string::npos) << r.output;
}

// Every field of app/export/onnx.proto has onnx's number, type and label.
TEST(OnnxSchema, FieldsAreOnnxs) {
  DP_SKIP_WITHOUT_ONNX();
  const auto r = test::run_command(std::string(DP_TEST_PYTHON) + " " + DP_CHECK_ONNX_SCHEMA + " " +
                                   DP_ONNX_DESCRIPTORS + " 2>&1");
  std::cout << r.output;
  EXPECT_EQ(r.status, 0) << r.output;
}

}  // namespace
}  // namespace dp
