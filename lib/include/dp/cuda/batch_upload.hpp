// dp::cuda::BatchUploader: training batches to the GPU from pinned buffers on a copy stream,
// overlapping the tail of the previous step.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include "dp/cuda/device.hpp"

namespace dp::cuda {

// Two slots, each a pinned host buffer and a device buffer for a batch's images and masks. A
// batch goes to the next slot: the host copies it into pinned memory, the copy stream uploads it
// and the compute stream is made to wait for the upload; the call returns at once, so the upload
// runs while the compute stream still works on the previous step. A slot is reused two batches
// later, once the compute stream has finished the step that read it.
class BatchUploader {
 public:
  // Room for `max_floats` floats per batch (images and masks together); `compute` must outlive
  // the uploader. On the current device.
  BatchUploader(size_t max_floats, cudaStream_t compute);
  ~BatchUploader();
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  struct Uploaded {
    const float* images = nullptr;  // device memory, valid until the batch after the next one
    const float* masks = nullptr;
  };
  Uploaded upload(const float* images, size_t image_floats, const float* masks, size_t mask_floats);

 private:
  struct Slot {
    float* pinned = nullptr;
    DeviceBuffer<float> device;
    Event uploaded;  // on the copy stream, after the slot's upload
    Event consumed;  // on the compute stream, after the step that read the slot
    bool used = false;
  };
  size_t max_floats_;
  cudaStream_t compute_;
  Stream copy_;
  std::array<Slot, 2> slots_;
  size_t next_ = 0;
  bool pending_ = false;  // the previous batch's slot still needs its `consumed` record
};

}  // namespace dp::cuda
