// The training loss: --loss chooses the backend's BCE, Dice and focal terms and their scales.
#include "train/loss.hpp"

#include <cmath>
#include <cstdlib>

#include "dp/error.hpp"
#include "train/options.hpp"

namespace dp::app {

Loss::Loss(const TrainOptions& o, float pos_weight)
    : pos_weight_(pos_weight),
      focal_alpha_(float(o.focal_alpha)),
      focal_gamma_(float(o.focal_gamma)) {
  if (o.loss == "bce")
    kind_ = Kind::kBce;
  else if (o.loss == "dice")
    kind_ = Kind::kDice;
  else if (o.loss == "bce+dice")
    kind_ = Kind::kBceDice;
  else if (o.loss == "focal")
    kind_ = Kind::kFocal;
  else
    fail("--loss: unknown loss '", o.loss, "'");
}

float Loss::crack_weight(const std::string& spec, float dataset_ratio) {
  if (spec == "none") return 1.0f;
  if (spec == "dataset") return dataset_ratio;
  if (spec == "sqrt") return std::sqrt(dataset_ratio);
  char* end = nullptr;
  const double v = spec.empty() ? 0.0 : std::strtod(spec.c_str(), &end);
  return end && *end == '\0' && std::isfinite(v) && v > 0 ? float(v) : 0.0f;
}

std::string Loss::describe(const TrainOptions& o) {
  if (o.loss == "dice") return "soft Dice per image";
  if (o.loss == "bce+dice") return "BCE per pixel + soft Dice per image";
  if (o.loss == "focal")
    return str_cat("focal per pixel, alpha ", o.focal_alpha, ", gamma ", o.focal_gamma);
  return "BCE per pixel";
}

double Loss::sum(Backend& backend, int images, int64_t pixels, const float* logits,
                 const float* target, int64_t global_images, float* diff_logits) const {
  const int64_t count = int64_t(images) * pixels;
  if (count == 0) return 0.0;
  // Gradients of the mean per pixel and of the mean per image over the global batch.
  const float per_pixel = global_images > 0 ? 1.0f / float(global_images * pixels) : 0.0f;
  const float per_image = global_images > 0 ? 1.0f / float(global_images) : 0.0f;
  switch (kind_) {
    case Kind::kBce:
      return backend.bce_with_logits(count, logits, target, pos_weight_, per_pixel, diff_logits);
    case Kind::kFocal:
      return backend.focal_with_logits(count, logits, target, focal_alpha_, focal_gamma_, per_pixel,
                                       diff_logits);
    case Kind::kDice:
      return double(pixels) * backend.dice_with_logits(images, pixels, logits, target, kDiceSmooth,
                                                       per_image, diff_logits, false);
    case Kind::kBceDice: {
      const double bce =
          backend.bce_with_logits(count, logits, target, pos_weight_, per_pixel, diff_logits);
      return bce + double(pixels) * backend.dice_with_logits(images, pixels, logits, target,
                                                             kDiceSmooth, per_image, diff_logits,
                                                             true);
    }
  }
  return 0.0;
}

}  // namespace dp::app
