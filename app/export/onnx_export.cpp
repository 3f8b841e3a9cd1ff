// dpexport's exporter: the model's graph (dp::Model::graph) mapped op by op to ONNX nodes in NCHW,
// the weights as initializers, normalisation and batch norm folded into convolutions.
#include "export/onnx_export.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "dp/checkpoint.hpp"
#include "dp/cpu/cpu_backend.hpp"
#include "dp/error.hpp"
#include "dp/fs.hpp"
#include "dp/model.hpp"
#include "export/onnx.pb.h"
#include "normalization.hpp"
#include "predict/settings.hpp"

namespace dp::app {
namespace {

static_assert(std::endian::native == std::endian::little,
              "TensorProto.raw_data is little-endian; this exporter copies floats as they are");

namespace onnx = dp::onnx;
using Kind = GraphOp::Kind;

constexpr const char* kInputName = "image";
constexpr const char* kLogitsName = "logits";
constexpr const char* kProbName = "prob";
constexpr int kChannels = 3;
constexpr int64_t kMaxProtoBytes = int64_t{2} << 30;  // protobuf's limit for one message
constexpr mode_t kFileMode = 0644;                    // rw-r--r--, less the umask
constexpr int kMetadataDigits = 9;                    // significant digits: a float round-trips

// A graph under construction: nodes in order, initializers, unique tensor names.
class OnnxGraph {
 public:
  explicit OnnxGraph(onnx::GraphProto& g) : g_(g) {}

  onnx::NodeProto& node(const std::string& op_type, std::vector<std::string> inputs,
                        const std::string& output) {
    onnx::NodeProto& n = *g_.add_node();
    n.set_op_type(op_type);
    n.set_name(output);
    for (std::string& in : inputs) n.add_input(std::move(in));
    n.add_output(output);
    return n;
  }
  const std::string& initializer(const std::string& name, const std::vector<int64_t>& dims,
                                 const std::vector<float>& values) {
    onnx::TensorProto& t = *g_.add_initializer();
    t.set_name(name);
    t.set_data_type(onnx::TensorProto::FLOAT);
    int64_t count = 1;
    for (const int64_t d : dims) t.add_dims(d), count *= d;
    DP_CHECK(count == int64_t(values.size()), "onnx export: initializer ", name, " has ",
             values.size(), " values for ", count, " elements");
    t.set_raw_data(values.data(), values.size() * sizeof(float));
    parameters_ += count;
    return t.name();
  }
  // `base`, or `base` with a suffix when a tensor of that name exists already.
  std::string unique(const std::string& base) {
    const int seen = names_[base]++;
    return seen == 0 ? base : str_cat(base, "_", seen);
  }
  int64_t parameters() const { return parameters_; }

 private:
  onnx::GraphProto& g_;
  std::map<std::string, int> names_;
  int64_t parameters_ = 0;
};

void set_ints(onnx::NodeProto& n, const char* name, std::initializer_list<int64_t> values) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (const int64_t v : values) a.add_ints(v);
}
void set_int(onnx::NodeProto& n, const char* name, int64_t value) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(value);
}
void set_float(onnx::NodeProto& n, const char* name, float value) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(value);
}
void set_string(onnx::NodeProto& n, const char* name, const std::string& value) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(value);
}

// A float tensor [batch, channels, height, width] with symbolic batch, height and width.
void set_image_type(onnx::ValueInfoProto& v, const std::string& name, int channels) {
  v.set_name(name);
  onnx::TypeProto::Tensor& t = *v.mutable_type()->mutable_tensor_type();
  t.set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto& s = *t.mutable_shape();
  s.add_dim()->set_dim_param("batch");
  s.add_dim()->set_dim_value(channels);
  s.add_dim()->set_dim_param("height");
  s.add_dim()->set_dim_param("width");
}

std::vector<float> values_of(const ParamView& p) {
  return std::vector<float>(p.host, p.host + p.numel);
}

// "conv1.0.weight" -> "conv1.0".
std::string prefix_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

std::string format_number(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*g", kMetadataDigits, v);
  return text;
}

// The model of a checkpoint with its weights loaded (averaged ones unless raw_weights).
struct LoadedModel {
  CheckpointMeta meta;
  Normalization normalization;
  bool averaged = false;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

LoadedModel load(const std::string& checkpoint, bool raw_weights) {
  DP_CHECK(std::filesystem::is_regular_file(checkpoint), "checkpoint '", checkpoint,
           "' does not exist or is not a file");
  LoadedModel m;
  m.meta = read_checkpoint_meta(checkpoint);
  m.normalization = normalization_of(m.meta, checkpoint);
  ModelConfig mc;
  mc.name = m.meta.model;
  mc.width_divisor = int(m.meta.width_divisor);
  mc.deconv = m.meta.deconv != 0;
  m.backend = make_cpu_backend();
  try {
    m.model = make_model(mc, *m.backend);
  } catch (const Error& e) {
    fail("checkpoint '", checkpoint, "': ", e.what());
  }
  m.averaged = m.meta.has_averaged_weights && !raw_weights;
  const AveragedWeights into_model{m.model->params().values(), m.model->buffers().values()};
  load_checkpoint(checkpoint, m.model->params(), OptimizerState{}, &m.model->buffers(),
                  m.averaged ? &into_model : nullptr);
  return m;
}

// Writes the ONNX nodes of `graph`, whose weights `params` and `buffers` hold.
class GraphMapper {
 public:
  GraphMapper(const Graph& graph, const ParamStore& params, const ParamStore& buffers,
              const ExportOptions& options, const Normalization& normalization, OnnxGraph& out)
      : graph_(graph),
        params_(params),
        buffers_(buffers),
        options_(options),
        normalization_(normalization),
        out_(out),
        names_(graph.channels.size()) {
    producer_.assign(graph.channels.size(), -1);
    consumers_.assign(graph.channels.size(), 0);
    for (size_t i = 0; i < graph.ops.size(); ++i) {
      producer_[size_t(graph.ops[i].out)] = int(i);
      for (const int in : {graph.ops[i].in0, graph.ops[i].in1})
        if (in >= 0) ++consumers_[size_t(in)];
    }
  }

  void run(ExportSummary& summary) {
    names_[size_t(graph_.input)] = kInputName;
    if (!options_.keep_normalization) normalize_input();
    // Batch norms folded into the convolution that feeds them (and nothing else).
    std::vector<int> folded_into(graph_.ops.size(), -1);
    std::vector<bool> skip(graph_.ops.size(), false);
    for (size_t j = 0; j < graph_.ops.size(); ++j) {
      const GraphOp& bn = graph_.ops[j];
      if (bn.kind != Kind::kBatchNorm) continue;
      const int p = producer_[size_t(bn.in0)];
      if (options_.fold_batchnorm && p >= 0 && graph_.ops[size_t(p)].kind == Kind::kConv &&
          !graph_.ops[size_t(p)].relu && consumers_[size_t(bn.in0)] == 1) {
        folded_into[size_t(p)] = int(j);
        skip[j] = true;
        ++summary.batchnorm_folded;
      } else {
        ++summary.batchnorm_kept;
      }
    }
    for (size_t i = 0; i < graph_.ops.size(); ++i) {
      if (skip[i]) continue;
      const GraphOp& op = graph_.ops[i];
      switch (op.kind) {
        case Kind::kConv:
          conv(op, folded_into[i] >= 0 ? &graph_.ops[size_t(folded_into[i])] : nullptr);
          break;
        case Kind::kDeconv:
          deconv(op);
          break;
        case Kind::kBatchNorm:
          batchnorm(op);
          break;
        case Kind::kAdd:
          emit("Add", {name(op.in0), name(op.in1)}, op.out, str_cat("add_", op.out), op.relu);
          break;
        case Kind::kDropout:  // identity in evaluation
          names_[size_t(op.out)] = name(op.in0);
          break;
        case Kind::kMaxPool: {
          onnx::NodeProto& n =
              emit("MaxPool", {name(op.in0)}, op.out, str_cat("maxpool_", op.out), false);
          set_ints(n, "kernel_shape", {2, 2});
          set_ints(n, "strides", {2, 2});
          break;
        }
        case Kind::kUpsample: {
          if (scales_.empty()) scales_ = out_.initializer("upsample.scales", {4}, {1, 1, 2, 2});
          onnx::NodeProto& n = emit("Resize", {name(op.in0), "", scales_}, op.out,
                                    str_cat("upsample_", op.out), false);
          // Bilinear, PyTorch's align_corners=False: source x = (x + 0.5) / 2 - 0.5, clamped.
          set_string(n, "mode", "linear");
          set_string(n, "coordinate_transformation_mode", "half_pixel");
          break;
        }
        case Kind::kConcat: {
          onnx::NodeProto& n = emit("Concat", {name(op.in0), name(op.in1)}, op.out,
                                    str_cat("concat_", op.out), false);
          set_int(n, "axis", 1);
          break;
        }
      }
    }
    DP_CHECK(names_[size_t(graph_.output)] == kLogitsName,
             "onnx export: the model's output is not produced by an op");
  }

 private:
  const std::string& name(int node) const {
    const std::string& n = names_.at(size_t(node));
    DP_CHECK(!n.empty(), "onnx export: node ", node, " used before it is computed");
    return n;
  }
  // The tensor name of node `node` as computed by an op named `base`.
  std::string output_name(int node, const std::string& base) {
    names_[size_t(node)] = node == graph_.output ? std::string(kLogitsName) : out_.unique(base);
    return names_[size_t(node)];
  }
  // The node of an op computing graph node `node` (named after `base`), and its fused ReLU.
  onnx::NodeProto& emit(const std::string& op_type, std::vector<std::string> inputs, int node,
                        const std::string& base, bool relu) {
    if (!relu) return out_.node(op_type, std::move(inputs), output_name(node, base));
    const std::string pre = out_.unique(base);
    onnx::NodeProto& n = out_.node(op_type, std::move(inputs), pre);
    out_.node("Relu", {pre}, output_name(node, base + ".relu"));
    return n;  // RepeatedPtrField elements stay where they are
  }

  // x - mean (scaled to the input's range) as one Sub; the division by std goes into the weights
  // of the convolution that reads the input (zero padding of x - mean is zero padding of the
  // normalised input, so the borders stay exact; folding the mean into the bias would not be).
  void normalize_input() {
    for (const GraphOp& op : graph_.ops)
      DP_CHECK((op.in0 != graph_.input && op.in1 != graph_.input) ||
                   (op.kind == Kind::kConv && op.in1 != graph_.input),
               "onnx export: the model's input feeds an op other than a convolution, which the "
               "normalisation cannot be folded into (use --keep-normalization)");
    std::vector<float> mean(kChannels);
    input_scale_.resize(kChannels);
    for (int c = 0; c < kChannels; ++c) {
      mean[size_t(c)] = normalization_.mean[size_t(c)] * options_.input_scale;
      input_scale_[size_t(c)] = 1.0f / (normalization_.std[size_t(c)] * options_.input_scale);
    }
    const std::string& m = out_.initializer("normalization.mean", {1, kChannels, 1, 1}, mean);
    const std::string centered = out_.unique("image.centered");
    out_.node("Sub", {kInputName, m}, centered);
    names_[size_t(graph_.input)] = centered;
  }

  // Conv (+ the folded input scale and batch norm) (+ ReLU).
  void conv(const GraphOp& op, const GraphOp* bn) {
    const ParamView& wv = params_.view(op.weight);
    const std::string prefix = prefix_of(wv.name);
    const int64_t cout = wv.shape[0], cin = wv.shape[1], taps = wv.shape[2] * wv.shape[3];
    std::vector<float> w = values_of(wv);
    std::vector<float> b = op.bias >= 0 ? values_of(params_.view(op.bias)) : std::vector<float>();
    if (op.in0 == graph_.input && !input_scale_.empty()) {
      DP_CHECK(cin == kChannels, "onnx export: the first convolution takes ", cin, " channels");
      for (int64_t o = 0; o < cout; ++o)
        for (int64_t c = 0; c < cin; ++c)
          for (int64_t t = 0; t < taps; ++t)
            w[size_t((o * cin + c) * taps + t)] *= input_scale_[size_t(c)];
    }
    bool relu = op.relu;
    int out_node = op.out;
    std::string base = prefix;
    if (bn != nullptr) {
      // y = gamma (conv(x) + b - mean) / sqrt(var + eps) + beta, per output channel.
      const float* gamma = params_.view(bn->weight).host;
      const float* beta = params_.view(bn->bias).host;
      const float* mean = buffers_.view(bn->running_mean).host;
      const float* var = buffers_.view(bn->running_var).host;
      if (b.empty()) b.assign(size_t(cout), 0.0f);
      for (int64_t o = 0; o < cout; ++o) {
        const double s = double(gamma[o]) / std::sqrt(double(var[o]) + double(kBatchNormEps));
        for (int64_t k = 0; k < cin * taps; ++k)
          w[size_t(o * cin * taps + k)] = float(w[size_t(o * cin * taps + k)] * s);
        b[size_t(o)] = float((double(b[size_t(o)]) - double(mean[o])) * s + double(beta[o]));
      }
      relu = bn->relu;
      out_node = bn->out;
      base = prefix_of(params_.view(bn->weight).name);
    }
    std::vector<std::string> inputs = {name(op.in0), out_.initializer(wv.name, wv.shape, w)};
    if (!b.empty()) inputs.push_back(out_.initializer(prefix + ".bias", {cout}, b));
    onnx::NodeProto& n = emit("Conv", std::move(inputs), out_node, base, relu);
    set_ints(n, "kernel_shape", {wv.shape[2], wv.shape[3]});
    set_ints(n, "strides", {op.stride, op.stride});
    set_ints(n, "pads", {op.pad, op.pad, op.pad, op.pad});
  }

  // ConvTranspose: weight [cin, cout, k, k] as in PyTorch and ONNX.
  void deconv(const GraphOp& op) {
    const ParamView& wv = params_.view(op.weight);
    const ParamView& bv = params_.view(op.bias);
    onnx::NodeProto& n = emit("ConvTranspose",
                              {name(op.in0), out_.initializer(wv.name, wv.shape, values_of(wv)),
                               out_.initializer(bv.name, bv.shape, values_of(bv))},
                              op.out, prefix_of(wv.name), op.relu);
    set_ints(n, "kernel_shape", {op.kernel, op.kernel});
    set_ints(n, "strides", {op.stride, op.stride});
    set_ints(n, "pads", {op.pad, op.pad, op.pad, op.pad});
  }

  // BatchNormalization in inference mode (running statistics).
  void batchnorm(const GraphOp& op) {
    const ParamView& g = params_.view(op.weight);
    const ParamView& b = params_.view(op.bias);
    const ParamView& m = buffers_.view(op.running_mean);
    const ParamView& v = buffers_.view(op.running_var);
    onnx::NodeProto& n = emit("BatchNormalization",
                              {name(op.in0), out_.initializer(g.name, g.shape, values_of(g)),
                               out_.initializer(b.name, b.shape, values_of(b)),
                               out_.initializer(m.name, m.shape, values_of(m)),
                               out_.initializer(v.name, v.shape, values_of(v))},
                              op.out, prefix_of(g.name), op.relu);
    set_float(n, "epsilon", kBatchNormEps);
  }

  const Graph& graph_;
  const ParamStore& params_;
  const ParamStore& buffers_;
  const ExportOptions& options_;
  const Normalization& normalization_;
  OnnxGraph& out_;
  std::vector<std::string> names_;  // per node: its tensor's name once computed
  std::vector<int> producer_, consumers_;
  std::vector<float> input_scale_;  // per input channel, folded into the first convolution
  std::string scales_;              // the Resize scales' initializer
};

void add_metadata(onnx::ModelProto& m, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto& e = *m.add_metadata_props();
  e.set_key(key);
  e.set_value(value);
}

}  // namespace

namespace {

// The ModelProto of `checkpoint` (the model and its arenas are gone when it returns).
onnx::ModelProto model_proto(const std::string& checkpoint, const ExportOptions& options,
                             ExportSummary& summary) {
  DP_CHECK(options.input_scale > 0, "onnx export: input scale must be positive");
  LoadedModel lm = load(checkpoint, options.raw_weights);
  const Model& model = *lm.model;
  const CheckpointMeta& meta = lm.meta;
  summary.model = meta.model;
  summary.width_divisor = int(meta.width_divisor);
  summary.deconv = meta.deconv != 0;
  summary.averaged = lm.averaged;
  summary.size_multiple = model.size_multiple();

  onnx::ModelProto mp;
  mp.set_ir_version(kOnnxIrVersion);
  onnx::OperatorSetIdProto& opset = *mp.add_opset_import();
  opset.set_domain("");
  opset.set_version(kOnnxOpset);
  mp.set_producer_name("dpexport");
  mp.set_producer_version(DP_VERSION);
  mp.set_model_version(meta.epoch);
  const std::string scale = options.keep_normalization ? "normalised ((pixel / 255 - mean) / std)"
                            : options.input_scale == 1.0f
                                ? "RGB 0..1"
                                : str_cat("RGB 0..", format_number(options.input_scale));
  const std::string multiple = std::to_string(model.size_multiple());
  mp.set_doc_string(str_cat("dptrain crack segmentation (", meta.model, ") from checkpoint '",
                            std::filesystem::path(checkpoint).filename().string(), "' (epoch ",
                            meta.epoch, "). Input `image`: float32 NCHW ", scale,
                            ", height and width multiples of ", multiple,
                            ". Output `logits`: NCHW, one channel; crack where sigmoid(logits) >= "
                            "the `threshold` metadata value."));

  onnx::GraphProto& g = *mp.mutable_graph();
  g.set_name(meta.model);
  OnnxGraph og(g);
  set_image_type(*g.add_input(), kInputName, kChannels);
  const Graph graph = model.graph();
  GraphMapper(graph, model.params(), model.buffers(), options, lm.normalization, og).run(summary);
  set_image_type(*g.add_output(), kLogitsName, 1);
  if (options.prob) {
    og.node("Sigmoid", {kLogitsName}, kProbName);
    set_image_type(*g.add_output(), kProbName, 1);
  }
  summary.nodes = g.node_size();
  summary.parameters = og.parameters();

  const double threshold = recorded_ods_threshold(meta);
  const Normalization& n = lm.normalization;
  add_metadata(mp, "model", meta.model);
  add_metadata(mp, "deconv", meta.deconv != 0 ? "1" : "0");
  add_metadata(mp, "width_divisor", std::to_string(meta.width_divisor));
  add_metadata(mp, "training_size", str_cat(meta.height, "x", meta.width));
  add_metadata(mp, "size_multiple", multiple);
  // dppredict's --scale auto: resize a photograph by it before the network (x first; empty where
  // the checkpoint records none).
  add_metadata(mp, "training_scale",
               meta.scale_y > 0 && meta.scale_x > 0
                   ? str_cat(format_number(meta.scale_x), "x", format_number(meta.scale_y))
                   : std::string());
  add_metadata(mp, "threshold", std::isnan(threshold) ? "" : format_number(threshold));
  add_metadata(mp, "epoch", std::to_string(meta.epoch));
  add_metadata(mp, "weights", lm.averaged ? "averaged" : "raw");
  add_metadata(mp, "input", scale);
  add_metadata(mp, "normalization",
               str_cat(options.keep_normalization ? "not folded" : "folded", "; mean ",
                       format_number(n.mean[0]), " ", format_number(n.mean[1]), " ",
                       format_number(n.mean[2]), ", std ", format_number(n.std[0]), " ",
                       format_number(n.std[1]), " ", format_number(n.std[2])));
  add_metadata(mp, "batchnorm",
               summary.batchnorm_folded > 0 ? "folded"
               : summary.batchnorm_kept > 0 ? "kept"
                                            : "none");
  add_metadata(mp, "source", std::filesystem::path(checkpoint).filename().string());

  summary.bytes = int64_t(mp.ByteSizeLong());
  DP_CHECK(summary.bytes < kMaxProtoBytes, "checkpoint '", checkpoint,
           "': the ONNX model would take ", summary.bytes, " bytes, more than protobuf's 2 GiB");
  return mp;
}

}  // namespace

ExportSummary export_onnx(const std::string& checkpoint, const std::string& out,
                          const ExportOptions& options) {
  ExportSummary summary;
  const onnx::ModelProto mp = model_proto(checkpoint, options, summary);
  // Serialised straight into the file: no second copy of the weights in memory.
  const std::string tmp = temp_path_for(out);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, kFileMode);
  if (fd < 0) fail("cannot write '", out, "': ", std::strerror(errno));
  errno = 0;
  bool ok = mp.SerializeToFileDescriptor(fd);
  int err = ok ? 0 : (errno != 0 ? errno : EIO);
  if (::close(fd) != 0 && ok) ok = false, err = errno;
  if (!ok) {
    std::remove(tmp.c_str());
    fail("cannot write '", out, "': ", std::strerror(err));
  }
  try {
    commit_file(tmp, out);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  return summary;
}

}  // namespace dp::app
