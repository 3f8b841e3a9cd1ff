// Golden tests: every CPU op against PyTorch references in tests/golden/layers.h5 (written by
// tools/reference/make_goldens.py; activations NHWC, weights in PyTorch's layout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/h5.hpp"
#include "golden_util.hpp"

namespace dp {
namespace {

using test::Golden;
using Vec = std::vector<float>;

Dims nhwc(const std::vector<int64_t>& s) {
  return {int(s.at(0)), int(s.at(1)), int(s.at(2)), int(s.at(3))};
}

class GoldenLayers : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  Golden g{std::string(DP_GOLDEN_DIR) + "/layers.h5"};
};

TEST_F(GoldenLayers, Convolutions) {
  for (const char* name :
       {"conv3x3", "conv1x1", "conv3x3_wide", "conv7x7_s2", "conv3x3_s2", "conv1x1_s2"}) {
    SCOPED_TRACE(name);
    const std::string c = name;
    const Dims x = nhwc(g.shape(c + "/x"));
    const auto ws = g.shape(c + "/w");
    ConvDesc d;
    d.n = x.n, d.h = x.h, d.w = x.w, d.cin = x.c, d.cout = int(ws[0]);
    d.kernel = int(g.attr_int(c, "kernel"));
    d.stride = int(g.attr_int(c, "stride"));
    d.pad = int(g.attr_int(c, "pad"));
    d.bias = g.attr_int(c, "bias") != 0;
    const Vec src = g.read(c + "/x"), w = g.read(c + "/w");
    const Vec b = d.bias ? g.read(c + "/b") : Vec();
    Vec y(size_t(d.dst().numel()));
    be->conv_forward(d, src.data(), w.data(), d.bias ? b.data() : nullptr, y.data());
    g.expect_close(c + "/y", y);
    Vec dy = g.read(c + "/dy"), dx(src.size()), dw(w.size()), db(b.size());
    be->conv_backward(d, src.data(), w.data(), y.data(), dy.data(), dx.data(), dw.data(),
                      d.bias ? db.data() : nullptr);
    g.expect_close(c + "/dx", dx);
    g.expect_close(c + "/dw", dw);
    if (d.bias) g.expect_close(c + "/db", db);
  }
}

TEST_F(GoldenLayers, TransposedConvolution) {
  const std::string c = "deconv4x4_s2";
  const Dims x = nhwc(g.shape(c + "/x"));
  DeconvDesc d;
  d.n = x.n, d.h = x.h, d.w = x.w, d.cin = x.c, d.cout = int(g.shape(c + "/w")[1]);
  d.kernel = int(g.attr_int(c, "kernel"));
  d.stride = int(g.attr_int(c, "stride"));
  d.pad = int(g.attr_int(c, "pad"));
  const Vec src = g.read(c + "/x"), w = g.read(c + "/w"), b = g.read(c + "/b");
  Vec y(size_t(d.dst().numel()));
  be->deconv_forward(d, src.data(), w.data(), b.data(), y.data());
  g.expect_close(c + "/y", y);
  Vec dy = g.read(c + "/dy"), dx(src.size()), dw(w.size()), db(b.size());
  be->deconv_backward(d, src.data(), w.data(), y.data(), dy.data(), dx.data(), dw.data(),
                      db.data());
  g.expect_close(c + "/dx", dx);
  g.expect_close(c + "/dw", dw);
  g.expect_close(c + "/db", db);
}

TEST_F(GoldenLayers, ReluPoolUpsampleConcat) {
  {
    const Vec x = g.read("relu/x"), dy = g.read("relu/dy");
    Vec y(x.size()), dx(x.size());
    be->relu_forward(int64_t(x.size()), x.data(), y.data());
    be->relu_backward(int64_t(x.size()), y.data(), dy.data(), dx.data());
    g.expect_close("relu/y", y);
    g.expect_close("relu/dx", dx);
  }
  {
    const Dims s = nhwc(g.shape("maxpool2x2/x"));
    const Vec x = g.read("maxpool2x2/x"), dy = g.read("maxpool2x2/dy");
    Vec y(dy.size()), dx(x.size());
    std::vector<uint8_t> arg(y.size());
    be->maxpool2x2_forward(s, x.data(), y.data(), arg.data());
    be->maxpool2x2_backward(s, arg.data(), dy.data(), dx.data(), false);
    g.expect_close("maxpool2x2/y", y);
    g.expect_close("maxpool2x2/dx", dx);
  }
  {
    const Dims s = nhwc(g.shape("upsample2x/x"));
    const Vec x = g.read("upsample2x/x"), dy = g.read("upsample2x/dy");
    Vec y(dy.size()), dx(x.size());
    be->upsample2x_forward(s, x.data(), y.data());
    be->upsample2x_backward(s, dy.data(), dx.data());
    g.expect_close("upsample2x/y", y);
    g.expect_close("upsample2x/dx", dx);
  }
  {
    const Dims a = nhwc(g.shape("concat/a")), b = nhwc(g.shape("concat/b"));
    const Vec xa = g.read("concat/a"), xb = g.read("concat/b"), dy = g.read("concat/dy");
    Vec y(dy.size()), da(xa.size()), db(xb.size());
    be->concat_forward(a, xa.data(), b, xb.data(), y.data());
    be->concat_backward(a, b, dy.data(), da.data(), db.data());
    g.expect_close("concat/y", y);
    g.expect_close("concat/da", da);
    g.expect_close("concat/db", db);
  }
}

TEST_F(GoldenLayers, BatchNormTrainingAndEvaluation) {
  for (bool training : {true, false}) {
    const std::string c = training ? "batchnorm_train" : "batchnorm_eval";
    SCOPED_TRACE(c);
    const Dims d = nhwc(g.shape(c + "/x"));
    const float eps = float(g.attr_double(c, "eps")),
                momentum = float(g.attr_double(c, "momentum"));
    const Vec x = g.read(c + "/x"), gamma = g.read(c + "/gamma"), beta = g.read(c + "/beta");
    Vec rm = g.read(c + "/running_mean"), rv = g.read(c + "/running_var");
    const double count = double(d.pixels());
    std::vector<double> sums(size_t(2 * d.c));
    Vec mean(size_t(d.c)), invstd(size_t(d.c));
    if (training) be->batchnorm_stats(d, x.data(), sums.data());
    be->batchnorm_prepare(d.c, training, sums.data(), count, eps, momentum, rm.data(), rv.data(),
                          mean.data(), invstd.data());
    if (training) {  // PyTorch: the running variance moves toward the unbiased one
      g.expect_close(c + "/running_mean_after", rm);
      g.expect_close(c + "/running_var_after", rv);
    }
    Vec y(x.size());
    be->batchnorm_apply(d, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), false,
                        y.data());
    g.expect_close(c + "/y", y);
    Vec dy = g.read(c + "/dy"), dx(x.size());
    Vec dgamma(size_t(d.c)), dbeta(size_t(d.c));
    be->batchnorm_backward_stats(d, x.data(), y.data(), false, dy.data(), mean.data(),
                                 invstd.data(), sums.data(), dgamma.data(), dbeta.data());
    be->batchnorm_backward_apply(d, x.data(), dy.data(), mean.data(), invstd.data(), gamma.data(),
                                 sums.data(), count, training, dx.data(), false);
    g.expect_close(c + "/dx", dx);
    g.expect_close(c + "/dgamma", dgamma);
    g.expect_close(c + "/dbeta", dbeta);
  }
}

TEST_F(GoldenLayers, BceWithLogitsMean) {
  for (const char* name : {"bce", "bce_pos_weight"}) {
    const std::string c = name;
    const Vec x = g.read(c + "/x"), t = g.read(c + "/target");
    const float pw = float(g.attr_double(c, "pos_weight"));
    const int64_t n = int64_t(x.size());
    Vec dx(x.size());
    const double loss =
        be->bce_with_logits(n, x.data(), t.data(), pw, 1.0f / float(n), dx.data()) / double(n);
    const double want = g.attr_double(c, "loss");
    std::printf("[golden] %-28s loss %.8f vs %.8f\n", name, loss, want);
    EXPECT_NEAR(loss, want, 1e-6 * std::fabs(want)) << name;
    g.expect_close(c + "/dx", dx);
  }
}

// --loss dice, bce+dice and focal against PyTorch (tests/golden/losses.h5): the mean loss (dice
// per image, the others per pixel) and its gradient, computed as the trainer computes them.
TEST(GoldenLosses, DiceBceDiceAndFocal) {
  const std::unique_ptr<Backend> be = make_cpu_backend();
  const Golden g{std::string(DP_GOLDEN_DIR) + "/losses.h5"};
  for (const char* name : {"dice", "dice_smooth0", "bce_dice", "focal", "focal_noalpha"}) {
    const std::string c = name;
    const Vec x = g.read(c + "/x"), t = g.read(c + "/target");
    const int images = int(g.attr_int(c, "images"));
    const int64_t n = int64_t(x.size()), pixels = n / images;
    Vec dx(x.size());
    double loss = 0;
    if (c == "focal" || c == "focal_noalpha") {
      loss = be->focal_with_logits(n, x.data(), t.data(), float(g.attr_double(c, "alpha")),
                                   float(g.attr_double(c, "gamma")), 1.0f / float(n), dx.data()) /
             double(n);
    } else {
      const bool with_bce = c == "bce_dice";
      if (with_bce)
        loss = be->bce_with_logits(n, x.data(), t.data(), float(g.attr_double(c, "pos_weight")),
                                   1.0f / float(n), dx.data()) /
               double(n);
      loss += be->dice_with_logits(images, pixels, x.data(), t.data(),
                                   float(g.attr_double(c, "smooth")), 1.0f / float(images),
                                   dx.data(), with_bce) /
              double(images);
    }
    const double want = g.attr_double(c, "loss");
    std::printf("[golden] %-28s loss %.8f vs %.8f\n", name, loss, want);
    EXPECT_NEAR(loss, want, 1e-6 * std::fabs(want)) << name;
    g.expect_close(c + "/dx", dx);
  }
}

// --loss with cldice against PyTorch's published soft_skel (tests/golden/losses.h5): soft clDice
// alone on continuous logits and on logits with ties (the gradient's routing at equal values),
// and bce+dice+cldice as the trainer sums them (weight 0.5, 2 iterations).
TEST(GoldenLosses, SoftClDice) {
  const std::unique_ptr<Backend> be = make_cpu_backend();
  const Golden g{std::string(DP_GOLDEN_DIR) + "/losses.h5"};
  for (const char* name : {"cldice", "cldice_ties", "bce_dice_cldice"}) {
    const std::string c = name;
    const Vec x = g.read(c + "/x"), t = g.read(c + "/target");
    const int images = int(g.attr_int(c, "images")), h = int(g.attr_int(c, "height")),
              w = int(g.attr_int(c, "width"));
    const int iterations = int(g.attr_int(c, "iterations"));
    const float smooth = float(g.attr_double(c, "smooth")),
                weight = float(g.attr_double(c, "weight"));
    const int64_t n = int64_t(x.size()), pixels = int64_t(h) * w;
    ASSERT_EQ(n, images * pixels) << name;
    Vec dx(x.size());
    double loss = 0;
    const bool combined = c == "bce_dice_cldice";
    if (combined) {
      loss = be->bce_with_logits(n, x.data(), t.data(), float(g.attr_double(c, "pos_weight")),
                                 1.0f / float(n), dx.data()) /
             double(n);
      loss += be->dice_with_logits(images, pixels, x.data(), t.data(), smooth, 1.0f / float(images),
                                   dx.data(), true) /
              double(images);
    }
    loss += weight *
            be->soft_cldice_with_logits(images, h, w, x.data(), t.data(), iterations, smooth,
                                        weight / float(images), dx.data(), combined) /
            double(images);
    const double want = g.attr_double(c, "loss");
    std::printf("[golden] %-28s loss %.8f vs %.8f\n", name, loss, want);
    EXPECT_NEAR(loss, want, 1e-6 * std::fabs(want)) << name;
    g.expect_close(c + "/dx", dx);
    if (combined) continue;
    // Each image on its own gives the same bits as the batch (no window crosses an image).
    double one_by_one = 0;
    Vec dx1(x.size());
    for (int i = 0; i < images; ++i)
      one_by_one += be->soft_cldice_with_logits(
          1, h, w, x.data() + i * pixels, t.data() + i * pixels, iterations, smooth,
          1.0f / float(images), dx1.data() + i * pixels, false);
    EXPECT_EQ(one_by_one / double(images), loss) << name;
    EXPECT_EQ(dx1, dx) << name;
  }
}

}  // namespace
}  // namespace dp
