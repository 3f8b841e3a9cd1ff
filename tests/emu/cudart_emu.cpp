// The CUDA runtime calls of lib/cuda on the CPU, for the emulated backend (tests/emu): devices
// (1, or DP_EMU_DEVICES) whose memory is host memory (tracked, so that cudaPointerGetAttributes
// tells device from host allocations), streams that run every call at once, events that record the
// host clock.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment
constexpr int kMajor = 9, kMinor = 0;

struct Allocations {
  std::mutex mutex;
  std::map<const char*, std::pair<size_t, cudaMemoryType>> blocks;  // start -> size, type
  size_t device_bytes = 0;
};

Allocations& allocations() {
  static Allocations a;
  return a;
}

size_t device_memory_limit() {
  const char* env = std::getenv("DP_EMU_DEVICE_MIB");
  return size_t(env != nullptr ? std::strtoull(env, nullptr, 10) : 16384) << 20;
}

cudaError_t allocate(void** p, size_t bytes, cudaMemoryType type) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  Allocations& a = allocations();
  std::lock_guard lock(a.mutex);
  if (type == cudaMemoryTypeDevice && a.device_bytes + bytes > device_memory_limit())
    return cudaErrorMemoryAllocation;
  // The exact size (not rounded up), so that AddressSanitizer sees any access past the end.
  void* block = nullptr;
  if (posix_memalign(&block, kAlign, bytes) != 0) return cudaErrorMemoryAllocation;
  a.blocks[static_cast<const char*>(block)] = {bytes, type};
  if (type == cudaMemoryTypeDevice) a.device_bytes += bytes;
  *p = block;
  return cudaSuccess;
}

cudaError_t release(void* p, cudaMemoryType type) {
  if (p == nullptr) return cudaSuccess;
  Allocations& a = allocations();
  std::lock_guard lock(a.mutex);
  const auto it = a.blocks.find(static_cast<const char*>(p));
  if (it == a.blocks.end() || it->second.second != type) return cudaErrorInvalidValue;
  if (type == cudaMemoryTypeDevice) a.device_bytes -= it->second.first;
  a.blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}

struct Event {
  std::chrono::steady_clock::time_point at;
};

// DP_EMU_DEVICES devices (default 1), all of them views of the same host memory.
int device_count() {
  const char* env = std::getenv("DP_EMU_DEVICES");
  return env != nullptr ? std::max(1, std::atoi(env)) : 1;
}
bool valid_device(int device) {
  return device >= 0 && device < device_count();
}
thread_local int current_device = 0;

}  // namespace

extern "C" {

cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    default:
      return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "dp_emu (CUDA emulated on the CPU)");
  prop->totalGlobalMem = device_memory_limit();
  prop->major = kMajor;
  prop->minor = kMinor;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = kMajor;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = kMinor;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = 1;
      break;
    default:
      *value = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  // DP_EMU_BUS_OFFSET shifts the bus numbers: ranks given different offsets see different
  // physical GPUs, as under srun --gpus-per-task.
  const char* offset = std::getenv("DP_EMU_BUS_OFFSET");
  std::snprintf(bus_id, size_t(len), "0000:%02x:00.0",
                device + (offset != nullptr ? std::atoi(offset) : 0));
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Allocations& a = allocations();
  std::lock_guard lock(a.mutex);
  *total_bytes = device_memory_limit();
  *free_bytes = *total_bytes - std::min(*total_bytes, a.device_bytes);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  return allocate(p, bytes, cudaMemoryTypeDevice);
}
cudaError_t cudaFree(void* p) {
  return release(p, cudaMemoryTypeDevice);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return allocate(p, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  return allocate(p, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaFreeHost(void* p) {
  return release(p, cudaMemoryTypeHost);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  *attr = cudaPointerAttributes{};
  attr->type = cudaMemoryTypeUnregistered;
  attr->device = -1;
  Allocations& a = allocations();
  std::lock_guard lock(a.mutex);
  const char* p = static_cast<const char*>(ptr);
  auto it = a.blocks.upper_bound(p);
  if (it == a.blocks.begin()) return cudaSuccess;
  --it;
  if (p >= it->first + std::max<size_t>(it->second.first, 1)) return cudaSuccess;
  attr->type = it->second.second;
  attr->device = current_device;
  if (attr->type == cudaMemoryTypeDevice) attr->devicePointer = const_cast<char*>(p);
  if (attr->type == cudaMemoryTypeHost) attr->hostPointer = const_cast<char*>(p);
  return cudaSuccess;
}

// Every call runs when it is made: streams only have to exist.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaProfilerStart(void) {
  return cudaSuccess;
}
cudaError_t cudaProfilerStop(void) {
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new Event{std::chrono::steady_clock::now()});
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  reinterpret_cast<Event*>(event)->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(end)->at -
                                                 reinterpret_cast<Event*>(start)->at)
            .count();
  return cudaSuccess;
}

}  // extern "C"
