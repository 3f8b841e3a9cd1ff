// Loader: worker threads fill a ring of pre-allocated NHWC float batches, delivered in order.
#include "dp/loader.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "dp/buffer.hpp"
#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/image_io.hpp"
#include "dp/rng.hpp"

namespace dp::data {

namespace {

constexpr int kChannels = 3;
constexpr int kLevels = 256;  // uint8 values
constexpr float kMaxByte = 255.0f;
constexpr int kMaxWorkers = 256;
constexpr int kMaxSide = kMaxImageSide;  // of a crop
constexpr float kFlipProbability = 0.5f;
constexpr uint64_t kQuarterTurns = 4;
constexpr float kJitter = 0.2f;
constexpr uint64_t kCropStream = 0x63726F70;  // "crop": the crop's draws, apart from draw()'s
constexpr float kMaxScale =
    4.0f;  // of --scale-jitter  // brightness and contrast factors in [1 - kJitter, 1 + kJitter]
// Grey level of an RGB pixel (ITU-R BT.601 luma, as torchvision's rgb_to_grayscale).
constexpr float kLuma[kChannels] = {0.299f, 0.587f, 0.114f};

using Lut = std::array<std::array<float, kLevels>, kChannels>;  // uint8 -> float, per channel

// The random choices for one sample: a function of (seed, epoch, index) only.
struct SampleAugment {
  bool hflip = false, vflip = false;
  int quarter_turns = 0;  // counter-clockwise, applied after the flips
  float brightness = 1.0f, contrast = 1.0f;
  bool jitter() const { return brightness != 1.0f || contrast != 1.0f; }
};

SampleAugment draw(Augment mode, uint64_t seed, int64_t epoch, int64_t index, bool square) {
  SampleAugment a;
  if (mode == Augment::kNone) return a;
  Rng rng(key(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)));
  // Always drawn in this order, so a sample's flips are the same with kFlips and kFull.
  a.hflip = rng.uniform() < kFlipProbability;
  a.vflip = rng.uniform() < kFlipProbability;
  const int turns = static_cast<int>(rng.below(kQuarterTurns));
  const float brightness = rng.uniform(1.0f - kJitter, 1.0f + kJitter);
  const float contrast = rng.uniform(1.0f - kJitter, 1.0f + kJitter);
  if (mode == Augment::kFull) {
    a.quarter_turns = square ? turns : 0;
    a.brightness = brightness;
    a.contrast = contrast;
  }
  return a;
}

// The stored-image window a sample's crop comes from: origin and size in stored pixels.
struct Window {
  float y = 0, x = 0, h = 0, w = 0;
  bool exact = false;  // integer origin, crop-sized: a plain copy
};

Window crop_window(const LoaderOptions& o, int64_t epoch, int64_t index, int stored_h,
                   int stored_w) {
  Window win;
  if (o.crop == Crop::kCenter) {
    win = {static_cast<float>((stored_h - o.crop_height) / 2),
           static_cast<float>((stored_w - o.crop_width) / 2), static_cast<float>(o.crop_height),
           static_cast<float>(o.crop_width), true};
    return win;
  }
  Rng rng(key(o.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index), kCropStream));
  const float s = rng.uniform(o.scale_min, o.scale_max);
  const float ry = rng.uniform(), rx = rng.uniform();
  if (o.scale_min == 1.0f && o.scale_max == 1.0f) {
    const int y = static_cast<int>(ry * static_cast<float>(stored_h - o.crop_height + 1));
    const int x = static_cast<int>(rx * static_cast<float>(stored_w - o.crop_width + 1));
    win = {static_cast<float>(std::min(y, stored_h - o.crop_height)),
           static_cast<float>(std::min(x, stored_w - o.crop_width)),
           static_cast<float>(o.crop_height), static_cast<float>(o.crop_width), true};
    return win;
  }
  win.h = std::min(static_cast<float>(o.crop_height) / s, static_cast<float>(stored_h));
  win.w = std::min(static_cast<float>(o.crop_width) / s, static_cast<float>(stored_w));
  win.y = ry * (static_cast<float>(stored_h) - win.h);
  win.x = rx * (static_cast<float>(stored_w) - win.w);
  return win;
}

// Resamples the window of a stored sample (h x w) to out_h x out_w: bilinear images (pixel
// centres aligned), nearest masks.
void resample(const uint8_t* image, const uint8_t* mask, int h, int w, const Window& win, int out_h,
              int out_w, uint8_t* dst_image, uint8_t* dst_mask) {
  if (win.exact) {
    const auto y0 = static_cast<int>(win.y), x0 = static_cast<int>(win.x);
    for (int y = 0; y < out_h; ++y) {
      const size_t src = static_cast<size_t>(y0 + y) * w + x0;
      std::copy_n(image + src * kChannels, static_cast<size_t>(out_w) * kChannels,
                  dst_image + static_cast<size_t>(y) * out_w * kChannels);
      std::copy_n(mask + src, out_w, dst_mask + static_cast<size_t>(y) * out_w);
    }
    return;
  }
  const float sy = win.h / static_cast<float>(out_h), sx = win.w / static_cast<float>(out_w);
  for (int y = 0; y < out_h; ++y) {
    const float fy = std::clamp(win.y + (y + 0.5f) * sy - 0.5f, 0.0f, static_cast<float>(h - 1));
    const int y0 = static_cast<int>(fy), y1 = std::min(y0 + 1, h - 1);
    const float ay = fy - static_cast<float>(y0);
    const int my = std::min(static_cast<int>(win.y + (y + 0.5f) * sy), h - 1);
    for (int x = 0; x < out_w; ++x) {
      const float fx = std::clamp(win.x + (x + 0.5f) * sx - 0.5f, 0.0f, static_cast<float>(w - 1));
      const int x0 = static_cast<int>(fx), x1 = std::min(x0 + 1, w - 1);
      const float ax = fx - static_cast<float>(x0);
      uint8_t* out = dst_image + (static_cast<size_t>(y) * out_w + x) * kChannels;
      for (int c = 0; c < kChannels; ++c) {
        auto at = [&](int yy, int xx) {
          return static_cast<float>(image[(static_cast<size_t>(yy) * w + xx) * kChannels + c]);
        };
        const float v = (1 - ay) * ((1 - ax) * at(y0, x0) + ax * at(y0, x1)) +
                        ay * ((1 - ax) * at(y1, x0) + ax * at(y1, x1));
        out[c] = static_cast<uint8_t>(std::clamp(v + 0.5f, 0.0f, kMaxByte));
      }
      const int mx = std::min(static_cast<int>(win.x + (x + 0.5f) * sx), w - 1);
      dst_mask[static_cast<size_t>(y) * out_w + x] = mask[static_cast<size_t>(my) * w + mx];
    }
  }
}

// Where output pixel (y, x) comes from: source index = origin + y * dy + x * dx. The output is
// the source flipped, then rotated (np.rot90 semantics; quarter turns only on square images).
struct Mapping {
  int64_t origin = 0, dy = 0, dx = 0;
};

Mapping mapping(const SampleAugment& a, int h, int w) {
  auto source = [&](int y, int x) {
    int ry = y, rx = x;  // position in the flipped image
    switch (a.quarter_turns) {
      case 1:
        ry = x, rx = w - 1 - y;
        break;
      case 2:
        ry = h - 1 - y, rx = w - 1 - x;
        break;
      case 3:
        ry = h - 1 - x, rx = y;
        break;
      default:
        break;
    }
    const int sy = a.vflip ? h - 1 - ry : ry;
    const int sx = a.hflip ? w - 1 - rx : rx;
    return static_cast<int64_t>(sy) * w + sx;
  };
  const int64_t origin = source(0, 0);
  return {origin, h > 1 ? source(1, 0) - origin : 0, w > 1 ? source(0, 1) - origin : 0};
}

// The normalising lookup table with brightness and contrast jitter folded in (torchvision's
// order: x*b clamped; then blended with the mean grey level of that image, clamped).
void jitter_lut(const uint8_t* image, size_t pixels, const SampleAugment& a,
                const std::array<float, kChannels>& mean, const std::array<float, kChannels>& std,
                Lut& lut) {
  std::array<float, kLevels> bright{};
  for (int v = 0; v < kLevels; ++v) bright[v] = std::min(a.brightness * v, kMaxByte);
  // The mean grey level from per-channel histograms: exact counts, independent of any order.
  std::array<std::array<uint32_t, kLevels>, kChannels> hist{};
  for (size_t i = 0; i < pixels; ++i) {
    for (int c = 0; c < kChannels; ++c) ++hist[c][image[i * kChannels + c]];
  }
  double grey = 0;
  for (int c = 0; c < kChannels; ++c) {
    for (int v = 0; v < kLevels; ++v) grey += double(kLuma[c]) * hist[c][v] * bright[v];
  }
  const auto m = static_cast<float>(grey / static_cast<double>(pixels));
  for (int c = 0; c < kChannels; ++c) {
    for (int v = 0; v < kLevels; ++v) {
      const float x = std::clamp(a.contrast * bright[v] + (1.0f - a.contrast) * m, 0.0f, kMaxByte);
      lut[c][v] = (x / kMaxByte - mean[c]) / std[c];
    }
  }
}

}  // namespace

const char* augment_name(Augment a) {
  switch (a) {
    case Augment::kNone:
      return "none";
    case Augment::kFlips:
      return "flips";
    case Augment::kFull:
      return "full";
  }
  return "?";
}

const char* normalize_name(Normalize n) {
  return n == Normalize::kImagenet ? "imagenet" : "dataset";
}

void parse_crop(const std::string& random_crop, const std::string& scale_jitter,
                LoaderOptions& options) {
  options.crop_height = options.crop_width = 0;
  options.scale_min = options.scale_max = 1.0f;
  if (!random_crop.empty()) {
    const size_t x = random_crop.find('x');
    int h = 0, w = 0;
    size_t used_h = 0, used_w = 0;
    try {
      h = std::stoi(random_crop.substr(0, x), &used_h);
      w = x == std::string::npos ? 0 : std::stoi(random_crop.substr(x + 1), &used_w);
    } catch (const std::exception&) {
      h = w = 0;
    }
    DP_CHECK(x != std::string::npos && used_h == x && used_w == random_crop.size() - x - 1 &&
                 h >= 1 && w >= 1 && h <= kMaxSide && w <= kMaxSide,
             "invalid --random-crop '", random_crop, "', expected HxW with sides in [1, ", kMaxSide,
             "] (e.g. 256x256)");
    options.crop_height = h;
    options.crop_width = w;
  }
  if (!scale_jitter.empty()) {
    const size_t dash = scale_jitter.find('-', 1);
    float lo = 0, hi = 0;
    size_t used_lo = 0, used_hi = 0;
    try {
      lo = std::stof(scale_jitter.substr(0, dash), &used_lo);
      hi = dash == std::string::npos ? 0 : std::stof(scale_jitter.substr(dash + 1), &used_hi);
    } catch (const std::exception&) {
      lo = hi = 0;
    }
    DP_CHECK(dash != std::string::npos && used_lo == dash &&
                 used_hi == scale_jitter.size() - dash - 1 && lo > 0 && lo <= hi && hi <= kMaxScale,
             "invalid --scale-jitter '", scale_jitter,
             "', expected LO-HI with 0 < LO <= HI <= ", kMaxScale, " (e.g. 0.8-1.2)");
    options.scale_min = lo;
    options.scale_max = hi;
  }
}

LoaderOptions validation_options(LoaderOptions train) {
  train.augment = Augment::kNone;
  train.crop = Crop::kCenter;
  train.scale_min = train.scale_max = 1.0f;
  return train;
}

struct Loader::Impl {
  struct Slot {
    Buffer images, masks;  // 64-byte aligned, allocated once
    std::vector<int64_t> indices;
    Batch batch;
    int64_t batch_id = -1;  // which batch of the epoch the slot holds (guarded by m)
    int remaining = 0;      // samples of it still being prepared (guarded by m)
  };
  struct Scratch {  // one sample as read from the file, and its crop, per worker
    std::vector<uint8_t> image, mask, crop_image, crop_mask;
  };
  enum CacheState : uint8_t { kAbsent, kFilling, kCached };

  Dataset dataset;
  LoaderOptions opt;
  std::array<float, kChannels> mean{}, stdev{};
  size_t pixels = 0;         // per stored sample
  int out_h = 0, out_w = 0;  // of a batch sample: the crop's, or the stored size
  size_t out_pixels = 0;
  bool cropping = false;  // samples are cropped and/or scaled
  Lut lut{};              // normalisation without jitter
  std::vector<Scratch> scratch;
  std::vector<Slot> slots;  // the ring: prefetch + 1 batches
  // With cache: per dataset index, image (pixels * 3) then mask (pixels). A worker that marks an
  // entry kFilling (under m) is the only one to touch it until it marks it kCached.
  std::vector<Buffer> cache;
  std::vector<uint8_t> cache_state;  // guarded by m
  int64_t cached = 0;                // guarded by m

  // Epoch state.
  std::vector<int64_t> indices;
  size_t total = 0;  // sample positions to deliver this epoch
  int64_t epoch = 0;
  std::vector<std::thread> workers;
  mutable std::mutex m;
  std::condition_variable slot_free;    // workers wait for the ring to advance
  std::condition_variable batch_ready;  // the consumer waits for its batch
  size_t next_pos = 0;                  // next sample position to claim (guarded by m)
  int64_t current = 0;                  // batch the consumer holds or waits for (guarded by m)
  bool held = false;                    // the consumer holds batch `current` (guarded by m)
  int busy = 0;                         // workers preparing a sample (guarded by m)
  std::exception_ptr error;             // the first worker error (guarded by m)
  bool stopping = false;                // guarded by m
  bool active = false;  // an epoch was started and not finished (consumer thread only)

  Impl(const std::string& path, const std::string& split, LoaderOptions options)
      : dataset(path, split), opt(options) {
    DP_CHECK(opt.batch_size >= 1, "loader: batch size ", opt.batch_size, " must be at least 1");
    DP_CHECK(opt.prefetch >= 0, "loader: prefetch ", opt.prefetch, " must not be negative");
    DP_CHECK(opt.workers >= 1 && opt.workers <= kMaxWorkers, "loader: workers ", opt.workers,
             " out of range [1, ", kMaxWorkers, "]");
    if (opt.normalize == Normalize::kDataset) {
      DP_CHECK(dataset.has_stats(), "cannot normalise with the dataset's own statistics: '", path,
               "' has no root attributes 'mean' and 'std' (dpprep writes them); use ImageNet's");
      mean = dataset.mean();
      stdev = dataset.std();
    } else {
      mean = kImagenetMean;
      stdev = kImagenetStd;
    }
    for (int c = 0; c < kChannels; ++c) {
      for (int v = 0; v < kLevels; ++v) lut[c][v] = (v / kMaxByte - mean[c]) / stdev[c];
    }
    pixels = static_cast<size_t>(dataset.height()) * dataset.width();
    DP_CHECK(opt.scale_min > 0 && opt.scale_min <= opt.scale_max, "loader: scale range [",
             opt.scale_min, ", ", opt.scale_max, "] must be positive and ordered");
    DP_CHECK(opt.crop_height >= 0 && opt.crop_width >= 0 &&
                 (opt.crop_height == 0) == (opt.crop_width == 0),
             "loader: bad crop ", opt.crop_height, "x", opt.crop_width);
    out_h = opt.crop_height ? opt.crop_height : dataset.height();
    out_w = opt.crop_width ? opt.crop_width : dataset.width();
    DP_CHECK(out_h <= dataset.height() && out_w <= dataset.width(), "crop ", out_h, "x", out_w,
             " (HxW) is larger than the images of split '", split, "' of '", path, "' (",
             dataset.height(), "x", dataset.width(), "); give a crop of at most their size");
    out_pixels = static_cast<size_t>(out_h) * out_w;
    cropping = out_h != dataset.height() || out_w != dataset.width() ||
               (opt.crop == Crop::kRandom && (opt.scale_min != 1.0f || opt.scale_max != 1.0f));
    scratch.resize(static_cast<size_t>(opt.workers));
    for (Scratch& s : scratch) {
      s.image.resize(pixels * kChannels);
      s.mask.resize(pixels);
      if (cropping) {
        s.crop_image.resize(out_pixels * kChannels);
        s.crop_mask.resize(out_pixels);
      }
    }
    const auto bs = static_cast<size_t>(opt.batch_size);
    slots.resize(static_cast<size_t>(opt.prefetch) + 1);
    for (Slot& s : slots) {
      s.images = Buffer(bs * out_pixels * kChannels * sizeof(float));
      s.masks = Buffer(bs * out_pixels * sizeof(float));
      s.indices.assign(bs, 0);
    }
    if (opt.cache) {
      cache.resize(static_cast<size_t>(dataset.size()));
      cache_state.assign(static_cast<size_t>(dataset.size()), kAbsent);
    }
  }

  ~Impl() { stop(); }

  int64_t batch_count() const {
    return static_cast<int64_t>((total + static_cast<size_t>(opt.batch_size) - 1) /
                                static_cast<size_t>(opt.batch_size));
  }

  void start(std::vector<int64_t> new_indices, int64_t new_epoch) {
    stop();
    indices = std::move(new_indices);
    epoch = new_epoch;
    total = indices.size();
    if (opt.drop_last) total -= total % static_cast<size_t>(opt.batch_size);
    {
      std::lock_guard<std::mutex> lock(m);
      next_pos = 0;
      current = 0;
      held = false;
      busy = 0;
      error = nullptr;
      stopping = false;
      for (Slot& s : slots) s.batch_id = -1;
    }
    for (int w = 0; w < opt.workers; ++w) workers.emplace_back([this, w] { work(w); });
    active = true;
  }

  // Abandons the epoch: wakes every worker wherever it waits, joins them and resets the ring.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(m);
      stopping = true;
    }
    slot_free.notify_all();
    for (std::thread& t : workers) t.join();
    workers.clear();
    std::lock_guard<std::mutex> lock(m);
    held = false;
    busy = 0;
    error = nullptr;
    active = false;
  }

  const Batch* next() {
    if (!active) return nullptr;
    std::unique_lock<std::mutex> lock(m);
    const auto n_slots = static_cast<int64_t>(slots.size());
    if (held) {  // the previous batch goes back to the workers
      held = false;
      ++current;
      slot_free.notify_all();
    }
    if (current < batch_count()) {
      Slot& s = slots[static_cast<size_t>(current % n_slots)];
      batch_ready.wait(lock, [&] {
        return (s.batch_id == current && s.remaining == 0) || (error && busy == 0);
      });
      if (s.batch_id == current && s.remaining == 0) {  // complete batches before an error too
        held = true;
        return &s.batch;
      }
    }
    std::exception_ptr failure = std::exchange(error, nullptr);
    lock.unlock();
    stop();  // every worker has finished (the epoch is done, or failed)
    if (failure) std::rethrow_exception(failure);
    return nullptr;
  }

  // How a claimed sample uses the cache: decided under m when the sample is claimed.
  enum class CacheUse { kNone, kHit, kFill };

  // Reads (or finds in the cache) dataset sample `index`; returns its image and mask bytes.
  std::pair<const uint8_t*, const uint8_t*> load(int64_t index, int worker, CacheUse use) {
    if (use != CacheUse::kNone) {
      Buffer& entry = cache[static_cast<size_t>(index)];
      if (use == CacheUse::kFill) {
        entry = Buffer(pixels * (kChannels + 1));
        dataset.read(index, entry.u8(), entry.u8() + pixels * kChannels);
      }
      return {entry.u8(), entry.u8() + pixels * kChannels};
    }
    Scratch& s = scratch[static_cast<size_t>(worker)];
    dataset.read(index, s.image.data(), s.mask.data());
    return {s.image.data(), s.mask.data()};
  }

  // Crops (and scales), augments and normalises one sample into its batch position.
  void prepare(int64_t index, const uint8_t* image, const uint8_t* mask, float* dst_image,
               float* dst_mask, int worker) {
    if (cropping) {
      Scratch& s = scratch[static_cast<size_t>(worker)];
      const Window win = crop_window(opt, epoch, index, dataset.height(), dataset.width());
      resample(image, mask, dataset.height(), dataset.width(), win, out_h, out_w,
               s.crop_image.data(), s.crop_mask.data());
      image = s.crop_image.data();
      mask = s.crop_mask.data();
    }
    const int h = out_h, w = out_w;
    const SampleAugment a = draw(opt.augment, opt.seed, epoch, index, h == w);
    const Mapping map = mapping(a, h, w);
    Lut jittered;
    const Lut* table = &lut;
    if (a.jitter()) {
      jitter_lut(image, out_pixels, a, mean, stdev, jittered);
      table = &jittered;
    }
    const Lut& t = *table;
    for (int y = 0; y < h; ++y) {
      const int64_t row = map.origin + y * map.dy;
      float* out = dst_image + static_cast<size_t>(y) * w * kChannels;
      float* out_mask = dst_mask + static_cast<size_t>(y) * w;
      for (int x = 0; x < w; ++x) {
        const int64_t src = row + x * map.dx;
        const uint8_t* p = image + src * kChannels;
        out[x * kChannels + 0] = t[0][p[0]];
        out[x * kChannels + 1] = t[1][p[1]];
        out[x * kChannels + 2] = t[2][p[2]];
        out_mask[x] = mask[src] ? 1.0f : 0.0f;
      }
    }
  }

  void work(int worker) noexcept {
    const auto n_slots = static_cast<int64_t>(slots.size());
    const auto bs = static_cast<size_t>(opt.batch_size);
    std::unique_lock<std::mutex> lock(m);
    while (true) {
      slot_free.wait(lock, [&] {
        return stopping || error || next_pos >= total ||
               static_cast<int64_t>(next_pos / bs) < current + n_slots;
      });
      if (stopping || error || next_pos >= total) return;
      // Claim the next sample position; the first claim of a batch sets up its slot.
      const size_t pos = next_pos++;
      const auto b = static_cast<int64_t>(pos / bs);
      const size_t k = pos % bs;
      Slot& s = slots[static_cast<size_t>(b % n_slots)];
      if (k == 0) {
        const int n = static_cast<int>(std::min(bs, total - pos));
        s.batch_id = b;
        s.remaining = n;
        s.batch = Batch{n, out_h, out_w, s.images.f32(), s.masks.f32(), s.indices.data()};
      }
      const int64_t index = indices[pos];
      s.indices[k] = index;
      CacheUse use = CacheUse::kNone;
      if (opt.cache && index >= 0 && index < dataset.size()) {
        uint8_t& state = cache_state[static_cast<size_t>(index)];
        if (state == kCached) {
          use = CacheUse::kHit;
        } else if (state == kAbsent) {  // (kFilling: another worker has it; read it again)
          state = kFilling;
          use = CacheUse::kFill;
        }
      }
      ++busy;
      lock.unlock();
      std::exception_ptr failure;
      try {
        const auto [image, mask] = load(index, worker, use);
        prepare(index, image, mask, s.images.f32() + k * out_pixels * kChannels,
                s.masks.f32() + k * out_pixels, worker);
      } catch (const Error&) {
        failure = std::current_exception();
      } catch (const std::exception& e) {
        failure = std::make_exception_ptr(Error(str_cat("loader worker: ", e.what())));
      } catch (...) {
        failure = std::make_exception_ptr(Error("loader worker: unknown exception"));
      }
      lock.lock();
      --busy;
      if (use == CacheUse::kFill) {
        if (failure) {
          cache[static_cast<size_t>(index)] = Buffer();
          cache_state[static_cast<size_t>(index)] = kAbsent;
        } else {
          cache_state[static_cast<size_t>(index)] = kCached;
          ++cached;
        }
      }
      if (failure && !error) error = failure;
      if (!failure) --s.remaining;
      if (s.remaining == 0 || (error && busy == 0)) batch_ready.notify_all();
      if (error) slot_free.notify_all();  // the other workers stop claiming
    }
  }
};

Loader::Loader(const std::string& path, const std::string& split, LoaderOptions options)
    : impl_(std::make_unique<Impl>(path, split, options)) {}

Loader::~Loader() = default;  // Impl's destructor stops and joins the workers

int64_t Loader::dataset_size() const {
  return impl_->dataset.size();
}
int Loader::height() const {
  return impl_->out_h;
}
int Loader::width() const {
  return impl_->out_w;
}
float Loader::pos_weight() const {
  return impl_->dataset.pos_weight();
}
const PixelScale& Loader::scale() const {
  return impl_->dataset.scale();
}
const std::array<float, 3>& Loader::mean() const {
  return impl_->mean;
}
const std::array<float, 3>& Loader::std() const {
  return impl_->stdev;
}
int64_t Loader::cached_samples() const {
  std::lock_guard<std::mutex> lock(impl_->m);
  return impl_->cached;
}

void Loader::start(std::vector<int64_t> indices, int64_t epoch) {
  impl_->start(std::move(indices), epoch);
}

const Batch* Loader::next() {
  return impl_->next();
}

void Loader::stop() {
  impl_->stop();
}

}  // namespace dp::data
