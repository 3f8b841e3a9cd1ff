// The CPU backend's alternatives to direct NHWC convolutions (CpuConvAlgo): Winograd (AVX-512),
// the direct kernels on blocked copies and the shifted GEMMs (every ISA): each pass equals the
// direct NHWC kernel's within rounding, alone and in every mixture over the passes, timing-based
// choice (kAuto) gives the same results, the choice by shape (kShape) runs Winograd forward on
// wide layers only, and a model trains with them as with direct kernels.
// Registered twice: natively and capped at AVX2 (ONEDNN_MAX_CPU_ISA), where Winograd skips and
// kAuto chooses between the two direct layouts and the GEMMs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cpu/conv_gemm.hpp"
#include "cpu/onednn.hpp"  // lib/: ConvPrims, to force each pass's kernel
#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "fit_util.hpp"
#include "tensor_util.hpp"

namespace dp {
namespace {

using Vec = std::vector<float>;

#define SKIP_WITHOUT_WINOGRAD() \
  if (!cpu_winograd_support().empty()) GTEST_SKIP() << cpu_winograd_support()

using test::random_vec;
using test::rel_diff;

std::unique_ptr<Backend> backend(CpuConvAlgo algo) {
  CpuOptions o;
  o.conv_algo = algo;
  return make_cpu_backend(o);
}

// Forward and backward of one convolution: output, data, weight and bias gradients, from the
// last of `calls` calls (outputs are poisoned before each). With a fused ReLU, backward masks the
// output gradient by `relu_y` when given (the reference's output) instead of this forward's: an
// output within rounding of 0 would otherwise flip the mask and move the gradients by a whole
// element's contribution, which is the ReLU's doing, not the kernel's.
struct ConvResult {
  Vec y, dx, dw, db;
};
// `fwd(x, w, b, y)` and `bwd(x, w, mask, dy, dx, dw, db)` as Backend::conv_forward/backward.
template <typename Fwd, typename Bwd>
ConvResult run_passes(const ConvDesc& d, int calls, const Vec* relu_y, const Fwd& fwd,
                      const Bwd& bwd) {
  const size_t src_n = size_t(d.src().numel()), dst_n = size_t(d.dst().numel());
  const size_t w_n = size_t(d.cout) * size_t(d.cin) * 9;
  const Vec x = random_vec(src_n, 1), w = random_vec(w_n, 2), b = random_vec(size_t(d.cout), 3);
  const Vec dy0 = random_vec(dst_n, 4);
  ConvResult r{Vec(dst_n), Vec(src_n), Vec(w_n), Vec(size_t(d.cout))};
  for (int call = 0; call < calls; ++call) {
    for (Vec* v : {&r.y, &r.dx, &r.dw, &r.db}) std::fill(v->begin(), v->end(), NAN);
    fwd(x.data(), w.data(), b.data(), r.y.data());
    Vec dy = dy0;
    const float* mask = relu_y != nullptr ? relu_y->data() : r.y.data();
    bwd(x.data(), w.data(), mask, dy.data(), r.dx.data(), r.dw.data(), r.db.data());
  }
  return r;
}

ConvResult run_conv(Backend& be, const ConvDesc& d, int calls = 1, const Vec* relu_y = nullptr) {
  return run_passes(
      d, calls, relu_y,
      [&](const float* x, const float* w, const float* b, float* y) {
        be.conv_forward(d, x, w, b, y);
      },
      [&](const float* x, const float* w, const float* y, float* dy, float* dx, float* dw,
          float* db) { be.conv_backward(d, x, w, y, dy, dx, dw, db); });
}

ConvDesc conv(int n, int h, int w, int cin, int cout, bool relu, bool bias) {
  ConvDesc d{n, h, w, cin, cout, 3};
  d.relu = relu;
  d.bias = bias;
  return d;
}

// Winograd F(4x4, 3x3) transforms cost a few bits: every pass within 2e-5 of the direct
// kernel's result (relative to the largest value), and not bitwise equal (it really ran).
TEST(Winograd, EachPassMatchesDirect) {
  SKIP_WITHOUT_WINOGRAD();
  auto direct = backend(CpuConvAlgo::kDirect);
  auto wino = backend(CpuConvAlgo::kWinograd);
  EXPECT_NE(wino->name().find("Winograd"), std::string::npos);
  for (const ConvDesc& d :
       {conv(2, 16, 16, 32, 48, true, true), conv(1, 12, 20, 16, 16, false, false),
        conv(2, 9, 11, 64, 32, true, true)}) {
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w));
    const ConvResult a = run_conv(*direct, d), b = run_conv(*wino, d, 1, &a.y);
    std::printf("[winograd] %d->%d %dx%d: y %.2e dx %.2e dw %.2e db %.2e\n", d.cin, d.cout, d.h,
                d.w, rel_diff(b.y, a.y), rel_diff(b.dx, a.dx), rel_diff(b.dw, a.dw),
                d.bias ? rel_diff(b.db, a.db) : 0.0);
    EXPECT_LT(rel_diff(b.y, a.y), 2e-5);
    EXPECT_LT(rel_diff(b.dx, a.dx), 2e-5);
    EXPECT_LT(rel_diff(b.dw, a.dw), 2e-5);
    if (d.bias) {
      EXPECT_LT(rel_diff(b.db, a.db), 2e-5);
    }
    EXPECT_GT(rel_diff(b.y, a.y), 0.0);
    EXPECT_GT(rel_diff(b.dw, a.dw), 0.0);
  }
}

// The direct kernels on oneDNN's blocked layout (nChw8c on AVX2, nChw16c on AVX-512) sum in another
// order than on NHWC: every pass within 2e-5 of NHWC's, on any CPU.
TEST(BlockedConv, EachPassMatchesDirect) {
  std::printf("[blocked] oneDNN runs %s\n", cpu_isa_name().c_str());
  auto direct = backend(CpuConvAlgo::kDirect);
  auto blocked = backend(CpuConvAlgo::kBlocked);
  EXPECT_NE(blocked->name().find("blocked"), std::string::npos) << blocked->name();
  for (const ConvDesc& d :
       {conv(2, 16, 16, 32, 48, true, true), conv(1, 12, 20, 16, 16, false, false),
        conv(2, 9, 11, 64, 32, true, true), conv(2, 16, 16, 3, 64, true, true)}) {
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w));
    const ConvResult a = run_conv(*direct, d), b = run_conv(*blocked, d, 1, &a.y);
    std::printf("[blocked] %d->%d %dx%d: y %.2e dx %.2e dw %.2e db %.2e\n", d.cin, d.cout, d.h, d.w,
                rel_diff(b.y, a.y), rel_diff(b.dx, a.dx), rel_diff(b.dw, a.dw),
                d.bias ? rel_diff(b.db, a.db) : 0.0);
    EXPECT_LT(rel_diff(b.y, a.y), 2e-5);
    EXPECT_LT(rel_diff(b.dx, a.dx), 2e-5);
    EXPECT_LT(rel_diff(b.dw, a.dw), 2e-5);
    if (d.bias) {
      EXPECT_LT(rel_diff(b.db, a.db), 2e-5);
    }
  }
}

// The shifted GEMMs and Winograd on GEMMs sum in another order than oneDNN's kernels:
// every pass within 2e-5 of direct NHWC's, on any CPU, for odd sizes (partial Winograd tiles),
// 3 input channels, a single pixel, and more tiles than one chunk holds (41x35, 2 images: 756
// tiles, chunks that span both images, whose backward-weights sums accumulate over 3 chunks).
void expect_gemm_passes_match_direct(CpuConvAlgo algo, const char* kind) {
  auto direct = backend(CpuConvAlgo::kDirect);
  auto gemm = backend(algo);
  EXPECT_NE(gemm->name().find("GEMMs"), std::string::npos) << gemm->name();
  for (const ConvDesc& d :
       {conv(2, 16, 16, 32, 48, true, true), conv(1, 12, 20, 16, 16, false, false),
        conv(2, 9, 11, 64, 32, true, true), conv(2, 16, 16, 3, 64, true, true),
        conv(1, 1, 1, 8, 8, false, true), conv(2, 41, 35, 16, 24, true, true)}) {
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w));
    const ConvResult a = run_conv(*direct, d), b = run_conv(*gemm, d, 2, &a.y);
    std::printf("[%s] %d->%d %dx%d: y %.2e dx %.2e dw %.2e db %.2e\n", kind, d.cin, d.cout, d.h,
                d.w, rel_diff(b.y, a.y), rel_diff(b.dx, a.dx), rel_diff(b.dw, a.dw),
                d.bias ? rel_diff(b.db, a.db) : 0.0);
    EXPECT_LT(rel_diff(b.y, a.y), 2e-5);
    EXPECT_LT(rel_diff(b.dx, a.dx), 2e-5);
    EXPECT_LT(rel_diff(b.dw, a.dw), 2e-5);
    if (d.bias) {
      EXPECT_LT(rel_diff(b.db, a.db), 2e-5);
    }
  }
  EXPECT_EQ(gemm->kernel_choices(), algo == CpuConvAlgo::kGemm
                                        ? "forward: 6 GEMM; backward data: 6 GEMM; backward "
                                          "weights: 6 GEMM"
                                        : "forward: 6 Winograd on GEMMs; backward data: 6 "
                                          "Winograd on GEMMs; backward weights: 6 Winograd on "
                                          "GEMMs");
}

TEST(GemmConv, EachPassMatchesDirect) {
  expect_gemm_passes_match_direct(CpuConvAlgo::kGemm, "gemm");
}

TEST(GemmWinograd, EachPassMatchesDirect) {
  expect_gemm_passes_match_direct(CpuConvAlgo::kGemmWinograd, "gemm-winograd");
}

// All 64 ways to run the three passes on direct NHWC, blocked (or oneDNN's Winograd), shifted GEMM
// and Winograd-on-GEMM kernels, as timing may leave them: the blocked and GEMM passes share the
// copies scratch, and none may clobber what another still reads (the scratch is poisoned before
// each call).
TEST(ConvKernels, EveryMixOverThePassesMatchesDirect) {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const ConvDesc d = conv(2, 30, 34, 64, 112, true, true);  // 0.26 GFLOP: kAuto times it
  auto p = cpu::make_conv(eng, d, false, CpuConvAlgo::kAuto);
  ASSERT_TRUE(p->blocked && p->gemm);
  // 64-byte aligned, as the backend's: oneDNN's Winograd writes its scratchpad with aligned
  // stores (a std::vector's 16-byte alignment crashed it).
  const Buffer copies(p->copies_bytes()), weights(p->weight_scratch_bytes());
  const cpu::Scratch scratch{weights.data(), copies.data()};
  auto direct = backend(CpuConvAlgo::kDirect);
  const ConvResult a = run_conv(*direct, d);
  const cpu::PassAlgo kinds[4] = {cpu::PassAlgo::kDirect, cpu::PassAlgo::kBlocked,
                                  cpu::PassAlgo::kGemm, cpu::PassAlgo::kGemmWinograd};
  for (int mix = 0; mix < 64; ++mix) {  // 4 kinds for each pass
    p->algo[0] = kinds[mix % 4];
    p->algo[1] = kinds[mix / 4 % 4];
    p->algo[2] = kinds[mix / 16];
    SCOPED_TRACE("forward " + std::to_string(int(p->algo[0])) + ", backward data " +
                 std::to_string(int(p->algo[1])) + ", backward weights " +
                 std::to_string(int(p->algo[2])));
    const auto poison = [&] { std::fill_n(copies.f32(), copies.bytes() / sizeof(float), NAN); };
    const ConvResult b = run_passes(
        d, 1, &a.y,
        [&](const float* x, const float* w, const float* bias, float* y) {
          poison();
          p->forward(stream, x, w, bias, y, scratch);
        },
        [&](const float* x, const float* w, const float* y, float* dy, float* dx, float* dw,
            float* db) {
          poison();
          p->backward(stream, x, w, y, dy, dx, dw, db, scratch);
        });
    EXPECT_LT(rel_diff(b.y, a.y), 2e-5);
    EXPECT_LT(rel_diff(b.dx, a.dx), 2e-5);
    EXPECT_LT(rel_diff(b.dw, a.dw), 2e-5);
    EXPECT_LT(rel_diff(b.db, a.db), 2e-5);
  }
}

// kAuto times the direct NHWC kernel and the alternatives (Winograd where oneDNN has it, else
// direct on blocked copies, and the GEMMs) on a pass large enough (0.6 GFLOP) at its first use and
// keeps the fastest: results match the direct kernel within rounding after the choice (the second
// call, whose outputs only the chosen kernels write). Runs on every CPU.
TEST(Winograd, TimedChoiceMatchesDirect) {
  const ConvDesc d = conv(2, 64, 64, 64, 64, true, true);
  auto direct = backend(CpuConvAlgo::kDirect);
  auto timed = backend(CpuConvAlgo::kAuto);
  const ConvResult a = run_conv(*direct, d);
  const ConvResult b = run_conv(*timed, d, 2, &a.y);
  EXPECT_LT(rel_diff(b.y, a.y), 2e-5);
  EXPECT_LT(rel_diff(b.dx, a.dx), 2e-5);
  EXPECT_LT(rel_diff(b.dw, a.dw), 2e-5);
  EXPECT_LT(rel_diff(b.db, a.db), 2e-5);
}

// One forward pass of `d` on `be` with the inputs of run_passes (seeds 1, 2, 3; the bias where `d`
// has one), the output poisoned first.
Vec forward_output(Backend& be, const ConvDesc& d) {
  const Vec x = random_vec(size_t(d.src().numel()), 1),
            w = random_vec(size_t(d.cout) * size_t(d.cin) * 9, 2),
            b = random_vec(size_t(d.cout), 3);
  Vec y(size_t(d.dst().numel()), NAN);
  be.conv_forward(d, x.data(), w.data(), d.bias ? b.data() : nullptr, y.data());
  return y;
}

// fp32 Winograd on GEMMs runs F(4x4, 3x3) (36 points, 6x6 tiles at stride 4) for every pass where
// the batch has at least 64 of its tiles, F(2x2, 3x3) below. Each tile, forced, is within 2e-5
// of direct in every pass, and the two differ (so the tile forced is the tile that ran), for sizes
// 4 does not divide (partial tiles on the right and bottom), a single pixel, 3 and 17 channels
// (not a whole vector of lanes), no bias or ReLU, and 2 images of 208 tiles each (two chunks of
// 112, the second partial).
TEST(GemmWinograd, Fp32TileByTheBatchsTiles) {
  auto direct = backend(CpuConvAlgo::kDirect);
  for (ConvDesc d : {conv(2, 50, 61, 16, 24, true, true), conv(1, 1, 1, 8, 8, false, true),
                     conv(2, 9, 11, 64, 32, true, false), conv(2, 16, 15, 3, 64, true, true),
                     conv(1, 7, 10, 17, 5, false, false), conv(1, 13, 6, 32, 17, true, true)}) {
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w));
    const int64_t tiles4 = int64_t(d.n) * ((d.h + 3) / 4) * ((d.w + 3) / 4);
    EXPECT_EQ(cpu::GemmConv(d, false).tile, tiles4 >= 64 ? 4 : 2);
    ConvDesc inference = d;
    inference.forward_only = true;
    EXPECT_EQ(cpu::GemmConv(inference, false).tile, tiles4 >= 64 ? 4 : 2);
    ConvDesc linear = d;  // the gradients' reference without the ReLU's mask
    linear.relu = false;
    const ConvResult want = run_conv(*direct, d), want_linear = run_conv(*direct, linear);
    const Vec x = random_vec(size_t(d.src().numel()), 1),
              w = random_vec(size_t(d.cout) * size_t(d.cin) * 9, 2),
              b = random_vec(size_t(d.cout), 3), dy = random_vec(size_t(d.dst().numel()), 4);
    ConvResult got[2];  // F(4x4, 3x3), F(2x2, 3x3)
    for (int k = 0; k < 2; ++k) {
      cpu::GemmConv g(d, false);
      g.tile = k == 0 ? 4 : 2;
      const Buffer copies(g.copies_bytes(false)), weights(g.weight_scratch_bytes());
      ConvResult& r = got[k];
      r = {Vec(dy.size(), NAN), Vec(x.size(), NAN), Vec(w.size(), NAN), Vec(b.size(), NAN)};
      g.forward_winograd(x.data(), w.data(), b.data(), r.y.data(), weights.data(), copies.data());
      g.backward_data_winograd(dy.data(), w.data(), r.dx.data(), weights.data(), copies.data());
      g.backward_weights_winograd(x.data(), dy.data(), r.dw.data(), r.db.data(), weights.data(),
                                  copies.data());
      std::printf("[gemm-winograd] %d->%d %dx%d: F(%dx%d, 3x3) y %.2e dx %.2e dw %.2e\n", d.cin,
                  d.cout, d.h, d.w, g.tile, g.tile, rel_diff(r.y, want.y),
                  rel_diff(r.dx, want_linear.dx), rel_diff(r.dw, want_linear.dw));
      EXPECT_LT(rel_diff(r.y, want.y), 2e-5);
      EXPECT_LT(rel_diff(r.dx, want_linear.dx), 2e-5);
      EXPECT_LT(rel_diff(r.dw, want_linear.dw), 2e-5);
    }
    EXPECT_NE(got[0].y, got[1].y);
    EXPECT_NE(got[0].dx, got[1].dx);
    EXPECT_NE(got[0].dw, got[1].dw);
  }
}

// kShape decides by the layer's shape, without timing: the forward pass of a layer whose channels
// pay for Winograd (64 -> 32: cin*cout/(cin+cout) = 21.3, above the bound of 20) and that has 0.2
// GFLOP runs it (oneDNN's where it has it, else on GEMMs), within 2e-5 of direct and not bitwise
// equal; a narrower one (24 -> 96: 19.2), a smaller one (64 -> 32 on a quarter of the pixels) and
// every backward pass run the direct kernels, bitwise.
TEST(ShapeRule, WinogradForwardWhereTheChannelsPayForIt) {
  auto direct = backend(CpuConvAlgo::kDirect);
  auto shape = backend(CpuConvAlgo::kShape);
  const ConvDesc wide = conv(2, 64, 64, 64, 32, true, true);    // 0.30 GFLOP
  const ConvDesc narrow = conv(2, 64, 64, 24, 96, true, true);  // 0.34 GFLOP
  const ConvDesc small = conv(2, 32, 32, 64, 32, true, true);   // 0.08 GFLOP
  for (const ConvDesc& d : {wide, narrow, small}) {
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w));
    const ConvResult a = run_conv(*direct, d), b = run_conv(*shape, d, 2, &a.y);
    std::printf("[shape] %d->%d %dx%d: y %.2e dx %.2e dw %.2e db %.2e\n", d.cin, d.cout, d.h, d.w,
                rel_diff(b.y, a.y), rel_diff(b.dx, a.dx), rel_diff(b.dw, a.dw),
                rel_diff(b.db, a.db));
    if (d == wide) {
      EXPECT_LT(rel_diff(b.y, a.y), 2e-5);
      EXPECT_GT(rel_diff(b.y, a.y), 0.0);  // Winograd ran
    } else {
      EXPECT_EQ(b.y, a.y);
    }
    EXPECT_EQ(b.dx, a.dx);
    EXPECT_EQ(b.dw, a.dw);
    EXPECT_EQ(b.db, a.db);
  }
  const std::string winograd = cpu_winograd_support().empty() ? "Winograd" : "Winograd on GEMMs";
  EXPECT_EQ(shape->kernel_choices(), "forward: 2 direct 1 " + winograd +
                                         "; backward data: 3 direct; backward weights: 3 direct");
  // As dppredict runs it: an inference model's forward-only convolution (no backward kernels).
  ConvDesc inference = wide;
  inference.forward_only = true;
  const Vec a = forward_output(*direct, wide), y = forward_output(*shape, inference);
  EXPECT_LT(rel_diff(y, a), 2e-5);
  EXPECT_GT(rel_diff(y, a), 0.0);
}

// Under kShape an inference model's layer runs Winograd on GEMMs (F(4x4, 3x3)) below 64 on the
// channel measure, and oneDNN's Winograd from 64 up where oneDNN has it (AVX-512) and its copies
// (the layer's input and output in the blocked layout) fit 32 MiB. A layer too large for those
// copies (a whole photograph as one tile) runs on GEMMs, whose copies are chunks of tiles: the
// scratch stays small whatever the image, and the result is direct's within rounding. A
// plain-GEMM choice still needs the bordered image.
TEST(ShapeRule, LargeLayersKeepWinogradWithoutWholeImageCopies) {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  ConvDesc small = conv(1, 96, 128, 64, 32, true, true),
           wide_small = conv(1, 24, 32, 256, 128, true, true),  // 85.3, 0.45 GFLOP
      large = conv(1, 320, 352, 64, 32, true, true);
  small.forward_only = wide_small.forward_only = large.forward_only = true;
  const size_t large_bytes = size_t(large.h) * large.w * (large.cin + large.cout) * sizeof(float);
  ASSERT_GT(large_bytes, size_t{40} << 20);  // more than the 32 MiB bound on oneDNN's copies
  const auto shape = [&](const ConvDesc& d) {
    return cpu::make_conv(eng, d, false, CpuConvAlgo::kShape);
  };
  const bool onednn_winograd = cpu_winograd_support().empty();
  EXPECT_EQ(shape(small)->algo[0], cpu::PassAlgo::kGemmWinograd);
  EXPECT_EQ(shape(wide_small)->algo[0],
            onednn_winograd ? cpu::PassAlgo::kBlocked : cpu::PassAlgo::kGemmWinograd);
  const auto big = shape(large);
  EXPECT_EQ(big->algo[0], cpu::PassAlgo::kGemmWinograd);
  EXPECT_LT(big->copies_bytes(), size_t{2} << 20) << "of " << large_bytes << " image bytes";
  EXPECT_GT(cpu::make_conv(eng, large, false, CpuConvAlgo::kGemm)->copies_bytes(),
            large_bytes / 2);  // the bordered input and the wide output
  const Vec want = forward_output(*backend(CpuConvAlgo::kDirect), large),
            got = forward_output(*backend(CpuConvAlgo::kShape), large);
  std::printf("[shape] %d->%d %dx%d as Winograd on GEMMs: y %.2e\n", large.cin, large.cout, large.h,
              large.w, rel_diff(got, want));
  EXPECT_LT(rel_diff(got, want), 2e-5);
  EXPECT_GT(rel_diff(got, want), 0.0);  // Winograd ran
}

// Under kShape an inference model's 3x3 layer with 4 output channels runs as packed pixels
// (PackedConv: P adjacent pixels of a row as P x 4 channels, P = 4 on AVX-512 and 2 on AVX2),
// within 1e-5 of direct with and without bias and ReLU. A width that P does not divide, 16 output
// channels, and a training model's layer (it needs the direct forward for its backward) stay
// direct, bitwise.
TEST(ShapeRule, NarrowInferenceLayersRunAsPackedPixels) {
  auto direct = backend(CpuConvAlgo::kDirect);
  auto shape = backend(CpuConvAlgo::kShape);
  const auto inference = [](ConvDesc d) {
    d.forward_only = true;
    return d;
  };
  struct Case {
    ConvDesc d;
    bool packed;
  };
  const Case cases[] = {
      {inference(conv(2, 24, 32, 16, 4, true, true)), true},
      {inference(conv(2, 20, 36, 12, 4, false, false)), true},  // no bias, no ReLU
      {inference(conv(2, 24, 29, 16, 4, true, true)), false},   // odd width
      {inference(conv(2, 24, 32, 16, 16, true, true)), false},  // fills the vectors already
      {conv(2, 24, 32, 16, 4, true, true), false},              // a training model's
  };
  for (const Case& c : cases) {
    const ConvDesc& d = c.d;
    SCOPED_TRACE(std::to_string(d.cin) + "->" + std::to_string(d.cout) + " " + std::to_string(d.h) +
                 "x" + std::to_string(d.w) + (d.forward_only ? " inference" : " training"));
    const Vec want = forward_output(*direct, d), got = forward_output(*shape, d);
    std::printf("[packed] %d->%d %dx%d: y %.2e\n", d.cin, d.cout, d.h, d.w, rel_diff(got, want));
    if (c.packed)
      EXPECT_LT(rel_diff(got, want), 1e-5);
    else
      EXPECT_EQ(got, want);
  }
  const std::string k = shape->kernel_choices();
  EXPECT_EQ(k.substr(0, k.find(';')), "forward: 3 direct 2 packed pixels") << k;
}

// Five SGD steps of UNet16/2 (32 to 256 channels) on one batch with every 3x3 convolution it
// can run that way on the alternative: the loss curve and the weights follow the direct kernels'.
void expect_trains_like_direct(CpuConvAlgo algo) {
  ModelConfig mc;
  mc.width_divisor = 2;
  Vec losses[2], weights[2];
  const char* kind = algo == CpuConvAlgo::kWinograd       ? "Winograd"
                     : algo == CpuConvAlgo::kGemm         ? "GEMM"
                     : algo == CpuConvAlgo::kGemmWinograd ? "GEMM"  // Winograd on GEMMs; GEMM
                                                          : "blocked";
  for (int b = 0; b < 2; ++b) {
    auto be = backend(b == 0 ? CpuConvAlgo::kDirect : algo);
    const test::FitResult fit = test::fit_one_batch(*be, mc, 5, 0.1f);
    if (b == 1) {  // the alternative ran: every pass of some convolutions
      const std::string k = be->kernel_choices();
      std::printf("[%s] kernels: %s\n", kind, k.c_str());
      EXPECT_NE(k.find(std::string("forward: ")), std::string::npos) << k;
      EXPECT_EQ(std::count(k.begin(), k.end(), ';'), 2) << k;
      for (const char* pass : {"forward:", "backward data:", "backward weights:"}) {
        const std::string part = k.substr(k.find(pass));
        EXPECT_NE(part.substr(0, part.find(';')).find(kind), std::string::npos) << pass << " " << k;
      }
    }
    losses[b].assign(fit.losses.begin(), fit.losses.end());
    weights[b] = fit.weights;
  }
  std::printf("[%s] loss %.6f -> %.6f (direct %.6f -> %.6f), weights %.2e apart\n", kind,
              losses[1].front(), losses[1].back(), losses[0].front(), losses[0].back(),
              rel_diff(weights[1], weights[0]));
  EXPECT_LT(losses[0].back(), losses[0].front());  // it learns
  EXPECT_LT(rel_diff(losses[1], losses[0]), 1e-4);
  EXPECT_LT(rel_diff(weights[1], weights[0]), 1e-4);
  if (algo == CpuConvAlgo::kWinograd) {
    EXPECT_GT(rel_diff(weights[1], weights[0]), 0.0);  // its transforms round differently
  }
}

TEST(Winograd, TrainsLikeDirect) {
  SKIP_WITHOUT_WINOGRAD();
  expect_trains_like_direct(CpuConvAlgo::kWinograd);
}

TEST(BlockedConv, TrainsLikeDirect) {
  expect_trains_like_direct(CpuConvAlgo::kBlocked);
}

TEST(GemmConv, TrainsLikeDirect) {
  expect_trains_like_direct(CpuConvAlgo::kGemm);
}

TEST(GemmWinograd, TrainsLikeDirect) {
  expect_trains_like_direct(CpuConvAlgo::kGemmWinograd);
}

}  // namespace
}  // namespace dp
