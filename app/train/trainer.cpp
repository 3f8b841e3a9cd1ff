// The training loop: data-parallel steps, validation from reduced sums, checkpoints, resume.
#include "train/trainer.hpp"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>

#include "agreement.hpp"
#include "dp/adamw.hpp"
#include "dp/dataset.hpp"
#include "dp/fs.hpp"
#include "dp/image_io.hpp"
#include "dp/rng.hpp"
#include "dp/sampler.hpp"
#include "dp/synth.hpp"
#include "eval/centerline_dice.hpp"
#include "eval/sweep_metrics.hpp"
#include "train/checkpoints.hpp"
#include "train/epoch_outputs.hpp"
#include "train/fault_injection.hpp"
#include "train/loss.hpp"
#include "train/model_dir_lock.hpp"
#include "train/optimization.hpp"
#include "train/retention.hpp"
#include "train/run_state.hpp"

namespace dp::app {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kImageChannels = 3;  // data::Batch images are [n, H, W, 3]

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

// This process's peak resident memory (VmHWM), in bytes; 0 where /proc is not available.
int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
  std::fclose(f);
  return int64_t(kib) * 1024;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Trainer::Trainer(TrainOptions options, Comm& comm, Logger log)
    : opt_(std::move(options)),
      comm_(comm),
      log_(log),
      progress_(
          comm_.rank() == 0,
          use_progress_bar(opt_.progress, isatty(STDOUT_FILENO) != 0, isatty(STDERR_FILENO) != 0),
          opt_.log_every),
      guard_(opt_, comm_, log_, progress_),
      preemption_(parse_preempt_signals(opt_.preempt_signals)) {
  choose_device();
  on_root(comm_, "--model-dir", [&] {
    ensure_writable_dir(opt_.model_dir);
    model_dir_lock_ = std::make_unique<ModelDirLock>(opt_.model_dir, log_);
  });
  faults_ = std::make_unique<FaultInjection>(opt_.test_faults, comm_.rank());
  prepare_data();
  collectively(comm_, [&] { resolve_data_choices(); });
  log_configuration();
  collectively(comm_, [&] { set_up_model(); });
  if (const std::string note = device_->memory_note(); !note.empty()) log_.info(note);
  log_set_up();
  // After every rank has agreed that set-up succeeded: the reducer duplicates the communicator.
  mpi::ReducerOptions ro;
  ro.bucket_mib = opt_.bucket_mb;
  ro.overlap = opt_.overlap;
  ro.progress_us = opt_.progress_us;
  reducer_ = device_->make_reducer(comm_, model_->params(), ro);
  log_.info(
      "gradients: ",
      opt_.bench_skip_allreduce ? "NOT reduced (--bench-skip-allreduce)" : reducer_->describe(),
      opt_.accumulation_steps > 1
          ? str_cat("; ", opt_.accumulation_steps, " micro-batches per step, global batch ",
                    int64_t(opt_.batch_size) * opt_.accumulation_steps * comm_.size())
          : std::string());
  checkpoints_ = std::make_unique<Checkpoints>(opt_, comm_, log_, *model_, *optim_, average_.get(),
                                               height_, width_);
  state_ = checkpoints_->restore_or_init();
  guard_.start_watchdog(device_->before_abort());
  // After the checkpoint is chosen: TensorBoard drops the events of later steps.
  outputs_ = std::make_unique<EpochOutputs>(
      opt_, comm_, log_, data_path_, Normalization{train_loader_->mean(), train_loader_->std()},
      height_, width_, val_loader_ != nullptr, state_.step);
}

// The choices that depend on the dataset, made before the configuration is printed so that it
// (and every checkpoint) shows what runs: --best-metric ods without a validation split, and
// --lr-schedule auto.
void Trainer::resolve_data_choices() {
  if (opt_.best_metric == BestMetric::kOds && !data::Dataset::has_split(data_path_, "val")) {
    log_.info("--best-metric ods: dataset '", data_path_,
              "' has no validation split; the training loss chooses the best epoch");
    opt_.best_metric = BestMetric::kValidLoss;  // ODS is measured on validation only
  }
  if (opt_.lr_schedule == LrScheduleKind::kAuto) {
    const int64_t images = data::Dataset(data_path_, "train").size();
    opt_.lr_schedule = auto_lr_schedule(images, opt_.epochs);
    log_.info("LR schedule: ", word_of(lr_schedule_words(), opt_.lr_schedule), " (auto: ", images,
              " training images x ", opt_.epochs, " epochs = ", images * opt_.epochs,
              opt_.lr_schedule == LrScheduleKind::kCosine ? " >= " : " < ", kCosineMinImages, ")");
  }
}

void Trainer::log_configuration() {
  if (comm_.rank() == 0) {  // Once: every effective option (also stored in every checkpoint;
                            // the same on every rank, so not repeated by --log-all-ranks).
    std::string block;
    std::istringstream lines(opt_.describe());
    for (std::string line; std::getline(lines, line);) block += "\n  " + line;
    log_.info("configuration (", comm_.size(), " rank(s)):", block);
  }
  // Where this rank runs (every rank's line with --log-all-ranks).
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  log_.info("rank ", comm_.rank(), " of ", comm_.size(), " on node ", host, ", node-local rank ",
            comm_.local_rank(), " of ", comm_.local_size());
}

void Trainer::choose_device() {
  // GPU = node-local rank modulo the visible GPUs (CUDA_VISIBLE_DEVICES respected); more ranks
  // per node than GPUs only with --allow-gpu-sharing.
  device_ = std::make_unique<Device>(DeviceRequest{.device = opt_.device,
                                                   .program = "dptrain",
                                                   .allow_sharing = opt_.allow_gpu_sharing,
                                                   .one_gpu_per_rank = true},
                                     comm_);
  if (device_->gpu()) {
    const GpuInfo& d = device_->gpu_info();
    log_.info("device: GPU ", d.ordinal, " of ", d.visible_count, " (", d.name, ", ", d.pci_bus_id,
              d.shared ? ", shared with other ranks" : "", ")");
    if (d.isolated && comm_.rank() == 0)
      log_.info(
          "GPUs are isolated per rank (each rank of a node sees only its own, e.g. srun "
          "--gpus-per-task): NCCL's peer-to-peer paths between them may be off; request "
          "the GPUs per node (--gpus-per-node) to keep them");
  }
  const ThreadChoice threads =
      choose_threads(opt_.threads, ThreadEnvironment::of_this_process(comm_.local_size()));
  omp_set_num_threads(threads.threads);
  if (const std::string w = oversubscription_warning(comm_, threads.threads);
      !w.empty() && comm_.rank() == 0)
    log_.warn(w);
  // Every reduction order is fixed by the world size and the thread count (static OpenMP
  // schedules, oneDNN's fixed blocking, a fixed all-reduce ring); --deterministic also forbids
  // OpenMP from changing the thread count between parallel regions.
  if (opt_.deterministic) omp_set_dynamic(0);
  if (device_->gpu()) {
    log_.info("dptrain: ", comm_.size(), " rank(s), device cuda (one GPU per rank), ",
              opt_.precision == Precision::kBFloat16 ? "bf16 activations and convolutions"
              : opt_.tf32                            ? "fp32 (TF32) convolutions"
                                                     : "fp32 convolutions");
  } else {
    // What runs, not what was asked: a choice this CPU cannot make is refused by make_backend().
    const bool bf16 = opt_.precision == Precision::kBFloat16;
    std::string convs = bf16 ? "bf16 activations and convolutions" : "fp32 convolutions";
    const std::string kernels =
        cpu_conv_kernels(opt_.deterministic ? CpuConvAlgo::kDirect : opt_.cpu_conv);
    if (!bf16 && !kernels.empty()) convs += " (" + kernels + ")";
    log_.info("dptrain: ", comm_.size(), " rank(s), device cpu (", cpu_onednn_version(), ", ",
              cpu_isa_name(), "), ", threads.threads, " thread(s) per rank (", threads.source,
              "), ", convs);
    if (const std::string note = cpu_bf16_note(); bf16 && !note.empty()) log_.info(note);
  }
  const std::string nccl = device_->nccl_version();
  log_.info("preemption: ", signal_names(preemption_signals()),
            " -> checkpoint at the next step, exit ", kExitPreempted,
            nccl.empty() ? std::string() : str_cat(" (NCCL ", nccl, " loaded)"));
  if (const std::string w = nccl_signal_warning(nccl, preemption_signals());
      !w.empty() && comm_.rank() == 0)
    log_.warn(w);
}

void Trainer::set_up_model() {
  BackendRequest br;
  br.precision = opt_.precision;
  // Timing-based choices differ between runs: reproducible runs use the direct kernels.
  br.cpu_conv = opt_.deterministic ? CpuConvAlgo::kDirect : opt_.cpu_conv;
  br.tf32 = opt_.tf32;
  br.deterministic = opt_.deterministic;
  br.log = log_;  // a bf16 convolution shape that runs in fp32
  backend_ = device_->make_backend(br);
  data::LoaderOptions lo;
  lo.batch_size = opt_.batch_size;
  lo.prefetch = opt_.prefetch;
  lo.seed = opt_.seed;
  lo.workers = opt_.workers;
  lo.augment = opt_.augment;
  lo.normalize = opt_.normalize;
  lo.cache = opt_.cache;
  data::parse_crop(opt_.random_crop, opt_.scale_jitter, lo);  // data path: crops
  train_loader_ = std::make_unique<data::Loader>(data_path_, "train", lo);
  check_train_size();
  lo = data::validation_options(lo);  // data path: no augmentation, centred crop
  if (data::Dataset::has_split(data_path_, "val"))
    val_loader_ = std::make_unique<data::Loader>(data_path_, "val", lo);
  height_ = train_loader_->height();
  width_ = train_loader_->width();
  if (val_loader_ && (val_loader_->height() != height_ || val_loader_->width() != width_))
    throw UsageError(str_cat("dataset '", data_path_, "': validation images are ",
                             val_loader_->height(), "x", val_loader_->width(),
                             " but training images are ", height_, "x", width_, " (HxW)"));
  if (val_loader_) {
    auto val = std::make_unique<data::Dataset>(data_path_, "val");
    if (val->has_native_masks() && val->height() == height_ && val->width() == width_)
      photo_masks_ = std::move(val);
  }
  const float pos_weight = Loss::crack_weight(opt_.pos_weight, train_loader_->pos_weight());
  loss_ = std::make_unique<Loss>(opt_, pos_weight);
  log_.info("loss: ", Loss::describe(opt_),
            opt_.pos_weight == "none" || !loss_->has_bce()
                ? std::string()
                : str_cat("; crack pixels weigh ", pos_weight, " in BCE (--pos-weight ",
                          opt_.pos_weight, "; the training split has ", train_loader_->pos_weight(),
                          " background pixels per crack pixel)"));

  ModelConfig mc;
  mc.name = opt_.model;
  mc.width_divisor = opt_.effective_width_divisor();
  mc.deconv = opt_.deconv;
  mc.dropout = float(opt_.dropout);
  mc.relu_init = opt_.weight_init;
  model_ = make_model(mc, *backend_);
  if (opt_.sync_bn)  // batch statistics over all ranks (forward and backward)
    model_->set_stat_reducer([this](double* sums, size_t n) {
      const auto waiting = watch("sync-BN statistics reduction");
      comm_.allreduce_sum(sums, n);
    });
  // The images' size is the dataset's fault; any other setup error (device memory) is not.
  const int multiple = model_->size_multiple();
  if (height_ % multiple != 0 || width_ % multiple != 0)
    throw UsageError(str_cat(opt_.random_crop.empty()
                                 ? str_cat("dataset '", data_path_, "': images are ")
                                 : std::string("--random-crop: crops are "),
                             height_, "x", width_, " (HxW); model ", opt_.model,
                             " needs a height and width that are multiples of ", multiple));
  model_->setup(opt_.batch_size, height_, width_);
  optim_ = make_optimizer(opt_, model_->params(), *backend_);
  if (opt_.ema > 0)
    average_ =
        std::make_unique<WeightAverage>(*model_, *backend_, float(opt_.ema), opt_.ema_warmup);
  diff_logits_ = Buffer(static_cast<size_t>(opt_.batch_size) * height_ * width_ * sizeof(float),
                        backend_->device_memory());
  dropout_seeds_.resize(size_t(opt_.batch_size));
  const size_t pixels = size_t(opt_.batch_size) * size_t(height_) * size_t(width_);
  device_->prepare_uploads(pixels * kImageChannels, pixels);
}

void Trainer::log_set_up() const {
  const ParamStore& ps = model_->params();
  log_.info("data: ", data_path_, ": ", train_loader_->dataset_size(), " train, ",
            val_loader_ ? val_loader_->dataset_size() : 0, " val images of ", height_, "x", width_,
            "; batch ", opt_.batch_size, " per rank, global ", opt_.batch_size * comm_.size());
  if (photo_masks_)
    log_.info(
        "validation: the threshold sweep (ODS, OIS, AP, the scores at the ODS threshold) "
        "and clDice at the photographs' ",
        photo_masks_->native_height(), "x", photo_masks_->native_width(),
        " (the probabilities resized as dppredict resizes them, against the dataset's "
        "val/native_masks); the loss and the scores at --threshold at ",
        height_, "x", width_);
  log_.info("loader: ", opt_.workers, " worker(s), prefetch ", opt_.prefetch, ", augment ",
            data::augment_name(opt_.augment), ", normalize ", data::normalize_name(opt_.normalize),
            opt_.cache
                ? str_cat(", cache: up to ",
                          format_mib(4.0 * height_ * width_ *
                                     double(train_loader_->dataset_size() +
                                            (val_loader_ ? val_loader_->dataset_size() : 0)) /
                                     comm_.size()),
                          " per rank after the first epoch")
                : std::string(),
            opt_.drop_last ? ", drop last" : "");
  log_.info(
      "model: ", opt_.model, " (width divisor ", opt_.effective_width_divisor(), "), ", ps.count(),
      " parameters; arenas ",
      format_mib(double(2 + optim_->state().size()) * double(ps.arena_size()) * sizeof(float)),
      " (params, grads, ", optim_->name(), " state), activations ",
      format_mib(double(model_->activation_bytes())), " (values and gradients ",
      format_mib(double(model_->unshared_activation_bytes())), " without sharing)");
  if (average_)
    log_.info("weights: an exponential moving average with decay ", opt_.ema,
              " per step is validated, chooses ", kBestCheckpointName,
              " and is stored in every checkpoint beside the raw weights (dppredict uses it)");
}

Trainer::~Trainer() = default;

void Trainer::check_train_size() const {
  const int64_t n = train_loader_->dataset_size();
  const int world = comm_.size();
  if (n < world)
    throw UsageError(str_cat("dataset '", data_path_, "': the training split has ", n,
                             " sample(s), fewer than the ", world,
                             " ranks; use fewer ranks or more data"));
  if (opt_.drop_last && n / world < opt_.batch_size)
    throw UsageError(str_cat("dataset '", data_path_, "': --drop-last with ", n,
                             " training samples on ", world, " ranks leaves ", n / world,
                             " per rank, less than one batch of ", opt_.batch_size));
}

void Trainer::prepare_data() {
  if (!opt_.synthetic()) {
    data_path_ = opt_.data;
    return;
  }
  const data::SynthOptions so = demo_dataset();
  data_path_ = opt_.synth_cache.empty() ? default_synth_cache(so) : opt_.synth_cache;
  on_root(comm_, "synthetic dataset", [&] {
    if (data::synthetic_matches(data_path_, so)) {
      log_.info("no --data given: using the cached synthetic crack dataset ", data_path_);
      return;
    }
    log_.info("no --data given: creating a synthetic crack dataset (", so.train_count, " train, ",
              so.val_count, " val, ", so.height, "x", so.width, ") at ", data_path_);
    // A bare file name (--synth-cache demo.h5) is in the working directory: nothing to create.
    if (const auto parent = std::filesystem::path(data_path_).parent_path(); !parent.empty())
      std::filesystem::create_directories(parent);
    data::write_synthetic(data_path_, so);
  });
}

EpochMetrics Trainer::train_epoch(int64_t epoch) {
  model_->set_training(true);
  const auto t0 = Clock::now();
  EpochContext e;
  e.epoch = epoch;
  e.lr = float(epoch_lr(opt_, epoch, comm_.size()));
  loss_->set_epoch(epoch);  // and for the validation that follows
  // A mid-epoch checkpoint continues its epoch after its steps, at its position of the epoch's
  // global order, with the epoch's partial sums (rank 0 carries them).
  const bool resuming = epoch == state_.epoch && state_.epoch_step > 0;
  if (resuming) e.start = {state_.epoch_step, state_.epoch_position};
  double carried_seconds = 0;
  EpochSums sums = EpochSums::from_partial(resuming ? state_.epoch_partial : std::vector<double>{},
                                           &carried_seconds);
  if (comm_.rank() != 0) sums = {};
  EpochShard shard =
      plan_epoch(opt_, train_loader_->dataset_size(), comm_.rank(), comm_.size(), epoch, e.start);
  e.plan = shard.plan;
  progress_.start_epoch(epoch + 1, opt_.epochs, e.start.step, e.start.step + e.plan.steps());
  outputs_->start_epoch();
  if (!shard.indices.empty()) train_loader_->start(std::move(shard.indices), epoch);
  auto step_end = Clock::now();  // --bench-step-times: wall time from one step's end to the next
  double reduce_seconds = 0;
  for (int64_t step = 0; step < e.plan.steps(); ++step) {
    const EpochSums before = sums;
    const StepResult done = train_step(e, step, sums);
    reduce_seconds += done.reduce_seconds;
    if (!kernels_logged_) {  // after the first step has timed every pass
      kernels_logged_ = true;
      const std::string k = backend_->kernel_choices();
      if (!k.empty()) log_.info("3x3 convolution kernels (per pass): ", k);
    }
    if (opt_.bench_step_times) {
      log_.info("bench: step_seconds ", seconds_since(step_end));
      step_end = Clock::now();
    }
    if (opt_.check_sync_every > 0 && state_.step % opt_.check_sync_every == 0) check_sync();
    // Rank 0's running loss; the images are the step's real ones over all ranks.
    progress_.step(e.start.step + step + 1, sums.loss / std::max(1.0, sums.pixels),
                   e.plan.step_samples(step));
    outputs_->step(state_.step, sums.loss - before.loss, sums.pixels - before.pixels,
                   e.plan.step_samples(step), float(step_lr(opt_, e.lr, state_.step)));
    // Preemption after this step, unless it is the epoch's last: the epoch ends and its
    // checkpoint serves.
    if (done.preempt && step + 1 < e.plan.steps()) {
      train_loader_->stop();
      {
        const auto waiting = watch("epoch metric reduction");
        sums.allreduce(comm_);
      }
      save_mid_epoch(e.start.step + step + 1,
                     e.start.position + e.plan.end_micro(step) * opt_.batch_size * comm_.size(),
                     sums.partial(carried_seconds + seconds_since(t0)), e.lr);
      EpochMetrics m;
      m.preempted = true;
      return m;
    }
  }
  DP_CHECK(train_loader_->next() == nullptr, "the training loader has more batches than the ",
           e.plan.micro_steps(), " of the epoch's plan");
  progress_.clear();
  const int64_t steps = e.plan.steps();
  if (comm_.size() > 1 && steps > 0)
    log_.info("  gradient all-reduce: ", fixed(1e3 * reduce_seconds / double(steps), 1),
              " ms per step waited after backward (rank 0; includes waiting for slower ranks)");
  const auto waiting = watch("epoch metric reduction");
  sums.allreduce(comm_);
  EpochMetrics m = sums.metrics();
  m.allreduce_wait_ms = steps > 0 ? 1e3 * reduce_seconds / double(steps) : 0.0;
  return m;
}

// One optimiser step: forward, loss and backward of each of its micro-batches (the last one's
// gradients all-reduced bucket by bucket while its backward runs), then the agreement of all
// ranks (preemption, a non-finite or exploded loss, a non-finite gradient norm), clipping and the
// update. `sums` gain the step's loss and counts, unless the step is skipped as non-finite.
Trainer::StepResult Trainer::train_step(const EpochContext& e, int64_t step, EpochSums& sums) {
  const EpochSums before = sums;
  const int64_t run_step = state_.step + 1;  // 1-based, over the whole run
  const int64_t image_pixels = int64_t(height_) * width_;
  const float logit_threshold = float(std::log(opt_.threshold / (1.0 - opt_.threshold)));
  const bool reduce = !opt_.bench_skip_allreduce;
  float* diff = diff_logits_.f32();
  const int64_t first = e.plan.first_micro(step), end = e.plan.end_micro(step);
  for (int64_t micro = first; micro < end; ++micro) {
    const data::Batch* b = train_loader_->next();
    DP_CHECK(b != nullptr && b->n == e.plan.batch_size(micro), "training batch ", micro, " has ",
             b != nullptr ? b->n : 0, " samples, expected ", e.plan.batch_size(micro));
    BatchTensors in;
    const float* logits = forward(*b, e.epoch, in);
    // Each rank's loss gradient is that of the mean over the real images of this optimiser step
    // (all micro-batches, all ranks), so the sum of the gradients over micro-batches and ranks is
    // the gradient of the mean over the global batch, uneven last batch included. Padding images
    // get a zero gradient, and their loss is dropped.
    const int real = e.plan.real_in_batch(comm_.rank(), micro);
    const int64_t real_pixels = int64_t(real) * image_pixels;
    const double loss = loss_->sum(*backend_, real, height_, width_, logits, in.masks,
                                   e.plan.step_samples(step), diff);
    if (real < b->n)
      loss_->sum(*backend_, b->n - real, height_, width_, logits + real_pixels,
                 in.masks + real_pixels, 0, diff + real_pixels);
    sums.add_batch(*backend_, real, image_pixels, logits, in.masks, logit_threshold, loss);
    const bool last = micro + 1 == end;
    if (last) faults_->at_step(run_step, sums.loss);
    // Gradients accumulate locally over the micro-batches of a step; only the last one's are
    // all-reduced.
    if (last && reduce) reducer_->begin();
    model_->backward(diff, last && reduce ? reducer_.get() : nullptr,
                     micro == first ? GradMode::kOverwrite : GradMode::kAccumulate);
  }
  StepResult result;
  if (reduce) {
    const auto waited_from = Clock::now();
    const auto waiting = watch("gradient all-reduce");
    reducer_->wait();
    result.reduce_seconds = seconds_since(waited_from);
  }
  // The divergence guard: this step's loss on every rank (non-finite, or exploded past
  // --divergence-factor) and the L2 norm of the averaged gradients (identical on every rank),
  // agreed on before the update, in the all-reduce that also carries the preemption flag.
  float* grads = model_->params().grads();
  const int64_t grad_count = model_->params().arena_size();
  const double grad_norm = std::sqrt(backend_->sum_squares(grad_count, grads));
  const StepGuard::Agreement agreed = guard_.agree(
      run_step, sums.loss - before.loss, sums.pixels - before.pixels, std::isfinite(grad_norm));
  result.preempt = agreed.preempt;
  if (!agreed.diverged()) {
    if (opt_.clip_grad_norm > 0)  // the reduced, averaged gradients: identical on every rank
      scale_to_max_norm(*backend_, grads, grad_count, grad_norm, opt_.clip_grad_norm);
    optim_->update(float(step_lr(opt_, e.lr, run_step)), run_step);
    if (average_) average_->update(run_step);
  } else {  // no update; the step's loss and counts are dropped
    guard_.on_divergence(agreed, e.epoch, e.start.step + step + 1, run_step, grad_norm);
    sums = before;
  }
  state_.step = run_step;
  return result;
}

const float* Trainer::forward(const data::Batch& b, int64_t epoch, BatchTensors& in) {
  // Dropout masks: a function of (seed, epoch, sample index), like the augmentation.
  for (int i = 0; i < b.n; ++i)
    dropout_seeds_[size_t(i)] = key(opt_.seed, uint64_t(epoch), uint64_t(b.indices[i]));
  model_->set_dropout_seeds(dropout_seeds_.data(), b.n);
  const size_t pixels = size_t(b.n) * size_t(height_) * size_t(width_);
  in = device_->upload(b, pixels * kImageChannels, pixels);
  return model_->forward(in.images, b.n);
}

void Trainer::score_at_photo_size(const float* logits, int64_t index, ThresholdSweep& sweep,
                                  CenterlineDice& centerline) {
  const int h = photo_masks_->native_height(), w = photo_masks_->native_width();
  std::vector<float> probability(size_t(height_) * size_t(width_));
  for (size_t p = 0; p < probability.size(); ++p)
    probability[p] = 1.0f / (1.0f + std::exp(-logits[p]));
  probability = data::resize_bilinear(probability, width_, height_, w, h);  // as dppredict's
  std::vector<uint8_t> truth(size_t(h) * size_t(w)), mask(truth.size());
  photo_masks_->read_native_mask(index, truth.data());
  for (size_t p = 0; p < mask.size(); ++p) mask[p] = probability[p] > opt_.threshold ? 1 : 0;
  sweep.add_probabilities(probability.data(), truth.data(), h, w);
  centerline.add_masks(mask.data(), truth.data(), h, w);
}

void Trainer::check_sync() {
  guard_.check_sync(model_->params(), state_.step);
}

EpochMetrics Trainer::validate() {
  if (!val_loader_) return {};
  data::DistributedSampler sampler(val_loader_->dataset_size(), comm_.rank(), comm_.size(),
                                   {.shuffle = false, .pad = false, .drop_last = false, .seed = 0});
  const float logit_threshold = float(std::log(opt_.threshold / (1.0 - opt_.threshold)));
  const int64_t image = int64_t(height_) * width_;
  EpochSums sums;
  ThresholdSweep sweep(opt_.tolerance);
  CenterlineDice centerline;
  std::vector<float> host_logits;  // a device backend's logits, for the sweep and clDice
  model_->set_training(false);     // running batch-norm statistics, no dropout
  val_loader_->start(sampler.indices(0), 0);
  while (const data::Batch* b = val_loader_->next()) {
    const int64_t pixels = int64_t(b->n) * image;
    const BatchTensors in = device_->upload(*b, size_t(pixels) * kImageChannels, size_t(pixels));
    const float* logits = model_->forward(in.images, b->n);
    const float* swept = logits;
    if (DeviceMemory* device = backend_->device_memory()) {
      host_logits.resize(size_t(pixels));
      device->download(host_logits.data(), logits, size_t(pixels) * sizeof(float));
      swept = host_logits.data();
    }
    for (int i = 0; i < b->n; ++i) {
      if (photo_masks_) {
        score_at_photo_size(swept + i * image, b->indices[i], sweep, centerline);
        continue;
      }
      sweep.add_image(swept + i * image, b->masks + i * image, height_, width_);
      centerline.add_image(swept + i * image, b->masks + i * image, height_, width_,
                           logit_threshold);
    }
    const double loss =
        loss_->sum(*backend_, b->n, height_, width_, logits, in.masks, 0, diff_logits_.f32());
    sums.add_batch(*backend_, b->n, image, logits, in.masks, logit_threshold, loss);
  }
  const auto waiting = watch("validation metric reduction");
  sums.allreduce(comm_);
  comm_.allreduce_sum(sweep.counts().data(), sweep.counts().size());
  comm_.allreduce_sum(sweep.sums().data(), sweep.sums().size());
  comm_.allreduce_sum(centerline.counts().data(), centerline.counts().size());
  EpochMetrics m = sums.metrics();
  m.cldice = centerline.value();
  const SweepResult r = sweep.result();
  m.ods = r.ods, m.ods_threshold = r.ods_threshold, m.ois = r.ois, m.ap = r.ap;
  if (r.ods_threshold > 0) m.at_ods = MaskScores::of(sweep.confusion_at(r.ods_threshold));
  return m;
}

bool Trainer::save_epoch(const EpochRecord& r) {
  const bool best = record_epoch(state_, opt_, r.train, r.valid, val_loader_ != nullptr, r.seconds);
  stamp_state(r.lr);
  const bool due = epoch_checkpoint_due(state_.epoch, opt_.save_every, opt_.epochs) ||
                   stopping_early(state_, opt_);
  if (due || best) {
    const auto waiting = watch("checkpoint agreement (rank 0 writes)");
    checkpoints_->write_epoch(state_, due, best);
  }
  return due;
}

void Trainer::stamp_state(float lr) {
  state_.best_metric = best_metric_name(opt_.best_metric);
  state_.model = opt_.model;
  state_.width_divisor = opt_.effective_width_divisor();
  state_.deconv = opt_.deconv;
  state_.height = height_;
  state_.width = width_;
  state_.scale_y = train_loader_->scale().y;  // 0 where unknown, as CheckpointMeta reads it
  state_.scale_x = train_loader_->scale().x;
  state_.world_size = comm_.size();
  state_.global_batch = int64_t(opt_.batch_size) * comm_.size();
  state_.seed = int64_t(opt_.seed);
  state_.lr = lr;
  // The input statistics, so that dppredict and dpexport normalise exactly as training did (also
  // in the options text, which older readers parse).
  const Normalization norm{train_loader_->mean(), train_loader_->std()};
  state_.normalize_mean.assign(norm.mean.begin(), norm.mean.end());
  state_.normalize_std.assign(norm.std.begin(), norm.std.end());
  state_.options = opt_.describe() + describe_normalization(norm);
  state_.option_values = opt_.values();
}

std::optional<mpi::StallWatchdog::Scope> Trainer::watch(const char* collective) {
  return guard_.watch(collective, state_.step);
}

void Trainer::save_mid_epoch(int64_t step_in_epoch, int64_t position, std::vector<double> partial,
                             float lr) {
  state_.epoch_step = step_in_epoch;
  state_.epoch_position = position;
  state_.epoch_partial = std::move(partial);
  stamp_state(lr);
  const auto waiting = watch("checkpoint agreement (rank 0 writes)");
  const std::string path = checkpoints_->write_mid_epoch(state_);
  log_.info("preempted in epoch ", state_.epoch + 1, " after step ", step_in_epoch, " (",
            state_.step, " in all): wrote ", path, "; exiting with ", kExitPreempted,
            " (resumable: rerun the same command)");
}

bool Trainer::already_finished() const {
  if (stopping_early(state_, opt_) && state_.epoch < opt_.epochs) {
    log_.info("run already stopped early at epoch ", state_.epoch, ": ",
              best_epoch_summary(state_, opt_.best_metric), ", ", opt_.model_dir, "/",
              kBestCheckpointName, "; ", state_.early_stop_wait, " validation(s) without a better ",
              best_metric_name(opt_.best_metric), " (--patience ", opt_.patience, ")");
    return true;
  }
  if (state_.epoch >= opt_.epochs) {
    log_.info("run already complete: ", state_.epoch, " of ", opt_.epochs, " epochs done in ",
              opt_.model_dir, " (best epoch ", state_.best_epoch, ", loss ",
              fixed(state_.best_valid_loss, 4), "); raise --epochs to train further");
    return true;
  }
  return false;
}

int Trainer::run() {
  if (already_finished()) return 0;
  log_.info("training epochs ", state_.epoch + 1, "..", opt_.epochs, "; checkpoints in ",
            opt_.model_dir);
  for (int64_t epoch = state_.epoch; epoch < opt_.epochs; ++epoch) {
    const auto t0 = Clock::now();
    // Seconds spent in this epoch before a mid-epoch checkpoint it resumes from.
    const double carried =
        epoch == state_.epoch && state_.epoch_partial.size() == EpochSums::kPartialSize
            ? state_.epoch_partial.back()
            : 0.0;
    EpochRecord r;
    r.epoch = epoch;
    r.lr = float(epoch_lr(opt_, epoch, comm_.size()));
    r.train = train_epoch(epoch);
    if (r.train.preempted) return kExitPreempted;
    r.images_per_s = double(r.train.samples) / (seconds_since(t0) + carried);
    // --val-every: validate every N epochs and after the last; NaN metrics otherwise.
    r.validated = (epoch + 1) % opt_.val_every == 0 || epoch + 1 == opt_.epochs;
    r.valid.loss = r.valid.iou = r.valid.dice = r.valid.precision = r.valid.recall =
        std::numeric_limits<double>::quiet_NaN();
    {  // --ema: the averaged weights are validated and shown
      const AveragedWeightsScope averaged(average_.get());
      if (r.validated) r.valid = validate();
      r.seconds = seconds_since(t0) + carried;
      outputs_->before_checkpoint(r, state_.step, *model_);
    }
    const bool saved = save_epoch(r);
    {
      const AveragedWeightsScope averaged(average_.get());
      outputs_->after_checkpoint(r, state_, *model_);
    }
    if (stopping_early(state_, opt_) && epoch + 1 < opt_.epochs) {
      log_.info("stopped early at epoch ", epoch + 1, ": ",
                best_epoch_summary(state_, opt_.best_metric), ", ", opt_.model_dir, "/",
                kBestCheckpointName, " (", state_.early_stop_wait,
                " validation(s) without a better ", best_metric_name(opt_.best_metric),
                "; --patience ", opt_.patience, ")");
      return 0;
    }
    // A signal during validation or the checkpoint: the epoch checkpoint is the resume point.
    if (epoch + 1 < opt_.epochs && guard_.agree(state_.step, 0, 0, true).preempt) {
      if (!saved) {  // --save-every skipped it: the resume point
        const auto waiting = watch("checkpoint agreement (rank 0 writes)");
        checkpoints_->write_epoch(state_, true, false);
      }
      log_.info("preempted after epoch ", epoch + 1, ": resumable from ", opt_.model_dir, "/",
                epoch_checkpoint_name(state_.epoch), "; exiting with ", kExitPreempted);
      return kExitPreempted;
    }
  }
  log_.info("done: ", best_epoch_summary(state_, opt_.best_metric), ", ", opt_.model_dir, "/",
            kBestCheckpointName);
  if (opt_.bench_step_times) {
    int64_t peak[2] = {peak_rss_bytes(), 0};
    peak[1] = peak[0];
    comm_.allreduce_sum(peak, 1);  // total over ranks in peak[0]; this rank's own in peak[1]
    log_.info("bench: peak_rss_mib_total ", fixed(double(peak[0]) / (1 << 20), 1), " rank0 ",
              fixed(double(peak[1]) / (1 << 20), 1));
  }
  return 0;
}

}  // namespace dp::app
