// Helpers shared by dptrain's tests: temporary directories, tensor comparison, tiny datasets.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dp/error.hpp"
#include "dp/log.hpp"
#include "train/options.hpp"

namespace dp::mpi {
class MpiComm;
}

namespace dp::test {

// The message of the dp::Error that f() throws; a test failure (and "") when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dp::Error";
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// main() of the MPI test binaries: initialises MPI, runs every test on every rank, and returns
// non-zero on every rank if any rank failed. world() is the communicator inside those tests.
int mpi_test_main(int argc, char** argv);
mpi::MpiComm& world();

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A directory all ranks of world() share: made by rank 0, its path broadcast; at the end every
// rank waits for the others, then rank 0 removes it.
class SharedDir {
 public:
  SharedDir();
  ~SharedDir();
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const;

 private:
  std::unique_ptr<TempDir> dir_;
  std::string path_;
};

// max |a-b| / max(|b|, floor) over the elements, and max |a-b|.
struct Diff {
  double max_abs = 0;
  double max_rel = 0;
};
Diff compare(const float* a, const float* b, int64_t count, double floor = 1e-6);

// Writes a small synthetic dataset v1 (train_count + val_count images of size x size).
void write_tiny_dataset(const std::string& path, int64_t train_count, int64_t val_count, int size,
                        uint64_t seed = 7);

// Runs a shell command and returns its exit status and combined stdout+stderr.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult run_command(const std::string& command);

// This build tree's programs for the tests that run them, read from test_programs.txt beside the
// test binary (tests/CMakeLists.txt writes it) rather than compiled in, so that those tests'
// objects are the same in every build tree and ccache compiles them once for scripts/test.sh's
// three builds. program("dptrain") (also dpprep, dppredict, dpexport, nolock_shim) is a path;
// mpiexec() the launcher with the suite's flags; mpi_family() "openmpi" or "mpich". A missing
// file or name throws.
const std::string& build_setting(const std::string& name);
inline const std::string& program(const std::string& name) {
  return build_setting(name);
}
inline const std::string& mpiexec() {
  return build_setting("mpiexec");
}
inline const std::string& mpi_family() {
  return build_setting("mpi_family");
}

// One epoch of UNet16 /16 by `dptrain` under `mpiexec -n 1` on `data` into `model_dir` (batch 2,
// LR 0.1, --pos-weight, so that the predictions are a mix of crack and background); returns the
// epoch's checkpoint, or "" after failing the current test with dptrain's output.
std::string train_one_epoch(const std::string& mpiexec, const std::string& dptrain,
                            const std::string& data, const std::string& model_dir);

// "timeout -k 5 T [env ENV] MPIEXEC -n NP PROGRAM ARGS": a job that hangs fails its test after
// kill_after_seconds instead of hanging it.
std::string mpiexec_command(const std::string& mpiexec, int np, const std::string& program,
                            const std::string& args, const std::string& env = "",
                            int kill_after_seconds = 120);

// The training tests' options: UNet16 at width divisor 16, `batch` per rank, lr 0.05, seed 5, one
// epoch, on `data`, checkpoints in `model_dir`.
app::TrainOptions tiny_training(const std::string& data, const std::string& model_dir, int batch);

// A logger that prints nothing (rank 1's, without --log-all-ranks).
inline Logger quiet_logger() {
  return Logger(1, false);
}

}  // namespace dp::test
