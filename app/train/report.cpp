// The training report: curves as inline SVG, validation samples as PNG data: URIs, one HTML file
// written atomically after every validation.
#include "train/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>

#include "dp/dataset.hpp"
#include "dp/fs.hpp"
#include "dp/image_io.hpp"
#include "dp/optim.hpp"
#include "train/loss.hpp"
#include "train/optimization.hpp"

namespace dp::app {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kThumbSide = 256;  // samples larger than this are shrunk for the page
// Chart geometry (SVG user units).
constexpr double kChartWidth = 460, kChartHeight = 260;
constexpr double kLeft = 58, kRight = 14, kTop = 40, kBottom = 34;
constexpr int kYTicks = 5;  // about this many horizontal grid lines
constexpr int kMaxXTicks = 10;
constexpr double kPointRadius = 2.5;
constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kValidColor = "#d62728";
constexpr const char* kDiceColor = "#2ca02c";
constexpr const char* kLrColor = "#9467bd";
constexpr const char* kSpeedColor = "#ff7f0e";

std::string num(double v, const char* format = "%.1f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// 1, 2 or 5 times a power of ten, at least `raw`.
double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

// A PNG data: URI of an image or mask, shrunk for the page.
std::string uri_of(data::Image img, bool mask) {
  img = display_size(std::move(img), kThumbSide, mask);
  return png_data_uri(img.pixels.data(), img.width, img.height, img.channels);
}

double dice_of(double iou) {
  return 2 * iou / (1 + iou);
}

// A copy of a model's parameters and buffers, put back on destruction (also on an exception).
class WeightsSnapshot {
 public:
  explicit WeightsSnapshot(Model& model)
      : model_(model), params_(copy_of(model.params())), buffers_(copy_of(model.buffers())) {}
  ~WeightsSnapshot() {
    restore(params_, model_.params());
    restore(buffers_, model_.buffers());
  }
  WeightsSnapshot(const WeightsSnapshot&) = delete;
  WeightsSnapshot& operator=(const WeightsSnapshot&) = delete;

 private:
  static std::vector<float> copy_of(ParamStore& p) {
    p.download();
    return {p.host_values(), p.host_values() + p.arena_size()};
  }
  static void restore(const std::vector<float>& copy, ParamStore& p) {
    std::copy(copy.begin(), copy.end(), p.host_values());
    p.upload();
  }
  Model& model_;
  std::vector<float> params_, buffers_;
};

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

std::string base64_encode(const uint8_t* data, size_t size) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= size; i += 3) {
    const uint32_t v = uint32_t(data[i]) << 16 | uint32_t(data[i + 1]) << 8 | data[i + 2];
    for (const int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 0x3f];
  }
  if (const size_t rest = size - i; rest > 0) {
    const uint32_t v = uint32_t(data[i]) << 16 | (rest == 2 ? uint32_t(data[i + 1]) << 8 : 0);
    out += kAlphabet[(v >> 18) & 0x3f];
    out += kAlphabet[(v >> 12) & 0x3f];
    out += rest == 2 ? kAlphabet[(v >> 6) & 0x3f] : '=';
    out += '=';
  }
  return out;
}

std::string png_data_uri(const uint8_t* pixels, int width, int height, int channels) {
  const std::vector<uint8_t> png = data::encode_png(pixels, width, height, channels);
  return "data:image/png;base64," + base64_encode(png.data(), png.size());
}

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_line_chart(const std::string& title, const std::vector<ChartSeries>& series,
                           int64_t epochs, int64_t marker_epoch,
                           std::optional<std::pair<double, double>> y_range) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const ChartSeries& s : series)
    for (const double v : s.values)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  const bool non_negative = lo >= 0;  // a flat curve at 0 gets a band above it, not below
  if (y_range) {                      // values outside it stretch it
    lo = std::min(lo, y_range->first), hi = std::max(hi, y_range->second);
  } else if (hi - lo <= std::abs(hi) * 1e-9) {  // flat: a band around the value
    const double pad = hi != 0 ? std::abs(hi) * 0.5 : 1.0;
    lo -= pad, hi += pad;
  }
  const double step = nice_step((hi - lo) / kYTicks);
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
  if (non_negative) lo = std::max(lo, 0.0);
  const double plot_w = kChartWidth - kLeft - kRight, plot_h = kChartHeight - kTop - kBottom;
  auto x_of = [&](int64_t epoch) {
    return epochs <= 1 ? kLeft + plot_w / 2
                       : kLeft + plot_w * double(epoch - 1) / double(epochs - 1);
  };
  auto y_of = [&](double v) { return kTop + plot_h * (hi - v) / (hi - lo); };

  std::string s = str_cat("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"",
                          kChartWidth, "\" height=\"", kChartHeight, "\" viewBox=\"0 0 ",
                          kChartWidth, " ", kChartHeight, "\" role=\"img\">\n");
  s +=
      str_cat("<text class=\"title\" x=\"", kLeft, "\" y=\"18\">", html_escape(title), "</text>\n");
  // Horizontal grid and y labels.
  for (double v = lo; v <= hi + step * 1e-6; v += step) {
    const std::string y = num(y_of(v));
    s += str_cat("<line class=\"grid\" x1=\"", kLeft, "\" x2=\"", kLeft + plot_w, "\" y1=\"", y,
                 "\" y2=\"", y, "\"/>\n");
    s += str_cat("<text class=\"ylab\" x=\"", kLeft - 6, "\" y=\"", y, "\">",
                 num(std::abs(v) < step * 1e-6 ? 0.0 : v, "%.4g"), "</text>\n");
  }
  // Epoch ticks.
  const int64_t xstep = int64_t(nice_step(std::max(1.0, double(epochs) / kMaxXTicks)));
  for (int64_t e = 1; e <= std::max<int64_t>(epochs, 1); e += std::max<int64_t>(xstep, 1)) {
    const std::string x = num(x_of(e));
    s += str_cat("<line class=\"tick\" x1=\"", x, "\" x2=\"", x, "\" y1=\"", kTop + plot_h,
                 "\" y2=\"", kTop + plot_h + 4, "\"/>\n");
    s += str_cat("<text class=\"xlab\" x=\"", x, "\" y=\"", kTop + plot_h + 16, "\">", e,
                 "</text>\n");
  }
  s += str_cat("<text class=\"xtitle\" x=\"", kLeft + plot_w / 2, "\" y=\"", kChartHeight - 4,
               "\">epoch</text>\n");
  s += str_cat("<rect class=\"frame\" x=\"", kLeft, "\" y=\"", kTop, "\" width=\"", plot_w,
               "\" height=\"", plot_h, "\"/>\n");
  if (marker_epoch > 0 && marker_epoch <= epochs) {
    const std::string x = num(x_of(marker_epoch));
    s += str_cat("<line class=\"best\" x1=\"", x, "\" x2=\"", x, "\" y1=\"", kTop, "\" y2=\"",
                 kTop + plot_h, "\"><title>best epoch ", marker_epoch, "</title></line>\n");
  }
  // Legend, right-aligned above the plot.
  double lx = kChartWidth - kRight;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    constexpr double kCharWidth = 6.2, kSwatch = 16, kGap = 14;
    lx -= double(it->label.size()) * kCharWidth;
    s += str_cat("<text class=\"legend\" x=\"", num(lx), "\" y=\"32\">", html_escape(it->label),
                 "</text>\n");
    lx -= kSwatch + 4;
    s += str_cat("<line x1=\"", num(lx), "\" x2=\"", num(lx + kSwatch),
                 "\" y1=\"28\" y2=\"28\" stroke=\"", it->color, "\" stroke-width=\"2.5\"/>\n");
    lx -= kGap;
  }
  // Curves: a polyline through the values (epochs without one, e.g. not validated, are
  // bridged), then one point per value.
  for (const ChartSeries& c : series) {
    s += str_cat("<g class=\"series\" data-series=\"", c.id, "\" stroke=\"", c.color, "\" fill=\"",
                 c.color, "\">\n");
    std::string points;
    for (size_t i = 0; i < c.values.size(); ++i) {
      if (!std::isfinite(c.values[i])) continue;
      if (!points.empty()) points += ' ';
      points += str_cat(num(x_of(int64_t(i) + 1)), ",", num(y_of(c.values[i])));
    }
    if (points.find(' ') != std::string::npos)  // two points or more
      s += "<polyline fill=\"none\" points=\"" + points + "\"/>\n";
    for (size_t i = 0; i < c.values.size(); ++i) {
      if (!std::isfinite(c.values[i])) continue;
      s += str_cat("<circle class=\"pt\" data-series=\"", c.id, "\" data-epoch=\"", i + 1,
                   "\" cx=\"", num(x_of(int64_t(i) + 1)), "\" cy=\"", num(y_of(c.values[i])),
                   "\" r=\"", kPointRadius, "\"><title>epoch ", i + 1, ": ", html_escape(c.label),
                   " ", num(c.values[i], "%.6g"), "</title></circle>\n");
    }
    s += "</g>\n";
  }
  s += "</svg>\n";
  return s;
}

TrainingReport::TrainingReport(const TrainOptions& options, const std::string& data_path,
                               std::shared_ptr<const ValidationSamples> samples)
    : opt_(options), data_path_(data_path), has_val_(samples != nullptr), samples_(samples) {
  if (!samples_) return;
  for (const ValidationSamples::Sample& s : samples_->samples())
    shown_.push_back({s.index, uri_of(s.image, false),
                      uri_of(mask_image(s.mask, s.image.width, s.image.height), true), "", ""});
}

void TrainingReport::predict(Model& model, int64_t epoch) {
  const std::vector<ValidationSamples::Prediction> predictions = samples_->predict(model);
  for (size_t k = 0; k < shown_.size(); ++k) {
    const data::Image& image = samples_->samples()[k].image;
    shown_[k].prediction_uri =
        uri_of(mask_image(predictions[k].mask, image.width, image.height), true);
    shown_[k].score = describe_sample_iou(predictions[k].counts);
  }
  predicted_epoch_ = epoch;
}

void TrainingReport::update(Model& model, const CheckpointMeta& state, double lr,
                            double images_per_s, const Logger& log) {
  try {
    lr_[state.epoch] = lr;
    throughput_[state.epoch] = images_per_s;
    if (!shown_.empty() && state.best_epoch == state.epoch) {
      predict(model, state.epoch);
    } else if (!shown_.empty() && predicted_epoch_ == 0 && state.best_epoch > 0) {
      // Resumed: the best weights are in model_best.h5; borrow the model for a moment.
      const WeightsSnapshot keep(model);
      load_checkpoint((std::filesystem::path(opt_.model_dir) / kBestCheckpointName).string(),
                      model.params(), nullptr, &model.buffers());
      predict(model, state.best_epoch);
    }
    write(state);
  } catch (const std::exception& e) {
    log.warn("--report: ", opt_.model_dir, "/", kFileName, " not updated: ", e.what());
  }
}

void TrainingReport::write(const CheckpointMeta& state) const {
  const std::string path = (std::filesystem::path(opt_.model_dir) / kFileName).string();
  const std::string tmp = temp_path_for(path);
  try {
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      DP_CHECK(f.good(), "cannot create '", tmp, "'");
      f << html(state);
      f.flush();
      DP_CHECK(f.good(), "writing '", tmp, "' failed");
    }
    commit_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

std::string TrainingReport::html(const CheckpointMeta& state) const {
  const int64_t epochs = int64_t(state.train_loss.size());
  const auto n = size_t(epochs);
  std::vector<double> valid_loss(n, kNaN), iou(n, kNaN), dice(n, kNaN), lr(n, kNaN), speed(n, kNaN);
  // Recorded since 2026-12-02 (NaN before): ODS, IoU at its threshold, clDice.
  const auto history = [n](const std::vector<double>& h) {
    return h.size() == n ? h : std::vector<double>(n, kNaN);
  };
  const std::vector<double> ods = history(state.valid_ods),
                            iou_at_ods = history(state.valid_iou_at_ods),
                            cldice = history(state.valid_cldice);
  for (int64_t e = 1; e <= epochs; ++e) {
    const size_t i = size_t(e - 1);
    if (has_val_) {  // NaN for epochs that were not validated (--val-every)
      valid_loss[i] = state.valid_loss[i];
      iou[i] = state.valid_iou[i];
      // Dice from the same sums: recorded, or 2 IoU / (1 + IoU) for checkpoints without it.
      dice[i] = state.valid_dice.size() == n ? state.valid_dice[i] : dice_of(iou[i]);
    }
    // Epochs from before a resume: the LR schedule of these options; no throughput record.
    const auto l = lr_.find(e);
    lr[i] = l != lr_.end() ? l->second
                           : epoch_lr(opt_, e - 1, int(std::max<int64_t>(state.world_size, 1)));
    if (const auto t = throughput_.find(e); t != throughput_.end()) speed[i] = t->second;
  }
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n";
  h += "<title>dptrain report: " + html_escape(opt_.model_dir) + "</title>\n";
  h += R"(<style>
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 24px 0 8px 0; }
.sub { color: #666; margin: 0 0 12px 0; }
table.summary td, table.summary th { text-align: left; padding: 2px 12px 2px 0; font-size: 14px; }
table.summary th { color: #555; font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { border: 1px solid #ddd; background: #fcfcfc; }
svg.chart text { font-size: 11px; fill: #333; stroke: none; }
svg.chart text.title { font-size: 13px; font-weight: 600; }
svg.chart text.ylab { text-anchor: end; dominant-baseline: middle; }
svg.chart text.xlab, svg.chart text.xtitle { text-anchor: middle; }
svg.chart line.grid { stroke: #e4e4e4; }
svg.chart line.tick { stroke: #888; }
svg.chart line.best { stroke: #999; stroke-dasharray: 4 3; }
svg.chart rect.frame { fill: none; stroke: #999; }
svg.chart polyline { stroke-width: 2; }
table.samples td, table.samples th { padding: 4px 8px; text-align: center; font-size: 13px; }
table.samples img { width: 200px; image-rendering: pixelated; border: 1px solid #ccc; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; }
</style>
</head>
<body>
)";
  h += "<h1>dptrain report</h1>\n<p class=\"sub\">" + html_escape(opt_.model_dir) +
       " &#183; updated " + now_text() + "</p>\n";
  h += "<table class=\"summary\">\n";
  auto row = [&](const std::string& k, const std::string& v) {
    h += "<tr><th>" + html_escape(k) + "</th><td>" + html_escape(v) + "</td></tr>\n";
  };
  row("model", str_cat(state.model, " (width divisor ", state.width_divisor,
                       state.deconv != 0 ? ", deconv" : "", ") on ", state.height, "x", state.width,
                       " images"));
  row("data", data_path_);
  row("epochs", str_cat(state.epoch, " of ", opt_.epochs, ", ", state.step, " steps, ",
                        state.world_size, " rank(s), global batch ", state.global_batch));
  if (state.best_epoch > 0)
    row("best", str_cat("epoch ", state.best_epoch, " by ", has_val_ ? "" : "training ",
                        state.best_metric, " ", fixed(state.best_score, 4),
                        state.best_metric == "valid_loss"
                            ? std::string()
                            : str_cat(" (loss ", fixed(state.best_valid_loss, 4), ")")));
  if (epochs > 0) {
    const size_t i = size_t(epochs - 1);
    row("last epoch",
        str_cat(
            "train loss ", fixed(state.train_loss[i], 4),
            !has_val_ ? std::string(", no validation split")
            : std::isnan(valid_loss[i])
                ? std::string(", not validated")
                : str_cat(", valid loss ", fixed(valid_loss[i], 4), ", IoU ", fixed(iou[i], 4),
                          ", Dice ", fixed(dice[i], 4), ", clDice ", fixed(cldice[i], 4), ", ODS ",
                          fixed(ods[i], 4), " (IoU at its threshold ", fixed(iou_at_ods[i], 4),
                          ")"),
            ", lr ", num(lr[i], "%.4g"),
            std::isfinite(speed[i]) ? str_cat(", ", fixed(speed[i], 1), " img/s") : std::string()));
  }
  h += "</table>\n<h2>Curves</h2>\n<div class=\"charts\">\n";
  std::vector<ChartSeries> loss{{"train_loss", "train loss", kTrainColor, state.train_loss}};
  if (has_val_) loss.push_back({"valid_loss", "valid loss", kValidColor, valid_loss});
  h += svg_line_chart("Loss (" + Loss::describe(opt_) + ")", loss, epochs, state.best_epoch);
  if (has_val_)
    h += svg_line_chart(
        str_cat("Validation IoU and Dice (threshold ", opt_.threshold, ")"),
        {{"valid_iou", "IoU", kValidColor, iou}, {"valid_dice", "Dice", kDiceColor, dice}}, epochs,
        state.best_epoch, std::make_pair(0.0, 1.0));
  if (has_val_)
    h += svg_line_chart("ODS (--tolerance " + std::to_string(opt_.tolerance) +
                            "), IoU at the ODS threshold, clDice",
                        {{"valid_ods", "ODS", kValidColor, ods},
                         {"valid_iou_at_ods", "IoU at ODS t", kDiceColor, iou_at_ods},
                         {"valid_cldice", "clDice", kTrainColor, cldice}},
                        epochs, state.best_epoch, std::make_pair(0.0, 1.0));
  h += svg_line_chart("Learning rate", {{"lr", "lr", kLrColor, lr}}, epochs);
  h += svg_line_chart("Throughput (training images/s)",
                      {{"throughput", "img/s", kSpeedColor, speed}}, epochs);
  h += "</div>\n<h2>Validation samples</h2>\n";
  if (shown_.empty()) {
    h += "<p>No validation split: no samples to show.</p>\n";
  } else {
    h += str_cat("<p class=\"sub\">Fixed samples of the validation split; prediction (p &gt; ",
                 opt_.threshold, ") from the best model",
                 predicted_epoch_ > 0 ? str_cat(", epoch ", predicted_epoch_) : std::string(),
                 ". IoU is undefined for a sample without crack pixels: the page says whether "
                 "any were predicted.</p>\n");
    h += "<table class=\"samples\">\n<tr><th>sample</th><th>image</th><th>ground truth</th>"
         "<th>prediction</th></tr>\n";
    for (const Shown& s : shown_) {
      h += str_cat("<tr><td>#", s.index,
                   predicted_epoch_ > 0 ? "<br/>" + html_escape(s.score) : std::string(), "</td>");
      for (const std::string* uri : {&s.image_uri, &s.truth_uri, &s.prediction_uri}) {
        if (uri->empty())
          h += "<td>(none yet)</td>";
        else
          h +=
              "<td><img alt=\"sample " + std::to_string(s.index) + "\" src=\"" + *uri + "\"/></td>";
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
  }
  h += "<h2>Options</h2>\n<details><summary>effective configuration</summary><pre>" +
       html_escape(state.options) + "</pre></details>\n</body>\n</html>\n";
  return h;
}

}  // namespace dp::app
