// tests/train/test_train_units.cpp — the trainer's pure pieces: INI parsing and overrides, unknown-key
// refusal, LR schedules, the EMA decay schedule and update, the global gradient norm, the matmul-rate probe
// behind MFU (every timed product synchronised).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

namespace {
dew::BackendPtr ref() {
  static dew::BackendPtr be = [] {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref"});
    return dew::create_backend("ref");
  }();
  return be;
}

}  // namespace

namespace dew {
// Forwards everything to `inner` and counts the matmuls issued since the last synchronize(): an asynchronous
// device returns from a kernel call at once, so a rate timed without synchronising measures its queue.
class SyncCountingBackend final : public Backend {
 public:
  explicit SyncCountingBackend(BackendPtr inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool host_accessible() const override { return inner_->host_accessible(); }
  Support supports(Kernel k, DType dtype) const override { return inner_->supports(k, dtype); }
  void synchronize() override {
    most_unsynced = std::max(most_unsynced, unsynced);
    unsynced = 0;
    inner_->synchronize();
  }
  void* allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void deallocate(void* ptr, size_t bytes) override { inner_->deallocate(ptr, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_->copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
  void copy_device(void* dst, const void* src, size_t bytes) override { inner_->copy_device(dst, src, bytes); }
#define DEW_TEST_FORWARD_(name, params, args)                  \
  void name params override {                                  \
    if (Kernel::name == Kernel::matmul) ++matmuls, ++unsynced; \
    inner_->name args;                                         \
  }
  DEW_KERNEL_TABLE(DEW_TEST_FORWARD_)
#undef DEW_TEST_FORWARD_

  int matmuls = 0, unsynced = 0, most_unsynced = 0;

 private:
  BackendPtr inner_;
};
}  // namespace dew

TEST_CASE("measure_matmul_peak_gflops: a finite positive rate, every product synchronised before the next") {
  auto be = std::make_shared<dew::SyncCountingBackend>(ref());
  const double gflops = dew::measure_matmul_peak_gflops(be);
  CHECK(std::isfinite(gflops));
  CHECK(gflops > 0);
  CHECK(be->matmuls >= 2);        // the warm-up and at least one timed product
  CHECK(be->most_unsynced == 1);  // never two products in flight
  CHECK(be->unsynced == 0);       // the last one waited for too
  const double bf16 = dew::measure_matmul_peak_gflops(be, dew::DType::bf16);  // the mixed precisions' operands
  CHECK(std::isfinite(bf16));
  CHECK(bf16 > 0);
}

TEST_CASE("INI parsing, comments, overrides and the effective config") {
  dew::Config c = dew::Config::parse_ini("# top\n[optim]\nname = adamw  # inline\nlr=0.5\n\n[run]\n; c\nname = a b\n");
  CHECK(c.section("optim").get_string("name", "") == "adamw");
  CHECK(c.section("optim").get_double("lr", 0) == 0.5);
  CHECK(c.section("run").get_string("name", "") == "a b");
  c.set("optim.lr", "0.25");
  CHECK(c.section("optim").get_double("lr", 0) == 0.25);
  CHECK(c.to_ini() == "[optim]\nlr = 0.25\nname = adamw\n\n[run]\nname = a b\n");
  CHECK_THROWS_WITH_AS(dew::Config::parse_ini("[a]\nx = 1\nx = 2\n", "f.ini"), doctest::Contains("given twice"),
                       dew::UsageError);
  CHECK_THROWS_WITH_AS(dew::Config::parse_ini("x = 1\n", "f.ini"), doctest::Contains("outside any [section]"),
                       dew::UsageError);
  CHECK_THROWS_WITH_AS(dew::Config::parse_ini("[a]\njunk\n", "f.ini"), doctest::Contains("f.ini:2"), dew::UsageError);
  CHECK_THROWS_AS(c.set("nodot", "1"), dew::UsageError);
}

TEST_CASE("keys nobody read are refused by name") {
  dew::Config c = dew::Config::parse_ini("[optim]\nlr = 1\nlrr = 2\n[typo]\nk = 1\n");
  c.section("optim").get_double("lr", 0);
  try {
    c.check_all_used();
    FAIL("expected a refusal");
  } catch (const dew::UsageError& e) {
    const std::string m = e.what();
    // Only lrr is unknown (the used lr is not listed), and lr is what it probably meant.
    CHECK(m.find("unknown option 'optim.lrr'; did you mean 'optim.lr'?") != std::string::npos);
  }
  c.section("optim").get_double("lrr", 0);
  CHECK_THROWS_WITH_AS(c.check_all_used(), doctest::Contains("'typo.k'"), dew::UsageError);
  dew::Config bad = dew::Config::parse_ini("[o]\nv = x\n");
  CHECK_THROWS_WITH_AS(bad.section("o").get_double("v", 0), doctest::Contains("'o.v' must be a number"),
                       dew::UsageError);
}

TEST_CASE("a key given as a bare flag: true for get_bool, 'needs a value' for the text getters") {
  dew::Options o({{"prompt", "x"}}, "sample");
  o.set_flag("echo");
  o.set_flag("stop");
  CHECK(o.get_bool("echo", false));
  CHECK_THROWS_WITH_AS(o.get_string("stop", ""), doctest::Contains("option 'sample.stop' needs a value"),
                       dew::UsageError);
  CHECK_THROWS_WITH_AS(o.get_int("stop", 0), doctest::Contains("needs a value"), dew::UsageError);
  CHECK(o.get_string("prompt", "") == "x");
  o.check_all_used();
}

TEST_CASE("LR schedules: warm-up, cosine to min_lr, linear decay, constant") {
  dew::Options cos({{"name", "cosine"}, {"warmup_steps", "10"}, {"min_lr", "0.1"}}, "schedule");
  auto f = dew::make_schedule(cos, 1.0, 110);
  CHECK(f(0) == doctest::Approx(0.1));    // (0 + 1) / 10
  CHECK(f(9) == doctest::Approx(1.0));    // end of warm-up
  CHECK(f(10) == doctest::Approx(1.0));   // cosine starts at the peak
  CHECK(f(60) == doctest::Approx(0.55));  // half way: min + (max - min) / 2
  CHECK(f(110) == doctest::Approx(0.1));
  dew::Options lin({{"name", "linear"}}, "schedule");
  auto g = dew::make_schedule(lin, 2.0, 100);
  CHECK(g(0) == doctest::Approx(2.0));
  CHECK(g(50) == doctest::Approx(1.0));
  CHECK(g(100) == doctest::Approx(0.0));
  dew::Options cst({}, "schedule");
  CHECK(dew::make_schedule(cst, 3.0, 10)(7) == doctest::Approx(3.0));
  dew::Options bad({{"name", "step"}}, "schedule");
  CHECK_THROWS_WITH_AS(dew::make_schedule(bad, 1.0, 10), doctest::Contains("unknown schedule"), dew::UsageError);
}

TEST_CASE("EMA: warm-up decay schedule, update rule and swap") {
  auto be = ref();
  dew::Tensor p = dew::Tensor::from_vector({1.0f, 2.0f}, {2}, be);
  dew::NamedTensors params{{"w", p}};
  dew::Ema ema(params, 0.9, true);
  CHECK(ema.decay_at(0) == doctest::Approx(0.1));     // (1 + 0) / (10 + 0)
  CHECK(ema.decay_at(1000) == doctest::Approx(0.9));  // capped at ema_decay
  p.copy_(dew::Tensor::from_vector({3.0f, 4.0f}, {2}, be));
  ema.update(params, 0);  // e = 0.1 e + 0.9 p
  const auto e = ema.tensors()[0].second.to_floats();
  CHECK(e[0] == doctest::Approx(0.1 * 1 + 0.9 * 3));
  CHECK(e[1] == doctest::Approx(0.1 * 2 + 0.9 * 4));
  ema.swap_into(params);
  CHECK(p.to_floats()[0] == doctest::Approx(2.8));
  CHECK(ema.tensors()[0].second.to_floats()[0] == doctest::Approx(3.0));
}

TEST_CASE("global gradient norm over every parameter with a gradient") {
  auto be = ref();
  dew::Tensor a = dew::Tensor::from_vector({3.0f}, {1}, be).set_requires_grad();
  dew::Tensor b = dew::Tensor::from_vector({1.0f, 1.0f}, {2}, be).set_requires_grad();
  dew::Tensor c = dew::Tensor::from_vector({5.0f}, {1}, be).set_requires_grad();  // no gradient
  dew::sum(dew::add(dew::scale(a, 4.0f), dew::scale(dew::sum(b), 0.0f) + 3.0f)).backward();
  // d/da = 4, d/db = 0: norm 4
  CHECK(dew::global_grad_norm({{"a", a}, {"b", b}, {"c", c}}) == doctest::Approx(4.0));
}

TEST_CASE("sum_squares_each: each input's sum_squares, in one tensor") {
  auto be = ref();
  const dew::Tensor a = dew::Tensor::uniform({37, 5}, -1, 1, 3, 1, be),
                    b = dew::Tensor::uniform({1000}, -2, 2, 3, 2, be);
  const dew::Tensor e = dew::Tensor::empty({0}, dew::DType::f32, be);
  // f32 inputs: f32 sums, the bits of sum_squares on each (one reduce per input, into its element)
  const std::vector<float> s = dew::sum_squares_each({a, e, b}).to_floats();
  REQUIRE(s.size() == 3);
  CHECK(s[0] == dew::sum_squares(a).to_floats()[0]);
  CHECK(s[1] == 0.0f);
  CHECK(s[2] == dew::sum_squares(b).to_floats()[0]);
  // an f64 input makes the result f64: its sum exact, the others' f32 sums widened
  const dew::Tensor d = dew::cast(b, dew::DType::f64), h = dew::cast(a, dew::DType::bf16);
  const dew::Tensor w = dew::sum_squares_each({a, d, h});
  CHECK(w.dtype() == dew::DType::f64);
  const std::vector<double> wd = w.to_doubles();
  CHECK(wd[0] == double(dew::sum_squares(a).to_floats()[0]));
  CHECK(wd[1] == dew::sum_squares(d).to_doubles()[0]);
  CHECK(wd[2] == dew::sum_squares(h).to_doubles()[0]);
  CHECK_THROWS_AS(dew::sum_squares_each({}), dew::Error);
}

TEST_CASE("lerp_towards: every average moved toward its target, f32 and f64 together, the group kernel's bits") {
  auto be = ref();
  const dew::Tensor a = dew::Tensor::uniform({37, 5}, -1, 1, 5, 1, be),
                    b = dew::Tensor::uniform({1000}, -2, 2, 5, 2, be);
  const dew::Tensor d = dew::cast(dew::Tensor::uniform({64}, -1, 1, 5, 3, be), dew::DType::f64);
  const dew::Tensor ta = dew::Tensor::uniform({37, 5}, -1, 1, 6, 1, be),
                    tb = dew::Tensor::zeros({1000}, dew::DType::f32, be);
  const dew::Tensor td = dew::cast(dew::Tensor::uniform({64}, -1, 1, 6, 3, be), dew::DType::f64);
  std::vector<dew::Tensor> averages = {a.clone(), d.clone(), b.clone()}, targets = {ta, td, tb};
  dew::lerp_towards(averages, targets, 0.25f);
  // against the definition, three kernels per tensor (lerp_each), bit for bit
  std::vector<dew::LerpSlot> f32_slots = {{a.clone(), ta}, {b.clone(), tb}}, f64_slots = {{d.clone(), td}};
  dew::lerp_each(*be, f32_slots, 0.25f);
  dew::lerp_each(*be, f64_slots, 0.25f);
  CHECK(averages[0].to_floats() == f32_slots[0].average.to_floats());
  CHECK(averages[2].to_floats() == f32_slots[1].average.to_floats());
  CHECK(averages[1].to_doubles() == f64_slots[0].average.to_doubles());
  // and the values: a + 0.25 (t - a), here b's toward zero exactly 0.75 b
  const std::vector<float> bv = b.to_floats(), got = averages[2].to_floats();
  for (size_t i = 0; i < bv.size(); i += 97) CHECK(got[i] == doctest::Approx(0.75 * bv[i]).epsilon(1e-6));
  CHECK(averages[1].dtype() == dew::DType::f64);
  std::vector<dew::Tensor> one = {a.clone()};
  CHECK_THROWS_WITH_AS(dew::lerp_towards(one, {ta, tb}, 0.5f), doctest::Contains("1 averages but 2 targets"),
                       dew::Error);
}

TEST_CASE("optimizers and schedules are registry kinds, the core's are built in") {
  auto& reg = dew::Registry::global();
  for (const char* name : {"adamw", "lamb", "muon", "muonclip", "sgd"}) {
    CHECK(reg.contains(dew::Optimizer::kind, name));
    CHECK(reg.find(dew::Optimizer::kind, name).origin.plugin == "core");
  }
  for (const char* name : {"constant", "cosine", "linear", "wsd", "exponential", "power", "one_cycle"})
    CHECK(reg.contains(dew::Schedule::kind, name));
  auto be = ref();
  dew::NamedTensors params{{"w", dew::Tensor::zeros({2, 2}, dew::DType::f32, be)}};
  CHECK_THROWS_WITH_AS(
      dew::make_optimizer(dew::Options({{"name", "nope"}}, "optim"), params),
      doctest::Contains(
          "unknown optimizer 'nope'; known: adamw (core), lamb (core), muon (core), muonclip (core), sgd (core)"),
      dew::UsageError);
  // A second registration of a built-in name is refused, naming both origins.
  CHECK_THROWS_WITH_AS(
      reg.builtin_registrar().add<dew::Optimizer>(
          {.name = "adamw", .factory = [](const dew::Options&) -> std::shared_ptr<dew::Optimizer> { return nullptr; }}),
      doctest::Contains("duplicate optimizer 'adamw'"), dew::Error);
}

TEST_CASE("parameter roles from names and shapes, overridden by patterns, groups scale lr and weight decay") {
  using R = dew::ParamRole;
  CHECK(dew::param_role("model.embed_tokens.weight", {256, 64}) == R::embedding);
  CHECK(dew::param_role("tok_emb.weight", {256, 64}) == R::embedding);
  CHECK(dew::param_role("pos_embed", {1, 16, 64}) == R::embedding);
  CHECK(dew::param_role("x_embedder.proj.weight", {64, 3, 2, 2}) == R::embedding);
  CHECK(dew::param_role("lm_head.weight", {256, 64}) == R::head);
  CHECK(dew::param_role("head.weight", {10, 64}) == R::head);
  CHECK(dew::param_role("final_layer.linear.weight", {64, 16}) == R::head);
  CHECK(dew::param_role("model.layers.0.self_attn.q_proj.weight", {64, 64}) == R::matrix);
  CHECK(dew::param_role("blocks.0.conv.weight", {8, 4, 3, 3}) == R::matrix);
  CHECK(dew::param_role("members.0.weight", {8, 8}) == R::matrix);  // "emb" inside a word is not an embedding
  CHECK(dew::param_role("model.layers.0.input_layernorm.weight", {64}) == R::norm);
  CHECK(dew::param_role("layers.0.bias", {64}) == R::bias);
  CHECK(dew::param_role("head.bias", {10}) == R::bias);
  CHECK(dew::param_role("attn.q_bias", {64}) == R::bias);

  auto be = ref();
  auto t = [&](const dew::Shape& s) { return dew::Tensor::zeros(s, dew::DType::f32, be); };
  dew::NamedTensors params{{"layers.0.weight", t({8, 4})},
                           {"layers.0.bias", t({8})},
                           {"layers.1.weight", t({3, 8})},
                           {"norm.weight", t({8})}};
  dew::Options o({{"roles.head", "layers.1.*"}, {"no_decay", "bias, norm"}, {"lr_scale.head", "0.5"}}, "optim");
  const auto ps = dew::optim_params(o, params);
  REQUIRE(ps.size() == 4);
  CHECK(ps[0].role == R::matrix);
  CHECK(ps[1].role == R::bias);
  CHECK(ps[2].role == R::head);  // the pattern wins over the name
  CHECK(ps[3].role == R::norm);
  CHECK(ps[0].weight_decay_scale == 1.0f);
  CHECK(ps[1].weight_decay_scale == 0.0f);
  CHECK(ps[3].weight_decay_scale == 0.0f);
  CHECK(ps[2].lr_scale == 0.5f);
  CHECK(ps[0].lr_scale == 1.0f);
  CHECK_THROWS_WITH_AS(dew::optim_params(dew::Options({{"no_decay", "gains"}}, "optim"), params),
                       doctest::Contains("unknown parameter role 'gains'"), dew::UsageError);
  CHECK_THROWS_WITH_AS(dew::optim_params(dew::Options({{"lr_scale.head", "-1"}}, "optim"), params),
                       doctest::Contains("'optim.lr_scale.head' must be >= 0"), dew::UsageError);
}
