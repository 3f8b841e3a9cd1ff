// The training report (dptrain --report): report.html in --model-dir, rewritten after every
// validation; self-contained (inline SVG curves, samples as PNG data: URIs), no network needed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "normalization.hpp"
#include "train/options.hpp"
#include "train/validation_samples.hpp"

namespace dp::app {

// RFC 4648 base64 with '=' padding.
std::string base64_encode(const uint8_t* data, size_t size);

// "data:image/png;base64,..." of an 8-bit image with 1 or 3 channels.
std::string png_data_uri(const uint8_t* pixels, int width, int height, int channels);

// One curve of a chart: a value per epoch (epoch i + 1 at index i; NaN: none).
struct ChartSeries {
  std::string id;     // data-series attribute of its points, e.g. "train_loss"
  std::string label;  // legend text
  std::string color;  // CSS colour
  std::vector<double> values;
};

// An inline SVG line chart over epochs 1..epochs: one polyline per series (broken at NaN) and one
// <circle class="pt" data-series=ID data-epoch=E> per value, with a <title> tooltip.
// `marker_epoch` > 0 draws a dashed vertical line there (the best epoch). `y_range` fixes the y
// axis (a ratio's is 0..1); without it the axis fits the values.
std::string svg_line_chart(const std::string& title, const std::vector<ChartSeries>& series,
                           int64_t epochs, int64_t marker_epoch = 0,
                           std::optional<std::pair<double, double>> y_range = std::nullopt);

// Text with & < > " escaped for HTML content and attribute values.
std::string html_escape(const std::string& text);

class TrainingReport {
 public:
  static constexpr const char* kFileName = "report.html";
  static constexpr int kSamples = ValidationSamples::kCount;

  // `samples`: the fixed validation samples, null without a validation split.
  TrainingReport(const TrainOptions& options, const std::string& data_path,
                 std::shared_ptr<const ValidationSamples> samples);

  // After an epoch was validated and saved (rank 0): records its LR and throughput, refreshes the
  // sample predictions when this epoch is the best (from `model`, evaluation mode) or when there
  // are none yet (from model_best.h5, after a resume), and rewrites report.html atomically. A
  // failure is logged as a warning: a report never stops training.
  void update(Model& model, const CheckpointMeta& state, double lr, double images_per_s,
              const Logger& log);

  // The page for `state` (exposed for tests).
  std::string html(const CheckpointMeta& state) const;

 private:
  struct Shown {  // a sample as the page shows it
    int64_t index = 0;
    std::string image_uri, truth_uri, prediction_uri;
    std::string score;  // describe_sample_iou of the prediction
  };
  void predict(Model& model, int64_t epoch);
  void write(const CheckpointMeta& state) const;

  TrainOptions opt_;
  std::string data_path_;
  bool has_val_ = false;
  std::shared_ptr<const ValidationSamples> samples_;
  std::vector<Shown> shown_;
  int64_t predicted_epoch_ = 0;                // epoch whose weights made the predictions (0: none)
  std::map<int64_t, double> lr_, throughput_;  // per epoch (1-based), as seen by this process
};

}  // namespace dp::app
