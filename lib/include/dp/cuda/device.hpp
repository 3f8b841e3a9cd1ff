// CUDA backend basics: CHECK macros, GPU discovery and selection, RAII owners, fill/axpy kernels.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <string>
#include <utility>

#include "dp/error.hpp"

// One CHECK macro per library: a failed status becomes dp::Error
// "CUDA error in <call>: <message> [<error name>] (at file:line)", "cuDNN error in <call>: ...".
#define DP_CUDA_CHECK(call)                                                     \
  do {                                                                          \
    cudaError_t dp_cuda_status_ = (call);                                       \
    if (dp_cuda_status_ != cudaSuccess)                                         \
      ::dp::cuda::throw_cuda_error(dp_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DP_CUDNN_CHECK(call)                                                      \
  do {                                                                            \
    cudnnStatus_t dp_cudnn_status_ = (call);                                      \
    if (dp_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                 \
      ::dp::cuda::throw_cudnn_error(dp_cudnn_status_, #call, __FILE__, __LINE__); \
  } while (0)

namespace dp::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file,
                                    int line);

// Number of GPUs this process can use (CUDA_VISIBLE_DEVICES applies). 0, never an exception, when
// the runtime reports an error (no device, insufficient or stub driver, ...). Probed once.
int visible_device_count();
// Why visible_device_count() is 0, in the runtime's words (plus CUDA_VISIBLE_DEVICES when set);
// empty when a GPU is visible. For test skips and "--device cuda requested but no GPU is visible".
std::string no_device_reason();

struct DeviceInfo {
  int ordinal = -1;        // CUDA runtime ordinal, i.e. index among the visible devices
  int visible_count = 0;   // visible_device_count() when selected
  bool shared = false;     // more ranks on this node than visible GPUs (allow_sharing was set)
  std::string name;        // e.g. "NVIDIA H200"
  std::string pci_bus_id;  // e.g. "0000:41:00.0": identifies the physical GPU across processes
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;  // bytes
};

// Makes GPU `local_rank % visible_device_count()` current for the calling thread and returns its
// description. Throws dp::Error when no GPU is visible (with no_device_reason()), or when
// local_size > visible GPUs and !allow_sharing (ranks would share a GPU).
DeviceInfo select_device(int local_rank, int local_size, bool allow_sharing);

// Owns a non-blocking cudaStream_t (no implicit sync with the legacy default stream). Move-only.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// Owns a cudaEvent_t; timing is off unless asked for (cheaper to record and wait on). Move-only.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream) const;
  // Makes `stream` wait (on the device) until this event has completed.
  void wait_on(cudaStream_t stream) const;
  void synchronize() const;
  bool query() const;  // true when the work before the last record() has completed
  // Milliseconds between two recorded timing events (start.record ... end.record).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t e_ = nullptr;
};

// Owns a cudnnHandle_t (created on the current device). Move-only.
class CudnnHandle {
 public:
  CudnnHandle();
  ~CudnnHandle();
  CudnnHandle(CudnnHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CudnnHandle& operator=(CudnnHandle&& o) noexcept;
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return h_; }
  void set_stream(cudaStream_t stream) const;

 private:
  cudnnHandle_t h_ = nullptr;
};

// Device memory from cudaMalloc (never managed memory), freed on destruction. Move-only.
void* device_alloc(size_t bytes);  // nullptr for 0 bytes; the error names the size in MiB
void device_free(void* p) noexcept;

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count)
      : p_(static_cast<T*>(device_alloc(count * sizeof(T)))), n_(count) {}
  ~DeviceBuffer() { device_free(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  // Synchronous copies of the whole buffer; `src`/`dst` hold size() elements on the host.
  void copy_from_host(const T* src) {
    DP_CUDA_CHECK(cudaMemcpy(p_, src, bytes(), cudaMemcpyHostToDevice));
  }
  void copy_to_host(T* dst) const {
    DP_CUDA_CHECK(cudaMemcpy(dst, p_, bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Element-wise kernels (lib/cuda/elementwise.cu), enqueued on `stream`; n == 0 launches nothing.
void fill(float* dst, size_t n, float value, cudaStream_t stream);
// dst[i] += alpha * src[i]
void axpy(float* dst, const float* src, size_t n, float alpha, cudaStream_t stream);

}  // namespace dp::cuda
