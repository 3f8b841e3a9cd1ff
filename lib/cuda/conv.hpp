// The CUDA backend's cuDNN convolutions (internal): plans per shape, algorithms chosen once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "device_memory.hpp"
#include "dp/backend.hpp"
#include "dp/cuda/cuda_backend.hpp"

namespace dp::cuda {

// Convolutions and transposed convolutions on cuDNN's legacy convolution API, NHWC activations,
// weights in PyTorch's layout. Every call is enqueued on the heap's stream (the handle must be
// bound to it). A transposed convolution is the backward-data pass of the convolution from its
// output to its input (same weight), its backward-data pass that convolution's forward.
//
// Algorithms: chosen per shape and pass (forward, backward data, backward filter), in fp32 on the
// pass's first use with the call's own buffers, in bf16 when the plan is built (a convolution's
// backward-data pass: at its first use), on zeroed scratch bf16 operands allocated for the search
// and freed after (the search blocks until it has run): the fastest that
// cudnnFind*AlgorithmEx measures, with a scratch workspace as large as the heuristics' candidates
// need (freed after); with options.deterministic, deterministic algorithms only, taken in the
// heuristics' (reproducible) order among those the search ran. TF32 only with options.tf32.
//
// Filters: cuDNN is first asked for algorithms on the weights as they are (an NCHW filter, i.e.
// [k, c, r, s], next to NHWC activations), then on an NHWC (KRSC) copy, made by
// cudnnTransformTensor before each call (and the filter gradient transformed back). The copy is
// used where the NCHW filter has no algorithm, or where its chosen algorithm's call, timed on the
// call's buffers, beats the NCHW filter's by 10% (keep_faster_krsc; not with
// options.deterministic). BackendOptions::krsc_filters forces the copy everywhere, so that both
// paths can be tested.
//
// Bias and ReLU: fused by cudnnConvolutionBiasActivationForward in a convolution's forward pass
// where cuDNN accepts it and it is not slower than the plain convolution + the bias/ReLU kernel
// kernels::convert (timed on the plan's first forward, except with options.deterministic; falling
// back for good on a refusal), else that kernel.
//
// bf16 (options.precision == kBFloat16): the activations and their gradients are bf16 (the
// backend's activation_type()). Every cuDNN call of a bf16 plan runs on them as they are, with
// bf16 filters and fp32 compute (the convolution descriptor's type CUDNN_DATA_FLOAT, tensor-op
// math; cuDNN's PSEUDO_BFLOAT16_CONFIG, which wants x, w and y, or dx / dw, all bf16): the
// weights are converted into a bf16 region of the staging arena (rounded to nearest even; KRSC
// filters in KRSC order directly), the bf16 filter gradient cuDNN writes there is widened into
// the fp32 weight gradient. cuDNN rounds its outputs to bf16; the bias and ReLU are then applied
// to the stored bf16 output and rounded again (never the fused call), as PyTorch's autocast adds
// the bias to a bf16 convolution output. The bias gradient is summed in fp32 from the bf16 output
// gradient (kernels::output_grad). Algorithms are searched when the plan is built, on scratch
// bf16 operands of the plan's shapes (freed after). A shape for which cuDNN offers no usable
// bf16 algorithm for one of the passes it runs (e.g. 3 input channels, 1 output channel) gets a
// widened fp32 plan instead: its calls widen their bf16 operands into fp32 regions of the staging
// arena, run fp32 with the fp32 weights (TF32 per options.tf32, the fused bias + ReLU allowed)
// and round their results into the bf16 outputs (with the bias and ReLU, once). The staging arena
// keeps the size of the largest widened plan's two fp32 sides (e.g. 822 MB for a 3->64 first
// layer at 448x448, batch 16). That is decided when the plan is built (a
// convolution's backward-data pass: when first asked for, since the first layer never runs it)
// and logged once (options.log); every other shape stays bf16. runs_in_bf16() says which a shape
// got.
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
  // Activations (void*) are fp32, or bf16 with options.precision == kBFloat16.
  void conv_forward(const ConvDesc& d, const void* src, const float* weight, const float* bias,
                    void* dst);
  void conv_backward(const ConvDesc& d, const void* src, const float* weight, const void* dst,
                     void* diff_dst, void* diff_src, float* diff_weight, float* diff_bias);
  void deconv_forward(const DeconvDesc& d, const void* src, const float* weight, const float* bias,
                      void* dst);
  void deconv_backward(const DeconvDesc& d, const void* src, const float* weight, const void* dst,
                       void* diff_dst, void* diff_src, float* diff_weight, float* diff_bias);
  // Whether the shape's plan (built now if needed) runs on bf16 operands with all its passes
  // (a convolution's backward-data pass probed now too).
  bool runs_in_bf16(const ConvDesc& d);
  bool runs_in_bf16(const DeconvDesc& d);

  struct Plan;  // conv_plan.hpp

 private:
  // n, h, w, cin, cout, kernel, stride, pad (a plan does not depend on bias or ReLU).
  using PlanKey = std::tuple<int, int, int, int, int, int, int, int>;

  Plan& conv_plan(const ConvDesc& d);
  Plan& deconv_plan(const DeconvDesc& d);
  // Sets up a plan whose sizes are filled in: its descriptors and (bf16 engine) its precision:
  // bf16 while cuDNN has a bf16 algorithm for each pass the plan runs, probed now (all passes,
  // or with `data_pass_on_use` all but backward-data, which a convolution whose input needs no
  // gradient never runs: probed by conv_backward when first asked for it).
  void build(Plan& p, bool data_pass_on_use);

  // The passes, on operands of the plan's type: the activations themselves, or (widened plan)
  // the fp32 regions that operand() / result() hand out. Weights and the filter gradient are
  // always fp32, PyTorch layout. y = x * w (cross-correlation); with a bias (fp32 plans only) the
  // bias and ReLU may be fused: true when they were, else epilogue() must add them.
  bool forward(Plan& p, const void* x, const float* w, void* y, const float* bias, bool relu);
  // cudnnConvolutionForward, and cudnnConvolutionBiasActivationForward, with the forward pass's
  // algorithm.
  void plain_forward(const Plan& p, const void* x, const void* filter, void* y);
  cudnnStatus_t fused_forward(const Plan& p, const void* x, const void* filter, void* y,
                              const float* bias, bool relu);
  // Times the fused call against the plain convolution + bias/ReLU kernel (first fp32 forward).
  bool fused_is_faster(const Plan& p, const void* x, const void* filter, void* y, const float* bias,
                       bool relu);
  void backward_data(Plan& p, const float* w, const void* dy, void* dx);
  void backward_filter(Plan& p, const void* x, const void* dy, float* dw);
  // Side x (the plan's input side) or y of a plan: its pixels and channels.
  enum class Side { kX, kY };
  static int64_t pixels(const Plan& p, Side side);
  static int channels(const Plan& p, Side side);
  // Operand `t` (an activation) as a pass reads it: `t` itself, or (widened plan) its fp32 copy in
  // the side's staging region, made now. result(): where a pass writes that side: `t`, or the
  // region.
  const void* operand(Plan& p, Side side, const void* t);
  void* result(Plan& p, Side side, void* t);
  // The output gradient of side `side` (kernels::output_grad: masked by dst where given, its bias
  // gradient where diff_bias); returns what the passes read: diff_dst, or (widened plan, when
  // `copy`) its fp32 copy in the side's region.
  const void* output_grad(Plan& p, Side side, bool copy, const void* dst, void* diff_dst,
                          float* diff_bias);
  // out = act(r + bias) over the side from a pass's result r: in place in the activations' type
  // (r == out), or rounded into the bf16 out from a widened plan's fp32 region; bias may be null
  // (none), act is ReLU when relu.
  void epilogue(const Plan& p, Side side, const void* r, void* out, const float* bias, bool relu);
  // Grows the staging arena to the plan's regions (at the start of each operation), and the
  // regions: a side's fp32 copy (widened plans), the bf16 filter (bf16 plans).
  void reserve_stage(const Plan& p);
  char* stage_region(const Plan& p, Side side) const;
  __nv_bfloat16* filter_region(const Plan& p) const;
  // The filter as the pass reads it (after ensure): `w` itself, its KRSC copy (made now) for a
  // KRSC pass, or (bf16) its bf16 copy in the pass's layout.
  const void* filter_for(Plan& p, int pass, const float* w);
  // ---- Algorithm choice (conv_search.cpp) ----
  // Chooses a bf16 plan's algorithms for `passes`, in order, on scratch bf16 operands allocated
  // once; at the first pass for which cuDNN has none (for a reason other than memory), logs it and
  // makes the plan a widened fp32 one. False when it did.
  bool keep_bf16(Plan& p, std::initializer_list<int> passes);
  // Chooses the pass's algorithm on its first use (x, w, y: the call's buffers; the pass's output
  // among them is overwritten). try_ensure: false, with the reasons in p.why, when cuDNN offers
  // none; ensure throws dp::Error then.
  void ensure(Plan& p, int pass, const void* x, const void* w, const void* y);
  bool try_ensure(Plan& p, int pass, const void* x, const void* w, const void* y);
  // After an NCHW-filter choice: searches with the KRSC filter and keeps it if its call is
  // clearly faster.
  void keep_faster_krsc(Plan& p, int pass, const void* x, const void* w, const void* y);
  // Milliseconds per call of the pass's chosen algorithm on the call's buffers (as choose's).
  float time_pass(const Plan& p, int pass, const void* x, const void* w, const void* y);
  // With options.log_algorithms: one info line with the pass's chosen algorithm.
  void note_choice(const Plan& p, int pass) const;
  // " (bf16 NHWC, fp32 compute, ..., workspace at most ...)": what a plan's search allowed.
  std::string search_conditions(const Plan& p) const;
  bool choose(Plan& p, int pass, bool krsc, const void* x, const void* w, const void* y);

  cudnnHandle_t handle_;
  DeviceHeap& heap_;
  Arena& workspace_;
  BackendOptions options_;
  bool bf16_ = false;  // options_.precision == kBFloat16: bf16 activations; plans bf16 where
                       // cuDNN allows
  Arena filter_copy_;  // the KRSC filter (or filter gradient) of the current call (fp32)
  Arena stage_;        // the current call's staged operands (Plan::stage())
  std::map<PlanKey, std::unique_ptr<Plan>> conv_plans_;
  std::map<PlanKey, std::unique_ptr<Plan>> deconv_plans_;
};

}  // namespace dp::cuda
