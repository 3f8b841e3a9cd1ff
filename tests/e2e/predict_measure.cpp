// dppredict's crack measurements and per-image rows as files: --measure-only and --measure equal
// to the library on the same masks, rows in input order on any number of ranks, --per-image rows
// that sum to the aggregate line, and one error line for each bad option.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "dp/crack_measure.hpp"
#include "dp/image_io.hpp"
#include "dp/synth.hpp"
#include "predict/measurements.hpp"
#include "test_util.hpp"
#include "trained_suite.hpp"

namespace dp {
namespace {

namespace fs = std::filesystem;

std::string mpi(int np, const std::string& binary, const std::string& args) {
  return test::mpiexec() + " -n " + std::to_string(np) + " " + binary + " " + args;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A crack-like mask: a few strokes of several widths (the synthetic crack renderer's masks).
std::vector<uint8_t> synthetic_mask(int width, int height, uint64_t seed) {
  data::SynthOptions so;
  so.width = width;
  so.height = height;
  std::vector<uint8_t> rgb(size_t(width) * size_t(height) * 3),
      mask(size_t(width) * size_t(height));
  data::render_synthetic(so, seed, rgb.data(), mask.data());
  for (uint8_t& v : mask) v = v != 0 ? 255 : 0;
  return mask;
}

// What dppredict must write for one mask: the library's rows.
app::MeasurementRows expected_rows(const std::string& name, const std::vector<uint8_t>& mask,
                                   int width, int height, const app::MeasureSettings& settings) {
  data::CrackMeasurer measurer(settings.min_crack_px);
  return app::measurement_rows(name, height, width, measurer.measure(mask.data(), height, width),
                               settings);
}

TEST(PredictMeasure, MeasureOnlyWritesTheLibrarysRowsInInputOrderOnAnyRanks) {
  test::TempDir dir;
  const std::string in = dir.file("masks");
  fs::create_directories(in);
  const app::MeasureSettings settings{0.25, 8};
  std::string cracks_want = app::measurements_header(settings);
  std::string summary_want = app::summary_header(settings);
  // Sorted by name as dppredict lists a folder; one name with a comma (quoted in the CSV), one
  // without cracks, one that is not an image (an error line, no rows).
  const std::vector<std::pair<std::string, std::pair<int, int>>> masks = {{"a_wide", {300, 200}},
                                                                          {"b,comma", {96, 128}},
                                                                          {"c_empty", {40, 30}},
                                                                          {"d_small", {64, 64}},
                                                                          {"e_tall", {120, 260}}};
  uint64_t seed = 11;
  for (const auto& [name, size] : masks) {
    const auto [w, h] = size;
    std::vector<uint8_t> mask = name == "c_empty" ? std::vector<uint8_t>(size_t(w) * size_t(h), 0)
                                                  : synthetic_mask(w, h, seed++);
    data::write_png(in + "/" + name + ".png", mask.data(), w, h, 1);
    const app::MeasurementRows rows = expected_rows(name, mask, w, h, settings);
    cracks_want += rows.cracks;
    summary_want += rows.summary;
  }
  std::ofstream(in + "/c_zbroken.png") << "not a png";
  std::string first_cracks;
  for (const int np : {1, 2, 3}) {
    const std::string out = dir.file(std::string("out") + std::to_string(np));
    const auto r = test::run_command(
        mpi(np, test::program("dppredict"),
            "--measure-only -q --pixel-size 0.25 --min-crack-px 8 -o " + out + " " + in));
    EXPECT_EQ(r.status, 6) << r.output;  // one input failed
    EXPECT_NE(r.output.find("c_zbroken.png"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("5 mask(s) measured, 1 failed"), std::string::npos) << r.output;
    const std::string cracks = read_text(out + "/measurements.csv");
    EXPECT_EQ(cracks, cracks_want) << "np " << np;
    EXPECT_EQ(read_text(out + "/summary.csv"), summary_want) << "np " << np;
    EXPECT_GT(lines_of(cracks).size(), 6u);  // several cracks per mask
    for (const auto& e : fs::directory_iterator(out))
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
  EXPECT_NE(summary_want.find("\"b,comma\",96,128,"), std::string::npos) << summary_want;
  EXPECT_NE(summary_want.find("c_empty,40,30,0,0,"), std::string::npos) << summary_want;
}

TEST(PredictMeasure, BadMeasureOptionsAreOneErrorLineAndNothingWritten) {
  test::TempDir dir;
  const std::string mask = dir.file("m.png");
  std::vector<uint8_t> pixels(32 * 32, 0);
  data::write_png(mask, pixels.data(), 32, 32, 1);
  const std::string out = dir.file("out");
  const std::string bin = std::string("ASAN_OPTIONS=detect_leaks=0 ") + test::program("dppredict");
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"--measure-only -o " + out + " --pixel-size 0 " + mask, "--pixel-size must be a positive"},
      {"--measure-only -o " + out + " --pixel-size -0.1 " + mask,
       "--pixel-size must be a positive"},
      {"--measure-only -o " + out + " --pixel-size abc " + mask, "pixel-size"},
      {"--measure-only " + mask, "--measure-only needs --out"},
      {"--measure-only -o " + out + " --min-crack-px 0 " + mask, "--min-crack-px"},
      {"--measure-only -o " + out + " -c x.h5 " + mask, "no --checkpoint"},
      {"-c x.h5 -o " + out + " --pixel-size 0.1 " + mask, "--pixel-size needs --measure"},
      {"-c x.h5 -o " + out + " --per-image rows.csv " + mask, "--per-image needs --dataset"},
      {"--measure-only -o " + out + " " + dir.file("missing.png"), "missing.png"},
  };
  for (const Case& c : cases) {
    const auto r = test::run_command(bin + " " + c.args);
    EXPECT_NE(r.status, 0) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out + "/measurements.csv")) << c.args;
  }
}

// With a model trained for one epoch by dptrain.
class PredictMeasureModel : public test::TrainedSuite<PredictMeasureModel> {
 public:
  static constexpr int kValSamples = 9, kSide = 64;
};

// --measure measures the masks dppredict writes: the rows equal the library's on those files.
TEST_F(PredictMeasureModel, MeasureGivesTheRowsOfTheWrittenMasks) {
  const std::string in = dir_->file("photos"), out = dir_->file("out");
  fs::create_directories(in);
  for (int i = 0; i < 3; ++i) {
    data::SynthOptions so;
    so.width = 160 + 40 * i;
    so.height = 128;
    std::vector<uint8_t> rgb(size_t(so.width) * size_t(so.height) * 3);
    std::vector<uint8_t> mask(size_t(so.width) * size_t(so.height));
    data::render_synthetic(so, uint64_t(100 + i), rgb.data(), mask.data());
    data::write_png(in + "/p" + std::to_string(i) + ".png", rgb.data(), so.width, so.height, 3);
  }
  const auto r = test::run_command(mpi(2, test::program("dppredict"),
                                       "-c " + checkpoint_ + " -q --threshold 0.3 --measure " +
                                           "--overlay --min-crack-px 4 -o " + out + " " + in));
  ASSERT_EQ(r.status, 0) << r.output;
  const app::MeasureSettings settings{0, 4};
  std::string cracks_want = app::measurements_header(settings);
  std::string summary_want = app::summary_header(settings);
  int64_t skeleton_pixels = 0, yellow = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string name = std::string("p") + std::to_string(i);
    const data::Image m =
        data::read_image(out + "/masks/" + name + ".png", data::PixelFormat::kGray);
    data::CrackMeasurer measurer(4);
    const auto& cracks = measurer.measure(m.pixels.data(), m.height, m.width);
    const app::MeasurementRows rows =
        app::measurement_rows(name, m.height, m.width, cracks, settings);
    cracks_want += rows.cracks;
    summary_want += rows.summary;
    // The overlay shows the skeleton in yellow.
    const data::Image o =
        data::read_image(out + "/overlay/" + name + ".png", data::PixelFormat::kRgb);
    for (size_t p = 0; p < measurer.skeleton().size(); ++p) {
      if (measurer.skeleton()[p] == 0) continue;
      ++skeleton_pixels;
      yellow += o.pixels[3 * p] == 255 && o.pixels[3 * p + 1] == 230 && o.pixels[3 * p + 2] == 0;
    }
  }
  EXPECT_EQ(read_text(out + "/measurements.csv"), cracks_want);
  EXPECT_EQ(read_text(out + "/summary.csv"), summary_want);
  EXPECT_GT(skeleton_pixels, 0) << "the model predicts no crack at 0.3: not a real test";
  EXPECT_GT(double(yellow), 0.9 * double(skeleton_pixels));  // rings may cross the skeleton
}

// --save-prob in its three formats holds one map (read back by Pillow: tests/tools/
// check_prob_maps.py), and --save-uncertainty with --tta writes the deviation map.
TEST_F(PredictMeasureModel, ProbabilityFormatsHoldOneMap) {
  const std::string probe = std::string(DP_TEST_PYTHON) + " -c 'import PIL, numpy' 2>&1";
  if (test::run_command(probe).status != 0)
    GTEST_SKIP() << "no Pillow/NumPy for " << DP_TEST_PYTHON << " (scripts/install-test-deps.sh)";
  const std::string in = dir_->file("formats_in");
  fs::create_directories(in);
  data::SynthOptions so;
  so.width = 150;
  so.height = 100;
  std::vector<uint8_t> rgb(150 * 100 * 3), mask(150 * 100);
  data::render_synthetic(so, 5, rgb.data(), mask.data());
  data::write_png(in + "/s.png", rgb.data(), 150, 100, 3);
  for (const std::string format : {"png16", "png8", "tiff32"}) {
    const auto r = test::run_command(mpi(1, test::program("dppredict"),
                                         "-c " + checkpoint_ + " -q --tta flips --save-prob " +
                                             "--save-uncertainty --prob-format " + format + " -o " +
                                             dir_->file(format) + " " + in));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const auto r =
      test::run_command(std::string(DP_TEST_PYTHON) + " " + DP_CHECK_PROB_MAPS + " " +
                        dir_->file("png16/prob") + " " + dir_->file("png8/prob") + " " +
                        dir_->file("tiff32/prob") + " " + dir_->file("png16/uncertainty") + " s");
  EXPECT_EQ(r.status, 0) << r.output;
  std::printf("[prob maps] %s", r.output.c_str());
}

double printed(const std::string& output, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex("metrics on .* " + name + " ([0-9.]+)")))
    return std::nan("");
  return std::stod(match[1]);
}

// --per-image: one row per sample in dataset order; the pixel counts sum to the aggregate's, the
// mean of the rows' best F is the printed OIS; the same file from 1 and 2 ranks.
TEST_F(PredictMeasureModel, PerImageRowsSumToTheAggregate) {
  std::string first;
  for (const int np : {1, 2}) {
    const std::string csv = dir_->file(std::string("per_image") + std::to_string(np) + ".csv");
    const auto r = test::run_command(mpi(
        np, test::program("dppredict"),
        "-c " + checkpoint_ + " --dataset " + data_ + " -q --threshold 0.4 --per-image " + csv));
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string text = read_text(csv);
    if (np == 1) first = text;
    EXPECT_EQ(text, first);
    const std::vector<std::string> lines = lines_of(text);
    ASSERT_EQ(lines.size(), 10u) << text;  // header + 9 validation samples
    EXPECT_EQ(lines[0].rfind("index,source,origin_y_px,origin_x_px,true_px,predicted_px,", 0), 0u);
    int64_t tp = 0, fp = 0, fn = 0;
    double best_f = 0;
    for (size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> f;
      std::stringstream s(lines[i]);
      for (std::string field; std::getline(s, field, ',');) f.push_back(field);
      ASSERT_EQ(f.size(), 16u) << lines[i];
      EXPECT_EQ(f[0], std::to_string(i - 1));
      const int64_t t = std::stoll(f[6]), p = std::stoll(f[7]), n = std::stoll(f[8]);
      EXPECT_EQ(std::stoll(f[4]), t + n);
      EXPECT_EQ(std::stoll(f[5]), t + p);
      EXPECT_NEAR(std::stod(f[9]), double(t) / std::max<double>(1, double(t + p + n)), 1e-6);
      tp += t, fp += p, fn += n;
      best_f += std::stod(f[14]);
    }
    EXPECT_GT(tp, 0) << text;
    EXPECT_NEAR(printed(r.output, "iou"), double(tp) / double(tp + fp + fn), 1e-7) << r.output;
    EXPECT_NEAR(printed(r.output, "precision"), double(tp) / double(tp + fp), 1e-7) << r.output;
    EXPECT_NEAR(printed(r.output, "ois"), best_f / 9, 1e-6) << r.output;
  }
}

}  // namespace
}  // namespace dp
