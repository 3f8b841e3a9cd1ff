// --precision bf16 on the CPU: bf16 activations; convolutions equal fp32 ones on bf16-rounded
// operands, every other op equals its fp32 self on the rounded inputs rounded once, and a training
// run learns like fp32 (skipped on CPUs without AVX512-BF16/AMX).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "bf16_util.hpp"
#include "dp/backend.hpp"
#include "fit_util.hpp"
#include "tensor_util.hpp"

namespace dp {
namespace {

using Vec = std::vector<float>;
using Bits = std::vector<bf16>;

#define SKIP_WITHOUT_BF16() \
  if (!cpu_bf16_support().empty()) GTEST_SKIP() << "no bf16 on this CPU: " << cpu_bf16_support()

using test::random_vec;
using test::rel_diff;

struct ConvCase {
  ConvDesc d;
  const char* name;
};

class Bf16Conv : public ::testing::TestWithParam<ConvCase> {};

// bf16 activations: a convolution reads the bf16 input (and the bf16 output gradient) as they
// are and bf16-rounded weights, and stores its output and data gradient in bf16. So it equals the
// fp32 convolution of the rounded operands up to the fp32 accumulation order (1e-5) and the final
// rounding to bf16 (8 significant bits: at most 2^-8 = 3.9e-3 of each element; 4e-3 in all); the
// weight and bias gradients are fp32 (1e-5). Against the unrounded fp32 result the error is bf16's
// (~1e-2), which shows that rounding happened.
constexpr double kStoredTol = 4e-3;

TEST_P(Bf16Conv, EqualsFp32OnRoundedOperands) {
  SKIP_WITHOUT_BF16();
  const ConvDesc d = GetParam().d;
  auto fp32 = make_cpu_backend(Precision::kFloat32);
  auto bf16 = make_cpu_backend(Precision::kBFloat16);
  const size_t src_n = size_t(d.src().numel()), dst_n = size_t(d.dst().numel());
  const size_t w_n = size_t(d.cout) * size_t(d.cin) * size_t(d.kernel) * size_t(d.kernel);
  const Vec x = random_vec(src_n, 1), w = random_vec(w_n, 2), b = random_vec(size_t(d.cout), 3);
  const Vec dy = random_vec(dst_n, 4);
  const Vec xr = test::rounded_to_bf16(x), wr = test::rounded_to_bf16(w),
            dyr = test::rounded_to_bf16(dy);

  const Bits x_lo = test::stored_bf16(x);
  Bits y_lo(dst_n);
  Vec y_ref(dst_n), y_full(dst_n);
  bf16->conv_forward(d, x_lo.data(), w.data(), b.data(), y_lo.data());
  fp32->conv_forward(d, xr.data(), wr.data(), b.data(), y_ref.data());
  fp32->conv_forward(d, x.data(), w.data(), b.data(), y_full.data());
  const Vec y = test::widened(y_lo);
  EXPECT_LT(rel_diff(y, y_ref), kStoredTol);
  EXPECT_GT(rel_diff(y, y_full), 1e-5);  // the operands really were rounded
  EXPECT_LT(rel_diff(y, y_full), 2e-2);

  // Backward (no ReLU here: the mask would depend on the forward output's rounding).
  Bits dx_lo(src_n), dy_lo = test::stored_bf16(dy);
  Vec dw_lo(w_n), db_lo(size_t(d.cout));
  Vec dx_ref(src_n), dw_ref(w_n), db_ref(size_t(d.cout));
  bf16->conv_backward(d, x_lo.data(), w.data(), y_lo.data(), dy_lo.data(), dx_lo.data(),
                      dw_lo.data(), db_lo.data());
  // Reference: dx from rounded dy and w; dw and db from rounded x and dy.
  Vec unused_dw(w_n), unused_db(size_t(d.cout)), dy_r = dyr;
  fp32->conv_backward(d, x.data(), wr.data(), y_ref.data(), dy_r.data(), dx_ref.data(),
                      unused_dw.data(), unused_db.data());
  dy_r = dyr;
  fp32->conv_backward(d, xr.data(), w.data(), y_ref.data(), dy_r.data(), nullptr, dw_ref.data(),
                      db_ref.data());
  EXPECT_LT(rel_diff(test::widened(dx_lo), dx_ref), kStoredTol);
  EXPECT_LT(rel_diff(dw_lo, dw_ref), 1e-5);
  EXPECT_LT(rel_diff(db_lo, db_ref), 1e-5);
}

ConvDesc conv(int n, int hw, int cin, int cout, int k, int stride, bool bias) {
  ConvDesc d{n, hw, hw, cin, cout, k};
  d.stride = stride;
  d.bias = bias;
  return d;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Conv,
                         ::testing::Values(ConvCase{conv(2, 16, 3, 16, 3, 1, true), "first_3x3"},
                                           ConvCase{conv(2, 8, 32, 64, 3, 1, true), "wide_3x3"},
                                           ConvCase{conv(2, 16, 16, 1, 1, 1, true), "final_1x1"},
                                           ConvCase{conv(2, 16, 8, 16, 3, 2, false),
                                                    "stride2_no_bias"}),
                         [](const auto& p) { return std::string(p.param.name); });

// Winograd F(2x2, 3x3) on bf16 GEMMs (kAuto may choose it, kGemmWinograd forces it): besides the
// operands, the transformed tiles and filters are rounded to bf16, so every pass comes within
// kWinogradTol of fp32 on the rounded operands: the output and data gradient about twice direct
// bf16's error, the weight gradient about PyTorch autocast's bf16 weight gradient's (2^-9 of each
// element); the bias gradient is summed in fp32 (1e-5).
// Shapes: odd sizes (partial tiles), 18 -> 34 channels (not whole panels or vectors) on 25 tiles
// (backward-weights pairs the last with a zero tile), a single pixel, and two images of 756 tiles
// (chunks across both; the weight sums run over two chunks).
constexpr double kWinogradTol = 8e-3;

TEST(Bf16Winograd, EachPassNearFp32OnRoundedOperands) {
  SKIP_WITHOUT_BF16();
  auto fp32 = make_cpu_backend(Precision::kFloat32);
  auto direct = make_cpu_backend(Precision::kBFloat16);
  auto wino = make_cpu_backend(CpuOptions{Precision::kBFloat16, CpuConvAlgo::kGemmWinograd});
  EXPECT_NE(wino->name().find("Winograd F(2x2, 3x3) on bf16 GEMMs"), std::string::npos);
  for (ConvDesc d : {conv(2, 16, 32, 48, 3, 1, true), conv(1, 12, 16, 16, 3, 1, false),
                     conv(2, 9, 64, 32, 3, 1, true), conv(1, 9, 18, 34, 3, 1, true),
                     conv(1, 1, 8, 8, 3, 1, true), conv(2, 41, 16, 24, 3, 1, true)}) {
    if (d.h == 12) d.w = 20;  // not square
    if (d.h == 41) d.w = 35;
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w));
    const size_t src_n = size_t(d.src().numel()), dst_n = size_t(d.dst().numel());
    const size_t w_n = size_t(d.cout) * size_t(d.cin) * 9;
    const Vec x = test::rounded_to_bf16(random_vec(src_n, 1)), w = random_vec(w_n, 2),
              b = random_vec(size_t(d.cout), 3), dy = test::rounded_to_bf16(random_vec(dst_n, 4));
    const Vec wr = test::rounded_to_bf16(w);
    Vec y_ref(dst_n), dx_ref(src_n), dw_ref(w_n), db_ref(size_t(d.cout)), unused_dw(w_n),
        unused_db(size_t(d.cout));
    fp32->conv_forward(d, x.data(), wr.data(), b.data(), y_ref.data());
    Vec dy_r = dy;
    fp32->conv_backward(d, x.data(), wr.data(), y_ref.data(), dy_r.data(), dx_ref.data(),
                        unused_dw.data(), unused_db.data());
    dy_r = dy;
    fp32->conv_backward(d, x.data(), w.data(), y_ref.data(), dy_r.data(), nullptr, dw_ref.data(),
                        db_ref.data());
    Vec err[2][4];  // [direct, Winograd] y, dx, dw, db
    double e[2][4];
    for (int k = 0; k < 2; ++k) {
      Backend& be = k == 0 ? *direct : *wino;
      const Bits x_lo = test::stored_bf16(x);
      Bits y_lo(dst_n, bf16{0x7fc0}), dx_lo(src_n, bf16{0x7fc0}), dy_lo = test::stored_bf16(dy);
      Vec dw(w_n, NAN), db(size_t(d.cout), NAN);
      be.conv_forward(d, x_lo.data(), w.data(), b.data(), y_lo.data());
      be.conv_backward(d, x_lo.data(), w.data(), y_lo.data(), dy_lo.data(), dx_lo.data(), dw.data(),
                       db.data());
      e[k][0] = rel_diff(test::widened(y_lo), y_ref);
      e[k][1] = rel_diff(test::widened(dx_lo), dx_ref);
      e[k][2] = rel_diff(dw, dw_ref);
      e[k][3] = d.bias ? rel_diff(db, db_ref) : 0.0;
    }
    std::printf(
        "[bf16 winograd] %d->%d %dx%d: y %.2e dx %.2e dw %.2e db %.2e (direct bf16: y "
        "%.2e dx %.2e)\n",
        d.cin, d.cout, d.h, d.w, e[1][0], e[1][1], e[1][2], e[1][3], e[0][0], e[0][1]);
    EXPECT_LT(e[1][0], kWinogradTol);
    EXPECT_LT(e[1][1], kWinogradTol);
    EXPECT_LT(e[1][2], kWinogradTol);
    EXPECT_LT(e[1][3], 1e-5);
    if (d.h > 1) {
      EXPECT_GT(e[1][0], e[0][0]);  // the transformed tiles really were rounded
    }
  }
  EXPECT_EQ(wino->kernel_choices(),
            "forward: 6 Winograd on GEMMs; backward data: 6 Winograd on GEMMs; backward weights: "
            "6 Winograd on GEMMs");
}

// kAuto with bf16 times direct against bf16 Winograd on a pass large enough (0.6 GFLOP) at its
// first use and keeps one: every pass's result after the choice (the second call) is within
// kWinogradTol of fp32 on the rounded operands, and each pass names a kernel.
TEST(Bf16Winograd, TimedChoiceStaysNearFp32) {
  SKIP_WITHOUT_BF16();
  ConvDesc d{2, 64, 64, 64, 64, 3};
  d.bias = true;
  auto fp32 = make_cpu_backend(Precision::kFloat32);
  auto timed = make_cpu_backend(CpuOptions{Precision::kBFloat16, CpuConvAlgo::kAuto});
  const size_t src_n = size_t(d.src().numel()), dst_n = size_t(d.dst().numel()),
               w_n = size_t(d.cout) * size_t(d.cin) * 9;
  const Vec x = test::rounded_to_bf16(random_vec(src_n, 1)), w = random_vec(w_n, 2),
            b = random_vec(size_t(d.cout), 3), dy = test::rounded_to_bf16(random_vec(dst_n, 4));
  const Vec wr = test::rounded_to_bf16(w);
  Vec y_ref(dst_n), dx_ref(src_n), dw_ref(w_n), db_ref(size_t(d.cout)), dy_r = dy;
  fp32->conv_forward(d, x.data(), wr.data(), b.data(), y_ref.data());
  fp32->conv_backward(d, x.data(), wr.data(), y_ref.data(), dy_r.data(), dx_ref.data(),
                      dw_ref.data(), db_ref.data());
  const Bits x_lo = test::stored_bf16(x);
  Bits y_lo(dst_n), dx_lo(src_n), dy_lo;
  Vec dw(w_n), db(size_t(d.cout));
  for (int call = 0; call < 2; ++call) {
    std::fill(y_lo.begin(), y_lo.end(), bf16{0x7fc0});
    std::fill(dx_lo.begin(), dx_lo.end(), bf16{0x7fc0});
    std::fill(dw.begin(), dw.end(), NAN);
    dy_lo = test::stored_bf16(dy);
    timed->conv_forward(d, x_lo.data(), w.data(), b.data(), y_lo.data());
    timed->conv_backward(d, x_lo.data(), w.data(), y_lo.data(), dy_lo.data(), dx_lo.data(),
                         dw.data(), db.data());
  }
  // dw against fp32 from the rounded operands: weights enter dw only through dy and x.
  EXPECT_LT(rel_diff(test::widened(y_lo), y_ref), kWinogradTol);
  EXPECT_LT(rel_diff(test::widened(dx_lo), dx_ref), kWinogradTol);
  EXPECT_LT(rel_diff(dw, dw_ref), kWinogradTol);
  const std::string k = timed->kernel_choices();
  std::printf("[bf16 auto] %s\n", k.c_str());
  EXPECT_EQ(k.find("not yet run"), std::string::npos) << k;
  EXPECT_EQ(std::count(k.begin(), k.end(), ';'), 2) << k;
}

// Ten SGD steps of UNet16/8 on one batch with every 3x3 convolution but the first (3 input
// channels) on bf16 Winograd: it fits the batch as direct bf16 does (the loss falls by the same
// amount within 5%), and every pass of those convolutions ran on it.
TEST(Bf16Winograd, FitsABatchLikeDirect) {
  SKIP_WITHOUT_BF16();
  ModelConfig mc;
  mc.width_divisor = 8;
  double drop[2] = {0, 0};
  for (int b = 0; b < 2; ++b) {
    auto be = make_cpu_backend(CpuOptions{
        Precision::kBFloat16, b == 0 ? CpuConvAlgo::kDirect : CpuConvAlgo::kGemmWinograd});
    const test::FitResult fit = test::fit_one_batch(*be, mc, 10, 0.5f);
    drop[b] = fit.losses.front() - fit.losses.back();
    std::printf("[bf16 %s] loss %.5f -> %.5f\n", b == 0 ? "direct" : "winograd", fit.losses.front(),
                fit.losses.back());
    if (b == 1) {
      const std::string k = be->kernel_choices();
      for (const char* pass : {"forward:", "backward data:", "backward weights:"}) {
        const std::string part = k.substr(k.find(pass));
        EXPECT_NE(part.substr(0, part.find(';')).find("Winograd on GEMMs"), std::string::npos)
            << pass << " " << k;
      }
    }
  }
  EXPECT_GT(drop[0], 0.02);  // direct bf16 learns
  EXPECT_NEAR(drop[1] / drop[0], 1.0, 0.05);
}

TEST(Bf16Deconv, EqualsFp32OnRoundedOperands) {
  SKIP_WITHOUT_BF16();
  const DeconvDesc d{2, 8, 8, 16, 8};
  auto fp32 = make_cpu_backend(Precision::kFloat32);
  auto bf16 = make_cpu_backend(Precision::kBFloat16);
  const size_t src_n = size_t(d.src().numel()), dst_n = size_t(d.dst().numel());
  const size_t w_n = size_t(d.cin) * size_t(d.cout) * 16;
  const Vec x = random_vec(src_n, 5), w = random_vec(w_n, 6), b = random_vec(size_t(d.cout), 7);
  const Bits x_lo = test::stored_bf16(x);
  Bits y_lo(dst_n);
  Vec y_ref(dst_n);
  bf16->deconv_forward(d, x_lo.data(), w.data(), b.data(), y_lo.data());
  const Vec xr = test::rounded_to_bf16(x), wr = test::rounded_to_bf16(w);
  fp32->deconv_forward(d, xr.data(), wr.data(), b.data(), y_ref.data());
  EXPECT_LT(rel_diff(test::widened(y_lo), y_ref), kStoredTol);
}

// ---- The other ops on bf16 activations ------------------------------------------------------

using Ptrs = std::vector<const void*>;
using MutPtrs = std::vector<void*>;
using OpFn = std::function<void(Backend&, const Ptrs& in, const MutPtrs& out)>;

template <typename V>
Ptrs pointers(const std::vector<V>& vs) {
  Ptrs p;
  for (const V& v : vs) p.push_back(v.data());
  return p;
}
template <typename V>
MutPtrs pointers(std::vector<V>& vs) {
  MutPtrs p;
  for (V& v : vs) p.push_back(v.data());
  return p;
}

// Runs `op` on an fp32 backend with the bf16-rounded inputs and on a bf16 backend with the inputs
// in bf16 storage: the bf16 outputs must be the fp32 outputs rounded once, bitwise (every op but
// the convolutions computes in fp32 from the widened inputs and rounds its result once). `outs`:
// the outputs' initial contents (the partial sums of an accumulating op, else garbage).
void expect_rounded_once(const std::string& name, const std::vector<Vec>& ins,
                         const std::vector<Vec>& outs, const OpFn& op) {
  auto fp32 = make_cpu_backend(Precision::kFloat32);
  auto bf16 = make_cpu_backend(Precision::kBFloat16);
  std::vector<Vec> in32, out32;
  std::vector<Bits> in16, out16;
  for (const Vec& v : ins)
    in32.push_back(test::rounded_to_bf16(v)), in16.push_back(test::stored_bf16(v));
  for (const Vec& v : outs)
    out32.push_back(test::rounded_to_bf16(v)), out16.push_back(test::stored_bf16(v));
  op(*fp32, pointers(std::as_const(in32)), pointers(out32));
  op(*bf16, pointers(std::as_const(in16)), pointers(out16));
  for (size_t i = 0; i < outs.size(); ++i) {
    const Vec want = test::rounded_to_bf16(out32[i]), got = test::widened(out16[i]);
    size_t differ = 0;
    for (size_t k = 0; k < want.size(); ++k)
      differ += std::memcmp(&want[k], &got[k], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << name << ": output " << i << " differs in " << differ << " of "
                          << want.size() << " elements";
    EXPECT_GT(rel_diff(got, Vec(got.size(), 0.0f)), 0.0)
        << name << ": output " << i << " is all zeros";
  }
}

Vec positive(Vec v) {
  for (float& x : v) x = 1.25f + 0.75f * x;  // [0.5, 2]
  return v;
}

TEST(Bf16Activations, EveryOtherOpRoundsOnce) {
  SKIP_WITHOUT_BF16();
  const Dims s{2, 6, 8, 5}, half{2, 3, 4, 5}, twice{2, 12, 16, 5}, other{2, 6, 8, 3};
  const auto n = [](const Dims& d) { return size_t(d.numel()); };
  const Vec x = random_vec(n(s), 11), y = random_vec(n(s), 12), prior = random_vec(n(s), 13);
  const Vec garbage(n(s), 777.0f);

  std::vector<uint8_t> argmax(n(half));
  expect_rounded_once("maxpool forward", {x}, {Vec(n(half))}, [&](Backend& be, auto in, auto out) {
    be.maxpool2x2_forward(s, in[0], out[0], argmax.data());
  });
  for (const bool acc : {false, true})
    expect_rounded_once(acc ? "maxpool backward accumulate" : "maxpool backward",
                        {random_vec(n(half), 14)}, {acc ? prior : garbage},
                        [&](Backend& be, auto in, auto out) {
                          be.maxpool2x2_backward(s, argmax.data(), in[0], out[0], acc);
                        });
  expect_rounded_once(
      "upsample forward", {x}, {Vec(n(twice))},
      [&](Backend& be, auto in, auto out) { be.upsample2x_forward(s, in[0], out[0]); });
  expect_rounded_once(
      "upsample backward", {random_vec(n(twice), 15)}, {garbage},
      [&](Backend& be, auto in, auto out) { be.upsample2x_backward(s, in[0], out[0]); });
  for (const bool relu : {false, true})
    expect_rounded_once(relu ? "add relu" : "add", {x, y}, {garbage},
                        [&](Backend& be, auto in, auto out) {
                          be.add_forward(s.numel(), in[0], in[1], relu, out[0]);
                        });
  expect_rounded_once("relu forward", {x}, {garbage}, [&](Backend& be, auto in, auto out) {
    be.relu_forward(s.numel(), in[0], out[0]);
  });
  expect_rounded_once("relu backward", {x, y}, {garbage}, [&](Backend& be, auto in, auto out) {
    be.relu_backward(s.numel(), in[0], in[1], out[0]);
  });
  expect_rounded_once(
      "concat forward", {x, random_vec(n(other), 16)}, {Vec(n(s) + n(other))},
      [&](Backend& be, auto in, auto out) { be.concat_forward(s, in[0], other, in[1], out[0]); });
  expect_rounded_once(
      "concat backward", {random_vec(n(s) + n(other), 17)}, {garbage, Vec(n(other), 777.0f)},
      [&](Backend& be, auto in, auto out) { be.concat_backward(s, other, in[0], out[0], out[1]); });
  const std::vector<uint64_t> seeds = {21, 22};
  Vec mask(size_t(s.n) * size_t(s.c));
  expect_rounded_once("dropout2d forward", {x}, {garbage}, [&](Backend& be, auto in, auto out) {
    be.dropout2d_forward(s, 0.3f, seeds.data(), in[0], mask.data(), out[0]);
  });
  expect_rounded_once("dropout2d backward", {y}, {garbage}, [&](Backend& be, auto in, auto out) {
    be.dropout2d_backward(s, mask.data(), in[0], out[0]);
  });
  expect_rounded_once("accumulate", {x}, {prior}, [&](Backend& be, auto in, auto out) {
    be.accumulate_activations(s.numel(), in[0], out[0]);
  });
  expect_rounded_once("copy", {x}, {garbage}, [&](Backend& be, auto in, auto out) {
    be.copy_activations(s.numel(), in[0], out[0]);
  });

  // Batch norm: per-channel fp32 parameters; the double sums and fp32 gradients must be equal.
  const Vec mean = random_vec(size_t(s.c), 18), invstd = positive(random_vec(size_t(s.c), 19));
  const Vec gamma = random_vec(size_t(s.c), 20), beta = random_vec(size_t(s.c), 21);
  std::vector<double> sums[2];
  Vec dgamma[2], dbeta[2];
  int which = 0;
  expect_rounded_once("batchnorm stats (input unchanged)", {}, {x},
                      [&](Backend& be, auto, auto out) {
                        sums[which].assign(2 * size_t(s.c), 0.0);
                        be.batchnorm_stats(s, out[0], sums[which].data());
                        which = 1 - which;
                      });
  EXPECT_EQ(sums[0], sums[1]) << "batchnorm stats";
  for (const bool relu : {false, true})
    expect_rounded_once(relu ? "batchnorm apply relu" : "batchnorm apply", {x}, {garbage},
                        [&](Backend& be, auto in, auto out) {
                          be.batchnorm_apply(s, in[0], mean.data(), invstd.data(), gamma.data(),
                                             beta.data(), relu, out[0]);
                        });
  expect_rounded_once("batchnorm backward stats (masked diff_dst)", {x, y}, {prior},
                      [&](Backend& be, auto in, auto out) {
                        sums[which].assign(2 * size_t(s.c), 0.0);
                        dgamma[which].resize(size_t(s.c));
                        dbeta[which].resize(size_t(s.c));
                        be.batchnorm_backward_stats(s, in[0], in[1], true, out[0], mean.data(),
                                                    invstd.data(), sums[which].data(),
                                                    dgamma[which].data(), dbeta[which].data());
                        which = 1 - which;
                      });
  EXPECT_EQ(sums[0], sums[1]) << "batchnorm backward stats";
  EXPECT_EQ(dgamma[0], dgamma[1]);
  EXPECT_EQ(dbeta[0], dbeta[1]);
  for (const bool acc : {false, true})
    expect_rounded_once(acc ? "batchnorm backward apply accumulate" : "batchnorm backward apply",
                        {x, y}, {acc ? prior : garbage}, [&](Backend& be, auto in, auto out) {
                          be.batchnorm_backward_apply(s, in[0], in[1], mean.data(), invstd.data(),
                                                      gamma.data(), sums[0].data(), 40.0, true,
                                                      out[0], acc);
                        });
}

// fp32 <-> activation conversions: round to nearest even (ties to the even mantissa, overflow to
// infinity), infinities and NaN kept; exact back.
TEST(Bf16Activations, ConversionsRoundToNearestEven) {
  SKIP_WITHOUT_BF16();
  auto be = make_cpu_backend(Precision::kBFloat16);
  ASSERT_EQ(be->activation_type(), DType::kBFloat16);
  const float inf = std::numeric_limits<float>::infinity();
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (to 1, even),
  // 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (to 1 + 2^-6, even); just above halfway
  // rounds up; the largest float is beyond bf16's largest finite value.
  const Vec x = {1.0f + 0x1p-8f,
                 1.0f + 3 * 0x1p-8f,
                 1.0f + 0x1p-8f + 0x1p-20f,
                 -2.5f,
                 0.0f,
                 inf,
                 -inf,
                 std::numeric_limits<float>::max(),
                 std::numeric_limits<float>::quiet_NaN()};
  const Vec want = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f, 0.0f, inf, -inf, inf};
  Bits stored(x.size());
  Vec back(x.size());
  be->to_activation(int64_t(x.size()), x.data(), stored.data());
  be->from_activation(int64_t(stored.size()), stored.data(), back.data());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(back[i], want[i]) << "element " << i;
  EXPECT_TRUE(std::isnan(back.back()));
}

// Ten SGD steps of UNet16/8 on one batch: bf16 activations and convolutions fit it as fp32 does
// (the loss falls by the same amount within 5%), and the weights differ (bf16 really was used).
TEST(Bf16Training, FitsABatchLikeFp32) {
  SKIP_WITHOUT_BF16();
  ModelConfig mc;
  mc.width_divisor = 8;
  double first[2] = {0, 0}, last[2] = {0, 0};
  Vec weights[2];
  for (int b = 0; b < 2; ++b) {
    auto be = make_cpu_backend(b == 0 ? Precision::kFloat32 : Precision::kBFloat16);
    const test::FitResult fit = test::fit_one_batch(*be, mc, 10, 0.5f);
    first[b] = fit.losses.front();
    last[b] = fit.losses.back();
    weights[b] = fit.weights;
  }
  std::printf("[bf16] loss %.5f -> %.5f (fp32 %.5f -> %.5f)\n", first[1], last[1], first[0],
              last[0]);
  EXPECT_LT(last[0], first[0] - 0.02);  // fp32 learns
  EXPECT_NEAR((first[1] - last[1]) / (first[0] - last[0]), 1.0, 0.05);
  EXPECT_GT(rel_diff(weights[1], weights[0]), 1e-6);
}

TEST(Bf16Support, NamedWhenRefused) {
  if (cpu_bf16_support().empty()) {
    EXPECT_NE(make_cpu_backend(Precision::kBFloat16)->name().find("bf16"), std::string::npos);
  } else {
    try {
      make_cpu_backend(Precision::kBFloat16);
      ADD_FAILURE() << "bf16 accepted without support";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("AVX512-BF16"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dp
