// fsync, atomic rename and directory checks for dptrain's output files.
#include "dp/fs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dp/error.hpp"

namespace dp {
namespace {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  DP_CHECK(fd >= 0, "cannot open '", path, "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  DP_CHECK(rc == 0, "fsync of '", path, "' failed: ", std::strerror(err));
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

void commit_file(const std::string& tmp, const std::string& path) {
  fsync_path(tmp, false);
  DP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
           "': ", std::strerror(errno));
  const auto dir = std::filesystem::absolute(path).parent_path();
  fsync_path(dir.string(), true);
}

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DP_CHECK(!ec, "cannot create directory '", dir, "': ", ec.message());
  DP_CHECK(std::filesystem::is_directory(dir), "'", dir, "' exists and is not a directory");
  DP_CHECK(::access(dir.c_str(), W_OK) == 0, "directory '", dir,
           "' is not writable: ", std::strerror(errno));
}

}  // namespace dp
