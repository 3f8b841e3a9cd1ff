// The CUDA backend's convolutions (internal): counted device memory, the workspace arena, and
// cuDNN plans per shape whose forward / backward-data / backward-filter algorithms are chosen once.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "dp/backend.hpp"
#include "dp/cuda/cuda_backend.hpp"

namespace dp::cuda {

// The backend's device allocations (cudaMalloc on the current device, never managed memory),
// counted: bytes held now and the most ever held at once. Not zero-filled here.
class DeviceHeap {
 public:
  explicit DeviceHeap(cudaStream_t stream);
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  // Throws dp::Error naming `what`, the size in MiB, what this backend already holds and the
  // device when cudaMalloc fails. nullptr for 0 bytes.
  void* allocate(size_t bytes, const char* what);
  // nullptr when the device is out of memory (the error is cleared); other errors throw.
  void* try_allocate(size_t bytes);
  // Waits for the stream first: queued work may still use the memory. Never throws.
  void free(void* p, size_t bytes) noexcept;

  size_t allocated() const;
  size_t peak() const;
  cudaStream_t stream() const { return stream_; }
  const std::string& device() const { return device_; }  // "device 0 (NVIDIA H200, 0000:41:00.0)"

 private:
  void* malloc_counted(size_t bytes, cudaError_t* status);

  cudaStream_t stream_;
  std::string device_;
  mutable std::mutex mutex_;
  size_t allocated_ = 0, peak_ = 0;
};

// One device allocation from a DeviceHeap that only grows. Work on one stream runs in order, so
// every op may reuse the whole region; growing waits for the queued work (old contents are lost).
class Arena {
 public:
  Arena(DeviceHeap& heap, const char* what) : heap_(heap), what_(what) {}
  ~Arena() { heap_.free(data_, bytes_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Grows to at least `bytes`; throws dp::Error (the heap's message) when the device is full.
  void reserve(size_t bytes);
  // Like reserve, but false (keeping the old size) when the device cannot hold `bytes`.
  bool try_reserve(size_t bytes);

 private:
  DeviceHeap& heap_;
  const char* what_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Convolutions and transposed convolutions on cuDNN's legacy convolution API, NHWC activations,
// weights in PyTorch's layout. Every call is enqueued on the heap's stream (the handle must be
// bound to it). A transposed convolution is the backward-data pass of the convolution from its
// output to its input (same weight), its backward-data pass that convolution's forward.
//
// Algorithms: chosen per shape and pass (forward, backward data, backward filter) on the pass's
// first use, with the call's own buffers (the search blocks until it has run): the fastest that
// cudnnFind*AlgorithmEx measures, with a scratch workspace as large as the heuristics' candidates
// need (freed after); with options.deterministic, deterministic algorithms only, taken in the
// heuristics' (reproducible) order among those the search ran. TF32 only with options.tf32.
//
// Filters: cuDNN is first asked for algorithms on the weights as they are (an NCHW filter, i.e.
// [k, c, r, s], next to NHWC activations); a pass for which it offers none uses an NHWC (KRSC)
// copy instead, made by cudnnTransformTensor before each call (and the filter gradient
// transformed back). DP_CUDNN_KRSC_FILTERS=1 in the environment forces the copy everywhere, so
// that both paths can be tested.
//
// Bias and ReLU: fused by cudnnConvolutionBiasActivationForward in a convolution's forward pass
// where cuDNN accepts it (falling back for good on a refusal), else kernels::bias_relu.
class ConvEngine {
 public:
  // `workspace` is the backend's one convolution workspace arena: it grows to the largest chosen
  // algorithm's need (at most options.max_workspace_bytes).
  ConvEngine(cudnnHandle_t handle, DeviceHeap& heap, Arena& workspace,
             const BackendOptions& options);
  ~ConvEngine();
  ConvEngine(const ConvEngine&) = delete;
  ConvEngine& operator=(const ConvEngine&) = delete;

  // The dp::Backend operations of the same names (semantics there).
  void conv_forward(const ConvDesc& d, const float* src, const float* weight, const float* bias,
                    float* dst);
  void conv_backward(const ConvDesc& d, const float* src, const float* weight, const float* dst,
                     float* diff_dst, float* diff_src, float* diff_weight, float* diff_bias);
  void deconv_forward(const DeconvDesc& d, const float* src, const float* weight, const float* bias,
                      float* dst);
  void deconv_backward(const DeconvDesc& d, const float* src, const float* weight, const float* dst,
                       float* diff_dst, float* diff_src, float* diff_weight, float* diff_bias);

  struct Plan;  // cudnn_conv.cpp

 private:
  // n, h, w, cin, cout, kernel, stride, pad (a plan does not depend on bias or ReLU).
  using PlanKey = std::tuple<int, int, int, int, int, int, int, int>;

  Plan& conv_plan(const ConvDesc& d);
  Plan& deconv_plan(const DeconvDesc& d);
  // y = x * w (cross-correlation), then + bias and ReLU when given.
  void forward(Plan& p, const float* x, const float* w, float* y, const float* bias, bool relu);
  void backward_data(Plan& p, const float* w, const float* dy, float* dx);
  void backward_filter(Plan& p, const float* x, const float* dy, float* dw);
  // The filter as the pass reads it: `w` itself, or its KRSC copy (made now) for a KRSC pass.
  const void* filter_for(Plan& p, int pass, const float* w);
  // Chooses the pass's algorithm on its first use (x, w, y: the call's buffers; the pass's output
  // among them is overwritten).
  void ensure(Plan& p, int pass, const void* x, const void* w, const void* y);
  bool choose(Plan& p, int pass, bool krsc, const void* x, const void* w, const void* y);

  cudnnHandle_t handle_;
  DeviceHeap& heap_;
  Arena& workspace_;
  BackendOptions options_;
  bool force_krsc_ = false;
  Arena filter_copy_;  // the KRSC filter (or filter gradient) of the current call
  std::map<PlanKey, std::unique_ptr<Plan>> conv_plans_;
  std::map<PlanKey, std::unique_ptr<Plan>> deconv_plans_;
};

}  // namespace dp::cuda
