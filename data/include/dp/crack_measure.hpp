// Crack measurements of a binary mask: 8-connected cracks, skeleton length, width along the
// skeleton.
#pragma once

#include <cstdint>
#include <vector>

namespace dp::data {

// The Euclidean distance from every pixel's centre to the centre of the nearest background pixel
// (mask 0) into `distance` (height x width, row-major): 0 on background, +infinity everywhere if
// the image has no background. Pixels outside the image are not background (as SciPy's
// ndimage.distance_transform_edt). Exact, in O(height x width): Felzenszwalb and Huttenlocher's
// lower envelope of parabolas, along columns and then along rows.
void distance_to_background(const uint8_t* mask, int height, int width, float* distance);

// Clears (sets to 0) every 8-connected component of `mask` (height x width, 0 = background,
// nonzero = crack) with fewer than min_px pixels, the specks of a thresholded prediction; other
// pixels keep their values. Returns the number of pixels cleared.
int64_t erase_specks(uint8_t* mask, int height, int width, int64_t min_px);

// One crack: an 8-connected component of crack pixels.
//   length: the skeleton's (dp::data::skeletonize, as scikit-image's) length estimated from its
//     steps by Vossepoel and Smeulders' corner count (CGIP 20, 1982): 0.980 per orthogonal step,
//     1.406 per diagonal step, -0.091 per corner (a pixel with two steps in different directions),
//     within ~1% of a straight line's length at any angle; steps_length counts orthogonal steps 1
//     and diagonal ones sqrt 2 (up to 8% long between the axes and the diagonals). A diagonal
//     step between two pixels that also share an orthogonal skeleton neighbour is not a step.
//   width at a skeleton pixel: 2 d - 0.5, d = distance_to_background. The crack's edge lies
//     half a pixel before the nearest background pixel's centre, so the near side is d - 0.5
//     wide; the far one is as wide when the skeleton pixel sits on the crack's centre line and
//     up to a pixel wider when it sits half a pixel off it (cracks an even number of pixels
//     wide): 2 d - 0.5 is right on average over where the centre line falls in the pixel, and
//     within 0.5 px for a crack along the axes.
struct Crack {
  int64_t area_px = 0;                // crack pixels
  int box_x = 0, box_y = 0;           // top-left pixel of the bounding box
  int box_width = 0, box_height = 0;  // bounding box, pixels
  int64_t skeleton_px = 0;            // skeleton pixels
  double length_px = 0;               // corner-count estimate (see above)
  double steps_length_px = 0;         // 1 per orthogonal step, sqrt 2 per diagonal step
  double mean_width_px = 0, median_width_px = 0, max_width_px = 0;  // over the skeleton pixels
  int widest_x = 0, widest_y = 0;  // the first skeleton pixel (raster order) of max_width_px
};

// Measures masks, reusing its buffers between calls.
class CrackMeasurer {
 public:
  // Components smaller than min_crack_px pixels are not cracks (specks of a prediction).
  explicit CrackMeasurer(int64_t min_crack_px);

  // The cracks of `mask` (height x width, 0 = background, nonzero = crack), in raster order of
  // their first pixel.
  const std::vector<Crack>& measure(const uint8_t* mask, int height, int width);
  // The skeleton pixels (0/1, height x width) of the cracks the last measure() returned.
  const std::vector<uint8_t>& skeleton() const { return skeleton_; }

 private:
  int64_t min_crack_px_;
  std::vector<Crack> cracks_;
  std::vector<int32_t> label_;  // crack index + 1 per pixel, 0 = none
  std::vector<uint8_t> skeleton_, thinning_;
  std::vector<float> distance_;
  std::vector<int64_t> stack_;
  std::vector<std::vector<float>> widths_;  // per crack, along its skeleton
};

}  // namespace dp::data
