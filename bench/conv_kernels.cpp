// Per-layer times of the CPU backend's 3x3 convolution kernels (direct NHWC, direct on blocked
// copies or Winograd, shifted GEMMs, Winograd on GEMMs), pass by pass, on the shapes of full-width
// UNet16 at 128x128.
//
//   OMP_NUM_THREADS=1 [ONEDNN_MAX_CPU_ISA=AVX2] build/default/bench/bench_conv_kernels [batch]
//
// For each shape and kernel: forward, backward-weights (backward without a data gradient) and
// backward-data (the rest of a full backward), the minimum over 4 rounds after a warm-up round
// (rounds alternate the kernels), in ms and GFLOP/s; then the step total over the layers (each
// counted as often as UNet16 runs it) per kernel and for the fastest kernel of each pass, which is
// what --cpu-conv auto picks.
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "cpu/onednn.hpp"
#include "dp/buffer.hpp"

namespace {

using dp::ConvDesc;
using dp::CpuConvAlgo;

struct Layer {
  int cin, cout, size, count;  // count: how often one UNet16 step runs it
};
// UNet16 (VGG16 encoder, decoder with bilinear upsampling) at 128x128, 3x3 layers above 0.2 GFLOP.
const Layer kLayers[] = {
    {64, 64, 128, 1},   {64, 128, 64, 1},  {128, 128, 64, 1}, {128, 256, 32, 1}, {256, 256, 32, 2},
    {256, 512, 16, 1},  {512, 512, 16, 2}, {512, 512, 8, 4},  {512, 256, 8, 1},  {768, 512, 16, 1},
    {512, 256, 16, 1},  {768, 512, 32, 1}, {512, 256, 32, 1}, {512, 256, 64, 1}, {256, 64, 64, 1},
    {192, 128, 128, 1}, {128, 32, 128, 1}, {96, 32, 128, 1}};

double ms_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 2;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  constexpr int kRounds = 5, kKernels = 4;
  const char* kNames[4] = {"direct", "blocked", "gemm", "gemm-wino"};
  const CpuConvAlgo kAlgos[4] = {CpuConvAlgo::kDirect, CpuConvAlgo::kBlocked, CpuConvAlgo::kGemm,
                                 CpuConvAlgo::kGemmWinograd};
  double total[kKernels][3] = {}, best[3] = {};  // [kernel][pass], [pass]
  std::printf(
      "oneDNN ISA %s, batch %d; ms (GFLOP/s) for forward | backward weights | backward "
      "data\n",
      dp::cpu_isa_name().c_str(), batch);
  for (const Layer& l : kLayers) {
    ConvDesc d{batch, l.size, l.size, l.cin, l.cout, 3};
    d.relu = true;
    const double gflop = 2.0 * batch * l.size * l.size * l.cin * l.cout * 9 / 1e9;
    std::vector<float> x(size_t(d.src().numel()), 0.5f), y(size_t(d.dst().numel())),
        dy(y.size(), 0.25f), ones(y.size(), 1.0f), dx(x.size()),
        w(size_t(l.cin) * l.cout * 9, 0.01f), b(l.cout), dw(w.size()), db(b.size());
    std::printf("%4d->%-4d %3dx%-3d x%d", l.cin, l.cout, l.size, l.size, l.count);
    double ms_best[3] = {1e30, 1e30, 1e30};
    std::unique_ptr<dp::cpu::ConvPrims> prims[kKernels];
    for (int k = 0; k < kKernels; ++k) prims[k] = dp::cpu::make_conv(eng, d, false, kAlgos[k]);
    size_t copies_bytes = 0, weight_bytes = 0;
    for (const auto& p : prims) {
      copies_bytes = std::max(copies_bytes, p->copies_bytes());
      weight_bytes = std::max(weight_bytes, p->weight_scratch_bytes());
    }
    const dp::Buffer copies(copies_bytes), weights(weight_bytes);  // 64-byte aligned
    const dp::cpu::Scratch scratch{weights.data(), copies.data()};
    // Rounds alternate the kernels, so that a slow phase of a shared machine hits them all.
    double ms[kKernels]
             [3];  // [kernel][forward, backward weights, full backward]: minimum over rounds
    for (auto& m : ms) std::fill(m, m + 3, 1e30);
    for (int round = 0; round < kRounds; ++round)
      for (int k = 0; k < kKernels; ++k) {
        dp::cpu::ConvPrims& p = *prims[k];
        const double t[3] = {
            ms_of([&] { p.forward(stream, x.data(), w.data(), b.data(), y.data(), scratch); }),
            ms_of([&] {
              p.backward(stream, x.data(), w.data(), ones.data(), dy.data(), nullptr, dw.data(),
                         db.data(), scratch);
            }),
            ms_of([&] {
              p.backward(stream, x.data(), w.data(), ones.data(), dy.data(), dx.data(), dw.data(),
                         db.data(), scratch);
            })};
        if (round > 0)  // the first is a warm-up
          for (int i = 0; i < 3; ++i) ms[k][i] = std::min(ms[k][i], t[i]);
      }
    for (int k = 0; k < kKernels; ++k) {
      const double pass_ms[3] = {ms[k][0], ms[k][1], std::max(ms[k][2] - ms[k][1], 1e-3)};
      std::printf(" | %s", kNames[k]);
      for (int pass = 0; pass < 3; ++pass) {
        std::printf(" %6.1f (%3.0f)", pass_ms[pass], gflop / pass_ms[pass] * 1e3);
        total[k][pass] += pass_ms[pass] * l.count;
        ms_best[pass] = std::min(ms_best[pass], pass_ms[pass]);
      }
    }
    for (int pass = 0; pass < 3; ++pass) best[pass] += ms_best[pass] * l.count;
    std::printf("\n");
  }
  std::printf("step total, ms (forward, backward weights, backward data):\n");
  for (int k = 0; k < kKernels; ++k)
    std::printf("  %-8s %8.0f %8.0f %8.0f = %8.0f\n", kNames[k], total[k][0], total[k][1],
                total[k][2], total[k][0] + total[k][1] + total[k][2]);
  std::printf("  %-8s %8.0f %8.0f %8.0f = %8.0f\n", "fastest", best[0], best[1], best[2],
              best[0] + best[1] + best[2]);
}
