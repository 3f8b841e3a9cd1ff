// CUDA device memory (internal): counted heap, grow-only arena, tensor allocator, host staging.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dp/buffer.hpp"
#include "dp/cuda/device.hpp"
#include "dp/error.hpp"

namespace dp::cuda {

// The backend's device allocations (cudaMalloc on the current device, never managed memory),
// counted: bytes held now and the most ever held at once. Not zero-filled here.
class DeviceHeap {
 public:
  explicit DeviceHeap(cudaStream_t stream);
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  // Throws dp::Error naming `what`, the size in MiB, what this backend already holds and the
  // device when cudaMalloc fails. nullptr for 0 bytes.
  void* allocate(size_t bytes, const char* what);
  // nullptr when the device is out of memory (the error is cleared); other errors throw.
  void* try_allocate(size_t bytes);
  // Waits for the stream first: queued work may still use the memory. Never throws.
  void free(void* p, size_t bytes) noexcept;

  size_t allocated() const;
  size_t peak() const;
  cudaStream_t stream() const { return stream_; }
  const std::string& device() const { return device_; }  // "device 0 (NVIDIA H200, 0000:41:00.0)"

 private:
  void* malloc_counted(size_t bytes, cudaError_t* status);

  cudaStream_t stream_;
  std::string device_;
  mutable std::mutex mutex_;
  size_t allocated_ = 0, peak_ = 0;
};

// One device allocation from a DeviceHeap that only grows. Work on one stream runs in order, so
// every op may reuse the whole region; growing waits for the queued work (old contents are lost).
class Arena {
 public:
  Arena(DeviceHeap& heap, const char* what) : heap_(heap), what_(what) {}
  ~Arena() { heap_.free(data_, bytes_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Grows to at least `bytes`; throws dp::Error (the heap's message) when the device is full.
  void reserve(size_t bytes);
  // Like reserve, but false (keeping the old size) when the device cannot hold `bytes`.
  bool try_reserve(size_t bytes);

 private:
  DeviceHeap& heap_;
  const char* what_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// dp::DeviceMemory on the backend's heap: zero-filled allocations, transfers ordered on the stream.
class CountedMemory final : public DeviceMemory {
 public:
  explicit CountedMemory(DeviceHeap& heap) : heap_(heap) {}

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = heap_.allocate(bytes, "a tensor");
    try {
      DP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, heap_.stream()));
      DP_CUDA_CHECK(cudaStreamSynchronize(heap_.stream()));
      std::lock_guard lock(mutex_);
      sizes_.emplace(p, bytes);
    } catch (...) {
      heap_.free(p, bytes);
      throw;
    }
    return p;
  }

  void deallocate(void* p) noexcept override {
    if (p == nullptr) return;
    size_t bytes = 0;
    {
      std::lock_guard lock(mutex_);
      const auto it = sizes_.find(p);
      if (it == sizes_.end()) return;  // not ours: never hand it to cudaFree
      bytes = it->second;
      sizes_.erase(it);
    }
    heap_.free(p, bytes);
  }

  // The stream is non-blocking: a plain cudaMemcpy would not wait for the work queued on it.
  void upload(void* device_dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    DP_CUDA_CHECK(
        cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, heap_.stream()));
    DP_CUDA_CHECK(cudaStreamSynchronize(heap_.stream()));
  }

  void download(void* host_dst, const void* device_src, size_t bytes) override {
    if (bytes == 0) return;
    DP_CUDA_CHECK(
        cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, heap_.stream()));
    DP_CUDA_CHECK(cudaStreamSynchronize(heap_.stream()));
  }

 private:
  DeviceHeap& heap_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
};

// The small arrays the Backend interface keeps in host memory (batch-norm sums, seeds, counts,
// returned scalars), moved through one pinned host buffer and a device buffer of the same size,
// both handed out in 256-byte aligned slots from a cursor. An upload's slot stays untouched until
// its copy has run: the cursor only wraps around after the stream has been synchronized (which
// every download does).
class Staging {
 public:
  explicit Staging(DeviceHeap& heap) : heap_(heap) {}
  ~Staging() {
    (void)cudaStreamSynchronize(heap_.stream());
    if (host_ != nullptr) (void)cudaFreeHost(host_);
    heap_.free(device_, capacity_);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // A device copy of `bytes` of host memory, enqueued on the stream; `host` may change at once.
  void* upload(const void* host, size_t bytes) {
    const size_t slot = reserve(bytes);
    std::memcpy(host_ + slot, host, bytes);
    DP_CUDA_CHECK(cudaMemcpyAsync(device_ + slot, host_ + slot, bytes, cudaMemcpyHostToDevice,
                                  heap_.stream()));
    return device_ + slot;
  }

  // A device slot for results (or for inputs an op does not read); fetch() brings it back.
  void* scratch(size_t bytes) {
    const size_t slot = reserve(bytes);  // first: it may move device_
    return device_ + slot;
  }

  // Copies `bytes` from a slot of this staging buffer to `host` once the queued work is done.
  void fetch(const void* slot, void* host, size_t bytes) {
    const size_t offset = size_t(static_cast<const char*>(slot) - device_);
    DP_CUDA_CHECK(
        cudaMemcpyAsync(host_ + offset, slot, bytes, cudaMemcpyDeviceToHost, heap_.stream()));
    DP_CUDA_CHECK(cudaStreamSynchronize(heap_.stream()));
    std::memcpy(host, host_ + offset, bytes);
    cursor_ = 0;  // every copy has run
  }

 private:
  static constexpr size_t kAlign = 256;

  size_t reserve(size_t bytes) {
    const size_t size = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (cursor_ + size > capacity_) {
      // Wrap around (or grow) once the copies from the slots handed out so far have run.
      DP_CUDA_CHECK(cudaStreamSynchronize(heap_.stream()));
      cursor_ = 0;
      if (size > capacity_) grow(std::max({size, 2 * capacity_, size_t{64} << 10}));
    }
    const size_t slot = cursor_;
    cursor_ += size;
    return slot;
  }

  void grow(size_t capacity) {
    if (host_ != nullptr) DP_CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr;
    heap_.free(device_, capacity_);
    device_ = nullptr;
    capacity_ = 0;
    void* host = nullptr;
    DP_CUDA_CHECK(cudaMallocHost(&host, capacity));
    host_ = static_cast<char*>(host);
    device_ = static_cast<char*>(heap_.allocate(capacity, "the host-array staging buffer"));
    capacity_ = capacity;
  }

  DeviceHeap& heap_;
  char* host_ = nullptr;    // pinned
  char* device_ = nullptr;  // same size
  size_t capacity_ = 0, cursor_ = 0;
};

}  // namespace dp::cuda
