// dppredict: tile geometry and blending against a pointwise model, tiled == untiled at the
// training size, any image size in and out, IoU equal to dptrain's validation, bad input.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>

#include "dp/checkpoint.hpp"
#include "dp/comm.hpp"
#include "dp/crack_measure.hpp"
#include "dp/dataset.hpp"
#include "dp/image_io.hpp"
#include "dp/loader.hpp"
#include "dp/prepare.hpp"
#include "dp/synth.hpp"
#include "exit_codes.hpp"
#include "normalization.hpp"
#include "predict/predictor.hpp"
#include "predict/run.hpp"
#include "predict/tiling.hpp"
#include "prep_util.hpp"
#include "test_util.hpp"
#include "train/trainer.hpp"
#include "trained_suite.hpp"

#ifdef DP_WITH_CUDA
#include "dp/cuda/device.hpp"
#endif

namespace dp {
namespace {

using app::Normalization;

constexpr int kSize = 64;          // training images of the fixture: 64x64
constexpr double kProbTol = 1e-6;  // probabilities: float rounding only
constexpr double kIouTol = 1e-6;
constexpr float kThresholdGap = 1e-5f;  // far above float rounding of a probability (~6e-8)

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string mpi(int np, const std::string& binary, const std::string& args) {
  return test::mpiexec() + " -n " + std::to_string(np) + " " + binary + " " + args;
}

// dppredict without mpiexec: a world of one that never starts MPI (app::run_program). The leak
// check stays off for it, as test::mpiexec()'s -x does for ranks it starts, for MPI's libraries.
std::string alone() {
  return std::string("ASAN_OPTIONS=detect_leaks=0 ") + test::program("dppredict");
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// The number after "<name> " in dppredict's metrics line (NaN if absent).
double printed(const std::string& output, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex("metrics on .* " + name + " ([0-9.]+)")))
    return std::nan("");
  return std::stod(match[1]);
}

// A double as text that parses back to the same value.
std::string str_cat_exact(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A deterministic RGB test image with every byte value in use.
data::Image test_image(int width, int height, uint64_t seed) {
  data::Image img{width, height, 3, std::vector<uint8_t>(size_t(width) * height * 3)};
  uint64_t s = seed;
  for (uint8_t& v : img.pixels) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = uint8_t(s >> 56);
  }
  return img;
}

// ---------------------------------------------------------------------------------------------
// Geometry and blending, no network

TEST(Tiling, StartsCoverTheAxisWithAtLeastTheOverlap) {
  for (const int tile : {32, 64}) {
    for (const int overlap : {0, 8, 16, tile - 1}) {
      for (int length = 1; length <= 300; ++length) {
        const std::vector<int> s = app::tile_starts(length, tile, overlap);
        SCOPED_TRACE(testing::Message()
                     << "length " << length << " tile " << tile << " overlap " << overlap);
        if (length <= tile) {
          ASSERT_EQ(s.size(), 1u);
          EXPECT_EQ(s[0], -((tile - length) / 2));  // centred, the rest reflect padding
          continue;
        }
        const int stride = tile - overlap;
        EXPECT_EQ(int(s.size()), (length - tile + stride - 1) / stride + 1);  // as few as can
        EXPECT_EQ(s.front(), 0);
        EXPECT_EQ(s.back(), length - tile);  // flush with the end: no tile reads outside
        for (size_t i = 1; i < s.size(); ++i) {
          EXPECT_GT(s[i], s[i - 1]);
          EXPECT_LE(s[i] - s[i - 1], stride);  // neighbours share >= overlap pixels
        }
      }
    }
  }
  EXPECT_THROW(app::tile_starts(10, 32, 32), Error);
}

TEST(Tiling, ReflectIndexMirrorsWithoutRepeatingTheEdge) {
  const std::vector<int> expected = {3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1};  // i = -3 .. 7, length 4
  for (int i = -3; i <= 7; ++i) EXPECT_EQ(app::reflect_index(i, 4), expected[size_t(i + 3)]) << i;
  EXPECT_EQ(app::reflect_index(-100, 1), 0);
  EXPECT_EQ(app::reflect_index(12345, 1), 0);
  EXPECT_EQ(app::reflect_index(-2, 2), 0);
}

TEST(Tiling, WindowIsPositiveSymmetricAndPeaksInTheMiddle) {
  const std::vector<float> w = app::window_weights(32);
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_GT(w[i], 0.0f);
    EXPECT_LE(w[i], 1.0f);
    EXPECT_FLOAT_EQ(w[i], w[w.size() - 1 - i]);
  }
  EXPECT_LT(w[0], 0.01f);
  EXPECT_GT(w[15], 0.99f);
}

// A "network" whose logit at a pixel depends on that pixel alone: blending any number of
// overlapping tiles, with any weights, must give back exactly its per-pixel probability, so every
// offset, reflection or weight-normalisation mistake shows.
TEST(Tiling, BlendingReproducesAPointwiseModelAtAnySize) {
  constexpr int kTileH = 32, kTileW = 48, kOverlap = 12, kBatch = 3;
  const Normalization norm{data::kImagenetMean, data::kImagenetStd};
  const app::NormalizationLut lut = app::normalization_lut(norm);
  auto pointwise = [](const float* px) { return 2.0f * px[0] - px[1] + 0.5f * px[2] - 0.25f; };
  std::vector<float> logits(size_t(kBatch) * kTileH * kTileW);
  int forwards = 0;
  app::TiledRunner runner(
      [&](const float* input, int n) {
        EXPECT_LE(n, kBatch);
        ++forwards;
        for (size_t i = 0; i < size_t(n) * kTileH * kTileW; ++i)
          logits[i] = pointwise(input + 3 * i);
        return logits.data();
      },
      norm, kTileH, kTileW, kOverlap, kBatch);
  // Larger than a tile both ways; smaller both ways (reflect padding); exactly one tile; mixed.
  const std::vector<std::pair<int, int>> sizes = {
      {1000, 700}, {13, 20}, {48, 32}, {1, 1}, {100, 7}};
  std::map<size_t, int> done;
  for (size_t id = 0; id < sizes.size(); ++id) {
    const auto [w, h] = sizes[id];
    runner.submit(id, test_image(w, h, id),
                  [&, w = w, h = h](size_t got, const data::Image& img, std::vector<float>& prob,
                                    const std::vector<float>&) {
                    ++done[got];
                    ASSERT_EQ(img.width, w);
                    ASSERT_EQ(img.height, h);
                    ASSERT_EQ(prob.size(), size_t(w) * h);
                    double worst = 0;
                    for (size_t i = 0; i < prob.size(); ++i) {
                      float px[3];
                      for (int c = 0; c < 3; ++c)
                        px[c] = lut[size_t(c)][img.pixels[3 * i + size_t(c)]];
                      worst = std::max(worst, std::abs(double(prob[i]) - sigmoid(pointwise(px))));
                    }
                    EXPECT_LE(worst, kProbTol) << "image " << got << " (" << w << "x" << h << ")";
                  });
  }
  runner.flush();
  EXPECT_EQ(done.size(), sizes.size());
  for (const auto& [id, n] : done) EXPECT_EQ(n, 1) << id;
  int64_t tiles = 0;
  for (const auto& [w, h] : sizes) tiles += runner.tiles_for(h, w);
  EXPECT_EQ(forwards, (tiles + kBatch - 1) / kBatch);  // tiles of different images share batches
}

// --margin M: the tiles cover [-M, length + M); margin 0 is the flush tiling of before.
TEST(Tiling, MarginExtendsTheCoveredAxisByReflectedContext) {
  for (const int length : {1, 5, 31, 32, 33, 100, 1000})
    for (const int tile : {8, 32, 48})
      for (const int overlap : {0, 3, 7})
        for (const int margin : {0, 1, 5, 40}) {
          SCOPED_TRACE(testing::Message()
                       << length << " " << tile << " " << overlap << " " << margin);
          const std::vector<int> s = app::tile_starts(length, tile, overlap, margin);
          if (margin == 0) {
            EXPECT_EQ(s, app::tile_starts(length, tile, overlap));
          }
          ASSERT_FALSE(s.empty());
          if (length + 2 * margin <= tile) {
            ASSERT_EQ(s.size(), 1u);
            EXPECT_LE(s[0], -margin);
            EXPECT_GE(s[0] + tile, length + margin);
            continue;
          }
          EXPECT_EQ(s.front(), -margin);
          EXPECT_EQ(s.back() + tile, length + margin);
          for (size_t i = 1; i < s.size(); ++i) EXPECT_LE(s[i] - s[i - 1], tile - overlap);
        }
  EXPECT_THROW(app::tile_starts(10, 8, 2, -1), Error);
}

// A "network" that answers crack (logit +8) on the outermost row and column of every tile and
// background (-8) elsewhere, as a model would that learned to fire where its zero padding begins.
// With margin 0 the tiles are flush with the image borders and those pixels come out as cracks;
// with a margin no image pixel lies on a tile border that is not outweighed by another tile.
TEST(Tiling, MarginKeepsImageBordersOffTheTilesBorders) {
  constexpr int kTileH = 32, kTileW = 48, kOverlap = 12, kBatch = 4;
  const Normalization norm{data::kImagenetMean, data::kImagenetStd};
  auto run = [&](int margin, int w, int h) {
    std::vector<float> logits(size_t(kBatch) * kTileH * kTileW);
    app::TiledRunner runner(
        [&](const float*, int n) {
          for (int k = 0; k < n; ++k)
            for (int y = 0; y < kTileH; ++y)
              for (int x = 0; x < kTileW; ++x) {
                const bool edge = y == 0 || x == 0 || y == kTileH - 1 || x == kTileW - 1;
                logits[(size_t(k) * kTileH + size_t(y)) * kTileW + size_t(x)] = edge ? 8.0f : -8.0f;
              }
          return logits.data();
        },
        norm, kTileH, kTileW, kOverlap, kBatch, margin);
    std::vector<float> out;
    runner.submit(0, test_image(w, h, 7),
                  [&](size_t, const data::Image&, std::vector<float>& p,
                      const std::vector<float>&) { out = p; });
    runner.flush();
    return out;
  };
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{100, 70}, {48, 32}, {300, 33}}) {
    SCOPED_TRACE(testing::Message() << w << "x" << h);
    const std::vector<float> flush = run(0, w, h);
    ASSERT_EQ(flush.size(), size_t(w) * size_t(h));
    EXPECT_GT(flush[0], 0.99f);                                          // corner
    EXPECT_GT(flush[size_t(h / 2) * size_t(w)], 0.99f);                  // left border
    EXPECT_GT(flush[size_t(h - 1) * size_t(w) + size_t(w / 2)], 0.99f);  // bottom border
    for (const int margin : {4, 16}) {
      const std::vector<float> p = run(margin, w, h);
      ASSERT_EQ(p.size(), flush.size());
      EXPECT_LT(*std::max_element(p.begin(), p.end()), 0.05f) << "margin " << margin;
    }
  }
}

TEST(Normalization, RecordedStatisticsRoundTripExactly) {
  const Normalization n{{0.123456789f, 0.5f, 1.0f / 3}, {0.2f, 0.0039215689f, 0.7f}};
  const Normalization back = app::normalization_from_options(
      "data = x.h5\nnormalize = dataset\n" + app::describe_normalization(n), "ckpt.h5");
  EXPECT_EQ(back.mean, n.mean);
  EXPECT_EQ(back.std, n.std);
  // Older checkpoints: ImageNet's statistics, or the named dataset's; none found is an error.
  EXPECT_EQ(app::normalization_from_options("normalize = imagenet\n", "c.h5").mean,
            data::kImagenetMean);
  EXPECT_EQ(app::normalization_from_options("", "c.h5").std, data::kImagenetStd);
  try {
    app::normalization_from_options("normalize = dataset\ndata = /nonexistent.h5\n", "c.h5");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'c.h5' was trained with --normalize dataset"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent.h5"), std::string::npos) << e.what();
  }
}

// A checkpoint's typed normalize_mean / normalize_std attributes win over its options text, which
// only files written before them are read by.
TEST(Normalization, TypedAttributesFirstThenTheOptionsText) {
  CheckpointMeta meta;
  meta.options = "normalize = imagenet\n";
  EXPECT_EQ(app::normalization_of(meta, "c.h5").mean, data::kImagenetMean);
  meta.normalize_mean = {0.25, 0.5, 0.75};
  meta.normalize_std = {0.5, 0.25, 0.125};
  const Normalization n = app::normalization_of(meta, "c.h5");
  EXPECT_EQ(n.mean, (std::array<float, 3>{0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(n.std, (std::array<float, 3>{0.5f, 0.25f, 0.125f}));
  meta.normalize_std[1] = 0;
  try {
    app::normalization_of(meta, "c.h5");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint 'c.h5': normalize_std must be positive"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// With a model trained for one epoch by dptrain

class Predict : public test::TrainedSuite<Predict> {
 public:
  static constexpr int kValSamples = 8, kSide = kSize;

 protected:
  static std::string dppredict(int np, const std::string& args) {
    return mpi(np, test::program("dppredict"), "-c " + checkpoint_ + " " + args);
  }
  // dptrain's validation (Trainer::validate) of the fixture's checkpoint on `data`, in process,
  // masks at `threshold`.
  static app::EpochMetrics validate(const std::string& data, double threshold,
                                    const std::string& model_dir) {
    app::TrainOptions to;
    to.data = data;
    to.width_divisor = 16;
    to.batch_size = 2;
    to.epochs = 1;
    to.optimizer = app::OptimizerKind::kSgd;  // the checkpoint's (test::train_one_epoch)
    to.resume = checkpoint_;
    to.threshold = threshold;
    to.model_dir = dir_->file(model_dir);
    SelfComm self;
    app::Trainer trainer(to, self, Logger(1));
    return trainer.validate();
  }
};

TEST_F(Predict, TiledEqualsUntiledAtTheTrainingSize) {
  app::Predictor predictor(checkpoint_, {});
  ASSERT_EQ(predictor.tile_height(), kSize);
  ASSERT_EQ(predictor.tile_width(), kSize);
  EXPECT_EQ(predictor.overlap(), kSize / 4);
  // The oracle: the network on the whole image in one forward pass, normalised as training did.
  const CheckpointMeta meta = read_checkpoint_meta(checkpoint_);
  auto backend = make_cpu_backend();
  auto model = make_model({meta.model, int(meta.width_divisor), meta.deconv != 0}, *backend);
  model->setup(1, kSize, kSize);
  model->set_training(false);
  load_checkpoint(checkpoint_, model->params(), nullptr, &model->buffers());
  const data::Dataset val(data_, "val");
  const Normalization norm{data::kImagenetMean, data::kImagenetStd};
  const app::NormalizationLut lut = app::normalization_lut(norm);
  for (const int64_t index : {int64_t{0}, val.size() - 1}) {
    data::Image img{kSize, kSize, 3, std::vector<uint8_t>(kSize * kSize * 3)};
    std::vector<uint8_t> mask(kSize * kSize);
    val.read(index, img.pixels.data(), mask.data());
    std::vector<float> input(img.pixels.size());
    for (size_t i = 0; i < input.size(); ++i) input[i] = lut[i % 3][img.pixels[i]];
    const float* logits = model->forward(input.data(), 1);
    const std::vector<float> tiled = predictor.predict(img);
    ASSERT_EQ(tiled.size(), size_t(kSize * kSize));
    double worst = 0, lo = 1, hi = 0;
    for (size_t i = 0; i < tiled.size(); ++i) {
      worst = std::max(worst, std::abs(double(tiled[i]) - sigmoid(logits[i])));
      lo = std::min(lo, double(tiled[i]));
      hi = std::max(hi, double(tiled[i]));
    }
    EXPECT_LE(worst, kProbTol) << "sample " << index;
    EXPECT_LT(lo, hi);  // not a constant map
  }
}

// An image transformed as test-time augmentation's variant v does: flipped left-right (bit 0),
// up-down (bit 1), then transposed (bit 2); `inverse` undoes it on a probability map.
template <typename T>
std::vector<T> transformed(const std::vector<T>& src, int width, int height, int channels, int v,
                           bool inverse) {
  const bool fx = v & 1, fy = v & 2, tr = v & 4;
  const int out_w = tr ? height : width;
  std::vector<T> dst(src.size());
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const int yy = fy ? height - 1 - y : y, xx = fx ? width - 1 - x : x;
      const size_t to =
          tr ? size_t(xx) * size_t(out_w) + size_t(yy) : size_t(yy) * size_t(out_w) + size_t(xx);
      const size_t from = size_t(y) * size_t(width) + size_t(x);
      for (int c = 0; c < channels; ++c) {
        if (inverse)
          dst[from * size_t(channels) + size_t(c)] = src[to * size_t(channels) + size_t(c)];
        else
          dst[to * size_t(channels) + size_t(c)] = src[from * size_t(channels) + size_t(c)];
      }
    }
  }
  return dst;
}

// --tta: the probabilities equal the mean over the explicitly transformed images predicted
// without augmentation and transformed back (tile starts are symmetric at these sizes, so each
// variant tile is a tile of the transformed image); the deviation, on one tile, equals theirs.
TEST_F(Predict, TtaIsTheMeanOverExplicitlyTransformedImages) {
  app::Predictor plain(checkpoint_, {});
  struct Case {
    app::Tta tta;
    int width, height;
  };
  for (const Case c :
       {Case{app::Tta::kFlips, 160, 112}, Case{app::Tta::kDihedral, 160, 160},
        Case{app::Tta::kFlips, kSize, kSize}, Case{app::Tta::kDihedral, kSize, kSize}}) {
    app::PredictorOptions po;
    po.tta = c.tta;
    app::Predictor augmented(checkpoint_, po);
    const data::Image img = test_image(c.width, c.height, 41);
    const int variants = app::tta_variants(c.tta);
    const size_t n = size_t(c.width) * size_t(c.height);
    std::vector<double> mean(n, 0), square(n, 0);
    for (int v = 0; v < variants; ++v) {
      const bool tr = v & 4;
      data::Image t{tr ? c.height : c.width, tr ? c.width : c.height, 3,
                    transformed(img.pixels, c.width, c.height, 3, v, false)};
      const std::vector<float> p = transformed(plain.predict(t), c.width, c.height, 1, v, true);
      for (size_t i = 0; i < n; ++i)
        mean[i] += p[i] / variants, square[i] += double(p[i]) * p[i] / variants;
    }
    std::vector<float> got, deviation;
    augmented.runner().submit(0, img,
                              [&](size_t, const data::Image&, std::vector<float>& p,
                                  const std::vector<float>& u) { got = p, deviation = u; });
    augmented.runner().flush();
    ASSERT_EQ(got.size(), n);
    ASSERT_EQ(deviation.size(), n);
    const std::vector<float> none = plain.predict(img);
    double worst = 0, worst_sd = 0, changed = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(got[i] - mean[i]));
      changed = std::max(changed, std::abs(double(got[i]) - none[i]));
      const double sd = std::sqrt(std::max(0.0, square[i] - mean[i] * mean[i]));
      worst_sd = std::max(worst_sd, std::abs(deviation[i] - sd));
    }
    std::printf(
        "[tta] %d variants on %dx%d: max |tta - explicit mean| %.2e, max deviation "
        "difference %.2e, max change from no augmentation %.3f\n",
        variants, c.width, c.height, worst, worst_sd, changed);
    EXPECT_LE(worst, 1e-5);
    EXPECT_GT(changed, 1e-3);  // the variants differ: the comparison is not vacuous
    if (c.width == kSize && c.height == kSize) {
      EXPECT_LE(worst_sd, 1e-4);
    }
  }
  // The 8 symmetries of a square only where the tile is square: one usage error.
  app::PredictorOptions po;
  po.tta = app::Tta::kDihedral;
  po.tile_height = kSize;
  po.tile_width = 2 * kSize;
  EXPECT_THROW(app::Predictor(checkpoint_, po), app::UsageError);
}

// A tile of a whole photograph runs alone (the batch capped at a megapixel of tiles) in an
// inference-only activation plan: a fraction of a training set-up's memory.
TEST_F(Predict, LargeTilesRunAloneInInferenceMemory) {
  app::PredictorOptions po;
  EXPECT_EQ(app::Predictor(checkpoint_, po).batch(), po.batch);  // training-size tiles: 4
  po.tile_height = 768;
  po.tile_width = 1024;
  app::Predictor large(checkpoint_, po);
  EXPECT_EQ(large.batch(), 1);
  const CheckpointMeta meta = read_checkpoint_meta(checkpoint_);
  auto backend = make_cpu_backend();
  auto training = make_model({meta.model, int(meta.width_divisor), meta.deconv != 0}, *backend);
  training->setup(1, 768, 1024);
  const double pixels = 768.0 * 1024.0;
  std::printf(
      "[large tile] 768x1024: %.0f bytes of activations per pixel (a training set-up: "
      "%.0f)\n",
      double(large.model().activation_bytes()) / pixels,
      double(training->activation_bytes()) / pixels);
  EXPECT_LT(large.model().activation_bytes(), training->activation_bytes() / 3);
}

TEST_F(Predict, DatasetIouEqualsTheTrainersValidationIou) {
  // 1. The run's own record: dptrain's validation IoU at 0.5 against dppredict under mpirun,
  //    the validation files split across two ranks, the sums printed by rank 0.
  const CheckpointMeta meta = read_checkpoint_meta(checkpoint_);
  ASSERT_EQ(meta.valid_iou.size(), 1u);
  // Specks are not cleared from the masks here (--min-crack-px 1): the trainer scores raw masks.
  auto r = test::run_command(
      dppredict(2, "--dataset " + data_ + " -q --threshold 0.5 --min-crack-px 1"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "metrics on"), 1) << r.output;  // rank 0 only
  EXPECT_NE(r.output.find("(8 images, 32768 pixels, threshold 0.5)"), std::string::npos)
      << r.output;
  EXPECT_NEAR(printed(r.output, "iou"), meta.valid_iou[0], kIouTol) << r.output;
  // Winograd kernels (oneDNN's on AVX-512, else the backend's own on GEMMs) change only the last
  // bits of the logits: the same IoU but for a pixel within rounding of the threshold.
  const std::string winograd = cpu_winograd_support().empty() ? "winograd" : "gemm-winograd";
  r = test::run_command(dppredict(
      2, "--dataset " + data_ + " -q --threshold 0.5 --min-crack-px 1 --cpu-conv " + winograd));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NEAR(printed(r.output, "iou"), meta.valid_iou[0], 0.02) << r.output;

  // 2. A threshold that splits the pixels (after one epoch the probabilities may all sit on one
  //    side of 0.5): between two distinct probabilities near the 90th percentile, so that no
  //    pixel is within rounding of it. dptrain's validation (Trainer::validate) at that
  //    threshold against dppredict, in process (exact sums) and under mpirun.
  app::Predictor predictor(checkpoint_, {});
  const data::Dataset val(data_, "val");
  std::vector<float> probs;
  std::vector<uint8_t> truth;
  for (int64_t i = 0; i < val.size(); ++i) {
    data::Image img{kSize, kSize, 3, std::vector<uint8_t>(kSize * kSize * 3)};
    std::vector<uint8_t> mask(kSize * kSize);
    val.read(i, img.pixels.data(), mask.data());
    const std::vector<float> p = predictor.predict(img);
    probs.insert(probs.end(), p.begin(), p.end());
    truth.insert(truth.end(), mask.begin(), mask.end());
  }
  const std::vector<float> by_image = probs;
  std::sort(probs.begin(), probs.end());
  size_t k = probs.size() * 9 / 10;
  while (k + 1 < probs.size() && probs[k + 1] - probs[k] < kThresholdGap) ++k;
  ASSERT_LT(k + 1, probs.size()) << "no gap in the probabilities above the 90th percentile";
  const double threshold = 0.5 * (double(probs[k]) + double(probs[k + 1]));

  const app::EpochMetrics validation = validate(data_, threshold, "validate");
  ASSERT_EQ(validation.samples, 8);
  SelfComm self;

  app::PredictOptions o;
  o.checkpoint = checkpoint_;
  o.dataset = data_;
  o.split = "val";
  o.threshold_rule = app::PredictOptions::ThresholdRule::kValue;
  o.threshold = threshold;
  o.quiet = true;
  o.min_crack_px = 1;
  app::SegmentationMetrics m;
  ASSERT_EQ(app::run_predict(o, self, Logger(1), &m), 0);
  EXPECT_EQ(m.images, 8);
  EXPECT_EQ(m.pixels, 8 * kSize * kSize);
  EXPECT_GT(m.tp, 0);  // cracks found, and both classes predicted
  EXPECT_GT(m.pixels - m.tp - m.fp, 0);
  EXPECT_NEAR(m.iou(), validation.iou, kIouTol) << "threshold " << threshold;
  // The threshold sweep of the same predictions (tolerance 0, dptrain's default): dppredict's
  // float probabilities against validation's logits (sigmoid in double), so a pixel within float
  // rounding of one of the 99 thresholds may fall on its other side (measured: 5e-6 on OIS).
  constexpr double kSweepTol = 1e-4;
  EXPECT_GT(validation.ap, 0.0);
  EXPECT_NEAR(m.sweep.ods, validation.ods, kSweepTol);
  EXPECT_NEAR(m.sweep.ods_threshold, validation.ods_threshold, 1e-9);
  EXPECT_NEAR(m.sweep.ois, validation.ois, kSweepTol);
  EXPECT_NEAR(m.sweep.ap, validation.ap, kSweepTol);
  EXPECT_NEAR(m.dice(), 2.0 * double(m.tp) / double(std::max<int64_t>(1, 2 * m.tp + m.fp + m.fn)),
              1e-12);
  r = test::run_command(dppredict(
      2, "--dataset " + data_ + " -q --min-crack-px 1 --threshold " + str_cat_exact(threshold)));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NEAR(printed(r.output, "iou"), validation.iou, kIouTol) << r.output;
  EXPECT_NEAR(printed(r.output, "precision"), m.precision(), kIouTol) << r.output;
  EXPECT_NEAR(printed(r.output, "recall"), m.recall(), kIouTol) << r.output;
  EXPECT_NEAR(printed(r.output, "ap"), m.sweep.ap, 1e-7) << r.output;  // 2 ranks: the same

  // 3. At the default --min-crack-px the mask scores are those of the masks with their specks
  //    cleared (data::erase_specks of each image's thresholded probabilities); the sweep is not.
  o.min_crack_px = app::PredictOptions{}.min_crack_px;
  app::SegmentationMetrics cleaned;
  ASSERT_EQ(app::run_predict(o, self, Logger(1), &cleaned), 0);
  int64_t tp = 0, fp = 0, fn = 0;
  for (int64_t i = 0; i < val.size(); ++i) {
    std::vector<uint8_t> mask(kSize * kSize);
    const size_t at = size_t(i) * kSize * kSize;
    for (size_t j = 0; j < mask.size(); ++j) mask[j] = by_image[at + j] > threshold ? 255 : 0;
    data::erase_specks(mask.data(), kSize, kSize, o.min_crack_px);
    for (size_t j = 0; j < mask.size(); ++j) {
      tp += mask[j] && truth[at + j];
      fp += mask[j] && !truth[at + j];
      fn += !mask[j] && truth[at + j];
    }
  }
  EXPECT_LT(cleaned.tp + cleaned.fp, m.tp + m.fp);  // specks were found and cleared
  EXPECT_EQ(cleaned.tp, tp);
  EXPECT_EQ(cleaned.fp, fp);
  EXPECT_EQ(cleaned.fn, fn);
  EXPECT_EQ(cleaned.sweep.ap, m.sweep.ap);
}

// Photographs resized by dpprep build --resize: dptrain's validation scores the threshold sweep
// and clDice at the photographs' own size (the dataset's val/native_masks), so the threshold it
// records is the one dppredict finds scoring the same photographs against their masks.
TEST_F(Predict, ValidationOfResizedPhotographsScoresAtTheirSize) {
  constexpr int kPhoto = 2 * kSize;  // photographs of 128x128, stored at the fixture's 64x64
  test::PairFolderOptions po;
  po.count = 4;
  po.width = po.height = kPhoto;
  test::write_pairs(dir_->file("photos/train"), po);
  po.prefix = "val";
  po.seed = 11;
  test::write_pairs(dir_->file("photos/val"), po);
  data::BuildOptions b;
  b.images = dir_->file("photos/train/images");
  b.masks = dir_->file("photos/train/masks");
  b.val_images = dir_->file("photos/val/images");
  b.val_masks = dir_->file("photos/val/masks");
  b.resize_width = b.resize_height = kSize;
  b.out = dir_->file("photos.h5");
  data::build_dataset(b);

  const app::EpochMetrics validation = validate(b.out, 0.5, "validate_photos");
  ASSERT_EQ(validation.samples, 4);
  SelfComm self;

  app::PredictOptions o;
  o.checkpoint = checkpoint_;
  o.inputs = {b.val_images};
  o.masks = b.val_masks;
  o.out = dir_->file("validate_photos_out");
  o.scale_y = o.scale_x = 0.5;  // the fixture's checkpoint was trained at scale 1
  o.threshold_rule = app::PredictOptions::ThresholdRule::kValue;
  o.quiet = true;
  o.min_crack_px = 1;  // the trainer scores raw masks
  app::SegmentationMetrics m;
  ASSERT_EQ(app::run_predict(o, self, Logger(1), &m), 0);
  EXPECT_EQ(m.pixels, 4 * kPhoto * kPhoto);
  EXPECT_GT(validation.ap, 0.0);
  constexpr double kSweepTol = 1e-4;  // float sigmoids on both sides, as above
  EXPECT_NEAR(m.sweep.ods, validation.ods, kSweepTol);
  EXPECT_NEAR(m.sweep.ods_threshold, validation.ods_threshold, 1e-9);
  EXPECT_NEAR(m.sweep.ois, validation.ois, kSweepTol);
  EXPECT_NEAR(m.sweep.ap, validation.ap, kSweepTol);
  EXPECT_NEAR(m.cldice, validation.cldice, kSweepTol);
  // dppredict --dataset scores the same samples at the same size (and masks them there).
  o.inputs.clear();
  o.masks.clear();
  o.dataset = b.out;
  o.scale_y = o.scale_x = 1;  // the samples as stored (auto: the fixture's 1 over the set's 0.5)
  app::SegmentationMetrics d;
  ASSERT_EQ(app::run_predict(o, self, Logger(1), &d), 0);
  EXPECT_EQ(d.pixels, 4 * kPhoto * kPhoto);
  EXPECT_NEAR(d.sweep.ods, validation.ods, kSweepTol);
  EXPECT_NEAR(d.sweep.ods_threshold, validation.ods_threshold, 1e-9);
  EXPECT_NEAR(d.cldice, validation.cldice, kSweepTol);
}

// --precision bf16: the probabilities of the fp32 model with bf16 activations differ from fp32's
// by bf16 rounding only (measured 4.1e-4 here), and the command line accepts it.
// --threshold ods: the threshold of the validation's best F-measure, recorded by dptrain for the
// checkpoint's epoch; dppredict's own sweep over the same split finds the same one. --threshold
// auto (the default) uses it too, and 0.5 where none was recorded.
TEST_F(Predict, ThresholdOdsIsTheOneTheValidationRecorded) {
  const CheckpointMeta meta = read_checkpoint_meta(checkpoint_);
  ASSERT_EQ(meta.valid_ods_threshold.size(), 1u);
  const double recorded = meta.valid_ods_threshold[0];
  ASSERT_TRUE(recorded > 0 && recorded < 1) << recorded;
  auto r = test::run_command(dppredict(2, "--dataset " + data_ + " -q --threshold ods"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::smatch used, swept;
  ASSERT_TRUE(
      std::regex_search(r.output, used, std::regex("; threshold ([0-9.]+) \\(validation ODS\\)")))
      << r.output;
  EXPECT_NEAR(std::stod(used[1]), recorded, 1e-6) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, swept, std::regex("ods [0-9.]+ \\(t ([0-9.]+)\\)")))
      << r.output;
  EXPECT_NEAR(std::stod(swept[1]), recorded, 0.006) << r.output;
  // With another threshold, the recorded one is named (once, by rank 0).
  r = test::run_command(dppredict(2, "--dataset " + data_ + " -q --threshold 0.5"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output,
                  "; threshold 0.5 (--threshold; the checkpoint's validation had its best "
                  "F-measure at "),
            1)
      << r.output;
  // The default, --threshold auto, masks at the recorded threshold and says why.
  r = test::run_command(dppredict(2, "--dataset " + data_ + " -q"));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(std::regex_search(
      r.output, used,
      std::regex("; threshold ([0-9.]+) \\(--threshold auto: the validation ODS threshold of "
                 "epoch 1\\)")))
      << r.output;
  EXPECT_NEAR(std::stod(used[1]), recorded, 1e-6) << r.output;
  EXPECT_EQ(count(r.output, "--threshold auto"), 1) << r.output;  // once, by rank 0
  std::smatch masked;
  ASSERT_TRUE(std::regex_search(r.output, masked, std::regex("pixels, threshold ([0-9.]+)\\)")))
      << r.output;
  EXPECT_NEAR(std::stod(masked[1]), recorded, 1e-6) << r.output;

  // A checkpoint without the record (an older dptrain's): one usage-error line.
  const std::string old = dir_->file("old.h5");
  std::filesystem::copy_file(checkpoint_, old, std::filesystem::copy_options::overwrite_existing);
  const hid_t file = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_GE(H5Adelete(file, "history_valid_ods_threshold"), 0);
  H5Fclose(file);
  r = test::run_command(mpi(1, test::program("dppredict"),
                            "-c " + old + " --dataset " + data_ + " -q --threshold ods"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(count(r.output, "error:"), 1) << r.output;
  EXPECT_NE(r.output.find("--threshold ods: checkpoint '" + old +
                          "' records no validation ODS threshold for its epoch 1"),
            std::string::npos)
      << r.output;
  // --threshold auto on it: 0.5, said once.
  r = test::run_command(
      mpi(2, test::program("dppredict"), "-c " + old + " --dataset " + data_ + " -q"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output,
                  "; threshold 0.5 (--threshold auto: the checkpoint records no validation ODS "
                  "threshold for its epoch 1)"),
            1)
      << r.output;
  EXPECT_NE(r.output.find("pixels, threshold 0.5)"), std::string::npos) << r.output;
}

// A checkpoint with averaged weights (dptrain --ema): dppredict runs them, --raw-weights the raw
// ones, and the start-up line says which.
TEST_F(Predict, AveragedWeightsAreTheDefaultAndRawWeightsAFlag) {
  auto be = make_cpu_backend();
  ModelConfig mc;
  mc.width_divisor = 16;
  auto m = make_model(mc, *be);
  const CheckpointMeta meta =
      load_checkpoint(checkpoint_, m->params(), OptimizerState{}, &m->buffers());
  const size_t n = size_t(m->params().arena_size());
  const std::vector<float> raw(m->params().values(), m->params().values() + n);
  std::vector<float> averaged(raw), buffers(size_t(m->buffers().arena_size()));
  for (float& v : averaged) v *= 0.5f;
  const std::string path = dir_->file("ema.h5");
  const AveragedWeights arenas{averaged.data(), buffers.data()};
  save_checkpoint(path, m->params(), OptimizerState{}, meta, &m->buffers(), &arenas);
  for (const bool use_raw : {false, true}) {
    app::PredictorOptions po;
    po.raw_weights = use_raw;
    app::Predictor p(path, po);
    EXPECT_EQ(p.averaged(), !use_raw);
    const float* v = p.model().params().values();
    EXPECT_EQ(std::vector<float>(v, v + n), use_raw ? raw : averaged) << "raw " << use_raw;
  }
  auto r = test::run_command(
      mpi(1, test::program("dppredict"), "-c " + path + " --dataset " + data_ + " -q"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "(its averaged weights, dptrain --ema)"), 1) << r.output;
  r = test::run_command(mpi(1, test::program("dppredict"),
                            "-c " + path + " --dataset " + data_ + " -q --raw-weights"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "(its raw weights, --raw-weights)"), 1) << r.output;
  // A checkpoint without them: neither is said.
  r = test::run_command(dppredict(1, "--dataset " + data_ + " -q"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "weights, "), 0) << r.output;
}

TEST_F(Predict, Bf16ProbabilitiesFollowFp32) {
  if (!cpu_bf16_support().empty()) GTEST_SKIP() << "no bf16 on this CPU: " << cpu_bf16_support();
  app::PredictorOptions bf16_options;
  bf16_options.precision = Precision::kBFloat16;
  app::Predictor fp32(checkpoint_, {}), bf16(checkpoint_, bf16_options);
  const data::Dataset val(data_, "val");
  double worst = 0;
  bool differ = false;
  for (int64_t i = 0; i < val.size(); ++i) {
    data::Image img{kSize, kSize, 3, std::vector<uint8_t>(kSize * kSize * 3)};
    std::vector<uint8_t> mask(kSize * kSize);
    val.read(i, img.pixels.data(), mask.data());
    const std::vector<float> a = fp32.predict(img), b = bf16.predict(img);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      worst = std::max(worst, double(std::fabs(a[k] - b[k])));
      differ = differ || a[k] != b[k];
    }
  }
  std::printf("[predict] bf16 against fp32: max |probability difference| %.3e\n", worst);
  EXPECT_LT(worst, 5e-3);
  EXPECT_TRUE(differ) << "bf16 gave the fp32 probabilities exactly: bf16 did not run";
  const auto r = test::run_command(dppredict(1, "--dataset " + data_ + " -q --precision bf16"));
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST_F(Predict, ImagesOfAnySizeAndFormatGiveMasksOfTheirSize) {
  const std::string in = dir_->file("photos"), out = dir_->file("out");
  std::filesystem::create_directories(in);
  // A 1000x700 photograph (synthetic cracks), a grayscale JPEG and a 16-bit PNG of odd sizes.
  data::SynthOptions so;
  so.width = 1000;
  so.height = 700;
  data::Image big{1000, 700, 3, std::vector<uint8_t>(1000 * 700 * 3)};
  std::vector<uint8_t> big_mask(1000 * 700);
  data::render_synthetic(so, 3, big.pixels.data(), big_mask.data());
  data::write_png(in + "/big.png", big.pixels.data(), 1000, 700, 3);
  std::vector<uint8_t> gray(37 * 50, 90);
  data::write_jpeg(in + "/gray.JPG", gray.data(), 37, 50, data::PixelFormat::kGray, 90);
  std::vector<uint16_t> deep(45 * 20 * 3, 30000);
  data::write_png16(in + "/deep.png", deep.data(), 45, 20, 3);
  std::ofstream(in + "/notes.txt") << "not an image, not listed";
  std::ofstream(in + "/._big.png") << "macOS metadata, hidden, not listed";

  const auto r = test::run_command(
      dppredict(2, "-o " + out + " --overlay --save-prob --prob-format png8 --threshold 0.5 " +
                       "--min-crack-px 1 " + in));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("3 image(s) on 2 rank(s)"), std::string::npos) << r.output;
  const std::map<std::string, std::pair<int, int>> expected = {
      {"big", {1000, 700}}, {"gray", {37, 50}}, {"deep", {45, 20}}};
  for (const auto& [stem, size] : expected) {
    for (const char* sub : {"masks", "prob", "overlay"}) {
      const std::string path = out + "/" + sub + "/" + stem + ".png";
      ASSERT_TRUE(std::filesystem::exists(path)) << path << "\n" << r.output;
      const data::ImageHeader h = data::read_image_header(path);
      EXPECT_EQ(h.width, size.first) << path;
      EXPECT_EQ(h.height, size.second) << path;
    }
  }
  // Mask = probability > 0.5 (the probability PNG holds round(255 p); no specks cleared); the
  // overlay is the image where the mask is off and tinted red where it is on.
  const data::Image mask = data::read_image(out + "/masks/big.png", data::PixelFormat::kGray);
  const data::Image prob = data::read_image(out + "/prob/big.png", data::PixelFormat::kGray);
  const data::Image overlay = data::read_image(out + "/overlay/big.png", data::PixelFormat::kRgb);
  const auto [lo, hi] = std::minmax_element(prob.pixels.begin(), prob.pixels.end());
  EXPECT_LT(*lo, *hi);  // a map of this image, not a constant
  for (size_t i = 0; i < mask.pixels.size(); ++i) {
    const uint8_t v = mask.pixels[i], p = prob.pixels[i];
    ASSERT_TRUE(v == 0 || v == 255) << int(v);
    ASSERT_TRUE(v == 255 ? p >= 128 : p <= 128) << i << ": mask " << int(v) << ", p " << int(p);
    const uint8_t* o = &overlay.pixels[3 * i];
    const uint8_t* src = &big.pixels[3 * i];
    if (v == 0)
      ASSERT_TRUE(o[0] == src[0] && o[1] == src[1] && o[2] == src[2]) << i;
    else
      ASSERT_TRUE(o[0] >= src[0] && o[1] <= src[1] && o[2] <= src[2]) << i;
  }
  // --list with the same files: the same masks.
  const std::string list = dir_->file("list.txt");
  std::ofstream(list) << "# photographs\n" << in << "/gray.JPG\n\n" << in << "/deep.png\n";
  const auto l = test::run_command(dppredict(1, "-q -o " + dir_->file("out2") + " --list " + list));
  ASSERT_EQ(l.status, 0) << l.output;
  EXPECT_TRUE(std::filesystem::exists(dir_->file("out2/masks/gray.png")));
  EXPECT_TRUE(std::filesystem::exists(dir_->file("out2/masks/deep.png")));
}

// --scale: an image predicted at half scale is its half-size copy (resized as dpprep --resize
// resizes) predicted as it is, the probabilities brought back to the image's size (bilinear);
// --scale auto takes the training scale the checkpoint records; --masks scores at the images'
// own size.
TEST_F(Predict, ScaleResizesAsTrainingDidAndScoresAtTheImagesSize) {
  constexpr int kW = 160, kH = 96;
  const std::string in = dir_->file("scale_in"), half_in = dir_->file("scale_half"),
                    truth = dir_->file("scale_truth");
  for (const std::string& d : {in, half_in, truth}) std::filesystem::create_directories(d);
  data::SynthOptions so;
  so.width = kW;
  so.height = kH;
  data::Image photo{kW, kH, 3, std::vector<uint8_t>(kW * kH * 3)};
  std::vector<uint8_t> truth_mask(kW * kH);
  data::render_synthetic(so, 5, photo.pixels.data(), truth_mask.data());
  data::write_png(in + "/photo.png", photo.pixels.data(), kW, kH, 3);
  const data::Image half = data::resize_bilinear(photo, kW / 2, kH / 2);
  data::write_png(half_in + "/photo.png", half.pixels.data(), kW / 2, kH / 2, 3);
  std::vector<uint8_t> truth_png(truth_mask);
  for (uint8_t& v : truth_png) v = v != 0 ? 255 : 0;
  data::write_png(truth + "/photo.png", truth_png.data(), kW, kH, 1);
  // The fixture's training set was not resized: its checkpoint records scale 1.
  const CheckpointMeta meta = read_checkpoint_meta(checkpoint_);
  EXPECT_EQ(meta.scale_y, 1.0);
  EXPECT_EQ(meta.scale_x, 1.0);

  const std::string common = " -q --save-prob --prob-format png8 --threshold 0.5 --min-crack-px 1 ";
  const std::string out_a = dir_->file("scale_a"), out_b = dir_->file("scale_b");
  const auto a = test::run_command(
      dppredict(1, "-o " + out_a + common + "--scale 0.5 --masks " + truth + " " + in));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("scale 0.5x0.5 (images resized by it, masks back; --scale)"),
            std::string::npos)
      << a.output;
  const auto b = test::run_command(dppredict(1, "-o " + out_b + common + "--scale 1 " + half_in));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("scale 1x1 (images as they are; --scale)"), std::string::npos)
      << b.output;
  const data::Image prob_a = data::read_image(out_a + "/prob/photo.png", data::PixelFormat::kGray);
  const data::Image prob_b = data::read_image(out_b + "/prob/photo.png", data::PixelFormat::kGray);
  ASSERT_EQ(prob_a.width, kW);
  ASSERT_EQ(prob_a.height, kH);
  std::vector<float> half_prob(prob_b.pixels.begin(), prob_b.pixels.end());
  const std::vector<float> back = data::resize_bilinear(half_prob, kW / 2, kH / 2, kW, kH);
  int differing = 0;
  for (size_t i = 0; i < back.size(); ++i) {
    // Each side rounded to 8 bits once: at most one level apart.
    ASSERT_LE(std::abs(float(prob_a.pixels[i]) - back[i]), 1.0f) << i;
    differing += prob_a.pixels[i] != prob_a.pixels[0];
  }
  EXPECT_GT(differing, 0);  // a map of the image, not a constant

  // The scores are of the written mask against the true one, at 160x96.
  const data::Image mask = data::read_image(out_a + "/masks/photo.png", data::PixelFormat::kGray);
  int64_t tp = 0, fp = 0, fn = 0;
  for (size_t i = 0; i < truth_mask.size(); ++i) {
    const bool p = mask.pixels[i] != 0, g = truth_mask[i] != 0;
    tp += p && g, fp += p && !g, fn += !p && g;
  }
  EXPECT_NE(a.output.find("metrics on " + truth + " (1 images, " + std::to_string(kW * kH) +
                          " pixels, threshold 0.5)"),
            std::string::npos)
      << a.output;
  EXPECT_NEAR(printed(a.output, "iou"), double(tp) / double(std::max<int64_t>(1, tp + fp + fn)),
              kIouTol)
      << a.output;

  // A checkpoint whose training set was resized to half: --scale auto resizes by it, from images
  // and relative to a dataset's own scale (the fixture's, 1).
  const std::string halved = dir_->file("halved.h5");
  std::filesystem::copy_file(checkpoint_, halved,
                             std::filesystem::copy_options::overwrite_existing);
  const hid_t file = H5Fopen(halved.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  for (const char* name : {"scale_y", "scale_x"}) {
    const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
    ASSERT_GE(attr, 0) << name;
    const double value = 0.5;
    EXPECT_GE(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value), 0);
    H5Aclose(attr);
  }
  H5Fclose(file);
  const std::string out_c = dir_->file("scale_c");
  const auto c = test::run_command(
      mpi(1, test::program("dppredict"), "-c " + halved + " -o " + out_c + common + in));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("scale 0.5x0.5 (images resized by it, masks back; --scale auto"),
            std::string::npos)
      << c.output;
  const data::Image prob_c = data::read_image(out_c + "/prob/photo.png", data::PixelFormat::kGray);
  EXPECT_EQ(prob_c.pixels, prob_a.pixels);
  const auto d = test::run_command(
      mpi(1, test::program("dppredict"), "-c " + halved + " -q --dataset " + data_));
  ASSERT_EQ(d.status, 0) << d.output;
  EXPECT_NE(d.output.find("scale 0.5x0.5 (images resized by it, masks back; --scale auto: the "
                          "checkpoint's training scale over the dataset's)"),
            std::string::npos)
      << d.output;

  // An image without a mask in --masks: one error line before anything runs.
  const std::string empty = dir_->file("scale_no_masks");
  std::filesystem::create_directories(empty);
  const auto e = test::run_command(
      dppredict(1, "-o " + dir_->file("scale_e") + " --masks " + empty + " " + in));
  EXPECT_NE(e.status, 0) << e.output;
  EXPECT_EQ(count(e.output, "error:"), 1) << e.output;
  EXPECT_NE(e.output.find("has no mask for '" + in + "/photo.png'"), std::string::npos) << e.output;
}

// --device cuda where no GPU can run (a build without CUDA, or no GPU visible): one usage error
// line naming the option (and, with CUDA built in, the runtime's reason), from every rank count.
// Started without a launcher, dppredict does not start MPI (a fifth of a one-photograph
// command's start-up), and predicts what one rank under mpiexec predicts. The proof: settings
// that make MPI_Init fail in Open MPI (an unknown PML) and in MPICH over UCX (an unknown
// transport) fail dptrain, which always starts MPI, and leave dppredict alone untouched.
TEST_F(Predict, WithoutALauncherMpiIsNotStarted) {
  const std::string in = dir_->file("alone_in"), out1 = dir_->file("alone_mpi");
  const std::string out0 = dir_->file("alone_self");
  std::filesystem::create_directories(in);
  const data::Image img = test_image(100, 70, 5);
  data::write_png(in + "/a.png", img.pixels.data(), 100, 70, 3);
  const std::string no_mpi = "OMPI_MCA_pml=dp_no_such_pml UCX_TLS=dp_no_such_transport ";
  const auto control =
      test::run_command(no_mpi + "timeout -s KILL 20 " + test::program("dptrain") + " --help");
  ASSERT_NE(control.status, 0) << "these settings no longer stop MPI_Init:\n" << control.output;

  const auto alone_run = test::run_command(no_mpi + alone() + " -c " + checkpoint_ + " -o " + out0 +
                                           " --save-prob --prob-format tiff32 " + in);
  ASSERT_EQ(alone_run.status, 0) << alone_run.output;
  EXPECT_NE(alone_run.output.find("1 image(s) on 1 rank(s)"), std::string::npos)
      << alone_run.output;
  const auto mpi_run =
      test::run_command(dppredict(1, "-o " + out1 + " --save-prob --prob-format tiff32 " + in));
  ASSERT_EQ(mpi_run.status, 0) << mpi_run.output;
  for (const char* file : {"/masks/a.png", "/prob/a.tif"}) {
    std::ifstream a(out0 + file, std::ios::binary), b(out1 + file, std::ios::binary);
    const std::string bytes_a((std::istreambuf_iterator<char>(a)), {});
    const std::string bytes_b((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(bytes_a.empty()) << file;
    EXPECT_EQ(bytes_a, bytes_b) << file;
  }
}

TEST_F(Predict, DeviceCudaWithoutAGpuIsOneUsageError) {
#ifdef DP_WITH_CUDA
  if (cuda::visible_device_count() > 0)
    GTEST_SKIP() << "a GPU is visible: --device cuda runs (scripts/gpu-check.sh checks it)";
#endif
  for (const int np : {1, 2}) {
    const auto r = test::run_command(dppredict(np, "--dataset " + data_ + " -q --device cuda"));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "dppredict: error:"), 1) << r.output;
    EXPECT_NE(r.output.find("--device cuda: "), std::string::npos) << r.output;
  }
}

TEST_F(Predict, BadInputIsOneErrorLineAndANonZeroExit) {
  const std::string out = dir_->file("bad_out");
  const std::string transparent = dir_->file("clear.png");
  std::vector<uint8_t> rgba(8 * 8 * 4, 0);  // alpha 0 everywhere
  data::write_png(transparent, rgba.data(), 8, 8, 4);
  const std::string corrupt = dir_->file("corrupt.png");
  std::ofstream(corrupt) << "\x89PNG\r\n\x1a\n but then nothing";
  std::filesystem::create_directories(dir_->file("empty"));
  std::filesystem::create_directories(dir_->file("a"));
  std::filesystem::create_directories(dir_->file("b"));
  const data::Image small = test_image(8, 8, 1);
  data::write_png(dir_->file("a/x.png"), small.pixels.data(), 8, 8, 3);
  data::write_png(dir_->file("b/x.png"), small.pixels.data(), 8, 8, 3);
  struct Case {
    int np;  // 0: the binary alone (an MPI singleton: a failing run ends faster than mpiexec's)
    std::string args, message;
    int status;
  };
  // A file that cannot be read or decoded fails alone (exit 6, the others predicted: see
  // AnUnreadableFileIsSkippedAndCounted); a path that does not exist, or the listing, stops the
  // run.
  const std::vector<Case> cases = {
      {0, "-o " + out + " " + transparent, "has transparent pixels", 6},
      // Rank 1 fails on its file while rank 0 succeeds: still one line, and exit 6 from both.
      {2, "-o " + out + " " + dir_->file("a/x.png") + " " + transparent,
       "[rank 1] PNG '" + transparent + "' has transparent pixels", 6},
      {0, "-o " + out + " " + corrupt, "corrupt PNG '" + corrupt + "'", 6},
      {0, "-o " + out + " " + dir_->file("absent.jpg"), "absent.jpg' does not exist", 1},
      {0, "-o " + out + " " + dir_->file("empty"), "holds no images", 1},
      {0, "-o " + out + " " + dir_->file("a") + " " + dir_->file("b"), "would both write", 1},
      {0, "-o " + out + " --tile 48 " + transparent, "multiples of 32", 2},
      {2, "-o " + out + " --threshold 1.5 " + transparent, "--threshold must be in (0, 1)", 2},
      {0, "-o " + out, "nothing to predict", 2},
      {0, transparent, "--out is required", 2},
      {0, "--dataset " + data_ + " --split test", "--split must be train or val", 2},
      {0, "--no-such-option", "unrecognised option", 2},
      {0, "--dataset " + data_ + " --cpu-conv fast",
       "--cpu-conv must be auto, direct, shape, winograd, blocked, gemm or gemm-winograd, got "
       "'fast'",
       2},
      {0, "--dataset " + data_ + " --precision fp16",
       "--precision must be fp32 or bf16, got 'fp16'", 2},
      {0, "--dataset " + data_ + " --device tpu", "--device must be auto, cpu or cuda, got 'tpu'",
       2},
  };
  for (const Case& c : cases) {
    const std::string args = "-c " + checkpoint_ + " " + c.args;
    const auto r = test::run_command(c.np == 0 ? alone() + " " + args
                                               : mpi(c.np, test::program("dppredict"), args));
    EXPECT_EQ(r.status, c.status) << c.args << "\n" << r.output;
    EXPECT_EQ(count(r.output, "dppredict: error:"), 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
  // Checkpoints: missing, or another kind of file.
  const std::vector<std::pair<std::string, std::string>> checkpoints = {
      {dir_->file("none.h5"), "' does not exist"}, {data_, data_}};
  for (const auto& [path, message] : checkpoints) {
    const auto r =
        test::run_command(alone() + " -c " + path + " -o " + out + " " + dir_->file("a"));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(count(r.output, "dppredict: error:"), 1) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  const auto h = test::run_command(alone() + " --help");
  EXPECT_EQ(h.status, 0) << h.output;
  EXPECT_NE(h.output.find("--overlap"), std::string::npos) << h.output;
}

// One bad file among good ones: it gives one error line naming it and no output; every
// other file is predicted; rank 0 sums up; every rank exits 6. Alone, and on 2 ranks where the
// bad file is rank 1's (inputs i go to rank i % 2) and rank 0 has nothing to report but the sum.
TEST_F(Predict, AnUnreadableFileIsSkippedAndCounted) {
  const std::string in = dir_->file("mixed");
  std::filesystem::create_directories(in);
  const std::vector<std::string> good = {"p0.png", "p1.jpg", "p2.png", "p4.png", "p5.jpg"};
  for (size_t i = 0; i < good.size(); ++i) {
    const data::Image img = test_image(40 + int(i), 30, i);
    if (good[i].ends_with(".png"))
      data::write_png(in + "/" + good[i], img.pixels.data(), img.width, img.height, 3);
    else
      data::write_jpeg(in + "/" + good[i], img.pixels.data(), img.width, img.height,
                       data::PixelFormat::kRgb, 90);
  }
  const std::string bad = in + "/p3.jpg";  // input 3 of 6: rank 1's on 2 ranks
  std::ofstream(bad).flush();              // empty
  for (const int np : {0, 2}) {
    const std::string out = dir_->file("mixed_out" + std::to_string(np));
    const std::string args = "-c " + checkpoint_ + " -q --save-prob --overlay -o " + out + " " + in;
    const auto r = test::run_command(np == 0 ? alone() + " " + args
                                             : mpi(np, test::program("dppredict"), args));
    EXPECT_EQ(r.status, 6) << r.output;
    EXPECT_EQ(count(r.output, "dppredict: error:"), 1) << r.output;
    const std::string rank = np == 2 ? "1" : "0";
    EXPECT_NE(r.output.find("dppredict: error: [rank " + rank + "] image '" + bad +
                            "' is empty (0 bytes)"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(count(r.output, "dppredict: 5 image(s) predicted, 1 failed"), 1) << r.output;
    EXPECT_NE(r.output.find("dppredict: 5 image(s) in "), std::string::npos) << r.output;
    for (const char* sub : {"masks", "prob", "overlay"}) {
      for (const std::string& name : good) {
        const std::string path =
            out + "/" + sub + "/" + std::filesystem::path(name).stem().string() + ".png";
        ASSERT_TRUE(std::filesystem::exists(path)) << path << "\n" << r.output;
        EXPECT_EQ(data::read_image_header(path).width,
                  data::read_image(in + "/" + name, data::PixelFormat::kRgb).width)
            << path;
      }
      // Nothing for the bad file, and no temporary left behind.
      int files = 0;
      for (const auto& e : std::filesystem::directory_iterator(out + "/" + sub)) {
        EXPECT_EQ(e.path().extension(), ".png") << e.path();
        ++files;
      }
      EXPECT_EQ(files, int(good.size())) << sub;
    }
  }
  // --list with a text file named .png and a truncated PNG besides a good image: two lines.
  const std::string text = dir_->file("text.png"), cut = dir_->file("cut.png");
  std::ofstream(text) << "just some text\n";
  const data::Image img = test_image(64, 64, 9);
  data::write_png(cut, img.pixels.data(), 64, 64, 3);
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) / 2);
  const std::string list = dir_->file("mixed_list.txt");
  std::ofstream(list) << text << "\n" << in << "/p0.png\n" << cut << "\n";
  const auto l = test::run_command(alone() + " -c " + checkpoint_ + " -q -o " +
                                   dir_->file("list_out") + " --list " + list);
  EXPECT_EQ(l.status, 6) << l.output;
  EXPECT_EQ(count(l.output, "dppredict: error:"), 2) << l.output;
  EXPECT_NE(l.output.find("image '" + text + "' is neither JPEG nor PNG"), std::string::npos)
      << l.output;
  EXPECT_NE(l.output.find("PNG '" + cut + "'"), std::string::npos) << l.output;
  EXPECT_NE(l.output.find("dppredict: 1 image(s) predicted, 2 failed"), std::string::npos)
      << l.output;
  EXPECT_TRUE(std::filesystem::exists(dir_->file("list_out/masks/p0.png")));
}

}  // namespace
}  // namespace dp
