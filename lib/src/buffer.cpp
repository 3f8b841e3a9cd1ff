// Host and device allocations for dp::Buffer.
#include "dp/buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "dp/error.hpp"

namespace dp {

namespace {
constexpr size_t kAlignment = 64;  // one cache line; what AVX-512 loads prefer
}

Buffer::Buffer(size_t bytes, DeviceMemory* device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device != nullptr) {
    data_ = device->allocate(bytes);
    return;
  }
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  DP_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
  std::memset(data_, 0, rounded);
}

void Buffer::release() noexcept {
  if (device_ != nullptr)
    device_->deallocate(data_);
  else
    std::free(data_);
}

Buffer::~Buffer() {
  release();
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      device_(std::exchange(o.device_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = std::exchange(o.device_, nullptr);
  }
  return *this;
}

void Buffer::upload(const void* host_src, size_t bytes, size_t offset) {
  DP_CHECK(offset + bytes <= bytes_, "Buffer::upload of ", bytes, " bytes at ", offset,
           " into a buffer of ", bytes_);
  if (bytes == 0) return;
  if (device_ != nullptr)
    device_->upload(u8() + offset, host_src, bytes);
  else
    std::memcpy(u8() + offset, host_src, bytes);
}

void Buffer::download(void* host_dst, size_t bytes, size_t offset) const {
  DP_CHECK(offset + bytes <= bytes_, "Buffer::download of ", bytes, " bytes at ", offset,
           " from a buffer of ", bytes_);
  if (bytes == 0) return;
  if (device_ != nullptr)
    device_->download(host_dst, u8() + offset, bytes);
  else
    std::memcpy(host_dst, u8() + offset, bytes);
}

}  // namespace dp
