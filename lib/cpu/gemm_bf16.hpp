// A bf16 GEMM with fp32 results on AVX512-BF16 (VDPBF16PS), for the Winograd passes of bf16
// training: row-major bf16 A times B packed in panels of 32 columns, written to fp32 C.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dp/bf16.hpp"
#include "simd.hpp"

namespace dp::cpu {

// B (k x n) packed for gemm_bf16: panels of kBf16Panel columns, each k/2 rows of kBf16Panel pairs
// (B[2q][j], B[2q+1][j]): the two values VDPBF16PS multiplies with a pair of A's row. The columns
// past n need no values: each column of C is its own lanes, and those past n are not stored. k
// must be even.
constexpr int64_t kBf16Panel = 32;
inline int64_t bf16_packed_size(int64_t k, int64_t n) {
  return (n + kBf16Panel - 1) / kBf16Panel * kBf16Panel * k;
}
inline int64_t bf16_packed_index(int64_t row, int64_t col, int64_t k) {
  return ((col / kBf16Panel) * (k / 2) + row / 2) * 2 * kBf16Panel + (col % kBf16Panel) * 2 +
         (row & 1);
}

// C (m x n, row stride ldc) = A (m x k, k even) times B packed (bf16_packed_index), summed in
// fp32 (added to C with `accumulate`). A's pair q of row r, (A[r][2q], A[r][2q+1]), is the two
// values at a + r * a_row + q * a_pair: a_row = lda and a_pair = 2 for row-major A; a_row = 2
// and a_pair = 2m for pairs of columns interleaved ([k/2][m][2], as the weight gradient's
// transposed tiles). Runs on the calling thread; needs AVX512-BF16 (the CPU backend's bf16
// precision requires it).
void gemm_bf16(int64_t m, int64_t n, int64_t k, const bf16* a, int64_t a_row, int64_t a_pair,
               const bf16* b, float* c, int64_t ldc, bool accumulate);

}  // namespace dp::cpu
