// Fuzz target: a dptrain --config file parsed and validated (parse_train_options).
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "train/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = dp::fuzz::input_file(data, size, ".ini");
  const char* argv[] = {"dptrain", "--config", path.c_str()};
  // UsageError (a dp::Error) is the expected outcome of a bad file.
  dp::fuzz::expect_errors([&] { dp::app::parse_train_options(3, argv, false); });
  return 0;
}
