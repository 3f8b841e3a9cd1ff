// Test-side control of the CPU execution model of the CUDA kernels (tests/emu/cuda_emu_device.hpp).
#pragma once

#include <cstdint>

namespace dp_emu {

// Caps gridDim.y (and gridDim.x of 1-D launches) at `blocks`, so that every grid-stride loop takes
// several turns on small test tensors; 0 = no cap (each launch's own grid). Returns the previous
// cap (initially DP_EMU_GRID_LIMIT from the environment, else 0). Channel tiles (gridDim.x of 2-D
// launches) are never capped: kernels index channels by blockIdx.x without a stride.
unsigned set_grid_stride_limit(unsigned blocks);

// The order in which a block's threads run between barriers: warp by warp, each warp's lanes in
// thread order (forward) or all reversed. A warp runs until all its lanes wait at a block barrier
// (or end) before the next one starts. Forward exposes a thread reading a slot before a later
// thread wrote it (a missing barrier before the read); reverse, a later thread overwriting a
// slot that an earlier one has yet to read (a missing barrier after it). Returns the previous.
enum class Order { kForward, kReverse };
Order set_order(Order order);

// Speed: a kernel whose first launch reached no barrier (__syncthreads, a shuffle) runs its later
// launches' threads as plain calls, in the same order, without fibers (and fails loudly should
// one of them reach a barrier after all). set_always_fibers(true) runs every launch on fibers.
// Returns the previous setting.
bool set_always_fibers(bool always);
// Kernel launches and GPU threads run since the process started.
uint64_t launches();
uint64_t threads_run();

}  // namespace dp_emu
