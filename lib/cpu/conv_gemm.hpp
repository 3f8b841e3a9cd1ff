// A 3x3 stride-1 fp32 convolution's passes as GEMMs on oneDNN's sgemm: one GEMM per kernel tap on
// a zero-bordered copy of each image (no im2col buffer), and Winograd for every pass: F(4x4, 3x3)
// (36 GEMMs on transformed tiles, 4x fewer multiplications) where the batch has enough tiles,
// else F(2x2, 3x3) (16 GEMMs, 2.25x fewer): the CPU backend's own kernels, next to oneDNN's
// direct and blocked/Winograd convolutions. With bf16 activations the Winograd passes read and
// write bf16 and multiply on bf16 GEMMs (gemm_bf16.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "dp/backend.hpp"
#include "dp/bf16.hpp"
#include "simd.hpp"

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
  // The output tile of the fp32 Winograd passes: 4, F(4x4, 3x3), where the batch has at least 64
  // such tiles (n x ceil(h/4) x ceil(w/4)); else 2, F(2x2, 3x3), whose GEMMs have 4x the rows.
  // F(4x4, 3x3)'s transforms multiply by up to 8 and 1/24: it rounds 2-10x more than F(2x2,
  // 3x3), a few 1e-6 relative to direct in every pass.
  int tile = 2;
  // bf16 activations (--precision bf16): the Winograd passes only, F(2x2, 3x3) for every pass.
  // The transforms run in fp32; the transformed tiles and filters are rounded to bf16 and their
  // products summed in fp32 on gemm_bf16 (VDPBF16PS: twice sgemm's multiply-adds a cycle); the
  // output transform's result is rounded once to bf16. Backward-weights rounds both tiles'
  // transforms and writes an fp32 weight gradient.
  bool bf16_activations = false;

  GemmConv(const ConvDesc& d, bool bf16);
  // Whether `d` is a convolution this path computes (3x3, stride 1, padding 1); with bf16
  // activations, also even channel counts (gemm_bf16 multiplies pairs of channels).
  static bool fits(const ConvDesc& d, bool bf16 = false);

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
  // The Winograd passes read and write activations of the convolution's type (float, or dp::bf16
  // with bf16_activations).
  // Forward and backward-data by Winograd F(MxM, 3x3), M = tile: each (M+2)x(M+2) input tile
  // (stride M) and each filter transformed (B^T d B, G g G^T), one GEMM per transformed position
  // (tiles x cin times cin x cout), each MxM output tile transformed back (A^T m A). Backward-data
  // is the same on the output gradient with the filters rotated by 180 degrees and cin, cout
  // swapped. Tiles go in chunks, so the transformed copies stay small. Rounding differs from direct
  // by about 1e-6 relative (the transforms multiply by 0.5 and 1 only).
  void forward_winograd(const void* x, const float* w_oihw, const float* b, void* y, void* weights,
                        void* copies) const;
  void backward_data_winograd(const void* dy, const float* w_oihw, void* dx, void* weights,
                              void* copies) const;
  // Backward-weights by the same transforms: for each point, the transformed input tiles
  // (B^T d B) times the transformed output-gradient tiles (A dY A^T), summed over all tiles of the
  // batch, then G^T M G back to the 3x3 taps. The sums over tiles run in the
  // transformed domain (about 1e-6 relative from direct, as forward's).
  void backward_weights_winograd(const void* x, const void* dy, float* dw_oihw, float* db,
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
  // (Per-thread passes over whole tensors, cloned for AVX2, simd.hpp.)
  template <typename T>
  DP_AVX2_CLONES void bias_gradient(const T* dy, float* db) const;
  // Forward (or, `rotated`, backward-data) Winograd on `in` into `out` with the optional bias and
  // ReLU: the filters transformed into `weights`, the tiles through the copies.
  void winograd_pass(const void* in, const float* w_oihw, bool rotated, const float* bias,
                     bool relu_out, void* out, void* weights, void* copies) const;
  // The pixels of Winograd F(MxM, 3x3) tile (ty, tx), a zero row for those outside the image: the
  // (M+2)x(M+2) input tile at stride M, and the MxM output-gradient tile there.
  template <int M, typename T>
  void input_pixels(const T* image, int64_t k, int64_t ty, int64_t tx, const T* zeros,
                    const T* (&d)[M + 2][M + 2]) const;
  template <int M, typename T>
  void gradient_pixels(const T* grad, int64_t k, int64_t ty, int64_t tx, const T* zeros,
                       const T* (&g)[M][M]) const;
  // Backward-weights' sums M[p] (`acc`, [points][cin][cout]) of the transformed tiles' products,
  // and G^T M G from them into the OIHW weight gradient, for F(MxM, 3x3).
  template <int M>
  void weight_points(const float* x, const float* dy, float* acc, void* copies) const;
  void weight_points_bf16(const bf16* x, const bf16* dy, float* acc, void* copies) const;
  template <int M>
  DP_AVX2_CLONES void points_to_weights(const float* acc, float* dw_oihw) const;
  // G g G^T of every filter into `u`, [16][k_in][k_out] floats, or with bf16_activations 16
  // matrices of bf16_packed_size(k_in, k_out) in gemm_bf16's layout; `rotated`: backward-data's
  // filters (k_in = cout, k_out = cin, rotated by 180 degrees).
  void winograd_filters(const float* w_oihw, bool rotated, void* u) const;
  // F(4x4, 3x3)'s filters: G g G^T of every filter into [36][k_in][k_out], `rotated` as above.
  DP_AVX2_CLONES void winograd4_filters(const float* w_oihw, bool rotated, float* u) const;
};

}  // namespace dp::cpu
