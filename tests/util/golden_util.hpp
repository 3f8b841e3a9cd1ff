// Reading golden files (dp-golden-v1) and comparing tensors against them, printing the max error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/h5.hpp"

namespace dp::test {

class Golden {
 public:
  explicit Golden(const std::string& path);
  std::vector<float> read(const std::string& dataset) const;
  std::vector<int64_t> read_int(const std::string& dataset) const;
  std::vector<int64_t> shape(const std::string& dataset) const;
  int64_t attr_int(const std::string& object, const std::string& name) const;
  double attr_double(const std::string& object, const std::string& name) const;
  std::string attr_string(const std::string& object, const std::string& name) const;
  // Fails the current test unless max|got - want| <= tol * max(max|want|, 1e-3); prints both.
  // (Relative to the tensor's scale, not per element: elements near zero would make a per-element
  // ratio meaningless.) Returns that relative error.
  double expect_close(const std::string& dataset, const std::vector<float>& got,
                      double tol = 1e-4) const;
  static double expect_close(const std::string& what, const float* got, const float* want,
                             size_t count, double tol);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  h5::File file_;
};

}  // namespace dp::test
