// Writes the fuzz seed corpora (tests/fuzz/corpus/<target>/seed_*) with the project's own writers.
// Usage: fuzz_make_seeds CORPUS_DIR. Every file is small (the largest, a UNet16/32 checkpoint,
// ~120 KB); regression inputs found by fuzzing sit beside them and are not touched.
#include <png.h>
#include <turbojpeg.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"
#include "dp/dataset.hpp"
#include "dp/h5.hpp"
#include "dp/image_io.hpp"
#include "dp/model.hpp"

namespace {

namespace fs = std::filesystem;
using dp::data::PixelFormat;

constexpr int kSide = 32;       // dataset images (a multiple of 32, as the models need)
constexpr int kImageSide = 16;  // image seeds

// A deterministic RGB image with a diagonal "crack" and its 0/1 mask.
void sample(int index, int side, std::vector<uint8_t>& image, std::vector<uint8_t>& mask) {
  image.assign(static_cast<size_t>(side) * side * 3, 0);
  mask.assign(static_cast<size_t>(side) * side, 0);
  for (int y = 0; y < side; ++y) {
    for (int x = 0; x < side; ++x) {
      const size_t p = static_cast<size_t>(y) * side + x;
      const bool crack = (x + index) % side == y;
      mask[p] = crack ? 1 : 0;
      for (int c = 0; c < 3; ++c)
        image[p * 3 + c] = static_cast<uint8_t>(crack ? 20 : 120 + 40 * c + (x ^ y) % 16);
    }
  }
}

void write_dataset(const std::string& path, int64_t train, int64_t val, int gzip) {
  dp::data::DatasetWriter w(path, kSide, kSide, train, val, gzip);
  std::vector<uint8_t> image, mask;
  for (int64_t i = 0; i < train; ++i) {
    sample(static_cast<int>(i), kSide, image, mask);
    w.write("train", i, image.data(), mask.data());
  }
  for (int64_t i = 0; i < val; ++i) {
    sample(static_cast<int>(i + 7), kSide, image, mask);
    w.write("val", i, image.data(), mask.data());
  }
  w.set_attr("generator", std::string("fuzz seed"));
  w.set_attr("seed", int64_t{7});
  w.set_attr("crack_width", 1.5);
  w.commit();
}

dp::CheckpointMeta meta_for(const std::string& model) {
  dp::CheckpointMeta m;
  m.epoch = 2;
  m.step = 8;
  m.model = model;
  m.width_divisor = 32;
  m.height = kSide;
  m.width = kSide;
  m.global_batch = 4;
  m.seed = 1;
  m.lr = 0.05;
  m.best_valid_loss = 0.5;
  m.best_epoch = 2;
  m.best_score = 0.5;
  m.options =
      "model = unet16\nnormalize = imagenet\nnormalize_mean = 0.485 0.456 0.406\n"
      "normalize_std = 0.229 0.224 0.225\n";
  m.train_loss = m.valid_loss = m.valid_iou = m.epoch_seconds = {0.7, 0.5};
  m.valid_dice = m.valid_precision = m.valid_recall = {0.1, 0.2};
  m.epoch_step = 1;
  m.epoch_position = 4;
  m.epoch_partial = {1, 2, 3, 4, 5, 6, 7};
  return m;
}

// A two-tensor store: the checkpoint layout without a whole model.
void write_tiny_checkpoint(const std::string& path, const std::vector<std::string>& state_names) {
  dp::ParamStore params, buffers;
  params.add("final.weight", {1, 1, 1, 1}, 1);
  params.add("final.bias", {1}, 1);
  params.finalize();
  params.initialize(3);
  buffers.add("conv1.1.running_mean", {2}, 0, dp::Init::kZeros);
  buffers.finalize();
  buffers.initialize(3);
  std::vector<std::vector<float>> arenas;
  arenas.reserve(state_names.size());
  dp::OptimizerState state;
  for (const std::string& name : state_names) {
    arenas.emplace_back(static_cast<size_t>(params.arena_size()), 0.25f);
    state.push_back({name, arenas.back().data()});
  }
  dp::save_checkpoint(path, params, state, meta_for("unet16"), &buffers);
}

// An --init-weights file of PyTorch keys (root datasets), as tools/pt_to_h5.py writes them.
void write_torch_keys(const std::string& path) {
  dp::h5::File f(path, dp::h5::Mode::kTruncate);
  const std::vector<float> w(2 * 3 * 3 * 3, 0.5f), b(2, 0.1f);
  dp::h5::Dataset::create(f, "features.0.weight", dp::h5::Type::kFloat32, {2, 3, 3, 3})
      .write(w.data());
  dp::h5::Dataset::create(f, "features.0.bias", dp::h5::Type::kFloat32, {2}).write(b.data());
  dp::h5::Dataset::create(f, "classifier.0.bias", dp::h5::Type::kFloat32, {2}).write(b.data());
}

void write_bytes(const std::string& path, const unsigned char* data, size_t size) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), size);
}

// A JPEG through TurboJPEG directly (flags the project's writer does not offer).
void write_jpeg_flags(const std::string& path, const std::vector<uint8_t>& rgb, int subsampling,
                      int flags) {
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(h, rgb.data(), kImageSide, 0, kImageSide, TJPF_RGB, &out, &size, subsampling, 85,
                  flags) != 0) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), tjGetErrorStr2(h));
    std::exit(1);
  }
  write_bytes(path, out, size);
  tjFree(out);
  tjDestroy(h);
}

// A palette PNG through libpng's simplified API.
void write_palette_png(const std::string& path, const std::vector<uint8_t>& rgb) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = kImageSide;
  image.height = kImageSide;
  image.format = PNG_FORMAT_RGB_COLORMAP;
  image.colormap_entries = 4;
  const uint8_t colormap[4 * 3] = {0, 0, 0, 255, 0, 0, 0, 255, 0, 255, 255, 255};
  std::vector<uint8_t> index(static_cast<size_t>(kImageSide) * kImageSide);
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<uint8_t>(rgb[i * 3] % 4);
  if (!png_image_write_to_file(&image, path.c_str(), 0, index.data(), 0, colormap)) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), image.message);
    std::exit(1);
  }
}

void write_images(const std::string& dir) {
  std::vector<uint8_t> rgb, gray;
  sample(3, kImageSide, rgb, gray);
  for (uint8_t& g : gray) g = static_cast<uint8_t>(g * 255);
  const int n = kImageSide;
  dp::data::write_jpeg(dir + "/seed_rgb.jpg", rgb.data(), n, n, PixelFormat::kRgb, 90);
  dp::data::write_jpeg(dir + "/seed_gray.jpg", gray.data(), n, n, PixelFormat::kGray, 90);
  write_jpeg_flags(dir + "/seed_progressive.jpg", rgb, TJSAMP_444, TJFLAG_PROGRESSIVE);
  write_jpeg_flags(dir + "/seed_422.jpg", rgb, TJSAMP_422, 0);
  dp::data::write_png(dir + "/seed_rgb.png", rgb.data(), n, n, 3);
  dp::data::write_png(dir + "/seed_gray.png", gray.data(), n, n, 1);
  std::vector<uint8_t> ga, rgba, rgba_clear;
  std::vector<uint16_t> rgb16;
  for (size_t i = 0; i < gray.size(); ++i) {
    ga.insert(ga.end(), {gray[i], 255});
    rgba.insert(rgba.end(), {rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2], 255});
    for (int c = 0; c < 3; ++c) rgb16.push_back(static_cast<uint16_t>(rgb[i * 3 + c] * 257));
  }
  rgba_clear = rgba;
  rgba_clear[3 * 4 + 3] = 0;  // one transparent pixel
  dp::data::write_png(dir + "/seed_ga.png", ga.data(), n, n, 2);
  dp::data::write_png(dir + "/seed_rgba.png", rgba.data(), n, n, 4);
  dp::data::write_png(dir + "/seed_transparent.png", rgba_clear.data(), n, n, 4);
  dp::data::write_png16(dir + "/seed_rgb16.png", rgb16.data(), n, n, 3);
  write_palette_png(dir + "/seed_palette.png", rgb);
}

void write_configs(const std::string& dir) {
  const char* const files[][2] = {
      {"seed_run.ini",
       "# a run\nepochs = 3\nbatch-size = 2\nlr = 0.01\nmodel = unet16\nwidth-divisor = 8\n"
       "optimizer = adamw\nlr-schedule = cosine\nwarmup-epochs = 1\naugment = flips\n"
       "cache = true\ndrop-last = true\nmodel-dir = runs/x\nresume = never\n"},
      {"seed_all.ini",
       "data = crack.h5\nworkers = 2\nprefetch = 3\nnormalize = dataset\ndeconv = true\n"
       "sync-bn = false\ndropout = 0.1\nmomentum = 0.8\nnesterov = true\nweight-decay = 0\n"
       "adam-beta1 = 0.8\nadam-beta2 = 0.99\nadam-eps = 1e-7\nlr-scaling = sqrt\n"
       "clip-grad-norm = 1.5\nlr-step = 10\nlr-gamma = 0.5\npos-weight = true\nthreshold = 0.4\n"
       "seed = 42\nmax-steps = 6\ndevice = cpu\ndeterministic = true\nprecision = fp32\n"
       "cpu-conv = direct\nthreads = 1\nbucket-mb = 0.5\nno-overlap = true\n"
       "accumulation-steps = 2\ncheck-sync-every = 3\nsave-every = 2\nkeep-last = 1\n"
       "best-metric = iou\nval-every = 2\nlog-every = 5\nprogress = lines\nreport = true\n"},
      {"seed_bad.ini", "[section]\nepochs = three\nunknown-key = 1\n"},
  };
  for (const auto& f : files) std::ofstream(dir + "/" + f[0]) << f[1];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  for (const char* t : {"dataset", "checkpoint", "image", "config"})
    fs::create_directories(root + "/" + t);
  write_dataset(root + "/dataset/seed_plain.h5", 2, 1, 0);
  write_dataset(root + "/dataset/seed_gzip.h5", 1, 1, 6);
  write_dataset(root + "/dataset/seed_train_only.h5", 1, 0, 1);

  const std::string ck = root + "/checkpoint/";
  auto backend = dp::make_cpu_backend(dp::CpuOptions{});
  dp::ModelConfig mc;
  mc.width_divisor = 32;
  auto model = dp::make_model(mc, *backend);
  model->params().initialize(1);
  dp::save_checkpoint(ck + "seed_unet16_w32.h5", model->params(), nullptr, meta_for("unet16"),
                      &model->buffers());
  write_tiny_checkpoint(ck + "seed_tiny_sgd.h5", {"momentum_buffer"});
  write_tiny_checkpoint(ck + "seed_tiny_adamw.h5", {"exp_avg", "exp_avg_sq"});
  write_torch_keys(ck + "seed_torch_keys.h5");

  write_images(root + "/image");
  write_configs(root + "/config");
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
