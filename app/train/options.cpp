// Parsing and validation of dptrain's options (Boost.Program_options), grouped by topic.
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
#include "placeholders.hpp"
#include "train/loss.hpp"
#include "train/metrics.hpp"
#include "train/signals.hpp"

namespace dp::app {
namespace po = boost::program_options;

namespace {
std::string join_words(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}
}  // namespace

std::string TrainOptions::describe() const {
  std::ostringstream os;
  os << "data = " << (data.empty() ? "(synthetic demo)" : data) << "\n"
     << "batch_size = " << batch_size << "\n"
     << "prefetch = " << prefetch << "\n"
     << "workers = " << workers << "\n"
     << "augment = " << augment << "\n"
     << "normalize = " << normalize << "\n"
     << "random_crop = " << random_crop << "\n"
     << "scale_jitter = " << scale_jitter << "\n"
     << "cache = " << cache << "\n"
     << "drop_last = " << drop_last << "\n"
     << "model = " << model << "\n"
     << "width_divisor = " << effective_width_divisor() << "\n"
     << "deconv = " << deconv << "\n"
     << "sync_bn = " << sync_bn << "\n"
     << "dropout = " << dropout << "\n"
     << "weight_init = " << weight_init << "\n"
     << "encoder_weights = " << encoder_weights << "\n"
     << "init_weights = " << init_weights << "\n"
     << "epochs = " << epochs << "\n"
     << "lr = " << lr << "\n"
     << "optimizer = " << optimizer << "\n"
     << "momentum = " << momentum << "\n"
     << "nesterov = " << nesterov << "\n"
     << "weight_decay = " << weight_decay << "\n"
     << "adam_beta1 = " << adam_beta1 << "\n"
     << "adam_beta2 = " << adam_beta2 << "\n"
     << "adam_eps = " << adam_eps << "\n"
     << "lr_schedule = " << lr_schedule << "\n"
     << "cooldown_epochs = " << cooldown_epochs << "\n"
     << "warmup_epochs = " << warmup_epochs << "\n"
     << "warmup_steps = " << warmup_steps << "\n"
     << "lr_scaling = " << lr_scaling << "\n"
     << "clip_grad_norm = " << clip_grad_norm << "\n"
     << "skip_nonfinite_steps = " << skip_nonfinite_steps << "\n"
     << "divergence_factor = " << divergence_factor << "\n"
     << "lr_step = " << lr_step << "\n"
     << "lr_gamma = " << lr_gamma << "\n"
     << "threshold = " << threshold << "\n"
     << "tolerance = " << tolerance << "\n"
     << "val_every = " << val_every << "\n"
     << "best_metric = " << best_metric << "\n"
     << "patience = " << patience << "\n"
     << "min_delta = " << min_delta << "\n"
     << "ema = " << ema << "\n"
     << "ema_warmup = " << ema_warmup << "\n"
     << "pos_weight = " << pos_weight << "\n"
     << "loss = " << loss << "\n"
     << "focal_alpha = " << focal_alpha << "\n"
     << "focal_gamma = " << focal_gamma << "\n"
     << "cldice_weight = " << cldice_weight << "\n"
     << "cldice_iterations = " << cldice_iterations << "\n"
     << "cldice_start_epoch = " << cldice_start_epoch << "\n"
     << "seed = " << seed << "\n"
     << "device = " << device << "\n"
     << "threads = " << threads << "\n"
     << "deterministic = " << deterministic << "\n"
     << "tf32 = " << tf32 << "\n"
     << "precision = " << precision << "\n"
     << "cpu_conv = " << cpu_conv << "\n"
     << "bucket_mb = " << bucket_mb << "\n"
     << "overlap = " << overlap << "\n"
     << "progress_us = " << progress_us << "\n"
     << "accumulation_steps = " << accumulation_steps << "\n"
     << "allow_gpu_sharing = " << allow_gpu_sharing << "\n"
     << "check_sync_every = " << check_sync_every << "\n"
     << "stall_timeout = " << stall_timeout << "\n"
     << "preempt_signal = " << join_words(preempt_signals) << "\n"
     << "model_dir = " << model_dir << "\n"
     << "resume = " << resume << "\n"
     << "config = " << config << "\n"
     << "max_steps = " << max_steps << "\n"
     << "log_every = " << log_every << "\n"
     << "progress = " << progress << "\n"
     << "log_all_ranks = " << log_all_ranks << "\n"
     << "save_every = " << save_every << "\n"
     << "keep_last = " << keep_last << "\n"
     << "report = " << report << "\n"
     << "tensorboard = " << tensorboard << "\n";
  return os.str();
}

namespace {

// A "%word%" would hang Boost's error formatting (app/placeholders.hpp).
void refuse_placeholders(const std::string& text, const std::string& where) {
  if (const std::string word = boost_placeholder_in(text); !word.empty())
    throw UsageError(str_cat(where, ": '", word, "' is not allowed in options"));
}

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
  std::vector<std::string> preempt_signals;  // --preempt-signal as given (none: the default)
  std::vector<std::string> test_faults;      // --test-fault as given
  po::options_description data("Data");
  data.add_options()("data", po::value(&o.data),
                     "dataset v1 HDF5 file (default: a synthetic crack dataset)")(
      "synth-cache", po::value(&o.synth_cache), "path of the cached synthetic dataset")(
      "batch-size,b", po::value(&o.batch_size)->default_value(o.batch_size),
      "images per rank per step")("prefetch", po::value(&o.prefetch)->default_value(o.prefetch),
                                  "batches prepared ahead")(
      "workers", po::value(&o.workers)->default_value(o.workers),
      "loader threads per rank (HDF5 reads are serialised; inflating --gzip rows and "
      "preparation run in parallel)")(
      "augment", po::value(&o.augment)->default_value(o.augment),
      "training augmentation: none, flips (h/v), or full (flips, 90-degree rotations of square "
      "images, brightness/contrast jitter)")(
      "normalize", po::value(&o.normalize)->default_value(o.normalize),
      "input normalisation: imagenet (mean/std) or dataset (the file's own mean/std)")(
      "random-crop", po::value(&o.random_crop),
      "train on HxW crops at positions drawn from (seed, epoch, sample); validation on the "
      "centred HxW crop")("scale-jitter", po::value(&o.scale_jitter),
                          "scale the training crops by a factor uniform in LO-HI (e.g. 0.8-1.2)")(
      "cache", po::bool_switch(&o.cache),
      "keep each rank's shard in memory after the first epoch (shards are then fixed; the order "
      "within a shard is reshuffled every epoch)")(
      "drop-last", po::bool_switch(&o.drop_last),
      "no padding of the last global batch: every step has the full batch");
  po::options_description model("Model");
  model.add_options()("model", po::value(&o.model)->default_value(o.model),
                      "network: unet16, unet_resnet34 or unet_resnet101")(
      "width-divisor", po::value(&o.width_divisor),
      "divide every channel count by D (default 1; 8 for the synthetic demo)")(
      "deconv", po::bool_switch(&o.deconv), "decoder upsamples by transposed convolutions")(
      "sync-bn", po::bool_switch(&o.sync_bn), "batch-norm statistics over all ranks")(
      "dropout", po::value(&o.dropout)->default_value(o.dropout, "0.2"),
      "dropout2d probability before the final layer of the ResNet UNets (training only)")(
      "weight-init", po::value(&o.weight_init)->default_value(o.weight_init),
      "how a fresh run starts the convolutions followed by a ReLU: he (He et al. 2015: "
      "N(0, 2/fan_out), zero bias, as torchvision trains VGG and ResNet from scratch; the "
      "default since docs/real-data.md's comparison on DeepCrack and CrackForest) or pytorch "
      "(the modules' defaults: U(+-1/sqrt(fan_in)), the default until 2026-12-05)")(
      "encoder-weights", po::value(&o.encoder_weights),
      "pretrained encoder (tools/export_torchvision.py) for a fresh run")(
      "init-weights", po::value(&o.init_weights),
      "whole-model weights (tools/pt_to_h5.py, or a checkpoint) for a fresh run");
  po::options_description optim("Optimisation");
  optim.add_options()("epochs", po::value(&o.epochs)->default_value(o.epochs),
                      "epochs to train in total")("lr", po::value(&o.lr),
                                                  "base learning rate (default: 0.05 with sgd; "
                                                  "with adamw 0.003 x D/8 at --width-divisor D "
                                                  "<= 8 (0.003 at /8, 0.000375 at /1), or 0.001 "
                                                  "(PyTorch's AdamW default) with --weight-init "
                                                  "pytorch)")(
      "optimizer", po::value(&o.optimizer)->default_value(o.optimizer),
      "adamw or sgd (PyTorch semantics; AdamW is the default since the recipe search on "
      "DeepCrack and CrackForest, docs/real-data.md)")(
      "momentum", po::value(&o.momentum)->default_value(o.momentum, "0.9"), "SGD momentum")(
      "nesterov", po::bool_switch(&o.nesterov), "SGD with Nesterov momentum")(
      "weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay),
      "weight decay (SGD: L2 added to the gradient; AdamW: decoupled)")(
      "adam-beta1", po::value(&o.adam_beta1)->default_value(o.adam_beta1, "0.9"), "AdamW beta1")(
      "adam-beta2", po::value(&o.adam_beta2)->default_value(o.adam_beta2), "AdamW beta2")(
      "adam-eps", po::value(&o.adam_eps)->default_value(o.adam_eps), "AdamW epsilon")(
      "lr-schedule", po::value(&o.lr_schedule)->default_value(o.lr_schedule),
      "per epoch: constant, step (x --lr-gamma every --lr-step epochs), cosine (to 0 at "
      "--epochs), cooldown (constant, then linearly towards 0 over the last --cooldown-epochs), "
      "or auto: cosine where the run sees at least 2000 training images in all "
      "(images x --epochs), else constant (a short run needs its few steps at the full rate; "
      "docs/real-data.md)")(
      "cooldown-epochs", po::value(&o.cooldown_epochs)->default_value(o.cooldown_epochs),
      "epochs of the cooldown schedule's decay: the last N run at lr x N/(N+1), ..., 1/(N+1) "
      "(0: a fifth of --epochs, rounded up)")(
      "warmup-epochs", po::value(&o.warmup_epochs)->default_value(o.warmup_epochs),
      "linear warm-up: epoch e < W runs at lr x (e+1)/(W+1)")(
      "warmup-steps", po::value(&o.warmup_steps),
      "linear warm-up per optimiser step on top of the schedule: step s <= N (1-based over the "
      "run) runs at its epoch's lr x s/N (default: 20 for the default recipe, adamw with he, "
      "below --width-divisor 8; else 0)")(
      "lr-scaling", po::value(&o.lr_scaling)->default_value(o.lr_scaling),
      "scale --lr by world size x accumulation steps: none, linear or sqrt")(
      "clip-grad-norm", po::value(&o.clip_grad_norm)->default_value(o.clip_grad_norm),
      "clip the global L2 norm of the averaged gradients to this (0: off)")(
      "skip-nonfinite-steps",
      po::value(&o.skip_nonfinite_steps)->default_value(o.skip_nonfinite_steps),
      "skip up to K optimiser steps whose loss or gradient norm is not finite (no update), then "
      "stop (exit 3); 0: stop at the first")(
      "divergence-factor", po::value(&o.divergence_factor)->default_value(o.divergence_factor),
      "a finite loss that explodes is a divergence too: stop (exit 3, no checkpoint of it) at a "
      "step whose loss over all ranks exceeds this many times the run's first step's; 0: off")(
      "lr-step", po::value(&o.lr_step)->default_value(o.lr_step), "epochs between LR decays")(
      "lr-gamma", po::value(&o.lr_gamma)->default_value(o.lr_gamma, "0.1"), "LR decay factor")(
      "pos-weight", po::value(&o.pos_weight)->implicit_value("dataset"),
      "weight of crack pixels in BCE: sqrt (the default with bce and bce+dice: the square "
      "root of the file's pos_weight, background per crack pixel; docs/real-data.md), dataset "
      "(pos_weight itself, class-balanced: the default with --optimizer sgd or --weight-init "
      "pytorch, and what --pos-weight alone gives), a number, or none (1)")(
      "loss", po::value(&o.loss)->default_value(o.loss),
      "bce (per pixel), dice (soft Dice per image), bce+dice (their sum; the default since "
      "CrackForest, docs/real-data.md), focal (per pixel), or bce+cldice, dice+cldice, "
      "bce+dice+cldice (with soft clDice per image, Shit et al. 2021: Dice of the soft skeletons, "
      "for thin structures); each the mean over the global batch")(
      "cldice-weight", po::value(&o.cldice_weight)->default_value(o.cldice_weight, "0.3"),
      "weight of the soft clDice term")(
      "cldice-iterations", po::value(&o.cldice_iterations)->default_value(o.cldice_iterations),
      "soft erosions of the soft skeleton (it follows cracks up to about 2 x this + 1 px wide)")(
      "cldice-start-epoch", po::value(&o.cldice_start_epoch)->default_value(o.cldice_start_epoch),
      "the first epoch (1-based) whose loss has the clDice term: a prediction that is still "
      "uniform has no soft skeleton, so clDice alone would push it towards all-crack")(
      "focal-alpha", po::value(&o.focal_alpha)->default_value(o.focal_alpha),
      "focal loss: weight of crack pixels, 1 - alpha of background (< 0: no weighting)")(
      "focal-gamma", po::value(&o.focal_gamma)->default_value(o.focal_gamma),
      "focal loss: focusing exponent (0 with --focal-alpha -1: BCE)")(
      "threshold", po::value(&o.threshold)->default_value(o.threshold),
      "probability threshold for IoU")(
      "tolerance", po::value(&o.tolerance)->default_value(o.tolerance),
      "pixels: validation's ODS/OIS/AP (threshold sweep) count a predicted crack pixel within this "
      "distance of a true one as right, and a true one with a prediction this close as found")(
      "seed", po::value(&o.seed)->default_value(o.seed),
      "seed of init, shuffling and augmentation")(
      "max-steps", po::value(&o.max_steps)->default_value(o.max_steps),
      "stop each epoch after N steps (-1: all)");
  po::options_description exec("Devices");
  exec.add_options()("device", po::value(&o.device)->default_value(o.device), "auto, cpu or cuda")(
      "deterministic", po::bool_switch(&o.deterministic),
      "bitwise reproducible CPU runs: fixed thread count (no OpenMP dynamic adjustment); runs "
      "with the same world size and threads then give identical weights, resumed or not; on "
      "the GPU: deterministic cuDNN algorithms only (the own reductions' atomics may still "
      "change the last bits)")(
      "precision", po::value(&o.precision)->default_value(o.precision),
      "fp32, or bf16: activations and their gradients stored in bf16, convolutions on bf16 "
      "inputs and weights with fp32 accumulation; weights, optimiser state, batch-norm "
      "statistics, loss and reductions fp32 (as PyTorch autocast; CPUs with AVX512-BF16 or AMX, "
      "GPUs; on AMX with oneDNN 2.x the weight gradients run on AVX512-BF16 kernels, as oneDNN "
      "2.x's AMX kernel for them writes outside its output: oneDNN 3.x keeps AMX, INSTALL.md)")(
      "cpu-conv", po::value(&o.cpu_conv)->default_value(o.cpu_conv),
      "CPU fp32 3x3 stride-1 convolutions: auto (per pass, whichever is faster when timed at "
      "first use: direct on NHWC, Winograd where oneDNN has it, else direct on oneDNN's blocked "
      "layout, or the backend's own GEMMs: nine shifted ones, or Winograd F(2x2, 3x3) on 16), "
      "direct, shape (no timing: Winograd for the forward passes whose channels pay for it, "
      "direct elsewhere; dppredict's default), winograd (oneDNN 2.x has it on AVX-512 only; "
      "elsewhere an error), blocked, gemm or gemm-winograd; --deterministic implies direct")(
      "no-tf32", po::bool_switch(),
      "GPU: fp32 convolutions without TF32 tensor cores (slower, closer to the CPU)")(
      "threads", po::value(&o.threads)->default_value(o.threads),
      "CPU threads per rank (0: SLURM_CPUS_PER_TASK, else OMP_NUM_THREADS, else the rank's "
      "core binding, at most the node's cores over its ranks)");
  po::options_description dist("Distributed");
  dist.add_options()("bucket-mb", po::value(&o.bucket_mb)->default_value(o.bucket_mb),
                     "gradient all-reduce bucket size in MiB (the first bucket is 1 MiB)")(
      "no-overlap", po::bool_switch(), "all-reduce gradients after backward, not during it")(
      "progress-us", po::value(&o.progress_us)->default_value(o.progress_us),
      "MPI all-reduce during backward: a thread advances the transfers every N microseconds "
      "(0: only between layers; Open MPI moves TCP data only inside MPI calls)")(
      "accumulation-steps", po::value(&o.accumulation_steps)->default_value(1),
      "micro-batches of --batch-size per optimiser step (one all-reduce per step)")(
      "allow-gpu-sharing", po::bool_switch(&o.allow_gpu_sharing),
      "allow more ranks per node than visible GPUs (GPU selection only: NCCL training still "
      "needs one GPU per rank)")(
      "check-sync-every", po::value(&o.check_sync_every)->default_value(0),
      "compare a hash of the parameters over ranks every N steps (0: never)")(
      "stall-timeout", po::value(&o.stall_timeout)->default_value(o.stall_timeout),
      "end the job (exit 4) when a collective waits longer than this many seconds, naming the "
      "ranks that have not arrived (0: off)")(
      "preempt-signal", po::value(&preempt_signals)->composing(),
      "a signal that makes dptrain checkpoint at the next step and exit 75 (preempted, "
      "resumable): TERM, USR1, USR2, HUP, INT, QUIT, XCPU or ALRM; repeat for several (default: "
      "TERM and USR1; with NCCL 2.12, which takes SIGUSR1 itself, use USR2 and sbatch "
      "--signal=B:USR2@T)");
  // Benchmark and test switches: parsed, not shown by --help.
  po::options_description hidden("Hidden");
  hidden.add_options()("bench-skip-allreduce", po::bool_switch(&o.bench_skip_allreduce),
                       "benchmarks: skip the gradient all-reduce (ranks diverge)")(
      "bench-step-times", po::bool_switch(&o.bench_step_times),
      "benchmarks: rank 0 prints each step's wall time and, at the end, the peak memory")(
      "test-fault", po::value(&test_faults)->composing(),
      "tests: plant a fault, KIND@RANK:STEP or preempt-at-start (train/fault_injection.hpp)");
  po::options_description out("Checkpointing");
  out.add_options()("model-dir", po::value(&o.model_dir)->default_value(o.model_dir),
                    "directory for checkpoints")(
      "resume", po::value(&o.resume)->default_value(o.resume),
      "auto (the newest checkpoint in --model-dir that verifies, mid-epoch ones included), never "
      "(alias: none), or a checkpoint path")(
      "save-every", po::value(&o.save_every)->default_value(o.save_every),
      "write model_epoch_<N>.h5 every E epochs (and after the last; model_best.h5 whenever an "
      "epoch is the best)")(
      "keep-last", po::value(&o.keep_last)->default_value(o.keep_last),
      "keep only the newest K epoch checkpoints (0: all); model_best.h5 is never deleted")(
      "best-metric", po::value(&o.best_metric)->default_value(o.best_metric),
      "chooses model_best.h5: valid_loss (lowest), iou, dice or ods (highest)")(
      "patience", po::value(&o.patience)->default_value(o.patience),
      "stop (exit 0) after N validations in a row without a better --best-metric (0: never)")(
      "min-delta", po::value(&o.min_delta)->default_value(o.min_delta),
      "early stopping: a better --best-metric must improve on the best by more than this")(
      "ema", po::value(&o.ema)->default_value(o.ema),
      "keep an exponential moving average of the weights and batch-norm buffers with this "
      "decay per optimiser step (e.g. 0.999; 0: off); it is validated, chooses model_best.h5 "
      "and is what dppredict uses")(
      "ema-warmup", po::bool_switch(&o.ema_warmup),
      "--ema's decay at optimiser step s is min(decay, (1 + s) / (10 + s)): the average follows "
      "the last ~s/9 steps early on (TensorFlow's num_updates), so it suits short runs");
  po::options_description output("Output");
  output.add_options()("val-every", po::value(&o.val_every)->default_value(o.val_every),
                       "validate every N epochs (and after the last)")(
      "log-every", po::value(&o.log_every)->default_value(o.log_every),
      "steps between progress lines (without the bar)")(
      "progress", po::value(&o.progress)->default_value(o.progress),
      "rank 0's progress: bar (redrawn in place), lines (every --log-every steps), or auto (bar "
      "when stdout and stderr are terminals; under mpirun that means lines)")(
      "log-all-ranks", po::bool_switch(&o.log_all_ranks),
      "log from every rank with a [rank r] prefix")(
      "report", po::bool_switch(&o.report),
      "write report.html in --model-dir after every epoch (curves, sample predictions)")(
      "tensorboard", po::bool_switch(&o.tensorboard),
      "write TensorBoard events in --model-dir/tb: loss, LR and img/s every --log-every steps "
      "(0: every step), validation metrics and sample predictions every epoch, the options");
  po::options_description general("General");
  general.add_options()("config", po::value(&o.config),
                        "INI file of options: 'name = value' lines, names as on the command line "
                        "without '--' (switches: name = true); the command line overrides it")(
      "help,h", "show this help");
  dist.add(exec);  // devices and threads under the distributed topic
  po::options_description all("Usage: mpirun -np N dptrain [options]");
  all.add(general).add(data).add(model).add(optim).add(dist).add(out).add(output);
  po::options_description parsed;
  parsed.add(all).add(hidden);

  po::variables_map vm;
  for (int i = 1; i < argc; ++i) refuse_placeholders(argv[i], str_cat("argument '", argv[i], "'"));
  try {
    po::store(po::command_line_parser(argc, argv).options(parsed).run(), vm);
  } catch (const po::error& e) {
    throw UsageError(str_cat(e.what(), " (see --help)"));
  }
  // --config: stored after the command line, whose values therefore win.
  if (vm.count("config")) store_config_file(vm["config"].as<std::string>(), parsed, vm);
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(str_cat(e.what(), " (see --help)"));
  }
  if (vm.count("help")) {
    if (print_help) std::cout << all << "\n";
    return std::nullopt;
  }
  // AdamW at SGD's rate diverges: without --lr, each optimiser gets its own default. AdamW's step
  // is absolute, and He-initialised weights are about 2.4x PyTorch's default in scale, so they
  // take a higher rate than PyTorch's AdamW default (docs/real-data.md). That rate was chosen at
  // width /8; AdamW moves every weight by about the rate, so a layer's output moves with its
  // fan-in, and the default recipe's rate follows the width: kAdamWLr x divisor / 8 (/1: 3.75e-4,
  // where /8's rate blows the loss up to 1e8 in two steps; DESIGN "The default recipe").
  const bool he_adamw = o.optimizer == "adamw" && o.weight_init == "he";
  if (vm.count("lr") == 0)
    o.lr = o.optimizer == "sgd" ? TrainOptions::kSgdLr
           : he_adamw           ? default_adamw_lr(o.effective_width_divisor())
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
  o.overlap = !vm["no-overlap"].as<bool>();
  o.tf32 = !vm["no-tf32"].as<bool>();
  if (o.resume == "none") o.resume = "never";  // the older spelling
  if (o.resume.empty()) throw UsageError("--resume must be auto, never or a checkpoint path");

  auto require = [](bool ok, auto&&... msg) {
    if (!ok) throw UsageError(str_cat(msg...));
  };
  require(o.dropout >= 0 && o.dropout < 1, "--dropout must be in [0, 1), got ", o.dropout);
  require(o.weight_init == "he" || o.weight_init == "pytorch",
          "--weight-init must be he or pytorch, got '", o.weight_init, "'");
  require(o.threads >= 0, "--threads must be >= 0, got ", o.threads);
  require(o.batch_size >= 1, "--batch-size must be at least 1, got ", o.batch_size);
  require(o.prefetch >= 1, "--prefetch must be at least 1, got ", o.prefetch);
  constexpr int kMaxWorkers = 64;
  require(o.workers >= 1 && o.workers <= kMaxWorkers, "--workers must be in [1, ", kMaxWorkers,
          "], got ", o.workers);
  require(data::augment_from_name(o.augment).has_value(),
          "--augment must be none, flips or full, got '", o.augment, "'");
  require(data::normalize_from_name(o.normalize).has_value(),
          "--normalize must be imagenet or dataset, got '", o.normalize, "'");
  try {  // --random-crop and --scale-jitter (parsed by the data library)
    data::LoaderOptions crop;
    data::parse_crop(o.random_crop, o.scale_jitter, crop);
  } catch (const Error& e) {
    require(false, e.what());
  }
  require(o.epochs >= 1, "--epochs must be at least 1, got ", o.epochs);
  require(o.lr > 0, "--lr must be positive, got ", o.lr);
  require(o.momentum >= 0 && o.momentum < 1, "--momentum must be in [0, 1), got ", o.momentum);
  require(o.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.weight_decay);
  require(o.optimizer == "sgd" || o.optimizer == "adamw", "--optimizer must be sgd or adamw, got '",
          o.optimizer, "'");
  require(o.adam_beta1 >= 0 && o.adam_beta1 < 1, "--adam-beta1 must be in [0, 1), got ",
          o.adam_beta1);
  require(o.adam_beta2 >= 0 && o.adam_beta2 < 1, "--adam-beta2 must be in [0, 1), got ",
          o.adam_beta2);
  require(o.adam_eps > 0, "--adam-eps must be positive, got ", o.adam_eps);
  require(o.lr_schedule == "auto" || o.lr_schedule == "constant" || o.lr_schedule == "step" ||
              o.lr_schedule == "cosine" || o.lr_schedule == "cooldown",
          "--lr-schedule must be auto, constant, step, cosine or cooldown, got '", o.lr_schedule,
          "'");
  require(o.cooldown_epochs >= 0, "--cooldown-epochs must be >= 0, got ", o.cooldown_epochs);
  require(o.warmup_epochs >= 0, "--warmup-epochs must be >= 0, got ", o.warmup_epochs);
  require(o.warmup_steps >= 0, "--warmup-steps must be >= 0, got ", o.warmup_steps);
  require(o.lr_scaling == "none" || o.lr_scaling == "linear" || o.lr_scaling == "sqrt",
          "--lr-scaling must be none, linear or sqrt, got '", o.lr_scaling, "'");
  require(o.clip_grad_norm >= 0, "--clip-grad-norm must be >= 0 (0: off), got ", o.clip_grad_norm);
  require(!o.nesterov || (o.optimizer == "sgd" && o.momentum > 0),
          "--nesterov needs --optimizer sgd with --momentum > 0");
  require(o.lr_step >= 1, "--lr-step must be at least 1, got ", o.lr_step);
  require(o.lr_gamma > 0 && o.lr_gamma <= 1, "--lr-gamma must be in (0, 1], got ", o.lr_gamma);
  require(o.threshold > 0 && o.threshold < 1, "--threshold must be in (0, 1), got ", o.threshold);
  require(o.tolerance >= 0 && o.tolerance <= 32, "--tolerance must be in [0, 32] pixels, got ",
          o.tolerance);
  require(Loss::valid(o.loss),
          "--loss must be bce, dice, bce+dice, focal, bce+cldice, dice+cldice or bce+dice+cldice, "
          "got '",
          o.loss, "'");
  require(o.cldice_weight > 0 && std::isfinite(o.cldice_weight),
          "--cldice-weight must be positive, got ", o.cldice_weight);
  require(o.cldice_iterations >= 1 && o.cldice_iterations <= 32,
          "--cldice-iterations must be in [1, 32], got ", o.cldice_iterations);
  require(o.cldice_start_epoch >= 1, "--cldice-start-epoch must be at least 1, got ",
          o.cldice_start_epoch);
  require(o.focal_alpha <= 1, "--focal-alpha must be <= 1 (< 0: off), got ", o.focal_alpha);
  require(o.focal_gamma >= 0, "--focal-gamma must be >= 0, got ", o.focal_gamma);
  require(Loss::crack_weight(o.pos_weight, 1.0f) > 0,
          "--pos-weight must be none, dataset, sqrt or a positive number, got '", o.pos_weight,
          "'");
  // A weight of 1 is "none" (so the 0/1 that older checkpoints recorded stays unambiguous).
  if (Loss::crack_weight(o.pos_weight, 2.0f) == 1.0f) o.pos_weight = "none";
  require(o.pos_weight == "none" || Loss::has_bce(o.loss),
          "--pos-weight weights BCE: use it with a --loss that has bce (focal has --focal-alpha)");
  require(o.max_steps == -1 || o.max_steps >= 1, "--max-steps must be -1 or positive, got ",
          o.max_steps);
  require(o.progress == "auto" || o.progress == "bar" || o.progress == "lines",
          "--progress must be auto, bar or lines, got '", o.progress, "'");
  require(o.log_every >= 0, "--log-every must be >= 0, got ", o.log_every);
  require(o.save_every >= 1, "--save-every must be at least 1, got ", o.save_every);
  require(o.keep_last >= 0, "--keep-last must be >= 0 (0 keeps all), got ", o.keep_last);
  require(o.val_every >= 1, "--val-every must be at least 1, got ", o.val_every);
  require(valid_best_metric(o.best_metric),
          "--best-metric must be valid_loss, iou, dice or ods, got '", o.best_metric, "'");
  require(o.patience >= 0, "--patience must be >= 0 validations (0: never stop early), got ",
          o.patience);
  require(o.min_delta >= 0, "--min-delta must be >= 0, got ", o.min_delta);
  require(o.ema >= 0 && o.ema < 1, "--ema must be a decay in [0, 1) (0: off), got ", o.ema);
  require(o.bucket_mb > 0, "--bucket-mb must be positive, got ", o.bucket_mb);
  require(o.progress_us >= 0 && o.progress_us <= 1000000,
          "--progress-us must be between 0 and 1000000, got ", o.progress_us);
  require(o.accumulation_steps >= 1, "--accumulation-steps must be at least 1, got ",
          o.accumulation_steps);
  if (!preempt_signals.empty()) o.preempt_signals = preempt_signals;
  parse_preempt_signals(o.preempt_signals);  // a UsageError naming a bad one
  for (const std::string& f : test_faults) {
    if (f != kPreemptAtStart) o.test_faults.push_back(parse_planted_fault(f));
  }
  require(o.stall_timeout >= 0, "--stall-timeout must be >= 0 seconds (0: off), got ",
          o.stall_timeout);
  require(o.skip_nonfinite_steps >= 0, "--skip-nonfinite-steps must be >= 0, got ",
          o.skip_nonfinite_steps);
  require(o.divergence_factor == 0 || o.divergence_factor > 1,
          "--divergence-factor must be 0 (off) or greater than 1, got ", o.divergence_factor);
  require(o.check_sync_every >= 0, "--check-sync-every must be >= 0, got ", o.check_sync_every);
  require(vm.count("width-divisor") == 0 || (o.width_divisor >= 1 && 32 % o.width_divisor == 0),
          "--width-divisor must be one of 1, 2, 4, 8, 16, 32, got ", o.width_divisor);
  parse_cpu_conv(o.cpu_conv);
  parse_precision(o.precision);
  require(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
          "--device must be auto, cpu or cuda, got '", o.device, "'");
  require(!o.model_dir.empty(), "--model-dir must not be empty");
  bool known = false;
  std::string names;
  for (const auto& n : model_names()) {
    known = known || n == o.model;
    names += (names.empty() ? "" : ", ") + n;
  }
  require(known, "unknown --model '", o.model, "' (known: ", names, ")");
  return o;
}

double default_adamw_lr(int divisor) {
  return TrainOptions::kAdamWLr * double(std::min(divisor, kTunedWidthDivisor)) /
         kTunedWidthDivisor;
}

}  // namespace dp::app
