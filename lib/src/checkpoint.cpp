// Checkpoint v1 writer and reader (HDF5), with a checksum over every stored tensor.
#include "dp/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <regex>
#include <tuple>
#include <variant>

#include "dp/error.hpp"
#include "dp/fs.hpp"
#include "dp/h5.hpp"
#include "dp/optim.hpp"
#include "dp/rng.hpp"

namespace dp {
namespace {

const std::string kParamsGroup = "params";
const std::string kBuffersGroup = "buffers";
const std::string kOptimGroup = "optim/";
const std::string kAveragedParamsGroup = "ema/params/";
const std::string kAveragedBuffersGroup = "ema/buffers/";
const std::string kOptionPrefix = "options.";  // the typed configuration's attributes
// Partial checksums, so that a weights-only read (dppredict, dpexport) verifies and reads only the
// tensors it loads: the raw weights (parameters, then buffers: the full chain's first part) and,
// as a chain of their own, the averaged weights. Absent in older files, which are read whole.
const char* const kWeightsChecksumAttr = "checksum_weights";
const char* const kAveragedChecksumAttr = "checksum_averaged";
// Lists the state arenas' names in the order of the checksum; absent in older files, which hold
// SGD's momentum buffer when has_optimizer_state is set.
const char* const kStateNamesAttr = "optimizer_state";
constexpr char kStateNameSeparator = ',';
constexpr size_t kMaxStateArenas = 8;     // SGD has one, AdamW two
constexpr int64_t kMaxImageSide = 32768;  // the largest side dpprep and dppredict accept

std::vector<std::string> split_names(const std::string& joined) {
  std::vector<std::string> names;
  size_t from = 0;
  while (from <= joined.size() && !joined.empty()) {
    const size_t at = joined.find(kStateNameSeparator, from);
    names.push_back(joined.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) break;
    from = at + 1;
  }
  return names;
}

OptimizerState momentum_state(const float* momentum) {
  if (momentum == nullptr) return {};
  return {{Sgd::kStateName, const_cast<float*>(momentum)}};
}

// 64-bit checksum of float tensors, chained in a fixed order (parameters by name, then state).
uint64_t checksum_update(uint64_t h, const std::string& name, const float* data, int64_t count) {
  uint64_t acc = key(h, hash_name(name), static_cast<uint64_t>(count));
  const auto* words = reinterpret_cast<const uint32_t*>(data);
  for (int64_t i = 0; i < count; ++i) acc = (acc ^ words[i]) * 0x100000001b3ull;
  return mix64(acc);
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Views sorted by name: the order of datasets in the file and in the checksum.
std::vector<const ParamView*> by_name(const ParamStore& params) {
  std::vector<const ParamView*> v;
  for (const auto& p : params.views()) v.push_back(&p);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return v;
}

void write_meta(h5::Location& root, const CheckpointMeta& m) {
  root.set_attr("format", std::string(kCheckpointFormat));
  root.set_attr("epoch", m.epoch);
  root.set_attr("step", m.step);
  root.set_attr("model", m.model);
  root.set_attr("width_divisor", m.width_divisor);
  root.set_attr("deconv", m.deconv);
  root.set_attr("height", m.height);
  root.set_attr("width", m.width);
  root.set_attr("scale_y", m.scale_y);
  root.set_attr("scale_x", m.scale_x);
  root.set_attr("world_size", m.world_size);
  root.set_attr("global_batch", m.global_batch);
  root.set_attr("seed", m.seed);
  root.set_attr("lr", m.lr);
  root.set_attr("best_valid_loss", m.best_valid_loss);
  root.set_attr("best_epoch", m.best_epoch);
  root.set_attr("options", m.options);
  for (const auto& [key, value] : m.option_values)
    std::visit([&root, &key = key](const auto& v) { root.set_attr(kOptionPrefix + key, v); },
               value);
  if (!m.normalize_mean.empty()) {
    root.set_attr("normalize_mean", m.normalize_mean);
    root.set_attr("normalize_std", m.normalize_std);
  }
  root.set_attr("history_train_loss", m.train_loss);
  root.set_attr("history_valid_loss", m.valid_loss);
  root.set_attr("history_valid_iou", m.valid_iou);
  root.set_attr("history_epoch_seconds", m.epoch_seconds);
  root.set_attr("best_metric", m.best_metric);
  root.set_attr("best_score", m.best_score);
  root.set_attr("history_valid_dice", m.valid_dice);
  root.set_attr("history_valid_precision", m.valid_precision);
  root.set_attr("history_valid_recall", m.valid_recall);
  root.set_attr("history_valid_ods_threshold", m.valid_ods_threshold);
  root.set_attr("history_valid_ods", m.valid_ods);
  root.set_attr("history_valid_iou_at_ods", m.valid_iou_at_ods);
  root.set_attr("history_valid_cldice", m.valid_cldice);
  root.set_attr("early_stop_wait", m.early_stop_wait);
  root.set_attr("early_stop_key", m.early_stop_key);
  root.set_attr("epoch_step", m.epoch_step);
  root.set_attr("epoch_position", m.epoch_position);
  root.set_attr("epoch_partial", m.epoch_partial);
}

CheckpointMeta read_meta(const h5::Location& root) {
  const std::string format = root.has_attr("format") ? root.attr_string("format") : "";
  DP_CHECK(format == kCheckpointFormat, "'", root.name(), "' is not a dptrain checkpoint: format '",
           format, "', expected '", kCheckpointFormat, "'");
  CheckpointMeta m;
  m.epoch = root.attr_int("epoch");
  m.step = root.attr_int("step");
  m.model = root.attr_string("model");
  m.width_divisor = root.attr_int("width_divisor");
  m.deconv = root.has_attr("deconv") ? root.attr_int("deconv") : 0;
  m.height = root.attr_int("height");
  m.width = root.attr_int("width");
  DP_CHECK(m.height >= 0 && m.height <= kMaxImageSide && m.width >= 0 && m.width <= kMaxImageSide,
           "checkpoint '", root.name(), "': image size ", m.height, "x", m.width,
           " out of range [0, ", kMaxImageSide, "]");
  if (root.has_attr("scale_y") && root.has_attr("scale_x")) {
    m.scale_y = root.attr_double("scale_y");
    m.scale_x = root.attr_double("scale_x");
    DP_CHECK(
        std::isfinite(m.scale_y) && std::isfinite(m.scale_x) && m.scale_y >= 0 && m.scale_x >= 0,
        "checkpoint '", root.name(), "': scale ", m.scale_y, "x", m.scale_x,
        " is not a non-negative number");
  }
  m.world_size = root.attr_int("world_size");
  m.global_batch = root.attr_int("global_batch");
  m.seed = root.attr_int("seed");
  m.lr = root.attr_double("lr");
  m.best_valid_loss = root.attr_double("best_valid_loss");
  m.best_epoch = root.attr_int("best_epoch");
  m.options = root.attr_string("options");
  for (const std::string& name : root.attr_names()) {
    if (name.rfind(kOptionPrefix, 0) != 0) continue;
    const std::string key = name.substr(kOptionPrefix.size());
    switch (root.attr_kind(name)) {
      case h5::Location::AttrKind::kInteger:
        m.option_values[key] = root.attr_int(name);
        break;
      case h5::Location::AttrKind::kNumber:
        m.option_values[key] = root.attr_double(name);
        break;
      default:
        m.option_values[key] = root.attr_string(name);  // a string, or an error naming it
    }
  }
  if (root.has_attr("normalize_mean") && root.has_attr("normalize_std")) {
    m.normalize_mean = root.attr_doubles("normalize_mean");
    m.normalize_std = root.attr_doubles("normalize_std");
    DP_CHECK(m.normalize_mean.size() == 3 && m.normalize_std.size() == 3, "checkpoint '",
             root.name(), "': normalize_mean and normalize_std hold ", m.normalize_mean.size(),
             " and ", m.normalize_std.size(), " values, expected 3 each (RGB)");
  }
  m.train_loss = root.attr_doubles("history_train_loss");
  m.valid_loss = root.attr_doubles("history_valid_loss");
  m.valid_iou = root.attr_doubles("history_valid_iou");
  m.epoch_seconds = root.attr_doubles("history_epoch_seconds");
  // Absent in older files: best by valid_loss, no further metrics, an epoch boundary.
  m.best_score = m.best_valid_loss;
  if (root.has_attr("best_metric")) {
    m.best_metric = root.attr_string("best_metric");
    m.best_score = root.attr_double("best_score");
    m.valid_dice = root.attr_doubles("history_valid_dice");
    m.valid_precision = root.attr_doubles("history_valid_precision");
    m.valid_recall = root.attr_doubles("history_valid_recall");
  }
  // Absent in older files: NaN for each of their epochs.
  const auto history_or_nan = [&](const char* name) {
    return root.has_attr(name)
               ? root.attr_doubles(name)
               : std::vector<double>(m.train_loss.size(), std::numeric_limits<double>::quiet_NaN());
  };
  m.valid_ods_threshold = history_or_nan("history_valid_ods_threshold");
  m.valid_ods = history_or_nan("history_valid_ods");
  m.valid_iou_at_ods = history_or_nan("history_valid_iou_at_ods");
  m.valid_cldice = history_or_nan("history_valid_cldice");
  if (root.has_attr("early_stop_wait")) {
    m.early_stop_wait = root.attr_int("early_stop_wait");
    m.early_stop_key = root.attr_double("early_stop_key");
  } else if (m.best_epoch > 0) {
    m.early_stop_wait = m.epoch - m.best_epoch;
    m.early_stop_key = m.best_metric == "valid_loss" ? m.best_score : -m.best_score;
  }
  m.has_averaged_weights =
      root.has_attr("has_averaged_weights") && root.attr_int("has_averaged_weights") != 0;
  if (root.has_attr("has_optimizer_state") && root.attr_int("has_optimizer_state") != 0)
    m.optimizer_state = root.has_attr(kStateNamesAttr)
                            ? split_names(root.attr_string(kStateNamesAttr))
                            : std::vector<std::string>{Sgd::kStateName};
  // Each arena is read in full: a few distinct names only.
  std::vector<std::string> names = m.optimizer_state;
  std::sort(names.begin(), names.end());
  DP_CHECK(names.size() <= kMaxStateArenas &&
               std::adjacent_find(names.begin(), names.end()) == names.end() &&
               std::find(names.begin(), names.end(), "") == names.end(),
           "checkpoint '", root.name(), "': bad optimizer state list '",
           root.has_attr(kStateNamesAttr) ? root.attr_string(kStateNamesAttr) : "", "'");
  if (root.has_attr("epoch_step")) {
    m.epoch_step = root.attr_int("epoch_step");
    m.epoch_position = root.attr_int("epoch_position");
    m.epoch_partial = root.attr_doubles("epoch_partial");
  }
  return m;
}

}  // namespace

void save_checkpoint(const std::string& path, const ParamStore& params, const float* momentum,
                     const CheckpointMeta& meta, const ParamStore* buffers) {
  save_checkpoint(path, params, momentum_state(momentum), meta, buffers);
}

void save_checkpoint(const std::string& path, const ParamStore& params, const OptimizerState& state,
                     const CheckpointMeta& meta, const ParamStore* buffers,
                     const AveragedWeights* averaged) {
  const std::string tmp = temp_path_for(path);
  try {
    std::lock_guard lock(h5::mutex());
    h5::File file(tmp, h5::Mode::kTruncate);
    uint64_t sum = 0;
    HostArena values(params, params.values());
    values.fetch();
    for (const ParamView* p : by_name(params)) {
      const float* v = values.data() + p->offset;
      h5::Dataset::create(file, kParamsGroup + "/" + p->name, h5::Type::kFloat32, p->shape)
          .write(v);
      sum = checksum_update(sum, p->name, v, p->numel);
    }
    if (buffers != nullptr) {
      HostArena buffer_values(*buffers, buffers->values());
      buffer_values.fetch();
      for (const ParamView* b : by_name(*buffers)) {
        const float* v = buffer_values.data() + b->offset;
        h5::Dataset::create(file, kBuffersGroup + "/" + b->name, h5::Type::kFloat32, b->shape)
            .write(v);
        sum = checksum_update(sum, kBuffersGroup + "/" + b->name, v, b->numel);
      }
    }
    // The chain so far covers the raw weights: a weights-only read verifies them against this.
    const uint64_t weights_sum = sum;
    uint64_t averaged_sum = 0;  // a chain of its own over the averaged weights
    // An arena of `store`'s layout as `group`<name> datasets, chained into the checksum (and into
    // `also` when given).
    auto write_arena = [&](const ParamStore& store, const float* arena, const std::string& group,
                           uint64_t* also) {
      HostArena host(store, arena);
      host.fetch();
      for (const ParamView* p : by_name(store)) {
        const float* v = host.data() + p->offset;
        h5::Dataset::create(file, group + p->name, h5::Type::kFloat32, p->shape).write(v);
        sum = checksum_update(sum, group + p->name, v, p->numel);
        if (also != nullptr) *also = checksum_update(*also, group + p->name, v, p->numel);
      }
    };
    std::string names;
    for (const StateArena& arena : state) {
      DP_CHECK(arena.data != nullptr && !arena.name.empty() &&
                   arena.name.find(kStateNameSeparator) == std::string::npos,
               "save_checkpoint: bad optimizer state arena '", arena.name, "'");
      names += (names.empty() ? "" : std::string(1, kStateNameSeparator)) + arena.name;
      write_arena(params, arena.data, kOptimGroup + arena.name + "/", nullptr);
    }
    if (averaged != nullptr) {  // after the optimiser state in the checksum
      for (const auto& [store, arena, group] :
           {std::tuple{&params, averaged->params, kAveragedParamsGroup},
            std::tuple{buffers, averaged->buffers, kAveragedBuffersGroup}}) {
        if (store == nullptr || store->views().empty()) continue;
        DP_CHECK(arena != nullptr, "save_checkpoint: no averaged arena for ", group);
        write_arena(*store, arena, group, &averaged_sum);
      }
    }
    write_meta(file, meta);
    file.set_attr("has_averaged_weights", int64_t{averaged != nullptr});
    file.set_attr("has_optimizer_state", int64_t{!state.empty()});
    file.set_attr(kStateNamesAttr, names);
    file.set_attr("checksum", hex(sum));
    file.set_attr(kWeightsChecksumAttr, hex(weights_sum));
    if (averaged != nullptr) file.set_attr(kAveragedChecksumAttr, hex(averaged_sum));
    file.flush();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  try {
    commit_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  std::lock_guard lock(h5::mutex());
  h5::File file(path, h5::Mode::kRead);
  return read_meta(file);
}

CheckpointMeta load_checkpoint(const std::string& path, ParamStore& params, float* momentum,
                               ParamStore* buffers) {
  return load_checkpoint(path, params, momentum_state(momentum), buffers);
}

CheckpointMeta load_checkpoint(const std::string& path, ParamStore& params,
                               const OptimizerState& state, ParamStore* buffers,
                               const AveragedWeights* averaged) {
  std::lock_guard lock(h5::mutex());
  h5::File file(path, h5::Mode::kRead);
  CheckpointMeta meta = read_meta(file);
  const bool has_state =
      file.has_attr("has_optimizer_state") && file.attr_int("has_optimizer_state");
  DP_CHECK(state.empty() || has_state, "checkpoint '", path,
           "' holds no optimizer state (weights only); cannot resume training from it");
  const std::vector<std::string>& stored_state = meta.optimizer_state;
  for (const StateArena& arena : state) {
    if (std::find(stored_state.begin(), stored_state.end(), arena.name) != stored_state.end())
      continue;
    std::string have, want;
    for (const auto& n : stored_state) have += (have.empty() ? "" : ", ") + n;
    for (const auto& a : state) want += (want.empty() ? "" : ", ") + a.name;
    throw Error(str_cat("checkpoint '", path, "' holds optimizer state ", have,
                        ", this run's optimizer needs ", want,
                        " (another --optimizer: use --resume never or the original optimizer)"));
  }
  auto load = [&](const std::string& dset_path, const ParamView& p, float* dst) {
    DP_CHECK(file.exists(dset_path), "checkpoint '", path, "' lacks '", dset_path, "'");
    h5::Dataset d = h5::Dataset::open(file, dset_path);
    DP_CHECK(d.shape() == p.shape, "checkpoint '", path, "': '", dset_path,
             "' has a different shape than the model's parameter (model ", meta.model,
             " with a different width?)");
    d.read(dst);
  };
  // A weights-only read of a file with partial checksums reads and verifies only the weights it
  // keeps, each set against its own partial checksum: the raw ones unless the averaged ones land
  // on them (dppredict's arenas), and the averaged ones where asked for. Any other read takes
  // every tensor of the file through the full checksum.
  const bool want_averaged = averaged != nullptr && meta.has_averaged_weights;
  const bool partial = state.empty() && file.has_attr(kWeightsChecksumAttr) &&
                       (!want_averaged || file.has_attr(kAveragedChecksumAttr));
  const bool averages_replace_raw =
      want_averaged && averaged->params == params.values() &&
      (buffers == nullptr || buffers->views().empty() || averaged->buffers == buffers->values());
  const bool read_raw = !(partial && averages_replace_raw);
  const auto verify = [&](const char* attr, uint64_t computed) {
    DP_CHECK(file.attr_string(attr) == hex(computed), "checkpoint '", path,
             "' is corrupt: checksum mismatch (", attr, " stored ", file.attr_string(attr),
             ", computed ", hex(computed), ")");
  };
  // Everything is read into host arenas (staging for device stores) and only stored to the
  // device once the checksum holds.
  uint64_t sum = 0;
  std::vector<HostArena> staged;
  staged.reserve(4 + state.size());  // references into it are kept
  if (read_raw) {
    HostArena& values = staged.emplace_back(params, params.values());
    for (const ParamView* p : by_name(params)) {
      float* v = values.data() + p->offset;
      load(kParamsGroup + "/" + p->name, *p, v);
      sum = checksum_update(sum, p->name, v, p->numel);
    }
  }
  const auto stored = file.open_group(kParamsGroup).children();
  DP_CHECK(stored.size() == params.views().size(), "checkpoint '", path, "' holds ", stored.size(),
           " parameters, the model has ", params.views().size());
  // Buffers are covered by the checksum when present, so they are read even if not wanted.
  std::vector<float> scratch;
  if (file.exists(kBuffersGroup)) {
    const size_t count = file.open_group(kBuffersGroup).children().size();
    DP_CHECK(buffers == nullptr || count == buffers->views().size(), "checkpoint '", path,
             "' holds ", count, " buffers, the model has ", buffers->views().size());
    ParamStore* source = buffers;
    DP_CHECK(source != nullptr || count == 0, "checkpoint '", path,
             "' holds batch-norm statistics, but no model buffers were given to load them into");
    if (source != nullptr && read_raw) {
      HostArena& buffer_values = staged.emplace_back(*source, source->values());
      for (const ParamView* b : by_name(*source)) {
        float* v = buffer_values.data() + b->offset;
        load(kBuffersGroup + "/" + b->name, *b, v);
        sum = checksum_update(sum, kBuffersGroup + "/" + b->name, v, b->numel);
      }
    }
  } else {
    DP_CHECK(buffers == nullptr || buffers->views().empty(), "checkpoint '", path,
             "' holds no batch-norm statistics, but the model has ", buffers->views().size());
  }
  // The `group`<name> datasets of an arena of `store`'s layout, chained into the checksum: into
  // `host` (a staged arena) or, read only for the checksum, a scratch buffer when it is null.
  auto read_arena = [&](const ParamStore& store, float* host, const std::string& group) {
    for (const ParamView* p : by_name(store)) {
      float* dst = host != nullptr ? host + p->offset : nullptr;
      if (dst == nullptr) {
        scratch.resize(static_cast<size_t>(p->numel));
        dst = scratch.data();
      }
      load(group + p->name, *p, dst);
      sum = checksum_update(sum, group + p->name, dst, p->numel);
    }
  };
  if (partial) {  // the raw weights are verified here; the averaged ones are a chain of their own
    if (read_raw) verify(kWeightsChecksumAttr, sum);
    sum = 0;
  }
  // The full checksum covers the state too, so all of it is read, in the file's order.
  if (!partial) {
    for (const std::string& name : stored_state) {
      float* arena = nullptr;
      for (const StateArena& a : state)
        if (a.name == name) arena = staged.emplace_back(params, a.data).data();
      read_arena(params, arena, kOptimGroup + name + "/");
    }
  }
  // Averaged weights: into the caller's arenas or, for the full checksum, a scratch buffer.
  if (meta.has_averaged_weights && (!partial || want_averaged)) {
    DP_CHECK(file.exists("ema"), "checkpoint '", path, "' lacks 'ema'");
    for (const auto& [store, arena, group] :
         {std::tuple{static_cast<const ParamStore*>(&params),
                     averaged != nullptr ? averaged->params : nullptr, kAveragedParamsGroup},
          std::tuple{static_cast<const ParamStore*>(buffers),
                     averaged != nullptr ? averaged->buffers : nullptr, kAveragedBuffersGroup}}) {
      if (store == nullptr) {  // weights-only reads without buffers: none in the file either
        DP_CHECK(!file.exists(group.substr(0, group.size() - 1)), "checkpoint '", path,
                 "' holds averaged batch-norm statistics, but no model buffers were given");
        continue;
      }
      if (store->views().empty()) continue;
      read_arena(*store, arena != nullptr ? staged.emplace_back(*store, arena).data() : nullptr,
                 group);
    }
  }
  if (!partial)
    verify("checksum", sum);
  else if (want_averaged)
    verify(kAveragedChecksumAttr, sum);
  for (HostArena& arena : staged) arena.store();
  return meta;
}

std::string epoch_checkpoint_name(int64_t epoch) {
  return "model_epoch_" + std::to_string(epoch) + ".h5";
}

std::string mid_epoch_checkpoint_name(int64_t epoch, int64_t step) {
  return "model_epoch_" + std::to_string(epoch) + "_step_" + std::to_string(step) + ".h5";
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return found;
  // At most 18 digits: every such number fits int64 (dptrain writes no longer ones).
  static const std::regex pattern(R"(model_epoch_(\d{1,18})(?:_step_(\d{1,18}))?\.h5)");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, pattern))
      found.push_back({std::stoll(m[1].str()), m[2].matched ? std::stoll(m[2].str()) : 0,
                       entry.path().string()});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return std::pair(a.epoch, a.step) > std::pair(b.epoch, b.step);
  });
  return found;
}

}  // namespace dp
