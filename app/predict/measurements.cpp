// CSV rows and overlay marks of dppredict's crack measurements (--measure, --measure-only).
#include "predict/measurements.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "dp/error.hpp"

namespace dp::app {
namespace {

constexpr std::array<uint8_t, 3> kSkeletonColour = {255, 230, 0};
constexpr std::array<uint8_t, 3> kWidestColour = {0, 255, 255};
constexpr double kMinRingRadius = 4.0;  // pixels: a ring small cracks' widest points still show
constexpr double kRingGap = 2.0;        // pixels between the crack's edge and the ring

std::string number(double v, int digits) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}
std::string px(double v) {
  return number(v, 3);
}
std::string mm(double v) {
  return number(v, 4);
}

}  // namespace

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string measurements_header(const MeasureSettings& s) {
  std::string h =
      "image,crack,area_px,length_px,steps_length_px,mean_width_px,median_width_px,max_width_px,"
      "widest_x_px,widest_y_px,box_x_px,box_y_px,box_width_px,box_height_px";
  if (s.pixel_size_mm > 0) h += ",area_mm2,length_mm,mean_width_mm,median_width_mm,max_width_mm";
  return h + "\n";
}

std::string summary_header(const MeasureSettings& s) {
  std::string h =
      "image,image_width_px,image_height_px,cracks,area_px,length_px,mean_width_px,max_width_px";
  if (s.pixel_size_mm > 0) h += ",area_mm2,length_mm,mean_width_mm,max_width_mm";
  return h + "\n";
}

MeasurementRows measurement_rows(const std::string& image, int height, int width,
                                 const std::vector<data::Crack>& cracks, const MeasureSettings& s) {
  MeasurementRows rows;
  const std::string name = csv_field(image);
  const double k = s.pixel_size_mm;
  int64_t area = 0, skeleton = 0;
  double length = 0, width_sum = 0, max_width = 0;
  for (size_t i = 0; i < cracks.size(); ++i) {
    const data::Crack& c = cracks[i];
    rows.cracks += str_cat(
        name, ",", i + 1, ",", c.area_px, ",", px(c.length_px), ",", px(c.steps_length_px), ",",
        px(c.mean_width_px), ",", px(c.median_width_px), ",", px(c.max_width_px), ",", c.widest_x,
        ",", c.widest_y, ",", c.box_x, ",", c.box_y, ",", c.box_width, ",", c.box_height);
    if (k > 0)
      rows.cracks += str_cat(",", number(double(c.area_px) * k * k, 6), ",", mm(c.length_px * k),
                             ",", mm(c.mean_width_px * k), ",", mm(c.median_width_px * k), ",",
                             mm(c.max_width_px * k));
    rows.cracks += "\n";
    area += c.area_px;
    skeleton += c.skeleton_px;
    length += c.length_px;
    width_sum += c.mean_width_px * double(c.skeleton_px);
    max_width = std::max(max_width, c.max_width_px);
  }
  const double mean_width = skeleton > 0 ? width_sum / double(skeleton) : 0.0;
  rows.summary = str_cat(name, ",", width, ",", height, ",", cracks.size(), ",", area, ",",
                         px(length), ",", px(mean_width), ",", px(max_width));
  if (k > 0)
    rows.summary += str_cat(",", number(double(area) * k * k, 6), ",", mm(length * k), ",",
                            mm(mean_width * k), ",", mm(max_width * k));
  rows.summary += "\n";
  return rows;
}

void draw_measurements(uint8_t* rgb, int height, int width, const std::vector<uint8_t>& skeleton,
                       const std::vector<data::Crack>& cracks) {
  auto paint = [&](int y, int x, const std::array<uint8_t, 3>& colour) {
    if (y < 0 || y >= height || x < 0 || x >= width) return;
    uint8_t* p = rgb + 3 * (size_t(y) * size_t(width) + size_t(x));
    p[0] = colour[0], p[1] = colour[1], p[2] = colour[2];
  };
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      if (skeleton[size_t(y) * size_t(width) + size_t(x)] != 0) paint(y, x, kSkeletonColour);
  for (const data::Crack& c : cracks) {
    const double w = std::isfinite(c.max_width_px) ? c.max_width_px : 0.0;
    const double r = std::max(kMinRingRadius, w / 2 + kRingGap);
    const int steps =
        int(std::ceil(2 * std::numbers::pi * r * 2));  // two points per pixel of circumference
    for (int i = 0; i < steps; ++i) {
      const double a = 2 * std::numbers::pi * i / steps;
      paint(int(std::lround(c.widest_y + r * std::sin(a))),
            int(std::lround(c.widest_x + r * std::cos(a))), kWidestColour);
    }
  }
}

}  // namespace dp::app
