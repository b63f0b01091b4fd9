// tests/train/test_schedules.cpp — every built-in schedule of core/train/schedules.cpp against its closed
// form, written out here independently: the warm-up, wsd in its three decay shapes, exponential (smooth
// and staircase), power, one_cycle; and the refusals of inconsistent options.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "dew/error.hpp"
#include "dew/optim.hpp"

namespace {

std::function<double(int64_t)> schedule(std::map<std::string, std::string> kv, double lr, int64_t total) {
  dew::Options o(std::move(kv), "schedule");
  auto f = dew::make_schedule(o, lr, total);
  o.check_all_used();  // every key given was read
  return f;
}

// Every step 0..total of f equals want(step) to 1e-12 relative.
void check_all(const std::function<double(int64_t)>& f, const std::function<double(int64_t)>& want, int64_t total) {
  for (int64_t s = 0; s <= total; ++s) {
    CAPTURE(s);
    CHECK(f(s) == doctest::Approx(want(s)).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("wsd: warm-up, optim.lr, then the decay shape down to min_lr over the last decay_steps") {
  const double lr = 0.01, lo = 0.001;
  const int64_t total = 100, warm = 10, decay = 20;  // decay from update 80 to 100
  auto linear_decay = [&](int64_t s) {
    if (s < warm) return lr * double(s + 1) / warm;
    if (s < total - decay) return lr;
    return lr + (lo - lr) * std::min(1.0, double(s - (total - decay)) / decay);
  };
  check_all(
      schedule(
          {{"name", "wsd"}, {"warmup_steps", "10"}, {"min_lr", "0.001"}, {"decay_steps", "20"}, {"decay", "linear"}},
          lr, total),
      linear_decay, total);
  check_all(
      schedule({{"name", "wsd"},
                {"warmup_steps", "10"},
                {"min_lr", "0.001"},
                {"decay_fraction", "0.2"},
                {"decay", "cosine"}},
               lr, total),
      [&](int64_t s) {
        if (s < total - decay) return linear_decay(s);
        const double t = double(s - 80) / 20;
        return lo + (lr - lo) * (1 + std::cos(M_PI * t)) / 2;
      },
      total);
  auto sqrt_shape = schedule({{"name", "wsd"}, {"warmup_steps", "10"}, {"min_lr", "0.001"}}, lr, total);  // defaults
  check_all(
      sqrt_shape,
      [&](int64_t s) {
        if (s < total - decay) return linear_decay(s);
        return lo + (lr - lo) * (1 - std::sqrt(double(s - 80) / 20));
      },
      total);
  CHECK(sqrt_shape(79) == lr);  // still stable
  CHECK(sqrt_shape(100) == doctest::Approx(lo));
  CHECK_THROWS_WITH_AS(schedule({{"name", "wsd"}, {"decay", "step"}}, lr, total),
                       doctest::Contains("'schedule.decay = step' is not a decay shape"), dew::UsageError);
  CHECK_THROWS_WITH_AS(schedule({{"name", "wsd"}, {"warmup_steps", "90"}, {"decay_steps", "20"}}, lr, total),
                       doctest::Contains("exceed trainer.steps"), dew::UsageError);
}

TEST_CASE("exponential: optim.lr * decay_rate^(s / transition_steps), staircase, floored at min_lr") {
  const double lr = 0.1;
  check_all(
      schedule({{"name", "exponential"}, {"warmup_steps", "5"}, {"decay_rate", "0.01"}}, lr, 105),
      [&](int64_t s) { return s < 5 ? lr * double(s + 1) / 5 : lr * std::pow(0.01, double(s - 5) / 100); }, 105);
  check_all(
      schedule({{"name", "exponential"},
                {"decay_rate", "0.5"},
                {"transition_steps", "10"},
                {"staircase", "true"},
                {"min_lr", "0.01"}},
               lr, 100),
      [&](int64_t s) { return std::max(0.01, lr * std::pow(0.5, std::floor(double(s) / 10))); }, 100);
  CHECK_THROWS_WITH_AS(schedule({{"name", "exponential"}, {"decay_rate", "1.5"}}, lr, 10),
                       doctest::Contains("'schedule.decay_rate' must be in (0, 1]"), dew::UsageError);
}

TEST_CASE("power: (optim.lr - min_lr) (1 - t)^power + min_lr after the warm-up") {
  check_all(
      schedule({{"name", "power"}, {"warmup_steps", "4"}, {"min_lr", "0.02"}, {"power", "2"}}, 0.2, 54),
      [](int64_t s) {
        if (s < 4) return 0.2 * double(s + 1) / 4;
        const double t = std::min(1.0, double(s - 4) / 50);
        return (0.2 - 0.02) * (1 - t) * (1 - t) + 0.02;
      },
      54);
  CHECK_THROWS_AS(schedule({{"name", "power"}, {"power", "0"}}, 0.1, 10), dew::UsageError);
}

TEST_CASE("one_cycle: half cosines from lr / div_factor up to lr, then down to lr / (div_factor * final_div_factor)") {
  const double peak = 0.04;
  const int64_t total = 100;
  check_all(
      schedule({{"name", "one_cycle"}}, peak, total),
      [&](int64_t s) {
        const double start = peak / 25, end = start / 1e4;
        if (s < 30) return start + (peak - start) * (1 - std::cos(M_PI * double(s) / 30)) / 2;
        return end + (peak - end) * (1 + std::cos(M_PI * std::min(1.0, double(s - 30) / 70))) / 2;
      },
      total);
  auto f = schedule({{"name", "one_cycle"}, {"pct_start", "0.25"}, {"div_factor", "10"}, {"final_div_factor", "100"}},
                    peak, total);
  CHECK(f(0) == doctest::Approx(peak / 10));
  CHECK(f(25) == doctest::Approx(peak));
  CHECK(f(100) == doctest::Approx(peak / 1000));
  CHECK_THROWS_WITH_AS(schedule({{"name", "one_cycle"}, {"warmup_steps", "10"}}, peak, total),
                       doctest::Contains("one_cycle rises over pct_start"), dew::UsageError);
  CHECK(schedule({{"name", "one_cycle"}, {"warmup_steps", "0"}}, peak, total)(0) == doctest::Approx(peak / 25));
}

TEST_CASE("cosine and linear keep their closed forms") {
  check_all(
      schedule({{"name", "cosine"}, {"warmup_steps", "10"}, {"min_lr", "0.1"}}, 1.0, 110),
      [](int64_t s) {
        if (s < 10) return double(s + 1) / 10;
        return 0.1 + 0.45 * (1 + std::cos(M_PI * std::min(1.0, double(s - 10) / 100)));
      },
      110);
  check_all(
      schedule({{"name", "linear"}}, 2.0, 100), [](int64_t s) { return 2.0 - 2.0 * double(s) / 100; }, 100);
}
