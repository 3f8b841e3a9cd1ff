// Rank 0's progress output: the bar and the plain lines (format, ETA, when each is used), and
// dptrain's --progress bar / --log-every as a user sees them.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "progress.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += char(c);
  return s;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Progress, Formats) {
  const app::ProgressState s{2, 10, 13, 40, 0.41234, 85.31, 32.4};
  EXPECT_EQ(app::format_progress_bar(s, 8),
            "epoch 2/10 [##......] 13/40  loss 0.4123  85.3 img/s  ETA 0:32");
  EXPECT_EQ(app::format_progress_line(s),
            "  epoch 2 step 13/40  loss 0.4123  85.3 img/s  ETA 0:32");
  EXPECT_EQ(app::format_duration(7.4), "0:07");
  EXPECT_EQ(app::format_duration(754), "12:34");
  EXPECT_EQ(app::format_duration(3723), "1:02:03");
  EXPECT_EQ(app::format_duration(-3), "0:00");
}

TEST(Progress, BarOnlyOnATerminalUnlessAskedFor) {
  EXPECT_TRUE(app::use_progress_bar(app::ProgressStyle::kAuto, true, true));
  EXPECT_FALSE(app::use_progress_bar(app::ProgressStyle::kAuto, true,
                                     false));  // mpirun: pty stdout, pipe stderr
  EXPECT_FALSE(app::use_progress_bar(app::ProgressStyle::kAuto, false, false));
  EXPECT_TRUE(app::use_progress_bar(app::ProgressStyle::kBar, false, false));
  EXPECT_FALSE(app::use_progress_bar(app::ProgressStyle::kLines, true, true));
}

TEST(Progress, LinesEveryLogEveryStepsAndABarRedrawnInPlace) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  app::TrainProgress lines(true, false, 2, f);
  lines.start_epoch(1, 3, 0, 5);
  for (int s = 1; s <= 5; ++s) lines.step(s, 0.5, 4);
  const std::string l = read_all(f);
  EXPECT_EQ(count(l, "\n"), 2u) << l;  // steps 2 and 4
  EXPECT_EQ(l.find("  epoch 1 step 2/5  loss 0.5000  "), 0u) << l;
  EXPECT_NE(l.find("  epoch 1 step 4/5  loss 0.5000  "), std::string::npos) << l;
  std::fclose(f);

  f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  app::TrainProgress bar(true, true, 0, f);
  bar.start_epoch(2, 3, 1, 3);  // resumed after step 1
  bar.step(2, 0.25, 4);
  bar.step(3, 0.25, 4);  // the last step is always drawn
  bar.clear();
  const std::string b = read_all(f);
  EXPECT_EQ(b.find('\n'), std::string::npos) << b;
  EXPECT_NE(b.find("\repoch 2/3 ["), std::string::npos) << b;
  EXPECT_NE(b.find("] 3/3  loss 0.2500"), std::string::npos) << b;
  EXPECT_EQ(b.substr(b.size() - 4), "\r\033[K");
  std::fclose(f);

  f = std::tmpfile();
  app::TrainProgress off(false, true, 1, f);  // ranks other than 0
  off.start_epoch(1, 1, 0, 2);
  off.step(1, 0.1, 1);
  off.clear();
  EXPECT_TRUE(read_all(f).empty());
  std::fclose(f);
}

TEST(ProgressCli, BarAndLines) {
  test::TempDir dir;
  test::write_tiny_dataset(dir.file("tiny.h5"), 8, 4, 32);
  const std::string cmd = test::mpiexec() + " -n 1 " + test::program("dptrain") + " --data " +
                          dir.file("tiny.h5") +
                          " --width-divisor 16 --batch-size 2 --epochs 1 --resume never"
                          " --model-dir " +
                          dir.file("run");
  // Through a pipe, auto means lines.
  const auto lines = test::run_command(cmd + " --log-every 2");
  ASSERT_EQ(lines.status, 0) << lines.output;
  EXPECT_NE(lines.output.find("  epoch 1 step 2/4  loss "), std::string::npos) << lines.output;
  EXPECT_NE(lines.output.find("  epoch 1 step 4/4  loss "), std::string::npos) << lines.output;
  EXPECT_EQ(lines.output.find('\r'), std::string::npos) << lines.output;
  const auto bar = test::run_command(cmd + " --progress bar --log-every 2");
  ASSERT_EQ(bar.status, 0) << bar.output;
  EXPECT_NE(bar.output.find("\repoch 1/1 ["), std::string::npos) << bar.output;
  EXPECT_NE(bar.output.find(" img/s  ETA "), std::string::npos) << bar.output;
  EXPECT_EQ(bar.output.find("  epoch 1 step 2/4"), std::string::npos) << bar.output;
}

}  // namespace
}  // namespace dp
