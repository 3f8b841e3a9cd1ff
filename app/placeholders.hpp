// Boost.Program_options' "%word%" placeholder trap, shared by dptrain, dppredict and dpprep.
#pragma once

#include <string>

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

}  // namespace dp::app
