// Rank-aware logging: rank 0 only by default; every rank with a [rank r] prefix on request.
#pragma once

#include <cstdio>
#include <string>

#include "dp/error.hpp"

namespace dp {

class Logger {
 public:
  Logger(int rank = 0, bool all_ranks = false) : rank_(rank), all_ranks_(all_ranks) {}
  bool enabled() const { return all_ranks_ || rank_ == 0; }
  // Informational line on stdout (rank 0, or all ranks with --log-all-ranks).
  template <typename... Args>
  void info(const Args&... args) const {
    if (enabled()) emit(stdout, str_cat(args...));
  }
  // Warning on stderr from whichever rank saw it.
  template <typename... Args>
  void warn(const Args&... args) const {
    emit(stderr, "warning: " + str_cat(args...), true);
  }

 private:
  void emit(std::FILE* f, const std::string& line, bool always_prefix = false) const;
  int rank_;
  bool all_ranks_;
};

// "12.3 MiB"
std::string format_mib(double bytes);
// v with `digits` digits after the point ("0.1235").
std::string fixed(double v, int digits);

}  // namespace dp
