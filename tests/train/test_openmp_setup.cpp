// tests/train/test_openmp_setup.cpp — dew-run's OpenMP defaults (tools/dew-run/openmp_setup.hpp): the busy-core
// arithmetic on /proc/stat lines, the choice of waiting for idle and busy machines (the thread count only
// divided among ranks), and that a user's variables are never replaced.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "openmp_setup.hpp"

using dew_run::busy_cores_between;
using dew_run::choose_openmp;

TEST_CASE("busy cores from two /proc/stat cpu lines") {
  // user nice system idle iowait irq softirq steal guest guest_nice
  const std::string a = "cpu  1000 0 200 5000 100 0 10 0 0 0";
  // +100 busy (user 60, system 30, softirq 5, steal 5) and +100 idle (idle 90, iowait 10): half the time busy.
  const std::string b = "cpu  1060 0 230 5090 110 0 15 5 0 0";
  CHECK(busy_cores_between(a, b, 2) == doctest::Approx(1.0));
  CHECK(busy_cores_between(a, b, 4) == doctest::Approx(2.0));
  CHECK(busy_cores_between(a, a, 2) == -1.0);               // no time passed
  CHECK(busy_cores_between("cpu0 1 2 3 4", b, 2) == -1.0);  // not the summary line
  CHECK(busy_cores_between("cpu  1 2", b, 2) == -1.0);      // truncated
  CHECK(busy_cores_between(a, b, 0) == -1.0);               // no cpu count
  // Four fields only (very old kernels): no iowait/irq/steal columns.
  CHECK(busy_cores_between("cpu 10 0 0 90", "cpu 40 0 0 160", 2) == doctest::Approx(0.6));
}

TEST_CASE("the choice: idle -> short spinning, busy -> passive, the count stays OpenMP's, the user's settings win") {
  auto c = choose_openmp(2, 0.1, false, false);
  CHECK(c.threads == 0);  // OpenMP's default: every usable core
  CHECK(c.policy == "spin");
  c = choose_openmp(2, 1.0, false, false);
  CHECK(c.threads == 0);  // never fewer threads for load: a resume must run the same count
  CHECK(c.policy == "passive");
  c = choose_openmp(2, 0.6, false, false);  // from half a core on, a core counts as taken
  CHECK(c.policy == "passive");
  c = choose_openmp(2, 0.4, false, false);
  CHECK(c.policy == "spin");
  c = choose_openmp(2, 1.0, false, true);  // OMP_WAIT_POLICY or GOMP_SPINCOUNT set: the waiting is the user's
  CHECK(c.policy.empty());
  c = choose_openmp(16, 0.0, false, false, 4);  // four ranks on one machine: 4 threads each, passive
  CHECK(c.threads == 4);
  CHECK(c.policy == "passive");
  c = choose_openmp(2, 0.0, false, false, 3);  // more ranks than cores: still one thread each
  CHECK(c.threads == 1);
  c = choose_openmp(16, 0.0, true, false, 4);  // OMP_NUM_THREADS set: the count is the user's
  CHECK(c.threads == 0);
  unsetenv("OMP_NUM_THREADS");  // describe() names a user's count
  CHECK(dew_run::describe(choose_openmp(2, 1.0, false, false)) ==
        "1.0 of 2 usable cores busy at start: every core, waiting passively");
  c = choose_openmp(2, -1.0, false, false);  // /proc/stat unreadable: cautious
  CHECK(c.threads == 0);
  CHECK(c.policy == "passive");
}

TEST_CASE("apply_openmp_defaults never replaces a variable the user set") {
  setenv("OMP_NUM_THREADS", "7", 1);
  setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  unsetenv("GOMP_SPINCOUNT");
  const auto c = dew_run::apply_openmp_defaults(10);
  CHECK(std::string(std::getenv("OMP_NUM_THREADS")) == "7");
  CHECK(std::string(std::getenv("OMP_WAIT_POLICY")) == "ACTIVE");
  CHECK(std::getenv("GOMP_SPINCOUNT") == nullptr);
  CHECK(c.threads == 0);
  CHECK(c.policy.empty());
  CHECK(c.usable_cores >= 1);
}
