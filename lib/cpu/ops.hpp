// The CPU backend's ops (internal), by family file, in the order of dp::Backend's methods.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dp/backend.hpp"

// Activation ops are templates over T, the activation storage type: float, or dp::bf16
// (--precision bf16), instantiated for both in their family file; each element is widened to
// fp32, computed in fp32 and stored back as T. Arguments as the dp::Backend method's. The
// convolutions are in onednn.hpp (conv.cpp) and conv_gemm.hpp.
namespace dp::cpu {

// elementwise.cpp: conversions between fp32 and the activation type.
template <typename T>
void to_activation(int64_t count, const float* src, T* out);
template <typename T>
void from_activation(int64_t count, const T* in, float* dst);

// batchnorm.cpp. `var`, `mean_dy`, `mean_dy_xhat`: the caller's per-channel scratch, resized here.
template <typename T>
void batchnorm_stats(const Dims& d, const T* src, double* sums);
void batchnorm_prepare(int channels, bool training, const double* sums, double count, float eps,
                       float momentum, float* running_mean, float* running_var, float* mean,
                       float* invstd, std::vector<float>& var);
template <typename T>
void batchnorm_apply(const Dims& d, const T* src, const float* mean, const float* invstd,
                     const float* gamma, const float* beta, bool relu, T* dst);
template <typename T>
void batchnorm_backward_stats(const Dims& d, const T* src, const T* dst, bool relu, T* diff_dst,
                              const float* mean, const float* invstd, double* sums,
                              float* diff_gamma, float* diff_beta);
template <typename T>
void batchnorm_backward_apply(const Dims& d, const T* src, const T* diff_dst, const float* mean,
                              const float* invstd, const float* gamma, const double* sums,
                              double count, bool training, T* diff_src, bool accumulate,
                              std::vector<float>& mean_dy, std::vector<float>& mean_dy_xhat);

// elementwise.cpp: the residual add.
template <typename T>
void add_forward(int64_t count, const T* a, const T* b, bool relu, T* dst);

// dropout.cpp.
template <typename T>
void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const T* src, float* mask,
                       T* dst);
template <typename T>
void dropout2d_backward(const Dims& d, const float* mask, const T* diff_dst, T* diff_src);

// elementwise.cpp: ReLU.
template <typename T>
void relu_forward(int64_t count, const T* src, T* dst);
template <typename T>
void relu_backward(int64_t count, const T* dst, const T* diff_dst, T* diff_src);

// pool_upsample.cpp (the caller checks that the max-pool's input is even).
template <typename T>
void maxpool2x2_forward(const Dims& s, const T* src, T* dst, uint8_t* argmax);
template <typename T>
void maxpool2x2_backward(const Dims& s, const uint8_t* argmax, const T* diff_dst, T* diff_src,
                         bool accumulate);
template <typename T>
void upsample2x_forward(const Dims& s, const T* src, T* dst);
template <typename T>
void upsample2x_backward(const Dims& s, const T* diff_dst, T* diff_src);

// concat.cpp: elements of elem_bytes bytes (the caller checks the shapes).
void concat_forward(size_t elem_bytes, const Dims& a, const void* pa, const Dims& b, const void* pb,
                    void* dst);
void concat_backward(size_t elem_bytes, const Dims& a, const Dims& b, const void* diff_dst,
                     void* diff_a, void* diff_b);

// elementwise.cpp: dst += src (accumulate_activations, and accumulate on fp32 gradients).
template <typename T>
void accumulate(int64_t count, const T* src, T* dst);

// loss.cpp.
double bce_with_logits(int64_t count, const float* x, const float* y, float pos_weight,
                       float grad_scale, float* dx);
double focal_with_logits(int64_t count, const float* x, const float* y, float alpha, float gamma,
                         float grad_scale, float* dx);
double dice_with_logits(int images, int64_t pixels, const float* x, const float* y, float smooth,
                        float grad_scale, float* dx, bool accumulate);
// Soft clDice per image (Backend::soft_cldice_with_logits); `scratch` grows to the floats it needs.
double soft_cldice_with_logits(int images, int height, int width, const float* x, const float* y,
                               int iterations, float smooth, float grad_scale, float* dx,
                               bool accumulate, std::vector<float>& scratch);
void confusion_counts(int64_t count, const float* x, const float* y, float threshold,
                      int64_t* counts);

// optim.cpp.
void sgd_update(int64_t count, float* p, const float* grad, float* m, float lr, float momentum,
                float weight_decay, bool nesterov);
void adamw_update(int64_t count, float* p, const float* g, float* m, float* v, float decay,
                  float b1, float b2, float eps, float step_size, float bc2_sqrt);
double sum_squares(int64_t count, const float* src);
void scale(int64_t count, float alpha, float* dst);
void ema_update(int64_t count, const float* src, float decay, float* avg);
void swap(int64_t count, float* a, float* b);

}  // namespace dp::cpu
