// Device choice and the per-device set-up of the apps: backends, gradient reducers, batch uploads.
#include "device.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "agreement.hpp"
#include "dp/mpi_comm.hpp"
#ifdef DP_WITH_CUDA
#include <nccl.h>
#include "dp/cuda/batch_upload.hpp"
#include "dp/cuda/cuda_backend.hpp"
#include "dp/cuda/device.hpp"
#include "dp/nccl_comm.hpp"
#include "dp/nccl_grad_reducer.hpp"
#endif

namespace dp::app {

int gpu_for_rank(int local_rank, int local_size, int visible_gpus, bool allow_sharing) {
  DP_CHECK(visible_gpus >= 1 && local_rank >= 0 && local_rank < local_size,
           "gpu_for_rank: local rank ", local_rank, " of ", local_size, ", ", visible_gpus,
           " GPU(s)");
  if (local_size > visible_gpus && !allow_sharing)
    throw UsageError(str_cat("--device cuda: ", local_size, " ranks on this node but ",
                             visible_gpus,
                             " visible GPU(s); start one rank per GPU or pass "
                             "--allow-gpu-sharing"));
  return local_rank % visible_gpus;
}

namespace {

// The leading positive integer of `text` ("4", "4,2" of a nested OMP_NUM_THREADS), else 0.
int leading_positive(const std::string& text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || value <= 0) return 0;
  if (end != text.data() + text.size() && *end != ',') return 0;
  return value;
}

std::string getenv_string(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// This process's node, as a non-negative number (a hash of its host name).
int64_t node_hash() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return int64_t(std::hash<std::string>{}(host) >> 2);
}

#ifdef DP_WITH_CUDA
// Whether the launcher gave every rank of this node GPUs of its own (srun --gpus-per-task, or a
// CUDA_VISIBLE_DEVICES per rank): the first visible GPU of each of the node's ranks is a different
// physical one (PCI bus id). One all-reduce, on every rank.
bool gpus_isolated_per_rank(Comm& comm, int visible) {
  const size_t world = size_t(comm.size());
  std::vector<int64_t> v(2 * world, 0);  // per rank: node, bus id of its first GPU
  v[2 * size_t(comm.rank())] = node_hash();
  char bus_id[32] = {};
  if (visible > 0 && cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0) == cudaSuccess)
    v[2 * size_t(comm.rank()) + 1] = int64_t(std::hash<std::string>{}(bus_id) >> 2) | 1;
  comm.allreduce_sum(v.data(), v.size());
  const int64_t node = v[2 * size_t(comm.rank())];
  std::vector<int64_t> buses;
  for (size_t r = 0; r < world; ++r)
    if (v[2 * r] == node) buses.push_back(v[2 * r + 1]);
  std::sort(buses.begin(), buses.end());
  return buses.size() > 1 && buses.front() != 0 &&
         std::adjacent_find(buses.begin(), buses.end()) == buses.end();
}
#endif

}  // namespace

ThreadEnvironment ThreadEnvironment::of_this_process(int local_ranks) {
  ThreadEnvironment env;
  env.slurm_cpus_per_task = getenv_string("SLURM_CPUS_PER_TASK");
  env.omp_num_threads = getenv_string("OMP_NUM_THREADS");
  cpu_set_t mask;
  CPU_ZERO(&mask);
  env.node_cpus = std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
  env.affinity_cpus =
      sched_getaffinity(0, sizeof mask, &mask) == 0 ? std::max(1, CPU_COUNT(&mask)) : env.node_cpus;
  env.local_ranks = std::max(1, local_ranks);
  return env;
}

ThreadChoice choose_threads(int requested, const ThreadEnvironment& env) {
  if (requested > 0) return {requested, "--threads"};
  if (const int n = leading_positive(env.slurm_cpus_per_task); n > 0)
    return {n, "SLURM_CPUS_PER_TASK=" + env.slurm_cpus_per_task};
  if (const int n = leading_positive(env.omp_num_threads); n > 0)
    return {n, "OMP_NUM_THREADS=" + env.omp_num_threads};
  const int share = std::max(1, env.node_cpus / std::max(1, env.local_ranks));
  if (env.affinity_cpus <= share)
    return {env.affinity_cpus, str_cat("the rank's CPU binding (", env.affinity_cpus, ")")};
  return {share, str_cat("the node's ", env.node_cpus, " CPUs over its ", env.local_ranks,
                         " rank(s): the rank is not bound to its own cores")};
}

std::string oversubscription_warning(Comm& comm, int threads) {
  constexpr size_t kMaskWords = 1024 / 64;
  constexpr size_t kSlot = 2 + kMaskWords;  // node hash, threads, mask
  const size_t world = size_t(comm.size());
  std::vector<int64_t> v(world * kSlot, 0);
  int64_t* mine = v.data() + size_t(comm.rank()) * kSlot;
  mine[0] = node_hash();
  mine[1] = threads;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (size_t cpu = 0; cpu < kMaskWords * 64 && cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &mask)) mine[2 + cpu / 64] |= int64_t(uint64_t{1} << (cpu % 64));
  comm.allreduce_sum(v.data(), v.size());  // one rank writes each slot: the sum is a copy
  std::vector<bool> done(world, false);
  for (size_t r = 0; r < world; ++r) {
    if (done[r]) continue;
    std::vector<uint64_t> cpus(kMaskWords, 0);
    int64_t node_threads = 0;
    std::string ranks;
    for (size_t q = r; q < world; ++q) {
      if (v[q * kSlot] != v[r * kSlot]) continue;
      done[q] = true;
      node_threads += v[q * kSlot + 1];
      for (size_t w = 0; w < kMaskWords; ++w) cpus[w] |= uint64_t(v[q * kSlot + 2 + w]);
      ranks += str_cat(ranks.empty() ? "" : ",", q);
    }
    int covered = 0;
    for (uint64_t w : cpus) covered += __builtin_popcountll(w);
    if (covered > 0 && node_threads > covered)
      return str_cat("ranks ", ranks, " on one node run ", node_threads, " threads on the ",
                     covered,
                     " CPU(s) their bindings cover: bind each rank to cores of its own (mpirun "
                     "--map-by slot:PE=<threads> --bind-to core, srun --cpu-bind=cores) or lower "
                     "--threads");
  }
  return {};
}

struct Device::Cuda {
#ifdef DP_WITH_CUDA
  cuda::CudaBackend* backend = nullptr;
  // Destroyed first: the communicator (aborted if a failure is unwinding), then the uploader,
  // which waits for the streams.
  std::unique_ptr<cuda::BatchUploader> uploader;
  std::unique_ptr<mpi::NcclComm> nccl;
#endif
};

Device::Device(const DeviceRequest& request, Comm& comm)
    : program_(request.program), cuda_(std::make_unique<Cuda>()) {
  gpu_ = request.device == DeviceChoice::kCuda;
#ifdef DP_WITH_CUDA
  if (request.device == DeviceChoice::kAuto)
    gpu_ = comm.all_true(cuda::visible_device_count() > 0);  // every rank decides the same
  if (!gpu_) return;
  const int visible = cuda::visible_device_count();
  // Fewer GPUs visible than ranks on the node, each rank's own (srun --gpus-per-task): the rank
  // takes its first; otherwise its node-local rank picks one of the node's GPUs.
  const bool isolated = comm.local_size() > visible && gpus_isolated_per_rank(comm, visible);
  const int rank = isolated ? 0 : comm.local_rank(), ranks = isolated ? 1 : comm.local_size();
  collectively(comm, [&] {
    if (visible > 0)  // else select_device says why none is visible
      gpu_for_rank(rank, ranks, visible, request.allow_sharing);
    cuda::DeviceInfo d;
    try {
      d = cuda::select_device(rank, ranks, request.allow_sharing);
    } catch (const Error& e) {
      throw UsageError(str_cat("--device cuda: ", e.what()));
    }
    gpu_info_ = {d.ordinal, d.visible_count, d.shared, isolated, d.name, d.pci_bus_id};
    if (request.one_gpu_per_rank && d.shared &&
        comm.size() > 1)  // NCCL refuses two ranks of a communicator on a GPU
      throw UsageError(str_cat("--device cuda: ", comm.local_size(), " ranks on this node share ",
                               d.visible_count,
                               " GPU(s), but the NCCL reducer needs one GPU per rank; start "
                               "one rank per GPU (or a single rank)"));
  });
#else
  (void)comm;
  if (gpu_)
    throw UsageError(str_cat("--device cuda: this ", program_,
                             " was built without CUDA (configure with -DDP_WITH_CUDA=ON); use "
                             "--device cpu"));
#endif
}

Device::~Device() = default;

std::string Device::nccl_version() const {
#ifdef DP_WITH_CUDA
  if (gpu_) return mpi::nccl_version();
#endif
  return {};
}

std::unique_ptr<Backend> Device::make_cpu_backend(const BackendRequest& request) {
  if (request.precision == Precision::kBFloat16 && !cpu_bf16_support().empty())
    throw UsageError(str_cat("--precision bf16: ", cpu_bf16_support(), "; use --precision fp32"));
  if (request.precision == Precision::kFloat32 && request.cpu_conv == CpuConvAlgo::kWinograd &&
      !cpu_winograd_support().empty())
    throw UsageError(
        str_cat("--cpu-conv winograd: ", cpu_winograd_support(), "; use --cpu-conv direct"));
  return dp::make_cpu_backend(CpuOptions{request.precision, request.cpu_conv});
}

std::unique_ptr<Backend> Device::make_backend(const BackendRequest& request) {
  if (!gpu_) return make_cpu_backend(request);
#ifdef DP_WITH_CUDA
  cuda::BackendOptions bo;
  bo.tf32 = request.tf32;
  bo.deterministic = request.deterministic;
  bo.precision = request.precision;
  bo.log = request.log;  // a bf16 convolution shape that runs in fp32
  auto backend = cuda::make_cuda_backend(bo);
  cuda_->backend = backend.get();
  return backend;
#else
  return nullptr;  // unreachable: the constructor refused --device cuda
#endif
}

void Device::prepare_uploads(size_t image_floats, size_t mask_floats) {
#ifdef DP_WITH_CUDA
  if (cuda_->backend != nullptr)
    cuda_->uploader =
        std::make_unique<cuda::BatchUploader>(image_floats + mask_floats, cuda_->backend->stream());
#else
  (void)image_floats, (void)mask_floats;
#endif
}

BatchTensors Device::upload(const data::Batch& batch, size_t image_floats, size_t mask_floats) {
#ifdef DP_WITH_CUDA
  if (cuda_->uploader) {
    const auto up = cuda_->uploader->upload(batch.images, image_floats, batch.masks, mask_floats);
    return {up.images, up.masks};
  }
#else
  (void)image_floats, (void)mask_floats;
#endif
  return {batch.images, batch.masks};
}

std::string Device::memory_note() const {
#ifdef DP_WITH_CUDA
  if (cuda_->backend != nullptr)
    return str_cat("GPU memory: ", format_mib(double(cuda_->backend->peak_bytes())),
                   " allocated at start (parameters, gradients, optimizer state, activations)");
#endif
  return {};
}

std::unique_ptr<mpi::GradReducer> Device::make_reducer(Comm& comm, ParamStore& params,
                                                       const mpi::ReducerOptions& options) {
#ifdef DP_WITH_CUDA
  if (cuda_->backend != nullptr) {
    auto* mpi_comm = dynamic_cast<mpi::MpiComm*>(&comm);
    DP_CHECK(mpi_comm != nullptr, "--device cuda: the NCCL reducer needs an MPI communicator");
    // NcclComm agrees over MPI on every failure before its collective ncclCommInitRank: the
    // ranks that failed throw their error, the others NcclPeerFailed, and collectively() reports
    // the lowest failed rank's error. A failure inside that call leaves the peers in it, which
    // they cannot leave: that rank reports it and ends the job at once.
    collectively(comm, [&] {
      try {
        cuda_->nccl = std::make_unique<mpi::NcclComm>(*mpi_comm);
      } catch (const mpi::NcclPeerFailed&) {
        // Not this rank's failure: collectively() fails here too, with the failed rank's error.
      } catch (const mpi::NcclInitError& e) {
        std::fprintf(stderr,
                     "%s: error: [rank %d] %s (the other ranks cannot leave "
                     "ncclCommInitRank: ending the job)\n",
                     program_.c_str(), comm.rank(), e.what());
        std::fflush(stderr);
        mpi::Env::abort(1);
      }
    });
    return mpi::make_nccl_grad_reducer(*cuda_->nccl, params, params.grads(),
                                       cuda_->backend->stream(), options);
  }
#endif
  return mpi::make_grad_reducer(comm, params, options);
}

std::function<void()> Device::before_abort() {
#ifdef DP_WITH_CUDA
  if (cuda_->nccl) return [nccl = cuda_->nccl.get()] { nccl->abort_for_exit(); };
#endif
  return {};
}

const Words<CpuConvAlgo>& cpu_conv_words() {
  static const Words<CpuConvAlgo> words = {{"auto", CpuConvAlgo::kAuto},
                                           {"direct", CpuConvAlgo::kDirect},
                                           {"shape", CpuConvAlgo::kShape},
                                           {"winograd", CpuConvAlgo::kWinograd},
                                           {"blocked", CpuConvAlgo::kBlocked},
                                           {"gemm", CpuConvAlgo::kGemm},
                                           {"gemm-winograd", CpuConvAlgo::kGemmWinograd}};
  return words;
}

const Words<Precision>& precision_words() {
  static const Words<Precision> words = {{"fp32", Precision::kFloat32},
                                         {"bf16", Precision::kBFloat16}};
  return words;
}

const Words<DeviceChoice>& device_words() {
  static const Words<DeviceChoice> words = {
      {"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda}};
  return words;
}

}  // namespace dp::app
