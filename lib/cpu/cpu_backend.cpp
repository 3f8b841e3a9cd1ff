// The CPU backend: oneDNN convolutions (conv.cpp), created once per shape and cached, plus plain
// loops for ReLU, max-pool, bilinear upsampling, batch norm, concat, residual add, dropout, loss,
// metrics and the optimiser update, over fp32 or bf16 activations.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "dp/backend.hpp"
#include "dp/bf16.hpp"
#include "dp/error.hpp"
#include "dp/rng.hpp"
#include "onednn.hpp"

namespace dp {
namespace {

using cpu::checked;

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

// The element-wise and data-movement ops as loops over T, the activation storage type (float or
// bf16): each element is widened to fp32, computed in fp32 and stored back as T.
template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}

template <typename T>
void maxpool_forward(const Dims& s, const T* src, T* dst, uint8_t* argmax) {
  const int oh = s.h / 2, ow = s.w / 2, c = s.c;
  const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r / oh, y = r % oh;
    for (int x = 0; x < ow; ++x) {
      const T* p00 = src + ((n * s.h + 2 * y) * s.w + 2 * x) * c;
      const T* p01 = p00 + c;
      const T* p10 = p00 + int64_t{s.w} * c;
      const T* p11 = p10 + c;
      T* o = dst + ((n * oh + y) * ow + x) * c;
      uint8_t* a = argmax + ((n * oh + y) * ow + x) * c;
      for (int k = 0; k < c; ++k) {
        // First maximum in scan order wins, as in PyTorch. (The maximum is one of the inputs, so
        // storing it back as T is exact.)
        float best = to_float(p00[k]);
        uint8_t which = 0;
        if (const float v = to_float(p01[k]); v > best) best = v, which = 1;
        if (const float v = to_float(p10[k]); v > best) best = v, which = 2;
        if (const float v = to_float(p11[k]); v > best) best = v, which = 3;
        o[k] = from_float<T>(best);
        a[k] = which;
      }
    }
  }
}

template <typename T>
void maxpool_backward(const Dims& s, const uint8_t* argmax, const T* diff_dst, T* diff_src,
                      bool accumulate) {
  const int oh = s.h / 2, ow = s.w / 2, c = s.c;
  const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r / oh, y = r % oh;
    for (int x = 0; x < ow; ++x) {
      T* q[4];
      q[0] = diff_src + ((n * s.h + 2 * y) * s.w + 2 * x) * c;
      q[1] = q[0] + c;
      q[2] = q[0] + int64_t{s.w} * c;
      q[3] = q[2] + c;
      const int64_t o = ((n * oh + y) * ow + x) * c;
      for (int k = 0; k < c; ++k) {
        const uint8_t which = argmax[o + k];
        const float g = to_float(diff_dst[o + k]);
        for (int j = 0; j < 4; ++j) {
          const float v = j == which ? g : 0.0f;
          q[j][k] = from_float<T>(accumulate ? to_float(q[j][k]) + v : v);
        }
      }
    }
  }
}

// Bilinear x2 with align_corners=False has fixed weights: output 2k takes 1/4 of input k-1 and
// 3/4 of input k, output 2k+1 takes 3/4 of k and 1/4 of k+1, clamped at the borders. Plain loops
// over (row, column) with the channels innermost (oneDNN's generic resampling backward took 3x
// its forward time here).
template <typename T>
void upsample_forward(const Dims& s, const T* src, T* dst) {
  const int oh = 2 * s.h, ow = 2 * s.w, c = s.c;
  const int64_t rows = int64_t{s.n} * oh;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r / oh;
    const Tap y = upsample_tap(int(r % oh), s.h);
    const T* row0 = src + (n * s.h + y.i0) * int64_t{s.w} * c;
    const T* row1 = src + (n * s.h + y.i1) * int64_t{s.w} * c;
    T* out = dst + r * ow * c;
    for (int ox = 0; ox < ow; ++ox) {
      const Tap x = upsample_tap(ox, s.w);
      const T* a = row0 + int64_t{x.i0} * c;
      const T* b = row0 + int64_t{x.i1} * c;
      const T* d = row1 + int64_t{x.i0} * c;
      const T* e = row1 + int64_t{x.i1} * c;
      T* o = out + int64_t{ox} * c;
#pragma omp simd
      for (int k = 0; k < c; ++k)
        o[k] = from_float<T>(y.w0 * (x.w0 * to_float(a[k]) + x.w1 * to_float(b[k])) +
                             y.w1 * (x.w0 * to_float(d[k]) + x.w1 * to_float(e[k])));
    }
  }
}

// The transpose, as a gather: input i collects from outputs 2i-1 .. 2i+2 (upsample_gather), in
// fp32 (one pixel's channels in a per-thread row, kept between calls), stored once.
template <typename T>
void upsample_backward(const Dims& s, const T* diff_dst, T* diff_src) {
  const int ow = 2 * s.w, c = s.c;
  const int64_t rows = int64_t{s.n} * s.h;
#pragma omp parallel
  {
    thread_local std::vector<float> row_sum;
    row_sum.resize(static_cast<size_t>(c));
    float* acc = row_sum.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / s.h;
      Gather gy[kGatherTaps];
      const int ny = upsample_gather(int(r % s.h), s.h, gy);
      for (int ix = 0; ix < s.w; ++ix) {
        Gather gx[kGatherTaps];
        const int nx = upsample_gather(ix, s.w, gx);
        std::fill(acc, acc + c, 0.0f);
        for (int j = 0; j < ny; ++j) {
          const T* row = diff_dst + (n * 2 * s.h + gy[j].o) * int64_t{ow} * c;
          for (int i = 0; i < nx; ++i) {
            const float w = gy[j].w * gx[i].w;
            const T* dy = row + int64_t{gx[i].o} * c;
#pragma omp simd
            for (int k = 0; k < c; ++k) acc[k] += w * to_float(dy[k]);
          }
        }
        T* dx = diff_src + (r * s.w + ix) * c;
#pragma omp simd
        for (int k = 0; k < c; ++k) dx[k] = from_float<T>(acc[k]);
      }
    }
  }
}

template <typename T>
void batchnorm_stats_loop(const Dims& d, const T* src, double* sums) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
  std::fill(sums, sums + 2 * c, 0.0);
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const double v = to_float(x[k]);
      sums[k] += v;
      sums[c + k] += v * v;
    }
  }
}

template <typename T>
void batchnorm_apply_loop(const Dims& d, const T* src, const float* mean, const float* invstd,
                          const float* gamma, const float* beta, bool relu, T* dst) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
    T* y = dst + p * c;
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const float v = gamma[k] * (to_float(x[k]) - mean[k]) * invstd[k] + beta[k];
      y[k] = from_float<T>(relu ? std::fmax(v, 0.0f) : v);
    }
  }
}

template <typename T>
void batchnorm_backward_stats_loop(const Dims& d, const T* src, const T* dst, bool relu,
                                   T* diff_dst, const float* mean, const float* invstd,
                                   double* sums) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
  std::fill(sums, sums + 2 * c, 0.0);
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
    T* dy = diff_dst + p * c;
    if (relu) {
      const T* y = dst + p * c;
      for (int k = 0; k < c; ++k)
        if (!(to_float(y[k]) > 0.0f)) dy[k] = from_float<T>(0.0f);
    }
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const double g = to_float(dy[k]);
      sums[k] += g;
      sums[c + k] += g * (to_float(x[k]) - mean[k]) * invstd[k];
    }
  }
}

template <typename T>
void batchnorm_backward_apply_loop(const Dims& d, const T* src, const T* diff_dst,
                                   const float* mean, const float* invstd, const float* gamma,
                                   const float* mean_dy, const float* mean_dy_xhat, T* diff_src,
                                   bool accumulate) {
  const int c = d.c;
  const int64_t pixels = d.pixels();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pixels; ++p) {
    const T* x = src + p * c;
    const T* dy = diff_dst + p * c;
    T* dx = diff_src + p * c;
#pragma omp simd
    for (int k = 0; k < c; ++k) {
      const float xhat = (to_float(x[k]) - mean[k]) * invstd[k];
      const float v =
          gamma[k] * invstd[k] * (to_float(dy[k]) - mean_dy[k] - xhat * mean_dy_xhat[k]);
      dx[k] = from_float<T>(accumulate ? to_float(dx[k]) + v : v);
    }
  }
}

template <typename T>
void add_loop(int64_t count, const T* a, const T* b, bool relu, T* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float v = to_float(a[i]) + to_float(b[i]);
    dst[i] = from_float<T>(relu ? std::fmax(v, 0.0f) : v);
  }
}

template <typename T>
void accumulate_loop(int64_t count, const T* src, T* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

template <typename T>
void channel_mask_loop(const Dims& d, const float* mask, const T* src, T* dst) {
  const int64_t hw = int64_t{d.h} * d.w;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < d.pixels(); ++p) {
    const float* m = mask + (p / hw) * d.c;
#pragma omp simd
    for (int k = 0; k < d.c; ++k)
      dst[p * d.c + k] = from_float<T>(to_float(src[p * d.c + k]) * m[k]);
  }
}

template <typename T>
void relu_forward_loop(int64_t count, const T* src, T* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = from_float<T>(std::fmax(to_float(src[i]), 0.0f));
}

template <typename T>
void relu_backward_loop(int64_t count, const T* dst, const T* diff_dst, T* diff_src) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i)
    diff_src[i] = to_float(dst[i]) > 0.0f ? diff_dst[i] : from_float<T>(0.0f);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options)
      : eng_(dnnl::engine::kind::cpu, 0),
        stream_(eng_),
        bf16_(options.precision == Precision::kBFloat16),
        conv_algo_(options.conv_algo) {}

  std::string name() const override {
    if (bf16_) return "cpu (bf16 activations and convolutions)";
    const std::string k = cpu_conv_kernels(conv_algo_);
    return k.empty() ? "cpu" : "cpu (" + k + ")";
  }

  std::string kernel_choices() const override {
    if (conv_algo_ == CpuConvAlgo::kDirect || bf16_) return {};
    // Per pass: [direct NHWC, direct on blocked copies, Winograd, GEMMs, Winograd on GEMMs, not
    // yet run].
    int counts[3][6] = {};
    for (const auto& entry : conv_cache_) {
      const cpu::ConvPrims& p = *entry.second;
      for (int k = 0; k < 3; ++k) {
        const cpu::PassAlgo a = p.algo[k];
        ++counts[k][a == cpu::PassAlgo::kDirect           ? 0
                    : a == cpu::PassAlgo::kGemm           ? 3
                    : a == cpu::PassAlgo::kGemmWinograd   ? 4
                    : a == cpu::PassAlgo::kTimeOnFirstUse ? 5
                    : p.blocked->winograd                 ? 2
                                                          : 1];
      }
    }
    static const char* const kPasses[3] = {"forward", "backward data", "backward weights"};
    static const char* const kKinds[6] = {"direct", "blocked",           "Winograd",
                                          "GEMM",   "Winograd on GEMMs", "not yet run"};
    std::string s;
    for (int k :
         {cpu::BlockedPrims::kFwd, cpu::BlockedPrims::kBwdData, cpu::BlockedPrims::kBwdWeights}) {
      s += str_cat(s.empty() ? "" : "; ", kPasses[k], ":");
      for (int kind = 0; kind < 6; ++kind)
        if (counts[k][kind] > 0) s += str_cat(" ", counts[k][kind], " ", kKinds[kind]);
    }
    return s;
  }

  DType activation_type() const override { return bf16_ ? DType::kBFloat16 : DType::kFloat32; }

  void to_activation(int64_t count, const float* src, void* dst) override {
    visit([&](auto t) {
      using T = decltype(t);
      T* out = as<T>(dst);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < count; ++i) out[i] = from_float<T>(src[i]);
    });
  }

  void from_activation(int64_t count, const void* src, float* dst) override {
    visit([&](auto t) {
      const auto* in = as<decltype(t)>(src);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < count; ++i) dst[i] = to_float(in[i]);
    });
  }

  void conv_forward(const ConvDesc& d, const void* src, const float* weight, const float* bias,
                    void* dst) override {
    cpu::ConvPrims& p = conv(d);  // first: it may grow the scratch
    p.forward(stream_, src, weight, bias, dst, scratch());
  }

  void conv_backward(const ConvDesc& d, const void* src, const float* weight, const void* dst,
                     void* diff_dst, void* diff_src, float* diff_weight,
                     float* diff_bias) override {
    cpu::ConvPrims& p = conv(d);
    p.backward(stream_, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias, scratch());
  }

  void deconv_forward(const DeconvDesc& d, const void* src, const float* weight, const float* bias,
                      void* dst) override {
    cpu::ConvPrims& p = deconv(d);
    p.forward(stream_, src, weight, bias, dst, scratch());
  }

  void deconv_backward(const DeconvDesc& d, const void* src, const float* weight, const void* dst,
                       void* diff_dst, void* diff_src, float* diff_weight,
                       float* diff_bias) override {
    cpu::ConvPrims& p = deconv(d);
    p.backward(stream_, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias, scratch());
  }

  void relu_forward(int64_t count, const void* src, void* dst) override {
    visit([&](auto t) { relu_forward_loop(count, as<decltype(t)>(src), as<decltype(t)>(dst)); });
  }

  void relu_backward(int64_t count, const void* dst, const void* diff_dst,
                     void* diff_src) override {
    visit([&](auto t) {
      using T = decltype(t);
      relu_backward_loop(count, as<T>(dst), as<T>(diff_dst), as<T>(diff_src));
    });
  }

  void maxpool2x2_forward(const Dims& s, const void* src, void* dst, uint8_t* argmax) override {
    DP_CHECK(s.h % 2 == 0 && s.w % 2 == 0, "maxpool2x2: input ", s.h, "x", s.w, " is not even");
    visit([&](auto t) { maxpool_forward(s, as<decltype(t)>(src), as<decltype(t)>(dst), argmax); });
  }

  void maxpool2x2_backward(const Dims& s, const uint8_t* argmax, const void* diff_dst,
                           void* diff_src, bool accumulate) override {
    visit([&](auto t) {
      maxpool_backward(s, argmax, as<decltype(t)>(diff_dst), as<decltype(t)>(diff_src), accumulate);
    });
  }

  void upsample2x_forward(const Dims& s, const void* src, void* dst) override {
    visit([&](auto t) { upsample_forward(s, as<decltype(t)>(src), as<decltype(t)>(dst)); });
  }

  void upsample2x_backward(const Dims& s, const void* diff_dst, void* diff_src) override {
    visit([&](auto t) {
      upsample_backward(s, as<decltype(t)>(diff_dst), as<decltype(t)>(diff_src));
    });
  }

  void batchnorm_stats(const Dims& d, const void* src, double* sums) override {
    visit([&](auto t) { batchnorm_stats_loop(d, as<decltype(t)>(src), sums); });
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

  void batchnorm_apply(const Dims& d, const void* src, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, bool relu, void* dst) override {
    visit([&](auto t) {
      using T = decltype(t);
      batchnorm_apply_loop(d, as<T>(src), mean, invstd, gamma, beta, relu, as<T>(dst));
    });
  }

  void batchnorm_backward_stats(const Dims& d, const void* src, const void* dst, bool relu,
                                void* diff_dst, const float* mean, const float* invstd,
                                double* sums, float* diff_gamma, float* diff_beta) override {
    visit([&](auto t) {
      using T = decltype(t);
      batchnorm_backward_stats_loop(d, as<T>(src), as<T>(dst), relu, as<T>(diff_dst), mean, invstd,
                                    sums);
    });
    for (int k = 0; k < d.c; ++k) {
      diff_gamma[k] = float(sums[d.c + k]);
      diff_beta[k] = float(sums[k]);
    }
  }

  void batchnorm_backward_apply(const Dims& d, const void* src, const void* diff_dst,
                                const float* mean, const float* invstd, const float* gamma,
                                const double* sums, double count, bool training, void* diff_src,
                                bool accumulate) override {
    const int c = d.c;
    std::vector<float>& mean_dy = scratch_a_;
    std::vector<float>& mean_dy_xhat = scratch_b_;
    mean_dy.resize(size_t(c));
    mean_dy_xhat.resize(size_t(c));
    for (int k = 0; k < c; ++k) {
      mean_dy[size_t(k)] = training ? float(sums[k] / count) : 0.0f;
      mean_dy_xhat[size_t(k)] = training ? float(sums[c + k] / count) : 0.0f;
    }
    visit([&](auto t) {
      using T = decltype(t);
      batchnorm_backward_apply_loop(d, as<T>(src), as<T>(diff_dst), mean, invstd, gamma,
                                    mean_dy.data(), mean_dy_xhat.data(), as<T>(diff_src),
                                    accumulate);
    });
  }

  void add_forward(int64_t count, const void* a, const void* b, bool relu, void* dst) override {
    visit([&](auto t) {
      using T = decltype(t);
      add_loop(count, as<T>(a), as<T>(b), relu, as<T>(dst));
    });
  }

  void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const void* src,
                         float* mask, void* dst) override {
    const float keep_scale = 1.0f / (1.0f - p);
    for (int n = 0; n < d.n; ++n) {
      Rng rng(seeds[n]);
      for (int k = 0; k < d.c; ++k) mask[n * d.c + k] = rng.uniform() < p ? 0.0f : keep_scale;
    }
    dropout2d_backward(d, mask, src, dst);
  }

  // The same channel scaling as the forward.
  void dropout2d_backward(const Dims& d, const float* mask, const void* diff_dst,
                          void* diff_src) override {
    visit([&](auto t) {
      channel_mask_loop(d, mask, as<decltype(t)>(diff_dst), as<decltype(t)>(diff_src));
    });
  }

  void concat_forward(const Dims& a, const void* pa, const Dims& b, const void* pb,
                      void* dst) override {
    check_concat(a, b);
    const size_t e = elem_bytes(), ra = e * size_t(a.c), rb = e * size_t(b.c);
    const auto* x = static_cast<const char*>(pa);
    const auto* y = static_cast<const char*>(pb);
    auto* out = static_cast<char*>(dst);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < a.pixels(); ++p) {
      std::memcpy(out + size_t(p) * (ra + rb), x + size_t(p) * ra, ra);
      std::memcpy(out + size_t(p) * (ra + rb) + ra, y + size_t(p) * rb, rb);
    }
  }

  void concat_backward(const Dims& a, const Dims& b, const void* diff_dst, void* diff_a,
                       void* diff_b) override {
    check_concat(a, b);
    const size_t e = elem_bytes(), ra = e * size_t(a.c), rb = e * size_t(b.c);
    const auto* in = static_cast<const char*>(diff_dst);
    auto* x = static_cast<char*>(diff_a);
    auto* y = static_cast<char*>(diff_b);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < a.pixels(); ++p) {
      std::memcpy(x + size_t(p) * ra, in + size_t(p) * (ra + rb), ra);
      std::memcpy(y + size_t(p) * rb, in + size_t(p) * (ra + rb) + ra, rb);
    }
  }

  void accumulate_activations(int64_t count, const void* src, void* dst) override {
    visit([&](auto t) { accumulate_loop(count, as<decltype(t)>(src), as<decltype(t)>(dst)); });
  }

  void copy_activations(int64_t count, const void* src, void* dst) override {
    std::memcpy(dst, src, elem_bytes() * static_cast<size_t>(count));
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

  double focal_with_logits(int64_t count, const float* x, const float* y, float alpha, float gamma,
                           float grad_scale, float* dx) override {
    double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      // z = +x for a crack pixel, -x for background: p_t = sigmoid(z), BCE = softplus(-z).
      const bool crack = y[i] > 0.5f;
      const float z = crack ? x[i] : -x[i];
      const float a = alpha < 0.0f ? 1.0f : crack ? alpha : 1.0f - alpha;
      const float ce = std::log1p(std::exp(-std::fabs(z))) + std::fmax(-z, 0.0f);
      const float q = 1.0f / (1.0f + std::exp(z));  // 1 - p_t
      const float pt = 1.0f - q;
      const float qg = gamma == 0.0f ? 1.0f : std::pow(q, gamma);
      sum += static_cast<double>(a * qg * ce);
      // d/dz [q^gamma ce] = -q^gamma (gamma p_t ce + q), since dq/dz = -q p_t and dce/dz = -q.
      const float dz = -a * qg * (gamma * pt * ce + q);
      dx[i] = (crack ? dz : -dz) * grad_scale;
    }
    return sum;
  }

  double dice_with_logits(int images, int64_t pixels, const float* x, const float* y, float smooth,
                          float grad_scale, float* dx, bool accumulate) override {
    double total = 0.0;
    for (int img = 0; img < images; ++img) {
      const float* xi = x + int64_t(img) * pixels;
      const float* yi = y + int64_t(img) * pixels;
      float* di = dx + int64_t(img) * pixels;
      double inter = 0.0, card = 0.0;
#pragma omp parallel for reduction(+ : inter, card) schedule(static)
      for (int64_t j = 0; j < pixels; ++j) {
        const double p = 1.0 / (1.0 + std::exp(-double(xi[j])));
        inter += p * yi[j];
        card += p + yi[j];
      }
      const double den = card + smooth, num = 2.0 * inter + smooth;
      total += 1.0 - num / den;
      // d(1 - num/den)/dp_j = -(2 t_j den - num) / den^2; dp/dx = p (1 - p).
      const float a = float(2.0 / den * grad_scale), b = float(num / (den * den) * grad_scale);
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < pixels; ++j) {
        const float p = 1.0f / (1.0f + std::exp(-xi[j]));
        const float g = (b - a * yi[j]) * p * (1.0f - p);
        di[j] = accumulate ? di[j] + g : g;
      }
    }
    return total;
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
    accumulate_loop(count, src, dst);
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

  void ema_update(int64_t count, const float* src, float decay, float* avg) override {
    const float keep = decay, take = 1.0f - decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) avg[i] = keep * avg[i] + take * src[i];
  }

  void swap(int64_t count, float* a, float* b) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) std::swap(a[i], b[i]);
  }

 private:
  // Calls f(T{}) with T the activation storage type.
  template <typename F>
  void visit(const F& f) const {
    if (bf16_)
      f(bf16{});
    else
      f(0.0f);
  }
  size_t elem_bytes() const {
    return dtype_bytes(activation_type());
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

  dnnl::engine eng_;
  dnnl::stream stream_;
  bool bf16_ = false;  // bf16 activations (and convolutions on bf16 weight copies)
  CpuConvAlgo conv_algo_ = CpuConvAlgo::kDirect;
  Buffer copies_scratch_;  // blocked activation copies (Winograd), one layer's at a time
  Buffer weight_scratch_;  // weights (or their gradient) in oneDNN's layout, one layer's at a time
  std::vector<float> scratch_a_, scratch_b_;  // per-channel values, sized on first use
  std::map<decltype(conv_key(ConvDesc{})), std::unique_ptr<cpu::ConvPrims>> conv_cache_;
  std::map<decltype(deconv_key(DeconvDesc{})), std::unique_ptr<cpu::ConvPrims>> deconv_cache_;
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

std::string cpu_conv_kernels(CpuConvAlgo algo) {
  switch (algo) {
    case CpuConvAlgo::kAuto:
      return cpu_winograd_support().empty()
                 ? "3x3: direct, Winograd or GEMMs, timed at first use"
                 : "3x3: direct on NHWC or on blocked copies, or GEMMs (shifted or Winograd), "
                   "timed at first use; oneDNN has no Winograd on this CPU";
    case CpuConvAlgo::kWinograd:  // the library falls back to direct; dptrain refuses it
      return cpu_winograd_support().empty() ? "3x3: Winograd"
                                            : "3x3: direct; oneDNN has no Winograd on this CPU";
    case CpuConvAlgo::kBlocked:
      return "3x3: direct on blocked copies";
    case CpuConvAlgo::kGemm:
      return "3x3: shifted GEMMs";
    case CpuConvAlgo::kGemmWinograd:
      return "3x3: Winograd F(2x2, 3x3) on GEMMs";
    case CpuConvAlgo::kDirect:
      break;
  }
  return {};
}

std::string cpu_isa_name() {
  using dnnl::cpu_isa;
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  switch (isa) {
    case cpu_isa::sse41:
      return "sse41";
    case cpu_isa::avx:
      return "avx";
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case cpu_isa::avx512_mic:
      return "avx512_mic";
    case cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case cpu_isa::avx512_core:
      return "avx512_core";
    case cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      break;
  }
  char text[32];
  std::snprintf(text, sizeof text, "oneDNN ISA 0x%x", static_cast<unsigned>(isa));
  return text;
}

std::string cpu_bf16_support() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  // oneDNN's ISA values are bit sets: each one contains the bits of the ISAs it extends.
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((isa & bf16) == bf16) return {};
  return "this CPU has neither AVX512-BF16 nor AMX (oneDNN runs " + cpu_isa_name() + ")";
}

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& options) {
  if (options.precision == Precision::kBFloat16)
    DP_CHECK(cpu_bf16_support().empty(), "--precision bf16: ", cpu_bf16_support());
  return checked("the CPU engine", [&] { return std::make_unique<CpuBackend>(options); });
}

}  // namespace dp
