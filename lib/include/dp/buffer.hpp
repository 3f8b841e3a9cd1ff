// dp::Buffer: an owned, zero-initialised allocation in host memory (64-byte aligned) or in a
// backend's device memory (through a DeviceMemory).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dp {

// A device backend's memory: plain device allocations and synchronous transfers. The CPU backend
// has none (its tensors are host memory).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* allocate(size_t bytes) = 0;  // zero-filled; nullptr for 0 bytes
  virtual void deallocate(void* p) noexcept = 0;
  // Complete when they return, ordered after all work the backend has queued before.
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, size_t bytes) = 0;
};

class Buffer {
 public:
  Buffer() = default;
  // Host memory when `device` is null, else device memory from it (which must outlive the
  // buffer). Zero-filled (host pages are touched once, here).
  explicit Buffer(size_t bytes, DeviceMemory* device = nullptr);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  uint8_t* u8() const { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }
  DeviceMemory* device() const { return device_; }  // null: host memory

  // Copies `bytes` from host memory into the buffer at byte `offset` / out of it into host
  // memory: memcpy for host buffers, the device's transfer otherwise.
  void upload(const void* host_src, size_t bytes, size_t offset = 0);
  void download(void* host_dst, size_t bytes, size_t offset = 0) const;

 private:
  void release() noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  DeviceMemory* device_ = nullptr;
};

}  // namespace dp
