// tests/train/test_memory.cpp — memory accounting: every in-tree host backend (ref, cpu) counts the
// bytes it hands out at their rounded size, keeps the high-water mark and resets it; ProfilingBackend
// forwards the figures; training_state_memory counts the storages of parameters, gradients and the
// optimizer's own state slots, each storage once.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

namespace {
dew::BackendPtr backend(const std::string& name) {
  static bool discovered = [] {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu"});
    return true;
  }();
  (void)discovered;
  return dew::create_backend(name);
}

// The bytes in use right now on `be`.
int64_t in_use(const dew::BackendPtr& be) { return be->memory_stats().in_use; }
}  // namespace

TEST_CASE("ref and cpu count what they hand out, at the rounded size, and keep the high-water mark") {
  for (const char* name : {"ref", "cpu"}) {
    CAPTURE(name);
    dew::BackendPtr be = backend(name);
    REQUIRE(be->memory_stats().tracked);
    const int64_t base = in_use(be);
    {
      // 1000 floats = 4000 bytes, rounded to 64 bytes: 4032 (both backends align to a cache line).
      dew::Tensor a = dew::Tensor::zeros({1000}, dew::DType::f32, be);
      CHECK(in_use(be) - base == 4032);
      dew::Tensor b = dew::Tensor::zeros({16}, dew::DType::f32, be);  // 64 bytes exactly
      CHECK(in_use(be) - base == 4032 + 64);
      dew::Tensor view = a.slice0(10, 20);  // a view allocates nothing
      CHECK(in_use(be) - base == 4032 + 64);
    }
    CHECK(in_use(be) == base);
    // The peak stays after a free; reset_memory_peak() brings it down to what is in use.
    be->reset_memory_peak();
    CHECK(be->memory_stats().peak == base);
    {
      dew::Tensor big = dew::Tensor::zeros({1 << 20}, dew::DType::f32, be);  // 4 MiB: cpu's mmap path
      CHECK(in_use(be) - base >= 4 << 20);
    }
    const dew::MemoryStats s = be->memory_stats();
    CHECK(s.in_use == base);
    CHECK(s.peak - base >= 4 << 20);
    CHECK(s.peak - base < (4 << 20) + (2 << 20));  // at most one 2 MiB rounding
    CHECK(s.reserved >= s.in_use);
    // cpu keeps the freed 4 MiB block for reuse: reserved, not in use; a new one of that size reuses it
    // and is counted again.
    if (std::string(name) == "cpu") {
      CHECK(s.reserved - s.in_use >= 4 << 20);
      dew::Tensor again = dew::Tensor::zeros({1 << 20}, dew::DType::f32, be);
      CHECK(in_use(be) - base >= 4 << 20);
      CHECK(be->memory_stats().reserved == s.reserved);
    }
    be->reset_memory_peak();
    CHECK(be->memory_stats().peak == in_use(be));
  }
}

TEST_CASE("ProfilingBackend forwards the wrapped backend's memory figures") {
  dew::BackendPtr inner = backend("cpu");
  auto prof = std::make_shared<dew::ProfilingBackend>(inner);
  const int64_t base = in_use(inner);
  dew::Tensor a = dew::Tensor::zeros({1000}, dew::DType::f32, prof);
  CHECK(prof->memory_stats().tracked);
  CHECK(prof->memory_stats().in_use - base == 4032);
  CHECK(in_use(inner) - base == 4032);
}

TEST_CASE("training_state_memory: parameters, gradients and the optimizer's own state, each storage once") {
  dew::BackendPtr be = backend("ref");
  dew::set_default_backend(be);
  dew::Tensor w = dew::Tensor::uniform({8, 4}, -1, 1, 1, 1, be).set_requires_grad();
  dew::Tensor b = dew::Tensor::zeros({8}, dew::DType::f32, be).set_requires_grad();
  dew::NamedTensors params{{"fc.weight", w}, {"fc.bias", b}};
  const int64_t param_bytes = (32 + 8) * 4;

  auto measure = [&](const std::string& optimizer, const dew::NamedTensors& extra = {}) {
    dew::Config c = dew::Config::parse_ini("[optim]\nname = " + optimizer + "\nlr = 0.1\n");
    std::shared_ptr<dew::Optimizer> opt = dew::make_optimizer(c.section("optim"), params);
    return dew::training_state_memory(params, opt.get(), extra);
  };
  SUBCASE("no gradient yet, AdamW's two moments") {
    const dew::TrainingStateMemory m = measure("adamw");
    CHECK(m.params == param_bytes);
    CHECK(m.grads == 0);
    CHECK(m.optim == 2 * param_bytes);
    CHECK(m.total() == 3 * param_bytes);
  }
  SUBCASE("plain SGD keeps no state; momentum SGD one buffer; the EMA counts as optimizer state") {
    CHECK(measure("sgd").optim == 0);
    dew::Config c = dew::Config::parse_ini("[optim]\nname = sgd\nlr = 0.1\nmomentum = 0.9\n");
    auto opt = dew::make_optimizer(c.section("optim"), params);
    CHECK(dew::training_state_memory(params, opt.get()).optim == param_bytes);
    dew::Ema ema(params, 0.99, true);
    CHECK(measure("sgd", ema.tensors()).optim == param_bytes);
  }
  SUBCASE("gradients after a backward; a tied parameter and a view count their storage once") {
    dew::Tensor x = dew::Tensor::uniform({3, 4}, -1, 1, 2, 1, be);
    dew::sum(dew::linear(x, w, b)).backward();
    CHECK(measure("adamw").grads == param_bytes);
    dew::NamedTensors tied = params;
    tied.push_back({"head.weight", w});                // tied to fc.weight
    tied.push_back({"fc.weight_rows", w.slice0(0, 2)});  // a view of it
    CHECK(dew::training_state_memory(tied, nullptr).params == param_bytes);
    CHECK(dew::training_state_memory(tied, nullptr).grads == param_bytes);
    CHECK(dew::training_state_memory(tied, nullptr).optim == 0);
  }
}
