// The training loss (--loss): BCE, soft Dice, BCE + Dice or focal, each the mean over the global
// batch (per pixel; Dice per image), so the result does not depend on the number of ranks.
#pragma once

#include <cstdint>
#include <string>

#include "dp/backend.hpp"

namespace dp::app {

struct TrainOptions;

class Loss {
 public:
  static constexpr float kDiceSmooth = 1.0f;  // an image without cracks predicted empty: Dice 1

  Loss(const TrainOptions& options, float pos_weight);

  // The loss of `images` images of `pixels` pixels each, in per-pixel units: summed over the
  // images of every rank and divided by their pixels, it is the batch's mean loss (Dice per
  // image counts `pixels` times). Writes diff_logits, the gradient of that mean over
  // `global_images` images (0: zero gradient, for validation and padding).
  double sum(Backend& backend, int images, int64_t pixels, const float* logits, const float* target,
             int64_t global_images, float* diff_logits) const;

  // BCE's weight of crack pixels for --pos-weight `spec` (none, dataset, sqrt or a number) on a
  // training split with `dataset_ratio` background pixels per crack pixel; 0 if `spec` is none of
  // those.
  static float crack_weight(const std::string& spec, float dataset_ratio);

  bool has_bce() const { return kind_ == Kind::kBce || kind_ == Kind::kBceDice; }

  // "BCE per pixel", "soft Dice per image", ... (chart titles).
  static std::string describe(const TrainOptions& options);

 private:
  enum class Kind { kBce, kDice, kBceDice, kFocal };
  Kind kind_;
  float pos_weight_, focal_alpha_, focal_gamma_;
};

}  // namespace dp::app
