// Progress bars and plain progress lines: dptrain's steps, dppredict's and dpprep's phases.
#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "dp/error.hpp"
#include "dp/log.hpp"

namespace dp::app {
namespace {

constexpr int kBarWidth = 24;
constexpr double kRedrawSeconds = 0.1;  // at most ~10 redraws a second
constexpr int kSecondsPerMinute = 60, kSecondsPerHour = 3600;

}  // namespace

std::string progress_bar(double fraction, int width) {
  const int filled = std::clamp(int(fraction * width), 0, width);
  return std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.');
}

bool use_progress_bar(ProgressStyle style, bool stdout_tty, bool stderr_tty) {
  switch (style) {
    case ProgressStyle::kBar:
      return true;
    case ProgressStyle::kLines:
      return false;
    case ProgressStyle::kAuto:
      break;
  }
  return stdout_tty && stderr_tty;
}

std::string format_duration(double seconds) {
  const auto total = int64_t(std::llround(std::max(0.0, seconds)));
  const int64_t h = total / kSecondsPerHour, m = total % kSecondsPerHour / kSecondsPerMinute,
                s = total % kSecondsPerMinute;
  char buf[32];
  if (h > 0)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(h),
                  static_cast<long long>(m), static_cast<long long>(s));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(m),
                  static_cast<long long>(s));
  return buf;
}

std::string format_progress_bar(const ProgressState& s, int bar_width) {
  const double done = s.steps > 0 ? double(s.step) / double(s.steps) : 1.0;
  return str_cat("epoch ", s.epoch, "/", s.epochs, " [", progress_bar(done, bar_width), "] ",
                 s.step, "/", s.steps, "  loss ", fixed(s.loss, 4), "  ", fixed(s.images_per_s, 1),
                 " img/s  ETA ", format_duration(s.eta_seconds));
}

std::string format_progress_line(const ProgressState& s) {
  return str_cat("  epoch ", s.epoch, " step ", s.step, "/", s.steps, "  loss ", fixed(s.loss, 4),
                 "  ", fixed(s.images_per_s, 1), " img/s  ETA ", format_duration(s.eta_seconds));
}

TrainProgress::TrainProgress(bool enabled, bool bar, int log_every, std::FILE* out)
    : enabled_(enabled), bar_(bar), log_every_(log_every), out_(out) {}

void TrainProgress::start_epoch(int64_t epoch, int64_t epochs, int64_t start_step, int64_t steps) {
  state_ = ProgressState{epoch, epochs, start_step, steps, 0, 0, 0};
  start_step_ = start_step;
  images_ = 0;
  t0_ = last_draw_ = Clock::now();
  drawn_ = false;
}

void TrainProgress::step(int64_t step, double loss, int64_t images) {
  if (!enabled_) return;
  images_ += images;
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - t0_).count();
  const int64_t done = step - start_step_;
  state_.step = step;
  state_.loss = loss;
  state_.images_per_s = elapsed > 0 ? double(images_) / elapsed : 0;
  state_.eta_seconds = done > 0 ? elapsed / double(done) * double(state_.steps - step) : 0;
  if (bar_) {
    const bool last = step >= state_.steps;
    if (!last && drawn_ && std::chrono::duration<double>(now - last_draw_).count() < kRedrawSeconds)
      return;
    std::fprintf(out_, "\r%s\033[K", format_progress_bar(state_, kBarWidth).c_str());
    std::fflush(out_);
    last_draw_ = now;
    drawn_ = true;
  } else if (log_every_ > 0 && step % log_every_ == 0) {
    std::fprintf(out_, "%s\n", format_progress_line(state_).c_str());
    std::fflush(out_);
  }
}

void TrainProgress::clear() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(out_, "\r\033[K");
  std::fflush(out_);
  drawn_ = false;
}

CountProgress::CountProgress(bool enabled, int64_t min_total_for_lines, Format bar, Format line)
    : enabled_(enabled),
      tty_(::isatty(STDOUT_FILENO) == 1),
      min_total_for_lines_(min_total_for_lines),
      bar_(std::move(bar)),
      line_(std::move(line)) {}

void CountProgress::update(const std::string& phase, int64_t done, int64_t total) {
  if (!enabled_) return;
  if (phase != phase_) {
    end_line();
    phase_ = phase;
    start_ = Clock::now();
    shown_ = -1;
  }
  const int64_t per_mille = total > 0 ? done * kPerMille / total : kPerMille;
  if (per_mille == shown_) return;
  shown_ = per_mille;
  State s{
      phase, done, total, per_mille, std::chrono::duration<double>(Clock::now() - start_).count(),
      0.0};
  s.rate = s.seconds > 0 ? double(done) / s.seconds : 0.0;
  if (tty_) {
    std::printf("\r%s", bar_(s).c_str());
    open_line_ = true;
  } else if (total >= min_total_for_lines_ && per_mille % (kPerMille / kLines) == 0 &&
             per_mille > 0) {
    std::printf("%s\n", line_(s).c_str());
  }
  std::fflush(stdout);
}

void CountProgress::end_line() {
  if (!open_line_) return;
  std::printf("\n");
  std::fflush(stdout);
  open_line_ = false;
}

}  // namespace dp::app
