// Synthetic crack images: value-noise concrete/asphalt texture, random-walk cracks, exact masks.
#include "dp/synth.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <iterator>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "dp/rng.hpp"

namespace dp::data {

namespace {

constexpr int kChannels = 3;
constexpr float kTwoPi = 6.283185307179586f;
constexpr float kMaxByte = 255.0f;

// Stream ids: train sample i uses key(seed, kTrainStream, i), val sample i key(seed, kValStream,
// i).
constexpr uint64_t kTrainStream = 0;
constexpr uint64_t kValStream = 1;
// Bumped whenever the generator's output changes, so stale cached files are regenerated
// (2: files carry the train images' mean and std attributes).
constexpr int64_t kSynthVersion = 2;

// Background texture.
constexpr int kOctaves = 4;
constexpr float kBaseCellMin = 12.0f, kBaseCellMax = 28.0f;  // px, coarsest noise lattice
constexpr float kOctaveGain = 0.5f;
constexpr float kGreyMin = 85.0f, kGreyMax = 185.0f;  // base grey level
constexpr float kWarmMin = -0.3f, kWarmMax = 1.0f;    // <0: bluish asphalt, >0: brownish concrete
constexpr float kWarmRed = 0.10f, kWarmGreen = 0.03f, kWarmBlue = -0.10f;
constexpr float kBrightnessMin = 0.75f, kBrightnessMax = 1.2f;
constexpr float kTextureMin = 8.0f, kTextureMax = 28.0f;  // grey levels of the value noise
constexpr float kGrainMin = 3.0f, kGrainMax = 14.0f;      // grey levels of per-pixel grain
constexpr float kColourGrain = 0.3f;                      // part of the grain that is per channel
constexpr float kGradientMax = 20.0f;                     // illumination ramp, grey levels
constexpr int kPixelsPerPore = 160;                       // pores: dark spots that are not cracks
constexpr float kPoreRadiusMin = 0.5f, kPoreRadiusMax = 1.6f;
constexpr float kPoreDarkMin = 0.08f, kPoreDarkMax = 0.3f;

// Cracks.
constexpr float kNoCrackProbability = 0.1f;
constexpr int kMaxCracks = 3;
constexpr float kStepMin = 1.0f, kStepMax = 2.0f;      // px per polyline vertex
constexpr float kLengthMin = 0.5f, kLengthMax = 1.5f;  // x image size
// Direction = heading (drifts slowly) + deviation (jagged, pulled back towards the heading).
constexpr float kHeadingDrift = 0.05f;               // rad per step, random walk of the heading
constexpr float kDeviationNoise = 0.3f;              // rad per step added to the deviation
constexpr float kDeviationDecay = 0.8f;              // pull of the deviation back to 0 per step
constexpr float kWidthMin = 1.0f, kWidthMax = 3.0f;  // px
constexpr float kWidthWobble = 0.6f;                 // px, amplitude of the width variation
constexpr float kWobbleFreqMin = 0.04f, kWobbleFreqMax = 0.2f;  // rad per px along the path
constexpr float kContrastMin = 0.1f, kContrastMax = 0.7f;       // fraction of darkening
constexpr float kContrastShape = 2.0f;  // >1 skews contrasts low: many faint cracks
constexpr float kContrastWobble = 0.25f;
constexpr float kEdgeFalloff = 0.4f;   // darkening at the crack edge relative to its centre
constexpr float kRadiusSlack = 0.15f;  // px added to half the width so 1 px cracks stay connected
constexpr float kStampSpacing = 0.5f;  // px between stamps along a segment
constexpr float kBranchProbability = 0.35f;
constexpr float kBranchAngleMin = 0.4f, kBranchAngleMax = 1.2f;    // rad off the parent direction
constexpr float kBranchLengthMin = 0.2f, kBranchLengthMax = 0.5f;  // x parent length
constexpr float kBranchWidthScale = 0.7f;
constexpr float kOutsideMargin = 8.0f;  // px beyond the border where a walk is abandoned

struct Canvas {
  int h, w;
  std::vector<float> dark;  // crack darkening per pixel, 0 = no crack
};

float smooth(float t) {
  return t * t * (3.0f - 2.0f * t);
}

// Lattice value in [0, 1) of noise octave `octave` at integer point (ix, iy).
float lattice(uint64_t seed, int octave, int64_t ix, int64_t iy) {
  constexpr float kInv24 = 1.0f / 16777216.0f;
  const uint64_t k = key(seed, static_cast<uint64_t>(octave), static_cast<uint64_t>(ix),
                         static_cast<uint64_t>(iy));
  return static_cast<float>(k >> 40) * kInv24;
}

// Smoothly interpolated value noise in [0, 1).
float value_noise(uint64_t seed, int octave, float x, float y) {
  const float fx = std::floor(x), fy = std::floor(y);
  const auto ix = static_cast<int64_t>(fx), iy = static_cast<int64_t>(fy);
  const float tx = smooth(x - fx), ty = smooth(y - fy);
  const float a = lattice(seed, octave, ix, iy), b = lattice(seed, octave, ix + 1, iy);
  const float c = lattice(seed, octave, ix, iy + 1), d = lattice(seed, octave, ix + 1, iy + 1);
  const float top = a + (b - a) * tx, bottom = c + (d - c) * tx;
  return top + (bottom - top) * ty;
}

// Darkens pixels within `radius` of (px, py): value = strength at the centre, falling towards
// the edge but never to 0, combined by maximum. Used for cracks (masked) and pores (not masked).
void stamp(std::vector<float>& dark, int h, int w, float px, float py, float radius,
           float strength) {
  const int x0 = std::max(0, static_cast<int>(std::floor(px - radius)));
  const int x1 = std::min(w - 1, static_cast<int>(std::floor(px + radius)));
  const int y0 = std::max(0, static_cast<int>(std::floor(py - radius)));
  const int y1 = std::min(h - 1, static_cast<int>(std::floor(py + radius)));
  const float r2 = radius * radius;
  for (int y = y0; y <= y1; ++y) {
    for (int x = x0; x <= x1; ++x) {
      const float dx = static_cast<float>(x) + 0.5f - px, dy = static_cast<float>(y) + 0.5f - py;
      const float d2 = dx * dx + dy * dy;
      if (d2 > r2) continue;
      const float v = strength * (1.0f - kEdgeFalloff * std::sqrt(d2 / r2));
      float& cell = dark[static_cast<size_t>(y) * w + x];
      cell = std::max(cell, v);
    }
  }
}

struct CrackParams {
  float x, y, theta, length, width, contrast;
  int depth;  // 0 = main crack, 1 = branch (branches do not branch again)
};

// One random-walk polyline; its direction drifts smoothly, width and contrast vary along it.
void paint_crack(Rng& rng, Canvas& canvas, CrackParams p) {
  const float wobble_phase = rng.uniform(0.0f, kTwoPi);
  const float wobble_freq = rng.uniform(kWobbleFreqMin, kWobbleFreqMax);
  const float shade_phase = rng.uniform(0.0f, kTwoPi);
  const float shade_freq = rng.uniform(kWobbleFreqMin, kWobbleFreqMax);
  float branch_at = -1.0f;
  if (p.depth == 0 && rng.uniform() < kBranchProbability) {
    branch_at = rng.uniform(0.2f, 0.8f) * p.length;
  }
  float x = p.x, y = p.y, heading = p.theta, deviation = 0.0f, travelled = 0.0f;
  while (travelled < p.length) {
    const float step = rng.uniform(kStepMin, kStepMax);
    heading += rng.uniform(-kHeadingDrift, kHeadingDrift);
    deviation = deviation * kDeviationDecay + rng.uniform(-kDeviationNoise, kDeviationNoise);
    const float theta = heading + deviation;
    const float nx = x + step * std::cos(theta), ny = y + step * std::sin(theta);
    const float width =
        std::clamp(p.width + kWidthWobble * std::sin(wobble_phase + wobble_freq * travelled),
                   kWidthMin, kWidthMax);
    const float contrast =
        p.contrast *
        (1.0f - kContrastWobble * 0.5f * (1.0f + std::sin(shade_phase + shade_freq * travelled)));
    const float radius = 0.5f * width + kRadiusSlack;
    const int stamps = std::max(1, static_cast<int>(std::ceil(step / kStampSpacing)));
    for (int s = 1; s <= stamps; ++s) {
      const float t = static_cast<float>(s) / static_cast<float>(stamps);
      stamp(canvas.dark, canvas.h, canvas.w, x + (nx - x) * t, y + (ny - y) * t, radius, contrast);
    }
    x = nx;
    y = ny;
    travelled += step;
    if (branch_at >= 0.0f && travelled >= branch_at) {
      branch_at = -1.0f;
      const float side = rng.uniform() < 0.5f ? -1.0f : 1.0f;
      paint_crack(rng, canvas,
                  CrackParams{x, y, heading + side * rng.uniform(kBranchAngleMin, kBranchAngleMax),
                              p.length * rng.uniform(kBranchLengthMin, kBranchLengthMax),
                              std::max(kWidthMin, p.width * kBranchWidthScale),
                              p.contrast * rng.uniform(0.7f, 1.0f), p.depth + 1});
    }
    if (x < -kOutsideMargin || y < -kOutsideMargin || x > canvas.w + kOutsideMargin ||
        y > canvas.h + kOutsideMargin) {
      break;
    }
  }
}

void check_options(const SynthOptions& o) {
  DP_CHECK(o.height > 0 && o.width > 0, "synthetic data: bad image size ", o.height, "x", o.width);
  DP_CHECK(o.train_count >= 0 && o.val_count >= 0, "synthetic data: bad sample counts train ",
           o.train_count, ", val ", o.val_count);
}

}  // namespace

void render_synthetic(const SynthOptions& options, uint64_t stream, uint8_t* image, uint8_t* mask) {
  check_options(options);
  const int h = options.height, w = options.width;
  const size_t pixels = static_cast<size_t>(h) * w;
  Rng rng(stream);

  // Background: tinted grey, multi-octave value noise, illumination ramp, grain.
  const float brightness = rng.uniform(kBrightnessMin, kBrightnessMax);
  const float grey = rng.uniform(kGreyMin, kGreyMax) * brightness;
  const float warm = rng.uniform(kWarmMin, kWarmMax);
  const float tint[kChannels] = {1.0f + kWarmRed * warm, 1.0f + kWarmGreen * warm,
                                 1.0f + kWarmBlue * warm};
  const float texture = rng.uniform(kTextureMin, kTextureMax);
  const float grain = rng.uniform(kGrainMin, kGrainMax);
  const float cell = rng.uniform(kBaseCellMin, kBaseCellMax);
  const float ramp_angle = rng.uniform(0.0f, kTwoPi);
  const float ramp = rng.uniform(0.0f, kGradientMax);
  const float ramp_x = std::cos(ramp_angle) * ramp / static_cast<float>(std::max(h, w));
  const float ramp_y = std::sin(ramp_angle) * ramp / static_cast<float>(std::max(h, w));
  const uint64_t noise_seed = rng.next();

  std::vector<float> background(pixels * kChannels);
  float amplitude_sum = 0.0f;
  for (int o = 0, amp = 1; o < kOctaves; ++o, amp *= 2) amplitude_sum += 1.0f / amp;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      float n = 0.0f, amp = 1.0f, scale = 1.0f / cell;
      for (int o = 0; o < kOctaves; ++o) {
        n += amp * (2.0f * value_noise(noise_seed, o, x * scale, y * scale) - 1.0f);
        amp *= kOctaveGain;
        scale *= 2.0f;
      }
      const float shared_grain = grain * (1.0f - kColourGrain) * (2.0f * rng.uniform() - 1.0f);
      const float level = grey + texture * n / amplitude_sum + ramp_x * (x - 0.5f * w) +
                          ramp_y * (y - 0.5f * h) + shared_grain;
      float* px = &background[(static_cast<size_t>(y) * w + x) * kChannels];
      for (int c = 0; c < kChannels; ++c) {
        px[c] = level * tint[c] + grain * kColourGrain * (2.0f * rng.uniform() - 1.0f);
      }
    }
  }

  // Pores: small dark spots that are not cracks (the model must not call every dark pixel one).
  std::vector<float> pores(pixels, 0.0f);
  const uint64_t n_pores = rng.below(pixels / kPixelsPerPore + 1);
  for (uint64_t i = 0; i < n_pores; ++i) {
    const float px = rng.uniform(0.0f, static_cast<float>(w));
    const float py = rng.uniform(0.0f, static_cast<float>(h));
    stamp(pores, h, w, px, py, rng.uniform(kPoreRadiusMin, kPoreRadiusMax),
          rng.uniform(kPoreDarkMin, kPoreDarkMax));
  }

  // Cracks.
  Canvas canvas{h, w, std::vector<float>(pixels, 0.0f)};
  const int n_cracks =
      rng.uniform() < kNoCrackProbability ? 0 : 1 + static_cast<int>(rng.below(kMaxCracks));
  const float size = 0.5f * static_cast<float>(h + w);
  for (int i = 0; i < n_cracks; ++i) {
    // A crack grows both ways from a point inside the image, so most of it is visible.
    const float u = rng.uniform();
    CrackParams p{rng.uniform(0.0f, static_cast<float>(w)),
                  rng.uniform(0.0f, static_cast<float>(h)),
                  rng.uniform(0.0f, kTwoPi),
                  0.5f * size * rng.uniform(kLengthMin, kLengthMax),
                  rng.uniform(kWidthMin, kWidthMax),
                  kContrastMin + (kContrastMax - kContrastMin) * std::pow(u, kContrastShape),
                  0};
    paint_crack(rng, canvas, p);
    p.theta += 0.5f * kTwoPi;
    paint_crack(rng, canvas, p);
  }

  for (size_t i = 0; i < pixels; ++i) {
    const float crack = canvas.dark[i];
    const float keep = (1.0f - pores[i]) * (1.0f - crack);
    for (int c = 0; c < kChannels; ++c) {
      const float v = std::clamp(background[i * kChannels + c] * keep, 0.0f, kMaxByte);
      image[i * kChannels + c] = static_cast<uint8_t>(std::lround(v));
    }
    mask[i] = crack > 0.0f ? 1 : 0;
  }
}

void write_synthetic(const std::string& path, const SynthOptions& options) {
  check_options(options);
  DatasetWriter writer(path, options.height, options.width, options.train_count, options.val_count,
                       options.gzip_level);
  const size_t pixels = static_cast<size_t>(options.height) * options.width;
  std::vector<uint8_t> image(pixels * kChannels), mask(pixels);
  for (int64_t i = 0; i < options.train_count; ++i) {
    render_synthetic(options, key(options.seed, kTrainStream, static_cast<uint64_t>(i)),
                     image.data(), mask.data());
    writer.write("train", i, image.data(), mask.data());
  }
  for (int64_t i = 0; i < options.val_count; ++i) {
    render_synthetic(options, key(options.seed, kValStream, static_cast<uint64_t>(i)), image.data(),
                     mask.data());
    writer.write("val", i, image.data(), mask.data());
  }
  writer.set_attr("synth_version", kSynthVersion);
  writer.set_attr("synth_seed", static_cast<int64_t>(options.seed));  // bit pattern of the seed
  writer.set_attr("synth_train", options.train_count);
  writer.set_attr("synth_val", options.val_count);
  writer.set_attr("synth_height", static_cast<int64_t>(options.height));
  writer.set_attr("synth_width", static_cast<int64_t>(options.width));
  writer.commit();
}

bool synthetic_matches(const std::string& path, const SynthOptions& options) {
  try {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    {
      h5::File file(path, h5::Mode::kRead);
      if (!file.has_attr("format") || file.attr_string("format") != kDatasetFormat) return false;
      const char* names[] = {"synth_version", "synth_seed",   "synth_train",
                             "synth_val",     "synth_height", "synth_width"};
      const int64_t want[] = {kSynthVersion,       static_cast<int64_t>(options.seed),
                              options.train_count, options.val_count,
                              options.height,      options.width};
      for (size_t i = 0; i < std::size(names); ++i) {
        if (!file.has_attr(names[i]) || file.attr_int(names[i]) != want[i]) return false;
      }
      if (options.train_count == 0 && file.exists("train")) return false;
      if (options.val_count == 0 && file.exists("val")) return false;
    }
    // The layout, format and sizes must be valid too (a reader's constructor checks them).
    const struct {
      const char* split;
      int64_t count;
    } splits[] = {{"train", options.train_count}, {"val", options.val_count}};
    for (const auto& s : splits) {
      if (s.count == 0) continue;
      Dataset d(path, s.split);
      if (d.size() != s.count || d.height() != options.height || d.width() != options.width) {
        return false;
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace dp::data
