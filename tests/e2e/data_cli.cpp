// dpprep and dptrain --data under mpiexec: image folders end to end, one test per bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/dataset.hpp"
#include "dp/image_io.hpp"
#include "prep_util.hpp"
#include "test_util.hpp"
#include "train/options.hpp"

namespace dp {
namespace {

using dp::test::contains;

namespace fs = std::filesystem;

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class DataCli : public ::testing::Test {
 protected:
  test::CommandResult dpprep(const std::string& args) const {
    return test::run_command(std::string(test::program("dpprep")) + " " + args);
  }
  test::CommandResult dptrain(int np, const std::string& data, const std::string& extra = "") {
    return test::run_command(test::mpiexec() + " -n " + std::to_string(np) + " " +
                             test::program("dptrain") + " --data " + data + " --model-dir " +
                             dir_.file("run") + " --width-divisor 16 --batch-size 2 --epochs 1 " +
                             extra);
  }
  // Without a validation split unless the test asks for one (3 pairs have none to spare).
  std::string build_args() const {
    return "build --images " + dir_.file("images") + " --masks " + dir_.file("masks") + " --out " +
           dir_.file("out.h5") + " --val-fraction 0";
  }
  // Exactly one "<program>: error:" line, containing every part; the exit status; and no
  // dataset or checkpoint file left behind.
  void expect_error(const test::CommandResult& r, const char* program, int status,
                    const std::vector<std::string>& parts) const {
    if (status >= 0) {
      EXPECT_EQ(r.status, status) << r.output;
    } else {
      EXPECT_NE(r.status, 0) << r.output;
    }
    const std::string tag = std::string(program) + ": error:";
    EXPECT_EQ(count(r.output, tag), 1) << r.output;
    const size_t at = r.output.find(tag);
    const std::string line =
        at == std::string::npos ? "" : r.output.substr(at, r.output.find('\n', at) - at);
    for (const std::string& p : parts)
      EXPECT_TRUE(contains(line, p)) << "'" << p << "' in " << line;
    EXPECT_FALSE(fs::exists(dir_.file("out.h5")));
    for (const auto& e : fs::directory_iterator(dir_.path()))
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
    // Nothing but the --model-dir lock file, which a job ended by MPI_Abort (an error one rank
    // saw mid-epoch) leaves behind, unlocked.
    if (fs::exists(dir_.file("run"))) {
      for (const auto& e : fs::directory_iterator(dir_.file("run"))) {
        EXPECT_EQ(e.path().filename(), ".dptrain.lock") << "written: " << e.path();
      }
    }
  }
  std::string raw(const std::string& name, const test::RawDataset& r) const {
    test::write_raw_dataset(dir_.file(name), r);
    return dir_.file(name);
  }
  test::PairFolderOptions pairs(int n) const {
    test::PairFolderOptions o;
    o.count = n;
    o.width = o.height = 32;
    return o;
  }
  test::TempDir dir_;
};

// ---------------------------------------------------------------------------------------------
// End to end

TEST_F(DataCli, JpegPngFoldersThroughBuildInfoAndTrainingOnTwoRanks) {
  test::PairFolderOptions o;
  o.count = 14;
  o.negatives = 4;      // stratified: 1 of the 4 without cracks and 3 of the 12 with go to val
  o.jpeg_masks = true;  // like the reference dataset: masks are JPEGs, not strictly 0/255
  test::write_pairs(dir_.path(), o);
  o.count = 2;  // and a few PNG masks
  o.negatives = 0;
  o.jpeg_masks = false;
  o.prefix = "png";
  test::write_pairs(dir_.path(), o);
  std::ofstream(dir_.file("images/README.txt")) << "not an image";

  auto r = dpprep("build --images " + dir_.file("images") + " --masks " + dir_.file("masks") +
                  " --out " + dir_.file("out.h5") + " --val-fraction 0.25 --seed 2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dpprep: wrote " + dir_.file("out.h5") + ": train 12"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "val 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "ignored 1 file(s)")) << r.output;

  r = dpprep("info " + dir_.file("out.h5"));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* part : {"valid dataset (format dp-crack-v1)", "train: 12 samples of 64x64",
                           "val: 4 samples of 64x64", "[1,64,64,3] (one per sample)", "pos_weight",
                           "mean (RGB)", "mask_threshold = 127"})
    EXPECT_TRUE(contains(r.output, part)) << part << " in\n" << r.output;
  EXPECT_FALSE(contains(r.output, "native_masks")) << r.output;
  // Resized, the validation split keeps its masks at the photographs' size too.
  r = dpprep("build --images " + dir_.file("images") + " --masks " + dir_.file("masks") +
             " --out " + dir_.file("resized.h5") + " --val-fraction 0.25 --seed 2 --resize 32x32");
  ASSERT_EQ(r.status, 0) << r.output;
  r = dpprep("info " + dir_.file("resized.h5"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "native_masks uint8 [4,64,64]"), 1) << r.output;

  r = dptrain(2, dir_.file("out.h5"),
              "--workers 2 --cache --augment full --normalize dataset --log-every 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "epoch 1/1"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "12 train, 4 val images of 64x64")) << r.output;
  EXPECT_TRUE(contains(r.output, "2 worker(s)") && contains(r.output, "cache")) << r.output;
  EXPECT_TRUE(fs::exists(dir_.file("run/model_epoch_1.h5")));
  // The checkpoint records the dataset's statistics, which training used, as typed attributes.
  const CheckpointMeta meta = read_checkpoint_meta(dir_.file("run/model_epoch_1.h5"));
  const data::Dataset ds(dir_.file("out.h5"), "train");
  ASSERT_EQ(meta.normalize_mean.size(), 3u);
  ASSERT_EQ(meta.normalize_std.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(float(meta.normalize_mean[c]), ds.mean()[c]) << c;
    EXPECT_EQ(float(meta.normalize_std[c]), ds.std()[c]) << c;
  }
}

// ---------------------------------------------------------------------------------------------
// dpprep build: bad input

TEST_F(DataCli, BuildRejectsAFileThatIsNoImage) {
  test::write_pairs(dir_.path(), pairs(3));
  std::ofstream(dir_.file("images/img001.jpg")) << "<html>not a JPEG</html>";
  expect_error(dpprep(build_args()), "dpprep", 1,
               {dir_.file("images/img001.jpg"), "neither JPEG nor PNG"});
}

// Boost.Program_options 1.74 loops forever formatting the error about a value holding one of its
// own placeholders: such an argument is refused first (timeout: a regression fails, not hangs).
TEST_F(DataCli, ABoostPlaceholderInAnArgumentIsAnErrorNotAHang) {
  expect_error(
      test::run_command("timeout 60 " + std::string(test::program("dpprep")) + " build --images " +
                        dir_.file("images") + " --masks m --out o --gzip %value%"),
      "dpprep", 2, {"argument '%value%': '%value%' is not allowed in options"});
}

TEST_F(DataCli, BuildRejectsAnUnreadableImage) {
  test::write_pairs(dir_.path(), pairs(3));
  fs::remove(dir_.file("images/img002.jpg"));
  fs::create_symlink(dir_.file("nowhere.jpg"), dir_.file("images/img002.jpg"));  // dangling
  expect_error(dpprep(build_args()), "dpprep", 1, {dir_.file("images/img002.jpg"), "No such file"});
}

TEST_F(DataCli, BuildRejectsACorruptMask) {
  test::write_pairs(dir_.path(), pairs(3));
  const std::string mask = dir_.file("masks/img000.png");
  fs::resize_file(mask, 40);  // signature and part of the header
  expect_error(dpprep(build_args()), "dpprep", 1, {mask, "PNG"});
}

TEST_F(DataCli, BuildRejectsATruncatedJpeg) {
  test::PairFolderOptions o = pairs(3);
  o.width = o.height = 96;  // the cut below leaves the JPEG header whole
  test::write_pairs(dir_.path(), o);
  const std::string image = dir_.file("images/img001.jpg");
  fs::resize_file(image, fs::file_size(image) * 2 / 3);
  expect_error(dpprep(build_args()), "dpprep", 1, {image, "truncated JPEG", "Premature end"});
}

TEST_F(DataCli, BuildRejectsAnImageMaskSizeMismatch) {
  test::write_pairs(dir_.path(), pairs(3));
  const std::vector<uint8_t> mask(40 * 32, 0);
  data::write_png(dir_.file("masks/img002.png"), mask.data(), 40, 32, 1);
  expect_error(dpprep(build_args()), "dpprep", 1,
               {dir_.file("images/img002.jpg"), "is 32x32 but its mask",
                dir_.file("masks/img002.png"), "is 40x32"});
}

// Several bad files: every one listed in one run, one "dpprep: error:" line each (a file that is
// no image and an empty mask found while reading the masks, a JPEG truncated after its header
// found by decoding the other images), then a line counting them; exit 1, nothing written.
TEST_F(DataCli, BuildListsEveryBadFile) {
  test::PairFolderOptions o = pairs(4);
  o.width = o.height = 96;  // the cut below leaves the JPEG header whole
  test::write_pairs(dir_.path(), o);
  const std::string text = dir_.file("images/img001.jpg"), cut = dir_.file("images/img002.jpg");
  const std::string empty = dir_.file("masks/img003.png");
  std::ofstream(text) << "<html>not a JPEG</html>";
  fs::resize_file(cut, fs::file_size(cut) * 2 / 3);
  std::ofstream(empty).flush();
  const auto r = dpprep(build_args());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count(r.output, "dpprep: error:"), 4) << r.output;
  for (const std::string& line :
       {"dpprep: error: image '" + text + "' is neither JPEG nor PNG",
        "dpprep: error: image '" + empty + "' is empty (0 bytes)",
        "dpprep: error: corrupt or truncated JPEG '" + cut + "'",
        std::string("dpprep: error: 3 problems with the input files; nothing was written")})
    EXPECT_TRUE(contains(r.output, line)) << line << " in\n" << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("out.h5")));
  for (const auto& e : fs::directory_iterator(dir_.path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(DataCli, BuildListsUnpairedFilesOrSkipsThem) {
  test::write_pairs(dir_.path(), pairs(4));
  fs::remove(dir_.file("masks/img003.png"));
  expect_error(dpprep(build_args()), "dpprep", 1, {"1 image(s)", "img003.jpg", "--skip-unpaired"});
  const auto r = dpprep(build_args() + " --skip-unpaired");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "skipped 1 image(s) without a mask and 0 mask(s)")) << r.output;
}

TEST_F(DataCli, BuildRejectsAnEmptySplitAndBadOptions) {
  test::write_pairs(dir_.path(), pairs(3));
  expect_error(dpprep("build --images " + dir_.file("images") + " --masks " + dir_.file("masks") +
                      " --out " + dir_.file("out.h5") + " --val-fraction 0.1"),
               "dpprep", 1, {"validation split would be empty"});
  expect_error(dpprep(build_args() + " --resize 64"), "dpprep", 2, {"--resize '64'", "WxH"});
  expect_error(dpprep("build --images " + dir_.file("images") + " --masks " + dir_.file("masks") +
                      " --out x.h5 --val-fraction 1.5"),
               "dpprep", 2, {"--val-fraction"});
  expect_error(dpprep("build --images " + dir_.file("images") + " --masks " + dir_.file("masks") +
                      " --out x.h5 --val-images " + dir_.file("images")),
               "dpprep", 2, {"--val-masks"});
}

TEST_F(DataCli, InfoRejectsAFileThatIsNoDataset) {
  std::ofstream(dir_.file("text.h5")) << "hello";
  expect_error(dpprep("info " + dir_.file("text.h5")), "dpprep", 1,
               {dir_.file("text.h5"), "not an HDF5 file"});
  test::RawDataset r;
  r.bad_mask_sample = 3;
  r.mask_value = 255;
  expect_error(dpprep("info " + raw("values.h5", r)), "dpprep", 1, {"sample 3", "value 255"});
  expect_error(dpprep("info"), "dpprep", 2, {"no FILE"});
}

// ---------------------------------------------------------------------------------------------
// dptrain --data: bad input, two ranks

TEST_F(DataCli, TrainRejectsANonHdf5File) {
  std::ofstream(dir_.file("images.zip")) << "PK not HDF5";
  expect_error(dptrain(2, dir_.file("images.zip")), "dptrain", 1,
               {dir_.file("images.zip"), "not an HDF5 file"});
}

TEST_F(DataCli, TrainRejectsMissingTrainDatasets) {
  test::RawDataset r;
  r.masks = false;
  expect_error(dptrain(2, raw("nomasks.h5", r)), "dptrain", 1,
               {dir_.file("nomasks.h5") + ":/train/masks", "not found"});
  r = {};
  r.images = r.masks = false;
  expect_error(dptrain(2, raw("nothing.h5", r)), "dptrain", 1,
               {dir_.file("nothing.h5"), "no split 'train'"});
}

TEST_F(DataCli, TrainRejectsTheWrongDtype) {
  test::RawDataset r;
  r.image_type = h5::Type::kFloat32;
  expect_error(dptrain(2, raw("float.h5", r)), "dptrain", 1,
               {dir_.file("float.h5") + ":/train/images", "float32, expected uint8"});
}

TEST_F(DataCli, TrainRejectsTheWrongRankOrShape) {
  test::RawDataset r;
  r.image_shape = {4, 32, 32};
  expect_error(dptrain(2, raw("rank.h5", r)), "dptrain", 1,
               {dir_.file("rank.h5") + ":/train/images", "[4,32,32]", "expected [N,H,W,3]"});
  r = {};
  r.mask_shape = {4, 32, 30};
  expect_error(dptrain(2, raw("mask.h5", r)), "dptrain", 1,
               {dir_.file("mask.h5") + ":/train/masks", "[4,32,30]"});
}

TEST_F(DataCli, TrainRejectsAValidationSplitOfAnotherSize) {
  test::RawDataset r;
  r.val_shape = {2, 64, 32};
  expect_error(
      dptrain(2, raw("valsize.h5", r)), "dptrain", 2,
      {dir_.file("valsize.h5"), "validation images are 64x32", "training images are 32x32"});
}

TEST_F(DataCli, TrainRejectsAnImageMaskCountMismatch) {
  test::RawDataset r;
  r.mask_shape = {3, 32, 32};
  expect_error(dptrain(2, raw("count.h5", r)), "dptrain", 1,
               {dir_.file("count.h5"), "4 images but 3 masks"});
}

TEST_F(DataCli, TrainRejectsMaskValuesOutsideZeroOne) {
  test::RawDataset r;  // found when the sample is read, on the rank that reads it
  r.bad_mask_sample = 1;
  r.mask_value = 255;
  expect_error(dptrain(2, raw("values.h5", r)), "dptrain", -1,
               {dir_.file("values.h5") + ":/train/masks", "sample 1", "value 255"});
}

TEST_F(DataCli, TrainRejectsAnEmptySplit) {
  test::RawDataset r;
  r.image_shape = {0, 32, 32, 3};
  r.mask_shape = {0, 32, 32};
  expect_error(dptrain(2, raw("empty.h5", r)), "dptrain", 1,
               {dir_.file("empty.h5"), "split 'train' is empty"});
}

TEST_F(DataCli, TrainRejectsMoreRanksThanSamples) {
  test::RawDataset r;
  r.image_shape = {1, 32, 32, 3};
  r.mask_shape = {1, 32, 32};
  expect_error(dptrain(2, raw("one.h5", r)), "dptrain", 2,
               {dir_.file("one.h5"), "1 sample(s), fewer than the 2 ranks"});
  r.image_shape = {3, 32, 32, 3};
  r.mask_shape = {3, 32, 32};
  expect_error(dptrain(2, raw("three.h5", r), "--drop-last"), "dptrain", 2,
               {"--drop-last", "less than one batch"});
}

TEST_F(DataCli, TrainRejectsSizesThatAreNotMultiplesOf32) {
  test::RawDataset r;
  r.image_shape = {4, 48, 40, 3};
  r.mask_shape = {4, 48, 40};
  expect_error(dptrain(2, raw("odd.h5", r)), "dptrain", 2,
               {dir_.file("odd.h5"), "multiples of 32"});
}

TEST_F(DataCli, TrainRejectsDatasetNormalisationWithoutStatistics) {
  test::RawDataset r;
  expect_error(dptrain(2, raw("plain.h5", r), "--normalize dataset"), "dptrain", 1,
               {dir_.file("plain.h5"), "'mean' and 'std'"});
}

// Option values are checked by the parser every rank runs (exit 2, printed once: e2e/train_cli).
TEST(DataOptions, LoaderOptionsAreParsedAndChecked) {
  auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "dptrain");
    return app::parse_train_options(int(args.size()), args.data(), false);
  };
  const auto o = parse(
      {"--workers", "3", "--augment", "flips", "--normalize", "dataset", "--cache", "--drop-last"});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->workers, 3);
  EXPECT_EQ(o->augment, data::Augment::kFlips);
  EXPECT_EQ(o->normalize, data::Normalize::kDataset);
  EXPECT_TRUE(o->cache);
  EXPECT_TRUE(o->drop_last);
  const auto d = parse({});
  EXPECT_EQ(d->workers, 1);
  EXPECT_EQ(d->augment, data::Augment::kFull);
  EXPECT_EQ(d->normalize, data::Normalize::kImagenet);
  EXPECT_FALSE(d->cache || d->drop_last);
  auto error = [&](std::vector<const char*> args) {
    try {
      parse(std::move(args));
    } catch (const app::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_TRUE(contains(error({"--augment", "sideways"}), "--augment must be none, flips or full"));
  EXPECT_TRUE(contains(error({"--workers", "0"}), "--workers must be in [1, 64]"));
  EXPECT_TRUE(contains(error({"--normalize", "other"}), "--normalize must be imagenet or dataset"));
}

}  // namespace
}  // namespace dp
