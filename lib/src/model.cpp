// The model graph executor: node allocation, forward in order, backward in reverse with
// gradient accumulation where a node feeds two ops (encoder outputs feed a pool and a skip).
#include "dp/model.hpp"

#include <algorithm>
#include <cmath>

#include "dp/error.hpp"
#include "dp/rng.hpp"

namespace dp {
namespace {
constexpr float kBnMomentum = 0.1f;   // PyTorch BatchNorm2d's default
constexpr int64_t kAlignFloats = 16;  // 64 bytes

int64_t aligned(int64_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}
}  // namespace

int Model::add_node(int scale, int c) {
  Node node;
  node.scale = scale;
  node.c = c;
  nodes_.push_back(std::move(node));
  return static_cast<int>(nodes_.size() - 1);
}

int Model::add_op(Op op, int scale, int c) {
  op.out = add_node(scale, c);
  ops_.push_back(std::move(op));
  return ops_.back().out;
}

int Model::input(int channels) {
  DP_CHECK(input_ < 0, "model graph: a second input");
  input_ = add_node(1, channels);
  return input_;
}

int Model::conv(const std::string& prefix, int src, int cout, int kernel, bool relu, int stride,
                int pad, bool bias, Init init) {
  const int cin = channels(src);
  Op op;
  op.kind = OpKind::kConv;
  op.in0 = src;
  op.kernel = kernel;
  op.stride = stride;
  op.pad = pad;
  op.relu = relu;
  const bool he =
      relu && init == Init::kUniformFanIn && config_.relu_init == ModelConfig::ReluInit::kHe;
  if (he) init = Init::kKaimingNormalFanOut;
  const int64_t fan = init == Init::kKaimingNormalFanOut ? int64_t{cout} * kernel * kernel
                                                         : int64_t{cin} * kernel * kernel;
  op.weight = params_.add(prefix + ".weight", {cout, cin, kernel, kernel}, fan, init);
  if (bias)
    op.bias = params_.add(prefix + ".bias", {cout}, int64_t{cin} * kernel * kernel,
                          he ? Init::kZeros : Init::kUniformFanIn);
  const int scale = nodes_[static_cast<size_t>(src)].scale * stride;
  return add_op(std::move(op), scale, cout);
}

int Model::deconv(const std::string& prefix, int src, int cout, bool relu) {
  const int cin = channels(src), scale = nodes_[static_cast<size_t>(src)].scale;
  DP_CHECK(scale % 2 == 0, "model graph: transposed convolution of a node at full resolution");
  constexpr int kKernel = 4;
  Op op;
  op.kind = OpKind::kDeconv;
  op.in0 = src;
  op.kernel = kKernel;
  op.stride = 2;
  op.pad = 1;
  op.relu = relu;
  // PyTorch computes ConvTranspose2d's fan_in from weight.size(1) * k * k = cout * k * k and its
  // fan_out (kaiming_normal_'s mode='fan_out') from weight.size(0) * k * k = cin * k * k.
  const int64_t fan = int64_t{cout} * kKernel * kKernel;
  if (relu && config_.relu_init == ModelConfig::ReluInit::kHe) {
    op.weight = params_.add(prefix + ".weight", {cin, cout, kKernel, kKernel},
                            int64_t{cin} * kKernel * kKernel, Init::kKaimingNormalFanOut);
    op.bias = params_.add(prefix + ".bias", {cout}, fan, Init::kZeros);
  } else {
    op.weight = params_.add(prefix + ".weight", {cin, cout, kKernel, kKernel}, fan);
    op.bias = params_.add(prefix + ".bias", {cout}, fan);
  }
  return add_op(std::move(op), scale / 2, cout);
}

int Model::batchnorm(const std::string& prefix, int src, bool relu) {
  const int c = channels(src);
  Op op;
  op.kind = OpKind::kBatchNorm;
  op.in0 = src;
  op.relu = relu;
  op.weight = params_.add(prefix + ".weight", {c}, c, Init::kOnes);
  op.bias = params_.add(prefix + ".bias", {c}, c, Init::kZeros);
  op.running_mean = buffers_.add(prefix + ".running_mean", {c}, c, Init::kZeros);
  op.running_var = buffers_.add(prefix + ".running_var", {c}, c, Init::kOnes);
  return add_op(std::move(op), nodes_[static_cast<size_t>(src)].scale, c);
}

int Model::add(int a, int b, bool relu) {
  DP_CHECK(nodes_[size_t(a)].scale == nodes_[size_t(b)].scale && channels(a) == channels(b),
           "model graph: residual add of different shapes");
  Op op;
  op.kind = OpKind::kAdd;
  op.in0 = a;
  op.in1 = b;
  op.relu = relu;
  return add_op(std::move(op), nodes_[size_t(a)].scale, channels(a));
}

int Model::dropout2d(int src, float p) {
  DP_CHECK(p >= 0.0f && p < 1.0f, "dropout probability ", p, " is not in [0, 1)");
  Op op;
  op.kind = OpKind::kDropout;
  op.in0 = src;
  op.p = p;
  return add_op(std::move(op), nodes_[size_t(src)].scale, channels(src));
}

int Model::maxpool(int src) {
  Op op;
  op.kind = OpKind::kMaxPool;
  op.in0 = src;
  return add_op(std::move(op), nodes_[size_t(src)].scale * 2, channels(src));
}

int Model::upsample(int src) {
  const int scale = nodes_[static_cast<size_t>(src)].scale;
  DP_CHECK(scale % 2 == 0, "model graph: upsampling a node at full resolution");
  Op op;
  op.kind = OpKind::kUpsample;
  op.in0 = src;
  return add_op(std::move(op), scale / 2, channels(src));
}

int Model::concat(int a, int b) {
  DP_CHECK(nodes_[static_cast<size_t>(a)].scale == nodes_[static_cast<size_t>(b)].scale,
           "model graph: concat of different resolutions");
  Op op;
  op.kind = OpKind::kConcat;
  op.in0 = a;
  op.in1 = b;
  return add_op(std::move(op), nodes_[size_t(a)].scale, channels(a) + channels(b));
}

Graph Model::graph() const {
  Graph g;
  g.input = input_;
  g.output = output_;
  for (const Node& x : nodes_) g.channels.push_back(x.c);
  for (const Op& op : ops_) {
    GraphOp o;
    o.kind = op.kind;
    o.in0 = op.in0;
    o.in1 = op.in1;
    o.out = op.out;
    o.weight = op.weight;
    o.bias = op.bias;
    o.running_mean = op.running_mean;
    o.running_var = op.running_var;
    o.kernel = op.kernel;
    o.stride = op.stride;
    o.pad = op.pad >= 0 ? op.pad : op.kernel / 2;
    o.relu = op.relu;
    g.ops.push_back(o);
  }
  return g;
}

void Model::set_output(int node) {
  output_ = node;
}

void Model::finalize() {
  params_.finalize(backend_.device_memory());
  buffers_.finalize(backend_.device_memory());
}

Dims Model::dims(int node, int n) const {
  const Node& x = nodes_[static_cast<size_t>(node)];
  return {n, height_ / x.scale, width_ / x.scale, x.c};
}

ConvDesc Model::conv_desc(const Op& op, int n) const {
  const Dims s = dims(op.in0, n);
  ConvDesc d{n, s.h, s.w, s.c, channels(op.out), op.kernel, op.relu};
  d.stride = op.stride;
  d.pad = op.pad;
  d.bias = op.bias >= 0;
  d.forward_only = purpose_ == Purpose::kInference;
  return d;
}

DeconvDesc Model::deconv_desc(const Op& op, int n) const {
  const Dims s = dims(op.in0, n);
  DeconvDesc d{n, s.h, s.w, s.c, channels(op.out)};
  d.kernel = op.kernel;
  d.stride = op.stride;
  d.pad = op.pad;
  d.relu = op.relu;
  d.forward_only = purpose_ == Purpose::kInference;
  return d;
}

void Model::setup(int max_batch, int height, int width, Purpose purpose) {
  const int m = size_multiple();
  DP_CHECK(max_batch > 0, "batch size must be positive, got ", max_batch);
  DP_CHECK(height > 0 && width > 0 && height % m == 0 && width % m == 0, "model ", config_.name,
           ": input height and width must be positive multiples of ", m, ", got ", height, "x",
           width);
  max_batch_ = max_batch;
  purpose_ = purpose;
  height_ = height;
  width_ = width;
  DeviceMemory* const mem = backend_.device_memory();
  act_ = backend_.activation_type();
  int64_t largest = 0;
  int max_channels = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    largest = std::max(largest, dims(int(i), max_batch).numel() * int64_t(dtype_bytes(act_)));
    max_channels = std::max(max_channels, nodes_[i].c);
  }
  plan_activations(mem, largest);
  logits_ = Buffer();
  if (act_ != DType::kFloat32)
    logits_ = Buffer(static_cast<size_t>(dims(output_, max_batch).numel()) * sizeof(float), mem);
  for (Op& op : ops_) {
    const int c = channels(op.out);
    op.saved = Buffer();
    if (op.kind == OpKind::kMaxPool && purpose == Purpose::kTraining)  // the backward's argmax
      op.saved = Buffer(static_cast<size_t>(dims(op.out, max_batch).numel()), mem);
    if (op.kind == OpKind::kBatchNorm) op.saved = Buffer(2 * size_t(c) * sizeof(float), mem);
    if (op.kind == OpKind::kDropout) op.saved = Buffer(size_t(max_batch) * c * sizeof(float), mem);
  }
  // GradMode::kAccumulate: room for the largest op's parameter gradients (two tensors, each
  // starting on a 64-byte boundary) before they are added to the arena.
  int64_t largest_param = 0;
  for (const ParamView& p : params_.views()) largest_param = std::max(largest_param, p.numel);
  param_scratch_ = Buffer();
  if (purpose == Purpose::kTraining)
    param_scratch_ = Buffer(static_cast<size_t>(2 * aligned(largest_param)) * sizeof(float), mem);
  bn_sums_.assign(2 * size_t(max_channels) + 1, 0.0);
  if (mem != nullptr) {
    input_stage_ =
        Buffer(static_cast<size_t>(dims(input_, max_batch).numel()) * sizeof(float), mem);
    logits_host_.resize(static_cast<size_t>(dims(output_, max_batch).numel()));
  }
  dropout_seeds_.resize(size_t(max_batch));
  op_seeds_.resize(size_t(max_batch));
  for (int i = 0; i < max_batch; ++i) dropout_seeds_[size_t(i)] = key(0, i);
}

void Model::set_dropout_seeds(const uint64_t* seeds, int n) {
  DP_CHECK(n <= max_batch_, "set_dropout_seeds: ", n, " seeds for a batch of at most ", max_batch_);
  std::copy(seeds, seeds + n, dropout_seeds_.begin());
}

int64_t Model::activation_bytes() const {
  int64_t total = static_cast<int64_t>(arena_.bytes() + param_scratch_.bytes());
  total += static_cast<int64_t>(logits_.bytes());
  for (const Op& op : ops_) total += static_cast<int64_t>(op.saved.bytes());
  return total;
}

// A training step as a timeline: op i's forward at time i, its backward at 2F - 1 - i (F ops).
// A node's value lives from its producer's forward to its last reader: consumers' forwards, the
// backward of a consumer that reads its input (convolutions, batch norm) and its producer's
// backward where that reads the output (the ReLU mask of a convolution, batch norm or addition);
// the model's output to the end of the step (the caller reads the logits). A gradient lives from
// the backward of its last consumer (the first to write it) to its producer's backward (the
// output's from the start of backward); the scratch for partial sums through all of backward.
// Buffers whose [birth, death] intervals overlap get disjoint memory: placed largest first, each
// at the lowest offset clear of the overlapping ones already placed (a greedy interval packing;
// the arena is at least the largest set of buffers live at one time).
void Model::plan_activations(DeviceMemory* mem, int64_t scratch_bytes) {
  struct Block {
    int64_t bytes = 0, offset = 0;
    int born = 0, dies = 0;
    void** ptr = nullptr;
  };
  const int f = static_cast<int>(ops_.size()), end = 2 * f;
  const auto backward_time = [f](size_t op) { return 2 * f - 1 - static_cast<int>(op); };
  std::vector<int> v_born(nodes_.size(), 0), v_dies(nodes_.size(), 0);
  std::vector<int> g_born(nodes_.size(), end), g_dies(nodes_.size(), 0);
  const bool inference = purpose_ == Purpose::kInference;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    const int t = static_cast<int>(i), tb = backward_time(i);
    if (inference) {  // a value lives from its op to the last op that reads it
      v_born[size_t(op.out)] = t;
      v_dies[size_t(op.out)] = std::max(v_dies[size_t(op.out)], t);
      for (int in : {op.in0, op.in1})
        if (in >= 0) v_dies[size_t(in)] = std::max(v_dies[size_t(in)], t);
      continue;
    }
    const bool reads_src =
        op.kind == OpKind::kConv || op.kind == OpKind::kDeconv || op.kind == OpKind::kBatchNorm;
    const bool reads_dst = op.relu && (reads_src || op.kind == OpKind::kAdd);
    v_born[size_t(op.out)] = t;
    v_dies[size_t(op.out)] = std::max(v_dies[size_t(op.out)], reads_dst ? tb : t);
    g_dies[size_t(op.out)] = tb;
    for (int in : {op.in0, op.in1}) {
      if (in < 0) continue;
      v_dies[size_t(in)] = std::max(v_dies[size_t(in)], reads_src ? tb : t);
      g_born[size_t(in)] = std::min(g_born[size_t(in)], tb);
    }
  }
  v_dies[size_t(output_)] = end;
  g_born[size_t(output_)] = f;
  const int64_t elem = int64_t(dtype_bytes(act_));
  std::vector<Block> blocks;
  unshared_bytes_ = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& x = nodes_[i];
    x.v = x.g = nullptr;
    const int64_t bytes = dims(int(i), max_batch_).numel() * elem;
    // An fp32 input is read in place (the caller's batch); any other type needs its converted
    // copy. The input needs no gradient.
    const bool input = int(i) == input_;
    if (!input || act_ != DType::kFloat32) blocks.push_back({bytes, 0, v_born[i], v_dies[i], &x.v});
    if (!input && !inference) blocks.push_back({bytes, 0, g_born[i], g_dies[i], &x.g});
  }
  constexpr int64_t kAlign = 256;  // bytes: as cuDNN's vectorised kernels want
  for (Block& b : blocks) {
    b.bytes = (b.bytes + kAlign - 1) / kAlign * kAlign;
    unshared_bytes_ += b.bytes;
    if (!config_.share_activation_memory) b.born = 0, b.dies = end;  // all overlap
  }
  scratch_ = nullptr;
  if (!inference)  // backward's scratch
    blocks.push_back({(scratch_bytes + kAlign - 1) / kAlign * kAlign, 0, f, end, &scratch_});
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
  int64_t total = 0;
  std::vector<const Block*> placed, clash;
  for (size_t i : order) {
    Block& b = blocks[i];
    clash.clear();
    for (const Block* o : placed)
      if (o->born <= b.dies && b.born <= o->dies) clash.push_back(o);
    std::sort(clash.begin(), clash.end(),
              [](const Block* x, const Block* y) { return x->offset < y->offset; });
    int64_t offset = 0;
    for (const Block* o : clash) {
      if (offset + b.bytes <= o->offset) break;
      offset = std::max(offset, o->offset + o->bytes);
    }
    b.offset = offset;
    total = std::max(total, offset + b.bytes);
    placed.push_back(&b);
  }
  arena_ = Buffer();
  arena_ = Buffer(static_cast<size_t>(total), mem);
  for (const Block& b : blocks) *b.ptr = static_cast<char*>(arena_.data()) + b.offset;
}

void Model::batchnorm_forward(Op& op, int n) {
  const Dims d = dims(op.in0, n);
  float* mean = op.saved.f32();
  float* invstd = mean + d.c;
  double* sums = bn_sums_.data();
  double count = 0;
  if (training_) {
    backend_.batchnorm_stats(d, nodes_[size_t(op.in0)].v, sums);
    sums[2 * d.c] = double(d.pixels());
    if (stat_reducer_) stat_reducer_(sums, 2 * size_t(d.c) + 1);  // sync-BN
    count = sums[2 * d.c];
  }
  backend_.batchnorm_prepare(d.c, training_, sums, count, kBatchNormEps, kBnMomentum,
                             buffers_.view(op.running_mean).value,
                             buffers_.view(op.running_var).value, mean, invstd);
  backend_.batchnorm_apply(d, nodes_[size_t(op.in0)].v, mean, invstd, params_.view(op.weight).value,
                           params_.view(op.bias).value, op.relu, nodes_[size_t(op.out)].v);
}

const float* Model::forward(const float* input, int n) {
  DP_CHECK(max_batch_ > 0, "Model::forward before setup()");
  DP_CHECK(n > 0 && n <= max_batch_, "batch of ", n, " images, but the model was set up for ",
           max_batch_);
  batch_ = n;
  Node& in = nodes_[static_cast<size_t>(input_)];
  if (act_ == DType::kFloat32)
    in.v = const_cast<float*>(input);  // fp32 activations: read in place
  else
    backend_.to_activation(dims(input_, n).numel(), input, in.v);
  for (Op& op : ops_) {
    const Node& a = nodes_[static_cast<size_t>(op.in0)];
    Node& out = nodes_[static_cast<size_t>(op.out)];
    switch (op.kind) {
      case OpKind::kConv:
        backend_.conv_forward(conv_desc(op, n), a.v, params_.view(op.weight).value,
                              op.bias >= 0 ? params_.view(op.bias).value : nullptr, out.v);
        break;
      case OpKind::kDeconv:
        backend_.deconv_forward(deconv_desc(op, n), a.v, params_.view(op.weight).value,
                                params_.view(op.bias).value, out.v);
        break;
      case OpKind::kBatchNorm:
        batchnorm_forward(op, n);
        break;
      case OpKind::kAdd:
        backend_.add_forward(dims(op.out, n).numel(), a.v, nodes_[size_t(op.in1)].v, op.relu,
                             out.v);
        break;
      case OpKind::kDropout:
        if (training_ && op.p > 0) {
          for (int i = 0; i < n; ++i) op_seeds_[size_t(i)] = key(dropout_seeds_[size_t(i)], op.out);
          backend_.dropout2d_forward(dims(op.in0, n), op.p, op_seeds_.data(), a.v, op.saved.f32(),
                                     out.v);
        } else {
          backend_.copy_activations(dims(op.in0, n).numel(), a.v, out.v);
        }
        break;
      case OpKind::kMaxPool:
        backend_.maxpool2x2_forward(dims(op.in0, n), a.v, out.v, op.saved.u8());
        break;
      case OpKind::kUpsample:
        backend_.upsample2x_forward(dims(op.in0, n), a.v, out.v);
        break;
      case OpKind::kConcat:
        backend_.concat_forward(dims(op.in0, n), a.v, dims(op.in1, n),
                                nodes_[static_cast<size_t>(op.in1)].v, out.v);
        break;
    }
  }
  void* const out = nodes_[static_cast<size_t>(output_)].v;
  if (act_ == DType::kFloat32) return static_cast<const float*>(out);
  backend_.from_activation(dims(output_, n).numel(), out, logits_.f32());
  return logits_.f32();
}

const float* Model::forward_host(const float* host_input, int n) {
  if (backend_.device_memory() == nullptr) return forward(host_input, n);
  DP_CHECK(n > 0 && n <= max_batch_, "batch of ", n, " images, but the model was set up for ",
           max_batch_);
  input_stage_.upload(host_input, static_cast<size_t>(dims(input_, n).numel()) * sizeof(float));
  const float* logits = forward(input_stage_.f32(), n);
  const auto count = static_cast<size_t>(dims(output_, n).numel());
  backend_.device_memory()->download(logits_host_.data(), logits, count * sizeof(float));
  return logits_host_.data();
}

void Model::backward(const float* diff_logits, GradListener* listener, GradMode mode) {
  DP_CHECK(purpose_ == Purpose::kTraining, "Model::backward after setup() for inference only");
  DP_CHECK(batch_ > 0, "Model::backward before forward()");
  const bool accumulate = mode == GradMode::kAccumulate;
  const int n = batch_;
  for (Node& x : nodes_) x.grad_ready = false;
  Node& out_node = nodes_[static_cast<size_t>(output_)];
  backend_.to_activation(dims(output_, n).numel(), diff_logits, out_node.g);
  out_node.grad_ready = true;

  // Writes an input gradient that an op can only overwrite: straight into the node when it holds
  // no partial sum yet, else through the scratch buffer and an addition.
  auto write_grad = [&](int id, auto&& op_writes) {
    Node& x = nodes_[static_cast<size_t>(id)];
    if (!x.grad_ready) {
      op_writes(x.g);
      x.grad_ready = true;
    } else {
      op_writes(scratch_);
      backend_.accumulate_activations(dims(id, n).numel(), scratch_, x.g);
    }
  };
  // Where an op writes its parameter gradients: the arena, or (accumulating) scratch space that
  // finish_params() adds to the arena. Then the listener hears of them, in arena order.
  float* const weight_scratch = param_scratch_.f32();
  float* const bias_scratch = weight_scratch + param_scratch_.bytes() / sizeof(float) / 2;
  auto weight_grad = [&](const Op& op) {
    return accumulate ? weight_scratch : params_.view(op.weight).grad;
  };
  auto bias_grad = [&](const Op& op) {
    return op.bias < 0 ? nullptr : accumulate ? bias_scratch : params_.view(op.bias).grad;
  };
  auto finish_params = [&](const Op& op) {
    const ParamView& w = params_.view(op.weight);
    if (accumulate) backend_.accumulate(w.numel, weight_scratch, w.grad);
    if (op.bias >= 0) {
      const ParamView& b = params_.view(op.bias);
      if (accumulate) backend_.accumulate(b.numel, bias_scratch, b.grad);
      if (listener != nullptr) listener->grad_ready(b);  // the bias comes first in the arena
    }
    if (listener != nullptr) listener->grad_ready(w);
  };

  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    Op& op = *it;
    Node& out = nodes_[static_cast<size_t>(op.out)];
    DP_CHECK(out.grad_ready, "model graph: node ", op.out, " has no gradient (unused output)");
    const Node& a = nodes_[static_cast<size_t>(op.in0)];
    switch (op.kind) {
      case OpKind::kConv: {
        const ConvDesc d = conv_desc(op, n);
        const float* w = params_.view(op.weight).value;
        if (op.in0 == input_) {
          backend_.conv_backward(d, a.v, w, out.v, out.g, nullptr, weight_grad(op), bias_grad(op));
        } else {
          write_grad(op.in0, [&](void* dst) {
            backend_.conv_backward(d, a.v, w, out.v, out.g, dst, weight_grad(op), bias_grad(op));
          });
        }
        finish_params(op);
        break;
      }
      case OpKind::kDeconv: {
        const DeconvDesc d = deconv_desc(op, n);
        const float* w = params_.view(op.weight).value;
        write_grad(op.in0, [&](void* dst) {
          backend_.deconv_backward(d, a.v, w, out.v, out.g, dst, weight_grad(op), bias_grad(op));
        });
        finish_params(op);
        break;
      }
      case OpKind::kBatchNorm:
        batchnorm_backward(op, n, weight_grad(op), bias_grad(op));
        finish_params(op);
        break;
      case OpKind::kAdd: {
        const int64_t count = dims(op.out, n).numel();
        if (op.relu) backend_.relu_backward(count, out.v, out.g, out.g);
        for (int id : {op.in0, op.in1})
          write_grad(id, [&](void* dst) { backend_.copy_activations(count, out.g, dst); });
        break;
      }
      case OpKind::kDropout:
        write_grad(op.in0, [&](void* dst) {
          if (training_ && op.p > 0)
            backend_.dropout2d_backward(dims(op.in0, n), op.saved.f32(), out.g, dst);
          else
            backend_.copy_activations(dims(op.in0, n).numel(), out.g, dst);
        });
        break;
      case OpKind::kMaxPool: {
        // Max-pool backward can add into a partial sum itself.
        Node& x = nodes_[static_cast<size_t>(op.in0)];
        backend_.maxpool2x2_backward(dims(op.in0, n), op.saved.u8(), out.g, x.g, x.grad_ready);
        x.grad_ready = true;
        break;
      }
      case OpKind::kUpsample:
        write_grad(op.in0,
                   [&](void* dst) { backend_.upsample2x_backward(dims(op.in0, n), out.g, dst); });
        break;
      case OpKind::kConcat: {
        const Dims da = dims(op.in0, n), db = dims(op.in1, n);
        Node& na = nodes_[static_cast<size_t>(op.in0)];
        Node& nb = nodes_[static_cast<size_t>(op.in1)];
        // Each part goes to its node, or to its own half of the scratch buffer.
        void* ga = na.grad_ready ? scratch_ : na.g;
        void* gb = nb.grad_ready ? at(scratch_, da.numel()) : nb.g;
        backend_.concat_backward(da, db, out.g, ga, gb);
        if (na.grad_ready) backend_.accumulate_activations(da.numel(), ga, na.g);
        if (nb.grad_ready) backend_.accumulate_activations(db.numel(), gb, nb.g);
        na.grad_ready = nb.grad_ready = true;
        break;
      }
    }
  }
}

void Model::batchnorm_backward(Op& op, int n, float* dgamma, float* dbeta) {
  const Dims d = dims(op.in0, n);
  Node& x = nodes_[size_t(op.in0)];
  Node& out = nodes_[size_t(op.out)];
  const float* mean = op.saved.f32();
  const float* invstd = mean + d.c;
  double* sums = bn_sums_.data();
  // dgamma, dbeta: this rank's parameter gradients (the gradient reducer sums them later).
  backend_.batchnorm_backward_stats(d, x.v, out.v, op.relu, out.g, mean, invstd, sums, dgamma,
                                    dbeta);
  const ParamView& gamma = params_.view(op.weight);
  sums[2 * d.c] = double(d.pixels());
  if (training_ && stat_reducer_) stat_reducer_(sums, 2 * size_t(d.c) + 1);
  const double count = sums[2 * d.c];
  backend_.batchnorm_backward_apply(d, x.v, out.g, mean, invstd, gamma.value, sums, count,
                                    training_, x.g, x.grad_ready);
  x.grad_ready = true;
}

}  // namespace dp
