// dp::Backend: the per-op interface (forward/backward pairs) that the CPU and CUDA backends
// implement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dp/buffer.hpp"

namespace dp {

// Element types of activations (Backend::activation_type()).
enum class DType { kFloat32, kBFloat16 };
inline size_t dtype_bytes(DType t) {
  return t == DType::kBFloat16 ? 2 : 4;
}

// Activation shape, NHWC.
struct Dims {
  int n = 0, h = 0, w = 0, c = 0;
  int64_t numel() const { return int64_t{n} * h * w * c; }
  int64_t pixels() const { return int64_t{n} * h * w; }
  bool operator==(const Dims&) const = default;
};

// A 2-D convolution with optional bias and fused ReLU. pad < 0 means kernel / 2 ("same" for
// stride 1). Output size = (in + 2 pad - kernel) / stride + 1.
struct ConvDesc {
  int n = 0, h = 0, w = 0;  // batch and input spatial size
  int cin = 0, cout = 0;
  int kernel = 3;
  bool relu = false;
  int stride = 1;
  int pad = -1;
  bool bias = true;
  bool forward_only = false;  // an inference model's: no backward pass, no primitives for one
  int padding() const { return pad >= 0 ? pad : kernel / 2; }
  int out_h() const { return (h + 2 * padding() - kernel) / stride + 1; }
  int out_w() const { return (w + 2 * padding() - kernel) / stride + 1; }
  Dims src() const { return {n, h, w, cin}; }
  Dims dst() const { return {n, out_h(), out_w(), cout}; }
  bool operator==(const ConvDesc&) const = default;
};

// A 2-D transposed convolution (PyTorch ConvTranspose2d) with bias and optional fused ReLU.
// Output size = (in - 1) * stride - 2 pad + kernel; weight layout [cin, cout, k, k] (PyTorch's).
struct DeconvDesc {
  int n = 0, h = 0, w = 0;
  int cin = 0, cout = 0;
  int kernel = 4, stride = 2, pad = 1;
  bool relu = false;
  bool forward_only = false;  // as ConvDesc's
  int out_h() const { return (h - 1) * stride - 2 * pad + kernel; }
  int out_w() const { return (w - 1) * stride - 2 * pad + kernel; }
  Dims src() const { return {n, h, w, cin}; }
  Dims dst() const { return {n, out_h(), out_w(), cout}; }
  bool operator==(const DeconvDesc&) const = default;
};

// Argument order everywhere: outputs' shapes, inputs, weights, saved state, outputs.
// Backward functions OVERWRITE their outputs unless an `accumulate` flag says otherwise.
// Tensors are backend memory (host memory for the CPU backend, device memory for the CUDA one);
// the few small arrays marked "host" (batch-norm sums, dropout seeds, metric counts) and returned
// scalars are host memory on every backend. Ops may run asynchronously on a device: an op that
// returns or writes host values completes its work first; synchronize() waits for all of it.
// Activations and their gradients (`void*`) hold elements of activation_type(): fp32, or bf16
// under --precision bf16; weights, their gradients, batch-norm statistics, masks, logits and
// targets (`float*`) are always fp32.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The kernels chosen so far where the backend has a choice (the CPU's --cpu-conv other than
  // direct: per convolution pass, how many run direct on NHWC, direct on blocked copies or
  // Winograd); empty where there is none.
  virtual std::string kernel_choices() const { return {}; }
  // Where the tensors live: null for host memory (CPU), else the device's allocator.
  virtual DeviceMemory* device_memory() { return nullptr; }
  virtual void synchronize() {}
  // The element type of activations and their gradients.
  virtual DType activation_type() const { return DType::kFloat32; }

  // Conversions between fp32 and the activation type (the model's input and logits; bf16 rounds
  // to nearest even). Plain copies when activations are fp32.
  virtual void to_activation(int64_t count, const float* src, void* dst) = 0;
  virtual void from_activation(int64_t count, const void* src, float* dst) = 0;

  // dst = act(conv(src, weight) + bias); weight in PyTorch layout [cout, cin, k, k], bias [cout]
  // (bias ignored, may be null, when !d.bias).
  virtual void conv_forward(const ConvDesc& d, const void* src, const float* weight,
                            const float* bias, void* dst) = 0;
  // With d.relu, diff_dst is first turned in place into the gradient before the ReLU (using
  // dst). diff_src may be null (first layer). diff_weight/diff_bias: PyTorch layout; diff_bias
  // may be null when !d.bias.
  virtual void conv_backward(const ConvDesc& d, const void* src, const float* weight,
                             const void* dst, void* diff_dst, void* diff_src, float* diff_weight,
                             float* diff_bias) = 0;

  virtual void deconv_forward(const DeconvDesc& d, const void* src, const float* weight,
                              const float* bias, void* dst) = 0;
  virtual void deconv_backward(const DeconvDesc& d, const void* src, const float* weight,
                               const void* dst, void* diff_dst, void* diff_src, float* diff_weight,
                               float* diff_bias) = 0;

  // Batch normalisation over (n, h, w) per channel, split so that statistics can be reduced over
  // ranks between the steps (sync-BN). Sums are double; C = d.c.
  // stats: sums (host, 2 C) [c] = sum x, [C + c] = sum x^2.
  virtual void batchnorm_stats(const Dims& d, const void* src, double* sums) = 0;
  // mean and invstd = 1 / sqrt(var + eps) (C each) for apply and backward. Training: from the
  // sums (host, over `count` elements per channel; var biased), and the running statistics move
  // by `momentum` toward mean and the unbiased variance. Evaluation: from the running statistics.
  virtual void batchnorm_prepare(int channels, bool training, const double* sums, double count,
                                 float eps, float momentum, float* running_mean, float* running_var,
                                 float* mean, float* invstd) = 0;
  // dst = act(gamma * (src - mean) * invstd + beta).
  virtual void batchnorm_apply(const Dims& d, const void* src, const float* mean,
                               const float* invstd, const float* gamma, const float* beta,
                               bool relu, void* dst) = 0;
  // With relu, diff_dst is first masked in place by (dst > 0). Then sums (host, 2 C) [c] = sum dy,
  // [C + c] = sum dy * (x - mean) * invstd, and this rank's parameter gradients
  // diff_beta = sums[c], diff_gamma = sums[C + c] (C each).
  virtual void batchnorm_backward_stats(const Dims& d, const void* src, const void* dst, bool relu,
                                        void* diff_dst, const float* mean, const float* invstd,
                                        double* sums, float* diff_gamma, float* diff_beta) = 0;
  // sums: host, possibly summed over ranks. Training (batch statistics over `count` elements per
  // channel): dx = gamma * invstd *
  // (dy - sum_dy / count - xhat * sum_dy_xhat / count); with running statistics (!training):
  // dx = gamma * invstd * dy. Adds to diff_src when `accumulate`.
  virtual void batchnorm_backward_apply(const Dims& d, const void* src, const void* diff_dst,
                                        const float* mean, const float* invstd, const float* gamma,
                                        const double* sums, double count, bool training,
                                        void* diff_src, bool accumulate) = 0;

  // dst = act(a + b) (the residual connection).
  virtual void add_forward(int64_t count, const void* a, const void* b, bool relu, void* dst) = 0;

  // Channel dropout (PyTorch dropout2d): each (sample, channel) is zeroed with probability p,
  // kept ones are scaled by 1 / (1 - p). mask is [n, c]; sample i's row is a function of
  // seeds[i] (host) only: channel k is dropped when the k-th uniform() of Rng(seeds[i]) (0-based)
  // is < p.
  virtual void dropout2d_forward(const Dims& d, float p, const uint64_t* seeds, const void* src,
                                 float* mask, void* dst) = 0;
  virtual void dropout2d_backward(const Dims& d, const float* mask, const void* diff_dst,
                                  void* diff_src) = 0;

  virtual void relu_forward(int64_t count, const void* src, void* dst) = 0;
  // diff_src = diff_dst * (dst > 0); may be in place.
  virtual void relu_backward(int64_t count, const void* dst, const void* diff_dst,
                             void* diff_src) = 0;

  // 2x2 max-pool, stride 2 (src h and w even). argmax: one byte per dst element (0..3), or
  // nullptr where no backward pass follows (inference).
  virtual void maxpool2x2_forward(const Dims& src_dims, const void* src, void* dst,
                                  uint8_t* argmax) = 0;
  virtual void maxpool2x2_backward(const Dims& src_dims, const uint8_t* argmax,
                                   const void* diff_dst, void* diff_src, bool accumulate) = 0;

  // Bilinear x2 upsample, PyTorch's align_corners=False.
  virtual void upsample2x_forward(const Dims& src_dims, const void* src, void* dst) = 0;
  virtual void upsample2x_backward(const Dims& src_dims, const void* diff_dst, void* diff_src) = 0;

  // dst = cat(a, b) along channels; a and b have the same n, h, w.
  virtual void concat_forward(const Dims& a_dims, const void* a, const Dims& b_dims, const void* b,
                              void* dst) = 0;
  virtual void concat_backward(const Dims& a_dims, const Dims& b_dims, const void* diff_dst,
                               void* diff_a, void* diff_b) = 0;

  // dst += src, and dst = src (element-wise, count activation elements).
  virtual void accumulate_activations(int64_t count, const void* src, void* dst) = 0;
  virtual void copy_activations(int64_t count, const void* src, void* dst) = 0;

  // Binary cross-entropy with logits, PyTorch formula with pos_weight. Returns the SUM of the
  // per-element losses (double); writes diff_logits = d(loss_sum)/d(logit) * grad_scale.
  virtual double bce_with_logits(int64_t count, const float* logits, const float* target,
                                 float pos_weight, float grad_scale, float* diff_logits) = 0;
  // Focal loss with logits (Lin et al. 2017; torchvision's sigmoid_focal_loss) for 0/1 targets:
  // per element a_t (1 - p_t)^gamma * BCE, p_t = sigmoid(+-logit), a_t = alpha for a crack pixel
  // and 1 - alpha for background (alpha < 0: a_t = 1). Returns the SUM of the per-element losses;
  // writes diff_logits = d(loss_sum)/d(logit) * grad_scale.
  virtual double focal_with_logits(int64_t count, const float* logits, const float* target,
                                   float alpha, float gamma, float grad_scale,
                                   float* diff_logits) = 0;
  // Soft Dice loss per image: `images` images of `pixels` elements each; image i's loss is
  // 1 - (2 sum(p t) + smooth) / (sum p + sum t + smooth), p = sigmoid(logit). Returns the SUM over
  // the images; writes (accumulate: adds to) diff_logits d(loss_sum)/d(logit) * grad_scale.
  virtual double dice_with_logits(int images, int64_t pixels, const float* logits,
                                  const float* target, float smooth, float grad_scale,
                                  float* diff_logits, bool accumulate) = 0;
  // Soft clDice loss per image (Shit et al., CVPR 2021): `images` images of height x width;
  // p = sigmoid(logit); S() the published soft skeleton with `iterations` soft erosions (minimum
  // of the vertical and horizontal 3-pixel minima; opening: their 3x3 maximum). Image i's loss is
  // 1 - 2 T_prec T_sens / (T_prec + T_sens), T_prec = (sum S(p) t + smooth) / (sum S(p) + smooth),
  // T_sens = (sum S(t) p + smooth) / (sum S(t) + smooth). Returns the SUM over the images; writes
  // (accumulate: adds to) diff_logits d(loss_sum)/d(logit) * grad_scale, with max-pooling's
  // gradient routing (the first extremum of a window) and torch.minimum's halves at ties.
  virtual double soft_cldice_with_logits(int images, int height, int width, const float* logits,
                                         const float* target, int iterations, float smooth,
                                         float grad_scale, float* diff_logits, bool accumulate) = 0;
  // Adds to counts[0..2] (host) the true positives, false positives and false negatives of
  // (logit > logit_threshold) against target (0/1).
  virtual void confusion_counts(int64_t count, const float* logits, const float* target,
                                float logit_threshold, int64_t* counts) = 0;

  // dst += src (count floats: parameter gradients).
  virtual void accumulate(int64_t count, const float* src, float* dst) = 0;

  // PyTorch SGD: g = grad + wd*p; m = momentum*m + g; p -= lr * (nesterov ? g + momentum*m : m).
  virtual void sgd_update(int64_t count, float* param, const float* grad, float* momentum_buf,
                          float lr, float momentum, float weight_decay, bool nesterov) = 0;
  // PyTorch AdamW step with the scalars precomputed: p *= decay; m = b1 m + (1 - b1) g;
  // v = b2 v + (1 - b2) g^2; p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
  virtual void adamw_update(int64_t count, float* param, const float* grad, float* exp_avg,
                            float* exp_avg_sq, float decay, float beta1, float beta2, float eps,
                            float step_size, float bc2_sqrt) = 0;
  // sum of src[i]^2 in double (gradient clipping), and dst *= alpha.
  virtual double sum_squares(int64_t count, const float* src) = 0;
  virtual void scale(int64_t count, float alpha, float* dst) = 0;
  // Weight averaging (--ema): avg = decay * avg + (1 - decay) * src, as timm's ModelEmaV2.
  virtual void ema_update(int64_t count, const float* src, float decay, float* avg) = 0;
  // Exchanges a[i] and b[i] (the model's weights and their average, for validation).
  virtual void swap(int64_t count, float* a, float* b) = 0;
};

// Host-side batch-norm moments from batchnorm_stats sums over `count` elements per channel:
// mean, biased variance (for normalising) and invstd = 1 / sqrt(var + eps).
void batchnorm_moments(const double* sums, int channels, double count, float eps, float* mean,
                       float* var, float* invstd);

// fp32, or bf16 as PyTorch's autocast: activations and their gradients are stored in bf16
// (activation_type()); convolutions read them and bf16-rounded weights, accumulate in fp32, and
// round their outputs and data gradients to bf16 once; every other op widens its inputs to fp32,
// computes in fp32 and rounds its result once. Master weights, their gradients, the optimiser,
// batch-norm statistics, the loss and all reductions are fp32 in both.
enum class Precision { kFloat32, kBFloat16 };

}  // namespace dp

// The CPU backend's factory and CPU queries, for the users of this header that predate it.
#include "dp/cpu/cpu_backend.hpp"  // IWYU pragma: export
