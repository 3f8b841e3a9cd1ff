// 3x3 stride-1 fp32 convolution passes on oneDNN's sgemm: nine shifted GEMMs each on zero-bordered
// copies of the images, and Winograd F(2x2, 3x3) for forward and backward-data; see conv_gemm.hpp.
#include "conv_gemm.hpp"

#include <dnnl.h>

#include <algorithm>
#include <cstring>

#include "dp/error.hpp"

namespace dp::cpu {
namespace {

constexpr int kTaps = 9;

// Winograd tiles transformed at a time: 16 x kTileChunk x (cin + cout) floats of copies (at most
// 32 MiB for 1024 channels), and GEMMs of kTileChunk rows.
constexpr int64_t kTileChunk = 256;
constexpr int kWinoPoints = 16;  // a 4x4 transformed tile
constexpr int kLanes = 16;       // channels the Winograd transforms handle at a time

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

GemmConv::GemmConv(const ConvDesc& d)
    : n(d.n), h(d.h), w(d.w), cin(d.cin), cout(d.cout), relu(d.relu), has_bias(d.bias) {}

bool GemmConv::fits(const ConvDesc& d) {
  return d.kernel == 3 && d.stride == 1 && d.padding() == 1;
}

int64_t GemmConv::padded_rows() const {
  return int64_t(h + 2) * (w + 2) + 2;
}
int64_t GemmConv::wide_rows() const {
  return int64_t(h) * (w + 2);
}

size_t GemmConv::copies_bytes() const {
  const size_t shifted = aligned(size_t(padded_rows()) * cin * sizeof(float)) +
                         size_t(wide_rows()) * cout * sizeof(float);
  const size_t wino =
      (size_t(kWinoPoints) * kTileChunk * (cin + cout) + std::max(cin, cout)) * sizeof(float);
  return std::max(shifted, wino);
}
size_t GemmConv::weight_scratch_bytes() const {
  return size_t(kWinoPoints) * cin * cout * sizeof(float);
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
  if (!has_bias) return;
  // Each thread sums its own channels over every pixel, in pixel order (any thread count gives
  // the same bits).
  const int64_t pixels = int64_t(n) * h * w;
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kChannelBlock) {
    const int64_t o1 = std::min<int64_t>(o0 + kChannelBlock, cout);
    std::fill(db + o0, db + o1, 0.0f);
    for (int64_t p = 0; p < pixels; ++p)
      for (int64_t o = o0; o < o1; ++o) db[o] += dy[p * cout + o];
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

void GemmConv::winograd_filters(const float* w_oihw, bool rotated, float* u) const {
  const int64_t k_in = rotated ? cout : cin, k_out = rotated ? cin : cout;
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kChannelBlock) {
    const int64_t lanes = std::min<int64_t>(kChannelBlock, cout - o0);
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
      float v[kWinoPoints][kChannelBlock];
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
          v[i * 4][l] = t[i][0];
          v[i * 4 + 1][l] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
          v[i * 4 + 2][l] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
          v[i * 4 + 3][l] = t[i][2];
        }
      }
      for (int p = 0; p < kWinoPoints; ++p)
        for (int64_t l = 0; l < lanes; ++l) {
          const int64_t o = o0 + l, row = rotated ? o : c, col = rotated ? c : o;
          u[(p * k_in + row) * k_out + col] = v[p][l];
        }
    }
  }
}

void GemmConv::winograd(const float* in, int k_in, int k_out, const float* u, const float* b,
                        bool relu_out, float* out, void* copies) const {
  const int64_t tiles_h = (h + 1) / 2, tiles_w = (w + 1) / 2, tiles = tiles_h * tiles_w;
  float* vt = static_cast<float*>(copies);               // [16][chunk][k_in]
  float* mt = vt + kWinoPoints * kTileChunk * k_in;      // [16][chunk][k_out]
  float* zeros = mt + kWinoPoints * kTileChunk * k_out;  // k_in zeros: pixels outside the image
  std::fill_n(zeros, k_in, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* image = in + i * int64_t(h) * w * k_in;
    float* result = out + i * int64_t(h) * w * k_out;
    for (int64_t t0 = 0; t0 < tiles; t0 += kTileChunk) {
      const int64_t count = std::min(kTileChunk, tiles - t0);
      // B^T d B per tile, channels innermost in vectors of kLanes (out-of-image pixels read a
      // zero row); B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < count; ++t) {
        const int64_t ty = (t0 + t) / tiles_w, tx = (t0 + t) % tiles_w;
        const float* d[4][4];
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < 4; ++c) {
            const int64_t y = 2 * ty - 1 + r, x = 2 * tx - 1 + c;
            d[r][c] = y >= 0 && y < h && x >= 0 && x < w ? image + (y * w + x) * k_in : zeros;
          }
        for (int64_t k0 = 0; k0 < k_in; k0 += kLanes) {
          const int64_t lanes = std::min<int64_t>(kLanes, k_in - k0);
          float e[4][4][kLanes] = {}, q[4][4][kLanes], v[4][4][kLanes];
          for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) std::copy_n(d[r][c] + k0, lanes, e[r][c]);
          for (int c = 0; c < 4; ++c)
            for (int j = 0; j < kLanes; ++j) {
              q[0][c][j] = e[0][c][j] - e[2][c][j];
              q[1][c][j] = e[1][c][j] + e[2][c][j];
              q[2][c][j] = e[2][c][j] - e[1][c][j];
              q[3][c][j] = e[1][c][j] - e[3][c][j];
            }
          for (int r = 0; r < 4; ++r)
            for (int j = 0; j < kLanes; ++j) {
              v[r][0][j] = q[r][0][j] - q[r][2][j];
              v[r][1][j] = q[r][1][j] + q[r][2][j];
              v[r][2][j] = q[r][2][j] - q[r][1][j];
              v[r][3][j] = q[r][1][j] - q[r][3][j];
            }
          for (int p = 0; p < kWinoPoints; ++p)
            std::copy_n(v[p / 4][p % 4], lanes, vt + (p * kTileChunk + t) * k_in + k0);
        }
      }
      for (int p = 0; p < kWinoPoints; ++p)
        sgemm('N', 'N', count, k_out, k_in, vt + p * kTileChunk * k_in, k_in,
              u + int64_t(p) * k_in * k_out, k_out, 0.0f, mt + p * kTileChunk * k_out, k_out);
        // A^T m A per tile, in vectors of kLanes channels; A^T = [1 1 1 0; 0 1 -1 -1].
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < count; ++t) {
        const int64_t ty = (t0 + t) / tiles_w, tx = (t0 + t) % tiles_w;
        for (int64_t k0 = 0; k0 < k_out; k0 += kLanes) {
          const int64_t lanes = std::min<int64_t>(kLanes, k_out - k0);
          float m[kWinoPoints][kLanes] = {}, q[2][4][kLanes], o[2][2][kLanes], bias[kLanes] = {};
          for (int p = 0; p < kWinoPoints; ++p)
            std::copy_n(mt + (p * kTileChunk + t) * k_out + k0, lanes, m[p]);
          if (b != nullptr) std::copy_n(b + k0, lanes, bias);
          for (int c = 0; c < 4; ++c)
            for (int j = 0; j < kLanes; ++j) {
              q[0][c][j] = m[c][j] + m[4 + c][j] + m[8 + c][j];
              q[1][c][j] = m[4 + c][j] - m[8 + c][j] - m[12 + c][j];
            }
          for (int r = 0; r < 2; ++r)
            for (int j = 0; j < kLanes; ++j) {
              const float r0 = q[r][0][j] + q[r][1][j] + q[r][2][j] + bias[j];
              const float r1 = q[r][1][j] - q[r][2][j] - q[r][3][j] + bias[j];
              o[r][0][j] = relu_out ? std::max(r0, 0.0f) : r0;
              o[r][1][j] = relu_out ? std::max(r1, 0.0f) : r1;
            }
          for (int r = 0; r < 2; ++r)
            for (int c = 0; c < 2; ++c) {
              const int64_t y = 2 * ty + r, x = 2 * tx + c;
              if (y < h && x < w) std::copy_n(o[r][c], lanes, result + (y * w + x) * k_out + k0);
            }
        }
      }
    }
  }
}

void GemmConv::forward_winograd(const float* x, const float* w_oihw, const float* b, float* y,
                                void* weights, void* copies) const {
  float* u = static_cast<float*>(weights);
  winograd_filters(w_oihw, false, u);
  winograd(x, cin, cout, u, has_bias ? b : nullptr, relu, y, copies);
}

void GemmConv::backward_data_winograd(const float* dy, const float* w_oihw, float* dx,
                                      void* weights, void* copies) const {
  float* u = static_cast<float*>(weights);
  winograd_filters(w_oihw, true, u);
  winograd(dy, cout, cin, u, nullptr, false, dx, copies);
}

}  // namespace dp::cpu
