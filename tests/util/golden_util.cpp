// Golden file reader and tensor comparison for the golden tests.
#include "golden_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace dp::test {

Golden::Golden(const std::string& path) : path_(path), file_(path, h5::Mode::kRead) {
  const std::string format = file_.attr_string("format");
  if (format != "dp-golden-v1") ADD_FAILURE() << path << ": format " << format;
}

std::vector<float> Golden::read(const std::string& dataset) const {
  h5::Dataset d = h5::Dataset::open(file_, dataset);
  std::vector<float> v(size_t(d.numel()));
  d.read(v.data());
  return v;
}

std::vector<int64_t> Golden::read_int(const std::string& dataset) const {
  const std::vector<float> v = read(dataset);
  return std::vector<int64_t>(v.begin(), v.end());
}

std::vector<int64_t> Golden::shape(const std::string& dataset) const {
  return h5::Dataset::open(file_, dataset).shape();
}

int64_t Golden::attr_int(const std::string& object, const std::string& name) const {
  return object.empty() ? file_.attr_int(name) : file_.open_group(object).attr_int(name);
}

double Golden::attr_double(const std::string& object, const std::string& name) const {
  return object.empty() ? file_.attr_double(name) : file_.open_group(object).attr_double(name);
}

std::string Golden::attr_string(const std::string& object, const std::string& name) const {
  return object.empty() ? file_.attr_string(name) : file_.open_group(object).attr_string(name);
}

double Golden::expect_close(const std::string& what, const float* got, const float* want,
                            size_t count, double tol) {
  double max_diff = 0, scale = 0;
  size_t worst = 0;
  for (size_t i = 0; i < count; ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    if (diff > max_diff) max_diff = diff, worst = i;
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  const double rel = max_diff / std::max(scale, 1e-3);
  std::printf("[golden] %-44s max abs diff %.3e (%.2e of max |ref| %.3e)\n", what.c_str(), max_diff,
              rel, scale);
  EXPECT_LE(rel, tol) << what << ": element " << worst << " is " << got[worst] << ", reference "
                      << want[worst];
  return rel;
}

double Golden::expect_close(const std::string& dataset, const std::vector<float>& got,
                            double tol) const {
  const std::vector<float> want = read(dataset);
  EXPECT_EQ(got.size(), want.size()) << dataset;
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  return expect_close(dataset, got.data(), want.data(), got.size(), tol);
}

}  // namespace dp::test
