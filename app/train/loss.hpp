// The training loss (--loss): BCE, soft Dice, soft clDice (summed as named) or focal, each the
// mean over the global batch (per pixel; Dice and clDice per image), independent of the ranks.
#pragma once

#include <cstdint>
#include <string>

#include "dp/backend.hpp"

namespace dp::app {

struct TrainOptions;

class Loss {
 public:
  static constexpr float kDiceSmooth = 1.0f;    // an image without cracks predicted empty: Dice 1
  static constexpr float kClDiceSmooth = 1.0f;  // as the published soft_dice_cldice

  Loss(const TrainOptions& options, float pos_weight);

  // The loss of `images` images of height x width pixels each, in per-pixel units: summed over
  // the images of every rank and divided by their pixels, it is the batch's mean loss (Dice and
  // clDice per image count height x width times). Writes diff_logits, the gradient of that mean
  // over `global_images` images (0: zero gradient, for validation and padding).
  double sum(Backend& backend, int images, int height, int width, const float* logits,
             const float* target, int64_t global_images, float* diff_logits) const;

  // BCE's weight of crack pixels for --pos-weight `spec` (none, dataset, sqrt or a number) on a
  // training split with `dataset_ratio` background pixels per crack pixel; 0 if `spec` is none of
  // those.
  static float crack_weight(const std::string& spec, float dataset_ratio);

  // --loss values: bce, dice, bce+dice, focal, bce+cldice, dice+cldice, bce+dice+cldice.
  static bool valid(const std::string& loss);
  static bool has_bce(const std::string& loss);
  bool has_bce() const { return bce_; }
  // The epoch (0-based) that the following sums belong to: clDice joins at --cldice-start-epoch.
  void set_epoch(int64_t epoch) { cldice_on_ = cldice_ && epoch + 1 >= cldice_start_epoch_; }

  // "BCE per pixel", "soft Dice per image", ... (chart titles).
  static std::string describe(const TrainOptions& options);

 private:
  bool bce_ = false, dice_ = false, cldice_ = false, focal_ = false;
  float pos_weight_, focal_alpha_, focal_gamma_, cldice_weight_;
  int cldice_iterations_;
  int64_t cldice_start_epoch_;
  bool cldice_on_ = false;
};

}  // namespace dp::app
