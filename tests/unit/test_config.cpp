// dptrain's --config FILE (INI; the command line overrides it; unknown keys name the file and
// key) and --help grouped by topic.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <variant>

#include "option_table.hpp"
#include "test_util.hpp"
#include "train/checkpoints.hpp"
#include "train/loss.hpp"
#include "train/options.hpp"

namespace dp {
namespace {

std::optional<app::TrainOptions> parse(std::vector<const char*> args, bool print_help = false) {
  args.insert(args.begin(), "dptrain");
  return app::parse_train_options(int(args.size()), args.data(), print_help);
}

std::string usage_error(std::vector<const char*> args) {
  try {
    parse(std::move(args));
  } catch (const app::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

// Without --lr each optimiser starts from its own rate (AdamW at SGD's 0.05 diverges), AdamW's
// by the scale of the initial weights (--weight-init).
TEST(Config, LearningRateDefaultsPerOptimizerAndInit) {
  EXPECT_EQ(parse({})->optimizer, app::OptimizerKind::kAdamW);
  EXPECT_EQ(parse({})->weight_init, ModelConfig::ReluInit::kHe);
  EXPECT_EQ(parse({})->lr, 3e-3);
  EXPECT_EQ(parse({"--weight-init", "pytorch"})->lr, 1e-3);
  EXPECT_EQ(parse({"--optimizer", "sgd"})->lr, 0.05);
  EXPECT_EQ(parse({"--optimizer", "sgd", "--weight-init", "pytorch"})->lr, 0.05);
  EXPECT_EQ(parse({"--optimizer", "adamw"})->lr, 3e-3);
  EXPECT_EQ(parse({"--optimizer", "adamw", "--lr", "0.01"})->lr, 0.01);
  EXPECT_EQ(parse({"--weight-init", "pytorch", "--lr", "0.004"})->lr, 0.004);
  EXPECT_EQ(parse({"--optimizer", "sgd", "--lr", "0.2"})->lr, 0.2);
  test::TempDir dir;
  const std::string path = dir.file("adamw.ini");
  std::ofstream(path) << "optimizer = adamw\nweight-init = pytorch\n";
  EXPECT_EQ(parse({"--config", path.c_str()})->lr, 1e-3);
  EXPECT_NE(parse({"--optimizer", "adamw"})->describe().find("lr = 0.003\n"), std::string::npos);
  EXPECT_NE(parse({})->describe().find("weight_init = he\n"), std::string::npos);
  EXPECT_EQ(usage_error({"--weight-init", "xavier"}),
            "--weight-init must be he or pytorch, got 'xavier'");
}

TEST(Config, IniValuesWithTheCommandLineWinning) {
  test::TempDir dir;
  const std::string path = dir.file("run.ini");
  std::ofstream(path) << "# a comment\nlr = 0.125\nbatch-size = 3\noptimizer = adamw\n"
                         "cache = true\nepochs = 7\ntensorboard = 1\n";
  const auto o = parse({"--config", path.c_str(), "--epochs", "9"});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->lr, 0.125);
  EXPECT_EQ(o->batch_size, 3);
  EXPECT_EQ(o->optimizer, app::OptimizerKind::kAdamW);
  EXPECT_TRUE(o->cache);
  EXPECT_TRUE(o->tensorboard);  // a switch spelt as 1
  EXPECT_FALSE(parse({})->tensorboard);
  EXPECT_EQ(o->epochs, 9);  // the command line overrides the file
  EXPECT_EQ(o->config, path);
  EXPECT_NE(o->describe().find("lr = 0.125\n"), std::string::npos);
  EXPECT_NE(o->describe().find("epochs = 9\n"), std::string::npos);
}

TEST(Config, LossChoices) {
  EXPECT_EQ(parse({})->loss, "bce+dice");  // docs/real-data.md
  EXPECT_EQ(parse({"--loss", "bce"})->loss, "bce");
  EXPECT_EQ(parse({"--loss", "bce+dice", "--pos-weight"})->loss, "bce+dice");
  EXPECT_EQ(parse({"--loss", "focal", "--focal-gamma", "0"})->focal_gamma, 0.0);
  EXPECT_EQ(usage_error({"--loss", "lovasz"}),
            "--loss must be bce, dice, bce+dice, focal, bce+cldice, dice+cldice or "
            "bce+dice+cldice, got 'lovasz'");
  EXPECT_EQ(usage_error({"--loss", "cldice+bce"}),
            "--loss must be bce, dice, bce+dice, focal, bce+cldice, dice+cldice or "
            "bce+dice+cldice, got 'cldice+bce'");
  // clDice terms: BCE keeps its class weight; the weight and iterations are checked.
  EXPECT_EQ(parse({"--loss", "bce+dice+cldice"})->pos_weight, "sqrt");
  EXPECT_EQ(parse({"--loss", "dice+cldice"})->pos_weight, "none");
  EXPECT_NE(usage_error({"--loss", "dice+cldice", "--pos-weight"}).find("--pos-weight weights BCE"),
            std::string::npos);
  EXPECT_EQ(usage_error({"--cldice-weight", "0"}), "--cldice-weight must be positive, got 0");
  EXPECT_EQ(usage_error({"--cldice-iterations", "0"}),
            "--cldice-iterations must be in [1, 32], got 0");
  EXPECT_EQ(usage_error({"--cldice-start-epoch", "0"}),
            "--cldice-start-epoch must be at least 1, got 0");
  EXPECT_NE(usage_error({"--loss", "focal", "--pos-weight"}).find("--focal-alpha"),
            std::string::npos);
  EXPECT_NE(usage_error({"--focal-gamma", "-1"}).find("--focal-gamma must be >= 0"),
            std::string::npos);
  EXPECT_NE(parse({"--loss", "dice"})->describe().find("loss = dice\n"), std::string::npos);
}

TEST(Config, PosWeightTakesARuleOrANumber) {
  // The square root of the class ratio with the default recipe (He, AdamW), class-balanced with
  // the earlier ones (docs/real-data.md); nothing to weight in dice or focal.
  EXPECT_EQ(parse({})->pos_weight, "sqrt");
  EXPECT_EQ(parse({"--loss", "bce"})->pos_weight, "sqrt");
  EXPECT_EQ(parse({"--weight-init", "pytorch"})->pos_weight, "dataset");
  EXPECT_EQ(parse({"--optimizer", "sgd"})->pos_weight, "dataset");
  EXPECT_EQ(parse({"--optimizer", "sgd", "--loss", "dice"})->pos_weight, "none");
  EXPECT_EQ(parse({"--loss", "dice"})->pos_weight, "none");
  EXPECT_EQ(parse({"--loss", "focal"})->pos_weight, "none");
  EXPECT_EQ(parse({"--pos-weight", "none"})->pos_weight, "none");
  EXPECT_EQ(parse({"--pos-weight", "1.0"})->pos_weight, "none");
  EXPECT_EQ(parse({"--pos-weight"})->pos_weight, "dataset");  // the switch it used to be
  EXPECT_EQ(parse({"--pos-weight=sqrt"})->pos_weight, "sqrt");
  EXPECT_EQ(parse({"--pos-weight", "sqrt"})->pos_weight, "sqrt");
  EXPECT_EQ(parse({"--pos-weight", "4.5", "--loss", "bce"})->pos_weight, "4.5");
  for (const std::string bad : {"-1", "0", "inf", "nan", "3x", "auto"})
    EXPECT_EQ(usage_error({("--pos-weight=" + bad).c_str()}),
              std::string("--pos-weight must be none, dataset, sqrt or a positive number, got '") +
                  bad + "'")
        << bad;
  EXPECT_NE(usage_error({"--loss", "dice", "--pos-weight", "sqrt"}).find("a --loss that has bce"),
            std::string::npos);
  EXPECT_EQ(app::Loss::crack_weight("none", 64.0f), 1.0f);
  EXPECT_EQ(app::Loss::crack_weight("dataset", 64.0f), 64.0f);
  EXPECT_EQ(app::Loss::crack_weight("sqrt", 64.0f), 8.0f);
  EXPECT_EQ(app::Loss::crack_weight("2.5", 64.0f), 2.5f);
  EXPECT_EQ(app::Loss::crack_weight("-2", 64.0f), 0.0f);
}

TEST(Config, UnknownKeysBadValuesAndMissingFilesNameTheFile) {
  test::TempDir dir;
  const std::string path = dir.file("bad.ini");
  std::ofstream(path) << "lr = 0.1\nlearning-rate = 0.2\n";
  std::string e = usage_error({"--config", path.c_str()});
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("learning-rate"), std::string::npos) << e;
  std::ofstream(path) << "batch-size = many\n";
  e = usage_error({"--config", path.c_str()});
  EXPECT_NE(e.find(path), std::string::npos) << e;
  std::ofstream(path) << "batch-size = 0\n";  // validated like the command line
  EXPECT_NE(usage_error({"--config", path.c_str()}).find("--batch-size"), std::string::npos);
  std::ofstream(path) << "config = other.ini\n";
  EXPECT_NE(usage_error({"--config", path.c_str()}).find("command line only"), std::string::npos);
  const std::string missing = dir.file("missing.ini");
  e = usage_error({"--config", missing.c_str()});
  EXPECT_NE(e.find(missing), std::string::npos) << e;
}

TEST(Config, HelpIsGroupedByTopic) {
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  const auto o = parse({"--help"}, true);
  std::cout.rdbuf(old);
  EXPECT_FALSE(o.has_value());
  const std::string help = captured.str();
  size_t at = 0;
  for (const char* topic :
       {"Data:", "Model:", "Optimisation:", "Distributed:", "Checkpointing:", "Output:"}) {
    const size_t found = help.find(std::string("\n") + topic, at);
    EXPECT_NE(found, std::string::npos) << topic << "\n" << help;
    if (found != std::string::npos) at = found;
  }
  for (const char* option : {"--config", "--optimizer", "--save-every", "--keep-last",
                             "--lr-schedule", "--clip-grad-norm", "--log-every"})
    EXPECT_NE(help.find(option), std::string::npos) << option;
  // Defaults print as written, not as their nearest doubles (0.90000000000000002).
  for (const char* noise : {"00000000", "99999999"})
    EXPECT_EQ(help.find(noise), std::string::npos) << help;
}

// What checkpoints record: every line of the printed configuration as a typed value (integers,
// numbers, words) that prints as that line does.
TEST(Config, TypedValuesAreThePrintedConfiguration) {
  const auto o = parse({"--epochs", "7", "--lr", "0.002", "--loss", "bce", "--ema", "0.9"});
  ASSERT_TRUE(o.has_value());
  const std::map<std::string, OptionValue> typed = o->values();
  EXPECT_EQ(std::get<int64_t>(typed.at("epochs")), 7);
  EXPECT_EQ(std::get<double>(typed.at("lr")), 0.002);
  EXPECT_EQ(std::get<double>(typed.at("ema")), 0.9);
  EXPECT_EQ(std::get<std::string>(typed.at("loss")), "bce");
  EXPECT_EQ(std::get<std::string>(typed.at("optimizer")), "adamw");
  std::istringstream lines(o->describe());
  size_t count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    const size_t eq = line.find(" = ");
    ASSERT_NE(eq, std::string::npos) << line;
    const auto it = typed.find(line.substr(0, eq));
    ASSERT_NE(it, typed.end()) << line;
    EXPECT_EQ(std::visit([](const auto& v) { return app::option_text(v); }, it->second),
              line.substr(eq + 3))
        << line;
  }
  EXPECT_EQ(count, typed.size());
}

// A checkpoint from before the typed values: its options text read back, typed.
TEST(Config, OlderCheckpointsOptionsTextReadsBackTyped) {
  CheckpointMeta meta;
  meta.options = "epochs = 15\nlr = 0.003\nloss = bce\npos_weight = 1\nmodel_dir = runs/a b\n";
  const std::map<std::string, OptionValue> was = app::recorded_options(meta);
  EXPECT_EQ(std::get<int64_t>(was.at("epochs")), 15);
  EXPECT_EQ(std::get<double>(was.at("lr")), 0.003);
  EXPECT_EQ(std::get<std::string>(was.at("loss")), "bce");
  EXPECT_EQ(std::get<int64_t>(was.at("pos_weight")), 1);
  EXPECT_EQ(std::get<std::string>(was.at("model_dir")), "runs/a b");
  meta.option_values = {{"lr", 0.001}};  // recorded values win over the text
  EXPECT_EQ(app::recorded_options(meta), meta.option_values);
}

}  // namespace
// The loss's terms: bce+dice+cldice is the sum of the backend's three terms (clDice weighted),
// and the clDice term joins at --cldice-start-epoch (epochs before it are bce+dice alone).
TEST(Config, LossSumsItsTermsAndStartsClDiceAtItsEpoch) {
  const std::unique_ptr<Backend> be = make_cpu_backend();
  const int images = 2, h = 8, w = 6;
  const size_t n = size_t(images) * h * w;
  std::vector<float> x(n), t(n, 0.0f), dx(n), dx_parts(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(int(i * 7 % 11) - 5) * 0.4f;
  for (int im = 0; im < images; ++im)
    for (int y = 0; y < h; ++y) t[size_t(im * h * w + y * w + 2 + im)] = 1.0f;  // a line
  auto options =
      parse({"--loss", "bce+dice+cldice", "--cldice-weight", "0.5", "--cldice-start-epoch", "3"});
  app::Loss loss(*options, 4.0f);
  const int64_t pixels = int64_t(h) * w, count = int64_t(n);
  const double bce = be->bce_with_logits(count, x.data(), t.data(), 4.0f, 0.0f, dx_parts.data());
  const double dice = double(pixels) * be->dice_with_logits(images, pixels, x.data(), t.data(),
                                                            1.0f, 0.0f, dx_parts.data(), true);
  const double cldice = double(pixels) * 0.5 *
                        be->soft_cldice_with_logits(images, h, w, x.data(), t.data(), 3, 1.0f, 0.0f,
                                                    dx_parts.data(), true);
  ASSERT_GT(cldice, 0.0);
  for (const int64_t epoch : {0, 1, 2, 5}) {
    loss.set_epoch(epoch);
    const double got = loss.sum(*be, images, h, w, x.data(), t.data(), images, dx.data());
    const double want = bce + dice + (epoch >= 2 ? cldice : 0.0);
    EXPECT_NEAR(got, want, 1e-9 * want) << "epoch " << epoch;
  }
}

}  // namespace dp
