// What the ranks agree on around each optimiser step: preemption, a diverged step (non-finite
// values, an exploded loss), parameter sync and the stall watch on collectives.
#include "train/step_guard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "agreement.hpp"
#include "dp/checkpoint.hpp"
#include "dp/mpi_comm.hpp"
#include "train/signals.hpp"

namespace dp::app {
namespace {

// FNV-1a over 32-bit words: any single differing word changes the result.
uint64_t hash_floats(const float* p, int64_t n) {
  constexpr uint64_t kOffset = 0xcbf29ce484222325ull, kPrime = 0x100000001b3ull;
  uint64_t h = kOffset;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, p + i, sizeof bits);
    h = (h ^ bits) * kPrime;
  }
  return h;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

}  // namespace

StepGuard::StepGuard(const TrainOptions& options, Comm& comm, Logger log, TrainProgress& progress)
    : opt_(options), comm_(comm), log_(log), progress_(progress) {}

StepGuard::~StepGuard() = default;

void StepGuard::start_watchdog(std::function<void()> before_abort) {
  if (opt_.stall_timeout <= 0) return;
  if (auto* mpi_comm = dynamic_cast<mpi::MpiComm*>(&comm_))
    watchdog_ = std::make_unique<mpi::StallWatchdog>(*mpi_comm, opt_.stall_timeout, "dptrain",
                                                     kExitStalled, std::move(before_abort));
}

std::optional<mpi::StallWatchdog::Scope> StepGuard::watch(const char* collective,
                                                          int64_t run_step) {
  if (!watchdog_) return std::nullopt;
  return watchdog_->watch(collective, run_step);
}

StepGuard::Agreement StepGuard::agree(int64_t run_step, double loss_sum, double pixels,
                                      bool grad_finite) {
  // [0]: ranks with a preemption signal; [1], [2]: the step's loss and pixels; [3 + r]: rank r's
  // non-finite flags (1 loss, 2 gradient). Small integers are exact in doubles.
  constexpr size_t kFlags = 3;
  const size_t world = size_t(comm_.size());
  const bool loss_finite = std::isfinite(loss_sum);
  std::vector<double> v(kFlags + world, 0.0);
  v[0] = preemption_signal() != 0 ? 1 : 0;
  v[1] = loss_finite ? loss_sum : 0.0;
  v[2] = pixels;
  v[kFlags + size_t(comm_.rank())] = (loss_finite ? 0 : 1) | (grad_finite ? 0 : 2);
  {
    const auto waiting = watch("step agreement", run_step);
    comm_.allreduce_sum(v.data(), v.size());
  }
  Agreement a;
  a.preempt = v[0] > 0;
  for (size_t r = 0; r < world; ++r) {
    const int flags = int(v[kFlags + r]);
    if ((flags & 1) != 0) a.nonfinite_loss.push_back(int(r));
    if ((flags & 2) != 0) a.nonfinite_grad.push_back(int(r));
  }
  // The explosion bound: the first step's loss is the untrained model's (1.7-1.9 for UNet16,
  // 9.6-15 for the full-width ResNet UNets), which training lowers; --divergence-factor times it
  // is far above the early spikes of runs that trained (13x at most) and far below the 1e8 of a
  // run whose weights blew up (docs/DESIGN.md "Divergence guard").
  if (a.finite() && v[2] > 0) {
    a.loss = v[1] / v[2];
    if (reference_loss_ <= 0) reference_loss_ = a.loss;
    a.exploded = opt_.divergence_factor > 0 && a.loss > opt_.divergence_factor * reference_loss_;
  }
  if (a.preempt) {
    progress_.clear();
    log_.info("preemption: ", signal_names(preemption_signals()), " received by ", v[0], " of ",
              comm_.size(), " rank(s); stopping after step ", run_step);
  }
  return a;
}

void StepGuard::on_divergence(const Agreement& agreed, int64_t epoch, int64_t step_in_epoch,
                              int64_t run_step, double grad_norm) {
  std::string what;
  if (!agreed.nonfinite_loss.empty())
    what = str_cat("non-finite loss on rank(s) ", rank_list(agreed.nonfinite_loss));
  if (!agreed.nonfinite_grad.empty())
    what += str_cat(what.empty() ? "" : "; ", "non-finite gradient norm (",
                    std::isnan(grad_norm) ? "NaN" : "infinite", ") after the all-reduce");
  if (agreed.exploded)
    what = str_cat("loss ", agreed.loss, " is more than --divergence-factor ",
                   opt_.divergence_factor, " times the run's first step's (", reference_loss_, ")");
  const std::string where = str_cat("epoch ", epoch + 1, ", step ", step_in_epoch,
                                    " (optimiser step ", run_step, " of the run)");
  if (!agreed.exploded && skipped_steps_ < opt_.skip_nonfinite_steps) {
    ++skipped_steps_;
    progress_.clear();
    if (comm_.rank() == 0)  // every rank knows: one line
      log_.warn("skipped ", where, ": ", what, "; no update (", skipped_steps_, " of ",
                opt_.skip_nonfinite_steps, " --skip-nonfinite-steps used)");
    return;
  }
  std::string newest = "none";
  if (comm_.rank() == 0)
    if (const auto files = list_checkpoints(opt_.model_dir); !files.empty())
      newest = files.front().path;
  throw AgreedFailure(
      str_cat("training diverged in ", where, ": ", what,
              "; stopped before the update, no checkpoint of this state is written (newest: ",
              newest, "); lower --lr, use --clip-grad-norm or ",
              agreed.exploded ? "raise --divergence-factor" : "--skip-nonfinite-steps"),
      kExitNonFinite, comm_.rank() == 0);
}

void StepGuard::check_sync(ParamStore& params, int64_t run_step) {
  params.download();
  const std::vector<ParamView>& views = params.views();
  std::vector<int64_t> mine(views.size()), root(views.size()), differ(views.size());
  for (size_t i = 0; i < views.size(); ++i)
    mine[i] = static_cast<int64_t>(hash_floats(views[i].host, views[i].numel));
  root = mine;
  {
    const auto waiting = watch("parameter sync check", run_step);
    comm_.broadcast(root.data(), root.size() * sizeof(int64_t), 0);
    for (size_t i = 0; i < views.size(); ++i) differ[i] = mine[i] != root[i] ? 1 : 0;
    comm_.allreduce_sum(differ.data(), differ.size());
  }
  const auto first = std::find_if(differ.begin(), differ.end(), [](int64_t d) { return d > 0; });
  if (first == differ.end()) return;
  const int64_t tensors =
      std::count_if(differ.begin(), differ.end(), [](int64_t d) { return d > 0; });
  const ParamView& v = views[size_t(first - differ.begin())];
  throw AgreedFailure(str_cat("parameters out of sync after step ", run_step, ": '", v.name,
                              "' differs from rank 0's on ", *first, " of ", comm_.size(),
                              " rank(s) (", tensors, " tensor(s) differ)"),
                      1, comm_.rank() == 0);
}

}  // namespace dp::app
