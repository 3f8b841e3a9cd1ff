// Rank 0's training progress: a bar redrawn in place on a terminal, or a plain line every
// --log-every steps (Slurm logs): epoch, step, loss, images/s, ETA of the epoch.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dp::app {

// --progress auto: a bar only when stdout and stderr are both terminals. (Open MPI gives every
// rank a pseudo-terminal stdout whatever mpirun's own stdout is, but stderr a pipe; so under
// mpirun auto means lines, and --progress bar asks for the bar.)
bool use_progress_bar(const std::string& mode, bool stdout_tty, bool stderr_tty);

struct ProgressState {
  int64_t epoch = 0, epochs = 0;  // 1-based epoch of epochs
  int64_t step = 0, steps = 0;    // optimiser steps done in the epoch, of its total
  double loss = 0;                // mean training loss of the epoch so far (rank 0's)
  double images_per_s = 0;        // global images per second in this run of the epoch
  double eta_seconds = 0;         // to the end of the epoch at the current pace
};

// "epoch 2/10 [#########...........] 13/40  loss 0.4123  85.3 img/s  ETA 0:32" (the bar
// `bar_width` characters wide).
std::string format_progress_bar(const ProgressState& s, int bar_width);
// "  epoch 2 step 13/40  loss 0.4123  85.3 img/s  ETA 0:32" (what job scripts grep for)
std::string format_progress_line(const ProgressState& s);
// "0:07", "12:34", "1:02:03"
std::string format_duration(double seconds);

// Draws on `out` (rank 0's stdout); a disabled TrainProgress does nothing.
class TrainProgress {
 public:
  TrainProgress(bool enabled, bool bar, int log_every, std::FILE* out = stdout);
  // Starts an epoch that continues after `start_step` (a mid-epoch resume) of `steps`.
  void start_epoch(int64_t epoch, int64_t epochs, int64_t start_step, int64_t steps);
  // After each optimiser step: `images` real images over all ranks in it.
  void step(int64_t step, double loss, int64_t images);
  // Ends the bar's line (before any other output).
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_, bar_;
  int log_every_;
  std::FILE* out_;
  ProgressState state_;
  int64_t start_step_ = 0;
  int64_t images_ = 0;
  Clock::time_point t0_, last_draw_;
  bool drawn_ = false;
};

}  // namespace dp::app
