// dpprep: prepares dataset v1 files (subcommand `synth`; `build` and `info` are to follow).
#include <boost/program_options.hpp>

#include <charconv>
#include <cstdint>
#include <exception>
#include <iomanip>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/synth.hpp"

namespace po = boost::program_options;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;
constexpr int kMaxSide = 16384;  // px: larger images are surely a typo
constexpr const char* kProgram = "dpprep";
constexpr int kCommandColumn = 10;  // width of the command names in --help

// A mistake in the command line (exit code 2), as opposed to a failure while running (1).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One subcommand: its name, a one-line summary for `dpprep --help` and its entry point, which
// receives the arguments after the subcommand name.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

template <typename T>
T parse_number(const std::string& text, const char* what) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError(dp::str_cat("invalid ", what, " '", text, "'"));
  }
  return value;
}

// "HxW" (e.g. 64x64) -> height, width.
void parse_size(const std::string& text, int& height, int& width) {
  const size_t x = text.find('x');
  if (x == std::string::npos) {
    throw UsageError(dp::str_cat("invalid --size '", text, "', expected HxW (e.g. 64x64)"));
  }
  height = parse_number<int>(text.substr(0, x), "--size height");
  width = parse_number<int>(text.substr(x + 1), "--size width");
  if (height < 1 || width < 1 || height > kMaxSide || width > kMaxSide) {
    throw UsageError(
        dp::str_cat("invalid --size '", text, "': each side must be in [1, ", kMaxSide, "]"));
  }
}

// Parses `args` against `desc`; returns false (after printing help) if --help was given.
bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                po::variables_map& vm, const char* usage) {
  // Words that are not options are collected under a hidden name and reported.
  constexpr const char* kStray = "stray-arguments";
  po::options_description all;
  all.add(desc).add_options()(kStray, po::value<std::vector<std::string>>());
  po::positional_options_description positional;
  positional.add(kStray, -1);
  po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
  if (vm.count(kStray)) {
    throw UsageError(dp::str_cat("unexpected argument '",
                                 vm[kStray].as<std::vector<std::string>>().front(), "'"));
  }
  if (vm.count("help")) {
    std::cout << usage << "\n\n" << desc;
    return false;
  }
  po::notify(vm);
  return true;
}

int run_synth(const std::vector<std::string>& args) {
  dp::data::SynthOptions opt;
  std::string out, size = "64x64", seed = "1";
  po::options_description desc("Options");
  desc.add_options()("help,h", "show this help")("out", po::value<std::string>(&out)->required(),
                                                 "output dataset file (HDF5, dataset v1)")(
      "train", po::value<int64_t>(&opt.train_count)->default_value(opt.train_count),
      "number of training samples")(
      "val", po::value<int64_t>(&opt.val_count)->default_value(opt.val_count),
      "number of validation samples")("size", po::value<std::string>(&size)->default_value(size),
                                      "image size HxW")(
      "seed", po::value<std::string>(&seed)->default_value(seed),
      "seed (unsigned 64-bit): the data are a function of it");
  po::variables_map vm;
  if (!parse_args(args, desc, vm,
                  "Usage: dpprep synth --out FILE [--train N] [--val N] [--size HxW] [--seed S]\n"
                  "Writes a synthetic crack-segmentation dataset (textured backgrounds with\n"
                  "random-walk cracks and their exact masks).")) {
    return kExitOk;
  }
  if (out.empty()) throw UsageError("--out must not be empty");
  if (opt.train_count < 0)
    throw UsageError(dp::str_cat("--train must be >= 0, got ", opt.train_count));
  if (opt.val_count < 0) throw UsageError(dp::str_cat("--val must be >= 0, got ", opt.val_count));
  if (opt.train_count == 0 && opt.val_count == 0) {
    throw UsageError("--train and --val are both 0: nothing to write");
  }
  parse_size(size, opt.height, opt.width);
  opt.seed = parse_number<uint64_t>(seed, "--seed");

  dp::data::write_synthetic(out, opt);
  float pos_weight = 1.0f;
  if (opt.train_count > 0) pos_weight = dp::data::Dataset(out, "train").pos_weight();
  std::cout << kProgram << ": wrote " << out << " (train " << opt.train_count << ", val "
            << opt.val_count << ", " << opt.height << "x" << opt.width << ", seed " << opt.seed
            << ", pos_weight " << pos_weight << ")\n";
  return kExitOk;
}

const Command kCommands[] = {
    {"synth", "write a synthetic crack dataset", run_synth},
};

void print_help() {
  std::cout << "Usage: dpprep COMMAND [OPTIONS]\n"
               "Prepares crack-segmentation datasets (HDF5, format dp-crack-v1).\n\n"
               "Commands:\n";
  for (const Command& c : kCommands) {
    std::cout << "  " << std::left << std::setw(kCommandColumn) << c.name << " " << c.summary
              << "\n";
  }
  std::cout << "\nRun 'dpprep COMMAND --help' for the options of a command.\n";
}

int run(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) throw UsageError("no command given (try 'dpprep --help')");
  const std::string& name = args.front();
  if (name == "--help" || name == "-h" || name == "help") {
    print_help();
    return kExitOk;
  }
  for (const Command& c : kCommands) {
    if (name == c.name) return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  std::string known;
  for (const Command& c : kCommands) known += dp::str_cat(known.empty() ? "" : ", ", c.name);
  throw UsageError(dp::str_cat("unknown command '", name, "' (expected one of: ", known, ")"));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const po::error& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return kExitRuntime;
  }
}
