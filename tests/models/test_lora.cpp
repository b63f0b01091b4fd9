// tests/models/test_lora.cpp — LoRA adapters (dew/lora.hpp, nn::Linear) on every bundled backbone.
//
// 1. One adapted Linear against its formula y = act(x W^T + b + s (x A^T) B^T), and its gradients (x, W, b,
//    A, B) against finite differences in double on ref.
// 2. Every backbone of the fixtures (backbone_cases.hpp: three causal_transformer variants with GQA, qk-norm,
//    biases, softcaps, sliding windows; vit_encoder; jepa_predictor; two DiTs; the U-Net), every Linear
//    outside a head adapted with random A and B: every output the fixtures record (the training forward,
//    the eval forward, the KV-cached decode, the slot-cache decode) equals the merged model's (W + s B A,
//    adapters removed) — a block that read `weight` itself (a fused or packed product) would drop the
//    adapter there and fail — and differs from the base model's (the adapters act). The adapters' gradients
//    follow from the merged weight's: dL/dB = s dW' A^T, dL/dA = s B^T dW'.
// 3. The split: adapters trained, the rest frozen (no gradient formed); the refusals.
// 4. LoRA dropout: the adapter's input masked as dew::dropout keys it (model key, path), in training only.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>

#include "../autograd/gradcheck.hpp"
#include "backbone_cases.hpp"
#include "dew/lora.hpp"

using namespace backbone_fixtures;

namespace {

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : dew::cast(t, dew::DType::f32).to_floats()) m = std::max(m, double(std::abs(v)));
  return m;
}
double max_diff(const Tensor& a, const Tensor& b) {
  return max_abs(dew::sub(dew::cast(a, dew::DType::f32), dew::cast(b, dew::DType::f32)));
}

std::map<std::string, Tensor> by_name(const dew::NamedTensors& v) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : v) m.emplace(n, t);
  return m;
}

}  // namespace

TEST_CASE("a LoRA Linear: its formula, and gradients by finite differences in double") {
  const dew::BackendPtr& be = gc::ref();  // gradcheck's own ref instance, made the default
  dew::set_default_backend(be);
  for (dew::Activation act : {dew::Activation::none, dew::Activation::gelu}) {
    dew::nn::Linear l(5, 4, true);
    l.add_lora(3, 1.5f, 7, "probe");
    CHECK(l.has_lora());
    const auto names = l.named_parameters();
    REQUIRE(names.size() == 4);
    CHECK(names[2].first == "lora_A.weight");
    CHECK(names[3].first == "lora_B.weight");
    CHECK(max_abs(l.lora_b) == 0.0);  // B starts at zero: the adapted layer is the plain one
    const Tensor x = Tensor::normal({2, 3, 5}, 0, 1, 1, 1, be, dew::DType::f64);
    const Tensor w = Tensor::normal({4, 5}, 0, 0.5f, 1, 2, be, dew::DType::f64);
    const Tensor b = Tensor::normal({4}, 0, 0.5f, 1, 3, be, dew::DType::f64);
    const Tensor a = Tensor::normal({3, 5}, 0, 0.5f, 1, 4, be, dew::DType::f64);
    const Tensor bb = Tensor::normal({4, 3}, 0, 0.5f, 1, 5, be, dew::DType::f64);
    auto f = [&](const std::vector<Tensor>& in) {
      l.weight = in[1];
      l.bias = in[2];
      l.lora_a = in[3];
      l.lora_b = in[4];
      return l.forward(in[0], act);
    };
    // The formula, by hand in double.
    const Tensor y = f({x, w, b, a, bb});
    const std::vector<float> xs = dew::cast(x, dew::DType::f32).to_floats(),
                             ws = dew::cast(w, dew::DType::f32).to_floats(),
                             bs = dew::cast(b, dew::DType::f32).to_floats(),
                             as = dew::cast(a, dew::DType::f32).to_floats(),
                             bbs = dew::cast(bb, dew::DType::f32).to_floats(),
                             ys = dew::cast(y, dew::DType::f32).to_floats();
    for (int row = 0; row < 6; ++row)
      for (int o = 0; o < 4; ++o) {
        double v = bs[size_t(o)];
        for (int i = 0; i < 5; ++i) v += double(xs[size_t(row * 5 + i)]) * ws[size_t(o * 5 + i)];
        for (int r = 0; r < 3; ++r) {
          double xa = 0;
          for (int i = 0; i < 5; ++i) xa += double(xs[size_t(row * 5 + i)]) * as[size_t(r * 5 + i)];
          v += 1.5 * xa * bbs[size_t(o * 3 + r)];
        }
        if (act == dew::Activation::gelu) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        CHECK(ys[size_t(row * 4 + o)] == doctest::Approx(v).epsilon(1e-5));
      }
    gc::gradcheck(f, {x, w, b, a, bb}, "lora linear");
  }
}

TEST_CASE("LoRA dropout: the adapter reads dropout(x) while training, keyed by the model key, and evaluation reads x") {
  const dew::BackendPtr& be = gc::ref();
  dew::set_default_backend(be);
  dew::nn::Linear l(6, 4, true);
  l.add_lora(3, 2.0f, 7, "layers.0.q_proj");
  dew::nn::RandomKey key{11, 5};
  l.set_lora_dropout(0.5f, &key, "layers.0.q_proj");
  const Tensor x = Tensor::normal({2, 5, 6}, 0, 1, 1, 1, be, dew::DType::f64);
  l.weight = Tensor::normal({4, 6}, 0, 0.5f, 1, 2, be, dew::DType::f64);
  l.bias = Tensor::normal({4}, 0, 0.5f, 1, 3, be, dew::DType::f64);
  l.lora_a = Tensor::normal({3, 6}, 0, 0.5f, 1, 4, be, dew::DType::f64);
  l.lora_b = Tensor::normal({4, 3}, 0, 0.5f, 1, 5, be, dew::DType::f64);
  const uint64_t stream = dew::philox::stream_of("layers.0.q_proj.lora_dropout");
  auto by_formula = [&](const Tensor& xa) {  // x W^T + b + s (xa A^T) B^T with the ops
    return dew::add(dew::linear(x, l.weight, l.bias),
                    dew::scale(dew::linear(dew::linear(xa, l.lora_a), l.lora_b), 2.0f));
  };
  l.set_training(true);
  const Tensor dropped = dew::dropout(x, 0.5f, 11, stream + 5 * 0x9E3779B97F4A7C15ull, 0);
  CHECK(max_diff(l.forward(x), by_formula(dropped)) < 1e-12);
  CHECK(max_diff(l.forward(x), by_formula(x)) > 1e-3);  // the masks act
  key.step = 6;                                         // the next micro-batch draws other masks
  CHECK(max_diff(l.forward(x), by_formula(dropped)) > 1e-3);
  gc::gradcheck(
      [&](const std::vector<Tensor>& in) {
        l.lora_a = in[1];
        l.lora_b = in[2];
        return l.forward(in[0]);
      },
      {x, l.lora_a, l.lora_b}, "lora linear with dropout");
  l.set_training(false);  // evaluation: no dropout
  CHECK(max_diff(l.forward(x), by_formula(x)) < 1e-12);
  CHECK_THROWS_WITH(l.set_lora_dropout(1.0f, &key, "p"), doctest::Contains("[0, 1)"));
  dew::Config c;
  c.set("lora.rank", "2");
  c.set("lora.dropout", "1.5");
  CHECK_THROWS_WITH_AS(dew::LoraOptions::read(c.section("lora")), doctest::Contains("lora.dropout"), dew::UsageError);
}

TEST_CASE(
    "every backbone with LoRA adapters equals its merged model (forward, decode, gradients) and with them off its "
    "base") {
  for (const Case& c : cases()) {
    INFO(c.name);
    auto m = make_model(c);
    randomize(*m);
    const dew::NamedTensors inputs = make_inputs(c);
    const Results base = run_model(c, *m, inputs);

    dew::LoraOptions o;
    o.rank = 3;
    o.alpha = 6;
    const std::vector<std::string> adapted = dew::attach_lora(*m, o, 5);
    REQUIRE(!adapted.empty());
    {  // random adapters (B = 0 would hide a bypassed one)
      dew::NoGradGuard ng;
      for (auto& [name, p] : m->named_parameters())
        if (dew::is_lora_parameter(name)) p.copy_(normal(p.shape(), 0.2f, dew::philox::stream_of(name.c_str())));
    }
    const auto weights = by_name(m->named_parameters());
    const Results adapted_run = run_model(c, *m, inputs);
    {  // with the adapters off (DPO's reference pass) the model is its base, bit for bit, on the base's own paths
      dew::nn::LoraAdaptersOff off;
      const Results off_run = run_model(c, *m, inputs);
      REQUIRE(off_run.outputs.size() == base.outputs.size());
      for (size_t i = 0; i < base.outputs.size(); ++i) {
        INFO(base.outputs[i].first);
        CHECK(max_diff(off_run.outputs[i].second, base.outputs[i].second) == 0);
      }
    }
    CHECK(dew::nn::lora_adapters_enabled());
    CHECK(max_diff(run_model(c, *m, inputs).outputs[0].second, adapted_run.outputs[0].second) == 0);  // on again
    CHECK(dew::merge_lora(*m) == int(adapted.size()));
    for (const auto& [name, p] : m->named_parameters()) CHECK(!dew::is_lora_parameter(name));
    CHECK(m->named_parameters().size() == base.grads.size());
    const Results merged = run_model(c, *m, inputs);

    REQUIRE(adapted_run.outputs.size() == merged.outputs.size());
    for (size_t i = 0; i < merged.outputs.size(); ++i) {
      INFO(merged.outputs[i].first);
      const double scale = std::max(1.0, max_abs(merged.outputs[i].second));
      CHECK(max_diff(adapted_run.outputs[i].second, merged.outputs[i].second) <= 2e-5 * scale);
      CHECK(max_diff(base.outputs[i].second, merged.outputs[i].second) > 1e-3 * scale);  // the adapters act
    }
    // dL/dB = s dW' A^T and dL/dA = s B^T dW', dW' the merged weight's gradient (the same loss).
    const auto g_adapted = by_name(adapted_run.grads), g_merged = by_name(merged.grads);
    for (const std::string& path : adapted) {
      INFO(path);
      const std::string pre = path.empty() ? "" : path + ".";
      const Tensor dw = g_merged.at("grad." + pre + "weight");
      const Tensor a = weights.at(pre + "lora_A.weight"), b = weights.at(pre + "lora_B.weight");
      const Tensor want_b = dew::scale(dew::matmul(dw, a, false, true), o.scale());
      const Tensor want_a = dew::scale(dew::matmul(b, dw, true, false), o.scale());
      CHECK(max_diff(g_adapted.at("grad." + pre + "lora_B.weight"), want_b) <= 1e-4 * std::max(1.0, max_abs(want_b)));
      CHECK(max_diff(g_adapted.at("grad." + pre + "lora_A.weight"), want_a) <= 1e-4 * std::max(1.0, max_abs(want_a)));
      // The base weight's own gradient is the merged one's (W enters the same way).
      CHECK(max_diff(g_adapted.at("grad." + pre + "weight"), dw) <= 1e-4 * std::max(1.0, max_abs(dw)));
    }
  }
}

TEST_CASE("LoRA's split: adapters trained, every other parameter frozen with no gradient formed") {
  const Case c = cases().front();  // causal_llama: q/k/v/o, gate/up/down, biases, qk-norm
  auto m = make_model(c);
  dew::LoraOptions o;
  o.rank = 2;
  o.alpha = 2;
  o.targets = {"*.q_proj", "*.v_proj"};
  o.train = {"*norm.weight"};
  const auto adapted = dew::attach_lora(*m, o, 1);
  CHECK(adapted.size() == 4);  // 2 layers x (q, v)
  auto [trained, frozen] = dew::split_frozen(m->named_parameters(), o, {});
  size_t adapters = 0, norms = 0;
  for (const auto& [n, t] : trained) {
    adapters += dew::is_lora_parameter(n);
    norms += n.find("norm.weight") != std::string::npos;
    CHECK(t.requires_grad());
  }
  CHECK(adapters == 8);
  CHECK(adapters + norms == trained.size());
  for (const auto& [n, t] : frozen) CHECK(!t.requires_grad());
  {
    dew::NoGradGuard ng;
    for (auto& [name, p] : m->named_parameters())
      if (dew::is_lora_parameter(name)) p.copy_(normal(p.shape(), 0.2f, 3));
  }
  const Tensor y = m->forward({{"tokens", ints({2, 7}, 24, 1)}});
  dew::sum(y).backward();
  for (const auto& [n, t] : frozen) CHECK_MESSAGE(!t.grad().defined(), n);
  for (const auto& [n, t] : trained) CHECK_MESSAGE(t.grad().defined(), n);

  // Plain freezing: the globs' parameters frozen, the rest trained.
  auto m2 = make_model(c);
  auto [t2, f2] = dew::split_frozen(m2->named_parameters(), {}, {"model.embed_tokens.*", "model.layers.0.*"});
  CHECK(!f2.empty());
  for (const auto& [n, t] : f2) CHECK((n.rfind("model.embed_tokens.", 0) == 0 || n.rfind("model.layers.0.", 0) == 0));
  for (const auto& [n, t] : t2) CHECK(n.rfind("model.layers.0.", 0) != 0);
}

TEST_CASE("LoRA refusals: targets that match nothing, a head, a glob that freezes nothing or everything") {
  const Case c = cases().front();
  dew::LoraOptions o;
  o.rank = 2;
  o.alpha = 2;
  o.targets = {"*.q_prj"};
  CHECK_THROWS_WITH_AS(dew::attach_lora(*make_model(c), o, 1),
                       doctest::Contains("matches none of the model's linear layers: model.layers.0.self_attn.q_proj"),
                       dew::UsageError);
  auto gemma = make_model(cases()[1]);  // untied: an lm_head Linear
  o.targets = {"*head*"};
  CHECK_THROWS_WITH_AS(dew::attach_lora(*gemma, o, 1), doctest::Contains("'lm_head' is a head"), dew::UsageError);
  auto m = make_model(c);
  CHECK_THROWS_WITH_AS(dew::split_frozen(m->named_parameters(), {}, {"model.embed.*"}),
                       doctest::Contains("'model.embed.*' matches no parameter"), dew::UsageError);
  CHECK_THROWS_WITH_AS(dew::split_frozen(m->named_parameters(), {}, {"*"}),
                       doctest::Contains("nothing is left to train"), dew::UsageError);
}
