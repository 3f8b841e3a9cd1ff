// 3x3 stride-1 fp32 convolution passes as nine shifted GEMMs each (oneDNN's sgemm) on
// zero-bordered copies of the images; see conv_gemm.hpp for the layout.
#include "conv_gemm.hpp"

#include <dnnl.h>

#include <algorithm>
#include <cstring>

#include "dp/error.hpp"

namespace dp::cpu {
namespace {

constexpr int kTaps = 9;

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
  return aligned(size_t(padded_rows()) * cin * sizeof(float)) +
         size_t(wide_rows()) * cout * sizeof(float);
}
size_t GemmConv::weight_scratch_bytes() const {
  return size_t(kTaps) * cin * cout * sizeof(float);
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
constexpr int64_t kTransposeBlock = 16;

void GemmConv::weights_to_taps(const float* w_oihw, float* taps) const {
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kTransposeBlock) {
    const int64_t o1 = std::min<int64_t>(o0 + kTransposeBlock, cout);
    for (int64_t c = 0; c < cin; ++c)
      for (int64_t t = 0; t < kTaps; ++t)
        for (int64_t o = o0; o < o1; ++o)
          taps[(t * cin + c) * cout + o] = w_oihw[(o * cin + c) * kTaps + t];
  }
}

void GemmConv::taps_to_weights(const float* taps, float* w_oihw) const {
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < cout; o0 += kTransposeBlock) {
    const int64_t o1 = std::min<int64_t>(o0 + kTransposeBlock, cout);
    for (int64_t c = 0; c < cin; ++c)
      for (int64_t t = 0; t < kTaps; ++t)
        for (int64_t o = o0; o < o1; ++o)
          w_oihw[(o * cin + c) * kTaps + t] = taps[(t * cin + c) * cout + o];
  }
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
  std::fill(db, db + cout, 0.0f);
  const int64_t pixels = int64_t(n) * h * w;
  for (int64_t p = 0; p < pixels; ++p)
    for (int64_t o = 0; o < cout; ++o) db[o] += dy[p * cout + o];
}

void GemmConv::backward_data(const float* dy, const float* w_oihw, float* dx, void* weights,
                             void* copies) const {
  float* taps = static_cast<float*>(weights);
  float *dxp = padded(copies), *dyw = wide(copies);
  weights_to_taps(w_oihw, taps);
  const int64_t wp = w + 2, image_in = int64_t(h) * w * cin, image_out = int64_t(h) * w * cout;
  for (int64_t i = 0; i < n; ++i) {
    widen(dy + i * image_out, dyw);
    std::memset(dxp, 0, size_t(padded_rows()) * cin * sizeof(float));
    for (int t = 0; t < kTaps; ++t)
      sgemm('N', 'T', wide_rows(), cin, cout, dyw, cout, taps + int64_t(t) * cin * cout, cout, 1.0f,
            dxp + ((t / 3) * wp + t % 3) * cin, cin);
    float* out = dx + i * image_in;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < h; ++r)
      std::memcpy(out + r * w * cin, dxp + ((r + 1) * wp + 1) * cin,
                  size_t(w) * cin * sizeof(float));
  }
}

}  // namespace dp::cpu
