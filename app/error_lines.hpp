// main() of the single-process apps (dpprep, dpexport): exit codes, and one "<program>: error: "
// line per line of an error's message (a failed build lists every bad file).
#pragma once

#include <exception>
#include <iostream>
#include <sstream>
#include <string>

#include "exit_codes.hpp"

namespace dp::app {

inline void print_error_lines(const char* program, const std::string& what) {
  std::istringstream lines(what);
  std::string line;
  while (std::getline(lines, line)) std::cerr << program << ": error: " << line << "\n";
  if (what.empty()) std::cerr << program << ": error:\n";
}

// Returns run()'s exit code; a UsageError is one error line and kExitUsage, any other exception
// its error lines and kExitFailure.
template <class Run>
int run_program(const char* program, Run run) {
  try {
    return run();
  } catch (const UsageError& e) {
    std::cerr << program << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    print_error_lines(program, e.what());
    return kExitFailure;
  }
}

}  // namespace dp::app
