// CudaBackendImpl (make_cuda_backend): each op dispatched to cuDNN (conv.cpp) or its launcher.
#include "dp/cuda/cuda_backend.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "conv.hpp"
#include "device_memory.hpp"
#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "kernels.cuh"

namespace dp::cuda {
namespace {

std::string cudnn_version() {
  const size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch since cuDNN 9
  return str_cat(v / 10000, ".", v % 10000 / 100, ".", v % 100);
}

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const BackendOptions& options)
      : heap_(stream_.get()),
        memory_(heap_),
        workspace_(heap_, "the convolution workspace"),
        conv_(cudnn_.get(), heap_, workspace_, options),
        staging_(heap_),
        cldice_scratch_(heap_, "the soft clDice levels"),
        name_(str_cat(
            "cuda (cuDNN ", cudnn_version(),
            options.precision == Precision::kBFloat16 ? ", bf16 activations and convolutions" : "",
            ")")),
        bf16_(options.precision == Precision::kBFloat16) {
    cudnn_.set_stream(stream_.get());
  }

  // Members go in reverse order, after the queued work (their memory may be in use by it).
  ~CudaBackendImpl() override { (void)cudaStreamSynchronize(stream_.get()); }

  std::string name() const override { return name_; }
  DeviceMemory* device_memory() override { return &memory_; }
  void synchronize() override { stream_.synchronize(); }

  DType activation_type() const override { return bf16_ ? DType::kBFloat16 : DType::kFloat32; }

  void to_activation(int64_t count, const float* src, void* dst) override {
    visit([&](auto t) {
      kernels::convert(s(), count, 1, src, nullptr, false, as<decltype(t)>(dst));
    });
  }
  void from_activation(int64_t count, const void* src, float* dst) override {
    visit([&](auto t) {
      kernels::convert(s(), count, 1, as<decltype(t)>(src), nullptr, false, dst);
    });
  }

  void conv_forward(const ConvDesc& d, const void* src, const float* weight, const float* bias,
                    void* dst) override {
    conv_.conv_forward(d, src, weight, bias, dst);
  }
  void conv_backward(const ConvDesc& d, const void* src, const float* weight, const void* dst,
                     void* diff_dst, void* diff_src, float* diff_weight,
                     float* diff_bias) override {
    conv_.conv_backward(d, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias);
  }
  void deconv_forward(const DeconvDesc& d, const void* src, const float* weight, const float* bias,
                      void* dst) override {
    conv_.deconv_forward(d, src, weight, bias, dst);
  }
  void deconv_backward(const DeconvDesc& d, const void* src, const float* weight, const void* dst,
                       void* diff_dst, void* diff_src, float* diff_weight,
                       float* diff_bias) override {
    conv_.deconv_backward(d, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias);
  }

  void batchnorm_stats(const Dims& d, const void* src, double* sums) override {
    const size_t bytes = sizeof(double) * 2 * size_t(d.c);
    if (d.pixels() == 0) {
      std::fill(sums, sums + 2 * d.c, 0.0);
      return;
    }
    void* dev = staging_.scratch(bytes);
    visit([&](auto t) {
      kernels::batchnorm_stats(s(), d, as<decltype(t)>(src), static_cast<double*>(dev));
    });
    staging_.fetch(dev, sums, bytes);
  }

  void batchnorm_prepare(int channels, bool training, const double* sums, double count, float eps,
                         float momentum, float* running_mean, float* running_var, float* mean,
                         float* invstd) override {
    // Evaluation reads no sums (they may be null); the kernel still gets valid memory.
    const size_t bytes = sizeof(double) * 2 * size_t(channels);
    void* dev = training ? staging_.upload(sums, bytes) : staging_.scratch(bytes);
    kernels::batchnorm_prepare(s(), channels, training, static_cast<const double*>(dev), count, eps,
                               momentum, running_mean, running_var, mean, invstd);
  }

  void batchnorm_apply(const Dims& d, const void* src, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, bool relu, void* dst) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::batchnorm_apply(s(), d, as<S>(src), mean, invstd, gamma, beta, relu, as<S>(dst));
    });
  }

  void batchnorm_backward_stats(const Dims& d, const void* src, const void* dst, bool relu,
                                void* diff_dst, const float* mean, const float* invstd,
                                double* sums, float* diff_gamma, float* diff_beta) override {
    const size_t bytes = sizeof(double) * 2 * size_t(d.c);
    if (d.pixels() == 0) {
      std::fill(sums, sums + 2 * d.c, 0.0);
      DP_CUDA_CHECK(cudaMemsetAsync(diff_gamma, 0, sizeof(float) * size_t(d.c), s()));
      DP_CUDA_CHECK(cudaMemsetAsync(diff_beta, 0, sizeof(float) * size_t(d.c), s()));
      return;
    }
    void* dev = staging_.scratch(bytes);
    visit([&](auto t) {
      using S = decltype(t);
      kernels::batchnorm_backward_stats(s(), d, as<S>(src), as<S>(dst), relu, as<S>(diff_dst), mean,
                                        invstd, static_cast<double*>(dev), diff_gamma, diff_beta);
    });
    staging_.fetch(dev, sums, bytes);
  }

  void batchnorm_backward_apply(const Dims& d, const void* src, const void* diff_dst,
                                const float* mean, const float* invstd, const float* gamma,
                                const double* sums, double count, bool training, void* diff_src,
                                bool accumulate) override {
    const size_t bytes = sizeof(double) * 2 * size_t(d.c);
    void* dev = training ? staging_.upload(sums, bytes) : staging_.scratch(bytes);
    visit([&](auto t) {
      using S = decltype(t);
      kernels::batchnorm_backward_apply(s(), d, as<S>(src), as<S>(diff_dst), mean, invstd, gamma,
                                        static_cast<const double*>(dev), count, training,
                                        as<S>(diff_src), accumulate);
    });
  }

  void add_forward(int64_t count, const void* a, const void* b, bool relu, void* dst) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::add_forward(s(), count, as<S>(a), as<S>(b), relu, as<S>(dst));
    });
  }

  void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const void* src,
                         float* mask, void* dst) override {
    if (d.n == 0) return;
    const void* dev = staging_.upload(seeds, sizeof(uint64_t) * size_t(d.n));
    visit([&](auto t) {
      using S = decltype(t);
      kernels::dropout2d_forward(s(), d, p, static_cast<const uint64_t*>(dev), as<S>(src), mask,
                                 as<S>(dst));
    });
  }

  void dropout2d_backward(const Dims& d, const float* mask, const void* diff_dst,
                          void* diff_src) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::dropout2d_backward(s(), d, mask, as<S>(diff_dst), as<S>(diff_src));
    });
  }

  void relu_forward(int64_t count, const void* src, void* dst) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::convert(s(), count, 1, as<S>(src), nullptr, true, as<S>(dst));
    });
  }

  void relu_backward(int64_t count, const void* dst, const void* diff_dst,
                     void* diff_src) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::relu_backward(s(), count, as<S>(dst), as<S>(diff_dst), as<S>(diff_src));
    });
  }

  void maxpool2x2_forward(const Dims& src_dims, const void* src, void* dst,
                          uint8_t* argmax) override {
    DP_CHECK(src_dims.h % 2 == 0 && src_dims.w % 2 == 0, "maxpool2x2: input ", src_dims.h, "x",
             src_dims.w, " is not even");
    visit([&](auto t) {
      using S = decltype(t);
      kernels::maxpool2x2_forward(s(), src_dims, as<S>(src), as<S>(dst), argmax);
    });
  }

  void maxpool2x2_backward(const Dims& src_dims, const uint8_t* argmax, const void* diff_dst,
                           void* diff_src, bool accumulate) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::maxpool2x2_backward(s(), src_dims, argmax, as<S>(diff_dst), as<S>(diff_src),
                                   accumulate);
    });
  }

  void upsample2x_forward(const Dims& src_dims, const void* src, void* dst) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::upsample2x_forward(s(), src_dims, as<S>(src), as<S>(dst));
    });
  }

  void upsample2x_backward(const Dims& src_dims, const void* diff_dst, void* diff_src) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::upsample2x_backward(s(), src_dims, as<S>(diff_dst), as<S>(diff_src));
    });
  }

  void concat_forward(const Dims& a_dims, const void* a, const Dims& b_dims, const void* b,
                      void* dst) override {
    check_concat(a_dims, b_dims);
    visit([&](auto t) {
      using S = decltype(t);
      kernels::concat_forward(s(), a_dims, as<S>(a), b_dims, as<S>(b), as<S>(dst));
    });
  }

  void concat_backward(const Dims& a_dims, const Dims& b_dims, const void* diff_dst, void* diff_a,
                       void* diff_b) override {
    check_concat(a_dims, b_dims);
    visit([&](auto t) {
      using S = decltype(t);
      kernels::concat_backward(s(), a_dims, b_dims, as<S>(diff_dst), as<S>(diff_a), as<S>(diff_b));
    });
  }

  void accumulate_activations(int64_t count, const void* src, void* dst) override {
    visit([&](auto t) {
      using S = decltype(t);
      kernels::accumulate(s(), count, as<S>(src), as<S>(dst));
    });
  }

  void copy_activations(int64_t count, const void* src, void* dst) override {
    if (count == 0 || src == dst) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, src, dtype_bytes(activation_type()) * size_t(count),
                                  cudaMemcpyDeviceToDevice, s()));
  }

  double bce_with_logits(int64_t count, const float* logits, const float* target, float pos_weight,
                         float grad_scale, float* diff_logits) override {
    if (count == 0) return 0.0;
    void* dev = staging_.scratch(sizeof(double));
    kernels::bce_with_logits(s(), count, logits, target, pos_weight, grad_scale, diff_logits,
                             static_cast<double*>(dev));
    double loss = 0.0;
    staging_.fetch(dev, &loss, sizeof loss);
    return loss;
  }

  double focal_with_logits(int64_t count, const float* logits, const float* target, float alpha,
                           float gamma, float grad_scale, float* diff_logits) override {
    if (count == 0) return 0.0;
    void* dev = staging_.scratch(sizeof(double));
    kernels::focal_with_logits(s(), count, logits, target, alpha, gamma, grad_scale, diff_logits,
                               static_cast<double*>(dev));
    double loss = 0.0;
    staging_.fetch(dev, &loss, sizeof loss);
    return loss;
  }

  double dice_with_logits(int images, int64_t pixels, const float* logits, const float* target,
                          float smooth, float grad_scale, float* diff_logits,
                          bool accumulate) override {
    if (images == 0 || pixels == 0) return 0.0;
    std::vector<double> sums(2 * size_t(images));
    void* dev = staging_.scratch(sizeof(double) * sums.size());
    kernels::dice_with_logits(s(), images, pixels, logits, target, smooth, grad_scale, diff_logits,
                              accumulate, static_cast<double*>(dev));
    staging_.fetch(dev, sums.data(), sizeof(double) * sums.size());
    double loss = 0.0;
    for (int i = 0; i < images; ++i)
      loss += 1.0 - (2.0 * sums[2 * size_t(i)] + smooth) / (sums[2 * size_t(i) + 1] + smooth);
    return loss;
  }

  double soft_cldice_with_logits(int images, int height, int width, const float* logits,
                                 const float* target, int iterations, float smooth,
                                 float grad_scale, float* diff_logits, bool accumulate) override {
    if (images == 0 || height == 0 || width == 0) return 0.0;
    cldice_scratch_.reserve(sizeof(float) *
                            kernels::soft_cldice_scratch_floats(images, height, width, iterations));
    std::vector<double> sums(4 * size_t(images));
    void* dev = staging_.scratch(sizeof(double) * sums.size());
    kernels::soft_cldice_with_logits(
        s(), images, height, width, logits, target, iterations, smooth, grad_scale, diff_logits,
        accumulate, static_cast<float*>(cldice_scratch_.data()), static_cast<double*>(dev));
    staging_.fetch(dev, sums.data(), sizeof(double) * sums.size());
    double loss = 0.0;
    for (size_t i = 0; i < size_t(images); ++i) {
      const double* k = sums.data() + 4 * i;
      const double tp = (k[0] + smooth) / (k[1] + smooth), ts = (k[2] + smooth) / (k[3] + smooth);
      loss += 1.0 - 2.0 * tp * ts / (tp + ts);
    }
    return loss;
  }

  void confusion_counts(int64_t count, const float* logits, const float* target,
                        float logit_threshold, int64_t* counts) override {
    if (count == 0) return;
    unsigned long long added[3] = {};
    void* dev = staging_.scratch(sizeof added);
    DP_CUDA_CHECK(cudaMemsetAsync(dev, 0, sizeof added, s()));
    kernels::confusion_counts(s(), count, logits, target, logit_threshold,
                              static_cast<unsigned long long*>(dev));
    staging_.fetch(dev, added, sizeof added);
    for (int i = 0; i < 3; ++i) counts[i] += static_cast<int64_t>(added[i]);
  }

  void accumulate(int64_t count, const float* src, float* dst) override {
    kernels::accumulate(s(), count, src, dst);
  }

  void sgd_update(int64_t count, float* param, const float* grad, float* momentum_buf, float lr,
                  float momentum, float weight_decay, bool nesterov) override {
    kernels::sgd_update(s(), count, param, grad, momentum_buf, lr, momentum, weight_decay,
                        nesterov);
  }

  void adamw_update(int64_t count, float* param, const float* grad, float* exp_avg,
                    float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                    float step_size, float bc2_sqrt) override {
    kernels::adamw_update(s(), count, param, grad, exp_avg, exp_avg_sq, decay, beta1, beta2, eps,
                          step_size, bc2_sqrt);
  }

  double sum_squares(int64_t count, const float* src) override {
    if (count == 0) return 0.0;
    void* dev = staging_.scratch(sizeof(double));
    kernels::sum_squares(s(), count, src, static_cast<double*>(dev));
    double sum = 0.0;
    staging_.fetch(dev, &sum, sizeof sum);
    return sum;
  }

  void scale(int64_t count, float alpha, float* dst) override {
    kernels::scale(s(), count, alpha, dst);
  }

  void ema_update(int64_t count, const float* src, float decay, float* avg) override {
    kernels::ema_update(s(), count, src, decay, avg);
  }

  void swap(int64_t count, float* a, float* b) override { kernels::swap(s(), count, a, b); }

  // CudaBackend.
  cudaStream_t stream() const override { return stream_.get(); }
  size_t allocated_bytes() const override { return heap_.allocated(); }
  size_t peak_bytes() const override { return heap_.peak(); }
  size_t workspace_bytes() const override { return workspace_.bytes(); }
  bool runs_in_bf16(const ConvDesc& d) override { return conv_.runs_in_bf16(d); }
  bool runs_in_bf16(const DeconvDesc& d) override { return conv_.runs_in_bf16(d); }

 private:
  cudaStream_t s() const { return stream_.get(); }
  // Calls f(S{}) with S the activations' storage type (float or __nv_bfloat16).
  template <typename F>
  void visit(const F& f) const {
    if (bf16_)
      f(__nv_bfloat16{});
    else
      f(0.0f);
  }
  template <typename S>
  static const S* as(const void* p) {
    return static_cast<const S*>(p);
  }
  template <typename S>
  static S* as(void* p) {
    return static_cast<S*>(p);
  }

  static void check_concat(const Dims& a, const Dims& b) {
    DP_CHECK(a.n == b.n && a.h == b.h && a.w == b.w, "concat: shapes differ: [", a.n, ",", a.h, ",",
             a.w, ",", a.c, "] vs [", b.n, ",", b.h, ",", b.w, ",", b.c, "]");
  }

  // Construction order matters: the heap needs the stream, the rest the heap. All on the device
  // current at construction.
  Stream stream_;
  CudnnHandle cudnn_;
  DeviceHeap heap_;
  CountedMemory memory_;
  Arena workspace_;
  ConvEngine conv_;
  Staging staging_;
  Arena cldice_scratch_;  // soft clDice's levels, grown on first use
  std::string name_;
  bool bf16_ = false;  // bf16 activations
};

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const BackendOptions& options) {
  if (options.precision == Precision::kBFloat16) {
    // cuDNN's bf16 convolutions want bf16 tensor cores (Ampere, compute capability 8.0, on).
    int ordinal = 0, major = 0, minor = 0;
    DP_CUDA_CHECK(cudaGetDevice(&ordinal));
    DP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal));
    DP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal));
    if (major < 8) {
      cudaDeviceProp prop{};
      DP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
      const std::string device = str_cat("device ", ordinal, " (", prop.name, ")");
      fail("bf16 convolutions need compute capability 8.0 or newer (bf16 tensor cores); ", device,
           " has ", major, ".", minor, "; use --precision fp32");
    }
  }
  return std::make_unique<CudaBackendImpl>(options);
}

}  // namespace dp::cuda
