// dppredict's per-image stages: an image's probabilities back at its size -> its mask (threshold,
// specks cleared) -> its cracks (--measure) and scores (a true mask) -> every sink.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dp/comm.hpp"
#include "dp/crack_measure.hpp"
#include "dp/image_io.hpp"
#include "eval/evaluation.hpp"
#include "predict/inputs.hpp"
#include "predict/options.hpp"
#include "predict/outputs.hpp"

namespace dp::app {

class ImageStages {
 public:
  // `inputs` and `sinks` are the run's and outlive the stages.
  ImageStages(const PredictOptions& options, float threshold, const std::vector<Input>& inputs,
              const std::vector<std::unique_ptr<Sink>>& sinks);

  // Input `id` out of the network: `probability` (and `uncertainty`, empty without
  // --save-uncertainty) of `predicted`, the image the network saw; `native` is the photograph
  // where it was resized for the network (else empty), `truth` its true mask (else empty).
  void predicted(size_t id, const data::Image& predicted, const data::Image& native,
                 std::vector<float>& probability, const std::vector<float>& uncertainty,
                 const std::vector<uint8_t>& truth);
  // --measure-only: input `id` is a mask as read (0/1); its cracks are measured.
  void measured(size_t id, const data::Image& mask);

  // The scores over every rank's images (collective; once, after the last image).
  SegmentationMetrics scores(Comm& comm);

 private:
  void to_sinks(PredictedImage& image, bool measure);

  const PredictOptions& options_;
  const float threshold_;
  const std::vector<Input>& inputs_;
  const std::vector<std::unique_ptr<Sink>>& sinks_;
  MaskEvaluation evaluation_;
  data::CrackMeasurer measurer_;
};

}  // namespace dp::app
