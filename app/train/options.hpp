// dptrain's options: the TrainOptions record and its parser (one table of options, options.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device.hpp"    // DeviceChoice
#include "dp/adamw.hpp"  // LrScheduleKind, LrScaling
#include "dp/backend.hpp"
#include "dp/checkpoint.hpp"  // OptionValue
#include "dp/error.hpp"
#include "dp/loader.hpp"
#include "dp/model.hpp"
#include "exit_codes.hpp"  // UsageError
#include "progress.hpp"    // ProgressStyle
#include "train/fault_injection.hpp"
#include "train/metrics.hpp"  // BestMetric
#include "words.hpp"

namespace dp::app {

enum class OptimizerKind { kAdamW, kSgd };

struct TrainOptions {
  // data
  std::string data;         // dataset v1 file; empty = the synthetic demo dataset
  std::string synth_cache;  // where the synthetic dataset is cached (empty = default path)
  int batch_size = 4;       // per rank
  int prefetch = 2;
  int workers = 1;                                         // loader threads per rank
  data::Augment augment = data::Augment::kFull;            // training split only
  data::Normalize normalize = data::Normalize::kImagenet;  // or the file's mean/std attributes
  std::string random_crop;   // HxW training crops ("": none; validation: centred)
  std::string scale_jitter;  // LO-HI scale factors of the crops ("": none)
  bool cache = false;        // keep the rank's (fixed) shard in memory after the first epoch
  bool drop_last = false;    // no padding; the last partial batch of each rank is skipped
  // model
  std::string model = "unet16";
  int width_divisor = 0;  // 0 = default: 8 for the synthetic demo, 1 with --data
  bool deconv = false;    // transposed-convolution decoder
  bool sync_bn = false;   // batch-norm statistics over all ranks
  double dropout = 0.2;   // dropout2d before the final layer (ResNet UNets)
  // How a fresh run initialises the convolutions followed by a ReLU.
  ModelConfig::ReluInit weight_init = ModelConfig::ReluInit::kHe;
  std::string encoder_weights;  // pretrained encoder (fresh runs only)
  std::string init_weights;     // whole-model weights (fresh runs only)
  // optimisation
  int epochs = 10;
  // --lr's default per optimiser (AdamW: per --weight-init, whose weights differ in scale)
  static constexpr double kSgdLr = 0.05, kAdamWLr = 3e-3, kAdamWPytorchInitLr = 1e-3;
  double lr = kAdamWLr;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double momentum = 0.9;       // SGD
  bool nesterov = false;       // SGD
  double weight_decay = 1e-4;  // SGD: L2 added to the gradient; AdamW: decoupled
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  // Per epoch; auto is resolved from the run's size before the configuration is printed.
  LrScheduleKind lr_schedule = LrScheduleKind::kAuto;
  int cooldown_epochs = 0;   // cooldown's linear decay (0: a fifth of --epochs)
  int warmup_epochs = 0;     // linear warm-up epochs
  int64_t warmup_steps = 0;  // linear warm-up per optimiser step, on top (default: parser)
  LrScaling lr_scaling = LrScaling::kNone;  // by world size x accumulation steps
  double clip_grad_norm = 0;                // max global L2 norm of the gradients (0: no clipping)
  int skip_nonfinite_steps = 0;    // steps with a non-finite loss/gradient skipped before a stop
  double divergence_factor = 100;  // a step loss above this x the run's first one stops (0: off)
  int lr_step = 30;                // epochs between x lr_gamma
  double lr_gamma = 0.1;
  double threshold = 0.5;  // for IoU, Dice, precision, recall
  int tolerance = 0;  // pixels: ODS/OIS/AP count a crack pixel this close to a true one as right
  int val_every = 1;  // epochs between validations (and the last epoch)
  BestMetric best_metric = BestMetric::kOds;  // chooses model_best.h5 (DESIGN)
  int patience = 0;      // stop after this many validations without a better best_metric (0: off)
  double min_delta = 0;  // an improvement of best_metric must exceed this (early stopping)
  double ema = 0;        // decay of the weights' moving average (0: off)
  bool ema_warmup = false;          // the decay ramps up as (1 + step) / (10 + step)
  std::string pos_weight = "sqrt";  // sqrt | dataset | a number > 0 | none (BCE crack pixels)
  std::string loss = "bce+dice";    // bce, dice, cldice joined by '+', or focal (docs/real-data.md)
  double focal_alpha = 0.25;        // weight of crack pixels in the focal loss (< 0: none)
  double focal_gamma = 2.0;
  double cldice_weight = 0.3;      // the soft clDice term's weight (1 collapsed runs: real-data.md)
  int64_t cldice_iterations = 3;   // soft erosions of the soft skeleton (the published default)
  int64_t cldice_start_epoch = 1;  // the first (1-based) epoch whose loss has the clDice term
  uint64_t seed = 42;
  int64_t max_steps = -1;  // stop each epoch after this many steps (tests, smoke runs)
  // execution
  DeviceChoice device = DeviceChoice::kAuto;
  int threads = 0;             // CPU threads per rank; 0 = OpenMP's default
  bool deterministic = false;  // no OpenMP dynamic thread adjustment; deterministic cuDNN
  bool tf32 = true;            // GPU: TF32 tensor cores for fp32 convolutions
  Precision precision = Precision::kFloat32;  // of the activations and convolutions
  CpuConvAlgo cpu_conv = CpuConvAlgo::kAuto;  // CPU fp32 3x3 convolutions
  // distribution
  double bucket_mb = 25.0;         // gradient all-reduce bucket size, MiB (first bucket: 1 MiB)
  bool overlap = true;             // all-reduce buckets during backward (--no-overlap: after it)
  int progress_us = 500;           // overlap: a thread advances the all-reduce every N us (0: off)
  int accumulation_steps = 1;      // micro-batches per optimiser step
  bool allow_gpu_sharing = false;  // allow more ranks on a node than visible GPUs
  int64_t check_sync_every = 0;    // steps between parameter-hash comparisons (0: never)
  double stall_timeout = 600;      // seconds a collective may wait before the job ends (0: off)
  // Signals that checkpoint and exit 75 (train/signals.hpp); empty on the command line: TERM USR1.
  std::vector<std::string> preempt_signals = {"TERM", "USR1"};
  bool bench_skip_allreduce = false;      // hidden, benchmarks only: no gradient communication
  bool bench_step_times = false;          // hidden, benchmarks only: per-step times, peak memory
  std::vector<PlantedFault> test_faults;  // hidden --test-fault, tests only
  // checkpointing and output
  std::string model_dir = "runs/dptrain";
  std::string resume = "auto";  // auto | never (alias none) | PATH
  std::string config;           // --config FILE (INI) the options came from, besides argv
  int save_every = 1;  // epochs between model_epoch_<N>.h5 (the last epoch is always saved)
  int keep_last = 0;   // epoch checkpoints kept, newest first (0: all); model_best.h5 always
  bool log_all_ranks = false;
  int log_every = 0;  // steps between progress lines (0 = once per epoch)
  ProgressStyle progress = ProgressStyle::kAuto;
  // --report: write report.html in model_dir after every epoch (rank 0)
  bool report = false;
  // --tensorboard: write TensorBoard events in model_dir/tb (rank 0)
  bool tensorboard = false;

  bool synthetic() const { return data.empty(); }
  int effective_width_divisor() const {
    return width_divisor > 0 ? width_divisor : (synthetic() ? 8 : 1);
  }
  // "key = value" lines of every effective option (printed at start, stored in checkpoints), in
  // the option table's order (options.cpp: each option declared once).
  std::string describe() const;
  // The same options typed, as checkpoints record them.
  std::map<std::string, OptionValue> values() const;
};

// The words of --weight-init (he, pytorch), --optimizer (adamw, sgd), --lr-schedule (auto,
// constant, step, cosine, cooldown), --lr-scaling (none, linear, sqrt) and --progress (auto, bar,
// lines).
const Words<ModelConfig::ReluInit>& weight_init_words();
const Words<OptimizerKind>& optimizer_words();
const Words<LrScheduleKind>& lr_schedule_words();
const Words<LrScaling>& lr_scaling_words();
const Words<ProgressStyle>& progress_words();

// Parses argv. Returns nullopt after printing --help. Throws UsageError on any bad value.
std::optional<TrainOptions> parse_train_options(int argc, const char* const* argv, bool print_help);

// The width divisor the default recipe (AdamW, He initialisation) was tuned at (docs/real-data.md).
inline constexpr int kTunedWidthDivisor = 8;
// Its --warmup-steps below that divisor.
inline constexpr int64_t kWideWarmupSteps = 20;
// Its --lr at width divisor `divisor`: kAdamWLr at kTunedWidthDivisor and above, proportional to
// the divisor below (3.75e-4 at full width).
double default_adamw_lr(int divisor);

}  // namespace dp::app
