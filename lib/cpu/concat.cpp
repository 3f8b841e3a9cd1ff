// CPU concatenation along channels and its backward, as row copies of activation elements.
#include <cstdint>
#include <cstring>

#include "ops.hpp"

namespace dp::cpu {

void concat_forward(size_t elem_bytes, const Dims& a, const void* pa, const Dims& b, const void* pb,
                    void* dst) {
  const size_t e = elem_bytes, ra = e * size_t(a.c), rb = e * size_t(b.c);
  const auto* x = static_cast<const char*>(pa);
  const auto* y = static_cast<const char*>(pb);
  auto* out = static_cast<char*>(dst);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < a.pixels(); ++p) {
    std::memcpy(out + size_t(p) * (ra + rb), x + size_t(p) * ra, ra);
    std::memcpy(out + size_t(p) * (ra + rb) + ra, y + size_t(p) * rb, rb);
  }
}

void concat_backward(size_t elem_bytes, const Dims& a, const Dims& b, const void* diff_dst,
                     void* diff_a, void* diff_b) {
  const size_t e = elem_bytes, ra = e * size_t(a.c), rb = e * size_t(b.c);
  const auto* in = static_cast<const char*>(diff_dst);
  auto* x = static_cast<char*>(diff_a);
  auto* y = static_cast<char*>(diff_b);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < a.pixels(); ++p) {
    std::memcpy(x + size_t(p) * ra, in + size_t(p) * (ra + rb), ra);
    std::memcpy(y + size_t(p) * rb, in + size_t(p) * (ra + rb) + ra, rb);
  }
}

}  // namespace dp::cpu
