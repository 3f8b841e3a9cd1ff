// Per-parameter gradient-ready times in Model::backward on the CPU (for bench/scaling_model.py).
//
// Builds a model with lib/ (no MPI), runs forward + BCE + backward on a random batch, and records
// the time of every GradListener::grad_ready call relative to the start of backward. Prints, per
// parameter tensor in backward (= arena) order, its name, bytes and the median ready time over the
// timed steps, plus the median forward and backward times, as CSV on stdout.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/model.hpp"
#include "dp/params.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Records (name, numel, time since reset) for every grad_ready call.
class Recorder : public dp::GradListener {
 public:
  struct Event {
    std::string name;
    int64_t numel;
    double ms;
  };
  void reset() {
    events_.clear();
    t0_ = Clock::now();
  }
  void grad_ready(const dp::ParamView& p) override {
    events_.push_back(
        {p.name, p.numel, std::chrono::duration<double, std::milli>(Clock::now() - t0_).count()});
  }
  const std::vector<Event>& events() const { return events_; }

 private:
  Clock::time_point t0_;
  std::vector<Event> events_;
};

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string model_name = "unet16", conv = "auto";
  int size = 64, divisor = 1, batch = 1, steps = 5, warmup = 2;
  po::options_description desc("bench_backward_timeline: per-parameter gradient-ready times");
  desc.add_options()("help", "this help")(
      "model", po::value(&model_name)->default_value(model_name), "model name")(
      "size", po::value(&size)->default_value(size), "image height = width")(
      "divisor", po::value(&divisor)->default_value(divisor), "width divisor")(
      "batch", po::value(&batch)->default_value(batch), "batch size")(
      "steps", po::value(&steps)->default_value(steps), "timed steps (median)")(
      "warmup", po::value(&warmup)->default_value(warmup), "untimed steps first")(
      "cpu-conv", po::value(&conv)->default_value(conv), "auto | direct | winograd");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::printf("%s\n", (std::ostringstream() << desc).str().c_str());
    return 0;
  }
  dp::CpuOptions co;
  co.conv_algo = conv == "direct"     ? dp::CpuConvAlgo::kDirect
                 : conv == "winograd" ? dp::CpuConvAlgo::kWinograd
                                      : dp::CpuConvAlgo::kAuto;
  std::unique_ptr<dp::Backend> backend = dp::make_cpu_backend(co);
  dp::ModelConfig mc;
  mc.name = model_name;
  mc.width_divisor = divisor;
  std::unique_ptr<dp::Model> model = dp::make_model(mc, *backend);
  model->setup(batch, size, size);
  model->params().initialize(1234);

  const int64_t pixels = int64_t{size} * size;
  dp::Buffer images(static_cast<size_t>(batch * pixels * 3) * sizeof(float));
  dp::Buffer masks(static_cast<size_t>(batch * pixels) * sizeof(float));
  dp::Buffer diff(static_cast<size_t>(batch * pixels) * sizeof(float));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < batch * pixels * 3; ++i) images.f32()[i] = u(rng);
  for (int64_t i = 0; i < batch * pixels; ++i) masks.f32()[i] = u(rng) > 0.8f ? 1.0f : 0.0f;

  Recorder rec;
  std::vector<double> fwd, bwd;
  std::vector<std::vector<double>> ready;  // [param][step]
  std::vector<Recorder::Event> order;
  const int64_t count = batch * pixels;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto t0 = Clock::now();
    const float* logits = model->forward(images.f32(), batch);
    backend->bce_with_logits(count, logits, masks.f32(), 1.0f, 1.0f / float(count), diff.f32());
    const auto t1 = Clock::now();
    rec.reset();
    model->backward(diff.f32(), &rec);
    const auto t2 = Clock::now();
    if (s < warmup) continue;
    fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    if (order.empty()) {
      order = rec.events();
      ready.resize(order.size());
    }
    for (size_t i = 0; i < order.size(); ++i) ready[i].push_back(rec.events()[i].ms);
  }
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf(
      "# Gradient-ready timeline of one backward pass (bench_backward_timeline; input to "
      "bench/scaling_model.py)\n");
  std::printf(
      "# model %s /%d, %dx%d, batch %d, %d thread(s), cpu-conv %s, %d timed steps after %d; "
      "load average %s\n",
      model_name.c_str(), divisor, size, size, batch, omp_get_max_threads(), conv.c_str(), steps,
      warmup, load.c_str());
  std::printf("# forward+loss median ms %.2f; backward median ms %.2f (min %.2f, max %.2f)\n",
              median(fwd), median(bwd), *std::min_element(bwd.begin(), bwd.end()),
              *std::max_element(bwd.begin(), bwd.end()));
  std::printf("index,name,bytes,ready_ms\n");
  for (size_t i = 0; i < order.size(); ++i)
    std::printf("%zu,%s,%lld,%.3f\n", i, order[i].name.c_str(),
                static_cast<long long>(order[i].numel * 4), median(ready[i]));
  std::printf("end,backward,0,%.3f\n", median(bwd));
  return 0;
}
