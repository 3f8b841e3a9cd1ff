// Preemption signals: --preempt-signal's names, the pre-scan of argv, nested handler sets, and the
// warning for NCCL releases that take SIGUSR1.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "train/signals.hpp"

namespace dp {
namespace {

using app::parse_preempt_signals;

// The action a signal has now: our handler or another (SIG_DFL, ...).
bool handled_by_us(int signal, void (*ours)(int)) {
  struct sigaction now {};
  sigaction(signal, nullptr, &now);
  return now.sa_handler == ours;
}

TEST(Signals, NamesParseWithOrWithoutSigAndRepeatsCollapse) {
  EXPECT_EQ(parse_preempt_signals({"TERM", "USR1"}), (std::vector<int>{SIGTERM, SIGUSR1}));
  EXPECT_EQ(parse_preempt_signals({"sigusr2", "USR2", "hup"}), (std::vector<int>{SIGUSR2, SIGHUP}));
  EXPECT_THROW(parse_preempt_signals({"KILL"}), app::UsageError);
  EXPECT_THROW(parse_preempt_signals({}), app::UsageError);
  EXPECT_EQ(app::signal_names({SIGUSR2, SIGTERM}), "SIGUSR2, SIGTERM");
}

TEST(Signals, ArgvPreScanFindsEveryOccurrenceAndFallsBackToTheDefault) {
  const char* both[] = {"dptrain",          "--epochs", "2",
                        "--preempt-signal", "USR2",     "--preempt-signal=XCPU"};
  EXPECT_EQ(app::preempt_signals_in_argv(6, both), (std::vector<int>{SIGUSR2, SIGXCPU}));
  const char* none[] = {"dptrain", "--epochs", "2"};
  EXPECT_EQ(app::preempt_signals_in_argv(3, none), (std::vector<int>{SIGTERM, SIGUSR1}));
  const char* bad[] = {"dptrain", "--preempt-signal", "KILL"};  // reported later by the parser
  EXPECT_EQ(app::preempt_signals_in_argv(3, bad), (std::vector<int>{SIGTERM, SIGUSR1}));
}

TEST(Signals, InnerSetReplacesTheOuterOneUntilItEnds) {
  struct sigaction original {};
  sigaction(SIGUSR1, nullptr, &original);
  {
    app::PreemptionHandlers outer(parse_preempt_signals({"TERM", "USR1"}));
    struct sigaction ours {};
    sigaction(SIGUSR1, nullptr, &ours);
    EXPECT_NE(ours.sa_handler, original.sa_handler);
    {
      app::PreemptionHandlers inner(parse_preempt_signals({"USR2"}));  // e.g. from --config
      EXPECT_EQ(app::preemption_signals(), (std::vector<int>{SIGUSR2}));
      EXPECT_FALSE(handled_by_us(SIGUSR1, ours.sa_handler));  // given back while inner lives
      EXPECT_TRUE(handled_by_us(SIGUSR2, ours.sa_handler));
      std::raise(SIGUSR2);
      EXPECT_EQ(app::preemption_signal(), SIGUSR2);
    }
    EXPECT_EQ(app::preemption_signals(), (std::vector<int>{SIGTERM, SIGUSR1}));
    EXPECT_TRUE(handled_by_us(SIGUSR1, ours.sa_handler));
    EXPECT_FALSE(handled_by_us(SIGUSR2, ours.sa_handler));
  }
  EXPECT_TRUE(handled_by_us(SIGUSR1, original.sa_handler));
  EXPECT_TRUE(app::preemption_signals().empty());
}

TEST(Signals, NcclThatTakesSigusr1IsOneWarning) {
  const std::vector<int> usr1 = {SIGTERM, SIGUSR1}, usr2 = {SIGUSR2};
  EXPECT_NE(app::nccl_signal_warning("2.12.10", usr1).find("--preempt-signal USR2"),
            std::string::npos);
  EXPECT_EQ(app::nccl_signal_warning("2.12.10", usr2), "");
  EXPECT_EQ(app::nccl_signal_warning("2.21.5", usr1), "");
  EXPECT_EQ(app::nccl_signal_warning("", usr1), "");  // no NCCL loaded
}

}  // namespace
}  // namespace dp
