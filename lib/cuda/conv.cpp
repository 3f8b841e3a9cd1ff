// The CUDA backend's cuDNN convolutions: plans, operands and passes (algorithms: conv_search.cpp).
#include "conv.hpp"

#include <algorithm>
#include <vector>

#include "conv_plan.hpp"
#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "dp/log.hpp"
#include "kernels.cuh"

namespace dp::cuda {

// ---------------------------------------------------------------------------------------------
// Plans

namespace {

// A refusal made on the host (bad parameter, unsupported configuration, a runtime-compiled kernel
// that is unavailable), as opposed to a kernel that failed on the device.
bool refused(cudnnStatus_t status) {
  return static_cast<int>(status) / 1000 * 1000 != CUDNN_STATUS_EXECUTION_FAILED;
}

std::string shape(int n, int h, int w, int c) {
  return str_cat("[", n, ",", h, ",", w, ",", c, "]");
}

// Runs `body`; a dp::Error from it gets the plan's description appended.
template <typename F>
void in_context(const ConvEngine::Plan& p, F&& body) {
  try {
    body();
  } catch (const Error& e) {
    fail(e.what(), " [in ", p.what, "]");
  }
}

}  // namespace

void init_plan(ConvEngine::Plan* p, const BackendOptions& options) {
  const cudnnMathType_t math = base_math_type(*p, options);
  const cudnnDataType_t type = operand_type(*p);
  DP_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(p->x.get(), CUDNN_TENSOR_NHWC, type, p->n, p->c, p->hx, p->wx));
  DP_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(p->y.get(), CUDNN_TENSOR_NHWC, type, p->n, p->k, p->hy, p->wy));
  DP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->bias.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                            p->k, 1, 1));
  DP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->w_nchw.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                            p->k, p->c, p->r, p->r));
  DP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->w_nhwc.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            p->k, p->c, p->r, p->r));
  DP_CUDNN_CHECK(cudnnSetActivationDescriptor(p->relu.get(), CUDNN_ACTIVATION_RELU,
                                              CUDNN_NOT_PROPAGATE_NAN, 0.0));
  DP_CUDNN_CHECK(cudnnSetActivationDescriptor(p->identity.get(), CUDNN_ACTIVATION_IDENTITY,
                                              CUDNN_NOT_PROPAGATE_NAN, 0.0));
  for (PassState& ps : p->pass) {
    ps.ready = false;
    ps.krsc = false;
    ps.algo = 0;
    DP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(ps.filter.get(), type, CUDNN_TENSOR_NCHW, p->k, p->c,
                                              p->r, p->r));
    DP_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(ps.conv.get(), p->pad, p->pad, p->stride,
                                                   p->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));
    DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), math));
  }
  // cuDNN must agree with dp's output size (a mismatch would read or write out of bounds).
  int n = 0, k = 0, h = 0, w = 0;
  DP_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->pass[0].conv.get(), p->x.get(),
                                                       p->pass[0].filter.get(), &n, &k, &h, &w));
  DP_CHECK(n == p->n && k == p->k && h == p->hy && w == p->wy, "cuDNN computes the output of ",
           p->what, " as ", shape(n, h, w, k), ", expected ", shape(p->n, p->hy, p->wy, p->k));
}

ConvEngine::ConvEngine(cudnnHandle_t handle, DeviceHeap& heap, Arena& workspace,
                       const BackendOptions& options)
    : handle_(handle),
      heap_(heap),
      workspace_(workspace),
      options_(options),
      bf16_(options.precision == Precision::kBFloat16),
      filter_copy_(heap, "the KRSC filter copy"),
      stage_(heap, "the convolution operand staging") {}

ConvEngine::~ConvEngine() = default;

ConvEngine::Plan& ConvEngine::conv_plan(const ConvDesc& d) {
  const PlanKey key{d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.stride, d.padding()};
  std::unique_ptr<Plan>& slot = conv_plans_[key];
  if (slot) return *slot;
  DP_CHECK(d.n >= 1 && d.cin >= 1 && d.cout >= 1 && d.kernel >= 1 && d.stride >= 1 &&
               d.out_h() >= 1 && d.out_w() >= 1,
           "conv: kernel ", d.kernel, " stride ", d.stride, " pad ", d.padding(), " from ", d.cin,
           " to ", d.cout, " channels does not fit a ", shape(d.n, d.h, d.w, d.cin), " input");
  auto p = std::make_unique<Plan>();
  p->what = str_cat("conv ", d.kernel, "x", d.kernel, " ", d.cin, "->", d.cout, " stride ",
                    d.stride, " pad ", d.padding(), " on ", shape(d.n, d.h, d.w, d.cin));
  p->n = d.n;
  p->c = d.cin;
  p->hx = d.h;
  p->wx = d.w;
  p->k = d.cout;
  p->hy = d.out_h();
  p->wy = d.out_w();
  p->r = d.kernel;
  p->stride = d.stride;
  p->pad = d.padding();
  in_context(*p, [&] { build(*p, true); });
  slot = std::move(p);
  return *slot;
}

ConvEngine::Plan& ConvEngine::deconv_plan(const DeconvDesc& d) {
  const PlanKey key{d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.stride, d.pad};
  std::unique_ptr<Plan>& slot = deconv_plans_[key];
  if (slot) return *slot;
  DP_CHECK(d.n >= 1 && d.cin >= 1 && d.cout >= 1 && d.kernel >= 1 && d.stride >= 1 && d.pad >= 0 &&
               d.out_h() >= 1 && d.out_w() >= 1,
           "transposed conv: kernel ", d.kernel, " stride ", d.stride, " pad ", d.pad, " from ",
           d.cin, " to ", d.cout, " channels does not fit a ", shape(d.n, d.h, d.w, d.cin),
           " input");
  // The convolution whose backward-data pass this is: from the deconv's output (c = cout
  // channels) to its input (k = cin channels); PyTorch's [cin, cout, kh, kw] weight is its
  // [k, c, r, s] filter as it stands.
  auto p = std::make_unique<Plan>();
  p->what = str_cat("transposed conv ", d.kernel, "x", d.kernel, " ", d.cin, "->", d.cout,
                    " stride ", d.stride, " pad ", d.pad, " on ", shape(d.n, d.h, d.w, d.cin));
  p->n = d.n;
  p->c = d.cout;
  p->hx = d.out_h();
  p->wx = d.out_w();
  p->k = d.cin;
  p->hy = d.h;
  p->wy = d.w;
  p->r = d.kernel;
  p->stride = d.stride;
  p->pad = d.pad;
  in_context(*p, [&] { build(*p, false); });
  slot = std::move(p);
  return *slot;
}

void ConvEngine::build(Plan& p, bool data_pass_on_use) {
  p.bf16 = bf16_;
  p.widened = false;
  init_plan(&p, options_);
  // bf16: the algorithms now. The first pass cuDNN cannot do in bf16 makes the plan fp32, whose
  // algorithms are then chosen on first use as in an fp32 engine.
  if (!p.bf16) return;
  if (data_pass_on_use)
    keep_bf16(p, {kForward, kBackwardFilter});
  else
    keep_bf16(p, {kForward, kBackwardData, kBackwardFilter});
}

// ---------------------------------------------------------------------------------------------
// Operands

void ConvEngine::reserve_stage(const Plan& p) {
  stage_.reserve(p.stage().bytes);
}

char* ConvEngine::stage_region(const Plan& p, Side side) const {
  const Plan::Regions r = p.stage();
  DP_CHECK(stage_.bytes() >= r.bytes, "internal: the staged operands of ", p.what, " need ",
           r.bytes, " bytes, the arena has ", stage_.bytes());
  return static_cast<char*>(stage_.data()) + (side == Side::kX ? 0 : r.y_offset);
}

__nv_bfloat16* ConvEngine::filter_region(const Plan& p) const {
  const Plan::Regions r = p.stage();
  DP_CHECK(p.bf16 && stage_.bytes() >= r.bytes, "internal: no bf16 filter region for ", p.what);
  return reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(stage_.data()) + r.w_offset);
}

int64_t ConvEngine::pixels(const Plan& p, Side side) {
  return side == Side::kX ? p.x_pixels() : p.y_pixels();
}
int ConvEngine::channels(const Plan& p, Side side) {
  return side == Side::kX ? p.c : p.k;
}

const void* ConvEngine::operand(Plan& p, Side side, const void* t) {
  if (!p.widened) return t;
  auto* copy = reinterpret_cast<float*>(stage_region(p, side));
  kernels::convert(heap_.stream(), pixels(p, side), channels(p, side),
                   static_cast<const __nv_bfloat16*>(t), nullptr, false, copy);
  return copy;
}

const void* ConvEngine::output_grad(Plan& p, Side side, bool copy, const void* dst, void* diff_dst,
                                    float* diff_bias) {
  const cudaStream_t s = heap_.stream();
  if (!bf16_) {
    kernels::output_grad(s, pixels(p, side), channels(p, side), static_cast<const float*>(dst),
                         static_cast<float*>(diff_dst), diff_bias, nullptr);
    return diff_dst;
  }
  float* widened = copy && p.widened ? reinterpret_cast<float*>(stage_region(p, side)) : nullptr;
  kernels::output_grad(s, pixels(p, side), channels(p, side),
                       static_cast<const __nv_bfloat16*>(dst),
                       static_cast<__nv_bfloat16*>(diff_dst), diff_bias, widened);
  return widened != nullptr ? static_cast<const void*>(widened) : diff_dst;
}

void* ConvEngine::result(Plan& p, Side side, void* t) {
  return p.widened ? stage_region(p, side) : t;
}

void ConvEngine::epilogue(const Plan& p, Side side, const void* r, void* out, const float* bias,
                          bool relu) {
  const cudaStream_t s = heap_.stream();
  const int64_t n = pixels(p, side);
  const int c = channels(p, side);
  if (p.widened) {
    kernels::convert(s, n, c, static_cast<const float*>(r), bias, relu,
                     static_cast<__nv_bfloat16*>(out));
  } else if (bias != nullptr || relu) {  // in place, in the activations' type
    if (bf16_)
      kernels::convert(s, n, c, static_cast<const __nv_bfloat16*>(out), bias, relu,
                       static_cast<__nv_bfloat16*>(out));
    else
      kernels::convert(s, n, c, static_cast<const float*>(out), bias, relu,
                       static_cast<float*>(out));
  }
}

const void* ConvEngine::filter_for(Plan& p, int pass, const float* w) {
  const bool krsc = p.pass[pass].krsc;
  if (p.bf16) {
    __nv_bfloat16* copy = filter_region(p);
    kernels::filter_to_bf16(heap_.stream(), p.k, p.c, p.r * p.r, w, krsc, copy);
    return copy;
  }
  if (!krsc) return w;
  filter_copy_.reserve(p.filter_bytes());
  DP_CUDNN_CHECK(cudnnTransformTensor(handle_, &kOne, p.w_nchw.get(), w, &kZero, p.w_nhwc.get(),
                                      filter_copy_.data()));
  return filter_copy_.data();
}

// ---------------------------------------------------------------------------------------------
// Passes

bool ConvEngine::forward(Plan& p, const void* x, const float* w, void* y, const float* bias,
                         bool relu) {
  if (!p.pass[kForward].ready) ensure(p, kForward, x, w, y);
  const PassState& ps = p.pass[kForward];
  const void* filter = filter_for(p, kForward, w);
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(ps.algo);
  // cuDNN's fused call, where it allows it: fp32 plans only (bf16 ones add the bias to their bf16
  // result), with the identity activation only for IMPLICIT_PRECOMP_GEMM. A refusal falls back to
  // the plain convolution for good, and so does a fused call timed slower than the plain one.
  if (!p.bf16 && bias != nullptr && p.fuse &&
      (relu || algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)) {
    if (!p.fuse_timed && !options_.deterministic) {
      p.fuse_timed = true;
      p.fuse = fused_is_faster(p, x, filter, y, bias, relu);
    }
    if (p.fuse) {
      const cudnnStatus_t status = fused_forward(p, x, filter, y, bias, relu);
      if (status == CUDNN_STATUS_SUCCESS) return true;
      if (!refused(status))
        throw_cudnn_error(status, "cudnnConvolutionBiasActivationForward", __FILE__, __LINE__);
      p.fuse = false;
    }
  }
  plain_forward(p, x, filter, y);
  return false;
}

void ConvEngine::plain_forward(const Plan& p, const void* x, const void* filter, void* y) {
  const PassState& ps = p.pass[kForward];
  DP_CUDNN_CHECK(
      cudnnConvolutionForward(handle_, &kOne, p.x.get(), x, ps.filter.get(), filter, ps.conv.get(),
                              static_cast<cudnnConvolutionFwdAlgo_t>(ps.algo), workspace_.data(),
                              workspace_.bytes(), &kZero, p.y.get(), y));
}

cudnnStatus_t ConvEngine::fused_forward(const Plan& p, const void* x, const void* filter, void* y,
                                        const float* bias, bool relu) {
  const PassState& ps = p.pass[kForward];
  return cudnnConvolutionBiasActivationForward(
      handle_, &kOne, p.x.get(), x, ps.filter.get(), filter, ps.conv.get(),
      static_cast<cudnnConvolutionFwdAlgo_t>(ps.algo), workspace_.data(), workspace_.bytes(),
      &kZero, p.y.get(), y, p.bias.get(), bias, relu ? p.relu.get() : p.identity.get(), p.y.get(),
      y);
}

// The search timed the plain convolution, and the fused call may run another, much slower
// kernel with the same algorithm: on an H200 (cuDNN 9.19) the fused call of UNet16's dec1 (96->32
// 3x3 + bias + ReLU at 448x448, batch 16) ran implicit_convolve_sgemm for 17.5 ms. So on a
// plan's first fp32 forward with a bias both are timed (one warm-up, then 3 runs each, on the
// call's buffers): the fused call, and the plain convolution followed by the bias/ReLU kernel.
// A refused fused call counts as slower.
bool ConvEngine::fused_is_faster(const Plan& p, const void* x, const void* filter, void* y,
                                 const float* bias, bool relu) {
  const cudaStream_t s = heap_.stream();
  auto fused = [&] { return fused_forward(p, x, filter, y, bias, relu); };
  auto plain = [&] {
    plain_forward(p, x, filter, y);
    auto* out = static_cast<float*>(y);
    kernels::convert(s, p.y_pixels(), p.k, out, bias, relu, out);
  };
  const cudnnStatus_t status = fused();
  if (status != CUDNN_STATUS_SUCCESS) {
    if (!refused(status))
      throw_cudnn_error(status, "cudnnConvolutionBiasActivationForward", __FILE__, __LINE__);
    return false;
  }
  plain();
  constexpr int kRuns = 3;
  const Event start(true), middle(true), end(true);
  start.record(s);
  for (int i = 0; i < kRuns; ++i) DP_CUDNN_CHECK(fused());
  middle.record(s);
  for (int i = 0; i < kRuns; ++i) plain();
  end.record(s);
  end.synchronize();
  const float fused_ms = Event::elapsed_ms(start, middle) / kRuns;
  const float plain_ms = Event::elapsed_ms(middle, end) / kRuns;
  if (fused_ms <= plain_ms) {
    if (options_.log_algorithms)
      options_.log.info("cuDNN: ", p.what, ": the fused bias", relu ? " + ReLU" : "",
                        " call takes ", fused_ms, " ms, the convolution then the bias",
                        relu ? "/ReLU" : "", " kernel ", plain_ms, " ms: using the former");
    return true;
  }
  options_.log.info("cuDNN: ", p.what, ": the fused bias", relu ? " + ReLU" : "", " call takes ",
                    fused_ms, " ms, the convolution then the bias", relu ? "/ReLU" : "", " kernel ",
                    plain_ms, " ms: using the latter");
  return false;
}

void ConvEngine::backward_data(Plan& p, const float* w, const void* dy, void* dx) {
  if (!p.pass[kBackwardData].ready) ensure(p, kBackwardData, dx, w, dy);
  const PassState& ps = p.pass[kBackwardData];
  const void* filter = filter_for(p, kBackwardData, w);
  DP_CUDNN_CHECK(cudnnConvolutionBackwardData(
      handle_, &kOne, ps.filter.get(), filter, p.y.get(), dy, ps.conv.get(),
      static_cast<cudnnConvolutionBwdDataAlgo_t>(ps.algo), workspace_.data(), workspace_.bytes(),
      &kZero, p.x.get(), dx));
}

void ConvEngine::backward_filter(Plan& p, const void* x, const void* dy, float* dw) {
  // bf16: cuDNN writes a bf16 filter gradient (PSEUDO_BFLOAT16_CONFIG has no fp32 dw), widened
  // into dw after.
  void* lowp_dw = p.bf16 ? filter_region(p) : nullptr;
  ensure(p, kBackwardFilter, x, p.bf16 ? lowp_dw : dw, dy);
  const PassState& ps = p.pass[kBackwardFilter];
  void* out = dw;
  if (p.bf16) {
    out = lowp_dw;
  } else if (ps.krsc) {
    filter_copy_.reserve(p.filter_bytes());
    out = filter_copy_.data();
  }
  DP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      handle_, &kOne, p.x.get(), x, p.y.get(), dy, ps.conv.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(ps.algo), workspace_.data(), workspace_.bytes(),
      &kZero, ps.filter.get(), out));
  if (p.bf16)
    kernels::filter_from_bf16(heap_.stream(), p.k, p.c, p.r * p.r,
                              static_cast<const __nv_bfloat16*>(out), ps.krsc, dw);
  else if (ps.krsc)
    DP_CUDNN_CHECK(
        cudnnTransformTensor(handle_, &kOne, p.w_nhwc.get(), out, &kZero, p.w_nchw.get(), dw));
}

bool ConvEngine::runs_in_bf16(const ConvDesc& d) {
  Plan& p = conv_plan(d);
  if (p.bf16 && !p.pass[kBackwardData].ready) in_context(p, [&] { keep_bf16(p, {kBackwardData}); });
  return p.bf16;
}

bool ConvEngine::runs_in_bf16(const DeconvDesc& d) {
  return deconv_plan(d).bf16;
}

// ---------------------------------------------------------------------------------------------
// The Backend operations. Each reserves the staging regions first: growing the arena loses its
// contents.

void ConvEngine::conv_forward(const ConvDesc& d, const void* src, const float* weight,
                              const float* bias, void* dst) {
  DP_CHECK(!d.bias || bias != nullptr,
           "conv_forward: the convolution has a bias but none is given");
  Plan& p = conv_plan(d);
  in_context(p, [&] {
    reserve_stage(p);
    const float* b = d.bias ? bias : nullptr;
    const void* x = operand(p, Side::kX, src);
    void* y = result(p, Side::kY, dst);
    const bool fused = forward(p, x, weight, y, b, d.relu);
    epilogue(p, Side::kY, y, dst, fused ? nullptr : b, !fused && d.relu);
  });
}

void ConvEngine::conv_backward(const ConvDesc& d, const void* src, const float* weight,
                               const void* dst, void* diff_dst, void* diff_src, float* diff_weight,
                               float* diff_bias) {
  DP_CHECK(!d.bias || diff_bias != nullptr,
           "conv_backward: the convolution has a bias but no bias gradient is given");
  Plan& p = conv_plan(d);
  in_context(p, [&] {
    const bool passes = diff_weight != nullptr || diff_src != nullptr;
    // The data gradient's first use: a bf16 plan without a bf16 algorithm for it turns fp32 now.
    if (diff_src != nullptr && p.bf16 && !p.pass[kBackwardData].ready)
      keep_bf16(p, {kBackwardData});
    if (passes) reserve_stage(p);
    // The masked output gradient, its bias gradient and (widened plans) the one fp32 copy of it
    // that serves both passes, in one pass over it.
    const void* dy = output_grad(p, Side::kY, passes, d.relu ? dst : nullptr, diff_dst,
                                 d.bias ? diff_bias : nullptr);
    if (!passes) return;
    if (diff_weight != nullptr) backward_filter(p, operand(p, Side::kX, src), dy, diff_weight);
    if (diff_src != nullptr) {
      // Written after the filter pass has read the X region (one stream: in order).
      void* dx = result(p, Side::kX, diff_src);
      backward_data(p, weight, dy, dx);
      epilogue(p, Side::kX, dx, diff_src, nullptr, false);
    }
  });
}

void ConvEngine::deconv_forward(const DeconvDesc& d, const void* src, const float* weight,
                                const float* bias, void* dst) {
  Plan& p = deconv_plan(d);
  in_context(p, [&] {
    reserve_stage(p);
    const void* dy = operand(p, Side::kY, src);
    void* dx = result(p, Side::kX, dst);
    backward_data(p, weight, dy, dx);
    epilogue(p, Side::kX, dx, dst, bias, d.relu);
  });
}

void ConvEngine::deconv_backward(const DeconvDesc& d, const void* src, const float* weight,
                                 const void* dst, void* diff_dst, void* diff_src,
                                 float* diff_weight, float* diff_bias) {
  Plan& p = deconv_plan(d);
  in_context(p, [&] {
    const bool passes = diff_weight != nullptr || diff_src != nullptr;
    if (passes) reserve_stage(p);
    // dW[cin, cout] = sum src[cin] * diff_dst[cout]: the convolution's filter gradient with its
    // input x = diff_dst and its output gradient dy = src. One widened copy of diff_dst serves
    // both passes.
    const void* x = output_grad(p, Side::kX, passes, d.relu ? dst : nullptr, diff_dst, diff_bias);
    if (!passes) return;
    if (diff_weight != nullptr) backward_filter(p, x, operand(p, Side::kY, src), diff_weight);
    if (diff_src != nullptr) {
      // Written after the filter pass has read the Y region (one stream: in order).
      void* y = result(p, Side::kY, diff_src);
      forward(p, x, weight, y, nullptr, false);  // no bias: never fused
      epilogue(p, Side::kY, y, diff_src, nullptr, false);
    }
  });
}

}  // namespace dp::cuda
