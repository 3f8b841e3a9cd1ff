// The part of cuDNN's legacy convolution API that lib/cuda uses, on the CPU, for the emulated
// backend (tests/emu): descriptors, direct convolutions (forward, backward data, backward filter,
// fused bias + activation) on NHWC/NCHW tensors and KCRS/KRSC filters in fp32 or bf16 with fp32
// accumulation, tensor transforms, and an algorithm search with two algorithms per pass.
//
// The algorithms (the same arithmetic; they differ in what the search sees):
//   0: deterministic, no workspace, never tensor cores (fp32 exact), searched at 2 ms;
//   1: searched at 1 ms (so preferred), needs a workspace (the filter's fp32 size + 4 KiB),
//      non-deterministic in the backward passes, on tensor cores unless the math type is FMA only:
//      fp32 operands are then rounded to TF32 (10 mantissa bits) as the GPU does.
// The heuristics list 1 before 0. bf16 tensors need even channel counts on both sides (so a
// 3-channel input or a 1-channel output has no bf16 algorithm: the backend's widened plans run).
// The fused call refuses bf16 tensors, and the identity activation except with algorithm 1 (as
// cuDNN allows it with IMPLICIT_PRECOMP_GEMM only). Calls check their arguments as cuDNN
// documents them (shapes, types, workspace size, outputs not overlapping inputs) and return its
// error statuses; the workspace is overwritten with NaN bytes, so that an operand placed in it
// shows.
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dp/bf16.hpp"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t sn = 0, sc = 0, sh = 0, sw = 0;  // element strides
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int k = 0, c = 0, r = 0, s = 0;
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};
struct cudnnActivationStruct {
  bool set = false;
  cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
};

namespace {

constexpr int kAlgorithms = 2;

size_t type_bytes(cudnnDataType_t t) {
  return t == CUDNN_DATA_BFLOAT16 ? 2 : 4;
}
bool known_type(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_BFLOAT16;
}

float load(const void* p, cudnnDataType_t t, int64_t i) {
  if (t == CUDNN_DATA_FLOAT) return static_cast<const float*>(p)[i];
  return dp::to_float(static_cast<const dp::bf16*>(p)[i]);
}
void store(void* p, cudnnDataType_t t, int64_t i, float v) {
  if (t == CUDNN_DATA_FLOAT)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<dp::bf16*>(p)[i] = dp::to_bf16(v);
}

// TF32: fp32 rounded to 10 explicit mantissa bits (nearest, ties to even).
float to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

int64_t numel(const cudnnTensorStruct& t) {
  return int64_t{t.n} * t.c * t.h * t.w;
}
int64_t offset(const cudnnTensorStruct& t, int n, int c, int h, int w) {
  return n * t.sn + c * t.sc + h * t.sh + w * t.sw;
}
int64_t numel(const cudnnFilterStruct& f) {
  return int64_t{f.k} * f.c * f.r * f.s;
}
int64_t offset(const cudnnFilterStruct& f, int k, int c, int i, int j) {
  if (f.format == CUDNN_TENSOR_NHWC) return ((int64_t{k} * f.r + i) * f.s + j) * f.c + c;
  return ((int64_t{k} * f.c + c) * f.r + i) * f.s + j;
}

// A tensor's values as fp32 in NHWC order (n, h, w, c), rounded to TF32 with `tf32`.
std::vector<float> nhwc(const cudnnTensorStruct& t, const void* p, bool tf32) {
  std::vector<float> out(size_t(numel(t)));
  size_t o = 0;
  for (int n = 0; n < t.n; ++n)
    for (int h = 0; h < t.h; ++h)
      for (int w = 0; w < t.w; ++w)
        for (int c = 0; c < t.c; ++c) {
          const float v = load(p, t.type, offset(t, n, c, h, w));
          out[o++] = tf32 ? to_tf32(v) : v;
        }
  return out;
}

// A filter's values as fp32 in [r][s][c][k] order (k fastest), rounded to TF32 with `tf32`.
std::vector<float> rsck(const cudnnFilterStruct& f, const void* p, bool tf32) {
  std::vector<float> out(size_t(numel(f)));
  for (int k = 0; k < f.k; ++k)
    for (int c = 0; c < f.c; ++c)
      for (int i = 0; i < f.r; ++i)
        for (int j = 0; j < f.s; ++j) {
          const float v = load(p, f.type, offset(f, k, c, i, j));
          out[size_t(((int64_t{i} * f.s + j) * f.c + c) * f.k + k)] = tf32 ? to_tf32(v) : v;
        }
  return out;
}

// The geometry of one convolution call, checked.
struct Conv {
  const cudnnTensorStruct* x;
  const cudnnFilterStruct* w;
  const cudnnConvolutionStruct* conv;
  const cudnnTensorStruct* y;
  int r = 0, s = 0;
};

int out_size(int in, int pad, int k, int dil, int stride) {
  return (in + 2 * pad - ((k - 1) * dil + 1)) / stride + 1;
}

cudnnStatus_t check(const Conv& g) {
  if (g.x == nullptr || g.w == nullptr || g.conv == nullptr || g.y == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  const auto& x = *g.x;
  const auto& w = *g.w;
  const auto& cv = *g.conv;
  const auto& y = *g.y;
  if (!x.set || !w.set || !cv.set || !y.set) return CUDNN_STATUS_BAD_PARAM;
  if (x.c != w.c || y.c != w.k || y.n != x.n) return CUDNN_STATUS_BAD_PARAM;
  if (y.h != out_size(x.h, cv.pad_h, w.r, cv.dil_h, cv.u) ||
      y.w != out_size(x.w, cv.pad_w, w.s, cv.dil_w, cv.v))
    return CUDNN_STATUS_BAD_PARAM;
  if (x.type != y.type || x.type != w.type) return CUDNN_STATUS_BAD_PARAM;
  if (cv.compute != CUDNN_DATA_FLOAT || cv.mode != CUDNN_CROSS_CORRELATION)
    return CUDNN_STATUS_NOT_SUPPORTED;
  static const bool bf16_any = std::getenv("DP_EMU_CUDNN_BF16_ANY") != nullptr;
  if (x.type == CUDNN_DATA_BFLOAT16 && !bf16_any && (x.c % 2 != 0 || y.c % 2 != 0))
    return CUDNN_STATUS_NOT_SUPPORTED;
  return CUDNN_STATUS_SUCCESS;
}

size_t workspace_need(const Conv& g, int algo) {
  return algo == 1 ? size_t(numel(*g.w)) * sizeof(float) + 4096 : 0;
}

bool uses_tf32(const Conv& g, int algo) {
  return algo == 1 && g.x->type == CUDNN_DATA_FLOAT && g.conv->math != CUDNN_FMA_MATH;
}

cudnnMathType_t math_of(const Conv& g, int algo) {
  if (g.x->type == CUDNN_DATA_BFLOAT16) return CUDNN_TENSOR_OP_MATH;
  return uses_tf32(g, algo) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

enum Pass { kForward, kBackwardData, kBackwardFilter };

cudnnDeterminism_t determinism_of(Pass pass, int algo) {
  return algo == 1 && pass != kForward ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
size_t bytes_of(const cudnnTensorStruct& t) {
  return size_t(numel(t)) * type_bytes(t.type);
}
size_t bytes_of(const cudnnFilterStruct& f) {
  return size_t(numel(f)) * type_bytes(f.type);
}

// Checks a call's algorithm and workspace, and poisons the workspace.
cudnnStatus_t prepare(const Conv& g, int algo, void* ws, size_t ws_bytes) {
  if (const cudnnStatus_t s = check(g); s != CUDNN_STATUS_SUCCESS) return s;
  if (algo < 0 || algo >= kAlgorithms) return CUDNN_STATUS_BAD_PARAM;
  const size_t need = workspace_need(g, algo);
  if (ws_bytes < need || (need > 0 && ws == nullptr)) return CUDNN_STATUS_BAD_PARAM;
  if (ws != nullptr && ws_bytes > 0) std::memset(ws, 0xff, ws_bytes);
  return CUDNN_STATUS_SUCCESS;
}

// A pass's call: its arguments checked (prepare), its output overlapping neither input refused,
// then run() (which may refuse too).
struct Span {
  const void* p;
  size_t bytes;
};
template <typename Run>
cudnnStatus_t call(const Conv& g, int algo, void* ws, size_t ws_bytes, Span out, Span in1, Span in2,
                   Run&& run) {
  if (const cudnnStatus_t s = prepare(g, algo, ws, ws_bytes); s != CUDNN_STATUS_SUCCESS) return s;
  if (overlaps(out.p, out.bytes, in1.p, in1.bytes) || overlaps(out.p, out.bytes, in2.p, in2.bytes))
    return CUDNN_STATUS_BAD_PARAM;
  return run();
}

// The three passes; results combined as alpha * result + beta * old (beta == 0: old unread).
void forward(const Conv& g, int algo, float alpha, const void* x, const void* w, float beta,
             void* y, std::vector<float>* result = nullptr) {
  const auto &xd = *g.x, &yd = *g.y;
  const auto& wd = *g.w;
  const auto& cv = *g.conv;
  const bool tf32 = uses_tf32(g, algo);
  const std::vector<float> xv = nhwc(xd, x, tf32), wv = rsck(wd, w, tf32);
  const int C = xd.c, K = yd.c;
  std::vector<float> acc(static_cast<size_t>(K));
  if (result) result->assign(size_t(numel(yd)), 0.0f);
  size_t o = 0;
  for (int n = 0; n < yd.n; ++n)
    for (int oy = 0; oy < yd.h; ++oy)
      for (int ox = 0; ox < yd.w; ++ox) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int i = 0; i < wd.r; ++i) {
          const int iy = oy * cv.u - cv.pad_h + i * cv.dil_h;
          if (iy < 0 || iy >= xd.h) continue;
          for (int j = 0; j < wd.s; ++j) {
            const int ix = ox * cv.v - cv.pad_w + j * cv.dil_w;
            if (ix < 0 || ix >= xd.w) continue;
            const float* xp = &xv[size_t(((int64_t{n} * xd.h + iy) * xd.w + ix) * C)];
            const float* wp = &wv[size_t((int64_t{i} * wd.s + j) * C * K)];
            for (int c = 0; c < C; ++c) {
              const float a = xp[c];
              const float* wk = wp + int64_t{c} * K;
              for (int k = 0; k < K; ++k) acc[size_t(k)] += a * wk[k];
            }
          }
        }
        for (int k = 0; k < K; ++k) {
          if (result) {
            (*result)[o++] = acc[size_t(k)];
            continue;
          }
          const int64_t at = offset(yd, n, k, oy, ox);
          const float old = beta != 0.0f ? load(y, yd.type, at) : 0.0f;
          store(y, yd.type, at, alpha * acc[size_t(k)] + beta * old);
        }
      }
}

void backward_data(const Conv& g, int algo, float alpha, const void* w, const void* dy, float beta,
                   void* dx) {
  const auto &xd = *g.x, &yd = *g.y;
  const auto& wd = *g.w;
  const auto& cv = *g.conv;
  const bool tf32 = uses_tf32(g, algo);
  const std::vector<float> dyv = nhwc(yd, dy, tf32), wv = rsck(wd, w, tf32);
  const int C = xd.c, K = yd.c;
  std::vector<float> acc(size_t(numel(xd)), 0.0f);  // NHWC
  for (int n = 0; n < yd.n; ++n)
    for (int oy = 0; oy < yd.h; ++oy)
      for (int ox = 0; ox < yd.w; ++ox) {
        const float* gp = &dyv[size_t(((int64_t{n} * yd.h + oy) * yd.w + ox) * K)];
        for (int i = 0; i < wd.r; ++i) {
          const int iy = oy * cv.u - cv.pad_h + i * cv.dil_h;
          if (iy < 0 || iy >= xd.h) continue;
          for (int j = 0; j < wd.s; ++j) {
            const int ix = ox * cv.v - cv.pad_w + j * cv.dil_w;
            if (ix < 0 || ix >= xd.w) continue;
            float* ap = &acc[size_t(((int64_t{n} * xd.h + iy) * xd.w + ix) * C)];
            const float* wp = &wv[size_t((int64_t{i} * wd.s + j) * C * K)];
            for (int c = 0; c < C; ++c) {
              const float* wk = wp + int64_t{c} * K;
              float sum = 0.0f;
              for (int k = 0; k < K; ++k) sum += gp[k] * wk[k];
              ap[c] += sum;
            }
          }
        }
      }
  size_t o = 0;
  for (int n = 0; n < xd.n; ++n)
    for (int h = 0; h < xd.h; ++h)
      for (int w2 = 0; w2 < xd.w; ++w2)
        for (int c = 0; c < C; ++c) {
          const int64_t at = offset(xd, n, c, h, w2);
          const float old = beta != 0.0f ? load(dx, xd.type, at) : 0.0f;
          store(dx, xd.type, at, alpha * acc[o++] + beta * old);
        }
}

void backward_filter(const Conv& g, int algo, float alpha, const void* x, const void* dy,
                     float beta, void* dw) {
  const auto &xd = *g.x, &yd = *g.y;
  const auto& wd = *g.w;
  const auto& cv = *g.conv;
  const bool tf32 = uses_tf32(g, algo);
  const std::vector<float> xv = nhwc(xd, x, tf32), dyv = nhwc(yd, dy, tf32);
  const int C = xd.c, K = yd.c;
  std::vector<float> acc(size_t(numel(wd)), 0.0f);  // [r][s][c][k]
  for (int n = 0; n < yd.n; ++n)
    for (int oy = 0; oy < yd.h; ++oy)
      for (int ox = 0; ox < yd.w; ++ox) {
        const float* gp = &dyv[size_t(((int64_t{n} * yd.h + oy) * yd.w + ox) * K)];
        for (int i = 0; i < wd.r; ++i) {
          const int iy = oy * cv.u - cv.pad_h + i * cv.dil_h;
          if (iy < 0 || iy >= xd.h) continue;
          for (int j = 0; j < wd.s; ++j) {
            const int ix = ox * cv.v - cv.pad_w + j * cv.dil_w;
            if (ix < 0 || ix >= xd.w) continue;
            const float* xp = &xv[size_t(((int64_t{n} * xd.h + iy) * xd.w + ix) * C)];
            float* ap = &acc[size_t((int64_t{i} * wd.s + j) * C * K)];
            for (int c = 0; c < C; ++c) {
              const float a = xp[c];
              float* ak = ap + int64_t{c} * K;
              for (int k = 0; k < K; ++k) ak[k] += a * gp[k];
            }
          }
        }
      }
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < wd.r; ++i)
        for (int j = 0; j < wd.s; ++j) {
          const int64_t at = offset(wd, k, c, i, j);
          const float old = beta != 0.0f ? load(dw, wd.type, at) : 0.0f;
          const float v = acc[size_t(((int64_t{i} * wd.s + j) * C + c) * K + k)];
          store(dw, wd.type, at, alpha * v + beta * old);
        }
}

float scalar(const void* p) {
  return *static_cast<const float*>(p);
}

// The search's results for one pass, fastest first (run: the pass on the call's buffers).
template <typename Perf, typename Run>
cudnnStatus_t find(const Conv& g, Pass pass, int requested, int* returned, Perf* perf, void* ws,
                   size_t ws_bytes, Run&& run) {
  const cudnnStatus_t status = check(g);
  if (status == CUDNN_STATUS_BAD_PARAM) return status;
  if (requested < 1 || returned == nullptr || perf == nullptr) return CUDNN_STATUS_BAD_PARAM;
  const bool supported = status == CUDNN_STATUS_SUCCESS;
  std::vector<Perf> out;
  for (const int algo : {1, 0}) {
    Perf p{};
    p.algo = static_cast<decltype(p.algo)>(algo);
    p.memory = workspace_need(g, algo);
    p.determinism = determinism_of(pass, algo);
    p.mathType = math_of(g, algo);
    p.time = -1.0f;
    if (!supported)
      p.status = CUDNN_STATUS_NOT_SUPPORTED;
    else if (p.memory > ws_bytes || (p.memory > 0 && ws == nullptr))
      p.status = CUDNN_STATUS_ALLOC_FAILED;
    else {
      if (ws != nullptr && ws_bytes > 0) std::memset(ws, 0xff, ws_bytes);
      run(algo);
      p.status = CUDNN_STATUS_SUCCESS;
      p.time = algo == 1 ? 1.0f : 2.0f;
    }
    out.push_back(p);
  }
  std::stable_sort(out.begin(), out.end(), [](const Perf& a, const Perf& b) {
    return (a.status == CUDNN_STATUS_SUCCESS) > (b.status == CUDNN_STATUS_SUCCESS);
  });
  *returned = std::min(requested, int(out.size()));
  std::copy(out.begin(), out.begin() + *returned, perf);
  return CUDNN_STATUS_SUCCESS;
}

template <typename Perf>
cudnnStatus_t heuristics(const Conv& g, Pass pass, int requested, int* returned, Perf* perf) {
  const cudnnStatus_t status = check(g);
  if (status == CUDNN_STATUS_BAD_PARAM) return status;
  if (requested < 1 || returned == nullptr || perf == nullptr) return CUDNN_STATUS_BAD_PARAM;
  const bool supported = status == CUDNN_STATUS_SUCCESS;
  *returned = std::min(requested, kAlgorithms);
  for (int i = 0; i < *returned; ++i) {
    const int algo = 1 - i;
    Perf p{};
    p.algo = static_cast<decltype(p.algo)>(algo);
    p.status = supported ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
    p.memory = workspace_need(g, algo);
    p.determinism = determinism_of(pass, algo);
    p.mathType = math_of(g, algo);
    p.time = -1.0f;
    perf[i] = p;
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace_size(const Conv& g, int algo, size_t* bytes) {
  if (const cudnnStatus_t s = check(g); s != CUDNN_STATUS_SUCCESS) return s;
  if (algo < 0 || algo >= kAlgorithms || bytes == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *bytes = workspace_need(g, algo);
  return CUDNN_STATUS_SUCCESS;
}

template <typename T>
cudnnStatus_t create(T** d) {
  if (d == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *d = new T();
  return CUDNN_STATUS_SUCCESS;
}
template <typename T>
cudnnStatus_t destroy(T* d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) {
  return CUDNN_VERSION;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_ALLOC_FAILED:
      return "CUDNN_STATUS_ALLOC_FAILED";
    default:
      return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  return create(handle);
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  return destroy(handle);
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  *stream = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  return create(d);
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  return destroy(d);
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  return create(d);
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  return destroy(d);
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  return create(d);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  return destroy(d);
}
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* d) {
  return create(d);
}
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d) {
  return destroy(d);
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (n < 1 || c < 1 || h < 1 || w < 1 || !known_type(type)) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
  *d = cudnnTensorStruct{true, type, n, c, h, w};
  if (format == CUDNN_TENSOR_NCHW) {
    d->sw = 1, d->sh = w, d->sc = int64_t{h} * w, d->sn = int64_t{c} * h * w;
  } else {
    d->sc = 1, d->sw = c, d->sh = int64_t{w} * c, d->sn = int64_t{h} * w * c;
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (k < 1 || c < 1 || h < 1 || w < 1 || !known_type(type)) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
  *d = cudnnFilterStruct{true, type, format, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dil_h < 1 || dil_w < 1)
    return CUDNN_STATUS_BAD_PARAM;
  const cudnnMathType_t math = d->math;
  *d = cudnnConvolutionStruct{true, pad_h, pad_w, u, v, dil_h, dil_w, mode, compute, math};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
  d->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d,
                                           cudnnActivationMode_t mode, cudnnNanPropagation_t,
                                           double) {
  *d = cudnnActivationStruct{true, mode};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t conv,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wo) {
  if (!conv->set || !x->set || !w->set || x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
  *n = x->n;
  *c = w->k;
  *h = out_size(x->h, conv->pad_h, w->r, conv->dil_h, conv->u);
  *wo = out_size(x->w, conv->pad_w, w->s, conv->dil_w, conv->v);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnTransformTensor(cudnnHandle_t, const void* alpha,
                                   const cudnnTensorDescriptor_t xd, const void* x,
                                   const void* beta, const cudnnTensorDescriptor_t yd, void* y) {
  if (!xd->set || !yd->set || xd->n != yd->n || xd->c != yd->c || xd->h != yd->h ||
      xd->w != yd->w || overlaps(x, bytes_of(*xd), y, bytes_of(*yd)))
    return CUDNN_STATUS_BAD_PARAM;
  const float a = scalar(alpha), b = scalar(beta);
  for (int n = 0; n < xd->n; ++n)
    for (int c = 0; c < xd->c; ++c)
      for (int h = 0; h < xd->h; ++h)
        for (int w = 0; w < xd->w; ++w) {
          const int64_t at = offset(*yd, n, c, h, w);
          const float old = b != 0.0f ? load(y, yd->type, at) : 0.0f;
          store(y, yd->type, at, a * load(x, xd->type, offset(*xd, n, c, h, w)) + b * old);
        }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t, int* count) {
  *count = kAlgorithms;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t, int* count) {
  *count = kAlgorithms;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t, int* count) {
  *count = kAlgorithms;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t y, int requested,
                                                     int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf) {
  return heuristics(Conv{x, w, conv, y}, kForward, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return heuristics(Conv{dx, w, conv, dy}, kBackwardData, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return heuristics(Conv{x, dw, conv, dy}, kBackwardFilter, requested, returned, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y,
    cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
  return workspace_size(Conv{x, w, conv, y}, int(algo), bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  return workspace_size(Conv{dx, w, conv, dy}, int(algo), bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  return workspace_size(Conv{x, dw, conv, dy}, int(algo), bytes);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t, const cudnnTensorDescriptor_t xd, const void* x,
    const cudnnFilterDescriptor_t wd, const void* w, const cudnnConvolutionDescriptor_t conv,
    const cudnnTensorDescriptor_t yd, void* y, const int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t ws_bytes) {
  const Conv g{xd, wd, conv, yd};
  return find(g, kForward, requested, returned, perf, ws, ws_bytes,
              [&](int algo) { forward(g, algo, 1.0f, x, w, 0.0f, y); });
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t, const cudnnFilterDescriptor_t wd, const void* w,
    const cudnnTensorDescriptor_t dyd, const void* dy, const cudnnConvolutionDescriptor_t conv,
    const cudnnTensorDescriptor_t dxd, void* dx, const int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws, size_t ws_bytes) {
  const Conv g{dxd, wd, conv, dyd};
  return find(g, kBackwardData, requested, returned, perf, ws, ws_bytes,
              [&](int algo) { backward_data(g, algo, 1.0f, w, dy, 0.0f, dx); });
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t, const cudnnTensorDescriptor_t xd, const void* x,
    const cudnnTensorDescriptor_t dyd, const void* dy, const cudnnConvolutionDescriptor_t conv,
    const cudnnFilterDescriptor_t dwd, void* dw, const int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws, size_t ws_bytes) {
  const Conv g{xd, dwd, conv, dyd};
  return find(g, kBackwardFilter, requested, returned, perf, ws, ws_bytes,
              [&](int algo) { backward_filter(g, algo, 1.0f, x, dy, 0.0f, dw); });
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void* alpha,
                                      const cudnnTensorDescriptor_t xd, const void* x,
                                      const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes,
                                      const void* beta, const cudnnTensorDescriptor_t yd, void* y) {
  const Conv g{xd, wd, conv, yd};
  return call(g, int(algo), ws, ws_bytes, {y, bytes_of(*yd)}, {x, bytes_of(*xd)},
              {w, bytes_of(*wd)}, [&] {
                forward(g, int(algo), scalar(alpha), x, w, scalar(beta), y);
                return CUDNN_STATUS_SUCCESS;
              });
}

cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t, const void* alpha1, const cudnnTensorDescriptor_t xd, const void* x,
    const cudnnFilterDescriptor_t wd, const void* w, const cudnnConvolutionDescriptor_t conv,
    cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes, const void* alpha2,
    const cudnnTensorDescriptor_t zd, const void* z, const cudnnTensorDescriptor_t bd,
    const void* bias, const cudnnActivationDescriptor_t act, const cudnnTensorDescriptor_t yd,
    void* y) {
  const Conv g{xd, wd, conv, yd};
  return call(
      g, int(algo), ws, ws_bytes, {y, bytes_of(*yd)}, {x, bytes_of(*xd)}, {w, bytes_of(*wd)}, [&] {
        if (xd->type != CUDNN_DATA_FLOAT || !act->set) return CUDNN_STATUS_NOT_SUPPORTED;
        if (act->mode != CUDNN_ACTIVATION_RELU &&
            !(act->mode == CUDNN_ACTIVATION_IDENTITY && int(algo) == 1))
          return CUDNN_STATUS_NOT_SUPPORTED;
        if (!bd->set || bd->n != 1 || bd->c != yd->c || bd->h != 1 || bd->w != 1 ||
            bd->type != CUDNN_DATA_FLOAT || !zd->set || zd->n != yd->n || zd->c != yd->c ||
            zd->h != yd->h || zd->w != yd->w)
          return CUDNN_STATUS_BAD_PARAM;
        std::vector<float> conv_out;
        forward(g, int(algo), 1.0f, x, w, 0.0f, nullptr, &conv_out);
        const float a1 = scalar(alpha1), a2 = scalar(alpha2);
        const float* b = static_cast<const float*>(bias);
        size_t o = 0;
        for (int n = 0; n < yd->n; ++n)
          for (int h = 0; h < yd->h; ++h)
            for (int w2 = 0; w2 < yd->w; ++w2)
              for (int k = 0; k < yd->c; ++k) {
                const float zv = a2 != 0.0f ? load(z, zd->type, offset(*zd, n, k, h, w2)) : 0.0f;
                float v = a1 * conv_out[o++] + a2 * zv + b[k];
                if (act->mode == CUDNN_ACTIVATION_RELU) v = std::max(v, 0.0f);
                store(y, yd->type, offset(*yd, n, k, h, w2), v);
              }
        return CUDNN_STATUS_SUCCESS;
      });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void* alpha,
                                           const cudnnFilterDescriptor_t wd, const void* w,
                                           const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws,
                                           size_t ws_bytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxd, void* dx) {
  const Conv g{dxd, wd, conv, dyd};
  return call(g, int(algo), ws, ws_bytes, {dx, bytes_of(*dxd)}, {dy, bytes_of(*dyd)},
              {w, bytes_of(*wd)}, [&] {
                backward_data(g, int(algo), scalar(alpha), w, dy, scalar(beta), dx);
                return CUDNN_STATUS_SUCCESS;
              });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void* alpha,
                                             const cudnnTensorDescriptor_t xd, const void* x,
                                             const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws,
                                             size_t ws_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwd, void* dw) {
  const Conv g{xd, dwd, conv, dyd};
  return call(g, int(algo), ws, ws_bytes, {dw, bytes_of(*dwd)}, {x, bytes_of(*xd)},
              {dy, bytes_of(*dyd)}, [&] {
                backward_filter(g, int(algo), scalar(alpha), x, dy, scalar(beta), dw);
                return CUDNN_STATUS_SUCCESS;
              });
}

}  // extern "C"
