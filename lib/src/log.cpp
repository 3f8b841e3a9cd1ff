// Logger output (one line per call, flushed, so mpirun interleaves whole lines).
#include "dp/log.hpp"

namespace dp {

void Logger::emit(std::FILE* f, const std::string& line, bool always_prefix) const {
  if (all_ranks_ || always_prefix)
    std::fprintf(f, "[rank %d] %s\n", rank_, line.c_str());
  else
    std::fprintf(f, "%s\n", line.c_str());
  std::fflush(f);
}

std::string format_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace dp
