// GPU training throughput of the CUDA backend: median step time and img/s of one model on one GPU.
//
//   bench_gpu_throughput --model unet16 --size 448 --batch 16 --steps 20 --warmup 5
//
// A step is what dptrain's training loop does on a batch already on the device: forward, BCE
// with logits (whose loss comes back to the host, so every step ends synchronised), backward and
// one SGD step. Input and target are random, made once. Prints a human line, then one JSON line
// (the last line of the output) with the median step time, img/s and the backend's peak device
// memory. --precision bf16 runs the convolutions in bf16 (BackendOptions::precision); in fp32,
// --tf32 decides whether they may use TF32 tensor cores. --profile brackets the last timed step
// with cudaProfilerStart/Stop, so that `ncu --profile-from-start off` times that step's kernels
// alone; --log-algorithms prints the cuDNN algorithm chosen for each convolution pass.

#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/cuda/cuda_backend.hpp"
#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/rng.hpp"

namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string model = "unet16";
  int size = 448;
  int batch = 16;
  int steps = 20;
  int warmup = 5;
  int divisor = 1;
  bool deconv = false;
  bool tf32 = true;
  dp::Precision precision = dp::Precision::kFloat32;
  bool deterministic = false;
  bool profile = false;
  bool log_algorithms = false;
  uint64_t seed = 1;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double gib(size_t bytes) {
  return double(bytes) / double(size_t{1} << 30);
}

// JSON string contents: the GPU name is the only free text here.
std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) out += ch;
  }
  return out;
}

void run(const Config& c) {
  const dp::cuda::DeviceInfo device = dp::cuda::select_device(0, 1, false);
  dp::cuda::BackendOptions options;
  options.tf32 = c.tf32;
  options.precision = c.precision;
  options.deterministic = c.deterministic;
  options.log_algorithms = c.log_algorithms;
  auto be = dp::cuda::make_cuda_backend(options);

  dp::ModelConfig mc;
  mc.name = c.model;
  mc.width_divisor = c.divisor;
  mc.deconv = c.deconv;
  auto model = dp::make_model(mc, *be);
  model->setup(c.batch, c.size, c.size);
  model->params().initialize(c.seed);
  model->buffers().initialize(c.seed);
  model->set_training(true);

  // Random images in [-2, 2) (about what normalisation gives) and sparse masks, made once.
  const size_t pixels = size_t(c.batch) * size_t(c.size) * size_t(c.size);
  std::vector<float> x(3 * pixels), t(pixels);
  dp::Rng rng(dp::key(c.seed, 17));
  for (float& v : x) v = rng.uniform(-2.0f, 2.0f);
  for (float& v : t) v = rng.uniform() < 0.1f ? 1.0f : 0.0f;
  dp::DeviceMemory* mem = be->device_memory();
  dp::Buffer input(x.size() * sizeof(float), mem), target(t.size() * sizeof(float), mem);
  dp::Buffer diff(t.size() * sizeof(float), mem);
  input.upload(x.data(), input.bytes());
  target.upload(t.data(), target.bytes());
  dp::Sgd sgd(model->params(), *be, {0.01f, 0.9f, 1e-4f, false});

  const auto count = int64_t(pixels);
  std::vector<uint64_t> seeds(size_t(c.batch));
  double loss = 0;
  auto step = [&](int s) {
    for (int i = 0; i < c.batch; ++i) seeds[size_t(i)] = dp::key(c.seed, s, i);
    model->set_dropout_seeds(seeds.data(), c.batch);
    const float* logits = model->forward(input.f32(), c.batch);
    loss = be->bce_with_logits(count, logits, target.f32(), 1.0f, 1.0f / float(count), diff.f32()) /
           double(count);
    model->backward(diff.f32());
    sgd.step(0.01f);
    be->synchronize();
  };

  const Clock::time_point t0 = Clock::now();
  for (int s = 0; s < c.warmup; ++s) step(s);
  const double warmup_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> times;
  for (int s = 0; s < c.steps; ++s) {
    const bool profiled = c.profile && s == c.steps - 1;
    if (profiled) DP_CUDA_CHECK(cudaProfilerStart());
    const Clock::time_point a = Clock::now();
    step(c.warmup + s);
    if (profiled) DP_CUDA_CHECK(cudaProfilerStop());
    times.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  DP_CHECK(std::isfinite(loss), "the loss is not finite after ", c.warmup + c.steps, " steps");
  const double step_s = median(times);
  const double img_s = c.batch / step_s;
  const bool bf16 = c.precision == dp::Precision::kBFloat16;
  const std::string mode = bf16 ? "bf16" : c.tf32 ? "fp32 (TF32 on)" : "fp32 (TF32 off)";

  std::printf(
      "dptrain %s%s /%d %dx%d batch %d %s on %s: %.1f img/s, %.2f ms/step (median of %d after "
      "%d warm-up steps, %.1f s), peak device memory %.2f GiB (workspace %.2f GiB, activations "
      "%.2f GiB shared, %.2f GiB unshared), loss %.4f\n",
      c.model.c_str(), c.deconv ? " deconv" : "", c.divisor, c.size, c.size, c.batch, mode.c_str(),
      device.name.c_str(), img_s, 1e3 * step_s, c.steps, c.warmup, warmup_seconds,
      gib(be->peak_bytes()), gib(be->workspace_bytes()), gib(size_t(model->activation_bytes())),
      gib(size_t(model->unshared_activation_bytes())), loss);
  std::printf(
      "{\"impl\": \"dptrain\", \"gpu\": \"%s\", \"model\": \"%s\", \"deconv\": %s, "
      "\"width_divisor\": %d, \"size\": %d, \"batch\": %d, \"precision\": \"%s\", \"tf32\": %s, "
      "\"steps\": %d, \"warmup\": %d, \"step_seconds\": %.6f, \"img_per_s\": %.3f, "
      "\"peak_device_bytes\": %zu, \"workspace_bytes\": %zu}\n",
      json_escape(device.name).c_str(), c.model.c_str(), c.deconv ? "true" : "false", c.divisor,
      c.size, c.batch, bf16 ? "bf16" : "fp32", c.tf32 ? "true" : "false", c.steps, c.warmup, step_s,
      img_s, be->peak_bytes(), be->workspace_bytes());
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string tf32 = "on", precision = "fp32";
  po::options_description desc("Usage: bench_gpu_throughput [options]");
  desc.add_options()("help,h", "show this help")("model",
                                                 po::value(&c.model)->default_value(c.model),
                                                 "unet16, unet_resnet34, unet_resnet101")(
      "size", po::value(&c.size)->default_value(c.size), "image side (px)")(
      "batch", po::value(&c.batch)->default_value(c.batch), "batch size")(
      "steps", po::value(&c.steps)->default_value(c.steps), "timed steps")(
      "warmup", po::value(&c.warmup)->default_value(c.warmup),
      "untimed steps first (cuDNN algorithm choice, allocation)")(
      "width-divisor", po::value(&c.divisor)->default_value(c.divisor),
      "divides every hidden channel count")("deconv", po::bool_switch(&c.deconv),
                                            "decoder upsamples by transposed convolution")(
      "tf32", po::value(&tf32)->default_value(tf32),
      "on: fp32 convolutions may use TF32 tensor cores; off: strict fp32")(
      "precision", po::value(&precision)->default_value(precision),
      "fp32 or bf16 (convolutions in bf16, everything else fp32)")(
      "deterministic", po::bool_switch(&c.deterministic), "deterministic cuDNN algorithms only")(
      "profile", po::bool_switch(&c.profile),
      "cudaProfilerStart/Stop around the last timed step (for ncu --profile-from-start off)")(
      "log-algorithms", po::bool_switch(&c.log_algorithms),
      "one line per convolution pass with the cuDNN algorithm chosen for it")(
      "seed", po::value(&c.seed)->default_value(c.seed), "initialisation and data seed");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    DP_CHECK(tf32 == "on" || tf32 == "off", "--tf32 must be on or off, got ", tf32);
    c.tf32 = tf32 == "on";
    DP_CHECK(precision == "fp32" || precision == "bf16", "--precision must be fp32 or bf16, got ",
             precision);
    c.precision = precision == "bf16" ? dp::Precision::kBFloat16 : dp::Precision::kFloat32;
    DP_CHECK(c.size >= 1 && c.batch >= 1 && c.steps >= 1 && c.warmup >= 0,
             "need --size, --batch, --steps >= 1 and --warmup >= 0");
    run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_throughput: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
