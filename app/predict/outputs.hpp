// dppredict's outputs: one small sink per kind of file, each fed every finished image and, at the
// end, collectively finished (the CSV files, written by rank 0 in input order).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dp/comm.hpp"
#include "dp/crack_measure.hpp"
#include "dp/image_io.hpp"
#include "predict/inputs.hpp"
#include "predict/options.hpp"

namespace dp::app {

// The files and folders of OUT.
inline constexpr const char* kMaskDir = "masks";
inline constexpr const char* kMeasurementsFile = "measurements.csv";
inline constexpr const char* kSummaryFile = "summary.csv";

// One finished image at its own size, as the per-image stages left it.
struct PredictedImage {
  size_t id = 0;  // its input's
  const Input* input = nullptr;
  const data::Image* photo = nullptr;                // null for --measure-only
  const std::vector<float>* probability = nullptr;   // null for --measure-only
  const std::vector<float>* uncertainty = nullptr;   // --save-uncertainty, else null
  const std::vector<uint8_t>* mask = nullptr;        // 0 or 1 per pixel, specks cleared
  int height = 0, width = 0;                         // of the mask
  const std::vector<uint8_t>* truth = nullptr;       // its true mask (0/1), or null
  const std::vector<data::Crack>* cracks = nullptr;  // --measure, else null
  const std::vector<uint8_t>* skeleton = nullptr;    // --measure, else null
};

class Sink {
 public:
  virtual ~Sink() = default;
  // Writes or records one image (no collectives; a failed write throws dp::Error).
  virtual void add(const PredictedImage& image) = 0;
  // After every rank's last add (collective).
  virtual void finish(Comm& comm) { (void)comm; }
};

// The sinks the options ask for, their folders made on rank 0 (dp::Error where one cannot be
// written): masks/, prob/, uncertainty/, overlay/, measurements.csv and summary.csv, --per-image.
// `inputs` names every input (the CSV rows are kept by input, written in input order).
std::vector<std::unique_ptr<Sink>> make_sinks(const PredictOptions& options,
                                              const InputSource* source, size_t inputs, int rank);

// Writes a file whole or not at all: written under a temporary name and renamed into place, so
// that a failed write (e.g. a full disk) or a kill never leaves a truncated file under an
// output's name.
void write_file_whole(const std::string& path, const void* data, size_t size);

}  // namespace dp::app
