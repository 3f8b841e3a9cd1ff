// The training loop: data-parallel steps, validation from reduced sums, checkpoints, resume.
#include "train/trainer.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "dp/adamw.hpp"
#include "dp/dataset.hpp"
#include "dp/fs.hpp"
#include "dp/mpi_comm.hpp"
#include "dp/rng.hpp"
#include "dp/sampler.hpp"
#include "dp/synth.hpp"
#include "train/centerline_dice.hpp"
#include "train/checkpoints.hpp"
#include "train/loss.hpp"
#include "train/model_dir_lock.hpp"
#include "train/optimization.hpp"
#include "train/report.hpp"
#include "train/retention.hpp"
#include "train/sweep_metrics.hpp"
#include "train/tensorboard.hpp"
#include "train/validation_samples.hpp"
#ifdef DP_WITH_CUDA
#include "dp/cuda/batch_upload.hpp"
#include "dp/cuda/cuda_backend.hpp"
#include "dp/cuda/device.hpp"
#include "dp/nccl_comm.hpp"
#include "dp/nccl_grad_reducer.hpp"
#endif

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

// The shape of one training epoch, the same on every rank and computed without communication.
// Rank q visits positions q, q+W, ... < N of the epoch's global order (DistributedSampler
// without padding), then padding up to `per_rank` samples so that every rank takes the same
// number of steps with the same batch sizes; --max-steps may cut every rank's list to the same
// length. Padding samples are computed but carry no weight (no loss, gradient or metrics), so a
// step's weight is its number of real samples over all ranks and the result does not depend on
// the world size.
struct EpochPlan {
  int64_t dataset = 0;   // N
  int world = 1;         // W
  int64_t per_rank = 0;  // samples every rank visits, padding included
  int batch = 1;
  int accumulation = 1;  // micro-batches per optimiser step

  int64_t micro_steps() const { return (per_rank + batch - 1) / batch; }
  int64_t steps() const { return (micro_steps() + accumulation - 1) / accumulation; }
  int batch_size(int64_t micro) const {
    return int(std::min<int64_t>(batch, per_rank - micro * batch));
  }
  int64_t real_samples(int q) const {
    return std::min(per_rank, q < dataset ? (dataset - q + world - 1) / world : 0);
  }
  int real_in_batch(int q, int64_t micro) const {
    return int(std::clamp<int64_t>(real_samples(q) - micro * batch, 0, batch_size(micro)));
  }
  // Real samples over all ranks in optimiser step `step` (at least 1: never all padding).
  int64_t step_samples(int64_t step) const {
    int64_t total = 0;
    const int64_t end = std::min(micro_steps(), (step + 1) * accumulation);
    for (int64_t m = step * accumulation; m < end; ++m)
      for (int q = 0; q < world; ++q) total += real_in_batch(q, m);
    return std::max<int64_t>(total, 1);
  }
};

// Metrics of a split from its reduced sums (loss, pixels) and counts (TP, FP, FN, samples).
EpochMetrics epoch_metrics(const double* sums, const int64_t* counts) {
  EpochMetrics m;
  const Confusion c{counts[0], counts[1], counts[2]};
  m.loss = sums[0] / std::max(1.0, sums[1]);
  m.iou = c.iou();
  m.dice = c.dice();
  m.precision = c.precision();
  m.recall = c.recall();
  m.samples = counts[3];
  return m;
}

// A mid-epoch checkpoint's epoch_partial: loss, pixels, TP, FP, FN, samples, seconds.
constexpr size_t kPartialSums = 7;

// DP_TEST_FAIL_AT="R:S": rank R throws during optimiser step S of the run (1-based), after its
// forward pass, while its peers wait in that step's gradient all-reduce. For the failure tests
// (tests/unit/test_failure.cpp); unset in normal runs.
constexpr const char* kFailAtVariable = "DP_TEST_FAIL_AT";

// DP_TEST_PREEMPT_AT="R:S": rank R raises SIGUSR1 in optimiser step S of the run (1-based), before
// the step's agreement, so the job stops after step S (tests/mpi/test_resume_mpi.cpp,
// tests/unit/test_cli.cpp).
constexpr const char* kPreemptAtVariable = "DP_TEST_PREEMPT_AT";

// DP_TEST_NONFINITE_AT="R:S": rank R's loss becomes NaN in optimiser step S of the run (1-based),
// its gradients stay finite (tests/unit/test_faults.cpp: the non-finite guard names that rank).
constexpr const char* kNonFiniteAtVariable = "DP_TEST_NONFINITE_AT";

void parse_fail_at(int& rank, int64_t& step, const char* variable = kFailAtVariable) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return;
  long long s = 0;
  char extra = 0;
  if (std::sscanf(v, "%d:%lld%c", &rank, &s, &extra) != 2 || rank < 0 || s < 1)
    throw UsageError(str_cat(variable, " must be RANK:STEP with STEP >= 1, got '", v, "'"));
  step = s;
}

// This rank's samples for epoch `epoch` from position `position` of the epoch's global order on
// (0, or where a mid-epoch checkpoint stopped). Rank q takes positions position+q, +W, ... of the
// order (a function of seed and epoch alone), so a resume on another world size continues the
// same order; then the padding (repeating the rank's first sample of the epoch, zero weight) or
// the --drop-last cut. --cache pins each rank's shard (reshuffled within it every epoch), so there
// the rank skips its own first position/W samples (same world size only, checked on resume).
std::vector<int64_t> epoch_indices(const TrainOptions& o, int64_t dataset, int rank, int world,
                                   int64_t epoch, int64_t position) {
  const size_t batch = size_t(o.batch_size);
  std::vector<int64_t> indices;
  if (o.cache) {
    data::DistributedSampler sampler(dataset, rank, world,
                                     {.shuffle = true,
                                      .pad = false,
                                      .drop_last = o.drop_last,
                                      .seed = o.seed,
                                      .fixed_shard = true});
    indices = sampler.indices(epoch);
    const int64_t padded = (dataset + world - 1) / world;
    if (o.drop_last)
      indices.resize(indices.size() / batch * batch);
    else if (dataset > 0)
      indices.resize(size_t(padded), indices.empty() ? 0 : indices.front());
    const auto skip = std::min(indices.size(), size_t(position / world));
    indices.erase(indices.begin(), indices.begin() + static_cast<ptrdiff_t>(skip));
    return indices;
  }
  const std::vector<int64_t> order =
      data::DistributedSampler(dataset, 0, 1,
                               {.shuffle = true, .pad = false, .drop_last = false, .seed = o.seed})
          .indices(epoch);
  const int64_t remaining = std::max<int64_t>(0, dataset - position);
  const int64_t end = o.drop_last ? position + remaining / world * world : dataset;
  for (int64_t p = position + rank; p < end; p += world) indices.push_back(order[size_t(p)]);
  if (o.drop_last)
    indices.resize(indices.size() / batch * batch);
  else if (remaining > 0)
    indices.resize(size_t((remaining + world - 1) / world), order[size_t(rank % dataset)]);
  return indices;
}

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

}  // namespace

int gpu_for_rank(int local_rank, int local_size, int visible_gpus, bool allow_sharing) {
  DP_CHECK(visible_gpus >= 1 && local_rank >= 0 && local_rank < local_size,
           "gpu_for_rank: local rank ", local_rank, " of ", local_size, ", ", visible_gpus,
           " GPU(s)");
  if (local_size > visible_gpus && !allow_sharing)
    throw UsageError(str_cat("--device cuda: ", local_size, " ranks on this node but ",
                             visible_gpus,
                             " visible GPU(s); start one rank per GPU or pass "
                             "--allow-gpu-sharing"));
  return local_rank % visible_gpus;
}

// What the CUDA backend needs besides the backend itself: the NCCL communicator for the gradient
// reducer and the batch uploader. Empty on the CPU.
struct Trainer::DeviceState {
#ifdef DP_WITH_CUDA
  cuda::CudaBackend* backend = nullptr;
  // Destroyed first: the communicator (aborted if a failure is unwinding), then the uploader,
  // which waits for the streams.
  std::unique_ptr<cuda::BatchUploader> uploader;
  std::unique_ptr<mpi::NcclComm> nccl;
#endif
};

std::unique_ptr<Backend> Trainer::make_backend(bool use_gpu) {
  device_ = std::make_unique<DeviceState>();
  const Precision precision = parse_precision(opt_.precision);
  if (!use_gpu) {
    CpuOptions co;
    co.precision = precision;
    // Timing-based choices differ between runs: reproducible runs use the direct kernels.
    co.conv_algo = opt_.deterministic ? CpuConvAlgo::kDirect : parse_cpu_conv(opt_.cpu_conv);
    return make_cli_cpu_backend(co);
  }
#ifdef DP_WITH_CUDA
  cuda::BackendOptions bo;
  bo.tf32 = opt_.tf32;
  bo.deterministic = opt_.deterministic;
  bo.precision = precision;
  bo.log = log_;  // a bf16 convolution shape that runs in fp32
  auto backend = cuda::make_cuda_backend(bo);
  device_->backend = backend.get();
  return backend;
#else
  throw UsageError("--device cuda: this dptrain was built without CUDA");
#endif
}

void Trainer::setup_device() {
#ifdef DP_WITH_CUDA
  if (device_->backend == nullptr) return;
  const size_t pixels = size_t(opt_.batch_size) * size_t(height_) * size_t(width_);
  device_->uploader = std::make_unique<cuda::BatchUploader>(pixels * (kImageChannels + 1),
                                                            device_->backend->stream());
  log_.info("GPU memory: ", format_mib(double(device_->backend->peak_bytes())),
            " allocated at start (parameters, gradients, optimizer state, activations)");
#endif
}

std::unique_ptr<mpi::GradReducer> Trainer::make_reducer(const mpi::ReducerOptions& ro) {
#ifdef DP_WITH_CUDA
  if (device_->backend != nullptr) {
    auto* mpi_comm = dynamic_cast<mpi::MpiComm*>(&comm_);
    DP_CHECK(mpi_comm != nullptr, "--device cuda: the NCCL reducer needs an MPI communicator");
    // NcclComm agrees over MPI on every failure before its collective ncclCommInitRank: the
    // ranks that failed throw their error, the others NcclPeerFailed, and collectively() reports
    // the lowest failed rank's error. A failure inside that call leaves the peers in it, which
    // they cannot leave: that rank reports it and ends the job at once.
    collectively(comm_, [&] {
      try {
        device_->nccl = std::make_unique<mpi::NcclComm>(*mpi_comm);
      } catch (const mpi::NcclPeerFailed&) {
        // Not this rank's failure: collectively() fails here too, with the failed rank's error.
      } catch (const mpi::NcclInitError& e) {
        std::fprintf(stderr,
                     "dptrain: error: [rank %d] %s (the other ranks cannot leave "
                     "ncclCommInitRank: ending the job)\n",
                     comm_.rank(), e.what());
        std::fflush(stderr);
        mpi::Env::abort(1);
      }
    });
    return mpi::make_nccl_grad_reducer(*device_->nccl, model_->params(), model_->params().grads(),
                                       device_->backend->stream(), ro);
  }
#endif
  return mpi::make_grad_reducer(comm_, model_->params(), ro);
}

Trainer::BatchTensors Trainer::to_backend(const data::Batch& b) {
#ifdef DP_WITH_CUDA
  if (device_->uploader) {
    const size_t pixels = size_t(b.n) * size_t(height_) * size_t(width_);
    const auto up = device_->uploader->upload(b.images, pixels * kImageChannels, b.masks, pixels);
    return {up.images, up.masks};
  }
#endif
  return {b.images, b.masks};
}

Trainer::Trainer(TrainOptions options, Comm& comm, Logger log)
    : opt_(std::move(options)),
      comm_(comm),
      log_(log),
      progress_(
          comm_.rank() == 0,
          use_progress_bar(opt_.progress, isatty(STDOUT_FILENO) != 0, isatty(STDERR_FILENO) != 0),
          opt_.log_every) {
  if (comm_.rank() == 0) {  // Once: every effective option (also stored in every checkpoint;
                            // the same on every rank, so not repeated by --log-all-ranks).
    std::string block;
    std::istringstream lines(opt_.describe());
    for (std::string line; std::getline(lines, line);) block += "\n  " + line;
    log_.info("configuration (", comm_.size(), " rank(s)):", block);
  }
  {  // Where this rank runs (every rank's line with --log-all-ranks).
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    log_.info("rank ", comm_.rank(), " of ", comm_.size(), " on node ", host, ", node-local rank ",
              comm_.local_rank(), " of ", comm_.local_size());
  }
  // --device auto: the GPU where this dptrain has the CUDA backend and one is visible.
  bool use_gpu = opt_.device == "cuda";
#ifdef DP_WITH_CUDA
  if (opt_.device == "auto") {
    use_gpu = comm_.all_true(cuda::visible_device_count() > 0);  // every rank decides the same
  }
  if (use_gpu) {
    // GPU = node-local rank modulo the visible GPUs (CUDA_VISIBLE_DEVICES respected); more ranks
    // per node than GPUs only with --allow-gpu-sharing.
    collectively(comm_, [&] {
      const int visible = cuda::visible_device_count();
      if (visible > 0)  // else select_device says why none is visible
        gpu_for_rank(comm_.local_rank(), comm_.local_size(), visible, opt_.allow_gpu_sharing);
      cuda::DeviceInfo d;
      try {
        d = cuda::select_device(comm_.local_rank(), comm_.local_size(), opt_.allow_gpu_sharing);
      } catch (const Error& e) {
        throw UsageError(str_cat("--device cuda: ", e.what()));
      }
      log_.info("device: GPU ", d.ordinal, " of ", d.visible_count, " (", d.name, ", ",
                d.pci_bus_id, d.shared ? ", shared with other ranks" : "", ")");
      if (d.shared && comm_.size() > 1)  // NCCL refuses two ranks of a communicator on a GPU
        throw UsageError(str_cat("--device cuda: ", comm_.local_size(),
                                 " ranks on this node share ", d.visible_count,
                                 " GPU(s), but the NCCL reducer needs one GPU per rank; start "
                                 "one rank per GPU (or a single rank)"));
    });
  }
#else
  if (use_gpu)
    throw UsageError(
        "--device cuda: this dptrain was built without CUDA (configure with "
        "-DDP_WITH_CUDA=ON); use --device cpu");
#endif
  if (opt_.threads > 0) omp_set_num_threads(opt_.threads);
  // Every reduction order is fixed by the world size and the thread count (static OpenMP
  // schedules, oneDNN's fixed blocking, a fixed all-reduce ring); --deterministic also forbids
  // OpenMP from changing the thread count between parallel regions.
  if (opt_.deterministic) omp_set_dynamic(0);
  if (use_gpu) {
    log_.info("dptrain: ", comm_.size(), " rank(s), device cuda (one GPU per rank), ",
              opt_.precision == "bf16" ? "bf16 activations and convolutions"
              : opt_.tf32              ? "fp32 (TF32) convolutions"
                                       : "fp32 convolutions");
  } else {
    // What runs, not what was asked: a choice this CPU cannot make is refused by make_backend().
    const bool bf16 = opt_.precision == "bf16";
    std::string convs = bf16 ? "bf16 activations and convolutions" : "fp32 convolutions";
    const std::string kernels =
        cpu_conv_kernels(opt_.deterministic ? CpuConvAlgo::kDirect : parse_cpu_conv(opt_.cpu_conv));
    if (!bf16 && !kernels.empty()) convs += " (" + kernels + ")";
    log_.info("dptrain: ", comm_.size(), " rank(s), device cpu (oneDNN, ", cpu_isa_name(), "), ",
              omp_get_max_threads(), " thread(s) per rank, ", convs);
  }
  on_root(comm_, "--model-dir", [&] {
    ensure_writable_dir(opt_.model_dir);
    model_dir_lock_ = std::make_unique<ModelDirLock>(opt_.model_dir, log_);
  });
  collectively(comm_, [&] { parse_fail_at(fail_rank_, fail_step_); });
  collectively(comm_, [&] { parse_fail_at(preempt_rank_, preempt_step_, kPreemptAtVariable); });
  collectively(comm_,
               [&] { parse_fail_at(nonfinite_rank_, nonfinite_step_, kNonFiniteAtVariable); });
  prepare_data();

  collectively(comm_, [&] {
    backend_ = make_backend(use_gpu);
    data::LoaderOptions lo;
    lo.batch_size = opt_.batch_size;
    lo.prefetch = opt_.prefetch;
    lo.seed = opt_.seed;
    lo.workers = opt_.workers;
    lo.augment = *data::augment_from_name(opt_.augment);
    lo.normalize = *data::normalize_from_name(opt_.normalize);
    lo.cache = opt_.cache;
    data::parse_crop(opt_.random_crop, opt_.scale_jitter, lo);  // data path: crops
    train_loader_ = std::make_unique<data::Loader>(data_path_, "train", lo);
    check_train_size();
    lo = data::validation_options(lo);  // data path: no augmentation, centred crop
    if (data::Dataset::has_split(data_path_, "val"))
      val_loader_ = std::make_unique<data::Loader>(data_path_, "val", lo);
    if (!val_loader_ && opt_.best_metric == "ods") {  // ODS is measured on validation only
      log_.info("--best-metric ods: dataset '", data_path_,
                "' has no validation split; the training loss chooses the best epoch");
      opt_.best_metric = "valid_loss";
    }
    height_ = train_loader_->height();
    width_ = train_loader_->width();
    if (val_loader_ && (val_loader_->height() != height_ || val_loader_->width() != width_))
      throw UsageError(str_cat("dataset '", data_path_, "': validation images are ",
                               val_loader_->height(), "x", val_loader_->width(),
                               " but training images are ", height_, "x", width_, " (HxW)"));
    pos_weight_ = Loss::crack_weight(opt_.pos_weight, train_loader_->pos_weight());
    loss_ = std::make_unique<Loss>(opt_, pos_weight_);
    log_.info("loss: ", Loss::describe(opt_),
              opt_.pos_weight == "none" || !loss_->has_bce()
                  ? std::string()
                  : str_cat("; crack pixels weigh ", pos_weight_, " in BCE (--pos-weight ",
                            opt_.pos_weight, "; the training split has ",
                            train_loader_->pos_weight(), " background pixels per crack pixel)"));

    ModelConfig mc;
    mc.name = opt_.model;
    mc.width_divisor = opt_.effective_width_divisor();
    mc.deconv = opt_.deconv;
    mc.dropout = float(opt_.dropout);
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
      average_ = std::make_unique<WeightAverage>(*model_, *backend_, float(opt_.ema));
    diff_logits_ = Buffer(static_cast<size_t>(opt_.batch_size) * height_ * width_ * sizeof(float),
                          backend_->device_memory());
    dropout_seeds_.resize(size_t(opt_.batch_size));
    setup_device();
  });
  const ParamStore& ps = model_->params();
  log_.info("data: ", data_path_, ": ", train_loader_->dataset_size(), " train, ",
            val_loader_ ? val_loader_->dataset_size() : 0, " val images of ", height_, "x", width_,
            "; batch ", opt_.batch_size, " per rank, global ", opt_.batch_size * comm_.size());
  log_.info("loader: ", opt_.workers, " worker(s), prefetch ", opt_.prefetch, ", augment ",
            opt_.augment, ", normalize ", opt_.normalize,
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
  // After every rank has agreed that set-up succeeded: the reducer duplicates the communicator.
  mpi::ReducerOptions ro;
  ro.bucket_mib = opt_.bucket_mb;
  ro.overlap = opt_.overlap;
  ro.progress_us = opt_.progress_us;
  reducer_ = make_reducer(ro);
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
  if (opt_.stall_timeout > 0)
    if (auto* mpi_comm = dynamic_cast<mpi::MpiComm*>(&comm_)) {
      std::function<void()> before_abort;
#ifdef DP_WITH_CUDA
      if (device_->nccl) before_abort = [nccl = device_->nccl.get()] { nccl->abort_for_exit(); };
#endif
      watchdog_ = std::make_unique<mpi::StallWatchdog>(mpi_comm->native(), opt_.stall_timeout,
                                                       "dptrain", kExitStalled, before_abort);
    }
  if ((opt_.report || opt_.tensorboard) && val_loader_)
    on_root(comm_, "validation samples", [&] {
      samples_ = std::make_shared<ValidationSamples>(
          data_path_, Normalization{train_loader_->mean(), train_loader_->std()}, opt_.threshold,
          height_, width_);
    });
  if (opt_.report)
    on_root(comm_, "--report",
            [&] { report_ = std::make_unique<TrainingReport>(opt_, data_path_, samples_); });
  if (opt_.tensorboard)
    on_root(comm_, "--tensorboard", [&] {
      // After the checkpoint is chosen: events of later steps are dropped (a resumed run
      // writes them again).
      tensorboard_ =
          std::make_unique<TensorBoardLog>(opt_.model_dir, state_.step, opt_.log_every, log_);
      tensorboard_->config(state_.step,
                           str_cat("dptrain on ", comm_.size(), " rank(s)\n", opt_.describe()));
      log_.info("tensorboard: events in ", tensorboard_->path(),
                " (watch with: tensorboard "
                "--logdir ",
                opt_.model_dir, ")");
    });
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
  const int world = comm_.size();
  const int64_t dataset = train_loader_->dataset_size();
  const auto t0 = Clock::now();
  // A mid-epoch checkpoint continues its epoch after `start_step` steps, at `position` of the
  // epoch's global order, with the epoch's partial sums (rank 0 carries them).
  const bool resuming = epoch == state_.epoch && state_.epoch_step > 0;
  const int64_t start_step = resuming ? state_.epoch_step : 0;
  const int64_t position = resuming ? state_.epoch_position : 0;
  std::vector<double> carried = resuming ? state_.epoch_partial : std::vector<double>{};
  carried.resize(kPartialSums, 0.0);
  // Padding keeps ranks in lock-step; --drop-last cuts every rank to whole batches instead.
  std::vector<int64_t> indices = epoch_indices(opt_, dataset, comm_.rank(), world, epoch, position);
  const int accumulation = opt_.accumulation_steps;
  const int64_t per_step = int64_t(opt_.batch_size) * accumulation;
  if (opt_.max_steps > 0) {
    const int64_t limit = std::max<int64_t>(opt_.max_steps - start_step, 1) * per_step;
    if (int64_t(indices.size()) > limit) indices.resize(size_t(limit));
  }
  const EpochPlan plan{dataset - position, world, int64_t(indices.size()), opt_.batch_size,
                       accumulation};
  const int64_t steps = start_step + plan.steps();
  progress_.start_epoch(epoch + 1, opt_.epochs, start_step, steps);
  if (tensorboard_) tensorboard_->start_window();
  const float lr = float(epoch_lr(opt_, epoch, comm_.size()));
  const float logit_threshold = float(std::log(opt_.threshold / (1.0 - opt_.threshold)));
  const int64_t image_pixels = int64_t(height_) * width_;
  float* diff = diff_logits_.f32();

  // sums[0] loss, [1] pixels; counts TP, FP, FN, samples; reduced once at the end of the epoch.
  double sums[2] = {0, 0};
  int64_t counts[4] = {0, 0, 0, 0};
  if (comm_.rank() == 0) {  // the sums of the steps before a mid-epoch checkpoint
    sums[0] = carried[0], sums[1] = carried[1];
    for (int i = 0; i < 4; ++i) counts[i] = int64_t(carried[size_t(2 + i)]);
  }
  if (!indices.empty()) train_loader_->start(std::move(indices), epoch);
  double step_sums[2] = {0, 0};
  int64_t step_counts[4] = {0, 0, 0, 0};
  int64_t micro = 0, step = start_step;
  auto step_end = Clock::now();  // --bench-step-times: wall time from one step's end to the next
  double reduce_wait = 0;  // seconds in GradReducer::wait (the all-reduce not hidden by backward)
  while (const data::Batch* b = plan.micro_steps() > 0 ? train_loader_->next() : nullptr) {
    DP_CHECK(b->n == plan.batch_size(micro), "training batch ", micro, " has ", b->n,
             " samples, expected ", plan.batch_size(micro));
    const int64_t group = micro / accumulation;
    const bool first_micro = micro % accumulation == 0;
    if (first_micro) {  // a step skipped as non-finite leaves the sums as they were before it
      std::copy(sums, sums + 2, step_sums);
      std::copy(counts, counts + 4, step_counts);
    }
    const bool boundary =
        micro % accumulation == accumulation - 1 || micro + 1 == plan.micro_steps();
    // Each rank's loss gradient is that of the mean over the real images of this optimiser step
    // (all micro-batches, all ranks), so the sum of the gradients over micro-batches and ranks is
    // the gradient of the mean over the global batch, uneven last batch included.
    const int real = plan.real_in_batch(comm_.rank(), micro);
    const int64_t real_pixels = int64_t(real) * image_pixels;
    // Dropout masks: a function of (seed, epoch, sample index), like the augmentation.
    for (int i = 0; i < b->n; ++i)
      dropout_seeds_[size_t(i)] = key(opt_.seed, uint64_t(epoch), uint64_t(b->indices[i]));
    model_->set_dropout_seeds(dropout_seeds_.data(), b->n);
    const BatchTensors in = to_backend(*b);
    const float* logits = model_->forward(in.images, b->n);
    sums[0] +=
        loss_->sum(*backend_, real, image_pixels, logits, in.masks, plan.step_samples(group), diff);
    if (real < b->n)  // padding: zero gradient, its loss is dropped
      loss_->sum(*backend_, b->n - real, image_pixels, logits + real_pixels, in.masks + real_pixels,
                 0, diff + real_pixels);
    sums[1] += double(real_pixels);
    backend_->confusion_counts(real_pixels, logits, in.masks, logit_threshold, counts);
    counts[3] += real;
    if (boundary && comm_.rank() == fail_rank_ && state_.step + 1 == fail_step_)
      fail(kFailAtVariable, "=", fail_rank_, ":", fail_step_, ": failing on purpose in step ",
           fail_step_);
    // Gradients accumulate locally over the micro-batches of a step; only the last one is
    // all-reduced, bucket by bucket while its backward runs.
    const bool reduce = boundary && !opt_.bench_skip_allreduce;
    if (reduce) reducer_->begin();
    model_->backward(diff, reduce ? reducer_.get() : nullptr,
                     first_micro ? GradMode::kOverwrite : GradMode::kAccumulate);
    ++micro;
    if (!boundary) continue;
    if (reduce) {
      const auto waited_from = Clock::now();
      const auto waiting = watch("gradient all-reduce");
      reducer_->wait();
      reduce_wait += seconds_since(waited_from);
    }
    if (comm_.rank() == nonfinite_rank_ && state_.step + 1 == nonfinite_step_)
      sums[0] = std::numeric_limits<double>::quiet_NaN();  // DP_TEST_NONFINITE_AT
    // The non-finite guard: this rank's loss so far in the epoch (finite before this step) and the
    // L2 norm of the averaged gradients (identical on every rank), agreed on before the update,
    // in the all-reduce that also carries the preemption flag.
    float* grads = model_->params().grads();
    const int64_t grad_count = model_->params().arena_size();
    const double grad_norm = std::sqrt(backend_->sum_squares(grad_count, grads));
    // Test hook: rank R raises SIGUSR1 in optimiser step S, before this step's agreement.
    if (comm_.rank() == preempt_rank_ && state_.step + 1 == preempt_step_) std::raise(SIGUSR1);
    const StepAgreement agreed =
        agree_step(state_.step + 1, std::isfinite(sums[0]), std::isfinite(grad_norm));
    if (agreed.nonfinite_loss.empty() && agreed.nonfinite_grad.empty()) {
      if (opt_.clip_grad_norm > 0)  // the reduced, averaged gradients: identical on every rank
        scale_to_max_norm(*backend_, grads, grad_count, grad_norm, opt_.clip_grad_norm);
      optim_->update(lr, state_.step + 1);
      if (average_) average_->update();
    } else {  // no update; the step's loss and counts are dropped
      on_nonfinite_step(agreed, epoch, step + 1, grad_norm);
      std::copy(step_sums, step_sums + 2, sums);
      std::copy(step_counts, step_counts + 4, counts);
    }
    ++step;
    ++state_.step;
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
    progress_.step(step, sums[0] / std::max(1.0, sums[1]), plan.step_samples(group));
    if (tensorboard_)  // this step's loss on rank 0 (none if it was skipped)
      tensorboard_->step(state_.step, sums[0] - step_sums[0], sums[1] - step_sums[1],
                         plan.step_samples(group), lr);
    // Preemption after this step, unless it is the epoch's last: the epoch ends and its
    // checkpoint serves.
    if (micro < plan.micro_steps() && agreed.preempt) {
      train_loader_->stop();
      {
        const auto waiting = watch("epoch metric reduction");
        comm_.allreduce_sum(sums, 2);
        comm_.allreduce_sum(counts, 4);
      }
      save_mid_epoch(step, position + micro * opt_.batch_size * world,
                     {sums[0], sums[1], double(counts[0]), double(counts[1]), double(counts[2]),
                      double(counts[3]), carried[6] + seconds_since(t0)},
                     lr);
      EpochMetrics m;
      m.preempted = true;
      return m;
    }
  }
  progress_.clear();
  if (world > 1 && step > start_step)
    log_.info("  gradient all-reduce: ", fixed(1e3 * reduce_wait / double(step - start_step), 1),
              " ms per step waited after backward (rank 0; includes waiting for slower ranks)");
  const auto waiting = watch("epoch metric reduction");
  comm_.allreduce_sum(sums, 2);
  comm_.allreduce_sum(counts, 4);
  EpochMetrics m = epoch_metrics(sums, counts);
  m.allreduce_wait_ms = step > start_step ? 1e3 * reduce_wait / double(step - start_step) : 0.0;
  return m;
}

void Trainer::check_sync() {
  model_->params().download();
  const std::vector<ParamView>& views = model_->params().views();
  std::vector<int64_t> mine(views.size()), root(views.size()), differ(views.size());
  for (size_t i = 0; i < views.size(); ++i)
    mine[i] = static_cast<int64_t>(hash_floats(views[i].host, views[i].numel));
  root = mine;
  {
    const auto waiting = watch("parameter sync check");
    comm_.broadcast(root.data(), root.size() * sizeof(int64_t), 0);
    for (size_t i = 0; i < views.size(); ++i) differ[i] = mine[i] != root[i] ? 1 : 0;
    comm_.allreduce_sum(differ.data(), differ.size());
  }
  const auto first = std::find_if(differ.begin(), differ.end(), [](int64_t d) { return d > 0; });
  if (first == differ.end()) return;
  const int64_t tensors =
      std::count_if(differ.begin(), differ.end(), [](int64_t d) { return d > 0; });
  const ParamView& v = views[size_t(first - differ.begin())];
  throw AgreedFailure(str_cat("parameters out of sync after step ", state_.step, ": '", v.name,
                              "' differs from rank 0's on ", *first, " of ", comm_.size(),
                              " rank(s) (", tensors, " tensor(s) differ)"),
                      1, comm_.rank() == 0);
}

EpochMetrics Trainer::validate() {
  if (!val_loader_) return {};
  data::DistributedSampler sampler(val_loader_->dataset_size(), comm_.rank(), comm_.size(),
                                   {.shuffle = false, .pad = false, .drop_last = false, .seed = 0});
  const float logit_threshold = float(std::log(opt_.threshold / (1.0 - opt_.threshold)));
  double sums[2] = {0, 0};
  int64_t counts[4] = {0, 0, 0, 0};
  ThresholdSweep sweep(opt_.tolerance);
  CenterlineDice centerline;
  std::vector<float> host_logits;  // a device backend's logits, for the sweep and clDice
  model_->set_training(false);     // running batch-norm statistics, no dropout
  val_loader_->start(sampler.indices(0), 0);
  while (const data::Batch* b = val_loader_->next()) {
    const int64_t pixels = int64_t(b->n) * height_ * width_;
    const BatchTensors in = to_backend(*b);
    const float* logits = model_->forward(in.images, b->n);
    const float* swept = logits;
    if (DeviceMemory* device = backend_->device_memory()) {
      host_logits.resize(size_t(pixels));
      device->download(host_logits.data(), logits, size_t(pixels) * sizeof(float));
      swept = host_logits.data();
    }
    const int64_t image = int64_t(height_) * width_;
    for (int i = 0; i < b->n; ++i) {
      sweep.add_image(swept + i * image, b->masks + i * image, height_, width_);
      centerline.add_image(swept + i * image, b->masks + i * image, height_, width_,
                           logit_threshold);
    }
    sums[0] += loss_->sum(*backend_, b->n, int64_t(height_) * width_, logits, in.masks, 0,
                          diff_logits_.f32());
    sums[1] += double(pixels);
    backend_->confusion_counts(pixels, logits, in.masks, logit_threshold, counts);
    counts[3] += b->n;
  }
  const auto waiting = watch("validation metric reduction");
  comm_.allreduce_sum(sums, 2);
  comm_.allreduce_sum(counts, 4);
  comm_.allreduce_sum(sweep.counts().data(), sweep.counts().size());
  comm_.allreduce_sum(sweep.sums().data(), sweep.sums().size());
  comm_.allreduce_sum(centerline.counts().data(), centerline.counts().size());
  EpochMetrics m = epoch_metrics(sums, counts);
  m.cldice = centerline.value();
  const SweepResult r = sweep.result();
  m.ods = r.ods, m.ods_threshold = r.ods_threshold, m.ois = r.ois, m.ap = r.ap;
  if (r.ods_threshold > 0) m.at_ods = MaskScores::of(sweep.confusion_at(r.ods_threshold));
  return m;
}

bool Trainer::save_epoch(const EpochMetrics& train, const EpochMetrics& valid, double seconds,
                         float lr) {
  state_.epoch += 1;
  state_.train_loss.push_back(train.loss);
  state_.valid_loss.push_back(valid.loss);
  state_.valid_iou.push_back(valid.iou);
  state_.valid_dice.push_back(valid.dice);
  state_.valid_precision.push_back(valid.precision);
  state_.valid_recall.push_back(valid.recall);
  state_.valid_ods_threshold.push_back(valid.ods_threshold);
  state_.valid_ods.push_back(valid.ods);
  state_.valid_iou_at_ods.push_back(valid.at_ods.iou);
  state_.valid_cldice.push_back(valid.cldice);
  state_.epoch_seconds.push_back(seconds);
  // The best epoch by --best-metric among validated ones (`valid` NaN: not validated); without a
  // validation split, by the same metric on the training split.
  // A non-finite score (a diverging validation) is never the best.
  const EpochMetrics& judged = val_loader_ ? valid : train;
  const double key = best_key(opt_.best_metric, judged.loss, judged.iou, judged.dice, judged.ods);
  const double best_so_far =
      higher_is_better(opt_.best_metric) ? -state_.best_score : state_.best_score;
  const bool best = std::isfinite(key) && (state_.best_epoch == 0 || key < best_so_far);
  if (best) {
    state_.best_valid_loss = judged.loss;
    state_.best_score = higher_is_better(opt_.best_metric) ? -key : key;
    state_.best_epoch = state_.epoch;
  }
  // Early stopping counts the judged epochs since the metric last improved by more than
  // --min-delta (kept in the checkpoint: a resumed job stops where an uninterrupted one would).
  if (std::isfinite(key)) {
    if (std::isnan(state_.early_stop_key) || key < state_.early_stop_key - opt_.min_delta) {
      state_.early_stop_key = key;
      state_.early_stop_wait = 0;
    } else {
      ++state_.early_stop_wait;
    }
  }
  state_.epoch_step = 0;  // an epoch boundary
  state_.epoch_position = 0;
  state_.epoch_partial.clear();
  stamp_state(lr);
  const bool due =
      epoch_checkpoint_due(state_.epoch, opt_.save_every, opt_.epochs) || stopping_early();
  if (due || best) {
    const auto waiting = watch("checkpoint agreement (rank 0 writes)");
    checkpoints_->write_epoch(state_, due, best);
  }
  return due;
}

void Trainer::log_epoch_events(const EpochMetrics& train, const EpochMetrics& valid, bool validated,
                               double seconds, double images_per_s, float lr) {
  const int64_t step = state_.step;
  tensorboard_->scalars(step, {{"epoch/train_loss", train.loss},
                               {"epoch/lr", lr},
                               {"epoch/seconds", seconds},
                               {"epoch/images_per_s", images_per_s},
                               {"epoch/allreduce_wait_ms", train.allreduce_wait_ms}});
  if (!validated) return;
  tensorboard_->scalars(step, {{"valid/loss", valid.loss},
                               {"valid/iou", valid.iou},
                               {"valid/dice", valid.dice},
                               {"valid/precision", valid.precision},
                               {"valid/recall", valid.recall},
                               {"valid/cldice", valid.cldice},
                               {"valid/ods", valid.ods},
                               {"valid/ods_threshold", valid.ods_threshold},
                               {"valid/ois", valid.ois},
                               {"valid/ap", valid.ap},
                               {"valid_at_ods/iou", valid.at_ods.iou},
                               {"valid_at_ods/dice", valid.at_ods.dice},
                               {"valid_at_ods/precision", valid.at_ods.precision},
                               {"valid_at_ods/recall", valid.at_ods.recall}});
  if (!samples_) return;
  const std::vector<ValidationSamples::Prediction> predictions = samples_->predict(*model_);
  for (size_t k = 0; k < predictions.size(); ++k) {
    const data::Image strip = sample_strip(samples_->samples()[k], predictions[k]);
    tensorboard_->image(step, str_cat("samples/", samples_->samples()[k].index),
                        strip.pixels.data(), strip.width, strip.height, strip.channels);
  }
}

void Trainer::stamp_state(float lr) {
  state_.best_metric = opt_.best_metric;
  state_.model = opt_.model;
  state_.width_divisor = opt_.effective_width_divisor();
  state_.deconv = opt_.deconv;
  state_.height = height_;
  state_.width = width_;
  state_.world_size = comm_.size();
  state_.global_batch = int64_t(opt_.batch_size) * comm_.size();
  state_.seed = int64_t(opt_.seed);
  state_.lr = lr;
  // With the input statistics, so that dppredict normalises exactly as training did.
  state_.options =
      opt_.describe() + describe_normalization({train_loader_->mean(), train_loader_->std()});
}

std::optional<mpi::StallWatchdog::Scope> Trainer::watch(const char* collective) {
  if (!watchdog_) return std::nullopt;
  return watchdog_->watch(collective, state_.step);
}

Trainer::StepAgreement Trainer::agree_step(int64_t run_step, bool loss_finite, bool grad_finite) {
  // [0]: ranks with a preemption signal; [1 + r]: rank r's non-finite flags (1 loss, 2 gradient).
  const size_t world = size_t(comm_.size());
  std::vector<int64_t> v(1 + world, 0);
  v[0] = preemption_signal() != 0 ? 1 : 0;
  v[1 + size_t(comm_.rank())] = (loss_finite ? 0 : 1) | (grad_finite ? 0 : 2);
  {
    const auto waiting = watch("step agreement");
    comm_.allreduce_sum(v.data(), v.size());
  }
  StepAgreement a;
  a.preempt = v[0] > 0;
  for (size_t r = 0; r < world; ++r) {
    if ((v[1 + r] & 1) != 0) a.nonfinite_loss.push_back(int(r));
    if ((v[1 + r] & 2) != 0) a.nonfinite_grad.push_back(int(r));
  }
  if (a.preempt) {
    progress_.clear();
    log_.info("preemption: SIGTERM/SIGUSR1 received by ", v[0], " of ", comm_.size(),
              " rank(s); stopping after step ", run_step);
  }
  return a;
}

void Trainer::on_nonfinite_step(const StepAgreement& agreed, int64_t epoch, int64_t step_in_epoch,
                                double grad_norm) {
  auto ranks = [](const std::vector<int>& list) {
    std::string s;
    for (int r : list) {
      if (!s.empty()) s += ',';
      s += std::to_string(r);
    }
    return s;
  };
  std::string what;
  if (!agreed.nonfinite_loss.empty())
    what = str_cat("non-finite loss on rank(s) ", ranks(agreed.nonfinite_loss));
  if (!agreed.nonfinite_grad.empty())
    what += str_cat(what.empty() ? "" : "; ", "non-finite gradient norm (",
                    std::isnan(grad_norm) ? "NaN" : "infinite", ") after the all-reduce");
  const std::string where = str_cat("epoch ", epoch + 1, ", step ", step_in_epoch,
                                    " (optimiser step ", state_.step + 1, " of the run)");
  if (skipped_steps_ < opt_.skip_nonfinite_steps) {
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
              newest, "); lower --lr, use --clip-grad-norm or --skip-nonfinite-steps"),
      kExitNonFinite, comm_.rank() == 0);
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

bool Trainer::stopping_early() const {
  return opt_.patience > 0 && state_.early_stop_wait >= opt_.patience;
}

std::string Trainer::best_epoch_summary() const {
  return str_cat(
      "best epoch ", state_.best_epoch, " (", opt_.best_metric, " ", fixed(state_.best_score, 4),
      opt_.best_metric == "valid_loss" ? "" : str_cat(", loss ", fixed(state_.best_valid_loss, 4)),
      ")");
}

int Trainer::run() {
  if (stopping_early() && state_.epoch < opt_.epochs) {
    log_.info("run already stopped early at epoch ", state_.epoch, ": ", best_epoch_summary(), ", ",
              opt_.model_dir, "/", kBestCheckpointName, "; ", state_.early_stop_wait,
              " validation(s) without a better ", opt_.best_metric, " (--patience ", opt_.patience,
              ")");
    return 0;
  }
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
    // Seconds spent in this epoch before a mid-epoch checkpoint it resumes from.
    const double carried = epoch == state_.epoch && state_.epoch_partial.size() == kPartialSums
                               ? state_.epoch_partial.back()
                               : 0.0;
    const float lr = float(epoch_lr(opt_, epoch, comm_.size()));
    const EpochMetrics train = train_epoch(epoch);
    if (train.preempted) return kExitPreempted;
    const double train_seconds = seconds_since(t0) + carried;
    // --val-every: validate every N epochs and after the last; NaN metrics otherwise.
    const bool validating = (epoch + 1) % opt_.val_every == 0 || epoch + 1 == opt_.epochs;
    EpochMetrics valid;
    valid.loss = valid.iou = valid.dice = valid.precision = valid.recall =
        std::numeric_limits<double>::quiet_NaN();
    const double images_per_s = double(train.samples) / train_seconds;
    double seconds = 0;
    {  // --ema: the averaged weights are validated and shown
      const AveragedWeightsScope averaged(average_.get());
      if (validating) valid = validate();
      seconds = seconds_since(t0) + carried;
      if (tensorboard_) log_epoch_events(train, valid, validating, seconds, images_per_s, lr);
    }
    const bool saved = save_epoch(train, valid, seconds, lr);
    if (report_) {  // rank 0; a report that cannot be written is a warning
      const AveragedWeightsScope averaged(average_.get());
      report_->update(*model_, state_, lr, images_per_s, log_);
    }
    if (comm_.rank() == 0) {  // a row that cannot be written is a warning
      try {
        // Opened at the first finished epoch (a failed start leaves no file); it keeps the rows
        // of the epochs done before this one, so a resumed run continues it.
        if (!metrics_csv_) metrics_csv_ = std::make_unique<MetricsCsv>(opt_.model_dir, epoch);
        metrics_csv_->append({epoch + 1, lr, train.loss, valid.loss, valid.iou, valid.dice,
                              valid.precision, valid.recall, images_per_s, seconds, valid.ods,
                              valid.ods_threshold, valid.ois, valid.ap, valid.at_ods,
                              valid.cldice});
      } catch (const std::exception& e) {
        log_.warn(e.what());
      }
    }
    log_.info(
        "epoch ", epoch + 1, "/", opt_.epochs, "  lr ", lr, "  train_loss ", fixed(train.loss, 4),
        validating
            ? str_cat("  valid_loss ", fixed(valid.loss, 4), "  valid_iou ", fixed(valid.iou, 4),
                      "  dice ", fixed(valid.dice, 4), "  precision ", fixed(valid.precision, 4),
                      "  recall ", fixed(valid.recall, 4), "  cldice ", fixed(valid.cldice, 4),
                      "  ods ", fixed(valid.ods, 4), " (t ", fixed(valid.ods_threshold, 2),
                      ")  ois ", fixed(valid.ois, 4), "  ap ", fixed(valid.ap, 4), "  at t ",
                      fixed(valid.ods_threshold, 2), ": iou ", fixed(valid.at_ods.iou, 4),
                      "  dice ", fixed(valid.at_ods.dice, 4), "  precision ",
                      fixed(valid.at_ods.precision, 4), "  recall ", fixed(valid.at_ods.recall, 4))
            : std::string("  (not validated)"),
        "  ", fixed(seconds, 1), " s  ", fixed(images_per_s, 1), " img/s",
        state_.best_epoch == state_.epoch ? "  *best" : "");
    if (stopping_early() && epoch + 1 < opt_.epochs) {
      log_.info("stopped early at epoch ", epoch + 1, ": ", best_epoch_summary(), ", ",
                opt_.model_dir, "/", kBestCheckpointName, " (", state_.early_stop_wait,
                " validation(s) without a better ", opt_.best_metric, "; --patience ",
                opt_.patience, ")");
      return 0;
    }
    // A signal during validation or the checkpoint: the epoch checkpoint is the resume point.
    if (epoch + 1 < opt_.epochs && agree_step(state_.step, true, true).preempt) {
      if (!saved) {  // --save-every skipped it: the resume point
        const auto waiting = watch("checkpoint agreement (rank 0 writes)");
        checkpoints_->write_epoch(state_, true, false);
      }
      log_.info("preempted after epoch ", epoch + 1, ": resumable from ", opt_.model_dir, "/",
                epoch_checkpoint_name(state_.epoch), "; exiting with ", kExitPreempted);
      return kExitPreempted;
    }
  }
  log_.info("done: ", best_epoch_summary(), ", ", opt_.model_dir, "/", kBestCheckpointName);
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
