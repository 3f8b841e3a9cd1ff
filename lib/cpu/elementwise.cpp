// CPU element-wise ops: fp32 <-> activation conversions, residual add, ReLU, accumulation.
#include <cmath>
#include <cstdint>

#include "dp/bf16.hpp"
#include "ops.hpp"

namespace dp::cpu {

template <typename T>
void to_activation(int64_t count, const float* src, T* out) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = from_float<T>(src[i]);
}

template <typename T>
void from_activation(int64_t count, const T* in, float* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = to_float(in[i]);
}

template <typename T>
void add_forward(int64_t count, const T* a, const T* b, bool relu, T* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float v = to_float(a[i]) + to_float(b[i]);
    dst[i] = from_float<T>(relu ? std::fmax(v, 0.0f) : v);
  }
}

template <typename T>
void relu_forward(int64_t count, const T* src, T* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = from_float<T>(std::fmax(to_float(src[i]), 0.0f));
}

template <typename T>
void relu_backward(int64_t count, const T* dst, const T* diff_dst, T* diff_src) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i)
    diff_src[i] = to_float(dst[i]) > 0.0f ? diff_dst[i] : from_float<T>(0.0f);
}

template <typename T>
void accumulate(int64_t count, const T* src, T* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

#define DP_INSTANTIATE(T)                                              \
  template void to_activation<T>(int64_t, const float*, T*);           \
  template void from_activation<T>(int64_t, const T*, float*);         \
  template void add_forward<T>(int64_t, const T*, const T*, bool, T*); \
  template void relu_forward<T>(int64_t, const T*, T*);                \
  template void relu_backward<T>(int64_t, const T*, const T*, T*);     \
  template void accumulate<T>(int64_t, const T*, T*);
DP_INSTANTIATE(float)
DP_INSTANTIATE(bf16)
#undef DP_INSTANTIATE

}  // namespace dp::cpu
