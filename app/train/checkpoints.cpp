// Checkpoint writing, verification, retention and resume for dptrain (rank 0 reads and writes,
// every rank agrees on the outcome).
#include "train/checkpoints.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <system_error>
#include <utility>
#include <variant>

#include "agreement.hpp"
#include "dp/weights.hpp"
#include "exit_codes.hpp"
#include "normalization.hpp"
#include "option_table.hpp"  // option_text
#include "train/metrics.hpp"
#include "train/retention.hpp"
#include "train/run_state.hpp"

namespace dp::app {
namespace {

// Metadata travels from rank 0 as doubles (all integers involved are far below 2^53).
std::vector<double> pack(const CheckpointMeta& m) {
  std::vector<double> v{double(m.epoch), double(m.step), m.best_valid_loss, double(m.best_epoch),
                        double(m.train_loss.size())};
  for (const auto* h : {&m.train_loss, &m.valid_loss, &m.valid_iou, &m.epoch_seconds})
    v.insert(v.end(), h->begin(), h->end());
  // Mid-epoch position, best score and further histories.
  v.insert(v.end(),
           {double(m.epoch_step), double(m.epoch_position), double(m.epoch_partial.size())});
  v.insert(v.end(), m.epoch_partial.begin(), m.epoch_partial.end());
  v.push_back(m.best_score);
  for (const auto* h : {&m.valid_dice, &m.valid_precision, &m.valid_recall, &m.valid_ods_threshold,
                        &m.valid_ods, &m.valid_iou_at_ods, &m.valid_cldice}) {
    v.push_back(double(h->size()));
    v.insert(v.end(), h->begin(), h->end());
  }
  v.insert(v.end(), {double(m.early_stop_wait), m.early_stop_key});
  return v;
}

void unpack(const std::vector<double>& v, CheckpointMeta& m) {
  m.epoch = static_cast<int64_t>(v[0]);
  m.step = static_cast<int64_t>(v[1]);
  m.best_valid_loss = v[2];
  m.best_epoch = static_cast<int64_t>(v[3]);
  const auto n = static_cast<size_t>(v[4]);
  size_t at = 5;
  for (auto* h : {&m.train_loss, &m.valid_loss, &m.valid_iou, &m.epoch_seconds}) {
    h->assign(v.begin() + static_cast<ptrdiff_t>(at), v.begin() + static_cast<ptrdiff_t>(at + n));
    at += n;
  }
  m.epoch_step = static_cast<int64_t>(v[at]);
  m.epoch_position = static_cast<int64_t>(v[at + 1]);
  const auto partial = static_cast<ptrdiff_t>(v[at + 2]);
  const auto from = v.begin() + static_cast<ptrdiff_t>(at + 3);
  m.epoch_partial.assign(from, from + partial);
  at += 3 + size_t(partial);
  m.best_score = v[at++];
  for (auto* h : {&m.valid_dice, &m.valid_precision, &m.valid_recall, &m.valid_ods_threshold,
                  &m.valid_ods, &m.valid_iou_at_ods, &m.valid_cldice}) {
    const auto count = static_cast<size_t>(v[at++]);
    h->assign(v.begin() + static_cast<ptrdiff_t>(at),
              v.begin() + static_cast<ptrdiff_t>(at + count));
    at += count;
  }
  m.early_stop_wait = static_cast<int64_t>(v[at]);
  m.early_stop_key = v[at + 1];
}

// The first view of `params`' layout whose values in `arena` (backend memory) are not all
// finite, or null.
const ParamView* first_nonfinite_view(const ParamStore& params, const float* arena) {
  HostArena host(params, arena);
  host.fetch();
  const float* base = host.data();
  for (const ParamView& v : params.views())
    for (int64_t i = 0; i < v.numel; ++i)
      if (!std::isfinite(base[v.offset + i])) return &v;
  return nullptr;
}

// An integer's or a number's value; nothing for a word.
std::optional<double> number(const OptionValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return double(*i);
  if (const auto* d = std::get_if<double>(&v)) return *d;
  return std::nullopt;
}

// As the printed configuration shows it.
std::string text(const OptionValue& v) {
  return std::visit([](const auto& x) { return option_text(x); }, v);
}

// Equal, numbers to the 6 digits that the options text of older files keeps.
bool same(const OptionValue& a, const OptionValue& b) {
  const std::optional<double> x = number(a), y = number(b);
  if (x && y)
    return *x == *y || std::fabs(*x - *y) <= 1e-6 * std::max(std::fabs(*x), std::fabs(*y));
  return text(a) == text(b);
}

// What differs between the loss a checkpoint was trained with (its recorded options) and this
// run's, as "loss bce -> bce+dice, pos_weight none -> sqrt"; empty if nothing does. Checkpoints
// from before --loss trained with bce, and recorded pos_weight as 0 or 1.
std::string loss_changes(std::map<std::string, OptionValue> was, const TrainOptions& now) {
  if (was.empty()) return {};  // written without options: nothing to compare
  was.try_emplace("loss", "bce");
  OptionValue& pw = was["pos_weight"];  // absent: 0
  if (const std::optional<double> legacy = number(pw); legacy && (*legacy == 0 || *legacy == 1))
    pw = *legacy == 0 ? "none" : "dataset";
  const std::map<std::string, OptionValue> is = now.values();
  const std::string loss_then = text(was["loss"]);
  std::string changes;
  for (const char* key : {"loss", "pos_weight", "focal_alpha", "focal_gamma", "cldice_weight",
                          "cldice_iterations", "cldice_start_epoch"}) {
    const bool focal_key = key[0] == 'f', cldice_key = key[0] == 'c';
    if (focal_key && (loss_then != "focal" || now.loss != "focal")) continue;
    const bool cldice_then = loss_then.find("cldice") != std::string::npos;
    if (cldice_key && (!cldice_then || now.loss.find("cldice") == std::string::npos)) continue;
    if (!same(was[key], is.at(key)))
      changes +=
          str_cat(changes.empty() ? "" : ", ", key, " ", text(was[key]), " -> ", text(is.at(key)));
  }
  return changes;
}

// The base learning rate the checkpoint was trained at where it differs from this run's, else "".
// (--lr's default changes with --weight-init, and changed with it on 2026-12-05: a run resumed by
// a newer dptrain without --lr would otherwise change its rate without a word.)
std::string rate_change(const std::map<std::string, OptionValue>& was, const TrainOptions& now) {
  const auto it = was.find("lr");
  if (it == was.end() || !number(it->second) || same(it->second, now.lr)) return {};
  return text(it->second);
}

}  // namespace

// The options a checkpoint was trained with, typed: the values it records, or, in files written
// before it recorded them, its options text read back (integers, numbers, else words).
std::map<std::string, OptionValue> recorded_options(const CheckpointMeta& meta) {
  if (!meta.option_values.empty()) return meta.option_values;
  std::map<std::string, OptionValue> typed;
  for (const auto& [key, text] : parse_option_lines(meta.options)) {
    int64_t integer = 0;
    const char* end = text.data() + text.size();
    char* stop = nullptr;
    const double real = std::strtod(text.c_str(), &stop);
    if (auto [at, ec] = std::from_chars(text.data(), end, integer); ec == std::errc() && at == end)
      typed[key] = integer;
    else if (!text.empty() && stop == end)
      typed[key] = real;
    else
      typed[key] = text;
  }
  return typed;
}

std::string first_nonfinite_tensor(Model& model, Optimizer& optim) {
  if (const ParamView* v = first_nonfinite_view(model.params(), model.params().values()))
    return str_cat("parameter '", v->name, "'");
  if (const ParamView* v = first_nonfinite_view(model.buffers(), model.buffers().values()))
    return str_cat("buffer '", v->name, "'");
  for (const StateArena& a : optim.state())
    if (const ParamView* v = first_nonfinite_view(model.params(), a.data))
      return str_cat(a.name, " of '", v->name, "'");
  return {};
}

Checkpoints::Checkpoints(const TrainOptions& options, Comm& comm, Logger log, Model& model,
                         Optimizer& optim, WeightAverage* average, int height, int width)
    : opt_(options),
      comm_(comm),
      log_(log),
      model_(model),
      optim_(optim),
      average_(average),
      height_(height),
      width_(width) {}

bool Checkpoints::load(const std::string& path, bool skip_bad, CheckpointMeta& state) {
  CheckpointMeta meta;
  try {
    meta = read_checkpoint_meta(path);
  } catch (const Error& e) {
    if (!skip_bad) throw;
    log_.warn("skipping unreadable checkpoint: ", e.what());
    return false;
  }
  // A checkpoint of another model or image size is a usage error, never silently skipped.
  if (meta.model != opt_.model || meta.width_divisor != opt_.effective_width_divisor() ||
      meta.deconv != int64_t{opt_.deconv} || meta.height != height_ || meta.width != width_)
    throw UsageError(str_cat("checkpoint '", path, "' is for ", meta.model, " /",
                             meta.width_divisor, " on ", meta.height, "x", meta.width,
                             " images, this run is ", opt_.model, " /",
                             opt_.effective_width_divisor(), " on ", height_, "x", width_,
                             "; use another --model-dir or --resume never"));
  std::vector<std::string> needed;
  for (const StateArena& a : optim_.state()) needed.push_back(a.name);
  if (!meta.optimizer_state.empty() && meta.optimizer_state != needed)
    throw UsageError(str_cat("checkpoint '", path, "' holds the state of another optimizer (",
                             meta.optimizer_state.front(), ", ...) than --optimizer ",
                             word_of(optimizer_words(), opt_.optimizer),
                             "; use the original --optimizer, another --model-dir or "
                             "--resume never"));
  // Another world size continues the same global sample order; only a per-rank cache pins the
  // shards, so a mid-epoch checkpoint with --cache needs the world size it was written with.
  const int64_t global_batch = int64_t(opt_.batch_size) * comm_.size();
  if (meta.world_size != comm_.size())
    log_.info("resuming ", path, " (", meta.world_size, " rank(s)) on ", comm_.size(),
              " rank(s): the global sample order continues");
  if (meta.global_batch != global_batch)
    log_.warn("global batch changes from ", meta.global_batch, " (checkpoint '", path, "') to ",
              global_batch, " (", comm_.size(), " x ", opt_.batch_size,
              "); results will differ from an uninterrupted run");
  if (meta.epoch_step > 0 && opt_.cache && meta.world_size != comm_.size())
    throw UsageError(str_cat("checkpoint '", path, "' was written mid-epoch by ", meta.world_size,
                             " rank(s); with --cache it resumes only on as many (this run has ",
                             comm_.size(), ")"));
  try {
    const AveragedWeights averaged = average_ != nullptr ? average_->arenas() : AveragedWeights{};
    state = load_checkpoint(path, model_.params(), optim_.state(), &model_.buffers(),
                            average_ != nullptr ? &averaged : nullptr);
  } catch (const Error& e) {
    if (!skip_bad) throw;
    log_.warn("skipping unreadable checkpoint: ", e.what());
    return false;
  }
  // A diverged run's weights (written by an older dptrain, or by hand) are never resumed from.
  if (const std::string bad = first_nonfinite_tensor(model_, optim_); !bad.empty()) {
    const std::string what =
        str_cat("checkpoint '", path, "' holds non-finite values (", bad, " first)");
    if (!skip_bad) fail(what, "; choose an older checkpoint");
    log_.warn("skipping ", what);
    return false;
  }
  return true;
}

void Checkpoints::rechoose_best(CheckpointMeta& state) const {
  const size_t n = state.valid_loss.size();
  const bool have =
      state.valid_iou.size() == n && state.valid_dice.size() == n && state.valid_ods.size() == n;
  log_.warn("--best-metric ", best_metric_name(opt_.best_metric), " replaces the checkpoint's ",
            state.best_metric, have ? "" : " (no history of it: the best epoch starts over)");
  state.best_epoch = 0;
  double best = 0;
  for (size_t e = 0; have && e < n; ++e) {
    const double k = best_key(opt_.best_metric, state.valid_loss[e], state.valid_iou[e],
                              state.valid_dice[e], state.valid_ods[e]);
    if (!std::isfinite(k) || (state.best_epoch != 0 && k >= best)) continue;
    best = k;
    state.best_epoch = int64_t(e) + 1;
    state.best_valid_loss = state.valid_loss[e];
    state.best_score = higher_is_better(opt_.best_metric) ? -k : k;
  }
  state.best_metric = best_metric_name(opt_.best_metric);
}

CheckpointMeta Checkpoints::restore_or_init() {
  ParamStore& ps = model_.params();
  CheckpointMeta state;
  state.best_valid_loss = std::numeric_limits<double>::infinity();
  std::string resumed_from;
  on_root(comm_, "starting state", [&] {
    if (opt_.resume == "auto") {
      // Newest first; a torn, corrupt or non-finite file is reported and the next older one tried.
      for (const CheckpointFile& file : list_checkpoints(opt_.model_dir))
        if (load(file.path, true, state)) {
          resumed_from = file.path;
          break;
        }
    } else if (opt_.resume != "never") {
      load(opt_.resume, false, state);
      resumed_from = opt_.resume;
    }
    if (resumed_from.empty()) {
      state = CheckpointMeta{};
      state.best_valid_loss = std::numeric_limits<double>::infinity();
      ps.initialize(opt_.seed);
      model_.buffers().initialize(opt_.seed);
      if (opt_.init_weights.empty())
        log_.info("initial weights: seed ", opt_.seed, ", ",
                  opt_.weight_init == ModelConfig::ReluInit::kHe
                      ? "He (N(0, 2/fan_out), zero bias) for the convolutions followed by a ReLU"
                      : "PyTorch's module defaults",
                  " (--weight-init ", word_of(weight_init_words(), opt_.weight_init), ")");
      for (const StateArena& a : optim_.state()) {  // a skipped file may have filled them
        HostArena host(ps, a.data);
        std::fill_n(host.data(), host.bytes() / sizeof(float), 0.0f);
        host.store();
      }
      // Pretrained weights replace the initialisation: the encoder's, or the whole model's.
      for (const auto& [file, encoder_only] :
           {std::pair{opt_.init_weights, false}, std::pair{opt_.encoder_weights, true}}) {
        if (file.empty()) continue;
        const ImportReport r = import_weights(file, opt_.model, ps, model_.buffers(), encoder_only);
        log_.info(encoder_only ? "encoder" : "model", " weights from ", file, ": ", r.loaded,
                  " tensors", r.ignored.empty() ? "" : str_cat(", ", r.ignored.size(), " ignored"));
      }
      if (!list_checkpoints(opt_.model_dir).empty() && opt_.resume == "never")
        log_.warn("--resume never: starting over; checkpoints in ", opt_.model_dir,
                  " will be overwritten");
    }
    if (!resumed_from.empty() && state.best_metric != best_metric_name(opt_.best_metric))
      rechoose_best(state);
    if (!resumed_from.empty()) {
      const std::map<std::string, OptionValue> was = recorded_options(state);
      if (const std::string changes = loss_changes(was, opt_); !changes.empty())
        log_.warn("checkpoint '", resumed_from, "' was trained with another loss (", changes,
                  "); training continues with this run's (give the checkpoint's options to keep "
                  "it)");
      if (const std::string lr = rate_change(was, opt_); !lr.empty())
        log_.warn("checkpoint '", resumed_from, "' was trained at --lr ", lr,
                  "; training continues at this run's ", opt_.lr, " (give --lr ", lr,
                  " to keep it)");
    }
  });
  // Every rank learns whether rank 0 restored the averages; else they start from the weights.
  int64_t restored_average = state.has_averaged_weights ? 1 : 0;
  comm_.broadcast(&restored_average, sizeof restored_average, 0);
  broadcast_state(state, restored_average != 0);
  if (average_ == nullptr && restored_average != 0 && comm_.rank() == 0)
    log_.warn("checkpoint '", resumed_from,
              "' holds averaged weights, but this run has no --ema: they are not kept");
  if (average_ != nullptr && restored_average == 0) {
    if (!resumed_from.empty())  // rank 0's knowledge
      log_.warn("checkpoint '", resumed_from,
                "' holds no averaged weights: --ema starts from its weights");
    average_->reset();
  }
  if (!resumed_from.empty())
    log_.info("resumed from epoch ", state.epoch, " (", resumed_from, ", step ", state.step, ")",
              state.epoch_step > 0
                  ? str_cat("; epoch ", state.epoch + 1, " continues after its step ",
                            state.epoch_step, " (sample ", state.epoch_position, " of its order)")
                  : std::string());
  return state;
}

void Checkpoints::broadcast_state(CheckpointMeta& state, bool with_average) {
  // Rank 0's weights, optimiser state and progress go to every rank (through host memory: once
  // per run).
  for (ParamStore* store : {&model_.params(), &model_.buffers()}) {
    store->download();
    comm_.broadcast(store->host_values(), size_t(store->arena_size()) * sizeof(float), 0);
    store->upload();
  }
  std::vector<std::pair<const ParamStore*, float*>> arenas;
  for (const StateArena& arena : optim_.state()) arenas.emplace_back(&model_.params(), arena.data);
  if (average_ != nullptr && with_average) {
    arenas.emplace_back(&model_.params(), average_->arenas().params);
    arenas.emplace_back(&model_.buffers(), average_->arenas().buffers);
  }
  for (const auto& [store, data] : arenas) {
    if (store->arena_size() == 0) continue;
    HostArena host(*store, data);
    host.fetch();
    comm_.broadcast(host.data(), host.bytes(), 0);
    host.store();
  }
  std::vector<double> packed = pack(state);
  int64_t length = int64_t(packed.size());
  comm_.broadcast(&length, sizeof length, 0);
  packed.resize(size_t(length));
  comm_.broadcast(packed.data(), packed.size() * sizeof(double), 0);
  unpack(packed, state);
}

void Checkpoints::check_finite(const CheckpointMeta& state, const std::string& path) {
  const std::string bad = first_nonfinite_tensor(model_, optim_);
  if (bad.empty()) return;
  throw CodedError(
      str_cat("not writing checkpoint '", path, "': ", bad, " holds a non-finite value after step ",
              state.step, " (training diverged; the checkpoints already written are kept)"),
      kExitNonFinite);
}

void Checkpoints::save(const std::string& path, const CheckpointMeta& state) {
  check_finite(state, path);
  const AveragedWeights averaged = average_ != nullptr ? average_->arenas() : AveragedWeights{};
  save_checkpoint(path, model_.params(), optim_.state(), state, &model_.buffers(),
                  average_ != nullptr ? &averaged : nullptr);
}

void Checkpoints::write_epoch(const CheckpointMeta& state, bool epoch_file, bool best) {
  if (!epoch_file && !best) return;
  on_root(comm_, "writing checkpoint", [&] {
    const std::filesystem::path dir(opt_.model_dir);
    if (epoch_file) save((dir / epoch_checkpoint_name(state.epoch)).string(), state);
    if (best) save((dir / kBestCheckpointName).string(), state);
    if (!epoch_file) return;
    // Only after the new file is committed: mid-epoch checkpoints older than it have served their
    // purpose, and --keep-last drops the oldest epoch checkpoints.
    for (const CheckpointFile& f : list_checkpoints(opt_.model_dir))
      if (f.step > 0 && f.epoch < state.epoch) std::filesystem::remove(f.path);
    for (const std::string& path :
         checkpoints_beyond(list_checkpoints(opt_.model_dir), opt_.keep_last)) {
      std::filesystem::remove(path);
      log_.info("--keep-last ", opt_.keep_last, ": removed ", path);
    }
  });
}

std::string Checkpoints::write_mid_epoch(const CheckpointMeta& state) {
  const std::string path = (std::filesystem::path(opt_.model_dir) /
                            mid_epoch_checkpoint_name(state.epoch, state.epoch_step))
                               .string();
  on_root(comm_, "writing checkpoint", [&] { save(path, state); });
  return path;
}

}  // namespace dp::app
