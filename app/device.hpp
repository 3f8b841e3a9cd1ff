// Where an app's model runs, the CPU (oneDNN) or this rank's GPU, and what it needs there: the
// backend, the gradient reducer and batch uploads. The one place in app/ that knows about CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "dp/grad_reducer.hpp"
#include "dp/loader.hpp"
#include "dp/log.hpp"
#include "dp/params.hpp"
#include "exit_codes.hpp"
#include "words.hpp"

namespace dp::app {

// The GPU a rank uses with --device cuda: its node-local rank modulo the visible GPUs (>= 1).
// More ranks on the node than visible GPUs is a UsageError unless allow_sharing.
int gpu_for_rank(int local_rank, int local_size, int visible_gpus, bool allow_sharing);

// The OpenMP threads of a rank, and where the number came from (for the start-up line).
struct ThreadChoice {
  int threads = 1;
  std::string source;  // e.g. "--threads", "SLURM_CPUS_PER_TASK=4"
};
// What the thread count of a rank is chosen from.
struct ThreadEnvironment {
  std::string slurm_cpus_per_task, omp_num_threads;  // empty: unset
  int affinity_cpus = 1;                             // CPUs in the rank's affinity mask
  int node_cpus = 1;                                 // online CPUs of the node
  int local_ranks = 1;                               // ranks of the job on this node
  static ThreadEnvironment of_this_process(int local_ranks);
};
// --threads N (N > 0) wins; else SLURM_CPUS_PER_TASK, then OMP_NUM_THREADS (its first value), then
// the rank's affinity mask, never more than the node's CPUs over its ranks (at least 1): a rank
// that no launcher bound (MPICH's Hydra, Open MPI --bind-to none) has every CPU of the node in its
// mask, and as many threads on every rank would oversubscribe the node. A variable that is not a
// positive number is passed over.
ThreadChoice choose_threads(int requested, const ThreadEnvironment& env);

// On every rank, collectively (one all-reduce): the warning, for rank 0 to print, when the ranks of
// a node run more threads than the CPUs their affinity masks cover together (masks that overlap,
// e.g. --threads above what each rank was bound to), naming the ranks and the fix; else empty.
// Masks past CPU 1023 are not seen.
std::string oversubscription_warning(Comm& comm, int threads);

// --device: auto (a GPU where every rank sees one, else the CPU), cpu or cuda.
enum class DeviceChoice { kAuto, kCpu, kCuda };

struct DeviceRequest {
  DeviceChoice device = DeviceChoice::kAuto;
  std::string program;         // "dptrain", "dppredict": for the error lines
  bool allow_sharing = false;  // more ranks on a node than visible GPUs (--allow-gpu-sharing)
  // The NCCL reducer: two ranks of a multi-rank job may not share a GPU (a UsageError).
  bool one_gpu_per_rank = false;
};

// The selected GPU (valid when Device::gpu()).
struct GpuInfo {
  int ordinal = -1, visible_count = 0;
  bool shared = false;    // with other ranks of the node
  bool isolated = false;  // each rank of the node sees only its own GPUs (srun --gpus-per-task)
  std::string name, pci_bus_id;
};

struct BackendRequest {
  Precision precision = Precision::kFloat32;
  CpuConvAlgo cpu_conv = CpuConvAlgo::kDirect;  // the CPU's 3x3 convolution kernels
  bool tf32 = true;                             // the GPU's fp32 convolutions may use TF32
  bool deterministic = false;                   // the GPU's deterministic cuDNN algorithms only
  Logger log;                                   // the GPU backend's notes
};

// A batch's images and masks in backend memory.
struct BatchTensors {
  const float* images = nullptr;
  const float* masks = nullptr;
};

class Device {
 public:
  // On every rank, collectively: --device auto is the GPU where this build has the CUDA backend
  // and every rank sees one, else the CPU. On a GPU, selects this rank's (gpu_for_rank; the
  // selection's failure is a UsageError); where the launcher isolated the GPUs per rank (fewer
  // visible than the node's ranks, each rank's different), the rank's first. --device cuda in a
  // build without CUDA is a UsageError.
  Device(const DeviceRequest& request, Comm& comm);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  bool gpu() const { return gpu_; }
  const GpuInfo& gpu_info() const { return gpu_info_; }
  // The version of the NCCL this process loaded ("2.21.5") when it runs on a GPU, else "".
  std::string nccl_version() const;

  // The CPU backend, or the CUDA one on the selected GPU. Call once.
  std::unique_ptr<Backend> make_backend(const BackendRequest& request);
  // The CPU backend; bf16 without AVX512-BF16/AMX, or winograd where it cannot run, is a
  // UsageError naming the reason.
  static std::unique_ptr<Backend> make_cpu_backend(const BackendRequest& request);

  // Training: batches of up to `image_floats` + `mask_floats` reach the backend through
  // upload() (on the GPU a copy stream into device buffers; the host batch itself on the CPU).
  void prepare_uploads(size_t image_floats, size_t mask_floats);
  BatchTensors upload(const data::Batch& batch, size_t image_floats, size_t mask_floats);
  // "GPU memory: X allocated ..." after the set-up; empty on the CPU.
  std::string memory_note() const;

  // The gradient reducer: MPI on host gradients, or NCCL on the GPU's (its communicator is
  // created collectively; a failure inside ncclCommInitRank ends the job at once).
  std::unique_ptr<mpi::GradReducer> make_reducer(Comm& comm, ParamStore& params,
                                                 const mpi::ReducerOptions& options);
  // What the stall watchdog runs before it ends a stalled job (aborting NCCL); empty on the CPU.
  std::function<void()> before_abort();

 private:
  bool gpu_ = false;
  GpuInfo gpu_info_;
  std::string program_;
  // The GPU's NCCL communicator and batch uploader. Destroyed before the backend's memory owners
  // (model, optimiser): freeing memory waits for the device, so after a failure the NCCL
  // communicator must be aborted first (NcclComm does that while an exception unwinds).
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
};

// --cpu-conv's words (auto, direct, shape, winograd, blocked, gemm, gemm-winograd),
// --precision's (fp32, bf16) and --device's (auto, cpu, cuda), in --help's order (dptrain,
// dppredict).
const Words<CpuConvAlgo>& cpu_conv_words();
const Words<Precision>& precision_words();
const Words<DeviceChoice>& device_words();

}  // namespace dp::app
