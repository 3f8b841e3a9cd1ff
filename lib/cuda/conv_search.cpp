// The CUDA backend's cuDNN algorithm choice: heuristics, timed search, KRSC filters, bf16 probes.
#include <algorithm>
#include <vector>

#include "conv_plan.hpp"
#include "dp/error.hpp"
#include "dp/log.hpp"

namespace dp::cuda {

namespace {

// One algorithm as cuDNN's perf structs describe it (the three differ only in the enum).
struct Candidate {
  int algo = 0;
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  size_t memory = 0;
  cudnnDeterminism_t determinism = CUDNN_NON_DETERMINISTIC;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float ms = -1.0f;  // the search's time; negative where it was not timed
};

// Runs a cuDNN algorithm query `q(capacity, &count, perf)` with room for every algorithm of the
// pass (`max_count`, cuDNN's *AlgorithmMaxCount); on success its results as candidates in *out.
template <typename Perf, typename Query>
cudnnStatus_t query(int max_count, std::vector<Candidate>* out, Query&& q) {
  std::vector<Perf> perf(size_t(std::max(max_count, 1)));
  int count = 0;
  const cudnnStatus_t status = q(int(perf.size()), &count, perf.data());
  if (status != CUDNN_STATUS_SUCCESS) return status;
  out->clear();
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[size_t(i)];
    out->push_back(
        {static_cast<int>(r.algo), r.status, r.memory, r.determinism, r.mathType, r.time});
  }
  return status;
}

// The number of algorithms cuDNN has for the pass.
int max_count(cudnnHandle_t h, int pass) {
  int n = 0;
  if (pass == kForward)
    DP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &n));
  else if (pass == kBackwardData)
    DP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &n));
  else
    DP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &n));
  return n;
}

// The heuristics' algorithms for the pass, in their order (no timing).
cudnnStatus_t heuristics(cudnnHandle_t h, const ConvEngine::Plan& p, const PassState& ps, int pass,
                         std::vector<Candidate>* out) {
  const int n = max_count(h, pass);
  if (pass == kForward)
    return query<cudnnConvolutionFwdAlgoPerf_t>(n, out, [&](int cap, int* count, auto* perf) {
      return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.get(), ps.filter.get(), ps.conv.get(),
                                                    p.y.get(), cap, count, perf);
    });
  if (pass == kBackwardData)
    return query<cudnnConvolutionBwdDataAlgoPerf_t>(n, out, [&](int cap, int* count, auto* perf) {
      return cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, ps.filter.get(), p.y.get(), ps.conv.get(), p.x.get(), cap, count, perf);
    });
  return query<cudnnConvolutionBwdFilterAlgoPerf_t>(n, out, [&](int cap, int* count, auto* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.get(), p.y.get(), ps.conv.get(),
                                                         ps.filter.get(), cap, count, perf);
  });
}

// Times the algorithms on the call's buffers (x, w, y; the pass's output among them is
// overwritten), fastest first.
cudnnStatus_t find(cudnnHandle_t h, const ConvEngine::Plan& p, const PassState& ps, int pass,
                   const void* x, const void* w, const void* y, void* ws, size_t ws_bytes,
                   std::vector<Candidate>* out) {
  const int n = max_count(h, pass);
  if (pass == kForward)
    return query<cudnnConvolutionFwdAlgoPerf_t>(n, out, [&](int cap, int* count, auto* perf) {
      return cudnnFindConvolutionForwardAlgorithmEx(h, p.x.get(), x, ps.filter.get(), w,
                                                    ps.conv.get(), p.y.get(), const_cast<void*>(y),
                                                    cap, count, perf, ws, ws_bytes);
    });
  if (pass == kBackwardData)
    return query<cudnnConvolutionBwdDataAlgoPerf_t>(n, out, [&](int cap, int* count, auto* perf) {
      return cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, ps.filter.get(), w, p.y.get(), y, ps.conv.get(), p.x.get(), const_cast<void*>(x), cap,
          count, perf, ws, ws_bytes);
    });
  return query<cudnnConvolutionBwdFilterAlgoPerf_t>(n, out, [&](int cap, int* count, auto* perf) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h, p.x.get(), x, p.y.get(), y, ps.conv.get(), ps.filter.get(), const_cast<void*>(w), cap,
        count, perf, ws, ws_bytes);
  });
}

cudnnStatus_t workspace_size(cudnnHandle_t h, const ConvEngine::Plan& p, const PassState& ps,
                             int pass, int algo, size_t* bytes) {
  if (pass == kForward)
    return cudnnGetConvolutionForwardWorkspaceSize(
        h, p.x.get(), ps.filter.get(), ps.conv.get(), p.y.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
  if (pass == kBackwardData)
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, ps.filter.get(), p.y.get(), ps.conv.get(), p.x.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(
      h, p.x.get(), p.y.get(), ps.conv.get(), ps.filter.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
}

}  // namespace

std::string ConvEngine::search_conditions(const Plan& p) const {
  return str_cat(p.bf16 ? " (bf16 NHWC, fp32 compute" : " (fp32 NHWC",
                 options_.deterministic ? ", deterministic only" : "",
                 p.bf16 || options_.tf32 ? "" : ", no TF32", ", workspace at most ",
                 format_mib(double(options_.max_workspace_bytes)), ")");
}

bool ConvEngine::try_ensure(Plan& p, int pass, const void* x, const void* w, const void* y) {
  PassState& ps = p.pass[pass];
  if (ps.ready) return true;
  p.short_of_memory = false;
  std::string why_nchw;
  if (!options_.krsc_filters) {
    if (choose(p, pass, false, x, w, y)) {
      keep_faster_krsc(p, pass, x, w, y);
      note_choice(p, pass);
      return true;
    }
    why_nchw = p.why;
  }
  if (choose(p, pass, true, x, w, y)) {
    note_choice(p, pass);
    return true;
  }
  p.why = str_cat(options_.krsc_filters ? "" : str_cat("with the NCHW filter: ", why_nchw, "; "),
                  "with the KRSC filter: ", p.why);
  return false;
}

// With the NCHW filter cuDNN may offer fewer or slower kernels for a shape than with the filter
// in KRSC (NHWC) order, the layout its NHWC tensor-core kernels read. So the KRSC filter is
// searched too, and kept when its call is clearly (10%) faster: that covers the filter copy it
// costs in fp32 (bf16 copies the filter either way). Both choices are timed as they will run
// (time_pass), not by the search's figures: the search may fail as a whole with the KRSC filter
// (then its choice is the heuristics' first), and with the NCHW filter it may find only
// IMPLICIT_GEMM, the legacy kernel without tensor cores (on an H200, cuDNN 9.19, UNet16's dec1 at
// 448x448, batch 16: 17.5 ms a call). --deterministic (choices ranked by the heuristics, never by
// timings) keeps the NCHW filter.
void ConvEngine::keep_faster_krsc(Plan& p, int pass, const void* x, const void* w, const void* y) {
  if (options_.deterministic) return;
  PassState& ps = p.pass[pass];
  ps.ms = time_pass(p, pass, x, w, y);
  const int algo = ps.algo;
  const cudnnMathType_t math = ps.math;
  const float ms = ps.ms;
  if (choose(p, pass, true, x, w, y)) {
    ps.ms = time_pass(p, pass, x, w, y);
    if (ps.ms < 0.9f * ms) return;
  }
  // Back to the NCHW filter's algorithm.
  DP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(ps.filter.get(), operand_type(p), CUDNN_TENSOR_NCHW,
                                            p.k, p.c, p.r, p.r));
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), math));
  ps.algo = algo;
  ps.math = math;
  ps.ms = ms;
  ps.krsc = false;
  ps.ready = true;
  p.short_of_memory = false;
  p.why.clear();
}

float ConvEngine::time_pass(const Plan& p, int pass, const void* x, const void* w, const void* y) {
  const PassState& ps = p.pass[pass];
  auto call = [&] {
    if (pass == kForward)
      DP_CUDNN_CHECK(cudnnConvolutionForward(
          handle_, &kOne, p.x.get(), x, ps.filter.get(), w, ps.conv.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(ps.algo), workspace_.data(), workspace_.bytes(),
          &kZero, p.y.get(), const_cast<void*>(y)));
    else if (pass == kBackwardData)
      DP_CUDNN_CHECK(cudnnConvolutionBackwardData(
          handle_, &kOne, ps.filter.get(), w, p.y.get(), y, ps.conv.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(ps.algo), workspace_.data(),
          workspace_.bytes(), &kZero, p.x.get(), const_cast<void*>(x)));
    else
      DP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          handle_, &kOne, p.x.get(), x, p.y.get(), y, ps.conv.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(ps.algo), workspace_.data(),
          workspace_.bytes(), &kZero, ps.filter.get(), const_cast<void*>(w)));
  };
  call();  // warm-up: lazy module loading, caches
  constexpr int kRuns = 3;
  const Event start(true), end(true);
  start.record(heap_.stream());
  for (int i = 0; i < kRuns; ++i) call();
  end.record(heap_.stream());
  end.synchronize();
  return Event::elapsed_ms(start, end) / kRuns;
}

void ConvEngine::note_choice(const Plan& p, int pass) const {
  if (!options_.log_algorithms) return;
  const PassState& ps = p.pass[pass];
  const char* math = ps.math == CUDNN_TENSOR_OP_MATH ? "tensor-op math"
                     : ps.math == CUDNN_FMA_MATH     ? "FMA math"
                                                     : "default math (TF32 allowed)";
  options_.log.info("cuDNN: ", p.what, " ", kPassName[pass], ": algorithm ", ps.algo, ", ", math,
                    ", ", ps.krsc ? "KRSC" : "NCHW", " filter",
                    ps.ms >= 0.0f ? str_cat(", ", fixed(ps.ms, 3), " ms") : std::string());
}

void ConvEngine::ensure(Plan& p, int pass, const void* x, const void* w, const void* y) {
  if (try_ensure(p, pass, x, w, y)) return;
  fail("cuDNN offers no usable ", kPassName[pass], " algorithm for ", p.what, search_conditions(p),
       ": ", p.why);
}

bool ConvEngine::keep_bf16(Plan& p, std::initializer_list<int> passes) {
  int pass = -1;  // the first pass without a bf16 algorithm
  {
    // On scratch operands of the plan's shapes (their contents do not matter to the search),
    // allocated once for the passes and freed after.
    Arena probe(heap_, "the bf16 algorithm search's operands");
    const Plan::Regions r = p.probe();
    probe.reserve(r.bytes);
    // Zeros: no NaN or subnormal garbage to slow an algorithm down in the timing.
    DP_CUDA_CHECK(cudaMemsetAsync(probe.data(), 0, r.bytes, heap_.stream()));
    char* base = static_cast<char*>(probe.data());
    for (int candidate : passes) {
      if (!try_ensure(p, candidate, base, base + r.w_offset, base + r.y_offset)) {
        pass = candidate;
        break;
      }
    }
  }
  if (pass < 0) return true;
  // Device memory, not bf16 support, is missing: the same error as in ensure(), on this rank.
  if (p.short_of_memory)
    fail("cuDNN offers no usable ", kPassName[pass], " algorithm for ", p.what,
         search_conditions(p), ": ", p.why);
  options_.log.info("cuDNN: ", p.what, " runs in fp32", options_.tf32 ? " (TF32)" : "",
                    " instead of bf16: no usable bf16 ", kPassName[pass], " algorithm",
                    search_conditions(p), ": ", p.why);
  p.bf16 = false;
  p.widened = true;
  init_plan(&p, options_);
  return false;
}

bool ConvEngine::choose(Plan& p, int pass, bool krsc, const void* x, const void* w, const void* y) {
  PassState& ps = p.pass[pass];
  const cudnnMathType_t base_math = base_math_type(p, options_);
  // Each algorithm runs with the math type it was found with, except in fp32 without TF32, where
  // every one runs FMA-only. (bf16 operands are rounded already: tensor cores lose nothing more.)
  const bool own_math = p.bf16 || options_.tf32;
  DP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(ps.filter.get(), operand_type(p),
                                            krsc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, p.k, p.c,
                                            p.r, p.r));
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), base_math));

  const auto usable = [&](const Candidate& c) {
    return c.status == CUDNN_STATUS_SUCCESS &&
           (!options_.deterministic || c.determinism == CUDNN_DETERMINISTIC) &&
           c.math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&  // may round to half precision
           (own_math || c.math != CUDNN_TENSOR_OP_MATH) && c.memory <= options_.max_workspace_bytes;
  };

  // The heuristics say which algorithms apply and how much workspace they may need.
  std::vector<Candidate> hints;
  const cudnnStatus_t hint_status = heuristics(handle_, p, ps, pass, &hints);
  if (hint_status != CUDNN_STATUS_SUCCESS) {
    p.why = str_cat("the heuristics failed: ", cudnnGetErrorString(hint_status));
    return false;
  }
  size_t search_bytes = 0;
  bool any = false;
  for (const Candidate& c : hints) {
    if (!usable(c)) continue;
    any = true;
    size_t need = 0;
    DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), own_math ? c.math : base_math));
    if (workspace_size(handle_, p, ps, pass, c.algo, &need) != CUDNN_STATUS_SUCCESS) need = 0;
    need = std::max(need, c.memory);
    if (need <= options_.max_workspace_bytes) search_bytes = std::max(search_bytes, need);
  }
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), base_math));
  if (!any) {
    p.why = "the heuristics list no supported algorithm";
    return false;
  }

  // Time them with as much of that workspace as the device can spare for the search (a scratch
  // allocation freed right after, or the arena when it is large enough already).
  void* temp = nullptr;
  size_t temp_bytes = 0;
  for (size_t b = search_bytes; b > workspace_.bytes(); b /= 2) {
    if ((temp = heap_.try_allocate(b)) != nullptr) {
      temp_bytes = b;
      break;
    }
  }
  std::vector<Candidate> found;
  cudnnStatus_t find_status = CUDNN_STATUS_SUCCESS;
  try {
    find_status = find(handle_, p, ps, pass, x, w, y, temp ? temp : workspace_.data(),
                       temp ? temp_bytes : workspace_.bytes(), &found);
  } catch (...) {
    heap_.free(temp, temp_bytes);
    throw;
  }
  heap_.free(temp, temp_bytes);
  std::vector<Candidate> ranked;
  const bool ranked_by_time = find_status == CUDNN_STATUS_SUCCESS && !options_.deterministic;
  if (find_status != CUDNN_STATUS_SUCCESS) {
    // Unsupported layouts may fail as a whole; the KRSC filter is the supported configuration,
    // where the heuristics' order stands in for the timing.
    if (!krsc) {
      p.why = str_cat("the search failed: ", cudnnGetErrorString(find_status));
      return false;
    }
    ranked = hints;
  } else if (options_.deterministic) {
    // Run-to-run reproducible: the heuristics' order (fixed for a shape, GPU and cuDNN), not the
    // timings, among the algorithms that ran in the search.
    for (const Candidate& h : hints) {
      const bool ran = std::any_of(found.begin(), found.end(), [&](const Candidate& c) {
        return c.algo == h.algo && c.status == CUDNN_STATUS_SUCCESS;
      });
      if (ran) ranked.push_back(h);
    }
  } else {
    ranked = found;
  }

  // The first usable algorithm whose workspace the arena can grow to.
  bool out_of_memory = false;
  for (const Candidate& c : ranked) {
    if (!usable(c)) continue;
    DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), own_math ? c.math : base_math));
    size_t need = 0;
    if (workspace_size(handle_, p, ps, pass, c.algo, &need) != CUDNN_STATUS_SUCCESS) continue;
    need = std::max(need, c.memory);
    if (need > options_.max_workspace_bytes) continue;
    if (!workspace_.try_reserve(need)) {
      out_of_memory = true;
      continue;
    }
    ps.algo = c.algo;
    ps.math = own_math ? c.math : base_math;
    ps.ms = ranked_by_time ? c.ms : -1.0f;
    ps.krsc = krsc;
    ps.ready = true;
    return true;
  }
  DP_CUDNN_CHECK(cudnnSetConvolutionMathType(ps.conv.get(), base_math));
  p.short_of_memory = p.short_of_memory || out_of_memory;
  p.why = out_of_memory ? str_cat("the workspace of the supported algorithms does not fit in ",
                                  heap_.device(), " next to the ",
                                  format_mib(double(heap_.allocated())), " held")
                        : std::string("no algorithm that ran in the search is usable");
  return false;
}

}  // namespace dp::cuda
