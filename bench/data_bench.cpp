// Data pipeline benchmark: Loader images/s per rank, step time with HDF5 loading vs in memory.
#include <omp.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/loader.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "dp/synth.hpp"

namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSeed = 3;
constexpr float kLr = 0.01f;

struct Config {
  std::string dir = "/tmp";
  int size = 448;
  int samples = 64;  // dataset size (one rank's shard in this single-process benchmark)
  int batch = 4;
  int workers = 1;
  int prefetch = 2;
  int gzip = 0;  // gzip level of the dataset's chunks (0: uncompressed)
  int divisor = 8;
  int steps = 6;   // measured steps per block
  int blocks = 2;  // blocks of each mode, alternated (A B A B) to spread out machine noise; 0: none
  int epochs = 3;  // loader epochs per configuration; the first with cache fills it
};

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string dataset_path(const Config& c) {
  const std::string path = c.dir + "/dp-bench-data-" + std::to_string(c.size) + "-" +
                           std::to_string(c.samples) +
                           (c.gzip > 0 ? "-gzip" + std::to_string(c.gzip) : "") + ".h5";
  dp::data::SynthOptions so;
  so.train_count = c.samples;
  so.val_count = 0;
  so.height = so.width = c.size;
  so.seed = kSeed;
  so.gzip_level = c.gzip;
  if (!dp::data::synthetic_matches(path, so)) {
    std::printf("writing %s (%d synthetic samples of %dx%d)...\n", path.c_str(), c.samples, c.size,
                c.size);
    dp::data::write_synthetic(path, so);
  }
  return path;
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// Images/s of the Loader alone (the consumer only takes batches), per epoch.
std::vector<double> loader_rates(const std::string& path, const Config& c, bool cache,
                                 dp::data::Augment augment) {
  dp::data::LoaderOptions o;
  o.batch_size = c.batch;
  o.prefetch = c.prefetch;
  o.workers = c.workers;
  o.augment = augment;
  o.cache = cache;
  o.seed = kSeed;
  dp::data::Loader loader(path, "train", o);
  std::vector<double> rates;
  for (int e = 0; e < c.epochs; ++e) {
    const auto t0 = Clock::now();
    int64_t images = 0;
    loader.start(all_indices(loader.dataset_size()), e);
    while (const dp::data::Batch* b = loader.next()) images += b->n;
    rates.push_back(static_cast<double>(images) / seconds(t0));
  }
  return rates;
}

// One training step (forward, loss, backward, SGD) on `images`/`masks` of n samples.
struct Trainer {
  std::unique_ptr<dp::Backend> backend = dp::make_cpu_backend();
  std::unique_ptr<dp::Model> model;
  std::unique_ptr<dp::Sgd> sgd;
  dp::Buffer diff;
  int64_t pixels = 0;

  explicit Trainer(const Config& c) {
    dp::ModelConfig mc;
    mc.name = "unet16";
    mc.width_divisor = c.divisor;
    model = dp::make_model(mc, *backend);
    model->setup(c.batch, c.size, c.size);
    model->params().initialize(kSeed);
    sgd = std::make_unique<dp::Sgd>(model->params(), *backend, dp::SgdOptions{kLr, 0.9f, 1e-4f});
    pixels = static_cast<int64_t>(c.size) * c.size;
    diff = dp::Buffer(static_cast<size_t>(c.batch * pixels) * sizeof(float));
  }

  void step(const float* images, const float* masks, int n) {
    const int64_t count = n * pixels;
    const float* logits = model->forward(images, n);
    backend->bce_with_logits(count, logits, masks, 1.0f, 1.0f / float(count), diff.f32());
    model->backward(diff.f32());
    sgd->step(kLr);
  }
};

void run(const Config& c) {
  const std::string path = dataset_path(c);
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf("machine: %u CPUs; OMP threads per rank: %d; load average: %s\n",
              std::thread::hardware_concurrency(), omp_get_max_threads(),
              load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1)).c_str());

  std::printf(
      "\n| loader, %dx%d, gzip %d, batch %d, %d worker(s), prefetch %d | first epoch img/s | "
      "later epochs img/s |\n|---|---|---|\n",
      c.size, c.size, c.gzip, c.batch, c.workers, c.prefetch);
  for (const auto augment : {dp::data::Augment::kNone, dp::data::Augment::kFull}) {
    for (const bool cache : {false, true}) {
      const std::vector<double> r = loader_rates(path, c, cache, augment);
      const std::vector<double> later(r.begin() + 1, r.end());
      std::printf("| --augment %s%s | %.0f | %.0f |\n", dp::data::augment_name(augment),
                  cache ? " --cache" : "", r.front(), median(later));
    }
  }

  if (c.blocks == 0) return;
  // Training step time: batches from the Loader (HDF5, full augmentation, no cache) vs the same
  // first batch held in memory. Blocks alternate so that machine noise hits both modes alike.
  Trainer t(c);
  dp::data::LoaderOptions o;
  o.batch_size = c.batch;
  o.prefetch = c.prefetch;
  o.workers = c.workers;
  o.augment = dp::data::Augment::kFull;
  o.seed = kSeed;
  dp::data::Loader loader(path, "train", o);
  const size_t image_floats = static_cast<size_t>(c.batch) * t.pixels * 3;
  dp::Buffer images(image_floats * sizeof(float)), masks(image_floats / 3 * sizeof(float));
  int64_t epoch = 0;
  loader.start(all_indices(loader.dataset_size()), epoch);
  const dp::data::Batch* first = loader.next();
  std::memcpy(images.f32(), first->images, image_floats * sizeof(float));
  std::memcpy(masks.f32(), first->masks, image_floats / 3 * sizeof(float));
  t.step(images.f32(), masks.f32(), c.batch);  // warm-up: oneDNN primitives, first touches
  std::vector<double> memory, hdf5, wait;      // wait: time the step spent in Loader::next()
  for (int block = 0; block < c.blocks; ++block) {
    for (int s = 0; s < c.steps; ++s) {
      const auto t0 = Clock::now();
      t.step(images.f32(), masks.f32(), c.batch);
      memory.push_back(seconds(t0));
    }
    for (int s = 0; s < c.steps; ++s) {
      const auto t0 = Clock::now();
      const dp::data::Batch* b = loader.next();
      if (b == nullptr || b->n < c.batch) {  // a new epoch when this one runs out
        loader.start(all_indices(loader.dataset_size()), ++epoch);
        b = loader.next();
      }
      wait.push_back(seconds(t0));
      t.step(b->images, b->masks, b->n);
      hdf5.push_back(seconds(t0));
    }
  }
  const double m = median(memory), h = median(hdf5);
  std::printf(
      "\n| step, unet16 /%d, %dx%d, batch %d (median of %zu steps) | s/step | img/s |\n"
      "|---|---|---|\n| batch already in memory | %.3f | %.2f |\n"
      "| batches from HDF5 (Loader, %d worker, --augment full) | %.3f | %.2f |\n"
      "| loading overhead: step time | %+.2f%% | |\n"
      "| loading overhead: wait in Loader::next() (median, max) | %.2f ms, %.2f ms | |\n",
      c.divisor, c.size, c.size, c.batch, memory.size(), m, c.batch / m, c.workers, h, c.batch / h,
      100.0 * (h - m) / m, 1e3 * median(wait), 1e3 * *std::max_element(wait.begin(), wait.end()));
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  po::options_description desc(
      "Usage: bench_data [options]  (run with OMP_NUM_THREADS=1 for one compute thread)");
  desc.add_options()("help,h", "show this help")("dir", po::value(&c.dir)->default_value(c.dir),
                                                 "where the benchmark dataset is cached")(
      "size", po::value(&c.size)->default_value(c.size), "image side (px)")(
      "samples", po::value(&c.samples)->default_value(c.samples), "dataset size")(
      "batch", po::value(&c.batch)->default_value(c.batch), "batch size")(
      "workers", po::value(&c.workers)->default_value(c.workers), "loader workers")(
      "prefetch", po::value(&c.prefetch)->default_value(c.prefetch), "loader prefetch")(
      "gzip", po::value(&c.gzip)->default_value(c.gzip), "gzip level of the dataset (0-9)")(
      "divisor", po::value(&c.divisor)->default_value(c.divisor), "unet16 width divisor")(
      "steps", po::value(&c.steps)->default_value(c.steps), "steps per block")(
      "blocks", po::value(&c.blocks)->default_value(c.blocks), "blocks per mode (0: loader only)")(
      "epochs", po::value(&c.epochs)->default_value(c.epochs), "loader epochs per row");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    DP_CHECK(c.samples >= c.batch && c.batch >= 1 && c.epochs >= 2 && c.steps >= 1 && c.blocks >= 0,
             "need samples >= batch >= 1, epochs >= 2, steps >= 1, blocks >= 0");
    run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
