// dpexport's exporter: a dptrain checkpoint as an ONNX model (opset 17) that takes RGB pixels.
#pragma once

#include <cstdint>
#include <string>

namespace dp::app {

inline constexpr int kOnnxOpset = 17;
inline constexpr int64_t kOnnxIrVersion = 8;  // the IR version of opset 17 (ONNX 1.12)

struct ExportOptions {
  bool prob = false;         // a second output `prob`, the sigmoid of `logits`
  bool raw_weights = false;  // the raw weights even where the checkpoint has averaged ones (--ema)
  // false: the input normalisation is folded in and the model takes pixels scaled by
  // `input_scale`; true: the model takes normalised input, as the network itself does.
  bool keep_normalization = false;
  bool fold_batchnorm = true;  // batch norm folded into the convolution before it
  float input_scale = 255.0f;  // the pixel value of full intensity: 255 (0..255) or 1 (0..1)
};

// What was exported, for dpexport's summary line and the tests.
struct ExportSummary {
  std::string model;  // e.g. "unet16"
  int width_divisor = 1;
  bool deconv = false;
  bool averaged = false;  // the checkpoint's averaged weights
  int nodes = 0;          // ONNX nodes
  int batchnorm_folded = 0, batchnorm_kept = 0;
  int64_t parameters = 0;  // floats in the initializers
  int size_multiple = 32;  // input height and width must be multiples of it
  int64_t bytes = 0;       // of the serialised model
};

// Writes the ONNX model of `checkpoint` to `out`, whole or not at all (a temporary name, fsync,
// rename). Throws dp::Error naming the checkpoint when it is missing, foreign, damaged or of an
// unknown model, or naming `out` when it cannot be written.
ExportSummary export_onnx(const std::string& checkpoint, const std::string& out,
                          const ExportOptions& options);

}  // namespace dp::app
