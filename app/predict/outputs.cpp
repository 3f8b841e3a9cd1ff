// dppredict's outputs: masks, probabilities, uncertainty, overlays, measurement and score rows.
#include "predict/outputs.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "agreement.hpp"
#include "dp/fs.hpp"
#include "dp/log.hpp"
#include "eval/evaluation.hpp"
#include "predict/measurements.hpp"

namespace dp::app {
namespace {

namespace fs = std::filesystem;

constexpr uint8_t kMaskOn = 255;  // crack pixels in the written masks
constexpr float kMaxByte = 255.0f;
constexpr float kMaxWord = 65535.0f;
constexpr float kMaxDeviation = 0.5f;  // of a probability: --save-uncertainty's full scale
// Overlay: crack pixels blended with this colour at this opacity.
constexpr std::array<float, 3> kTint = {255.0f, 0.0f, 0.0f};
constexpr float kTintAlpha = 0.6f;
constexpr const char* kProbDir = "prob";
constexpr const char* kOverlayDir = "overlay";
constexpr const char* kUncertaintyDir = "uncertainty";
// --per-image: one row per scored image.
constexpr const char* kSampleHeader =
    "index,source,origin_y_px,origin_x_px,true_px,predicted_px,tp_px,fp_px,fn_px,iou,f1,"
    "precision,recall,cldice,best_f,best_f_threshold\n";

// A PNG encoded in memory, then written whole.
void write_png_whole(const std::string& path, const uint8_t* pixels, int width, int height,
                     int channels, data::PngEffort effort = data::PngEffort::kDefault) {
  const std::vector<uint8_t> bytes = data::encode_png(pixels, width, height, channels, effort);
  write_file_whole(path, bytes.data(), bytes.size());
}

// A gray 16-bit PNG of round(clamp(v x scale, 0, 1) x 65535), written whole.
void write_png16_whole(const std::string& path, const float* values, float scale, int width,
                       int height) {
  std::vector<uint16_t> words(size_t(width) * size_t(height));
  for (size_t i = 0; i < words.size(); ++i)
    words[i] = uint16_t(std::lround(std::clamp(values[i] * scale, 0.0f, 1.0f) * kMaxWord));
  const std::vector<uint8_t> bytes = data::encode_png16(words.data(), width, height, 1);
  write_file_whole(path, bytes.data(), bytes.size());
}

// A CSV file: its header, then the rows of every input in input order (collective; `rows` holds
// this rank's inputs, id % size == rank, the others empty). The rows travel to every rank, one
// broadcast per rank; rank 0 writes the file whole.
void write_rows_in_input_order(Comm& comm, const std::string& path, const std::string& header,
                               const std::vector<std::string>& rows) {
  const int rank = comm.rank(), world = comm.size();
  std::vector<int64_t> sizes(rows.size(), 0);
  for (size_t i = size_t(rank); i < rows.size(); i += size_t(world))
    sizes[i] = int64_t(rows[i].size());
  comm.allreduce_sum(sizes.data(), sizes.size());
  std::string text = header;
  std::vector<std::string> from(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    int64_t bytes = 0;
    for (size_t i = size_t(r); i < rows.size(); i += size_t(world)) bytes += sizes[i];
    std::string& buffer = from[size_t(r)];
    if (r == rank) {
      for (size_t i = size_t(r); i < rows.size(); i += size_t(world)) buffer += rows[i];
    } else {
      buffer.resize(size_t(bytes));
    }
    if (bytes > 0 && world > 1) comm.broadcast(buffer.data(), size_t(bytes), r);
  }
  std::vector<size_t> offset(size_t(world), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t r = i % size_t(world);
    text.append(from[r], offset[r], size_t(sizes[i]));
    offset[r] += size_t(sizes[i]);
  }
  on_root(comm, "dppredict", [&] { write_file_whole(path, text.data(), text.size()); });
}

// The files of one folder of OUT, one per image: <folder>/<name><extension>.
class FileSink : public Sink {
 protected:
  FileSink(const PredictOptions& o, const char* folder, int rank) : dir_(fs::path(o.out) / folder) {
    if (rank == 0) ensure_writable_dir(dir_.string());
  }
  std::string path(const PredictedImage& p, const char* extension = ".png") const {
    return (dir_ / (p.input->name + extension)).string();
  }

 private:
  fs::path dir_;
};

// masks/<name>.png: 0 or 255.
class MaskFiles : public FileSink {
 public:
  MaskFiles(const PredictOptions& o, int rank) : FileSink(o, kMaskDir, rank) {}
  void add(const PredictedImage& p) override {
    std::vector<uint8_t> bytes(*p.mask);
    for (uint8_t& v : bytes) v = v != 0 ? kMaskOn : 0;
    // Binary: no filter helps, and the default effort was a tenth of a large photograph's time.
    write_png_whole(path(p), bytes.data(), p.width, p.height, 1, data::PngEffort::kFast);
  }
};

// prob/<name>.png (png16, png8) or prob/<name>.tif (tiff32).
class ProbabilityFiles : public FileSink {
 public:
  ProbabilityFiles(const PredictOptions& o, int rank)
      : FileSink(o, kProbDir, rank), format_(o.prob_format) {}
  void add(const PredictedImage& p) override {
    const std::vector<float>& prob = *p.probability;
    if (format_ == "png8") {
      std::vector<uint8_t> p8(prob.size());
      for (size_t i = 0; i < prob.size(); ++i) p8[i] = uint8_t(std::lround(prob[i] * kMaxByte));
      write_png_whole(path(p), p8.data(), p.width, p.height, 1);
    } else if (format_ == "tiff32") {
      const std::vector<uint8_t> bytes = data::encode_tiff_float(prob.data(), p.width, p.height);
      write_file_whole(path(p, ".tif"), bytes.data(), bytes.size());
    } else {
      write_png16_whole(path(p), prob.data(), 1.0f, p.width, p.height);
    }
  }

 private:
  std::string format_;
};

// uncertainty/<name>.png: the variants' standard deviation, 65535 at 0.5.
class UncertaintyFiles : public FileSink {
 public:
  UncertaintyFiles(const PredictOptions& o, int rank) : FileSink(o, kUncertaintyDir, rank) {}
  void add(const PredictedImage& p) override {
    write_png16_whole(path(p), p.uncertainty->data(), 1.0f / kMaxDeviation, p.width, p.height);
  }
};

// overlay/<name>.png: the photograph with crack pixels tinted, and the measurements drawn.
class OverlayFiles : public FileSink {
 public:
  OverlayFiles(const PredictOptions& o, int rank) : FileSink(o, kOverlayDir, rank) {}
  void add(const PredictedImage& p) override {
    std::vector<uint8_t> tinted(p.photo->pixels);
    const std::vector<uint8_t>& mask = *p.mask;
    for (size_t i = 0; i < mask.size(); ++i) {
      if (mask[i] == 0) continue;
      for (size_t c = 0; c < 3; ++c) {
        uint8_t& v = tinted[3 * i + c];
        v = uint8_t(std::lround((1.0f - kTintAlpha) * v + kTintAlpha * kTint[c]));
      }
    }
    if (p.cracks != nullptr)
      draw_measurements(tinted.data(), p.height, p.width, *p.skeleton, *p.cracks);
    write_png_whole(path(p), tinted.data(), p.width, p.height, 3);
  }
};

// OUT/measurements.csv (a row per crack) and OUT/summary.csv (a row per image).
class MeasurementFiles : public Sink {
 public:
  MeasurementFiles(const PredictOptions& o, size_t inputs)
      : out_(o.out),
        settings_{o.pixel_size_mm, o.min_crack_px},
        cracks_(inputs),
        summaries_(inputs) {}
  void add(const PredictedImage& p) override {
    MeasurementRows rows = measurement_rows(p.input->name, p.height, p.width, *p.cracks, settings_);
    cracks_[p.id] = std::move(rows.cracks);
    summaries_[p.id] = std::move(rows.summary);
  }
  void finish(Comm& comm) override {
    write_rows_in_input_order(comm, (out_ / kMeasurementsFile).string(),
                              measurements_header(settings_), cracks_);
    write_rows_in_input_order(comm, (out_ / kSummaryFile).string(), summary_header(settings_),
                              summaries_);
  }

 private:
  fs::path out_;
  MeasureSettings settings_;
  std::vector<std::string> cracks_, summaries_;  // by input
};

// --per-image: a row of scores per scored image, its own best F over the thresholds (what OIS
// averages: 1 for an image without crack where some threshold predicts none) with that threshold
// (0 without crack).
class ScoreRows : public Sink {
 public:
  ScoreRows(const PredictOptions& o, const InputSource& source, size_t inputs)
      : path_(o.per_image), tolerance_(o.tolerance), source_(source), rows_(inputs) {}
  void add(const PredictedImage& p) override {
    if (p.truth == nullptr) return;
    MaskEvaluation evaluation(tolerance_);
    evaluation.add(p.probability->data(), p.mask->data(), p.truth->data(), p.height, p.width);
    const SegmentationMetrics m = evaluation.result();
    const int64_t index = p.input->index >= 0 ? p.input->index : int64_t(p.id);
    rows_[p.id] =
        str_cat(index, ",", source_.source_fields(p.id), ",", m.tp + m.fn, ",", m.tp + m.fp, ",",
                m.tp, ",", m.fp, ",", m.fn, ",", score(m.iou()), ",", score(m.dice()), ",",
                score(m.precision()), ",", score(m.recall()), ",", score(m.cldice), ",",
                score(m.sweep.ois), ",", fixed(m.sweep.ods_threshold, 2), "\n");
  }
  void finish(Comm& comm) override { write_rows_in_input_order(comm, path_, kSampleHeader, rows_); }

 private:
  static std::string score(double v) { return fixed(v, 6); }
  std::string path_;
  int tolerance_;
  const InputSource& source_;
  std::vector<std::string> rows_;  // by input
};

}  // namespace

void write_file_whole(const std::string& path, const void* data, size_t size) {
  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail("cannot write '", path, "': ", std::strerror(errno));
  bool ok = std::fwrite(data, 1, size, f) == size && std::fflush(f) == 0;
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) ok = false, err = errno;
  if (!ok) {
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(err));
  }
}

std::vector<std::unique_ptr<Sink>> make_sinks(const PredictOptions& o, const InputSource* source,
                                              size_t inputs, int rank) {
  std::vector<std::unique_ptr<Sink>> sinks;
  if (!o.out.empty() && !o.measure_only) {
    sinks.push_back(std::make_unique<MaskFiles>(o, rank));
    if (o.save_prob) sinks.push_back(std::make_unique<ProbabilityFiles>(o, rank));
    if (o.save_uncertainty) sinks.push_back(std::make_unique<UncertaintyFiles>(o, rank));
    if (o.overlay) sinks.push_back(std::make_unique<OverlayFiles>(o, rank));
  }
  if (o.measure || o.measure_only) {
    if (rank == 0) ensure_writable_dir(o.out);
    sinks.push_back(std::make_unique<MeasurementFiles>(o, inputs));
  }
  if (!o.per_image.empty() && source != nullptr)
    sinks.push_back(std::make_unique<ScoreRows>(o, *source, inputs));
  return sinks;
}

}  // namespace dp::app
