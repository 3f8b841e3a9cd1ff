// UNet16 (TernausNet: VGG16 encoder + bilinear-upsampling decoder) and the model factory.
#include <algorithm>

#include "dp/error.hpp"
#include "dp/model.hpp"

namespace dp {
namespace {

// Parameter names follow the reference PyTorch module's state_dict keys, e.g. conv1.0.weight
// (encoder Sequential indices 0, 2, 4: conv, relu, conv, ...), center.block.1.conv.weight
// (DecoderBlockV2: block = [Interpolate, ConvRelu, ConvRelu]), dec1.conv.weight, final.weight.
class UNet16 final : public Model {
 public:
  UNet16(const ModelConfig& config, Backend& backend) : Model(config, backend) {
    const int d = config.width_divisor;
    DP_CHECK(d >= 1 && 32 % d == 0, "--width-divisor must divide 32 (1, 2, 4, 8, 16 or 32), got ",
             d);
    const int nf = 32 / d;  // the reference's num_filters
    const auto c = [d](int channels) { return channels / d; };

    const int x = input(3);
    const int conv1 = block("conv1", x, c(64), 2);
    const int conv2 = block("conv2", maxpool(conv1), c(128), 2);
    const int conv3 = block("conv3", maxpool(conv2), c(256), 3);
    const int conv4 = block("conv4", maxpool(conv3), c(512), 3);
    const int conv5 = block("conv5", maxpool(conv4), c(512), 3);
    const int center = decoder("center", maxpool(conv5), nf * 8 * 2, nf * 8);
    const int dec5 = decoder("dec5", concat(center, conv5), nf * 8 * 2, nf * 8);
    const int dec4 = decoder("dec4", concat(dec5, conv4), nf * 8 * 2, nf * 8);
    const int dec3 = decoder("dec3", concat(dec4, conv3), nf * 4 * 2, nf * 2);
    const int dec2 = decoder("dec2", concat(dec3, conv2), nf * 2 * 2, nf);
    const int dec1 = conv("dec1.conv", concat(dec2, conv1), nf, 3, true);
    set_output(conv("final", dec1, 1, 1, false));
    params().finalize();
  }

  int size_multiple() const override { return 32; }

 private:
  // VGG stage: `layers` x (3x3 conv + ReLU), Sequential indices 0, 2, 4.
  int block(const std::string& name, int src, int channels, int layers) {
    for (int i = 0; i < layers; ++i)
      src = conv(name + "." + std::to_string(2 * i), src, channels, 3, true);
    return src;
  }
  // DecoderBlockV2 without deconvolution: upsample x2, ConvRelu(in, mid), ConvRelu(mid, out).
  int decoder(const std::string& name, int src, int mid, int out) {
    const int up = upsample(src);
    const int a = conv(name + ".block.1.conv", up, mid, 3, true);
    return conv(name + ".block.2.conv", a, out, 3, true);
  }
};

}  // namespace

std::vector<std::string> model_names() {
  return {"unet16"};
}

std::unique_ptr<Model> make_model(const ModelConfig& config, Backend& backend) {
  if (config.name == "unet16") return std::make_unique<UNet16>(config, backend);
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model '", config.name, "' (known: ", known, ")");
}

}  // namespace dp
