// core/train/schedules.cpp — the built-in learning-rate schedules (registry kind "schedule").
// Invariants: lr(step) is a pure function of the update count (step = updates done, 0-based), so a
// resumed run sees the same rates bit for bit; every built-in starts with the same linear warm-up
// lr * (step + 1) / warmup_steps over its first warmup_steps updates and reads min_lr (absolute).
#include <algorithm>
#include <cmath>

#include "dew/error.hpp"
#include "dew/optim.hpp"
#include "registry/builtins.hpp"

namespace dew {

namespace {

// The warm-up and min_lr every built-in shares; after the warm-up, shape(t) with t in [0, 1] the
// fraction of the remaining updates done.
class WarmupSchedule : public Schedule {
 public:
  explicit WarmupSchedule(const Options& o)
      : warmup_(o.get_int("warmup_steps", 0)), min_lr_(o.get_double("min_lr", 0.0)) {
    DEW_USAGE_CHECK(warmup_ >= 0, "option 'schedule.warmup_steps' must be >= 0");
  }
  void init(double base_lr, int64_t total_steps) override {
    DEW_USAGE_CHECK(min_lr_ >= 0 && min_lr_ <= base_lr, "option 'schedule.min_lr' must be in [0, optim.lr]");
    base_lr_ = base_lr;
    total_ = total_steps;
  }
  double lr(int64_t step) const override {
    if (warmup_ > 0 && step < warmup_) return base_lr_ * double(step + 1) / double(warmup_);
    const double span = double(std::max<int64_t>(total_ - warmup_, 1));
    return after_warmup(std::min(1.0, double(step - warmup_) / span));
  }

 protected:
  virtual double after_warmup(double t) const = 0;
  int64_t warmup_;
  double min_lr_, base_lr_ = 0;
  int64_t total_ = 0;
};

class Constant final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;
  double after_warmup(double) const override { return base_lr_; }
};

class Cosine final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;
  double after_warmup(double t) const override {
    return min_lr_ + 0.5 * (base_lr_ - min_lr_) * (1.0 + std::cos(M_PI * t));
  }
};

class Linear final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;
  double after_warmup(double t) const override { return base_lr_ + (min_lr_ - base_lr_) * t; }
};

const std::vector<OptionSpec> kWarmupOptions = {
    {"warmup_steps", "0", "linear warm-up: lr * (step + 1) / warmup_steps for the first updates"},
    {"min_lr", "0", "the final learning rate (absolute, in [0, optim.lr])"}};

template <class S>
void add_schedule(Registrar& registrar, const char* name, const char* description) {
  registrar.add<Schedule>({.name = name,
                           .description = description,
                           .factory = [](const Options& o) { return std::make_shared<S>(o); },
                           .options = kWarmupOptions});
}

}  // namespace

void register_schedules(Registrar& registrar) {
  add_schedule<Constant>(registrar, "constant", "optim.lr after the warm-up");
  add_schedule<Cosine>(registrar, "cosine", "half a cosine from optim.lr down to min_lr at trainer.steps");
  add_schedule<Linear>(registrar, "linear", "a straight line from optim.lr down to min_lr at trainer.steps");
}

}  // namespace dew
