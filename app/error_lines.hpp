// The error lines of the single-process apps (dpprep, dpexport): one "<program>: error: " line per
// line of the message (a failed build lists every bad file).
#pragma once

#include <iostream>
#include <sstream>
#include <string>

namespace dp::app {

inline void print_error_lines(const char* program, const std::string& what) {
  std::istringstream lines(what);
  std::string line;
  while (std::getline(lines, line)) std::cerr << program << ": error: " << line << "\n";
  if (what.empty()) std::cerr << program << ": error:\n";
}

}  // namespace dp::app
