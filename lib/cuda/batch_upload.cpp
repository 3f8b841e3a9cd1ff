// BatchUploader: pinned double buffering of training batches on a dedicated copy stream.
#include "dp/cuda/batch_upload.hpp"

#include <cstring>

#include "dp/error.hpp"

namespace dp::cuda {

BatchUploader::BatchUploader(size_t max_floats, cudaStream_t compute)
    : max_floats_(max_floats), compute_(compute) {
  for (Slot& s : slots_) {
    DP_CUDA_CHECK(cudaMallocHost(&s.pinned, max_floats * sizeof(float)));
    s.device = DeviceBuffer<float>(max_floats);
  }
}

BatchUploader::~BatchUploader() {
  // The streams may still read the slots: wait for them before the memory goes.
  cudaStreamSynchronize(copy_.get());
  cudaStreamSynchronize(compute_);
  for (Slot& s : slots_) cudaFreeHost(s.pinned);
}

BatchUploader::Uploaded BatchUploader::upload(const float* images, size_t image_floats,
                                              const float* masks, size_t mask_floats) {
  DP_CHECK(image_floats + mask_floats <= max_floats_, "BatchUploader: a batch of ",
           image_floats + mask_floats, " floats, room for ", max_floats_);
  // Everything the compute stream holds now belongs to the previous batch's step.
  if (pending_) slots_[1 - next_].consumed.record(compute_);
  Slot& s = slots_[next_];
  if (s.used) {
    s.uploaded.synchronize();         // the pinned buffer's last upload is done
    s.consumed.wait_on(copy_.get());  // and the device buffer's last reader
  }
  std::memcpy(s.pinned, images, image_floats * sizeof(float));
  std::memcpy(s.pinned + image_floats, masks, mask_floats * sizeof(float));
  DP_CUDA_CHECK(cudaMemcpyAsync(s.device.data(), s.pinned,
                                (image_floats + mask_floats) * sizeof(float),
                                cudaMemcpyHostToDevice, copy_.get()));
  s.uploaded.record(copy_.get());
  s.uploaded.wait_on(compute_);
  s.used = true;
  pending_ = true;
  next_ = 1 - next_;
  return {s.device.data(), s.device.data() + image_floats};
}

}  // namespace dp::cuda
