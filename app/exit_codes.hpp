// Exit statuses of dptrain, dppredict and dpprep: one table, each value with one meaning; and
// UsageError, the error that exits with kExitUsage.
#pragma once

#include "dp/error.hpp"

namespace dp::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // an error (one line says what, where, what was expected)
inline constexpr int kExitUsage = 2;    // bad options or input files the user must change
// dptrain: a non-finite loss or gradient norm, or a loss past --divergence-factor, stopped training
// (no checkpoint of it is written).
inline constexpr int kExitNonFinite = 3;
// dptrain: a collective waited longer than --stall-timeout (a rank stopped, hung or died).
inline constexpr int kExitStalled = 4;
// dptrain: another dptrain holds the --model-dir lock (its host, pid and Slurm job are named).
inline constexpr int kExitModelDirLocked = 5;
// dppredict: some inputs could not be read or predicted; every other input was predicted.
inline constexpr int kExitSomeInputsFailed = 6;
// dptrain: stopped by SIGTERM/SIGUSR1 after writing a resumable checkpoint (EX_TEMPFAIL).
inline constexpr int kExitPreempted = 75;
// dpprep: stopped by signal s (SIGINT, SIGTERM) before writing anything: 128 + s, as a shell.
inline constexpr int kExitSignalBase = 128;

// A command-line or configuration mistake: reported as one line, exit code 2, no MPI_Abort
// (every rank sees the same mistake).
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace dp::app
