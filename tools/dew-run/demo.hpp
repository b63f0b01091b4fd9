// tools/dew-run/demo.hpp — `dew-run demo`: a small end-to-end fit that exercises the core on a backend.
#pragma once
#include <cstdint>
#include <string>

namespace dew_run {
struct DemoOptions {
  std::string backend = "cpu";
  int steps = 300;
  uint64_t seed = 0;
};
int run_demo(const DemoOptions& opt);
}  // namespace dew_run
