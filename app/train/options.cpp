// dptrain's options declared once (the option table), the parser and the recipe's computed
// defaults.
#include "train/options.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "device.hpp"
#include "dp/loader.hpp"
#include "dp/model.hpp"
#include "option_table.hpp"
#include "placeholders.hpp"
#include "train/loss.hpp"
#include "train/metrics.hpp"
#include "train/signals.hpp"

namespace dp::app {
namespace po = boost::program_options;

namespace {

// Every option of dptrain, by topic as --help shows them; the printed configuration (and what
// checkpoints store) follows the same order.
OptionTable<TrainOptions> make_train_option_table() {
  using O = TrainOptions;
  OptionTable<O> t;
  t.value("General", "config", &O::config,
          "INI file of options: 'name = value' lines, names as on the command line without '--' "
          "(switches: name = true); the command line overrides it")
      .no_default();
  t.command_line("General", "help,h", "show this help");

  const std::string data = "Data";
  t.value(data, "data", &O::data, "dataset v1 HDF5 file (default: a synthetic crack dataset)")
      .no_default()
      .printed("data", [](const O& o) { return o.synthetic() ? "(synthetic demo)" : o.data; });
  t.value(data, "synth-cache", &O::synth_cache, "path of the cached synthetic dataset")
      .no_default()
      .printed("");
  t.value(data, "batch-size,b", &O::batch_size, "images per rank per step", {at_least(1)});
  t.value(data, "prefetch", &O::prefetch, "batches prepared ahead", {at_least(1)});
  constexpr int kMaxWorkers = 64;
  t.value(data, "workers", &O::workers,
          "loader threads per rank (HDF5 reads are serialised; inflating --gzip rows and "
          "preparation run in parallel)",
          {in_range(1, kMaxWorkers)});
  using data::Augment, data::Normalize;
  t.choice(data, "augment", &O::augment,
           Words<Augment>{{data::augment_name(Augment::kNone), Augment::kNone},
                          {data::augment_name(Augment::kFlips), Augment::kFlips},
                          {data::augment_name(Augment::kFull), Augment::kFull}},
           "training augmentation: none, flips (h/v), or full (flips, 90-degree rotations of "
           "square images, brightness/contrast jitter)");
  t.choice(data, "normalize", &O::normalize,
           Words<Normalize>{{data::normalize_name(Normalize::kImagenet), Normalize::kImagenet},
                            {data::normalize_name(Normalize::kDataset), Normalize::kDataset}},
           "input normalisation: imagenet (mean/std) or dataset (the file's own mean/std)");
  t.value(data, "random-crop", &O::random_crop,
          "train on HxW crops at positions drawn from (seed, epoch, sample); validation on the "
          "centred HxW crop")
      .no_default();
  t.value(data, "scale-jitter", &O::scale_jitter,
          "scale the training crops by a factor uniform in LO-HI (e.g. 0.8-1.2)")
      .no_default();
  t.flag(data, "cache", &O::cache,
         "keep each rank's shard in memory after the first epoch (shards are then fixed; the "
         "order within a shard is reshuffled every epoch)");
  t.flag(data, "drop-last", &O::drop_last,
         "no padding of the last global batch: every step has the full batch");

  const std::string model = "Model";
  t.value(model, "model", &O::model, "network: unet16, unet_resnet34 or unet_resnet101");
  t.value(model, "width-divisor", &O::width_divisor,
          "divide every channel count by D (default 1; 8 for the synthetic demo)")
      .no_default()
      .printed("width_divisor",
               [](const O& o) { return option_text(o.effective_width_divisor()); });
  t.flag(model, "deconv", &O::deconv, "decoder upsamples by transposed convolutions");
  t.flag(model, "sync-bn", &O::sync_bn, "batch-norm statistics over all ranks");
  t.value(model, "dropout", &O::dropout,
          "dropout2d probability before the final layer of the ResNet UNets (training only)",
          {unit_interval()});
  t.choice(model, "weight-init", &O::weight_init, weight_init_words(),
           "how a fresh run starts the convolutions followed by a ReLU: he (He et al. 2015: "
           "N(0, 2/fan_out), zero bias, as torchvision trains VGG and ResNet from scratch; the "
           "default since docs/real-data.md's comparison on DeepCrack and CrackForest) or pytorch "
           "(the modules' defaults: U(+-1/sqrt(fan_in)), the default until 2026-12-05)");
  t.value(model, "encoder-weights", &O::encoder_weights,
          "pretrained encoder (tools/export_torchvision.py) for a fresh run")
      .no_default();
  t.value(model, "init-weights", &O::init_weights,
          "whole-model weights (tools/pt_to_h5.py, or a checkpoint) for a fresh run")
      .no_default();

  const std::string optim = "Optimisation";
  t.value(optim, "epochs", &O::epochs, "epochs to train in total", {at_least(1)});
  t.value(optim, "lr", &O::lr,
          "base learning rate (default: 0.05 with sgd; with adamw 0.003 x D/8 at --width-divisor "
          "D <= 8 (0.003 at /8, 0.000375 at /1), or 0.001 (PyTorch's AdamW default) with "
          "--weight-init pytorch)",
          {positive<double>()})
      .no_default();
  t.choice(optim, "optimizer", &O::optimizer, optimizer_words(),
           "adamw or sgd (PyTorch semantics; AdamW is the default since the recipe search on "
           "DeepCrack and CrackForest, docs/real-data.md)");
  t.value(optim, "momentum", &O::momentum, "SGD momentum", {unit_interval()});
  t.flag(optim, "nesterov", &O::nesterov, "SGD with Nesterov momentum");
  t.value(optim, "weight-decay", &O::weight_decay,
          "weight decay (SGD: L2 added to the gradient; AdamW: decoupled)",
          {non_negative<double>()});
  t.value(optim, "adam-beta1", &O::adam_beta1, "AdamW beta1", {unit_interval()});
  t.value(optim, "adam-beta2", &O::adam_beta2, "AdamW beta2", {unit_interval()});
  t.value(optim, "adam-eps", &O::adam_eps, "AdamW epsilon", {positive<double>()});
  t.choice(optim, "lr-schedule", &O::lr_schedule, lr_schedule_words(),
           "per epoch: constant, step (x --lr-gamma every --lr-step epochs), cosine (to 0 at "
           "--epochs), cooldown (constant, then linearly towards 0 over the last "
           "--cooldown-epochs), or auto: cosine where the run sees at least 2000 training images "
           "in all (images x --epochs), else constant (a short run needs its few steps at the full "
           "rate; docs/real-data.md)");
  t.value(optim, "cooldown-epochs", &O::cooldown_epochs,
          "epochs of the cooldown schedule's decay: the last N run at lr x N/(N+1), ..., 1/(N+1) "
          "(0: a fifth of --epochs, rounded up)",
          {non_negative<int>()});
  t.value(optim, "warmup-epochs", &O::warmup_epochs,
          "linear warm-up: epoch e < W runs at lr x (e+1)/(W+1)", {non_negative<int>()});
  t.value(optim, "warmup-steps", &O::warmup_steps,
          "linear warm-up per optimiser step on top of the schedule: step s <= N (1-based over "
          "the run) runs at its epoch's lr x s/N (default: 20 for the default recipe, adamw with "
          "he, below --width-divisor 8; else 0)",
          {non_negative<int64_t>()})
      .no_default();
  t.choice(optim, "lr-scaling", &O::lr_scaling, lr_scaling_words(),
           "scale --lr by world size x accumulation steps: none, linear or sqrt");
  t.value(optim, "clip-grad-norm", &O::clip_grad_norm,
          "clip the global L2 norm of the averaged gradients to this (0: off)",
          {non_negative<double>(" (0: off)")});
  t.value(optim, "skip-nonfinite-steps", &O::skip_nonfinite_steps,
          "skip up to K optimiser steps whose loss or gradient norm is not finite (no update), "
          "then stop (exit 3); 0: stop at the first",
          {non_negative<int>()});
  t.value(optim, "divergence-factor", &O::divergence_factor,
          "a finite loss that explodes is a divergence too: stop (exit 3, no checkpoint of it) at "
          "a step whose loss over all ranks exceeds this many times the run's first step's; 0: "
          "off",
          {{[](double f) { return f == 0 || f > 1; }, "must be 0 (off) or greater than 1"}});
  t.value(optim, "lr-step", &O::lr_step, "epochs between LR decays", {at_least(1)});
  t.value(optim, "lr-gamma", &O::lr_gamma, "LR decay factor",
          {{[](double g) { return g > 0 && g <= 1; }, "must be in (0, 1]"}});
  t.value(optim, "pos-weight", &O::pos_weight,
          "weight of crack pixels in BCE: sqrt (the default with bce and bce+dice: the square "
          "root of the file's pos_weight, background per crack pixel; docs/real-data.md), "
          "dataset (pos_weight itself, class-balanced: the default with --optimizer sgd or "
          "--weight-init pytorch, and what --pos-weight alone gives), a number, or none (1)")
      .no_default()
      .implicit_value("dataset");
  t.value(optim, "loss", &O::loss,
          "bce (per pixel), dice (soft Dice per image), bce+dice (their sum; the default since "
          "CrackForest, docs/real-data.md), focal (per pixel), or bce+cldice, dice+cldice, "
          "bce+dice+cldice (with soft clDice per image, Shit et al. 2021: Dice of the soft "
          "skeletons, for thin structures); each the mean over the global batch",
          {{Loss::valid,
            "must be bce, dice, bce+dice, focal, bce+cldice, dice+cldice or bce+dice+cldice"}});
  t.value(optim, "cldice-weight", &O::cldice_weight, "weight of the soft clDice term",
          {{[](double w) { return w > 0 && std::isfinite(w); }, "must be positive"}});
  t.value(optim, "cldice-iterations", &O::cldice_iterations,
          "soft erosions of the soft skeleton (it follows cracks up to about 2 x this + 1 px wide)",
          {in_range<int64_t>(1, 32)});
  t.value(optim, "cldice-start-epoch", &O::cldice_start_epoch,
          "the first epoch (1-based) whose loss has the clDice term: a prediction that is still "
          "uniform has no soft skeleton, so clDice alone would push it towards all-crack",
          {at_least(int64_t(1))});
  t.value(optim, "focal-alpha", &O::focal_alpha,
          "focal loss: weight of crack pixels, 1 - alpha of background (< 0: no weighting)",
          {{[](double a) { return a <= 1; }, "must be <= 1 (< 0: off)"}});
  t.value(optim, "focal-gamma", &O::focal_gamma,
          "focal loss: focusing exponent (0 with --focal-alpha -1: BCE)", {non_negative<double>()});
  t.value(optim, "threshold", &O::threshold, "probability threshold for IoU",
          {{[](double p) { return p > 0 && p < 1; }, "must be in (0, 1)"}});
  t.value(optim, "tolerance", &O::tolerance,
          "pixels: validation's ODS/OIS/AP (threshold sweep) count a predicted crack pixel within "
          "this distance of a true one as right, and a true one with a prediction this close as "
          "found",
          {in_range(0, 32, " pixels")});
  t.value(optim, "seed", &O::seed, "seed of init, shuffling and augmentation");
  t.value(optim, "max-steps", &O::max_steps, "stop each epoch after N steps (-1: all)",
          {{[](int64_t n) { return n == -1 || n >= 1; }, "must be -1 or positive"}});

  const std::string dist = "Distributed";
  t.value(dist, "bucket-mb", &O::bucket_mb,
          "gradient all-reduce bucket size in MiB (the first bucket is 1 MiB)",
          {positive<double>()});
  t.negated_flag(dist, "no-overlap", &O::overlap,
                 "all-reduce gradients after backward, not during it");
  t.value(dist, "progress-us", &O::progress_us,
          "MPI all-reduce during backward: a thread advances the transfers every N microseconds "
          "(0: only between layers; Open MPI moves TCP data only inside MPI calls)",
          {{[](int us) { return us >= 0 && us <= 1000000; }, "must be between 0 and 1000000"}});
  t.value(dist, "accumulation-steps", &O::accumulation_steps,
          "micro-batches of --batch-size per optimiser step (one all-reduce per step)",
          {at_least(1)});
  t.flag(dist, "allow-gpu-sharing", &O::allow_gpu_sharing,
         "allow more ranks per node than visible GPUs (GPU selection only: NCCL training still "
         "needs one GPU per rank)");
  t.value(dist, "check-sync-every", &O::check_sync_every,
          "compare a hash of the parameters over ranks every N steps (0: never)",
          {non_negative<int64_t>()});
  t.value(dist, "stall-timeout", &O::stall_timeout,
          "end the job (exit 4) when a collective waits longer than this many seconds, naming "
          "the ranks that have not arrived (0: off)",
          {non_negative<double>(" seconds (0: off)")});
  t.value(dist, "preempt-signal", &O::preempt_signals,
          "a signal that makes dptrain checkpoint at the next step and exit 75 (preempted, "
          "resumable): TERM, USR1, USR2, HUP, INT, QUIT, XCPU or ALRM; repeat for several "
          "(default: TERM and USR1; with NCCL 2.12, which takes SIGUSR1 itself, use USR2 and "
          "sbatch --signal=B:USR2@T)");

  const std::string devices = "Devices";
  t.choice(devices, "device", &O::device, device_words(), "auto, cpu or cuda");
  t.flag(devices, "deterministic", &O::deterministic,
         "bitwise reproducible CPU runs: fixed thread count (no OpenMP dynamic adjustment); runs "
         "with the same world size and threads then give identical weights, resumed or not; on "
         "the GPU: deterministic cuDNN algorithms only (the own reductions' atomics may still "
         "change the last bits)");
  t.choice(devices, "precision", &O::precision, precision_words(),
           "fp32, or bf16: activations and their gradients stored in bf16, convolutions on bf16 "
           "inputs and weights with fp32 accumulation; weights, optimiser state, batch-norm "
           "statistics, loss and reductions fp32 (as PyTorch autocast; CPUs with AVX512-BF16 or "
           "AMX, GPUs; on AMX with oneDNN 2.x the weight gradients run on AVX512-BF16 kernels, as "
           "oneDNN 2.x's AMX kernel for them writes outside its output: oneDNN 3.x keeps AMX, "
           "INSTALL.md)");
  t.choice(devices, "cpu-conv", &O::cpu_conv, cpu_conv_words(),
           "CPU 3x3 stride-1 convolutions: auto (per pass, whichever is faster when timed at "
           "first use: direct on NHWC, Winograd where oneDNN has it, else direct on oneDNN's "
           "blocked layout, or the backend's own GEMMs: nine shifted ones, or Winograd, F(4x4, "
           "3x3) on 36 where a batch has 64 of its tiles, else F(2x2, 3x3) on 16), direct, shape "
           "(no timing: Winograd for the forward passes whose channels "
           "pay for it, direct elsewhere; dppredict's default), winograd (oneDNN 2.x has it on "
           "AVX-512 only; elsewhere an error), blocked, gemm or gemm-winograd; --deterministic "
           "implies direct. bf16: auto times direct against Winograd F(2x2, 3x3) on bf16 GEMMs, "
           "gemm-winograd forces the latter, the others are direct");
  t.negated_flag(devices, "no-tf32", &O::tf32,
                 "GPU: fp32 convolutions without TF32 tensor cores (slower, closer to the CPU)");
  t.value(devices, "threads", &O::threads,
          "CPU threads per rank (0: SLURM_CPUS_PER_TASK, else OMP_NUM_THREADS, else the rank's "
          "core binding, at most the node's cores over its ranks)",
          {non_negative<int>()});

  const std::string out = "Checkpointing";
  t.value(out, "model-dir", &O::model_dir, "directory for checkpoints",
          {{[](const std::string& d) { return !d.empty(); }, "must not be empty"}});
  t.value(out, "resume", &O::resume,
          "auto (the newest checkpoint in --model-dir that verifies, mid-epoch ones included), "
          "never (alias: none), or a checkpoint path");
  t.value(out, "save-every", &O::save_every,
          "write model_epoch_<N>.h5 every E epochs (and after the last; model_best.h5 whenever "
          "an epoch is the best)",
          {at_least(1)});
  t.value(out, "keep-last", &O::keep_last,
          "keep only the newest K epoch checkpoints (0: all); model_best.h5 is never deleted",
          {non_negative<int>(" (0 keeps all)")});
  t.choice(out, "best-metric", &O::best_metric, best_metric_words(),
           "chooses model_best.h5: valid_loss (lowest), iou, dice or ods (highest)");
  t.value(out, "patience", &O::patience,
          "stop (exit 0) after N validations in a row without a better --best-metric (0: never)",
          {non_negative<int>(" validations (0: never stop early)")});
  t.value(out, "min-delta", &O::min_delta,
          "early stopping: a better --best-metric must improve on the best by more than this",
          {non_negative<double>()});
  t.value(out, "ema", &O::ema,
          "keep an exponential moving average of the weights and batch-norm buffers with this "
          "decay per optimiser step (e.g. 0.999; 0: off); it is validated, chooses model_best.h5 "
          "and is what dppredict uses",
          {{[](double d) { return d >= 0 && d < 1; }, "must be a decay in [0, 1) (0: off)"}});
  t.flag(out, "ema-warmup", &O::ema_warmup,
         "--ema's decay at optimiser step s is min(decay, (1 + s) / (10 + s)): the average "
         "follows the last ~s/9 steps early on (TensorFlow's num_updates), so it suits short "
         "runs");

  const std::string output = "Output";
  t.value(output, "val-every", &O::val_every, "validate every N epochs (and after the last)",
          {at_least(1)});
  t.value(output, "log-every", &O::log_every, "steps between progress lines (without the bar)",
          {non_negative<int>()});
  t.choice(output, "progress", &O::progress, progress_words(),
           "rank 0's progress: bar (redrawn in place), lines (every --log-every steps), or auto "
           "(bar when stdout and stderr are terminals; under mpirun that means lines)");
  t.flag(output, "log-all-ranks", &O::log_all_ranks, "log from every rank with a [rank r] prefix");
  t.flag(output, "report", &O::report,
         "write report.html in --model-dir after every epoch (curves, sample predictions)");
  t.flag(output, "tensorboard", &O::tensorboard,
         "write TensorBoard events in --model-dir/tb: loss, LR and img/s every --log-every steps "
         "(0: every step), validation metrics and sample predictions every epoch, the options");

  // Benchmark switches: parsed, not shown by --help nor printed.
  t.flag("", "bench-skip-allreduce", &O::bench_skip_allreduce,
         "benchmarks: skip the gradient all-reduce (ranks diverge)")
      .printed("");
  t.flag("", "bench-step-times", &O::bench_step_times,
         "benchmarks: rank 0 prints each step's wall time and, at the end, the peak memory")
      .printed("");
  return t;
}

const OptionTable<TrainOptions>& train_option_table() {
  static const OptionTable<TrainOptions> table = make_train_option_table();
  return table;
}

}  // namespace

std::string TrainOptions::describe() const {
  return train_option_table().describe(*this);
}

std::map<std::string, OptionValue> TrainOptions::values() const {
  return train_option_table().values(*this);
}

namespace {

// Reads an INI file of options into `vm` (values already there, from the command line, stay).
// An unknown key, a bad value or an unreadable file is a UsageError naming the file.
void store_config_file(const std::string& path, const po::options_description& options,
                       po::variables_map& vm) {
  std::ifstream file(path);
  if (!file) throw UsageError(str_cat("--config '", path, "': cannot read the file"));
  std::ostringstream text;
  text << file.rdbuf();
  refuse_placeholders(text.str(), str_cat("--config '", path, "'"));
  std::istringstream in(text.str());
  try {
    const po::parsed_options parsed = po::parse_config_file(in, options, false);
    for (const po::option& opt : parsed.options)
      if (opt.string_key == "config" || opt.string_key == "help")
        throw UsageError(str_cat("--config '", path, "': '", opt.string_key,
                                 "' is allowed on the command line only"));
    po::store(parsed, vm);
  } catch (const po::error& e) {
    throw UsageError(str_cat("--config '", path, "': ", e.what()));
  }
}

}  // namespace

std::optional<TrainOptions> parse_train_options(int argc, const char* const* argv,
                                                bool print_help) {
  TrainOptions o;
  auto bound = train_option_table().bind(o, "Usage: mpirun -np N dptrain [options]");
  std::vector<std::string> test_faults;  // --test-fault as given
  bound.all.add_options()(
      "test-fault", po::value(&test_faults)->composing(),
      "tests: plant a fault, KIND@RANK:STEP or preempt-at-start (train/fault_injection.hpp)");

  // --config: stored after the command line, whose values therefore win.
  const po::variables_map vm =
      read_command_line(argc, argv, bound.all, {}, [&bound](po::variables_map& given) {
        if (given.count("config"))
          store_config_file(given["config"].as<std::string>(), bound.all, given);
      });
  if (vm.count("help")) {
    if (print_help) std::cout << bound.visible << "\n";
    return std::nullopt;
  }
  // AdamW at SGD's rate diverges: without --lr, each optimiser gets its own default. AdamW's step
  // is absolute, and He-initialised weights are about 2.4x PyTorch's default in scale, so they
  // take a higher rate than PyTorch's AdamW default (docs/real-data.md). That rate was chosen at
  // width /8; AdamW moves every weight by about the rate, so a layer's output moves with its
  // fan-in, and the default recipe's rate follows the width: kAdamWLr x divisor / 8 (/1: 3.75e-4,
  // where /8's rate blows the loss up to 1e8 in two steps; DESIGN "The default recipe").
  const bool he_adamw =
      o.optimizer == OptimizerKind::kAdamW && o.weight_init == ModelConfig::ReluInit::kHe;
  if (vm.count("lr") == 0)
    o.lr = o.optimizer == OptimizerKind::kSgd ? TrainOptions::kSgdLr
           : he_adamw                         ? default_adamw_lr(o.effective_width_divisor())
                                              : TrainOptions::kAdamWPytorchInitLr;
  // Below /8 the default recipe's first steps spike the loss (AdamW's first steps move every
  // weight by about the rate whatever its gradient: 13x the first step's loss at /2), and 20
  // steps of linear warm-up take that away (1.2x; DESIGN "The default recipe"). /8, where the
  // recipe was tuned, never spiked and keeps none.
  if (vm.count("warmup-steps") == 0)
    o.warmup_steps =
        he_adamw && o.effective_width_divisor() < kTunedWidthDivisor ? kWideWarmupSteps : 0;
  // The crack pixels' weight in BCE: the square root of the class ratio for the default recipe
  // (He and AdamW), which calibrates better than full class balance there; class-balanced for the
  // earlier recipes (SGD, or PyTorch's initialisation), which stall without it on small sets
  // (docs/real-data.md). The other losses have no BCE term to weight.
  if (vm.count("pos-weight") == 0)
    o.pos_weight = !Loss::has_bce(o.loss) ? "none" : he_adamw ? "sqrt" : "dataset";
  if (o.resume == "none") o.resume = "never";  // the older spelling
  if (o.resume.empty()) throw UsageError("--resume must be auto, never or a checkpoint path");

  train_option_table().check(o);
  // What one option's rules cannot say: values parsed by the library that uses them, and
  // options that depend on each other.
  try {  // --random-crop and --scale-jitter (parsed by the data library)
    data::LoaderOptions crop;
    data::parse_crop(o.random_crop, o.scale_jitter, crop);
  } catch (const Error& e) {
    require(false, e.what());
  }
  require(!o.nesterov || (o.optimizer == OptimizerKind::kSgd && o.momentum > 0),
          "--nesterov needs --optimizer sgd with --momentum > 0");
  require(Loss::crack_weight(o.pos_weight, 1.0f) > 0,
          "--pos-weight must be none, dataset, sqrt or a positive number, got '", o.pos_weight,
          "'");
  // A weight of 1 is "none" (so the 0/1 that older checkpoints recorded stays unambiguous).
  if (Loss::crack_weight(o.pos_weight, 2.0f) == 1.0f) o.pos_weight = "none";
  require(o.pos_weight == "none" || Loss::has_bce(o.loss),
          "--pos-weight weights BCE: use it with a --loss that has bce (focal has --focal-alpha)");
  parse_preempt_signals(o.preempt_signals);  // a UsageError naming a bad one
  for (const std::string& f : test_faults) {
    if (f != kPreemptAtStart) o.test_faults.push_back(parse_planted_fault(f));
  }
  require(vm.count("width-divisor") == 0 || (o.width_divisor >= 1 && 32 % o.width_divisor == 0),
          "--width-divisor must be one of 1, 2, 4, 8, 16, 32, got ", o.width_divisor);
  bool known = false;
  std::string names;
  for (const auto& n : model_names()) {
    known = known || n == o.model;
    names += (names.empty() ? "" : ", ") + n;
  }
  require(known, "unknown --model '", o.model, "' (known: ", names, ")");
  return o;
}

const Words<ModelConfig::ReluInit>& weight_init_words() {
  static const Words<ModelConfig::ReluInit> words = {{"he", ModelConfig::ReluInit::kHe},
                                                     {"pytorch", ModelConfig::ReluInit::kPytorch}};
  return words;
}

const Words<OptimizerKind>& optimizer_words() {
  static const Words<OptimizerKind> words = {{"adamw", OptimizerKind::kAdamW},
                                             {"sgd", OptimizerKind::kSgd}};
  return words;
}

const Words<LrScheduleKind>& lr_schedule_words() {
  using K = LrScheduleKind;
  static const Words<K> words = {{"auto", K::kAuto},
                                 {"constant", K::kConstant},
                                 {"step", K::kStep},
                                 {"cosine", K::kCosine},
                                 {"cooldown", K::kCooldown}};
  return words;
}

const Words<LrScaling>& lr_scaling_words() {
  static const Words<LrScaling> words = {
      {"none", LrScaling::kNone}, {"linear", LrScaling::kLinear}, {"sqrt", LrScaling::kSqrt}};
  return words;
}

const Words<ProgressStyle>& progress_words() {
  static const Words<ProgressStyle> words = {{"auto", ProgressStyle::kAuto},
                                             {"bar", ProgressStyle::kBar},
                                             {"lines", ProgressStyle::kLines}};
  return words;
}

double default_adamw_lr(int divisor) {
  return TrainOptions::kAdamWLr * double(std::min(divisor, kTunedWidthDivisor)) /
         kTunedWidthDivisor;
}

}  // namespace dp::app
