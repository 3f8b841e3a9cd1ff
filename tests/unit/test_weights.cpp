// Importing PyTorch weights: name maps (torchvision, reference aliases), encoder-only and whole
// model loads, and the errors for a missing or mismatching tensor. Files are written by the test.
#include <gtest/gtest.h>

#include <regex>

#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "dp/model.hpp"
#include "dp/rng.hpp"
#include "dp/weights.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

TEST(Weights, NameMaps) {
  EXPECT_EQ(canonical_weight_name("unet16", "features.0.weight"), "conv1.0.weight");
  EXPECT_EQ(canonical_weight_name("unet16", "encoder.28.bias"), "conv5.4.bias");
  EXPECT_EQ(canonical_weight_name("unet16", "features.17.weight"), "conv4.0.weight");
  EXPECT_EQ(canonical_weight_name("unet16", "conv3.2.weight"), "conv3.2.weight");
  EXPECT_EQ(canonical_weight_name("unet16", "classifier.0.weight"), "");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "conv1.weight"), "conv1.0.weight");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "encoder.bn1.running_var"),
            "conv1.1.running_var");
  EXPECT_EQ(canonical_weight_name("unet_resnet101", "layer3.22.bn3.bias"), "conv4.22.bn3.bias");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "encoder.layer1.0.downsample.0.weight"),
            "conv2.0.downsample.0.weight");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "conv2.1.conv1.weight"), "conv2.1.conv1.weight");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "fc.weight"), "");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "bn1.num_batches_tracked"), "");
  EXPECT_EQ(canonical_weight_name("unet_resnet34", "dec0.conv.weight"), "dec0.conv.weight");
}

// The inverse maps, to write files the way torchvision (and the reference) name things.
std::string torchvision_name(const std::string& model, const std::string& name) {
  std::smatch m;
  if (model == "unet16") {
    static const std::regex re(R"(conv([1-5])\.([024])\.(weight|bias))");
    static const int base[] = {0, 0, 5, 10, 17, 24};
    if (!std::regex_match(name, m, re)) return "";
    return str_cat("features.", base[std::stoi(m[1].str())] + std::stoi(m[2].str()), ".",
                   m[3].str());
  }
  if (name.rfind("conv1.0.", 0) == 0) return "conv1." + name.substr(8);
  if (name.rfind("conv1.1.", 0) == 0) return "bn1." + name.substr(8);
  static const std::regex re(R"(conv([2-5])\.(.*))");
  if (!std::regex_match(name, m, re)) return "";
  return str_cat("layer", std::stoi(m[1].str()) - 1, ".", m[2].str());
}

struct Fixture {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model;
  explicit Fixture(const char* name, int divisor = 8) {
    ModelConfig c;
    c.name = name;
    c.width_divisor = divisor;
    model = make_model(c, *be);
    model->params().initialize(1);
    model->buffers().initialize(1);
  }
};

// Writes the encoder of `model` under torchvision's names, with distinct values, plus the
// tensors torchvision has and dptrain does not (classifier / fc, num_batches_tracked).
void write_torchvision(const std::string& path, const std::string& model_name, const Model& m,
                       const std::string& skip = "", const std::string& reshape = "") {
  std::lock_guard lock(h5::mutex());
  h5::File f(path, h5::Mode::kTruncate);
  f.set_attr("format", std::string(kTorchWeightsFormat));
  auto put = [&](const std::string& key, std::vector<int64_t> shape, float base) {
    if (key == skip) return;
    if (key == reshape) shape.back() += 1;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = base + 1e-3f * float(i % 101);
    h5::Dataset::create(f, key, h5::Type::kFloat32, shape).write(v.data());
  };
  float base = 1.0f;
  for (const ParamStore* store : {&m.params(), &m.buffers()})
    for (const ParamView& v : store->views())
      if (const std::string k = torchvision_name(model_name, v.name); !k.empty())
        put(k, v.shape, base += 1.0f);
  if (model_name == "unet16") {
    put("classifier.0.weight", {16, 8}, 0.5f);
  } else {
    put("fc.weight", {10, 8}, 0.5f);
    put("bn1.num_batches_tracked", {1}, 0.0f);
  }
}

TEST(Weights, TorchvisionVgg16EncoderLoadsIntoUNet16) {
  test::TempDir dir;
  Fixture a("unet16");
  const std::string path = dir.file("vgg16.h5");
  write_torchvision(path, "unet16", *a.model);
  Fixture b("unet16");
  const std::vector<float> decoder_before(b.model->params().find("dec1.conv.weight")->value,
                                          b.model->params().find("dec1.conv.weight")->value + 10);
  const ImportReport r =
      import_weights(path, "unet16", b.model->params(), b.model->buffers(), true);
  EXPECT_EQ(r.loaded, 26);  // 13 convs x (weight, bias)
  EXPECT_EQ(r.ignored, std::vector<std::string>{"classifier.0.weight"});
  const ParamView* w = b.model->params().find("conv3.4.weight");
  EXPECT_NEAR(w->value[0], 1.0f + 13, 1e-6);  // conv3.4.weight is the 13th tensor written
  const ParamView* dec = b.model->params().find("dec1.conv.weight");
  EXPECT_EQ(std::vector<float>(dec->value, dec->value + 10), decoder_before);  // untouched
}

TEST(Weights, TorchvisionResNetEncoderWithBatchNormStatistics) {
  test::TempDir dir;
  for (const char* name : {"unet_resnet34", "unet_resnet101"}) {
    Fixture a(name, 16);
    const std::string path = dir.file(std::string(name) + ".h5");
    write_torchvision(path, name, *a.model);
    Fixture b(name, 16);
    const ImportReport r = import_weights(path, name, b.model->params(), b.model->buffers(), true);
    EXPECT_GT(r.loaded, 100) << name;
    const ParamView* rv = b.model->buffers().find("conv5.2.bn2.running_var");
    ASSERT_NE(rv, nullptr);
    EXPECT_GT(rv->value[0], 2.0f) << name;  // written values, not the initial 1
  }
}

TEST(Weights, MissingOrMismatchingTensorIsNamed) {
  test::TempDir dir;
  Fixture a("unet16");
  write_torchvision(dir.file("missing.h5"), "unet16", *a.model, "features.26.weight");
  write_torchvision(dir.file("shape.h5"), "unet16", *a.model, "", "features.7.weight");
  Fixture b("unet16");
  try {
    import_weights(dir.file("missing.h5"), "unet16", b.model->params(), b.model->buffers(), true);
    FAIL() << "missing tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lack conv5.2.weight"), std::string::npos) << e.what();
  }
  try {
    import_weights(dir.file("shape.h5"), "unet16", b.model->params(), b.model->buffers(), true);
    FAIL() << "wrong shape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'features.7.weight' has shape [16,16,3,4]"),
              std::string::npos)
        << e.what();
  }
  // A VGG16 file is not a ResNet.
  EXPECT_THROW(import_weights(dir.file("missing.h5"), "unet_resnet34", b.model->params(),
                              b.model->buffers(), true),
               Error);
}

}  // namespace
}  // namespace dp
