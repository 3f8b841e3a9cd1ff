// dppredict's work: inputs listed and split across ranks, tiled inference, PNG outputs, metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/log.hpp"
#include "eval/evaluation.hpp"
#include "predict/inputs.hpp"
#include "predict/options.hpp"

namespace dp::app {

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
