// dppredict's options declared once (the option table) and the checks between them.
#include "predict/options.hpp"

#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "device.hpp"
#include "option_table.hpp"
#include "placeholders.hpp"
#include "predict/tiling.hpp"

namespace dp::app {
namespace po = boost::program_options;
namespace {

// --tile "N" or "HxW" (pixels).
void parse_tile(PredictOptions& o, const std::string& text) {
  int h = 0, w = 0;
  char x = 0, extra = 0;
  const int n = std::sscanf(text.c_str(), "%d%c%d%c", &h, &x, &w, &extra);
  if (n == 1) {
    w = h;
  } else if (n != 3 || (x != 'x' && x != 'X')) {
    throw UsageError(str_cat("--tile must be N or HxW (pixels), got '", text, "'"));
  }
  if (h <= 0 || w <= 0)
    throw UsageError(str_cat("--tile sides must be positive, got '", text, "'"));
  o.tile_height = h;
  o.tile_width = w;
}

// --scale "auto" (0, 0), "S" (both axes) or "SXxSY" (as dpprep's --resize WxH: x first), each in
// (0, kMaxScale].
void parse_scale(PredictOptions& o, const std::string& text) {
  constexpr double kMaxScale = 16;
  if (text == "auto") {
    o.scale_y = o.scale_x = 0;
    return;
  }
  double x = 0, y = 0;
  char sep = 0, extra = 0;
  const int n = std::sscanf(text.c_str(), "%lf%c%lf%c", &x, &sep, &y, &extra);
  if (n == 1) {
    y = x;
  } else if (n != 3 || (sep != 'x' && sep != 'X')) {
    throw UsageError(str_cat("--scale must be auto, S or SXxSY, got '", text, "'"));
  }
  if (!(x > 0 && x <= kMaxScale && y > 0 && y <= kMaxScale))
    throw UsageError(str_cat("--scale factors must be in (0, ", kMaxScale, "], got '", text, "'"));
  o.scale_y = y;
  o.scale_x = x;
}

// --threshold auto, ods or a probability in (0, 1).
void parse_threshold(PredictOptions& o, const std::string& text) {
  using Rule = PredictOptions::ThresholdRule;
  o.threshold_rule = text == "auto" ? Rule::kAuto : text == "ods" ? Rule::kOds : Rule::kValue;
  if (o.threshold_rule != Rule::kValue) return;
  char* end = nullptr;
  o.threshold = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(o.threshold > 0 && o.threshold < 1))
    throw UsageError(str_cat("--threshold must be in (0, 1), auto or ods, got '", text, "'"));
}

// Every option of dppredict, by topic as --help shows them.
OptionTable<PredictOptions> make_predict_option_table() {
  using O = PredictOptions;
  OptionTable<O> t;
  const std::string in = "Input";
  t.value(in, "checkpoint,c", &O::checkpoint,
          "trained model: model_best.h5 or model_epoch_<N>.h5 (required)")
      .no_default();
  t.value(in, "list", &O::list, "text file naming one image per line (# comments)").no_default();
  t.value(in, "dataset", &O::dataset,
          "dataset v1 HDF5 file instead of images; its masks give IoU, Dice, precision, recall")
      .no_default();
  t.value(in, "split", &O::split, "split of --dataset: train or val", {one_of({"train", "val"})});
  t.value(in, "masks", &O::masks,
          "folder of the true masks of the image inputs (<stem>.png or another image type; "
          "pixels > 127 are crack), at the images' sizes: IoU, Dice, precision, recall, "
          "ODS/OIS/AP as with --dataset, at the photographs' own resolution")
      .no_default();

  const std::string out = "Output";
  t.value(out, "out,o", &O::out,
          "output folder: masks/, prob/ and overlay/ (optional with --dataset)")
      .no_default();
  t.parsed(out, "threshold", "auto", parse_threshold,
           "probability above which a pixel is a crack; auto: the threshold of the best "
           "F-measure over the validation split that dptrain recorded for the checkpoint's "
           "epoch, 0.5 where none was recorded; ods: that recorded threshold or an error");
  t.value(out, "tolerance", &O::tolerance,
          "with --dataset or --masks: ODS/OIS/AP count a predicted crack pixel within this many "
          "pixels of a true one as right, and a true one with a prediction this close as found",
          {in_range(0, 32, " pixels")});
  t.flag(out, "save-prob", &O::save_prob,
         "also write the probability map (prob/), as --prob-format says");
  t.value(out, "prob-format", &O::prob_format,
          "png16: 16-bit PNG of round(p x 65535); png8: 8-bit PNG of round(p x 255); tiff32: "
          "32-bit float TIFF of p (prob/<name>.tif)",
          {one_of({"png16", "png8", "tiff32"})});
  t.flag(out, "save-uncertainty", &O::save_uncertainty,
         "with --tta: also write the per-pixel standard deviation of the probability over the "
         "variants (uncertainty/, 16-bit PNG of round(sd x 131070): 65535 is the largest "
         "possible sd, 0.5)");
  t.flag(out, "overlay", &O::overlay,
         "also write the image with crack pixels tinted red (overlay/)");
  t.flag(out, "quiet,q", &O::quiet, "no progress bar or progress lines");
  t.flag(out, "raw-weights", &O::raw_weights,
         "use the checkpoint's raw weights where it also holds averaged ones (dptrain --ema; "
         "those are the default)");

  const std::string measure = "Crack measurements";
  t.flag(measure, "measure", &O::measure,
         "also measure every crack of every mask (8-connected component): skeleton length, "
         "mean, median and maximum width, area, bounding box and widest point, into "
         "OUT/measurements.csv (one row per crack) and OUT/summary.csv (one row per image); with "
         "--overlay the skeleton and the widest points are drawn");
  t.flag(measure, "measure-only", &O::measure_only,
         "the inputs are masks (pixels > 127 are crack, as dpprep reads them): measure them into "
         "OUT/measurements.csv and OUT/summary.csv; no checkpoint");
  t.value(measure, "pixel-size", &O::pixel_size_mm,
          "millimetres per pixel: the measurements also in mm (columns *_mm, area_mm2)")
      .no_default();
  t.value(measure, "min-crack-px", &O::min_crack_px,
          "8-connected components of fewer pixels are specks, not cracks: cleared from the masks "
          "(and so from the overlays, the mask scores of --dataset and the measurements; 1 keeps "
          "every pixel above the threshold)",
          {at_least(int64_t(1))});
  t.value(measure, "per-image", &O::per_image,
          "with --dataset or --masks: write this CSV file, one row of scores per sample (source "
          "file and tile position where dpprep stored them, pixel counts, IoU, F1, precision, "
          "recall, clDice, the sample's best F over the thresholds)")
      .no_default();

  const std::string run = "Inference";
  t.choice(run, "tta", &O::tta, tta_words(),
           "test-time augmentation: none; flips (each tile also flipped left-right, up-down and "
           "both: 4x the time); dihedral (and transposed: 8x, square tiles only); the "
           "probabilities are averaged");
  t.parsed(run, "scale", "auto", parse_scale,
           "network pixels per input pixel: auto (the default) resizes every image as dpprep "
           "build --resize resized the training photographs (the scale dptrain recorded in the "
           "checkpoint; 1 where none was recorded, or relative to --dataset's own), predicts, and "
           "brings the probabilities back to the image's size; S (both axes) or SXxSY (x first, "
           "as --resize WxH) instead; 1 predicts at the images' own resolution");
  t.parsed(run, "tile", "", parse_tile,
           "tile size N or HxW (default: the size the checkpoint was trained on)");
  t.value(run, "overlap", &O::overlap,
          "pixels shared by neighbouring tiles (default: a quarter of the tile)")
      .no_default();
  t.value(run, "margin", &O::margin,
          "pixels of reflected context added around every image, so that no image border meets "
          "the network's zero padding at a tile border (0: borders flush, as whole training "
          "images were; docs/real-data.md)",
          {in_range(0, 4096, " pixels")});
  t.value(run, "batch-size,b", &O::batch_size,
          "tiles per forward pass (fewer where they would hold more than a megapixel: a large "
          "tile runs alone)",
          {at_least(1)});
  t.choice(run, "cpu-conv", &O::cpu_conv, cpu_conv_words(),
           "3x3 convolutions: shape (the default: Winograd for the layers whose channels pay for "
           "it, cin*cout/(cin+cout) >= 20, with at least 0.2 GFLOP a pass; layers with 4 or 8 "
           "output channels as packed pixels; direct for the others; chosen by shape, so every "
           "run on this CPU uses the same kernels), direct (oneDNN's direct kernels only), auto "
           "(whichever is faster when timed at first use: direct, Winograd or direct on oneDNN's "
           "blocked layout, or GEMMs: shifted or Winograd; the timing costs more than it saves "
           "unless a command predicts many photographs), winograd (AVX-512 CPUs only; elsewhere "
           "an error), blocked, gemm or gemm-winograd; bench/README.md has the measurements");
  t.choice(run, "device", &O::device, device_words(),
           "auto (a GPU where every rank sees one, else the CPU), cpu or cuda (GPU = node-local "
           "rank modulo the visible GPUs; ranks may share one)");
  t.choice(run, "precision", &O::precision, precision_words(),
           "fp32, or bf16: activations in bf16 and convolutions on bf16 operands (about 2x faster "
           "on CPUs with AVX512-BF16 or AMX; probabilities differ in the third digit)");
  t.command_line(run, "help,h", "show this help");
  t.value("", "input", &O::inputs, "images or folders");
  return t;
}

}  // namespace

std::optional<PredictOptions> parse_predict_options(int argc, const char* const* argv,
                                                    bool print_help) {
  PredictOptions o;
  static const OptionTable<PredictOptions> table = make_predict_option_table();
  auto bound = table.bind(
      o,
      "Usage: [mpirun -np N] dppredict -c CHECKPOINT -o OUT [options] IMAGE|FOLDER...\n"
      "       [mpirun -np N] dppredict -c CHECKPOINT --dataset FILE.h5 [--split val] [-o OUT]\n"
      "       [mpirun -np N] dppredict --measure-only -o OUT [--pixel-size MM] MASK|FOLDER...\n"
      "Writes OUT/masks/<name>.png (0 or 255) for every image; the files are split across "
      "ranks");
  const po::variables_map vm = read_command_line(argc, argv, bound.all, {"input"});
  if (vm.count("help")) {
    if (print_help) std::cout << bound.visible << "\n";
    return std::nullopt;
  }
  table.check(o);
  // What one option's rules cannot say: options given or not, and options that depend on each
  // other.
  const bool files = !o.inputs.empty() || !o.list.empty();
  if (vm.count("pixel-size"))
    require(o.pixel_size_mm > 0 && std::isfinite(o.pixel_size_mm),
            "--pixel-size must be a positive number of millimetres per pixel, got ",
            o.pixel_size_mm);
  require(o.measure || o.measure_only || !vm.count("pixel-size"),
          "--pixel-size needs --measure or --measure-only");
  if (o.measure_only) {
    require(files, "--measure-only: give mask files or folders (or --list FILE)");
    require(!o.out.empty(), "--measure-only needs --out (the folder of the CSV files)");
    require(!o.from_dataset() && o.checkpoint.empty() && o.masks.empty(),
            "--measure-only measures masks: no --checkpoint, --dataset or --masks");
    require(!o.save_prob && !o.overlay, "--measure-only writes no --save-prob or --overlay");
    return o;
  }
  require(!o.checkpoint.empty(), "--checkpoint is required (see --help)");
  require(files || o.from_dataset(),
          "nothing to predict: give images or folders, --list FILE, or --dataset FILE.h5");
  require(!(files && o.from_dataset()),
          "give either images (folders, --list) or --dataset, not both");
  require(o.from_dataset() || !o.out.empty(), "--out is required for images (see --help)");
  require(vm.count("overlap") == 0 || o.overlap >= 0, "--overlap must be >= 0, got ", o.overlap);
  require(!(o.out.empty() && (o.save_prob || o.overlay || o.measure)),
          "--save-prob, --overlay and --measure need --out");
  require(o.per_image.empty() || o.scored(), "--per-image needs --dataset or --masks");
  require(o.masks.empty() || files, "--masks scores image inputs (files, folders, --list)");
  if (!o.masks.empty()) {
    std::error_code ec;
    require(std::filesystem::is_directory(o.masks, ec), "--masks '", o.masks, "' is not a folder");
  }
  require(!o.save_uncertainty || o.tta != Tta::kNone,
          "--save-uncertainty needs --tta flips or dihedral (the deviation over its variants)");
  require(!(o.out.empty() && o.save_uncertainty), "--save-uncertainty needs --out");
  return o;
}

}  // namespace dp::app
