// core/train/loss_scale.hpp — dynamic loss scaling for f16-mixed training (PyTorch GradScaler / flax
// DynamicScale semantics; docs/precision.md). Internal to libdew.
//
// The trainer multiplies the loss by scale() before the backward pass, so small f16 gradients do not
// flush to zero, and divides the gradients by it again (folded into the optimizer's gradient factor and
// the global norm). After each attempt, update(finite): a finite attempt counts towards the growth
// interval, and `interval` finite attempts in a row multiply the scale by `growth`; an attempt whose
// gradients are not finite (an f16 overflow) is rejected by the trainer, and the scale is multiplied by
// `backoff` and the count restarts. The state (scale, good-attempt count, overflows) is in the checkpoint,
// so a resumed run scales exactly as the uninterrupted one.
// Invariants: scale is a power of two times the initial value (growth and backoff are exact in double
// when they are powers of two, as the defaults are); update() is the only mutator besides restore().
#pragma once
#include <cstdint>

#include "dew/options.hpp"

namespace dew::training {

struct LossScaleOptions {
  double init = 65536.0;   // [run] loss_scale_init (GradScaler's 2^16)
  double growth = 2.0;     // [run] loss_scale_growth
  double backoff = 0.5;    // [run] loss_scale_backoff
  int64_t interval = 2000; // [run] loss_scale_growth_interval: finite attempts in a row before growing
  static LossScaleOptions read(Options& run_section);  // throws UsageError on values out of range
};

class DynamicLossScale {
 public:
  DynamicLossScale() = default;
  explicit DynamicLossScale(const LossScaleOptions& o) : o_(o), scale_(o.init) {}
  double scale() const { return scale_; }
  int64_t good_steps() const { return good_; }
  int64_t overflows() const { return overflows_; }
  // After an attempt: finite gradients grow the count (and the scale every `interval`), non-finite ones
  // back the scale off, count an overflow and restart the count. Returns false when the scale has fallen
  // below the smallest normal f32 (every gradient overflows: the loss itself is not finite or huge).
  bool update(bool finite);
  void restore(double scale, int64_t good, int64_t overflows);

 private:
  LossScaleOptions o_;
  double scale_ = 1.0;
  int64_t good_ = 0, overflows_ = 0;
};

}  // namespace dew::training
