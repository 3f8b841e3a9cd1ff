// Convolution and transposed convolution on oneDNN: primitive descriptors built once per shape,
// NHWC activations end to end, weights in PyTorch's layout reordered into oneDNN's choice.
#include "onednn.hpp"

#include <algorithm>

namespace dp::cpu {
namespace {

dnnl::primitive_attr relu_attr(bool relu) {
  dnnl::primitive_attr attr;
  if (relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  return attr;
}

// Builds the three primitives of a (de)convolution. `Fwd`, `BwdData`, `BwdWeights` are oneDNN's
// convolution_* or deconvolution_* classes, which share one constructor pattern.
template <typename Fwd, typename BwdData, typename BwdWeights>
std::unique_ptr<ConvPrims> build(const dnnl::engine& eng, algorithm alg, const Dims& src,
                                 const Dims& dst, const memory::desc& user_w_md, bool has_bias,
                                 bool relu, int stride, int pad, bool bf16) {
  auto p = std::make_unique<ConvPrims>();
  p->relu = relu;
  p->has_bias = has_bias;
  p->lowp = bf16;
  // Activations and their gradients are fp32 NHWC; the primitives read `ct` (the compute type)
  // copies of the input and the output gradient, and weights in `ct`.
  const dt ct = bf16 ? dt::bf16 : dt::f32;
  const memory::desc src_md = nhwc_md(src), dst_md = nhwc_md(dst);
  const memory::desc src_ct = nhwc_md(src, ct), dst_ct = nhwc_md(dst, ct);
  const memory::desc any_w_md(user_w_md.dims(), ct, tag::any);
  const memory::desc any_dw_md(user_w_md.dims(), dt::f32, tag::any);
  const memory::desc bias_md = has_bias ? memory::desc({dst.c}, dt::f32, tag::x) : memory::desc();
  const memory::dims strides{stride, stride}, padding{pad, pad};

  typename Fwd::primitive_desc fwd_pd(
      typename Fwd::desc(prop_kind::forward_training, alg, src_ct, any_w_md, bias_md, dst_md,
                         strides, padding, padding),
      relu_attr(relu), eng);
  typename BwdData::primitive_desc bwd_data_pd(
      typename BwdData::desc(alg, src_md, any_w_md, dst_ct, strides, padding, padding), eng,
      fwd_pd);
  typename BwdWeights::primitive_desc bwd_w_pd(
      typename BwdWeights::desc(alg, src_ct, any_dw_md, bias_md, dst_ct, strides, padding, padding),
      eng, fwd_pd);
  // One layout end to end: the activations must stay NHWC, never reordered.
  DP_CHECK(fwd_pd.src_desc() == src_ct && fwd_pd.dst_desc() == dst_md &&
               bwd_data_pd.diff_src_desc() == src_md && bwd_w_pd.diff_dst_desc() == dst_ct,
           "oneDNN chose a non-NHWC activation layout for ", src.c, "->", dst.c, " channels");

  p->src.init(src_md, eng);
  p->dst.init(dst_md, eng);
  p->diff_src.init(src_md, eng);
  p->diff_dst.init(dst_md, eng);
  if (bf16) {
    p->src_lowp.init(src_ct, eng);
    p->diff_dst_lowp.init(dst_ct, eng);
    p->src_to_lowp = Exec(dnnl::reorder(p->src.mem, p->src_lowp.mem));
    p->src_to_lowp.arg(DNNL_ARG_FROM, p->src.mem).arg(DNNL_ARG_TO, p->src_lowp.mem);
    p->diff_dst_to_lowp = Exec(dnnl::reorder(p->diff_dst.mem, p->diff_dst_lowp.mem));
    p->diff_dst_to_lowp.arg(DNNL_ARG_FROM, p->diff_dst.mem).arg(DNNL_ARG_TO, p->diff_dst_lowp.mem);
    p->src_lowp_bytes = (src_ct.get_size() + 63) / 64 * 64;
    p->dst_lowp_bytes = (dst_ct.get_size() + 63) / 64 * 64;
  } else {  // the primitives read the fp32 tensors themselves
    p->src_lowp = p->src;
    p->diff_dst_lowp = p->diff_dst;
  }
  p->w_fwd.init(eng, user_w_md, fwd_pd.weights_desc());
  p->w_bwd.init(eng, user_w_md, bwd_data_pd.weights_desc());
  p->diff_w_user.init(user_w_md, eng);
  p->diff_w_reorder = bwd_w_pd.diff_weights_desc() != user_w_md;
  if (p->diff_w_reorder) p->diff_w_internal.init(bwd_w_pd.diff_weights_desc(), eng);
  const memory& dw = p->diff_w_reorder ? p->diff_w_internal.mem : p->diff_w_user.mem;

  p->fwd = Exec(Fwd(fwd_pd));
  p->fwd.arg(DNNL_ARG_SRC, p->src_lowp.mem)
      .arg(DNNL_ARG_WEIGHTS, p->w_fwd.active())
      .arg(DNNL_ARG_DST, p->dst.mem);
  p->bwd_data = Exec(BwdData(bwd_data_pd));
  p->bwd_data.arg(DNNL_ARG_DIFF_DST, p->diff_dst_lowp.mem)
      .arg(DNNL_ARG_WEIGHTS, p->w_bwd.active())
      .arg(DNNL_ARG_DIFF_SRC, p->diff_src.mem);
  p->bwd_weights = Exec(BwdWeights(bwd_w_pd));
  p->bwd_weights.arg(DNNL_ARG_SRC, p->src_lowp.mem)
      .arg(DNNL_ARG_DIFF_DST, p->diff_dst_lowp.mem)
      .arg(DNNL_ARG_DIFF_WEIGHTS, dw);
  if (has_bias) {
    p->bias.init(bias_md, eng);
    p->diff_bias.init(bias_md, eng);
    p->fwd.arg(DNNL_ARG_BIAS, p->bias.mem);
    p->bwd_weights.arg(DNNL_ARG_DIFF_BIAS, p->diff_bias.mem);
  }
  if (p->diff_w_reorder) {
    p->diff_w_to_user = Exec(dnnl::reorder(dw, p->diff_w_user.mem));
    p->diff_w_to_user.arg(DNNL_ARG_FROM, dw).arg(DNNL_ARG_TO, p->diff_w_user.mem);
  }
  if (relu) {
    // ReLU backward from the forward output (the fused post-op kept no input), in place.
    dnnl::eltwise_forward::primitive_desc hint(
        dnnl::eltwise_forward::desc(prop_kind::forward_training,
                                    algorithm::eltwise_relu_use_dst_for_bwd, dst_md, 0.0f),
        eng);
    p->relu_bwd = Exec(dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(algorithm::eltwise_relu_use_dst_for_bwd, dst_md, dst_md, 0.0f),
        eng, hint)));
    p->relu_bwd.arg(DNNL_ARG_DST, p->dst.mem)
        .arg(DNNL_ARG_DIFF_DST, p->diff_dst.mem)
        .arg(DNNL_ARG_DIFF_SRC, p->diff_dst.mem);
  }
  return p;
}

}  // namespace

size_t ConvPrims::weight_scratch_bytes() const {
  const size_t dw = diff_w_reorder ? diff_w_internal.mem.get_desc().get_size() : 0;
  return std::max({w_fwd.scratch_bytes(), w_bwd.scratch_bytes(), dw});
}

void ConvPrims::forward(dnnl::stream& s, const float* x, const float* w, const float* b, float* y,
                        const Scratch& scratch) {
  src.at(x);
  if (lowp) {
    src_lowp.at(scratch.lowp);
    src_to_lowp.run(s);
  }
  dst.at(y);
  if (has_bias) bias.at(b);
  w_fwd.prepare(s, w, scratch.weights);
  fwd.run(s);
  s.wait();
}

void ConvPrims::backward(dnnl::stream& s, const float* x, const float* w, const float* y, float* dy,
                         float* dx, float* dw, float* db, const Scratch& scratch) {
  src.at(x);
  dst.at(y);
  diff_dst.at(dy);
  if (relu) relu_bwd.run(s);
  if (lowp) {  // the bf16 copies: input (again: layers of one shape share these primitives)
    src_lowp.at(scratch.lowp);
    diff_dst_lowp.at(static_cast<char*>(scratch.lowp) + src_lowp_bytes);
    src_to_lowp.run(s);
    diff_dst_to_lowp.run(s);
  }
  // The weight gradient (through the weight scratch), then the data gradient (whose reordered
  // weights reuse that scratch once the gradient is out of it).
  diff_w_user.at(dw);
  if (diff_w_reorder) diff_w_internal.at(scratch.weights);
  if (has_bias) diff_bias.at(db);
  bwd_weights.run(s);
  if (diff_w_reorder) diff_w_to_user.run(s);
  if (dx != nullptr) {
    diff_src.at(dx);
    w_bwd.prepare(s, w, scratch.weights);
    bwd_data.run(s);
  }
  s.wait();
}

std::unique_ptr<ConvPrims> make_conv(const dnnl::engine& eng, const ConvDesc& d, bool bf16) {
  DP_CHECK(d.kernel >= 1 && d.stride >= 1 && d.out_h() >= 1 && d.out_w() >= 1, "conv: kernel ",
           d.kernel, " stride ", d.stride, " does not fit a ", d.h, "x", d.w, " input");
  const memory::desc user_w({d.cout, d.cin, d.kernel, d.kernel}, dt::f32, tag::oihw);
  return checked("convolution", [&] {
    return build<dnnl::convolution_forward, dnnl::convolution_backward_data,
                 dnnl::convolution_backward_weights>(eng, algorithm::convolution_direct, d.src(),
                                                     d.dst(), user_w, d.bias, d.relu, d.stride,
                                                     d.padding(), bf16);
  });
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
                                                       d.stride, d.pad, bf16);
  });
}

}  // namespace dp::cpu
