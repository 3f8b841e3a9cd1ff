// The CPU backend: oneDNN primitives (convolutions in conv.cpp, ReLU), created once per shape and
// cached, plus plain loops for max-pool, bilinear upsampling, batch norm, concat, residual add,
// dropout, loss, metrics and the optimiser update.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "dp/backend.hpp"
#include "dp/error.hpp"
#include "dp/rng.hpp"
#include "onednn.hpp"

namespace dp {
namespace {

using cpu::algorithm;
using cpu::Bound;
using cpu::checked;
using cpu::dt;
using cpu::Exec;
using cpu::memory;
using cpu::nhwc_md;
using cpu::prop_kind;
using cpu::tag;

struct EltwiseEntry {
  Exec fwd, bwd;
  Bound src, dst, diff_dst, diff_src;
};

auto conv_key(const ConvDesc& d) {
  return std::make_tuple(d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.relu, d.stride, d.padding(),
                         d.bias);
}
auto deconv_key(const DeconvDesc& d) {
  return std::make_tuple(d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.relu, d.stride, d.pad);
}
// One output coordinate of a bilinear x2 upsample: inputs i0, i1 with weights w0, w1.
struct Tap {
  int i0, i1;
  float w0, w1;
};
Tap upsample_tap(int o, int in) {
  const int k = o / 2;
  if (o % 2 == 0) return k == 0 ? Tap{0, 0, 1.0f, 0.0f} : Tap{k - 1, k, 0.25f, 0.75f};
  return k == in - 1 ? Tap{k, k, 1.0f, 0.0f} : Tap{k, k + 1, 0.75f, 0.25f};
}
// The outputs that read input i, with their weights (at most four: 2i-1, 2i, 2i+1, 2i+2).
struct Gather {
  int o;
  float w;
};
constexpr int kGatherTaps = 4;
int upsample_gather(int i, int in, Gather* g) {
  int n = 0;
  for (int o = std::max(0, 2 * i - 1); o <= std::min(2 * in - 1, 2 * i + 2); ++o) {
    const Tap t = upsample_tap(o, in);
    const float w = (t.i0 == i ? t.w0 : 0.0f) + (t.i1 == i ? t.w1 : 0.0f);
    if (w != 0.0f) g[n++] = {o, w};
  }
  return n;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options)
      : eng_(dnnl::engine::kind::cpu, 0),
        stream_(eng_),
        bf16_(options.precision == Precision::kBFloat16),
        conv_algo_(options.conv_algo) {}

  std::string name() const override {
    if (bf16_) return "cpu (bf16 convolutions)";
    switch (conv_algo_) {
      case CpuConvAlgo::kAuto:
        return "cpu (3x3 convolutions: direct or Winograd, timed)";
      case CpuConvAlgo::kWinograd:
        return "cpu (Winograd 3x3 convolutions)";
      case CpuConvAlgo::kDirect:
        break;
    }
    return "cpu";
  }

  void conv_forward(const ConvDesc& d, const float* src, const float* weight, const float* bias,
                    float* dst) override {
    cpu::ConvPrims& p = conv(d);  // first: it may grow the scratch
    p.forward(stream_, src, weight, bias, dst, scratch());
  }

  void conv_backward(const ConvDesc& d, const float* src, const float* weight, const float* dst,
                     float* diff_dst, float* diff_src, float* diff_weight,
                     float* diff_bias) override {
    cpu::ConvPrims& p = conv(d);
    p.backward(stream_, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias, scratch());
  }

  void deconv_forward(const DeconvDesc& d, const float* src, const float* weight, const float* bias,
                      float* dst) override {
    cpu::ConvPrims& p = deconv(d);
    p.forward(stream_, src, weight, bias, dst, scratch());
  }

  void deconv_backward(const DeconvDesc& d, const float* src, const float* weight, const float* dst,
                       float* diff_dst, float* diff_src, float* diff_weight,
                       float* diff_bias) override {
    cpu::ConvPrims& p = deconv(d);
    p.backward(stream_, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias, scratch());
  }

  void relu_forward(int64_t count, const float* src, float* dst) override {
    EltwiseEntry& e = relu(count);
    e.src.at(src);
    e.dst.at(dst);
    e.fwd.run(stream_);
    stream_.wait();
  }

  void relu_backward(int64_t count, const float* dst, const float* diff_dst,
                     float* diff_src) override {
    EltwiseEntry& e = relu(count);
    e.dst.at(dst);
    e.diff_dst.at(diff_dst);
    e.diff_src.at(diff_src);
    e.bwd.run(stream_);
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

  // Bilinear x2 with align_corners=False has fixed weights: output 2k takes 1/4 of input k-1 and
  // 3/4 of input k, output 2k+1 takes 3/4 of k and 1/4 of k+1, clamped at the borders. Plain
  // loops over (row, column) with the channels innermost (oneDNN's generic resampling backward
  // took 3x its forward time here).
  void upsample2x_forward(const Dims& s, const float* src, float* dst) override {
    const int oh = 2 * s.h, ow = 2 * s.w, c = s.c;
    const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / oh;
      const Tap y = upsample_tap(int(r % oh), s.h);
      const float* row0 = src + (n * s.h + y.i0) * int64_t{s.w} * c;
      const float* row1 = src + (n * s.h + y.i1) * int64_t{s.w} * c;
      float* out = dst + r * ow * c;
      for (int ox = 0; ox < ow; ++ox) {
        const Tap x = upsample_tap(ox, s.w);
        const float* a = row0 + int64_t{x.i0} * c;
        const float* b = row0 + int64_t{x.i1} * c;
        const float* d = row1 + int64_t{x.i0} * c;
        const float* e = row1 + int64_t{x.i1} * c;
        float* o = out + int64_t{ox} * c;
#pragma omp simd
        for (int k = 0; k < c; ++k)
          o[k] = y.w0 * (x.w0 * a[k] + x.w1 * b[k]) + y.w1 * (x.w0 * d[k] + x.w1 * e[k]);
      }
    }
  }

  // The transpose, as a gather: input i collects from outputs 2i-1 .. 2i+2 (upsample_gather).
  void upsample2x_backward(const Dims& s, const float* diff_dst, float* diff_src) override {
    const int ow = 2 * s.w, c = s.c;
    const int64_t rows = int64_t{s.n} * s.h;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / s.h;
      Gather gy[kGatherTaps];
      const int ny = upsample_gather(int(r % s.h), s.h, gy);
      for (int ix = 0; ix < s.w; ++ix) {
        Gather gx[kGatherTaps];
        const int nx = upsample_gather(ix, s.w, gx);
        float* dx = diff_src + (r * s.w + ix) * c;
        std::fill(dx, dx + c, 0.0f);
        for (int j = 0; j < ny; ++j) {
          const float* row = diff_dst + (n * 2 * s.h + gy[j].o) * int64_t{ow} * c;
          for (int i = 0; i < nx; ++i) {
            const float w = gy[j].w * gx[i].w;
            const float* dy = row + int64_t{gx[i].o} * c;
#pragma omp simd
            for (int k = 0; k < c; ++k) dx[k] += w * dy[k];
          }
        }
      }
    }
  }

  void batchnorm_stats(const Dims& d, const float* src, double* sums) override {
    const int c = d.c;
    const int64_t pixels = d.pixels();
    std::fill(sums, sums + 2 * c, 0.0);
    for (int64_t p = 0; p < pixels; ++p) {
      const float* x = src + p * c;
#pragma omp simd
      for (int k = 0; k < c; ++k) {
        sums[k] += x[k];
        sums[c + k] += double(x[k]) * x[k];
      }
    }
  }

  void batchnorm_prepare(int channels, bool training, const double* sums, double count, float eps,
                         float momentum, float* running_mean, float* running_var, float* mean,
                         float* invstd) override {
    if (!training) {
      for (int k = 0; k < channels; ++k) {
        mean[k] = running_mean[k];
        invstd[k] = 1.0f / std::sqrt(running_var[k] + eps);
      }
      return;
    }
    std::vector<float>& var = scratch_a_;
    var.resize(size_t(channels));
    batchnorm_moments(sums, channels, count, eps, mean, var.data(), invstd);
    const float unbias = count > 1 ? float(count / (count - 1)) : 1.0f;
    for (int k = 0; k < channels; ++k) {
      running_mean[k] = (1 - momentum) * running_mean[k] + momentum * mean[k];
      running_var[k] = (1 - momentum) * running_var[k] + momentum * var[size_t(k)] * unbias;
    }
  }

  void batchnorm_apply(const Dims& d, const float* src, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, bool relu, float* dst) override {
    const int c = d.c;
    const int64_t pixels = d.pixels();
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pixels; ++p) {
      const float* x = src + p * c;
      float* y = dst + p * c;
#pragma omp simd
      for (int k = 0; k < c; ++k) {
        const float v = gamma[k] * (x[k] - mean[k]) * invstd[k] + beta[k];
        y[k] = relu ? std::fmax(v, 0.0f) : v;
      }
    }
  }

  void batchnorm_backward_stats(const Dims& d, const float* src, const float* dst, bool relu,
                                float* diff_dst, const float* mean, const float* invstd,
                                double* sums, float* diff_gamma, float* diff_beta) override {
    const int c = d.c;
    const int64_t pixels = d.pixels();
    std::fill(sums, sums + 2 * c, 0.0);
    for (int64_t p = 0; p < pixels; ++p) {
      const float* x = src + p * c;
      float* dy = diff_dst + p * c;
      if (relu) {
        const float* y = dst + p * c;
        for (int k = 0; k < c; ++k) dy[k] = y[k] > 0.0f ? dy[k] : 0.0f;
      }
#pragma omp simd
      for (int k = 0; k < c; ++k) {
        sums[k] += dy[k];
        sums[c + k] += double(dy[k]) * (x[k] - mean[k]) * invstd[k];
      }
    }
    for (int k = 0; k < c; ++k) {
      diff_gamma[k] = float(sums[c + k]);
      diff_beta[k] = float(sums[k]);
    }
  }

  void batchnorm_backward_apply(const Dims& d, const float* src, const float* diff_dst,
                                const float* mean, const float* invstd, const float* gamma,
                                const double* sums, double count, bool training, float* diff_src,
                                bool accumulate) override {
    const int c = d.c;
    const int64_t pixels = d.pixels();
    std::vector<float>& mean_dy = scratch_a_;
    std::vector<float>& mean_dy_xhat = scratch_b_;
    mean_dy.resize(size_t(c));
    mean_dy_xhat.resize(size_t(c));
    for (int k = 0; k < c; ++k) {
      mean_dy[size_t(k)] = training ? float(sums[k] / count) : 0.0f;
      mean_dy_xhat[size_t(k)] = training ? float(sums[c + k] / count) : 0.0f;
    }
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pixels; ++p) {
      const float* x = src + p * c;
      const float* dy = diff_dst + p * c;
      float* dx = diff_src + p * c;
#pragma omp simd
      for (int k = 0; k < c; ++k) {
        const float xhat = (x[k] - mean[k]) * invstd[k];
        const float v =
            gamma[k] * invstd[k] * (dy[k] - mean_dy[size_t(k)] - xhat * mean_dy_xhat[size_t(k)]);
        dx[k] = accumulate ? dx[k] + v : v;
      }
    }
  }

  void add_forward(int64_t count, const float* a, const float* b, bool relu, float* dst) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const float v = a[i] + b[i];
      dst[i] = relu ? std::fmax(v, 0.0f) : v;
    }
  }

  void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const float* src,
                         float* mask, float* dst) override {
    const float keep_scale = 1.0f / (1.0f - p);
    for (int n = 0; n < d.n; ++n) {
      Rng rng(seeds[n]);
      for (int k = 0; k < d.c; ++k) mask[n * d.c + k] = rng.uniform() < p ? 0.0f : keep_scale;
    }
    apply_channel_mask(d, mask, src, dst);
  }

  void dropout2d_backward(const Dims& d, const float* mask, const float* diff_dst,
                          float* diff_src) override {
    apply_channel_mask(d, mask, diff_dst, diff_src);
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

  void adamw_update(int64_t count, float* p, const float* g, float* m, float* v, float decay,
                    float b1, float b2, float eps, float step_size, float bc2_sqrt) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  }

  double sum_squares(int64_t count, const float* src) override {
    double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < count; ++i) sum += double(src[i]) * double(src[i]);
    return sum;
  }

  void scale(int64_t count, float alpha, float* dst) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) dst[i] *= alpha;
  }

 private:
  static void apply_channel_mask(const Dims& d, const float* mask, const float* src, float* dst) {
    const int64_t hw = int64_t{d.h} * d.w;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < d.pixels(); ++p) {
      const float* m = mask + (p / hw) * d.c;
#pragma omp simd
      for (int k = 0; k < d.c; ++k) dst[p * d.c + k] = src[p * d.c + k] * m[k];
    }
  }

  static void check_concat(const Dims& a, const Dims& b) {
    DP_CHECK(a.n == b.n && a.h == b.h && a.w == b.w, "concat: shapes differ: [", a.n, ",", a.h, ",",
             a.w, ",", a.c, "] vs [", b.n, ",", b.h, ",", b.w, ",", b.c, "]");
  }

  cpu::ConvPrims& conv(const ConvDesc& d) {
    auto& slot = conv_cache_[conv_key(d)];
    if (!slot) slot = with_scratch(cpu::make_conv(eng_, d, bf16_, conv_algo_));
    return *slot;
  }

  cpu::ConvPrims& deconv(const DeconvDesc& d) {
    auto& slot = deconv_cache_[deconv_key(d)];
    if (!slot) slot = with_scratch(cpu::make_deconv(eng_, d, bf16_));
    return *slot;
  }

  // New primitives (first use of a shape) may need more scratch: it grows then, never in a step
  // that only reuses primitives.
  std::unique_ptr<cpu::ConvPrims> with_scratch(std::unique_ptr<cpu::ConvPrims> p) {
    grow(copies_scratch_, p->copies_bytes());
    grow(weight_scratch_, p->weight_scratch_bytes());
    return p;
  }
  // Scratch holds nothing between ops: the old buffer goes before the new one is made (and
  // zeroed), so growing never holds both.
  static void grow(Buffer& scratch, size_t bytes) {
    if (bytes <= scratch.bytes()) return;
    scratch = Buffer();
    scratch = Buffer(bytes);
  }
  cpu::Scratch scratch() const {
    return {weight_scratch_.data(), copies_scratch_.data()};
  }

  EltwiseEntry& relu(int64_t count) {
    auto& slot = relu_cache_[count];
    if (!slot) slot = checked("ReLU", [&] { return make_relu(count); });
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
    for (Bound* b : {&e->src, &e->dst, &e->diff_dst, &e->diff_src}) b->init(md, eng_);
    e->fwd = Exec(dnnl::eltwise_forward(fwd_pd));
    e->fwd.arg(DNNL_ARG_SRC, e->src.mem).arg(DNNL_ARG_DST, e->dst.mem);
    e->bwd = Exec(dnnl::eltwise_backward(bwd_pd));
    e->bwd.arg(DNNL_ARG_DST, e->dst.mem)
        .arg(DNNL_ARG_DIFF_DST, e->diff_dst.mem)
        .arg(DNNL_ARG_DIFF_SRC, e->diff_src.mem);
    return e;
  }

  dnnl::engine eng_;
  dnnl::stream stream_;
  bool bf16_ = false;  // convolutions on bf16 copies of inputs, gradients and weights
  CpuConvAlgo conv_algo_ = CpuConvAlgo::kDirect;
  Buffer copies_scratch_;  // activation copies in bf16 or a blocked layout, one layer's at a time
  Buffer weight_scratch_;  // weights (or their gradient) in oneDNN's layout, one layer's at a time
  std::vector<float> scratch_a_, scratch_b_;  // per-channel values, sized on first use
  std::map<decltype(conv_key(ConvDesc{})), std::unique_ptr<cpu::ConvPrims>> conv_cache_;
  std::map<decltype(deconv_key(DeconvDesc{})), std::unique_ptr<cpu::ConvPrims>> deconv_cache_;
  std::map<int64_t, std::unique_ptr<EltwiseEntry>> relu_cache_;
};

}  // namespace

void batchnorm_moments(const double* sums, int channels, double count, float eps, float* mean,
                       float* var, float* invstd) {
  for (int k = 0; k < channels; ++k) {
    const double m = sums[k] / count;
    const double v = std::max(0.0, sums[channels + k] / count - m * m);
    mean[k] = float(m);
    var[k] = float(v);
    invstd[k] = float(1.0 / std::sqrt(v + double(eps)));
  }
}

std::string cpu_bf16_support() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  // oneDNN's ISA values are bit sets: each one contains the bits of the ISAs it extends.
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((isa & bf16) == bf16) return {};
  char text[96];
  std::snprintf(text, sizeof text, "this CPU has neither AVX512-BF16 nor AMX (oneDNN ISA 0x%x)",
                isa);
  return text;
}

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& options) {
  if (options.precision == Precision::kBFloat16)
    DP_CHECK(cpu_bf16_support().empty(), "--precision bf16: ", cpu_bf16_support());
  return checked("the CPU engine", [&] { return std::make_unique<CpuBackend>(options); });
}

}  // namespace dp
