// Crack measurements against analytic geometry (strokes of known length and width at 1x and 4x)
// and against the reference (tools/reference/crack_measure.py -> tests/golden/crack_measure.h5).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <string>
#include <vector>

#include "dp/crack_measure.hpp"
#include "dp/error.hpp"
#include "dp/h5.hpp"
#include "golden_util.hpp"

namespace dp {
namespace {

using Point =
    std::array<double, 2>;  // x, y in pixels; pixel (i, j) has its centre at (i + .5, j + .5)

// A mask of the pixels whose centres lie within width / 2 of the polyline `points`.
struct Canvas {
  int height, width;
  std::vector<uint8_t> mask;
  Canvas(int h, int w) : height(h), width(w), mask(size_t(h) * size_t(w), 0) {}
  void stroke(const std::vector<Point>& points, double stroke_width) {
    for (size_t s = 0; s + 1 < points.size(); ++s) {
      const Point p = points[s], q = points[s + 1];
      const double dx = q[0] - p[0], dy = q[1] - p[1], len2 = dx * dx + dy * dy;
      for (int y = 0; y < height; ++y) {
        for (int x = 0; x < width; ++x) {
          const double cx = x + 0.5 - p[0], cy = y + 0.5 - p[1];
          const double t = std::clamp((cx * dx + cy * dy) / len2, 0.0, 1.0);
          if (std::hypot(cx - t * dx, cy - t * dy) <= stroke_width / 2)
            mask[size_t(y) * size_t(width) + size_t(x)] = 255;
        }
      }
    }
  }
};

double polyline_length(const std::vector<Point>& points) {
  double l = 0;
  for (size_t s = 0; s + 1 < points.size(); ++s)
    l += std::hypot(points[s + 1][0] - points[s][0], points[s + 1][1] - points[s][1]);
  return l;
}

std::vector<Point> scaled(std::vector<Point> points, double k) {
  for (Point& p : points) p = {p[0] * k, p[1] * k};
  return points;
}

// The stated tolerances (docs/DESIGN.md, "Crack measurements"): length within 3% plus half the
// stroke's width (thinning stops up to a quarter of the width short of a round end); the median
// width within 1 px of the raster, at 1x and at 4x (there a quarter of a 1x pixel).
constexpr double kLengthTolerance = 0.03;
constexpr double kWidthTolerancePx = 1.0;
double length_tolerance(double length, double width) {
  return kLengthTolerance * length + width / 2;
}

struct Shape {
  std::string name;
  std::vector<Point> points;  // at 1x, in a 128 x 128 image
  double width;
};

std::vector<Shape> straight_strokes() {
  std::vector<Shape> shapes;
  for (const double angle : {0.0, 10.0, 22.5, 30.0, 45.0, 60.0, 80.0, 135.0}) {
    for (const double width : {3.0, 5.0, 8.0}) {
      const double a = angle * std::numbers::pi / 180, r = 45;
      shapes.push_back({"line " + std::to_string(int(angle * 10)) + "/10 deg, width " +
                            std::to_string(int(width)),
                        {{64 - r * std::cos(a), 64 - r * std::sin(a)},
                         {64 + r * std::cos(a), 64 + r * std::sin(a)}},
                        width});
    }
  }
  return shapes;
}

void expect_measured(const Shape& shape, int scale) {
  Canvas canvas(128 * scale, 128 * scale);
  const std::vector<Point> points = scaled(shape.points, scale);
  canvas.stroke(points, shape.width * scale);
  data::CrackMeasurer measurer(1);
  const std::vector<data::Crack>& cracks =
      measurer.measure(canvas.mask.data(), canvas.height, canvas.width);
  ASSERT_EQ(cracks.size(), 1u) << shape.name;
  const data::Crack& c = cracks[0];
  const double length = polyline_length(points), width = shape.width * scale;
  std::printf(
      "[measure] %-28s %dx: length %8.2f of %8.2f (%+5.2f%%), steps %+5.2f%%; median width "
      "%6.2f of %5.1f (%+5.2f px)\n",
      shape.name.c_str(), scale, c.length_px, length, 100 * (c.length_px / length - 1),
      100 * (c.steps_length_px / length - 1), c.median_width_px, width, c.median_width_px - width);
  EXPECT_NEAR(c.length_px, length, length_tolerance(length, width))
      << shape.name << " at " << scale << "x";
  EXPECT_NEAR(c.median_width_px, width, kWidthTolerancePx) << shape.name << " at " << scale << "x";
  EXPECT_LE(c.median_width_px, c.max_width_px);
  int64_t area = 0;
  for (const uint8_t v : canvas.mask) area += v != 0;
  EXPECT_EQ(c.area_px, area);
}

TEST(CrackMeasure, StraightStrokesOfKnownLengthAndWidth) {
  for (const Shape& s : straight_strokes()) {
    expect_measured(s, 1);
    expect_measured(s, 4);
  }
}

TEST(CrackMeasure, CurvedAndBranchingStrokes) {
  std::vector<Point> arc;  // a quarter circle of radius 70 about (20, 110)
  constexpr int kArcPoints = 90;
  for (int i = 0; i <= kArcPoints; ++i) {
    const double a = -std::numbers::pi / 2 * i / kArcPoints;
    arc.push_back({20 + 70 * std::cos(a), 110 + 70 * std::sin(a)});
  }
  expect_measured({"quarter circle r 70, width 4", arc, 4}, 1);
  expect_measured({"quarter circle r 70, width 4", arc, 4}, 4);
  const std::vector<Point> zigzag = {{10, 20}, {60, 100}, {110, 30}};
  expect_measured({"bent stroke, width 5", zigzag, 5}, 1);
  expect_measured({"bent stroke, width 5", zigzag, 5}, 4);
  // A Y: two arms from a junction; the skeleton's length is the sum of the three segments.
  for (const int scale : {1, 4}) {
    Canvas canvas(128 * scale, 128 * scale);
    const std::vector<Point> stem = scaled({{64, 120}, {64, 64}, {14, 10}}, scale);
    const std::vector<Point> arm = scaled({{64, 64}, {114, 10}}, scale);
    canvas.stroke(stem, 5 * scale);
    canvas.stroke(arm, 5 * scale);
    data::CrackMeasurer measurer(1);
    const auto& cracks = measurer.measure(canvas.mask.data(), canvas.height, canvas.width);
    ASSERT_EQ(cracks.size(), 1u);
    const double length = polyline_length(stem) + polyline_length(arm);
    std::printf(
        "[measure] branching Y, width 5 %dx: length %.2f of %.2f (%+.2f%%), median width "
        "%.2f of %d\n",
        scale, cracks[0].length_px, length, 100 * (cracks[0].length_px / length - 1),
        cracks[0].median_width_px, 5 * scale);
    EXPECT_NEAR(cracks[0].length_px, length, length_tolerance(length, 5.0 * scale));
    EXPECT_NEAR(cracks[0].median_width_px, 5.0 * scale, kWidthTolerancePx);
  }
}

TEST(CrackMeasure, SeparateCracksWidestPointAndSpecks) {
  Canvas canvas(64, 96);
  canvas.stroke({{5, 10}, {60, 10}}, 3);   // thin, first in raster order
  canvas.stroke({{10, 40}, {90, 40}}, 3);  // a second one, with a wide part
  canvas.stroke({{70, 40}, {80, 40}}, 9);
  canvas.mask[size_t(60) * 96 + 3] = 255;  // a speck of one pixel
  data::CrackMeasurer all(1), cracks_only(2);
  EXPECT_EQ(all.measure(canvas.mask.data(), 64, 96).size(), 3u);
  const auto& cracks = cracks_only.measure(canvas.mask.data(), 64, 96);
  ASSERT_EQ(cracks.size(), 2u);
  EXPECT_EQ(cracks[0].box_y, 8);   // pixel centres within 1.5 of y = 10: rows 8..10
  EXPECT_EQ(cracks[1].box_y, 35);  // within 4.5 of y = 40: rows 35..44
  EXPECT_NEAR(cracks[1].max_width_px, 9.0, 1.0);
  EXPECT_GE(cracks[1].widest_x, 70);  // the widest point lies in the wide part
  EXPECT_LE(cracks[1].widest_x, 80);
  EXPECT_NEAR(cracks[1].widest_y, 39.5, 0.5);
  EXPECT_EQ(cracks_only.skeleton()[size_t(60) * 96 + 3], 0);  // no skeleton for the speck
  EXPECT_THROW(data::CrackMeasurer(0), Error);
}

// erase_specks against the measurer's own labelling, on random masks: what stays is exactly the
// components of at least min_px pixels (8-connected: diagonal neighbours join), values kept.
TEST(CrackMeasure, EraseSpecksKeepsExactlyTheComponentsOfAtLeastMinPixels) {
  const int h = 48, w = 64;
  uint64_t s = 7;
  for (const int min_px : {2, 5, 20}) {
    std::vector<uint8_t> mask(size_t(h) * w, 0);
    for (uint8_t& v : mask) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v = (s >> 58) < 19 ? 200 : 0;  // 30% crack: many small components, some large
    }
    data::CrackMeasurer every(1);
    int64_t big = 0, small = 0, big_components = 0;
    for (const data::Crack& c : every.measure(mask.data(), h, w)) {
      (c.area_px >= min_px ? big : small) += c.area_px;
      big_components += c.area_px >= min_px;
    }
    ASSERT_GT(small, 0);
    ASSERT_GT(big_components, 0);
    std::vector<uint8_t> erased = mask;
    EXPECT_EQ(data::erase_specks(erased.data(), h, w, min_px), small) << min_px;
    int64_t left = 0;
    for (size_t i = 0; i < mask.size(); ++i) {
      ASSERT_TRUE(erased[i] == 0 || erased[i] == mask[i]) << i;
      left += erased[i] != 0;
    }
    EXPECT_EQ(left, big);
    const auto& after = every.measure(erased.data(), h, w);
    EXPECT_EQ(int64_t(after.size()), big_components);
    for (const data::Crack& c : after) EXPECT_GE(c.area_px, min_px);
  }
  std::vector<uint8_t> diagonal = {255, 0, 0, 255};  // 2x2: one component of 2 pixels
  EXPECT_EQ(data::erase_specks(diagonal.data(), 2, 2, 2), 0);
  EXPECT_EQ(data::erase_specks(diagonal.data(), 2, 2, 3), 2);
  EXPECT_EQ(diagonal, std::vector<uint8_t>(4, 0));
}

std::string golden_path() {
  return std::string(DP_GOLDEN_DIR) + "/crack_measure.h5";
}

std::vector<uint8_t> read_mask(const h5::File& file, const std::string& path) {
  const h5::Dataset d = h5::Dataset::open(file, path);
  std::vector<uint8_t> m(size_t(d.numel()));
  d.read(m.data());
  return m;
}

// Every field of every crack equal to the reference's: counts exactly, lengths and widths to the
// precision of a float distance.
TEST(CrackMeasure, EqualsTheReferenceOnItsCases) {
  const test::Golden golden(golden_path());
  const h5::File file(golden_path(), h5::Mode::kRead);
  std::printf("[measure] %s: scikit-image %s\n", golden_path().c_str(),
              file.attr_string("skimage_version").c_str());
  constexpr int kColumns = 13;
  int cases = 0, cracks = 0;
  double worst = 0;
  for (const std::string& name : file.open_group("measure").children()) {
    const std::string g = "measure/" + name;
    const std::vector<int64_t> shape = golden.shape(g + "/mask");
    const int h = int(shape[0]), w = int(shape[1]);
    const std::vector<uint8_t> mask = read_mask(file, g + "/mask");
    const std::vector<float> want = golden.read(g + "/cracks");
    data::CrackMeasurer measurer(golden.attr_int(g, "min_crack_px"));
    const auto& got = measurer.measure(mask.data(), h, w);
    ASSERT_EQ(got.size() * kColumns, want.size()) << name;
    for (size_t k = 0; k < got.size(); ++k) {
      const data::Crack& c = got[k];
      const double fields[kColumns] = {
          double(c.area_px),    double(c.box_x),       double(c.box_y), double(c.box_width),
          double(c.box_height), double(c.skeleton_px), c.length_px,     c.steps_length_px,
          c.mean_width_px,      c.median_width_px,     c.max_width_px,  double(c.widest_x),
          double(c.widest_y)};
      for (int j = 0; j < kColumns; ++j) {
        const double r = want[k * kColumns + size_t(j)];
        if (std::isinf(r)) {
          EXPECT_TRUE(std::isinf(fields[j])) << name << " crack " << k << " field " << j;
          continue;
        }
        const double err = std::abs(fields[j] - r) / std::max(1.0, std::abs(r));
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-5) << name << " crack " << k << " field " << j << ": " << fields[j]
                             << " vs " << r;
      }
    }
    ++cases, cracks += int(got.size());
  }
  std::printf("[measure] %d cases, %d cracks: max relative difference %.2e\n", cases, cracks,
              worst);
  EXPECT_GT(cracks, 50);
}

TEST(CrackMeasure, DistanceTransformEqualsSciPy) {
  const test::Golden golden(golden_path());
  const h5::File file(golden_path(), h5::Mode::kRead);
  for (const std::string& name : file.open_group("distance").children()) {
    const std::string g = "distance/" + name;
    const std::vector<int64_t> shape = golden.shape(g + "/mask");
    const std::vector<uint8_t> mask = read_mask(file, g + "/mask");
    const std::vector<float> want = golden.read(g + "/distance");
    std::vector<float> got(mask.size(), -1);
    data::distance_to_background(mask.data(), int(shape[0]), int(shape[1]), got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isinf(want[i])) {
        EXPECT_TRUE(std::isinf(got[i])) << name << " pixel " << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, want[i])) << name << " pixel " << i;
      }
    }
  }
}

}  // namespace
}  // namespace dp
