// Loader: a background reader thread per epoch filling a ring of pre-allocated NHWC float batches.
#include "dp/loader.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
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
constexpr float kFlipProbability = 0.5f;

}  // namespace

struct Loader::Impl {
  struct Slot {
    Buffer images, masks;  // 64-byte aligned, allocated once
    std::vector<int64_t> indices;
    Batch batch;
  };

  Dataset dataset;
  LoaderOptions opt;
  size_t image_floats = 0, mask_floats = 0;                 // per sample
  std::array<std::array<float, kLevels>, kChannels> lut{};  // uint8 -> normalised, per channel
  std::vector<uint8_t> image_u8, mask_u8;                   // reader scratch, one sample
  std::vector<Slot> slots;                                  // the ring: prefetch + 1 batches

  // Epoch state. The reader owns slots it is filling; the consumer owns the slot it holds.
  std::vector<int64_t> indices;
  int64_t epoch = 0;
  std::thread reader;
  std::mutex m;
  std::condition_variable slot_free;    // reader waits for a slot to fill
  std::condition_variable batch_ready;  // consumer waits for a batch
  int ready = 0;                        // filled slots not yet handed out (guarded by m)
  bool held = false;                    // the consumer holds slots[read_pos] (guarded by m)
  int read_pos = 0;                     // consumer side of the ring
  bool reader_done = false;             // guarded by m
  std::exception_ptr error;             // guarded by m
  std::atomic<bool> stopping{false};    // set under m, also polled between samples
  bool active = false;  // an epoch was started and not finished (consumer thread only)

  Impl(const std::string& path, const std::string& split, LoaderOptions options)
      : dataset(path, split), opt(options) {
    DP_CHECK(opt.batch_size >= 1, "loader: batch size ", opt.batch_size, " must be at least 1");
    DP_CHECK(opt.prefetch >= 0, "loader: prefetch ", opt.prefetch, " must not be negative");
    for (int c = 0; c < kChannels; ++c) {
      DP_CHECK(opt.std[c] > 0, "loader: std[", c, "] = ", opt.std[c], " must be positive");
      for (int v = 0; v < kLevels; ++v) {
        lut[c][v] = (static_cast<float>(v) / 255.0f - opt.mean[c]) / opt.std[c];
      }
    }
    const size_t pixels = static_cast<size_t>(dataset.height()) * dataset.width();
    image_floats = pixels * kChannels;
    mask_floats = pixels;
    image_u8.resize(image_floats);
    mask_u8.resize(mask_floats);
    const auto bs = static_cast<size_t>(opt.batch_size);
    slots.resize(static_cast<size_t>(opt.prefetch) + 1);
    for (Slot& s : slots) {
      s.images = Buffer(bs * image_floats * sizeof(float));
      s.masks = Buffer(bs * mask_floats * sizeof(float));
      s.indices.assign(bs, 0);
    }
  }

  ~Impl() { stop(); }

  void start(std::vector<int64_t> new_indices, int64_t new_epoch) {
    stop();
    indices = std::move(new_indices);
    epoch = new_epoch;
    {
      std::lock_guard<std::mutex> lock(m);
      ready = 0;
      held = false;
      read_pos = 0;
      reader_done = false;
      error = nullptr;
      stopping = false;
    }
    reader = std::thread([this] { run(); });
    active = true;
  }

  // Abandons the epoch: wakes the reader wherever it waits, joins it and resets the ring.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(m);
      stopping = true;
    }
    slot_free.notify_all();
    if (reader.joinable()) reader.join();
    std::lock_guard<std::mutex> lock(m);
    ready = 0;
    held = false;
    error = nullptr;
    active = false;
  }

  const Batch* next() {
    if (!active) return nullptr;
    std::unique_lock<std::mutex> lock(m);
    const int n_slots = static_cast<int>(slots.size());
    if (held) {  // the previous batch goes back to the reader
      held = false;
      read_pos = (read_pos + 1) % n_slots;
      slot_free.notify_one();
    }
    batch_ready.wait(lock, [&] { return ready > 0 || reader_done || error; });
    if (ready > 0) {  // batches finished before an error are still delivered, in order
      --ready;
      held = true;
      return &slots[static_cast<size_t>(read_pos)].batch;
    }
    std::exception_ptr failure = std::exchange(error, nullptr);
    lock.unlock();
    reader.join();  // the reader has finished (done or failed)
    active = false;
    if (failure) std::rethrow_exception(failure);
    return nullptr;
  }

  // Reads, augments and normalises dataset sample `index` into one batch position.
  void fill_sample(int64_t index, float* image, float* mask) {
    dataset.read(index, image_u8.data(), mask_u8.data());
    bool hflip = false, vflip = false;
    if (opt.augment) {
      Rng rng(key(opt.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)));
      hflip = rng.uniform() < kFlipProbability;
      vflip = rng.uniform() < kFlipProbability;
    }
    const int h = dataset.height(), w = dataset.width();
    for (int y = 0; y < h; ++y) {
      const int sy = vflip ? h - 1 - y : y;
      for (int x = 0; x < w; ++x) {
        const int sx = hflip ? w - 1 - x : x;
        const size_t src = static_cast<size_t>(sy) * w + sx;
        const size_t dst = static_cast<size_t>(y) * w + x;
        for (int c = 0; c < kChannels; ++c) {
          image[dst * kChannels + c] = lut[c][image_u8[src * kChannels + c]];
        }
        mask[dst] = mask_u8[src] ? 1.0f : 0.0f;
      }
    }
  }

  void run() noexcept {
    try {
      const int n_slots = static_cast<int>(slots.size());
      const size_t total = indices.size();
      int write_pos = 0;
      for (size_t pos = 0; pos < total;) {
        {
          std::unique_lock<std::mutex> lock(m);
          slot_free.wait(lock, [&] { return stopping || ready + (held ? 1 : 0) < n_slots; });
          if (stopping) return;
        }
        Slot& s = slots[static_cast<size_t>(write_pos)];
        const int n = static_cast<int>(std::min<size_t>(opt.batch_size, total - pos));
        for (int k = 0; k < n; ++k) {
          if (stopping.load(std::memory_order_relaxed)) return;
          const int64_t index = indices[pos + static_cast<size_t>(k)];
          fill_sample(index, s.images.f32() + static_cast<size_t>(k) * image_floats,
                      s.masks.f32() + static_cast<size_t>(k) * mask_floats);
          s.indices[static_cast<size_t>(k)] = index;
        }
        s.batch = Batch{
            n, dataset.height(), dataset.width(), s.images.f32(), s.masks.f32(), s.indices.data()};
        {
          std::lock_guard<std::mutex> lock(m);
          ++ready;
        }
        batch_ready.notify_one();
        write_pos = (write_pos + 1) % n_slots;
        pos += static_cast<size_t>(n);
      }
      std::lock_guard<std::mutex> lock(m);
      reader_done = true;
    } catch (const Error&) {
      set_error(std::current_exception());
    } catch (const std::exception& e) {
      set_error(std::make_exception_ptr(Error(str_cat("loader thread: ", e.what()))));
    } catch (...) {
      set_error(std::make_exception_ptr(Error("loader thread: unknown exception")));
    }
    batch_ready.notify_one();
  }

  void set_error(std::exception_ptr e) noexcept {
    std::lock_guard<std::mutex> lock(m);
    error = std::move(e);
  }
};

Loader::Loader(const std::string& path, const std::string& split, LoaderOptions options)
    : impl_(std::make_unique<Impl>(path, split, options)) {}

Loader::~Loader() = default;  // Impl's destructor stops and joins the reader

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
