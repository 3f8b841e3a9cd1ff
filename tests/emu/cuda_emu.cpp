// The CPU execution model of cuda_emu_device.hpp: fibers as GPU threads, block and warp barriers.
#include "cuda_emu_device.hpp"

#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace dp_emu {

uint3 block_idx;
dim3 block_dim, grid_dim;

namespace {

constexpr unsigned kWarpSize = 32;
constexpr size_t kStackBytes = 256 * 1024;

// A barrier among `members` fibers; members that exit drop out (as exited GPU threads do).
struct Barrier {
  unsigned members = 0, arrived = 0;
  uint64_t generation = 0;
  void release_if_complete() {
    if (arrived > 0 && arrived == members) {
      arrived = 0;
      ++generation;
    }
  }
};

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  uint3 index;
  unsigned warp = 0, lane = 0;
  bool done = false;
  const Barrier* waiting_on = nullptr;  // blocked until its generation moves past wait_generation
  uint64_t wait_generation = 0;
};

struct Warp {
  Barrier barrier;
  unsigned char slots[kWarpSize][16];
};

struct Scheduler {
  ucontext_t main;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier block;
  Fiber* current = nullptr;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  unsigned grid_limit = 0;
  Order order = Order::kForward;
  bool always_fibers = false;
  bool plain = false;            // the running launch calls its threads without fibers
  bool reached_barrier = false;  // ... a fiber of the running launch reached a barrier
  std::unordered_map<const void*, bool> needs_fibers;  // per kernel, after its first launch
  Fiber plain_thread;
  uint64_t launches = 0, threads = 0;
};

Scheduler& sched() {
  static Scheduler s = [] {
    Scheduler init;
    if (const char* env = std::getenv("DP_EMU_GRID_LIMIT"))
      init.grid_limit = unsigned(std::atoi(env));
    return init;
  }();
  return s;
}

// Thread t of the running block (x fastest).
uint3 thread_index(unsigned t) {
  return uint3{t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y)};
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %u,%u,%u)\n", what, block_idx.x,
               block_idx.y, block_idx.z, sched().current ? sched().current->index.x : 0u,
               sched().current ? sched().current->index.y : 0u,
               sched().current ? sched().current->index.z : 0u);
  std::abort();
}

void fiber_main() {
  Scheduler& s = sched();
  s.body(s.ctx);
  Fiber& f = *s.current;
  f.done = true;
  --s.block.members;
  s.block.release_if_complete();
  Barrier& w = s.warps[f.warp].barrier;
  --w.members;
  w.release_if_complete();
  // Returning resumes s.main (uc_link).
}

// Blocks the running fiber at `b` until every member has arrived.
void wait(Barrier& b) {
  Scheduler& s = sched();
  if (s.plain)
    fail("a kernel reached a barrier in a launch run without fibers (its first did not)");
  s.reached_barrier = true;
  Fiber& f = *s.current;
  ++b.arrived;
  const uint64_t generation = b.generation;
  b.release_if_complete();
  if (b.generation != generation) return;  // this fiber completed the barrier
  f.waiting_on = &b;
  f.wait_generation = generation;
  if (swapcontext(&f.context, &s.main) != 0) fail("swapcontext failed");
}

void run_block(Scheduler& s, unsigned threads) {
  s.block = Barrier{threads, 0, 0};
  const unsigned warps = (threads + kWarpSize - 1) / kWarpSize;
  s.warps.assign(warps, Warp{});
  for (unsigned w = 0; w < warps; ++w)
    s.warps[w].barrier.members = std::min(kWarpSize, threads - w * kWarpSize);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    f.index = thread_index(t);
    f.warp = t / kWarpSize;
    f.lane = t % kWarpSize;
    f.done = false;
    f.waiting_on = nullptr;
    if (getcontext(&f.context) != 0) fail("getcontext failed");
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &s.main;
    makecontext(&f.context, fiber_main, 0);
  }
  // Passes over the warps in order; within a pass each warp runs its runnable lanes (in order)
  // until none is left, i.e. to its next block barrier or its end, before the next warp starts.
  const bool reverse = s.order == Order::kReverse;
  unsigned finished = 0;
  while (finished < threads) {
    bool ran = false;
    for (unsigned wi = 0; wi < warps; ++wi) {
      const unsigned w = reverse ? warps - 1 - wi : wi;
      const unsigned first = w * kWarpSize, count = std::min(kWarpSize, threads - first);
      for (bool again = true; again;) {
        again = false;
        for (unsigned li = 0; li < count; ++li) {
          Fiber& f = s.fibers[first + (reverse ? count - 1 - li : li)];
          if (f.done || (f.waiting_on != nullptr && f.waiting_on->generation == f.wait_generation))
            continue;
          f.waiting_on = nullptr;
          s.current = &f;
          if (swapcontext(&s.main, &f.context) != 0) fail("swapcontext failed");
          s.current = nullptr;
          ran = again = true;
          if (f.done) ++finished;
        }
      }
    }
    if (!ran)
      fail("deadlock: a barrier (__syncthreads or a warp shuffle) not every thread reaches");
  }
  s.threads += threads;
}

}  // namespace

const uint3& thread_idx() {
  const Fiber* f = sched().current;
  if (f == nullptr) fail("threadIdx outside a kernel");
  return f->index;
}

unsigned set_grid_stride_limit(unsigned blocks) {
  return std::exchange(sched().grid_limit, blocks);
}
Order set_order(Order order) {
  return std::exchange(sched().order, order);
}
bool set_always_fibers(bool always) {
  return std::exchange(sched().always_fibers, always);
}
uint64_t launches() {
  return sched().launches;
}
uint64_t threads_run() {
  return sched().threads;
}

void sync_block() {
  wait(sched().block);
}

void shuffle_down(void* v, size_t bytes, unsigned delta, unsigned mask) {
  Scheduler& s = sched();
  Fiber& f = *s.current;
  Warp& w = s.warps[f.warp];
  if (mask != 0xffffffffu || w.barrier.members != kWarpSize)
    fail("warp shuffle without all 32 lanes (full mask, full warp, none exited)");
  std::memcpy(w.slots[f.lane], v, bytes);
  wait(w.barrier);
  if (f.lane + delta < kWarpSize) std::memcpy(v, w.slots[f.lane + delta], bytes);
  wait(w.barrier);  // no lane overwrites its slot before every lane has read
}

// Runs the block's threads one after the other as plain calls, in the scheduling order.
void run_block_plain(Scheduler& s, unsigned threads) {
  const bool reverse = s.order == Order::kReverse;
  for (unsigned i = 0; i < threads; ++i) {
    const unsigned t = reverse ? threads - 1 - i : i;
    s.plain_thread.index = thread_index(t);
    s.current = &s.plain_thread;
    s.body(s.ctx);
    s.current = nullptr;
  }
  s.threads += threads;
}

void run_grid(const void* kernel, dim3 grid, dim3 block, void (*body)(void*), void* ctx) {
  // One launch at a time: the scheduler is global (a launch from another host thread waits).
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  Scheduler& s = sched();
  if (s.current != nullptr) fail("kernel launched from a kernel");
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535)
    fail("invalid launch configuration");
  if (s.grid_limit > 0) {
    grid.y = std::min(grid.y, s.grid_limit);
    if (block.y == 1 && grid.y == 1) grid.x = std::min(grid.x, s.grid_limit);
  }
  while (s.fibers.size() < threads) {
    s.fibers.emplace_back();
    s.fibers.back().stack.reset(new char[kStackBytes]);
  }
  s.body = body;
  s.ctx = ctx;
  block_dim = block;
  grid_dim = grid;
  ++s.launches;
  const auto known = s.needs_fibers.find(kernel);
  s.plain = !s.always_fibers && known != s.needs_fibers.end() && !known->second;
  s.reached_barrier = false;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_idx = uint3{x, y, z};
        if (s.plain)
          run_block_plain(s, threads);
        else
          run_block(s, threads);
      }
  if (!s.plain) s.needs_fibers[kernel] = s.needs_fibers[kernel] || s.reached_barrier;
  s.plain = false;
}

}  // namespace dp_emu
