// dp::Error, the one exception type of dptrain, and the DP_CHECK / DP_THROW helpers.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dp {

// Library code throws dp::Error with context (what, where, expected vs found); only main() catches.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Concatenates the arguments with operator<< into one message.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace dp

// Throws dp::Error built from the message arguments when `cond` is false.
#define DP_CHECK(cond, ...)               \
  do {                                    \
    if (!(cond)) ::dp::fail(__VA_ARGS__); \
  } while (0)
