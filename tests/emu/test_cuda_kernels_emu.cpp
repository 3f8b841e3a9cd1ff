// The CUDA backend's own kernels (lib/cuda/*.cu), run on the CPU by tests/emu/cuda_emu,
// against the CPU backend's ops on the same inputs: every launcher, on fp32 and bf16 storage, on
// the 4-channel vector and the scalar paths, with each launch's own grid and with grid-stride
// loops forced to take several turns. Runs everywhere (no GPU needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bf16_util.hpp"
#include "cuda_emu.hpp"
#include "dp/backend.hpp"
#include "dp/cuda/device.hpp"
#include "dp/error.hpp"
#include "kernels.cuh"
#include "tensor_util.hpp"

namespace dp {
namespace {

namespace k = cuda::kernels;
using Vec = std::vector<float>;
using test::random_vec;

constexpr cudaStream_t kStream = nullptr;
// Outputs start as NaN: an element a kernel fails to write shows.
constexpr float kUnwritten = std::numeric_limits<float>::quiet_NaN();
// The kernels compute each element by the CPU backend's expression, so where neither side
// contracts a * b + c into an FMA (x86-64 builds without -mfma; the emulated sources are built
// with -ffp-contract=off) the results are the CPU backend's bit for bit, bf16 roundings included.
// Elsewhere the CPU backend may contract: fp32 then agrees within kFp32Tol of each tensor's
// largest value, bf16 within one bf16 ulp per element.
#if defined(__x86_64__) && !defined(__FMA__)
constexpr bool kBitwise = true;
#else
constexpr bool kBitwise = false;
#endif
constexpr double kFp32Tol = 1e-6;
constexpr double kSumTol = 1e-12;      // double sums of float terms, another order
constexpr double kFloatSumTol = 1e-5;  // float sums (bias gradients), another order

// Activation storage S: float, or __nv_bfloat16 holding dp::bf16's bits.
template <typename S>
struct Storage {
  static S store(float x) { return x; }
  static float load(S x) { return x; }
  static Vec rounded(Vec v) { return v; }
};
template <>
struct Storage<__nv_bfloat16> {
  static __nv_bfloat16 store(float x) {
    __nv_bfloat16_raw raw;
    raw.x = to_bf16(x).bits;
    return raw;
  }
  static float load(__nv_bfloat16 x) { return to_float(bf16{__nv_bfloat16_raw(x).x}); }
  static Vec rounded(Vec v) { return test::rounded_to_bf16(std::move(v)); }
};

// A "device" tensor of storage type S (host memory), `offset` elements past a 16-byte boundary:
// offset 1 makes the launchers take their scalar paths.
template <typename S>
class Tensor {
 public:
  Tensor(const Vec& v, size_t offset) : buf_(v.size() + offset), offset_(offset) {
    for (size_t i = 0; i < v.size(); ++i) buf_[i + offset] = Storage<S>::store(v[i]);
  }
  S* data() { return buf_.data() + offset_; }
  Vec values() const {
    Vec v(buf_.size() - offset_);
    for (size_t i = 0; i < v.size(); ++i) v[i] = Storage<S>::load(buf_[i + offset_]);
    return v;
  }

 private:
  std::vector<S> buf_;
  size_t offset_;
};

// The values S can hold: what a bf16 backend's tensors hold for the CPU reference's inputs.
template <typename S>
Vec storable(const Vec& v) {
  return Storage<S>::rounded(v);
}

// got (stored as S) against the fp32 reference `want` stored as S (see kBitwise).
template <typename S>
void expect_stored(const std::string& what, const Vec& got, const Vec& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const Vec r = Storage<S>::rounded(want);
  if (kBitwise) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &r[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                       << " elements differ from the CPU backend's; first [" << first << "] "
                       << got[first] << " vs " << r[first];
  } else if constexpr (std::is_same_v<S, float>) {
    EXPECT_LE(test::rel_diff(got, r), kFp32Tol) << what;
  } else {
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(r[i]), 1e-30f)) - 7);
      if (!(std::fabs(got[i] - r[i]) <= ulp)) ++bad;
    }
    EXPECT_EQ(bad, 0u) << what << ": elements off by more than one bf16 ulp";
  }
}

void expect_sums(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " [" << i << "]";
}

std::vector<double> as_double(const Vec& v) {
  return {v.begin(), v.end()};
}

// n values uniform in [0.5, 2) (variances, inverse deviations).
Vec positive_vec(size_t n, uint64_t seed) {
  Vec v = random_vec(n, seed);
  for (float& x : v) x = 1.25f + 0.75f * x;
  return v;
}

// Ties for max-pool: values on a grid of 1/4.
Vec quantized(Vec v) {
  for (float& x : v) x = std::round(x * 4) / 4;
  return v;
}

struct Case {
  int c;
  size_t offset;
  const char* name;
};
// 8 and 136 channels take the 4-channel vector kernels (136: 34 groups, two channel tiles), 5 the
// scalar ones; a misaligned 8 the scalar ones as well.
const Case kCases[] = {{8, 0, "c8"}, {5, 0, "c5"}, {136, 0, "c136"}, {8, 1, "c8 misaligned"}};
// How the emulation runs each launch: its own grid or at most 2 blocks per grid-stride dimension
// (several turns of each loop), threads in forward or reverse order (see dp_emu::Order).
struct Mode {
  unsigned grid_limit;
  dp_emu::Order order;
  const char* label;
};
const Mode kModes[] = {{0, dp_emu::Order::kForward, ""},
                       {2, dp_emu::Order::kForward, " grid<=2"},
                       {0, dp_emu::Order::kReverse, " reverse"},
                       {2, dp_emu::Order::kReverse, " grid<=2 reverse"}};

// Runs body(label) under every mode.
template <typename F>
void for_each_mode(F&& body) {
  for (const Mode& m : kModes) {
    const unsigned limit = dp_emu::set_grid_stride_limit(m.grid_limit);
    const dp_emu::Order order = dp_emu::set_order(m.order);
    body(std::string(m.label));
    dp_emu::set_grid_stride_limit(limit);
    dp_emu::set_order(order);
  }
}

// Every launch on fibers (not only each kernel's first): barriers and orders are what these
// tests exercise.
class AlwaysFibers : public ::testing::Environment {
 public:
  void SetUp() override { dp_emu::set_always_fibers(true); }
};
[[maybe_unused]] ::testing::Environment* const kAlwaysFibers =
    ::testing::AddGlobalTestEnvironment(new AlwaysFibers);

template <typename S>
class EmulatedKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(Precision::kFloat32);
};
using StorageTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(EmulatedKernels, StorageTypes);

// Runs body(case, label) for every case under every mode.
template <typename F>
void for_each_case(F&& body) {
  for_each_mode([&](const std::string& mode) {
    for (const Case& c : kCases) body(c, c.name + mode);
  });
}

TYPED_TEST(EmulatedKernels, ElementWise) {
  using S = TypeParam;
  Backend& cpu = *this->cpu_;
  for_each_case([&](const Case& cs, const std::string& at) {
    const Dims d{2, 6, 10, cs.c};
    const size_t n = size_t(d.numel());
    const uint64_t seed = 100 + uint64_t(cs.c);
    const Vec a = storable<S>(random_vec(n, seed)), b = storable<S>(random_vec(n, seed + 1));
    const Vec prior = storable<S>(random_vec(n, seed + 2)), unwritten(n, kUnwritten);
    for (const bool relu : {false, true}) {
      Tensor<S> ta(a, cs.offset), tb(b, cs.offset), out(unwritten, cs.offset);
      k::add_forward(kStream, d.numel(), ta.data(), tb.data(), relu, out.data());
      Vec want(n);
      cpu.add_forward(d.numel(), a.data(), b.data(), relu, want.data());
      expect_stored<S>("add " + at + (relu ? " relu" : ""), out.values(), want);
    }
    // relu_backward: the whole tensor, and one element less (the vector path's remainder).
    for (const int64_t count : {d.numel(), d.numel() - 1}) {
      Tensor<S> tdst(a, cs.offset), tdy(b, cs.offset), out(unwritten, cs.offset);
      k::relu_backward(kStream, count, tdst.data(), tdy.data(), out.data());
      Vec want(unwritten);
      cpu.relu_backward(count, a.data(), b.data(), want.data());
      Vec got = out.values();
      got.resize(size_t(count));
      want.resize(size_t(count));
      expect_stored<S>("relu backward " + at + " count " + std::to_string(count), got, want);
    }
    {
      Tensor<S> src(a, cs.offset), dst(prior, cs.offset);
      k::accumulate(kStream, d.numel(), src.data(), dst.data());
      Vec want = prior;
      cpu.accumulate(d.numel(), a.data(), want.data());
      expect_stored<S>("accumulate " + at, dst.values(), want);
    }
  });
}

// convert: dst = act(src + bias) between storage types, and a convolution's output gradient.
TYPED_TEST(EmulatedKernels, ConversionsAndOutputGradient) {
  using S = TypeParam;
  for_each_case([&](const Case& cs, const std::string& at) {
    const int64_t pixels = 2 * 6 * 10;
    const size_t n = size_t(pixels) * size_t(cs.c);
    const uint64_t seed = 200 + uint64_t(cs.c);
    const Vec x = random_vec(n, seed), bias = random_vec(size_t(cs.c), seed + 1);
    const Vec xs = storable<S>(x), unwritten(n, kUnwritten);
    for (const bool with_bias : {false, true})
      for (const bool relu : {false, true}) {
        const std::string what = at + (with_bias ? " bias" : "") + (relu ? " relu" : "");
        Vec want(n);
        for (size_t i = 0; i < n; ++i) {
          const float v = xs[i] + (with_bias ? bias[i % size_t(cs.c)] : 0.0f);
          want[i] = relu ? std::max(v, 0.0f) : v;
        }
        Tensor<float> b(bias, cs.offset);
        const float* bp = with_bias ? b.data() : nullptr;
        {  // S -> S (a convolution's epilogue)
          Tensor<S> src(xs, cs.offset), dst(unwritten, cs.offset);
          k::convert(kStream, pixels, cs.c, src.data(), bp, relu, dst.data());
          expect_stored<S>("convert S->S " + what, dst.values(), want);
        }
        {  // in place
          Tensor<S> srcdst(xs, cs.offset);
          k::convert(kStream, pixels, cs.c, srcdst.data(), bp, relu, srcdst.data());
          expect_stored<S>("convert in place " + what, srcdst.values(), want);
        }
        {  // S -> fp32: exact
          Tensor<S> src(xs, cs.offset);
          Tensor<float> dst(unwritten, cs.offset);
          k::convert(kStream, pixels, cs.c, src.data(), bp, relu, dst.data());
          expect_stored<float>("convert S->fp32 " + what, dst.values(), want);
        }
        {  // fp32 -> S: the input rounded once, after the bias and ReLU
          Vec want32(n);
          for (size_t i = 0; i < n; ++i) {
            const float v = x[i] + (with_bias ? bias[i % size_t(cs.c)] : 0.0f);
            want32[i] = relu ? std::max(v, 0.0f) : v;
          }
          Tensor<float> src(x, cs.offset);
          Tensor<S> dst(unwritten, cs.offset);
          k::convert(kStream, pixels, cs.c, src.data(), bp, relu, dst.data());
          expect_stored<S>("convert fp32->S " + what, dst.values(), want32);
        }
      }
    // output_grad: g = dy masked by dst > 0 (written back), diff_bias = sum g, copy = g (fp32).
    const Vec dst = storable<S>(random_vec(n, seed + 2)), dy = storable<S>(random_vec(n, seed + 3));
    for (const bool masked : {true, false}) {
      Vec g(n);
      std::vector<double> bias_sum(size_t(cs.c));
      for (size_t i = 0; i < n; ++i) {
        g[i] = masked && !(dst[i] > 0.0f) ? 0.0f : dy[i];
        bias_sum[i % size_t(cs.c)] += g[i];
      }
      Tensor<S> tdst(dst, cs.offset), tdy(dy, cs.offset);
      Tensor<float> db(Vec(size_t(cs.c), kUnwritten), cs.offset), copy(unwritten, cs.offset);
      k::output_grad(kStream, pixels, cs.c, masked ? tdst.data() : nullptr, tdy.data(), db.data(),
                     copy.data());
      const std::string what = at + (masked ? " masked" : "");
      expect_stored<S>("output_grad diff_dst " + what, tdy.values(), masked ? g : dy);
      expect_stored<float>("output_grad copy " + what, copy.values(), g);
      expect_sums("output_grad diff_bias " + what, as_double(db.values()), bias_sum, kFloatSumTol);
    }
  });
}

TYPED_TEST(EmulatedKernels, BatchNorm) {
  using S = TypeParam;
  Backend& cpu = *this->cpu_;
  for_each_case([&](const Case& cs, const std::string& at) {
    const Dims d{2, 6, 10, cs.c};
    const size_t n = size_t(d.numel()), c = size_t(cs.c);
    const double count = double(d.pixels());
    const uint64_t seed = 300 + uint64_t(cs.c);
    const Vec x = storable<S>(random_vec(n, seed)), y = storable<S>(random_vec(n, seed + 1));
    const Vec dy = storable<S>(random_vec(n, seed + 2)),
              prior = storable<S>(random_vec(n, seed + 3));
    const Vec gamma = random_vec(c, seed + 4), beta = random_vec(c, seed + 5);
    const Vec unwritten(n, kUnwritten);
    // Statistics.
    Tensor<S> tx(x, cs.offset);
    std::vector<double> sums(2 * c, kUnwritten), want_sums(2 * c);
    k::batchnorm_stats(kStream, d, tx.data(), sums.data());
    cpu.batchnorm_stats(d, x.data(), want_sums.data());
    expect_sums("batchnorm stats " + at, sums, want_sums, kSumTol);
    // prepare: from the CPU's sums, bitwise the CPU's running statistics, mean and invstd.
    for (const bool training : {true, false}) {
      Vec rm = random_vec(c, seed + 6), rv = positive_vec(c, seed + 7);
      Tensor<float> trm(rm, 0), trv(rv, 0), mean(Vec(c, kUnwritten), 0), invstd(mean);
      k::batchnorm_prepare(kStream, cs.c, training, want_sums.data(), count, 1e-5f, 0.1f,
                           trm.data(), trv.data(), mean.data(), invstd.data());
      Vec wmean(c), winvstd(c);
      cpu.batchnorm_prepare(cs.c, training, want_sums.data(), count, 1e-5f, 0.1f, rm.data(),
                            rv.data(), wmean.data(), winvstd.data());
      const std::string what = "batchnorm prepare " + at + (training ? " training" : " eval");
      EXPECT_EQ(trm.values(), rm) << what << " running mean";
      EXPECT_EQ(trv.values(), rv) << what << " running var";
      EXPECT_EQ(mean.values(), wmean) << what << " mean";
      EXPECT_EQ(invstd.values(), winvstd) << what << " invstd";
    }
    const Vec mean = random_vec(c, seed + 8), invstd = positive_vec(c, seed + 9);
    Tensor<float> tmean(mean, cs.offset), tinvstd(invstd, cs.offset), tgamma(gamma, cs.offset),
        tbeta(beta, cs.offset);
    for (const bool relu : {false, true}) {
      Tensor<S> dst(unwritten, cs.offset);
      k::batchnorm_apply(kStream, d, tx.data(), tmean.data(), tinvstd.data(), tgamma.data(),
                         tbeta.data(), relu, dst.data());
      Vec want(n);
      cpu.batchnorm_apply(d, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), relu,
                          want.data());
      expect_stored<S>("batchnorm apply " + at + (relu ? " relu" : ""), dst.values(), want);
    }
    for (const bool relu : {false, true}) {
      Tensor<S> ty(y, cs.offset), tdy(dy, cs.offset);
      Tensor<float> dg(Vec(c, kUnwritten), cs.offset), dbt(dg);
      k::batchnorm_backward_stats(kStream, d, tx.data(), ty.data(), relu, tdy.data(), tmean.data(),
                                  tinvstd.data(), sums.data(), dg.data(), dbt.data());
      Vec wdy = dy, wdg(c), wdbt(c);
      std::vector<double> wsums(2 * c);
      cpu.batchnorm_backward_stats(d, x.data(), y.data(), relu, wdy.data(), mean.data(),
                                   invstd.data(), wsums.data(), wdg.data(), wdbt.data());
      const std::string what = "batchnorm backward stats " + at + (relu ? " relu" : "");
      expect_stored<S>(what + " masked diff_dst", tdy.values(), wdy);
      expect_sums(what + " sums", sums, wsums, kSumTol);
      expect_sums(what + " diff_gamma", as_double(dg.values()), as_double(wdg), kFp32Tol);
      expect_sums(what + " diff_beta", as_double(dbt.values()), as_double(wdbt), kFp32Tol);
    }
    std::vector<double> bsums(2 * c);
    for (size_t i = 0; i < 2 * c; ++i) bsums[i] = 0.1 * double(i + 1);
    for (const bool training : {true, false})
      for (const bool acc : {false, true}) {
        Tensor<S> tdy(dy, cs.offset), dx(acc ? prior : unwritten, cs.offset);
        k::batchnorm_backward_apply(kStream, d, tx.data(), tdy.data(), tmean.data(), tinvstd.data(),
                                    tgamma.data(), bsums.data(), count, training, dx.data(), acc);
        Vec want = acc ? prior : unwritten;
        cpu.batchnorm_backward_apply(d, x.data(), dy.data(), mean.data(), invstd.data(),
                                     gamma.data(), bsums.data(), count, training, want.data(), acc);
        expect_stored<S>("batchnorm backward apply " + at + (training ? " training" : " eval") +
                             (acc ? " accumulate" : ""),
                         dx.values(), want);
      }
  });
}

TYPED_TEST(EmulatedKernels, DropoutPoolUpsampleConcat) {
  using S = TypeParam;
  Backend& cpu = *this->cpu_;
  for_each_case([&](const Case& cs, const std::string& at) {
    const Dims d{2, 6, 10, cs.c}, pooled{2, 3, 5, cs.c}, twice{2, 12, 20, cs.c};
    const auto n = [](const Dims& x) { return size_t(x.numel()); };
    const uint64_t seed = 400 + uint64_t(cs.c);
    const Vec x = storable<S>(random_vec(n(d), seed)), dy = storable<S>(random_vec(n(d), seed + 1));
    const Vec prior = storable<S>(random_vec(n(d), seed + 2)), unwritten(n(d), kUnwritten);
    {  // Dropout: masks bitwise the CPU's (the same draws), then both directions.
      const std::vector<uint64_t> seeds = {seed + 3, seed + 4};
      std::vector<uint64_t> dseeds = seeds;
      Tensor<S> tx(x, cs.offset), out(unwritten, cs.offset), tdy(dy, cs.offset),
          dx(unwritten, cs.offset);
      Tensor<float> mask(Vec(size_t(d.n) * size_t(d.c), kUnwritten), cs.offset);
      k::dropout2d_forward(kStream, d, 0.3f, dseeds.data(), tx.data(), mask.data(), out.data());
      k::dropout2d_backward(kStream, d, mask.data(), tdy.data(), dx.data());
      Vec wmask(size_t(d.n) * size_t(d.c)), wout(n(d)), wdx(n(d));
      cpu.dropout2d_forward(d, 0.3f, seeds.data(), x.data(), wmask.data(), wout.data());
      cpu.dropout2d_backward(d, wmask.data(), dy.data(), wdx.data());
      EXPECT_EQ(mask.values(), wmask) << "dropout mask " << at;
      expect_stored<S>("dropout forward " + at, out.values(), wout);
      expect_stored<S>("dropout backward " + at, dx.values(), wdx);
    }
    {  // Max-pool with ties (the first maximum wins): argmax bitwise the CPU's.
      const Vec xq = storable<S>(quantized(x));
      const Vec pdy = storable<S>(random_vec(n(pooled), seed + 5));
      Tensor<S> tx(xq, cs.offset), out(Vec(n(pooled), kUnwritten), cs.offset), tdy(pdy, cs.offset);
      std::vector<uint8_t> argmax(n(pooled) + 4, 0xff);
      uint8_t* am = argmax.data() + cs.offset;
      k::maxpool2x2_forward(kStream, d, tx.data(), out.data(), am);
      std::vector<uint8_t> wargmax(n(pooled));
      Vec wout(n(pooled));
      cpu.maxpool2x2_forward(d, xq.data(), wout.data(), wargmax.data());
      expect_stored<S>("maxpool forward " + at, out.values(), wout);
      EXPECT_TRUE(std::equal(wargmax.begin(), wargmax.end(), am)) << "maxpool argmax " << at;
      Tensor<S> no_index(Vec(n(pooled), kUnwritten), cs.offset);  // inference: no argmax
      k::maxpool2x2_forward(kStream, d, tx.data(), no_index.data(), nullptr);
      expect_stored<S>("maxpool forward without argmax " + at, no_index.values(), wout);
      for (const bool acc : {false, true}) {
        Tensor<S> dx(acc ? prior : unwritten, cs.offset);
        k::maxpool2x2_backward(kStream, d, am, tdy.data(), dx.data(), acc);
        Vec want = acc ? prior : unwritten;
        cpu.maxpool2x2_backward(d, wargmax.data(), pdy.data(), want.data(), acc);
        expect_stored<S>("maxpool backward " + at + (acc ? " accumulate" : ""), dx.values(), want);
      }
    }
    {  // Bilinear x2 upsample.
      Tensor<S> tx(x, cs.offset), out(Vec(n(twice), kUnwritten), cs.offset);
      k::upsample2x_forward(kStream, d, tx.data(), out.data());
      Vec want(n(twice));
      cpu.upsample2x_forward(d, x.data(), want.data());
      expect_stored<S>("upsample forward " + at, out.values(), want);
      const Vec udy = storable<S>(random_vec(n(twice), seed + 6));
      Tensor<S> tdy(udy, cs.offset), dx(unwritten, cs.offset);
      k::upsample2x_backward(kStream, d, tdy.data(), dx.data());
      Vec wdx(n(d));
      cpu.upsample2x_backward(d, udy.data(), wdx.data());
      expect_stored<S>("upsample backward " + at, dx.values(), wdx);
    }
    {  // Concat with a 4-channel (3 when c is odd: scalar) second input.
      const Dims other{2, 6, 10, cs.c % 2 ? 3 : 4};
      const Vec b = storable<S>(random_vec(n(other), seed + 7));
      Tensor<S> ta(x, cs.offset), tb(b, cs.offset),
          out(Vec(n(d) + n(other), kUnwritten), cs.offset);
      k::concat_forward(kStream, d, ta.data(), other, tb.data(), out.data());
      Vec want(n(d) + n(other));
      cpu.concat_forward(d, x.data(), other, b.data(), want.data());
      expect_stored<S>("concat forward " + at, out.values(), want);
      const Vec cdy = storable<S>(random_vec(n(d) + n(other), seed + 8));
      Tensor<S> tdy(cdy, cs.offset), da(unwritten, cs.offset),
          db(Vec(n(other), kUnwritten), cs.offset);
      k::concat_backward(kStream, d, other, tdy.data(), da.data(), db.data());
      Vec wda(n(d)), wdb(n(other));
      cpu.concat_backward(d, other, cdy.data(), wda.data(), wdb.data());
      expect_stored<S>("concat backward a " + at, da.values(), wda);
      expect_stored<S>("concat backward b " + at, db.values(), wdb);
    }
  });
}

// The fp32-only kernels: loss, metrics, optimisers, gradient norms, filter conversions.
TEST(EmulatedKernelsFp32, LossMetricsOptimisersFilters) {
  auto cpu = make_cpu_backend(Precision::kFloat32);
  for_each_mode([&](const std::string& at) {
    const size_t n = 1000;
    const Vec logits = random_vec(n, 501), grad = random_vec(n, 502), p0 = random_vec(n, 503);
    Vec target = random_vec(n, 504);
    for (float& t : target) t = t > 0.2f ? 1.0f : 0.0f;
    {
      Tensor<float> x(logits, 0), y(target, 0), dx(Vec(n, kUnwritten), 0);
      double loss = kUnwritten;
      k::bce_with_logits(kStream, int64_t(n), x.data(), y.data(), 3.0f, 0.01f, dx.data(), &loss);
      Vec wdx(n);
      const double wloss =
          cpu->bce_with_logits(int64_t(n), logits.data(), target.data(), 3.0f, 0.01f, wdx.data());
      EXPECT_NEAR(loss, wloss, kSumTol * std::fabs(wloss)) << "bce loss" << at;
      expect_stored<float>("bce diff" + at, dx.values(), wdx);
    }
    for (const auto& [alpha, gamma] : {std::pair{0.25f, 2.0f}, {-1.0f, 1.5f}}) {
      Tensor<float> x(logits, 0), y(target, 0), dx(Vec(n, kUnwritten), 0);
      double loss = kUnwritten;
      k::focal_with_logits(kStream, int64_t(n), x.data(), y.data(), alpha, gamma, 0.01f, dx.data(),
                           &loss);
      Vec wdx(n);
      const double wloss = cpu->focal_with_logits(int64_t(n), logits.data(), target.data(), alpha,
                                                  gamma, 0.01f, wdx.data());
      EXPECT_NEAR(loss, wloss, kSumTol * std::fabs(wloss)) << "focal loss" << at;
      expect_stored<float>("focal diff" + at, dx.values(), wdx);
    }
    for (const bool accumulate : {false, true}) {  // 4 images of 250 pixels
      Tensor<float> x(logits, 0), y(target, 0), dx(grad, 0);
      std::vector<double> sums(8, kUnwritten);
      k::dice_with_logits(kStream, 4, int64_t(n) / 4, x.data(), y.data(), 1.0f, 0.25f, dx.data(),
                          accumulate, sums.data());
      Vec wdx = grad;
      const double wloss = cpu->dice_with_logits(4, int64_t(n) / 4, logits.data(), target.data(),
                                                 1.0f, 0.25f, wdx.data(), accumulate);
      double loss = 0;
      for (size_t i = 0; i < 4; ++i) loss += 1 - (2 * sums[2 * i] + 1) / (sums[2 * i + 1] + 1);
      EXPECT_NEAR(loss, wloss, kSumTol * std::fabs(wloss)) << "dice loss" << at;
      expect_stored<float>(str_cat("dice diff", accumulate ? " accumulated" : "", at), dx.values(),
                           wdx);
    }
    {
      Tensor<float> x(logits, 0), y(target, 0);
      std::vector<unsigned long long> counts = {1, 2, 3};
      k::confusion_counts(kStream, int64_t(n), x.data(), y.data(), 0.1f, counts.data());
      int64_t want[3] = {1, 2, 3};
      cpu->confusion_counts(int64_t(n), logits.data(), target.data(), 0.1f, want);
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(int64_t(counts[size_t(i)]), want[i]) << "confusion count " << i << at;
    }
    for (const bool nesterov : {false, true}) {
      Tensor<float> p(p0, 0), g(grad, 0), m(logits, 0);
      k::sgd_update(kStream, int64_t(n), p.data(), g.data(), m.data(), 0.05f, 0.9f, 1e-4f,
                    nesterov);
      Vec wp = p0, wm = logits;
      cpu->sgd_update(int64_t(n), wp.data(), grad.data(), wm.data(), 0.05f, 0.9f, 1e-4f, nesterov);
      EXPECT_EQ(p.values(), wp) << "sgd param" << (nesterov ? " nesterov" : "") << at;
      EXPECT_EQ(m.values(), wm) << "sgd momentum" << (nesterov ? " nesterov" : "") << at;
    }
    {
      Vec v0 = random_vec(n, 505);
      for (float& v : v0) v = v * v;
      Tensor<float> p(p0, 0), g(grad, 0), m(logits, 0), v(v0, 0);
      k::adamw_update(kStream, int64_t(n), p.data(), g.data(), m.data(), v.data(), 0.999f, 0.9f,
                      0.999f, 1e-8f, 1e-3f, 0.7f);
      Vec wp = p0, wm = logits, wv = v0;
      cpu->adamw_update(int64_t(n), wp.data(), grad.data(), wm.data(), wv.data(), 0.999f, 0.9f,
                        0.999f, 1e-8f, 1e-3f, 0.7f);
      expect_stored<float>("adamw param" + at, p.values(), wp);
      expect_stored<float>("adamw exp_avg" + at, m.values(), wm);
      expect_stored<float>("adamw exp_avg_sq" + at, v.values(), wv);
    }
    {
      Tensor<float> g(grad, 0);
      double sum = kUnwritten;
      k::sum_squares(kStream, int64_t(n), g.data(), &sum);
      const double want = cpu->sum_squares(int64_t(n), grad.data());
      EXPECT_NEAR(sum, want, kSumTol * want) << "sum_squares" << at;
      k::scale(kStream, int64_t(n), 0.3f, g.data());
      Vec wg = grad;
      cpu->scale(int64_t(n), 0.3f, wg.data());
      EXPECT_EQ(g.values(), wg) << "scale" << at;
      cuda::fill(g.data(), n, 2.5f, kStream);
      EXPECT_EQ(g.values(), Vec(n, 2.5f)) << "fill" << at;
      cuda::axpy(g.data(), grad.data(), n, -2.0f, kStream);
      Vec wa(n);
      for (size_t i = 0; i < n; ++i) wa[i] = 2.5f + -2.0f * grad[i];
      EXPECT_EQ(g.values(), wa) << "axpy" << at;
    }
    // Filters [k, c, r, s] to bf16, in place or as [k, r, s, c], and back.
    const int kk = 6, c = 5, rs = 9;
    const Vec w = random_vec(size_t(kk * c * rs), 506);
    for (const bool krsc : {false, true}) {
      Tensor<float> src(w, 0), back(Vec(w.size(), kUnwritten), 0);
      Tensor<__nv_bfloat16> b16(Vec(w.size(), kUnwritten), 0);
      k::filter_to_bf16(kStream, kk, c, rs, src.data(), krsc, b16.data());
      const Vec r = test::rounded_to_bf16(w), got = b16.values();
      for (int o = 0; o < kk; ++o)
        for (int i = 0; i < c; ++i)
          for (int q = 0; q < rs; ++q) {
            const size_t from = size_t((o * c + i) * rs + q);
            const size_t to = krsc ? size_t((o * rs + q) * c + i) : from;
            ASSERT_EQ(got[to], r[from]) << "filter_to_bf16" << (krsc ? " krsc" : "") << at;
          }
      k::filter_from_bf16(kStream, kk, c, rs, b16.data(), krsc, back.data());
      EXPECT_EQ(back.values(), r) << "filter_from_bf16" << (krsc ? " krsc" : "") << at;
    }
  });
}

// The emulation itself: launches ran, with several blocks per grid under the limit.
TEST(EmulatedKernelsFp32, GridLimitStillCoversEveryElement) {
  const size_t n = 5000;  // 20 blocks of 256 as launched
  Tensor<float> g(Vec(n, 1.0f), 0);
  const uint64_t launches = dp_emu::launches(), threads = dp_emu::threads_run();
  const unsigned before = dp_emu::set_grid_stride_limit(3);
  k::scale(kStream, int64_t(n), 2.0f, g.data());
  dp_emu::set_grid_stride_limit(before);
  EXPECT_EQ(g.values(), Vec(n, 2.0f));
  EXPECT_EQ(dp_emu::launches() - launches, 1u);
  EXPECT_EQ(dp_emu::threads_run() - threads, 3u * 256u);
}

}  // namespace
}  // namespace dp
