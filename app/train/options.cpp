// Parsing and validation of dptrain's options (Boost.Program_options), grouped by topic.
#include "train/options.hpp"

#include <boost/program_options.hpp>

#include <iostream>
#include <sstream>

#include "dp/model.hpp"

namespace dp::app {
namespace po = boost::program_options;

std::string TrainOptions::describe() const {
  std::ostringstream os;
  os << "data = " << (data.empty() ? "(synthetic demo)" : data) << "\n"
     << "batch_size = " << batch_size << "\n"
     << "prefetch = " << prefetch << "\n"
     << "augment = " << augment << "\n"
     << "model = " << model << "\n"
     << "width_divisor = " << effective_width_divisor() << "\n"
     << "epochs = " << epochs << "\n"
     << "lr = " << lr << "\n"
     << "momentum = " << momentum << "\n"
     << "weight_decay = " << weight_decay << "\n"
     << "lr_step = " << lr_step << "\n"
     << "lr_gamma = " << lr_gamma << "\n"
     << "threshold = " << threshold << "\n"
     << "pos_weight = " << use_pos_weight << "\n"
     << "seed = " << seed << "\n"
     << "device = " << device << "\n"
     << "model_dir = " << model_dir << "\n"
     << "resume = " << resume << "\n";
  return os.str();
}

std::optional<TrainOptions> parse_train_options(int argc, const char* const* argv,
                                                bool print_help) {
  TrainOptions o;
  po::options_description data("Data");
  data.add_options()("data", po::value(&o.data),
                     "dataset v1 HDF5 file (default: a synthetic crack dataset)")(
      "synth-cache", po::value(&o.synth_cache), "path of the cached synthetic dataset")(
      "batch-size,b", po::value(&o.batch_size)->default_value(o.batch_size),
      "images per rank per step")("prefetch", po::value(&o.prefetch)->default_value(o.prefetch),
                                  "batches prepared ahead")("no-augment", po::bool_switch(),
                                                            "disable random flips");
  po::options_description model("Model");
  model.add_options()("model", po::value(&o.model)->default_value(o.model), "network: unet16")(
      "width-divisor", po::value(&o.width_divisor),
      "divide every channel count by D (default 1; 8 for the synthetic demo)");
  po::options_description optim("Optimisation");
  optim.add_options()("epochs", po::value(&o.epochs)->default_value(o.epochs),
                      "epochs to train in total")("lr", po::value(&o.lr)->default_value(o.lr),
                                                  "base learning rate")(
      "momentum", po::value(&o.momentum)->default_value(o.momentum), "SGD momentum")(
      "weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay), "L2 weight decay")(
      "lr-step", po::value(&o.lr_step)->default_value(o.lr_step), "epochs between LR decays")(
      "lr-gamma", po::value(&o.lr_gamma)->default_value(o.lr_gamma), "LR decay factor")(
      "pos-weight", po::bool_switch(&o.use_pos_weight),
      "weight crack pixels by the dataset's pos_weight")(
      "threshold", po::value(&o.threshold)->default_value(o.threshold),
      "probability threshold for IoU")("seed", po::value(&o.seed)->default_value(o.seed),
                                       "seed of init, shuffling and augmentation")(
      "max-steps", po::value(&o.max_steps)->default_value(o.max_steps),
      "stop each epoch after N steps (-1: all)");
  po::options_description exec("Execution");
  exec.add_options()("device", po::value(&o.device)->default_value(o.device), "auto, cpu or cuda");
  po::options_description out("Checkpointing and output");
  out.add_options()("model-dir", po::value(&o.model_dir)->default_value(o.model_dir),
                    "directory for checkpoints")(
      "resume", po::value(&o.resume)->default_value(o.resume),
      "auto (newest model_epoch_N.h5 in --model-dir), none, or a checkpoint path")(
      "log-every", po::value(&o.log_every)->default_value(o.log_every),
      "steps between progress lines")("log-all-ranks", po::bool_switch(&o.log_all_ranks),
                                      "log from every rank with a [rank r] prefix")(
      "help,h", "show this help");
  po::options_description all("Usage: mpirun -np N dptrain [options]");
  all.add(data).add(model).add(optim).add(exec).add(out);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(str_cat(e.what(), " (see --help)"));
  }
  if (vm.count("help")) {
    if (print_help) std::cout << all << "\n";
    return std::nullopt;
  }
  o.augment = !vm["no-augment"].as<bool>();

  auto require = [](bool ok, auto&&... msg) {
    if (!ok) throw UsageError(str_cat(msg...));
  };
  require(o.batch_size >= 1, "--batch-size must be at least 1, got ", o.batch_size);
  require(o.prefetch >= 1, "--prefetch must be at least 1, got ", o.prefetch);
  require(o.epochs >= 1, "--epochs must be at least 1, got ", o.epochs);
  require(o.lr > 0, "--lr must be positive, got ", o.lr);
  require(o.momentum >= 0 && o.momentum < 1, "--momentum must be in [0, 1), got ", o.momentum);
  require(o.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.weight_decay);
  require(o.lr_step >= 1, "--lr-step must be at least 1, got ", o.lr_step);
  require(o.lr_gamma > 0 && o.lr_gamma <= 1, "--lr-gamma must be in (0, 1], got ", o.lr_gamma);
  require(o.threshold > 0 && o.threshold < 1, "--threshold must be in (0, 1), got ", o.threshold);
  require(o.max_steps == -1 || o.max_steps >= 1, "--max-steps must be -1 or positive, got ",
          o.max_steps);
  require(o.log_every >= 0, "--log-every must be >= 0, got ", o.log_every);
  require(vm.count("width-divisor") == 0 || (o.width_divisor >= 1 && 32 % o.width_divisor == 0),
          "--width-divisor must be one of 1, 2, 4, 8, 16, 32, got ", o.width_divisor);
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

}  // namespace dp::app
