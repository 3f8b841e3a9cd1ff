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
#include "option_table.hpp"

namespace po = boost::program_options;

namespace {

using dp::app::kExitOk;
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

// dpexport's command line: what to export, where, and how (ExportOptions).
struct ExportCommand : dp::app::ExportOptions {
  std::string checkpoint, out;
  bool fold_bn = false, keep_bn = false;  // fold_batchnorm, said either way
};

const dp::app::OptionTable<ExportCommand>& export_option_table() {
  using C = ExportCommand;
  static const dp::app::OptionTable<ExportCommand> table = [] {
    dp::app::OptionTable<ExportCommand> t;
    const std::string topic = "Options";
    t.value(topic, "checkpoint,c", &C::checkpoint, "dptrain checkpoint (.h5)").no_default();
    t.value(topic, "out,o", &C::out, "ONNX file to write (whole or not at all)").no_default();
    t.flag(topic, "prob", &C::prob, "also output `prob` = sigmoid(logits)");
    t.flag(topic, "raw-weights", &C::raw_weights,
           "the raw weights even where the checkpoint has averaged ones (--ema); by default the "
           "averages, as dppredict");
    t.value(topic, "input-scale", &C::input_scale,
            "pixel value of full intensity the model takes: 255 (pixels 0..255) or 1 (0..1)",
            {{[](float v) { return v == 255.0f || v == 1.0f; }, "must be 255 or 1"}});
    t.flag(topic, "keep-normalization", &C::keep_normalization,
           "do not fold the normalisation: the model takes (pixel / 255 - mean) / std, as the "
           "network itself");
    t.flag(topic, "fold-bn", &C::fold_bn,
           "fold batch norm into the convolution before it (the default)");
    t.flag(topic, "keep-bn", &C::keep_bn, "keep BatchNormalization nodes");
    t.command_line(topic, "help,h", "show this help");
    return t;
  }();
  return table;
}

int run(int argc, char** argv) {
  ExportCommand c;
  const auto bound = export_option_table().bind(c, kUsage);
  const po::variables_map vm = dp::app::read_command_line(argc, argv, bound.all);
  if (vm.count("help")) {
    std::cout << bound.visible << "\n";
    return kExitOk;
  }
  if (c.checkpoint.empty()) throw UsageError("--checkpoint is required (see --help)");
  if (c.out.empty()) throw UsageError("--out is required (see --help)");
  if (c.fold_bn && c.keep_bn) throw UsageError("give --fold-bn or --keep-bn, not both");
  export_option_table().check(c);
  if (c.keep_normalization && !vm["input-scale"].defaulted())
    throw UsageError("--input-scale has no effect with --keep-normalization");
  c.fold_batchnorm = !c.keep_bn;
  const dp::app::ExportOptions& o = c;
  const std::string& out = c.out;

  const dp::app::ExportSummary s = dp::app::export_onnx(c.checkpoint, out, o);
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
  return dp::app::run_program(kProgram, [&] { return run(argc, argv); });
}
