// tests/backends_cuda/test_optim_emulated.cpp — the optimizer step's grouped kernels (dew/kernel_table.hpp) on ref,
// cpu and the cuda plugin emulated on the CPU. adamw_update_group: every slot's param, m and v are adamw_update's bits
// on that tensor alone, with the slot's lr and weight decay (the group's own lr and weight decay are never read);
// slots of every kind the device launcher splits differently (odd sizes on the element path, multiples of 8 on the
// 8-wide path, tensors over several blocks, empty ones, more than one launch's 48); the contract's refusals (shared
// state, mixed dtypes or sizes). sum_squares_group: each element is reduce(sumsq)'s bits on its tensor, for every
// size class of the device's reduce (one thread, one block, slices) and over two launches.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/registry.hpp"

using namespace dew;

namespace {

BackendPtr backend(const std::string& name) {
  static bool loaded = [] {
    Registry::global().discover(Registry::default_plugin_dirs(), {"cpu", "ref"});
    Registry::global().load(DEW_CUDA_EMULATED_PLUGIN_PATH);
    return true;
  }();
  (void)loaded;
  return create_backend(name);
}

std::vector<float> values(int64_t n, uint32_t seed, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * float(s >> 8) / float(1u << 24);
  }
  return v;
}

struct Slot {
  int64_t n;
  float lr, wd;
};

// The slots' tensors on `be`, from the same host values every time.
std::vector<AdamWSlot> make_slots(const std::vector<Slot>& spec, const BackendPtr& be) {
  std::vector<AdamWSlot> slots;
  for (size_t j = 0; j < spec.size(); ++j) {
    const int64_t n = spec[j].n;
    const uint32_t s = uint32_t(4 * j);
    slots.push_back({Tensor::from_vector(values(n, s, -1, 1), {n}, be),
                     Tensor::from_vector(values(n, s + 1, -1, 1), {n}, be),
                     Tensor::from_vector(values(n, s + 2, -0.1f, 0.1f), {n}, be),
                     Tensor::from_vector(values(n, s + 3, 0, 0.01f), {n}, be), spec[j].lr, spec[j].wd});
  }
  return slots;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("adamw_update_group: adamw_update's bits on every slot (ref, cpu, cuda-emulated)") {
  std::vector<Slot> spec = {{1031, 1e-2f, 0.1f}, {64 * 96, 3e-3f, 0.0f}, {8, 1e-3f, 0.01f},   {20000, 2e-3f, 0.1f},
                            {0, 1e-3f, 0.1f},    {16, 5e-4f, 0.0f},      {8192, 1e-3f, 0.2f}, {8193, 1e-3f, 0.2f}};
  for (int i = 0; i < 60; ++i) spec.push_back({1 + (i * 37) % 300, 1e-3f * float(1 + i % 4), i % 2 ? 0.1f : 0.0f});
  // The group's own lr and weight decay are placeholders no slot may take.
  const AdamWParams group{9e-9f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.7f, 17};
  for (const char* name : {"ref", "cpu", "cuda-emulated"}) {
    CAPTURE(name);
    const BackendPtr be = backend(name);
    std::vector<AdamWSlot> grouped = make_slots(spec, be), single = make_slots(spec, be);
    be->adamw_update_group(grouped, group);
    for (AdamWSlot& s : single) {
      AdamWParams p = group;
      p.lr = s.lr;
      p.weight_decay = s.weight_decay;
      be->adamw_update(s.param, s.grad, s.m, s.v, p);
    }
    int differ = 0;
    for (size_t j = 0; j < spec.size(); ++j)
      differ += !same_bits(grouped[j].param, single[j].param) + !same_bits(grouped[j].m, single[j].m) +
                !same_bits(grouped[j].v, single[j].v);
    CHECK(differ == 0);
    // and it moved them: not a group that wrote nothing
    CHECK_FALSE(same_bits(grouped[3].param, make_slots(spec, be)[3].param));
  }
}

TEST_CASE("adamw_update_group refuses what its contract excludes, naming it") {
  for (const char* name : {"ref", "cpu", "cuda-emulated"}) {
    CAPTURE(name);
    const BackendPtr be = backend(name);
    const AdamWParams p;
    {  // two slots writing one moment
      std::vector<AdamWSlot> slots = make_slots({{64, 1e-3f, 0}, {64, 1e-3f, 0}}, be);
      slots[1].m = slots[0].m;
      CHECK_THROWS_WITH_AS(be->adamw_update_group(slots, p), doctest::Contains("share memory"), Error);
    }
    {  // a param that is a view into another slot's param
      std::vector<AdamWSlot> slots = make_slots({{64, 1e-3f, 0}, {32, 1e-3f, 0}}, be);
      slots[1].param = slots[0].param.reshape({64}).slice0(16, 48);
      CHECK_THROWS_WITH_AS(be->adamw_update_group(slots, p), doctest::Contains("share memory"), Error);
    }
    {  // a state of another size
      std::vector<AdamWSlot> slots = make_slots({{64, 1e-3f, 0}, {32, 1e-3f, 0}}, be);
      slots[1].v = make_slots({{31, 1e-3f, 0}}, be)[0].v;
      CHECK_THROWS_WITH_AS(be->adamw_update_group(slots, p), doctest::Contains("must match its param"), Error);
    }
  }
}

TEST_CASE("sum_squares_group: reduce's bits on every tensor (ref, cpu, cuda-emulated)") {
  std::vector<int64_t> ns = {0, 1, 63, 64, 1000, 65535, 65536, 200003, 8};
  for (int i = 0; i < 70; ++i) ns.push_back(1 + (i * 53) % 700);
  for (const char* name : {"ref", "cpu", "cuda-emulated"}) {
    CAPTURE(name);
    const BackendPtr be = backend(name);
    std::vector<Tensor> xs;
    for (size_t i = 0; i < ns.size(); ++i)
      xs.push_back(Tensor::from_vector(values(ns[i], uint32_t(100 + i), -2, 2), {ns[i]}, be));
    Tensor out = Tensor::empty({int64_t(xs.size())}, DType::f32, be);
    be->sum_squares_group(xs, out);
    const std::vector<float> got = out.to_floats();
    int differ = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      Tensor one = Tensor::empty({1}, DType::f32, be);
      if (ns[i] == 0)
        be->fill(one, 0.0);
      else
        be->reduce(xs[i], one, ReduceParams{ReduceOp::sumsq, 1, ns[i], 1});
      const float want = one.to_floats()[0];
      differ += std::memcmp(&want, &got[i], sizeof(float)) != 0;
    }
    CHECK(differ == 0);
    CHECK(got[7] > 1000.0f);  // 200003 values in [-2, 2]: a sum, not a zero left unwritten
    Tensor wrong = Tensor::empty({int64_t(xs.size()) - 1}, DType::f32, be);
    CHECK_THROWS_WITH_AS(be->sum_squares_group(xs, wrong), doctest::Contains("one value per input"), Error);
  }
}
