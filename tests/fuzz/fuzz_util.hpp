// Shared pieces of the fuzz targets: the input as a file, the dp::Error policy, HDF5 id leaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dp/error.hpp"

namespace dp::fuzz {

// Writes the input to this process's scratch file (in $DP_FUZZ_TMP, /dev/shm or /tmp; the name
// ends in `suffix`; removed at exit) and returns its path: the projects' readers take paths.
const std::string& input_file(const uint8_t* data, size_t size, const char* suffix);

// Prints `what` (an expected error) when DP_FUZZ_VERBOSE is set, else nothing.
void note_error(const char* what);

// Runs `fn`. A dp::Error is the expected outcome of a bad file and is swallowed; anything else
// (another exception, a crash, a sanitizer report) escapes and is a finding.
template <typename Fn>
void expect_errors(Fn&& fn) {
  try {
    fn();
  } catch (const dp::Error& e) {
    note_error(e.what());
  }
}

// Aborts if an HDF5 file, group, dataset, attribute or type is still open after an input: a
// leaked id keeps the file open, and HDF5 would then serve the next input from stale metadata.
void check_no_open_hdf5_objects();

}  // namespace dp::fuzz
