// Tiled inference: tile positions, reflect padding, the blending window, and TiledRunner, which
// turns images of any size into probability maps with a fixed-size network.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dp/buffer.hpp"
#include "dp/image_io.hpp"
#include "normalization.hpp"
#include "words.hpp"

namespace dp::app {

// Start offsets of the tiles that cover [-margin, length + margin) with tiles of `tile` pixels,
// neighbours sharing at least `overlap` pixels (0 <= overlap < tile, margin >= 0); with
// L = length + 2 margin:
//   L <= tile: one tile centred on the axis (start <= -margin; the outside is reflect padding);
//   otherwise ceil((L - tile) / (tile - overlap)) + 1 tiles spread evenly from -margin to
//   length + margin - tile: the first and last are flush with the ends of the extended axis, so
//   with margin 0 no tile reads outside the image and its borders meet the tiles' borders (where
//   the network pads with zeros, as it did on whole training images); with margin > 0 every image
//   pixel has at least `margin` pixels of reflected context.
std::vector<int> tile_starts(int length, int tile, int overlap, int margin = 0);

// Index into [0, length) of position i of an axis extended by reflection without repeating the
// edge pixel (numpy's and PyTorch's "reflect"): ... 2 1 | 0 1 2 ... L-1 | L-2 L-3 ...
int reflect_index(int64_t i, int length);

// Blending weight of position i of a tile of `tile` pixels: sin^2(pi (i + 0.5) / tile). Smooth,
// symmetric, largest at the centre and small (never 0) at the borders, where a network sees the
// least context. A tile's 2-D weight is the product of its row and column weights.
std::vector<float> window_weights(int tile);

// Test-time augmentation: the variants of every tile whose probabilities are averaged. kFlips:
// the tile, flipped left-right, up-down and both (nnU-Net's mirroring); kDihedral: those and
// their transposes, the 8 symmetries of a square (square tiles only). Each variant's logits are
// mapped back to the tile before the sigmoid's average.
enum class Tta { kNone, kFlips, kDihedral };
// --tta's words: none, flips, dihedral.
const Words<Tta>& tta_words();
int tta_variants(Tta tta);  // 1, 4 or 8

// Runs images of any size through a network that takes tiles of tile_height x tile_width, in
// batches of up to `batch` tiles (tiles of consecutive images share a batch). Each pixel's
// probability is the window-weighted mean of sigmoid(logit) over the tiles that cover it:
// sum(w * p) / sum(w). Sides shorter than the tile are reflect-padded, and every side by `margin`
// pixels of reflected context (see tile_starts).
class TiledRunner {
 public:
  // input: [n, tile_height, tile_width, 3] normalised floats; returns logits [n, th, tw, 1],
  // valid until the next call.
  using Forward = std::function<const float*(const float* input, int n)>;
  // Hears of an image (RGB, as submitted) with its probabilities (height * width) when all of its
  // tiles are in, and with test-time augmentation their uncertainty: per pixel, the standard
  // deviation of the probability over the variants, window-weighted over the tiles like the
  // probabilities (0..0.5; empty without augmentation).
  using Done = std::function<void(size_t id, const data::Image& image, std::vector<float>& prob,
                                  const std::vector<float>& uncertainty)>;

  // A Tta::kDihedral with a tile that is not square is a UsageError naming --tta.
  TiledRunner(Forward forward, const Normalization& normalization, int tile_height, int tile_width,
              int overlap, int batch, int margin = 0, Tta tta = Tta::kNone);
  ~TiledRunner();
  TiledRunner(const TiledRunner&) = delete;
  TiledRunner& operator=(const TiledRunner&) = delete;

  // Queues the tiles of an RGB image (channels == 3); runs every batch that fills up, so `done`
  // may be called (for this or earlier images) before submit returns.
  void submit(size_t id, data::Image image, Done done);
  // Runs the last, partial batch: every submitted image is done afterwards.
  void flush();
  // Tiles one image needs.
  int64_t tiles_for(int height, int width) const;

 private:
  struct Job;
  struct Slot {
    std::shared_ptr<Job> job;
    int y0 = 0, x0 = 0;
  };
  void run_batch();
  // The batch's tiles through every variant: mean_ and deviation_ per tile pixel.
  void run_variants(int n);

  Forward forward_;
  NormalizationLut lut_;
  int tile_height_, tile_width_, overlap_, batch_, margin_;
  Tta tta_;
  Buffer variant_input_;                 // [batch, th, tw, 3]: one variant of the batch
  std::vector<float> mean_, deviation_;  // [batch, th, tw]: over the variants
  std::vector<float> window_y_, window_x_;
  Buffer input_;             // [batch, th, tw, 3]
  std::vector<Slot> slots_;  // the tiles of the batch being filled
};

}  // namespace dp::app
