// dpexport: writes a dptrain checkpoint as an ONNX model (ONNX Runtime, TensorRT, OpenCV DNN).
#include <boost/program_options.hpp>

#include <exception>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dp/error.hpp"
#include "error_lines.hpp"
#include "exit_codes.hpp"
#include "export/onnx_export.hpp"
#include "placeholders.hpp"

namespace po = boost::program_options;

namespace {

using dp::app::kExitFailure;
using dp::app::kExitOk;
using dp::app::kExitUsage;
using dp::app::UsageError;
constexpr const char* kProgram = "dpexport";
constexpr double kMillion = 1e6;

constexpr const char* kUsage =
    "Usage: dpexport -c CHECKPOINT -o MODEL.onnx [options]\n"
    "Writes the checkpoint's model as ONNX (opset 17). Input `image`: float32 NCHW, RGB, batch,\n"
    "height and width dynamic (multiples of 32 for unet16, of 64 for the ResNet UNets); by\n"
    "default pixels 0..255 (the checkpoint's normalisation is folded in). Output `logits`:\n"
    "[batch, 1, height, width]; crack where sigmoid(logits) >= the `threshold` in the model's\n"
    "metadata (the checkpoint's validation ODS threshold; empty when it records none)";

int run(int argc, char** argv) {
  std::string checkpoint, out;
  float input_scale = 255.0f;
  dp::app::ExportOptions o;
  bool fold_bn = false, keep_bn = false;
  po::options_description desc(kUsage);
  desc.add_options()("checkpoint,c", po::value(&checkpoint), "dptrain checkpoint (.h5)")(
      "out,o", po::value(&out), "ONNX file to write (whole or not at all)")(
      "prob", po::bool_switch(&o.prob), "also output `prob` = sigmoid(logits)")(
      "raw-weights", po::bool_switch(&o.raw_weights),
      "the raw weights even where the checkpoint has averaged ones (--ema); by default the "
      "averages, as dppredict")(
      "input-scale", po::value(&input_scale)->default_value(input_scale),
      "pixel value of full intensity the model takes: 255 (pixels 0..255) or 1 (0..1)")(
      "keep-normalization", po::bool_switch(&o.keep_normalization),
      "do not fold the normalisation: the model takes (pixel / 255 - mean) / std, as the "
      "network itself")("fold-bn", po::bool_switch(&fold_bn),
                        "fold batch norm into the convolution before it (the default)")(
      "keep-bn", po::bool_switch(&keep_bn), "keep BatchNormalization nodes")("help,h",
                                                                             "show this help");
  dp::app::refuse_placeholders_in_argv(argc, argv);
  // Words that are not options are collected under a hidden name and refused.
  constexpr const char* kStray = "stray-arguments";
  std::vector<std::string> stray;
  po::options_description all;
  all.add(desc).add_options()(kStray, po::value(&stray));
  po::positional_options_description positional;
  positional.add(kStray, -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(dp::str_cat(e.what(), " (see --help)"));
  }
  if (!stray.empty())
    throw UsageError(dp::str_cat("unexpected argument '", stray[0], "' (see --help)"));
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return kExitOk;
  }
  if (checkpoint.empty()) throw UsageError("--checkpoint is required (see --help)");
  if (out.empty()) throw UsageError("--out is required (see --help)");
  if (fold_bn && keep_bn) throw UsageError("give --fold-bn or --keep-bn, not both");
  if (input_scale != 255.0f && input_scale != 1.0f)
    throw UsageError(dp::str_cat("--input-scale must be 255 or 1, got ", input_scale));
  if (o.keep_normalization && !vm["input-scale"].defaulted())
    throw UsageError("--input-scale has no effect with --keep-normalization");
  o.fold_batchnorm = !keep_bn;
  o.input_scale = input_scale;

  const dp::app::ExportSummary s = dp::app::export_onnx(checkpoint, out, o);
  std::ostringstream bn;
  if (s.batchnorm_folded + s.batchnorm_kept > 0)
    bn << ", " << s.batchnorm_folded << " batch norms folded, " << s.batchnorm_kept << " kept";
  std::cout << kProgram << ": wrote " << out << " (" << s.model << " /" << s.width_divisor
            << (s.deconv ? " deconv" : "") << ", " << (s.averaged ? "averaged" : "raw")
            << " weights, " << s.nodes << " nodes, " << std::setprecision(3)
            << double(s.parameters) / kMillion << "M parameters" << bn.str() << ", input "
            << (o.keep_normalization ? std::string("normalised")
                                     : dp::str_cat("RGB 0..", int(o.input_scale)))
            << ", sides multiples of " << s.size_multiple << ")\n";
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    dp::app::print_error_lines(kProgram, e.what());
    return kExitFailure;
  }
}
