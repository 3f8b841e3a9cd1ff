// dpprep: prepares dataset v1 files (`build` from image folders, `info`, `synth`).
#include <unistd.h>
#include <boost/program_options.hpp>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "dp/dataset.hpp"
#include "dp/error.hpp"
#include "dp/prepare.hpp"
#include "dp/synth.hpp"
#include "error_lines.hpp"
#include "exit_codes.hpp"
#include "option_table.hpp"
#include "progress.hpp"

namespace po = boost::program_options;

namespace {

using dp::app::kExitOk;
using dp::app::kExitSignalBase;
using dp::app::UsageError;
constexpr int kMaxSide = 16384;  // px: larger images are surely a typo
constexpr const char* kProgram = "dpprep";
constexpr int kCommandColumn = 10;  // width of the command names in --help

// Set by SIGINT/SIGTERM; the progress callback turns it into an exception, so the dataset writer
// removes its temporary file on the way out.
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_signal(int sig) {
  g_signal = sig;
}

class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int sig)
      : std::runtime_error(dp::str_cat("interrupted by signal ", sig, "; nothing was written")),
        signal_(sig) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

void catch_interrupts() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Progress of a long phase (dp::app::CountProgress), which also turns a SIGINT/SIGTERM into an
// exception.
class Progress {
 public:
  Progress() : count_(true, kMinTotalForLines, bar, line) {}

  void operator()(const char* phase, int64_t done, int64_t total) {
    if (g_signal != 0) throw Interrupted(g_signal);
    count_.update(phase, done, total);
  }
  void end_line() { count_.end_line(); }

 private:
  static constexpr int64_t kMinTotalForLines = 200;
  static constexpr double kMinRateSeconds = 0.2;  // the rate settles after a moment
  using State = dp::app::CountProgress::State;
  static std::string bar(const State& s) {
    const std::string rate =
        s.seconds >= kMinRateSeconds ? dp::str_cat(static_cast<int64_t>(s.rate), " img/s") : "";
    char text[256];
    std::snprintf(text, sizeof text, "%-13s [%s] %lld/%lld %5.1f%% %-12s", s.phase.c_str(),
                  dp::app::progress_bar(double(s.per_mille) / dp::app::CountProgress::kPerMille,
                                        dp::app::CountProgress::kBarWidth)
                      .c_str(),
                  static_cast<long long>(s.done), static_cast<long long>(s.total),
                  100.0 * double(s.per_mille) / dp::app::CountProgress::kPerMille, rate.c_str());
    return text;
  }
  static std::string line(const State& s) {
    char text[256];
    std::snprintf(text, sizeof text, "%s: %s %lld/%lld (%.0f%%, %.0f img/s)", kProgram,
                  s.phase.c_str(), static_cast<long long>(s.done), static_cast<long long>(s.total),
                  100.0 * double(s.per_mille) / dp::app::CountProgress::kPerMille, s.rate);
    return text;
  }
  dp::app::CountProgress count_;
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

// Parses a command's `args` with its option table and checks them; nothing (after printing
// `usage` and the options) where --help was given.
template <class Command>
std::optional<po::variables_map> parse_command(const std::vector<std::string>& args,
                                               const dp::app::OptionTable<Command>& table,
                                               Command& c, const char* usage,
                                               dp::app::Operands operands = {}) {
  const auto bound = table.bind(c, "");
  po::variables_map vm = dp::app::read_command_line(args, bound.all, operands);
  if (vm.count("help")) {
    std::cout << usage << "\n" << bound.visible;
    return std::nullopt;
  }
  table.check(c);
  return vm;
}

// dpprep synth's command line.
struct SynthCommand : dp::data::SynthOptions {
  std::string out, size = "64x64", seed_text = "1";
};

const dp::app::OptionTable<SynthCommand>& synth_options() {
  using C = SynthCommand;
  static const dp::app::OptionTable<C> table = [] {
    dp::app::OptionTable<C> t;
    const std::string topic = "Options";
    t.command_line(topic, "help,h", "show this help");
    t.value(topic, "out", &C::out, "output dataset file (HDF5, dataset v1)").no_default();
    t.value(topic, "train", &C::train_count, "number of training samples",
            {dp::app::non_negative<int64_t>()});
    t.value(topic, "val", &C::val_count, "number of validation samples",
            {dp::app::non_negative<int64_t>()});
    t.value(topic, "size", &C::size, "image size HxW");
    t.value(topic, "seed", &C::seed_text, "seed (unsigned 64-bit): the data are a function of it");
    return t;
  }();
  return table;
}

int run_synth(const std::vector<std::string>& args) {
  SynthCommand opt;
  if (!parse_command(
          args, synth_options(), opt,
          "Usage: dpprep synth --out FILE [--train N] [--val N] [--size HxW] [--seed S]\n"
          "Writes a synthetic crack-segmentation dataset (textured backgrounds with\n"
          "random-walk cracks and their exact masks).")) {
    return kExitOk;
  }
  const std::string& out = opt.out;
  if (out.empty()) throw UsageError("--out is required (see --help)");
  if (opt.train_count == 0 && opt.val_count == 0) {
    throw UsageError("--train and --val are both 0: nothing to write");
  }
  parse_size(opt.size, opt.height, opt.width);
  opt.seed = parse_number<uint64_t>(opt.seed_text, "--seed");

  dp::data::write_synthetic(out, opt);
  float pos_weight = 1.0f;
  if (opt.train_count > 0) pos_weight = dp::data::Dataset(out, "train").pos_weight();
  std::cout << kProgram << ": wrote " << out << " (train " << opt.train_count << ", val "
            << opt.val_count << ", " << opt.height << "x" << opt.width << ", seed " << opt.seed
            << ", pos_weight " << pos_weight << ")\n";
  return kExitOk;
}

// "WxH" (e.g. 448x448) -> width, height, for --resize.
void parse_resize(const std::string& text, int& width, int& height) {
  const size_t x = text.find('x');
  if (x == std::string::npos) {
    throw UsageError(dp::str_cat("invalid --resize '", text, "', expected WxH (e.g. 448x448)"));
  }
  width = parse_number<int>(text.substr(0, x), "--resize width");
  height = parse_number<int>(text.substr(x + 1), "--resize height");
  if (height < 1 || width < 1 || height > kMaxSide || width > kMaxSide) {
    throw UsageError(
        dp::str_cat("invalid --resize '", text, "': each side must be in [1, ", kMaxSide, "]"));
  }
}

// "HxW" for `option` (--tile, --pad-to) -> height, width.
void parse_hw(const std::string& text, const char* option, int& height, int& width) {
  const size_t x = text.find('x');
  if (x == std::string::npos) {
    throw UsageError(dp::str_cat("invalid ", option, " '", text, "', expected HxW (e.g. 256x256)"));
  }
  height = parse_number<int>(text.substr(0, x), option);
  width = parse_number<int>(text.substr(x + 1), option);
  if (height < 1 || width < 1 || height > kMaxSide || width > kMaxSide) {
    throw UsageError(
        dp::str_cat("invalid ", option, " '", text, "': each side must be in [1, ", kMaxSide, "]"));
  }
}

std::string percent(int64_t part, int64_t whole) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1)
     << (whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0) << "%";
  return os.str();
}

std::string triple(const std::array<double, 3>& v) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(4) << v[0] << " " << v[1] << " " << v[2];
  return os.str();
}

// dpprep build's command line.
struct BuildCommand : dp::data::BuildOptions {
  std::string resize, tile, pad_to, seed_text = "1";
};

const dp::app::OptionTable<BuildCommand>& build_options() {
  using C = BuildCommand;
  static const dp::app::OptionTable<C> table = [] {
    dp::app::OptionTable<C> t;
    const std::string topic = "Options";
    t.command_line(topic, "help,h", "show this help");
    t.value(topic, "images", &C::images, "folder of images").no_default();
    t.value(topic, "masks", &C::masks, "folder of masks (paired with the images by file stem)")
        .no_default();
    t.value(topic, "out", &C::out, "output dataset file (HDF5, v1)").no_default();
    t.value(topic, "val-fraction", &C::val_fraction,
            "fraction held out for validation, stratified by whether a mask has a crack (0: none)",
            {dp::app::unit_interval()});
    t.value(topic, "val-images", &C::val_images,
            "explicit validation images (with --val-masks; replaces --val-fraction)")
        .no_default();
    t.value(topic, "val-masks", &C::val_masks, "explicit validation masks").no_default();
    t.value(topic, "seed", &C::seed_text, "seed of the train/val split");
    t.value(topic, "group-by", &C::group_by,
            "keep images whose stems share this regular expression's first match on one side of "
            "the split, e.g. '^[^-]+' for crops PHOTO-1, PHOTO-2 of one photograph (default: "
            "none)")
        .no_default();
    t.value(topic, "mask-threshold", &C::mask_threshold, "a mask pixel > T is a crack",
            {dp::app::in_range(0, 254)});
    t.value(topic, "resize", &C::resize,
            "resize every pair to WxH (bilinear images, nearest masks); otherwise all images "
            "must share one size")
        .no_default();
    t.value(topic, "tile", &C::tile,
            "cut every image (any size, at least the tile) and its mask into HxW tiles; the "
            "split stays by source image")
        .no_default();
    t.value(topic, "stride", &C::tile_stride,
            "step between tiles in px (default: the tile's sides, no overlap); a last row and "
            "column of tiles is flush with the bottom and right edges")
        .no_default();
    t.value(topic, "min-crack-fraction", &C::min_crack_fraction,
            "drop tiles whose fraction of crack pixels is below F (default 0: keep all)",
            {dp::app::in_range(0.0, 1.0)})
        .no_default();
    t.value(topic, "keep-below", &C::keep_below,
            "keep this fraction (0-1, drawn from the seed) of the tiles below "
            "--min-crack-fraction, so training still sees background (default 0)",
            {dp::app::in_range(0.0, 1.0)})
        .no_default();
    t.value(topic, "pad-to", &C::pad_to,
            "pad every image at the bottom and right with zeros (its mask with background) to "
            "HxW; no image may be larger")
        .no_default();
    t.flag(topic, "skip-unpaired", &C::skip_unpaired,
           "skip images without masks and masks without images (counted)");
    t.value(topic, "gzip", &C::gzip_level,
            "gzip level of the chunks, 0-9 (0: none; the fastest to read)",
            {dp::app::in_range(0, 9)});
    return t;
  }();
  return table;
}

int run_build(const std::vector<std::string>& args) {
  BuildCommand opt;
  const auto vm =
      parse_command(args, build_options(), opt,
                    "Usage: dpprep build --images DIR --masks DIR --out FILE [options]\n"
                    "Builds a dataset v1 file from folders of images and masks (.jpg, .jpeg,\n"
                    "  .png, .tif, .tiff, .bmp), paired by file stem. Masks are binarised\n"
                    "  (> threshold). Images of several sizes need --tile or --pad-to.");
  if (!vm) return kExitOk;
  for (const auto& [value, flag] : {std::pair{&opt.images, "--images"},
                                    std::pair{&opt.masks, "--masks"}, std::pair{&opt.out, "--out"}})
    if (value->empty()) throw UsageError(dp::str_cat(flag, " is required (see --help)"));
  if (vm->count("val-images") != vm->count("val-masks")) {
    throw UsageError("--val-images and --val-masks go together");
  }
  if (vm->count("val-images") && !(*vm)["val-fraction"].defaulted()) {
    throw UsageError("give either --val-fraction or --val-images/--val-masks, not both");
  }
  if (vm->count("val-images") && vm->count("group-by")) {
    throw UsageError("--group-by groups a drawn split; --val-images gives the split itself");
  }
  if (!opt.resize.empty()) parse_resize(opt.resize, opt.resize_width, opt.resize_height);
  if (!opt.tile.empty()) parse_hw(opt.tile, "--tile", opt.tile_height, opt.tile_width);
  if (!opt.pad_to.empty()) parse_hw(opt.pad_to, "--pad-to", opt.pad_height, opt.pad_width);
  if (int(!opt.resize.empty()) + int(!opt.tile.empty()) + int(!opt.pad_to.empty()) > 1) {
    throw UsageError("give at most one of --resize, --tile and --pad-to");
  }
  if (opt.tile.empty() &&
      (vm->count("stride") || vm->count("min-crack-fraction") || vm->count("keep-below"))) {
    throw UsageError("--stride, --min-crack-fraction and --keep-below need --tile HxW");
  }
  if (vm->count("stride") && (opt.tile_stride < 1 || opt.tile_stride > kMaxSide)) {
    throw UsageError(dp::str_cat("--stride must be in [1, ", kMaxSide, "], got ", opt.tile_stride));
  }
  opt.seed = parse_number<uint64_t>(opt.seed_text, "--seed");

  catch_interrupts();
  Progress progress;
  const dp::data::BuildReport r = dp::data::build_dataset(
      opt, [&](const char* phase, int64_t done, int64_t total) { progress(phase, done, total); });
  progress.end_line();
  std::cout << kProgram << ": wrote " << opt.out << ": train " << r.train << " ("
            << r.train_with_cracks << " with cracks), val " << r.val << " (" << r.val_with_cracks
            << " with cracks), " << r.width << "x" << r.height << " (WxH)"
            << (r.resized ? " resized" : "") << (r.padded ? " padded" : "")
            << (!r.resized        ? ""
                : r.scale.known() ? dp::str_cat(" (scale ", r.scale.x, "x", r.scale.y,
                                                " of the photographs, recorded for dppredict)")
                                  : std::string(" (from photographs of several sizes: no scale "
                                                "recorded; dppredict --scale gives one)"))
            << ", pos_weight " << r.pos_weight << "\n"
            << kProgram << ": train mean " << triple(r.mean) << ", std " << triple(r.std)
            << " (RGB)\n";
  if (r.tiled) {
    std::cout << kProgram << ": " << r.train + r.val << " tiles from " << r.sources << " image(s); "
              << r.tiles_dropped << " below --min-crack-fraction dropped\n";
  }
  if (r.skipped_images + r.skipped_masks > 0) {
    std::cout << kProgram << ": skipped " << r.skipped_images << " image(s) without a mask and "
              << r.skipped_masks << " mask(s) without an image\n";
  }
  if (r.ignored_files > 0) {
    std::cout << kProgram << ": ignored " << r.ignored_files
              << " file(s) that are hidden or not .jpg/.jpeg/.png/.tif/.tiff/.bmp\n";
  }
  return kExitOk;
}

std::string chunk_text(const std::vector<int64_t>& chunk, const std::vector<int64_t>& sample) {
  if (chunk.empty()) return "contiguous";
  std::string s = "[";
  for (size_t i = 0; i < chunk.size(); ++i) s += dp::str_cat(i ? "," : "", chunk[i]);
  s += "]";
  bool per_sample = chunk.size() == sample.size() + 1 && chunk[0] == 1;
  for (size_t i = 0; per_sample && i < sample.size(); ++i) per_sample = chunk[i + 1] == sample[i];
  return per_sample ? s + " (one per sample)" : s;
}

// dpprep info's command line.
struct InfoCommand {
  std::string file;
};

const dp::app::OptionTable<InfoCommand>& info_options() {
  static const dp::app::OptionTable<InfoCommand> table = [] {
    dp::app::OptionTable<InfoCommand> t;
    t.command_line("Options", "help,h", "show this help");
    t.value("", "file", &InfoCommand::file, "the dataset").no_default();
    return t;
  }();
  return table;
}

int run_info(const std::vector<std::string>& args) {
  InfoCommand c;
  if (!parse_command(
          args, info_options(), c,
          "Usage: dpprep info FILE\n"
          "Checks a dataset v1 file (layout, attributes, every mask value) and describes "
          "it;\nexits non-zero with the reason if it is not a valid v1 dataset.",
          {"file", 1})) {
    return kExitOk;
  }
  if (c.file.empty()) throw UsageError("no FILE given (usage: dpprep info FILE)");
  const std::string& path = c.file;
  catch_interrupts();
  Progress progress;
  const dp::data::DatasetInfo info = dp::data::inspect_dataset(
      path, [&](const char* phase, int64_t done, int64_t total) { progress(phase, done, total); });
  progress.end_line();
  std::cout << path << ": valid dataset (format " << info.format << ")\n"
            << "  pos_weight  " << info.pos_weight
            << " (background / crack pixels over the training masks)\n";
  if (info.has_stats) {
    std::cout << "  mean (RGB)  " << triple(info.mean) << "\n  std (RGB)   " << triple(info.std)
              << "\n";
  } else {
    std::cout << "  mean, std   absent (--normalize dataset is not available)\n";
  }
  for (const dp::data::SplitInfo& s : info.splits) {
    std::cout << "  " << s.name << ": " << s.count << " samples of " << s.height << "x" << s.width
              << " (HxW); " << s.with_cracks << " (" << percent(s.with_cracks, s.count)
              << ") with cracks; crack pixels " << percent(s.crack_pixels, s.pixels) << "\n"
              << "    images uint8 [" << s.count << "," << s.height << "," << s.width
              << ",3] chunks " << chunk_text(s.image_chunk, {s.height, s.width, 3}) << ", gzip "
              << (s.gzip_level > 0 ? std::to_string(s.gzip_level) : std::string("none")) << "\n"
              << "    masks  uint8 [" << s.count << "," << s.height << "," << s.width << "] chunks "
              << chunk_text(s.mask_chunk, {s.height, s.width}) << "\n";
    if (s.native_height > 0) {
      std::cout << "    native_masks uint8 [" << s.count << "," << s.native_height << ","
                << s.native_width << "]: the masks at the photographs' size, which dptrain's "
                << "validation scores against\n";
    }
    if (s.sources > 0) {
      std::cout << "    source, origin: the file and position of each sample, from " << s.sources
                << " source image(s)\n";
    }
  }
  for (const auto& [name, value] : info.attributes) {
    std::cout << "  " << name << " = " << value << "\n";
  }
  return kExitOk;
}

const Command kCommands[] = {
    {"build", "build a dataset from folders of images and masks (JPEG, PNG, TIFF, BMP)", run_build},
    {"info", "check a dataset file and describe it", run_info},
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
  return dp::app::run_program(kProgram, [&] {
    try {
      return run(argc, argv);
    } catch (const Interrupted& e) {  // the signal's exit status, as the shell gives it
      std::cerr << kProgram << ": error: " << e.what() << "\n";
      return kExitSignalBase + e.signal();
    }
  });
}
