// dp::make_cpu_backend: the Backend on the host (oneDNN), its options and the CPU queries.
#pragma once

#include <memory>
#include <string>

#include "dp/backend.hpp"

namespace dp {

// How the CPU backend runs fp32 3x3 stride-1 convolutions, pass by pass (forward, backward data,
// backward weights). kDirect (the library's default): oneDNN's direct kernels only, bitwise
// reproducible. kAuto (dptrain's default, --cpu-conv): the direct kernel on NHWC, or an
// alternative on blocked copies of the activations where that measured faster on this machine:
// oneDNN's Winograd kernel (F(4x4, 3x3); AVX-512 only) or, where it has none, its direct kernels on
// its blocked layout (nChw8c on AVX2). Both are timed on the layer's own tensors at the pass's
// first use, for passes of at least 0.2 GFLOP whose scratchpad fits 96 MiB and whose blocked
// copies fit 32 MiB (the choice may differ between runs and ranks; results differ in the last
// bits). The backend's own kernels on oneDNN's
// sgemm are timed with them (lib/cpu/conv_gemm.hpp): nine GEMMs per pass, one per kernel tap, on
// zero-bordered copies of each image (up to 2x faster than oneDNN 2.6's backward-weights kernels
// on AVX2), and Winograd on GEMMs (F(4x4, 3x3) where a batch has 64 of its tiles, else F(2x2)).
// kWinograd: oneDNN's Winograd wherever it has it, whatever its memory; kBlocked: the direct
// kernels on blocked copies; kGemm: the shifted GEMMs; kGemmWinograd: Winograd on GEMMs; each for
// every 3x3 stride-1 pass (tests, benchmarks). kShape (dppredict's default): no timing; the forward
// pass of a 3x3 stride-1 convolution whose channels pay for Winograd's transforms and copies
// (cin*cout/(cin+cout) >= 20, e.g. 64 -> 32) and that has at least 0.2 GFLOP runs oneDNN's Winograd
// where it has it within the scratchpad cap, else Winograd on GEMMs; all other passes direct. The
// same kernels on every run of a model on one CPU.
enum class CpuConvAlgo { kDirect, kAuto, kWinograd, kBlocked, kGemm, kGemmWinograd, kShape };

struct CpuOptions {
  Precision precision = Precision::kFloat32;
  // bf16: kAuto and kGemmWinograd add Winograd on bf16 GEMMs; the others are direct.
  CpuConvAlgo conv_algo = CpuConvAlgo::kDirect;
};

// The oneDNN backend (lib/cpu/). Threads follow OMP_NUM_THREADS. bf16 needs AVX512-BF16 or AMX.
std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& options);
inline std::unique_ptr<Backend> make_cpu_backend(Precision precision = Precision::kFloat32) {
  return make_cpu_backend(CpuOptions{precision});
}
// The instruction set oneDNN runs on this CPU ("avx2", "avx512_core", ...), after any
// ONEDNN_MAX_CPU_ISA cap: for logs and errors.
std::string cpu_isa_name();
// The oneDNN library this process runs ("oneDNN 2.6.3"): 2.x and 3.x builds differ in kernels.
std::string cpu_onednn_version();
// Empty when oneDNN has Winograd convolutions on this CPU, else why not (errors, test skips).
std::string cpu_winograd_support();
// What fp32 3x3 convolutions run on under `algo` on this CPU, for the start-up line ("3x3: ...";
// empty for kDirect): only the candidates that exist here.
std::string cpu_conv_kernels(CpuConvAlgo algo);
// Empty when this CPU runs bf16 convolutions natively, else why not (for errors and test skips).
std::string cpu_bf16_support();
// oneDNN 2.x's AMX bf16 backward-weights convolution (jit:avx512_core_amx_bf16; 2.6.3 measured)
// writes one kernel row of fp32 weight gradients (3072 bytes) before its output at some activation
// sizes (192x256, 192x240, 384x512, 384x544; not 160x288, 176x256 or 256x256), whatever the batch
// or thread count, corrupting the heap (tools/onednn_bf16_weights_probe.cpp shows it with oneDNN
// alone). oneDNN 3.2 does not. True where this process's oneDNN is 2.x and runs AMX: the CPU
// backend then builds those convolution passes on the next implementation (avx512_core_bf16).
bool cpu_amx_bf16_weights_bug();
// The start-up line saying so where cpu_amx_bf16_weights_bug(), else empty.
std::string cpu_bf16_note();

}  // namespace dp
