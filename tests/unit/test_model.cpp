// UNet16: structure (names, shapes, parameter count), input checks, and whole-model gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dp/error.hpp"
#include "dp/model.hpp"
#include "dp/rng.hpp"

namespace dp {
namespace {

std::unique_ptr<Model> unet16(Backend& be, int divisor) {
  ModelConfig c;
  c.name = "unet16";
  c.width_divisor = divisor;
  return make_model(c, be);
}

TEST(UNet16, ParameterNamesAndShapesFollowTheReference) {
  auto be = make_cpu_backend();
  auto m = unet16(*be, 1);
  const ParamStore& ps = m->params();
  // 13 VGG convs + 2 in each of center, dec5..dec2 + dec1 + final = 25 convs, weight and bias.
  EXPECT_EQ(ps.views().size(), 50u);
  // The reference UNet16 (num_filters=32) has 29,306,465 parameters.
  EXPECT_EQ(ps.count(), 29306465);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"conv1.0.weight", {64, 3, 3, 3}},
      {"conv1.2.weight", {64, 64, 3, 3}},
      {"conv3.4.bias", {256}},
      {"conv5.4.weight", {512, 512, 3, 3}},
      {"center.block.1.conv.weight", {512, 512, 3, 3}},
      {"center.block.2.conv.weight", {256, 512, 3, 3}},
      {"dec5.block.1.conv.weight", {512, 768, 3, 3}},
      {"dec3.block.1.conv.weight", {256, 512, 3, 3}},
      {"dec3.block.2.conv.weight", {64, 256, 3, 3}},
      {"dec2.block.1.conv.weight", {128, 192, 3, 3}},
      {"dec2.block.2.conv.weight", {32, 128, 3, 3}},
      {"dec1.conv.weight", {32, 96, 3, 3}},
      {"final.weight", {1, 32, 1, 1}},
      {"final.bias", {1}}};
  for (const auto& [name, shape] : expected) {
    const ParamView* v = ps.find(name);
    ASSERT_NE(v, nullptr) << name;
    EXPECT_EQ(v->shape, shape) << name;
  }
  // Arena in reverse order: the final layer's gradients come first (they are ready first), each
  // tensor 64-byte aligned.
  EXPECT_EQ(ps.find("final.bias")->offset, 0);
  EXPECT_EQ(ps.find("final.weight")->offset, 16);
  EXPECT_EQ(ps.find("conv1.0.weight")->offset + 64 * 27, ps.arena_size());
}

// Parameter and buffer counts at full width equal the PyTorch reference's (tools/reference,
// encoder.fc excluded: the classifier is not part of the segmentation network).
TEST(Models, SizesMatchTheReference) {
  auto be = make_cpu_backend();
  struct Case {
    const char* name;
    bool deconv;
    int64_t params;
    size_t tensors, buffers;
  };
  for (const Case& k :
       {Case{"unet16", true, 32202337, 50, 0}, Case{"unet_resnet34", false, 34604897, 136, 72},
        Case{"unet_resnet101", false, 74621025, 340, 208}}) {
    ModelConfig c;
    c.name = k.name;
    c.deconv = k.deconv;
    auto m = make_model(c, *be);
    EXPECT_EQ(m->params().count(), k.params) << k.name;
    EXPECT_EQ(m->params().views().size(), k.tensors) << k.name;
    EXPECT_EQ(m->buffers().views().size(), k.buffers) << k.name;
  }
}

// setup() for inference: the same logits as a training set-up in evaluation mode, for every model
// of the zoo, in much less activation memory; backward() is refused.
TEST(Models, InferenceSetupGivesTheSameLogitsInLessMemory) {
  auto be = make_cpu_backend();
  struct Case {
    const char* name;
    bool deconv;
    int divisor;
  };
  for (const Case& k : {Case{"unet16", false, 16}, Case{"unet16", true, 16},
                        Case{"unet_resnet34", false, 16}, Case{"unet_resnet101", false, 32}}) {
    ModelConfig c;
    c.name = k.name;
    c.deconv = k.deconv;
    c.width_divisor = k.divisor;
    auto train = make_model(c, *be), infer = make_model(c, *be);
    train->params().initialize(7);
    std::memcpy(infer->params().values(), train->params().values(),
                size_t(train->params().arena_size()) * sizeof(float));
    if (train->buffers().arena_size() > 0) {
      for (int64_t i = 0; i < train->buffers().arena_size(); ++i)  // running statistics
        train->buffers().values()[i] = 0.5f + 0.25f * float(i % 3);
      std::memcpy(infer->buffers().values(), train->buffers().values(),
                  size_t(train->buffers().arena_size()) * sizeof(float));
    }
    constexpr int kBatch = 2, kH = 64, kW = 128;
    train->setup(kBatch, kH, kW);
    infer->setup(kBatch, kH, kW, Model::Purpose::kInference);
    train->set_training(false);
    infer->set_training(false);
    std::vector<float> input(size_t(kBatch) * kH * kW * 3);
    Rng rng(3);
    for (float& v : input) v = rng.uniform(-2.0f, 2.0f);
    const float* a = train->forward(input.data(), kBatch);
    std::vector<float> want(a, a + size_t(kBatch) * kH * kW);
    const float* b = infer->forward(input.data(), kBatch);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, double(std::abs(b[i] - want[i])));
    std::printf(
        "[inference setup] %s%s /%d: activations %.2f MiB (training %.2f MiB), max "
        "|logit difference| %.1e\n",
        k.name, k.deconv ? " deconv" : "", k.divisor, double(infer->activation_bytes()) / (1 << 20),
        double(train->activation_bytes()) / (1 << 20), worst);
    EXPECT_EQ(worst, 0.0) << k.name;
    EXPECT_LT(infer->activation_bytes(), train->activation_bytes() / 2) << k.name;
    std::vector<float> diff(want.size(), 1.0f);
    EXPECT_THROW(infer->backward(diff.data(), nullptr, GradMode::kOverwrite), Error);
  }
}

// Dropout2d: training zeroes whole channels (a function of the seed), evaluation is the identity.
TEST(Models, DropoutOnlyInTrainingAndSeeded) {
  auto be = make_cpu_backend();
  ModelConfig c;
  c.name = "unet_resnet34";
  c.width_divisor = 8;
  c.dropout = 0.5f;
  auto m = make_model(c, *be);
  m->setup(2, 64, 64);
  m->params().initialize(3);
  std::vector<float> x(size_t(2 * 64 * 64 * 3));
  Rng rng(8);
  for (auto& v : x) v = rng.uniform(-1, 1);
  auto run = [&](bool training, uint64_t seed) {
    m->set_training(training);
    const uint64_t seeds[2] = {key(seed, 0), key(seed, 1)};
    m->set_dropout_seeds(seeds, 2);
    const float* y = m->forward(x.data(), 2);
    return std::vector<float>(y, y + 2 * 64 * 64);
  };
  const auto a = run(true, 1), b = run(true, 1), other = run(true, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  const auto e1 = run(false, 1), e2 = run(false, 2);
  EXPECT_EQ(e1, e2);
}

// --weight-init he: every convolution followed by a ReLU (transposed ones too) starts from
// N(0, 2 / fan_out) with zero bias, fan_out = weight.size(0) x k x k as PyTorch's
// kaiming_normal_(mode='fan_out'); the final 1x1 convolution keeps PyTorch's default.
TEST(Models, HeInitScalesTheReluConvolutionsAndZeroesTheirBiases) {
  auto be = make_cpu_backend();
  for (const bool deconv : {false, true}) {
    ModelConfig c;
    c.name = "unet16";
    c.deconv = deconv;
    c.relu_init = ModelConfig::ReluInit::kHe;
    auto m = make_model(c, *be);
    m->params().initialize(4);
    int he_weights = 0;
    for (const ParamView& v : m->params().views()) {
      SCOPED_TRACE(v.name);
      const bool final = v.name.rfind("final.", 0) == 0;
      const bool bias = v.shape.size() == 1;
      double sum = 0, sq = 0, peak = 0;
      for (int64_t i = 0; i < v.numel; ++i) {
        sum += v.host[i], sq += double(v.host[i]) * v.host[i];
        peak = std::max(peak, double(std::fabs(v.host[i])));
      }
      const double mean = sum / double(v.numel), sd = std::sqrt(sq / double(v.numel) - mean * mean);
      if (final) {  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 32 x 1 x 1: not zero
        EXPECT_LE(peak, 1 / std::sqrt(32.0));
        EXPECT_GT(peak, 0);
      } else if (bias) {
        EXPECT_EQ(peak, 0.0);
      } else {
        const double fan_out = double(v.shape[0] * v.shape[2] * v.shape[3]);
        EXPECT_NEAR(sd, std::sqrt(2 / fan_out), 0.05 * std::sqrt(2 / fan_out));
        EXPECT_NEAR(mean, 0.0, 0.05 * std::sqrt(2 / fan_out));
        ++he_weights;
      }
    }
    EXPECT_EQ(he_weights, 24);  // 25 convolutions (or 19 and 5 transposed) less the final one
  }
  // The PyTorch default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  auto m = unet16(*be, 1);
  m->params().initialize(4);
  const ParamView* w = m->params().find("conv2.0.weight");
  const ParamView* b = m->params().find("conv2.0.bias");
  const double bound = 1 / std::sqrt(64.0 * 9);
  double wpeak = 0, bpeak = 0;
  for (int64_t i = 0; i < w->numel; ++i) wpeak = std::max(wpeak, double(std::fabs(w->host[i])));
  for (int64_t i = 0; i < b->numel; ++i) bpeak = std::max(bpeak, double(std::fabs(b->host[i])));
  EXPECT_LE(wpeak, bound);
  EXPECT_GT(wpeak, 0.95 * bound);
  EXPECT_GT(bpeak, 0.5 * bound);
}

TEST(UNet16, OutputShapeAndWidthDivisor) {
  auto be = make_cpu_backend();
  auto m = unet16(*be, 8);
  EXPECT_EQ(m->params().find("conv1.0.weight")->shape, (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(m->params().find("dec1.conv.weight")->shape, (std::vector<int64_t>{4, 12, 3, 3}));
  m->setup(3, 64, 96);
  m->params().initialize(1);
  std::vector<float> x(size_t(3 * 64 * 96 * 3));
  Rng rng(5);
  for (auto& v : x) v = rng.uniform(-1, 1);
  const float* y = m->forward(x.data(), 3);
  // Output [3, 64, 96, 1], finite and not constant.
  double lo = 1e30, hi = -1e30;
  for (int64_t i = 0; i < 3 * 64 * 96; ++i) {
    ASSERT_TRUE(std::isfinite(y[i]));
    lo = std::min(lo, double(y[i]));
    hi = std::max(hi, double(y[i]));
  }
  EXPECT_LT(lo, hi);
  // A smaller batch after setup works too (the last batch of an epoch).
  m->forward(x.data(), 1);
}

TEST(UNet16, RejectsBadSizesAndNames) {
  auto be = make_cpu_backend();
  auto m = unet16(*be, 8);
  try {
    m->setup(2, 50, 64);
    FAIL() << "50x64 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m->setup(0, 64, 64), Error);
  ModelConfig c;
  c.name = "unet17";
  EXPECT_THROW(make_model(c, *be), Error);
  c.name = "unet16";
  c.width_divisor = 3;
  EXPECT_THROW(make_model(c, *be), Error);
}

TEST(UNet16, InitialisationIsPyTorchDefaultAndSeeded) {
  auto be = make_cpu_backend();
  auto a = unet16(*be, 4), b = unet16(*be, 4);
  a->params().initialize(3);
  b->params().initialize(3);
  const ParamStore& ps = a->params();
  EXPECT_EQ(0, std::memcmp(ps.values(), b->params().values(), size_t(ps.arena_size()) * 4));
  for (const ParamView& v : ps.views()) {
    const double bound = 1.0 / std::sqrt(double(v.fan));
    double mx = 0, sum = 0;
    for (int64_t i = 0; i < v.numel; ++i) {
      mx = std::max(mx, std::fabs(double(v.value[i])));
      sum += v.value[i];
    }
    EXPECT_LE(mx, bound) << v.name;
    if (v.numel > 1000) {
      EXPECT_GT(mx, 0.9 * bound) << v.name;  // spans the range
    }
  }
}

// The whole graph's backward (skip connections, pooling, upsampling) through an exact identity.
// Every op is positively homogeneous (conv is linear, ReLU / max-pool / upsample / concat commute
// with scaling by a > 0), so with L = sum(r * logits) for a fixed r, scaling the first layer's
// weights and every bias by a scales L by a. Euler's theorem then says
//   sum(W1 * dL/dW1) + sum over all biases (b * dL/db) = L
// exactly, whatever the ReLU and max-pool patterns: no finite differences, no kinks. Each bias
// gradient is the sum of its layer's pre-activation gradient, so every layer's incoming gradient
// takes part (a lost skip gradient or a missing accumulation breaks the identity).
TEST(UNet16, WholeModelGradientSatisfiesEulerIdentity) {
  auto be = make_cpu_backend();
  for (int divisor : {16, 8}) {
    auto m = unet16(*be, divisor);
    const int n = 2, h = 64, w = 32;
    m->setup(n, h, w);
    m->params().initialize(11);
    std::vector<float> x(size_t(n * h * w * 3)), r(size_t(n * h * w));
    Rng rng(6);
    for (auto& v : x) v = rng.uniform(-2, 2);
    for (auto& v : r) v = rng.uniform(-1, 1);
    const float* y = m->forward(x.data(), n);
    double loss = 0, magnitude = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      loss += double(r[i]) * y[i];
      magnitude += std::fabs(double(r[i]) * y[i]);
    }
    m->backward(r.data());
    double euler = 0;
    for (const ParamView& v : m->params().views()) {
      if (v.name != "conv1.0.weight" && v.shape.size() != 1) continue;
      for (int64_t i = 0; i < v.numel; ++i) euler += double(v.value[i]) * double(v.grad[i]);
    }
    const double rel = std::fabs(euler - loss) / magnitude;
    std::printf("[euler] unet16/%d: L = %.6f, sum(p * dL/dp) = %.6f, error %.2e of sum|r*y|\n",
                divisor, loss, euler, rel);
    EXPECT_LT(rel, 1e-5);
  }
}

// The listener hears of every parameter exactly once, in arena order (what bucketing relies on).
TEST(Models, GradListenerReportsEveryParameterInArenaOrder) {
  struct Recorder : GradListener {
    std::vector<int64_t> offsets;
    void grad_ready(const ParamView& p) override { offsets.push_back(p.offset); }
  };
  auto be = make_cpu_backend();
  for (const char* name : {"unet16", "unet_resnet34", "unet_resnet101"}) {
    for (bool deconv : {false, true}) {
      ModelConfig c;
      c.name = name;
      c.width_divisor = 16;
      c.deconv = deconv;
      auto m = make_model(c, *be);
      m->setup(1, 64, 64);
      m->params().initialize(1);
      std::vector<float> x(64 * 64 * 3, 0.5f), g(64 * 64, 1.0f);
      m->forward(x.data(), 1);
      Recorder rec;
      m->backward(g.data(), &rec);
      ASSERT_EQ(rec.offsets.size(), m->params().views().size()) << name;
      for (size_t i = 1; i < rec.offsets.size(); ++i)
        EXPECT_LT(rec.offsets[i - 1], rec.offsets[i]) << name;
      EXPECT_EQ(rec.offsets.front(), 0) << name;
    }
  }
}

// A second, independent check on the layers nearest the loss: central differences of the final
// 1x1 convolution (no ReLU after it, so L is exactly linear in its parameters).
TEST(UNet16, FinalLayerGradientMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  auto m = unet16(*be, 16);
  const int n = 2, h = 32, w = 32;
  m->setup(n, h, w);
  m->params().initialize(12);
  std::vector<float> x(size_t(n * h * w * 3)), r(size_t(n * h * w));
  Rng rng(7);
  for (auto& v : x) v = rng.uniform(-2, 2);
  for (auto& v : r) v = rng.uniform(-1, 1);
  auto loss = [&] {
    const float* y = m->forward(x.data(), n);
    double s = 0;
    for (size_t i = 0; i < r.size(); ++i) s += double(r[i]) * y[i];
    return s;
  };
  loss();
  m->backward(r.data());
  for (const char* name : {"final.weight", "final.bias"}) {
    const ParamView* v = m->params().find(name);
    for (int64_t i = 0; i < v->numel; ++i) {
      const float saved = v->value[i], eps = 0.05f;
      v->value[i] = saved + eps;
      const double up = loss();
      v->value[i] = saved - eps;
      const double down = loss();
      v->value[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(v->grad[i], numeric, 1e-4 * std::max(1.0, std::fabs(numeric))) << name << i;
    }
  }
}

// Shared activation memory (ModelConfig::share_activation_memory, the default) changes where
// values and gradients live, never what is computed: every model, fp32 and bf16, trained three
// steps (dropout on, the last two accumulating gradients over two micro-batches) and evaluated,
// equals the run where nothing is shared, bitwise; and it needs less memory.
TEST(Models, SharedActivationMemoryChangesNothingButTheBytes) {
  struct Case {
    const char* name;
    bool deconv;
    int size;
  };
  for (const Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (precision == Precision::kBFloat16 && !cpu_bf16_support().empty()) continue;
    auto be = make_cpu_backend(precision);
    for (const Case& c : {Case{"unet16", false, 32}, Case{"unet16", true, 32},
                          Case{"unet_resnet34", false, 64}, Case{"unet_resnet101", false, 64}}) {
      const std::string what = std::string(c.name) + (c.deconv ? " deconv" : "") +
                               (precision == Precision::kBFloat16 ? " bf16" : " fp32");
      constexpr int kBatch = 2;
      const size_t pixels = size_t(kBatch) * size_t(c.size) * size_t(c.size);
      std::vector<float> x(pixels * 3), diff(pixels);
      Rng rng(21);
      for (float& v : x) v = rng.uniform(-2, 2);
      for (float& v : diff) v = rng.uniform(-1, 1) / float(pixels);
      std::vector<float> results[2];
      int64_t bytes[2] = {0, 0};
      for (const bool share : {false, true}) {
        ModelConfig mc;
        mc.name = c.name;
        mc.deconv = c.deconv;
        mc.width_divisor = 16;
        mc.dropout = 0.3f;
        mc.share_activation_memory = share;
        auto m = make_model(mc, *be);
        m->setup(kBatch, c.size, c.size);
        m->params().initialize(9);
        bytes[share] = m->activation_bytes();
        std::vector<float>& out = results[share];
        const auto keep = [&](const float* p, size_t n) { out.insert(out.end(), p, p + n); };
        for (int step = 0; step < 3; ++step) {
          const uint64_t seeds[kBatch] = {key(4, uint64_t(step)), key(5, uint64_t(step))};
          m->set_dropout_seeds(seeds, kBatch);
          keep(m->forward(x.data(), kBatch), pixels);
          m->backward(diff.data(), nullptr,
                      step < 2 ? GradMode::kOverwrite : GradMode::kAccumulate);
          keep(m->params().grads(), size_t(m->params().arena_size()));
        }
        m->set_training(false);
        keep(m->forward(x.data(), kBatch), pixels);
        keep(m->buffers().values(), size_t(m->buffers().arena_size()));
      }
      EXPECT_EQ(results[0].size(), results[1].size()) << what;
      EXPECT_TRUE(results[0] == results[1]) << what << ": sharing changed the results";
      std::printf("[model] %-28s activation memory %lld bytes shared, %lld unshared\n",
                  what.c_str(), static_cast<long long>(bytes[1]), static_cast<long long>(bytes[0]));
      EXPECT_LT(bytes[1], bytes[0]) << what;
    }
  }
}

}  // namespace
}  // namespace dp
