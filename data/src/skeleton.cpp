// Zhang-Suen thinning with scikit-image's deletion table: skeletons for the clDice metric.
#include "dp/skeleton.hpp"

#include <array>
#include <cstddef>

#include "dp/error.hpp"

namespace dp::data {
namespace {

// A pixel's 8 neighbours as the bits of a code 0..255 (scikit-image's weights).
constexpr int kNW = 1, kN = 2, kNE = 4, kE = 8, kSE = 16, kS = 32, kSW = 64, kW = 128;
// What a table entry says: deleted in the first sub-iteration, the second, or both.
constexpr uint8_t kFirst = 1, kSecond = 2, kBoth = kFirst | kSecond, kKeep = 0;
// Foreground that the current sub-iteration deletes once it has looked at every pixel.
constexpr uint8_t kMarked = 2;

struct Entry {
  int code;
  uint8_t deleted;
};

// Where scikit-image's hand-maintained table (skimage/morphology/_skeletonize_various_cy.pyx,
// _fast_skeletonize, unchanged from 0.19 through 0.26) departs from Zhang and Suen's conditions;
// found by comparing the two, entry by entry. Kept so that skeletons (and clDice) equal theirs.
constexpr std::array<Entry, 25> kScikitImageEntries{{
    {kNW | kN, kFirst},       {kN | kNE, kFirst},
    {kN | kE, kBoth},         {kNW | kN | kE, kFirst},
    {kNE | kE, kFirst},       {kN | kNE | kE, kFirst},
    {kE | kSE, kSecond},      {kN | kE | kSE, kSecond},
    {kE | kS, kBoth},         {kSE | kS, kKeep},
    {kE | kSE | kS, kSecond}, {kS | kSW, kSecond},
    {kE | kS | kSW, kSecond}, {kNE | kE | kS | kSW, kSecond},
    {kNW | kW, kKeep},        {kN | kW, kBoth},
    {kNW | kN | kW, kFirst},  {kN | kNE | kW, kFirst},
    {kS | kW, kBoth},         {kNW | kS | kW, kFirst},
    {kSE | kS | kW, kSecond}, {kSW | kW, kSecond},
    {kN | kSW | kW, kFirst},  {kN | kNE | kSW | kW, kFirst},
    {kS | kSW | kW, kSecond},
}};

// Zhang and Suen (CACM 27(3), 1984): with P2..P9 the neighbours clockwise from north, B the
// number of foreground ones and A the number of background-to-foreground steps around them, a
// pixel may go when 2 <= B <= 6 and A = 1; the first sub-iteration also needs P2 P4 P6 = 0 and
// P4 P6 P8 = 0, the second P2 P4 P8 = 0 and P2 P6 P8 = 0. Then scikit-image's own entries.
constexpr std::array<uint8_t, 256> make_table() {
  std::array<uint8_t, 256> table{};
  constexpr int kClockwise[8] = {kN, kNE, kE, kSE, kS, kSW, kW, kNW};  // P2..P9
  for (int code = 0; code < 256; ++code) {
    bool p[8] = {};
    for (int k = 0; k < 8; ++k) p[k] = (code & kClockwise[k]) != 0;
    int b = 0, a = 0;
    for (int k = 0; k < 8; ++k) {
      b += p[k] ? 1 : 0;
      a += !p[k] && p[(k + 1) % 8] ? 1 : 0;
    }
    if (b < 2 || b > 6 || a != 1) continue;
    const bool n = p[0], e = p[2], s = p[4], w = p[6];
    uint8_t deleted = kKeep;
    if (!(n && e && s) && !(e && s && w)) deleted |= kFirst;
    if (!(n && e && w) && !(n && s && w)) deleted |= kSecond;
    table[size_t(code)] = deleted;
  }
  for (const Entry& entry : kScikitImageEntries) table[size_t(entry.code)] = entry.deleted;
  return table;
}

constexpr std::array<uint8_t, 256> kTable = make_table();

}  // namespace

void skeletonize(const uint8_t* mask, int height, int width, uint8_t* skeleton) {
  std::vector<uint8_t> scratch;
  skeletonize(mask, height, width, skeleton, scratch);
}

void skeletonize(const uint8_t* mask, int height, int width, uint8_t* skeleton,
                 std::vector<uint8_t>& scratch) {
  DP_CHECK(height >= 0 && width >= 0, "skeletonize: size ", height, " x ", width);
  if (height == 0 || width == 0) return;
  const size_t h = size_t(height), w = size_t(width), stride = w + 2;
  // The image inside a border of background pixels: every pixel has 8 neighbours.
  scratch.assign(stride * (h + 2), 0);
  for (size_t y = 0; y < h; ++y)
    for (size_t x = 0; x < w; ++x) scratch[(y + 1) * stride + x + 1] = mask[y * w + x] != 0;
  uint8_t* const image = scratch.data();
  bool deleted = true;
  while (deleted) {
    deleted = false;
    for (const uint8_t sub_iteration : {kFirst, kSecond}) {
      // Mark first (marked pixels still count as foreground), delete after: in parallel.
      size_t first_row = h + 1, last_row = 0;
      for (size_t y = 1; y <= h; ++y) {
        uint8_t* const row = image + y * stride;
        const uint8_t* const up = row - stride;
        const uint8_t* const down = row + stride;
        for (size_t x = 1; x <= w; ++x) {
          if (!row[x]) continue;
          const int code = (up[x - 1] ? kNW : 0) | (up[x] ? kN : 0) | (up[x + 1] ? kNE : 0) |
                           (row[x + 1] ? kE : 0) | (down[x + 1] ? kSE : 0) | (down[x] ? kS : 0) |
                           (down[x - 1] ? kSW : 0) | (row[x - 1] ? kW : 0);
          if (kTable[size_t(code)] & sub_iteration) {
            row[x] = kMarked;
            if (first_row > h) first_row = y;
            last_row = y;
          }
        }
      }
      if (first_row > h) continue;
      deleted = true;
      for (size_t i = first_row * stride; i < (last_row + 1) * stride; ++i)
        if (image[i] == kMarked) image[i] = 0;
    }
  }
  for (size_t y = 0; y < h; ++y)
    for (size_t x = 0; x < w; ++x) skeleton[y * w + x] = image[(y + 1) * stride + x + 1];
}

}  // namespace dp::data
