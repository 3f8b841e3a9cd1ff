// Device-memory staging on the CPU: a model, optimizer and checkpoints on a simulated device
// (separate allocations, explicit transfers) must match the host ones exactly; host buffers'
// zero-fill, alignment and huge pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/error.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/rng.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

// "Device" memory that is host memory of its own: every byte the model, optimizer and
// checkpoints use must go through allocate/upload/download, which are counted.
class SimulatedDeviceMemory : public DeviceMemory {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    allocated += bytes;
    return std::calloc(bytes, 1);
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    ++uploads;
    if (bytes > 0) std::memcpy(dst, src, bytes);  // an empty arena's pointers may be null
  }
  void download(void* dst, const void* src, size_t bytes) override {
    ++downloads;
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  size_t allocated = 0;
  int uploads = 0, downloads = 0;
};

// The CPU backend's ops over the simulated device memory.
class SimulatedDeviceBackend : public Backend {
 public:
  explicit SimulatedDeviceBackend(Precision precision) : inner_(make_cpu_backend(precision)) {}
  std::string name() const override { return "simulated device"; }
  DeviceMemory* device_memory() override { return &memory; }
  DType activation_type() const override { return inner_->activation_type(); }
  void to_activation(int64_t count, const float* src, void* dst) override {
    inner_->to_activation(count, src, dst);
  }
  void from_activation(int64_t count, const void* src, float* dst) override {
    inner_->from_activation(count, src, dst);
  }
  void conv_forward(const ConvDesc& d, const void* src, const float* weight, const float* bias,
                    void* dst) override {
    inner_->conv_forward(d, src, weight, bias, dst);
  }
  void conv_backward(const ConvDesc& d, const void* src, const float* weight, const void* dst,
                     void* diff_dst, void* diff_src, float* diff_weight,
                     float* diff_bias) override {
    inner_->conv_backward(d, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias);
  }
  void deconv_forward(const DeconvDesc& d, const void* src, const float* weight, const float* bias,
                      void* dst) override {
    inner_->deconv_forward(d, src, weight, bias, dst);
  }
  void deconv_backward(const DeconvDesc& d, const void* src, const float* weight, const void* dst,
                       void* diff_dst, void* diff_src, float* diff_weight,
                       float* diff_bias) override {
    inner_->deconv_backward(d, src, weight, dst, diff_dst, diff_src, diff_weight, diff_bias);
  }
  void batchnorm_stats(const Dims& d, const void* src, double* sums) override {
    inner_->batchnorm_stats(d, src, sums);
  }
  void batchnorm_prepare(int channels, bool training, const double* sums, double count, float eps,
                         float momentum, float* running_mean, float* running_var, float* mean,
                         float* invstd) override {
    inner_->batchnorm_prepare(channels, training, sums, count, eps, momentum, running_mean,
                              running_var, mean, invstd);
  }
  void batchnorm_apply(const Dims& d, const void* src, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, bool relu, void* dst) override {
    inner_->batchnorm_apply(d, src, mean, invstd, gamma, beta, relu, dst);
  }
  void batchnorm_backward_stats(const Dims& d, const void* src, const void* dst, bool relu,
                                void* diff_dst, const float* mean, const float* invstd,
                                double* sums, float* diff_gamma, float* diff_beta) override {
    inner_->batchnorm_backward_stats(d, src, dst, relu, diff_dst, mean, invstd, sums, diff_gamma,
                                     diff_beta);
  }
  void batchnorm_backward_apply(const Dims& d, const void* src, const void* diff_dst,
                                const float* mean, const float* invstd, const float* gamma,
                                const double* sums, double count, bool training, void* diff_src,
                                bool accumulate) override {
    inner_->batchnorm_backward_apply(d, src, diff_dst, mean, invstd, gamma, sums, count, training,
                                     diff_src, accumulate);
  }
  void add_forward(int64_t count, const void* a, const void* b, bool relu, void* dst) override {
    inner_->add_forward(count, a, b, relu, dst);
  }
  void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const void* src,
                         float* mask, void* dst) override {
    inner_->dropout2d_forward(d, p, seeds, src, mask, dst);
  }
  void dropout2d_backward(const Dims& d, const float* mask, const void* diff_dst,
                          void* diff_src) override {
    inner_->dropout2d_backward(d, mask, diff_dst, diff_src);
  }
  void relu_forward(int64_t count, const void* src, void* dst) override {
    inner_->relu_forward(count, src, dst);
  }
  void relu_backward(int64_t count, const void* dst, const void* diff_dst,
                     void* diff_src) override {
    inner_->relu_backward(count, dst, diff_dst, diff_src);
  }
  void maxpool2x2_forward(const Dims& src_dims, const void* src, void* dst,
                          uint8_t* argmax) override {
    inner_->maxpool2x2_forward(src_dims, src, dst, argmax);
  }
  void maxpool2x2_backward(const Dims& src_dims, const uint8_t* argmax, const void* diff_dst,
                           void* diff_src, bool accumulate) override {
    inner_->maxpool2x2_backward(src_dims, argmax, diff_dst, diff_src, accumulate);
  }
  void upsample2x_forward(const Dims& src_dims, const void* src, void* dst) override {
    inner_->upsample2x_forward(src_dims, src, dst);
  }
  void upsample2x_backward(const Dims& src_dims, const void* diff_dst, void* diff_src) override {
    inner_->upsample2x_backward(src_dims, diff_dst, diff_src);
  }
  void concat_forward(const Dims& a_dims, const void* a, const Dims& b_dims, const void* b,
                      void* dst) override {
    inner_->concat_forward(a_dims, a, b_dims, b, dst);
  }
  void concat_backward(const Dims& a_dims, const Dims& b_dims, const void* diff_dst, void* diff_a,
                       void* diff_b) override {
    inner_->concat_backward(a_dims, b_dims, diff_dst, diff_a, diff_b);
  }
  void accumulate_activations(int64_t count, const void* src, void* dst) override {
    inner_->accumulate_activations(count, src, dst);
  }
  void copy_activations(int64_t count, const void* src, void* dst) override {
    inner_->copy_activations(count, src, dst);
  }
  double bce_with_logits(int64_t count, const float* logits, const float* target, float pos_weight,
                         float grad_scale, float* diff_logits) override {
    return inner_->bce_with_logits(count, logits, target, pos_weight, grad_scale, diff_logits);
  }
  double focal_with_logits(int64_t count, const float* logits, const float* target, float alpha,
                           float gamma, float grad_scale, float* diff_logits) override {
    return inner_->focal_with_logits(count, logits, target, alpha, gamma, grad_scale, diff_logits);
  }
  double dice_with_logits(int images, int64_t pixels, const float* logits, const float* target,
                          float smooth, float grad_scale, float* diff_logits,
                          bool accumulate) override {
    return inner_->dice_with_logits(images, pixels, logits, target, smooth, grad_scale, diff_logits,
                                    accumulate);
  }
  double soft_cldice_with_logits(int images, int height, int width, const float* logits,
                                 const float* target, int iterations, float smooth,
                                 float grad_scale, float* diff_logits, bool accumulate) override {
    return inner_->soft_cldice_with_logits(images, height, width, logits, target, iterations,
                                           smooth, grad_scale, diff_logits, accumulate);
  }
  void confusion_counts(int64_t count, const float* logits, const float* target,
                        float logit_threshold, int64_t* counts) override {
    inner_->confusion_counts(count, logits, target, logit_threshold, counts);
  }
  void accumulate(int64_t count, const float* src, float* dst) override {
    inner_->accumulate(count, src, dst);
  }
  void sgd_update(int64_t count, float* param, const float* grad, float* momentum_buf, float lr,
                  float momentum, float weight_decay, bool nesterov) override {
    inner_->sgd_update(count, param, grad, momentum_buf, lr, momentum, weight_decay, nesterov);
  }
  void adamw_update(int64_t count, float* param, const float* grad, float* exp_avg,
                    float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                    float step_size, float bc2_sqrt) override {
    inner_->adamw_update(count, param, grad, exp_avg, exp_avg_sq, decay, beta1, beta2, eps,
                         step_size, bc2_sqrt);
  }
  double sum_squares(int64_t count, const float* src) override {
    return inner_->sum_squares(count, src);
  }
  void scale(int64_t count, float alpha, float* dst) override { inner_->scale(count, alpha, dst); }
  void ema_update(int64_t count, const float* src, float decay, float* avg) override {
    inner_->ema_update(count, src, decay, avg);
  }
  void swap(int64_t count, float* a, float* b) override { inner_->swap(count, a, b); }

  SimulatedDeviceMemory memory;

 private:
  std::unique_ptr<Backend> inner_;
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

std::vector<float> host_copy(ParamStore& p) {
  p.download();
  return {p.host_values(), p.host_values() + p.arena_size()};
}

std::vector<float> arena(const ParamStore& p) {
  return {p.values(), p.values() + p.arena_size()};
}

std::vector<float> downloaded(const Buffer& b) {
  std::vector<float> v(b.bytes() / sizeof(float));
  b.download(v.data(), b.bytes());
  return v;
}

// One SGD step of `model` on (input, target): host tensors, uploaded when the backend has a
// device. Returns the loss.
double train_step(Model& model, Backend& be, Sgd& sgd, const std::vector<float>& input,
                  const std::vector<float>& target, int n) {
  DeviceMemory* dev = be.device_memory();
  const size_t in_bytes = input.size() * sizeof(float), t_bytes = target.size() * sizeof(float);
  Buffer x(in_bytes, dev), t(t_bytes, dev), diff(t_bytes, dev);
  x.upload(input.data(), in_bytes);
  t.upload(target.data(), t_bytes);
  const float* logits = model.forward(x.f32(), n);
  const double loss = be.bce_with_logits(int64_t(target.size()), logits, t.f32(), 1.0f,
                                         1.0f / float(target.size()), diff.f32());
  model.backward(diff.f32());
  sgd.step(0.05f);
  return loss;
}

struct Case {
  const char* model;
  int divisor, size;
  Precision precision = Precision::kFloat32;
};

class DeviceStaging : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceStaging, ModelOptimizerAndCheckpointsMatchTheHost) {
  const Case c = GetParam();
  if (c.precision == Precision::kBFloat16 && !cpu_bf16_support().empty())
    GTEST_SKIP() << "no bf16 on this CPU: " << cpu_bf16_support();
  ModelConfig mc;
  mc.name = c.model;
  mc.width_divisor = c.divisor;
  auto cpu = make_cpu_backend(c.precision);
  SimulatedDeviceBackend dev(c.precision);
  auto host_model = make_model(mc, *cpu);
  auto dev_model = make_model(mc, dev);
  ASSERT_TRUE(dev_model->params().on_device());
  ASSERT_FALSE(host_model->params().on_device());
  constexpr int kBatch = 2;
  for (Model* m : {host_model.get(), dev_model.get()}) {
    m->setup(kBatch, c.size, c.size);
    m->params().initialize(7);
    const uint64_t seeds[kBatch] = {11, 12};
    m->set_dropout_seeds(seeds, kBatch);
  }
  // Initialisation happens on the host mirror and is uploaded.
  EXPECT_EQ(host_copy(dev_model->params()), arena(host_model->params()));
  EXPECT_GE(dev.memory.allocated, size_t(dev_model->activation_bytes()));

  const size_t pixels = size_t(kBatch) * size_t(c.size) * size_t(c.size);
  const std::vector<float> input = random_floats(pixels * 3, 1);
  std::vector<float> target = random_floats(pixels, 2);
  for (float& v : target) v = v > 0.3f ? 1.0f : 0.0f;
  Sgd host_sgd(host_model->params(), *cpu, {});
  Sgd dev_sgd(dev_model->params(), dev, {});
  for (int step = 0; step < 2; ++step) {
    const double a = train_step(*host_model, *cpu, host_sgd, input, target, kBatch);
    const double b = train_step(*dev_model, dev, dev_sgd, input, target, kBatch);
    EXPECT_EQ(a, b) << "step " << step;
  }
  EXPECT_EQ(host_copy(dev_model->params()), arena(host_model->params()));
  EXPECT_EQ(host_copy(dev_model->buffers()), arena(host_model->buffers()));  // BN running stats
  EXPECT_EQ(downloaded(dev_model->params().grad_buffer()),
            std::vector<float>(host_model->params().grads(),
                               host_model->params().grads() + host_model->params().arena_size()));

  // Evaluation from host memory to host memory.
  host_model->set_training(false);
  dev_model->set_training(false);
  const float* ha = host_model->forward_host(input.data(), kBatch);
  const float* da = dev_model->forward_host(input.data(), kBatch);
  EXPECT_EQ(std::vector<float>(ha, ha + pixels), std::vector<float>(da, da + pixels));

  // A checkpoint written from the device loads on the host and back on a device, bit for bit.
  test::TempDir dir;
  const std::string from_dev = dir.file("dev.h5"), from_host = dir.file("host.h5");
  save_checkpoint(from_dev, dev_model->params(), dev_sgd.state(), {}, &dev_model->buffers());
  save_checkpoint(from_host, host_model->params(), host_sgd.state(), {}, &host_model->buffers());
  auto host2 = make_model(mc, *cpu);
  Sgd host2_sgd(host2->params(), *cpu, {});
  load_checkpoint(from_dev, host2->params(), host2_sgd.state(), &host2->buffers());
  EXPECT_EQ(arena(host2->params()), arena(host_model->params()));
  EXPECT_EQ(arena(host2->buffers()), arena(host_model->buffers()));
  const size_t floats = size_t(host2->params().arena_size());
  EXPECT_EQ(0, std::memcmp(host2_sgd.momentum(), host_sgd.momentum(), floats * sizeof(float)));
  auto dev2 = make_model(mc, dev);
  Sgd dev2_sgd(dev2->params(), dev, {});
  load_checkpoint(from_host, dev2->params(), dev2_sgd.state(), &dev2->buffers());
  EXPECT_EQ(host_copy(dev2->params()), arena(host_model->params()));
  EXPECT_EQ(host_copy(dev2->buffers()), arena(host_model->buffers()));
  std::vector<float> momentum(floats);
  dev.memory.download(momentum.data(), dev2_sgd.momentum(), floats * sizeof(float));
  EXPECT_EQ(0, std::memcmp(momentum.data(), host_sgd.momentum(), floats * sizeof(float)));
}

// bf16: activations in bf16 on the device, the input converted there and the logits back to fp32
// (Model::forward, forward_host).
INSTANTIATE_TEST_SUITE_P(Models, DeviceStaging,
                         ::testing::Values(Case{"unet16", 16, 32}, Case{"unet_resnet34", 16, 64},
                                           Case{"unet16", 16, 32, Precision::kBFloat16},
                                           Case{"unet_resnet34", 16, 64, Precision::kBFloat16}),
                         [](const auto& p) {
                           return std::string(p.param.model) +
                                  (p.param.precision == Precision::kBFloat16 ? "_bf16" : "");
                         });

TEST(DeviceStaging, BufferTransfersCheckTheirBounds) {
  SimulatedDeviceMemory mem;
  Buffer b(16, &mem);
  const float four[4] = {1, 2, 3, 4};
  b.upload(four, 8, 8);
  float back[2] = {0, 0};
  b.download(back, 8, 8);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 2.0f);
  EXPECT_EQ(mem.uploads, 1);
  EXPECT_EQ(mem.downloads, 1);
  EXPECT_THROW(b.upload(four, 16, 4), Error);
  EXPECT_THROW(b.download(back, 8, 12), Error);
  Buffer moved = std::move(b);
  EXPECT_EQ(moved.device(), &mem);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
}

// The THPeligible field of /proc/self/smaps for the mapping that holds `p` (-1: not found).
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' '))
      inside = lo <= a && a < hi;
    else if (inside && line.rfind("THPeligible:", 0) == 0)
      return std::stoi(line.substr(12));
  }
  return -1;
}

// Host buffers are zero-filled even where the allocator hands back freed, dirty memory; large
// ones sit on whole 2 MiB pages and ask for transparent huge pages.
TEST(HostBuffer, ZeroFilledAlignedAndLargeOnesOnHugePages) {
  for (const size_t bytes : {size_t{100}, size_t{8} << 20}) {
    {
      Buffer dirty(bytes);
      std::memset(dirty.data(), 0xA5, bytes);
    }
    const Buffer b(bytes);
    const auto* u = b.u8();
    EXPECT_EQ(std::count(u, u + bytes, 0), static_cast<std::ptrdiff_t>(bytes)) << bytes;
    const size_t align = bytes >= (size_t{8} << 20) ? size_t{2} << 20 : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % align, 0u) << bytes;
  }
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (mode.find("[never]") != std::string::npos || mode.empty())
    GTEST_SKIP() << "transparent huge pages are off on this kernel ('" << mode << "')";
  const Buffer large(size_t{8} << 20);
  EXPECT_EQ(thp_eligible(large.data()), 1) << "THP mode " << mode;
}

}  // namespace
}  // namespace dp
