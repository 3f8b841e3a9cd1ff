// The CPU backend: oneDNN primitives (convolution, ReLU, resampling), created once per shape and
// cached, plus plain loops for max-pool, concat, loss, metrics and the optimiser update.
#include <dnnl.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "dp/backend.hpp"
#include "dp/error.hpp"

namespace dp {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = memory::format_tag;
using dt = memory::data_type;

memory::desc nhwc_md(const Dims& d) {
  return memory::desc({d.n, d.c, d.h, d.w}, dt::f32, tag::nhwc);
}

// A memory object bound to a caller's pointer on each use (no allocation per call).
struct Bound {
  memory mem;
  memory& at(const void* p) {
    mem.set_data_handle(const_cast<void*>(p));
    return mem;
  }
};

// Weights kept in PyTorch's OIHW layout; a primitive that prefers another layout gets a private
// copy reordered once per call (the reorder primitive and its buffer are built once).
struct WeightsIn {
  Bound user;
  memory internal;
  dnnl::reorder to_internal;
  bool needs_reorder = false;

  void init(const dnnl::engine& eng, const memory::desc& user_md, const memory::desc& want) {
    user.mem = memory(user_md, eng, DNNL_MEMORY_NONE);
    needs_reorder = want != user_md;
    if (needs_reorder) {
      internal = memory(want, eng);
      to_internal = dnnl::reorder(user.mem, internal);
    }
  }
  memory& prepare(dnnl::stream& s, const float* p) {
    memory& u = user.at(p);
    if (!needs_reorder) return u;
    to_internal.execute(s, u, internal);
    return internal;
  }
};

struct ConvEntry {
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::eltwise_backward relu_bwd;
  Bound src, dst, bias, diff_dst, diff_src, diff_bias;
  WeightsIn w_fwd, w_bwd;
  Bound diff_w_user;
  memory diff_w_internal;
  dnnl::reorder diff_w_to_user;
  bool diff_w_reorder = false;
};

struct ResampleEntry {
  dnnl::resampling_forward fwd;
  dnnl::resampling_backward bwd;
  Bound src, dst;
};

struct EltwiseEntry {
  dnnl::eltwise_forward fwd;
  dnnl::eltwise_backward bwd;
  Bound src, dst, diff_dst, diff_src;
};

// The oneDNN CHECK: runs `build` and turns a dnnl::error into a dp::Error naming the primitive.
template <typename F>
auto dnnl_checked(const char* what, const F& build) {
  try {
    return build();
  } catch (const dnnl::error& e) {
    fail("oneDNN: could not create ", what, ": ", e.what(), " (status ", static_cast<int>(e.status),
         ")");
  }
}

auto conv_key(const ConvDesc& d) {
  return std::make_tuple(d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.relu);
}
auto dims_key(const Dims& d) {
  return std::make_tuple(d.n, d.h, d.w, d.c);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {}

  std::string name() const override { return "cpu"; }

  void conv_forward(const ConvDesc& d, const float* src, const float* weight, const float* bias,
                    float* dst) override {
    ConvEntry& e = conv(d);
    memory& w = e.w_fwd.prepare(stream_, weight);
    e.fwd.execute(stream_, {{DNNL_ARG_SRC, e.src.at(src)},
                            {DNNL_ARG_WEIGHTS, w},
                            {DNNL_ARG_BIAS, e.bias.at(bias)},
                            {DNNL_ARG_DST, e.dst.at(dst)}});
    stream_.wait();
  }

  void conv_backward(const ConvDesc& d, const float* src, const float* weight, const float* dst,
                     float* diff_dst, float* diff_src, float* diff_weight,
                     float* diff_bias) override {
    ConvEntry& e = conv(d);
    memory& dd = e.diff_dst.at(diff_dst);
    if (d.relu) {
      e.relu_bwd.execute(
          stream_,
          {{DNNL_ARG_DST, e.dst.at(dst)}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dd}});
    }
    memory& dw = e.diff_w_reorder ? e.diff_w_internal : e.diff_w_user.at(diff_weight);
    e.bwd_weights.execute(stream_, {{DNNL_ARG_SRC, e.src.at(src)},
                                    {DNNL_ARG_DIFF_DST, dd},
                                    {DNNL_ARG_DIFF_WEIGHTS, dw},
                                    {DNNL_ARG_DIFF_BIAS, e.diff_bias.at(diff_bias)}});
    if (e.diff_w_reorder) e.diff_w_to_user.execute(stream_, dw, e.diff_w_user.at(diff_weight));
    if (diff_src != nullptr) {
      memory& w = e.w_bwd.prepare(stream_, weight);
      e.bwd_data.execute(stream_, {{DNNL_ARG_DIFF_DST, dd},
                                   {DNNL_ARG_WEIGHTS, w},
                                   {DNNL_ARG_DIFF_SRC, e.diff_src.at(diff_src)}});
    }
    stream_.wait();
  }

  void relu_forward(int64_t count, const float* src, float* dst) override {
    EltwiseEntry& e = relu(count);
    e.fwd.execute(stream_, {{DNNL_ARG_SRC, e.src.at(src)}, {DNNL_ARG_DST, e.dst.at(dst)}});
    stream_.wait();
  }

  void relu_backward(int64_t count, const float* dst, const float* diff_dst,
                     float* diff_src) override {
    EltwiseEntry& e = relu(count);
    e.bwd.execute(stream_, {{DNNL_ARG_DST, e.dst.at(dst)},
                            {DNNL_ARG_DIFF_DST, e.diff_dst.at(diff_dst)},
                            {DNNL_ARG_DIFF_SRC, e.diff_src.at(diff_src)}});
    stream_.wait();
  }

  void maxpool2x2_forward(const Dims& s, const float* src, float* dst, uint8_t* argmax) override {
    DP_CHECK(s.h % 2 == 0 && s.w % 2 == 0, "maxpool2x2: input ", s.h, "x", s.w, " is not even");
    const int oh = s.h / 2, ow = s.w / 2, c = s.c;
    const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / oh, y = r % oh;
      for (int x = 0; x < ow; ++x) {
        const float* p00 = src + ((n * s.h + 2 * y) * s.w + 2 * x) * c;
        const float* p01 = p00 + c;
        const float* p10 = p00 + int64_t{s.w} * c;
        const float* p11 = p10 + c;
        float* o = dst + ((n * oh + y) * ow + x) * c;
        uint8_t* a = argmax + ((n * oh + y) * ow + x) * c;
        for (int k = 0; k < c; ++k) {
          // First maximum in scan order wins, as in PyTorch.
          float best = p00[k];
          uint8_t which = 0;
          if (p01[k] > best) best = p01[k], which = 1;
          if (p10[k] > best) best = p10[k], which = 2;
          if (p11[k] > best) best = p11[k], which = 3;
          o[k] = best;
          a[k] = which;
        }
      }
    }
  }

  void maxpool2x2_backward(const Dims& s, const uint8_t* argmax, const float* diff_dst,
                           float* diff_src, bool accumulate) override {
    const int oh = s.h / 2, ow = s.w / 2, c = s.c;
    const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / oh, y = r % oh;
      for (int x = 0; x < ow; ++x) {
        float* q[4];
        q[0] = diff_src + ((n * s.h + 2 * y) * s.w + 2 * x) * c;
        q[1] = q[0] + c;
        q[2] = q[0] + int64_t{s.w} * c;
        q[3] = q[2] + c;
        const int64_t o = ((n * oh + y) * ow + x) * c;
        for (int k = 0; k < c; ++k) {
          const uint8_t which = argmax[o + k];
          const float g = diff_dst[o + k];
          for (int j = 0; j < 4; ++j) {
            const float v = j == which ? g : 0.0f;
            q[j][k] = accumulate ? q[j][k] + v : v;
          }
        }
      }
    }
  }

  void upsample2x_forward(const Dims& s, const float* src, float* dst) override {
    ResampleEntry& e = resample(s);
    e.fwd.execute(stream_, {{DNNL_ARG_SRC, e.src.at(src)}, {DNNL_ARG_DST, e.dst.at(dst)}});
    stream_.wait();
  }

  void upsample2x_backward(const Dims& s, const float* diff_dst, float* diff_src) override {
    ResampleEntry& e = resample(s);
    e.bwd.execute(stream_, {{DNNL_ARG_DIFF_DST, e.dst.at(diff_dst)},
                            {DNNL_ARG_DIFF_SRC, e.src.at(diff_src)}});
    stream_.wait();
  }

  void concat_forward(const Dims& a, const float* pa, const Dims& b, const float* pb,
                      float* dst) override {
    check_concat(a, b);
    const int64_t pixels = a.pixels();
    const int c = a.c + b.c;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pixels; ++p) {
      std::memcpy(dst + p * c, pa + p * a.c, sizeof(float) * a.c);
      std::memcpy(dst + p * c + a.c, pb + p * b.c, sizeof(float) * b.c);
    }
  }

  void concat_backward(const Dims& a, const Dims& b, const float* diff_dst, float* diff_a,
                       float* diff_b) override {
    check_concat(a, b);
    const int64_t pixels = a.pixels();
    const int c = a.c + b.c;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pixels; ++p) {
      std::memcpy(diff_a + p * a.c, diff_dst + p * c, sizeof(float) * a.c);
      std::memcpy(diff_b + p * b.c, diff_dst + p * c + a.c, sizeof(float) * b.c);
    }
  }

  double bce_with_logits(int64_t count, const float* x, const float* y, float pos_weight,
                         float grad_scale, float* dx) override {
    double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      // loss = (1-y) x + (1 + (pw-1) y) * softplus(-x); softplus(-x) = log1p(exp(-|x|)) + max(-x,
      // 0)
      const float w = 1.0f + (pos_weight - 1.0f) * y[i];
      const float softplus = std::log1p(std::exp(-std::fabs(x[i]))) + std::fmax(-x[i], 0.0f);
      sum += static_cast<double>((1.0f - y[i]) * x[i] + w * softplus);
      const float sig_neg = 1.0f / (1.0f + std::exp(x[i]));  // sigmoid(-x)
      dx[i] = ((1.0f - y[i]) - w * sig_neg) * grad_scale;
    }
    return sum;
  }

  void confusion_counts(int64_t count, const float* x, const float* y, float threshold,
                        int64_t* counts) override {
    int64_t tp = 0, fp = 0, fn = 0;
#pragma omp parallel for reduction(+ : tp, fp, fn) schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const bool pred = x[i] > threshold, truth = y[i] > 0.5f;
      tp += pred && truth;
      fp += pred && !truth;
      fn += !pred && truth;
    }
    counts[0] += tp;
    counts[1] += fp;
    counts[2] += fn;
  }

  void accumulate(int64_t count, const float* src, float* dst) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
  }

  void copy(int64_t count, const float* src, float* dst) override {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(count));
  }

  void sgd_update(int64_t count, float* p, const float* grad, float* m, float lr, float momentum,
                  float weight_decay, bool nesterov) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const float g = grad[i] + weight_decay * p[i];
      const float buf = momentum * m[i] + g;
      m[i] = buf;
      p[i] -= lr * (nesterov ? g + momentum * buf : buf);
    }
  }

 private:
  static void check_concat(const Dims& a, const Dims& b) {
    DP_CHECK(a.n == b.n && a.h == b.h && a.w == b.w, "concat: shapes differ: [", a.n, ",", a.h, ",",
             a.w, ",", a.c, "] vs [", b.n, ",", b.h, ",", b.w, ",", b.c, "]");
  }

  ConvEntry& conv(const ConvDesc& d) {
    auto& slot = conv_cache_[conv_key(d)];
    if (slot) return *slot;
    DP_CHECK(d.kernel == 1 || d.kernel == 3, "conv: kernel ", d.kernel, " not supported (1 or 3)");
    slot = dnnl_checked("convolution", [&] { return make_conv(d); });
    return *slot;
  }

  std::unique_ptr<ConvEntry> make_conv(const ConvDesc& d) {
    auto e = std::make_unique<ConvEntry>();
    const memory::dim pad = d.kernel / 2;
    const memory::desc src_md = nhwc_md(d.src()), dst_md = nhwc_md(d.dst());
    const memory::desc user_w_md({d.cout, d.cin, d.kernel, d.kernel}, dt::f32, tag::oihw);
    const memory::desc any_w_md({d.cout, d.cin, d.kernel, d.kernel}, dt::f32, tag::any);
    const memory::desc bias_md({d.cout}, dt::f32, tag::x);
    const memory::dims strides{1, 1}, padding{pad, pad};

    dnnl::primitive_attr attr;
    if (d.relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    dnnl::convolution_forward::primitive_desc fwd_pd(
        dnnl::convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                        src_md, any_w_md, bias_md, dst_md, strides, padding,
                                        padding),
        attr, eng_);
    dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
        dnnl::convolution_backward_data::desc(algorithm::convolution_direct, src_md, any_w_md,
                                              dst_md, strides, padding, padding),
        eng_, fwd_pd);
    dnnl::convolution_backward_weights::primitive_desc bwd_w_pd(
        dnnl::convolution_backward_weights::desc(algorithm::convolution_direct, src_md, any_w_md,
                                                 bias_md, dst_md, strides, padding, padding),
        eng_, fwd_pd);
    // One layout end to end: the activations must stay NHWC, never reordered.
    DP_CHECK(fwd_pd.src_desc() == src_md && fwd_pd.dst_desc() == dst_md &&
                 bwd_data_pd.diff_src_desc() == src_md && bwd_w_pd.diff_dst_desc() == dst_md,
             "oneDNN chose a non-NHWC activation layout for conv ", d.cin, "->", d.cout);
    e->fwd = dnnl::convolution_forward(fwd_pd);
    e->bwd_data = dnnl::convolution_backward_data(bwd_data_pd);
    e->bwd_weights = dnnl::convolution_backward_weights(bwd_w_pd);
    e->src.mem = memory(src_md, eng_, DNNL_MEMORY_NONE);
    e->dst.mem = memory(dst_md, eng_, DNNL_MEMORY_NONE);
    e->diff_src.mem = memory(src_md, eng_, DNNL_MEMORY_NONE);
    e->diff_dst.mem = memory(dst_md, eng_, DNNL_MEMORY_NONE);
    e->bias.mem = memory(bias_md, eng_, DNNL_MEMORY_NONE);
    e->diff_bias.mem = memory(bias_md, eng_, DNNL_MEMORY_NONE);
    e->w_fwd.init(eng_, user_w_md, fwd_pd.weights_desc());
    e->w_bwd.init(eng_, user_w_md, bwd_data_pd.weights_desc());
    e->diff_w_user.mem = memory(user_w_md, eng_, DNNL_MEMORY_NONE);
    e->diff_w_reorder = bwd_w_pd.diff_weights_desc() != user_w_md;
    if (e->diff_w_reorder) {
      e->diff_w_internal = memory(bwd_w_pd.diff_weights_desc(), eng_);
      e->diff_w_to_user = dnnl::reorder(e->diff_w_internal, e->diff_w_user.mem);
    }
    if (d.relu) {
      // ReLU backward from the forward output (the fused post-op kept no input).
      dnnl::eltwise_forward::primitive_desc hint(
          dnnl::eltwise_forward::desc(prop_kind::forward_training,
                                      algorithm::eltwise_relu_use_dst_for_bwd, dst_md, 0.0f),
          eng_);
      e->relu_bwd = dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
          dnnl::eltwise_backward::desc(algorithm::eltwise_relu_use_dst_for_bwd, dst_md, dst_md,
                                       0.0f),
          eng_, hint));
    }
    return e;
  }

  EltwiseEntry& relu(int64_t count) {
    auto& slot = relu_cache_[count];
    if (!slot) slot = dnnl_checked("ReLU", [&] { return make_relu(count); });
    return *slot;
  }

  std::unique_ptr<EltwiseEntry> make_relu(int64_t count) {
    auto e = std::make_unique<EltwiseEntry>();
    const memory::desc md({count}, dt::f32, tag::x);
    dnnl::eltwise_forward::primitive_desc fwd_pd(
        dnnl::eltwise_forward::desc(prop_kind::forward_training,
                                    algorithm::eltwise_relu_use_dst_for_bwd, md, 0.0f),
        eng_);
    dnnl::eltwise_backward::primitive_desc bwd_pd(
        dnnl::eltwise_backward::desc(algorithm::eltwise_relu_use_dst_for_bwd, md, md, 0.0f), eng_,
        fwd_pd);
    e->fwd = dnnl::eltwise_forward(fwd_pd);
    e->bwd = dnnl::eltwise_backward(bwd_pd);
    for (Bound* b : {&e->src, &e->dst, &e->diff_dst, &e->diff_src})
      b->mem = memory(md, eng_, DNNL_MEMORY_NONE);
    return e;
  }

  ResampleEntry& resample(const Dims& s) {
    auto& slot = resample_cache_[dims_key(s)];
    if (!slot) slot = dnnl_checked("bilinear resampling", [&] { return make_resample(s); });
    return *slot;
  }

  std::unique_ptr<ResampleEntry> make_resample(const Dims& s) {
    auto e = std::make_unique<ResampleEntry>();
    const memory::desc src_md = nhwc_md(s), dst_md = nhwc_md({s.n, 2 * s.h, 2 * s.w, s.c});
    // oneDNN's linear resampling uses half-pixel centres and clamps at the border, which is
    // PyTorch's bilinear interpolation with align_corners=False (checked by the tests).
    dnnl::resampling_forward::primitive_desc fwd_pd(
        dnnl::resampling_forward::desc(prop_kind::forward_training, algorithm::resampling_linear,
                                       src_md, dst_md),
        eng_);
    dnnl::resampling_backward::primitive_desc bwd_pd(
        dnnl::resampling_backward::desc(algorithm::resampling_linear, src_md, dst_md), eng_,
        fwd_pd);
    e->fwd = dnnl::resampling_forward(fwd_pd);
    e->bwd = dnnl::resampling_backward(bwd_pd);
    e->src.mem = memory(src_md, eng_, DNNL_MEMORY_NONE);
    e->dst.mem = memory(dst_md, eng_, DNNL_MEMORY_NONE);
    return e;
  }

  dnnl::engine eng_;
  dnnl::stream stream_;
  std::map<decltype(conv_key(ConvDesc{})), std::unique_ptr<ConvEntry>> conv_cache_;
  std::map<decltype(dims_key(Dims{})), std::unique_ptr<ResampleEntry>> resample_cache_;
  std::map<int64_t, std::unique_ptr<EltwiseEntry>> relu_cache_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return dnnl_checked("the CPU engine", [] { return std::make_unique<CpuBackend>(); });
}

}  // namespace dp
