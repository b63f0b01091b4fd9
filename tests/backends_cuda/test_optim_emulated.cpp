// tests/backends_cuda/test_optim_emulated.cpp — the optimizer step's grouped kernels (dew/kernel_table.hpp) on ref,
// cpu and the cuda plugin emulated on the CPU. adamw_update_group: every slot's param, m and v are adamw_update's bits
// on that tensor alone, with the slot's lr and weight decay (the group's own lr and weight decay are never read);
// slots of every kind the device launcher splits differently (odd sizes on the element path, multiples of 8 on the
// 8-wide path, tensors over several blocks, empty ones, more than one launch's 48); the contract's refusals (shared
// state, mixed dtypes or sizes). sum_squares_group: each element is reduce(sumsq)'s bits on its tensor, for every
// size class of the device's reduce (one thread, one block, slices) and over two launches. lerp_group: every average
// is the bits of the three kernels it fuses (lerp_each: sub, affine, add), in f32, bf16 (cuda) and f64 (ref), zero
// products' signs included, over two launches; a target may serve two slots, an average may not be written twice
// or read as a target.
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

// Bit for bit, any float dtype: through the exact widening to double (which keeps every value and zero's sign).
bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
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

namespace {

// lerp_group's slots: averages and targets of the given sizes in `dtype`, the same host values every time; slot 0
// holds signed zeros (averages -0, targets +0 and -0) so the sign a zero difference leaves is compared too.
std::vector<LerpSlot> make_lerp_slots(const std::vector<int64_t>& ns, const BackendPtr& be, DType dtype) {
  std::vector<LerpSlot> slots;
  for (size_t j = 0; j < ns.size(); ++j) {
    std::vector<float> a = values(ns[j], uint32_t(500 + 2 * j), -1, 1), t = values(ns[j], uint32_t(501 + 2 * j), -1, 1);
    if (j == 0)
      for (size_t i = 0; i < a.size(); ++i) a[i] = -0.0f, t[i] = i % 2 ? -0.0f : 0.0f;
    slots.push_back({Tensor::from_vector(a, {ns[j]}, be, dtype), Tensor::from_vector(t, {ns[j]}, be, dtype)});
  }
  return slots;
}

}  // namespace

TEST_CASE("lerp_group: the bits of sub, affine and add on every slot (ref, cpu, cuda-emulated) in f32, bf16 and f64") {
  std::vector<int64_t> ns = {16, 1031, 8192, 8193, 20000, 0, 7};
  for (int i = 0; i < 100; ++i) ns.push_back(1 + (i * 41) % 500);  // past one launch's 96 slots
  struct Case {
    const char* backend;
    DType dtype;
  };
  for (const Case c : {Case{"ref", DType::f32}, Case{"ref", DType::f64}, Case{"cpu", DType::f32},
                       Case{"cuda-emulated", DType::f32}, Case{"cuda-emulated", DType::bf16}}) {
    CAPTURE(c.backend);
    const std::string dtype = dtype_name(c.dtype);
    CAPTURE(dtype);
    const BackendPtr be = backend(c.backend);
    for (const float weight : {0.0011f, 0.3f, -0.5f}) {  // an EMA's 1 - decay; a negative weight: zero products' signs
      CAPTURE(weight);
      std::vector<LerpSlot> fused = make_lerp_slots(ns, be, c.dtype), unfused = make_lerp_slots(ns, be, c.dtype);
      be->lerp_group(fused, weight);
      lerp_each(*be, unfused, weight);
      int differ = 0;
      for (size_t j = 0; j < ns.size(); ++j) differ += !same_bits(fused[j].average, unfused[j].average);
      CHECK(differ == 0);
      CHECK_FALSE(same_bits(fused[4].average, make_lerp_slots(ns, be, c.dtype)[4].average));  // it moved
      CHECK(same_bits(fused[4].target, make_lerp_slots(ns, be, c.dtype)[4].target));          // targets kept
    }
  }
}

TEST_CASE("lerp_group refuses what its contract excludes, naming it, and lets a target serve several slots") {
  for (const char* name : {"ref", "cpu", "cuda-emulated"}) {
    CAPTURE(name);
    const BackendPtr be = backend(name);
    {  // one target read by two slots: allowed
      std::vector<LerpSlot> slots = make_lerp_slots({64, 64}, be, DType::f32);
      slots[1].target = slots[0].target;
      CHECK_NOTHROW(be->lerp_group(slots, 0.1f));
    }
    {  // two slots writing one average
      std::vector<LerpSlot> slots = make_lerp_slots({64, 64}, be, DType::f32);
      slots[1].average = slots[0].average.reshape({64}).slice0(8, 16);
      slots[1].target = slots[1].target.slice0(0, 8);
      CHECK_THROWS_WITH_AS(be->lerp_group(slots, 0.1f), doctest::Contains("two averages share memory"), Error);
    }
    {  // an average that another slot reads as its target
      std::vector<LerpSlot> slots = make_lerp_slots({64, 64}, be, DType::f32);
      slots[1].target = slots[0].average;
      CHECK_THROWS_WITH_AS(be->lerp_group(slots, 0.1f), doctest::Contains("shares memory with a target"), Error);
    }
    {  // a target of another size
      std::vector<LerpSlot> slots = make_lerp_slots({64, 32}, be, DType::f32);
      slots[1].target = slots[0].target;
      CHECK_THROWS_WITH_AS(be->lerp_group(slots, 0.1f), doctest::Contains("must match its average"), Error);
    }
  }
}
