// Launch-shape helpers shared by the backend's .cu files (grid-stride 1-D and per-channel NHWC).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace dp::cuda::detail {

constexpr unsigned kBlockSize = 256;
// Enough blocks to fill any current GPU; the grid-stride loop covers larger n.
constexpr size_t kMaxBlocks = 4096;
// Reductions: about one resident wave on an H100/H200 (132 SMs x 8 blocks of 256 threads), so
// that the per-block atomics at the end stay few.
constexpr size_t kReduceBlocks = 1024;

inline unsigned blocks_for(size_t n, size_t max_blocks = kMaxBlocks) {
  return static_cast<unsigned>(std::min((n + kBlockSize - 1) / kBlockSize, max_blocks));
}

// A 2-D launch over NHWC data: threadIdx.x / blockIdx.x over channels, threadIdx.y / blockIdx.y
// over pixels (grid-stride). blockDim.x is the smallest power of two >= c, at most 32, so that a
// warp reads one contiguous run of memory also for few channels; blockDim.y = kBlockSize /
// blockDim.x is a power of two (for the shared-memory tree reductions).
struct ChannelGrid {
  dim3 grid, block;
};

inline ChannelGrid channel_grid(int64_t pixels, int c, size_t max_blocks) {
  unsigned bx = 1;
  while (bx < 32 && bx < static_cast<unsigned>(c)) bx *= 2;
  const unsigned by = kBlockSize / bx;
  const size_t tiles = (static_cast<size_t>(c) + bx - 1) / bx;
  const size_t rows = (static_cast<size_t>(pixels) + by - 1) / by;
  const size_t row_blocks = std::clamp<size_t>(max_blocks / tiles, 1, 65535);
  return {dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(rows, row_blocks))),
          dim3(bx, by)};
}

}  // namespace dp::cuda::detail
