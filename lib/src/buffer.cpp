// Aligned host allocations for dp::Buffer.
#include "dp/buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "dp/error.hpp"

namespace dp {

namespace {
constexpr size_t kAlignment = 64;  // one cache line; what AVX-512 loads prefer
}

Buffer::Buffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  DP_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
  std::memset(data_, 0, rounded);
}

Buffer::~Buffer() {
  std::free(data_);
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace dp
