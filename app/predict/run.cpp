// dppredict's work: inputs split across ranks, tiled inference, PNG outputs, metrics reduced over
// ranks, progress on rank 0.
#include "predict/run.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>

#include "agreement.hpp"
#include "dp/dataset.hpp"
#include "dp/fs.hpp"
#include "dp/image_io.hpp"
#include "eval/evaluation.hpp"
#include "exit_codes.hpp"
#include "predict/measurements.hpp"
#include "predict/predictor.hpp"
#include "progress.hpp"

namespace dp::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint8_t kMaskOn = 255;  // crack pixels in the written masks
constexpr float kMaxByte = 255.0f;
// Overlay: crack pixels blended with this colour at this opacity.
constexpr std::array<float, 3> kTint = {255.0f, 0.0f, 0.0f};
constexpr float kTintAlpha = 0.6f;
constexpr const char* kMaskDir = "masks";
constexpr const char* kProbDir = "prob";
constexpr const char* kOverlayDir = "overlay";
constexpr const char* kUncertaintyDir = "uncertainty";
constexpr float kMaxWord = 65535.0f;
constexpr float kMaxDeviation = 0.5f;  // of a probability: --save-uncertainty's full scale
// Mask files (--measure-only, --masks): pixels above this are crack (as dpprep build reads masks).
constexpr uint8_t kMaskInputThreshold = 127;
constexpr const char* kMeasurementsFile = "measurements.csv";
constexpr const char* kSummaryFile = "summary.csv";
// --per-image: one row per dataset sample.
constexpr const char* kSampleHeader =
    "index,source,origin_y_px,origin_x_px,true_px,predicted_px,tp_px,fp_px,fn_px,iou,f1,"
    "precision,recall,cldice,best_f,best_f_threshold\n";

// Rank 0's progress through its share (dp::app::CountProgress): "dppredict [###...] 3/10 ...".
class Progress {
 public:
  Progress(bool enabled, int64_t total, int rank, int world)
      : share_(world > 1 ? str_cat(" (rank ", rank, " of ", world, ")") : ""),
        total_(total),
        count_(
            enabled && total > 0, kMinTotalForLines,
            [this](const CountProgress::State& s) {
              char text[256];
              std::snprintf(text, sizeof text, "dppredict [%s] %lld/%lld %5.1f%% %.1f img/s%s",
                            progress_bar(double(s.per_mille) / CountProgress::kPerMille,
                                         CountProgress::kBarWidth)
                                .c_str(),
                            static_cast<long long>(s.done), static_cast<long long>(s.total),
                            100.0 * double(s.per_mille) / CountProgress::kPerMille, s.rate,
                            share_.c_str());
              return std::string(text);
            },
            [this](const CountProgress::State& s) {
              return str_cat("dppredict: ", s.done, "/", s.total, " images", share_, ", ",
                             fixed(s.rate, 1), " img/s");
            }) {}

  void advance() { count_.update("predict", ++done_, total_); }
  void end_line() { count_.end_line(); }

 private:
  static constexpr int64_t kMinTotalForLines = 20;
  std::string share_;
  int64_t total_, done_ = 0;
  CountProgress count_;
};

bool is_listed_image(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  return e.is_regular_file() && !name.empty() && name[0] != '.' && data::has_image_extension(name);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// The files of one run: name (output file stem) and where the pixels come from.
struct Input {
  std::string name;
  std::string path;    // image file; empty for a dataset sample
  int64_t index = -1;  // dataset sample
  std::string mask;    // --masks: the image file's true mask
};

// The true mask of every image input, by stem, from the --masks folder (any image type).
void find_masks(const std::string& folder, std::vector<Input>& inputs) {
  std::map<std::string, std::string> by_stem;
  for (const auto& e : fs::directory_iterator(folder))
    if (is_listed_image(e)) by_stem.emplace(e.path().stem().string(), e.path().string());
  for (Input& in : inputs) {
    const auto it = by_stem.find(in.name);
    DP_CHECK(it != by_stem.end(), "--masks '", folder, "' has no mask for '", in.path,
             "' (expected ", in.name, ".png or another image file of that stem)");
    in.mask = it->second;
  }
}

// The true mask of an image input: read, checked against the image's size and binarised as
// dpprep build reads masks (> 127: crack, stored as 1).
std::vector<uint8_t> read_true_mask(const Input& in, int width, int height) {
  data::Image mask = data::read_image(in.mask, data::PixelFormat::kGray);
  DP_CHECK(mask.width == width && mask.height == height, in.mask, ": mask is ", mask.width, "x",
           mask.height, " but its image '", in.path, "' is ", width, "x", height,
           " (WxH); expected the same size");
  for (uint8_t& v : mask.pixels) v = v > kMaskInputThreshold ? 1 : 0;
  return std::move(mask.pixels);
}

// --scale: the factor that brings an input to the network's pixel scale (the training set's),
// and why.
struct Resampling {
  double y = 1, x = 1;
  std::string why;
  bool none() const { return y == 1 && x == 1; }
};

Resampling choose_resampling(const PredictOptions& o, const CheckpointMeta& meta,
                             const data::Dataset* dataset) {
  if (o.scale_y > 0) return {o.scale_y, o.scale_x, "--scale"};
  if (meta.scale_y <= 0 || meta.scale_x <= 0)
    return {1, 1, "--scale auto: the checkpoint records no training scale"};
  if (dataset == nullptr)
    return {meta.scale_y, meta.scale_x,
            "--scale auto: as dpprep resized the training photographs, recorded in the "
            "checkpoint"};
  const data::PixelScale& own = dataset->scale();
  if (!own.known()) return {1, 1, "--scale auto: the dataset records no scale of its own"};
  return {meta.scale_y / own.y, meta.scale_x / own.x,
          "--scale auto: the checkpoint's training scale over the dataset's"};
}

// Writes a file whole or not at all: written under a temporary name (temp_path_for) and renamed
// into place, so that a failed write (e.g. a full disk) or a kill never leaves a truncated file
// under an output's name.
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

std::string padded(int64_t v, int64_t largest) {
  const std::string digits = std::to_string(largest);
  std::string s = std::to_string(v);
  return std::string(digits.size() > s.size() ? digits.size() - s.size() : 0, '0') + s;
}

}  // namespace

std::vector<std::string> list_inputs(const PredictOptions& options) {
  std::vector<std::string> files;
  for (const std::string& p : options.inputs) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(p))
        if (is_listed_image(e)) found.push_back(e.path().string());
      DP_CHECK(!found.empty(), "folder '", p, "' holds no images (.jpg .jpeg .png)");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      DP_CHECK(fs::is_regular_file(p, ec), "input '", p, "' does not exist or is not a file");
      files.push_back(p);
    }
  }
  if (!options.list.empty()) {
    std::ifstream list(options.list);
    DP_CHECK(list.good(), "cannot read --list '", options.list, "'");
    int line_no = 0;
    for (std::string line; std::getline(list, line);) {
      ++line_no;
      line = trim(line);
      if (line.empty() || line[0] == '#') continue;
      std::error_code ec;
      DP_CHECK(fs::is_regular_file(line, ec), "--list '", options.list, "' line ", line_no, ": '",
               line, "' does not exist or is not a file");
      files.push_back(line);
    }
    DP_CHECK(!options.inputs.empty() || !files.empty(), "--list '", options.list,
             "' names no images");
  }
  std::map<std::string, std::string> by_stem;
  for (const std::string& f : files) {
    const std::string stem = fs::path(f).stem().string();
    const auto [it, fresh] = by_stem.emplace(stem, f);
    DP_CHECK(fresh, "inputs '", it->second, "' and '", f, "' would both write ", kMaskDir, "/",
             stem, ".png; rename one");
  }
  return files;
}

double recorded_ods_threshold(const CheckpointMeta& meta) {
  const size_t epoch = size_t(std::max<int64_t>(meta.epoch, 0));
  const double t = epoch >= 1 && epoch <= meta.valid_ods_threshold.size()
                       ? meta.valid_ods_threshold[epoch - 1]
                       : std::numeric_limits<double>::quiet_NaN();
  return t > 0 && t < 1 ? t : std::numeric_limits<double>::quiet_NaN();
}

namespace {

// One error line for an input file that cannot be read or decoded (the file named once).
void report_unreadable(int rank, const std::string& path, const std::string& what) {
  const std::string line = what.find(path) == std::string::npos ? str_cat(path, ": ", what) : what;
  std::fprintf(stderr, "dppredict: error: [rank %d] %s\n", rank, line.c_str());
  std::fflush(stderr);
}

std::string score(double v) {
  return fixed(v, 6);
}

// The --per-image row of sample `index` (a dataset's, or an image input's with --masks): its
// source ("file,y,x"), pixel counts and scores at the
// mask's threshold, and its own best F over the thresholds (what OIS averages: 1 for a sample
// without crack where some threshold predicts none) with that threshold (0 without crack).
std::string sample_row(int64_t index, const std::string& source, const float* prob,
                       const uint8_t* mask, const uint8_t* truth, int height, int width,
                       int tolerance) {
  MaskEvaluation evaluation(tolerance);
  evaluation.add(prob, mask, truth, height, width);
  const SegmentationMetrics m = evaluation.result();
  return str_cat(index, ",", source, ",", m.tp + m.fn, ",", m.tp + m.fp, ",", m.tp, ",", m.fp, ",",
                 m.fn, ",", score(m.iou()), ",", score(m.dice()), ",", score(m.precision()), ",",
                 score(m.recall()), ",", score(m.cldice), ",", score(m.sweep.ois), ",",
                 fixed(m.sweep.ods_threshold, 2), "\n");
}

// dppredict --measure-only: the masks named by the options measured, no network.
int run_measure_only(const PredictOptions& o, Comm& comm, const Logger& log) {
  const auto t0 = Clock::now();
  const int rank = comm.rank(), world = comm.size();
  std::vector<std::string> files;
  collectively(comm, [&] {
    files = list_inputs(o);
    if (rank == 0) ensure_writable_dir(o.out);
  });
  const MeasureSettings settings{o.pixel_size_mm, o.min_crack_px};
  log.info("dppredict: measuring ", files.size(), " mask(s) on ", world,
           " rank(s): pixels > 127 are crack, components of at least ", o.min_crack_px, " px",
           o.pixel_size_mm > 0 ? str_cat(", ", o.pixel_size_mm, " mm per pixel") : std::string());
  std::vector<std::string> crack_rows(files.size()), summary_rows(files.size());
  std::vector<size_t> mine;
  for (size_t i = size_t(rank); i < files.size(); i += size_t(world)) mine.push_back(i);
  Progress progress(rank == 0 && !o.quiet, int64_t(mine.size()), rank, world);
  std::vector<int64_t> sums(2, 0);  // measured, failed
  collectively(
      comm,
      [&] {
        data::CrackMeasurer measurer(o.min_crack_px);
        int64_t measured = 0, failed = 0;
        for (const size_t i : mine) {
          data::Image mask;
          try {
            mask = data::read_image(files[i], data::PixelFormat::kGray);
          } catch (const Error& e) {
            progress.end_line();
            report_unreadable(rank, files[i], e.what());
            ++failed;
            progress.advance();
            continue;
          }
          for (uint8_t& v : mask.pixels) v = v > kMaskInputThreshold ? 1 : 0;
          const auto& cracks = measurer.measure(mask.pixels.data(), mask.height, mask.width);
          MeasurementRows rows = measurement_rows(fs::path(files[i]).stem().string(), mask.height,
                                                  mask.width, cracks, settings);
          crack_rows[i] = std::move(rows.cracks);
          summary_rows[i] = std::move(rows.summary);
          ++measured;
          progress.advance();
        }
        sums = {measured, failed};
      },
      &sums);
  progress.end_line();
  const fs::path out(o.out);
  write_rows_in_input_order(comm, (out / kMeasurementsFile).string(), measurements_header(settings),
                            crack_rows);
  write_rows_in_input_order(comm, (out / kSummaryFile).string(), summary_header(settings),
                            summary_rows);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  log.info("dppredict: ", sums[0], " mask(s) measured in ", fixed(seconds, 1), " s; ",
           (out / kMeasurementsFile).string(), ", ", (out / kSummaryFile).string());
  if (sums[1] > 0 && rank == 0) {
    std::fprintf(stderr,
                 "dppredict: %lld mask(s) measured, %lld failed (could not be read; one error "
                 "line each above)\n",
                 static_cast<long long>(sums[0]), static_cast<long long>(sums[1]));
    std::fflush(stderr);
  }
  return sums[1] > 0 ? kExitSomeInputsFailed : kExitOk;
}

}  // namespace

int run_predict(const PredictOptions& o, Comm& comm, const Logger& log,
                SegmentationMetrics* metrics_out) {
  if (o.measure_only) return run_measure_only(o, comm, log);
  const auto t0 = Clock::now();
  const int rank = comm.rank(), world = comm.size();
  // --device auto: the GPU where this dppredict has the CUDA backend and every rank sees one.
  Device device(DeviceRequest{.device = o.device, .program = "dppredict", .allow_sharing = true},
                comm);
  const std::string device_name =
      device.gpu() ? str_cat("GPU ", device.gpu_info().ordinal, " of ",
                             device.gpu_info().visible_count, " (", device.gpu_info().name, ")")
                   : "cpu (" + cpu_onednn_version() + ", " + cpu_isa_name() + ")";
  const ThreadChoice threads =
      choose_threads(0, ThreadEnvironment::of_this_process(comm.local_size()));
  omp_set_num_threads(threads.threads);
  std::unique_ptr<Predictor> predictor;
  std::unique_ptr<data::Dataset> dataset;
  std::vector<Input> inputs;
  double threshold = o.threshold;
  collectively(comm, [&] {
    PredictorOptions po;
    po.device = &device;
    po.tile_height = o.tile_height;
    po.tile_width = o.tile_width;
    po.overlap = o.overlap;
    po.margin = o.margin;
    po.batch = o.batch_size;
    po.conv_algo = parse_cpu_conv(o.cpu_conv);
    po.precision = parse_precision(o.precision);
    po.raw_weights = o.raw_weights;
    po.tta = parse_tta(o.tta);
    predictor = std::make_unique<Predictor>(o.checkpoint, po);
    if (o.threshold_rule == PredictOptions::ThresholdRule::kOds &&
        std::isnan(recorded_ods_threshold(predictor->meta())))
      throw UsageError(str_cat("--threshold ods: checkpoint '", o.checkpoint,
                               "' records no validation ODS threshold for its epoch ",
                               predictor->meta().epoch,
                               " (not validated that epoch, or written by an older dptrain); "
                               "give --threshold P"));
    if (o.from_dataset()) {
      dataset = std::make_unique<data::Dataset>(o.dataset, o.split);
      for (int64_t i = 0; i < dataset->size(); ++i)
        inputs.push_back({str_cat(o.split, "_", padded(i, dataset->size() - 1)), "", i, {}});
    } else {
      for (std::string& f : list_inputs(o))
        inputs.push_back({fs::path(f).stem().string(), std::move(f), -1, {}});
      if (!o.masks.empty()) find_masks(o.masks, inputs);
    }
    if (rank == 0 && !o.out.empty()) {
      ensure_writable_dir((fs::path(o.out) / kMaskDir).string());
      if (o.save_prob) ensure_writable_dir((fs::path(o.out) / kProbDir).string());
      if (o.save_uncertainty) ensure_writable_dir((fs::path(o.out) / kUncertaintyDir).string());
      if (o.overlay) ensure_writable_dir((fs::path(o.out) / kOverlayDir).string());
    }
  });
  const CheckpointMeta& meta = predictor->meta();
  const Resampling resampling = choose_resampling(o, meta, dataset.get());
  // The mask threshold and why: weighted crack pixels move the best one away from 0.5 (0.72-0.95 on
  // DeepCrack, docs/real-data.md).
  const double recorded = recorded_ods_threshold(meta);
  std::string why;
  switch (o.threshold_rule) {
    case PredictOptions::ThresholdRule::kOds:
      threshold = recorded;
      why = "validation ODS";
      break;
    case PredictOptions::ThresholdRule::kAuto:
      if (std::isnan(recorded)) {
        why = str_cat(
            "--threshold auto: the checkpoint records no validation ODS threshold for "
            "its epoch ",
            meta.epoch);
      } else {
        threshold = recorded;
        why = str_cat("--threshold auto: the validation ODS threshold of epoch ", meta.epoch);
      }
      break;
    case PredictOptions::ThresholdRule::kValue:
      why = std::isnan(recorded)
                ? "--threshold"
                : str_cat("--threshold; the checkpoint's validation had its best F-measure at ",
                          recorded, ", which --threshold auto uses");
      break;
  }
  log.info(
      "dppredict: ", o.checkpoint, ": ", meta.model, " (width divisor ", meta.width_divisor,
      meta.deconv != 0 ? ", deconv" : "", ") trained ", meta.epoch, " epoch(s) on ", meta.height,
      "x", meta.width,
      predictor->averaged()       ? " (its averaged weights, dptrain --ema)"
      : meta.has_averaged_weights ? " (its raw weights, --raw-weights)"
                                  : "",
      "; tiles ", predictor->tile_height(), "x", predictor->tile_width(), ", overlap ",
      predictor->overlap(),
      predictor->margin() > 0 ? str_cat(", margin ", predictor->margin()) : std::string(), ", ",
      predictor->batch(), " per batch (activations ",
      format_mib(double(predictor->model().activation_bytes())), ", ",
      fixed(double(predictor->model().activation_bytes()) /
                (double(predictor->batch()) * predictor->tile_height() * predictor->tile_width()),
            0),
      " bytes a tile pixel); ", inputs.size(), " image(s) on ", world, " rank(s); rank 0 on ",
      device_name, ", ", threads.threads, " thread(s) per rank (", threads.source, ")",
      o.precision == "bf16" ? ", bf16 activations" : "",
      o.tta != "none"
          ? str_cat(", --tta ", o.tta, " (", tta_variants(parse_tta(o.tta)), " variants per tile)")
          : std::string(),
      "; scale ", resampling.x, "x", resampling.y,
      resampling.none() ? " (images as they are; " : " (images resized by it, masks back; ",
      resampling.why, "); threshold ", threshold, " (", why, ")");

  std::vector<size_t> mine;
  for (size_t i = size_t(rank); i < inputs.size(); i += size_t(world)) mine.push_back(i);
  Progress progress(rank == 0 && !o.quiet, int64_t(mine.size()), rank, world);
  int64_t finished = 0;                                    // images finished on this rank
  MaskEvaluation evaluation(o.tolerance);                  // --dataset, --masks
  std::unordered_map<size_t, std::vector<uint8_t>> truth;  // true masks of images in flight
  const auto mask_threshold = float(threshold);
  const fs::path out(o.out);
  const MeasureSettings measure_settings{o.pixel_size_mm, o.min_crack_px};
  data::CrackMeasurer measurer(o.min_crack_px);
  // CSV rows of this rank's inputs, by input (written in input order at the end).
  std::vector<std::string> crack_rows(o.measure ? inputs.size() : 0);
  std::vector<std::string> summary_rows(o.measure ? inputs.size() : 0);
  std::vector<std::string> sample_rows(o.per_image.empty() ? 0 : inputs.size());
  std::vector<data::SampleSource> sources;
  if (!o.per_image.empty() && dataset) sources = dataset->read_sources();
  // --scale: the images as read, while their resized copies are in flight.
  std::unordered_map<size_t, data::Image> natives;

  // Writes the outputs of one finished image and counts it.
  auto finish = [&](size_t id, const data::Image& predicted, std::vector<float>& prob,
                    const std::vector<float>& predicted_uncertainty) {
    // A resized image's maps back at its own size.
    const data::Image* photo = &predicted;
    const std::vector<float>* uncertainty_at_size = &predicted_uncertainty;
    std::vector<float> resized_uncertainty;
    const auto native = natives.find(id);
    if (native != natives.end()) {
      photo = &native->second;
      prob = data::resize_bilinear(prob, predicted.width, predicted.height, photo->width,
                                   photo->height);
      if (!predicted_uncertainty.empty()) {
        resized_uncertainty = data::resize_bilinear(predicted_uncertainty, predicted.width,
                                                    predicted.height, photo->width, photo->height);
        uncertainty_at_size = &resized_uncertainty;
      }
    }
    const data::Image& image = *photo;
    const std::vector<float>& uncertainty = *uncertainty_at_size;
    const int w = image.width, h = image.height;
    const size_t pixels = size_t(w) * size_t(h);
    std::vector<uint8_t> mask(pixels);
    for (size_t i = 0; i < pixels; ++i) mask[i] = prob[i] > mask_threshold ? kMaskOn : 0;
    // The mask's scores, files and measurements are of its cracks; ODS, OIS and AP (the sweep
    // below) are of the probabilities.
    data::erase_specks(mask.data(), h, w, o.min_crack_px);
    const std::string file = inputs[id].name + ".png";
    if (!o.out.empty()) {
      // Binary: no filter helps, and the default effort was a tenth of a large photograph's time.
      write_png_whole((out / kMaskDir / file).string(), mask.data(), w, h, 1,
                      data::PngEffort::kFast);
      if (o.save_prob && o.prob_format == "png8") {
        std::vector<uint8_t> p8(pixels);
        for (size_t i = 0; i < pixels; ++i) p8[i] = uint8_t(std::lround(prob[i] * kMaxByte));
        write_png_whole((out / kProbDir / file).string(), p8.data(), w, h, 1);
      } else if (o.save_prob && o.prob_format == "tiff32") {
        const std::vector<uint8_t> bytes = data::encode_tiff_float(prob.data(), w, h);
        write_file_whole((out / kProbDir / (inputs[id].name + ".tif")).string(), bytes.data(),
                         bytes.size());
      } else if (o.save_prob) {
        write_png16_whole((out / kProbDir / file).string(), prob.data(), 1.0f, w, h);
      }
      if (o.save_uncertainty)
        write_png16_whole((out / kUncertaintyDir / file).string(), uncertainty.data(),
                          1.0f / kMaxDeviation, w, h);
      const std::vector<data::Crack>* cracks = nullptr;
      if (o.measure) {
        cracks = &measurer.measure(mask.data(), h, w);
        MeasurementRows rows = measurement_rows(inputs[id].name, h, w, *cracks, measure_settings);
        crack_rows[id] = std::move(rows.cracks);
        summary_rows[id] = std::move(rows.summary);
      }
      if (o.overlay) {
        std::vector<uint8_t> tinted(image.pixels);
        for (size_t i = 0; i < pixels; ++i) {
          if (mask[i] == 0) continue;
          for (size_t c = 0; c < 3; ++c) {
            uint8_t& v = tinted[3 * i + c];
            v = uint8_t(std::lround((1.0f - kTintAlpha) * v + kTintAlpha * kTint[c]));
          }
        }
        if (cracks != nullptr) draw_measurements(tinted.data(), h, w, measurer.skeleton(), *cracks);
        write_png_whole((out / kOverlayDir / file).string(), tinted.data(), w, h, 3);
      }
    }
    if (const auto t = truth.find(id); t != truth.end()) {
      evaluation.add(prob.data(), mask.data(), t->second.data(), h, w);
      if (!sample_rows.empty()) {
        const Input& in = inputs[id];
        std::string source = ",,";
        if (!sources.empty())
          source = str_cat(csv_field(sources[size_t(in.index)].name), ",",
                           sources[size_t(in.index)].y, ",", sources[size_t(in.index)].x);
        else if (!in.path.empty())
          source = str_cat(csv_field(fs::path(in.path).filename().string()), ",0,0");
        sample_rows[id] = sample_row(in.index >= 0 ? in.index : int64_t(id), source, prob.data(),
                                     mask.data(), t->second.data(), h, w, o.tolerance);
      }
      truth.erase(t);
    }
    if (native != natives.end()) natives.erase(native);
    ++finished;
    progress.advance();
  };

  // An input file that cannot be read or decoded: one error line now (the file named), counted,
  // and the loop goes on with the next (no collective: the counts are summed at the end).
  int64_t failed = 0;
  auto unreadable = [&](const std::string& path, const std::string& what) {
    progress.end_line();
    report_unreadable(rank, path, what);
    ++failed;
    progress.advance();
  };

  // The loop has no collectives: a rank that fails stops and reports at the agreement below.
  std::vector<int64_t> sums(2, 0);  // finished, failed
  collectively(
      comm,
      [&] {
        TiledRunner& runner = predictor->runner();
        for (const size_t id : mine) {
          const Input& in = inputs[id];
          data::Image image;
          if (dataset) {
            image.width = dataset->width();
            image.height = dataset->height();
            image.channels = 3;
            image.pixels.resize(size_t(image.width) * size_t(image.height) * 3);
            std::vector<uint8_t> mask(size_t(image.width) * size_t(image.height));
            dataset->read(in.index, image.pixels.data(), mask.data());
            truth.emplace(id, std::move(mask));
          } else {
            // Gray, palette and 16-bit files are converted to 8-bit RGB; transparency is refused.
            // A file that cannot be read or decoded is this input's failure, not the run's.
            try {
              image = data::read_image(in.path, data::PixelFormat::kRgb);
            } catch (const Error& e) {
              unreadable(in.path, e.what());
              continue;
            }
            if (!in.mask.empty()) {
              try {
                truth.emplace(id, read_true_mask(in, image.width, image.height));
              } catch (const Error& e) {
                unreadable(in.mask, e.what());
                continue;
              }
            }
          }
          if (!resampling.none()) {
            const int width = std::max(1, int(std::lround(image.width * resampling.x)));
            const int height = std::max(1, int(std::lround(image.height * resampling.y)));
            data::Image resized = data::resize_bilinear(image, width, height);
            natives.insert_or_assign(id, std::move(image));
            image = std::move(resized);
          }
          runner.submit(id, std::move(image), finish);
        }
        runner.flush();
        sums = {finished, failed};
      },
      &sums);
  progress.end_line();
  SegmentationMetrics total;
  if (o.scored()) {  // every rank finished: the counts sum over ranks
    evaluation.reduce(comm);
    total = evaluation.result();
  }
  total.images = sums[0];
  if (o.measure) {
    write_rows_in_input_order(comm, (out / kMeasurementsFile).string(),
                              measurements_header(measure_settings), crack_rows);
    write_rows_in_input_order(comm, (out / kSummaryFile).string(), summary_header(measure_settings),
                              summary_rows);
  }
  if (!o.per_image.empty())
    write_rows_in_input_order(comm, o.per_image, kSampleHeader, sample_rows);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  log.info("dppredict: ", total.images, " image(s) in ", fixed(seconds, 1), " s (",
           fixed(double(total.images) / std::max(seconds, 1e-9), 1), " img/s)",
           o.out.empty() ? std::string() : str_cat("; masks in ", (out / kMaskDir).string()));
  const int64_t failures = sums[1];
  if (failures > 0 && rank == 0) {
    std::fprintf(stderr,
                 "dppredict: %lld image(s) predicted, %lld failed (could not be read; one error "
                 "line each above)\n",
                 static_cast<long long>(total.images), static_cast<long long>(failures));
    std::fflush(stderr);
  }
  if (o.scored()) {
    log.info("metrics on ", dataset ? str_cat(o.dataset, " /", o.split) : o.masks, " (",
             total.images, " images, ", total.pixels, " pixels, threshold ", threshold, "): iou ",
             fixed(total.iou(), 8), "  dice ", fixed(total.dice(), 8), "  precision ",
             fixed(total.precision(), 8), "  recall ", fixed(total.recall(), 8), "  cldice ",
             fixed(total.cldice, 8), "; over thresholds 0.01..0.99, tolerance ", o.tolerance,
             " px: ods ", fixed(total.sweep.ods, 8), " (t ", fixed(total.sweep.ods_threshold, 2),
             ")  ois ", fixed(total.sweep.ois, 8), "  ap ", fixed(total.sweep.ap, 8));
  }
  if (metrics_out != nullptr) *metrics_out = total;
  return failures > 0 ? kExitSomeInputsFailed : kExitOk;
}

}  // namespace dp::app
