// File systems without locks (Lustre, GPFS, Cray DVS): datasets and checkpoints are read without
// HDF5's file lock, and the --model-dir lock degrades to its warning. Locks fail through an
// LD_PRELOAD shim (tests/util/nolock_shim.c) with the errno such file systems give.
#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

namespace dp {
namespace {

constexpr int kEopnotsupp = 95;  // NFS, GPFS
constexpr int kEnotsupp = 524;   // Cray DVS (the kernel's ENOTSUPP)
constexpr int kEnosys = 38;      // HDF5 1.10.7+ ignores this one by itself

std::string without_locks(int error, const std::string& command) {
  return "env LD_PRELOAD=" + test::program("nolock_shim") +
         " DP_NOLOCK_ERRNO=" + std::to_string(error) + " " + command;
}

class FileLocks : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef DP_SANITIZED
    GTEST_SKIP() << "an LD_PRELOAD shim and AddressSanitizer's runtime do not mix";
#endif
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 8, 4, 32);
  }
  test::TempDir dir_;
  std::string data_;
};

TEST_F(FileLocks, DatasetsAreReadWhereLocksFail) {
  for (int error : {kEopnotsupp, kEnotsupp}) {
    const auto r = test::run_command(
        without_locks(error, std::string(test::program("dpprep")) + " info " + data_));
    EXPECT_EQ(r.status, 0) << "errno " << error << "\n" << r.output;
    EXPECT_NE(r.output.find("train"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("unable to lock file"), std::string::npos) << r.output;
  }
}

TEST_F(FileLocks, TrainingResumesAndTheModelDirLockWarnsWhereLocksAreMissing) {
  const std::string train = std::string(test::program("dptrain")) + " --data " + data_ +
                            " --width-divisor 16 --batch-size 2 --model-dir " + dir_.file("run");
  const auto first = test::run_command(without_locks(kEnosys, train + " --epochs 1"));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("a second dptrain on this --model-dir would not be refused"),
            std::string::npos)
      << first.output;
  // The resume reads the checkpoint back without a lock.
  const auto second = test::run_command(without_locks(kEnosys, train + " --epochs 2"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resum"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("epoch 2/2"), std::string::npos) << second.output;
}

}  // namespace
}  // namespace dp
