// tests/dpo/test_dpo.cpp — DPO (plugins/objectives/dpo) over preference pairs (plugins/data/preference_jsonl).
//
// The loss is recomputed independently: the model's logits are read back and every log-softmax, sum and
// -log sigmoid is done here in double; with precomputed reference log-probs (arbitrary numbers in the
// records) and with the starting-weights reference (the loss is log 2 before any change, then follows
// the logits of the changed policy and of the kept starting weights). A short dew::train run on a
// synthetic set must take the validation reward accuracy from 0 (every reward is 0 at the start) to
// above 0.9.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/checkpoint.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/registry.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"
#include "temp_dir.hpp"

using dew::Tensor;
namespace fs = std::filesystem;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref"))
      reg.discover(dew::Registry::default_plugin_dirs(),
                   {"ref", "cpu", "causal_transformer", "dpo", "preference_jsonl"});
    return dew::create_backend("ref");
  }();
  dew::set_default_backend(be);
  return be;
}

using dew_test::TempDir;

std::string byte_folder(const fs::path& dir) {
  auto tok = dew::make_byte_tokenizer();
  dew::write_token_corpus(*tok, {"placeholder"}, (dir / "bytes").string(), 0.0);
  return (dir / "bytes").string();
}

const double kBeta = 0.3;

// Summed log-probs (double) of the masked targets of rows [R, S + 1] from logits [R, S, V].
std::vector<double> logps(const std::vector<float>& logits, const std::vector<int32_t>& ids,
                          const std::vector<int32_t>& mask, int64_t rows, int64_t s, int64_t v) {
  std::vector<double> out(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < s; ++j) {
      if (!mask[size_t(r * (s + 1) + j + 1)]) continue;
      const float* l = logits.data() + (r * s + j) * v;
      double mx = l[0];
      for (int64_t k = 1; k < v; ++k) mx = std::max<double>(mx, l[k]);
      double z = 0;
      for (int64_t k = 0; k < v; ++k) z += std::exp(double(l[k]) - mx);
      out[size_t(r)] += double(l[ids[size_t(r * (s + 1) + j + 1)]]) - mx - std::log(z);
    }
  return out;
}

struct Batch4 {
  std::vector<int32_t> c, r, cm, rm;
  std::vector<float> rc, rr;
  int64_t b = 0, n = 0;
  dew::Batch batch(bool with_ref, dew::BackendPtr be = nullptr) const {
    if (!be) be = ref();
    dew::Batch bt{{"chosen", Tensor::from_ints(c, {b, n}, be)},
                  {"rejected", Tensor::from_ints(r, {b, n}, be)},
                  {"chosen_mask", Tensor::from_ints(cm, {b, n}, be)},
                  {"rejected_mask", Tensor::from_ints(rm, {b, n}, be)}};
    if (with_ref) {
      bt["ref_chosen_logp"] = Tensor::from_vector(rc, {b}, be);
      bt["ref_rejected_logp"] = Tensor::from_vector(rr, {b}, be);
    }
    return bt;
  }
};

Batch4 gather(const dew::DataSource& src, int64_t b) {
  Batch4 out;
  out.b = b;
  for (int64_t i = 0; i < b; ++i) {
    const dew::Record rec = src.get(i);
    out.n = rec.at("chosen").shape[0];
    auto add = [&](std::vector<int32_t>& v, const char* f) {
      v.insert(v.end(), rec.at(f).as<int32_t>(), rec.at(f).as<int32_t>() + out.n);
    };
    add(out.c, "chosen");
    add(out.r, "rejected");
    add(out.cm, "chosen_mask");
    add(out.rm, "rejected_mask");
    if (rec.count("ref_chosen_logp")) {
      out.rc.push_back(*rec.at("ref_chosen_logp").as<float>());
      out.rr.push_back(*rec.at("ref_rejected_logp").as<float>());
    }
  }
  return out;
}

// The model's logits for rows [B, n] (inputs = ids[:, :-1]).
std::vector<float> logits_of(dew::Model& m, const std::vector<int32_t>& ids, int64_t b, int64_t n) {
  std::vector<int32_t> in;
  for (int64_t r = 0; r < b; ++r) in.insert(in.end(), ids.begin() + r * n, ids.begin() + r * n + n - 1);
  dew::NoGradGuard g;
  return m.forward({{"tokens", Tensor::from_ints(in, {b, n - 1}, ref())}}).to_floats();
}

struct Expected {
  double loss, accuracy, margin;
};

Expected expected(const std::vector<double>& pc, const std::vector<double>& pr, const std::vector<double>& rc,
                  const std::vector<double>& rr) {
  Expected e{0, 0, 0};
  for (size_t i = 0; i < pc.size(); ++i) {
    const double w = kBeta * (pc[i] - rc[i]), l = kBeta * (pr[i] - rr[i]), d = w - l;
    e.loss += std::log1p(std::exp(-d));
    e.accuracy += w > l;
    e.margin += d;
  }
  const double n = double(pc.size());
  return {e.loss / n, e.accuracy / n, e.margin / n};
}

std::string write_pairs(const fs::path& dir, bool with_ref) {
  const fs::path p = dir / "pairs.jsonl";
  std::ofstream out(p);
  const char* prompts[] = {"Q: ab\\nA:", "Q: hello\\nA:", "Q: x\\nA:", "Q: dew\\nA:"};
  const char* chosen[] = {" yes", " bonjour", " indeed so", " 42"};
  const char* rejected[] = {" no", " bye", " never", " 7 or 8"};
  for (int i = 0; i < 4; ++i) {
    out << "{\"prompt\": \"" << prompts[i] << "\", \"chosen\": \"" << chosen[i] << "\", \"rejected\": \"" << rejected[i]
        << "\"";
    if (with_ref) out << ", \"ref_chosen_logp\": " << -20.0 - 3 * i << ", \"ref_rejected_logp\": " << -15.5 + 2 * i;
    out << "}\n";
  }
  return p.string();
}

// 160 pairs: prompt "say W:" for a random word W; chosen " W!", rejected " W?".
fs::path write_synthetic_pairs(const fs::path& dir) {
  const fs::path pairs = dir / "synthetic.jsonl";
  std::mt19937 rng(7);
  std::ofstream out(pairs);
  for (int i = 0; i < 160; ++i) {
    std::string w;
    for (int k = 0, n = 2 + int(rng() % 5); k < n; ++k) w += char('a' + rng() % 26);
    out << "{\"prompt\": \"say " << w << ":\", \"chosen\": \" " << w << "!\", \"rejected\": \" " << w << "?\"}\n";
  }
  return pairs;
}

std::shared_ptr<dew::Objective> build_dpo(dew::Config& cfg, const dew::DataSource& src) {
  auto obj = dew::Registry::global().create<dew::Objective>("dpo", cfg.section("objective"));
  dew::ObjectiveContext ctx{&cfg, ref(), 5, &src};
  obj->build(ctx);
  return obj;
}

// Adds N(0, 0.05) noise to every policy parameter (seeded by the parameter's name length): the same change on every
// run, so the loss leaves log 2 and every gradient is live.
void perturb_policy(dew::Objective& obj, const dew::BackendPtr& be) {
  dew::NoGradGuard g;
  for (auto& [n, t] : obj.parameters()) {
    std::vector<float> v = t.to_floats();
    std::mt19937 rng(uint32_t(n.size()));
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (float& x : v) x += noise(rng);
    t.copy_(Tensor::from_vector(v, t.shape(), be));
  }
}

dew::Config tiny_config(const std::string& bytes, const std::string& pairs) {
  std::ostringstream beta;
  beta << kBeta;
  return dew::Config::parse_ini("[objective]\nplugin = dpo\nbeta = " + beta.str() +
                                "\n[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n"
                                "[data]\nsource = preference_jsonl\nseq_len = 24\nbatch_size = 4\npath = " +
                                pairs + "\ntokenizer = " + bytes + "\n");
}

}  // namespace

TEST_CASE("preference_jsonl: prompt then response tokens, masks on the response") {
  ref();
  TempDir d("src");
  const std::string bytes = byte_folder(d.path);
  auto src = dew::Registry::global().create<dew::DataSource>(
      "preference_jsonl",
      dew::Options({{"path", write_pairs(d.path, true)}, {"tokenizer", bytes}, {"seq_len", "24"}}, "data"));
  REQUIRE(src->size() == 4);
  const dew::Record r = src->get(0);
  const std::string prompt = "Q: ab\nA:";
  std::string chosen, masked;
  for (int j = 0; j < 25; ++j) {
    if (r.at("chosen_mask").as<int32_t>()[j]) masked += char(r.at("chosen").as<int32_t>()[j]);
    if (j < int(prompt.size())) CHECK(r.at("chosen").as<int32_t>()[j] == (unsigned char)prompt[size_t(j)]);
  }
  CHECK(masked == " yes");
  CHECK(*r.at("ref_chosen_logp").as<float>() == -20.0f);
  CHECK(*r.at("ref_rejected_logp").as<float>() == -15.5f);
  // Too long: refused naming the line.
  CHECK_THROWS_WITH_AS(
      dew::Registry::global().create<dew::DataSource>(
          "preference_jsonl",
          dew::Options({{"path", write_pairs(d.path, false)}, {"tokenizer", bytes}, {"seq_len", "10"}}, "data")),
      doctest::Contains("pairs.jsonl:1: prompt + chosen is 12 tokens"), dew::UsageError);
}

TEST_CASE(
    "dpo loss (sigmoid, hinge, ipo, simpo, orpo, label smoothing) with precomputed reference log-probs equals a "
    "double-precision computation") {
  ref();
  TempDir d("pre");
  const std::string bytes = byte_folder(d.path), pairs = write_pairs(d.path, true);
  dew::Config cfg = tiny_config(bytes, pairs);
  auto src = dew::Registry::global().create<dew::DataSource>(
      "preference_jsonl", dew::Options({{"path", pairs}, {"tokenizer", bytes}, {"seq_len", "24"}}, "data"));
  auto obj = build_dpo(cfg, *src);
  const Batch4 b = gather(*src, 4);
  const dew::StepResult r = obj->step(b.batch(true), {0, 0, 5});
  dew::Model& m = *obj->main_model();
  const auto pc = logps(logits_of(m, b.c, 4, b.n), b.c, b.cm, 4, b.n - 1, 256);
  const auto pr = logps(logits_of(m, b.r, 4, b.n), b.r, b.rm, 4, b.n - 1, 256);
  const Expected e =
      expected(pc, pr, std::vector<double>(b.rc.begin(), b.rc.end()), std::vector<double>(b.rr.begin(), b.rr.end()));
  CHECK(r.loss.item() == doctest::Approx(e.loss).epsilon(1e-5));
  CHECK(r.metrics.at("reward_accuracy") == doctest::Approx(e.accuracy));
  CHECK(r.metrics.at("reward_margin") == doctest::Approx(e.margin).epsilon(1e-5));
  CHECK(std::fabs(e.loss - std::log(2.0)) > 0.01);  // the references are not the policy's: a real check
  r.loss.backward();
  for (auto& [n, t] : obj->parameters()) REQUIRE(t.grad().defined());

  // The SFT term: + sft_weight * (the chosen tokens' summed NLL / their count).
  dew::Config cfg2 = tiny_config(bytes, pairs);
  cfg2.section("objective").set("sft_weight", "0.5");
  auto obj2 = build_dpo(cfg2, *src);
  const dew::StepResult r2 = obj2->step(b.batch(true), {0, 0, 5});
  dew::Model& m2 = *obj2->main_model();
  const auto pc2 = logps(logits_of(m2, b.c, 4, b.n), b.c, b.cm, 4, b.n - 1, 256);
  const auto pr2 = logps(logits_of(m2, b.r, 4, b.n), b.r, b.rm, 4, b.n - 1, 256);
  const Expected e2 =
      expected(pc2, pr2, std::vector<double>(b.rc.begin(), b.rc.end()), std::vector<double>(b.rr.begin(), b.rr.end()));
  double nll = 0, count = 0;
  for (int64_t i = 0; i < 4; ++i) {
    nll -= pc2[size_t(i)];
    for (int64_t j = 1; j < b.n; ++j) count += b.cm[size_t(i * b.n + j)];
  }
  CHECK(r2.metrics.at("sft_nll") == doctest::Approx(nll / count).epsilon(1e-5));
  CHECK(r2.loss.item() == doctest::Approx(e2.loss + 0.5 * nll / count).epsilon(1e-5));

  // The other losses: hinge (SLiC) max(0, 1 - d) on the sums; IPO (d / beta - 1 / (2 beta))^2 on per-token means;
  // SimPO -log sigmoid(beta (mean log-prob chosen - rejected) - gamma), no reference; cDPO's label smoothing; ORPO
  // the chosen NLL + beta * -log sigmoid(log odds ratio of the means), no reference.
  for (const std::string loss : {"hinge", "ipo", "simpo", "smoothed", "orpo"}) {
    CAPTURE(loss);
    dew::Config cfg3 = tiny_config(bytes, pairs);
    cfg3.section("objective").set("loss", loss == "smoothed" ? "sigmoid" : loss);
    if (loss == "smoothed") cfg3.section("objective").set("label_smoothing", "0.1");
    if (loss == "simpo") cfg3.section("objective").set("simpo_gamma", "0.3");
    auto obj3 = build_dpo(cfg3, *src);
    const dew::StepResult r3 = obj3->step(b.batch(true), {0, 0, 5});
    dew::Model& m3 = *obj3->main_model();
    const auto pc3 = logps(logits_of(m3, b.c, 4, b.n), b.c, b.cm, 4, b.n - 1, 256);
    const auto pr3 = logps(logits_of(m3, b.r, 4, b.n), b.r, b.rm, 4, b.n - 1, 256);
    double want = 0, margin = 0;
    for (int64_t i = 0; i < 4; ++i) {
      double nc = 0, nr = 0;
      for (int64_t j = 1; j < b.n; ++j) {
        nc += b.cm[size_t(i * b.n + j)];
        nr += b.rm[size_t(i * b.n + j)];
      }
      const double hw = pc3[size_t(i)] - b.rc[size_t(i)], hl = pr3[size_t(i)] - b.rr[size_t(i)];
      if (loss == "hinge") {
        want += std::max(0.0, 1.0 - kBeta * (hw - hl));
        margin += kBeta * (hw - hl);
      } else if (loss == "ipo") {
        const double h = hw / nc - hl / nr;
        want += (h - 1.0 / (2.0 * kBeta)) * (h - 1.0 / (2.0 * kBeta));
        margin += kBeta * h;
      } else if (loss == "orpo") {  // beta * -log sigmoid(log odds ratio) of the means, + the chosen NLL (below)
        const double mw = pc3[size_t(i)] / nc, ml = pr3[size_t(i)] / nr;
        const double lo = (mw - ml) - (std::log(1 - std::exp(mw)) - std::log(1 - std::exp(ml)));
        want += kBeta * std::log1p(std::exp(-lo));
        margin += kBeta * (mw - ml);
      } else if (loss == "simpo") {  // the precomputed references are not read
        const double h = pc3[size_t(i)] / nc - pr3[size_t(i)] / nr;
        want += std::log1p(std::exp(-(kBeta * h - 0.3)));
        margin += kBeta * h;
      } else {
        const double d = kBeta * (hw - hl);
        want += 0.9 * std::log1p(std::exp(-d)) + 0.1 * std::log1p(std::exp(d));
        margin += d;
      }
    }
    double nll3 = 0, count3 = 0;  // ORPO's NLL term: the chosen tokens' mean NLL, weight 1
    for (int64_t i = 0; i < 4; ++i) {
      nll3 -= pc3[size_t(i)];
      for (int64_t j = 1; j < b.n; ++j) count3 += b.cm[size_t(i * b.n + j)];
    }
    CHECK(r3.metrics.at("dpo_loss") == doctest::Approx(want / 4).epsilon(1e-5));
    CHECK(r3.loss.item() == doctest::Approx(want / 4 + (loss == "orpo" ? nll3 / count3 : 0.0)).epsilon(1e-5));
    CHECK(r3.metrics.at("reward_margin") == doctest::Approx(margin / 4).epsilon(1e-5));
    r3.loss.backward();
    for (auto& [n, t] : obj3->parameters()) CHECK_MESSAGE(t.grad().defined(), n);
  }
  dew::Config bad = tiny_config(bytes, pairs);
  bad.section("objective").set("loss", "kto");
  CHECK_THROWS_WITH_AS(build_dpo(bad, *src), doctest::Contains("sigmoid, hinge, ipo, simpo or orpo"), dew::UsageError);
  dew::Config bad2 = tiny_config(bytes, pairs);
  bad2.section("objective").set("loss", "hinge");
  bad2.section("objective").set("label_smoothing", "0.1");
  CHECK_THROWS_WITH_AS(build_dpo(bad2, *src), doctest::Contains("applies to the sigmoid and simpo"), dew::UsageError);
}

TEST_CASE("dpo with the starting weights as reference: log 2 first, then the double-precision loss") {
  ref();
  TempDir d("start");
  const std::string bytes = byte_folder(d.path), pairs = write_pairs(d.path, false);
  dew::Config cfg = tiny_config(bytes, pairs);
  auto src = dew::Registry::global().create<dew::DataSource>(
      "preference_jsonl", dew::Options({{"path", pairs}, {"tokenizer", bytes}, {"seq_len", "24"}}, "data"));
  auto obj = build_dpo(cfg, *src);
  const Batch4 b = gather(*src, 4);
  dew::Model& m = *obj->main_model();
  const auto c0 = logits_of(m, b.c, 4, b.n), r0 = logits_of(m, b.r, 4, b.n);
  dew::StepResult r = obj->step(b.batch(false), {0, 0, 5});
  CHECK(r.loss.item() == doctest::Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(r.metrics.at("reward_accuracy") == 0.0);  // ties
  // The policy and the reference give the same log-probabilities bit for bit (d = 0 exactly), and the loss's gradient
  // there is -sigmoid(0) beta (grad log pi(y_w) - grad log pi(y_l)), not 0: the first update is a real one. (The
  // former log(1 + exp(-|d|)) - min(d, 0) gave exactly 0 at d = 0.)
  CHECK(r.metrics.at("reward_margin") == 0.0);
  r.loss.backward();
  double grad_sq = 0;
  for (auto& [n, t] : obj->parameters())
    if (t.grad().defined())
      for (float g : t.grad().to_floats()) grad_sq += double(g) * g;
  CHECK(grad_sq > 1e-12);
  for (auto& [n, t] : obj->parameters()) t.zero_grad();
  perturb_policy(*obj, ref());  // the reference keeps the starting weights
  r = obj->step(b.batch(false), {1, 0, 5});
  const auto pc = logps(logits_of(m, b.c, 4, b.n), b.c, b.cm, 4, b.n - 1, 256);
  const auto pr = logps(logits_of(m, b.r, 4, b.n), b.r, b.rm, 4, b.n - 1, 256);
  const auto rc = logps(c0, b.c, b.cm, 4, b.n - 1, 256), rr = logps(r0, b.r, b.rm, 4, b.n - 1, 256);
  const Expected e = expected(pc, pr, rc, rr);
  CHECK(r.loss.item() == doctest::Approx(e.loss).epsilon(1e-5));
  CHECK(r.metrics.at("reward_margin") == doctest::Approx(e.margin).epsilon(1e-4));
  CHECK(std::fabs(e.loss - std::log(2.0)) > 1e-4);
  // The reference travels as state (checkpoints, resume): the starting weights and the flag.
  const dew::NamedTensors st = obj->state();
  CHECK(st.back().first == "reference_ready");
  CHECK(st.back().second.item() == 1.0);
}

TEST_CASE("dpo with a mixture-of-experts policy adds the policy forward's balancing loss (not the reference's)") {
  ref();
  TempDir d("moe");
  const std::string bytes = byte_folder(d.path), pairs = write_pairs(d.path, false);
  dew::Config cfg = tiny_config(bytes, pairs);
  cfg.set("model.moe_experts", "4");
  cfg.set("model.moe_hidden", "8");
  cfg.set("model.moe_aux_loss", "0.5");  // large, so the sum is plainly not the DPO loss alone
  auto src = dew::Registry::global().create<dew::DataSource>(
      "preference_jsonl", dew::Options({{"path", pairs}, {"tokenizer", bytes}, {"seq_len", "24"}}, "data"));
  auto obj = build_dpo(cfg, *src);
  perturb_policy(*obj, ref());
  const Batch4 b = gather(*src, 4);
  const dew::StepResult r = obj->step(b.batch(false), {1, 0, 5});
  REQUIRE(r.device_metrics.count("aux_loss"));
  const double aux = r.device_metrics.at("aux_loss").item(), dpo = r.metrics.at("dpo_loss");
  CHECK(aux >= 0.5 * 2.0 - 1e-6);  // weight x top_k at perfect balance, never below
  CHECK(r.loss.item() == doctest::Approx(dpo + aux).epsilon(1e-6));
  // The same balancing loss by the policy's own training forward over the step's rows (chosen, then rejected).
  dew::Model& m = *obj->main_model();
  m.set_training(true);
  std::vector<int32_t> ids = b.c;
  ids.insert(ids.end(), b.r.begin(), b.r.end());
  const Tensor all = Tensor::from_ints(ids, {8, b.n}, ref());
  m.forward({{"tokens", dew::slice(all, 1, 0, b.n - 1)}});
  CHECK(m.auxiliary_loss().item() == doctest::Approx(aux).epsilon(1e-6));
}

TEST_CASE("dpo with the head fused (fused_head): the unfused loss and gradients, the logits in chunks") {
  // fused_head = true: dew::linear_token_logprobs over chunks of 7 rows (fused_head_mb: 7 rows of 256 f32 logits), for
  // the policy (its backward computes each chunk's logits again) and the reference; false: the model's logits and
  // dew::token_logprobs. After a perturbation of the policy (so the loss is not log 2 and every gradient is live),
  // with the SFT term: the same loss, metrics and parameter gradients.
  ref();
  TempDir d("fused");
  const std::string bytes = byte_folder(d.path), pairs = write_pairs(d.path, false);
  auto src = dew::Registry::global().create<dew::DataSource>(
      "preference_jsonl", dew::Options({{"path", pairs}, {"tokenizer", bytes}, {"seq_len", "24"}}, "data"));
  const Batch4 b = gather(*src, 4);
  std::ostringstream seven_rows;
  seven_rows.precision(17);
  seven_rows << 7 * 256 * 4 / 1048576.0;
  double loss[2], margin[2];
  std::vector<std::vector<float>> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    dew::Config cfg = tiny_config(bytes, pairs);
    cfg.section("objective").set("sft_weight", "0.5");
    cfg.section("objective").set("fused_head", fused ? "true" : "false");
    cfg.section("objective").set("fused_head_mb", seven_rows.str());
    auto profiler = std::make_shared<dew::ProfilingBackend>(ref());
    auto obj = dew::Registry::global().create<dew::Objective>("dpo", cfg.section("objective"));
    dew::ObjectiveContext ctx{&cfg, profiler, 5, src.get()};
    obj->build(ctx);
    obj->step(b.batch(false, profiler), {0, 0, 5});  // freezes the reference
    perturb_policy(*obj, profiler);
    profiler->start();
    dew::StepResult r = obj->step(b.batch(false, profiler), {1, 0, 5});
    profiler->stop();
    // 8 sequences (chosen and rejected) x (n - 1) targets in chunks of 7 rows, for the policy and for the reference;
    // unfused one call each
    const int64_t rows = 8 * (b.n - 1), chunks = (rows + 6) / 7;
    CHECK(profiler->calls("cross_entropy") == (fused ? 2 * chunks : 2));
    loss[fused] = r.loss.item();
    margin[fused] = r.metrics.at("reward_margin");
    r.loss.backward();
    for (auto& [n, t] : obj->parameters()) {
      REQUIRE_MESSAGE(t.grad().defined(), n);
      grads[fused].push_back(t.grad().to_floats());
    }
  }
  CHECK(std::fabs(loss[0] - std::log(2.0)) > 1e-4);
  CHECK(loss[1] == doctest::Approx(loss[0]).epsilon(1e-5));
  CHECK(margin[1] == doctest::Approx(margin[0]).epsilon(1e-4));
  for (size_t k = 0; k < grads[0].size(); ++k) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < grads[0][k].size(); ++i) {
      worst = std::max(worst, double(std::fabs(grads[0][k][i] - grads[1][k][i])));
      scale = std::max(scale, double(std::fabs(grads[0][k][i])));
    }
    CHECK_MESSAGE(scale > 0, "parameter ", k, " has no gradient");
    CHECK_MESSAGE(worst <= 1e-5 * std::max(1.0, scale), "parameter ", k, " differs by ", worst);
  }
}

TEST_CASE("dpo, simpo and orpo training raise the reward accuracy above 0.9 on a synthetic preference set") {
  ref();
  TempDir d("train");
  const std::string bytes = byte_folder(d.path);
  const fs::path pairs = write_synthetic_pairs(d.path);
  // SimPO at its paper's scale (beta 2, a margin gamma), without a reference: no copy in its checkpoint.
  for (const std::string objective :
       {"beta = 0.5", "beta = 2\nloss = simpo\nsimpo_gamma = 0.5", "beta = 0.5\nloss = orpo"}) {
    CAPTURE(objective);
    dew::Config cfg = dew::Config::parse_ini(
        "[run]\nname = dpo-synthetic\nbackend = cpu\nseed = 2\n"
        "[model]\nplugin = causal_transformer\ndim = 32\nn_layers = 1\nn_heads = 2\n"
        "[objective]\nplugin = dpo\n" +
        objective + "\n[data]\nsource = preference_jsonl\nseq_len = 24\nbatch_size = 16\nval_count = 32\npath = " +
        pairs.string() + "\ntokenizer = " + bytes +
        "\n[optim]\nname = adamw\nlr = 0.01\n[trainer]\nsteps = 30\nlog_every = 10\neval_every = 30\n"
        "checkpoint_every = 30\n");
    const bool reference_free = objective.find("loss") != std::string::npos;
    const fs::path run = d.path / (reference_free ? objective.substr(objective.find("loss = ") + 7, 5) : "dpo");
    dew::TrainOptions to;
    to.run_dir = run.string();
    REQUIRE(dew::train(cfg, to) == 0);
    std::ifstream metrics(run / "metrics.jsonl");
    std::string line, last_val;
    while (std::getline(metrics, line))
      if (line.find("val/reward_accuracy") != std::string::npos) last_val = line;
    INFO(last_val);
    REQUIRE(!last_val.empty());
    const size_t at = last_val.find("\"val/reward_accuracy\":");
    const double acc = std::atof(last_val.c_str() + at + std::strlen("\"val/reward_accuracy\":"));
    CHECK(acc > 0.9);
    const dew::CheckpointData c = dew::read_checkpoint((run / "checkpoints" / "step-00000030.h5").string(), ref());
    int copies = 0;
    for (auto& [name, t] : c.state_tensors) copies += name.rfind("objective.reference.", 0) == 0;
    CHECK((copies == 0) == reference_free);
  }
}

TEST_CASE(
    "dpo with LoRA adapters: the reference is the frozen base run with the adapters off, no copy, reward accuracy "
    "> 0.9, and the policy samples and evaluates as an lm run does") {
  ref();
  TempDir d("lora");
  const std::string bytes = byte_folder(d.path);
  const fs::path pairs = write_synthetic_pairs(d.path);
  const auto config = [&](const std::string& reference) {
    return dew::Config::parse_ini(
        "[run]\nname = dpo-lora\nbackend = cpu\nseed = 2\n"
        "[model]\nplugin = causal_transformer\ndim = 32\nn_layers = 1\nn_heads = 2\n"
        "[objective]\nplugin = dpo\nbeta = 0.5\nreference = " +
        reference +
        "\n[lora]\nrank = 8\nalpha = 16\n"
        "[data]\nsource = preference_jsonl\nseq_len = 24\nbatch_size = 16\nval_count = 32\npath = " +
        pairs.string() + "\ntokenizer = " + bytes +
        "\n[optim]\nname = adamw\nlr = 0.01\n[trainer]\nsteps = 30\nlog_every = 1\neval_every = 30\n"
        "checkpoint_every = 30\n");
  };
  // The same run with the adapters-off reference (auto) and with a copy of the starting weights (copy).
  dew::TrainOptions to, copy_to;
  to.run_dir = (d.path / "run").string();
  copy_to.run_dir = (d.path / "copy").string();
  dew::Config cfg = config("auto"), copy_cfg = config("copy");
  REQUIRE(dew::train(cfg, to) == 0);
  REQUIRE(dew::train(copy_cfg, copy_to) == 0);
  const auto losses = [](const fs::path& run, std::string& first, std::string& last_val) {
    std::ifstream metrics(run / "metrics.jsonl");
    std::string line, all;
    while (std::getline(metrics, line)) {
      const size_t at = line.find("\"dpo_loss\":");
      if (at != std::string::npos) all += line.substr(at, line.find_first_of(",}", at) - at) + "\n";
      if (first.empty() && at != std::string::npos) first = line;
      if (line.find("val/reward_accuracy") != std::string::npos) last_val = line;
    }
    return all;
  };
  std::string first, last_val, copy_first, copy_last_val;
  const std::string auto_losses = losses(d.path / "run", first, last_val);
  CHECK(std::count(auto_losses.begin(), auto_losses.end(), '\n') >= 30);
  CHECK(auto_losses == losses(d.path / "copy", copy_first, copy_last_val));  // bit for bit, every update
  auto value = [](const std::string& l, const std::string& key) {
    const size_t at = l.find("\"" + key + "\":");
    REQUIRE(at != std::string::npos);
    return std::atof(l.c_str() + at + key.size() + 3);
  };
  INFO(first);
  INFO(last_val);
  // B = 0 at the start: the policy is the reference (the base), so the first loss is log 2 to the bit.
  CHECK(value(first, "dpo_loss") == doctest::Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(value(last_val, "val/reward_accuracy") > 0.9);
  // The copy run's reference (objective state) equals the policy's base weights, which did not move; the auto run
  // keeps no copy.
  const auto checkpoint_of = [](const std::string& run) {
    return dew::read_checkpoint((fs::path(run) / "checkpoints" / "step-00000030.h5").string(), ref());
  };
  const auto references = [](const dew::CheckpointData& c) {
    int n = 0;
    for (auto& [name, t] : c.state_tensors) n += name.rfind("objective.reference.", 0) == 0;
    return n;
  };
  const dew::CheckpointData c = checkpoint_of(copy_to.run_dir);
  std::map<std::string, Tensor> saved;
  for (auto& [n, t] : c.params) saved.emplace(n, t);
  for (auto& [n, t] : c.state_tensors) {
    if (n.rfind("objective.reference.", 0) != 0) continue;
    const std::string base = n.substr(std::strlen("objective.reference."));
    REQUIRE(saved.count(base) == 1);
    CHECK_MESSAGE(t.to_floats() == saved.at(base).to_floats(), base);
  }
  CHECK(references(c) > 0);
  const dew::CheckpointData ca = checkpoint_of(to.run_dir);
  CHECK(references(ca) == 0);
  int adapters = 0;
  for (auto& [n, t] : ca.params) adapters += n.find("lora_") != std::string::npos;
  CHECK(adapters == 14);  // 1 layer x (q, k, v, o, gate, up, down) x (A, B)
  // `dew-run eval` merges the adapters: the reference it validates against is still the base (a copy made first),
  // so its rewards are the training run's last validation's (another backend: to rounding).
  const std::map<std::string, double> val = dew::evaluate(to.run_dir, "latest", false, "ref");
  REQUIRE(val.count("reward_margin") == 1);
  CHECK(val.at("reward_margin") == doctest::Approx(value(last_val, "val/reward_margin")).epsilon(1e-3));
  CHECK(val.at("reward_margin") > 0.1);
  auto ir = dew::load_inference_run(to.run_dir, "latest", false, "ref");  // merges the adapters on load

  // `dew-run sample` and `eval --task` run the trained policy as the lm objective runs its model: greedy tokens
  // equal dew::generate's on the loaded (merged) model, a log-likelihood the model's own log-softmax sum.
  auto* decoder = dynamic_cast<dew::CausalDecoder*>(ir->objective->main_model());
  REQUIRE(decoder != nullptr);
  const std::vector<int32_t> prompt{104, 105, 32}, continuation{116, 104};
  dew::SamplingParams sp;
  sp.max_new_tokens = 6;
  sp.temperature = 0;
  sp.eos_id = -1;
  std::vector<dew::Generation> direct;
  {
    dew::NoGradGuard no_grad;
    direct = dew::generate(dew::decoder_start(*decoder), {prompt}, sp, nullptr, decoder->context_length());
  }
  std::ostringstream expect_ids;
  for (size_t i = 0; i < direct[0].tokens.size(); ++i) expect_ids << (i ? " " : "") << direct[0].tokens[i];
  std::ostringstream printed;
  {
    std::streambuf* const was = std::cout.rdbuf(printed.rdbuf());
    dew::Options req({{"prompt_ids", "104,105,32"}, {"max_new_tokens", "6"}, {"temperature", "0"}});
    try {
      dew::sample(to.run_dir, "latest", false, "ref", req);
    } catch (...) {
      std::cout.rdbuf(was);
      throw;
    }
    std::cout.rdbuf(was);
  }
  INFO(printed.str());
  CHECK(printed.str().rfind(expect_ids.str() + "\n", 0) == 0);
  const fs::path requests = d.path / "ll.jsonl";
  std::ofstream(requests) << "{\"context_ids\": [104, 105, 32], \"continuation_ids\": [116, 104]}\n";
  dew::Options task({{"task", "loglikelihood"}, {"requests", requests.string()}});
  const std::map<std::string, double> m = dew::evaluate(to.run_dir, "latest", false, "ref", task);
  double ll = 0;
  {
    dew::NoGradGuard no_grad;
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), continuation.begin(), continuation.end());
    const Tensor tokens = Tensor::from_ints(all, {1, int64_t(all.size())}, ir->backend);
    const std::vector<double> logp =
        dew::log_softmax(ir->objective->main_model()->forward({{"tokens", tokens}})).to_doubles();
    const int64_t vocab = int64_t(logp.size() / all.size());
    for (size_t i = 0; i < continuation.size(); ++i)
      ll += logp[(prompt.size() - 1 + i) * size_t(vocab) + size_t(continuation[i])];
  }
  REQUIRE(m.count("loglikelihood_sum") == 1);
  CHECK(m.at("loglikelihood_sum") == doctest::Approx(ll).epsilon(1e-5));
}

TEST_CASE("dpo resume keeps the starting-weights reference: 2 + 2 updates equal 4, bit for bit") {
  ref();
  TempDir d("resume");
  const std::string bytes = byte_folder(d.path), pairs = write_pairs(d.path, false);
  auto config = [&](int steps) {
    return dew::Config::parse_ini(
        "[run]\nname = dpo-resume\nbackend = ref\nseed = 3\n"
        "[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n"
        "[objective]\nplugin = dpo\nbeta = 0.3\n"
        "[data]\nsource = preference_jsonl\nseq_len = 24\nbatch_size = 2\nval_count = 1\npath = " +
        pairs + "\ntokenizer = " + bytes + "\n[optim]\nname = adamw\nlr = 0.01\n[trainer]\nsteps = " +
        std::to_string(steps) + "\nlog_every = 1\ncheckpoint_every = 2\n");
  };
  auto losses = [](const fs::path& run) {
    std::ifstream in(run / "metrics.jsonl");
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
      const size_t at = line.find("\"loss\":");
      if (at != std::string::npos && line.find("\"val/") == std::string::npos)
        out.push_back(line.substr(at, line.find(',', at) - at));
    }
    return out;
  };
  dew::Config straight = config(4);
  dew::TrainOptions a;
  a.run_dir = (d.path / "straight").string();
  REQUIRE(dew::train(straight, a) == 0);
  dew::Config first = config(2);
  dew::TrainOptions b;
  b.run_dir = (d.path / "resumed").string();
  REQUIRE(dew::train(first, b) == 0);
  dew::Config second = config(4);
  b.resume = true;
  REQUIRE(dew::train(second, b) == 0);
  const auto la = losses(d.path / "straight"), lb = losses(d.path / "resumed");
  REQUIRE(la.size() == 4);
  CHECK(lb == la);
}
