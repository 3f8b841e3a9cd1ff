// Launchers of the CUDA backend's own kernels (internal), in dp::Backend's order, by family file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

// One launcher per Backend op that is not a cuDNN call, with the Backend method's arguments after
// the stream. Every pointer is DEVICE memory here, including the arrays that the Backend interface
// keeps on the host (batch-norm sums, seeds, counts, loss): the backend stages those. Launches are
// asynchronous on `s`, use grid-stride loops, and check cudaGetLastError (DP_CUDA_CHECK).
// count == 0 launches nothing.
namespace dp::cuda::kernels {

// An NHWC activation shape; dp::Dims converts to it implicitly. (Not dp::Dims itself: CUDA
// sources compile as C++17, see cmake/DpCuda.cmake, and dp/backend.hpp needs C++20.)
struct Shape {
  int n = 0, h = 0, w = 0, c = 0;
  Shape() = default;
  Shape(int batch, int height, int width, int channels)
      : n(batch), h(height), w(width), c(channels) {}
  template <typename D>
  Shape(const D& d) : n(d.n), h(d.h), w(d.w), c(d.c) {}  // NOLINT: implicit from dp::Dims
  int64_t numel() const { return int64_t{n} * h * w * c; }
  int64_t pixels() const { return int64_t{n} * h * w; }
};

// Activation ops are templates over the storage type S of the activations: float, or
// __nv_bfloat16 (--precision bf16); each element is widened to fp32, computed in fp32 and stored
// as S (bf16: rounded to nearest even once per op; NaN stays NaN, values beyond bf16's range
// become +-inf). Instantiated for both in their family file.

// elementwise.cu: conversions (to_activation, from_activation, relu_forward, conv epilogues).
// dst[p, k] = act(float(src[p, k]) + bias[k]) stored as Out, NHWC with c channels over `pixels`
// rows: no bias when bias is null, act = ReLU when relu, else the identity. In, Out: float or
// __nv_bfloat16 (every pair instantiated); may run in place (src == dst, In == Out). Serves the
// fp32 <-> activation conversions, ReLU, and the convolutions' bias/ReLU epilogues.
template <typename In, typename Out>
void convert(cudaStream_t s, int64_t pixels, int c, const In* src, const float* bias, bool relu,
             Out* dst);

// conv_kernels.cu: the convolutions' output gradient and bf16 filters.
// A convolution's output gradient g, NHWC [pixels, c], in one pass: with dst (the ReLU'd output)
// g = dst > 0 ? diff_dst : 0, written back to diff_dst; with diff_bias, diff_bias[k] = sum over
// pixels of g (overwritten); with copy, copy = g in fp32. Each of the three may be null.
template <typename S>
void output_grad(cudaStream_t s, int64_t pixels, int c, const S* dst, S* diff_dst, float* diff_bias,
                 float* copy);
// bf16 filters of the bf16 convolutions (conv.cpp): a filter [k, c, r, s] (PyTorch's OIHW,
// rs = r * s) to bf16 in the same layout, or with krsc in [k, r, s, c] (NHWC) order.
void filter_to_bf16(cudaStream_t s, int k, int c, int rs, const float* src, bool krsc,
                    __nv_bfloat16* dst);
// The reverse: a bf16 filter in [k, c, r, s] order (or [k, r, s, c] with krsc) to fp32
// [k, c, r, s].
void filter_from_bf16(cudaStream_t s, int k, int c, int rs, const __nv_bfloat16* src, bool krsc,
                      float* dst);

// batchnorm.cu: formulas in dp::Backend. sums: 2 C doubles, overwritten.
template <typename S>
void batchnorm_stats(cudaStream_t s, const Shape& d, const S* src, double* sums);
void batchnorm_prepare(cudaStream_t s, int channels, bool training, const double* sums,
                       double count, float eps, float momentum, float* running_mean,
                       float* running_var, float* mean, float* invstd);
template <typename S>
void batchnorm_apply(cudaStream_t s, const Shape& d, const S* src, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, bool relu, S* dst);
template <typename S>
void batchnorm_backward_stats(cudaStream_t s, const Shape& d, const S* src, const S* dst, bool relu,
                              S* diff_dst, const float* mean, const float* invstd, double* sums,
                              float* diff_gamma, float* diff_beta);
template <typename S>
void batchnorm_backward_apply(cudaStream_t s, const Shape& d, const S* src, const S* diff_dst,
                              const float* mean, const float* invstd, const float* gamma,
                              const double* sums, double count, bool training, S* diff_src,
                              bool accumulate);

// elementwise.cu: the residual add.
template <typename S>
void add_forward(cudaStream_t s, int64_t count, const S* a, const S* b, bool relu, S* dst);

// dropout.cu: the mask from the per-sample seeds exactly as dp::Rng draws it on the host.
template <typename S>
void dropout2d_forward(cudaStream_t s, const Shape& d, float p, const uint64_t* seeds, const S* src,
                       float* mask, S* dst);
template <typename S>
void dropout2d_backward(cudaStream_t s, const Shape& d, const float* mask, const S* diff_dst,
                        S* diff_src);

// elementwise.cu: ReLU backward.
template <typename S>
void relu_backward(cudaStream_t s, int64_t count, const S* dst, const S* diff_dst,
                   S* diff_src);  // may be in place

// pool_upsample.cu.
template <typename S>
void maxpool2x2_forward(cudaStream_t s, const Shape& src_dims, const S* src, S* dst,
                        uint8_t* argmax);
template <typename S>
void maxpool2x2_backward(cudaStream_t s, const Shape& src_dims, const uint8_t* argmax,
                         const S* diff_dst, S* diff_src, bool accumulate);
template <typename S>
void upsample2x_forward(cudaStream_t s, const Shape& src_dims, const S* src, S* dst);
template <typename S>
void upsample2x_backward(cudaStream_t s, const Shape& src_dims, const S* diff_dst, S* diff_src);

// concat.cu.
template <typename S>
void concat_forward(cudaStream_t s, const Shape& a_dims, const S* a, const Shape& b_dims,
                    const S* b, S* dst);
template <typename S>
void concat_backward(cudaStream_t s, const Shape& a_dims, const Shape& b_dims, const S* diff_dst,
                     S* diff_a, S* diff_b);

// elementwise.cu: accumulate_activations, and accumulate on fp32 gradients.
template <typename S>
void accumulate(cudaStream_t s, int64_t count, const S* src, S* dst);  // dst += src

// loss.cu.
// *loss_sum = sum of the per-element losses (double, overwritten); diff as dp::Backend.
void bce_with_logits(cudaStream_t s, int64_t count, const float* logits, const float* target,
                     float pos_weight, float grad_scale, float* diff_logits, double* loss_sum);
// *loss_sum = sum of the focal losses (double, overwritten); diff as dp::Backend.
void focal_with_logits(cudaStream_t s, int64_t count, const float* logits, const float* target,
                       float alpha, float gamma, float grad_scale, float* diff_logits,
                       double* loss_sum);
// Per image: sums[2i] = sum(p t), sums[2i + 1] = sum(p) + sum(t) (double, overwritten); then
// diff_logits written or (accumulate) added as dp::Backend::dice_with_logits.
void dice_with_logits(cudaStream_t s, int images, int64_t pixels, const float* logits,
                      const float* target, float smooth, float grad_scale, float* diff_logits,
                      bool accumulate, double* sums);
// Soft clDice as dp::Backend::soft_cldice_with_logits, on `scratch` of
// soft_cldice_scratch_floats() floats; sums: 4 doubles per image (sum S(p) t, sum S(p),
// sum S(t) p, sum S(t)), from which the caller computes the loss.
size_t soft_cldice_scratch_floats(int images, int height, int width, int iterations);
void soft_cldice_with_logits(cudaStream_t s, int images, int height, int width, const float* logits,
                             const float* target, int iterations, float smooth, float grad_scale,
                             float* diff_logits, bool accumulate, float* scratch, double* sums);
// counts[0..2] += tp, fp, fn.
void confusion_counts(cudaStream_t s, int64_t count, const float* logits, const float* target,
                      float logit_threshold, unsigned long long* counts);

// optim.cu.
void sgd_update(cudaStream_t s, int64_t count, float* param, const float* grad, float* momentum_buf,
                float lr, float momentum, float weight_decay, bool nesterov);
void adamw_update(cudaStream_t s, int64_t count, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                  float step_size, float bc2_sqrt);
// *result = sum src[i]^2 (double), overwritten.
void sum_squares(cudaStream_t s, int64_t count, const float* src, double* result);
void scale(cudaStream_t s, int64_t count, float alpha, float* dst);
// avg = decay * avg + (1 - decay) * src, rounded as the CPU backend's (no fused multiply-add).
void ema_update(cudaStream_t s, int64_t count, const float* src, float decay, float* avg);
void swap(cudaStream_t s, int64_t count, float* a, float* b);  // a[i] <-> b[i]

}  // namespace dp::cuda::kernels
