// dp::Model: a network as a fixed DAG of backend ops over pre-allocated NHWC activations.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/buffer.hpp"
#include "dp/params.hpp"

namespace dp {

struct ModelConfig {
  std::string name = "unet16";
  int width_divisor = 1;  // every hidden channel count is divided by this (CPU demos, tests)
  bool deconv = false;    // decoder blocks upsample by transposed convolution
  float dropout = 0.2f;   // dropout2d before the final layer of the ResNet UNets (training only)
  // How a convolution followed by a ReLU starts in a fresh run: kPytorch, PyTorch's module
  // default (Conv2d, ConvTranspose2d: U(+-1/sqrt(fan_in)) for weight and bias), or kHe, He et al.
  // 2015 (N(0, 2 / fan_out), zero bias: torchvision's init of VGG and ResNet trained from
  // scratch). The final 1x1 convolution and the ResNet encoders (already He) do not change.
  enum class ReluInit { kPytorch, kHe } relu_init = ReluInit::kPytorch;
  // Activations and activation gradients whose lifetimes in a training step do not overlap share
  // memory (Model::setup plans one arena). Off: every one has its own (tests compare the two).
  bool share_activation_memory = true;
};

// Models known to make_model().
std::vector<std::string> model_names();

// Batch norm's epsilon (PyTorch's BatchNorm2d default), in evaluation (running statistics) and
// training alike.
inline constexpr float kBatchNormEps = 1e-5f;

// One op of a model's graph as Model::graph() describes it (exporters): `in0`, `in1`, `out` are
// node ids, `weight`, `bias` indices into params(), `running_mean`, `running_var` into buffers()
// (-1: none). Convolution: weight [cout, cin, k, k], padding `pad` (already resolved: kernel / 2
// when the model said -1), fused ReLU. Transposed convolution: weight [cin, cout, k, k], stride,
// pad. Batch norm: eps kBatchNormEps, fused ReLU. Add: in0 + in1, fused ReLU. Dropout: identity
// in evaluation. Max-pool: 2x2, stride 2. Upsample: bilinear x2, PyTorch's align_corners=False.
// Concat: along channels, in0's channels first.
struct GraphOp {
  enum class Kind { kConv, kDeconv, kBatchNorm, kAdd, kDropout, kMaxPool, kUpsample, kConcat };
  Kind kind = Kind::kConv;
  int in0 = -1, in1 = -1, out = -1;
  int weight = -1, bias = -1;
  int running_mean = -1, running_var = -1;
  int kernel = 0, stride = 1, pad = 0;
  bool relu = false;
};
struct Graph {
  int input = -1, output = -1;  // node ids (the input [n,H,W,3] NHWC, the logits [n,H,W,1])
  std::vector<int> channels;    // per node id
  std::vector<GraphOp> ops;     // in execution order
};

// Told during Model::backward when a parameter's gradient is final (in backward order, which
// is arena order: the arena is laid out in reverse declaration order). A gradient reducer uses
// it to start a bucket's all-reduce while the rest of backward runs.
class GradListener {
 public:
  virtual ~GradListener() = default;
  virtual void grad_ready(const ParamView& param) = 0;
};

// How Model::backward writes parameter gradients: kOverwrite replaces the grad arena's contents;
// kAccumulate adds to them (gradient accumulation over micro-batches).
enum class GradMode { kOverwrite, kAccumulate };

// Layers are explicit forward/backward pairs; the graph runs them in order and in reverse.
// Parameters live in one ParamStore arena; activations and their gradients are allocated once by
// setup() for the largest batch, so the step loop allocates nothing.
class Model {
 public:
  Model(ModelConfig config, Backend& backend) : config_(std::move(config)), backend_(backend) {}
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  // Batch-norm running statistics (`<bn>.running_mean`, `<bn>.running_var`); empty for UNet16.
  ParamStore& buffers() { return buffers_; }
  const ParamStore& buffers() const { return buffers_; }
  // Multiple that the input height and width must be (the number of 2x poolings, as a factor).
  virtual int size_multiple() const = 0;
  // The graph as it runs in evaluation mode (ops in forward order), for exporters.
  Graph graph() const;

  // Allocates activations for up to max_batch images of height x width (checked). Forward only
  // (inference): no gradients, and each value's memory is reused once the forward pass has read
  // it for the last time (the UNet's skip connections live until their decoder stage), so a large
  // tile needs a fraction of a training step's memory; backward() is then an error.
  enum class Purpose { kTraining, kInference };
  void setup(int max_batch, int height, int width, Purpose purpose = Purpose::kTraining);
  int max_batch() const { return max_batch_; }
  // Bytes of activation memory (values, gradients, saved state, scratch) allocated by setup(),
  // and what the values and gradients alone would take if none shared memory.
  int64_t activation_bytes() const;
  int64_t unshared_activation_bytes() const { return unshared_bytes_; }

  // Training mode (default): batch-norm uses and updates batch statistics, dropout is on.
  // Evaluation: running statistics, no dropout.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Dropout seeds of the samples of the next forward (n values, e.g. key(seed, epoch, sample
  // index): then masks do not depend on how samples are spread over ranks and batches).
  void set_dropout_seeds(const uint64_t* seeds, int n);
  // Sync-BN: when set, batch-norm sums (and the element count, the last entry) are passed to this
  // function to be summed over all ranks, in forward and in backward, in the same order everywhere.
  using StatReducer = std::function<void(double* sums, size_t count)>;
  void set_stat_reducer(StatReducer reducer) { stat_reducer_ = std::move(reducer); }

  // input: [n,H,W,3] fp32 in backend memory (kept by pointer until backward when activations
  // are fp32, else converted); returns fp32 logits [n,H,W,1] in backend memory.
  const float* forward(const float* input, int n);
  // forward() from host memory to host memory, whatever the backend: the input is uploaded into
  // a staging buffer and the logits downloaded (no copies on the CPU backend). For evaluation
  // outside the training loop (reports, prediction); the trainer uploads batches itself.
  const float* forward_host(const float* host_input, int n);
  // diff_logits: [n,H,W,1] fp32 for the batch of the last forward; OVERWRITES params().grads(), or
  // adds to them with GradMode::kAccumulate. `listener` (optional) hears of each parameter as soon
  // as its gradient (the sum, when accumulating) is complete.
  void backward(const float* diff_logits, GradListener* listener = nullptr,
                GradMode mode = GradMode::kOverwrite);

 protected:
  // Graph construction, used by the concrete models' constructors. Names are PyTorch prefixes.
  int input(int channels);  // the one input node; returns its id
  // Convolution `<prefix>.weight` [cout, cin, k, k] (+ `<prefix>.bias`), optional fused ReLU.
  int conv(const std::string& prefix, int src, int cout, int kernel, bool relu, int stride = 1,
           int pad = -1, bool bias = true, Init init = Init::kUniformFanIn);
  // Transposed convolution k=4, s=2, p=1 (x2 upsampling), weight [cin, cout, 4, 4], bias.
  int deconv(const std::string& prefix, int src, int cout, bool relu);
  // Batch norm (eps 1e-5, momentum 0.1) with `<prefix>.weight/.bias` and running statistics.
  int batchnorm(const std::string& prefix, int src, bool relu);
  int add(int a, int b, bool relu);  // residual connection
  int dropout2d(int src, float p);
  int maxpool(int src);
  int upsample(int src);
  int concat(int a, int b);
  void set_output(int node);
  int channels(int node) const { return nodes_.at(static_cast<size_t>(node)).c; }
  void finalize();  // after the graph is built: allocates the parameter and buffer arenas

 private:
  struct Node {
    int scale = 1;  // spatial size = input size / scale
    int c = 0;
    void* v = nullptr;        // value and gradient: elements of the backend's activation_type() in
    void* g = nullptr;        // the arena (the input's value in fp32: the caller's batch)
    bool grad_ready = false;  // during backward: grad holds a partial sum
  };
  using OpKind = GraphOp::Kind;
  struct Op {
    OpKind kind = OpKind::kConv;
    int in0 = -1, in1 = -1, out = -1;
    int weight = -1, bias = -1;               // parameters (conv, deconv, batch norm)
    int running_mean = -1, running_var = -1;  // buffers (batch norm)
    int kernel = 0, stride = 1, pad = -1;     // conv, deconv
    bool relu = false;
    float p = 0;   // dropout
    Buffer saved;  // max-pool argmax; batch-norm mean and invstd; dropout mask
  };
  int add_node(int scale, int c);
  int add_op(Op op, int scale, int c);
  Dims dims(int node, int n) const;
  ConvDesc conv_desc(const Op& op, int n) const;
  DeconvDesc deconv_desc(const Op& op, int n) const;
  void batchnorm_forward(Op& op, int n);
  void batchnorm_backward(Op& op, int n, float* dgamma, float* dbeta);
  // Lays out every node's value and gradient, and the scratch (`scratch_bytes`), in arena_ (see
  // ModelConfig::share_activation_memory).
  void plan_activations(DeviceMemory* mem, int64_t scratch_bytes);
  // Activation element `i` of `base` (pointer arithmetic in the activation type).
  void* at(void* base, int64_t i) const {
    return static_cast<char*>(base) + i * int64_t(dtype_bytes(act_));
  }

  ModelConfig config_;
  Backend& backend_;
  ParamStore params_, buffers_;
  std::vector<Node> nodes_;
  std::vector<Op> ops_;
  int input_ = -1, output_ = -1;
  int max_batch_ = 0, height_ = 0, width_ = 0, batch_ = 0;
  Purpose purpose_ = Purpose::kTraining;
  DType act_ = DType::kFloat32;  // the backend's activation_type()
  bool training_ = true;
  std::vector<uint64_t> dropout_seeds_, op_seeds_;  // per sample; per sample for one op
  StatReducer stat_reducer_;
  Buffer arena_;  // node values and gradients (plan_activations)
  int64_t unshared_bytes_ = 0;
  void* scratch_ = nullptr;  // in arena_: gradients that must be added to a partial sum
  Buffer param_scratch_;  // GradMode::kAccumulate: an op's parameter gradients before the addition
  Buffer input_stage_;    // forward_host on a device backend: the input, max batch
  std::vector<float> logits_host_;  // and the logits it returns
  Buffer logits_;                   // fp32 logits when activations are not fp32
  std::vector<double> bn_sums_;     // batch-norm sums (2 C + 1, host), sized once
};

// Builds a model by name (model_names()), parameters declared and the arenas allocated but not
// initialised. Unknown names are a dp::Error listing the known ones.
std::unique_ptr<Model> make_model(const ModelConfig& config, Backend& backend);

}  // namespace dp
