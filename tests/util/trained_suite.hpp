// A test suite on one tiny checkpoint: its dataset and one epoch trained on it, made once.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

namespace dp::test {

// Suite (the derived fixture) gives kValSamples and kSide: the dataset has 32 training and
// kValSamples validation samples of kSide x kSide (write_tiny_dataset), and checkpoint_ is one
// epoch of UNet16 /16 on it (train_one_epoch), both in dir_ until the suite ends.
template <class Suite>
class TrainedSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    data_ = dir_->file("synth.h5");
    write_tiny_dataset(data_, 32, Suite::kValSamples, Suite::kSide);
    checkpoint_ = train_one_epoch(mpiexec(), program("dptrain"), data_, dir_->file("run"));
    ASSERT_FALSE(checkpoint_.empty());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static inline TempDir* dir_ = nullptr;
  static inline std::string data_, checkpoint_;
};

}  // namespace dp::test
