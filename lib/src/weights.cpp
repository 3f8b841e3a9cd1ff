// Name maps between PyTorch state_dict keys (torchvision, the reference network) and dptrain's
// parameter names, and the importer that uses them.
#include "dp/weights.hpp"

#include <map>
#include <regex>

#include "dp/error.hpp"
#include "dp/h5.hpp"

namespace dp {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string strip_prefix(const std::string& s, const std::string& prefix) {
  return starts_with(s, prefix) ? s.substr(prefix.size()) : s;
}

// torchvision vgg16.features index of each conv -> (UNet16 stage, index inside the stage).
const std::map<int, std::pair<int, int>>& vgg_index_map() {
  static const std::map<int, std::pair<int, int>> map = {
      {0, {1, 0}},  {2, {1, 2}},  {5, {2, 0}},  {7, {2, 2}},  {10, {3, 0}},
      {12, {3, 2}}, {14, {3, 4}}, {17, {4, 0}}, {19, {4, 2}}, {21, {4, 4}},
      {24, {5, 0}}, {26, {5, 2}}, {28, {5, 4}}};
  return map;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += str_cat(i ? "," : "", s[i]);
  return out + "]";
}

}  // namespace

std::string canonical_weight_name(const std::string& model, const std::string& key) {
  if (key.find("num_batches_tracked") != std::string::npos) return "";
  if (model == "unet16") {
    static const std::regex vgg(R"((?:features|encoder)\.(\d+)\.(weight|bias))");
    std::smatch m;
    if (std::regex_match(key, m, vgg)) {
      // Indices are below 31: a longer digit string (std::stoi would throw) names no layer.
      const std::string index = m[1].str();
      const auto it =
          index.size() <= 2 ? vgg_index_map().find(std::stoi(index)) : vgg_index_map().end();
      if (it == vgg_index_map().end()) return "";
      return str_cat("conv", it->second.first, ".", it->second.second, ".", m[2].str());
    }
    if (starts_with(key, "classifier.")) return "";
    return key;
  }
  // ResNet UNets: the reference keeps torchvision's ResNet as `encoder.*` and aliases its parts.
  const std::string k = strip_prefix(key, "encoder.");
  if (starts_with(k, "fc.")) return "";
  if (starts_with(k, "conv1.") && !starts_with(k, "conv1.0.") && !starts_with(k, "conv1.1."))
    return str_cat("conv1.0.", k.substr(6));
  if (starts_with(k, "bn1.")) return str_cat("conv1.1.", k.substr(4));
  static const std::regex layer(R"(layer([1-4])\.(.*))");
  std::smatch m;
  if (std::regex_match(k, m, layer))
    return str_cat("conv", std::stoi(m[1].str()) + 1, ".", m[2].str());
  return k;
}

bool is_encoder_weight(const std::string& model, const std::string& name) {
  static const std::regex encoder(R"(conv[1-5]\..*)");
  (void)model;  // both UNets call their encoder stages conv1..conv5
  return std::regex_match(name, encoder);
}

ImportReport import_weights(const std::string& path, const std::string& model, ParamStore& params,
                            ParamStore& buffers, bool encoder_only) {
  std::lock_guard lock(h5::mutex());
  h5::File file(path, h5::Mode::kRead);
  // Tensors in the file: root datasets (PyTorch keys) or a dptrain checkpoint's groups.
  std::vector<std::pair<std::string, std::string>> entries;  // (key, dataset path)
  for (const std::string& group : {std::string("params"), std::string("buffers")}) {
    if (!file.exists(group)) continue;
    for (const std::string& k : file.open_group(group).children())
      entries.emplace_back(k, group + "/" + k);
  }
  for (const std::string& k : file.children())
    if (k != "params" && k != "buffers" && k != "optim") entries.emplace_back(k, k);

  // Read into the host copies (the current values first: an encoder-only import keeps the rest),
  // stored to the device once every tensor is there.
  params.download();
  buffers.download();
  ImportReport report;
  std::map<std::string, bool> done;
  for (const auto& [key, dataset] : entries) {
    const std::string name = canonical_weight_name(model, key);
    const ParamView* v = name.empty() ? nullptr : params.find(name);
    if (v == nullptr && !name.empty()) v = buffers.find(name);
    if (v == nullptr || (encoder_only && !is_encoder_weight(model, name))) {
      report.ignored.push_back(key);
      continue;
    }
    h5::Dataset d = h5::Dataset::open(file, dataset);
    DP_CHECK(d.shape() == v->shape, "weights '", path, "': '", key, "' has shape ",
             shape_str(d.shape()), " but ", model, "'s ", v->name, " is ", shape_str(v->shape),
             " (another architecture or --width-divisor?)");
    if (done[name]) continue;  // the reference lists shared layers twice (encoder.* and conv*.*)
    d.read(v->host);
    done[name] = true;
    ++report.loaded;
  }
  auto require_all = [&](const ParamStore& store) {
    for (const ParamView& v : store.views()) {
      if (encoder_only && !is_encoder_weight(model, v.name)) continue;
      DP_CHECK(done[v.name], "weights '", path, "' lack ", v.name, " (", shape_str(v.shape),
               ") of ", model, encoder_only ? "'s encoder" : "");
    }
  };
  require_all(params);
  require_all(buffers);
  params.upload();
  buffers.upload();
  return report;
}

}  // namespace dp
