// Boost.Program_options' "%word%" placeholder trap, shared by dptrain, dppredict and dpprep.
#pragma once

#include <string>

#include "dp/error.hpp"    // str_cat
#include "exit_codes.hpp"  // UsageError

namespace dp::app {

// Boost.Program_options 1.74 formats an error by replacing each placeholder of its message
// ("%value%", "%invalid_line%", ...) with the offending text, and loops forever when that text
// holds the placeholder itself (found by fuzzing --config). Returns the first "%word%" (lower
// case letters and '_') in `text`, or "" if there is none; callers refuse it before Boost sees it.
inline std::string boost_placeholder_in(const std::string& text) {
  for (size_t at = text.find('%'); at != std::string::npos; at = text.find('%', at + 1)) {
    size_t end = at + 1;
    while (end < text.size() && ((text[end] >= 'a' && text[end] <= 'z') || text[end] == '_')) ++end;
    if (end > at + 1 && end < text.size() && text[end] == '%') return text.substr(at, end - at + 1);
  }
  return {};
}

// A UsageError "WHERE: '%word%' is not allowed in options" where `text` holds a placeholder.
inline void refuse_placeholders(const std::string& text, const std::string& where) {
  if (const std::string word = boost_placeholder_in(text); !word.empty())
    throw UsageError(str_cat(where, ": '", word, "' is not allowed in options"));
}

// The same for every argument of argv (after the program's name), each named "argument 'A'".
inline void refuse_placeholders_in_argv(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) refuse_placeholders(argv[i], str_cat("argument '", argv[i], "'"));
}

}  // namespace dp::app
