// The training loss: --loss chooses the backend's BCE, Dice, clDice and focal terms and scales.
#include "train/loss.hpp"

#include <cmath>
#include <cstdlib>

#include "dp/error.hpp"
#include "train/options.hpp"

namespace dp::app {

namespace {

// Whether '+'-joined `loss` names `term`.
bool names(const std::string& loss, const std::string& term) {
  return ("+" + loss + "+").find("+" + term + "+") != std::string::npos;
}

}  // namespace

bool Loss::valid(const std::string& l) {
  return l == "bce" || l == "dice" || l == "bce+dice" || l == "focal" || l == "bce+cldice" ||
         l == "dice+cldice" || l == "bce+dice+cldice";
}

bool Loss::has_bce(const std::string& l) {
  return names(l, "bce");
}

Loss::Loss(const TrainOptions& o, float pos_weight)
    : pos_weight_(pos_weight),
      focal_alpha_(float(o.focal_alpha)),
      focal_gamma_(float(o.focal_gamma)),
      cldice_weight_(float(o.cldice_weight)),
      cldice_iterations_(int(o.cldice_iterations)),
      cldice_start_epoch_(o.cldice_start_epoch) {
  if (!valid(o.loss)) fail("--loss: unknown loss '", o.loss, "'");
  focal_ = o.loss == "focal";
  bce_ = names(o.loss, "bce");
  dice_ = names(o.loss, "dice");
  cldice_ = names(o.loss, "cldice");
  set_epoch(0);
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
  if (o.loss == "focal")
    return str_cat("focal per pixel, alpha ", o.focal_alpha, ", gamma ", o.focal_gamma);
  std::string terms;
  auto add = [&](const std::string& term) { terms += (terms.empty() ? "" : " + ") + term; };
  if (names(o.loss, "bce")) add("BCE per pixel");
  if (names(o.loss, "dice")) add("soft Dice per image");
  if (names(o.loss, "cldice"))
    add(str_cat(o.cldice_weight == 1.0 ? "" : str_cat(o.cldice_weight, " x "),
                "soft clDice per image (", o.cldice_iterations, " iterations",
                o.cldice_start_epoch > 1 ? str_cat(", from epoch ", o.cldice_start_epoch) : "",
                ")"));
  return terms;
}

double Loss::sum(Backend& backend, int images, int height, int width, const float* logits,
                 const float* target, int64_t global_images, float* diff_logits) const {
  const int64_t pixels = int64_t(height) * width, count = int64_t(images) * pixels;
  if (count == 0) return 0.0;
  // Gradients of the mean per pixel and of the mean per image over the global batch.
  const float per_pixel = global_images > 0 ? 1.0f / float(global_images * pixels) : 0.0f;
  const float per_image = global_images > 0 ? 1.0f / float(global_images) : 0.0f;
  if (focal_)
    return backend.focal_with_logits(count, logits, target, focal_alpha_, focal_gamma_, per_pixel,
                                     diff_logits);
  // Each term writes the gradient (the first) or adds to it (the others).
  double total = 0.0;
  bool written = false;
  if (bce_) {
    total += backend.bce_with_logits(count, logits, target, pos_weight_, per_pixel, diff_logits);
    written = true;
  }
  if (dice_) {
    total += double(pixels) * backend.dice_with_logits(images, pixels, logits, target, kDiceSmooth,
                                                       per_image, diff_logits, written);
    written = true;
  }
  if (cldice_on_)
    total += double(pixels) * cldice_weight_ *
             backend.soft_cldice_with_logits(images, height, width, logits, target,
                                             cldice_iterations_, kClDiceSmooth,
                                             per_image * cldice_weight_, diff_logits, written);
  return total;
}

}  // namespace dp::app
