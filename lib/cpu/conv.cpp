// Convolution and transposed convolution on oneDNN: primitive descriptors built once per shape,
// NHWC activations end to end, weights in PyTorch's layout reordered into oneDNN's choice; 3x3
// stride-1 passes may run on blocked copies (Winograd where oneDNN has it, else direct kernels on
// oneDNN's blocked layout) where those are faster, and narrow inference layers as packed pixels.
#include "onednn.hpp"

#include "dp/cpu/cpu_backend.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <type_traits>

namespace dp::cpu {
namespace {

// Builds the three primitives of a (de)convolution, or only the forward one (`forward_only`: an
// inference model's, whose backward primitives would cost start-up time and never run). `Fwd`,
// `BwdData`, `BwdWeights` are oneDNN's convolution_* or deconvolution_* classes, which share one
// constructor pattern. The forward primitive is the same either way (forward_training), so an
// inference model computes a training model's logits to the bit.
template <typename Fwd, typename BwdData, typename BwdWeights>
std::unique_ptr<ConvPrims> build(const dnnl::engine& eng, algorithm alg, const Dims& src,
                                 const Dims& dst, const memory::desc& user_w_md, bool has_bias,
                                 bool relu, int stride, int pad, bool bf16, bool forward_only) {
  auto p = std::make_unique<ConvPrims>();
  p->relu = relu;
  p->has_bias = has_bias;
  p->forward_only = forward_only;
  // Activations and their gradients are NHWC in `at` (fp32, or bf16 storage); the weights are
  // read in the same type (a bf16 copy made by the weight reorder), weight gradients are fp32.
  const dt at = bf16 ? dt::bf16 : dt::f32;
  const memory::desc src_md = nhwc_md(src, at), dst_md = nhwc_md(dst, at);
  const memory::desc any_w_md(dims_of(user_w_md), at, tag::any);
  const memory::desc any_dw_md(dims_of(user_w_md), dt::f32, tag::any);
  const memory::desc bias_md = has_bias ? memory::desc({dst.c}, dt::f32, tag::x) : memory::desc();
  const memory::dims strides{stride, stride}, padding{pad, pad};

  const auto fwd_desc =
      fwd_pd<Fwd>(eng, alg, src_md, any_w_md, bias_md, dst_md, strides, padding, relu_attr(relu));
  std::optional<typename BwdData::primitive_desc> bwd_data_desc;
  std::optional<typename BwdWeights::primitive_desc> bwd_w_desc;
  if (!forward_only) {
    bwd_data_desc.emplace(
        bwd_data_pd<BwdData>(eng, alg, src_md, any_w_md, dst_md, strides, padding, fwd_desc));
    // oneDNN 2.6's jit_1x1 backward-weights kernel for a strided 1x1 convolution writes past its
    // scratchpad with 3 or more threads (measured: 1408 bytes past a 5376-byte scratchpad for
    // 2->4 channels, stride 2, 4 threads; whenever the input has fewer than 16 channels),
    // corrupting the heap: ResNet downsample convolutions take the next implementation instead.
    const memory::dims k = dims_of(user_w_md);
    std::vector<std::string> skip;
    if (k[2] == 1 && k[3] == 1 && stride > 1) skip.emplace_back("jit_1x1");
    // oneDNN 2.x's AMX bf16 weight-gradient kernel writes outside its output at photograph sizes
    // (cpu_amx_bf16_weights_bug): its passes take the next implementation (avx512_core_bf16).
    // Transposed convolutions have no other there, and theirs (4x4, stride 2) wrote inside its
    // buffers at every decoder shape up to 384x544 outputs, /1 widths included: they keep it.
    constexpr bool conv = std::is_same_v<BwdWeights, dnnl::convolution_backward_weights>;
    if (conv && bf16 && cpu_amx_bf16_weights_bug()) skip.emplace_back("jit:avx512_core_amx");
    bwd_w_desc.emplace(bwd_weights_pd<BwdWeights>(eng, alg, src_md, any_dw_md, bias_md, dst_md,
                                                  strides, padding, fwd_desc, {}, skip));
  }
  // One layout end to end: the activations must stay NHWC, never reordered.
  DP_CHECK(fwd_desc.src_desc() == src_md && fwd_desc.dst_desc() == dst_md &&
               (forward_only || (bwd_data_desc->diff_src_desc() == src_md &&
                                 bwd_w_desc->diff_dst_desc() == dst_md)),
           "oneDNN chose a non-NHWC activation layout for ", src.c, "->", dst.c, " channels");

  p->src.init(src_md, eng);
  p->dst.init(dst_md, eng);
  p->w_fwd.init(eng, user_w_md, fwd_desc.weights_desc());
  p->fwd = Exec(Fwd(fwd_desc));
  p->fwd.arg(DNNL_ARG_SRC, p->src.mem)
      .arg(DNNL_ARG_WEIGHTS, p->w_fwd.active())
      .arg(DNNL_ARG_DST, p->dst.mem);
  if (has_bias) {
    p->bias.init(bias_md, eng);
    p->fwd.arg(DNNL_ARG_BIAS, p->bias.mem);
  }
  if (forward_only) return p;

  p->diff_src.init(src_md, eng);
  p->diff_dst.init(dst_md, eng);
  p->w_bwd.init(eng, user_w_md, bwd_data_desc->weights_desc());
  p->diff_w_user.init(user_w_md, eng);
  p->diff_w_reorder = bwd_w_desc->diff_weights_desc() != user_w_md;
  if (p->diff_w_reorder) p->diff_w_internal.init(bwd_w_desc->diff_weights_desc(), eng);
  const memory& dw = p->diff_w_reorder ? p->diff_w_internal.mem : p->diff_w_user.mem;

  p->bwd_data = Exec(BwdData(*bwd_data_desc));
  p->bwd_data.arg(DNNL_ARG_DIFF_DST, p->diff_dst.mem)
      .arg(DNNL_ARG_WEIGHTS, p->w_bwd.active())
      .arg(DNNL_ARG_DIFF_SRC, p->diff_src.mem);
  p->bwd_weights = Exec(BwdWeights(*bwd_w_desc));
  p->bwd_weights.arg(DNNL_ARG_SRC, p->src.mem)
      .arg(DNNL_ARG_DIFF_DST, p->diff_dst.mem)
      .arg(DNNL_ARG_DIFF_WEIGHTS, dw);
  if (has_bias) {
    p->diff_bias.init(bias_md, eng);
    p->bwd_weights.arg(DNNL_ARG_DIFF_BIAS, p->diff_bias.mem);
  }
  if (p->diff_w_reorder) {
    p->diff_w_to_user = Exec(dnnl::reorder(dw, p->diff_w_user.mem));
    p->diff_w_to_user.arg(DNNL_ARG_FROM, dw).arg(DNNL_ARG_TO, p->diff_w_user.mem);
  }
  if (relu) {
    p->relu_bwd = Exec(dnnl::eltwise_backward(relu_backward_pd(eng, dst_md)));
    p->relu_bwd.arg(DNNL_ARG_DST, p->dst.mem)
        .arg(DNNL_ARG_DIFF_DST, p->diff_dst.mem)
        .arg(DNNL_ARG_DIFF_SRC, p->diff_dst.mem);
  }
  return p;
}

// The variants of a 3x3 stride-1 fp32 convolution's passes on oneDNN's own activation layout
// (`alg`: Winograd, or direct on blocked nChw8c/nChw16c copies), with reorders to and from NHWC;
// the forward pass only where `p` is forward-only. Throws a dnnl::error where oneDNN has none for
// this shape and CPU.
std::unique_ptr<BlockedPrims> build_blocked(const dnnl::engine& eng, const ConvDesc& d,
                                            ConvPrims& p, const memory::desc& user_w_md,
                                            algorithm alg) {
  auto w = std::make_unique<BlockedPrims>();
  w->winograd = alg == algorithm::convolution_winograd;
  const auto any = [](const Dims& x) {
    return memory::desc({x.n, x.c, x.h, x.w}, dt::f32, tag::any);
  };
  const memory::desc src_md = any(d.src()), dst_md = any(d.dst());
  const memory::desc w_md(dims_of(user_w_md), dt::f32, tag::any);
  const memory::desc bias_md = d.bias ? memory::desc({d.cout}, dt::f32, tag::x) : memory::desc();
  const memory::dims strides{1, 1}, padding{d.padding(), d.padding()};
  // Scratchpads are ours (in the copies scratch) so that their size is known and counted.
  dnnl::primitive_attr fwd_attr = relu_attr(d.relu), attr;
  fwd_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto fwd_desc = fwd_pd<dnnl::convolution_forward>(eng, alg, src_md, w_md, bias_md, dst_md,
                                                          strides, padding, fwd_attr);
  const auto reorder = [](const memory& from, const memory& to) {
    Exec e(dnnl::reorder(from, to));
    e.arg(DNNL_ARG_FROM, from).arg(DNNL_ARG_TO, to);
    return e;
  };
  const auto padded = [](const memory::desc& md) { return (md.get_size() + 63) / 64 * 64; };
  w->src.init(fwd_desc.src_desc(), eng);
  w->dst.init(fwd_desc.dst_desc(), eng);
  w->src_in = reorder(p.src.mem, w->src.mem);
  w->dst_out = reorder(w->dst.mem, p.dst.mem);
  w->w_fwd.init(eng, user_w_md, fwd_desc.weights_desc());
  w->src_bytes = padded(fwd_desc.src_desc());
  w->mid_bytes = padded(fwd_desc.dst_desc());
  w->pads[BlockedPrims::kFwd].init(fwd_desc.scratchpad_desc(), eng);
  w->pad_bytes[BlockedPrims::kFwd] = padded(fwd_desc.scratchpad_desc());
  Exec& fwd = w->prims[BlockedPrims::kFwd];
  fwd = Exec(dnnl::convolution_forward(fwd_desc));
  fwd.arg(DNNL_ARG_SRC, w->src.mem)
      .arg(DNNL_ARG_WEIGHTS, w->w_fwd.active())
      .arg(DNNL_ARG_DST, w->dst.mem)
      .arg(DNNL_ARG_SCRATCHPAD, w->pads[BlockedPrims::kFwd].mem);
  if (d.bias) fwd.arg(DNNL_ARG_BIAS, p.bias.mem);
  if (p.forward_only) return w;

  const auto bwd_data_desc = bwd_data_pd<dnnl::convolution_backward_data>(
      eng, alg, src_md, w_md, dst_md, strides, padding, fwd_desc, attr);
  const auto bwd_w_desc = bwd_weights_pd<dnnl::convolution_backward_weights>(
      eng, alg, src_md, w_md, bias_md, dst_md, strides, padding, fwd_desc, attr);
  // One blocked copy of the input serves forward and backward-weights (the data gradient takes
  // its place after), one of the output gradient both backward passes.
  if (bwd_w_desc.src_desc() != fwd_desc.src_desc() ||
      bwd_w_desc.diff_dst_desc() != bwd_data_desc.diff_dst_desc() ||
      bwd_data_desc.diff_src_desc().get_size() > fwd_desc.src_desc().get_size())
    throw dnnl::error(dnnl_unimplemented, "blocked passes disagree on activation layouts");
  w->diff_dst.init(bwd_data_desc.diff_dst_desc(), eng);
  w->diff_src.init(bwd_data_desc.diff_src_desc(), eng);
  w->diff_w.init(bwd_w_desc.diff_weights_desc(), eng);
  w->diff_dst_in = reorder(p.diff_dst.mem, w->diff_dst.mem);
  w->diff_src_out = reorder(w->diff_src.mem, p.diff_src.mem);
  w->diff_w_out = reorder(w->diff_w.mem, p.diff_w_user.mem);
  w->w_bwd.init(eng, user_w_md, bwd_data_desc.weights_desc());
  w->mid_bytes = std::max(w->mid_bytes, padded(bwd_data_desc.diff_dst_desc()));
  const memory::desc pads[3] = {fwd_desc.scratchpad_desc(), bwd_data_desc.scratchpad_desc(),
                                bwd_w_desc.scratchpad_desc()};
  for (int k : {BlockedPrims::kBwdData, BlockedPrims::kBwdWeights}) {
    w->pads[k].init(pads[k], eng);
    w->pad_bytes[k] = padded(pads[k]);
  }
  Exec& bwd_data = w->prims[BlockedPrims::kBwdData];
  bwd_data = Exec(dnnl::convolution_backward_data(bwd_data_desc));
  bwd_data.arg(DNNL_ARG_DIFF_DST, w->diff_dst.mem)
      .arg(DNNL_ARG_WEIGHTS, w->w_bwd.active())
      .arg(DNNL_ARG_DIFF_SRC, w->diff_src.mem)
      .arg(DNNL_ARG_SCRATCHPAD, w->pads[BlockedPrims::kBwdData].mem);
  Exec& bwd_w = w->prims[BlockedPrims::kBwdWeights];
  bwd_w = Exec(dnnl::convolution_backward_weights(bwd_w_desc));
  bwd_w.arg(DNNL_ARG_SRC, w->src.mem)
      .arg(DNNL_ARG_DIFF_DST, w->diff_dst.mem)
      .arg(DNNL_ARG_DIFF_WEIGHTS, w->diff_w.mem)
      .arg(DNNL_ARG_SCRATCHPAD, w->pads[BlockedPrims::kBwdWeights].mem);
  if (d.bias) bwd_w.arg(DNNL_ARG_DIFF_BIAS, p.diff_bias.mem);
  return w;
}

// Under CpuConvAlgo::kAuto, passes below this many FLOPs stay direct NHWC (too small for the choice
// to matter; timing them would be mostly noise), and so do passes whose Winograd scratchpad (the
// transformed weights and tiles: 36 x cin x cout floats and more, for deep layers far larger than
// their activations) exceeds the cap. The scratchpad is shared by all layers, so Winograd adds at
// most the cap plus one layer's blocked copies to the run's memory.
constexpr double kTimedPassMinFlops = 0.2e9;
constexpr size_t kWinogradMaxScratchpad = size_t{96} << 20;

// Under CpuConvAlgo::kShape a forward pass of at least kTimedPassMinFlops runs Winograd where
// cin*cout/(cin+cout) reaches this: its arithmetic shrinks with cin*cout, its transforms and
// layout copies grow with cin+cout (measured per layer on UNet16 at full width and /8:
// bench/README.md; 64 -> 32, at 21.3, is the narrowest layer that gains); below the FLOP bound
// its primitive's creation and weight transform cost more than it saves.
constexpr double kShapeWinogradMinChannels = 20;
// ... on GEMMs (F(4x4, 3x3), GemmConv) for an inference model's layer below this, even where oneDNN
// has Winograd: no blocked copies, and faster at these widths (UNet16 /8 on AVX-512, 3456x2304:
// 2.47-2.53 -> 2.34-2.40 s, 20 MiB less; at full width, where oneDNN's is faster on the widest
// layers, bounds from 48 to 128 ran within noise of each other, 192 and all-GEMM slower) ...
constexpr double kShapeGemmWinogradBelowChannels = 64;
// ... and oneDNN's Winograd (or, under kAuto, its blocked layout) only where its blocked copies of
// the layer's input and output fit this; a larger layer (a whole photograph as one tile) runs
// Winograd on GEMMs instead, whose copies are chunks of tiles. So Winograd adds at most this plus
// the scratchpad cap to any run. (Under kAuto, full-width UNet16 at 384x544, batch 1, 2 threads,
// EPYC Zen 4, AVX-512: peak memory 2961 -> 2120 MiB, step 3.37 -> 2.99 s; 192x256 batch 4: 2647
// -> 2044 MiB, 3.19 -> 3.38 s.)
constexpr size_t kBlockedMaxCopies = size_t{32} << 20;

// Runs `pass(a)` for each candidate kernel once to warm up, then once each timed (their
// conversions included), and returns the fastest. (Where two are close the choice matters little;
// where it matters Winograd is up to 2.5x faster than direct NHWC, and the GEMMs up to 2x in
// backward-weights on AVX2.)
template <typename F>
PassAlgo fastest(const std::vector<PassAlgo>& candidates, const F& pass) {
  using clock = std::chrono::steady_clock;
  std::vector<double> seconds(candidates.size());
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < candidates.size(); ++i) {
      const auto t0 = clock::now();
      pass(candidates[i]);
      seconds[i] = std::chrono::duration<double>(clock::now() - t0).count();
    }
  return candidates[size_t(std::min_element(seconds.begin(), seconds.end()) - seconds.begin())];
}

// Settles a pass's kernel on its first use (timing the candidates when asked to).
template <typename F>
PassAlgo settle(PassAlgo& algo, const std::vector<PassAlgo>& candidates, const F& pass) {
  if (algo == PassAlgo::kTimeOnFirstUse) algo = fastest(candidates, pass);
  return algo;
}

// Under CpuConvAlgo::kShape the forward pass of a 3x3, stride-1, padding-1 layer with 4 or 8
// output channels runs packed (PackedConv) with P = vector width / cout of 2 or 4, where P divides
// the width. Measured on the /8 UNet16's layers (1 thread, batch 4): 16->4 channels at 192x256
// 4.7 -> 2.7 ms (AVX-512, P 4) and 7.0 -> 5.1 ms (AVX2, P 2); 32->8 at 96x128 2.4 -> 1.6 ms
// (AVX-512, P 2); P 4 for 8 channels and P 2 for 8 channels on AVX2 were no faster.
int packed_pixels(const ConvDesc& d) {
  if (d.kernel != 3 || d.stride != 1 || d.padding() != 1 || d.cout <= 0) return 1;
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  const int lanes = (isa & avx512) == avx512 ? 16 : 8;
  const int p = lanes % d.cout == 0 ? lanes / d.cout : 1;
  return (p == 2 || p == 4) && d.w % p == 0 ? p : 1;
}

std::unique_ptr<PackedConv> build_packed(const dnnl::engine& eng, const ConvDesc& d, int pixels) {
  auto k = std::make_unique<PackedConv>();
  k->pixels = pixels;
  k->cout = d.cout;
  k->cin = d.cin;
  const int cout = pixels * d.cout, kw = 2 + pixels;
  const memory::desc src_md = nhwc_md(d.src());
  const memory::desc dst_md({d.n, cout, d.out_h(), d.out_w() / pixels}, dt::f32, tag::nhwc);
  const memory::desc user_w({cout, d.cin, 3, kw}, dt::f32, tag::oihw);
  const memory::desc bias_md({cout}, dt::f32, tag::x);
  const auto pd = fwd_pd<dnnl::convolution_forward>(
      eng, algorithm::convolution_direct, src_md, memory::desc(dims_of(user_w), dt::f32, tag::any),
      bias_md, dst_md, {1, pixels}, {1, 1}, relu_attr(d.relu));
  DP_CHECK(pd.src_desc() == src_md && pd.dst_desc() == dst_md,
           "oneDNN chose a non-NHWC activation layout for the packed ", d.cin, "->", d.cout,
           " channels");
  k->src.init(src_md, eng);
  k->dst.init(dst_md, eng);
  k->bias.init(bias_md, eng);
  k->w.init(eng, user_w, pd.weights_desc());
  k->w_packed.assign(size_t(cout) * size_t(d.cin) * 3 * size_t(kw), 0.0f);
  k->b_packed.assign(size_t(cout), 0.0f);
  k->fwd = Exec(dnnl::convolution_forward(pd));
  k->fwd.arg(DNNL_ARG_SRC, k->src.mem)
      .arg(DNNL_ARG_WEIGHTS, k->w.active())
      .arg(DNNL_ARG_BIAS, k->bias.mem)
      .arg(DNNL_ARG_DST, k->dst.mem);
  return k;
}

}  // namespace

void PackedConv::pack(const float* weights, const float* b) {
  const size_t kw = size_t(2 + pixels), ci_n = size_t(cin);
  for (size_t p = 0; p < size_t(pixels); ++p)
    for (size_t c = 0; c < size_t(cout); ++c) {
      const size_t o = p * size_t(cout) + c;  // packed output channel
      b_packed[o] = b != nullptr ? b[c] : 0.0f;
      for (size_t ci = 0; ci < ci_n; ++ci)
        for (size_t y = 0; y < 3; ++y)
          for (size_t x = 0; x < 3; ++x)
            w_packed[((o * ci_n + ci) * 3 + y) * kw + p + x] =
                weights[((c * ci_n + ci) * 3 + y) * 3 + x];
    }
}

size_t BlockedPrims::weight_scratch_bytes() const {
  const size_t dw = diff_w.mem ? diff_w.mem.get_desc().get_size() : 0;  // none if forward-only
  return std::max({w_fwd.scratch_bytes(), w_bwd.scratch_bytes(), dw});
}

std::vector<PassAlgo> ConvPrims::candidates(int pass) const {
  std::vector<PassAlgo> c{PassAlgo::kDirect};
  if (blocked && blocked->pad_bytes[pass] <= kWinogradMaxScratchpad)
    c.push_back(PassAlgo::kBlocked);
  if (gemm && !gemm->bf16_activations) c.push_back(PassAlgo::kGemm);
  if (gemm) c.push_back(PassAlgo::kGemmWinograd);
  return c;
}

size_t ConvPrims::blocked_bytes() const {
  if (!blocked) return 0;
  size_t pad = 0;
  for (int k = 0; k < 3; ++k)
    if (algo[k] == PassAlgo::kBlocked || algo[k] == PassAlgo::kTimeOnFirstUse)
      pad = std::max(pad, blocked->pad_bytes[k]);
  return blocked->src_bytes + blocked->mid_bytes + pad;
}

size_t ConvPrims::copies_bytes() const {
  if (!gemm) return blocked_bytes();
  const bool plain =
      !gemm->bf16_activations && std::any_of(std::begin(algo), std::end(algo), [](PassAlgo a) {
        return a == PassAlgo::kGemm || a == PassAlgo::kTimeOnFirstUse;
      });
  return std::max(blocked_bytes(), gemm_offset + gemm->copies_bytes(plain));
}

void* ConvPrims::gemm_copies(const Scratch& scratch) const {
  return static_cast<char*>(scratch.copies) + gemm_offset;
}

size_t ConvPrims::weight_scratch_bytes() const {
  const size_t dw = diff_w_reorder ? diff_w_internal.mem.get_desc().get_size() : 0;
  return std::max({w_fwd.scratch_bytes(), w_bwd.scratch_bytes(), dw,
                   blocked ? blocked->weight_scratch_bytes() : 0,
                   gemm ? gemm->weight_scratch_bytes() : 0,
                   packed ? packed->w.scratch_bytes() : 0});
}

void ConvPrims::bind_blocked_copies(const Scratch& scratch) {
  // oneDNN's Winograd kernels write their scratchpad and copies with aligned (streaming) stores.
  DP_CHECK(reinterpret_cast<uintptr_t>(scratch.copies) % 64 == 0 &&
               reinterpret_cast<uintptr_t>(scratch.weights) % 64 == 0,
           "conv: the scratch buffers must be 64-byte aligned (dp::Buffer is)");
  char* base = static_cast<char*>(scratch.copies);
  blocked->src.at(base);
  blocked->dst.at(base + blocked->src_bytes);
  for (Bound& pad : blocked->pads)  // a forward-only convolution has the forward one alone
    if (pad.mem) pad.at(base + blocked->src_bytes + blocked->mid_bytes);
  if (forward_only) return;
  blocked->diff_src.at(base);  // written by backward-data, after backward-weights read src
  blocked->diff_dst.at(base + blocked->src_bytes);
}

void ConvPrims::forward_pass(dnnl::stream& s, const void* x, const float* w, const float* b,
                             void* y, const Scratch& scratch, PassAlgo a) {
  if (a == PassAlgo::kGemm) {
    gemm->forward(static_cast<const float*>(x), w, b, static_cast<float*>(y), scratch.weights,
                  gemm_copies(scratch));
    return;
  }
  if (a == PassAlgo::kGemmWinograd) {
    gemm->forward_winograd(x, w, b, y, scratch.weights, gemm_copies(scratch));
    return;
  }
  if (a == PassAlgo::kPacked) {
    packed->pack(w, has_bias ? b : nullptr);
    packed->w.prepare(s, packed->w_packed.data(), scratch.weights);
    packed->src.at(x);
    packed->dst.at(y);
    packed->bias.at(packed->b_packed.data());
    packed->fwd.run(s);
  } else if (a == PassAlgo::kBlocked) {
    blocked->w_fwd.prepare(s, w, scratch.weights);
    blocked->src_in.run(s);
    blocked->prims[BlockedPrims::kFwd].run(s);
    blocked->dst_out.run(s);
  } else {
    w_fwd.prepare(s, w, scratch.weights);
    fwd.run(s);
  }
  s.wait();
}

void ConvPrims::forward(dnnl::stream& s, const void* x, const float* w, const float* b, void* y,
                        const Scratch& scratch) {
  src.at(x);
  dst.at(y);
  if (has_bias) bias.at(b);
  if (blocked) bind_blocked_copies(scratch);
  const auto pass = [&](PassAlgo a) { forward_pass(s, x, w, b, y, scratch, a); };
  pass(settle(algo[BlockedPrims::kFwd], candidates(BlockedPrims::kFwd), pass));
}

// The weight gradient, through the weight scratch (oneDNN's layout, then reordered into the
// caller's), and the bias gradient. The blocked variant reads the output gradient's blocked copy
// made by backward().
void ConvPrims::weights_pass(dnnl::stream& s, const void* x, const void* dy, float* dw, float* db,
                             const Scratch& scratch, PassAlgo a) {
  if (a == PassAlgo::kGemm) {
    gemm->backward_weights(static_cast<const float*>(x), static_cast<const float*>(dy), dw, db,
                           scratch.weights, gemm_copies(scratch));
    return;
  }
  if (a == PassAlgo::kGemmWinograd) {
    gemm->backward_weights_winograd(x, dy, dw, db, scratch.weights, gemm_copies(scratch));
    return;
  }
  if (a == PassAlgo::kBlocked) {
    blocked->diff_w.at(scratch.weights);
    blocked->src_in.run(s);
    blocked->prims[BlockedPrims::kBwdWeights].run(s);
    blocked->diff_w_out.run(s);
  } else {
    if (diff_w_reorder) diff_w_internal.at(scratch.weights);
    bwd_weights.run(s);
    if (diff_w_reorder) diff_w_to_user.run(s);
  }
  s.wait();
}

// The data gradient (its reordered weights reuse the weight scratch once the weight gradient is
// out of it).
void ConvPrims::data_pass(dnnl::stream& s, const float* w, const void* dy, void* dx,
                          const Scratch& scratch, PassAlgo a) {
  if (a == PassAlgo::kGemm) {
    gemm->backward_data(static_cast<const float*>(dy), w, static_cast<float*>(dx), scratch.weights,
                        gemm_copies(scratch));
    return;
  }
  if (a == PassAlgo::kGemmWinograd) {
    gemm->backward_data_winograd(dy, w, dx, scratch.weights, gemm_copies(scratch));
    return;
  }
  if (a == PassAlgo::kBlocked) {
    blocked->w_bwd.prepare(s, w, scratch.weights);
    blocked->prims[BlockedPrims::kBwdData].run(s);
    blocked->diff_src_out.run(s);
  } else {
    w_bwd.prepare(s, w, scratch.weights);
    bwd_data.run(s);
  }
  s.wait();
}

void ConvPrims::backward(dnnl::stream& s, const void* x, const float* w, const void* y, void* dy,
                         void* dx, float* dw, float* db, const Scratch& scratch) {
  DP_CHECK(!forward_only, "conv: a backward pass of a convolution set up for inference only");
  src.at(x);
  dst.at(y);
  diff_dst.at(dy);
  if (relu) relu_bwd.run(s);
  s.wait();  // the GEMMs read the masked gradient outside the stream
  diff_w_user.at(dw);
  if (has_bias) diff_bias.at(db);
  if (dx != nullptr) diff_src.at(dx);
  const auto may_be_blocked = [&](int pass) {
    return algo[pass] == PassAlgo::kBlocked || algo[pass] == PassAlgo::kTimeOnFirstUse;
  };
  if (blocked) {  // the blocked output gradient, for whichever backward pass runs blocked
    bind_blocked_copies(scratch);
    if (may_be_blocked(BlockedPrims::kBwdWeights) ||
        (dx != nullptr && may_be_blocked(BlockedPrims::kBwdData)))
      blocked->diff_dst_in.run(s);
  }
  // Timing charges the blocked variant with its output-gradient conversion.
  const auto convert = [&](PassAlgo a) {
    if (a == PassAlgo::kBlocked) blocked->diff_dst_in.run(s);
  };
  const auto weights = [&](PassAlgo a) {
    convert(a);
    weights_pass(s, x, dy, dw, db, scratch, a);
  };
  weights_pass(
      s, x, dy, dw, db, scratch,
      settle(algo[BlockedPrims::kBwdWeights], candidates(BlockedPrims::kBwdWeights), weights));
  if (dx == nullptr) return;
  const auto data = [&](PassAlgo a) {
    convert(a);
    data_pass(s, w, dy, dx, scratch, a);
  };
  data_pass(s, w, dy, dx, scratch,
            settle(algo[BlockedPrims::kBwdData], candidates(BlockedPrims::kBwdData), data));
}

std::unique_ptr<ConvPrims> make_conv(const dnnl::engine& eng, const ConvDesc& d, bool bf16,
                                     CpuConvAlgo algo) {
  DP_CHECK(d.kernel >= 1 && d.stride >= 1 && d.out_h() >= 1 && d.out_w() >= 1, "conv: kernel ",
           d.kernel, " stride ", d.stride, " does not fit a ", d.h, "x", d.w, " input");
  const memory::desc user_w({d.cout, d.cin, d.kernel, d.kernel}, dt::f32, tag::oihw);
  auto p = checked("convolution", [&] {
    return build<dnnl::convolution_forward, dnnl::convolution_backward_data,
                 dnnl::convolution_backward_weights>(eng, algorithm::convolution_direct, d.src(),
                                                     d.dst(), user_w, d.bias, d.relu, d.stride,
                                                     d.padding(), bf16, d.forward_only);
  });
  const double flops = 2.0 * double(d.dst().numel()) * d.cin * d.kernel * d.kernel;
  if (algo == CpuConvAlgo::kDirect || d.kernel != 3 || d.stride != 1 ||
      (algo == CpuConvAlgo::kAuto && flops < kTimedPassMinFlops))
    return p;
  if (bf16) {  // oneDNN's direct kernels, or under kAuto and kGemmWinograd bf16 Winograd on GEMMs
    if ((algo != CpuConvAlgo::kAuto && algo != CpuConvAlgo::kGemmWinograd) ||
        !GemmConv::fits(d, true))
      return p;
    p->gemm = std::make_unique<GemmConv>(d, true);
    for (PassAlgo& a : p->algo)
      a = algo == CpuConvAlgo::kAuto ? PassAlgo::kTimeOnFirstUse : PassAlgo::kGemmWinograd;
    return p;
  }
  if (algo == CpuConvAlgo::kGemm || algo == CpuConvAlgo::kGemmWinograd) {
    if (!GemmConv::fits(d)) return p;
    p->gemm = std::make_unique<GemmConv>(d, false);
    for (PassAlgo& a : p->algo)
      a = algo == CpuConvAlgo::kGemm ? PassAlgo::kGemm : PassAlgo::kGemmWinograd;
    return p;
  }
  // `auto` tries Winograd, and where oneDNN has none for this shape or CPU (on AVX2 it has none
  // at all) the direct kernels on the blocked layout, and the GEMMs; a forced choice tries only
  // its own.
  const auto build_variant = [&](CpuConvAlgo variant) {
    try {
      p->blocked = build_blocked(eng, d, *p, user_w,
                                 variant == CpuConvAlgo::kWinograd ? algorithm::convolution_winograd
                                                                   : algorithm::convolution_direct);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  };
  if (algo == CpuConvAlgo::kShape) {
    if (const int pixels = packed_pixels(d); pixels > 1 && d.forward_only) {
      p->packed = checked("packed convolution", [&] { return build_packed(eng, d, pixels); });
      p->algo[BlockedPrims::kFwd] = PassAlgo::kPacked;
      return p;
    }
    const double channels = double(d.cin) * d.cout / (d.cin + d.cout);
    if (channels < kShapeWinogradMinChannels || flops < kTimedPassMinFlops) return p;
    if (!(d.forward_only && channels < kShapeGemmWinogradBelowChannels) &&
        build_variant(CpuConvAlgo::kWinograd) &&
        p->blocked->pad_bytes[BlockedPrims::kFwd] <= kWinogradMaxScratchpad &&
        p->blocked->src_bytes + p->blocked->mid_bytes <= kBlockedMaxCopies) {
      p->algo[BlockedPrims::kFwd] = PassAlgo::kBlocked;
      return p;
    }
    p->blocked.reset();
    if (GemmConv::fits(d)) {
      p->gemm = std::make_unique<GemmConv>(d, false);
      p->algo[BlockedPrims::kFwd] = PassAlgo::kGemmWinograd;
    }
    return p;
  }
  if (algo != CpuConvAlgo::kAuto) {
    if (build_variant(algo))
      for (PassAlgo& a : p->algo) a = PassAlgo::kBlocked;
    return p;  // direct NHWC only where oneDNN has no such variant
  }
  if (!build_variant(CpuConvAlgo::kWinograd)) build_variant(CpuConvAlgo::kBlocked);
  if (GemmConv::fits(d)) p->gemm = std::make_unique<GemmConv>(d, false);
  if (p->blocked && p->gemm && p->blocked->src_bytes + p->blocked->mid_bytes > kBlockedMaxCopies)
    p->blocked.reset();  // Winograd on GEMMs instead: its copies are chunks of tiles
  bool blocked_used = false;
  for (int k = 0; k < 3; ++k) {
    const std::vector<PassAlgo> c = p->candidates(k);
    if (c.size() > 1) p->algo[k] = PassAlgo::kTimeOnFirstUse;
    blocked_used = blocked_used || std::count(c.begin(), c.end(), PassAlgo::kBlocked) > 0;
  }
  if (!blocked_used) p->blocked.reset();
  p->gemm_offset = (p->blocked_bytes() + 63) / 64 * 64;
  return p;
}

std::unique_ptr<ConvPrims> make_deconv(const dnnl::engine& eng, const DeconvDesc& d, bool bf16) {
  DP_CHECK(d.kernel >= 1 && d.stride >= 1 && d.out_h() >= 1 && d.out_w() >= 1,
           "transposed conv: kernel ", d.kernel, " stride ", d.stride, " does not fit a ", d.h, "x",
           d.w, " input");
  // PyTorch's ConvTranspose2d weight is [cin, cout, k, k]: oneDNN's (out, in, kh, kw) in iohw
  // order.
  const memory::desc user_w({d.cout, d.cin, d.kernel, d.kernel}, dt::f32, tag::iohw);
  return checked("transposed convolution", [&] {
    return build<dnnl::deconvolution_forward, dnnl::deconvolution_backward_data,
                 dnnl::deconvolution_backward_weights>(eng, algorithm::deconvolution_direct,
                                                       d.src(), d.dst(), user_w, true, d.relu,
                                                       d.stride, d.pad, bf16, d.forward_only);
  });
}

}  // namespace dp::cpu

namespace dp {

std::string cpu_winograd_support() {
  try {
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const cpu::memory::desc x({1, 16, 8, 8}, cpu::dt::f32, cpu::tag::any);
    const cpu::memory::desc w({16, 16, 3, 3}, cpu::dt::f32, cpu::tag::any);
    cpu::fwd_pd<dnnl::convolution_forward>(eng, cpu::algorithm::convolution_winograd, x, w,
                                           cpu::memory::desc(), x, {1, 1}, {1, 1});
    return {};
  } catch (const dnnl::error&) {
    return "oneDNN has no Winograd convolution on this CPU (it runs " + cpu_isa_name() +
#if DNNL_VERSION_MAJOR >= 3
           "; " + cpu_onednn_version() + " has no fp32 Winograd training kernels)";
#else
           "; oneDNN 2.x has Winograd kernels for AVX-512 only)";
#endif
  }
}

}  // namespace dp
