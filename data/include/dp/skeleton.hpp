// Skeletons of binary masks by Zhang-Suen thinning, pixel for pixel as scikit-image computes them.
#pragma once

#include <cstdint>
#include <vector>

namespace dp::data {

// The skeleton of `mask` (height x width, row-major, 0 = background, nonzero = foreground) into
// `skeleton` (0/1, the same size; it may be `mask` itself): exactly what scikit-image's
// skimage.morphology.skeletonize gives for a 2-D image (method 'zhang', its default), with pixels
// outside the image as background. Zhang and Suen's two sub-iterations (each deleting in
// parallel the pixels its rule selects), repeated until a full iteration deletes none, with
// scikit-image's deletion table (see skeleton.cpp). O(height x width) per iteration.
void skeletonize(const uint8_t* mask, int height, int width, uint8_t* skeleton);
// The same with a caller's scratch buffer (resized to (height + 2) x (width + 2)), so repeated
// calls do not allocate.
void skeletonize(const uint8_t* mask, int height, int width, uint8_t* skeleton,
                 std::vector<uint8_t>& scratch);

}  // namespace dp::data
