// Scratch files and HDF5 id accounting for the fuzz targets (tests/fuzz).
#include "fuzz_util.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "dp/h5.hpp"

namespace dp::fuzz {
namespace {

std::string scratch_dir() {
  if (const char* dir = std::getenv("DP_FUZZ_TMP"); dir != nullptr && dir[0] != '\0') return dir;
  if (::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  if (const char* dir = std::getenv("TMPDIR"); dir != nullptr && dir[0] != '\0') return dir;
  return "/tmp";
}

std::string& scratch_path() {
  static std::string path;
  return path;
}

void remove_scratch() {
  if (!scratch_path().empty()) ::unlink(scratch_path().c_str());
}

}  // namespace

const std::string& input_file(const uint8_t* data, size_t size, const char* suffix) {
  std::string& path = scratch_path();
  if (path.empty()) {
    path = scratch_dir() + "/dp_fuzz_" + std::to_string(::getpid()) + suffix;
    std::atexit(remove_scratch);
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

void note_error(const char* what) {
  static const bool verbose = std::getenv("DP_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  dp::Error: %s\n", what);
}

void check_no_open_hdf5_objects() {
  std::lock_guard<std::recursive_mutex> lock(h5::mutex());
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) {
    std::fprintf(stderr, "fuzz: %zd HDF5 objects still open after the input\n", open);
    std::abort();
  }
}

}  // namespace dp::fuzz
