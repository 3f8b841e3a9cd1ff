// The best-epoch metric names; metrics.csv kept in step with the checkpoints.
#include "train/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "dp/error.hpp"

namespace dp::app {
namespace {

// 9 significant digits (the learning rate, a float, with 7); an epoch without validation writes
// an empty field.
std::string field(double v, int digits = 9) {
  if (std::isnan(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

const Words<BestMetric>& best_metric_words() {
  static const Words<BestMetric> words = {{"valid_loss", BestMetric::kValidLoss},
                                          {"iou", BestMetric::kIou},
                                          {"dice", BestMetric::kDice},
                                          {"ods", BestMetric::kOds}};
  return words;
}

const std::string& best_metric_name(BestMetric metric) {
  return word_of(best_metric_words(), metric);
}

bool higher_is_better(BestMetric metric) {
  return metric != BestMetric::kValidLoss;
}

MetricsCsv::MetricsCsv(const std::string& model_dir, int64_t epochs_done)
    : path_((std::filesystem::path(model_dir) / kFileName).string()) {
  std::vector<std::string> keep;
  if (std::ifstream in(path_); in) {
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line == kHeader) continue;
      long long epoch = 0;
      if (std::sscanf(line.c_str(), "%lld,", &epoch) != 1 || epoch > epochs_done) continue;
      // A row of an older dptrain (fewer columns): empty fields for the new ones.
      const auto columns = [](const std::string& l) { return std::count(l.begin(), l.end(), ','); };
      line.append(size_t(std::max<std::ptrdiff_t>(0, columns(kHeader) - columns(line))), ',');
      keep.push_back(line);
    }
  }
  std::ofstream out(path_, std::ios::trunc);
  out << kHeader << "\n";
  for (const auto& l : keep) out << l << "\n";
  out.flush();
  DP_CHECK(out.good(), "cannot write '", path_, "'");
}

void MetricsCsv::append(const MetricsRow& r) const {
  std::ofstream out(path_, std::ios::app);
  out << r.epoch << "," << field(r.lr, 7) << "," << field(r.train_loss) << ","
      << field(r.valid_loss) << "," << field(r.iou) << "," << field(r.dice) << ","
      << field(r.precision) << "," << field(r.recall) << "," << field(r.images_per_s) << ","
      << field(r.seconds) << "," << field(r.ods) << "," << field(r.ods_threshold, 3) << ","
      << field(r.ois) << "," << field(r.ap) << "," << field(r.at_ods.iou) << ","
      << field(r.at_ods.dice) << "," << field(r.at_ods.precision) << "," << field(r.at_ods.recall)
      << "," << field(r.cldice) << "\n";
  out.flush();
  DP_CHECK(out.good(), "cannot append to '", path_, "'");
}

}  // namespace dp::app
