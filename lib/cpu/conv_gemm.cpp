// 3x3 stride-1 convolution passes on GEMMs: nine shifted sgemms each on zero-bordered copies of
// the images, and Winograd for every pass: F(4x4, 3x3) or F(2x2, 3x3) on sgemm, F(2x2, 3x3) on
// gemm_bf16 with bf16 activations; see conv_gemm.hpp.
#include "conv_gemm.hpp"

#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "dp/bf16.hpp"
#include "dp/error.hpp"
#include "gemm_bf16.hpp"
#include "simd.hpp"

namespace dp::cpu {
namespace {

constexpr int kTaps = 9;

// Winograd tiles transformed at a time: 16 x kTileChunk x (cin + cout) floats of copies (at most
// 32 MiB for 1024 channels), each thread's GEMMs on kTileChunk / threads of those rows.
constexpr int64_t kTileChunk = 256;
constexpr int kWinoPoints = 16;  // a 4x4 transformed tile
// ... and for backward-weights on bf16 GEMMs (half the bytes a tile): 16 x kWeightChunk x (cin +
// cout rounded up to 32) bf16 values, at most the fp32 chunks' bytes plus 512 KiB.
constexpr int64_t kWeightChunk = 512;
// F(4x4, 3x3): 6x6 transformed tiles, each giving 4x4 output pixels; chunks of as many
// transformed rows as F(2x2, 3x3)'s (36 x 112 against 16 x 256).
constexpr int kWino4Points = 36;
constexpr int64_t kTileChunk4 = 112;
// fp32 Winograd runs F(4x4, 3x3) where the batch has at least this many of its tiles: with
// fewer, the GEMMs' rows are too few (forward and backward-data per layer of UNet16 at 128x128,
// batch 2, capped at AVX2 on 2 threads, Zen 4: F(4x4, 3x3) 10-30% faster on 32x32 images, 128
// tiles, and 3-25% slower on 16x16, 32 tiles).
constexpr int64_t kTile4MinTiles = 64;
constexpr int kLanes = 16;  // channels the Winograd transforms handle at a time

// Row-major C (m x n) = alpha op(A) op(B) + beta C; op(X) = X or its transpose.
void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  DP_CHECK(st == dnnl_success, "oneDNN: sgemm ", m, "x", n, "x", k, " failed (status ", int(st),
           ")");
}

size_t aligned(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

}  // namespace

GemmConv::GemmConv(const ConvDesc& d, bool bf16)
    : n(d.n),
      h(d.h),
      w(d.w),
      cin(d.cin),
      cout(d.cout),
      relu(d.relu),
      has_bias(d.bias),
      tile(!bf16 && int64_t(d.n) * ((d.h + 3) / 4) * ((d.w + 3) / 4) >= kTile4MinTiles ? 4 : 2),
      bf16_activations(bf16) {}

bool GemmConv::fits(const ConvDesc& d, bool bf16) {
  return d.kernel == 3 && d.stride == 1 && d.padding() == 1 &&
         (!bf16 || (d.cin % 2 == 0 && d.cout % 2 == 0));
}

int64_t GemmConv::padded_rows() const {
  return int64_t(h + 2) * (w + 2) + 2;
}
int64_t GemmConv::wide_rows() const {
  return int64_t(h) * (w + 2);
}

size_t GemmConv::copies_bytes(bool plain) const {
  const size_t rows = tile == 4 ? kWino4Points * kTileChunk4 : kWinoPoints * kTileChunk;
  size_t wino = (rows * (cin + cout) + std::max(cin, cout)) * sizeof(float);
  if (bf16_activations)  // backward-weights' chunks (forward's and backward-data's are smaller)
    wino = std::max(
        wino, size_t(kWinoPoints * (kWeightChunk * cin + bf16_packed_size(kWeightChunk, cout)) +
                     std::max(cin, cout)) *
                  sizeof(bf16));
  if (!plain) return wino;
  const size_t shifted = aligned(size_t(padded_rows()) * cin * sizeof(float)) +
                         size_t(wide_rows()) * cout * sizeof(float);
  return std::max(shifted, wino);
}
size_t GemmConv::weight_scratch_bytes() const {
  const size_t fp32 = size_t(tile == 4 ? kWino4Points : kWinoPoints) * cin * cout * sizeof(float);
  if (!bf16_activations) return fp32;
  const int64_t packed = std::max(bf16_packed_size(cin, cout), bf16_packed_size(cout, cin));
  return std::max(fp32, size_t(kWinoPoints) * size_t(packed) * sizeof(bf16));
}

float* GemmConv::padded(void* copies) const {
  return static_cast<float*>(copies);
}
float* GemmConv::wide(void* copies) const {
  return reinterpret_cast<float*>(static_cast<char*>(copies) +
                                  aligned(size_t(padded_rows()) * cin * sizeof(float)));
}

// OIHW <-> [tap][cin][cout], in blocks of 16 output channels: each block reads (or writes) 16
// contiguous runs of 9 cin values and writes (reads) whole cache lines of 16 floats, where a plain
// loop would miss the cache on every element of one side.
constexpr int64_t kChannelBlock = 16;

// Calls copy(tap-layout index, OIHW index) for every weight, in that blocked order.
template <typename F>
void for_each_weight_blocked(int64_t cin, int64_t cout, const F& copy) {
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kChannelBlock) {
    const int64_t o1 = std::min<int64_t>(o0 + kChannelBlock, cout);
    for (int64_t c = 0; c < cin; ++c)
      for (int64_t t = 0; t < kTaps; ++t)
        for (int64_t o = o0; o < o1; ++o) copy((t * cin + c) * cout + o, (o * cin + c) * kTaps + t);
  }
}

void GemmConv::weights_to_taps(const float* w_oihw, float* taps) const {
  for_each_weight_blocked(cin, cout, [&](int64_t i, int64_t j) { taps[i] = w_oihw[j]; });
}

void GemmConv::taps_to_weights(const float* taps, float* w_oihw) const {
  for_each_weight_blocked(cin, cout, [&](int64_t i, int64_t j) { w_oihw[j] = taps[i]; });
}

// The Winograd tile transforms, on kLanes channels at a time (a lane at a time for the rest),
// with AVX2 clones (simd.hpp). They only add, subtract and halve.

namespace {

// B^T d B (B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]) of L channels from d[r][c] + k0 into
// v[p * stride + k0 + j] for the 16 points p = 4 r + c.
template <int64_t L>
[[gnu::always_inline]] inline void input_lanes(const float* const (&d)[4][4], int64_t k0, float* v,
                                               int64_t stride) {
  float q[4][4][L];
  for (int c = 0; c < 4; ++c)
    for (int64_t j = 0; j < L; ++j) {
      const float e0 = d[0][c][k0 + j], e1 = d[1][c][k0 + j], e2 = d[2][c][k0 + j],
                  e3 = d[3][c][k0 + j];
      q[0][c][j] = e0 - e2;
      q[1][c][j] = e1 + e2;
      q[2][c][j] = e2 - e1;
      q[3][c][j] = e1 - e3;
    }
  for (int r = 0; r < 4; ++r)
    for (int64_t j = 0; j < L; ++j) {
      float* out = v + int64_t(4 * r) * stride + k0 + j;
      out[0] = q[r][0][j] - q[r][2][j];
      out[stride] = q[r][1][j] + q[r][2][j];
      out[2 * stride] = q[r][2][j] - q[r][1][j];
      out[3 * stride] = q[r][1][j] - q[r][3][j];
    }
}

DP_AVX2_CLONES void input_transform(const float* const (&d)[4][4], int64_t k, float* v,
                                    int64_t stride) {
  int64_t k0 = 0;
  for (; k0 + kLanes <= k; k0 += kLanes) input_lanes<kLanes>(d, k0, v, stride);
  for (; k0 < k; ++k0) input_lanes<1>(d, k0, v, stride);
}

// A dY A^T (A = [1 0; 1 1; 1 -1; 0 -1]) of the 2x2 gradient pixels g[r][c] + k0 into
// z[p * stride + k0 + j].
template <int64_t L>
[[gnu::always_inline]] inline void gradient_lanes(const float* const (&g)[2][2], int64_t k0,
                                                  float* z, int64_t stride) {
  float q[4][2][L];
  for (int c = 0; c < 2; ++c)
    for (int64_t j = 0; j < L; ++j) {
      const float e0 = g[0][c][k0 + j], e1 = g[1][c][k0 + j];
      q[0][c][j] = e0;
      q[1][c][j] = e0 + e1;
      q[2][c][j] = e0 - e1;
      q[3][c][j] = -e1;
    }
  for (int r = 0; r < 4; ++r)
    for (int64_t j = 0; j < L; ++j) {
      float* out = z + int64_t(4 * r) * stride + k0 + j;
      out[0] = q[r][0][j];
      out[stride] = q[r][0][j] + q[r][1][j];
      out[2 * stride] = q[r][0][j] - q[r][1][j];
      out[3 * stride] = -q[r][1][j];
    }
}

DP_AVX2_CLONES void gradient_transform(const float* const (&g)[2][2], int64_t k, float* z,
                                       int64_t stride) {
  int64_t k0 = 0;
  for (; k0 + kLanes <= k; k0 += kLanes) gradient_lanes<kLanes>(g, k0, z, stride);
  for (; k0 < k; ++k0) gradient_lanes<1>(g, k0, z, stride);
}

// A^T m A (A^T = [1 1 1 0; 0 1 -1 -1]) of the 16 points m[p * stride + k0 + j], plus the bias
// (optional), then ReLU (optional), into the 2x2 output pixels o[r][c] + k0 (null: outside the
// image).
template <int64_t L>
[[gnu::always_inline]] inline void output_lanes(const float* m, int64_t stride, int64_t k0,
                                                const float* bias, bool relu,
                                                float* const (&o)[2][2]) {
  float q[2][4][L], res[2][2][L];
  for (int c = 0; c < 4; ++c)
    for (int64_t j = 0; j < L; ++j) {
      const float m0 = m[c * stride + k0 + j], m1 = m[(4 + c) * stride + k0 + j],
                  m2 = m[(8 + c) * stride + k0 + j], m3 = m[(12 + c) * stride + k0 + j];
      q[0][c][j] = m0 + m1 + m2;
      q[1][c][j] = m1 - m2 - m3;
    }
  for (int r = 0; r < 2; ++r)
    for (int64_t j = 0; j < L; ++j) {
      const float b = bias != nullptr ? bias[k0 + j] : 0.0f;
      const float r0 = q[r][0][j] + q[r][1][j] + q[r][2][j] + b;
      const float r1 = q[r][1][j] - q[r][2][j] - q[r][3][j] + b;
      res[r][0][j] = relu ? std::max(r0, 0.0f) : r0;
      res[r][1][j] = relu ? std::max(r1, 0.0f) : r1;
    }
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c)
      if (o[r][c] != nullptr) std::copy_n(res[r][c], L, o[r][c] + k0);
}

DP_AVX2_CLONES void output_transform(const float* m, int64_t stride, int64_t k, const float* bias,
                                     bool relu, float* const (&o)[2][2]) {
  int64_t k0 = 0;
  for (; k0 + kLanes <= k; k0 += kLanes) output_lanes<kLanes>(m, stride, k0, bias, relu, o);
  for (; k0 < k; ++k0) output_lanes<1>(m, stride, k0, bias, relu, o);
}

// The same transforms on bf16 activations, 16 channels a vector with AVX-512 (bf16 training runs
// only where AVX512-BF16 is): bf16 widened exactly, results rounded to nearest even by
// VCVTNEPS2BF16, the channels past the last multiple of 16 masked: input tiles to bf16 (forward's
// and backward-data's GEMMs), input and gradient tiles of two tiles interleaved
// (backward-weights'), output tiles from fp32 to bf16.

DP_BF16_TARGET inline __mmask16 lanes_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}
DP_BF16_TARGET inline __m512 load16(const bf16* p, __mmask16 m) {
  // (The maskz forms: GCC 12 warns of the plain forms' undefined pass-through operand.)
  const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, wide, 16));
}
DP_BF16_TARGET inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
DP_BF16_TARGET inline void store16(bf16* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// B^T d B and A dY A^T of 16 channels from k0 (masked by m) into the 16 points' vectors.
DP_BF16_TARGET inline void input_points(const bf16* const (&d)[4][4], int64_t k0, __mmask16 m,
                                        __m512 (&v)[16]) {
  __m512 q[4][4];
  for (int c = 0; c < 4; ++c) {
    const __m512 e0 = load16(d[0][c] + k0, m), e1 = load16(d[1][c] + k0, m),
                 e2 = load16(d[2][c] + k0, m), e3 = load16(d[3][c] + k0, m);
    q[0][c] = e0 - e2;
    q[1][c] = e1 + e2;
    q[2][c] = e2 - e1;
    q[3][c] = e1 - e3;
  }
  for (int r = 0; r < 4; ++r) {
    v[4 * r] = q[r][0] - q[r][2];
    v[4 * r + 1] = q[r][1] + q[r][2];
    v[4 * r + 2] = q[r][2] - q[r][1];
    v[4 * r + 3] = q[r][1] - q[r][3];
  }
}
DP_BF16_TARGET inline void gradient_points(const bf16* const (&g)[2][2], int64_t k0, __mmask16 m,
                                           __m512 (&z)[16]) {
  __m512 q[4][2];
  for (int c = 0; c < 2; ++c) {
    const __m512 e0 = load16(g[0][c] + k0, m), e1 = load16(g[1][c] + k0, m);
    q[0][c] = e0;
    q[1][c] = e0 + e1;
    q[2][c] = e0 - e1;
    q[3][c] = -e1;
  }
  for (int r = 0; r < 4; ++r) {
    z[4 * r] = q[r][0];
    z[4 * r + 1] = q[r][0] + q[r][1];
    z[4 * r + 2] = q[r][0] - q[r][1];
    z[4 * r + 3] = -q[r][1];
  }
}

DP_BF16_TARGET void input_transform(const bf16* const (&d)[4][4], int64_t k, bf16* v,
                                    int64_t stride) {
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    const __mmask16 m = lanes_mask(k - k0);
    __m512 points[16];
    input_points(d, k0, m, points);
    for (int p = 0; p < 16; ++p) store16(v + p * stride + k0, m, points[p]);
  }
}

// Two tiles' 16 channels rounded to bf16 and interleaved (a0 b0 a1 b1 ...): the pairs along the
// tiles that gemm_bf16 multiplies in the weight gradient's sum over tiles.
DP_BF16_TARGET inline void store_pairs(bf16* p, int64_t left, __m512 a, __m512 b) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a's 16 values, then b's
  const __m512i pairs = _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both);
  const __mmask32 m = left >= 16 ? __mmask32(0xffffffffu) : __mmask32((1u << (2 * left)) - 1);
  _mm512_mask_storeu_epi16(p, m, pairs);
}

// Two input channels' transformed filters (v[j][p][l]: input channel c0 + j, output channel
// o0 + l) rounded to bf16 into gemm_bf16's packing of the 16 points' matrices: [cin][cout], the
// two channels a pair of rows (an interleaved store); or rotated, [cout][cin], where each two
// output channels are a pair of rows (one 32-bit store each).
DP_BF16_TARGET void store_filters_bf16(const float (&v)[2][16][16], int64_t c0, int64_t o0,
                                       int64_t lanes, int64_t cin, int64_t cout, bool rotated,
                                       bf16* u) {
  const int64_t k_in = rotated ? cout : cin, point = bf16_packed_size(k_in, rotated ? cin : cout);
  for (int p = 0; p < 16; ++p) {
    bf16* up = u + p * point;
    if (!rotated) {
      store_pairs(up + bf16_packed_index(c0, o0, k_in), lanes, _mm512_loadu_ps(v[0][p]),
                  _mm512_loadu_ps(v[1][p]));
      continue;
    }
    for (int64_t c = c0; c < std::min(c0 + 2, cin); ++c) {
      alignas(32) uint32_t pairs[8];  // output channels (o0 + 2i, o0 + 2i + 1) as bf16
      _mm256_store_si256(reinterpret_cast<__m256i*>(pairs),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(v[c - c0][p])));
      for (int64_t i = 0; i < lanes / 2; ++i)
        std::memcpy(up + bf16_packed_index(o0 + 2 * i, c, k_in), &pairs[i], sizeof(uint32_t));
    }
  }
}

// The transforms of tiles t and t+1 (d0/g0 and d1/g1) for backward-weights on bf16 GEMMs, stored
// as pairs: the input tiles at v + p * v_point + 2 c (c < k_in), the gradient tiles at
// z + p * z_point in gemm_bf16's packing of a B with z_k rows (z: the pair's first row).
DP_BF16_TARGET void pair_transforms(const bf16* const (&d0)[4][4], const bf16* const (&d1)[4][4],
                                    int64_t k_in, bf16* v, int64_t v_point,
                                    const bf16* const (&g0)[2][2], const bf16* const (&g1)[2][2],
                                    int64_t k_out, bf16* z, int64_t z_point, int64_t z_k) {
  __m512 a[16], b[16];
  for (int64_t k0 = 0; k0 < k_in; k0 += 16) {
    const __mmask16 m = lanes_mask(k_in - k0);
    input_points(d0, k0, m, a);
    input_points(d1, k0, m, b);
    for (int p = 0; p < 16; ++p) store_pairs(v + p * v_point + 2 * k0, k_in - k0, a[p], b[p]);
  }
  for (int64_t k0 = 0; k0 < k_out; k0 += 16) {
    const __mmask16 m = lanes_mask(k_out - k0);
    gradient_points(g0, k0, m, a);
    gradient_points(g1, k0, m, b);
    for (int p = 0; p < 16; ++p)
      store_pairs(z + p * z_point + bf16_packed_index(0, k0, z_k), k_out - k0, a[p], b[p]);
  }
}

DP_BF16_TARGET void output_transform(const float* mm, int64_t stride, int64_t k, const float* bias,
                                     bool relu, bf16* const (&o)[2][2]) {
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    const __mmask16 m = lanes_mask(k - k0);
    __m512 q[2][4];
    for (int c = 0; c < 4; ++c) {
      const float* col = mm + c * stride + k0;
      const __m512 m0 = load16(col, m), m1 = load16(col + 4 * stride, m),
                   m2 = load16(col + 8 * stride, m), m3 = load16(col + 12 * stride, m);
      q[0][c] = m0 + m1 + m2;
      q[1][c] = m1 - m2 - m3;
    }
    const __m512 b = bias != nullptr ? load16(bias + k0, m) : _mm512_setzero_ps();
    for (int r = 0; r < 2; ++r) {
      __m512 res[2] = {q[r][0] + q[r][1] + q[r][2] + b, q[r][1] - q[r][2] - q[r][3] + b};
      for (int c = 0; c < 2; ++c) {
        if (relu) res[c] = _mm512_maskz_max_ps(0xffff, res[c], _mm512_setzero_ps());
        if (o[r][c] != nullptr) store16(o[r][c] + k0, m, res[c]);
      }
    }
  }
}

// F(4x4, 3x3) on the points 0, 1, -1, 2, -2 and infinity (Lavin and Gray's matrices):
// B^T d B of L channels of the 6x6 input tile d[r][c] + k0 into v[p * stride + k0 + j] for the
// 36 points p = 6 r + c, with B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0;
// 0 2 -1 -2 1 0; 0 4 0 -5 0 1].
template <int64_t L>
[[gnu::always_inline]] inline void bt6(const float* e0, const float* e1, const float* e2,
                                       const float* e3, const float* e4, const float* e5,
                                       float* const (&t)[6]) {
  // One loop per output row: the compiler vectorises each over the L channels.
  for (int64_t j = 0; j < L; ++j) t[0][j] = 4.0f * e0[j] - 5.0f * e2[j] + e4[j];
  for (int64_t j = 0; j < L; ++j) t[1][j] = -4.0f * (e1[j] + e2[j]) + e3[j] + e4[j];
  for (int64_t j = 0; j < L; ++j) t[2][j] = 4.0f * (e1[j] - e2[j]) - e3[j] + e4[j];
  for (int64_t j = 0; j < L; ++j) t[3][j] = 2.0f * (e3[j] - e1[j]) - e2[j] + e4[j];
  for (int64_t j = 0; j < L; ++j) t[4][j] = 2.0f * (e1[j] - e3[j]) - e2[j] + e4[j];
  for (int64_t j = 0; j < L; ++j) t[5][j] = 4.0f * e1[j] - 5.0f * e3[j] + e5[j];
}

template <int64_t L>
[[gnu::always_inline]] inline void input6_lanes(const float* const (&d)[6][6], int64_t k0, float* v,
                                                int64_t stride) {
  float q[6][6][L];  // B^T d: q[r][c]
  for (int c = 0; c < 6; ++c) {
    float* const t[6] = {q[0][c], q[1][c], q[2][c], q[3][c], q[4][c], q[5][c]};
    bt6<L>(d[0][c] + k0, d[1][c] + k0, d[2][c] + k0, d[3][c] + k0, d[4][c] + k0, d[5][c] + k0, t);
  }
  for (int r = 0; r < 6; ++r) {
    float* const t[6] = {v + (6 * r) * stride + k0,     v + (6 * r + 1) * stride + k0,
                         v + (6 * r + 2) * stride + k0, v + (6 * r + 3) * stride + k0,
                         v + (6 * r + 4) * stride + k0, v + (6 * r + 5) * stride + k0};
    bt6<L>(q[r][0], q[r][1], q[r][2], q[r][3], q[r][4], q[r][5], t);
  }
}

DP_AVX2_CLONES void input6_transform(const float* const (&d)[6][6], int64_t k, float* v,
                                     int64_t stride) {
  int64_t k0 = 0;
  for (; k0 + kLanes <= k; k0 += kLanes) input6_lanes<kLanes>(d, k0, v, stride);
  for (; k0 < k; ++k0) input6_lanes<1>(d, k0, v, stride);
}

// A^T m A of the 36 points m[p * stride + k0 + j], plus the bias (optional), then ReLU
// (optional), into the 4x4 output pixels o[r][c] + k0 (null: outside the image);
// A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
template <int64_t L>
[[gnu::always_inline]] inline void at4(const float* e0, const float* e1, const float* e2,
                                       const float* e3, const float* e4, const float* e5,
                                       float (&t)[4][L]) {
  for (int64_t j = 0; j < L; ++j) {
    const float p12 = e1[j] + e2[j], m12 = e1[j] - e2[j], p34 = e3[j] + e4[j], m34 = e3[j] - e4[j];
    t[0][j] = e0[j] + p12 + p34;
    t[1][j] = m12 + 2.0f * m34;
    t[2][j] = p12 + 4.0f * p34;
    t[3][j] = m12 + 8.0f * m34 + e5[j];
  }
}

template <int64_t L>
[[gnu::always_inline]] inline void output4_lanes(const float* m, int64_t stride, int64_t k0,
                                                 const float* bias, bool relu,
                                                 float* const (&o)[4][4]) {
  float q[6][4][L], res[4][4][L], b[L];  // A^T m, column by column: q[c][r]; then (A^T m A)[r]
  for (int64_t j = 0; j < L; ++j) b[j] = bias != nullptr ? bias[k0 + j] : 0.0f;
  for (int c = 0; c < 6; ++c) {
    const float* col = m + c * stride + k0;
    at4<L>(col, col + 6 * stride, col + 12 * stride, col + 18 * stride, col + 24 * stride,
           col + 30 * stride, q[c]);
  }
  for (int r = 0; r < 4; ++r) {
    at4<L>(q[0][r], q[1][r], q[2][r], q[3][r], q[4][r], q[5][r], res[r]);
    for (int c = 0; c < 4; ++c) {
      float* x = res[r][c];
      for (int64_t j = 0; j < L; ++j) x[j] += b[j];
      if (relu)
        for (int64_t j = 0; j < L; ++j) x[j] = std::max(x[j], 0.0f);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      if (o[r][c] != nullptr) std::copy_n(res[r][c], L, o[r][c] + k0);
}

DP_AVX2_CLONES void output4_transform(const float* m, int64_t stride, int64_t k, const float* bias,
                                      bool relu, float* const (&o)[4][4]) {
  int64_t k0 = 0;
  for (; k0 + kLanes <= k; k0 += kLanes) output4_lanes<kLanes>(m, stride, k0, bias, relu, o);
  for (; k0 < k; ++k0) output4_lanes<1>(m, stride, k0, bias, relu, o);
}

// A dY A^T of the 4x4 gradient pixels g[r][c] + k0 into z[p * stride + k0 + j] for the 36 points
// p = 6 r + c (backward-weights of F(4x4, 3x3)); A = [1 0 0 0; 1 1 1 1; 1 -1 1 -1; 1 2 4 8;
// 1 -2 4 -8; 0 0 0 1] (A^T above).
template <int64_t L>
[[gnu::always_inline]] inline void gradient4_lanes(const float* const (&g)[4][4], int64_t k0,
                                                   float* z, int64_t stride) {
  const auto a = [](float e0, float e1, float e2, float e3, float(&q)[6]) {
    const float s02 = e0 + e2, s13 = e1 + e3, t = e0 + 4 * e2, u = 2 * e1 + 8 * e3;
    q[0] = e0;
    q[1] = s02 + s13;
    q[2] = s02 - s13;
    q[3] = t + u;
    q[4] = t - u;
    q[5] = e3;
  };
  float q[4][6][L];  // A dY: [column][row][lane]
  for (int c = 0; c < 4; ++c)
    for (int64_t j = 0; j < L; ++j) {
      float col[6];
      a(g[0][c][k0 + j], g[1][c][k0 + j], g[2][c][k0 + j], g[3][c][k0 + j], col);
      for (int r = 0; r < 6; ++r) q[c][r][j] = col[r];
    }
  for (int r = 0; r < 6; ++r)
    for (int64_t j = 0; j < L; ++j) {
      float row[6];
      a(q[0][r][j], q[1][r][j], q[2][r][j], q[3][r][j], row);
      float* out = z + int64_t(6 * r) * stride + k0 + j;
      for (int c = 0; c < 6; ++c) out[c * stride] = row[c];
    }
}

DP_AVX2_CLONES void gradient4_transform(const float* const (&g)[4][4], int64_t k, float* z,
                                        int64_t stride) {
  int64_t k0 = 0;
  for (; k0 + kLanes <= k; k0 += kLanes) gradient4_lanes<kLanes>(g, k0, z, stride);
  for (; k0 < k; ++k0) gradient4_lanes<1>(g, k0, z, stride);
}

}  // namespace

// One NHWC image into the zero-bordered buffer.
void GemmConv::border_image(const float* x, float* xp) const {
  const int64_t wp = w + 2, row_bytes = int64_t(w) * cin * int64_t(sizeof(float));
  std::memset(xp, 0, size_t(wp + 1) * cin * sizeof(float));  // top row, first left border
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < h; ++r) {
    float* dst = xp + ((r + 1) * wp + 1) * cin;
    std::memcpy(dst, x + r * w * cin, size_t(row_bytes));
    std::memset(dst + int64_t(w) * cin, 0, 2 * size_t(cin) * sizeof(float));  // right, next left
  }
  std::memset(xp + ((h + 1) * wp + 1) * cin, 0, size_t(wp + 1) * cin * sizeof(float));
}

// One image's output gradient into the wide rows, the two extra columns zero (they must add
// nothing to the weight and data gradients).
void GemmConv::widen(const float* dy, float* dyw) const {
  const int64_t wp = w + 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < h; ++r) {
    float* dst = dyw + r * wp * cout;
    std::memcpy(dst, dy + r * w * cout, size_t(w) * cout * sizeof(float));
    std::memset(dst + int64_t(w) * cout, 0, 2 * size_t(cout) * sizeof(float));
  }
}

void GemmConv::forward(const float* x, const float* w_oihw, const float* b, float* y, void* weights,
                       void* copies) const {
  float* taps = static_cast<float*>(weights);
  float *xp = padded(copies), *yw = wide(copies);
  weights_to_taps(w_oihw, taps);
  const int64_t wp = w + 2, image_in = int64_t(h) * w * cin, image_out = int64_t(h) * w * cout;
  for (int64_t i = 0; i < n; ++i) {
    border_image(x + i * image_in, xp);
    for (int t = 0; t < kTaps; ++t)
      sgemm('N', 'N', wide_rows(), cout, cin, xp + ((t / 3) * wp + t % 3) * cin, cin,
            taps + int64_t(t) * cin * cout, cout, t == 0 ? 0.0f : 1.0f, yw, cout);
    float* out = y + i * image_out;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t c = 0; c < w; ++c) {
        const float* src = yw + (r * wp + c) * cout;
        float* dst = out + (r * w + c) * cout;
        for (int64_t o = 0; o < cout; ++o) {
          const float v = src[o] + (has_bias ? b[o] : 0.0f);
          dst[o] = relu ? std::max(v, 0.0f) : v;
        }
      }
  }
}

void GemmConv::backward_weights(const float* x, const float* dy, float* dw_oihw, float* db,
                                void* weights, void* copies) const {
  float* dtaps = static_cast<float*>(weights);
  float *xp = padded(copies), *dyw = wide(copies);
  const int64_t wp = w + 2, image_in = int64_t(h) * w * cin, image_out = int64_t(h) * w * cout;
  for (int64_t i = 0; i < n; ++i) {
    border_image(x + i * image_in, xp);
    widen(dy + i * image_out, dyw);
    for (int t = 0; t < kTaps; ++t)
      sgemm('T', 'N', cin, cout, wide_rows(), xp + ((t / 3) * wp + t % 3) * cin, cin, dyw, cout,
            i == 0 ? 0.0f : 1.0f, dtaps + int64_t(t) * cin * cout, cout);
  }
  taps_to_weights(dtaps, dw_oihw);
  bias_gradient(dy, db);
}

// Each thread sums its own channels over every pixel, in pixel order (any thread count gives the
// same bits).
template <typename T>
void GemmConv::bias_gradient(const T* dy, float* db) const {
  if (!has_bias) return;
  const int64_t pixels = int64_t(n) * h * w;
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kChannelBlock) {
    const int64_t lanes = std::min<int64_t>(kChannelBlock, cout - o0);
    float sum[kChannelBlock] = {};  // in registers, where db might alias dy
    for (int64_t p = 0; p < pixels; ++p) {
      const T* row = dy + p * cout + o0;
      if (lanes == kChannelBlock)
        for (int64_t o = 0; o < kChannelBlock; ++o) sum[o] += to_float(row[o]);
      else
        for (int64_t o = 0; o < lanes; ++o) sum[o] += to_float(row[o]);
    }
    std::copy_n(sum, lanes, db + o0);
  }
}

void GemmConv::backward_data(const float* dy, const float* w_oihw, float* dx, void* weights,
                             void* copies) const {
  float* taps = static_cast<float*>(weights);
  float *dxp = padded(copies), *dyw = wide(copies);
  weights_to_taps(w_oihw, taps);
  const int64_t wp = w + 2, image_in = int64_t(h) * w * cin, image_out = int64_t(h) * w * cout;
  for (int64_t i = 0; i < n; ++i) {
    widen(dy + i * image_out, dyw);
    // The centre tap (rows wp+1 on) goes first and overwrites; only the rows before and after
    // its range need zeros.
    std::memset(dxp, 0, size_t(wp + 1) * cin * sizeof(float));
    std::memset(dxp + (wp + 1 + wide_rows()) * cin, 0,
                size_t(padded_rows() - wp - 1 - wide_rows()) * cin * sizeof(float));
    for (int k = 0; k < kTaps; ++k) {
      const int t = (k + kTaps / 2) % kTaps;  // 4, 5, ..., 8, 0, ..., 3
      sgemm('N', 'T', wide_rows(), cin, cout, dyw, cout, taps + int64_t(t) * cin * cout, cout,
            k == 0 ? 0.0f : 1.0f, dxp + ((t / 3) * wp + t % 3) * cin, cin);
    }
    float* out = dx + i * image_in;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < h; ++r)
      std::memcpy(out + r * w * cin, dxp + ((r + 1) * wp + 1) * cin,
                  size_t(w) * cin * sizeof(float));
  }
}

namespace {

using FilterBlock = float[kWinoPoints][kChannelBlock];  // [point][output channel]

// G g G^T of each of the cin x cout filters (OIHW), rotated by 180 degrees where asked, handed to
// store(c, o0, lanes, v) two input channels at a time: v[j][p][l] is point p of the filter from
// input channel c + j to output channel o0 + l (l < lanes); past cin, v[1] is zeros.
template <typename Store>
DP_AVX2_CLONES void transform_filters(int64_t cin, int64_t cout, const float* w_oihw, bool rotated,
                                      const Store& store) {
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kChannelBlock) {
    const int64_t lanes = std::min<int64_t>(kChannelBlock, cout - o0);
    FilterBlock v[2];
    for (int64_t c = 0; c < cin; ++c) {
      // The 3x3 filters of up to 16 output channels, tap-major, so that the transform below is
      // fixed-length loops over the channels the compiler vectorises (scalar, it was 4.5% of a
      // 2-thread full-width AVX2 step in perf, now 3.6%); rotated: the taps reversed (180 deg).
      float g[kTaps][kChannelBlock] = {};
      for (int64_t l = 0; l < lanes; ++l) {
        const float* f = w_oihw + ((o0 + l) * cin + c) * kTaps;
        for (int k = 0; k < kTaps; ++k) g[k][l] = f[rotated ? kTaps - 1 - k : k];
      }
      // t = G g (4x3), then G g G^T (4x4); G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
      FilterBlock& vc = v[c % 2];
      for (int64_t l = 0; l < kChannelBlock; ++l) {
        float t[4][3];
        for (int j = 0; j < 3; ++j) {
          const float g0 = g[j][l], g1 = g[3 + j][l], g2 = g[6 + j][l];
          t[0][j] = g0;
          t[1][j] = 0.5f * (g0 + g1 + g2);
          t[2][j] = 0.5f * (g0 - g1 + g2);
          t[3][j] = g2;
        }
        for (int i = 0; i < 4; ++i) {
          vc[i * 4][l] = t[i][0];
          vc[i * 4 + 1][l] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
          vc[i * 4 + 2][l] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
          vc[i * 4 + 3][l] = t[i][2];
        }
      }
      if (c % 2 == 1 || c + 1 == cin) {
        if (c % 2 == 0) std::fill_n(&v[1][0][0], kWinoPoints * kChannelBlock, 0.0f);
        store(c - c % 2, o0, lanes, v);
      }
    }
  }
}

}  // namespace

void GemmConv::winograd_filters(const float* w_oihw, bool rotated, void* u) const {
  const int64_t k_in = rotated ? cout : cin, k_out = rotated ? cin : cout;
  if (!bf16_activations) {
    float* uf = static_cast<float*>(u);
    transform_filters(cin, cout, w_oihw, rotated,
                      [&](int64_t c0, int64_t o0, int64_t lanes, const FilterBlock(&v)[2]) {
                        for (int64_t c = c0; c < std::min<int64_t>(c0 + 2, cin); ++c)
                          for (int p = 0; p < kWinoPoints; ++p)
                            for (int64_t l = 0; l < lanes; ++l) {
                              const int64_t o = o0 + l, row = rotated ? o : c,
                                            col = rotated ? c : o;
                              uf[(p * k_in + row) * k_out + col] = v[c - c0][p][l];
                            }
                      });
    return;
  }
  bf16* ub = static_cast<bf16*>(u);
  transform_filters(cin, cout, w_oihw, rotated,
                    [&](int64_t c0, int64_t o0, int64_t lanes, const FilterBlock(&v)[2]) {
                      store_filters_bf16(v, c0, o0, lanes, cin, cout, rotated, ub);
                    });
}

// The pixels of tile (ty, tx) of F(MxM, 3x3) (a zero row for those outside the image): the
// (M+2)x(M+2) input tile at stride M, and the MxM output-gradient tile there.
template <int M, typename T>
void GemmConv::input_pixels(const T* image, int64_t k, int64_t ty, int64_t tx, const T* zeros,
                            const T* (&d)[M + 2][M + 2]) const {
  for (int r = 0; r < M + 2; ++r)
    for (int c = 0; c < M + 2; ++c) {
      const int64_t y = M * ty - 1 + r, x = M * tx - 1 + c;
      d[r][c] = y >= 0 && y < h && x >= 0 && x < w ? image + (y * w + x) * k : zeros;
    }
}

template <int M, typename T>
void GemmConv::gradient_pixels(const T* grad, int64_t k, int64_t ty, int64_t tx, const T* zeros,
                               const T* (&g)[M][M]) const {
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < M; ++c) {
      const int64_t y = M * ty + r, x = M * tx + c;
      g[r][c] = y < h && x < w ? grad + (y * w + x) * k : zeros;
    }
}

namespace {

// Runs piece(first tile, count, first row) on every thread over its contiguous part of `total`
// tiles (all images' tiles in order), in pieces of up to its own `chunk / threads` rows of the
// copies (from `first row`; threads past `chunk` have none and no part). A piece's input
// transforms, its GEMMs over those rows (each sgemm on its calling thread inside the region) and
// their output transforms touch only the thread's rows and its tiles' outputs, so the threads
// never wait for each other inside a pass (with a barrier a chunk, a full-width 2-thread bf16
// step spent 5.3% of its time in OpenMP's waits, 3.9% without, in perf on Zen 4).
template <typename F>
void for_each_thread_piece(int64_t total, int64_t chunk, const F& piece) {
#pragma omp parallel
  {
    const int64_t threads = std::min<int64_t>(omp_get_num_threads(), chunk);
    const int64_t me = omp_get_thread_num(), rows = chunk / threads;
    if (me < threads) {
      const int64_t end = total * (me + 1) / threads;
      for (int64_t t = total * me / threads; t < end; t += rows)
        piece(t, std::min(rows, end - t), me * rows);
    }
  }
}

// Winograd F(MxM, 3x3) on GEMMs, M = 2 or 4, on n images of h x w x k_in (`in`, activations of
// type T) with the transformed filters `u` into `out` (k_out channels), bias and ReLU optional:
// each (M+2)x(M+2) input tile at stride M transformed (pixels outside the image read a zero row),
// one GEMM per point over a chunk of tiles, each MxM output tile transformed back. fp32: `u` is
// [points][k_in][k_out] floats, the GEMMs sgemm; bf16 (M = 2): the tiles are rounded to bf16, `u`
// is the points' matrices in gemm_bf16's packing, and the GEMMs gemm_bf16.
template <int M, typename T>
void winograd_tiles(int64_t n, int64_t h, int64_t w, const T* in, int64_t k_in, int64_t k_out,
                    const T* u, const float* b, bool relu, T* out, void* copies) {
  constexpr int kSide = M + 2, kPoints = kSide * kSide;
  constexpr int64_t kChunk = M == 2 ? kTileChunk : kTileChunk4;
  static_assert(M == 2 || std::is_same_v<T, float>);
  const int64_t tiles_w = (w + M - 1) / M, tiles = (h + M - 1) / M * tiles_w;
  const int64_t packed = bf16_packed_size(k_in, k_out);
  T* vt = static_cast<T*>(copies);                                     // [points][chunk][k_in]
  float* mt = reinterpret_cast<float*>(vt + kPoints * kChunk * k_in);  // [points][chunk][k_out]
  T* zeros = reinterpret_cast<T*>(mt + kPoints * kChunk * k_out);      // pixels outside the image
  std::memset(static_cast<void*>(zeros), 0, size_t(k_in) * sizeof(T));
  for_each_thread_piece(n * tiles, kChunk, [&](int64_t first, int64_t count, int64_t row0) {
    for (int64_t j = 0; j < count; ++j) {
      const int64_t g = first + j, i = g / tiles, ty = g % tiles / tiles_w, tx = g % tiles_w;
      const T* image = in + i * h * w * k_in;
      const T* d[kSide][kSide];
      for (int r = 0; r < kSide; ++r)
        for (int c = 0; c < kSide; ++c) {
          const int64_t y = M * ty - 1 + r, x = M * tx - 1 + c;
          d[r][c] = y >= 0 && y < h && x >= 0 && x < w ? image + (y * w + x) * k_in : zeros;
        }
      if constexpr (M == 2)
        input_transform(d, k_in, vt + (row0 + j) * k_in, kChunk * k_in);
      else
        input6_transform(d, k_in, vt + (row0 + j) * k_in, kChunk * k_in);
    }
    for (int p = 0; p < kPoints; ++p) {
      const T* a = vt + (p * kChunk + row0) * k_in;
      float* c = mt + (p * kChunk + row0) * k_out;
      if constexpr (std::is_same_v<T, float>)
        sgemm('N', 'N', count, k_out, k_in, a, k_in, u + p * k_in * k_out, k_out, 0.0f, c, k_out);
      else
        gemm_bf16(count, k_out, k_in, a, k_in, 2, u + p * packed, c, k_out, false);
    }
    for (int64_t j = 0; j < count; ++j) {
      const int64_t g = first + j, i = g / tiles, ty = g % tiles / tiles_w, tx = g % tiles_w;
      T* result = out + i * h * w * k_out;
      T* o[M][M];
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < M; ++c) {
          const int64_t y = M * ty + r, x = M * tx + c;
          o[r][c] = y < h && x < w ? result + (y * w + x) * k_out : nullptr;
        }
      if constexpr (M == 2)
        output_transform(mt + (row0 + j) * k_out, kChunk * k_out, k_out, b, relu, o);
      else
        output4_transform(mt + (row0 + j) * k_out, kChunk * k_out, k_out, b, relu, o);
    }
  });
}

}  // namespace

// G g G^T of every filter into [36][k_in][k_out], G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6;
// 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1], 16 columns (k_out channels) at a time, so that u is
// written in whole cache lines; `rotated`: backward-data's, as winograd_filters (k_in = cout).
void GemmConv::winograd4_filters(const float* w_oihw, bool rotated, float* u) const {
  const int64_t k_in = rotated ? cout : cin, k_out = rotated ? cin : cout;
  const auto g = [](float g0, float g1, float g2, float* t, int64_t step) {
    constexpr float k6 = 1.0f / 6, k12 = 1.0f / 12, k24 = 1.0f / 24;
    t[0] = 0.25f * g0;
    t[step] = -k6 * (g0 + g1 + g2);
    t[2 * step] = -k6 * (g0 - g1 + g2);
    t[3 * step] = k24 * g0 + k12 * g1 + k6 * g2;
    t[4 * step] = k24 * g0 - k12 * g1 + k6 * g2;
    t[5 * step] = g2;
  };
#pragma omp parallel for schedule(static)
  for (int64_t col0 = 0; col0 < k_out; col0 += kChannelBlock) {
    const int64_t lanes = std::min<int64_t>(kChannelBlock, k_out - col0);
    for (int64_t row = 0; row < k_in; ++row) {
      float f[kTaps][kChannelBlock] = {};
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t c = rotated ? col0 + l : row, o = rotated ? row : col0 + l;
        for (int k = 0; k < kTaps; ++k)
          f[k][l] = w_oihw[(o * cin + c) * kTaps + (rotated ? kTaps - 1 - k : k)];
      }
      float cols[6][3][kChannelBlock], v[kWino4Points][kChannelBlock];  // G g, then G g G^T
      for (int j = 0; j < 3; ++j)
        for (int64_t l = 0; l < kChannelBlock; ++l)
          g(f[j][l], f[3 + j][l], f[6 + j][l], &cols[0][j][l], 3 * kChannelBlock);
      for (int r = 0; r < 6; ++r)
        for (int64_t l = 0; l < kChannelBlock; ++l)
          g(cols[r][0][l], cols[r][1][l], cols[r][2][l], &v[6 * r][l], kChannelBlock);
      for (int p = 0; p < kWino4Points; ++p)
        std::copy_n(v[p], lanes, u + (int64_t(p) * k_in + row) * k_out + col0);
    }
  }
}

void GemmConv::forward_winograd(const void* x, const float* w_oihw, const float* b, void* y,
                                void* weights, void* copies) const {
  winograd_pass(x, w_oihw, false, has_bias ? b : nullptr, relu, y, weights, copies);
}

void GemmConv::backward_data_winograd(const void* dy, const float* w_oihw, void* dx, void* weights,
                                      void* copies) const {
  winograd_pass(dy, w_oihw, true, nullptr, false, dx, weights, copies);
}

void GemmConv::winograd_pass(const void* in, const float* w_oihw, bool rotated, const float* bias,
                             bool relu_out, void* out, void* weights, void* copies) const {
  const int64_t k_in = rotated ? cout : cin, k_out = rotated ? cin : cout;
  if (bf16_activations) {
    winograd_filters(w_oihw, rotated, weights);
    winograd_tiles<2>(n, h, w, static_cast<const bf16*>(in), k_in, k_out,
                      static_cast<const bf16*>(weights), bias, relu_out, static_cast<bf16*>(out),
                      copies);
    return;
  }
  const auto* x = static_cast<const float*>(in);
  auto* y = static_cast<float*>(out);
  auto* u = static_cast<float*>(weights);
  if (tile == 4) {
    winograd4_filters(w_oihw, rotated, u);
    winograd_tiles<4>(n, h, w, x, k_in, k_out, u, bias, relu_out, y, copies);
  } else {
    winograd_filters(w_oihw, rotated, u);
    winograd_tiles<2>(n, h, w, x, k_in, k_out, u, bias, relu_out, y, copies);
  }
}

// dL/dU = V (.) (A dY A^T) per tile, so the weight gradient is G^T M G with M[p] = sum over tiles
// of V[p]^T Z[p]: 16 GEMMs (cin x tiles times tiles x cout) accumulated over chunks of tiles taken
// across the images, the points shared among the threads (each point's sum runs in chunk order,
// so a run with the same thread count repeats its bits).
void GemmConv::backward_weights_winograd(const void* x, const void* dy, float* dw_oihw, float* db,
                                         void* weights, void* copies) const {
  float* acc = static_cast<float*>(weights);  // M: [points][cin][cout]
  if (bf16_activations) {
    weight_points_bf16(static_cast<const bf16*>(x), static_cast<const bf16*>(dy), acc, copies);
    bias_gradient(static_cast<const bf16*>(dy), db);
    points_to_weights<2>(acc, dw_oihw);
    return;
  }
  const auto* xf = static_cast<const float*>(x);
  const auto* dyf = static_cast<const float*>(dy);
  bias_gradient(dyf, db);
  if (tile == 4) {
    weight_points<4>(xf, dyf, acc, copies);
    points_to_weights<4>(acc, dw_oihw);
  } else {
    weight_points<2>(xf, dyf, acc, copies);
    points_to_weights<2>(acc, dw_oihw);
  }
}

template <int M>
void GemmConv::weight_points(const float* x, const float* dy, float* acc, void* copies) const {
  constexpr int kSide = M + 2, kPoints = kSide * kSide;
  constexpr int64_t kChunk = M == 2 ? kTileChunk : kTileChunk4;
  float* vt = static_cast<float*>(copies);  // [points][chunk][cin]
  float* zt = vt + kPoints * kChunk * cin;  // [points][chunk][cout]
  float* zeros = zt + kPoints * kChunk * cout;
  std::fill_n(zeros, std::max(cin, cout), 0.0f);
  const int64_t tiles_w = (w + M - 1) / M, image_tiles = (h + M - 1) / M * tiles_w;
  const int64_t tiles = n * image_tiles, image_in = int64_t(h) * w * cin,
                image_out = int64_t(h) * w * cout;
#pragma omp parallel
  for (int64_t t0 = 0; t0 < tiles; t0 += kChunk) {
    const int64_t count = std::min(kChunk, tiles - t0);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < count; ++t) {
      const int64_t i = (t0 + t) / image_tiles, ty = (t0 + t) % image_tiles / tiles_w,
                    tx = (t0 + t) % tiles_w;
      const float *d[kSide][kSide], *g[M][M];
      input_pixels<M>(x + i * image_in, cin, ty, tx, zeros, d);
      gradient_pixels<M>(dy + i * image_out, cout, ty, tx, zeros, g);
      if constexpr (M == 2) {
        input_transform(d, cin, vt + t * cin, kChunk * cin);
        gradient_transform(g, cout, zt + t * cout, kChunk * cout);
      } else {
        input6_transform(d, cin, vt + t * cin, kChunk * cin);
        gradient4_transform(g, cout, zt + t * cout, kChunk * cout);
      }
    }
    // Inside the parallel region each sgemm runs on its calling thread.
#pragma omp for schedule(static)
    for (int p = 0; p < kPoints; ++p)
      sgemm('T', 'N', cin, cout, count, vt + p * kChunk * cin, cin, zt + p * kChunk * cout, cout,
            t0 == 0 ? 0.0f : 1.0f, acc + int64_t(p) * cin * cout, cout);
  }
}

// The same sums on gemm_bf16: per chunk of tiles, V[p]^T as [pairs of tiles][cin][2] (A, its pairs
// along the tiles) and the gradient tiles Z[p] in gemm_bf16's packing (B), both rounded to bf16 and
// filled a pair of tiles at a time (a zero tile after an odd count), then M[p] (+)= A B in fp32.
void GemmConv::weight_points_bf16(const bf16* x, const bf16* dy, float* acc, void* copies) const {
  const int64_t z_point = bf16_packed_size(kWeightChunk, cout);
  bf16* vt = static_cast<bf16*>(copies);             // [16][chunk / 2][cin][2]
  bf16* zt = vt + kWinoPoints * kWeightChunk * cin;  // [16][z_point]
  bf16* zeros = zt + kWinoPoints * z_point;
  std::fill_n(zeros, std::max(cin, cout), bf16{0});
  const int64_t tiles_w = (w + 1) / 2, image_tiles = (h + 1) / 2 * tiles_w;
  const int64_t tiles = n * image_tiles, image_in = int64_t(h) * w * cin,
                image_out = int64_t(h) * w * cout;
#pragma omp parallel
  for (int64_t t0 = 0; t0 < tiles; t0 += kWeightChunk) {
    const int64_t count = std::min(kWeightChunk, tiles - t0), pairs = (count + 1) / 2;
#pragma omp for schedule(static)
    for (int64_t q = 0; q < pairs; ++q) {
      const bf16 *d[2][4][4], *g[2][2][2];
      for (int j = 0; j < 2; ++j) {
        const int64_t t = t0 + 2 * q + j;
        const bool real = 2 * q + j < count;
        // A tile past the count reads zeros everywhere (a tile position below the image).
        const int64_t i = real ? t / image_tiles : 0;
        const int64_t ty = real ? t % image_tiles / tiles_w : h, tx = real ? t % tiles_w : w;
        input_pixels<2>(x + i * image_in, cin, ty, tx, zeros, d[j]);
        gradient_pixels<2>(dy + i * image_out, cout, ty, tx, zeros, g[j]);
      }
      pair_transforms(d[0], d[1], cin, vt + q * 2 * cin, kWeightChunk * cin, g[0], g[1], cout,
                      zt + q * 2 * kBf16Panel, z_point, 2 * pairs);
    }
#pragma omp for schedule(static)
    for (int p = 0; p < kWinoPoints; ++p)
      gemm_bf16(cin, cout, 2 * pairs, vt + p * kWeightChunk * cin, 2, 2 * cin, zt + p * z_point,
                acc + int64_t(p) * cin * cout, cout, t0 > 0);
  }
}

// G^T M G per (cin, cout) pair into OIHW, 16 output channels at a time: for F(2x2, 3x3)
// G^T = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1], for F(4x4, 3x3) the transpose of
// winograd4_filters' G.
template <int M>
void GemmConv::points_to_weights(const float* acc, float* dw_oihw) const {
  constexpr int kSide = M + 2, kPoints = kSide * kSide;
  static constexpr float k6 = 1.0f / 6, k12 = 1.0f / 12, k24 = 1.0f / 24;
  static constexpr float kG2[3][4] = {{1, .5f, .5f, 0}, {0, .5f, -.5f, 0}, {0, .5f, .5f, 1}};
  static constexpr float kG4[3][6] = {
      {.25f, -k6, -k6, k24, k24, 0}, {0, -k6, k6, k12, -k12, 0}, {0, -k6, -k6, k6, k6, 1}};
  const auto& gt = []() -> const auto& {
    if constexpr (M == 2)
      return kG2;
    else
      return kG4;
  }
  ();
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kChannelBlock) {
    const int64_t lanes = std::min<int64_t>(kChannelBlock, cout - o0);
    for (int64_t c = 0; c < cin; ++c) {
      float m[kPoints][kChannelBlock] = {};
      for (int p = 0; p < kPoints; ++p)
        std::copy_n(acc + (int64_t(p) * cin + c) * cout + o0, lanes, m[p]);
      float t[3][kSide][kChannelBlock] = {}, r[kTaps][kChannelBlock] = {};  // G^T M, G^T M G
      for (int i = 0; i < 3; ++i)
        for (int q = 0; q < kSide; ++q)
          if (gt[i][q] != 0.0f)  // (F(2x2)'s G^T is a third zeros)
            for (int j = 0; j < kSide; ++j)
              for (int64_t l = 0; l < kChannelBlock; ++l)
                t[i][j][l] += gt[i][q] * m[q * kSide + j][l];
      for (int i = 0; i < 3; ++i)
        for (int k = 0; k < 3; ++k)
          for (int j = 0; j < kSide; ++j)
            if (gt[k][j] != 0.0f)
              for (int64_t l = 0; l < kChannelBlock; ++l) r[i * 3 + k][l] += t[i][j][l] * gt[k][j];
      for (int64_t l = 0; l < lanes; ++l)
        for (int k = 0; k < kTaps; ++k) dw_oihw[((o0 + l) * cin + c) * kTaps + k] = r[k][l];
    }
  }
}

}  // namespace dp::cpu
