// core/train/schedules.cpp — the built-in learning-rate schedules (registry kind "schedule"): constant,
// cosine, linear, wsd, exponential, power (all with the same linear warm-up and min_lr) and one_cycle.
// Invariants: lr(step) is a pure function of the update count (step = updates done, 0-based), so a
// resumed run sees the same rates bit for bit; the warm-up is lr * (step + 1) / warmup_steps over the
// first warmup_steps updates; t in the shapes runs from 0 after the warm-up to 1 at trainer.steps.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dew/error.hpp"
#include "dew/optim.hpp"
#include "registry/builtins.hpp"

namespace dew {

namespace {

// The warm-up and min_lr the built-ins share: lr(step) = base_lr (step + 1) / warmup_steps while
// step < warmup_steps, then after_warmup(step - warmup_steps).
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
    span_ = std::max<int64_t>(total_ - warmup_, 1);
    check();
  }
  double lr(int64_t step) const override {
    if (warmup_ > 0 && step < warmup_) return base_lr_ * double(step + 1) / double(warmup_);
    return after_warmup(step - warmup_);
  }

 protected:
  // s = updates since the warm-up (>= 0); span_ = updates from the warm-up to trainer.steps (>= 1).
  virtual double after_warmup(int64_t s) const = 0;
  virtual void check() {}
  double fraction(int64_t s) const { return std::min(1.0, double(s) / double(span_)); }
  int64_t warmup_;
  double min_lr_, base_lr_ = 0;
  int64_t total_ = 0, span_ = 1;
};

class Constant final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;
  double after_warmup(int64_t) const override { return base_lr_; }
};

double cosine_between(double from, double to, double t) { return to + 0.5 * (from - to) * (1.0 + std::cos(M_PI * t)); }

class Cosine final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;
  double after_warmup(int64_t s) const override { return cosine_between(base_lr_, min_lr_, fraction(s)); }
};

class Linear final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;
  double after_warmup(int64_t s) const override { return base_lr_ + (min_lr_ - base_lr_) * fraction(s); }
};

// Warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024): optim.lr until the last decay_steps
// updates, then down to min_lr in the decay shape: linear, cosine, or sqrt (1 - sqrt(t), the cooldown
// Hägele et al. found best). decay_steps = 0 means round(decay_fraction * trainer.steps).
class Wsd final : public WarmupSchedule {
 public:
  explicit Wsd(const Options& o)
      : WarmupSchedule(o),
        decay_steps_(o.get_int("decay_steps", 0)),
        decay_fraction_(o.get_double("decay_fraction", 0.2)),
        shape_(o.get_string("decay", "sqrt")) {
    DEW_USAGE_CHECK(shape_ == "linear" || shape_ == "cosine" || shape_ == "sqrt", "option 'schedule.decay = ", shape_,
                    "' is not a decay shape; known: linear, cosine, sqrt");
    DEW_USAGE_CHECK(decay_steps_ >= 0, "option 'schedule.decay_steps' must be >= 0");
    DEW_USAGE_CHECK(decay_fraction_ > 0 && decay_fraction_ <= 1, "option 'schedule.decay_fraction' must be in (0, 1]");
  }
  void check() override {
    if (decay_steps_ == 0) decay_steps_ = std::max<int64_t>(1, std::llround(decay_fraction_ * double(total_)));
    DEW_USAGE_CHECK(decay_steps_ <= total_ - warmup_, "schedule wsd: decay_steps (", decay_steps_, ") + warmup_steps (",
                    warmup_, ") exceed trainer.steps (", total_, ")");
  }
  double after_warmup(int64_t s) const override {
    const int64_t into = s - (span_ - decay_steps_);  // updates into the decay
    if (into < 0) return base_lr_;
    const double t = std::min(1.0, double(into) / double(decay_steps_));
    if (shape_ == "linear") return base_lr_ + (min_lr_ - base_lr_) * t;
    if (shape_ == "cosine") return cosine_between(base_lr_, min_lr_, t);
    return min_lr_ + (base_lr_ - min_lr_) * (1.0 - std::sqrt(t));
  }

 private:
  int64_t decay_steps_;
  double decay_fraction_;
  std::string shape_;
};

// Exponential decay (optax.exponential_decay): lr = max(min_lr, optim.lr * decay_rate ^ (s / transition_steps)),
// the exponent floored when staircase; transition_steps = 0 means the updates after the warm-up.
class Exponential final : public WarmupSchedule {
 public:
  explicit Exponential(const Options& o)
      : WarmupSchedule(o),
        rate_(o.get_double("decay_rate", 0.1)),
        transition_(o.get_int("transition_steps", 0)),
        staircase_(o.get_bool("staircase", false)) {
    DEW_USAGE_CHECK(rate_ > 0 && rate_ <= 1, "option 'schedule.decay_rate' must be in (0, 1]");
    DEW_USAGE_CHECK(transition_ >= 0, "option 'schedule.transition_steps' must be >= 0");
  }
  void check() override {
    if (transition_ == 0) transition_ = span_;
  }
  double after_warmup(int64_t s) const override {
    double e = double(s) / double(transition_);
    if (staircase_) e = std::floor(e);
    return std::max(min_lr_, base_lr_ * std::pow(rate_, e));
  }

 private:
  double rate_;
  int64_t transition_;
  bool staircase_;
};

// Polynomial decay (optax.polynomial_schedule, PyTorch PolynomialLR): (optim.lr - min_lr) (1 - t)^power + min_lr,
// t the fraction of the updates after the warm-up.
class Power final : public WarmupSchedule {
 public:
  explicit Power(const Options& o) : WarmupSchedule(o), power_(o.get_double("power", 1.0)) {
    DEW_USAGE_CHECK(power_ > 0, "option 'schedule.power' must be positive");
  }
  double after_warmup(int64_t s) const override {
    return (base_lr_ - min_lr_) * std::pow(1.0 - fraction(s), power_) + min_lr_;
  }

 private:
  double power_;
};

// One cycle (optax.cosine_onecycle_schedule; Smith & Topin 2019): from optim.lr / div_factor up to optim.lr
// at update round_down(pct_start * trainer.steps), then down to optim.lr / (div_factor * final_div_factor)
// at trainer.steps, each half a cosine. Its first phase is the warm-up: it takes no warmup_steps or min_lr.
class OneCycle final : public Schedule {
 public:
  explicit OneCycle(const Options& o)
      : pct_(o.get_double("pct_start", 0.3)),
        div_(o.get_double("div_factor", 25.0)),
        final_div_(o.get_double("final_div_factor", 1e4)) {
    DEW_USAGE_CHECK(pct_ > 0 && pct_ < 1, "option 'schedule.pct_start' must be in (0, 1)");
    DEW_USAGE_CHECK(div_ >= 1, "option 'schedule.div_factor' must be >= 1");
    DEW_USAGE_CHECK(final_div_ >= 1, "option 'schedule.final_div_factor' must be >= 1");
    DEW_USAGE_CHECK(o.get_int("warmup_steps", 0) == 0 && o.get_double("min_lr", 0.0) == 0.0,
                    "schedule one_cycle rises over pct_start of the run and ends at optim.lr / (div_factor * "
                    "final_div_factor): it takes no warmup_steps or min_lr (leave them 0)");
  }
  void init(double base_lr, int64_t total_steps) override {
    peak_ = base_lr;
    total_ = total_steps;
    up_ = int64_t(pct_ * double(total_steps));
  }
  double lr(int64_t step) const override {
    const double start = peak_ / div_, end = start / final_div_;
    if (step < up_) return cosine_between(start, peak_, double(step) / double(up_));
    const double t = std::min(1.0, double(step - up_) / double(std::max<int64_t>(total_ - up_, 1)));
    return cosine_between(peak_, end, t);
  }

 private:
  double pct_, div_, final_div_, peak_ = 0;
  int64_t total_ = 0, up_ = 0;
};

const std::vector<OptionSpec> kWarmupOptions = {
    {"warmup_steps", "0", "linear warm-up: lr * (step + 1) / warmup_steps for the first updates"},
    {"min_lr", "0", "the final learning rate (absolute, in [0, optim.lr])"}};

std::vector<OptionSpec> with_warmup(std::vector<OptionSpec> own) {
  std::vector<OptionSpec> all = kWarmupOptions;
  all.insert(all.end(), own.begin(), own.end());
  return all;
}

template <class S>
void add_schedule(Registrar& registrar, const char* name, const char* description, std::vector<OptionSpec> options) {
  registrar.add<Schedule>({.name = name,
                           .description = description,
                           .factory = [](const Options& o) { return std::make_shared<S>(o); },
                           .options = std::move(options)});
}

}  // namespace

void register_schedules(Registrar& registrar) {
  add_schedule<Constant>(registrar, "constant", "optim.lr after the warm-up", kWarmupOptions);
  add_schedule<Cosine>(registrar, "cosine", "half a cosine from optim.lr down to min_lr at trainer.steps",
                       kWarmupOptions);
  add_schedule<Linear>(registrar, "linear", "a straight line from optim.lr down to min_lr at trainer.steps",
                       kWarmupOptions);
  add_schedule<Wsd>(
      registrar, "wsd", "warmup-stable-decay: optim.lr, then a short decay to min_lr at the end",
      with_warmup({{"decay_steps", "0", "updates of the decay at the end (0: decay_fraction of trainer.steps)"},
                   {"decay_fraction", "0.2", "the decay's share of trainer.steps when decay_steps = 0"},
                   {"decay", "sqrt", "the decay's shape: sqrt (1 - sqrt(t)), linear or cosine"}}));
  add_schedule<Exponential>(
      registrar, "exponential", "optim.lr * decay_rate ^ (updates / transition_steps), floored at min_lr",
      with_warmup({{"decay_rate", "0.1", "the factor per transition_steps updates, in (0, 1]"},
                   {"transition_steps", "0", "updates per factor decay_rate (0: the updates after the warm-up)"},
                   {"staircase", "false", "decay in whole steps of transition_steps"}}));
  add_schedule<Power>(registrar, "power", "polynomial decay (optim.lr - min_lr) (1 - t)^power + min_lr",
                      with_warmup({{"power", "1", "the exponent (1: linear)"}}));
  add_schedule<OneCycle>(registrar, "one_cycle",
                         "one cycle: a cosine up from optim.lr / div_factor to optim.lr, then down to "
                         "optim.lr / (div_factor * final_div_factor)",
                         {{"pct_start", "0.3", "the rising share of trainer.steps"},
                          {"div_factor", "25", "the start is optim.lr / div_factor"},
                          {"final_div_factor", "1e4", "the end is the start / final_div_factor"}});
}

}  // namespace dew
