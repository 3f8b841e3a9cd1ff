// dp::Model: a network as a fixed DAG of backend ops over pre-allocated NHWC activations.
#pragma once

#include <cstdint>
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
};

// Models known to make_model().
std::vector<std::string> model_names();

// Told during Model::backward when a parameter's gradient is final (in backward order, which
// is arena order: the arena is laid out in reverse declaration order). A gradient reducer uses
// it to start a bucket's all-reduce while the rest of backward runs.
class GradListener {
 public:
  virtual ~GradListener() = default;
  virtual void grad_ready(const ParamView& param) = 0;
};

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
  // Multiple that the input height and width must be (the number of 2x poolings, as a factor).
  virtual int size_multiple() const = 0;

  // Allocates activations for up to max_batch images of height x width (checked).
  void setup(int max_batch, int height, int width);
  int max_batch() const { return max_batch_; }
  int64_t activation_bytes() const;

  // input: [n,H,W,3] (kept by pointer until backward); returns logits [n,H,W,1].
  const float* forward(const float* input, int n);
  // diff_logits: [n,H,W,1] for the batch of the last forward; OVERWRITES params().grads().
  // `listener` (optional) hears of each parameter as soon as its gradient is complete.
  void backward(const float* diff_logits, GradListener* listener = nullptr);

 protected:
  // Graph construction, used by the concrete models' constructors.
  int input(int channels);  // the one input node; returns its id
  int conv(const std::string& weight_prefix, int src, int cout, int kernel, bool relu);
  int maxpool(int src);
  int upsample(int src);
  int concat(int a, int b);
  void set_output(int node);
  int channels(int node) const { return nodes_.at(static_cast<size_t>(node)).c; }

 private:
  struct Node {
    int scale = 1;  // spatial size = input size / scale
    int c = 0;
    Buffer value, grad;
    float* v = nullptr;
    float* g = nullptr;
    bool grad_ready = false;  // during backward: grad holds a partial sum
  };
  enum class OpKind { kConv, kMaxPool, kUpsample, kConcat };
  struct Op {
    OpKind kind = OpKind::kConv;
    int in0 = -1, in1 = -1, out = -1;
    int weight = -1, bias = -1, kernel = 0;  // conv
    bool relu = false;
    Buffer argmax;  // max-pool
  };
  int add_node(int scale, int c);
  Dims dims(int node, int n) const;

  ModelConfig config_;
  Backend& backend_;
  ParamStore params_;
  std::vector<Node> nodes_;
  std::vector<Op> ops_;
  int input_ = -1, output_ = -1;
  int max_batch_ = 0, height_ = 0, width_ = 0, batch_ = 0;
  Buffer scratch_;  // for gradients that must be added to a partial sum
};

// Builds a model by name ("unet16"), parameters declared and the arena allocated but not
// initialised. Unknown names are a dp::Error listing the known ones.
std::unique_ptr<Model> make_model(const ModelConfig& config, Backend& backend);

}  // namespace dp
