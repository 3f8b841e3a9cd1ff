// The GradReducer for device gradients: each released bucket's ncclAllReduce runs on a dedicated
// stream after an event recorded on the compute stream (built only with DP_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "dp/grad_reducer.hpp"
#include "dp/nccl_comm.hpp"

namespace dp::mpi {

// `device_grads` is the gradient arena in device memory, laid out like `params`
// (ParamView::offset); backward runs on `compute_stream` and calls grad_ready() after enqueueing
// the kernels that produce that gradient. Buckets (the same plan as the MPI reducer; piece_elements
// is ignored, NCCL needs no temporary) are all-reduced in place on the reducer's own stream,
// released buckets of one call in one NCCL group. wait() blocks the host until every bucket is
// done, checking ncclCommGetAsyncError while it waits (a failed peer or network becomes a dp::Error
// instead of a hang), then orders the compute stream after the reductions.
// `nccl`, `params` and the device arena must outlive the reducer.
std::unique_ptr<GradReducer> make_nccl_grad_reducer(NcclComm& nccl, const ParamStore& params,
                                                    float* device_grads,
                                                    cudaStream_t compute_stream,
                                                    const ReducerOptions& options);

}  // namespace dp::mpi
