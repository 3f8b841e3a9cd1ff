// Synthetic crack dataset: textured backgrounds with random-walk cracks and their exact masks.
#pragma once

#include <cstdint>
#include <string>

namespace dp::data {

struct SynthOptions {
  int64_t train_count = 512;
  int64_t val_count = 128;
  int height = 64;
  int width = 64;
  uint64_t seed = 1;
  int gzip_level = 0;  // of the written chunks; synthetic_matches does not compare it
};

// Renders sample `index` of the stream `seed` (a pure function of both): image H*W*3 uint8 and
// mask H*W in {0,1}. Texture: smooth multi-octave value noise with grain and random tint;
// cracks: 1-3 random-walk polylines, varying width (1-3 px) and contrast; mask = crack pixels.
void render_synthetic(const SynthOptions& options, uint64_t stream, uint8_t* image, uint8_t* mask);

// Writes a dataset v1 file (atomically) with the options stored as root attributes.
void write_synthetic(const std::string& path, const SynthOptions& options);

// Returns true if `path` is a valid dataset v1 written by write_synthetic with these options.
bool synthetic_matches(const std::string& path, const SynthOptions& options);

}  // namespace dp::data
