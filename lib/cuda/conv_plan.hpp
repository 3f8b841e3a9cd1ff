// The cuDNN convolution plan that conv.cpp and conv_search.cpp share: descriptors, algorithms.
#pragma once

#include <cuda_bf16.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "conv.hpp"
#include "dp/cuda/device.hpp"

namespace dp::cuda {

// Owner of one cuDNN descriptor. Not copyable or movable (plans hold them in place).
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() {
    const cudnnStatus_t status = Create(&d_);
    if (status != CUDNN_STATUS_SUCCESS)
      throw_cudnn_error(status, "cudnnCreate*Descriptor", __FILE__, __LINE__);
  }
  ~CudnnDescriptor() {
    if (d_ != nullptr) (void)Destroy(d_);
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  T get() const { return d_; }

 private:
  T d_ = nullptr;
};

using TensorDescriptor = CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                                         cudnnDestroyTensorDescriptor>;
using FilterDescriptor = CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                         cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                    cudnnDestroyConvolutionDescriptor>;
using ActivationDescriptor =
    CudnnDescriptor<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                    cudnnDestroyActivationDescriptor>;

enum PassKind : int { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
inline constexpr const char* kPassName[3] = {"forward", "backward-data", "backward-filter"};

inline const float kOne = 1.0f, kZero = 0.0f;

// One pass of a plan: its filter layout, convolution descriptor (math type of the chosen
// algorithm) and algorithm.
struct PassState {
  bool ready = false;
  bool krsc = false;  // the filter is read (or its gradient written) as an NHWC (KRSC) copy
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // the chosen algorithm's, set on `conv`
  float ms = -1.0f;                           // its time in the search; negative if untimed
  FilterDescriptor filter;
  ConvolutionDescriptor conv;
};

// A cross-correlation y = x * w: x NHWC [n, hx, wx, c], y NHWC [n, hy, wy, k], w [k, c, r, r]
// (PyTorch's OIHW). A convolution is one directly; a transposed convolution is the backward-data
// pass of the convolution that maps its output (x) to its input (y).
struct ConvEngine::Plan {
  std::string what;  // for messages: "conv 3x3 64->128 stride 1 pad 1 on [8,256,256,64]"
  int n = 0, c = 0, hx = 0, wx = 0, k = 0, hy = 0, wy = 0, r = 0, stride = 1, pad = 0;
  TensorDescriptor x, y, bias;      // bias [1, k, 1, 1]
  TensorDescriptor w_nchw, w_nhwc;  // the filter as a plain tensor, for cudnnTransformTensor
  ActivationDescriptor relu, identity;
  PassState pass[3];
  bool bf16 = false;        // cuDNN runs on bf16 tensors (a bf16 engine, where cuDNN allows it)
  bool widened = false;     // bf16 activations, fp32 plan: operands widened, results narrowed
  bool fuse = true;         // cudnnConvolutionBiasActivationForward: not refused, not slower
  bool fuse_timed = false;  // the fused call was timed against the separate one
  std::string why;          // why the last algorithm search failed
  bool short_of_memory = false;  // ... because supported algorithms' workspace did not fit

  size_t filter_bytes() const { return sizeof(float) * filter_numel(); }
  size_t filter_numel() const { return size_t(k) * size_t(c) * size_t(r) * size_t(r); }
  int64_t y_pixels() const { return int64_t{n} * hy * wy; }
  int64_t x_pixels() const { return int64_t{n} * hx * wx; }

  // The x, filter and y regions of an arena (each 256-byte aligned, as cuDNN's vectorised
  // kernels want) for operands of `x_bytes`, `w_bytes` and `y_bytes` per element.
  static size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }
  struct Regions {
    size_t w_offset, y_offset, bytes;
  };
  Regions regions(size_t x_bytes, size_t w_bytes, size_t y_bytes) const {
    const size_t w_offset = aligned(x_bytes * size_t(x_pixels()) * size_t(c));
    const size_t y_offset = w_offset + aligned(w_bytes * filter_numel());
    return {w_offset, y_offset, y_offset + aligned(y_bytes * size_t(y_pixels()) * size_t(k))};
  }
  // The engine's staging arena for this plan's calls: fp32 x and y where widened, the bf16
  // filter (and filter gradient) where bf16.
  Regions stage() const {
    const size_t xy = widened ? sizeof(float) : 0, w = bf16 ? sizeof(__nv_bfloat16) : 0;
    return regions(xy, w, xy);
  }
  // The bf16 algorithm search's scratch operands: x, filter and y in bf16.
  Regions probe() const {
    constexpr size_t b = sizeof(__nv_bfloat16);
    return regions(b, b, b);
  }
};

// The data type of the tensors and filters cuDNN sees in a plan.
inline cudnnDataType_t operand_type(const ConvEngine::Plan& p) {
  return p.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

// The math type an algorithm search starts from: bf16 on tensor cores (as PyTorch sets it for
// bf16); fp32 with TF32 allowed (cuDNN's default) or FMA only.
inline cudnnMathType_t base_math_type(const ConvEngine::Plan& p, const BackendOptions& options) {
  if (p.bf16) return CUDNN_TENSOR_OP_MATH;
  return options.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Sets the descriptors of a plan whose sizes and precision are filled in, and forgets its
// algorithms. The convolution's compute type is fp32 in both precisions (bf16:
// PSEUDO_BFLOAT16_CONFIG; the bias and the fp32 filter views are used by fp32 plans only).
void init_plan(ConvEngine::Plan* p, const BackendOptions& options);

}  // namespace dp::cuda
