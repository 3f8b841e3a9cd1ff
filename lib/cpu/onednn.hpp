// oneDNN helpers for the CPU backend: primitive descriptors on the 2.x and 3.x APIs alike, bound
// memories, executions with pre-bound arguments, weight reorders built once, the error check.
#pragma once

#include <dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conv_gemm.hpp"
#include "dp/backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = memory::format_tag;
using dt = memory::data_type;

inline memory::desc nhwc_md(const Dims& d, dt type = dt::f32) {
  return memory::desc({d.n, d.c, d.h, d.w}, type, tag::nhwc);
}

// oneDNN 2.x (Debian 12 ships 2.6) builds a primitive descriptor from an operation descriptor;
// 3.x removed those and takes the operation's parameters directly, engine first. These build the
// descriptors the backend uses on either API.
inline memory::dims dims_of(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_dims();
#else
  return md.dims();
#endif
}

inline dnnl::primitive_attr relu_attr(bool relu) {
  dnnl::primitive_attr attr;
  if (relu) {
    dnnl::post_ops ops;
#if DNNL_VERSION_MAJOR >= 3
    ops.append_eltwise(algorithm::eltwise_relu, 0.0f, 0.0f);
#else
    ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
#endif
    attr.set_post_ops(ops);
  }
  return attr;
}

// Moves `pd` past the implementations whose name starts with one of `prefixes` (oneDNN lists them
// fastest first); dnnl_unimplemented when no other is left.
template <typename Pd>
void skip_impls(Pd& pd, const std::vector<std::string>& prefixes) {
  const auto skipped = [&] {
    const std::string name = pd.impl_info_str();
    return std::any_of(prefixes.begin(), prefixes.end(),
                       [&](const std::string& p) { return name.rfind(p, 0) == 0; });
  };
  while (skipped())
    if (!pd.next_impl()) throw dnnl::error(dnnl_unimplemented, "no other implementation");
}

// Forward pass (forward_training) of a convolution_forward or deconvolution_forward `Fwd`, with
// symmetric padding; an empty `bias` means none.
template <typename Fwd>
typename Fwd::primitive_desc fwd_pd(const dnnl::engine& eng, algorithm alg, const memory::desc& src,
                                    const memory::desc& w, const memory::desc& bias,
                                    const memory::desc& dst, const memory::dims& strides,
                                    const memory::dims& pad,
                                    const dnnl::primitive_attr& attr = {}) {
#if DNNL_VERSION_MAJOR >= 3
  return {eng, prop_kind::forward_training, alg, src, w, bias, dst, strides, pad, pad, attr};
#else
  return {
      typename Fwd::desc(prop_kind::forward_training, alg, src, w, bias, dst, strides, pad, pad),
      attr, eng};
#endif
}

// Backward-data pass of a (de)convolution `BwdData`, hinted by its forward pass.
template <typename BwdData, typename FwdPd>
typename BwdData::primitive_desc bwd_data_pd(const dnnl::engine& eng, algorithm alg,
                                             const memory::desc& src, const memory::desc& w,
                                             const memory::desc& dst, const memory::dims& strides,
                                             const memory::dims& pad, const FwdPd& hint,
                                             const dnnl::primitive_attr& attr = {}) {
#if DNNL_VERSION_MAJOR >= 3
  return {eng, alg, src, w, dst, strides, pad, pad, hint, attr};
#else
  return {typename BwdData::desc(alg, src, w, dst, strides, pad, pad), attr, eng, hint};
#endif
}

// Backward-weights pass of a (de)convolution `BwdWeights`, hinted by its forward pass, past the
// implementations whose names start with one of `skip` (oneDNN 2.6's implementation iterator keeps
// a pointer to its operation descriptor, which next_impl() reads: the skipping happens while it
// lives).
template <typename BwdWeights, typename FwdPd>
typename BwdWeights::primitive_desc bwd_weights_pd(
    const dnnl::engine& eng, algorithm alg, const memory::desc& src, const memory::desc& dw,
    const memory::desc& bias, const memory::desc& dst, const memory::dims& strides,
    const memory::dims& pad, const FwdPd& hint, const dnnl::primitive_attr& attr = {},
    const std::vector<std::string>& skip = {}) {
#if DNNL_VERSION_MAJOR >= 3
  typename BwdWeights::primitive_desc pd(eng, alg, src, dw, bias, dst, strides, pad, pad, hint,
                                         attr);
#else
  const typename BwdWeights::desc op(alg, src, dw, bias, dst, strides, pad, pad);
  typename BwdWeights::primitive_desc pd(op, attr, eng, hint);
#endif
  if (!skip.empty()) skip_impls(pd, skip);
  return pd;
}

// ReLU backward computed from the forward output (a fused post-op keeps no input), in place.
inline dnnl::eltwise_backward::primitive_desc relu_backward_pd(const dnnl::engine& eng,
                                                               const memory::desc& dst) {
  constexpr algorithm relu = algorithm::eltwise_relu_use_dst_for_bwd;
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::eltwise_forward::primitive_desc hint(eng, prop_kind::forward_training, relu, dst, dst,
                                                   0.0f);
  return {eng, relu, dst, dst, dst, 0.0f, 0.0f, hint};
#else
  const dnnl::eltwise_forward::primitive_desc hint(
      dnnl::eltwise_forward::desc(prop_kind::forward_training, relu, dst, 0.0f), eng);
  return {dnnl::eltwise_backward::desc(relu, dst, dst, 0.0f), eng, hint};
#endif
}

// The oneDNN CHECK: runs `build` and turns a dnnl::error into a dp::Error naming the primitive.
template <typename F>
auto checked(const char* what, const F& build) {
  try {
    return build();
  } catch (const dnnl::error& e) {
    fail("oneDNN: could not create ", what, ": ", e.what(), " (status ", static_cast<int>(e.status),
         ")");
  }
}

// A memory object whose data pointer is set to the caller's buffer on each use.
struct Bound {
  memory mem;
  void init(const memory::desc& md, const dnnl::engine& eng) {
    mem = memory(md, eng, DNNL_MEMORY_NONE);
  }
  void at(const void* p) { mem.set_data_handle(const_cast<void*>(p)); }
};

// A primitive with its arguments bound once (memory handles stay valid when their data pointer
// changes); run() goes through the C API so that executing allocates nothing.
class Exec {
 public:
  Exec() = default;
  explicit Exec(dnnl::primitive p) : prim_(std::move(p)) {}
  Exec& arg(int which, const memory& m) {
    mems_.push_back(m);
    args_.push_back({which, m.get()});
    return *this;
  }
  void run(const dnnl::stream& s) const {
    const dnnl_status_t st =
        dnnl_primitive_execute(prim_.get(), s.get(), static_cast<int>(args_.size()), args_.data());
    DP_CHECK(st == dnnl_success, "oneDNN: primitive execution failed (status ", int(st), ")");
  }

 private:
  dnnl::primitive prim_;
  std::vector<memory> mems_;
  std::vector<dnnl_exec_arg_t> args_;
};

// Weights kept in PyTorch's layout; when a primitive prefers another layout (or bf16) it reads a
// copy, reordered on each prepare() by a reorder built once into the caller's scratch memory
// (shared by all layers: the copy is only needed while the primitive runs).
struct WeightsIn {
  Bound user, internal;
  Exec reorder;
  bool needs_reorder = false;

  void init(const dnnl::engine& eng, const memory::desc& user_md, const memory::desc& want) {
    user.init(user_md, eng);
    needs_reorder = want != user_md;
    if (needs_reorder) {
      internal.init(want, eng);
      reorder = Exec(dnnl::reorder(user.mem, internal.mem));
      reorder.arg(DNNL_ARG_FROM, user.mem).arg(DNNL_ARG_TO, internal.mem);
    }
  }
  size_t scratch_bytes() const { return needs_reorder ? internal.mem.get_desc().get_size() : 0; }
  // The memory the primitive reads (fixed once init() ran).
  const memory& active() const { return needs_reorder ? internal.mem : user.mem; }
  void prepare(const dnnl::stream& s, const float* p, void* scratch) {
    user.at(p);
    if (needs_reorder) {
      internal.at(scratch);
      reorder.run(s);
    }
  }
};

// Scratch memory from the caller, shared by every layer (a layer needs it only while its
// primitives run): `weights` (weight_scratch_bytes(): reordered weights, or the weight gradient
// in oneDNN's layout before its reorder back) and `copies` (copies_bytes(): the blocked activation
// copies that the passes on oneDNN's own layout read and write).
struct Scratch {
  void* weights = nullptr;
  void* copies = nullptr;
};

// The blocked variants of a convolution's three passes (fp32, 3x3 stride 1): oneDNN's Winograd
// (jit_wino_4x3, AVX-512) or, where it has none, its direct kernels on its own blocked layout
// (nChw8c on AVX2, nChw16c on AVX-512), which run faster there than on NHWC. They read and write
// blocked copies of the NHWC tensors and may need a scratchpad (Winograd's transformed tiles), all
// in the copies scratch: [src, later diff_src | dst or diff_dst | scratchpad]; weights go through
// the weight scratch in their own layouts.
struct BlockedPrims {
  enum Pass { kFwd, kBwdData, kBwdWeights };
  Exec prims[3];
  Exec src_in, dst_out, diff_dst_in, diff_src_out, diff_w_out;  // reorders to and from NHWC/OIHW
  Bound src, dst, diff_dst, diff_src, diff_w, pads[3];
  WeightsIn w_fwd, w_bwd;
  size_t src_bytes = 0, mid_bytes = 0, pad_bytes[3] = {0, 0, 0};
  bool winograd = false;  // else direct kernels on the blocked layout
  size_t weight_scratch_bytes() const;
};

// The forward pass of a narrow 3x3 convolution (4 or 8 output channels) with P adjacent output
// pixels of a row computed as P x cout channels. oneDNN's kernels block output channels by the
// vector width (16 floats on AVX-512, 8 on AVX2), so a 4-channel layer fills a quarter of each
// vector. Output pixel P w' + p, channel c, is channel p cout + c of pixel w' of a convolution
// with stride (1, P), a 3 x (P+2) kernel and the weights W'[p cout + c, ci, kh, p + kw] =
// W[c, ci, kh, kw] (zero elsewhere); in NHWC memory the two outputs are the same bytes, so the
// packed convolution reads and writes the layer's own tensors. (P+2)/3 as many multiply-adds,
// most of the extra by zero, at up to 4x the lane use.
struct PackedConv {
  int pixels = 1, cout = 0, cin = 0;  // P, and the layer's channels
  Exec fwd;
  Bound src, dst, bias;
  WeightsIn w;
  std::vector<float> w_packed, b_packed;  // W' (oihw) and the bias repeated P times
  // Fills w_packed and b_packed from the layer's weights [cout, cin, 3, 3] and bias (or none).
  void pack(const float* weights, const float* b);
};

// How each pass of a convolution runs: direct NHWC kernels, the blocked variant, the shifted GEMMs
// or (forward and backward-data) Winograd on GEMMs, decided on the pass's first use when timing
// picks (see make_conv), or (forward only) the packed pixels of a narrow layer.
enum class PassAlgo : uint8_t { kDirect, kBlocked, kGemm, kGemmWinograd, kTimeOnFirstUse, kPacked };

// Forward, backward-data and backward-weights of a convolution or transposed convolution with
// optional bias and fused ReLU, all bound to their arguments once.
// With bf16 activations the primitives read and write them directly, read bf16 weights
// (converted by the weight reorder), accumulate in fp32 and write fp32 weight and bias gradients.
struct ConvPrims {
  Exec fwd, bwd_data, bwd_weights, relu_bwd, diff_w_to_user;
  Bound src, dst, bias, diff_dst, diff_src, diff_bias, diff_w_user, diff_w_internal;
  WeightsIn w_fwd, w_bwd;
  bool diff_w_reorder = false, relu = false, has_bias = false;
  bool forward_only = false;  // an inference model's: no backward primitives (backward() fails)
  std::unique_ptr<BlockedPrims> blocked;  // null where no pass may run on blocked copies
  std::unique_ptr<GemmConv> gemm;         // null where no pass may run as GEMMs
  std::unique_ptr<PackedConv> packed;     // null unless the forward pass runs packed
  PassAlgo algo[3] = {PassAlgo::kDirect, PassAlgo::kDirect,
                      PassAlgo::kDirect};  // BlockedPrims::Pass

  size_t gemm_offset = 0;  // where the GEMMs' copies start in the copies scratch (see below)

  size_t copies_bytes() const;
  // The blocked copies and the scratchpads of the passes that may still run blocked.
  size_t blocked_bytes() const;
  size_t weight_scratch_bytes() const;
  // The kernels a timed pass chooses from (BlockedPrims::Pass), direct first.
  std::vector<PassAlgo> candidates(int pass) const;
  void forward(dnnl::stream& s, const void* x, const float* w, const float* b, void* y,
               const Scratch& scratch);
  void backward(dnnl::stream& s, const void* x, const float* w, const void* y, void* dy, void* dx,
                float* dw, float* db, const Scratch& scratch);

 private:
  // One pass each, on tensors already bound (the GEMMs take the pointers too), by `a` (not
  // kTimeOnFirstUse). Each waits for its work.
  void forward_pass(dnnl::stream& s, const void* x, const float* w, const float* b, void* y,
                    const Scratch& scratch, PassAlgo a);
  void weights_pass(dnnl::stream& s, const void* x, const void* dy, float* dw, float* db,
                    const Scratch& scratch, PassAlgo a);
  void data_pass(dnnl::stream& s, const float* w, const void* dy, void* dx, const Scratch& scratch,
                 PassAlgo a);
  void bind_blocked_copies(const Scratch& scratch);
  // The GEMMs' copies, after the blocked ones (which the other backward pass may still read).
  void* gemm_copies(const Scratch& scratch) const;
};

std::unique_ptr<ConvPrims> make_conv(const dnnl::engine& eng, const ConvDesc& d, bool bf16,
                                     CpuConvAlgo algo);
std::unique_ptr<ConvPrims> make_deconv(const dnnl::engine& eng, const DeconvDesc& d, bool bf16);

}  // namespace dp::cpu
