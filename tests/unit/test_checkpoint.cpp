// Checkpoint v1: exact round trip, atomic write, corruption and mismatch detection, listing.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dp/checkpoint.hpp"
#include "dp/error.hpp"
#include "dp/model.hpp"
#include "dp/optim.hpp"
#include "test_util.hpp"

namespace dp {
namespace {

struct Fixture {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model;
  std::unique_ptr<Sgd> sgd;
  explicit Fixture(int divisor = 8, uint64_t seed = 1) {
    ModelConfig c;
    c.width_divisor = divisor;
    model = make_model(c, *be);
    model->params().initialize(seed);
    sgd = std::make_unique<Sgd>(model->params(), *be, SgdOptions{});
    for (int64_t i = 0; i < model->params().arena_size(); ++i)
      sgd->momentum()[i] = 0.001f * float(i % 977);
  }
};

CheckpointMeta sample_meta() {
  CheckpointMeta m;
  m.epoch = 3;
  m.step = 120;
  m.model = "unet16";
  m.width_divisor = 8;
  m.height = m.width = 64;
  m.scale_y = 0.5;
  m.scale_x = 0.470588;
  m.world_size = 2;
  m.global_batch = 8;
  m.seed = 42;
  m.lr = 0.05;
  m.best_valid_loss = 0.25;
  m.best_epoch = 2;
  m.options = "lr = 0.05\n";
  m.train_loss = {0.5, 0.4, 0.3};
  m.valid_loss = {0.45, 0.25, 0.26};
  m.valid_iou = {0.1, 0.2, 0.3};
  m.epoch_seconds = {1, 2, 3};
  return m;
}

TEST(Checkpoint, RoundTripIsExact) {
  test::TempDir dir;
  Fixture a, b(8, 2);
  const std::string path = dir.file("model_epoch_3.h5");
  save_checkpoint(path, a.model->params(), a.sgd->momentum(), sample_meta());
  // Nothing but the checkpoint is left in the directory (the temporary was renamed).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
  const CheckpointMeta m = load_checkpoint(path, b.model->params(), b.sgd->momentum());
  const size_t bytes = size_t(a.model->params().arena_size()) * sizeof(float);
  EXPECT_EQ(0, std::memcmp(a.model->params().values(), b.model->params().values(), bytes));
  EXPECT_EQ(0, std::memcmp(a.sgd->momentum(), b.sgd->momentum(), bytes));
  const CheckpointMeta e = sample_meta();
  EXPECT_EQ(m.epoch, e.epoch);
  EXPECT_EQ(m.step, e.step);
  EXPECT_EQ(m.model, e.model);
  EXPECT_EQ(m.width_divisor, e.width_divisor);
  EXPECT_EQ(m.scale_y, e.scale_y);
  EXPECT_EQ(m.scale_x, e.scale_x);
  EXPECT_EQ(m.best_epoch, e.best_epoch);
  EXPECT_DOUBLE_EQ(m.best_valid_loss, e.best_valid_loss);
  EXPECT_EQ(m.options, e.options);
  EXPECT_EQ(m.valid_iou, e.valid_iou);
  EXPECT_EQ(m.epoch_seconds, e.epoch_seconds);
}

// The configuration's typed values round-trip with their types; older files have none.
TEST(Checkpoint, TypedOptionsRoundTrip) {
  test::TempDir dir;
  Fixture a;
  CheckpointMeta meta = sample_meta();
  meta.option_values = {{"epochs", int64_t(15)}, {"lr", 0.003}, {"loss", std::string("bce+dice")}};
  save_checkpoint(dir.file("typed.h5"), a.model->params(), nullptr, meta);
  EXPECT_EQ(read_checkpoint_meta(dir.file("typed.h5")).option_values, meta.option_values);
  save_checkpoint(dir.file("untyped.h5"), a.model->params(), nullptr, sample_meta());
  EXPECT_TRUE(read_checkpoint_meta(dir.file("untyped.h5")).option_values.empty());
}

// The input statistics are typed attributes (3 values each), absent from files written before.
TEST(Checkpoint, NormalizationStatisticsRoundTrip) {
  test::TempDir dir;
  Fixture a;
  CheckpointMeta meta = sample_meta();
  meta.normalize_mean = {0.123456789, 0.5, 1.0 / 3};
  meta.normalize_std = {0.2, 0.0039215689, 0.7};
  save_checkpoint(dir.file("typed.h5"), a.model->params(), nullptr, meta);
  const CheckpointMeta m = read_checkpoint_meta(dir.file("typed.h5"));
  EXPECT_EQ(m.normalize_mean, meta.normalize_mean);
  EXPECT_EQ(m.normalize_std, meta.normalize_std);
  save_checkpoint(dir.file("untyped.h5"), a.model->params(), nullptr, sample_meta());
  EXPECT_TRUE(read_checkpoint_meta(dir.file("untyped.h5")).normalize_mean.empty());
  meta.normalize_std.pop_back();
  save_checkpoint(dir.file("short.h5"), a.model->params(), nullptr, meta);
  EXPECT_THROW(read_checkpoint_meta(dir.file("short.h5")), Error);
}

TEST(Checkpoint, BatchNormBuffersRoundTrip) {
  test::TempDir dir;
  auto be = make_cpu_backend();
  ModelConfig c;
  c.name = "unet_resnet34";
  c.width_divisor = 32;
  auto a = make_model(c, *be), b = make_model(c, *be);
  a->params().initialize(1);
  ParamStore& bufs = a->buffers();
  ASSERT_FALSE(bufs.views().empty());
  for (const ParamView& v : bufs.views())  // not the arena's zero padding, which is not stored
    for (int64_t i = 0; i < v.numel; ++i) v.value[i] = 0.5f + 0.25f * float((v.offset + i) % 7);
  const std::string path = dir.file("model_epoch_1.h5");
  save_checkpoint(path, a->params(), nullptr, sample_meta(), &bufs);
  load_checkpoint(path, b->params(), nullptr, &b->buffers());
  EXPECT_EQ(0, std::memcmp(bufs.values(), b->buffers().values(),
                           size_t(bufs.arena_size()) * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a->params().values(), b->params().values(),
                           size_t(a->params().arena_size()) * sizeof(float)));
  // The statistics are part of the model: refusing to drop them silently.
  EXPECT_THROW(load_checkpoint(path, b->params(), nullptr, nullptr), Error);
}

// Flips one byte of the file where the 8 floats at `values` are stored (found by their bytes).
void damage(const std::string& path, const float* values) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(values), 32));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] = char(bytes[at + 5] ^ 0x40);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(Checkpoint, DetectsCorruption) {
  test::TempDir dir;
  Fixture a, b;
  const std::string path = dir.file("model_epoch_1.h5");
  save_checkpoint(path, a.model->params(), a.sgd->momentum(), sample_meta());
  damage(path, a.model->params().find("conv1.0.weight")->value);  // a byte of conv1.0.weight
  try {
    load_checkpoint(path, b.model->params(), b.sgd->momentum());
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// A weights-only read (dppredict, dpexport) reads and verifies only the weights it keeps, through
// the file's partial checksums: damage in the optimiser state stops a resume but not a
// weights-only read, damage in the averaged weights only the reads that take them, damage in the
// raw weights every read but dppredict's averaged one (into the model's own arena); a file
// without the partial checksums (an older dptrain's) is verified whole.
TEST(Checkpoint, WeightsOnlyReadsVerifyTheWeightsTheyKeep) {
  test::TempDir dir;
  Fixture a, b(8, 2);
  ParamStore& params = a.model->params();
  const size_t n = size_t(params.arena_size()), bytes = n * sizeof(float);
  std::vector<float> avg(n), into(n);
  for (const ParamView& v : params.views())  // the arena's padding stays 0, as in a model's
    for (int64_t i = v.offset; i < v.offset + v.numel; ++i)
      avg[size_t(i)] = 0.5f - 0.0007f * float(i % 613);
  const AveragedWeights averaged{avg.data(), nullptr}, into_avg{into.data(), nullptr};
  const size_t at = size_t(params.find("conv1.0.weight")->offset);
  struct Damaged {
    std::string name;
    const float* values;
    bool resume, raw, averaged;  // which reads succeed
  };
  const Damaged cases[] = {{"state", a.sgd->momentum() + at, false, true, true},
                           {"averaged", avg.data() + at, false, true, false},
                           {"raw", params.values() + at, false, false, true}};
  const auto loads = [&](const std::string& path, const OptimizerState& state,
                         const AveragedWeights* av) {
    try {
      load_checkpoint(path, b.model->params(), state, nullptr, av);
      return true;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
      return false;
    }
  };
  for (const Damaged& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name + ".h5");
    save_checkpoint(path, params, a.sgd->state(), sample_meta(), nullptr, &averaged);
    damage(path, c.values);
    EXPECT_EQ(loads(path, b.sgd->state(), nullptr), c.resume);
    std::fill(b.model->params().values(), b.model->params().values() + n, 0.0f);
    EXPECT_EQ(loads(path, OptimizerState{}, nullptr), c.raw);
    if (c.raw) {
      EXPECT_EQ(0, std::memcmp(b.model->params().values(), params.values(), bytes));
    }
    // As dppredict: the averaged weights into the model's own arena, the raw ones never read.
    std::fill(b.model->params().values(), b.model->params().values() + n, 0.0f);
    const AveragedWeights into_model{b.model->params().values(), nullptr};
    EXPECT_EQ(loads(path, OptimizerState{}, &into_model), c.averaged);
    if (c.averaged) {
      EXPECT_EQ(0, std::memcmp(b.model->params().values(), avg.data(), bytes));
    }
    // Both (arenas of their own): both verified.
    std::fill(into.begin(), into.end(), 0.0f);
    EXPECT_EQ(loads(path, OptimizerState{}, &into_avg), c.raw && c.averaged);
    if (c.raw && c.averaged) {
      EXPECT_EQ(0, std::memcmp(into.data(), avg.data(), bytes));
      EXPECT_EQ(0, std::memcmp(b.model->params().values(), params.values(), bytes));
    }
  }
  // Without the partial checksums the whole file is read and verified: the damaged state counts.
  const std::string old = dir.file("old.h5");
  std::filesystem::copy_file(dir.file("state.h5"), old);
  const hid_t file = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_GE(H5Adelete(file, "checksum_weights"), 0);
  EXPECT_GE(H5Adelete(file, "checksum_averaged"), 0);
  H5Fclose(file);
  EXPECT_FALSE(loads(old, OptimizerState{}, nullptr));
  const AveragedWeights into_model{b.model->params().values(), nullptr};
  EXPECT_FALSE(loads(old, OptimizerState{}, &into_model));
}

TEST(Checkpoint, TruncatedAndForeignFilesAreClearErrors) {
  test::TempDir dir;
  Fixture a;
  const std::string path = dir.file("model_epoch_1.h5");
  save_checkpoint(path, a.model->params(), a.sgd->momentum(), sample_meta());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  EXPECT_THROW(load_checkpoint(path, a.model->params(), a.sgd->momentum()), Error);
  const std::string text = dir.file("notes.h5");
  std::ofstream(text) << "not hdf5";
  try {
    read_checkpoint_meta(text);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_checkpoint_meta(dir.file("missing.h5")), Error);
}

TEST(Checkpoint, RejectsAnotherModelShape) {
  test::TempDir dir;
  Fixture a(8), wide(4);
  const std::string path = dir.file("model_epoch_1.h5");
  save_checkpoint(path, a.model->params(), a.sgd->momentum(), sample_meta());
  try {
    load_checkpoint(path, wide.model->params(), wide.sgd->momentum());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different shape"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, WeightsOnlyFileCannotResumeTraining) {
  test::TempDir dir;
  Fixture a;
  const std::string path = dir.file("weights.h5");
  save_checkpoint(path, a.model->params(), nullptr, sample_meta());
  EXPECT_NO_THROW(load_checkpoint(path, a.model->params(), nullptr));
  EXPECT_THROW(load_checkpoint(path, a.model->params(), a.sgd->momentum()), Error);
}

TEST(Checkpoint, ListsEpochFilesNewestFirst) {
  test::TempDir dir;
  // A number too long for int64 is not a name dptrain writes: ignored, not an exception.
  for (const char* name :
       {"model_epoch_2.h5", "model_epoch_10.h5", "model_epoch_1.h5", "model_epoch_2_step_5.h5",
        "model_best.h5", "model_epoch_3.h5.tmp.123", "other.txt",
        "model_epoch_99999999999999999999.h5", "model_epoch_4_step_99999999999999999999.h5"})
    std::ofstream(dir.file(name)) << "x";
  const auto found = list_checkpoints(dir.path());
  ASSERT_EQ(found.size(), 4u);
  const std::vector<std::pair<int64_t, int64_t>> expected = {{10, 0}, {2, 5}, {2, 0}, {1, 0}};
  for (size_t i = 0; i < found.size(); ++i)
    EXPECT_EQ(std::pair(found[i].epoch, found[i].step), expected[i]) << found[i].path;
  EXPECT_EQ(found[1].path, dir.file("model_epoch_2_step_5.h5"));
  EXPECT_TRUE(list_checkpoints(dir.file("absent")).empty());
}

}  // namespace
}  // namespace dp
