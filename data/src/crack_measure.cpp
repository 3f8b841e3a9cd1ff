// Crack measurements: exact distance transform, 8-connected labelling, skeleton steps and widths.
#include "dp/crack_measure.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>

#include "dp/error.hpp"
#include "dp/skeleton.hpp"

namespace dp::data {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Vossepoel and Smeulders' corner-count length estimator (Comput. Graph. Image Process. 20, 1982).
constexpr double kOrthogonalStep = 0.980, kDiagonalStep = 1.406, kCorner = -0.091;
// A skeleton pixel is half a pixel from the crack's edge less than from the background centre.
constexpr double kWidthOffset = 0.5;

// The squared distance from every index of one line to the nearest "site" of finite squared
// height f (Felzenszwalb and Huttenlocher, Theory of Computing 8, 2012): d[q] = min_p (q-p)^2 +
// f[p] over the p with finite f[p]; +inf where there is none. v and z are scratch of n and n + 1.
void squared_distance_1d(const double* f, int n, double* d, int* v, double* z) {
  int k = -1;
  for (int q = 0; q < n; ++q) {
    if (!std::isfinite(f[q])) continue;
    if (k < 0) {
      k = 0, v[0] = q, z[0] = -kInf, z[1] = kInf;
      continue;
    }
    double s;
    while (true) {  // z[0] = -inf: ends at k = 0 at the latest
      const int p = v[k];
      s = ((f[q] + double(q) * q) - (f[p] + double(p) * p)) / (2.0 * (q - p));
      if (s > z[k]) break;
      --k;
    }
    ++k;
    v[k] = q, z[k] = s, z[k + 1] = kInf;
  }
  if (k < 0) {
    std::fill(d, d + n, kInf);
    return;
  }
  int j = 0;
  for (int q = 0; q < n; ++q) {
    while (z[j + 1] < q) ++j;
    const double dq = double(q - v[j]);
    d[q] = dq * dq + f[v[j]];
  }
}

// Calls f(q) for every 8-neighbour q of pixel p inside a height x width image (row-major).
template <typename F>
void for_each_neighbour(size_t p, int width, int height, F&& f) {
  const int py = int(p / size_t(width)), px = int(p % size_t(width));
  for (int dy = -1; dy <= 1; ++dy) {
    for (int dx = -1; dx <= 1; ++dx) {
      const int qy = py + dy, qx = px + dx;
      if ((dy != 0 || dx != 0) && qy >= 0 && qy < height && qx >= 0 && qx < width)
        f(size_t(qy) * size_t(width) + size_t(qx));
    }
  }
}

}  // namespace

void distance_to_background(const uint8_t* mask, int height, int width, float* distance) {
  DP_CHECK(height >= 0 && width >= 0, "distance_to_background: image size ", height, " x ", width);
  const size_t w = size_t(width), h = size_t(height);
  // Along each column: the squared distance to the nearest background pixel of the column.
  std::vector<double> column(h * w);
  for (size_t x = 0; x < w; ++x) {
    double last = -kInf;  // row of the last background pixel above
    for (size_t y = 0; y < h; ++y) {
      if (mask[y * w + x] == 0) last = double(y);
      column[y * w + x] = double(y) - last;
    }
    last = kInf;
    for (size_t y = h; y-- > 0;) {
      if (mask[y * w + x] == 0) last = double(y);
      const double up = column[y * w + x], down = last - double(y);
      const double nearest = std::min(up, down);
      column[y * w + x] = nearest * nearest;
    }
  }
  // Along each row: the lower envelope of the columns' parabolas.
  const size_t longest = std::max(h, w);
  std::vector<double> d(longest);
  std::vector<int> v(longest);
  std::vector<double> z(longest + 1);
  for (size_t y = 0; y < h; ++y) {
    squared_distance_1d(column.data() + y * w, width, d.data(), v.data(), z.data());
    for (size_t x = 0; x < w; ++x) distance[y * w + x] = float(std::sqrt(d[x]));
  }
}

int64_t erase_specks(uint8_t* mask, int height, int width, int64_t min_px) {
  DP_CHECK(height >= 0 && width >= 0, "erase_specks: image size ", height, " x ", width);
  if (min_px <= 1) return 0;  // every component has a pixel: no scan, no scratch
  const size_t n = size_t(width) * size_t(height);
  std::vector<uint8_t> seen(n, 0);
  std::vector<size_t> component;  // the component being filled, in breadth-first order
  int64_t cleared = 0;
  for (size_t start = 0; start < n; ++start) {
    if (mask[start] == 0 || seen[start] != 0) continue;
    component.assign(1, start);
    seen[start] = 1;
    for (size_t next = 0; next < component.size(); ++next) {  // breadth-first fill
      for_each_neighbour(component[next], width, height, [&](size_t q) {
        if (mask[q] != 0 && seen[q] == 0) seen[q] = 1, component.push_back(q);
      });
    }
    if (int64_t(component.size()) >= min_px) continue;
    for (const size_t p : component) mask[p] = 0;
    cleared += int64_t(component.size());
  }
  return cleared;
}

CrackMeasurer::CrackMeasurer(int64_t min_crack_px) : min_crack_px_(min_crack_px) {
  DP_CHECK(min_crack_px >= 1, "CrackMeasurer: min_crack_px ", min_crack_px, " (expected >= 1)");
}

const std::vector<Crack>& CrackMeasurer::measure(const uint8_t* mask, int height, int width) {
  DP_CHECK(height >= 0 && width >= 0, "CrackMeasurer: image size ", height, " x ", width);
  const size_t w = size_t(width), h = size_t(height), n = w * h;
  cracks_.clear();
  label_.assign(n, 0);
  // 8-connected components in raster order of their first pixel; those too small end as label 0.
  std::vector<int32_t> kept;  // component index -> crack index + 1 (0 when dropped)
  int32_t components = 0;
  for (size_t start = 0; start < n; ++start) {
    if (mask[start] == 0 || label_[start] != 0) continue;
    const int32_t id = ++components;
    Crack c;
    int x0 = width, y0 = height, x1 = -1, y1 = -1;
    stack_.assign(1, int64_t(start));
    label_[start] = id;
    while (!stack_.empty()) {
      const size_t p = size_t(stack_.back());
      stack_.pop_back();
      const int py = int(p / w), px = int(p % w);
      ++c.area_px;
      x0 = std::min(x0, px), x1 = std::max(x1, px), y0 = std::min(y0, py), y1 = std::max(y1, py);
      for_each_neighbour(p, width, height, [&](size_t q) {
        if (mask[q] != 0 && label_[q] == 0) label_[q] = id, stack_.push_back(int64_t(q));
      });
    }
    if (c.area_px < min_crack_px_) {
      kept.push_back(0);
      continue;
    }
    c.box_x = x0, c.box_y = y0, c.box_width = x1 - x0 + 1, c.box_height = y1 - y0 + 1;
    cracks_.push_back(c);
    kept.push_back(int32_t(cracks_.size()));
  }
  for (int32_t& l : label_) l = l > 0 ? kept[size_t(l - 1)] : 0;

  skeleton_.resize(n);
  skeletonize(mask, height, width, skeleton_.data(), thinning_);
  for (size_t i = 0; i < n; ++i)
    if (label_[i] == 0) skeleton_[i] = 0;  // the skeletons of specks
  distance_.resize(n);
  distance_to_background(mask, height, width, distance_.data());

  widths_.resize(cracks_.size());
  for (auto& list : widths_) list.clear();
  std::vector<std::array<double, 3>> steps(cracks_.size(), {0, 0, 0});  // orthogonal, diag, corners
  auto on = [&](int y, int x) {
    return y >= 0 && y < height && x >= 0 && x < width && skeleton_[size_t(y) * w + size_t(x)];
  };
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const size_t p = size_t(y) * w + size_t(x);
      if (skeleton_[p] == 0) continue;
      const size_t k = size_t(label_[p] - 1);
      Crack& c = cracks_[k];
      ++c.skeleton_px;
      const double wd = 2.0 * double(distance_[p]) - kWidthOffset;
      widths_[k].push_back(float(wd));
      if (widths_[k].size() == 1 || wd > c.max_width_px) {
        c.max_width_px = wd;
        c.widest_x = x, c.widest_y = y;
      }
      // The pixel's steps: every skeleton neighbour, less a diagonal one that an orthogonal
      // skeleton neighbour of both already joins. Each step is seen from its two ends: half each.
      int count = 0;
      std::array<int, 2> first{0, 0};
      bool corner = false;
      for (int dy = -1; dy <= 1; ++dy) {
        for (int dx = -1; dx <= 1; ++dx) {
          if ((dy == 0 && dx == 0) || !on(y + dy, x + dx)) continue;
          const bool diagonal = dy != 0 && dx != 0;
          if (diagonal && (on(y, x + dx) || on(y + dy, x))) continue;
          steps[k][diagonal ? 1 : 0] += 0.5;
          if (count == 0) first = {dy, dx};
          if (count == 1) corner = !(first[0] == -dy && first[1] == -dx);
          ++count;
        }
      }
      if (count == 2 && corner) steps[k][2] += 1;
    }
  }
  for (size_t k = 0; k < cracks_.size(); ++k) {
    Crack& c = cracks_[k];
    const auto [orthogonal, diagonal, corners] = steps[k];
    c.length_px = kOrthogonalStep * orthogonal + kDiagonalStep * diagonal + kCorner * corners;
    c.steps_length_px = orthogonal + std::sqrt(2.0) * diagonal;
    std::vector<float>& list = widths_[k];
    if (list.empty()) {  // no skeleton: no widths, the widest point at the box's corner
      c.widest_x = c.box_x, c.widest_y = c.box_y;
      continue;
    }
    double sum = 0;
    for (const float v : list) sum += v;
    c.mean_width_px = sum / double(list.size());
    // The median as NumPy's: the mean of the two middle values of an even count.
    const size_t mid = list.size() / 2;
    std::nth_element(list.begin(), list.begin() + std::ptrdiff_t(mid), list.end());
    double median = list[mid];
    if (list.size() % 2 == 0)
      median = 0.5 * (median + *std::max_element(list.begin(), list.begin() + std::ptrdiff_t(mid)));
    c.median_width_px = median;
  }
  return cracks_;
}

}  // namespace dp::data
