// dppredict's crack measurements as files: the rows of measurements.csv and summary.csv, and the
// marks drawn on an overlay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/crack_measure.hpp"

namespace dp::app {

struct MeasureSettings {
  double pixel_size_mm = 0;  // millimetres per pixel; 0: the columns in pixels only
  int64_t min_crack_px = 1;  // smaller components are not cracks
};

// The header lines (with their newline). Every column name carries its unit.
//   measurements.csv, one row per crack: image, crack (1.. in raster order of the crack's first
//     pixel), area_px, length_px, steps_length_px, mean/median/max_width_px, widest_x_px,
//     widest_y_px, box_x_px, box_y_px, box_width_px, box_height_px; with a pixel size also
//     area_mm2, length_mm, mean/median/max_width_mm.
//   summary.csv, one row per image: image, image_width_px, image_height_px, cracks, area_px,
//     length_px (sum over its cracks), mean_width_px (over every skeleton pixel of its cracks),
//     max_width_px; with a pixel size also area_mm2, length_mm, mean_width_mm, max_width_mm.
std::string measurements_header(const MeasureSettings& settings);
std::string summary_header(const MeasureSettings& settings);

// The lines (each with its newline) of one image of height x width and its cracks.
struct MeasurementRows {
  std::string cracks;   // measurements.csv: one line per crack (none without cracks)
  std::string summary;  // summary.csv: one line
};
MeasurementRows measurement_rows(const std::string& image, int height, int width,
                                 const std::vector<data::Crack>& cracks,
                                 const MeasureSettings& settings);

// Draws onto an RGB image (height x width x 3): the skeleton (yellow) and a ring round the widest
// point of every crack (cyan), where an inspector looks first.
void draw_measurements(uint8_t* rgb, int height, int width, const std::vector<uint8_t>& skeleton,
                       const std::vector<data::Crack>& cracks);

// A CSV field: as it is, or quoted (RFC 4180) where it holds a comma, a quote or a line break.
std::string csv_field(const std::string& text);

}  // namespace dp::app
