// dppredict's work: inputs listed and split across ranks, tiled inference, PNG outputs, metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/log.hpp"
#include "eval/evaluation.hpp"
#include "predict/options.hpp"

namespace dp::app {

// The threshold of the validation's ODS F-measure that dptrain recorded for the checkpoint's last
// epoch (dppredict --threshold ods, dpexport's metadata); NaN if there is none.
double recorded_ods_threshold(const CheckpointMeta& meta);

// The images the options name, in order: each positional file; each positional folder's image
// files (.jpg .jpeg .png in any case, hidden files skipped), sorted by name; then each line of
// --list (blank lines and # comments skipped; relative paths from the current directory).
// A missing path, a folder without images or two inputs with one file stem (they would write
// the same mask) are dp::Errors naming them.
std::vector<std::string> list_inputs(const PredictOptions& options);

// Runs dppredict on this rank's share (inputs i with i % size == rank) and returns the exit code,
// the same on every rank: 0, or kExitSomeInputsFailed (exit_codes.hpp) when any rank met input
// files it could not read or decode. Such a file is one input's failure: the rank that meets it
// prints one line naming it ("dppredict: error: [rank r] ..."), writes nothing for it and goes on;
// rank 0 prints how many were predicted and how many failed. Everything else (options, paths
// that do not exist, the checkpoint, the output folder, writing an output, a --dataset read) is
// the run's failure: set-up problems and any rank's failure while predicting are reported once,
// by the lowest failing rank, through AgreedFailure (see agreement.hpp) on every rank.
// Outputs are written whole or not at all (temporary name, then rename). `metrics` (may be null)
// receives the reduced counts of a --dataset run.
int run_predict(const PredictOptions& options, Comm& comm, const Logger& log,
                SegmentationMetrics* metrics = nullptr);

}  // namespace dp::app
