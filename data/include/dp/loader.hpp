// Loader: reads this rank's samples of one split in a background thread into pre-allocated batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp::data {

// One batch in the layout the model consumes: NHWC float32.
struct Batch {
  int n = 0;  // samples in this batch (the last one may be smaller)
  int height = 0, width = 0;
  const float* images = nullptr;     // [n,H,W,3], normalised: (x/255 - mean[c]) / std[c]
  const float* masks = nullptr;      // [n,H,W,1], 0 or 1
  const int64_t* indices = nullptr;  // dataset index of each sample
};

struct LoaderOptions {
  int batch_size = 4;
  int prefetch = 2;      // batches prepared ahead of the consumer
  bool augment = false;  // random flips, a function of (seed, epoch, sample index) only
  uint64_t seed = 0;
  float mean[3] = {0.485f, 0.456f, 0.406f};  // ImageNet statistics, as the reference
  float std[3] = {0.229f, 0.224f, 0.225f};
};

// All buffers are allocated in the constructor (prefetch + 1 batches of batch_size) and reused.
// Usage per epoch: start(indices, epoch); while (const Batch* b = next()) {...}
// next() returns nullptr at the end of the epoch; a batch stays valid until the next call.
// Errors in the reader thread are rethrown from next() as dp::Error.
class Loader {
 public:
  Loader(const std::string& path, const std::string& split, LoaderOptions options);
  ~Loader();  // stops and joins the reader thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t dataset_size() const;
  int height() const;
  int width() const;
  float pos_weight() const;
  void start(std::vector<int64_t> indices, int64_t epoch);
  const Batch* next();
  void stop();  // abandons the rest of the epoch (joins the thread)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dp::data
