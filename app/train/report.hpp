// The training report (dptrain --report): report.html in --model-dir, rewritten after every
// validation; self-contained (inline SVG curves, samples as PNG data: URIs), no network needed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/log.hpp"
#include "dp/model.hpp"
#include "predict/normalization.hpp"
#include "train/options.hpp"

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
// `marker_epoch` > 0 draws a dashed vertical line there (the best epoch).
std::string svg_line_chart(const std::string& title, const std::vector<ChartSeries>& series,
                           int64_t epochs, int64_t marker_epoch = 0);

// Text with & < > " escaped for HTML content and attribute values.
std::string html_escape(const std::string& text);

class TrainingReport {
 public:
  static constexpr const char* kFileName = "report.html";
  static constexpr int kSamples = 4;  // validation samples shown (fewer if the split is smaller)

  // Reads the fixed validation samples (evenly spaced over the split) of `data_path` when it has
  // one, normalised as training does. Throws dp::Error naming the file on a read error.
  TrainingReport(const TrainOptions& options, const std::string& data_path, bool has_val,
                 const Normalization& normalization);

  // After an epoch was validated and saved (rank 0): records its LR and throughput, refreshes the
  // sample predictions when this epoch is the best (from `model`, evaluation mode) or when there
  // are none yet (from model_best.h5, after a resume), and rewrites report.html atomically. A
  // failure is logged as a warning: a report never stops training.
  void update(Model& model, const CheckpointMeta& state, double lr, double images_per_s,
              const Logger& log);

  // The page for `state` (exposed for tests).
  std::string html(const CheckpointMeta& state) const;

 private:
  struct Sample {
    int64_t index = 0;
    int height = 0, width = 0;
    std::vector<uint8_t> mask;  // 0/1
    std::vector<float> input;   // normalised NHWC
    std::string image_uri, truth_uri, prediction_uri;
    double iou = 0;
  };
  void predict(Model& model, int64_t epoch);
  void write(const CheckpointMeta& state) const;

  TrainOptions opt_;
  std::string data_path_;
  bool has_val_ = false;
  float logit_threshold_ = 0;
  std::vector<Sample> samples_;
  int64_t predicted_epoch_ = 0;                // epoch whose weights made the predictions (0: none)
  std::map<int64_t, double> lr_, throughput_;  // per epoch (1-based), as seen by this process
};

}  // namespace dp::app
