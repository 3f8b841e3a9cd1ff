// The CUDA backend's device allocator: DeviceHeap (counted cudaMalloc) and Arena (grow-only).
#include "device_memory.hpp"

#include <algorithm>

#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "dp/log.hpp"

namespace dp::cuda {

DeviceHeap::DeviceHeap(cudaStream_t stream) : stream_(stream) {
  int ordinal = 0;
  DP_CUDA_CHECK(cudaGetDevice(&ordinal));
  cudaDeviceProp prop{};
  DP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  char bus_id[32] = {};
  DP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal));
  device_ = str_cat("device ", ordinal, " (", prop.name, ", ", bus_id, ")");
}

void* DeviceHeap::malloc_counted(size_t bytes, cudaError_t* status) {
  void* p = nullptr;
  *status = cudaMalloc(&p, bytes);
  if (*status != cudaSuccess) {
    (void)cudaGetLastError();  // clear a non-sticky error (out of memory) for later checks
    return nullptr;
  }
  std::lock_guard lock(mutex_);
  allocated_ += bytes;
  peak_ = std::max(peak_, allocated_);
  return p;
}

void* DeviceHeap::allocate(size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  cudaError_t status = cudaSuccess;
  if (void* p = malloc_counted(bytes, &status)) return p;
  size_t free_bytes = 0, total_bytes = 0;
  const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  (void)cudaGetLastError();
  fail("cudaMalloc of ", format_mib(double(bytes)), " for ", what, " failed on ", device_, ": ",
       cudaGetErrorString(status), " [", cudaGetErrorName(status), "]; this backend already holds ",
       format_mib(double(allocated())), " (peak ", format_mib(double(peak())), ")",
       have_info ? str_cat("; the device has ", format_mib(double(free_bytes)), " free of ",
                           format_mib(double(total_bytes)))
                 : std::string());
}

void* DeviceHeap::try_allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  cudaError_t status = cudaSuccess;
  if (void* p = malloc_counted(bytes, &status)) return p;
  if (status == cudaErrorMemoryAllocation) return nullptr;
  const std::string call = str_cat("cudaMalloc of ", format_mib(double(bytes)), " on ", device_);
  throw_cuda_error(status, call.c_str(), __FILE__, __LINE__);
}

void DeviceHeap::free(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  (void)cudaStreamSynchronize(stream_);
  (void)cudaFree(p);
  std::lock_guard lock(mutex_);
  allocated_ -= std::min(allocated_, bytes);
}

size_t DeviceHeap::allocated() const {
  std::lock_guard lock(mutex_);
  return allocated_;
}

size_t DeviceHeap::peak() const {
  std::lock_guard lock(mutex_);
  return peak_;
}

void Arena::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  heap_.free(data_, bytes_);  // first, so that the old and the new need not fit together
  data_ = nullptr;
  bytes_ = 0;
  data_ = heap_.allocate(bytes, what_);
  bytes_ = bytes;
}

bool Arena::try_reserve(size_t bytes) {
  if (bytes <= bytes_) return true;
  if (void* p = heap_.try_allocate(bytes)) {
    heap_.free(data_, bytes_);
    data_ = p;
    bytes_ = bytes;
    return true;
  }
  const size_t old = bytes_;
  heap_.free(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  if (void* p = heap_.try_allocate(bytes)) {
    data_ = p;
    bytes_ = bytes;
    return true;
  }
  data_ = heap_.allocate(old, what_);  // the size just freed fits again
  bytes_ = old;
  return false;
}

}  // namespace dp::cuda
