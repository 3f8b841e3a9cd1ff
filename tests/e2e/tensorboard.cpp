// dptrain --tensorboard: record framing and CRC, trimming on resume, a full disk, and event files
// read back by the tensorboard package after preempted and killed runs
// (tools/check_tensorboard.py).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "train/tensorboard.hpp"
#include "train/tensorboard_event.pb.h"

namespace dp {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The one event file of a tb/ directory.
std::string event_file(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u) << dir;
  return files.empty() ? std::string() : files.front();
}

// Steps of the summary events in a file (its version record first: -1), and config text steps.
struct FileSteps {
  std::vector<int64_t> steps, config;
  size_t records = 0;
};
FileSteps file_steps(const std::string& path) {
  const std::string bytes = read_bytes(path);
  const app::RecordScan scan = app::scan_records(bytes);
  EXPECT_EQ(scan.stop, "") << path;
  EXPECT_EQ(scan.whole_bytes, bytes.size());
  FileSteps s;
  s.records = scan.records.size();
  for (const std::string& r : scan.records) {
    tb::Event e;
    EXPECT_TRUE(e.ParseFromString(r));
    if (e.what_case() == tb::Event::kFileVersion) {
      EXPECT_EQ(e.file_version(), "brain.Event:2");
      s.steps.push_back(-1);
    } else if (e.summary().value(0).tag() == "config") {
      s.config.push_back(e.step());
    } else {
      s.steps.push_back(e.step());
    }
  }
  return s;
}

TEST(TensorBoard, Crc32cIsCastagnolis) {
  // The CRC-32C check value (RFC 3720, B.4): "123456789" -> 0xE3069283, before the mask.
  const std::string check = "123456789";
  const uint32_t masked = app::masked_crc32c(check.data(), check.size());
  const uint32_t rotated = masked - 0xa282ead8u;
  EXPECT_EQ((rotated << 15) | (rotated >> 17), 0xE3069283u);
  // Framing: length, its CRC, the data, its CRC.
  const std::string rec = app::frame_record("abc");
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(rec[0], 3);
  EXPECT_EQ(rec.substr(12, 3), "abc");
}

TEST(TensorBoard, ScanStopsAtATornOrCorruptRecord) {
  const std::string whole = app::frame_record("first") + app::frame_record("second");
  const std::string third = app::frame_record("third record");
  for (size_t cut = 1; cut < third.size(); ++cut) {
    const app::RecordScan s = app::scan_records(whole + third.substr(0, cut));
    ASSERT_EQ(s.records.size(), 2u) << cut;
    EXPECT_EQ(s.records[1], "second");
    EXPECT_EQ(s.whole_bytes, whole.size());
    EXPECT_NE(s.stop.find("cut short"), std::string::npos) << cut << ": " << s.stop;
  }
  std::string corrupt = whole + third;
  corrupt[whole.size() + 14] ^= 1;  // a bit of the third record's data
  const app::RecordScan s = app::scan_records(corrupt);
  EXPECT_EQ(s.records.size(), 2u);
  EXPECT_NE(s.stop.find("corrupt record at byte"), std::string::npos) << s.stop;
  EXPECT_EQ(app::scan_records(whole + third).stop, "");
}

TEST(TensorBoard, ResumeKeepsEarlierStepsAndDropsLaterOnesAndATornTail) {
  test::TempDir dir;
  const Logger log;
  {
    app::TensorBoardLog tb(dir.path(), 0, 1, log);
    tb.config(0, "a = 1");
    for (int64_t step = 1; step <= 10; ++step) tb.step(step, 1.0, 2.0, 4, 0.1);
  }
  const std::string tb_dir = dir.file(app::TensorBoardLog::kDirName);
  const std::string path = event_file(tb_dir);
  EXPECT_EQ(file_steps(path).steps, (std::vector<int64_t>{-1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  { std::ofstream(path, std::ios::app | std::ios::binary) << app::frame_record("x").substr(0, 7); }
  {  // resumed after step 6 (the kill came later): 7..10 are done again
    app::TensorBoardLog tb(dir.path(), 6, 1, log);
    tb.config(6, "a = 2");
    tb.start_window();
    for (int64_t step = 7; step <= 8; ++step) tb.step(step, 1.0, 2.0, 4, 0.1);
  }
  EXPECT_EQ(event_file(tb_dir), path);  // the same file, appended
  FileSteps s = file_steps(path);
  EXPECT_EQ(s.steps, (std::vector<int64_t>{-1, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s.config, (std::vector<int64_t>{0, 6}));
  {  // restarted at the same step: its configuration text is written once
    app::TensorBoardLog tb(dir.path(), 8, 1, log);
    tb.config(8, "a = 3");
  }
  s = file_steps(path);
  EXPECT_EQ(s.config, (std::vector<int64_t>{0, 6, 8}));
  {
    app::TensorBoardLog tb(dir.path(), 8, 1, log);
    tb.config(8, "a = 4");
  }
  EXPECT_EQ(file_steps(path).config, (std::vector<int64_t>{0, 6, 8}));
  {  // a fresh start in the same directory keeps nothing but the version record
    app::TensorBoardLog tb(dir.path(), 0, 1, log);
  }
  EXPECT_EQ(file_steps(path).steps, (std::vector<int64_t>{-1}));
  for (const auto& e : fs::directory_iterator(tb_dir))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(TensorBoard, PointsEveryLogEveryStepsWithTheWindowsMeanLoss) {
  test::TempDir dir;
  {
    app::TensorBoardLog tb(dir.path(), 0, 3, Logger());
    for (int64_t step = 1; step <= 7; ++step) tb.step(step, double(step), 1.0, 2, 0.5);
  }
  const std::string bytes = read_bytes(event_file(dir.file("tb")));
  const app::RecordScan scan = app::scan_records(bytes);
  std::vector<std::pair<int64_t, float>> losses;
  for (const std::string& r : scan.records) {
    tb::Event e;
    ASSERT_TRUE(e.ParseFromString(r));
    for (const auto& v : e.summary().value())
      if (v.tag() == "train/loss") losses.emplace_back(e.step(), v.simple_value());
  }
  // Steps 3 and 6: the mean per pixel of steps 1-3 and 4-6; step 7 is not a point yet.
  EXPECT_EQ(losses, (std::vector<std::pair<int64_t, float>>{{3, 2.0f}, {6, 5.0f}}));
}

TEST(TensorBoard, AFullDiskEndsTheEventsWithWholeRecordsAndAWarning) {
  test::TempDir dir;
  app::TensorBoardLog tb(dir.path(), 0, 1, Logger());
  tb.config(0, "a = 1");
  const std::string path = event_file(dir.file("tb"));
  const auto before = fs::file_size(path);
  // A file-size limit a little above the file's size: the next image does not fit (EFBIG).
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = rlim_t(before + 100);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  testing::internal::CaptureStderr();
  std::vector<uint8_t> noise(64 * 64 * 3);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = uint8_t(i * 7919 % 251);
  tb.image(1, "samples/0", noise.data(), 64, 64, 3);
  tb.step(1, 1.0, 1.0, 1, 0.1);  // nothing more is written
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(err.find("writing '" + path + "' failed"), std::string::npos) << err;
  EXPECT_NE(err.find("training goes on"), std::string::npos) << err;
  EXPECT_EQ(fs::file_size(path), before);  // the partial record was taken back
  EXPECT_EQ(file_steps(path).records, 2u);
}

// Whole runs: 2 ranks, 16 training and 8 validation images of 32x32, batch 2: 4 steps an epoch.
class TensorBoardRun : public ::testing::Test {
 protected:
  static constexpr int kEpochs = 3, kStepsPerEpoch = 4;
  void SetUp() override {
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 16, 8, 32);
  }
  test::CommandResult train(const std::string& model_dir, const std::string& extra = "") {
    return test::run_command(test::mpiexec() + " -n 2 " + test::program("dptrain") + extra +
                             " --data " + data_ +
                             " --width-divisor 16 --batch-size 2 --lr 0.2 --log-every 1 "
                             "--deterministic --tensorboard --epochs " +
                             std::to_string(kEpochs) + " --model-dir " + model_dir);
  }
  // tools/check_tensorboard.py on `run` against the uninterrupted run.
  test::CommandResult check(const std::string& run, int resumed_at) {
    return test::run_command(std::string(DP_TEST_PYTHON) + " " + DP_CHECK_TENSORBOARD + " " + run +
                             " " + dir_.file("whole") + " --epochs " + std::to_string(kEpochs) +
                             " --steps-per-epoch " + std::to_string(kStepsPerEpoch) +
                             " --resumed-at " + std::to_string(resumed_at));
  }
  test::TempDir dir_;
  std::string data_;
};

TEST_F(TensorBoardRun, PreemptedAndKilledRunsReadBackAsOneContinuousCurve) {
  const auto probe =
      test::run_command(std::string(DP_TEST_PYTHON) + " -c 'import tensorboard, PIL, numpy' 2>&1");
  if (probe.status != 0)
    GTEST_SKIP() << "no tensorboard/Pillow for " << DP_TEST_PYTHON
                 << " (scripts/install-test-deps.sh installs them): " << probe.output;
  auto r = train(dir_.file("whole"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tensorboard: events in"), std::string::npos) << r.output;

  // Preempted in epoch 2 after step 6 (rank 1's SIGUSR1), then resumed mid-epoch.
  r = train(dir_.file("preempted"), " --test-fault preempt@1:6");
  ASSERT_EQ(r.status, 75) << r.output;
  r = train(dir_.file("preempted"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = check(dir_.file("preempted"), 6);
  EXPECT_EQ(r.status, 0) << r.output;

  // Killed in epoch 3 after its events were written: model_epoch_3.h5 never came, and the last
  // event record is torn. The rerun resumes from epoch 2 (step 8) and writes steps 9..12 again.
  r = train(dir_.file("killed"));
  ASSERT_EQ(r.status, 0) << r.output;
  fs::remove(dir_.file("killed/model_epoch_3.h5"));
  const std::string events = event_file(dir_.file("killed/tb"));
  std::ofstream(events, std::ios::app | std::ios::binary) << app::frame_record("torn").substr(0, 9);
  r = train(dir_.file("killed"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from epoch 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("9 byte(s) dropped"), std::string::npos) << r.output;
  r = check(dir_.file("killed"), 2 * kStepsPerEpoch);
  EXPECT_EQ(r.status, 0) << r.output;
}

// --random-crop: the model sees 32x32 crops, so the samples shown are validation's centred crops
// (they were whole 64x64 images, fed to a model set up for 32x32).
TEST_F(TensorBoardRun, SamplesAreValidationsCentredCrop) {
  const std::string data = dir_.file("tiny64.h5");
  test::write_tiny_dataset(data, 8, 4, 64);
  const auto r =
      test::run_command(test::mpiexec() + " -n 1 " + test::program("dptrain") + " --data " + data +
                        " --width-divisor 16 --batch-size 2 --epochs 1 " +
                        "--random-crop 32x32 --tensorboard --model-dir " + dir_.file("crop"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string bytes = read_bytes(event_file(dir_.file("crop/tb")));
  int images = 0;
  for (const std::string& rec : app::scan_records(bytes).records) {
    tb::Event e;
    ASSERT_TRUE(e.ParseFromString(rec));
    for (const auto& v : e.summary().value()) {
      if (!v.has_image()) continue;
      ++images;
      EXPECT_EQ(v.image().height(), 32) << v.tag();
      EXPECT_EQ(v.image().width(), 3 * 32 + 2 * 4) << v.tag();  // three panels, two gaps
    }
  }
  EXPECT_EQ(images, 4);
}

TEST_F(TensorBoardRun, NoEventsWithoutTheOption) {
  const auto r = test::run_command(
      test::mpiexec() + " -n 1 " + test::program("dptrain") + " --data " + data_ +
      " --width-divisor 16 --batch-size 2 --epochs 1 " + "--model-dir " + dir_.file("run"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("run/tb")));
}

}  // namespace
}  // namespace dp
