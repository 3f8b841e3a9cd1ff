// The crack-segmentation UNets: UNet16 (VGG16 encoder) and UNetResNet34/101, with the reference
// network's module names, and the model factory.
#include <algorithm>

#include "dp/error.hpp"
#include "dp/model.hpp"

namespace dp {
namespace {

constexpr int kNumFilters = 32;  // the reference's num_filters

// Shared pieces of both UNets (TernausNet-style decoder).
class UNetBase : public Model {
 protected:
  UNetBase(const ModelConfig& config, Backend& backend) : Model(config, backend) {
    const int d = config.width_divisor;
    DP_CHECK(d >= 1 && kNumFilters % d == 0,
             "--width-divisor must divide 32 (1, 2, 4, 8, 16 or 32), got ", d);
  }
  int c(int channels) const { return channels / config().width_divisor; }
  int nf() const { return c(kNumFilters); }

  // DecoderBlockV2: bilinear x2 upsample, ConvRelu(in, mid), ConvRelu(mid, out) as
  // block.{1,2}.conv; with --deconv: ConvRelu(in, mid) as block.0.conv, then a transposed conv
  // (k4, s2, p1) to `out` as block.1, and ReLU.
  int decoder(const std::string& name, int src, int mid, int out) {
    if (config().deconv) {
      const int a = conv(name + ".block.0.conv", src, mid, 3, true);
      return deconv(name + ".block.1", a, out, true);
    }
    const int a = conv(name + ".block.1.conv", upsample(src), mid, 3, true);
    return conv(name + ".block.2.conv", a, out, 3, true);
  }
};

// Parameter names follow the reference PyTorch module's state_dict keys, e.g. conv1.0.weight
// (encoder Sequential indices 0, 2, 4: conv, relu, conv, ...), center.block.1.conv.weight,
// dec1.conv.weight, final.weight. (The reference also lists the VGG layers as encoder.N.*; the
// conversion tools add those aliases.)
class UNet16 final : public UNetBase {
 public:
  UNet16(const ModelConfig& config, Backend& backend) : UNetBase(config, backend) {
    const int x = input(3);
    const int conv1 = vgg_stage("conv1", x, c(64), 2);
    const int conv2 = vgg_stage("conv2", maxpool(conv1), c(128), 2);
    const int conv3 = vgg_stage("conv3", maxpool(conv2), c(256), 3);
    const int conv4 = vgg_stage("conv4", maxpool(conv3), c(512), 3);
    const int conv5 = vgg_stage("conv5", maxpool(conv4), c(512), 3);
    const int center = decoder("center", maxpool(conv5), nf() * 8 * 2, nf() * 8);
    const int dec5 = decoder("dec5", concat(center, conv5), nf() * 8 * 2, nf() * 8);
    const int dec4 = decoder("dec4", concat(dec5, conv4), nf() * 8 * 2, nf() * 8);
    const int dec3 = decoder("dec3", concat(dec4, conv3), nf() * 4 * 2, nf() * 2);
    const int dec2 = decoder("dec2", concat(dec3, conv2), nf() * 2 * 2, nf());
    const int dec1 = conv("dec1.conv", concat(dec2, conv1), nf(), 3, true);
    set_output(conv("final", dec1, 1, 1, false));
    finalize();
  }
  int size_multiple() const override { return 32; }

 private:
  // VGG stage: `layers` x (3x3 conv + ReLU), Sequential indices 0, 2, 4.
  int vgg_stage(const std::string& name, int src, int channels, int layers) {
    for (int i = 0; i < layers; ++i)
      src = conv(name + "." + std::to_string(2 * i), src, channels, 3, true);
    return src;
  }
};

// UNetResNet: torchvision ResNet34 (basic blocks) or ResNet101 (bottlenecks, stride in the 3x3)
// as encoder: conv1 = [7x7/2 conv, BN, ReLU, 2x2 max-pool] (conv1.0, conv1.1), conv2..conv5 =
// layer1..layer4; one more 2x2 pool; DecoderBlockV2 center and dec5..dec1 (dec1 without skip),
// dec0 ConvRelu, dropout2d (training only), final 1x1 conv. Input sizes: multiples of 64.
class UNetResNet final : public UNetBase {
 public:
  UNetResNet(const ModelConfig& config, Backend& backend, int depth)
      : UNetBase(config, backend), bottleneck_(depth == 101) {
    DP_CHECK(depth == 34 || depth == 101, "UNetResNet: depth ", depth, " (34 or 101)");
    const int expansion = bottleneck_ ? 4 : 1;
    const int blocks[4] = {3, 4, bottleneck_ ? 23 : 6, 3};
    const int bottom = c(512) * expansion;

    const int x = input(3);
    int stem = conv("conv1.0", x, c(64), 7, false, 2, 3, false, Init::kKaimingNormalFanOut);
    stem = batchnorm("conv1.1", stem, true);
    const int conv1 = maxpool(stem);
    inplanes_ = c(64);
    const int conv2 = layer("conv2", conv1, c(64), blocks[0], 1);
    const int conv3 = layer("conv3", conv2, c(128), blocks[1], 2);
    const int conv4 = layer("conv4", conv3, c(256), blocks[2], 2);
    const int conv5 = layer("conv5", conv4, c(512), blocks[3], 2);
    const int center = decoder("center", maxpool(conv5), nf() * 8 * 2, nf() * 8);
    const int dec5 = decoder("dec5", concat(center, conv5), nf() * 8 * 2, nf() * 8);
    const int dec4 = decoder("dec4", concat(dec5, conv4), nf() * 8 * 2, nf() * 8);
    const int dec3 = decoder("dec3", concat(dec4, conv3), nf() * 4 * 2, nf() * 2);
    const int dec2 = decoder("dec2", concat(dec3, conv2), nf() * 2 * 2, nf() * 2 * 2);
    const int dec1 = decoder("dec1", dec2, nf() * 2 * 2, nf());
    const int dec0 = conv("dec0.conv", dec1, nf(), 3, true);
    set_output(conv("final", dropout2d(dec0, config.dropout), 1, 1, false));
    DP_CHECK(channels(conv5) == bottom, "UNetResNet: encoder ends with ", channels(conv5),
             " channels, expected ", bottom);
    finalize();
  }
  int size_multiple() const override { return 64; }

 private:
  // torchvision ResNet._make_layer: block 0 may downsample (1x1 conv with stride + BN).
  int layer(const std::string& name, int src, int planes, int blocks, int stride) {
    for (int i = 0; i < blocks; ++i)
      src = block(name + "." + std::to_string(i), src, planes, i == 0 ? stride : 1);
    return src;
  }

  int block(const std::string& p, int x, int planes, int stride) {
    const Init init = Init::kKaimingNormalFanOut;
    const int expansion = bottleneck_ ? 4 : 1;
    int identity = x;
    if (stride != 1 || inplanes_ != planes * expansion) {
      identity = conv(p + ".downsample.0", x, planes * expansion, 1, false, stride, 0, false, init);
      identity = batchnorm(p + ".downsample.1", identity, false);
    }
    int y;
    if (bottleneck_) {
      y = batchnorm(p + ".bn1", conv(p + ".conv1", x, planes, 1, false, 1, 0, false, init), true);
      y = batchnorm(p + ".bn2", conv(p + ".conv2", y, planes, 3, false, stride, 1, false, init),
                    true);
      y = batchnorm(p + ".bn3", conv(p + ".conv3", y, planes * 4, 1, false, 1, 0, false, init),
                    false);
    } else {
      y = batchnorm(p + ".bn1", conv(p + ".conv1", x, planes, 3, false, stride, 1, false, init),
                    true);
      y = batchnorm(p + ".bn2", conv(p + ".conv2", y, planes, 3, false, 1, 1, false, init), false);
    }
    inplanes_ = planes * expansion;
    return add(y, identity, true);
  }

  bool bottleneck_;
  int inplanes_ = 0;
};

}  // namespace

std::vector<std::string> model_names() {
  return {"unet16", "unet_resnet34", "unet_resnet101"};
}

std::unique_ptr<Model> make_model(const ModelConfig& config, Backend& backend) {
  if (config.name == "unet16") return std::make_unique<UNet16>(config, backend);
  if (config.name == "unet_resnet34") return std::make_unique<UNetResNet>(config, backend, 34);
  if (config.name == "unet_resnet101") return std::make_unique<UNetResNet>(config, backend, 101);
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model '", config.name, "' (known: ", known, ")");
}

}  // namespace dp
