// Shows oneDNN's bf16 convolution backward-weights pass writing outside its buffers, with oneDNN
// alone: every buffer between two guard pages, and a fault named by buffer and offset.
//
//   g++ -O1 -std=c++17 tools/onednn_bf16_weights_probe.cpp -o /tmp/probe -ldnnl  (2.x or 3.x)
//   /tmp/probe 1 24 16 192 256       # N C_in C_out H W (3x3, stride 1, padding 1)
//
// Prints the implementation oneDNN chose, then "ok" (exit 0) or the fault (exit 3). Debian's
// oneDNN 2.6.3 on an AMX CPU (jit:avx512_core_amx_bf16): "fault ... diff_weights ... offset
// -3072" at 192x256; ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 or oneDNN 3.2: ok (docs/DESIGN.md).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>

namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

struct Region {
  const char* name;
  const char* lo;
  const char* hi;
};
Region g_regions[8];
int g_count = 0;

// Names the buffer next to the faulting address (async-signal-safe: snprintf on a stack buffer).
void on_fault(int, siginfo_t* info, void*) {
  const char* at = static_cast<const char*>(info->si_addr);
  char line[256];
  int n = std::snprintf(line, sizeof line, "fault at %p: outside every buffer\n", info->si_addr);
  for (int i = 0; i < g_count; ++i) {
    const Region& r = g_regions[i];
    if (at >= r.lo - 4096 && at < r.hi + 4096) {
      n = std::snprintf(line, sizeof line, "fault at %p: %s, offset %ld of its %ld bytes\n",
                        info->si_addr, r.name, long(at - r.lo), long(r.hi - r.lo));
      break;
    }
  }
  (void)!write(2, line, size_t(n));
  _exit(3);
}

// `bytes` ending at a guard page (64-byte aligned), with a guard page before the first page too.
void* guarded(size_t bytes, const char* name) {
  const size_t page = 4096, span = (bytes + page - 1) / page * page;
  char* base = static_cast<char*>(
      mmap(nullptr, span + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED) std::abort();
  mprotect(base, page, PROT_NONE);
  mprotect(base + page + span, page, PROT_NONE);
  char* p = base + page + (span - bytes) / 64 * 64;
  g_regions[g_count++] = {name, p, p + bytes};
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s N C_IN C_OUT H W\n", argv[0]);
    return 2;
  }
  const memory::dim n = std::atol(argv[1]), ic = std::atol(argv[2]), oc = std::atol(argv[3]),
                    h = std::atol(argv[4]), w = std::atol(argv[5]);
  struct sigaction action = {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, nullptr);

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const memory::desc src({n, ic, h, w}, dt::bf16, tag::nhwc),
      dst({n, oc, h, w}, dt::bf16, tag::nhwc);
  const memory::desc wei({oc, ic, 3, 3}, dt::bf16, tag::any),
      dwei({oc, ic, 3, 3}, dt::f32, tag::any);
  const memory::desc bias({oc}, dt::f32, tag::x);
  const memory::dims strides{1, 1}, pad{1, 1};
  const auto alg = dnnl::algorithm::convolution_direct;
  // The fused post-op and the relu do not matter; dptrain builds the same descriptors otherwise.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::convolution_forward::primitive_desc fwd(eng, dnnl::prop_kind::forward_training, alg,
                                                      src, wei, bias, dst, strides, pad, pad);
  const dnnl::convolution_backward_weights::primitive_desc pd(eng, alg, src, dwei, bias, dst,
                                                              strides, pad, pad, fwd, attr);
#else
  const dnnl::convolution_forward::primitive_desc fwd(
      {dnnl::prop_kind::forward_training, alg, src, wei, bias, dst, strides, pad, pad}, eng);
  const dnnl::convolution_backward_weights::primitive_desc pd(
      {alg, src, dwei, bias, dst, strides, pad, pad}, attr, eng, fwd);
#endif
  std::printf("%s\n", pd.impl_info_str());
  std::fflush(stdout);

  const auto make = [&](const memory::desc& md, const char* name) {
    void* p = guarded(md.get_size(), name);
    std::memset(p, 0, md.get_size());
    return memory(md, eng, p);
  };
  const memory src_m = make(src, "src"), diff_dst_m = make(dst, "diff_dst");
  const memory diff_w_m = make(pd.diff_weights_desc(), "diff_weights");
  const memory diff_b_m = make(bias, "diff_bias"), pad_m = make(pd.scratchpad_desc(), "scratchpad");
  dnnl::convolution_backward_weights(pd).execute(stream, {{DNNL_ARG_SRC, src_m},
                                                          {DNNL_ARG_DIFF_DST, diff_dst_m},
                                                          {DNNL_ARG_DIFF_WEIGHTS, diff_w_m},
                                                          {DNNL_ARG_DIFF_BIAS, diff_b_m},
                                                          {DNNL_ARG_SCRATCHPAD, pad_m}});
  stream.wait();
  std::printf("ok\n");
  return 0;
}
