// One dptrain per --model-dir: an advisory lock that the kernel releases when its process dies.
#pragma once

#include <string>

#include "dp/log.hpp"

namespace dp::app {

// Holds an open-file-description lock (fcntl F_OFD_SETLK, or a POSIX F_SETLK where the kernel has
// no OFD locks) on <dir>/.dptrain.lock for its lifetime, with "host <h> pid <p> [Slurm job <j>]
// since <time>" written in the file for whoever is refused. The kernel drops the lock when the
// process ends in any way (a SIGKILLed job leaves no stale lock, only the file, which the next
// holder reuses); a holder that ends normally or with an error removes the file. These
// locks hold across nodes on NFSv4, on Lustre mounted with -o flock (not with -o localflock or
// without the option, where locking fails: then a warning, and no protection) and on GPFS.
class ModelDirLock {
 public:
  // Throws CodedError (kExitModelDirLocked) naming the holder when another process holds it.
  ModelDirLock(const std::string& dir, Logger log);
  ~ModelDirLock();
  ModelDirLock(const ModelDirLock&) = delete;
  ModelDirLock& operator=(const ModelDirLock&) = delete;

  const std::string& path() const { return path_; }
  bool held() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

// "host <h> pid <p> [Slurm job <j>] since <UTC time>": how this process names itself as holder.
std::string lock_holder_description();

}  // namespace dp::app
