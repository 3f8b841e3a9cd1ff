// dppredict's run, top to bottom: inputs split across ranks -> per image: read, resized to the
// training scale, tiled inference -> the per-image stages (predict/stages.hpp) -> the sinks
// (predict/outputs.hpp) -> scores reduced over ranks; progress on rank 0.
#include "predict/run.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <unordered_map>

#include "agreement.hpp"
#include "dp/image_io.hpp"
#include "exit_codes.hpp"
#include "predict/inputs.hpp"
#include "predict/outputs.hpp"
#include "predict/predictor.hpp"
#include "predict/settings.hpp"
#include "predict/stages.hpp"
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

// This rank's share of the inputs (i % size == rank), walked inside one agreement (collectively)
// with rank 0's progress. The walk has no collectives: a rank that fails stops and reports at the
// agreement. An input whose file cannot be read or decoded is that input's failure (one error
// line, counted), not the run's.
class Share {
 public:
  struct Counts {
    int64_t done = 0, failed = 0;  // over every rank
  };

  Share(Comm& comm, const std::vector<Input>& inputs, bool quiet)
      : comm_(comm),
        inputs_(inputs),
        ids_(ids_of(comm, inputs.size())),
        progress_(comm.rank() == 0 && !quiet, int64_t(ids_.size()), comm.rank(), comm.size()) {}

  // For each input of the share: item = read(id), then use(id, item), which calls done() when
  // the input is finished (at once, or later from a batch); then last(). An Error from read is
  // the input's failure where `files` (image or mask files), else the run's.
  template <class Read, class Use, class Last>
  Counts walk(bool files, Read read, Use use, Last last) {
    std::vector<int64_t> sums(2, 0);
    collectively(
        comm_,
        [&] {
          for (const size_t id : ids_) {
            std::optional<decltype(read(id))> item;
            try {
              item.emplace(read(id));
            } catch (const Error& e) {
              if (!files) throw;
              unreadable(inputs_[id].path, e.what());
              continue;
            }
            use(id, std::move(*item));
          }
          last();
          sums = {done_, failed_};
        },
        &sums);
    progress_.end_line();
    return {sums[0], sums[1]};
  }

  void done() {
    ++done_;
    progress_.advance();
  }

  // Rank 0's line about the inputs that failed, if any; the exit code, the same on every rank.
  int exit_code(const Counts& counts, const char* done_what) const {
    if (counts.failed == 0) return kExitOk;
    if (comm_.rank() == 0) {
      std::fprintf(stderr,
                   "dppredict: %lld %s, %lld failed (could not be read; one error line "
                   "each above)\n",
                   static_cast<long long>(counts.done), done_what,
                   static_cast<long long>(counts.failed));
      std::fflush(stderr);
    }
    return kExitSomeInputsFailed;
  }

 private:
  static std::vector<size_t> ids_of(const Comm& comm, size_t inputs) {
    std::vector<size_t> ids;
    for (size_t i = size_t(comm.rank()); i < inputs; i += size_t(comm.size())) ids.push_back(i);
    return ids;
  }

  void unreadable(const std::string& path, const std::string& what) {
    progress_.end_line();
    const std::string line =
        what.find(path) == std::string::npos ? str_cat(path, ": ", what) : what;
    std::fprintf(stderr, "dppredict: error: [rank %d] %s\n", comm_.rank(), line.c_str());
    std::fflush(stderr);
    ++failed_;
    progress_.advance();
  }

  Comm& comm_;
  const std::vector<Input>& inputs_;
  std::vector<size_t> ids_;
  Progress progress_;
  int64_t done_ = 0, failed_ = 0;
};

// The network as the options ask (collective set-up: a dp::Error is the run's).
std::unique_ptr<Predictor> open_predictor(const PredictOptions& o, Device& device) {
  PredictorOptions po;
  po.device = &device;
  po.tile_height = o.tile_height;
  po.tile_width = o.tile_width;
  po.overlap = o.overlap;
  po.margin = o.margin;
  po.batch = o.batch_size;
  po.conv_algo = o.cpu_conv;
  po.precision = o.precision;
  po.raw_weights = o.raw_weights;
  po.tta = o.tta;
  auto predictor = std::make_unique<Predictor>(o.checkpoint, po);
  if (o.threshold_rule == PredictOptions::ThresholdRule::kOds &&
      std::isnan(recorded_ods_threshold(predictor->meta())))
    throw UsageError(str_cat("--threshold ods: checkpoint '", o.checkpoint,
                             "' records no validation ODS threshold for its epoch ",
                             predictor->meta().epoch,
                             " (not validated that epoch, or written by an older dptrain); "
                             "give --threshold P"));
  return predictor;
}

std::string device_name(const Device& device) {
  if (!device.gpu()) return "cpu (" + cpu_onednn_version() + ", " + cpu_isa_name() + ")";
  const auto& gpu = device.gpu_info();
  return str_cat("GPU ", gpu.ordinal, " of ", gpu.visible_count, " (", gpu.name, ")");
}

// The start line: the model, the tiles, the inputs, the device, the scale and the threshold.
std::string start_line(const PredictOptions& o, Predictor& predictor, size_t inputs, int world,
                       const std::string& device, const ThreadChoice& threads,
                       const Resampling& resampling, const Threshold& threshold) {
  const CheckpointMeta& meta = predictor.meta();
  const double tile_pixels =
      double(predictor.batch()) * predictor.tile_height() * predictor.tile_width();
  return str_cat(
      "dppredict: ", o.checkpoint, ": ", meta.model, " (width divisor ", meta.width_divisor,
      meta.deconv != 0 ? ", deconv" : "", ") trained ", meta.epoch, " epoch(s) on ", meta.height,
      "x", meta.width,
      predictor.averaged()        ? " (its averaged weights, dptrain --ema)"
      : meta.has_averaged_weights ? " (its raw weights, --raw-weights)"
                                  : "",
      "; tiles ", predictor.tile_height(), "x", predictor.tile_width(), ", overlap ",
      predictor.overlap(),
      predictor.margin() > 0 ? str_cat(", margin ", predictor.margin()) : std::string(), ", ",
      predictor.batch(), " per batch (activations ",
      format_mib(double(predictor.model().activation_bytes())), ", ",
      fixed(double(predictor.model().activation_bytes()) / tile_pixels, 0),
      " bytes a tile pixel); ", inputs, " image(s) on ", world, " rank(s); rank 0 on ", device,
      ", ", threads.threads, " thread(s) per rank (", threads.source, ")",
      o.precision == Precision::kBFloat16 ? ", bf16 activations" : "",
      o.tta != Tta::kNone ? str_cat(", --tta ", word_of(tta_words(), o.tta), " (",
                                    tta_variants(o.tta), " variants per tile)")
                          : std::string(),
      "; scale ", resampling.x, "x", resampling.y,
      resampling.none() ? " (images as they are; " : " (images resized by it, masks back; ",
      resampling.why, "); threshold ", threshold.value, " (", threshold.why, ")");
}

// The scores line of a run with true masks.
std::string scores_line(const std::string& scored_set, const SegmentationMetrics& m,
                        double threshold, int tolerance) {
  return str_cat("metrics on ", scored_set, " (", m.images, " images, ", m.pixels,
                 " pixels, threshold ", threshold, "): iou ", fixed(m.iou(), 8), "  dice ",
                 fixed(m.dice(), 8), "  precision ", fixed(m.precision(), 8), "  recall ",
                 fixed(m.recall(), 8), "  cldice ", fixed(m.cldice, 8),
                 "; over thresholds 0.01..0.99, tolerance ", tolerance, " px: ods ",
                 fixed(m.sweep.ods, 8), " (t ", fixed(m.sweep.ods_threshold, 2), ")  ois ",
                 fixed(m.sweep.ois, 8), "  ap ", fixed(m.sweep.ap, 8));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// dppredict --measure-only: the masks named by the options measured, no network.
int run_measure_only(const PredictOptions& o, Comm& comm, const Logger& log) {
  const auto t0 = Clock::now();
  std::unique_ptr<InputSource> source;
  std::vector<std::unique_ptr<Sink>> sinks;
  collectively(comm, [&] {
    source = std::make_unique<InputSource>(o);
    sinks = make_sinks(o, nullptr, source->inputs().size(), comm.rank());
  });
  const std::vector<Input>& inputs = source->inputs();
  log.info("dppredict: measuring ", inputs.size(), " mask(s) on ", comm.size(),
           " rank(s): pixels > 127 are crack, components of at least ", o.min_crack_px, " px",
           o.pixel_size_mm > 0 ? str_cat(", ", o.pixel_size_mm, " mm per pixel") : std::string());

  ImageStages stages(o, 0, inputs, sinks);
  Share share(comm, inputs, o.quiet);
  const Share::Counts counts = share.walk(
      true, [&](size_t id) { return read_mask_file(inputs[id].path); },
      [&](size_t id, const data::Image& mask) {
        stages.measured(id, mask);
        share.done();
      },
      [] {});
  for (const auto& sink : sinks) sink->finish(comm);

  const fs::path out(o.out);
  log.info("dppredict: ", counts.done, " mask(s) measured in ", fixed(seconds_since(t0), 1), " s; ",
           (out / kMeasurementsFile).string(), ", ", (out / kSummaryFile).string());
  return share.exit_code(counts, "mask(s) measured");
}

}  // namespace

int run_predict(const PredictOptions& o, Comm& comm, const Logger& log,
                SegmentationMetrics* metrics_out) {
  if (o.measure_only) return run_measure_only(o, comm, log);
  const auto t0 = Clock::now();
  // --device auto: the GPU where this dppredict has the CUDA backend and every rank sees one.
  Device device(DeviceRequest{.device = o.device, .program = "dppredict", .allow_sharing = true},
                comm);
  const ThreadChoice threads =
      choose_threads(0, ThreadEnvironment::of_this_process(comm.local_size()));
  omp_set_num_threads(threads.threads);
  std::unique_ptr<Predictor> predictor;
  std::unique_ptr<InputSource> source;
  std::vector<std::unique_ptr<Sink>> sinks;
  collectively(comm, [&] {
    predictor = open_predictor(o, device);
    source = std::make_unique<InputSource>(o);
    sinks = make_sinks(o, source.get(), source->inputs().size(), comm.rank());
  });
  const std::vector<Input>& inputs = source->inputs();
  const Resampling resampling = choose_resampling(o, predictor->meta(), source->dataset());
  const Threshold threshold = choose_threshold(o, predictor->meta());
  log.info(start_line(o, *predictor, inputs.size(), comm.size(), device_name(device), threads,
                      resampling, threshold));
  // A dataset of resized photographs that keeps their masks: scored at their size, as validation.
  if (resampling.none() && source->use_photo_size())
    log.info("dppredict: samples scored at their photographs' ", source->dataset()->native_height(),
             "x", source->dataset()->native_width(), " (HxW; the dataset's /", o.split,
             "/native_masks), their probabilities resized as dptrain's validation resizes them");

  // Per input: read, resized to the network's scale (the photograph kept for the end), into the
  // tiled runner, whose batches finish images through the per-image stages.
  ImageStages stages(o, float(threshold.value), inputs, sinks);
  Share share(comm, inputs, o.quiet);
  struct InFlight {
    data::Image native;  // the photograph; empty where predicted at its own size
    std::vector<uint8_t> truth;
  };
  std::unordered_map<size_t, InFlight> in_flight;
  TiledRunner& runner = predictor->runner();
  const TiledRunner::Done finish = [&](size_t id, const data::Image& predicted,
                                       std::vector<float>& prob,
                                       const std::vector<float>& uncertainty) {
    const auto f = in_flight.find(id);
    stages.predicted(id, predicted, f->second.native, prob, uncertainty, f->second.truth);
    in_flight.erase(f);
    share.done();
  };
  const Share::Counts counts = share.walk(
      source->file_inputs(), [&](size_t id) { return source->read(id); },
      [&](size_t id, InputImage&& read) {
        InFlight& f = in_flight[id];
        f.truth = std::move(read.truth);
        f.native = std::move(read.photo);
        data::Image image = std::move(read.image);
        if (!resampling.none()) {
          const int width = std::max(1, int(std::lround(image.width * resampling.x)));
          const int height = std::max(1, int(std::lround(image.height * resampling.y)));
          f.native = std::move(image);
          image = data::resize_bilinear(f.native, width, height);
        }
        runner.submit(id, std::move(image), finish);
      },
      [&] { runner.flush(); });
  for (const auto& sink : sinks) sink->finish(comm);
  // Every rank finished: the counts sum over ranks.
  SegmentationMetrics total = o.scored() ? stages.scores(comm) : SegmentationMetrics();
  total.images = counts.done;

  const double seconds = seconds_since(t0);
  log.info("dppredict: ", total.images, " image(s) in ", fixed(seconds, 1), " s (",
           fixed(double(total.images) / std::max(seconds, 1e-9), 1), " img/s)",
           o.out.empty() ? std::string()
                         : str_cat("; masks in ", (fs::path(o.out) / kMaskDir).string()));
  const int exit_code = share.exit_code(counts, "image(s) predicted");
  if (o.scored()) log.info(scores_line(source->scored_set(), total, threshold.value, o.tolerance));
  if (metrics_out != nullptr) *metrics_out = total;
  return exit_code;
}

}  // namespace dp::app
