// Logger output (one write per line, flushed, so mpirun interleaves whole lines; with a rank
// prefix on every line of a multi-line message).
#include "dp/log.hpp"

namespace dp {

void Logger::emit(std::FILE* f, const std::string& text, bool always_prefix) const {
  for (size_t start = 0;;) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end == std::string::npos ? end : end - start);
    if (all_ranks_ || always_prefix)
      std::fprintf(f, "[rank %d] %s\n", rank_, line.c_str());
    else
      std::fprintf(f, "%s\n", line.c_str());
    std::fflush(f);
    if (end == std::string::npos) break;
    start = end + 1;
  }
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
