// dp::cuda::CudaBackend: the dp::Backend on one GPU (cuDNN convolutions, own .cu kernels, NHWC).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "dp/backend.hpp"
#include "dp/log.hpp"

namespace dp::cuda {

struct BackendOptions {
  // fp32 convolutions may use TF32 tensor cores (cuDNN's default math); false forbids them
  // (CUDNN_FMA_MATH), for bitwise-stable comparisons with the CPU backend.
  bool tf32 = true;
  // Convolution arithmetic (dp::Precision): bf16 rounds the input, the output gradient and the
  // weights to bf16 at each convolution (cuDNN bf16 tensors, fp32 compute). cuDNN's results are
  // bf16 too (it has no bf16-in, fp32-out convolution), so the output, the data gradient and the
  // weight gradient are rounded to bf16 once before they are widened into the fp32 tensors (as
  // PyTorch's autocast, whose conv outputs and weight gradients are bf16); bias and ReLU are
  // applied in fp32 after, the bias gradient is fp32 throughout. Needs compute capability 8.0+
  // (make_cuda_backend throws otherwise); tf32 does not apply to the bf16 convolutions. A shape
  // for which cuDNN offers no usable bf16 algorithm for one of its passes (e.g. 3 input or 1
  // output channel) runs all its passes in fp32 instead (TF32 per tf32), logged once per shape;
  // CudaBackend::runs_in_bf16 says which.
  Precision precision = Precision::kFloat32;
  // Only deterministic cuDNN algorithms (no atomics in backward filter/data).
  bool deterministic = false;
  // The largest convolution workspace an algorithm may ask for; the arena grows to the largest
  // chosen algorithm's need (once per shape) and never shrinks.
  size_t max_workspace_bytes = size_t{1} << 30;
  // One info line per convolution pass with the algorithm chosen for it (and the fused bias/ReLU
  // call's timing), for profiling.
  bool log_algorithms = false;
  // Every convolution on a KRSC filter copy, the path otherwise taken only where cuDNN offers no
  // algorithm for the NCHW filter: for the tests of that path (tests/emu, emu.krsc_filters).
  bool krsc_filters = false;
  // Where the backend's notes go (info: a bf16 shape that runs in fp32).
  Logger log;
};

// Every op is enqueued on stream() (a non-blocking stream owned by the backend); ops that
// return host values (bce_with_logits, sum_squares, batch-norm sums, confusion counts) wait for
// it. Device memory comes from cudaMalloc through device_memory(), counted for the peak.
class CudaBackend : public Backend {
 public:
  virtual cudaStream_t stream() const = 0;
  virtual size_t allocated_bytes() const = 0;  // device bytes held now (tensors and scratch)
  virtual size_t peak_bytes() const = 0;       // the most ever held at once
  virtual size_t workspace_bytes() const = 0;  // the convolution workspace arena
  // Whether the (transposed) convolutions of this shape run on bf16 operands: false with fp32
  // precision, and with bf16 for a shape that fell back to fp32 (see BackendOptions::precision).
  // Builds the shape's plan (its algorithm search included) if it does not exist yet.
  virtual bool runs_in_bf16(const ConvDesc& d) = 0;
  virtual bool runs_in_bf16(const DeconvDesc& d) = 0;
};

// On the current device (select_device first).
std::unique_ptr<CudaBackend> make_cuda_backend(const BackendOptions& options = {});

}  // namespace dp::cuda
