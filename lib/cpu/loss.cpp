// CPU losses on fp32 logits (BCE with pos_weight, focal, soft Dice, soft clDice) and the confusion
// counts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops.hpp"

namespace dp::cpu {

double bce_with_logits(int64_t count, const float* x, const float* y, float pos_weight,
                       float grad_scale, float* dx) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    // loss = (1-y) x + (1 + (pw-1) y) * softplus(-x); softplus(-x) = log1p(exp(-|x|)) + max(-x,
    // 0)
    const float w = 1.0f + (pos_weight - 1.0f) * y[i];
    const float softplus = std::log1p(std::exp(-std::fabs(x[i]))) + std::fmax(-x[i], 0.0f);
    sum += static_cast<double>((1.0f - y[i]) * x[i] + w * softplus);
    const float sig_neg = 1.0f / (1.0f + std::exp(x[i]));  // sigmoid(-x)
    dx[i] = ((1.0f - y[i]) - w * sig_neg) * grad_scale;
  }
  return sum;
}

double focal_with_logits(int64_t count, const float* x, const float* y, float alpha, float gamma,
                         float grad_scale, float* dx) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    // z = +x for a crack pixel, -x for background: p_t = sigmoid(z), BCE = softplus(-z).
    const bool crack = y[i] > 0.5f;
    const float z = crack ? x[i] : -x[i];
    const float a = alpha < 0.0f ? 1.0f : crack ? alpha : 1.0f - alpha;
    const float ce = std::log1p(std::exp(-std::fabs(z))) + std::fmax(-z, 0.0f);
    const float q = 1.0f / (1.0f + std::exp(z));  // 1 - p_t
    const float pt = 1.0f - q;
    const float qg = gamma == 0.0f ? 1.0f : std::pow(q, gamma);
    sum += static_cast<double>(a * qg * ce);
    // d/dz [q^gamma ce] = -q^gamma (gamma p_t ce + q), since dq/dz = -q p_t and dce/dz = -q.
    const float dz = -a * qg * (gamma * pt * ce + q);
    dx[i] = (crack ? dz : -dz) * grad_scale;
  }
  return sum;
}

double dice_with_logits(int images, int64_t pixels, const float* x, const float* y, float smooth,
                        float grad_scale, float* dx, bool accumulate) {
  double total = 0.0;
  for (int img = 0; img < images; ++img) {
    const float* xi = x + int64_t(img) * pixels;
    const float* yi = y + int64_t(img) * pixels;
    float* di = dx + int64_t(img) * pixels;
    double inter = 0.0, card = 0.0;
#pragma omp parallel for reduction(+ : inter, card) schedule(static)
    for (int64_t j = 0; j < pixels; ++j) {
      const double p = 1.0 / (1.0 + std::exp(-double(xi[j])));
      inter += p * yi[j];
      card += p + yi[j];
    }
    const double den = card + smooth, num = 2.0 * inter + smooth;
    total += 1.0 - num / den;
    // d(1 - num/den)/dp_j = -(2 t_j den - num) / den^2; dp/dx = p (1 - p).
    const float a = float(2.0 / den * grad_scale), b = float(num / (den * den) * grad_scale);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < pixels; ++j) {
      const float p = 1.0f / (1.0f + std::exp(-xi[j]));
      const float g = (b - a * yi[j]) * p * (1.0f - p);
      di[j] = accumulate ? di[j] + g : g;
    }
  }
  return total;
}

// Soft clDice (Shit et al., CVPR 2021; the published soft_skel): every plane holds `images`
// images of h x w floats. Soft erosion is the minimum of a vertical and a horizontal 3-pixel
// minimum, soft dilation a 3x3 maximum (windows clipped at the border, as max-pooling's -inf
// padding). The forward passes record, per output pixel, where its window's first minimum /
// maximum in scan order lies (PyTorch's max-pool indices) and which of the two minima is smaller;
// the backward passes gather: each input pixel sums the gradients of the windows that chose it,
// and the minimum of two equal values passes half the gradient to each (torch.minimum). The CUDA
// version (lib/cuda/loss.cu) finds the same windows' extrema again instead of recording them; the
// sums run in the same order, so both give the same bits.
namespace {

struct Grid {
  int images, h, w;
  int64_t plane() const { return int64_t(images) * h * w; }
  // f(y, base) for every row of every image, base the row's first index, rows on the threads.
  template <typename F>
  void each_row(const F& f) const {
#pragma omp parallel for collapse(2) schedule(static)
    for (int im = 0; im < images; ++im)
      for (int y = 0; y < h; ++y) f(y, (int64_t(im) * h + y) * w);
  }
};

// Erosion code of an output pixel: bits 0-1 the row (0..2 = y-1..y+1) of the vertical minimum,
// bits 2-3 the column of the horizontal one, bits 4-5 which is smaller (0 vertical, 1 equal, 2
// horizontal). Dilation code: the 3x3 window's maximum at (row, column) = (code / 3, code % 3).
void erode(const Grid& g, const float* in, float* out, uint8_t* code) {
  const int h = g.h, w = g.w;
  g.each_row([&](int y, int64_t base) {
    const float* row = in + base;
    const float* up = y > 0 ? row - w : nullptr;
    const float* down = y + 1 < h ? row + w : nullptr;
    for (int x = 0; x < w; ++x) {
      // The first minimum in scan order: a later value must be strictly smaller.
      int vr = 1;
      float v = row[x];
      if (up != nullptr) vr = 0, v = up[x];
      if (row[x] < v) vr = 1, v = row[x];
      if (down != nullptr && down[x] < v) vr = 2, v = down[x];
      int hc = x > 0 ? 0 : 1;
      float hv = row[x > 0 ? x - 1 : x];
      if (row[x] < hv) hc = 1, hv = row[x];
      if (x + 1 < w && row[x + 1] < hv) hc = 2, hv = row[x + 1];
      const int cmp = v < hv ? 0 : v == hv ? 1 : 2;
      out[base + x] = cmp == 2 ? hv : v;
      code[base + x] = uint8_t(vr | hc << 2 | cmp << 4);
    }
  });
}

void dilate(const Grid& g, const float* in, float* out, uint8_t* code) {
  const int h = g.h, w = g.w;
  g.each_row([&](int y, int64_t base) {
    for (int x = 0; x < w; ++x) {
      int best = -1;
      float m = 0.0f;
      for (int dy = 0; dy < 3; ++dy) {
        const int yy = y + dy - 1;
        if (yy < 0 || yy >= h) continue;
        const float* r = in + base + int64_t(dy - 1) * w;
        for (int dx = 0; dx < 3; ++dx) {
          const int xx = x + dx - 1;
          if (xx < 0 || xx >= w) continue;
          if (best < 0 || r[xx] > m) best = dy * 3 + dx, m = r[xx];
        }
      }
      out[base + x] = m;
      code[base + x] = uint8_t(best);
    }
  });
}

// g_in = add + d erode(in) / d in applied to g_out (add may be nullptr).
void erode_backward(const Grid& g, const uint8_t* code, const float* g_out, const float* add,
                    float* g_in) {
  const int h = g.h, w = g.w;
  g.each_row([&](int y, int64_t base) {
    for (int x = 0; x < w; ++x) {
      float sum = add != nullptr ? add[base + x] : 0.0f;
      // The windows that contain (y, x), in the order of the CUDA version: vertical ones
      // centred at rows y-1..y+1, then horizontal ones centred at columns x-1..x+1.
      for (int r = 0; r < 6; ++r) {
        const bool vertical = r < 3;
        const int ry = vertical ? y + r - 1 : y, rx = vertical ? x : x + r - 4;
        if (ry < 0 || ry >= h || rx < 0 || rx >= w) continue;
        const int64_t o = base + int64_t(ry - y) * w + rx;
        const int c = code[o], cmp = c >> 4;
        // The window's chosen row (column) is 2 - (r % 3) when it lies on (y, x).
        if ((vertical ? (c & 3) : (c >> 2 & 3)) != 2 - r % 3) continue;
        const float share = cmp == 1 ? 0.5f : (cmp == 0) == vertical ? 1.0f : 0.0f;
        sum += share * g_out[o];
      }
      g_in[base + x] = sum;
    }
  });
}

// g_in = add + d dilate(in) / d in applied to g_out (add may be nullptr).
void dilate_backward(const Grid& g, const uint8_t* code, const float* g_out, const float* add,
                     float* g_in) {
  const int h = g.h, w = g.w;
  g.each_row([&](int y, int64_t base) {
    for (int x = 0; x < w; ++x) {
      float sum = add != nullptr ? add[base + x] : 0.0f;
      for (int ry = y - 1; ry <= y + 1; ++ry) {
        if (ry < 0 || ry >= h) continue;
        for (int rx = x - 1; rx <= x + 1; ++rx) {
          if (rx < 0 || rx >= w) continue;
          const int64_t o = base + int64_t(ry - y) * w + rx;
          // (y, x) seen from the window centred at (ry, rx): row y - ry + 1, column x - rx + 1.
          if (code[o] == (y - ry + 1) * 3 + (x - rx + 1)) sum += g_out[o];
        }
      }
      g_in[base + x] = sum;
    }
  });
}

// The planes of a soft skeleton of K iterations: img[0] the input, img[j+1] = erode(img[j]),
// eroded_last = erode(img[K]), opened[j] = dilate(erode(img[j])), skel[j] the running skeleton
// after level j (skel[K] the result), and each level's erosion and dilation codes.
struct Skeleton {
  std::vector<float*> img, opened, skel;
  float* eroded_last;
  std::vector<uint8_t*> erode_code, dilate_code;
  float* eroded(size_t j) const { return j + 1 < img.size() ? img[j + 1] : eroded_last; }
};

void soft_skeleton(const Grid& g, const Skeleton& s) {
  const int64_t n = g.plane();
  for (size_t j = 0; j < s.img.size(); ++j) {
    float* eroded = s.eroded(j);
    erode(g, s.img[j], eroded, s.erode_code[j]);
    dilate(g, eroded, s.opened[j], s.dilate_code[j]);
    const float *im = s.img[j], *op = s.opened[j];
    const float* prev = j > 0 ? s.skel[j - 1] : nullptr;
    float* out = s.skel[j];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float d = std::fmax(im[i] - op[i], 0.0f);
      out[i] = prev == nullptr ? d : prev[i] + std::fmax(d - prev[i] * d, 0.0f);
    }
  }
}

}  // namespace

double soft_cldice_with_logits(int images, int height, int width, const float* x, const float* y,
                               int iterations, float smooth, float grad_scale, float* dx,
                               bool accumulate, std::vector<float>& scratch) {
  const Grid g{images, height, width};
  const int64_t n = g.plane(), hw = int64_t(height) * width;
  const size_t k = size_t(iterations);
  // Float planes: img[0..K], eroded_last, opened[0..K], skel[0..K], the truth's skeleton, 5
  // gradients; then 2 (K + 1) byte planes of codes.
  const size_t floats = size_t(n) * (3 * k + 10), code_floats = (2 * (k + 1) * size_t(n) + 3) / 4;
  scratch.resize(floats + code_floats);
  float* next = scratch.data();
  auto take = [&] { return std::exchange(next, next + n); };
  Skeleton s;
  s.img.resize(k + 1), s.opened.resize(k + 1), s.skel.resize(k + 1);
  for (auto* v : {&s.img, &s.opened, &s.skel})
    for (float*& a : *v) a = take();
  s.eroded_last = take();
  float* truth_skel = take();
  float *g_skel = take(), *g_img = take(), *g_direct = take(), *g_opened = take(),
        *g_eroded = take();
  auto* codes = reinterpret_cast<uint8_t*>(scratch.data() + floats);
  for (size_t j = 0; j <= k; ++j) {
    s.erode_code.push_back(codes + 2 * j * size_t(n));
    s.dilate_code.push_back(codes + (2 * j + 1) * size_t(n));
  }

  // The true masks' skeletons first (no gradient), then the predictions'.
  std::copy(y, y + n, s.img[0]);
  soft_skeleton(g, s);
  std::copy(s.skel[k], s.skel[k] + n, truth_skel);
  float* p = s.img[0];
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = 1.0f / (1.0f + std::exp(-x[i]));
  soft_skeleton(g, s);
  const float* pred_skel = s.skel[k];

  // Per image: topology precision T = (sum S(p) t + s) / (sum S(p) + s), sensitivity
  // S = (sum S(t) p + s) / (sum S(t) + s), loss 1 - 2 T S / (T + S).
  double total = 0.0;
  const size_t count = static_cast<size_t>(images);
  std::vector<float> a_skel(count), b_skel(count), c_p(count);
  for (int im = 0; im < images; ++im) {
    double st = 0, sp = 0, sens = 0, sk = 0;
    const int64_t o = im * hw;
#pragma omp parallel for reduction(+ : st, sp, sens, sk) schedule(static)
    for (int64_t j = o; j < o + hw; ++j) {
      st += double(pred_skel[j]) * y[j];
      sp += pred_skel[j];
      sens += double(truth_skel[j]) * p[j];
      sk += truth_skel[j];
    }
    const double tp = (st + smooth) / (sp + smooth), ts = (sens + smooth) / (sk + smooth);
    total += 1.0 - 2.0 * tp * ts / (tp + ts);
    const double dl_dtp = -2.0 * ts * ts / ((tp + ts) * (tp + ts));
    const double dl_dts = -2.0 * tp * tp / ((tp + ts) * (tp + ts));
    // d tp / d S(p)_j = t_j / (sp + s) - (st + s) / (sp + s)^2; d ts / d p_j = S(t)_j / (sk + s).
    a_skel[size_t(im)] = float(dl_dtp / (sp + smooth));
    b_skel[size_t(im)] = float(-dl_dtp * (st + smooth) / ((sp + smooth) * (sp + smooth)));
    c_p[size_t(im)] = float(dl_dts / (sk + smooth));
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const size_t im = size_t(i / hw);
    g_skel[i] = a_skel[im] * y[i] + b_skel[im];
  }

  // Back through the levels K..0: skel[j] = skel[j-1] + relu(d - skel[j-1] d) (skel[0] = d),
  // d = relu(img[j] - opened[j]), opened[j] = dilate(eroded[j]), eroded[j] = erode(img[j]) =
  // img[j+1]. g_img holds the gradient of img[j+1] from the levels above.
  for (size_t j = k + 1; j-- > 0;) {
    const float *im = s.img[j], *op = s.opened[j], *prev = j > 0 ? s.skel[j - 1] : nullptr;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float d = std::fmax(im[i] - op[i], 0.0f);
      float gd = g_skel[i];
      if (prev != nullptr) {
        const bool on = d - prev[i] * d > 0.0f;
        gd = on ? g_skel[i] * (1.0f - prev[i]) : 0.0f;
        if (on) g_skel[i] -= g_skel[i] * d;
      }
      const bool pos = im[i] - op[i] > 0.0f;
      g_opened[i] = pos ? -gd : 0.0f;
      g_direct[i] = pos ? gd : 0.0f;
    }
    dilate_backward(g, s.dilate_code[j], g_opened, j < k ? g_img : nullptr, g_eroded);
    erode_backward(g, s.erode_code[j], g_eroded, g_direct, g_img);
  }
  // g_img is now the gradient of the skeleton's input p; add the sensitivity term.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gp = g_img[i] + c_p[size_t(i / hw)] * truth_skel[i];
    const float gx = gp * p[i] * (1.0f - p[i]) * grad_scale;
    dx[i] = accumulate ? dx[i] + gx : gx;
  }
  return total;
}

void confusion_counts(int64_t count, const float* x, const float* y, float threshold,
                      int64_t* counts) {
  int64_t tp = 0, fp = 0, fn = 0;
#pragma omp parallel for reduction(+ : tp, fp, fn) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const bool pred = x[i] > threshold, truth = y[i] > 0.5f;
    tp += pred && truth;
    fp += pred && !truth;
    fn += !pred && truth;
  }
  counts[0] += tp;
  counts[1] += fp;
  counts[2] += fn;
}

}  // namespace dp::cpu
