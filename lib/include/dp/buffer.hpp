// dp::Buffer: an owned, 64-byte aligned, zero-initialised host allocation (activations, arenas).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dp {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);  // zero-filled, so its pages are touched once, here
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  uint8_t* u8() const { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dp
