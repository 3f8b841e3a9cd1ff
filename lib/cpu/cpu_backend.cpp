// CpuBackend (make_cpu_backend): each op dispatched to its family file (ops.hpp); CPU queries.
#include "dp/cpu/cpu_backend.hpp"

#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "dp/backend.hpp"
#include "dp/bf16.hpp"
#include "dp/error.hpp"
#include "onednn.hpp"
#include "ops.hpp"

namespace dp {
namespace {

using cpu::checked;

auto conv_key(const ConvDesc& d) {
  return std::make_tuple(d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.relu, d.stride, d.padding(),
                         d.bias, d.forward_only);
}
auto deconv_key(const DeconvDesc& d) {
  return std::make_tuple(d.n, d.h, d.w, d.cin, d.cout, d.kernel, d.relu, d.stride, d.pad,
                         d.forward_only);
}

// Activations as T, the activation storage type (float or bf16).
template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options)
      : eng_(dnnl::engine::kind::cpu, 0),
        stream_(eng_),
        bf16_(options.precision == Precision::kBFloat16),
        conv_algo_(options.conv_algo) {}

  std::string name() const override {
    if (bf16_) {
      const char* k = conv_algo_ == CpuConvAlgo::kAuto
                          ? "; 3x3: direct or Winograd on bf16 GEMMs, timed at first use"
                      : conv_algo_ == CpuConvAlgo::kGemmWinograd
                          ? "; 3x3: Winograd F(2x2, 3x3) on bf16 GEMMs"
                          : "";
      return str_cat("cpu (bf16 activations and convolutions", k, ")");
    }
    const std::string k = cpu_conv_kernels(conv_algo_);
    return k.empty() ? "cpu" : "cpu (" + k + ")";
  }

  std::string kernel_choices() const override {
    if (conv_algo_ == CpuConvAlgo::kDirect) return {};
    static const char* const kKinds[] = {"direct",       "blocked",           "Winograd",
                                         "GEMM",         "Winograd on GEMMs", "not yet run",
                                         "packed pixels"};
    constexpr int kNumKinds = int(std::size(kKinds));
    int counts[3][kNumKinds] = {};  // per pass and kind (kKinds)
    for (const auto& entry : conv_cache_) {
      const cpu::ConvPrims& p = *entry.second;
      for (int k = 0; k < 3; ++k) {
        const cpu::PassAlgo a = p.algo[k];
        ++counts[k][a == cpu::PassAlgo::kDirect           ? 0
                    : a == cpu::PassAlgo::kGemm           ? 3
                    : a == cpu::PassAlgo::kGemmWinograd   ? 4
                    : a == cpu::PassAlgo::kTimeOnFirstUse ? 5
                    : a == cpu::PassAlgo::kPacked         ? 6
                    : p.blocked->winograd                 ? 2
                                                          : 1];
      }
    }
    static const char* const kPasses[3] = {"forward", "backward data", "backward weights"};
    std::string s;
    for (int k :
         {cpu::BlockedPrims::kFwd, cpu::BlockedPrims::kBwdData, cpu::BlockedPrims::kBwdWeights}) {
      s += str_cat(s.empty() ? "" : "; ", kPasses[k], ":");
      for (int kind = 0; kind < kNumKinds; ++kind)
        if (counts[k][kind] > 0) s += str_cat(" ", counts[k][kind], " ", kKinds[kind]);
    }
    return s;
  }

  DType activation_type() const override { return bf16_ ? DType::kBFloat16 : DType::kFloat32; }

  void to_activation(int64_t count, const float* src, void* dst) override {
    visit([&](auto t) { cpu::to_activation(count, src, as<decltype(t)>(dst)); });
  }

  void from_activation(int64_t count, const void* src, float* dst) override {
    visit([&](auto t) { cpu::from_activation(count, as<decltype(t)>(src), dst); });
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
  void batchnorm_stats(const Dims& d, const void* src, double* sums) override {
    visit([&](auto t) { cpu::batchnorm_stats(d, as<decltype(t)>(src), sums); });
  }

  void batchnorm_prepare(int channels, bool training, const double* sums, double count, float eps,
                         float momentum, float* running_mean, float* running_var, float* mean,
                         float* invstd) override {
    cpu::batchnorm_prepare(channels, training, sums, count, eps, momentum, running_mean,
                           running_var, mean, invstd, scratch_a_);
  }

  void batchnorm_apply(const Dims& d, const void* src, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, bool relu, void* dst) override {
    visit([&](auto t) {
      using T = decltype(t);
      cpu::batchnorm_apply(d, as<T>(src), mean, invstd, gamma, beta, relu, as<T>(dst));
    });
  }

  void batchnorm_backward_stats(const Dims& d, const void* src, const void* dst, bool relu,
                                void* diff_dst, const float* mean, const float* invstd,
                                double* sums, float* diff_gamma, float* diff_beta) override {
    visit([&](auto t) {
      using T = decltype(t);
      cpu::batchnorm_backward_stats(d, as<T>(src), as<T>(dst), relu, as<T>(diff_dst), mean, invstd,
                                    sums, diff_gamma, diff_beta);
    });
  }

  void batchnorm_backward_apply(const Dims& d, const void* src, const void* diff_dst,
                                const float* mean, const float* invstd, const float* gamma,
                                const double* sums, double count, bool training, void* diff_src,
                                bool accumulate) override {
    visit([&](auto t) {
      using T = decltype(t);
      cpu::batchnorm_backward_apply(d, as<T>(src), as<T>(diff_dst), mean, invstd, gamma, sums,
                                    count, training, as<T>(diff_src), accumulate, scratch_a_,
                                    scratch_b_);
    });
  }

  void add_forward(int64_t count, const void* a, const void* b, bool relu, void* dst) override {
    visit([&](auto t) {
      using T = decltype(t);
      cpu::add_forward(count, as<T>(a), as<T>(b), relu, as<T>(dst));
    });
  }

  void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const void* src,
                         float* mask, void* dst) override {
    visit([&](auto t) {
      using T = decltype(t);
      cpu::dropout2d_forward(d, p, seeds, as<T>(src), mask, as<T>(dst));
    });
  }

  void dropout2d_backward(const Dims& d, const float* mask, const void* diff_dst,
                          void* diff_src) override {
    visit([&](auto t) {
      cpu::dropout2d_backward(d, mask, as<decltype(t)>(diff_dst), as<decltype(t)>(diff_src));
    });
  }

  void relu_forward(int64_t count, const void* src, void* dst) override {
    visit([&](auto t) { cpu::relu_forward(count, as<decltype(t)>(src), as<decltype(t)>(dst)); });
  }

  void relu_backward(int64_t count, const void* dst, const void* diff_dst,
                     void* diff_src) override {
    visit([&](auto t) {
      using T = decltype(t);
      cpu::relu_backward(count, as<T>(dst), as<T>(diff_dst), as<T>(diff_src));
    });
  }

  void maxpool2x2_forward(const Dims& s, const void* src, void* dst, uint8_t* argmax) override {
    DP_CHECK(s.h % 2 == 0 && s.w % 2 == 0, "maxpool2x2: input ", s.h, "x", s.w, " is not even");
    visit([&](auto t) {
      cpu::maxpool2x2_forward(s, as<decltype(t)>(src), as<decltype(t)>(dst), argmax);
    });
  }

  void maxpool2x2_backward(const Dims& s, const uint8_t* argmax, const void* diff_dst,
                           void* diff_src, bool accumulate) override {
    visit([&](auto t) {
      cpu::maxpool2x2_backward(s, argmax, as<decltype(t)>(diff_dst), as<decltype(t)>(diff_src),
                               accumulate);
    });
  }

  void upsample2x_forward(const Dims& s, const void* src, void* dst) override {
    visit([&](auto t) { cpu::upsample2x_forward(s, as<decltype(t)>(src), as<decltype(t)>(dst)); });
  }

  void upsample2x_backward(const Dims& s, const void* diff_dst, void* diff_src) override {
    visit([&](auto t) {
      cpu::upsample2x_backward(s, as<decltype(t)>(diff_dst), as<decltype(t)>(diff_src));
    });
  }

  void concat_forward(const Dims& a, const void* pa, const Dims& b, const void* pb,
                      void* dst) override {
    check_concat(a, b);
    cpu::concat_forward(elem_bytes(), a, pa, b, pb, dst);
  }

  void concat_backward(const Dims& a, const Dims& b, const void* diff_dst, void* diff_a,
                       void* diff_b) override {
    check_concat(a, b);
    cpu::concat_backward(elem_bytes(), a, b, diff_dst, diff_a, diff_b);
  }

  void accumulate_activations(int64_t count, const void* src, void* dst) override {
    visit([&](auto t) { cpu::accumulate(count, as<decltype(t)>(src), as<decltype(t)>(dst)); });
  }

  void copy_activations(int64_t count, const void* src, void* dst) override {
    std::memcpy(dst, src, elem_bytes() * static_cast<size_t>(count));
  }

  double bce_with_logits(int64_t count, const float* x, const float* y, float pos_weight,
                         float grad_scale, float* dx) override {
    return cpu::bce_with_logits(count, x, y, pos_weight, grad_scale, dx);
  }

  double focal_with_logits(int64_t count, const float* x, const float* y, float alpha, float gamma,
                           float grad_scale, float* dx) override {
    return cpu::focal_with_logits(count, x, y, alpha, gamma, grad_scale, dx);
  }

  double dice_with_logits(int images, int64_t pixels, const float* x, const float* y, float smooth,
                          float grad_scale, float* dx, bool accumulate) override {
    return cpu::dice_with_logits(images, pixels, x, y, smooth, grad_scale, dx, accumulate);
  }

  double soft_cldice_with_logits(int images, int height, int width, const float* x, const float* y,
                                 int iterations, float smooth, float grad_scale, float* dx,
                                 bool accumulate) override {
    return cpu::soft_cldice_with_logits(images, height, width, x, y, iterations, smooth, grad_scale,
                                        dx, accumulate, cldice_scratch_);
  }

  void confusion_counts(int64_t count, const float* x, const float* y, float threshold,
                        int64_t* counts) override {
    cpu::confusion_counts(count, x, y, threshold, counts);
  }

  void accumulate(int64_t count, const float* src, float* dst) override {
    cpu::accumulate(count, src, dst);
  }

  void sgd_update(int64_t count, float* p, const float* grad, float* m, float lr, float momentum,
                  float weight_decay, bool nesterov) override {
    cpu::sgd_update(count, p, grad, m, lr, momentum, weight_decay, nesterov);
  }

  void adamw_update(int64_t count, float* p, const float* g, float* m, float* v, float decay,
                    float b1, float b2, float eps, float step_size, float bc2_sqrt) override {
    cpu::adamw_update(count, p, g, m, v, decay, b1, b2, eps, step_size, bc2_sqrt);
  }

  double sum_squares(int64_t count, const float* src) override {
    return cpu::sum_squares(count, src);
  }

  void scale(int64_t count, float alpha, float* dst) override { cpu::scale(count, alpha, dst); }

  void ema_update(int64_t count, const float* src, float decay, float* avg) override {
    cpu::ema_update(count, src, decay, avg);
  }

  void swap(int64_t count, float* a, float* b) override { cpu::swap(count, a, b); }

 private:
  // Calls f(T{}) with T the activation storage type.
  template <typename F>
  void visit(const F& f) const {
    if (bf16_)
      f(bf16{});
    else
      f(0.0f);
  }
  size_t elem_bytes() const { return dtype_bytes(activation_type()); }

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
  cpu::Scratch scratch() const { return {weight_scratch_.data(), copies_scratch_.data()}; }

  dnnl::engine eng_;
  dnnl::stream stream_;
  bool bf16_ = false;  // bf16 activations (and convolutions on bf16 weight copies)
  CpuConvAlgo conv_algo_ = CpuConvAlgo::kDirect;
  Buffer copies_scratch_;  // blocked activation copies (Winograd), one layer's at a time
  Buffer weight_scratch_;  // weights (or their gradient) in oneDNN's layout, one layer's at a time
  std::vector<float> scratch_a_, scratch_b_;  // per-channel values, sized on first use
  std::vector<float> cldice_scratch_;         // soft clDice's levels, grown on first use
  std::map<decltype(conv_key(ConvDesc{})), std::unique_ptr<cpu::ConvPrims>> conv_cache_;
  std::map<decltype(deconv_key(DeconvDesc{})), std::unique_ptr<cpu::ConvPrims>> deconv_cache_;
};

}  // namespace

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
      return "3x3: Winograd on GEMMs";
    case CpuConvAlgo::kShape:
      return cpu_winograd_support().empty()
                 ? "3x3: Winograd forward where the channels pay for it, else direct"
                 : "3x3: Winograd on GEMMs forward where the channels pay for it, "
                   "else direct";
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
#if DNNL_VERSION_MAJOR >= 3
    case cpu_isa::avx2_vnni_2:
      return "avx2_vnni_2";
    case cpu_isa::avx512_core_fp16:
      return "avx512_core_fp16";
    case cpu_isa::avx512_core_amx_fp16:
      return "avx512_core_amx_fp16";
#else
    case cpu_isa::avx512_mic:
      return "avx512_mic";
    case cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
#endif
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

std::string cpu_onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

std::string cpu_bf16_support() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  // oneDNN's ISA values are bit sets: each one contains the bits of the ISAs it extends.
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((isa & bf16) == bf16) return {};
  return "this CPU has neither AVX512-BF16 nor AMX (oneDNN runs " + cpu_isa_name() + ")";
}

bool cpu_amx_bf16_weights_bug() {
#if DNNL_VERSION_MAJOR >= 3
  return false;
#else
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (isa & amx) == amx;
#endif
}

std::string cpu_bf16_note() {
  if (!cpu_amx_bf16_weights_bug()) return {};
  return "bf16 weight gradients run on avx512_core_bf16 kernels, not AMX: " + cpu_onednn_version() +
         "'s AMX kernel for them writes outside its output at photograph sizes (oneDNN 3.x keeps "
         "AMX; INSTALL.md)";
}

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& options) {
  if (options.precision == Precision::kBFloat16)
    DP_CHECK(cpu_bf16_support().empty(), "--precision bf16: ", cpu_bf16_support());
  return checked("the CPU engine", [&] { return std::make_unique<CpuBackend>(options); });
}

}  // namespace dp
