// The model graph executor: node allocation, forward in order, backward in reverse with
// gradient accumulation where a node feeds two ops (encoder outputs feed a pool and a skip).
#include "dp/model.hpp"

#include <algorithm>

#include "dp/error.hpp"

namespace dp {

int Model::add_node(int scale, int c) {
  Node node;
  node.scale = scale;
  node.c = c;
  nodes_.push_back(std::move(node));
  return static_cast<int>(nodes_.size() - 1);
}

int Model::input(int channels) {
  DP_CHECK(input_ < 0, "model graph: a second input");
  input_ = add_node(1, channels);
  return input_;
}

int Model::conv(const std::string& prefix, int src, int cout, int kernel, bool relu) {
  const int cin = channels(src);
  Op op;
  op.kind = OpKind::kConv;
  op.in0 = src;
  op.kernel = kernel;
  op.relu = relu;
  op.weight =
      params_.add(prefix + ".weight", {cout, cin, kernel, kernel}, int64_t{cin} * kernel * kernel);
  op.bias = params_.add(prefix + ".bias", {cout}, int64_t{cin} * kernel * kernel);
  op.out = add_node(nodes_[static_cast<size_t>(src)].scale, cout);
  ops_.push_back(std::move(op));
  return ops_.back().out;
}

int Model::maxpool(int src) {
  Op op;
  op.kind = OpKind::kMaxPool;
  op.in0 = src;
  op.out = add_node(nodes_[static_cast<size_t>(src)].scale * 2, channels(src));
  ops_.push_back(std::move(op));
  return ops_.back().out;
}

int Model::upsample(int src) {
  const int scale = nodes_[static_cast<size_t>(src)].scale;
  DP_CHECK(scale % 2 == 0, "model graph: upsampling a node at full resolution");
  Op op;
  op.kind = OpKind::kUpsample;
  op.in0 = src;
  op.out = add_node(scale / 2, channels(src));
  ops_.push_back(std::move(op));
  return ops_.back().out;
}

int Model::concat(int a, int b) {
  DP_CHECK(nodes_[static_cast<size_t>(a)].scale == nodes_[static_cast<size_t>(b)].scale,
           "model graph: concat of different resolutions");
  Op op;
  op.kind = OpKind::kConcat;
  op.in0 = a;
  op.in1 = b;
  op.out = add_node(nodes_[static_cast<size_t>(a)].scale, channels(a) + channels(b));
  ops_.push_back(std::move(op));
  return ops_.back().out;
}

void Model::set_output(int node) {
  output_ = node;
}

Dims Model::dims(int node, int n) const {
  const Node& x = nodes_[static_cast<size_t>(node)];
  return {n, height_ / x.scale, width_ / x.scale, x.c};
}

void Model::setup(int max_batch, int height, int width) {
  const int m = size_multiple();
  DP_CHECK(max_batch > 0, "batch size must be positive, got ", max_batch);
  DP_CHECK(height > 0 && width > 0 && height % m == 0 && width % m == 0, "model ", config_.name,
           ": input height and width must be positive multiples of ", m, ", got ", height, "x",
           width);
  max_batch_ = max_batch;
  height_ = height;
  width_ = width;
  int64_t largest = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& x = nodes_[i];
    const int64_t bytes = dims(static_cast<int>(i), max_batch).numel() * int64_t{sizeof(float)};
    largest = std::max(largest, bytes);
    if (static_cast<int>(i) != input_) x.value = Buffer(static_cast<size_t>(bytes));
    x.grad = Buffer(static_cast<size_t>(bytes));
    x.v = x.value.f32();
    x.g = x.grad.f32();
  }
  nodes_[static_cast<size_t>(input_)].grad = Buffer();  // the input needs no gradient
  nodes_[static_cast<size_t>(input_)].g = nullptr;
  for (Op& op : ops_)
    if (op.kind == OpKind::kMaxPool)
      op.argmax = Buffer(static_cast<size_t>(dims(op.out, max_batch).numel()));
  scratch_ = Buffer(static_cast<size_t>(largest));
}

int64_t Model::activation_bytes() const {
  int64_t total = static_cast<int64_t>(scratch_.bytes());
  for (const Node& x : nodes_) total += static_cast<int64_t>(x.value.bytes() + x.grad.bytes());
  for (const Op& op : ops_) total += static_cast<int64_t>(op.argmax.bytes());
  return total;
}

const float* Model::forward(const float* input, int n) {
  DP_CHECK(max_batch_ > 0, "Model::forward before setup()");
  DP_CHECK(n > 0 && n <= max_batch_, "batch of ", n, " images, but the model was set up for ",
           max_batch_);
  batch_ = n;
  nodes_[static_cast<size_t>(input_)].v = const_cast<float*>(input);
  for (Op& op : ops_) {
    const Node& a = nodes_[static_cast<size_t>(op.in0)];
    Node& out = nodes_[static_cast<size_t>(op.out)];
    switch (op.kind) {
      case OpKind::kConv: {
        const Dims s = dims(op.in0, n);
        backend_.conv_forward({n, s.h, s.w, s.c, out.c, op.kernel, op.relu}, a.v,
                              params_.view(op.weight).value, params_.view(op.bias).value, out.v);
        break;
      }
      case OpKind::kMaxPool:
        backend_.maxpool2x2_forward(dims(op.in0, n), a.v, out.v, op.argmax.u8());
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
  return nodes_[static_cast<size_t>(output_)].v;
}

void Model::backward(const float* diff_logits, GradListener* listener) {
  DP_CHECK(batch_ > 0, "Model::backward before forward()");
  const int n = batch_;
  for (Node& x : nodes_) x.grad_ready = false;
  Node& out_node = nodes_[static_cast<size_t>(output_)];
  backend_.copy(dims(output_, n).numel(), diff_logits, out_node.g);
  out_node.grad_ready = true;

  // Writes an input gradient that an op can only overwrite: straight into the node when it holds
  // no partial sum yet, else through the scratch buffer and an addition.
  auto write_grad = [&](int id, float* scratch, auto&& op_writes) {
    Node& x = nodes_[static_cast<size_t>(id)];
    if (!x.grad_ready) {
      op_writes(x.g);
      x.grad_ready = true;
    } else {
      op_writes(scratch);
      backend_.accumulate(dims(id, n).numel(), scratch, x.g);
    }
  };

  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    Op& op = *it;
    Node& out = nodes_[static_cast<size_t>(op.out)];
    DP_CHECK(out.grad_ready, "model graph: node ", op.out, " has no gradient (unused output)");
    const Node& a = nodes_[static_cast<size_t>(op.in0)];
    switch (op.kind) {
      case OpKind::kConv: {
        const Dims s = dims(op.in0, n);
        const ConvDesc d{n, s.h, s.w, s.c, out.c, op.kernel, op.relu};
        const ParamView& w = params_.view(op.weight);
        const ParamView& b = params_.view(op.bias);
        if (op.in0 == input_) {
          backend_.conv_backward(d, a.v, w.value, out.v, out.g, nullptr, w.grad, b.grad);
        } else {
          write_grad(op.in0, scratch_.f32(), [&](float* dst) {
            backend_.conv_backward(d, a.v, w.value, out.v, out.g, dst, w.grad, b.grad);
          });
        }
        if (listener != nullptr) {
          listener->grad_ready(b);  // the bias comes first in the arena
          listener->grad_ready(w);
        }
        break;
      }
      case OpKind::kMaxPool: {
        // Max-pool backward can add into a partial sum itself.
        Node& x = nodes_[static_cast<size_t>(op.in0)];
        backend_.maxpool2x2_backward(dims(op.in0, n), op.argmax.u8(), out.g, x.g, x.grad_ready);
        x.grad_ready = true;
        break;
      }
      case OpKind::kUpsample:
        write_grad(op.in0, scratch_.f32(),
                   [&](float* dst) { backend_.upsample2x_backward(dims(op.in0, n), out.g, dst); });
        break;
      case OpKind::kConcat: {
        const Dims da = dims(op.in0, n), db = dims(op.in1, n);
        Node& na = nodes_[static_cast<size_t>(op.in0)];
        Node& nb = nodes_[static_cast<size_t>(op.in1)];
        // Each part goes to its node, or to its own half of the scratch buffer.
        float* ga = na.grad_ready ? scratch_.f32() : na.g;
        float* gb = nb.grad_ready ? scratch_.f32() + da.numel() : nb.g;
        backend_.concat_backward(da, db, out.g, ga, gb);
        if (na.grad_ready) backend_.accumulate(da.numel(), ga, na.g);
        if (nb.grad_ready) backend_.accumulate(db.numel(), gb, nb.g);
        na.grad_ready = nb.grad_ready = true;
        break;
      }
    }
  }
}

}  // namespace dp
