// dppredict's run, top to bottom: inputs split across ranks -> per image: read, resized to the
// training scale, tiled inference, back at its size, mask, cracks, scores -> the sinks
// (predict/outputs.hpp) -> scores reduced over ranks; progress on rank 0.
#include "predict/run.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <unordered_map>

#include "agreement.hpp"
#include "dp/dataset.hpp"
#include "dp/image_io.hpp"
#include "eval/evaluation.hpp"
#include "exit_codes.hpp"
#include "predict/inputs.hpp"
#include "predict/outputs.hpp"
#include "predict/predictor.hpp"
#include "progress.hpp"

namespace dp::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

}  // namespace

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

// The mask threshold and why: weighted crack pixels move the best one away from 0.5 (0.72-0.95 on
// DeepCrack, docs/real-data.md).
struct Choice {
  double value = 0;
  std::string why;
};

Choice choose_threshold(const PredictOptions& o, const CheckpointMeta& meta) {
  const double recorded = recorded_ods_threshold(meta);
  switch (o.threshold_rule) {
    case PredictOptions::ThresholdRule::kOds:
      return {recorded, "validation ODS"};
    case PredictOptions::ThresholdRule::kAuto:
      if (std::isnan(recorded))
        return {o.threshold,
                str_cat("--threshold auto: the checkpoint records no validation ODS threshold for "
                        "its epoch ",
                        meta.epoch)};
      return {recorded,
              str_cat("--threshold auto: the validation ODS threshold of epoch ", meta.epoch)};
    case PredictOptions::ThresholdRule::kValue:
      break;
  }
  return {o.threshold,
          std::isnan(recorded)
              ? "--threshold"
              : str_cat("--threshold; the checkpoint's validation had its best F-measure at ",
                        recorded, ", which --threshold auto uses")};
}

// An image in flight through the tiled runner: its pixels as read where it was resized for the
// network, and its true mask.
struct InFlight {
  data::Image native;  // empty where not resized
  std::vector<uint8_t> truth;
};

// dppredict --measure-only: the masks named by the options measured, no network.
int run_measure_only(const PredictOptions& o, Comm& comm, const Logger& log) {
  const auto t0 = Clock::now();
  const int rank = comm.rank(), world = comm.size();
  std::unique_ptr<InputSource> source;
  std::vector<std::unique_ptr<Sink>> sinks;
  collectively(comm, [&] {
    source = std::make_unique<InputSource>(o);
    sinks = make_sinks(o, nullptr, source->inputs().size(), rank);
  });
  const std::vector<Input>& inputs = source->inputs();
  log.info("dppredict: measuring ", inputs.size(), " mask(s) on ", world,
           " rank(s): pixels > 127 are crack, components of at least ", o.min_crack_px, " px",
           o.pixel_size_mm > 0 ? str_cat(", ", o.pixel_size_mm, " mm per pixel") : std::string());
  std::vector<size_t> mine;
  for (size_t i = size_t(rank); i < inputs.size(); i += size_t(world)) mine.push_back(i);
  Progress progress(rank == 0 && !o.quiet, int64_t(mine.size()), rank, world);
  std::vector<int64_t> sums(2, 0);  // measured, failed
  collectively(
      comm,
      [&] {
        data::CrackMeasurer measurer(o.min_crack_px);
        int64_t measured = 0, failed = 0;
        for (const size_t id : mine) {
          data::Image mask;
          try {
            mask = read_mask_file(inputs[id].path);
          } catch (const Error& e) {
            progress.end_line();
            report_unreadable(rank, inputs[id].path, e.what());
            ++failed;
            progress.advance();
            continue;
          }
          PredictedImage p;
          p.id = id;
          p.input = &inputs[id];
          p.mask = &mask.pixels;
          p.height = mask.height;
          p.width = mask.width;
          p.cracks = &measurer.measure(mask.pixels.data(), mask.height, mask.width);
          p.skeleton = &measurer.skeleton();
          for (const auto& sink : sinks) sink->add(p);
          ++measured;
          progress.advance();
        }
        sums = {measured, failed};
      },
      &sums);
  progress.end_line();
  for (const auto& sink : sinks) sink->finish(comm);
  const fs::path out(o.out);
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
  std::unique_ptr<InputSource> source;
  std::vector<std::unique_ptr<Sink>> sinks;
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
    source = std::make_unique<InputSource>(o);
    sinks = make_sinks(o, source.get(), source->inputs().size(), rank);
  });
  const CheckpointMeta& meta = predictor->meta();
  const Resampling resampling = choose_resampling(o, meta, source->dataset());
  const Choice threshold = choose_threshold(o, meta);
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
      " bytes a tile pixel); ", source->inputs().size(), " image(s) on ", world,
      " rank(s); rank 0 on ", device_name, ", ", threads.threads, " thread(s) per rank (",
      threads.source, ")", o.precision == "bf16" ? ", bf16 activations" : "",
      o.tta != "none"
          ? str_cat(", --tta ", o.tta, " (", tta_variants(parse_tta(o.tta)), " variants per tile)")
          : std::string(),
      "; scale ", resampling.x, "x", resampling.y,
      resampling.none() ? " (images as they are; " : " (images resized by it, masks back; ",
      resampling.why, "); threshold ", threshold.value, " (", threshold.why, ")");

  const auto mask_threshold = float(threshold.value);

  // Each rank predicts inputs i with i % size == rank. The loop has no collectives: a rank that
  // fails stops and reports at the agreement after it.
  const std::vector<Input>& inputs = source->inputs();
  std::vector<size_t> mine;
  for (size_t i = size_t(rank); i < inputs.size(); i += size_t(world)) mine.push_back(i);
  Progress progress(rank == 0 && !o.quiet, int64_t(mine.size()), rank, world);
  std::unordered_map<size_t, InFlight> in_flight;
  MaskEvaluation evaluation(o.tolerance);  // --dataset, --masks
  data::CrackMeasurer measurer(o.min_crack_px);
  int64_t finished = 0, failed = 0;

  // One image out of the network: back at its own size, its mask (specks cleared), its cracks,
  // its scores, then every sink.
  auto finish = [&](size_t id, const data::Image& predicted, std::vector<float>& prob,
                    const std::vector<float>& uncertainty_of_predicted) {
    const auto f = in_flight.find(id);
    const data::Image& photo = f->second.native.pixels.empty() ? predicted : f->second.native;
    const int w = photo.width, h = photo.height;
    const std::vector<float>* uncertainty = &uncertainty_of_predicted;
    std::vector<float> resized_uncertainty;
    if (&photo != &predicted) {
      prob = data::resize_bilinear(prob, predicted.width, predicted.height, w, h);
      if (!uncertainty->empty()) {
        resized_uncertainty =
            data::resize_bilinear(*uncertainty, predicted.width, predicted.height, w, h);
        uncertainty = &resized_uncertainty;
      }
    }
    // The mask's scores, files and measurements are of its cracks; ODS, OIS and AP are of the
    // probabilities.
    std::vector<uint8_t> mask(prob.size());
    for (size_t i = 0; i < prob.size(); ++i) mask[i] = prob[i] > mask_threshold ? 1 : 0;
    data::erase_specks(mask.data(), h, w, o.min_crack_px);
    PredictedImage p;
    p.id = id;
    p.input = &inputs[id];
    p.photo = &photo;
    p.probability = &prob;
    p.uncertainty = uncertainty;
    p.mask = &mask;
    p.height = h;
    p.width = w;
    if (!f->second.truth.empty()) {
      p.truth = &f->second.truth;
      evaluation.add(prob.data(), mask.data(), p.truth->data(), h, w);
    }
    if (o.measure) {
      p.cracks = &measurer.measure(mask.data(), h, w);
      p.skeleton = &measurer.skeleton();
    }
    for (const auto& sink : sinks) sink->add(p);
    in_flight.erase(f);
    ++finished;
    progress.advance();
  };

  std::vector<int64_t> sums(2, 0);  // finished, failed
  collectively(
      comm,
      [&] {
        TiledRunner& runner = predictor->runner();
        for (const size_t id : mine) {
          InputImage read;
          try {
            read = source->read(id);
          } catch (const Error& e) {
            if (!source->file_inputs()) throw;  // a dataset that cannot be read: the run's
            // A file that cannot be read or decoded is this input's failure, not the run's.
            progress.end_line();
            report_unreadable(rank, inputs[id].path, e.what());
            ++failed;
            progress.advance();
            continue;
          }
          InFlight& f = in_flight[id];
          f.truth = std::move(read.truth);
          data::Image image = std::move(read.image);
          if (!resampling.none()) {  // resized for the network; the original kept for the end
            const int width = std::max(1, int(std::lround(image.width * resampling.x)));
            const int height = std::max(1, int(std::lround(image.height * resampling.y)));
            f.native = std::move(image);
            image = data::resize_bilinear(f.native, width, height);
          }
          runner.submit(id, std::move(image), finish);
        }
        runner.flush();
        sums = {finished, failed};
      },
      &sums);
  progress.end_line();
  for (const auto& sink : sinks) sink->finish(comm);
  SegmentationMetrics total;
  if (o.scored()) {  // every rank finished: the counts sum over ranks
    evaluation.reduce(comm);
    total = evaluation.result();
  }
  total.images = sums[0];
  const int64_t failures = sums[1];
  const fs::path out(o.out);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  log.info("dppredict: ", total.images, " image(s) in ", fixed(seconds, 1), " s (",
           fixed(double(total.images) / std::max(seconds, 1e-9), 1), " img/s)",
           o.out.empty() ? std::string() : str_cat("; masks in ", (out / kMaskDir).string()));
  if (failures > 0 && rank == 0) {
    std::fprintf(stderr,
                 "dppredict: %lld image(s) predicted, %lld failed (could not be read; one error "
                 "line each above)\n",
                 static_cast<long long>(total.images), static_cast<long long>(failures));
    std::fflush(stderr);
  }
  if (o.scored()) {
    log.info("metrics on ", source->scored_set(), " (", total.images, " images, ", total.pixels,
             " pixels, threshold ", threshold.value, "): iou ", fixed(total.iou(), 8), "  dice ",
             fixed(total.dice(), 8), "  precision ", fixed(total.precision(), 8), "  recall ",
             fixed(total.recall(), 8), "  cldice ", fixed(total.cldice, 8),
             "; over thresholds 0.01..0.99, tolerance ", o.tolerance, " px: ods ",
             fixed(total.sweep.ods, 8), " (t ", fixed(total.sweep.ods_threshold, 2), ")  ois ",
             fixed(total.sweep.ois, 8), "  ap ", fixed(total.sweep.ap, 8));
  }
  if (metrics_out != nullptr) *metrics_out = total;
  return failures > 0 ? kExitSomeInputsFailed : kExitOk;
}

}  // namespace dp::app
