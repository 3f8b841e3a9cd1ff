// ModelDirLock: fcntl record locks on <model-dir>/.dptrain.lock, and the holder's description.
#include "train/model_dir_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "agreement.hpp"
#include "exit_codes.hpp"

namespace dp::app {
namespace {

constexpr const char* kLockName = ".dptrain.lock";
constexpr size_t kMaxHolderText = 512;
constexpr int kAttempts = 8;

// F_SETLK-style request for a write lock on the whole file.
int try_lock(int fd) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
#ifdef F_OFD_SETLK
  if (fcntl(fd, F_OFD_SETLK, &l) == 0) return 0;
  if (errno != EINVAL) return errno;  // EINVAL: a kernel without OFD locks
#endif
  return fcntl(fd, F_SETLK, &l) == 0 ? 0 : errno;
}

std::string read_holder(int fd) {
  char text[kMaxHolderText] = {};
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  std::string s(text, n > 0 ? size_t(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.empty() ? std::string("a process that has not yet written its name") : s;
}

}  // namespace

std::string lock_holder_description() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return str_cat("host ", host, " pid ", getpid(),
                 job != nullptr && *job != '\0' ? str_cat(" Slurm job ", job) : std::string(),
                 " since ", when);
}

ModelDirLock::ModelDirLock(const std::string& dir, Logger log)
    : path_((std::filesystem::path(dir) / kLockName).string()) {
  // The holder removes the file when it ends: a lock taken on a file that was removed (or
  // replaced) meanwhile is worthless, so after locking, the path must still name the locked file.
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot open the lock file '", path_, "': ", std::strerror(errno));
    const int err = try_lock(fd);
    if (err == EAGAIN || err == EACCES) {
      const std::string holder = read_holder(fd);
      close(fd);
      throw CodedError(
          str_cat("--model-dir '", dir, "' is in use by another dptrain (", holder, "; lock ",
                  path_, "): wait for it to end, stop it, or use another --model-dir"),
          kExitModelDirLocked);
    }
    if (err != 0) {  // ENOLCK, ENOSYS, EOPNOTSUPP: a file system without these locks
      log.warn("cannot lock '", path_, "' (", std::strerror(err),
               "): a second dptrain on this --model-dir would not be refused");
      close(fd);
      return;
    }
    struct stat locked {
    }, named{};
    if (fstat(fd, &locked) != 0 || stat(path_.c_str(), &named) != 0 ||
        locked.st_ino != named.st_ino || locked.st_dev != named.st_dev) {
      close(fd);  // removed by its previous holder after we opened it: try the new one
      continue;
    }
    fd_ = fd;
    const std::string me = lock_holder_description() + "\n";
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
      log.warn("cannot write the holder into '", path_, "': ", std::strerror(errno));
    return;
  }
  fail("cannot lock '", path_, "': it was replaced ", kAttempts, " times while locking");
}

ModelDirLock::~ModelDirLock() {
  if (fd_ < 0) return;
  unlink(path_.c_str());  // still locked: nobody can take the removed file's lock meanwhile
  close(fd_);             // releases the lock
}

}  // namespace dp::app
