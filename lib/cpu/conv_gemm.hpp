// A 3x3 stride-1 fp32 convolution's passes as GEMMs on oneDNN's sgemm: one GEMM per kernel tap on
// a zero-bordered copy of each image (no im2col buffer), and Winograd F(2x2, 3x3) for forward and
// backward-data (16 GEMMs on transformed tiles, 2.25x fewer multiplications), F(4x4, 3x3) for an
// inference model's forward pass (36 GEMMs, 4x fewer): the CPU backend's own kernels, next to
// oneDNN's direct and blocked/Winograd convolutions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dp/backend.hpp"

namespace dp::cpu {

// Each image is copied into a zero-bordered (h+2) x (w+2) NHWC buffer. Read as a matrix of pixels
// (rows) by channels, output pixel q = y * (w+2) + x of a "wide" output (two extra columns per row,
// whose values are discarded) sees tap (ky, kx) at row q + ky * (w+2) + kx: the convolution is the
// sum over the nine taps of a shifted submatrix times that tap's cin x cout weight matrix, and
// both backward passes are the transposed products. The wide rows cost 2/w more work; the copies
// are one image at a time, in the caller's copies scratch.
struct GemmConv {
  int n = 0, h = 0, w = 0, cin = 0, cout = 0;
  bool relu = false, has_bias = false;
  // The output tile of forward Winograd: 2, F(2x2, 3x3); 4, F(4x4, 3x3), for a forward-only
  // (inference) convolution, whose only pass is forward. F(4x4, 3x3)'s transforms multiply by up
  // to 8 and 1/6: it rounds 2-10x more than F(2x2, 3x3), a few 1e-6 relative to direct.
  int forward_tile = 2;

  explicit GemmConv(const ConvDesc& d);
  // Whether `d` is a convolution this path computes (3x3, stride 1, padding 1).
  static bool fits(const ConvDesc& d);

  // The copies scratch of the passes that may run: with `plain` GEMMs the bordered image and a
  // wide output (gradient), the image's size; the Winograd passes alone need chunks of tiles.
  size_t copies_bytes(bool plain) const;
  size_t weight_scratch_bytes() const;  // the weights (or their gradient) as [tap][cin][cout]

  // As ConvPrims' passes: NHWC activations, OIHW weights (PyTorch's); the output gradient `dy`
  // already went through the ReLU's backward. Gradients are written, not accumulated.
  void forward(const float* x, const float* w_oihw, const float* b, float* y, void* weights,
               void* copies) const;
  void backward_weights(const float* x, const float* dy, float* dw_oihw, float* db, void* weights,
                        void* copies) const;
  void backward_data(const float* dy, const float* w_oihw, float* dx, void* weights,
                     void* copies) const;
  // Forward and backward-data by Winograd F(2x2, 3x3): each 4x4 input tile (stride 2) and each
  // filter transformed (B^T d B, G g G^T), one GEMM per of the 16 transformed positions (tiles x
  // cin times cin x cout), each 2x2 output tile transformed back (A^T m A). Backward-data is the
  // same on the output gradient with the filters rotated by 180 degrees and cin, cout swapped.
  // Tiles go in chunks, so the transformed copies stay small. Rounding differs from direct by
  // about 1e-6 relative (the transforms multiply by 0.5 and 1 only).
  void forward_winograd(const float* x, const float* w_oihw, const float* b, float* y,
                        void* weights, void* copies) const;
  void backward_data_winograd(const float* dy, const float* w_oihw, float* dx, void* weights,
                              void* copies) const;
  // Backward-weights by the same transforms: for each of the 16 points, the transformed input
  // tiles (B^T d B) times the transformed output-gradient tiles (A dY A^T), summed over all
  // tiles of the batch, then G^T M G back to the 3x3 taps. The sums over tiles run in the
  // transformed domain (about 1e-6 relative from direct, as forward's).
  void backward_weights_winograd(const float* x, const float* dy, float* dw_oihw, float* db,
                                 void* weights, void* copies) const;

 private:
  int64_t padded_rows() const;  // (h+2)(w+2) + 2: the last tap's rows stay inside
  int64_t wide_rows() const;    // h (w+2)
  float* padded(void* copies) const;
  float* wide(void* copies) const;
  void weights_to_taps(const float* w_oihw, float* taps) const;
  void taps_to_weights(const float* taps, float* w_oihw) const;
  void border_image(const float* x, float* xp) const;
  void widen(const float* dy, float* dyw) const;
  void bias_gradient(const float* dy, float* db) const;
  // One tile's transforms into 16 rows (one per point) `stride` floats apart: B^T d B of the 4x4
  // input tile at (ty, tx), A dY A^T of the 2x2 output-gradient tile there.
  void input_tile(const float* image, int64_t k, int64_t ty, int64_t tx, const float* zeros,
                  float* v, int64_t stride) const;
  void gradient_tile(const float* grad, int64_t k, int64_t ty, int64_t tx, const float* zeros,
                     float* z, int64_t stride) const;
  // Winograd on `in` (n images of h x w x k_in) with transformed filters `u` into `out` (k_out
  // channels); bias and ReLU optional.
  void winograd(const float* in, int k_in, int k_out, const float* u, const float* b, bool relu,
                float* out, void* copies) const;
  // G g G^T of every filter into [16][k_in][k_out]; `rotated`: backward-data's filters (k_in =
  // cout, k_out = cin, rotated by 180 degrees).
  void winograd_filters(const float* w_oihw, bool rotated, float* u) const;
  // F(4x4, 3x3) forward's filters: G g G^T of every filter into [36][cin][cout].
  void winograd4_filters(const float* w_oihw, float* u) const;
};

}  // namespace dp::cpu
