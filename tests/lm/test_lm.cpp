// tests/lm/test_lm.cpp — the language-model slice on the ref backend: the causal_transformer's
// Hugging Face parameter names, causality, KV-cached decoding against the full forward, gradients of
// every option family, the sampling chain (dew/generate.hpp), stop strings, the lm objective's step /
// validate / sample artifact, and a tiny end-to-end dew::train run whose loss falls.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"

using dew::Tensor;
namespace fs = std::filesystem;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref")) {
      const auto dirs = dew::Registry::default_plugin_dirs();
      reg.discover(dirs, {"ref", "causal_transformer", "lm", "synthetic"});
      for (const std::string& d : dirs)  // the tokens source, when it is built
        if (fs::exists(fs::path(d) / "dew_tokens.so")) {
          reg.load((fs::path(d) / "dew_tokens.so").string());
          break;
        }
    }
    dew::BackendPtr b = dew::create_backend("ref");
    dew::set_default_backend(b);
    return b;
  }();
  dew::set_default_backend(be);
  return be;
}

std::map<std::string, std::string> tiny(std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> kv{{"vocab_size", "13"}, {"dim", "16"}, {"n_layers", "2"}, {"n_heads", "2"}};
  for (auto& [k, v] : extra) kv[k] = v;
  return kv;
}

std::shared_ptr<dew::Model> make_model(std::map<std::string, std::string> kv, uint64_t seed = 1) {
  ref();
  dew::Options o(std::move(kv), "model");
  auto m = dew::Registry::global().create<dew::Model>("causal_transformer", o);
  o.check_all_used();
  m->initialize(seed);
  return m;
}

std::vector<std::string> names_of(const dew::Model& m) {
  std::vector<std::string> out;
  for (auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

Tensor tokens(const std::vector<int32_t>& ids, int64_t b = 1) {
  return Tensor::from_ints(ids, {b, int64_t(ids.size()) / b}, ref());
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Rows [t0, t1) of logits [1, T, V] as floats.
std::vector<float> rows(const Tensor& logits, int64_t t0, int64_t t1) {
  const int64_t t = logits.shape()[1], v = logits.shape()[2];
  return dew::reshape(logits, {t, v}).slice0(t0, t1).to_floats();
}

}  // namespace

TEST_CASE("causal_transformer: Hugging Face parameter names, tied and untied, with qk_norm") {
  auto m = make_model(tiny());
  std::vector<std::string> expect{"model.embed_tokens.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
      expect.push_back(p + s);
  }
  expect.push_back("model.norm.weight");
  CHECK(names_of(*m) == expect);

  auto untied = make_model(tiny({{"tie_embeddings", "false"}}));
  auto e2 = expect;
  e2.push_back("lm_head.weight");
  CHECK(names_of(*untied) == e2);

  auto qk = make_model(tiny({{"qk_norm", "true"}, {"n_kv_heads", "1"}}));
  const auto n = names_of(*qk);
  const std::set<std::string> all(n.begin(), n.end());
  CHECK(all.count("model.layers.1.self_attn.q_norm.weight"));
  CHECK(all.count("model.layers.0.self_attn.k_norm.weight"));
  CHECK(n.size() == expect.size() + 4);
  for (auto& [name, t] : qk->named_parameters()) {
    if (name == "model.layers.0.self_attn.k_proj.weight") CHECK(t.shape() == dew::Shape{8, 16});  // 1 kv head x 8
    if (name == "model.layers.0.self_attn.q_norm.weight") CHECK(t.shape() == dew::Shape{8});
  }
  // default mlp_hidden = 8 * 16 / 3 rounded up to 64
  for (auto& [name, t] : m->named_parameters())
    if (name == "model.layers.0.mlp.up_proj.weight") CHECK(t.shape() == dew::Shape{64, 16});
  const auto d = m->describe();
  CHECK(d.at("hidden_size") == "16");
  CHECK(d.at("num_hidden_layers") == "2");
  CHECK(d.at("num_key_value_heads") == "2");
  CHECK(d.at("intermediate_size") == "64");
  CHECK(d.at("tie_word_embeddings") == "true");
  CHECK(m->flops_per_sample() > 0);
}

TEST_CASE("causal_transformer: init is N(0, 0.02) with output projections scaled by 1/sqrt(2L)") {
  auto m = make_model(tiny({{"dim", "64"}, {"n_layers", "2"}, {"vocab_size", "200"}}));
  auto stdev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    const auto v = t.to_floats();
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / double(v.size());
    return std::sqrt(s2 / double(v.size()) - mean * mean);
  };
  for (auto& [name, t] : m->named_parameters()) {
    if (name == "model.embed_tokens.weight" || name == "model.layers.0.self_attn.q_proj.weight")
      CHECK(stdev(t) == doctest::Approx(0.02).epsilon(0.1));
    if (name == "model.layers.1.mlp.down_proj.weight" || name == "model.layers.0.self_attn.o_proj.weight")
      CHECK(stdev(t) == doctest::Approx(0.02 / 2.0).epsilon(0.1));
    if (name == "model.norm.weight") CHECK(t.to_floats()[0] == 1.0f);
  }
}

TEST_CASE("causal_transformer: causal (changing token t+1 leaves logits at <= t unchanged)") {
  for (auto extra : std::vector<std::map<std::string, std::string>>{
           {}, {{"sliding_window", "3"}, {"layer_pattern", "local,global"}, {"qk_norm", "true"}}}) {
    auto m = make_model(tiny(extra), 7);
    dew::NoGradGuard ng;
    const std::vector<int32_t> a{1, 5, 2, 9, 3, 3, 0, 12}, b{1, 5, 2, 9, 7, 11, 4, 2};
    const Tensor la = m->forward({{"tokens", tokens(a)}}), lb = m->forward({{"tokens", tokens(b)}});
    CHECK(la.shape() == dew::Shape{1, 8, 13});
    CHECK(la.dtype() == dew::DType::f32);
    CHECK(max_diff(rows(la, 0, 4), rows(lb, 0, 4)) == 0.0);
    CHECK(max_diff(rows(la, 4, 5), rows(lb, 4, 5)) > 1e-6);
  }
}

TEST_CASE("causal_transformer: KV-cached decode equals the full forward") {
  const std::vector<std::map<std::string, std::string>> configs{
      {},
      {{"n_kv_heads", "1"}, {"qk_norm", "true"}},
      {{"sliding_window", "3"}, {"layer_pattern", "local,global"}, {"attn_softcap", "5"}, {"final_softcap", "3"}},
      {{"partial_rotary", "0.5"},
       {"n_heads", "4"},
       {"n_kv_heads", "2"},
       {"head_dim", "8"},
       {"mlp", "geglu"},
       {"norm_offset", "1"},
       {"embed_scale", "true"},
       {"tie_embeddings", "false"}},
      {{"mlp", "gelu"}, {"rope_theta", "500"}},
  };
  for (const auto& extra : configs) {
    CAPTURE(extra.size());
    auto m = make_model(tiny(extra), 3);
    auto* dec = dynamic_cast<dew::CausalDecoder*>(m.get());
    REQUIRE(dec != nullptr);
    dew::NoGradGuard ng;
    const std::vector<int32_t> seq{4, 1, 7, 7, 2, 12, 0, 5};
    const Tensor full = m->forward({{"tokens", tokens(seq)}});
    auto cache = dec->make_cache(1, 8);
    const Tensor pre = dec->forward_cached(tokens({seq.begin(), seq.begin() + 5}), *cache);
    CHECK(pre.shape() == dew::Shape{1, 5, 13});
    CHECK(max_diff(rows(pre, 0, 5), rows(full, 0, 5)) < 1e-4);
    for (int64_t t = 5; t < 8; ++t) {
      const Tensor one = dec->forward_cached(tokens({seq[size_t(t)]}), *cache);
      CHECK(one.shape() == dew::Shape{1, 1, 13});
      CHECK(max_diff(one.to_floats(), rows(full, t, t + 1)) < 1e-4);
    }
    CHECK(cache->length() == 8);
    CHECK_THROWS_AS(dec->forward_cached(tokens({1}), *cache), dew::Error);  // full
  }
  // A batch of 2 through one cache matches per-row full forwards.
  auto m = make_model(tiny({{"n_kv_heads", "1"}}), 5);
  auto* dec = dynamic_cast<dew::CausalDecoder*>(m.get());
  dew::NoGradGuard ng;
  const std::vector<int32_t> two{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [2, 6]
  const Tensor full = m->forward({{"tokens", tokens(two, 2)}});
  auto cache = dec->make_cache(2, 6);
  dec->forward_cached(tokens({1, 2, 3, 4, 7, 8, 9, 10}, 2), *cache);
  const Tensor next = dec->forward_cached(tokens({5, 11}, 2), *cache);
  const auto fv = full.to_floats(), nv = next.to_floats();
  for (int r = 0; r < 2; ++r)
    for (int v = 0; v < 13; ++v) CHECK(std::fabs(nv[size_t(r * 13 + v)] - fv[size_t((r * 6 + 4) * 13 + v)]) < 1e-4);
}

TEST_CASE("causal_transformer on the cpu backend (when built): cached decode equals the full forward and ref") {
  ref();
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "cpu"))
    for (const std::string& d : dew::Registry::default_plugin_dirs())
      if (fs::exists(fs::path(d) / "dew_cpu.so")) {
        reg.load((fs::path(d) / "dew_cpu.so").string());
        break;
      }
  if (!reg.contains("backend", "cpu")) return;
  dew::BackendPtr cpu = dew::create_backend("cpu");
  for (const auto& extra : std::vector<std::map<std::string, std::string>>{
           {{"n_kv_heads", "1"}, {"qk_norm", "true"}},
           {{"sliding_window", "3"}, {"layer_pattern", "local,global"}, {"attn_softcap", "5"}}}) {
    auto on_ref = make_model(tiny(extra), 3);
    dew::set_default_backend(cpu);
    dew::Options o(tiny(extra), "model");
    auto m = reg.create<dew::Model>("causal_transformer", o);
    m->initialize(3);
    auto* dec = dynamic_cast<dew::CausalDecoder*>(m.get());
    REQUIRE(dec);
    dew::NoGradGuard ng;
    const std::vector<int32_t> seq{4, 1, 7, 7, 2, 12, 0, 5};
    const Tensor ids = Tensor::from_ints(seq, {1, 8}, cpu);
    const Tensor full = m->forward({{"tokens", ids}});
    dew::set_default_backend(ref());
    CHECK(max_diff(full.to_floats(), on_ref->forward({{"tokens", tokens(seq)}}).to_floats()) < 1e-4);
    auto cache = dec->make_cache(1, 8);
    const Tensor pre = dec->forward_cached(Tensor::from_ints({4, 1, 7, 7, 2}, {1, 5}, cpu), *cache);
    CHECK(max_diff(rows(pre, 0, 5), rows(full, 0, 5)) < 1e-4);
    for (int64_t t = 5; t < 8; ++t) {
      const Tensor one = dec->forward_cached(Tensor::from_ints({seq[size_t(t)]}, {1, 1}, cpu), *cache);
      CHECK(max_diff(one.to_floats(), rows(full, t, t + 1)) < 1e-4);
    }
  }
  dew::set_default_backend(ref());
}

TEST_CASE("causal_transformer: GQA, sliding window, softcaps, dropout: a gradient reaches every parameter") {
  const std::vector<std::map<std::string, std::string>> configs{
      {{"n_heads", "4"}, {"n_kv_heads", "2"}, {"head_dim", "4"}},
      {{"sliding_window", "2"},
       {"layer_pattern", "local,global"},
       {"attn_softcap", "10"},
       {"final_softcap", "5"},
       {"qk_norm", "true"},
       {"tie_embeddings", "false"}},
      {{"mlp", "gelu"}, {"dropout", "0.1"}, {"norm_offset", "1"}},
  };
  for (const auto& extra : configs) {
    auto m = make_model(tiny(extra), 11);
    m->set_training(true);
    dew::Batch in{{"tokens", tokens({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, 2)}};
    m->set_random_key({7, 1});
    Tensor logits = m->forward(in);
    Tensor loss = dew::cross_entropy(dew::reshape(logits, {10, 13}),
                                     Tensor::from_ints({1, 4, 1, 5, 9, 6, 5, 3, 5, 8}, {10}, ref()));
    CHECK(std::isfinite(loss.item()));
    loss.backward();
    for (auto& [name, p] : m->named_parameters()) {
      CAPTURE(name);
      REQUIRE(p.grad().defined());
      double s = 0;
      for (float g : p.grad().to_floats()) s += std::fabs(g);
      CHECK(s > 0);
    }
  }
}

TEST_CASE("causal_transformer: option errors are usage errors") {
  CHECK_THROWS_AS(make_model({{"dim", "16"}}), dew::UsageError);  // no vocab_size
  CHECK_THROWS_AS(make_model(tiny({{"n_kv_heads", "3"}})), dew::UsageError);
  CHECK_THROWS_AS(make_model(tiny({{"mlp", "relu6"}})), dew::UsageError);
  CHECK_THROWS_AS(make_model(tiny({{"layer_pattern", "local"}})), dew::UsageError);  // no window
  CHECK_THROWS_AS(make_model(tiny({{"layer_pattern", "global,weird"}})), dew::UsageError);
}

// ---------------------------------------------------------------- sampling

TEST_CASE("sample_token: greedy, top_k = 1, small top_p, seeds, penalties, min_p") {
  const std::vector<float> logits{0.5f, 2.0f, 1.9f, -1.0f, 1.0f};
  dew::SamplingParams p;
  p.temperature = 0;
  CHECK(dew::sample_token(logits.data(), 5, p, {}, 0) == 1);
  p = {};
  p.top_k = 1;
  for (uint64_t i = 0; i < 20; ++i) CHECK(dew::sample_token(logits.data(), 5, p, {}, i) == 1);
  p = {};
  p.top_p = 0.05f;
  for (uint64_t i = 0; i < 20; ++i) CHECK(dew::sample_token(logits.data(), 5, p, {}, i) == 1);

  // The same seed reproduces; another seed gives another sequence; all ids are drawn over many draws.
  p = {};
  p.seed = 42;
  std::vector<int32_t> a, b, c;
  for (uint64_t i = 0; i < 200; ++i) {
    a.push_back(dew::sample_token(logits.data(), 5, p, {}, i));
    b.push_back(dew::sample_token(logits.data(), 5, p, {}, i));
  }
  p.seed = 43;
  for (uint64_t i = 0; i < 200; ++i) c.push_back(dew::sample_token(logits.data(), 5, p, {}, i));
  CHECK(a == b);
  CHECK(a != c);
  CHECK(std::set<int32_t>(a.begin(), a.end()).size() == 5);
  // Frequencies follow the softmax.
  p.seed = 1;
  std::vector<int> count(5, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[size_t(dew::sample_token(logits.data(), 5, p, {}, uint64_t(i)))];
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  for (int k = 0; k < 5; ++k)
    CHECK(double(count[size_t(k)]) / n == doctest::Approx(std::exp(double(logits[size_t(k)])) / z).epsilon(0.08));

  // Repetition penalty lowers a repeated token's probability (positive and negative logits).
  p = {};
  const auto base = dew::sampling_distribution(logits.data(), 5, p, {1, 3});
  p.repetition_penalty = 1.5f;
  const auto pen = dew::sampling_distribution(logits.data(), 5, p, {1, 3, 1});
  CHECK(pen[1] < base[1]);
  CHECK(pen[3] < base[3]);
  CHECK(pen[2] > base[2]);
  p.temperature = 0;
  CHECK(dew::sample_token(logits.data(), 5, p, {1}, 0) == 2);  // 2.0 / 1.5 < 1.9

  // min_p: tokens below min_p * max are dropped.
  p = {};
  p.min_p = 0.5f;  // keeps e^2.0, e^1.9 (ratio 0.905), e^1.0 (0.37) dropped
  const auto mp = dew::sampling_distribution(logits.data(), 5, p, {});
  CHECK(mp[1] > 0);
  CHECK(mp[2] > 0);
  CHECK(mp[0] == 0);
  CHECK(mp[3] == 0);
  CHECK(mp[4] == 0);
  CHECK(mp[1] + mp[2] == doctest::Approx(1.0));
  // top_k = 2 keeps the two largest; temperature sharpens.
  p = {};
  p.top_k = 2;
  const auto tk = dew::sampling_distribution(logits.data(), 5, p, {});
  CHECK(tk[0] + tk[3] + tk[4] == 0);
  p = {};
  p.temperature = 0.1f;
  CHECK(dew::sampling_distribution(logits.data(), 5, p, {})[1] > 0.7);
  // A temperature so small that logit / T overflows: still the argmax alone (not every positive logit as a tie at
  // +inf, which the first id would win).
  p.temperature = 1e-30f;
  CHECK(dew::sampling_distribution(logits.data(), 5, p, {})[1] == 1.0);
  CHECK(dew::sample_token(logits.data(), 5, p, {}, 3) == 1);

  dew::SamplingParams bad;
  bad.top_p = 0;
  CHECK_THROWS_AS(dew::validate(bad), dew::UsageError);
  bad = {};
  bad.temperature = -1;
  CHECK_THROWS_AS(dew::validate(bad), dew::UsageError);
}

// The chain as first written: rank every token with a stable sort, then walk the ranked list (the reference the
// selection-based chain of sampling.cpp must agree with).
struct FullSortChain {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};
FullSortChain full_sort_chain(const std::vector<float>& logits, const dew::SamplingParams& p,
                              const std::vector<int32_t>& history) {
  std::vector<double> z(logits.begin(), logits.end());
  std::set<int32_t> seen(history.begin(), history.end());
  for (int32_t t : seen)
    z[size_t(t)] = z[size_t(t)] < 0 ? z[size_t(t)] * p.repetition_penalty : z[size_t(t)] / p.repetition_penalty;
  for (double& v : z) v = std::isnan(v / p.temperature) ? -INFINITY : v / p.temperature;
  FullSortChain r;
  r.ids.resize(z.size());
  for (size_t i = 0; i < z.size(); ++i) r.ids[i] = int32_t(i);
  std::stable_sort(r.ids.begin(), r.ids.end(), [&](int32_t a, int32_t b) { return z[size_t(a)] > z[size_t(b)]; });
  size_t n = p.top_k > 0 ? std::min(z.size(), size_t(p.top_k)) : z.size();
  const double top = z[size_t(r.ids[0])];
  double total = 0;
  for (size_t i = 0; i < n; ++i)
    total += r.probs.emplace_back(std::isinf(top) ? (i == 0) : std::exp(z[size_t(r.ids[i])] - top));
  for (double& q : r.probs) q /= total;
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n && (cum += r.probs[keep++]) < double(p.top_p) - 1e-12) {
    }
    n = keep;
  }
  size_t keep = 1;
  while (keep < n && r.probs[keep] >= double(p.min_p) * r.probs[0]) ++keep;
  r.probs.resize(keep);
  r.ids.resize(keep);
  total = 0;
  for (double q : r.probs) total += q;
  for (double& q : r.probs) q /= total;
  return r;
}

TEST_CASE("sample_token: the chain without a full sort draws what a full sort draws, 50,257 tokens") {
  // Logits of a real vocabulary's size: flat (most tokens matter to top_p and the draw) and peaked, with ties (equal
  // logits, the largest among them) and NaN / -inf entries; every filter alone and together.
  std::mt19937 rng(7);
  for (const double spread : {0.3, 4.0}) {
    std::normal_distribution<float> nd(0.0f, float(spread));
    std::vector<float> logits(50257);
    for (float& v : logits) v = nd(rng);
    const float high = *std::max_element(logits.begin(), logits.end());
    for (size_t i : {17, 5000, 40000}) logits[i] = high;               // a three-way tie at the top
    for (size_t i = 100; i < 50257; i += 997) logits[i] = logits[99];  // ties in the body
    logits[321] = NAN;
    logits[654] = -INFINITY;
    const std::vector<int32_t> history{17, 99, 2024, 2024, 3};
    for (const float temperature : {0.7f, 1.3f})
      for (const int64_t top_k : {int64_t(0), int64_t(1), int64_t(50), int64_t(5000), int64_t(60000)})
        for (const float top_p : {1.0f, 0.9f, 0.2f})
          for (const float min_p : {0.0f, 0.05f})
            for (const float penalty : {1.0f, 1.3f}) {
              dew::SamplingParams p;
              p.temperature = temperature;
              p.top_k = top_k;
              p.top_p = top_p;
              p.min_p = min_p;
              p.repetition_penalty = penalty;
              p.seed = 11;
              CAPTURE(spread);
              CAPTURE(temperature);
              CAPTURE(top_k);
              CAPTURE(top_p);
              CAPTURE(min_p);
              CAPTURE(penalty);
              const FullSortChain r = full_sort_chain(logits, p, history);
              const std::vector<double> dist = dew::sampling_distribution(logits.data(), 50257, p, history);
              std::vector<double> want_dist(logits.size(), 0.0);
              for (size_t i = 0; i < r.ids.size(); ++i) want_dist[size_t(r.ids[i])] = r.probs[i];
              double worst = 0;
              for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::abs(dist[i] - want_dist[i]));
              CHECK(worst < 1e-12);
              int mismatched = 0;
              for (uint64_t draw = 0; draw < 16; ++draw) {
                // The draw: philox::uniform on the chain's stream (sampling.cpp's kSampleStream, "sample"), walked
                // down the ranked list.
                const double u = double(dew::philox::uniform(p.seed, 0x73616d706c650000ull ^ 5, draw));
                double cum = 0;
                int32_t want = r.ids.back();
                for (size_t i = 0; i < r.ids.size(); ++i)
                  if (u < (cum += r.probs[i])) {
                    want = r.ids[i];
                    break;
                  }
                mismatched += dew::sample_token(logits.data(), 50257, p, history, draw, 5) != want;
              }
              CHECK(mismatched == 0);
            }
  }
}

TEST_CASE("generate: a scripted decoder, eos, max_new_tokens, stop strings trimmed, KV use") {
  ref();  // the default backend, on which generate builds its token tensors (the case runs alone under ctest)
  // The decoder's logits favour the token after the last one fed ("abcdef..." in bytes).
  int64_t fed = 0;
  std::vector<int64_t> calls;
  dew::StartFn start = [&](int64_t capacity) -> dew::DecodeFn {
    CHECK(capacity > 0);
    return [&](const Tensor& t) {
      const int64_t n = t.shape()[1];
      calls.push_back(n);
      fed += n;
      const std::vector<int32_t> ids = t.to_ints();
      std::vector<float> out(size_t(n * 256), 0.0f);
      for (int64_t i = 0; i < n; ++i) out[size_t(i * 256 + (ids[size_t(i)] + 1) % 256)] = 10.0f;
      return Tensor::from_vector(out, {1, n, 256}, ref());
    };
  };
  auto tok = dew::make_byte_tokenizer();
  dew::SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = 5;
  auto g = dew::generate(start, {{'a'}, {'x', 'y'}}, p, tok.get());
  REQUIRE(g.size() == 2);
  CHECK(g[0].text == "bcdef");
  CHECK(g[0].finish_reason == "length");
  CHECK(g[1].text == "z{|}~");
  // prefill once, then one token per call (the last sampled token is never fed)
  CHECK(calls == std::vector<int64_t>{1, 1, 1, 1, 1, 2, 1, 1, 1, 1});

  p.stop = {"de", "zzz"};
  g = dew::generate(start, {{'a'}}, p, tok.get());
  CHECK(g[0].text == "bc");
  CHECK(g[0].tokens == std::vector<int32_t>{'b', 'c'});
  CHECK(g[0].finish_reason == "stop");

  p.stop = {};
  p.eos_id = 'd';
  g = dew::generate(start, {{'a'}}, p, tok.get());
  CHECK(g[0].text == "bc");
  CHECK(g[0].finish_reason == "eos");

  // A context of 4: the cache rolls over to the last 2 tokens when full.
  p.eos_id = -1;
  p.max_new_tokens = 6;
  calls.clear();
  g = dew::generate(start, {{'a', 'b'}}, p, tok.get(), 4);
  CHECK(g[0].text == "cdefgh");
  CHECK(calls == std::vector<int64_t>{2, 1, 1, 2, 1, 1});
  calls.clear();
  p.max_new_tokens = 1;
  g = dew::generate(start, {{'a', 'b', 'c', 'd', 'e', 'f'}}, p, tok.get(), 4);  // a long prompt keeps its last 4
  CHECK(g[0].text == "g");
  CHECK(calls == std::vector<int64_t>{4});
  // Prompts (and refills) in chunks of prefill_chunk tokens, cut at its multiples; the last chunk draws.
  calls.clear();
  p.max_new_tokens = 3;
  p.prefill_chunk = 3;
  g = dew::generate(start, {{'a', 'b', 'c', 'd', 'e', 'f', 'g'}}, p, tok.get());
  CHECK(g[0].text == "hij");
  CHECK(calls == std::vector<int64_t>{3, 3, 1, 1, 1});
  calls.clear();
  p.max_new_tokens = 4;
  g = dew::generate(start, {{'a', 'b', 'c', 'd', 'e'}}, p, tok.get(), 6);  // refill of 3 at the 3rd token
  CHECK(g[0].text == "fghi");
  CHECK(calls == std::vector<int64_t>{3, 2, 1, 3, 1});
  p.prefill_chunk = -1;
  CHECK_THROWS_AS(dew::generate(start, {{'a'}}, p, tok.get()), dew::UsageError);
  p.prefill_chunk = dew::kPrefillChunk;
  CHECK(dew::find_stop("hello world", {"wor", "lo"}) == 3);
  p.stop = {"x"};
  CHECK_THROWS_AS(dew::generate(start, {{'a'}}, p, nullptr), dew::UsageError);
}

TEST_CASE("generate: ids past the tokenizer's vocabulary (a padded head) are never drawn") {
  ref();
  // 300 logits, the largest at id 280 (no byte has it), the next at 'b'.
  dew::StartFn start = [&](int64_t) -> dew::DecodeFn {
    return [&](const Tensor& t) {
      std::vector<float> out(300, 0.0f);
      out[280] = 9.0f;
      out['b'] = 5.0f;
      return Tensor::from_vector(out, {1, 1, 300}, ref());
    };
  };
  auto tok = dew::make_byte_tokenizer();
  dew::SamplingParams p;
  p.max_new_tokens = 4;
  for (const float temperature : {0.0f, 1.0f}) {
    p.temperature = temperature;
    const auto g = dew::generate(start, {{'a'}}, p, tok.get());
    for (int32_t id : g[0].tokens) CHECK(id < 256);
    CHECK(g[0].text.size() == 4);
  }
  p.temperature = 0;
  CHECK(dew::generate(start, {{'a'}}, p, nullptr)[0].tokens == std::vector<int32_t>(4, 280));  // no tokenizer: any id
}

TEST_CASE("generate_text on the causal_transformer: seeded runs reproduce, greedy equals a full-forward argmax") {
  auto m = make_model({{"vocab_size", "256"}, {"dim", "16"}, {"n_layers", "2"}, {"n_heads", "2"}}, 9);
  auto* dec = dynamic_cast<dew::CausalDecoder*>(m.get());
  REQUIRE(dec);
  auto tok = dew::make_byte_tokenizer();
  dew::SamplingParams p;
  p.max_new_tokens = 12;
  p.seed = 5;
  const auto a = dew::generate_text(*dec, *tok, {"The ", "A longer prompt"}, p);
  const auto b = dew::generate_text(*dec, *tok, {"The ", "A longer prompt"}, p);
  CHECK(a[0].tokens == b[0].tokens);
  CHECK(a[1].tokens == b[1].tokens);
  CHECK(a[0].tokens.size() == 12);
  p.temperature = 0;
  const auto g = dew::generate_text(*dec, *tok, {"Hi"}, p);
  std::vector<int32_t> seq{'H', 'i'};
  dew::NoGradGuard ng;
  for (int i = 0; i < 4; ++i) {
    const Tensor l = m->forward({{"tokens", tokens(seq)}});
    const int64_t t = int64_t(seq.size());
    seq.push_back(dew::argmax(dew::reshape(l, {t, 256}).slice0(t - 1, t)).to_ints()[0]);
  }
  CHECK(std::vector<int32_t>(g[0].tokens.begin(), g[0].tokens.begin() + 4) ==
        std::vector<int32_t>(seq.begin() + 2, seq.end()));
}

// ---------------------------------------------------------------- the lm objective

namespace {

// Deterministic "text": a repeated pattern of tokens.
class PatternSource final : public dew::DataSource {
 public:
  PatternSource(int64_t n, int64_t s) : n_(n), s_(s) {}
  int64_t size() const override { return n_; }
  dew::Record get(int64_t i) const override {
    dew::HostArray a = dew::HostArray::make(dew::DType::i32, {s_ + 1});
    for (int64_t k = 0; k <= s_; ++k) a.as<int32_t>()[k] = int32_t((i + k) % 7);
    return {{"text", a}};
  }
  std::string identity() const override { return "test:pattern"; }

 private:
  int64_t n_, s_;
};

}  // namespace

TEST_CASE("lm objective: build fills the model keys, step and validate") {
  ref();
  dew::Config cfg = dew::Config::parse_ini(
      "[objective]\nplugin = lm\nsample_tokens = 5\nvocab_size = 7\n"
      "[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n"
      "[data]\nbatch_size = 4\n");
  auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
  PatternSource src(10, 8);
  dew::ObjectiveContext ctx;
  ctx.config = &cfg;
  ctx.backend = ref();
  ctx.seed = 1;
  ctx.train_source = &src;
  obj->build(ctx);
  CHECK(cfg.section("model").values().at("vocab_size") == "7");
  CHECK(cfg.section("model").values().at("max_seq_len") == "8");
  CHECK(obj->batch_fields() == std::vector<std::string>{"text"});
  const auto params = obj->parameters();
  CHECK(params.front().first == "model.embed_tokens.weight");  // the HF names, unprefixed
  CHECK(params.back().first == "model.norm.weight");
  CHECK(obj->train_flops_per_sample() > 0);
  CHECK(obj->primary_metric() == "ce");

  std::vector<int32_t> text;
  for (int64_t i = 0; i < 4; ++i) {
    const dew::Record rec = src.get(i);
    const int32_t* p = rec.at("text").as<int32_t>();
    text.insert(text.end(), p, p + 9);
  }
  dew::Batch batch{{"text", Tensor::from_ints(text, {4, 9}, ref())}};
  dew::StepResult r = obj->step(batch, {0, 0, 1});
  // The trained-token count, ce and token accuracy stay on the device (the trainer's one transfer).
  CHECK(r.device_tokens.item() == 32);
  CHECK(r.samples == 4);
  CHECK(r.device_metrics.at("ce").item() == doctest::Approx(std::log(7.0)).epsilon(0.05));  // near-uniform at init
  CHECK(r.device_metrics.at("ce").item() == doctest::Approx(r.loss.item()));
  const double accuracy = r.device_metrics.at("token_accuracy").item();
  CHECK((accuracy >= 0 && accuracy <= 1));
  r.loss.backward();

  auto shared = std::shared_ptr<dew::DataSource>(&src, [](dew::DataSource*) {});
  dew::LoaderConfig lc;
  lc.batch_size = 3;
  lc.shuffle = false;
  dew::DataLoader loader(shared, lc);
  const dew::ValidationResult vr = obj->validate(loader, {12, 0, 1});
  CHECK(vr.metrics.at("tokens") == 80);  // 10 windows x 8 targets, each once
  CHECK(vr.metrics.at("perplexity") == doctest::Approx(std::exp(vr.metrics.at("ce"))));
  CHECK(vr.metrics.at("bits_per_byte") == doctest::Approx(vr.metrics.at("ce") / std::log(2.0)));
  REQUIRE(vr.artifacts.size() == 1);
  CHECK(vr.artifacts[0].file_name == "sample-step-00000012.txt");

  // pad_id: targets equal to it are not counted.
  dew::Config cfg2 = dew::Config::parse_ini(
      "[objective]\nplugin = lm\npad_id = 0\nvocab_size = 7\n[model]\nplugin = causal_transformer\ndim = 16\n"
      "n_layers = 1\nn_heads = 2\n");
  auto obj2 = dew::Registry::global().create<dew::Objective>("lm", cfg2.section("objective"));
  obj2->build(ctx = dew::ObjectiveContext{&cfg2, ref(), 1, &src});
  r = obj2->step(batch, {0, 0, 1});
  int64_t zeros = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if (i % 9 != 0 && text[i] == 0) ++zeros;
  CHECK(r.device_tokens.item() == 32 - zeros);
}

TEST_CASE("lm objective: the head fused into the loss (fused_head) gives the unfused step and validation") {
  // fused_head = true runs dew::linear_cross_entropy over chunks of 3 rows (fused_head_mb: 3 rows of 7 f32 logits);
  // false the model's logits and cross_entropy. Same loss, token accuracy, parameter gradients (tied and untied
  // heads, with a final softcap and a pad_id) and validation metrics, up to the chunks' summation order.
  ref();
  PatternSource src(10, 8);
  std::vector<int32_t> text;
  for (int64_t i = 0; i < 4; ++i) {
    const dew::Record rec = src.get(i);
    const int32_t* p = rec.at("text").as<int32_t>();
    text.insert(text.end(), p, p + 9);
  }
  for (const std::string model_extra : {"", "tie_embeddings = false\nfinal_softcap = 3\n"}) {
    CAPTURE(model_extra);
    std::vector<std::vector<float>> grads[2];
    double loss[2], accuracy[2];
    dew::ValidationResult vr[2];
    std::ostringstream three_rows;  // 3 rows of 7 f32 logits, in MiB, to the last digit
    three_rows.precision(17);
    three_rows << 3 * 7 * 4 / 1048576.0;
    const std::string mb_of_three_rows = three_rows.str();
    for (int fused = 0; fused < 2; ++fused) {
      dew::Config cfg = dew::Config::parse_ini(
          std::string("[objective]\nplugin = lm\nsample_tokens = 0\nvocab_size = 7\npad_id = 0\nfused_head = ") +
          (fused ? "true" : "false") + "\nfused_head_mb = " + mb_of_three_rows +
          "\n[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n" + model_extra);
      auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
      auto profiler = std::make_shared<dew::ProfilingBackend>(ref());  // counts the cross_entropy calls
      dew::ObjectiveContext ctx{&cfg, profiler, 1, &src};
      obj->build(ctx);
      profiler->start();
      dew::StepResult r = obj->step({{"text", Tensor::from_ints(text, {4, 9}, profiler)}}, {0, 0, 1});
      profiler->stop();
      // one call a chunk: 32 targets in chunks of 3 rows (fused), or one over the [32, 7] logits
      CHECK(profiler->calls("cross_entropy") == (fused ? 11 : 1));
      loss[fused] = r.loss.item();
      accuracy[fused] = r.device_metrics.at("token_accuracy").item();
      r.loss.backward();
      for (auto& [name, t] : obj->parameters()) {
        REQUIRE_MESSAGE(t.grad().defined(), name);
        grads[fused].push_back(t.grad().to_floats());
      }
      auto shared = std::shared_ptr<dew::DataSource>(&src, [](dew::DataSource*) {});
      dew::LoaderConfig lc;
      lc.batch_size = 3;
      lc.shuffle = false;
      dew::DataLoader loader(shared, lc);
      vr[fused] = obj->validate(loader, {1, 0, 1});
    }
    CHECK(loss[1] == doctest::Approx(loss[0]).epsilon(1e-6));
    CHECK(accuracy[1] == accuracy[0]);
    REQUIRE(grads[0].size() == grads[1].size());
    for (size_t k = 0; k < grads[0].size(); ++k) {
      CHECK(max_diff(grads[0][k], grads[1][k]) <= 1e-6);
      double scale = 0;
      for (float g : grads[0][k]) scale = std::max(scale, double(std::fabs(g)));
      CHECK_MESSAGE(scale > 0, "parameter ", k, " has no gradient");
    }
    for (const char* m : {"ce", "token_accuracy", "tokens"})
      CHECK(vr[1].metrics.at(m) == doctest::Approx(vr[0].metrics.at(m)).epsilon(1e-6));
  }
  // Under f16-mixed the fused head's gradients would come before the loss scale (and underflow): auto keeps the
  // unfused head there, true is refused with a usage error.
  for (const char* mode : {"auto", "true"}) {
    dew::Config cfg = dew::Config::parse_ini(std::string("[objective]\nplugin = lm\nsample_tokens = 0\nvocab_size = 7\n"
                                                         "fused_head_mb = 1e-9\nfused_head = ") +
                                             mode +
                                             "\n[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\n"
                                             "n_heads = 2\n");
    auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
    auto profiler = std::make_shared<dew::ProfilingBackend>(ref());
    dew::ObjectiveContext ctx{&cfg, profiler, 1, &src};
    obj->build(ctx);
    dew::AutocastGuard f16(dew::DType::f16);
    const dew::Batch b{{"text", Tensor::from_ints(text, {4, 9}, profiler)}};
    if (std::string(mode) == "true") {
      CHECK_THROWS_WITH_AS(obj->step(b, {0, 0, 1}), doctest::Contains("does not train under f16-mixed"),
                           dew::UsageError);
      continue;
    }
    profiler->start();
    obj->step(b, {0, 0, 1});
    profiler->stop();
    CHECK(profiler->calls("cross_entropy") == 1);
  }
  // A value other than auto / true / false, and a chunk size <= 0, are usage errors.
  for (const char* bad : {"fused_head = yes", "fused_head_mb = 0"}) {
    dew::Config cfg = dew::Config::parse_ini(std::string("[objective]\nplugin = lm\n") + bad + "\n");
    CHECK_THROWS_AS(dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective")), dew::UsageError);
  }
}

TEST_CASE("lm objective: a tokens folder (byte tokenizer) gives vocab 256, bits per byte and text samples") {
  ref();
  const fs::path dir = fs::temp_directory_path() / ("dew_test_lm_tokens_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto tok = dew::make_byte_tokenizer();
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back("The quick brown fox jumps over the lazy dog. ");
  dew::write_token_corpus(*tok, docs, dir.string(), 0.1);
  dew::Config cfg = dew::Config::parse_ini(
      "[objective]\nplugin = lm\nsample_tokens = 8\nsample_prompt = Hello\n"
      "[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n"
      "[data]\npath = " +
      dir.string() + "\nseq_len = 16\n");
  auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
  dew::ObjectiveContext ctx{&cfg, ref(), 1, nullptr};
  obj->build(ctx);
  CHECK(cfg.section("model").values().at("vocab_size") == "256");
  CHECK(cfg.section("model").values().at("max_seq_len") == "16");
  if (dew::Registry::global().contains("data_source", "tokens")) {
    cfg.section("data").set("source", "tokens");
    cfg.section("data").set("batch_size", "4");
    auto loader = dew::make_loader(cfg.section("data"), "val", 1);
    const auto vr = obj->validate(*loader, {3, 0, 1});
    CHECK(vr.metrics.at("tokens") > 0);
    CHECK(vr.metrics.at("bits_per_byte") == doctest::Approx(vr.metrics.at("ce") / std::log(2.0)));
    REQUIRE(vr.artifacts.size() == 1);
    const std::string body(vr.artifacts[0].bytes.begin(), vr.artifacts[0].bytes.end());
    CHECK(body.rfind("Hello", 0) == 0);
    CHECK(body.size() == 5 + 8 + 1);

    // train -> eval -> sample through the run directory, as dew-run does.
    const fs::path run = dir / "run";
    dew::Config tc = dew::Config::parse_ini(
        "[run]\nbackend = ref\nseed = 1\n[model]\nplugin = causal_transformer\n"
        "dim = 16\nn_layers = 1\nn_heads = 2\n[objective]\nplugin = lm\n"
        "sample_prompt = \"The \"\nsample_tokens = 4\n[data]\nsource = tokens\npath = " +
        dir.string() +
        "\nseq_len = 16\nbatch_size = 4\n[optim]\nname = adamw\n"
        "lr = 0.01\n[trainer]\nsteps = 4\nlog_every = 2\n");
    dew::TrainOptions to;
    to.run_dir = run.string();
    REQUIRE(dew::train(tc, to) == 0);
    std::ifstream art(run / "samples" / "sample-step-00000004.txt");
    std::string first_line;
    std::getline(art, first_line);
    CHECK(first_line.rfind("The ", 0) == 0);
    const auto metrics = dew::evaluate(run.string(), "latest", true, "");
    CHECK(metrics.at("ce") > 0);
    CHECK(metrics.at("step") == 4);
    dew::Options req({{"prompt", "fox"}, {"max_new_tokens", "6"}, {"temperature", "0"}, {"num_samples", "2"}},
                     "sample");
    std::ostringstream captured;
    auto* old_buf = std::cout.rdbuf(captured.rdbuf());
    try {
      dew::sample(run.string(), "latest", true, "", req);
    } catch (...) {
      std::cout.rdbuf(old_buf);
      throw;
    }
    std::cout.rdbuf(old_buf);
    const std::string out = captured.str();
    CHECK(out.find("=== sample 1 of 2 ===\nfox") != std::string::npos);
    CHECK(out.find("=== sample 2 of 2 ===\nfox") != std::string::npos);
    dew::Options typo({{"promt", "x"}}, "sample");
    CHECK_THROWS_AS(dew::sample(run.string(), "latest", true, "", typo), dew::UsageError);
  }
  fs::remove_all(dir);
}

TEST_CASE("lm end to end: dew::train on synthetic tokens lowers the loss") {
  ref();
  const fs::path run = fs::temp_directory_path() / ("dew_test_lm_run_" + std::to_string(::getpid()));
  fs::remove_all(run);
  dew::Config cfg = dew::Config::parse_ini(R"(
[run]
name = lm-tiny
seed = 2
backend = ref
[model]
plugin = causal_transformer
dim = 32
n_layers = 2
n_heads = 2
[objective]
plugin = lm
sample_tokens = 6
[data]
source = synthetic
kind = tokens
seq_len = 16
vocab = 16
size = 256
batch_size = 8
[optim]
name = adamw
lr = 0.01
weight_decay = 0.0
clip_grad_norm = 1.0
[schedule]
name = cosine
warmup_steps = 3
[trainer]
steps = 30
log_every = 1
)");
  dew::TrainOptions to;
  to.run_dir = run.string();
  REQUIRE(dew::train(cfg, to) == 0);
  std::ifstream in(run / "metrics.jsonl");
  std::vector<double> losses;
  double val_ce = -1;
  std::string line;
  while (std::getline(in, line)) {
    auto at = line.find("\"loss\":");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
    at = line.find("\"val/ce\":");
    if (at != std::string::npos) val_ce = std::stod(line.substr(at + 9));
  }
  REQUIRE(losses.size() == 30);
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  MESSAGE("loss " << first << " -> " << last << ", val ce " << val_ce);
  CHECK(first == doctest::Approx(std::log(16.0)).epsilon(0.1));
  CHECK(last < 0.6 * first);
  CHECK(val_ce > 0);
  CHECK(val_ce < 0.7 * std::log(16.0));
  CHECK(fs::exists(run / "samples" / "sample-step-00000030.txt"));
  fs::remove_all(run);
}

TEST_CASE("lm overfit: a tiny causal_transformer memorises one fixed batch (loss < 0.05) with AdamW") {
  ref();
  dew::Config cfg = dew::Config::parse_ini(
      "[objective]\nplugin = lm\nsample_tokens = 0\n"
      "[model]\nplugin = causal_transformer\nvocab_size = 16\ndim = 32\nn_layers = 2\nn_heads = 2\nmlp_hidden = 64\n"
      "[data]\nseq_len = 12\nbatch_size = 4\n"
      "[optim]\nname = adamw\nlr = 0.01\nweight_decay = 0.0\nbetas = 0.9, 0.95\n");
  auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
  dew::ObjectiveContext ctx;
  ctx.config = &cfg;
  ctx.backend = ref();
  ctx.seed = 3;
  obj->build(ctx);
  dew::NamedTensors params = obj->parameters();
  auto opt = dew::make_optimizer(cfg.section("optim"), params);
  // Random rows [4, 13]; row r starts with token r, so no two rows share a prefix and every target is
  // determined by its context (memorisable to zero loss).
  std::vector<int32_t> text;
  uint32_t state = 12345;
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 13; ++i) {
      state = state * 1664525u + 1013904223u;
      text.push_back(i == 0 ? r : int32_t((state >> 16) % 16));
    }
  const dew::Batch batch{{"text", Tensor::from_ints(text, {4, 13}, ref())}};
  double first = -1, loss = -1;
  int steps = 0;
  for (; steps < 300; ++steps) {
    dew::StepResult r = obj->step(batch, {steps, 0, 3});
    loss = r.loss.item();
    if (first < 0) first = loss;
    if (loss < 0.05) break;
    r.loss.backward();
    opt->update(0.01f, 1.0f, steps + 1);
    for (auto& [k, p] : params) p.zero_grad();
  }
  MESSAGE("overfit: loss " << first << " -> " << loss << " in " << steps << " AdamW steps");
  CHECK(first == doctest::Approx(std::log(16.0)).epsilon(0.1));
  CHECK(loss < 0.05);
}
