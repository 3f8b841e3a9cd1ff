// CPU backend ops: forward against naive references, backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dp/backend.hpp"
#include "dp/error.hpp"
#include "dp/rng.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

using Vec = std::vector<float>;

Vec random_vec(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(key(seed, 12345));
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Checks analytic d(sum(r * f(x)))/dx against central differences at `samples` coordinates.
// `loss(x)` evaluates sum(r * f(x)) in double. Kink band (ReLU, max): a coordinate whose
// perturbation crosses a kink shows a large second difference; it is skipped, not counted.
void check_gradient(const std::string& what, Vec& x, const Vec& analytic,
                    const std::function<double(const Vec&)>& loss, float eps = 1e-2f,
                    double tol = 2e-3, int samples = 40) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  Rng rng(key(99, x.size()));
  const double center = loss(x);
  double worst = 0;
  int checked = 0, kinks = 0;
  for (int s = 0; s < samples; ++s) {
    const size_t i = static_cast<size_t>(rng.below(x.size()));
    const float saved = x[i];
    x[i] = saved + eps;
    const double up = loss(x);
    x[i] = saved - eps;
    const double down = loss(x);
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    const double scale = std::max(1.0, std::fabs(numeric));
    if (std::fabs(up - 2 * center + down) / (2.0 * eps) > 0.5 * tol * scale) {
      ++kinks;
      continue;
    }
    const double err = std::fabs(numeric - analytic[i]) / scale;
    worst = std::max(worst, err);
    EXPECT_LT(err, tol) << what << ": coordinate " << i << " analytic " << analytic[i]
                        << " numeric " << numeric;
    ++checked;
  }
  EXPECT_GE(checked, samples * 3 / 4) << what << ": " << kinks << " coordinates hit a kink";
  std::printf("[gradcheck] %-28s max error %.2e over %d coordinates (%d at a kink)\n", what.c_str(),
              worst, checked, kinks);
}

// Naive NHWC convolution with OIHW weights, "same" padding, optional ReLU.
Vec conv_reference(const ConvDesc& d, const Vec& src, const Vec& w, const Vec& b) {
  const int k = d.kernel, pad = k / 2;
  Vec dst(static_cast<size_t>(d.dst().numel()));
  for (int n = 0; n < d.n; ++n)
    for (int y = 0; y < d.h; ++y)
      for (int x = 0; x < d.w; ++x)
        for (int o = 0; o < d.cout; ++o) {
          double acc = b[size_t(o)];
          for (int i = 0; i < d.cin; ++i)
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx) {
                const int sy = y + ky - pad, sx = x + kx - pad;
                if (sy < 0 || sy >= d.h || sx < 0 || sx >= d.w) continue;
                acc += double(src[size_t(((n * d.h + sy) * d.w + sx) * d.cin + i)]) *
                       double(w[size_t(((o * d.cin + i) * k + ky) * k + kx)]);
              }
          if (d.relu) acc = std::max(acc, 0.0);
          dst[size_t(((n * d.h + y) * d.w + x) * d.cout + o)] = float(acc);
        }
  return dst;
}

class LayersTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
};

void run_conv_test(Backend& be, const ConvDesc& d, const char* name) {
  const int64_t wn = int64_t{d.cout} * d.cin * d.kernel * d.kernel;
  Vec src = random_vec(d.src().numel(), 1), w = random_vec(wn, 2, -0.5f, 0.5f),
      b = random_vec(d.cout, 3, -0.2f, 0.2f);
  Vec dst(size_t(d.dst().numel()));
  be.conv_forward(d, src.data(), w.data(), b.data(), dst.data());
  const Vec ref = conv_reference(d, src, w, b);
  const test::Diff diff = test::compare(dst.data(), ref.data(), int64_t(ref.size()), 1e-3);
  std::printf("[forward]  %-28s max abs diff vs naive %.2e\n", name, diff.max_abs);
  EXPECT_LT(diff.max_abs, 1e-4) << name;

  const Vec r = random_vec(d.dst().numel(), 4);
  Vec diff_dst = r, diff_src(src.size()), dw(w.size()), db(b.size());
  be.conv_backward(d, src.data(), w.data(), dst.data(), diff_dst.data(), diff_src.data(), dw.data(),
                   db.data());
  auto loss_src = [&](const Vec& s) {
    Vec out(size_t(d.dst().numel()));
    be.conv_forward(d, s.data(), w.data(), b.data(), out.data());
    return dot(r, out);
  };
  auto loss_w = [&](const Vec& ww) {
    Vec out(size_t(d.dst().numel()));
    be.conv_forward(d, src.data(), ww.data(), b.data(), out.data());
    return dot(r, out);
  };
  auto loss_b = [&](const Vec& bb) {
    Vec out(size_t(d.dst().numel()));
    be.conv_forward(d, src.data(), w.data(), bb.data(), out.data());
    return dot(r, out);
  };
  // A weight or bias moves many outputs, so with ReLU a small step keeps clear of most kinks.
  const float eps = d.relu ? 2e-3f : 1e-2f;
  check_gradient(std::string(name) + " d/src", src, diff_src, loss_src, eps);
  check_gradient(std::string(name) + " d/weight", w, dw, loss_w, eps);
  check_gradient(std::string(name) + " d/bias", b, db, loss_b, eps);
}

TEST_F(LayersTest, Conv3x3MatchesNaiveAndGradients) {
  run_conv_test(*be, {2, 6, 5, 3, 4, 3, false}, "conv3x3");
}
TEST_F(LayersTest, Conv3x3ReluMatchesNaiveAndGradients) {
  run_conv_test(*be, {2, 6, 6, 5, 7, 3, true}, "conv3x3+relu");
}
TEST_F(LayersTest, Conv1x1MatchesNaiveAndGradients) {
  run_conv_test(*be, {3, 4, 4, 6, 1, 1, false}, "conv1x1");
}
TEST_F(LayersTest, Conv3x3WideChannels) {
  // Channel counts oneDNN blocks (16 / 32) and a batch that is not.
  run_conv_test(*be, {3, 8, 8, 32, 16, 3, true}, "conv3x3 32->16 +relu");
}

// An inference model's convolutions (`forward_only`) build no backward primitives: the same
// output bits as a training model's, and a backward pass is an error, not a crash. `fwd`, `bwd`:
// Backend::conv_* or Backend::deconv_* (their weights have cin * cout * k * k elements either way).
template <typename Desc, typename Fwd, typename Bwd>
void expect_forward_only_same_without_backward(Backend& be, const Desc& full, Fwd fwd, Bwd bwd) {
  Desc inference = full;
  inference.forward_only = true;
  const int64_t wn = int64_t{full.cout} * full.cin * full.kernel * full.kernel;
  const Vec src = random_vec(full.src().numel(), 1), w = random_vec(wn, 2),
            b = random_vec(full.cout, 3);
  Vec a(size_t(full.dst().numel())), y(a.size());
  (be.*fwd)(full, src.data(), w.data(), b.data(), a.data());
  (be.*fwd)(inference, src.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(y, a);
  Vec dy(a.size(), 1.0f), dx(src.size()), dw(w.size()), db(b.size());
  EXPECT_THROW((be.*bwd)(inference, src.data(), w.data(), y.data(), dy.data(), dx.data(), dw.data(),
                         db.data()),
               Error);
}

// With a strided 1x1 (whose full build skips an implementation) and a transposed convolution.
TEST_F(LayersTest, ForwardOnlyConvolutionsComputeTheSameAndRefuseBackward) {
  ConvDesc strided{2, 8, 8, 8, 16, 1, false};
  strided.stride = 2;
  for (const ConvDesc& full : {ConvDesc{2, 8, 8, 32, 16, 3, true}, strided})
    expect_forward_only_same_without_backward(*be, full, &Backend::conv_forward,
                                              &Backend::conv_backward);
  DeconvDesc deconv{2, 4, 5, 8, 4};
  deconv.relu = true;
  expect_forward_only_same_without_backward(*be, deconv, &Backend::deconv_forward,
                                            &Backend::deconv_backward);
}

TEST_F(LayersTest, ReluForwardBackward) {
  Vec x = random_vec(1000, 5);
  Vec y(x.size()), gx(x.size());
  be->relu_forward(int64_t(x.size()), x.data(), y.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], std::max(x[i], 0.0f));
  const Vec r = random_vec(int64_t(x.size()), 6);
  be->relu_backward(int64_t(x.size()), y.data(), r.data(), gx.data());
  check_gradient("relu", x, gx, [&](const Vec& xx) {
    Vec out(xx.size());
    be->relu_forward(int64_t(xx.size()), xx.data(), out.data());
    return dot(r, out);
  });
}

TEST_F(LayersTest, MaxPoolForwardBackward) {
  const Dims s{2, 6, 4, 5};
  Vec x = random_vec(s.numel(), 7);
  const Dims o{s.n, s.h / 2, s.w / 2, s.c};
  Vec y(size_t(o.numel()));
  std::vector<uint8_t> arg(y.size());
  be->maxpool2x2_forward(s, x.data(), y.data(), arg.data());
  for (int n = 0; n < s.n; ++n)
    for (int yy = 0; yy < o.h; ++yy)
      for (int xx = 0; xx < o.w; ++xx)
        for (int c = 0; c < s.c; ++c) {
          float m = -1e30f;
          for (int dy = 0; dy < 2; ++dy)
            for (int dx = 0; dx < 2; ++dx)
              m = std::max(m, x[size_t(((n * s.h + 2 * yy + dy) * s.w + 2 * xx + dx) * s.c + c)]);
          ASSERT_EQ(y[size_t(((n * o.h + yy) * o.w + xx) * s.c + c)], m);
        }
  // Without an argmax (inference) the same maxima, bitwise; ties and a NaN included.
  Vec xt = x;
  xt[size_t(s.w * s.c) + 1] = xt[1];  // a tie in the first window, channel 1
  xt[size_t(s.c)] = std::numeric_limits<float>::quiet_NaN();  // a NaN in it, channel 0
  Vec with_arg(y.size()), without(y.size());
  be->maxpool2x2_forward(s, xt.data(), with_arg.data(), arg.data());
  be->maxpool2x2_forward(s, xt.data(), without.data(), nullptr);
  ASSERT_EQ(0, std::memcmp(with_arg.data(), without.data(), y.size() * sizeof(float)));
  be->maxpool2x2_forward(s, x.data(), y.data(), arg.data());
  const Vec r = random_vec(o.numel(), 8);
  Vec gx(x.size(), 0.0f);
  be->maxpool2x2_backward(s, arg.data(), r.data(), gx.data(), false);
  check_gradient("maxpool2x2", x, gx, [&](const Vec& xx) {
    Vec out(y.size());
    std::vector<uint8_t> a(y.size());
    be->maxpool2x2_forward(s, xx.data(), out.data(), a.data());
    return dot(r, out);
  });
  // accumulate = true adds to what is there.
  Vec acc(x.size(), 1.0f);
  be->maxpool2x2_backward(s, arg.data(), r.data(), acc.data(), true);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(acc[i], 1.0f + gx[i]);
}

// PyTorch's bilinear x2 with align_corners=False, written out independently.
Vec upsample_reference(const Dims& s, const Vec& x) {
  const int oh = 2 * s.h, ow = 2 * s.w;
  Vec y(size_t(int64_t{s.n} * oh * ow * s.c));
  auto coord = [](int dst, int in_size, int& i0, int& i1, float& l1) {
    float src = (float(dst) + 0.5f) * 0.5f - 0.5f;
    if (src < 0) src = 0;
    i0 = int(src);
    i1 = std::min(i0 + 1, in_size - 1);
    l1 = src - float(i0);
  };
  for (int n = 0; n < s.n; ++n)
    for (int yy = 0; yy < oh; ++yy)
      for (int xx = 0; xx < ow; ++xx) {
        int y0, y1, x0, x1;
        float ly, lx;
        coord(yy, s.h, y0, y1, ly);
        coord(xx, s.w, x0, x1, lx);
        for (int c = 0; c < s.c; ++c) {
          auto at = [&](int a, int b) { return x[size_t(((n * s.h + a) * s.w + b) * s.c + c)]; };
          y[size_t(((n * oh + yy) * ow + xx) * s.c + c)] =
              (1 - ly) * ((1 - lx) * at(y0, x0) + lx * at(y0, x1)) +
              ly * ((1 - lx) * at(y1, x0) + lx * at(y1, x1));
        }
      }
  return y;
}

TEST_F(LayersTest, UpsampleMatchesPyTorchSemanticsAndGradients) {
  const Dims s{2, 3, 5, 4};
  Vec x = random_vec(s.numel(), 9);
  Vec y(size_t(s.numel() * 4));
  be->upsample2x_forward(s, x.data(), y.data());
  const Vec ref = upsample_reference(s, x);
  const test::Diff d = test::compare(y.data(), ref.data(), int64_t(ref.size()), 1e-3);
  std::printf("[forward]  %-28s max abs diff vs reference %.2e\n", "upsample2x", d.max_abs);
  EXPECT_LT(d.max_abs, 1e-6);
  const Vec r = random_vec(int64_t(y.size()), 10);
  Vec gx(x.size());
  be->upsample2x_backward(s, r.data(), gx.data());
  check_gradient("upsample2x", x, gx, [&](const Vec& xx) {
    Vec out(y.size());
    be->upsample2x_forward(s, xx.data(), out.data());
    return dot(r, out);
  });
}

TEST_F(LayersTest, ConcatAndSplit) {
  const Dims a{2, 3, 3, 4}, b{2, 3, 3, 6};
  Vec xa = random_vec(a.numel(), 11), xb = random_vec(b.numel(), 12);
  Vec y(size_t(a.numel() + b.numel()));
  be->concat_forward(a, xa.data(), b, xb.data(), y.data());
  for (int64_t p = 0; p < a.pixels(); ++p)
    for (int c = 0; c < 10; ++c)
      ASSERT_EQ(y[size_t(p * 10 + c)], c < 4 ? xa[size_t(p * 4 + c)] : xb[size_t(p * 6 + c - 4)]);
  const Vec r = random_vec(int64_t(y.size()), 13);
  Vec ga(xa.size()), gb(xb.size());
  be->concat_backward(a, b, r.data(), ga.data(), gb.data());
  auto loss = [&](const Vec& pa, const Vec& pb) {
    Vec out(y.size());
    be->concat_forward(a, pa.data(), b, pb.data(), out.data());
    return dot(r, out);
  };
  check_gradient("concat (first)", xa, ga, [&](const Vec& v) { return loss(v, xb); });
  check_gradient("concat (second)", xb, gb, [&](const Vec& v) { return loss(xa, v); });
}

TEST_F(LayersTest, BceWithLogitsValueAndGradient) {
  for (float pos_weight : {1.0f, 3.5f}) {
    Vec x = random_vec(500, 14, -8.0f, 8.0f);
    Vec t(x.size());
    Rng rng(3);
    for (auto& v : t) v = rng.uniform() < 0.3f ? 1.0f : 0.0f;
    Vec g(x.size());
    const double sum =
        be->bce_with_logits(int64_t(x.size()), x.data(), t.data(), pos_weight, 1.0f, g.data());
    // Reference: -(pw * y * log(sigmoid(x)) + (1-y) * log(1 - sigmoid(x))), in double.
    double ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double s = 1.0 / (1.0 + std::exp(-double(x[i])));
      ref -= pos_weight * t[i] * std::log(s) + (1 - t[i]) * std::log(1 - s);
    }
    EXPECT_NEAR(sum, ref, 1e-5 * std::fabs(ref)) << "pos_weight " << pos_weight;
    check_gradient(
        pos_weight == 1.0f ? "bce_with_logits" : "bce_with_logits pos_weight", x, g,
        [&](const Vec& xx) {
          Vec scratch(xx.size());
          return be->bce_with_logits(int64_t(xx.size()), xx.data(), t.data(), pos_weight, 1.0f,
                                     scratch.data());
        },
        1e-3f);
    // Large logits stay finite.
    Vec big{100.0f, -100.0f}, tb{0.0f, 1.0f}, gb(2);
    const double l = be->bce_with_logits(2, big.data(), tb.data(), pos_weight, 1.0f, gb.data());
    EXPECT_TRUE(std::isfinite(l));
    EXPECT_NEAR(l, 100.0 + pos_weight * 100.0, 1e-3);
  }
}

TEST_F(LayersTest, FocalWithLogitsValueAndGradient) {
  Vec x = random_vec(500, 15, -8.0f, 8.0f);
  Vec t(x.size());
  Rng rng(4);
  for (auto& v : t) v = rng.uniform() < 0.3f ? 1.0f : 0.0f;
  for (const auto& [alpha, gamma] : {std::pair{0.25f, 2.0f}, {-1.0f, 0.0f}, {0.7f, 1.5f}}) {
    const std::string name = str_cat("focal alpha ", alpha, " gamma ", gamma);
    Vec g(x.size());
    const double sum =
        be->focal_with_logits(int64_t(x.size()), x.data(), t.data(), alpha, gamma, 1.0f, g.data());
    // Reference in double: -a_t (1 - p_t)^gamma log(p_t).
    double ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double p = 1.0 / (1.0 + std::exp(-double(x[i])));
      const double pt = t[i] > 0.5f ? p : 1 - p;
      const double at = alpha < 0 ? 1.0 : t[i] > 0.5f ? alpha : 1 - alpha;
      ref -= at * std::pow(1 - pt, gamma) * std::log(pt);
    }
    EXPECT_NEAR(sum, ref, 1e-5 * std::fabs(ref)) << name;
    check_gradient(
        name, x, g,
        [&](const Vec& xx) {
          Vec scratch(xx.size());
          return be->focal_with_logits(int64_t(xx.size()), xx.data(), t.data(), alpha, gamma, 1.0f,
                                       scratch.data());
        },
        1e-3f);
  }
  // gamma 0 without alpha is BCE.
  Vec gf(x.size()), gb(x.size());
  const double focal =
      be->focal_with_logits(int64_t(x.size()), x.data(), t.data(), -1.0f, 0.0f, 0.5f, gf.data());
  const double bce =
      be->bce_with_logits(int64_t(x.size()), x.data(), t.data(), 1.0f, 0.5f, gb.data());
  EXPECT_NEAR(focal, bce, 1e-9 * bce);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(gf[i], gb[i], 1e-6f) << i;
}

TEST_F(LayersTest, DiceWithLogitsValueAndGradient) {
  // 3 images of 40 pixels: cracks in two, none in the third (its Dice is smooth / (sum p +
  // smooth)).
  constexpr int kImages = 3;
  constexpr int64_t kPixels = 40;
  Vec x = random_vec(size_t(kImages * kPixels), 16, -4.0f, 4.0f);
  Vec t(x.size(), 0.0f);
  Rng rng(5);
  for (size_t i = 0; i < size_t(2 * kPixels); ++i) t[i] = rng.uniform() < 0.3f ? 1.0f : 0.0f;
  for (const float smooth : {1.0f, 0.0f}) {
    Vec g(x.size());
    const double sum =
        be->dice_with_logits(kImages, kPixels, x.data(), t.data(), smooth, 1.0f, g.data(), false);
    double ref = 0;
    for (int img = 0; img < kImages; ++img) {
      double inter = 0, card = 0;
      for (int64_t j = 0; j < kPixels; ++j) {
        const size_t i = size_t(img * kPixels + j);
        const double p = 1.0 / (1.0 + std::exp(-double(x[i])));
        inter += p * t[i];
        card += p + t[i];
      }
      ref += 1 - (2 * inter + smooth) / (card + smooth);
    }
    EXPECT_NEAR(sum, ref, 1e-6) << "smooth " << smooth;
    check_gradient(
        str_cat("dice smooth ", smooth), x, g,
        [&](const Vec& xx) {
          Vec scratch(xx.size());
          return be->dice_with_logits(kImages, kPixels, xx.data(), t.data(), smooth, 1.0f,
                                      scratch.data(), false);
        },
        1e-3f);
    // accumulate adds to what is there (a BCE gradient written first).
    Vec acc(x.size(), 0.25f);
    be->dice_with_logits(kImages, kPixels, x.data(), t.data(), smooth, 1.0f, acc.data(), true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(acc[i], g[i] + 0.25f, 1e-6f) << i;
  }
}

TEST_F(LayersTest, ConfusionCounts) {
  const Vec x{2.0f, -1.0f, 0.5f, -3.0f, 1.0f};
  const Vec t{1.0f, 1.0f, 0.0f, 0.0f, 1.0f};
  int64_t c[3] = {0, 0, 0};
  be->confusion_counts(5, x.data(), t.data(), 0.0f, c);
  EXPECT_EQ(c[0], 2);  // TP
  EXPECT_EQ(c[1], 1);  // FP
  EXPECT_EQ(c[2], 1);  // FN
}

TEST_F(LayersTest, SgdMatchesPyTorchFormula) {
  Vec p{1.0f, -2.0f}, g{0.5f, 0.25f}, m{0.0f, 0.0f};
  const float lr = 0.1f, mu = 0.9f, wd = 0.01f;
  // Two steps by hand: buf1 = g + wd p; p1 = p - lr buf1; buf2 = mu buf1 + g + wd p1.
  be->sgd_update(2, p.data(), g.data(), m.data(), lr, mu, wd, false);
  be->sgd_update(2, p.data(), g.data(), m.data(), lr, mu, wd, false);
  for (int i = 0; i < 2; ++i) {
    const double p0 = i == 0 ? 1.0 : -2.0, gi = i == 0 ? 0.5 : 0.25;
    const double b1 = gi + wd * p0, p1 = p0 - lr * b1;
    const double b2 = mu * b1 + gi + wd * p1, p2 = p1 - lr * b2;
    EXPECT_NEAR(p[size_t(i)], p2, 1e-6);
    EXPECT_NEAR(m[size_t(i)], b2, 1e-6);
  }
}

}  // namespace
}  // namespace dp
