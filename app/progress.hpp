// Progress of the apps: a bar redrawn in place on a terminal, or plain lines for logs. dptrain's
// steps (TrainProgress), and the items of a phase for dppredict and dpprep (CountProgress).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace dp::app {

// "#####....." : `width` characters, `fraction` (clamped to [0, 1]) of them filled.
std::string progress_bar(double fraction, int width);

// --progress auto: a bar only when stdout and stderr are both terminals. (Open MPI gives every
// rank a pseudo-terminal stdout whatever mpirun's own stdout is, but stderr a pipe; so under
// mpirun auto means lines, and --progress bar asks for the bar.)
enum class ProgressStyle { kAuto, kBar, kLines };
bool use_progress_bar(ProgressStyle style, bool stdout_tty, bool stderr_tty);

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

// A phase of `total` items (images read, predicted or written), shown on stdout: on a terminal a
// bar redrawn at every per mille; otherwise a plain line every tenth, for phases of at least
// `min_total_for_lines` items.
class CountProgress {
 public:
  struct State {
    std::string phase;
    int64_t done = 0, total = 0;
    int64_t per_mille = 0;  // of the phase done
    double seconds = 0;     // since the phase began
    double rate = 0;        // items per second
  };
  using Format = std::function<std::string(const State&)>;  // the text of the bar or of a line
  static constexpr int64_t kPerMille = 1000;
  static constexpr int kBarWidth = 30;

  CountProgress(bool enabled, int64_t min_total_for_lines, Format bar, Format line);
  ~CountProgress() { end_line(); }
  CountProgress(const CountProgress&) = delete;
  CountProgress& operator=(const CountProgress&) = delete;

  // `done` of `total` items of `phase` (a new phase restarts the clock).
  void update(const std::string& phase, int64_t done, int64_t total);
  // Ends the bar's line, so that the next output starts on its own.
  void end_line();

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kLines = 10;  // plain lines per phase
  bool enabled_, tty_;
  int64_t min_total_for_lines_;
  Format bar_, line_;
  std::string phase_;
  Clock::time_point start_;
  int64_t shown_ = -1;
  bool open_line_ = false;
};

}  // namespace dp::app
