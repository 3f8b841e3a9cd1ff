// Input normalisation of a trained model: its statistics, their record in checkpoints, the table.
#pragma once

#include <array>
#include <map>
#include <string>

#include "dp/checkpoint.hpp"

namespace dp::app {

// Per-channel input normalisation as the training Loader applies it: (v / 255 - mean) / std.
struct Normalization {
  std::array<float, 3> mean{}, std{};
};

// The 256-entry table of each channel, computed with the Loader's own float expression.
using NormalizationLut = std::array<std::array<float, 256>, 3>;
NormalizationLut normalization_lut(const Normalization& n);

// "normalize_mean = m0 m1 m2\nnormalize_std = s0 s1 s2\n" with 9 significant digits (a float
// round-trips exactly): dptrain appends it to the options it stores in checkpoints.
std::string describe_normalization(const Normalization& n);

// "key = value" lines (a checkpoint's `options` attribute) as a map; other lines are ignored.
std::map<std::string, std::string> parse_option_lines(const std::string& text);

// The normalisation a checkpoint was trained with: the statistics it records; failing that,
// ImageNet's when it says `normalize = imagenet` (or nothing); failing that (`normalize =
// dataset` in a checkpoint written before the statistics were recorded), the mean/std attributes
// of the dataset it names. Throws dp::Error naming the checkpoint when none can be found.
Normalization normalization_from_options(const std::string& options, const std::string& checkpoint);

// The normalisation of a checkpoint whose attributes are `meta`: its normalize_mean and
// normalize_std attributes; in files written before them, normalization_from_options(meta.options).
Normalization normalization_of(const CheckpointMeta& meta, const std::string& checkpoint);

}  // namespace dp::app
