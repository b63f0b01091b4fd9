// tests/backends_cuda/test_profile_emulated.cpp — the profiler's two clocks (dew/profile.hpp). On a backend with a
// device clock (cuda; here its plugin emulated on the CPU, whose events read the host clock) each call is timed by
// two marks on the stream, read when the profiler stops, with no synchronisation per call; on one without (cpu)
// by the wall clock around a synchronised call. Either way every call is counted under its label, its time is
// positive, and the results are the wrapped backend's bit for bit.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/registry.hpp"

using namespace dew;

namespace {

BackendPtr backend(const std::string& name) {
  static bool loaded = [] {
    Registry::global().discover(Registry::default_plugin_dirs(), {"cpu"});
    Registry::global().load(DEW_CUDA_EMULATED_PLUGIN_PATH);
    return true;
  }();
  (void)loaded;
  return create_backend(name);
}

// The report's line for `label`: milliseconds per step and calls per step.
bool row_of(const std::string& report, const std::string& label, double& ms, double& calls) {
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("  " + label);
    if (at == std::string::npos || line.size() != at + 2 + label.size()) continue;
    std::istringstream fields(line);
    fields >> ms >> calls;
    return bool(fields);
  }
  return false;
}

}  // namespace

TEST_CASE("the profiler reads the cuda backend's device clock and the cpu backend's wall clock") {
  for (const char* name : {"cuda-emulated", "cpu"}) {
    CAPTURE(name);
    const bool device_clock = std::string(name) != "cpu";
    BackendPtr inner = backend(name);
    auto prof = std::make_shared<ProfilingBackend>(inner);
    const Tensor a = Tensor::uniform({48, 40}, -1, 1, 7, 0, prof), b = Tensor::uniform({40, 24}, -1, 1, 8, 0, prof);
    const Tensor a_plain = Tensor::uniform({48, 40}, -1, 1, 7, 0, inner);
    const Tensor b_plain = Tensor::uniform({40, 24}, -1, 1, 8, 0, inner);

    prof->start();
    Tensor c;
    for (int i = 0; i < 3; ++i) c = matmul(a, b);
    const Tensor d = add(c, c);
    prof->stop();
    CHECK(prof->device_clock() == device_clock);

    const std::string report = prof->report(1, 1e4);
    CAPTURE(report);
    CHECK(report.find(device_clock ? "by the device clock" : "synchronised per kernel") != std::string::npos);
    double ms = 0, calls = 0;
    REQUIRE(row_of(report, "matmul 48x40x24", ms, calls));
    CHECK(calls == 3.0);
    CHECK(ms > 0.0);
    REQUIRE(row_of(report, "binary add", ms, calls));
    CHECK(calls == 1.0);
    CHECK(ms > 0.0);

    // Not timed once stopped; the results are the wrapped backend's.
    const Tensor e = matmul(a, b);
    CHECK(prof->report(1, 1e4) == report);
    const Tensor plain = add(matmul(a_plain, b_plain), matmul(a_plain, b_plain));
    CHECK(d.to_floats() == plain.to_floats());
    CHECK(e.to_floats() == matmul(a_plain, b_plain).to_floats());
  }
}
