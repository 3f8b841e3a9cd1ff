// A CUDA execution model on the CPU, force-included into lib/cuda/*.cu compiled as C++ for tests.
//
// The backend's own kernels (lib/cuda/*.cu) then run on machines without a GPU: every GPU
// thread of a block is a fiber (ucontext) on the calling thread, blocks run one after another
// (after its first launch, a kernel that reached no barrier runs its threads as plain calls).
// __syncthreads() and the warp shuffles are real barriers between those fibers; each fiber runs
// until its next barrier, in thread order, so a read of a shared-memory slot that a later thread
// writes before the barrier sees the stale value every time (a race on a GPU), and a barrier that
// not every thread reaches is reported as a deadlock, not hung. __shared__ variables are shared by
// the threads of the running block, atomics are plain read-modify-writes (one thread of
// execution), and "device" pointers are host memory. Not modelled: FMA contraction (the host
// build rounds every operation), the order of concurrent float atomics, races between blocks.
//
// The build (tests/emu/emulate_cu.cmake) rewrites each launch `k<<<grid, block, 0, s>>>(args)`
// to `k | ::dp_emu::Launch{grid, block, 0, s}(args)`. Launches run synchronously.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emu.hpp"

namespace dp_emu {

// The running GPU thread's coordinates (valid inside a kernel only).
const uint3& thread_idx();
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

// __syncthreads(): waits until every thread of the block that has not exited arrives.
void sync_block();
// The value `v` (as raw bytes) of lane (this lane + delta) of the warp, or this lane's own value
// when that lane is past the warp; every lane of the warp must call it (full mask).
void shuffle_down(void* v, size_t bytes, unsigned delta, unsigned mask);

// Runs `body` once per GPU thread of the grid (fibers, block by block).
// `kernel` identifies the kernel (see set_always_fibers).
void run_grid(const void* kernel, dim3 grid, dim3 block, void (*body)(void*), void* ctx);

template <typename... A>
struct Pending;

// The launch configuration of `<<<grid, block, shared, stream>>>`.
struct Launch {
  dim3 grid, block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  Launch(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), shared_bytes(smem), stream(s) {}
  template <typename... A>
  Pending<std::decay_t<A>...> operator()(A&&... args) const {
    return {*this, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
  }
};

template <typename... A>
struct Pending {
  Launch launch;
  std::tuple<A...> args;
};

// kernel | Launch{...}(args...): runs the kernel over the grid with the arguments converted to
// its parameter types (once, as a launch copies them).
template <typename... P, typename... A>
void operator|(void (*kernel)(P...), Pending<A...> pending) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
  struct Call {
    void (*kernel)(P...);
    std::tuple<P...> params;
  } call{kernel, std::apply([](auto&... a) { return std::tuple<P...>(a...); }, pending.args)};
  run_grid(
      reinterpret_cast<const void*>(kernel), pending.launch.grid, pending.launch.block,
      [](void* ctx) {
        auto* c = static_cast<Call*>(ctx);
        std::apply(c->kernel, c->params);
      },
      &call);
}

template <typename T>
T shfl_down_sync(unsigned mask, T v, unsigned delta) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffle of a large type");
  shuffle_down(&v, sizeof(T), delta, mask);
  return v;
}

template <typename T>
T atomic_add(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}

// Correctly rounded single operations without contraction into FMAs (volatile keeps each
// rounding, as the __*_rn intrinsics do).
template <typename T>
T rounded(T v) {
  volatile T r = v;
  return r;
}

}  // namespace dp_emu

// The execution-space keywords: host code now.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __shared__ static

#define threadIdx (::dp_emu::thread_idx())
#define blockIdx (::dp_emu::block_idx)
#define blockDim (::dp_emu::block_dim)
#define gridDim (::dp_emu::grid_dim)

inline void __syncthreads() {
  ::dp_emu::sync_block();
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
  return ::dp_emu::shfl_down_sync(mask, v, delta);
}
inline float atomicAdd(float* p, float v) {
  return ::dp_emu::atomic_add(p, v);
}
inline double atomicAdd(double* p, double v) {
  return ::dp_emu::atomic_add(p, v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return ::dp_emu::atomic_add(p, v);
}

inline float __fadd_rn(float a, float b) {
  return ::dp_emu::rounded(a + b);
}
inline float __fmul_rn(float a, float b) {
  return ::dp_emu::rounded(a * b);
}
inline double __dadd_rn(double a, double b) {
  return ::dp_emu::rounded(a + b);
}
inline double __dsub_rn(double a, double b) {
  return ::dp_emu::rounded(a - b);
}
inline double __dmul_rn(double a, double b) {
  return ::dp_emu::rounded(a * b);
}
inline double __ddiv_rn(double a, double b) {
  return ::dp_emu::rounded(a / b);
}
