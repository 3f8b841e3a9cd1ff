// Skeletons and clDice against scikit-image (tools/reference/cldice.py -> tests/golden/cldice.h5),
// hand-checkable cases, and counts that sum over ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dp/h5.hpp"
#include "dp/skeleton.hpp"
#include "eval/centerline_dice.hpp"

namespace dp {
namespace {

std::string golden_path() {
  return std::string(DP_GOLDEN_DIR) + "/cldice.h5";
}

// The golden's datasets: uint8 and float32 through dp::h5, int64 and float64 with the C API.
class Golden {
 public:
  Golden() : file_(golden_path(), h5::Mode::kRead) {
    EXPECT_EQ(file_.attr_string("format"), "dp-golden-v1");
    std::printf("[cldice] %s: scikit-image %s\n", golden_path().c_str(),
                file_.attr_string("skimage_version").c_str());
  }
  std::vector<std::string> cases(const std::string& group) const {
    return file_.open_group(group).children();
  }
  std::vector<int64_t> shape(const std::string& path) const {
    return h5::Dataset::open(file_, path).shape();
  }
  std::vector<uint8_t> bytes(const std::string& path) const {
    const h5::Dataset d = h5::Dataset::open(file_, path);
    std::vector<uint8_t> v(size_t(d.numel()));
    d.read(v.data());
    return v;
  }
  std::vector<float> floats(const std::string& path) const {
    const h5::Dataset d = h5::Dataset::open(file_, path);
    std::vector<float> v(size_t(d.numel()));
    d.read(v.data());
    return v;
  }
  std::vector<int64_t> int64s(const std::string& path) const {
    return raw<int64_t>(path, H5T_NATIVE_INT64);
  }
  double float64(const std::string& path) const {
    const std::vector<double> v = raw<double>(path, H5T_NATIVE_DOUBLE);
    EXPECT_EQ(v.size(), 1u) << path;
    return v.empty() ? std::nan("") : v[0];
  }

 private:
  template <typename T>
  std::vector<T> raw(const std::string& path, hid_t type) const {
    std::lock_guard<std::recursive_mutex> lock(h5::mutex());
    const h5::Id d(H5Dopen2(file_.id(), path.c_str(), H5P_DEFAULT));
    if (!d.valid()) {
      ADD_FAILURE() << "cannot open " << path;
      return {};
    }
    const h5::Id space(H5Dget_space(d.get()));
    std::vector<T> v(size_t(std::max<hssize_t>(H5Sget_simple_extent_npoints(space.get()), 0)));
    EXPECT_GE(H5Dread(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0) << path;
    return v;
  }
  h5::File file_;
};

std::vector<uint8_t> skeleton_of(const std::vector<uint8_t>& mask, int height, int width) {
  std::vector<uint8_t> s(mask.size(), 7);
  data::skeletonize(mask.data(), height, width, s.data());
  return s;
}

// Random crack-like masks: 1-2 random walks across the image, 1-4 px wide.
std::vector<uint8_t> random_cracks(std::mt19937& rng, int height, int width) {
  std::vector<uint8_t> m(size_t(height) * size_t(width), 0);
  const int walks = 1 + int(rng() % 2);
  for (int k = 0; k < walks; ++k) {
    const int thickness = 1 + int(rng() % 4);
    int y = int(rng() % unsigned(height));
    for (int x = 0; x < width; ++x) {
      for (int t = 0; t < thickness; ++t)
        if (y + t < height) m[size_t(y + t) * size_t(width) + size_t(x)] = 1;
      y = std::clamp(y + int(rng() % 3) - 1, 0, height - 1);
    }
  }
  return m;
}

TEST(Skeleton, EqualsScikitImageOnEveryGoldenMask) {
  const Golden g;
  const std::vector<std::string> names = g.cases("skeleton");
  ASSERT_GE(names.size(), 8u);
  std::vector<uint8_t> scratch;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string c = "skeleton/" + name;
    const std::vector<int64_t> shape = g.shape(c + "/mask");
    ASSERT_EQ(shape.size(), 2u);
    const int h = int(shape[0]), w = int(shape[1]);
    const std::vector<uint8_t> mask = g.bytes(c + "/mask"), want = g.bytes(c + "/skeleton");
    std::vector<uint8_t> got(mask.size(), 7);
    data::skeletonize(mask.data(), h, w, got.data(), scratch);  // one scratch for every case
    int64_t differ = 0, on = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i], on += want[i];
    std::printf("[cldice] skeleton %-16s %3d x %3d: %4lld pixels, %lld differ\n", name.c_str(), h,
                w, static_cast<long long>(on), static_cast<long long>(differ));
    EXPECT_EQ(differ, 0) << "pixels differing from scikit-image's skeleton";
    // In place (skeleton = mask) gives the same.
    std::vector<uint8_t> in_place = mask;
    data::skeletonize(in_place.data(), h, w, in_place.data());
    EXPECT_EQ(in_place, got);
  }
}

TEST(Skeleton, HandCheckableCases) {
  // A 1-px straight line (a row, a column) is its own skeleton, as scikit-image keeps it.
  const int h = 9, w = 14;
  std::vector<uint8_t> row(size_t(h * w), 0), column(size_t(h * w), 0);
  for (int x = 2; x < 12; ++x) row[size_t(4 * w + x)] = 1;
  for (int y = 0; y < h; ++y) column[size_t(y * w + 6)] = 1;
  EXPECT_EQ(skeleton_of(row, h, w), row);
  EXPECT_EQ(skeleton_of(column, h, w), column);
  // A single pixel stays; nothing stays nothing; an empty image is allowed.
  std::vector<uint8_t> dot(size_t(h * w), 0);
  dot[size_t(3 * w + 3)] = 255;  // nonzero is foreground, the skeleton is 0/1
  std::vector<uint8_t> want_dot(size_t(h * w), 0);
  want_dot[size_t(3 * w + 3)] = 1;
  EXPECT_EQ(skeleton_of(dot, h, w), want_dot);
  const std::vector<uint8_t> none(size_t(h * w), 0);
  EXPECT_EQ(skeleton_of(none, h, w), none);
  data::skeletonize(nullptr, 0, 5, nullptr);
  // A 3-px bar thins to one line, 1 px wide, inside the bar.
  std::vector<uint8_t> bar(size_t(h * w), 0);
  for (int y = 3; y < 6; ++y)
    for (int x = 1; x < 13; ++x) bar[size_t(y * w + x)] = 1;
  const std::vector<uint8_t> s = skeleton_of(bar, h, w);
  int on = 0;
  for (int x = 0; x < w; ++x) {
    int column_on = 0;
    for (int y = 0; y < h; ++y) {
      column_on += s[size_t(y * w + x)];
      EXPECT_TRUE(!s[size_t(y * w + x)] || bar[size_t(y * w + x)]) << y << ", " << x;
    }
    EXPECT_LE(column_on, 1) << "column " << x;
    on += column_on;
  }
  EXPECT_GE(on, 8);
}

// The four counts and clDice of each golden case; the counts summed from two halves of the
// images (two ranks) equal one pass over all of them.
TEST(CenterlineDice, MatchesTheReference) {
  const Golden g;
  const std::vector<std::string> names = g.cases("cldice");
  ASSERT_GE(names.size(), 4u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string c = "cldice/" + name;
    const std::vector<int64_t> shape = g.shape(c + "/probability");
    ASSERT_EQ(shape.size(), 3u);
    const int n = int(shape[0]), h = int(shape[1]), w = int(shape[2]);
    const size_t image = size_t(h) * size_t(w);
    const std::vector<float> probability = g.floats(c + "/probability");
    const std::vector<uint8_t> mask = g.bytes(c + "/mask");
    const double threshold = g.float64(c + "/threshold");
    const std::vector<int64_t> want = g.int64s(c + "/counts");
    ASSERT_EQ(want.size(), 4u);
    app::CenterlineDice all, first, second;
    for (int i = 0; i < n; ++i) {
      const float* p = probability.data() + size_t(i) * image;
      const uint8_t* m = mask.data() + size_t(i) * image;
      all.add_probabilities(p, m, h, w, threshold);
      (i < n / 2 ? first : second).add_probabilities(p, m, h, w, threshold);
    }
    for (size_t k = 0; k < first.counts().size(); ++k) first.counts()[k] += second.counts()[k];
    for (const app::CenterlineDice* d : {&all, &first}) {
      std::printf("[cldice] %-13s t %.2f: counts %lld %lld %lld %lld, clDice %.6f\n", name.c_str(),
                  threshold, static_cast<long long>(d->counts()[0]),
                  static_cast<long long>(d->counts()[1]), static_cast<long long>(d->counts()[2]),
                  static_cast<long long>(d->counts()[3]), d->value());
      for (size_t k = 0; k < 4; ++k) EXPECT_EQ(d->counts()[k], want[k]) << "count " << k;
      EXPECT_NEAR(d->precision(), g.float64(c + "/precision"), 1e-12);
      EXPECT_NEAR(d->sensitivity(), g.float64(c + "/sensitivity"), 1e-12);
      EXPECT_NEAR(d->value(), g.float64(c + "/cldice"), 1e-12);
    }
  }
}

TEST(CenterlineDice, PerfectShiftedAndEmptyPredictions) {
  std::mt19937 rng(7);
  const int h = 40, w = 48;
  // A prediction equal to the truth: 1.
  app::CenterlineDice same;
  for (int i = 0; i < 5; ++i) {
    const std::vector<uint8_t> truth = random_cracks(rng, h, w);
    same.add_masks(truth.data(), truth.data(), h, w);
  }
  EXPECT_GT(same.counts()[app::CenterlineDice::kTrueSkeleton], 0);
  EXPECT_EQ(same.precision(), 1.0);
  EXPECT_EQ(same.sensitivity(), 1.0);
  EXPECT_EQ(same.value(), 1.0);
  // A 3-px vertical stroke, predicted 6 px to the right (more than its width): 0.
  std::vector<uint8_t> truth(size_t(h * w), 0), shifted(size_t(h * w), 0);
  for (int y = 2; y < h - 2; ++y)
    for (int x = 10; x < 13; ++x) truth[size_t(y * w + x)] = 1, shifted[size_t(y * w + x + 6)] = 1;
  app::CenterlineDice off;
  off.add_masks(shifted.data(), truth.data(), h, w);
  EXPECT_GT(off.counts()[app::CenterlineDice::kPredictedSkeleton], 0);
  EXPECT_EQ(off.precision(), 0.0);
  EXPECT_EQ(off.sensitivity(), 0.0);
  EXPECT_EQ(off.value(), 0.0);
  // The conventions for empty skeletons (centerline_dice.hpp).
  const std::vector<uint8_t> none(size_t(h * w), 0);
  app::CenterlineDice nothing, missed, false_alarm;
  nothing.add_masks(none.data(), none.data(), h, w);
  EXPECT_EQ(nothing.value(), 1.0);  // nothing true, nothing predicted
  missed.add_masks(none.data(), truth.data(), h, w);
  EXPECT_EQ(missed.precision(), 1.0);
  EXPECT_EQ(missed.sensitivity(), 0.0);
  EXPECT_EQ(missed.value(), 0.0);
  false_alarm.add_masks(truth.data(), none.data(), h, w);
  EXPECT_EQ(false_alarm.precision(), 0.0);
  EXPECT_EQ(false_alarm.sensitivity(), 1.0);
  EXPECT_EQ(false_alarm.value(), 0.0);
}

// dptrain's logits and dppredict's probabilities give the same counts for the same decisions
// (logits away from the threshold, where sigmoid's float rounding could tip them); images of
// different sizes one after another reuse the scratch; two halves summed equal one pass.
TEST(CenterlineDice, LogitsAndProbabilitiesAgreeAndHalvesSum) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> noise(-3.0f, 3.0f);
  for (const double t : {0.5, 0.7}) {
    SCOPED_TRACE(t);
    const float logit_threshold = float(std::log(t / (1.0 - t)));
    app::CenterlineDice from_logits, from_probabilities, first, second;
    const int images = 6;
    for (int i = 0; i < images; ++i) {
      const int h = 20 + 7 * i, w = 50 - 5 * i;
      const std::vector<uint8_t> truth = random_cracks(rng, h, w);
      std::vector<float> logits(truth.size()), probability(truth.size()), mask(truth.size());
      for (size_t k = 0; k < truth.size(); ++k) {
        float l = noise(rng) + (truth[k] ? 2.5f : -1.0f);
        if (std::fabs(l - logit_threshold) < 1e-3f) l = logit_threshold + 0.01f;
        logits[k] = l;
        probability[k] = float(1.0 / (1.0 + std::exp(-double(l))));
        mask[k] = float(truth[k]);
        ASSERT_EQ(l >= logit_threshold, double(probability[k]) >= t) << l;
      }
      from_logits.add_image(logits.data(), mask.data(), h, w, logit_threshold);
      from_probabilities.add_probabilities(probability.data(), truth.data(), h, w, t);
      (i < images / 2 ? first : second)
          .add_image(logits.data(), mask.data(), h, w, logit_threshold);
    }
    for (size_t k = 0; k < first.counts().size(); ++k) first.counts()[k] += second.counts()[k];
    EXPECT_GT(from_logits.counts()[app::CenterlineDice::kPredictedSkeleton], 0);
    EXPECT_EQ(from_logits.counts(), from_probabilities.counts());
    EXPECT_EQ(from_logits.counts(), first.counts());
    EXPECT_EQ(from_logits.value(), first.value());
    EXPECT_GT(from_logits.value(), 0.0);
    EXPECT_LT(from_logits.value(), 1.0);
  }
}

}  // namespace
}  // namespace dp
