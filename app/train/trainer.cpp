// The training loop: data-parallel steps, validation from reduced sums, checkpoints, resume.
#include "train/trainer.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "dp/dataset.hpp"
#include "dp/fs.hpp"
#include "dp/sampler.hpp"
#include "dp/synth.hpp"

namespace dp::app {
namespace {

using Clock = std::chrono::steady_clock;

// The embedded default: a small synthetic crack dataset (fixed seed, so the cache is reused).
data::SynthOptions demo_dataset() {
  data::SynthOptions s;
  s.train_count = 512;
  s.val_count = 128;
  s.height = 64;
  s.width = 64;
  s.seed = 1;
  return s;
}

std::string default_synth_cache(const data::SynthOptions& s) {
  std::filesystem::path dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    dir = xdg;
  else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    dir = std::filesystem::path(home) / ".cache";
  else
    dir = std::filesystem::temp_directory_path();
  return (dir / "dptrain" /
          str_cat("synthetic-v1-", s.train_count, "-", s.val_count, "-", s.height, "x", s.width,
                  "-seed", s.seed, ".h5"))
      .string();
}

// Metadata travels from rank 0 as doubles (all integers involved are far below 2^53).
std::vector<double> pack(const CheckpointMeta& m) {
  std::vector<double> v{double(m.epoch), double(m.step), m.best_valid_loss, double(m.best_epoch),
                        double(m.train_loss.size())};
  for (const auto* h : {&m.train_loss, &m.valid_loss, &m.valid_iou, &m.epoch_seconds})
    v.insert(v.end(), h->begin(), h->end());
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
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

template <typename F>
void Trainer::collectively(F&& fn) {
  std::string message;
  int code = 1;
  bool failed = false;
  try {
    fn();
  } catch (const UsageError& e) {
    failed = true, code = 2, message = e.what();
  } catch (const AgreedFailure&) {
    throw;
  } catch (const std::exception& e) {
    failed = true, message = e.what();
  }
  std::vector<int64_t> flags(static_cast<size_t>(comm_.size()), 0);
  flags[static_cast<size_t>(comm_.rank())] = failed ? code : 0;
  comm_.allreduce_sum(flags.data(), flags.size());
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] == 0) continue;
    const bool mine = static_cast<int>(r) == comm_.rank();
    throw AgreedFailure(mine ? message : str_cat("rank ", r, " failed"), static_cast<int>(flags[r]),
                        mine);
  }
}

template <typename F>
void Trainer::on_root(const char* what, F&& fn) {
  collectively([&] {
    if (comm_.rank() != 0) return;
    try {
      fn();
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      fail(what, ": ", e.what());
    }
  });
}

Trainer::Trainer(TrainOptions options, Comm& comm, Logger log)
    : opt_(std::move(options)), comm_(comm), log_(log) {
  if (opt_.device == "cuda") {
#ifdef DP_WITH_CUDA
    throw UsageError(
        "--device cuda: the CUDA backend's layers are not implemented yet in this version "
        "(only device discovery and the NCCL bootstrap are); use --device cpu");
#else
    throw UsageError(
        "--device cuda: this dptrain was built without CUDA (configure with "
        "-DDP_WITH_CUDA=ON); use --device cpu");
#endif
  }
  log_.info("dptrain: ", comm_.size(), " rank(s), device cpu (oneDNN), ", omp_get_max_threads(),
            " thread(s) per rank");
  on_root("--model-dir", [&] { ensure_writable_dir(opt_.model_dir); });
  prepare_data();

  collectively([&] {
    backend_ = make_cpu_backend();
    data::LoaderOptions lo;
    lo.batch_size = opt_.batch_size;
    lo.prefetch = opt_.prefetch;
    lo.seed = opt_.seed;
    lo.augment = opt_.augment;
    train_loader_ = std::make_unique<data::Loader>(data_path_, "train", lo);
    lo.augment = false;
    if (data::Dataset::has_split(data_path_, "val"))
      val_loader_ = std::make_unique<data::Loader>(data_path_, "val", lo);
    height_ = train_loader_->height();
    width_ = train_loader_->width();
    pos_weight_ = opt_.use_pos_weight ? train_loader_->pos_weight() : 1.0f;

    ModelConfig mc;
    mc.name = opt_.model;
    mc.width_divisor = opt_.effective_width_divisor();
    model_ = make_model(mc, *backend_);
    try {
      model_->setup(opt_.batch_size, height_, width_);
    } catch (const Error& e) {
      throw UsageError(str_cat("dataset '", data_path_, "': ", e.what()));
    }
    sgd_ = std::make_unique<Sgd>(
        model_->params(), *backend_,
        SgdOptions{float(opt_.lr), float(opt_.momentum), float(opt_.weight_decay), false});
    diff_logits_ = Buffer(static_cast<size_t>(opt_.batch_size) * height_ * width_ * sizeof(float));
  });
  const ParamStore& ps = model_->params();
  log_.info("data: ", data_path_, ": ", train_loader_->dataset_size(), " train, ",
            val_loader_ ? val_loader_->dataset_size() : 0, " val images of ", height_, "x", width_,
            "; batch ", opt_.batch_size, " per rank, global ", opt_.batch_size * comm_.size());
  log_.info("model: ", opt_.model, " (width divisor ", opt_.effective_width_divisor(), "), ",
            ps.count(), " parameters; arenas ", format_mib(3.0 * ps.arena_size() * sizeof(float)),
            " (params, grads, momentum), activations ",
            format_mib(double(model_->activation_bytes())));
  restore_or_init();
}

Trainer::~Trainer() = default;

void Trainer::prepare_data() {
  if (!opt_.synthetic()) {
    data_path_ = opt_.data;
    return;
  }
  const data::SynthOptions so = demo_dataset();
  data_path_ = opt_.synth_cache.empty() ? default_synth_cache(so) : opt_.synth_cache;
  on_root("synthetic dataset", [&] {
    if (data::synthetic_matches(data_path_, so)) {
      log_.info("no --data given: using the cached synthetic crack dataset ", data_path_);
      return;
    }
    log_.info("no --data given: creating a synthetic crack dataset (", so.train_count, " train, ",
              so.val_count, " val, ", so.height, "x", so.width, ") at ", data_path_);
    std::filesystem::create_directories(std::filesystem::path(data_path_).parent_path());
    data::write_synthetic(data_path_, so);
  });
}

void Trainer::restore_or_init() {
  ParamStore& ps = model_->params();
  state_ = CheckpointMeta{};
  state_.best_valid_loss = std::numeric_limits<double>::infinity();
  std::string resumed_from;
  on_root("resume", [&] {
    // A checkpoint of another model or image size is a usage error, never silently skipped.
    auto check_compatible = [&](const std::string& path, const CheckpointMeta& m) {
      if (m.model != opt_.model || m.width_divisor != opt_.effective_width_divisor() ||
          m.height != height_ || m.width != width_)
        throw UsageError(str_cat("checkpoint '", path, "' is for ", m.model, " /", m.width_divisor,
                                 " on ", m.height, "x", m.width, " images, this run is ",
                                 opt_.model, " /", opt_.effective_width_divisor(), " on ", height_,
                                 "x", width_, "; use another --model-dir or --resume none"));
    };
    if (opt_.resume == "auto") {
      // Newest first; a torn or corrupt file is reported and the next older one is tried.
      for (const auto& [epoch, path] : list_epoch_checkpoints(opt_.model_dir)) {
        CheckpointMeta meta;
        try {
          meta = read_checkpoint_meta(path);
        } catch (const Error& e) {
          log_.warn("skipping unreadable checkpoint: ", e.what());
          continue;
        }
        check_compatible(path, meta);
        try {
          state_ = load_checkpoint(path, ps, sgd_->momentum());
          resumed_from = path;
          break;
        } catch (const Error& e) {
          log_.warn("skipping unreadable checkpoint: ", e.what());
        }
      }
    } else if (opt_.resume != "none") {
      check_compatible(opt_.resume, read_checkpoint_meta(opt_.resume));
      state_ = load_checkpoint(opt_.resume, ps, sgd_->momentum());
      resumed_from = opt_.resume;
    }
    if (resumed_from.empty()) {
      ps.init_pytorch_default(opt_.seed);
      if (!list_epoch_checkpoints(opt_.model_dir).empty() && opt_.resume == "none")
        log_.warn("--resume none: starting over; checkpoints in ", opt_.model_dir,
                  " will be overwritten");
    }
  });
  // Rank 0's weights, optimiser state and progress go to every rank.
  comm_.broadcast(ps.values(), size_t(ps.arena_size()) * sizeof(float), 0);
  comm_.broadcast(sgd_->momentum(), size_t(ps.arena_size()) * sizeof(float), 0);
  std::vector<double> packed = pack(state_);
  int64_t length = int64_t(packed.size());
  comm_.broadcast(&length, sizeof length, 0);
  packed.resize(size_t(length));
  comm_.broadcast(packed.data(), packed.size() * sizeof(double), 0);
  unpack(packed, state_);
  if (!resumed_from.empty())
    log_.info("resumed from epoch ", state_.epoch, " (", resumed_from, ", step ", state_.step, ")");
}

EpochMetrics Trainer::train_epoch(int64_t epoch) {
  const int world = comm_.size();
  data::DistributedSampler sampler(
      train_loader_->dataset_size(), comm_.rank(), world,
      {.shuffle = true, .pad = true, .drop_last = false, .seed = opt_.seed});
  std::vector<int64_t> indices = sampler.indices(epoch);
  if (opt_.max_steps > 0 && int64_t(indices.size()) > opt_.max_steps * opt_.batch_size)
    indices.resize(size_t(opt_.max_steps * opt_.batch_size));
  const int64_t steps = (int64_t(indices.size()) + opt_.batch_size - 1) / opt_.batch_size;
  const float lr = step_lr(float(opt_.lr), epoch, opt_.lr_step, float(opt_.lr_gamma));
  const float logit_threshold = float(std::log(opt_.threshold / (1.0 - opt_.threshold)));
  ParamStore& ps = model_->params();

  // sums[0] loss, [1] pixels; counts TP, FP, FN; reduced once at the end of the epoch.
  double sums[2] = {0, 0};
  int64_t counts[4] = {0, 0, 0, 0};
  train_loader_->start(std::move(indices), epoch);
  int64_t step = 0;
  while (const data::Batch* b = train_loader_->next()) {
    const int64_t pixels = int64_t(b->n) * height_ * width_;
    // The padded sampler gives every rank the same batch sizes, so the global pixel count is
    // known without communication; each rank's loss is its sum over the global count, and the
    // all-reduced SUM of gradients is the gradient of the global mean.
    const float grad_scale = 1.0f / float(pixels * world);
    const float* logits = model_->forward(b->images, b->n);
    sums[0] += backend_->bce_with_logits(pixels, logits, b->masks, pos_weight_, grad_scale,
                                         diff_logits_.f32());
    sums[1] += double(pixels);
    backend_->confusion_counts(pixels, logits, b->masks, logit_threshold, counts);
    counts[3] += b->n;
    model_->backward(diff_logits_.f32());
    comm_.allreduce_sum(ps.grads(), size_t(ps.arena_size()));
    sgd_->step(lr);
    ++step;
    ++state_.step;
    if (opt_.log_every > 0 && step % opt_.log_every == 0)
      log_.info("  epoch ", epoch + 1, " step ", step, "/", steps, " loss ", sums[0] / sums[1],
                " (rank 0)");
  }
  comm_.allreduce_sum(sums, 2);
  comm_.allreduce_sum(counts, 4);
  EpochMetrics m;
  m.loss = sums[0] / sums[1];
  m.iou = double(counts[0]) / std::max<double>(1.0, double(counts[0] + counts[1] + counts[2]));
  m.samples = counts[3];
  return m;
}

EpochMetrics Trainer::validate() {
  EpochMetrics m;
  if (!val_loader_) return m;
  data::DistributedSampler sampler(val_loader_->dataset_size(), comm_.rank(), comm_.size(),
                                   {.shuffle = false, .pad = false, .drop_last = false, .seed = 0});
  const float logit_threshold = float(std::log(opt_.threshold / (1.0 - opt_.threshold)));
  double sums[2] = {0, 0};
  int64_t counts[4] = {0, 0, 0, 0};
  val_loader_->start(sampler.indices(0), 0);
  while (const data::Batch* b = val_loader_->next()) {
    const int64_t pixels = int64_t(b->n) * height_ * width_;
    const float* logits = model_->forward(b->images, b->n);
    sums[0] +=
        backend_->bce_with_logits(pixels, logits, b->masks, pos_weight_, 0.0f, diff_logits_.f32());
    sums[1] += double(pixels);
    backend_->confusion_counts(pixels, logits, b->masks, logit_threshold, counts);
    counts[3] += b->n;
  }
  comm_.allreduce_sum(sums, 2);
  comm_.allreduce_sum(counts, 4);
  m.loss = sums[0] / std::max(1.0, sums[1]);
  m.iou = double(counts[0]) / std::max<double>(1.0, double(counts[0] + counts[1] + counts[2]));
  m.samples = counts[3];
  return m;
}

void Trainer::save_epoch(const EpochMetrics& train, const EpochMetrics& valid, double seconds,
                         float lr) {
  state_.epoch += 1;
  state_.train_loss.push_back(train.loss);
  state_.valid_loss.push_back(valid.loss);
  state_.valid_iou.push_back(valid.iou);
  state_.epoch_seconds.push_back(seconds);
  // Without a validation split the best model is chosen by the training loss.
  const double score = val_loader_ ? valid.loss : train.loss;
  const bool best = score < state_.best_valid_loss;
  if (best) {
    state_.best_valid_loss = score;
    state_.best_epoch = state_.epoch;
  }
  state_.model = opt_.model;
  state_.width_divisor = opt_.effective_width_divisor();
  state_.height = height_;
  state_.width = width_;
  state_.world_size = comm_.size();
  state_.global_batch = int64_t(opt_.batch_size) * comm_.size();
  state_.seed = int64_t(opt_.seed);
  state_.lr = lr;
  state_.options = opt_.describe();
  on_root("writing checkpoint", [&] {
    const std::filesystem::path dir(opt_.model_dir);
    save_checkpoint((dir / epoch_checkpoint_name(state_.epoch)).string(), model_->params(),
                    sgd_->momentum(), state_);
    if (best)
      save_checkpoint((dir / kBestCheckpointName).string(), model_->params(), sgd_->momentum(),
                      state_);
  });
}

int Trainer::run() {
  if (state_.epoch >= opt_.epochs) {
    log_.info("run already complete: ", state_.epoch, " of ", opt_.epochs, " epochs done in ",
              opt_.model_dir, " (best epoch ", state_.best_epoch, ", loss ",
              fixed(state_.best_valid_loss, 4), "); raise --epochs to train further");
    return 0;
  }
  log_.info("training epochs ", state_.epoch + 1, "..", opt_.epochs, "; checkpoints in ",
            opt_.model_dir);
  for (int64_t epoch = state_.epoch; epoch < opt_.epochs; ++epoch) {
    const auto t0 = Clock::now();
    const float lr = step_lr(float(opt_.lr), epoch, opt_.lr_step, float(opt_.lr_gamma));
    const EpochMetrics train = train_epoch(epoch);
    const double train_seconds = seconds_since(t0);
    const EpochMetrics valid = validate();
    const double seconds = seconds_since(t0);
    save_epoch(train, valid, seconds, lr);
    log_.info("epoch ", epoch + 1, "/", opt_.epochs, "  lr ", lr, "  train_loss ",
              fixed(train.loss, 4), "  valid_loss ", fixed(valid.loss, 4), "  valid_iou ",
              fixed(valid.iou, 4), "  ", fixed(seconds, 1), " s  ",
              fixed(double(train.samples) / train_seconds, 1), " img/s",
              state_.best_epoch == state_.epoch ? "  *best" : "");
  }
  log_.info("done: best epoch ", state_.best_epoch, " (loss ", fixed(state_.best_valid_loss, 4),
            "), ", opt_.model_dir, "/", kBestCheckpointName);
  return 0;
}

}  // namespace dp::app
