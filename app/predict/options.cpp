// Parsing and validation of dppredict's options (Boost.Program_options).
#include "predict/options.hpp"

#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "device.hpp"
#include "placeholders.hpp"
#include "predict/tiling.hpp"

namespace dp::app {
namespace po = boost::program_options;
namespace {

// "N" or "HxW" (pixels).
void parse_tile(const std::string& text, int& height, int& width) {
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
  height = h;
  width = w;
}

// "auto" (0, 0), "S" (both axes) or "SXxSY" (as dpprep's --resize WxH: x first), each in
// (0, kMaxScale].
void parse_scale(const std::string& text, double& scale_y, double& scale_x) {
  constexpr double kMaxScale = 16;
  if (text == "auto") {
    scale_y = scale_x = 0;
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
  scale_y = y;
  scale_x = x;
}

}  // namespace

std::optional<PredictOptions> parse_predict_options(int argc, const char* const* argv,
                                                    bool print_help) {
  PredictOptions o;
  std::string tile, threshold, scale;
  po::options_description in("Input");
  in.add_options()("checkpoint,c", po::value(&o.checkpoint),
                   "trained model: model_best.h5 or model_epoch_<N>.h5 (required)")(
      "list", po::value(&o.list), "text file naming one image per line (# comments)")(
      "dataset", po::value(&o.dataset),
      "dataset v1 HDF5 file instead of images; its masks give IoU, Dice, precision, recall")(
      "split", po::value(&o.split)->default_value(o.split), "split of --dataset: train or val")(
      "masks", po::value(&o.masks),
      "folder of the true masks of the image inputs (<stem>.png or another image type; pixels "
      "> 127 are crack), at the images' sizes: IoU, Dice, precision, recall, ODS/OIS/AP as "
      "with --dataset, at the photographs' own resolution");
  po::options_description out("Output");
  out.add_options()("out,o", po::value(&o.out),
                    "output folder: masks/, prob/ and overlay/ (optional with --dataset)")(
      "threshold", po::value(&threshold)->default_value("auto"),
      "probability above which a pixel is a crack; auto: the threshold of the best F-measure "
      "over the validation split that dptrain recorded for the checkpoint's epoch, 0.5 where "
      "none was recorded; ods: that recorded threshold or an error")(
      "tolerance", po::value(&o.tolerance)->default_value(o.tolerance),
      "with --dataset or --masks: ODS/OIS/AP count a predicted crack pixel within this many pixels "
      "of a "
      "true one as right, and a true one with a prediction this close as found")(
      "save-prob", po::bool_switch(&o.save_prob),
      "also write the probability map (prob/), as --prob-format says")(
      "prob-format", po::value(&o.prob_format)->default_value(o.prob_format),
      "png16: 16-bit PNG of round(p x 65535); png8: 8-bit PNG of round(p x 255); tiff32: "
      "32-bit float TIFF of p (prob/<name>.tif)")(
      "save-uncertainty", po::bool_switch(&o.save_uncertainty),
      "with --tta: also write the per-pixel standard deviation of the probability over the "
      "variants (uncertainty/, 16-bit PNG of round(sd x 131070): 65535 is the largest possible "
      "sd, 0.5)")("overlay", po::bool_switch(&o.overlay),
                  "also write the image with crack pixels tinted red (overlay/)")(
      "quiet,q", po::bool_switch(&o.quiet), "no progress bar or progress lines")(
      "raw-weights", po::bool_switch(&o.raw_weights),
      "use the checkpoint's raw weights where it also holds averaged ones (dptrain --ema; "
      "those are the default)");
  po::options_description measure("Crack measurements");
  measure.add_options()(
      "measure", po::bool_switch(&o.measure),
      "also measure every crack of every mask (8-connected component): skeleton length, mean, "
      "median and maximum width, area, bounding box and widest point, into OUT/measurements.csv "
      "(one row per crack) and OUT/summary.csv (one row per image); with --overlay the skeleton "
      "and the widest points are drawn")(
      "measure-only", po::bool_switch(&o.measure_only),
      "the inputs are masks (pixels > 127 are crack, as dpprep reads them): measure them into "
      "OUT/measurements.csv and OUT/summary.csv; no checkpoint")(
      "pixel-size", po::value(&o.pixel_size_mm),
      "millimetres per pixel: the measurements also in mm (columns *_mm, area_mm2)")(
      "min-crack-px", po::value(&o.min_crack_px)->default_value(o.min_crack_px),
      "8-connected components of fewer pixels are specks, not cracks: cleared from the masks "
      "(and so from the overlays, the mask scores of --dataset and the measurements; 1 keeps "
      "every pixel above the threshold)")(
      "per-image", po::value(&o.per_image),
      "with --dataset or --masks: write this CSV file, one row of scores per sample (source "
      "file and tile position where dpprep stored them, pixel counts, IoU, F1, precision, recall, "
      "clDice, the "
      "sample's best F over the thresholds)");
  po::options_description run("Inference");
  run.add_options()("tta", po::value(&o.tta)->default_value(o.tta),
                    "test-time augmentation: none; flips (each tile also flipped left-right, "
                    "up-down and both: 4x the time); dihedral (and transposed: 8x, square tiles "
                    "only); the probabilities are averaged")(
      "scale", po::value(&scale)->default_value("auto"),
      "network pixels per input pixel: auto (the default) resizes every image as dpprep build "
      "--resize resized the training photographs (the scale dptrain recorded in the checkpoint; "
      "1 where none was recorded, or relative to --dataset's own), predicts, and brings the "
      "probabilities back to the image's size; S (both axes) or SXxSY (x first, as --resize WxH) "
      "instead; 1 predicts at the images' own resolution")(
      "tile", po::value(&tile),
      "tile size N or HxW (default: the size the checkpoint was trained on)")(
      "overlap", po::value(&o.overlap),
      "pixels shared by neighbouring tiles (default: a quarter of the tile)")(
      "margin", po::value(&o.margin)->default_value(o.margin),
      "pixels of reflected context added around every image, so that no image border meets the "
      "network's zero padding at a tile border (0: borders flush, as whole training images were; "
      "docs/real-data.md)")("batch-size,b", po::value(&o.batch_size)->default_value(o.batch_size),
                            "tiles per forward pass (fewer where they would hold more than a "
                            "megapixel: a large tile runs alone)")(
      "cpu-conv", po::value(&o.cpu_conv)->default_value(o.cpu_conv),
      "3x3 convolutions: shape (the default: Winograd for the layers whose channels pay for it, "
      "cin*cout/(cin+cout) >= 20, with at least 0.2 GFLOP a pass; layers with 4 or 8 output "
      "channels as packed pixels; direct for the others; chosen by shape, so every run on this "
      "CPU uses the same kernels), direct (oneDNN's direct kernels "
      "only), auto (whichever is faster when timed at first use: direct, Winograd or direct on "
      "oneDNN's blocked layout, or GEMMs: shifted or Winograd; the timing costs more than it "
      "saves unless a command predicts many photographs), winograd (AVX-512 CPUs only; elsewhere "
      "an error), blocked, gemm or gemm-winograd; bench/README.md has the measurements")(
      "device", po::value(&o.device)->default_value(o.device),
      "auto (a GPU where every rank sees one, else the CPU), cpu or cuda (GPU = node-local rank "
      "modulo the visible GPUs; ranks may share one)")(
      "precision", po::value(&o.precision)->default_value(o.precision),
      "fp32, or bf16: activations in bf16 and convolutions on bf16 operands (about 2x faster on "
      "CPUs with AVX512-BF16 or AMX; probabilities differ in the third digit)")("help,h",
                                                                                "show this help");
  po::options_description hidden;
  hidden.add_options()("input", po::value(&o.inputs)->composing(), "images or folders");
  po::positional_options_description positional;
  positional.add("input", -1);
  po::options_description visible(
      "Usage: [mpirun -np N] dppredict -c CHECKPOINT -o OUT [options] IMAGE|FOLDER...\n"
      "       [mpirun -np N] dppredict -c CHECKPOINT --dataset FILE.h5 [--split val] [-o OUT]\n"
      "       [mpirun -np N] dppredict --measure-only -o OUT [--pixel-size MM] MASK|FOLDER...\n"
      "Writes OUT/masks/<name>.png (0 or 255) for every image; the files are split across "
      "ranks");
  visible.add(in).add(out).add(measure).add(run);
  po::options_description all;
  all.add(visible).add(hidden);

  for (int i = 1; i < argc; ++i)
    if (const std::string word = boost_placeholder_in(argv[i]); !word.empty())
      throw UsageError(str_cat("argument '", argv[i], "': '", word, "' is not allowed in options"));
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(str_cat(e.what(), " (see --help)"));
  }
  if (vm.count("help")) {
    if (print_help) std::cout << visible << "\n";
    return std::nullopt;
  }
  auto require = [](bool ok, auto&&... msg) {
    if (!ok) throw UsageError(str_cat(msg...));
  };
  const bool files = !o.inputs.empty() || !o.list.empty();
  if (vm.count("pixel-size"))
    require(o.pixel_size_mm > 0 && std::isfinite(o.pixel_size_mm),
            "--pixel-size must be a positive number of millimetres per pixel, got ",
            o.pixel_size_mm);
  require(o.min_crack_px >= 1, "--min-crack-px must be at least 1, got ", o.min_crack_px);
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
  require(o.split == "train" || o.split == "val", "--split must be train or val, got '", o.split,
          "'");
  using Rule = PredictOptions::ThresholdRule;
  o.threshold_rule = threshold == "auto"  ? Rule::kAuto
                     : threshold == "ods" ? Rule::kOds
                                          : Rule::kValue;
  if (o.threshold_rule == Rule::kValue) {
    char* end = nullptr;
    o.threshold = std::strtod(threshold.c_str(), &end);
    require(!threshold.empty() && *end == '\0' && o.threshold > 0 && o.threshold < 1,
            "--threshold must be in (0, 1), auto or ods, got '", threshold, "'");
  }
  require(o.tolerance >= 0 && o.tolerance <= 32, "--tolerance must be in [0, 32] pixels, got ",
          o.tolerance);
  require(o.batch_size >= 1, "--batch-size must be at least 1, got ", o.batch_size);
  parse_cpu_conv(o.cpu_conv);
  require(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
          "--device must be auto, cpu or cuda, got '", o.device, "'");
  parse_precision(o.precision);
  require(vm.count("overlap") == 0 || o.overlap >= 0, "--overlap must be >= 0, got ", o.overlap);
  require(o.margin >= 0 && o.margin <= 4096, "--margin must be in [0, 4096] pixels, got ",
          o.margin);
  require(!(o.out.empty() && (o.save_prob || o.overlay || o.measure)),
          "--save-prob, --overlay and --measure need --out");
  require(o.per_image.empty() || o.scored(), "--per-image needs --dataset or --masks");
  require(o.masks.empty() || files, "--masks scores image inputs (files, folders, --list)");
  if (!o.masks.empty()) {
    std::error_code ec;
    require(std::filesystem::is_directory(o.masks, ec), "--masks '", o.masks, "' is not a folder");
  }
  parse_scale(scale, o.scale_y, o.scale_x);
  require(o.prob_format == "png16" || o.prob_format == "png8" || o.prob_format == "tiff32",
          "--prob-format must be png16, png8 or tiff32, got '", o.prob_format, "'");
  parse_tta(o.tta);
  require(!o.save_uncertainty || o.tta != "none",
          "--save-uncertainty needs --tta flips or dihedral (the deviation over its variants)");
  require(!(o.out.empty() && o.save_uncertainty), "--save-uncertainty needs --out");
  if (!tile.empty()) parse_tile(tile, o.tile_height, o.tile_width);
  return o;
}

}  // namespace dp::app
