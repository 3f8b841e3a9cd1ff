// Loader: worker threads fill a ring of pre-allocated NHWC float batches, delivered in order.
#include "dp/loader.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "dp/buffer.hpp"
#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/rng.hpp"

namespace dp::data {

namespace {

constexpr int kChannels = 3;
constexpr int kLevels = 256;  // uint8 values
constexpr float kMaxByte = 255.0f;
constexpr int kMaxWorkers = 256;
constexpr float kFlipProbability = 0.5f;
constexpr uint64_t kQuarterTurns = 4;
constexpr float kJitter = 0.2f;  // brightness and contrast factors in [1 - kJitter, 1 + kJitter]
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

std::optional<Augment> augment_from_name(std::string_view name) {
  if (name == "none") return Augment::kNone;
  if (name == "flips") return Augment::kFlips;
  if (name == "full") return Augment::kFull;
  return std::nullopt;
}

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

std::optional<Normalize> normalize_from_name(std::string_view name) {
  if (name == "imagenet") return Normalize::kImagenet;
  if (name == "dataset") return Normalize::kDataset;
  return std::nullopt;
}

const char* normalize_name(Normalize n) {
  return n == Normalize::kImagenet ? "imagenet" : "dataset";
}

struct Loader::Impl {
  struct Slot {
    Buffer images, masks;  // 64-byte aligned, allocated once
    std::vector<int64_t> indices;
    Batch batch;
    int64_t batch_id = -1;  // which batch of the epoch the slot holds (guarded by m)
    int remaining = 0;      // samples of it still being prepared (guarded by m)
  };
  struct Scratch {  // one sample as read from the file, per worker
    std::vector<uint8_t> image, mask;
  };
  enum CacheState : uint8_t { kAbsent, kFilling, kCached };

  Dataset dataset;
  LoaderOptions opt;
  std::array<float, kChannels> mean{}, stdev{};
  size_t pixels = 0;  // per sample
  Lut lut{};          // normalisation without jitter
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
    scratch.resize(static_cast<size_t>(opt.workers));
    for (Scratch& s : scratch) {
      s.image.resize(pixels * kChannels);
      s.mask.resize(pixels);
    }
    const auto bs = static_cast<size_t>(opt.batch_size);
    slots.resize(static_cast<size_t>(opt.prefetch) + 1);
    for (Slot& s : slots) {
      s.images = Buffer(bs * pixels * kChannels * sizeof(float));
      s.masks = Buffer(bs * pixels * sizeof(float));
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

  // Augments and normalises one sample into its batch position.
  void prepare(int64_t index, const uint8_t* image, const uint8_t* mask, float* dst_image,
               float* dst_mask) const {
    const int h = dataset.height(), w = dataset.width();
    const SampleAugment a = draw(opt.augment, opt.seed, epoch, index, h == w);
    const Mapping map = mapping(a, h, w);
    Lut jittered;
    const Lut* table = &lut;
    if (a.jitter()) {
      jitter_lut(image, pixels, a, mean, stdev, jittered);
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
        s.batch = Batch{
            n, dataset.height(), dataset.width(), s.images.f32(), s.masks.f32(), s.indices.data()};
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
        prepare(index, image, mask, s.images.f32() + k * pixels * kChannels,
                s.masks.f32() + k * pixels);
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
  return impl_->dataset.height();
}
int Loader::width() const {
  return impl_->dataset.width();
}
float Loader::pos_weight() const {
  return impl_->dataset.pos_weight();
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
