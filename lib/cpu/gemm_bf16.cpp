// bf16 GEMM on AVX512-BF16 for the bf16 Winograd passes; see gemm_bf16.hpp.
#include "gemm_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace dp::cpu {
namespace {

// A tile of up to kRows rows of C by one panel (V vectors of 16 columns): R x V accumulators in
// registers over all of k, each step one pair of A's row broadcast against V vectors of pairs of
// B. 8 x 2 keeps 16 accumulators in flight (more than VDPBF16PS's latency times its throughput on
// Zen 4 and Sapphire Rapids) with 10 loads for 16 multiply-adds of 32 products.
constexpr int kRows = 8;

template <int R, int V>
DP_BF16_TARGET void tile(int64_t pairs, const bf16* a, int64_t a_row, int64_t a_pair,
                         const bf16* panel, float* c, int64_t ldc, __mmask16 last,
                         bool accumulate) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if (accumulate) {
      if constexpr (V == 2) acc[r][0] = _mm512_loadu_ps(c + r * ldc);
      acc[r][V - 1] = _mm512_maskz_loadu_ps(last, c + r * ldc + 16 * (V - 1));
    } else {
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    }
  }
  for (int64_t q = 0; q < pairs; ++q) {
    __m512bh b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
      b[v] = (__m512bh)_mm512_loadu_si512(panel + q * 2 * kBf16Panel + v * 32);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * a_row + q * a_pair, sizeof pair);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, b[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if constexpr (V == 2) _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ldc + 16 * (V - 1), last, acc[r][V - 1]);
  }
}

using Tile = void (*)(int64_t, const bf16*, int64_t, int64_t, const bf16*, float*, int64_t,
                      __mmask16, bool);
template <int V>
constexpr Tile kTiles[kRows] = {tile<1, V>, tile<2, V>, tile<3, V>, tile<4, V>,
                                tile<5, V>, tile<6, V>, tile<7, V>, tile<8, V>};

}  // namespace

void gemm_bf16(int64_t m, int64_t n, int64_t k, const bf16* a, int64_t a_row, int64_t a_pair,
               const bf16* b, float* c, int64_t ldc, bool accumulate) {
  const int64_t pairs = k / 2;
  for (int64_t n0 = 0; n0 < n; n0 += kBf16Panel) {
    const int64_t cols = std::min(kBf16Panel, n - n0);
    const bool two = cols > 16;
    const auto last = __mmask16(0xffffu >> (16 - (two ? cols - 16 : cols)));
    const bf16* panel = b + n0 * k;  // (n0 / kBf16Panel) panels of k x kBf16Panel values
    for (int64_t m0 = 0; m0 < m; m0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, m - m0);
      (two ? kTiles<2> : kTiles<1>)[rows - 1](pairs, a + m0 * a_row, a_row, a_pair, panel,
                                              c + m0 * ldc + n0, ldc, last, accumulate);
    }
  }
}

}  // namespace dp::cpu
