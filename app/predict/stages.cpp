// dppredict's per-image stages, from the network's probabilities to the sinks.
#include "predict/stages.hpp"

namespace dp::app {

ImageStages::ImageStages(const PredictOptions& options, float threshold,
                         const std::vector<Input>& inputs,
                         const std::vector<std::unique_ptr<Sink>>& sinks)
    : options_(options),
      threshold_(threshold),
      inputs_(inputs),
      sinks_(sinks),
      evaluation_(options.tolerance),
      measurer_(options.min_crack_px) {}

void ImageStages::predicted(size_t id, const data::Image& predicted, const data::Image& native,
                            std::vector<float>& prob, const std::vector<float>& uncertainty,
                            const std::vector<uint8_t>& truth) {
  // Back at the photograph's size.
  const data::Image& photo = native.pixels.empty() ? predicted : native;
  const int w = photo.width, h = photo.height;
  std::vector<float> resized_uncertainty;
  const std::vector<float>* uncertainty_of_photo = &uncertainty;
  if (&photo != &predicted) {
    prob = data::resize_bilinear(prob, predicted.width, predicted.height, w, h);
    if (!uncertainty.empty()) {
      resized_uncertainty =
          data::resize_bilinear(uncertainty, predicted.width, predicted.height, w, h);
      uncertainty_of_photo = &resized_uncertainty;
    }
  }
  // The mask's scores, files and measurements are of its cracks; ODS, OIS and AP are of the
  // probabilities.
  std::vector<uint8_t> mask(prob.size());
  for (size_t i = 0; i < prob.size(); ++i) mask[i] = prob[i] > threshold_ ? 1 : 0;
  data::erase_specks(mask.data(), h, w, options_.min_crack_px);
  PredictedImage p;
  p.id = id;
  p.photo = &photo;
  p.probability = &prob;
  p.uncertainty = uncertainty_of_photo;
  p.mask = &mask;
  p.height = h;
  p.width = w;
  if (!truth.empty()) {
    p.truth = &truth;
    evaluation_.add(prob.data(), mask.data(), truth.data(), h, w);
  }
  to_sinks(p, options_.measure);
}

void ImageStages::measured(size_t id, const data::Image& mask) {
  PredictedImage p;
  p.id = id;
  p.mask = &mask.pixels;
  p.height = mask.height;
  p.width = mask.width;
  to_sinks(p, true);
}

void ImageStages::to_sinks(PredictedImage& p, bool measure) {
  p.input = &inputs_[p.id];
  if (measure) {
    p.cracks = &measurer_.measure(p.mask->data(), p.height, p.width);
    p.skeleton = &measurer_.skeleton();
  }
  for (const auto& sink : sinks_) sink->add(p);
}

SegmentationMetrics ImageStages::scores(Comm& comm) {
  evaluation_.reduce(comm);
  return evaluation_.result();
}

}  // namespace dp::app
