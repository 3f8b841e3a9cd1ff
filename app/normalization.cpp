// Input normalisation of a trained model: its record in checkpoints, recovered for inference.
#include "normalization.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/loader.hpp"

namespace dp::app {
namespace {

constexpr int kChannels = 3;
constexpr int kLevels = 256;
constexpr float kMaxByte = 255.0f;
constexpr const char* kMeanKey = "normalize_mean";
constexpr const char* kStdKey = "normalize_std";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::array<float, 3> parse_triple(const std::string& text, const char* key,
                                  const std::string& checkpoint) {
  std::array<float, 3> v{};
  std::istringstream is(text);
  for (float& x : v) {
    is >> x;
    DP_CHECK(!is.fail(), "checkpoint '", checkpoint, "': option ", key, " = '", text,
             "' is not three numbers");
  }
  return v;
}

}  // namespace

NormalizationLut normalization_lut(const Normalization& n) {
  NormalizationLut lut{};
  for (int c = 0; c < kChannels; ++c)
    for (int v = 0; v < kLevels; ++v)
      lut[size_t(c)][size_t(v)] = (v / kMaxByte - n.mean[size_t(c)]) / n.std[size_t(c)];
  return lut;
}

std::string describe_normalization(const Normalization& n) {
  std::string out;
  for (const auto& [key, v] : {std::pair{kMeanKey, n.mean}, std::pair{kStdKey, n.std}}) {
    char line[128];
    std::snprintf(line, sizeof line, "%s = %.9g %.9g %.9g\n", key, double(v[0]), double(v[1]),
                  double(v[2]));
    out += line;
  }
  return out;
}

std::map<std::string, std::string> parse_option_lines(const std::string& text) {
  std::map<std::string, std::string> options;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    options[trim(line.substr(0, eq))] = trim(line.substr(eq + 3));
  }
  return options;
}

Normalization normalization_from_options(const std::string& options,
                                         const std::string& checkpoint) {
  const auto o = parse_option_lines(options);
  Normalization n;
  if (o.count(kMeanKey) != 0 && o.count(kStdKey) != 0) {
    n.mean = parse_triple(o.at(kMeanKey), kMeanKey, checkpoint);
    n.std = parse_triple(o.at(kStdKey), kStdKey, checkpoint);
    for (const float s : n.std)
      DP_CHECK(s > 0, "checkpoint '", checkpoint, "': ", kStdKey, " must be positive, got ", s);
    return n;
  }
  const auto mode = o.find("normalize");
  if (mode == o.end() || mode->second == "imagenet") {
    n.mean = data::kImagenetMean;
    n.std = data::kImagenetStd;
    return n;
  }
  DP_CHECK(mode->second == "dataset", "checkpoint '", checkpoint, "': unknown normalize = '",
           mode->second, "'");
  // Older checkpoints name their dataset only: its statistics are the ones training used.
  const auto data = o.find("data");
  const std::string path = data == o.end() ? std::string() : data->second;
  try {
    const data::Dataset ds(path, "train");
    DP_CHECK(ds.has_stats(), "it has no mean/std attributes");
    n.mean = ds.mean();
    n.std = ds.std();
  } catch (const Error& e) {
    fail("checkpoint '", checkpoint,
         "' was trained with --normalize dataset but does not record the statistics, and its "
         "dataset '",
         path, "' cannot supply them: ", e.what());
  }
  return n;
}

Normalization normalization_of(const CheckpointMeta& meta, const std::string& checkpoint) {
  if (meta.normalize_mean.empty()) return normalization_from_options(meta.options, checkpoint);
  Normalization n;
  for (size_t c = 0; c < n.mean.size(); ++c) {
    n.mean[c] = float(meta.normalize_mean[c]);
    n.std[c] = float(meta.normalize_std[c]);
    DP_CHECK(std::isfinite(n.mean[c]) && std::isfinite(n.std[c]) && n.std[c] > 0, "checkpoint '",
             checkpoint, "': ", kStdKey, " must be positive and ", kMeanKey, " finite, got mean ",
             n.mean[c], " and std ", n.std[c], " for channel ", c);
  }
  return n;
}

}  // namespace dp::app
