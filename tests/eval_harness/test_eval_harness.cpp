// tests/eval_harness/test_eval_harness.cpp — the evaluation harness on the ref backend: plan_windows
// scores every target exactly once with the longest context; a zero-weight model's log-likelihoods are
// computed by hand (-n ln V, greedy only for token 0); a random model's log-likelihoods equal an
// independent full forward + log-softmax in double (through model_scores: the head in chunks), and equal the
// scores of the whole logits (LinearHeadModel::forward_rows gives the head's rows, refuses other shapes); rolling
// windows give each token its designed context; batching with right padding equals scoring alone; the lm objective's
// eval tasks (loglikelihood with text pairs, multiple_choice, loglikelihood_rolling, generate_until stopping at the
// stop string, perplexity of a token file) on a byte-tokenizer run.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/lm_eval.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/tokenizer.hpp"

using dew::Tensor;
namespace fs = std::filesystem;
namespace le = dew::lm_eval;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref"))
      reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "causal_transformer", "lm"});
    dew::BackendPtr b = dew::create_backend("ref");
    dew::set_default_backend(b);
    return b;
  }();
  dew::set_default_backend(be);
  return be;
}

std::shared_ptr<dew::Model> model(int64_t vocab, uint64_t seed, bool zero = false) {
  ref();
  dew::Options o({{"vocab_size", std::to_string(vocab)},
                  {"dim", "16"},
                  {"n_layers", "2"},
                  {"n_heads", "2"},
                  {"max_seq_len", "64"},
                  {"tie_embeddings", "false"}},
                 "model");
  auto m = dew::Registry::global().create<dew::Model>("causal_transformer", o);
  m->initialize(seed);
  if (zero)
    for (auto& [n, t] : m->named_parameters()) t.backend().fill(t, 0.0);
  m->set_training(false);
  return m;
}

// log P(seq[t] | seq[s, t)) for each t in [t0, t1) by a full forward of exactly that context, in double.
double independent_logprob(dew::Model& m, const std::vector<int32_t>& seq, int64_t s, int64_t t) {
  dew::NoGradGuard ng;
  const std::vector<int32_t> ctx(seq.begin() + s, seq.begin() + t);
  const Tensor lg = m.forward({{"tokens", Tensor::from_ints(ctx, {1, int64_t(ctx.size())}, ref())}});
  const int64_t v = lg.shape()[2];
  const std::vector<float> all = lg.to_floats();
  const float* row = all.data() + (int64_t(ctx.size()) - 1) * v;
  double mx = -1e300, z = 0;
  for (int64_t i = 0; i < v; ++i) mx = std::max(mx, double(row[i]));
  for (int64_t i = 0; i < v; ++i) z += std::exp(double(row[i]) - mx);
  return double(row[seq[size_t(t)]]) - mx - std::log(z);
}

std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> out;
  uint32_t x = seed * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(int32_t((x >> 8) % uint32_t(vocab)));
  }
  return out;
}

}  // namespace

TEST_CASE("plan_windows: every target once, at most max_length inputs, the longest context") {
  for (int64_t L : {1, 2, 3, 5, 8})
    for (int64_t block = 1; block <= L; ++block)
      for (int64_t t0 : {1, 2, 7})
        for (int64_t t1 : {t0, t0 + 1, t0 + 4, t0 + 23}) {
          const auto ws = le::plan_windows(t0, t1, L, block);
          std::vector<int> seen(size_t(t1), 0);
          for (const auto& w : ws) {
            CHECK(w.begin < w.first);
            CHECK(w.end - 1 - w.begin <= L);
            CHECK(w.end - w.first <= block);
            CHECK(w.begin == std::max<int64_t>(0, w.end - 1 - L));
            for (int64_t t = w.first; t < w.end; ++t) ++seen[size_t(t)];
          }
          for (int64_t t = 0; t < t1; ++t) CHECK(seen[size_t(t)] == (t >= t0 ? 1 : 0));
        }
  CHECK_THROWS(le::plan_windows(0, 3, 4, 4));  // the first token has no context
  CHECK_THROWS(le::plan_windows(1, 3, 4, 5));  // block > max_length
}

TEST_CASE("loglikelihood by hand: a zero-weight model is uniform, -n ln V, greedy only for token 0") {
  auto m = model(11, 1, true);
  const auto fn = le::model_scores(*m);
  const auto r = le::loglikelihood(fn, {{{3, 4, 5}, {6, 7}}, {{1}, {0, 0, 0}}, {{2, 9}, {0, 4}}}, 64, 2);
  REQUIRE(r.size() == 3);
  CHECK(r[0].logprob == doctest::Approx(-2 * std::log(11.0)).epsilon(1e-6));
  CHECK(r[1].logprob == doctest::Approx(-3 * std::log(11.0)).epsilon(1e-6));
  CHECK(r[0].tokens == 2);
  CHECK(r[1].tokens == 3);
  CHECK_FALSE(r[0].greedy);
  CHECK(r[1].greedy);  // ties: the argmax is the first index, 0
  CHECK_FALSE(r[2].greedy);
  CHECK_THROWS_AS(le::loglikelihood(fn, {{{1}, {}}}, 64, 1), dew::UsageError);  // empty continuation
  CHECK_THROWS_AS(le::loglikelihood(fn, {{{}, {1}}}, 64, 1), dew::UsageError);  // empty context, no prefix
  CHECK(le::loglikelihood(fn, {{{}, {1}}}, 64, 1, 0)[0].tokens == 1);
}

TEST_CASE(
    "loglikelihood equals an independent full forward, batched with padding equals alone, long "
    "continuations in blocks") {
  auto m = model(23, 7);
  const auto fn = le::model_scores(*m);
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back({random_ids(3 + 2 * i, 23, i), random_ids(1 + i, 23, 100 + i)});
  const auto batched = le::loglikelihood(fn, reqs, 64, 4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> seq = reqs[i].first;
    seq.insert(seq.end(), reqs[i].second.begin(), reqs[i].second.end());
    double want = 0;
    bool greedy = true;
    for (size_t t = reqs[i].first.size(); t < seq.size(); ++t) want += independent_logprob(*m, seq, 0, int64_t(t));
    CHECK(batched[i].logprob == doctest::Approx(want).epsilon(1e-5));
    const auto alone = le::loglikelihood(fn, {reqs[i]}, 64, 1);
    CHECK(alone[0].logprob == doctest::Approx(batched[i].logprob).epsilon(1e-6));
    (void)greedy;
  }
  // max_length 4: a 9-token continuation is scored in blocks, each token once with its window's context.
  const std::vector<int32_t> ctx = random_ids(6, 23, 9), cont = random_ids(9, 23, 10);
  std::vector<int32_t> seq = ctx;
  seq.insert(seq.end(), cont.begin(), cont.end());
  const auto r = le::loglikelihood(fn, {{ctx, cont}}, 4, 3)[0];
  CHECK(r.tokens == 9);
  double want = 0;
  for (const auto& w : le::plan_windows(6, 15, 4, 4))
    for (int64_t t = w.first; t < w.end; ++t) want += independent_logprob(*m, seq, w.begin, t);
  CHECK(r.logprob == doctest::Approx(want).epsilon(1e-5));
}

TEST_CASE("a model's scores with its head in chunks equal the scores of its whole logits") {
  auto m = model(29, 11);
  const std::vector<int32_t> ids = random_ids(2 * 9, 29, 3), targets = random_ids(2 * 9, 29, 4);
  const Tensor tokens = Tensor::from_ints(ids, {2, 9}, ref());
  const le::TargetScores whole = le::scores_from_logits(le::model_logits(*m))(tokens, targets);
  // 29 f32 logits a row: 4 rows a chunk (5 chunks, the last of 2), then one chunk
  for (const double mb : {4.0 * 29 * 4 / 1048576.0, 256.0}) {
    CAPTURE(mb);
    const le::TargetScores chunked = le::model_scores(*m, mb)(tokens, targets);
    REQUIRE(chunked.logprobs.size() == targets.size());
    CHECK(chunked.argmax == whole.argmax);
    for (size_t i = 0; i < targets.size(); ++i)
      CHECK(chunked.logprobs[i] == doctest::Approx(whole.logprobs[i]).epsilon(1e-6));
  }
  CHECK_THROWS_WITH_AS(le::model_scores(*m)(tokens, std::vector<int32_t>(18, 29)),
                       doctest::Contains("token id 29 is outside the vocabulary [0, 29)"), dew::Error);
}

TEST_CASE("LinearHeadModel::forward_rows: forward_hidden's states as the head's rows, shapes refused by name") {
  auto m = model(29, 11);
  auto* head = dynamic_cast<dew::LinearHeadModel*>(m.get());
  REQUIRE(head);
  dew::NoGradGuard ng;
  const dew::Batch in{{"tokens", Tensor::from_ints(random_ids(2 * 9, 29, 3), {2, 9}, ref())}};
  const dew::HiddenAndHead whole = head->forward_hidden(in), rows = head->forward_rows(in, 18, 29);
  CHECK(rows.hidden.shape() == dew::Shape{18, 16});
  CHECK(rows.weight.shape() == dew::Shape{29, 16});
  CHECK(rows.hidden.to_floats() == whole.hidden.to_floats());
  CHECK(head->forward_rows(in, 18).hidden.shape() == dew::Shape{18, 16});  // any vocabulary
  CHECK_THROWS_WITH_AS(head->forward_rows(in, 17, 29), doctest::Contains("do not give [17, 29] logits"), dew::Error);
  CHECK_THROWS_WITH_AS(head->forward_rows(in, 18, 30), doctest::Contains("and linear head [29, 16]"), dew::Error);
}

TEST_CASE("rolling log-likelihood: each token scored exactly once, with the window's context") {
  auto m = model(19, 3);
  const auto fn = le::model_scores(*m);
  const std::vector<int32_t> doc = random_ids(23, 19, 5);
  std::vector<int32_t> seq{0};
  seq.insert(seq.end(), doc.begin(), doc.end());
  for (int64_t L : {4, 7, 64})
    for (int64_t stride : {int64_t(1), L / 2 > 0 ? L / 2 : 1, L}) {
      const auto r = le::loglikelihood_rolling(fn, {doc}, 0, L, stride, 3)[0];
      CHECK(r.tokens == 23);
      REQUIRE(r.token_logprobs.size() == 23);
      int64_t k = 0;
      for (const auto& w : le::plan_windows(1, 24, L, stride))
        for (int64_t t = w.first; t < w.end; ++t, ++k)
          CHECK(r.token_logprobs[size_t(k)] == doctest::Approx(independent_logprob(*m, seq, w.begin, t)).epsilon(1e-5));
    }
  // With the whole document in one window, rolling equals the plain full-forward sum.
  double full = 0;
  for (size_t t = 1; t < seq.size(); ++t) full += independent_logprob(*m, seq, 0, int64_t(t));
  CHECK(le::loglikelihood_rolling(fn, {doc}, 0, 64, 64, 1)[0].logprob == doctest::Approx(full).epsilon(1e-5));
}

TEST_CASE("encode_pair: trailing context spaces move to the continuation (lm-evaluation-harness)") {
  auto tok = dew::make_byte_tokenizer();
  auto enc = [&](const std::string& s) { return tok->encode(s); };
  const auto [c, x] = le::encode_pair(enc, "Question: ab ", "cd");
  CHECK(c == tok->encode("Question: ab"));
  CHECK(x == tok->encode(" cd"));
}

namespace {

struct Run {
  fs::path dir;
  dew::Config cfg;
  std::shared_ptr<dew::Objective> obj;
  std::unique_ptr<dew::DataLoader> loader;
};

// An lm objective over a byte-tokenizer token folder (tokens source when built, else no data).
Run lm_run(const std::string& name) {
  ref();
  Run r;
  r.dir = fs::temp_directory_path() / ("dew_test_eval_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(r.dir);
  auto tok = dew::make_byte_tokenizer();
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i) docs.push_back("the cat sat on the mat. ");
  dew::write_token_corpus(*tok, docs, r.dir.string(), 0.2);
  r.cfg = dew::Config::parse_ini(
      "[objective]\nplugin = lm\nsample_tokens = 0\n[model]\nplugin = causal_transformer\n"
      "dim = 16\nn_layers = 1\nn_heads = 2\nmax_seq_len = 32\ntie_embeddings = false\n[data]\nsource = none\npath = " +
      r.dir.string() + "\n");
  r.obj = dew::Registry::global().create<dew::Objective>("lm", r.cfg.section("objective"));
  dew::ObjectiveContext ctx{&r.cfg, ref(), 5, nullptr};
  r.obj->build(ctx);
  r.loader = dew::make_loader(r.cfg.section("data"), "val", 0);
  return r;
}

dew::ValidationResult run_task(Run& r, std::map<std::string, std::string> req, const std::string& jsonl) {
  const fs::path f = r.dir / "requests.jsonl";
  std::ofstream(f) << jsonl;
  req["requests"] = f.string();
  dew::Options o(req, "eval");
  auto out = r.obj->evaluate(*r.loader, o, {0, 0, 0});
  o.check_all_used();
  return out;
}

std::vector<std::string> lines_of(const dew::Artifact& a) {
  std::vector<std::string> out;
  std::stringstream ss(std::string(a.bytes.begin(), a.bytes.end()));
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("lm eval tasks: loglikelihood, multiple_choice, rolling, perplexity through the objective") {
  Run r = lm_run("tasks");
  auto* m = r.obj->main_model();
  auto tok = dew::make_byte_tokenizer();
  auto ll = [&](const std::string& ctx, const std::string& cont) {
    auto [c, x] = le::encode_pair([&](const std::string& s) { return tok->encode(s); }, ctx, cont);
    std::vector<int32_t> seq = c;
    seq.insert(seq.end(), x.begin(), x.end());
    double s = 0;
    for (size_t t = c.size(); t < seq.size(); ++t) s += independent_logprob(*m, seq, 0, int64_t(t));
    return s;
  };
  // loglikelihood with text pairs (the tokenizer of the run).
  auto v = run_task(r, {{"task", "loglikelihood"}}, R"({"context": "the cat ", "continuation": "sat"}
{"context_ids": [116, 104], "continuation_ids": [101]}
)");
  CHECK(v.metrics.at("requests") == 2);
  REQUIRE(v.artifacts.size() == 1);
  CHECK(v.artifacts[0].file_name == "loglikelihood.jsonl");
  const double want0 = ll("the cat ", "sat"), want1 = independent_logprob(*m, {116, 104, 101}, 0, 2);
  CHECK(v.metrics.at("loglikelihood_sum") == doctest::Approx(want0 + want1).epsilon(1e-5));
  CHECK(lines_of(v.artifacts[0]).size() == 2);

  // multiple_choice: gold = the independently best choice for two questions, a wrong gold for the third.
  const std::vector<std::string> ch{"mat", "cat", "dog"};
  auto best = [&](const std::string& ctx) {
    int b = 0;
    for (int i = 1; i < 3; ++i)
      if (ll(ctx, " " + ch[size_t(i)]) > ll(ctx, " " + ch[size_t(b)])) b = i;
    return b;
  };
  const int b1 = best("the cat sat on the"), b2 = best("on the");
  std::ostringstream q;
  q << R"({"query": "the cat sat on the", "choices": ["mat", "cat", "dog"], "gold": )" << b1 << "}\n";
  q << R"({"query": "on the", "choices": ["mat", "cat", "dog"], "gold": )" << b2 << "}\n";
  q << R"({"query": "on the", "choices": ["mat", "cat", "dog"], "gold": )" << (b2 + 1) % 3 << "}\n";
  v = run_task(r, {{"task", "multiple_choice"}}, q.str());
  CHECK(v.metrics.at("questions") == 3);
  CHECK(v.metrics.at("acc") == doctest::Approx(2.0 / 3.0));

  // rolling: every byte of the text scored once, after an explicit --prefix_token.
  v = run_task(r, {{"task", "loglikelihood_rolling"}, {"prefix_token", "46"}, {"max_length", "8"}},
               R"({"text": "the cat sat on the mat."}
)");
  CHECK(v.metrics.at("tokens") == 23);
  CHECK(v.metrics.at("bits_per_byte") == doctest::Approx(-v.metrics.at("loglikelihood_sum") / std::log(2.0) / 23.0));
  // Without --prefix_token the rolling windows start from the tokenizer's document token (byte: 255).
  v = run_task(r, {{"task", "loglikelihood_rolling"}}, R"({"text": "x"})");
  CHECK(v.metrics.at("tokens") == 1);

  // perplexity of the token folder's val split: n - 1 tokens, bits per byte = ce / ln 2 for bytes.
  dew::Options o({{"task", "perplexity"}, {"max_length", "16"}, {"stride", "8"}}, "eval");
  v = r.obj->evaluate(*r.loader, o, {0, 0, 0});
  o.check_all_used();
  const dew::TokenMeta meta = dew::read_token_meta(r.dir.string());
  CHECK(v.metrics.at("tokens") == double(meta.val_tokens - 1));
  CHECK(v.metrics.at("bits_per_byte") == doctest::Approx(v.metrics.at("ce") / std::log(2.0)));
  CHECK(v.metrics.at("perplexity") == doctest::Approx(std::exp(v.metrics.at("ce"))));

  // A folder tokenized by another tokenizer is refused (its scores would be of tokens the model did not
  // learn), as are ids past the model's vocabulary and a prefix token outside it.
  const fs::path other = r.dir / "other";
  fs::create_directories(other);
  for (const char* f : {"train.bin", "val.bin"}) fs::copy_file(r.dir / f, other / f);
  auto write_meta = [&](const std::string& tokenizer, int64_t vocab, const std::string& dtype) {
    std::ofstream(other / "meta.json") << R"({"tokenizer": ")" << tokenizer << R"(", "vocab_size": )" << vocab
                                       << R"(, "dtype": ")" << dtype << R"(", "train_tokens": )" << meta.train_tokens
                                       << R"(, "val_tokens": )" << meta.val_tokens << "}";
  };
  write_meta("bpe", 250, "uint8");
  dew::Options bpe({{"task", "perplexity"}, {"data", other.string()}}, "eval");
  CHECK_THROWS_WITH_AS(
      r.obj->evaluate(*r.loader, bpe, {0, 0, 0}),
      doctest::Contains("tokenized by a bpe tokenizer of 250 tokens; the run's is a byte tokenizer of 256"),
      dew::UsageError);
  {  // no tokenizer named: the ids themselves are checked (uint16 299 at token 3)
    std::vector<uint16_t> ids(size_t(meta.val_tokens), 97);
    ids[3] = 299;
    std::ofstream(other / "val.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
    write_meta("", 300, "uint16");
  }
  dew::Options ids({{"task", "perplexity"}, {"data", other.string()}}, "eval");
  CHECK_THROWS_WITH_AS(
      r.obj->evaluate(*r.loader, ids, {0, 0, 0}),
      doctest::Contains(
          ("token 3 of " + (other / "val.bin").string() + " is 299, outside the model's vocabulary of 256").c_str()),
      dew::UsageError);
  for (const char* p : {"256", "4294967297", "-2"}) {
    CHECK_THROWS_WITH_AS(
        run_task(r, {{"task", "loglikelihood_rolling"}, {"prefix_token", p}}, R"({"text": "x"})"),
        doctest::Contains(
            ("--prefix_token " + std::string(p) + " must be -1 (none) or a token id in [0, 256)").c_str()),
        dew::UsageError);
  }

  // Unknown tasks and unread keys are refused.
  dew::Options bad({{"task", "hellaswag"}}, "eval");
  CHECK_THROWS_WITH_AS(r.obj->evaluate(*r.loader, bad, {0, 0, 0}), doctest::Contains("unknown --task"),
                       dew::UsageError);
  dew::Options none({}, "eval");
  CHECK_THROWS_WITH_AS(r.obj->evaluate(*r.loader, none, {0, 0, 0}), doctest::Contains("no validation data"),
                       dew::UsageError);
  fs::remove_all(r.dir);
}

TEST_CASE("lm eval generate_until: greedy generation cut at the first stop string") {
  Run r = lm_run("gen");
  // A hand-set bigram model: every block's weights are 0 (the residual stream keeps the embedding),
  // embed[b] = one-hot(b % 16), lm_head[a + (j + 1) % 16][j] = 10, so after byte b the argmax is
  // 'a' + (b % 16 + 1) % 16. After "the cat" ('t' = 116, 116 % 16 = 4): f h j l n p b d f ...
  for (auto& [n, t] : r.obj->main_model()->named_parameters()) {
    std::vector<float> w(size_t(t.numel()), 0.0f);
    if (n == "model.embed_tokens.weight")
      for (int b = 0; b < 256; ++b) w[size_t(b * 16 + b % 16)] = 1.0f;
    if (n == "lm_head.weight")
      for (int j = 0; j < 16; ++j) w[size_t(('a' + (j + 1) % 16) * 16 + j)] = 10.0f;
    if (n == "model.norm.weight") std::fill(w.begin(), w.end(), 1.0f);
    t.copy_from_host(w.data());
  }
  auto v = run_task(r, {{"task", "generate_until"}, {"max_gen_toks", "24"}},
                    R"({"context": "the cat", "until": ["n"], "target": "fhjl"}
{"context": "the cat", "until": "zz", "max_gen_toks": 4, "target": " fhjl "}
{"context": "the cat", "until": ["q", "lnp"], "max_gen_toks": 9}
{"context_ids": [116], "max_gen_toks": 6}
)");
  const auto rows = lines_of(v.artifacts[0]);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].find(R"("generation":"fhjl")") != std::string::npos);
  CHECK(rows[0].find(R"("finish_reason":"stop")") != std::string::npos);
  CHECK(rows[0].find(R"("tokens":[102,104,106,108])") != std::string::npos);
  CHECK(rows[1].find(R"("generation":"fhjl")") != std::string::npos);
  CHECK(rows[1].find(R"("finish_reason":"length")") != std::string::npos);
  CHECK(rows[2].find(R"("generation":"fhj")") != std::string::npos);  // "lnp" starts at byte 3
  CHECK(rows[2].find(R"("finish_reason":"stop")") != std::string::npos);
  CHECK(rows[3].find(R"("generation":"fhjlnp")") != std::string::npos);
  CHECK(v.metrics.at("exact_match") == 1.0);  // both targets match after trimming
  CHECK(v.metrics.at("generated_tokens_mean") == doctest::Approx((4 + 4 + 3 + 6) / 4.0));
  fs::remove_all(r.dir);
}
