// The CUDA backend's cuDNN convolutions: plans, algorithm choice, operands and passes.
#include "conv.hpp"

#include <algorithm>
#include <vector>

#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "dp/log.hpp"
#include "kernels.cuh"

namespace dp::cuda {

// ---------------------------------------------------------------------------------------------
// Plans

namespace {

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
constexpr const char* kPassName[3] = {"forward", "backward-data", "backward-filter"};

const float kOne = 1.0f, kZero = 0.0f;

// One algorithm as cuDNN's perf structs describe it (the three differ only in the enum).
struct Candidate {
  int algo = 0;
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  size_t memory = 0;
  cudnnDeterminism_t determinism = CUDNN_NON_DETERMINISTIC;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float ms = -1.0f;  // the search's time; negative where it was not timed
};

template <typename Perf>
std::vector<Candidate> candidates(const std::vector<Perf>& perf, int count) {
  std::vector<Candidate> out;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[size_t(i)];
    out.push_back(
        {static_cast<int>(p.algo), p.status, p.memory, p.determinism, p.mathType, p.time});
  }
  return out;
}

// A refusal made on the host (bad parameter, unsupported configuration, a runtime-compiled kernel
// that is unavailable), as opposed to a kernel that failed on the device.
bool refused(cudnnStatus_t status) {
  return static_cast<int>(status) / 1000 * 1000 != CUDNN_STATUS_EXECUTION_FAILED;
}

std::string shape(int n, int h, int w, int c) {
  return str_cat("[", n, ",", h, ",", w, ",", c, "]");
}

}  // namespace

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

namespace {

// The data type of the tensors and filters cuDNN sees in a plan.
cudnnDataType_t operand_type(const ConvEngine::Plan& p) {
  return p.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

// The math type an algorithm search starts from: bf16 on tensor cores (as PyTorch sets it for
// bf16); fp32 with TF32 allowed (cuDNN's default) or FMA only.
cudnnMathType_t base_math_type(const ConvEngine::Plan& p, const BackendOptions& options) {
  if (p.bf16) return CUDNN_TENSOR_OP_MATH;
  return options.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Sets the descriptors of a plan whose sizes and precision are filled in, and forgets its
// algorithms. The convolution's compute type is fp32 in both precisions (bf16:
// PSEUDO_BFLOAT16_CONFIG; the bias and the fp32 filter views are used by fp32 plans only).
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

// ---------------------------------------------------------------------------------------------
// Algorithm choice

namespace {

cudnnStatus_t heuristics(cudnnHandle_t h, const ConvEngine::Plan& p, const PassState& ps, int pass,
                         std::vector<Candidate>* out) {
  int max_count = 0, count = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  if (pass == kForward) {
    DP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(size_t(std::max(max_count, 1)));
    status =
        cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.get(), ps.filter.get(), ps.conv.get(),
                                               p.y.get(), int(perf.size()), &count, perf.data());
    if (status == CUDNN_STATUS_SUCCESS) *out = candidates(perf, count);
  } else if (pass == kBackwardData) {
    DP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(size_t(std::max(max_count, 1)));
    status = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, ps.filter.get(), p.y.get(),
                                                         ps.conv.get(), p.x.get(), int(perf.size()),
                                                         &count, perf.data());
    if (status == CUDNN_STATUS_SUCCESS) *out = candidates(perf, count);
  } else {
    DP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(size_t(std::max(max_count, 1)));
    status = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.get(), p.y.get(), ps.conv.get(),
                                                           ps.filter.get(), int(perf.size()),
                                                           &count, perf.data());
    if (status == CUDNN_STATUS_SUCCESS) *out = candidates(perf, count);
  }
  return status;
}

// Times the algorithms on the call's buffers (x, w, y; the pass's output among them is
// overwritten), fastest first.
cudnnStatus_t find(cudnnHandle_t h, const ConvEngine::Plan& p, const PassState& ps, int pass,
                   const void* x, const void* w, const void* y, void* ws, size_t ws_bytes,
                   std::vector<Candidate>* out) {
  int max_count = 0, count = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  if (pass == kForward) {
    DP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(size_t(std::max(max_count, 1)));
    status = cudnnFindConvolutionForwardAlgorithmEx(
        h, p.x.get(), x, ps.filter.get(), w, ps.conv.get(), p.y.get(), const_cast<void*>(y),
        int(perf.size()), &count, perf.data(), ws, ws_bytes);
    if (status == CUDNN_STATUS_SUCCESS) *out = candidates(perf, count);
  } else if (pass == kBackwardData) {
    DP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(size_t(std::max(max_count, 1)));
    status = cudnnFindConvolutionBackwardDataAlgorithmEx(
        h, ps.filter.get(), w, p.y.get(), y, ps.conv.get(), p.x.get(), const_cast<void*>(x),
        int(perf.size()), &count, perf.data(), ws, ws_bytes);
    if (status == CUDNN_STATUS_SUCCESS) *out = candidates(perf, count);
  } else {
    DP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(size_t(std::max(max_count, 1)));
    status = cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h, p.x.get(), x, p.y.get(), y, ps.conv.get(), ps.filter.get(), const_cast<void*>(w),
        int(perf.size()), &count, perf.data(), ws, ws_bytes);
    if (status == CUDNN_STATUS_SUCCESS) *out = candidates(perf, count);
  }
  return status;
}

cudnnStatus_t workspace_size(cudnnHandle_t h, const ConvEngine::Plan& p, const PassState& ps,
                             int pass, int algo, size_t* bytes) {
  if (pass == kForward)
    return cudnnGetConvolutionForwardWorkspaceSize(
        h, p.x.get(), ps.filter.get(), ps.conv.get(), p.y.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
  if (pass == kBackwardData)
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, ps.filter.get(), p.y.get(), ps.conv.get(), p.x.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(
      h, p.x.get(), p.y.get(), ps.conv.get(), ps.filter.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
}

}  // namespace

std::string ConvEngine::search_conditions(const Plan& p) const {
  return str_cat(p.bf16 ? " (bf16 NHWC, fp32 compute" : " (fp32 NHWC",
                 options_.deterministic ? ", deterministic only" : "",
                 p.bf16 || options_.tf32 ? "" : ", no TF32", ", workspace at most ",
                 format_mib(double(options_.max_workspace_bytes)), ")");
}

bool ConvEngine::try_ensure(Plan& p, int pass, const void* x, const void* w, const void* y) {
  PassState& ps = p.pass[pass];
  if (ps.ready) return true;
  p.short_of_memory = false;
  std::string why_nchw;
  if (!options_.krsc_filters) {
    if (choose(p, pass, false, x, w, y)) {
      keep_faster_krsc(p, pass, x, w, y);
      note_choice(p, pass);
      return true;
    }
    why_nchw = p.why;
  }
  if (choose(p, pass, true, x, w, y)) {
    note_choice(p, pass);
    return true;
  }
  p.why = str_cat(options_.krsc_filters ? "" : str_cat("with the NCHW filter: ", why_nchw, "; "),
                  "with the KRSC filter: ", p.why);
  return false;
}

// With the NCHW filter cuDNN may offer fewer or slower kernels for a shape than with the filter
// in KRSC (NHWC) order, the layout its NHWC tensor-core kernels read. So the KRSC filter is
// searched too, and kept when its call is clearly (10%) faster: that covers the filter copy it
// costs in fp32 (bf16 copies the filter either way). Both choices are timed as they will run
// (time_pass), not by the search's figures: the search may fail as a whole with the KRSC filter
// (then its choice is the heuristics' first), and with the NCHW filter it may find only
// IMPLICIT_GEMM, the legacy kernel without tensor cores (on an H200, cuDNN 9.19, UNet16's dec1 at
// 448x448, batch 16: 17.5 ms a call). --deterministic (choices ranked by the heuristics, never by
// timings) keeps the NCHW filter.
void ConvEngine::keep_faster_krsc(Plan& p, int pass, const void* x, const void* w, const void* y) {
  if (options_.deterministic) return;
  PassState& ps = p.pass[pass];
  ps.ms = time_pass(p, pass, x, w, y);
  const int algo = ps.algo;
  const cudnnMathType_t math = ps.math;
  const float ms = ps.ms;
  if (choose(p, pass, true, x, w, y)) {
    ps.ms = time_pass(p, pass, x, w, y);
    if (ps.ms < 0.9f * ms) return;
  }
  // Back to the NCHW filter's algorithm.
  DP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(ps.filter.get(), operand_type(p), CUDNN_TENSOR_NCHW,
                                            p.k, p.c, p.r, p.r));
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), math));
  ps.algo = algo;
  ps.math = math;
  ps.ms = ms;
  ps.krsc = false;
  ps.ready = true;
  p.short_of_memory = false;
  p.why.clear();
}

float ConvEngine::time_pass(const Plan& p, int pass, const void* x, const void* w, const void* y) {
  const PassState& ps = p.pass[pass];
  auto call = [&] {
    if (pass == kForward)
      DP_CUDNN_CHECK(cudnnConvolutionForward(
          handle_, &kOne, p.x.get(), x, ps.filter.get(), w, ps.conv.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(ps.algo), workspace_.data(), workspace_.bytes(),
          &kZero, p.y.get(), const_cast<void*>(y)));
    else if (pass == kBackwardData)
      DP_CUDNN_CHECK(cudnnConvolutionBackwardData(
          handle_, &kOne, ps.filter.get(), w, p.y.get(), y, ps.conv.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(ps.algo), workspace_.data(),
          workspace_.bytes(), &kZero, p.x.get(), const_cast<void*>(x)));
    else
      DP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          handle_, &kOne, p.x.get(), x, p.y.get(), y, ps.conv.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(ps.algo), workspace_.data(),
          workspace_.bytes(), &kZero, ps.filter.get(), const_cast<void*>(w)));
  };
  call();  // warm-up: lazy module loading, caches
  constexpr int kRuns = 3;
  const Event start(true), end(true);
  start.record(heap_.stream());
  for (int i = 0; i < kRuns; ++i) call();
  end.record(heap_.stream());
  end.synchronize();
  return Event::elapsed_ms(start, end) / kRuns;
}

void ConvEngine::note_choice(const Plan& p, int pass) const {
  if (!options_.log_algorithms) return;
  const PassState& ps = p.pass[pass];
  const char* math = ps.math == CUDNN_TENSOR_OP_MATH ? "tensor-op math"
                     : ps.math == CUDNN_FMA_MATH     ? "FMA math"
                                                     : "default math (TF32 allowed)";
  options_.log.info("cuDNN: ", p.what, " ", kPassName[pass], ": algorithm ", ps.algo, ", ", math,
                    ", ", ps.krsc ? "KRSC" : "NCHW", " filter",
                    ps.ms >= 0.0f ? str_cat(", ", fixed(ps.ms, 3), " ms") : std::string());
}

void ConvEngine::ensure(Plan& p, int pass, const void* x, const void* w, const void* y) {
  if (try_ensure(p, pass, x, w, y)) return;
  fail("cuDNN offers no usable ", kPassName[pass], " algorithm for ", p.what, search_conditions(p),
       ": ", p.why);
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

bool ConvEngine::keep_bf16(Plan& p, std::initializer_list<int> passes) {
  int pass = -1;  // the first pass without a bf16 algorithm
  {
    // On scratch operands of the plan's shapes (their contents do not matter to the search),
    // allocated once for the passes and freed after.
    Arena probe(heap_, "the bf16 algorithm search's operands");
    const Plan::Regions r = p.probe();
    probe.reserve(r.bytes);
    // Zeros: no NaN or subnormal garbage to slow an algorithm down in the timing.
    DP_CUDA_CHECK(cudaMemsetAsync(probe.data(), 0, r.bytes, heap_.stream()));
    char* base = static_cast<char*>(probe.data());
    for (int candidate : passes) {
      if (!try_ensure(p, candidate, base, base + r.w_offset, base + r.y_offset)) {
        pass = candidate;
        break;
      }
    }
  }
  if (pass < 0) return true;
  // Device memory, not bf16 support, is missing: the same error as in ensure(), on this rank.
  if (p.short_of_memory)
    fail("cuDNN offers no usable ", kPassName[pass], " algorithm for ", p.what,
         search_conditions(p), ": ", p.why);
  options_.log.info("cuDNN: ", p.what, " runs in fp32", options_.tf32 ? " (TF32)" : "",
                    " instead of bf16: no usable bf16 ", kPassName[pass], " algorithm",
                    search_conditions(p), ": ", p.why);
  p.bf16 = false;
  p.widened = true;
  init_plan(&p, options_);
  return false;
}

bool ConvEngine::choose(Plan& p, int pass, bool krsc, const void* x, const void* w, const void* y) {
  PassState& ps = p.pass[pass];
  const cudnnMathType_t base_math = base_math_type(p, options_);
  // Each algorithm runs with the math type it was found with, except in fp32 without TF32, where
  // every one runs FMA-only. (bf16 operands are rounded already: tensor cores lose nothing more.)
  const bool own_math = p.bf16 || options_.tf32;
  DP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(ps.filter.get(), operand_type(p),
                                            krsc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, p.k, p.c,
                                            p.r, p.r));
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), base_math));

  const auto usable = [&](const Candidate& c) {
    return c.status == CUDNN_STATUS_SUCCESS &&
           (!options_.deterministic || c.determinism == CUDNN_DETERMINISTIC) &&
           c.math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&  // may round to half precision
           (own_math || c.math != CUDNN_TENSOR_OP_MATH) && c.memory <= options_.max_workspace_bytes;
  };

  // The heuristics say which algorithms apply and how much workspace they may need.
  std::vector<Candidate> hints;
  const cudnnStatus_t hint_status = heuristics(handle_, p, ps, pass, &hints);
  if (hint_status != CUDNN_STATUS_SUCCESS) {
    p.why = str_cat("the heuristics failed: ", cudnnGetErrorString(hint_status));
    return false;
  }
  size_t search_bytes = 0;
  bool any = false;
  for (const Candidate& c : hints) {
    if (!usable(c)) continue;
    any = true;
    size_t need = 0;
    DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), own_math ? c.math : base_math));
    if (workspace_size(handle_, p, ps, pass, c.algo, &need) != CUDNN_STATUS_SUCCESS) need = 0;
    need = std::max(need, c.memory);
    if (need <= options_.max_workspace_bytes) search_bytes = std::max(search_bytes, need);
  }
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), base_math));
  if (!any) {
    p.why = "the heuristics list no supported algorithm";
    return false;
  }

  // Time them with as much of that workspace as the device can spare for the search (a scratch
  // allocation freed right after, or the arena when it is large enough already).
  void* temp = nullptr;
  size_t temp_bytes = 0;
  for (size_t b = search_bytes; b > workspace_.bytes(); b /= 2) {
    if ((temp = heap_.try_allocate(b)) != nullptr) {
      temp_bytes = b;
      break;
    }
  }
  std::vector<Candidate> found;
  cudnnStatus_t find_status = CUDNN_STATUS_SUCCESS;
  try {
    find_status = find(handle_, p, ps, pass, x, w, y, temp ? temp : workspace_.data(),
                       temp ? temp_bytes : workspace_.bytes(), &found);
  } catch (...) {
    heap_.free(temp, temp_bytes);
    throw;
  }
  heap_.free(temp, temp_bytes);
  std::vector<Candidate> ranked;
  const bool ranked_by_time = find_status == CUDNN_STATUS_SUCCESS && !options_.deterministic;
  if (find_status != CUDNN_STATUS_SUCCESS) {
    // Unsupported layouts may fail as a whole; the KRSC filter is the supported configuration,
    // where the heuristics' order stands in for the timing.
    if (!krsc) {
      p.why = str_cat("the search failed: ", cudnnGetErrorString(find_status));
      return false;
    }
    ranked = hints;
  } else if (options_.deterministic) {
    // Run-to-run reproducible: the heuristics' order (fixed for a shape, GPU and cuDNN), not the
    // timings, among the algorithms that ran in the search.
    for (const Candidate& h : hints) {
      const bool ran = std::any_of(found.begin(), found.end(), [&](const Candidate& c) {
        return c.algo == h.algo && c.status == CUDNN_STATUS_SUCCESS;
      });
      if (ran) ranked.push_back(h);
    }
  } else {
    ranked = found;
  }

  // The first usable algorithm whose workspace the arena can grow to.
  bool out_of_memory = false;
  for (const Candidate& c : ranked) {
    if (!usable(c)) continue;
    DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), own_math ? c.math : base_math));
    size_t need = 0;
    if (workspace_size(handle_, p, ps, pass, c.algo, &need) != CUDNN_STATUS_SUCCESS) continue;
    need = std::max(need, c.memory);
    if (need > options_.max_workspace_bytes) continue;
    if (!workspace_.try_reserve(need)) {
      out_of_memory = true;
      continue;
    }
    ps.algo = c.algo;
    ps.math = own_math ? c.math : base_math;
    ps.ms = ranked_by_time ? c.ms : -1.0f;
    ps.krsc = krsc;
    ps.ready = true;
    return true;
  }
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), base_math));
  p.short_of_memory = p.short_of_memory || out_of_memory;
  p.why = out_of_memory ? str_cat("the workspace of the supported algorithms does not fit in ",
                                  heap_.device(), " next to the ",
                                  format_mib(double(heap_.allocated())), " held")
                        : std::string("no algorithm that ran in the search is usable");
  return false;
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
