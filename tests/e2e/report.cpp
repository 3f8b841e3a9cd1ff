// dptrain --report: base64, the SVG charts, and report.html written by a real run (well-formed,
// one curve point per epoch, sample images as PNG data URIs), also after a resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dp/checkpoint.hpp"
#include "test_util.hpp"
#include "train/report.hpp"

namespace dp {
namespace {

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A strict well-formedness check of HTML written as XML-like markup: every element closed in
// order (void elements and "/>" excepted), attributes quoted, '&' only in entities, no stray '<'
// or '>' in text. Returns an empty string, or what is wrong and where.
std::string check_well_formed(const std::string& html) {
  static const std::set<std::string> kVoid = {"meta", "img", "br", "hr", "link", "input"};
  static const std::regex kEntity("^&(amp|lt|gt|quot|#[0-9]+);");
  std::vector<std::string> open;
  auto where = [&](size_t at) {
    return str_cat(" at offset ", at, ": '", html.substr(at, 40), "'");
  };
  auto check_text = [&](size_t from, size_t to) -> std::string {
    for (size_t i = from; i < to; ++i) {
      if (html[i] == '>') return "stray '>'" + where(i);
      if (html[i] == '&' && !std::regex_search(html.substr(i, 10), kEntity))
        return "bare '&'" + where(i);
    }
    return {};
  };
  size_t at = 0;
  while (at < html.size()) {
    const size_t lt = html.find('<', at);
    if (std::string e = check_text(at, lt == std::string::npos ? html.size() : lt); !e.empty())
      return e;
    if (lt == std::string::npos) break;
    if (html.compare(lt, 4, "<!--") == 0) {
      const size_t end = html.find("-->", lt);
      if (end == std::string::npos) return "unclosed comment" + where(lt);
      at = end + 3;
      continue;
    }
    if (html.compare(lt, 9, "<!DOCTYPE") == 0) {
      at = html.find('>', lt) + 1;
      continue;
    }
    size_t i = lt + 1;
    const bool closing = html[i] == '/';
    if (closing) ++i;
    const size_t name_end = html.find_first_of(" \t\n/>", i);
    if (name_end == std::string::npos || name_end == i) return "bad tag" + where(lt);
    const std::string name = html.substr(i, name_end - i);
    i = name_end;
    bool self_closed = false;
    while (true) {  // attributes
      while (i < html.size() && std::isspace(static_cast<unsigned char>(html[i]))) ++i;
      if (i >= html.size()) return "unterminated tag" + where(lt);
      if (html[i] == '>') break;
      if (html.compare(i, 2, "/>") == 0) {
        self_closed = true;
        ++i;
        break;
      }
      if (closing) return "attributes in a closing tag" + where(lt);
      const size_t eq = html.find('=', i);
      if (eq == std::string::npos || html[eq + 1] != '"') return "unquoted attribute" + where(i);
      for (size_t k = i; k < eq; ++k)
        if (!std::isalnum(static_cast<unsigned char>(html[k])) && html[k] != '-' && html[k] != ':')
          return "bad attribute name" + where(i);
      const size_t close = html.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute" + where(i);
      if (html.find('<', eq + 2) < close) return "'<' in an attribute" + where(i);
      if (std::string e = check_text(eq + 2, close); !e.empty()) return e;
      i = close + 1;
    }
    at = i + 1;
    if (closing) {
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes <" + (open.empty() ? "nothing" : open.back()) + ">" +
               where(lt);
      open.pop_back();
    } else if (name == "style" || name == "script") {  // raw text up to its end tag
      const size_t end = html.find("</" + name + ">", at);
      if (end == std::string::npos) return "unclosed <" + name + ">";
      at = end + name.size() + 3;
    } else if (!self_closed && kVoid.count(name) == 0) {
      open.push_back(name);
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return {};
}

// Base64 decoding, for checking the embedded images (test only).
std::vector<uint8_t> base64_decode(const std::string& s) {
  static const std::string kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : s) {
    if (c == '=') break;
    acc = acc << 6 | uint32_t(kAlphabet.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  return out;
}

int points(const std::string& html, const std::string& series) {
  return count(html, "<circle class=\"pt\" data-series=\"" + series + "\"");
}

TEST(Report, Base64MatchesRfc4648) {
  const std::vector<std::pair<std::string, std::string>> vectors = {{"", ""},
                                                                    {"f", "Zg=="},
                                                                    {"fo", "Zm8="},
                                                                    {"foo", "Zm9v"},
                                                                    {"foob", "Zm9vYg=="},
                                                                    {"fooba", "Zm9vYmE="},
                                                                    {"foobar", "Zm9vYmFy"}};
  for (const auto& [in, out] : vectors)
    EXPECT_EQ(app::base64_encode(reinterpret_cast<const uint8_t*>(in.data()), in.size()), out);
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[size_t(i)] = uint8_t(i);
  EXPECT_EQ(base64_decode(app::base64_encode(all.data(), all.size())), all);
}

TEST(Report, ChartHasOnePointPerValueAndIsWellFormed) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string svg = app::svg_line_chart("Loss & <things>",
                                              {{"a", "series a", "#000", {1.0, 0.5, nan, 0.25}},
                                               {"b", "series \"b\"", "#f00", {nan, nan, nan, nan}}},
                                              4, 2);
  EXPECT_EQ(check_well_formed(svg), "") << svg;
  EXPECT_EQ(points(svg, "a"), 3);
  EXPECT_EQ(points(svg, "b"), 0);
  EXPECT_EQ(count(svg, "<polyline"), 1);  // through 1.0, 0.5 and 0.25, bridging the gap
  EXPECT_NE(svg.find("Loss &amp; &lt;things&gt;"), std::string::npos);
  // A flat series and a single epoch still give a finite chart.
  const std::string flat = app::svg_line_chart("lr", {{"lr", "lr", "#00f", {0.05}}}, 1);
  EXPECT_EQ(check_well_formed(flat), "") << flat;
  EXPECT_EQ(points(flat, "lr"), 1);
  EXPECT_EQ(flat.find("nan"), std::string::npos) << flat;
  EXPECT_EQ(flat.find("inf"), std::string::npos) << flat;
  EXPECT_NE(check_well_formed("<p><b>x</p></b>"), "");  // the checker can fail
  EXPECT_NE(check_well_formed("<p>a & b</p>"), "");
  EXPECT_NE(check_well_formed("<div><p>x</p>"), "");
}

// The y-axis labels of a chart, in order.
std::vector<std::string> y_labels(const std::string& svg) {
  std::vector<std::string> out;
  const std::regex label("class=\"ylab\"[^>]*>([^<]*)<");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator();
       ++it)
    out.push_back((*it)[1]);
  return out;
}

TEST(Report, RatioAxisIsZeroToOneAndAFlatZeroCurveStaysAboveZero) {
  // Every IoU at 0 (a model that predicts no crack yet): the ratio axis spans 0..1, not -1..1.
  const std::string iou = app::svg_line_chart("IoU", {{"iou", "IoU", "#f00", {0.0, 0.0, 0.0}}}, 3,
                                              0, std::make_pair(0.0, 1.0));
  EXPECT_EQ(y_labels(iou), (std::vector<std::string>{"0", "0.2", "0.4", "0.6", "0.8", "1"}));
  // Values inside the range do not shrink it; a free axis of a flat 0 has no negative labels.
  const std::string part = app::svg_line_chart("IoU", {{"iou", "IoU", "#f00", {0.3, 0.5}}}, 2, 0,
                                               std::make_pair(0.0, 1.0));
  EXPECT_EQ(y_labels(part).front(), "0");
  EXPECT_EQ(y_labels(part).back(), "1");
  const std::string flat = app::svg_line_chart("x", {{"x", "x", "#f00", {0.0, 0.0}}}, 2);
  for (const std::string& l : y_labels(flat)) EXPECT_NE(l.front(), '-') << flat;
}

TEST(Report, SampleScoreSaysWhenIouIsUndefined) {
  EXPECT_EQ(app::describe_sample_iou({0, 0, 0}), "no crack, none predicted");
  EXPECT_EQ(app::describe_sample_iou({0, 5, 0}), "no crack, 5 px predicted");
  EXPECT_EQ(app::describe_sample_iou({3, 1, 0}), "IoU 0.750");
  EXPECT_EQ(app::describe_sample_iou({0, 0, 4}), "IoU 0.000");  // a missed crack is 0
}

class ReportRun : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.file("tiny.h5");
    test::write_tiny_dataset(data_, 8, 6, 32);
  }
  test::CommandResult train(int epochs) {
    return test::run_command(test::mpiexec() + " -n 2 " + test::program("dptrain") + " --data " +
                             data_ + " --width-divisor 16 --batch-size 2 --report --epochs " +
                             std::to_string(epochs) + " --model-dir " + dir_.file("run"));
  }
  // Checks the page and returns it.
  std::string check_report(int epochs) {
    const std::string path = dir_.file("run/report.html");
    EXPECT_TRUE(std::filesystem::exists(path));
    const std::string html = read_text(path);
    EXPECT_EQ(check_well_formed(html), "");
    for (const char* s : {"train_loss", "valid_loss", "valid_iou", "valid_dice", "valid_ods",
                          "valid_iou_at_ods", "valid_cldice", "lr"})
      EXPECT_EQ(points(html, s), epochs) << s;
    // Self-contained: no reference to anything outside the file.
    EXPECT_EQ(count(html, "http"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
    EXPECT_EQ(html.find("<script"), std::string::npos);
    // 4 fixed validation samples x (image, ground truth, prediction), each a decodable PNG.
    const std::regex uri("src=\"data:image/png;base64,([A-Za-z0-9+/=]+)\"");
    int images = 0;
    for (auto it = std::sregex_iterator(html.begin(), html.end(), uri);
         it != std::sregex_iterator(); ++it, ++images) {
      const std::vector<uint8_t> png = base64_decode((*it)[1]);
      const std::vector<uint8_t> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
      EXPECT_TRUE(png.size() > 8 && std::equal(signature.begin(), signature.end(), png.begin()));
    }
    EXPECT_EQ(images, 3 * app::TrainingReport::kSamples);
    for (const auto& e : std::filesystem::directory_iterator(dir_.file("run")))
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
    return html;
  }
  test::TempDir dir_;
  std::string data_;
};

TEST_F(ReportRun, WrittenAfterEveryValidationAndAfterResume) {
  auto r = train(2);
  ASSERT_EQ(r.status, 0) << r.output;
  std::string html = check_report(2);
  EXPECT_EQ(points(html, "throughput"), 2);
  CheckpointMeta meta = read_checkpoint_meta(dir_.file("run/model_epoch_2.h5"));
  EXPECT_NE(html.find(str_cat("from the best model, epoch ", meta.best_epoch)), std::string::npos);
  // The sample rows: evenly spaced over the 6 validation images.
  for (const char* index : {"#0<", "#1<", "#3<", "#4<"})
    EXPECT_NE(html.find(std::string("<td>") + index), std::string::npos) << index;

  // Resumed for one more epoch: the history comes from the checkpoint (one point per epoch);
  // the predictions come from the best model (this epoch's, or model_best.h5's).
  r = train(3);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from epoch 2"), std::string::npos) << r.output;
  html = check_report(3);
  EXPECT_EQ(points(html, "throughput"), 1);  // measured only for the epochs this run trained
  meta = read_checkpoint_meta(dir_.file("run/model_epoch_3.h5"));
  EXPECT_NE(html.find(str_cat("from the best model, epoch ", meta.best_epoch)), std::string::npos);
  EXPECT_NE(html.find("report = 1"), std::string::npos);  // the options, escaped, at the end
}

TEST_F(ReportRun, NotWrittenWithoutTheOption) {
  const auto r = test::run_command(
      test::mpiexec() + " -n 1 " + test::program("dptrain") + " --data " + data_ +
      " --width-divisor 16 --batch-size 2 --epochs 1 " + "--model-dir " + dir_.file("run"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("run/report.html")));
}

}  // namespace
}  // namespace dp
