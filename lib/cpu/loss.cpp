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

// Soft clDice (Shit et al., CVPR 2021; the published soft_skel): every array holds `images`
// images of h x w floats. Soft erosion is the minimum of a vertical and a horizontal 3-pixel
// minimum, soft dilation a 3x3 maximum (windows clipped at the border, as max-pooling's -inf
// padding). The backward passes gather: each input pixel sums the output gradients of the
// windows whose first minimum / maximum in scan order it is (PyTorch's max-pool indices), and
// the minimum of two equal values passes half the gradient to each (torch.minimum).
namespace {

struct Grid {
  int64_t images;
  int h, w;
  int64_t count() const { return images * h * w; }
};

// The first minimum of the vertical (dy) or horizontal window centred on (y, x): its offset.
inline int64_t vertical_min(const float* img, int y, int x, int h, int w) {
  int64_t best = int64_t(y > 0 ? y - 1 : y) * w + x;
  for (int yy = (y > 0 ? y : y + 1); yy <= y + 1 && yy < h; ++yy)
    if (img[int64_t(yy) * w + x] < img[best]) best = int64_t(yy) * w + x;
  return best;
}

inline int64_t horizontal_min(const float* img, int y, int x, int w) {
  const int64_t row = int64_t(y) * w;
  int64_t best = row + (x > 0 ? x - 1 : x);
  for (int xx = (x > 0 ? x : x + 1); xx <= x + 1 && xx < w; ++xx)
    if (img[row + xx] < img[best]) best = row + xx;
  return best;
}

inline int64_t window_max(const float* img, int y, int x, int h, int w) {
  int64_t best = -1;
  for (int yy = y - 1; yy <= y + 1; ++yy) {
    if (yy < 0 || yy >= h) continue;
    for (int xx = x - 1; xx <= x + 1; ++xx) {
      if (xx < 0 || xx >= w) continue;
      const int64_t i = int64_t(yy) * w + xx;
      if (best < 0 || img[i] > img[best]) best = i;
    }
  }
  return best;
}

void erode(const Grid& g, const float* in, float* out) {
  const int64_t hw = int64_t(g.h) * g.w;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.count(); ++i) {
    const float* img = in + i / hw * hw;
    const int y = int(i % hw / g.w), x = int(i % g.w);
    out[i] = std::fmin(img[vertical_min(img, y, x, g.h, g.w)], img[horizontal_min(img, y, x, g.w)]);
  }
}

void dilate(const Grid& g, const float* in, float* out) {
  const int64_t hw = int64_t(g.h) * g.w;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.count(); ++i) {
    const float* img = in + i / hw * hw;
    out[i] = img[window_max(img, int(i % hw / g.w), int(i % g.w), g.h, g.w)];
  }
}

// g_in = add + d erode(in) / d in applied to g_out.
void erode_backward(const Grid& g, const float* in, const float* g_out, const float* add,
                    float* g_in) {
  const int64_t hw = int64_t(g.h) * g.w;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.count(); ++i) {
    const int64_t base = i / hw * hw, q = i - base;
    const float* img = in + base;
    const int y = int(q / g.w), x = int(q % g.w);
    float sum = add != nullptr ? add[i] : 0.0f;
    // Windows that contain q: vertical ones centred at rows y-1..y+1, horizontal at x-1..x+1.
    for (int r = 0; r < 6; ++r) {
      const bool vertical = r < 3;
      const int ry = vertical ? y + r - 1 : y, rx = vertical ? x : x + r - 4;
      if (ry < 0 || ry >= g.h || rx < 0 || rx >= g.w) continue;
      const int64_t v = vertical_min(img, ry, rx, g.h, g.w),
                    hmin = horizontal_min(img, ry, rx, g.w);
      if ((vertical ? v : hmin) != q) continue;
      const float a = img[vertical ? v : hmin], b = img[vertical ? hmin : v];
      const float share = a < b ? 1.0f : a == b ? 0.5f : 0.0f;
      sum += share * g_out[base + int64_t(ry) * g.w + rx];
    }
    g_in[i] = sum;
  }
}

// g_in = add + d dilate(in) / d in applied to g_out.
void dilate_backward(const Grid& g, const float* in, const float* g_out, const float* add,
                     float* g_in) {
  const int64_t hw = int64_t(g.h) * g.w;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.count(); ++i) {
    const int64_t base = i / hw * hw, q = i - base;
    const float* img = in + base;
    const int y = int(q / g.w), x = int(q % g.w);
    float sum = add != nullptr ? add[i] : 0.0f;
    for (int ry = y - 1; ry <= y + 1; ++ry) {
      if (ry < 0 || ry >= g.h) continue;
      for (int rx = x - 1; rx <= x + 1; ++rx)
        if (rx >= 0 && rx < g.w && window_max(img, ry, rx, g.h, g.w) == q)
          sum += g_out[base + int64_t(ry) * g.w + rx];
    }
    g_in[i] = sum;
  }
}

// The soft skeleton of img[0] (iterations K): fills img[1..K] (the erosions), eroded_last,
// opened[0..K] and skel[0..K] (the running skeleton after each level; skel[K] is the result).
void soft_skeleton(const Grid& g, int iterations, std::vector<float*>& img, float* eroded_last,
                   std::vector<float*>& opened, std::vector<float*>& skel) {
  for (int j = 0; j <= iterations; ++j) {
    float* eroded = j < iterations ? img[size_t(j) + 1] : eroded_last;
    erode(g, img[size_t(j)], eroded);
    dilate(g, eroded, opened[size_t(j)]);
    const float *im = img[size_t(j)], *op = opened[size_t(j)];
    const float* prev = j > 0 ? skel[size_t(j) - 1] : nullptr;
    float* out = skel[size_t(j)];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < g.count(); ++i) {
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
  const int64_t n = g.count(), hw = int64_t(height) * width;
  const size_t k = size_t(iterations);
  // img[0..K], eroded_last, opened[0..K], skel[0..K], the truth's skeleton, 5 gradients.
  scratch.resize(size_t(n) * (3 * k + 10));
  float* next = scratch.data();
  auto take = [&] { return std::exchange(next, next + n); };
  std::vector<float*> img(k + 1), opened(k + 1), skel(k + 1);
  for (auto* v : {&img, &opened, &skel})
    for (float*& a : *v) a = take();
  float* eroded_last = take();
  float* truth_skel = take();
  float *g_skel = take(), *g_img = take(), *g_direct = take(), *g_opened = take(),
        *g_eroded = take();

  // The true masks' skeletons first (no gradient), then the predictions'.
  std::copy(y, y + n, img[0]);
  soft_skeleton(g, iterations, img, eroded_last, opened, skel);
  std::copy(skel[k], skel[k] + n, truth_skel);
  float* p = img[0];
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = 1.0f / (1.0f + std::exp(-x[i]));
  soft_skeleton(g, iterations, img, eroded_last, opened, skel);
  const float* pred_skel = skel[k];

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
    const float *im = img[j], *op = opened[j], *prev = j > 0 ? skel[j - 1] : nullptr;
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
    const float* eroded = j < k ? img[j + 1] : eroded_last;
    dilate_backward(g, eroded, g_opened, j < k ? g_img : nullptr, g_eroded);
    erode_backward(g, im, g_eroded, g_direct, g_img);
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
