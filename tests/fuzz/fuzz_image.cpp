// Fuzz target: a JPEG or PNG file decoded as dpprep build and dppredict do (header, RGB, gray).
#include <cstddef>
#include <cstdint>

#include "dp/image_io.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = dp::fuzz::input_file(data, size, ".img");
  dp::fuzz::expect_errors([&] { dp::data::read_image_header(path); });
  // Images are read as RGB, masks as gray.
  dp::fuzz::expect_errors([&] { dp::data::read_image(path, dp::data::PixelFormat::kRgb); });
  dp::fuzz::expect_errors([&] { dp::data::read_image(path, dp::data::PixelFormat::kGray); });
  return 0;
}
