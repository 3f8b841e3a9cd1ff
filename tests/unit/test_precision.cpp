// --precision bf16 on the CPU: convolutions equal fp32 ones on bf16-rounded operands, and a
// training run with bf16 convolutions learns like fp32 (skipped on CPUs without AVX512-BF16/AMX).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bf16_util.hpp"
#include "dp/backend.hpp"
#include "fit_util.hpp"
#include "tensor_util.hpp"

namespace dp {
namespace {

using Vec = std::vector<float>;

#define SKIP_WITHOUT_BF16() \
  if (!cpu_bf16_support().empty()) GTEST_SKIP() << "no bf16 on this CPU: " << cpu_bf16_support()

using test::random_vec;
using test::rel_diff;

struct ConvCase {
  ConvDesc d;
  const char* name;
};

class Bf16Conv : public ::testing::TestWithParam<ConvCase> {};

// bf16 convolution == fp32 convolution of the bf16-rounded input and weights (forward), of the
// rounded output gradient and weights (backward data) and of the rounded input and output
// gradient (backward weights): only the fp32 accumulation order may differ (1e-5). Against the
// unrounded fp32 result the error is bf16's (~1e-2), which shows that rounding happened.
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

  Vec y_lo(dst_n), y_ref(dst_n), y_full(dst_n);
  bf16->conv_forward(d, x.data(), w.data(), b.data(), y_lo.data());
  fp32->conv_forward(d, xr.data(), wr.data(), b.data(), y_ref.data());
  fp32->conv_forward(d, x.data(), w.data(), b.data(), y_full.data());
  EXPECT_LT(rel_diff(y_lo, y_ref), 1e-5);
  EXPECT_GT(rel_diff(y_lo, y_full), 1e-5);  // the operands really were rounded
  EXPECT_LT(rel_diff(y_lo, y_full), 2e-2);

  // Backward (no ReLU here: the mask would depend on the forward output's rounding).
  Vec dx_lo(src_n), dw_lo(w_n), db_lo(size_t(d.cout)), dy_lo = dy;
  Vec dx_ref(src_n), dw_ref(w_n), db_ref(size_t(d.cout));
  bf16->conv_backward(d, x.data(), w.data(), y_lo.data(), dy_lo.data(), dx_lo.data(), dw_lo.data(),
                      db_lo.data());
  // Reference: dx from rounded dy and w; dw and db from rounded x and dy.
  Vec unused_dw(w_n), unused_db(size_t(d.cout)), dy_r = dyr;
  fp32->conv_backward(d, x.data(), wr.data(), y_ref.data(), dy_r.data(), dx_ref.data(),
                      unused_dw.data(), unused_db.data());
  dy_r = dyr;
  fp32->conv_backward(d, xr.data(), w.data(), y_ref.data(), dy_r.data(), nullptr, dw_ref.data(),
                      db_ref.data());
  EXPECT_LT(rel_diff(dx_lo, dx_ref), 1e-5);
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

TEST(Bf16Deconv, EqualsFp32OnRoundedOperands) {
  SKIP_WITHOUT_BF16();
  const DeconvDesc d{2, 8, 8, 16, 8};
  auto fp32 = make_cpu_backend(Precision::kFloat32);
  auto bf16 = make_cpu_backend(Precision::kBFloat16);
  const size_t src_n = size_t(d.src().numel()), dst_n = size_t(d.dst().numel());
  const size_t w_n = size_t(d.cin) * size_t(d.cout) * 16;
  const Vec x = random_vec(src_n, 5), w = random_vec(w_n, 6), b = random_vec(size_t(d.cout), 7);
  Vec y_lo(dst_n), y_ref(dst_n);
  bf16->deconv_forward(d, x.data(), w.data(), b.data(), y_lo.data());
  const Vec xr = test::rounded_to_bf16(x), wr = test::rounded_to_bf16(w);
  fp32->deconv_forward(d, xr.data(), wr.data(), b.data(), y_ref.data());
  EXPECT_LT(rel_diff(y_lo, y_ref), 1e-5);
}

// Ten SGD steps of UNet16/8 on one batch: bf16 convolutions fit it as fp32 does (the loss
// falls by the same amount within 5%), and the weights differ (bf16 really was used).
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
