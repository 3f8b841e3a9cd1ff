// Preemption signal handlers that only record the signal (async-signal-safe), and the names
// --preempt-signal takes.
#include "train/signals.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>

#include "dp/error.hpp"

namespace dp::app {
namespace {

// Written by the handler, read by the training loop: the only state a handler may touch.
volatile std::sig_atomic_t g_preemption_signal = 0;
int g_depth = 0;  // PreemptionHandlers alive (one thread: dptrain's main, then its Trainer)
std::vector<int> g_installed;  // the signals the innermost instance handles

struct Named {
  const char* name;
  int signal;
};
constexpr std::array<Named, 8> kSignals = {{{"TERM", SIGTERM},
                                            {"USR1", SIGUSR1},
                                            {"USR2", SIGUSR2},
                                            {"HUP", SIGHUP},
                                            {"INT", SIGINT},
                                            {"QUIT", SIGQUIT},
                                            {"XCPU", SIGXCPU},
                                            {"ALRM", SIGALRM}}};

extern "C" void on_preemption_signal(int signal) {
  g_preemption_signal = signal;
}

void install(int signal, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and MPI progress continue after the handler
  DP_CHECK(sigaction(signal, &sa, old) == 0, "sigaction(", signal, "): ", std::strerror(errno));
}

// The signal of one name, or 0.
int signal_of(std::string name) {
  for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (const Named& n : kSignals)
    if (name == n.name) return n.signal;
  return 0;
}

}  // namespace

std::vector<std::string> default_preempt_signal_names() {
  return {"TERM", "USR1"};
}

std::vector<int> parse_preempt_signals(const std::vector<std::string>& names) {
  std::vector<int> signals;
  for (const std::string& name : names) {
    const int s = signal_of(name);
    if (s == 0) {
      std::string known;
      for (const Named& n : kSignals) known += std::string(known.empty() ? "" : ", ") + n.name;
      throw UsageError(
          str_cat("--preempt-signal: unknown signal '", name, "' (one of ", known, ")"));
    }
    if (std::find(signals.begin(), signals.end(), s) == signals.end()) signals.push_back(s);
  }
  if (signals.empty()) throw UsageError("--preempt-signal: give at least one signal");
  return signals;
}

std::vector<std::string> option_values_in_argv(int argc, const char* const* argv,
                                               const std::string& option) {
  std::vector<std::string> values;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == option && i + 1 < argc) {
      values.push_back(argv[++i]);
    } else if (a.rfind(option + "=", 0) == 0) {
      values.push_back(a.substr(option.size() + 1));
    }
  }
  return values;
}

std::vector<int> preempt_signals_in_argv(int argc, const char* const* argv) {
  const std::vector<std::string> names = option_values_in_argv(argc, argv, "--preempt-signal");
  try {
    if (!names.empty()) return parse_preempt_signals(names);
  } catch (const UsageError&) {
  }
  return parse_preempt_signals(default_preempt_signal_names());
}

std::string signal_names(const std::vector<int>& signals) {
  std::string text;
  for (const int s : signals) {
    std::string name = std::to_string(s);
    for (const Named& n : kSignals)
      if (n.signal == s) name = n.name;
    text += (text.empty() ? "SIG" : ", SIG") + name;
  }
  return text;
}

std::string nccl_signal_warning(const std::string& nccl_version, const std::vector<int>& signals) {
  const bool usr1 = std::find(signals.begin(), signals.end(), SIGUSR1) != signals.end();
  if (!usr1 || nccl_version.rfind("2.12.", 0) != 0) return {};
  return str_cat("NCCL ", nccl_version,
                 " installs its own SIGUSR1 handler (NVIDIA/nccl#704), so a SIGUSR1 preemption "
                 "notice may be lost; use --preempt-signal USR2 (with sbatch --signal=B:USR2@T) or "
                 "another NCCL release");
}

namespace {

// The actions the signals had before any PreemptionHandlers: restored when none handles them.
std::vector<std::pair<int, struct sigaction>> g_original;

bool contains(const std::vector<int>& v, int s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Makes `signals` the handled set: installs the new ones, gives the others back their originals.
void handle_only(const std::vector<int>& signals) {
  for (const int s : signals) {
    if (contains(g_installed, s)) continue;
    struct sigaction old {};
    install(s, &old);
    const bool known = std::any_of(g_original.begin(), g_original.end(),
                                   [s](const auto& o) { return o.first == s; });
    if (!known) g_original.emplace_back(s, old);
  }
  for (const auto& [s, old] : g_original)
    if (contains(g_installed, s) && !contains(signals, s)) sigaction(s, &old, nullptr);
  g_installed = signals;
}

}  // namespace

PreemptionHandlers::PreemptionHandlers(const std::vector<int>& signals) : outer_(g_installed) {
  if (g_depth == 0) g_preemption_signal = 0;
  handle_only(signals);
  ++g_depth;
}

PreemptionHandlers::~PreemptionHandlers() {
  --g_depth;
  try {
    handle_only(outer_);
  } catch (const std::exception&) {  // sigaction on a signal it accepted before: not expected
  }
  if (g_depth == 0) g_original.clear();
}

int preemption_signal() {
  return static_cast<int>(g_preemption_signal);
}

const std::vector<int>& preemption_signals() {
  return g_installed;
}

}  // namespace dp::app
