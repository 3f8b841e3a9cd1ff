// CUDA backend basics: error reporting, GPU discovery and selection, CUDA/cuDNN RAII owners.
#include "dp/cuda/device.hpp"

#include <cstdlib>

namespace dp::cuda {

namespace {

// ' (CUDA_VISIBLE_DEVICES="<value>")' when the variable is set: messages say what the runtime saw.
std::string visible_devices_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? str_cat(" (CUDA_VISIBLE_DEVICES=\"", v, "\")") : std::string();
}

struct Probe {
  int count = 0;
  std::string reason;  // empty when count > 0
};

Probe probe_devices() {
  Probe p;
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    // The count is left untouched on error (e.g. 35, insufficient driver): trust the status only.
    (void)cudaGetLastError();
    p.reason = str_cat("cudaGetDeviceCount: ", cudaGetErrorString(status), " [",
                       cudaGetErrorName(status), "]", visible_devices_note());
  } else if (n <= 0) {
    p.reason = str_cat("the CUDA runtime reports no devices", visible_devices_note());
  } else {
    p.count = n;
  }
  return p;
}

// The device set does not change during a process's life: probe once.
const Probe& probe() {
  static const Probe p = probe_devices();
  return p;
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so later checks do not report it again
  fail("CUDA error in ", call, ": ", cudaGetErrorString(status), " [", cudaGetErrorName(status),
       "] (at ", file, ":", line, ")");
}

void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  fail("cuDNN error in ", call, ": ", cudnnGetErrorString(status), " (at ", file, ":", line, ")");
}

int visible_device_count() {
  return probe().count;
}

std::string no_device_reason() {
  return probe().reason;
}

DeviceInfo select_device(int local_rank, int local_size, bool allow_sharing) {
  DP_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size,
           "select_device: local rank ", local_rank, " is outside [0, ", local_size, ")");
  const int count = visible_device_count();
  DP_CHECK(count > 0, "no GPU is visible: ", no_device_reason());
  DP_CHECK(local_size <= count || allow_sharing, local_size, " ranks on this node but ", count,
           " GPU(s) visible", visible_devices_note(),
           ": start one rank per GPU, or allow ranks to share GPUs (if the launcher gives each "
           "task its own GPU, e.g. srun --gpus-per-task, request the GPUs per node instead so "
           "every rank sees all of them)");

  DeviceInfo info;
  info.ordinal = local_rank % count;
  info.visible_count = count;
  info.shared = local_size > count;
  DP_CUDA_CHECK(cudaSetDevice(info.ordinal));
  cudaDeviceProp prop{};
  DP_CUDA_CHECK(cudaGetDeviceProperties(&prop, info.ordinal));
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  char bus_id[32] = {};  // "domain:bus:device.function", at most 13 characters
  DP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, info.ordinal));
  info.pci_bus_id = bus_id;
  return info;
}

// Destructors ignore errors: they cannot throw, and at process exit the runtime may be gone.

Stream::Stream() {
  DP_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  if (s_) (void)cudaStreamDestroy(s_);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) (void)cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const {
  DP_CUDA_CHECK(cudaStreamSynchronize(s_));
}

Event::Event(bool timing) {
  DP_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (e_) (void)cudaEventDestroy(e_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) (void)cudaEventDestroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) const {
  DP_CUDA_CHECK(cudaEventRecord(e_, stream));
}

void Event::wait_on(cudaStream_t stream) const {
  DP_CUDA_CHECK(cudaStreamWaitEvent(stream, e_, 0));
}

void Event::synchronize() const {
  DP_CUDA_CHECK(cudaEventSynchronize(e_));
}

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(e_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  DP_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  DP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, end.e_));
  return ms;
}

CudnnHandle::CudnnHandle() {
  DP_CUDNN_CHECK(cudnnCreate(&h_));
}

CudnnHandle::~CudnnHandle() {
  if (h_) (void)cudnnDestroy(h_);
}

CudnnHandle& CudnnHandle::operator=(CudnnHandle&& o) noexcept {
  if (this != &o) {
    if (h_) (void)cudnnDestroy(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

void CudnnHandle::set_stream(cudaStream_t stream) const {
  DP_CUDNN_CHECK(cudnnSetStream(h_, stream));
}

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status != cudaSuccess) {
    const std::string call = str_cat("cudaMalloc of ", static_cast<double>(bytes) / kMiB, " MiB");
    throw_cuda_error(status, call.c_str(), __FILE__, __LINE__);
  }
  return p;
}

void device_free(void* p) noexcept {
  if (p) (void)cudaFree(p);
}

}  // namespace dp::cuda
