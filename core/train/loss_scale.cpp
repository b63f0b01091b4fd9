// core/train/loss_scale.cpp — dynamic loss scaling (core/train/loss_scale.hpp).
#include "train/loss_scale.hpp"

#include <cmath>
#include <limits>

#include "dew/error.hpp"

namespace dew::training {

LossScaleOptions LossScaleOptions::read(Options& rs) {
  LossScaleOptions o;
  o.init = rs.get_double("loss_scale_init", o.init);
  o.growth = rs.get_double("loss_scale_growth", o.growth);
  o.backoff = rs.get_double("loss_scale_backoff", o.backoff);
  o.interval = rs.get_int("loss_scale_growth_interval", o.interval);
  DEW_USAGE_CHECK(std::isfinite(o.init) && o.init > 0, "option 'run.loss_scale_init' must be a positive number, got ",
                  o.init);
  DEW_USAGE_CHECK(std::isfinite(o.growth) && o.growth >= 1, "option 'run.loss_scale_growth' must be >= 1, got ",
                  o.growth);
  DEW_USAGE_CHECK(o.backoff > 0 && o.backoff < 1, "option 'run.loss_scale_backoff' must be in (0, 1), got ", o.backoff);
  DEW_USAGE_CHECK(o.interval >= 1, "option 'run.loss_scale_growth_interval' must be >= 1, got ", o.interval);
  return o;
}

bool DynamicLossScale::update(bool finite) {
  if (finite) {
    if (++good_ >= o_.interval) {
      scale_ = std::min(scale_ * o_.growth, double(std::numeric_limits<float>::max()) / 2);
      good_ = 0;
    }
    return true;
  }
  ++overflows_;
  good_ = 0;
  scale_ *= o_.backoff;
  return scale_ >= double(std::numeric_limits<float>::min());
}

void DynamicLossScale::restore(double scale, int64_t good, int64_t overflows) {
  DEW_CHECK(std::isfinite(scale) && scale > 0 && good >= 0 && good < o_.interval && overflows >= 0,
            "checkpoint: loss scale state (scale ", scale, ", good steps ", good, ", overflows ", overflows,
            ") is out of range for growth interval ", o_.interval);
  scale_ = scale;
  good_ = good;
  overflows_ = overflows;
}

}  // namespace dew::training
