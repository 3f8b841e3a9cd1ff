// Host and device allocations for dp::Buffer.
#include "dp/buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include <sys/mman.h>

#include "dp/error.hpp"

namespace dp {

namespace {
constexpr size_t kAlignment = 64;  // one cache line; what AVX-512 loads prefer
// From this size on a host buffer is aligned to, and rounded up to, whole 2 MiB pages and asks
// for transparent huge pages (where the kernel's THP setting is "madvise", as on Debian):
// dppredict's 36 MiB activation arena is then 18 page faults instead of 9216, with fewer TLB
// misses after: a 1024x768 photograph's dppredict command 7-15% faster (bench/README.md).
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFrom = 4 * kHugePage;
}  // namespace

Buffer::Buffer(size_t bytes, DeviceMemory* device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device != nullptr) {
    data_ = device->allocate(bytes);
    return;
  }
  const size_t align = bytes >= kHugeFrom ? kHugePage : kAlignment;
  const size_t rounded = (bytes + align - 1) / align * align;
  data_ = std::aligned_alloc(align, rounded);
  DP_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
  if (align == kHugePage) madvise(data_, rounded, MADV_HUGEPAGE);  // a hint: fine if refused
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
