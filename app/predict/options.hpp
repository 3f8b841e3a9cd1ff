// dppredict's options: the PredictOptions record and its parser (one table of options,
// options.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "device.hpp"  // DeviceChoice
#include "dp/backend.hpp"
#include "predict/tiling.hpp"

namespace dp::app {

struct PredictOptions {
  std::string checkpoint;           // model_best.h5 or model_epoch_<N>.h5
  std::vector<std::string> inputs;  // image files and folders (positional arguments)
  std::string list;                 // a text file naming one image per line
  std::string dataset;              // or a dataset v1 file (masks give metrics)
  std::string split = "val";        // its split
  std::string masks;  // folder of the image inputs' true masks (same stem): scores as --dataset's
  std::string out;    // output folder (optional with --dataset: metrics only)
  // --threshold: auto (the default) takes the validation ODS threshold dptrain recorded for the
  // checkpoint's epoch where there is one, else 0.5; ods insists on the recorded one; a number
  // in (0, 1) is used as given.
  enum class ThresholdRule { kAuto, kOds, kValue };
  ThresholdRule threshold_rule = ThresholdRule::kAuto;
  double threshold = 0.5;  // kValue: probability above which a pixel is a crack
  int tolerance = 0;       // --dataset: pixels of tolerance of ODS/OIS/AP (eval/sweep_metrics.hpp)
  bool save_prob = false;  // also write the probability map (prob/)
  std::string prob_format = "png16";    // png16 (p x 65535) | png8 (p x 255)
  bool save_uncertainty = false;        // with --tta: the variants' deviation (uncertainty/)
  Tta tta = Tta::kNone;                 // test-time augmentation (predict/tiling.hpp)
  bool overlay = false;                 // also write the image with crack pixels tinted
  int tile_height = 0, tile_width = 0;  // 0: the checkpoint's training size
  int overlap = -1;                     // pixels; -1: a quarter of the smaller tile side
  int margin = 0;                       // pixels of reflected context around every image
  // --scale: network input pixels per input pixel, along y and x; 0: auto (the training set's
  // scale recorded in the checkpoint, relative to a --dataset's own).
  double scale_y = 0, scale_x = 0;
  int batch_size = 4;                          // tiles per forward pass
  CpuConvAlgo cpu_conv = CpuConvAlgo::kShape;  // 3x3 convolution kernels (bench/README)
  Precision precision = Precision::kFloat32;   // of the activations (dptrain's --precision)
  DeviceChoice device = DeviceChoice::kAuto;   // the GPU where every rank sees one, else the CPU
  bool quiet = false;                          // no progress bar or lines
  bool raw_weights = false;  // the raw weights where the checkpoint also has averaged ones
  // Crack measurements (predict/measurements.hpp): OUT/measurements.csv and OUT/summary.csv.
  bool measure = false;
  bool measure_only = false;  // the inputs are masks (> 127: crack): measured, no checkpoint
  double pixel_size_mm = 0;   // --pixel-size: millimetres per pixel; 0: pixels only
  int64_t min_crack_px = 32;  // smaller 8-connected components are specks: cleared, not measured
  std::string per_image;      // --dataset: a CSV with one row of scores per sample

  bool from_dataset() const { return !dataset.empty(); }
  bool scored() const { return from_dataset() || !masks.empty(); }  // true masks given
};

// Parses argv. Returns nullopt after printing --help. Throws UsageError on any bad value.
std::optional<PredictOptions> parse_predict_options(int argc, const char* const* argv,
                                                    bool print_help);

}  // namespace dp::app
