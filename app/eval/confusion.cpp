// Confusion counts and their scores.
#include "eval/confusion.hpp"

namespace dp::app {
namespace {

double ratio(double num, double den) {
  return den > 0 ? num / den : 0.0;
}

}  // namespace

void Confusion::add(const uint8_t* predicted, const uint8_t* truth, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i) {
    const bool p = predicted[i] != 0, g = truth[i] != 0;
    tp += p && g;
    fp += p && !g;
    fn += !p && g;
  }
}

double Confusion::iou() const {
  return ratio(double(tp), double(tp + fp + fn));
}
double Confusion::dice() const {
  return ratio(2.0 * double(tp), double(2 * tp + fp + fn));
}
double Confusion::precision() const {
  return ratio(double(tp), double(tp + fp));
}
double Confusion::recall() const {
  return ratio(double(tp), double(tp + fn));
}

}  // namespace dp::app
