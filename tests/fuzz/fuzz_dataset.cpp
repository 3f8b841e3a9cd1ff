// Fuzz target: a dataset v1 file opened and validated as dpprep info, dptrain and dppredict do.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/prepare.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = dp::fuzz::input_file(data, size, ".h5");
  // dpprep info: layout, attributes, every mask.
  dp::fuzz::expect_errors([&] { dp::data::inspect_dataset(path); });
  // The Loader's reader of each split (dptrain; dppredict --dataset): first and last sample.
  for (const char* split : {"train", "val"}) {
    dp::fuzz::expect_errors([&] {
      if (!dp::data::Dataset::has_split(path, split)) return;
      const dp::data::Dataset d(path, split);
      const size_t pixels = static_cast<size_t>(d.height()) * static_cast<size_t>(d.width());
      std::vector<uint8_t> image(pixels * 3), mask(pixels);
      for (const int64_t i : {int64_t{0}, d.size() - 1}) d.read(i, image.data(), mask.data());
      d.read_mask(d.size() - 1, mask.data());
    });
  }
  dp::fuzz::check_no_open_hdf5_objects();
  return 0;
}
