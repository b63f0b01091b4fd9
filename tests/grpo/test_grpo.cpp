// tests/grpo/test_grpo.cpp — GRPO (plugins/objectives/grpo) over prompts (plugins/data/prompt_jsonl), with the
// built-in reward functions (plugins/objectives/grpo/rewards.cpp) and rewards registered here, in the test process,
// as a plugin would register its own.
//
// The rollout is held to dew::generate(): completion g of prompt b is generate()'s with Philox stream (position + b)
// * G + g. The loss is recomputed independently: the completions the step drew (captured by a reward) are laid out
// again, the model's logits are read back, and every advantage, weight, log-softmax and KL term is done here in
// double, for each loss type and scaling, with the KL penalty against a reference that differs from the policy; the
// parameters' gradients are held to those of the surrogate sum_t c_t log pi_t formed through log_softmax and a one-hot
// product (another path than the objective's cross-entropy rows). A short dew::train run must raise the validation
// reward well above the untrained policy's, and a resumed run must equal a straight one bit for bit.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/reward.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"
#include "temp_dir.hpp"

using dew::Tensor;
namespace fs = std::filesystem;
using dew_test::TempDir;

namespace {

constexpr int64_t kVocab = 256;  // the byte tokenizer's
constexpr int32_t kEos = 255;

// The completions the last scoring saw (the "capture" reward below).
std::mutex captured_mu;
std::vector<dew::Completion> captured;

// capture: records what it scores; its score is the share of even token ids (varied, deterministic).
class Capture final : public dew::Reward {
 public:
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::lock_guard<std::mutex> lock(captured_mu);
    captured = cs;
    std::vector<double> out;
    for (const auto& c : cs) {
      double even = 0;
      for (int32_t t : c.tokens) even += t % 2 == 0;
      out.push_back(c.tokens.empty() ? 0.0 : even / double(c.tokens.size()));
    }
    return out;
  }
};

// target: the share of the completion's tokens equal to the answer's first byte (a dense, prompt-dependent reward).
class Target final : public dew::Reward {
 public:
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out;
    for (const auto& c : cs) {
      double hits = 0;
      for (int32_t t : c.tokens) hits += !c.answer.empty() && t == int32_t(static_cast<unsigned char>(c.answer[0]));
      out.push_back(hits / double(std::max<size_t>(1, c.tokens.size())));
    }
    return out;
  }
};

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref"))
      reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "causal_transformer", "grpo", "prompt_jsonl"});
    reg.builtin_registrar().add<dew::Reward>(
        {.name = "capture", .description = "test: records the completions", .factory = [](const dew::Options&) {
           return std::shared_ptr<dew::Reward>(std::make_shared<Capture>());
         }});
    reg.builtin_registrar().add<dew::Reward>(
        {.name = "target", .description = "test: the share of the answer's byte", .factory = [](const dew::Options&) {
           return std::shared_ptr<dew::Reward>(std::make_shared<Target>());
         }});
    return dew::create_backend("ref");
  }();
  dew::set_default_backend(be);
  return be;
}

std::string byte_folder(const fs::path& dir) {
  auto tok = dew::make_byte_tokenizer();
  dew::write_token_corpus(*tok, {"placeholder"}, (dir / "bytes").string(), 0.0);
  return (dir / "bytes").string();
}

std::string write_prompts(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& lines,
                          const char* name = "prompts.jsonl") {
  const fs::path p = dir / name;
  std::ofstream out(p);
  for (const auto& [prompt, answer] : lines) out << "{\"prompt\": " << prompt << ", \"answer\": " << answer << "}\n";
  return p.string();
}

std::shared_ptr<dew::DataSource> prompt_source(const std::string& path, const std::string& bytes,
                                               const std::string& prompt_len = "8", const std::string& extra = "") {
  dew::Options o({{"path", path}, {"tokenizer", bytes}, {"prompt_len", prompt_len}}, "data");
  if (!extra.empty()) o.set(extra, "true");
  return dew::Registry::global().create<dew::DataSource>("prompt_jsonl", o);
}

dew::Batch batch_of(const dew::DataSource& src, int64_t b) {
  std::vector<int32_t> prompt, length, answer, answer_length;
  int64_t p = 0, a = 0;
  for (int64_t i = 0; i < b; ++i) {
    const dew::Record r = src.get(i);
    p = r.at("prompt").shape[0];
    a = r.at("answer").shape[0];
    prompt.insert(prompt.end(), r.at("prompt").as<int32_t>(), r.at("prompt").as<int32_t>() + p);
    length.push_back(*r.at("prompt_length").as<int32_t>());
    for (int64_t k = 0; k < a; ++k) answer.push_back(r.at("answer").as<unsigned char>()[k]);
    answer_length.push_back(*r.at("answer_length").as<int32_t>());
  }
  return {{"prompt", Tensor::from_ints(prompt, {b, p}, ref())},
          {"prompt_length", Tensor::from_ints(length, {b}, ref())},
          {"answer", Tensor::from_ints(answer, {b, a}, ref())},
          {"answer_length", Tensor::from_ints(answer_length, {b}, ref())}};
}

// num_generations 4; max_completion_length 6 unless `objective` sets it.
dew::Config grpo_config(const std::string& bytes, const std::string& path, const std::string& objective) {
  const bool sets_length = objective.find("max_completion_length") != std::string::npos;
  return dew::Config::parse_ini(
      std::string("[objective]\nplugin = grpo\n") + (sets_length ? "" : "max_completion_length = 6\n") +
      (objective.find("num_generations") != std::string::npos ? "" : "num_generations = 4\n") + objective +
      "\n[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n"
      "[data]\nsource = prompt_jsonl\nprompt_len = 8\nbatch_size = 2\npath = " +
      path + "\ntokenizer = " + bytes + "\n");
}

std::shared_ptr<dew::Objective> build_grpo(dew::Config& cfg, const dew::DataSource& src) {
  auto obj = dew::Registry::global().create<dew::Objective>("grpo", cfg.section("objective"));
  dew::ObjectiveContext ctx{&cfg, ref(), 5, &src};
  obj->build(ctx);
  return obj;
}

// The rows the step trains on: prompt tokens then the completion's (and EOS when it ended there), padded with EOS.
struct Rows {
  std::vector<int32_t> ids;
  std::vector<int> mask;  // 1 on the completion's scored tokens
  std::vector<int64_t> counts;
  int64_t rows = 0, width = 0;
};
Rows lay_out(const std::vector<std::vector<int32_t>>& prompts, const std::vector<dew::Completion>& cs, int64_t group,
             bool mask_truncated = false) {
  Rows r;
  r.rows = int64_t(cs.size());
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i = 0; i < r.rows; ++i) {
    std::vector<int32_t> s = prompts[size_t(i / group)];
    s.insert(s.end(), cs[size_t(i)].tokens.begin(), cs[size_t(i)].tokens.end());
    if (cs[size_t(i)].finish_reason == "eos") s.push_back(kEos);
    r.width = std::max<int64_t>(r.width, int64_t(s.size()));
    seqs.push_back(s);
  }
  r.ids.assign(size_t(r.rows * r.width), kEos);
  r.mask.assign(size_t(r.rows * r.width), 0);
  for (int64_t i = 0; i < r.rows; ++i) {
    const bool dropped = mask_truncated && cs[size_t(i)].finish_reason == "length";
    const size_t plen = prompts[size_t(i / group)].size();
    int64_t n = 0;
    for (size_t k = 0; k < seqs[size_t(i)].size(); ++k) {
      r.ids[size_t(i * r.width) + k] = seqs[size_t(i)][k];
      if (k >= plen && !dropped) {
        r.mask[size_t(i * r.width) + k] = 1;
        ++n;
      }
    }
    r.counts.push_back(n);
  }
  return r;
}

// log pi(ids[i, j + 1] | ...) in double from the model's logits over ids[:, :-1]: [rows * (width - 1)].
std::vector<double> token_logps(dew::Model& m, const Rows& r) {
  const int64_t s = r.width - 1;
  std::vector<int32_t> in;
  for (int64_t i = 0; i < r.rows; ++i)
    in.insert(in.end(), r.ids.begin() + i * r.width, r.ids.begin() + i * r.width + s);
  dew::NoGradGuard g;
  const std::vector<float> logits = m.forward({{"tokens", Tensor::from_ints(in, {r.rows, s}, ref())}}).to_floats();
  std::vector<double> out(static_cast<size_t>(r.rows * s), 0.0);
  for (int64_t i = 0; i < r.rows; ++i)
    for (int64_t j = 0; j < s; ++j) {
      const float* l = logits.data() + (i * s + j) * kVocab;
      double mx = l[0], z = 0;
      for (int64_t k = 1; k < kVocab; ++k) mx = std::max<double>(mx, l[k]);
      for (int64_t k = 0; k < kVocab; ++k) z += std::exp(double(l[k]) - mx);
      out[size_t(i * s + j)] = double(l[r.ids[size_t(i * r.width + j + 1)]]) - mx - std::log(z);
    }
  return out;
}

// Advantages in double: TRL's (r - group mean) / (std + 1e-4), std unbiased; batch: the whole batch's std; none.
std::vector<double> advantages(const std::vector<double>& rewards, int64_t group, const std::string& scale) {
  const int64_t n = int64_t(rewards.size());
  auto stats = [](const double* r, int64_t k) {
    double mean = 0, ss = 0;
    for (int64_t i = 0; i < k; ++i) mean += r[i];
    mean /= double(k);
    for (int64_t i = 0; i < k; ++i) ss += (r[i] - mean) * (r[i] - mean);
    return std::make_pair(mean, std::sqrt(ss / double(k - 1)));
  };
  const double batch_std = stats(rewards.data(), n).second;
  std::vector<double> a;
  for (int64_t b = 0; b < n / group; ++b) {
    const auto [mean, sd] = stats(rewards.data() + b * group, group);
    for (int64_t g = 0; g < group; ++g) {
      const double d = rewards[size_t(b * group + g)] - mean;
      a.push_back(scale == "group" ? d / (sd + 1e-4) : scale == "batch" ? d / (batch_std + 1e-4) : d);
    }
  }
  return a;
}

// Each scored token's weight c_t = -w_t A_i (the loss's coefficient of pi_t / pi_old_t), and w_t (the KL's).
std::vector<double> token_weights(const Rows& r, const std::string& loss_type, int64_t max_completion) {
  const int64_t s = r.width - 1;
  int64_t total = 0;
  for (int64_t n : r.counts) total += n;
  std::vector<double> w(static_cast<size_t>(r.rows * s), 0.0);
  for (int64_t i = 0; i < r.rows; ++i)
    for (int64_t j = 0; j < s; ++j)
      if (r.mask[size_t(i * r.width + j + 1)])
        w[size_t(i * s + j)] = loss_type == "grpo" ? 1.0 / (double(std::max<int64_t>(1, r.counts[size_t(i)])) * r.rows)
                               : loss_type == "bnpo" ? 1.0 / double(total)
                                                     : 1.0 / (double(r.rows) * double(max_completion));
  return w;
}

std::vector<double> capture_rewards(const std::vector<dew::Completion>& cs) {
  Capture c;
  std::vector<double> r = c.score(cs);
  return r;
}

}  // namespace

TEST_CASE("prompt_jsonl: prompt tokens, lengths, answers as bytes, left truncation and refusals") {
  ref();
  TempDir d("source");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_prompts(d.path, {{"\"2+3=\"", "\"5\""},
                                                  {"[{\"role\": \"user\", \"content\": \"hi\"}]", "42"},
                                                  {"\"abc\"", "\"a longer answer\""}});
  auto src = prompt_source(path, bytes, "64");
  REQUIRE(src->size() == 3);
  const dew::Record r0 = src->get(0);
  CHECK(r0.at("prompt").shape == dew::Shape{64});
  CHECK(*r0.at("prompt_length").as<int32_t>() == 4);
  CHECK(std::string(r0.at("prompt").as<int32_t>(), r0.at("prompt").as<int32_t>() + 4) == std::string("2+3="));
  CHECK(r0.at("prompt").as<int32_t>()[4] == 0);
  CHECK(r0.at("answer").shape == dew::Shape{15});  // the longest answer
  CHECK(*r0.at("answer_length").as<int32_t>() == 1);
  CHECK(r0.at("answer").as<unsigned char>()[0] == '5');
  const dew::Record r1 = src->get(1);  // messages: rendered with the chat template's generation prompt
  CHECK(*r1.at("prompt_length").as<int32_t>() > 2);
  CHECK(*r1.at("answer_length").as<int32_t>() == 2);  // a number is kept as its JSON text
  CHECK(r1.at("answer").as<unsigned char>()[1] == '2');
  // Longer than prompt_len: refused naming the line, or cut from the left with truncate.
  CHECK_THROWS_WITH_AS(prompt_source(path, bytes, "3"), doctest::Contains("prompts.jsonl:1: the prompt is 4 tokens"),
                       dew::UsageError);
  auto cut = prompt_source(path, bytes, "3", "truncate");
  const dew::Record c0 = cut->get(0);
  CHECK(*c0.at("prompt_length").as<int32_t>() == 3);
  CHECK(std::string(c0.at("prompt").as<int32_t>(), c0.at("prompt").as<int32_t>() + 3) == std::string("+3="));
  const std::string bad = write_prompts(d.path, {{"\"ok\"", "\"1\""}, {"7", "\"1\""}}, "bad.jsonl");
  CHECK_THROWS_WITH_AS(prompt_source(bad, bytes), doctest::Contains("bad.jsonl:2: a line is {\"prompt\""),
                       dew::UsageError);
  std::ofstream(d.path / "broken.jsonl") << "{\"prompt\": \n";
  CHECK_THROWS_WITH_AS(prompt_source((d.path / "broken.jsonl").string(), bytes),
                       doctest::Contains("broken.jsonl:1: not valid JSON"), dew::UsageError);
}

TEST_CASE("the built-in rewards: accuracy, contains, number_match, format and overlong") {
  ref();
  auto& reg = dew::Registry::global();
  auto completion = [](const std::string& text, const std::string& answer, size_t tokens = 3) {
    dew::Completion c;
    c.text = text;
    c.answer = answer;
    c.tokens.assign(tokens, 1);
    c.finish_reason = "eos";
    return c;
  };
  const std::vector<dew::Completion> cs = {
      completion("  42\n", "42"),
      completion("so the answer is 41", "42"),
      completion("first 3, then #### 1,234", "#### 1234"),
      completion("it is \\boxed{-0.5} and 7 later", "-.5"),
      completion("<a>7</a>", ""),
  };
  auto scores = [&](const char* name, const dew::Options& o = {}) {
    return reg.create<dew::Reward>(name, o)->score(cs);
  };
  const auto acc = scores("accuracy");
  CHECK(acc[0] == 1.0);
  CHECK(acc[1] == 0.0);
  CHECK(std::isnan(acc[4]));  // no answer: not scored
  const auto has = scores("contains");
  CHECK(has[0] == 1.0);
  CHECK(has[1] == 0.0);
  const auto num = scores("number_match");
  CHECK(std::vector<double>(num.begin(), num.begin() + 4) == std::vector<double>{1.0, 0.0, 1.0, 1.0});
  CHECK(std::isnan(num[4]));
  const auto fmt = scores("format", dew::Options({{"format_pattern", "^<a>[0-9]+</a>$"}}, "reward"));
  CHECK(fmt == std::vector<double>{0, 0, 0, 0, 1});
  CHECK_THROWS_WITH_AS(scores("format"), doctest::Contains("needs [reward] format_pattern"), dew::UsageError);
  CHECK_THROWS_WITH_AS(scores("format", dew::Options({{"format_pattern", "(("}}, "reward")),
                       doctest::Contains("not a valid regular expression"), dew::UsageError);
  std::vector<dew::Completion> lengths;
  for (size_t n : {8u, 9u, 10u, 11u}) lengths.push_back(completion("", "", n));
  const auto over =
      reg.create<dew::Reward>("overlong",
                              dew::Options({{"overlong_max_length", "10"}, {"overlong_buffer", "2"}}, "reward"))
          ->score(lengths);
  CHECK(over == std::vector<double>{0.0, -0.5, -1.0, -1.0});
}

TEST_CASE("the command reward: a program's last output line, its stdin and environment, timeouts, parallel runs") {
  ref();
  auto& reg = dew::Registry::global();
  auto completion = [](const std::string& text, const std::string& answer) {
    dew::Completion c;
    c.text = text;
    c.answer = answer;
    c.prompt = "p?";
    c.finish_reason = "eos";
    return c;
  };
  auto command = [&](const std::string& line, const std::vector<std::pair<std::string, std::string>>& more = {}) {
    dew::Options o({{"command", line}}, "reward");
    for (const auto& [k, v] : more) o.set(k, v);
    return reg.create<dew::Reward>("command", o);
  };
  // stdin: the completion; stdout's last line: the score (earlier lines ignored); no number: NaN.
  const auto counts = command("echo noise; tr -cd a | wc -c")
                          ->score({completion("banana", ""), completion("", ""), completion("aaaa", "")});
  CHECK(counts == std::vector<double>{3, 0, 4});
  const auto env = command("printf 'x\\n%s\\n' \"$DEW_ANSWER\"; test \"$DEW_PROMPT\" = 'p?' || echo bad")
                       ->score({completion("", "42"), completion("", "1.5e1"), completion("", "none")});
  CHECK(env[0] == 42.0);
  CHECK(env[1] == 15.0);
  CHECK(std::isnan(env[2]));
  // A program that does not read a large stdin (the trainer must not die of SIGPIPE), and one that exits at once.
  CHECK(command("echo 7")->score({completion(std::string(1 << 20, 'x'), "")}) == std::vector<double>{7});
  CHECK(std::isnan(command("exit 3")->score({completion("x", "")})[0]));  // nothing printed: not scored
  // Timeouts: the program (and what it started in its group) killed, its score command_timeout_score; 8 programs of
  // 0.3 s, 4 at once, finish in about 0.6 s.
  const auto t0 = std::chrono::steady_clock::now();
  const auto late = command("sleep 20; echo 1", {{"command_timeout", "0.3"}, {"command_timeout_score", "-1"}})
                        ->score({completion("", ""), completion("", "")});
  CHECK(late == std::vector<double>{-1, -1});
  const auto grand = command("(sleep 20 &); echo 5", {{"command_timeout", "0.3"}})->score({completion("", "")});
  CHECK(grand == std::vector<double>{0});  // its stdout held open by the background sleep: killed at the timeout
  const double killed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(killed < 5.0);
  const auto t1 = std::chrono::steady_clock::now();
  const auto many = command("sleep 0.3; echo 1", {{"command_parallel", "4"}})
                        ->score(std::vector<dew::Completion>(8, completion("", "")));
  CHECK(many == std::vector<double>(8, 1.0));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() < 2.0);  // not 8 x 0.3 in turn
  // A program waiting for its stdin's end while a later one runs: it ends at once (no pipe held open by the other).
  const auto t2 = std::chrono::steady_clock::now();
  const auto waits = command("if [ \"$DEW_ANSWER\" = slow ]; then sleep 3; fi; wc -c", {{"command_timeout", "2"}})
                         ->score({completion("abc", "fast"), completion("de", "slow")});
  CHECK(waits[0] == 3.0);
  CHECK(waits[1] == 0.0);  // the slow one: killed at its timeout
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count() < 2.9);
  CHECK_THROWS_WITH_AS(reg.create<dew::Reward>("command", dew::Options({}, "reward")),
                       doctest::Contains("needs [reward] command"), dew::UsageError);
}

TEST_CASE("grpo's rollout is dew::generate's: completion g of prompt b on Philox stream (position + b) * G + g") {
  ref();
  TempDir d("rollout");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_prompts(d.path, {{"\"ab:\"", "\"a\""}, {"\"xyz:\"", "\"b\""}});
  auto src = prompt_source(path, bytes);
  dew::Config cfg = grpo_config(bytes, path, "rewards = capture\ntemperature = 1.3");
  auto obj = build_grpo(cfg, *src);
  const dew::StepInfo info{0, 0, 5, 6};  // position 6: streams 24..31
  obj->step(batch_of(*src, 2), info);
  const std::vector<dew::Completion> got = captured;
  REQUIRE(got.size() == 8);
  auto* decoder = dynamic_cast<dew::CausalDecoder*>(obj->main_model());
  REQUIRE(decoder);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 32; ++i)
    prompts.push_back(i < 28 ? std::vector<int32_t>{'a', 'b', ':'} : std::vector<int32_t>{'x', 'y', 'z', ':'});
  dew::SamplingParams sp;
  sp.temperature = 1.3f;
  sp.seed = 5;
  sp.eos_id = kEos;
  sp.max_new_tokens = 6;
  obj->main_model()->set_training(false);
  const auto solo = dew::generate(dew::decoder_start(*decoder), prompts, sp);
  bool some_differ = false;
  for (int i = 0; i < 8; ++i) {
    CHECK(got[size_t(i)].tokens == solo[size_t(24 + i)].tokens);
    CHECK(got[size_t(i)].finish_reason == solo[size_t(24 + i)].finish_reason);
    CHECK(got[size_t(i)].answer == (i < 4 ? "a" : "b"));
    CHECK(got[size_t(i)].prompt == (i < 4 ? "ab:" : "xyz:"));
    some_differ = some_differ || got[size_t(i)].tokens != got[0].tokens;
  }
  CHECK(some_differ);
  // eos_token: another token ends the completions ('!', 33, here), as generate() with that eos_id.
  {
    dew::Config bang = grpo_config(bytes, path,
                                   "rewards = capture\ntemperature = 1.3\nmax_completion_length = 160\n"
                                   "eos_token = !");
    build_grpo(bang, *src)->step(batch_of(*src, 2), info);
    dew::SamplingParams bsp = sp;
    bsp.eos_id = '!';
    bsp.max_new_tokens = 160;
    const auto want = dew::generate(dew::decoder_start(*decoder), prompts, bsp);
    int ended = 0;
    for (int i = 0; i < 8; ++i) {
      CHECK(captured[size_t(i)].tokens == want[size_t(24 + i)].tokens);
      CHECK(captured[size_t(i)].finish_reason == want[size_t(24 + i)].finish_reason);
      ended += captured[size_t(i)].finish_reason == "eos";
    }
    CHECK(ended > 0);
  }
  // One slot at a time (generation_cache_mb below one slot's cache) or two: the same completions.
  for (const char* limit : {"generation_cache_mb = 0.0001", "generation_slots = 2"}) {
    CAPTURE(limit);
    dew::Config narrow = grpo_config(bytes, path, std::string("rewards = capture\ntemperature = 1.3\n") + limit);
    build_grpo(narrow, *src)->step(batch_of(*src, 2), info);
    for (int i = 0; i < 8; ++i) CHECK(captured[size_t(i)].tokens == got[size_t(i)].tokens);
  }
}

TEST_CASE("grpo's loss and gradients against double precision: every loss type and scaling, the KL penalty") {
  ref();
  TempDir d("loss");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_prompts(d.path, {{"\"ab:\"", "\"a\""}, {"\"xyz:\"", "\"b\""}});
  auto src = prompt_source(path, bytes);
  const std::vector<std::vector<int32_t>> prompts = {{'a', 'b', ':'}, {'x', 'y', 'z', ':'}};
  struct Case {
    std::string loss_type, scale;
    bool mask_truncated;
  };
  for (const Case& c : {Case{"bnpo", "group", false}, Case{"grpo", "batch", false}, Case{"dr_grpo", "none", true},
                        Case{"grpo", "group", true}}) {
    CAPTURE(c.loss_type);
    CAPTURE(c.scale);
    // 160 tokens at most: an untrained byte model ends about half its completions at EOS (255) before that, so
    // mask_truncated_completions has both kinds to tell apart.
    dew::Config cfg = grpo_config(bytes, path,
                                  "rewards = capture\nmax_completion_length = 160\nloss_type = " + c.loss_type +
                                      "\nscale_rewards = " + c.scale +
                                      "\nmask_truncated_completions = " + (c.mask_truncated ? "true" : "false"));
    auto obj = build_grpo(cfg, *src);
    dew::Model& m = *obj->main_model();
    dew::StepResult r = obj->step(batch_of(*src, 2), {0, 0, 5, 0});
    const std::vector<dew::Completion> cs = captured;
    const Rows rows = lay_out(prompts, cs, 4, c.mask_truncated);
    const std::vector<double> a = advantages(capture_rewards(cs), 4, c.scale);
    const std::vector<double> w = token_weights(rows, c.loss_type, 160);
    int64_t ended = 0;
    for (const auto& x : cs) ended += x.finish_reason == "eos";
    CHECK(ended > 0);
    CHECK(ended < 8);
    const int64_t s = rows.width - 1;
    double expected = 0, magnitude = 0;  // the terms cancel (advantages sum to 0 over a group): compare to their size
    std::vector<float> coef(w.size());
    for (int64_t i = 0; i < rows.rows; ++i)
      for (int64_t j = 0; j < s; ++j) {
        expected += -w[size_t(i * s + j)] * a[size_t(i)];
        magnitude += std::fabs(w[size_t(i * s + j)] * a[size_t(i)]);
        coef[size_t(i * s + j)] = float(-w[size_t(i * s + j)] * a[size_t(i)]);
      }
    CHECK(magnitude > 1e-3);
    CHECK(std::fabs(r.loss.item() - expected) <= 1e-6 * magnitude);
    // Gradients: the objective's backward against the surrogate sum_t c_t log pi_t through log_softmax and a one-hot.
    r.loss.backward();
    std::map<std::string, std::vector<float>> grads;
    for (auto& [n, t] : obj->parameters()) {
      grads[n] = t.grad().defined() ? t.grad().to_floats() : std::vector<float>(size_t(t.numel()), 0.0f);
      t.zero_grad();
    }
    std::vector<int32_t> in;
    std::vector<float> onehot(size_t(rows.rows * s * kVocab), 0.0f);
    for (int64_t i = 0; i < rows.rows; ++i) {
      in.insert(in.end(), rows.ids.begin() + i * rows.width, rows.ids.begin() + i * rows.width + s);
      for (int64_t j = 0; j < s; ++j)
        onehot[size_t((i * s + j) * kVocab + rows.ids[size_t(i * rows.width + j + 1)])] = coef[size_t(i * s + j)];
    }
    m.set_training(true);
    const Tensor logits =
        dew::reshape(m.forward({{"tokens", Tensor::from_ints(in, {rows.rows, s}, ref())}}), {rows.rows * s, kVocab});
    dew::sum(dew::log_softmax(logits) * Tensor::from_vector(onehot, {rows.rows * s, kVocab}, ref())).backward();
    double err = 0, norm = 0;
    for (auto& [n, t] : obj->parameters()) {
      const std::vector<float> want = t.grad().defined() ? t.grad().to_floats() : std::vector<float>(grads[n].size());
      for (size_t k = 0; k < want.size(); ++k) {
        err = std::max(err, std::fabs(double(want[k]) - grads[n][k]));
        norm = std::max(norm, std::fabs(double(want[k])));
      }
      t.zero_grad();
    }
    CHECK(norm > 1e-6);
    CHECK(err <= 1e-5 * norm + 1e-9);
  }

  SUBCASE("beta > 0: the KL penalty to the starting weights, k3 per token") {
    dew::Config cfg = grpo_config(bytes, path, "rewards = capture\nbeta = 0.2\nreference = copy");
    auto obj = build_grpo(cfg, *src);
    dew::Config cfg0 = grpo_config(bytes, path, "rewards = capture");
    auto start = build_grpo(cfg0, *src);         // the same seed: the starting weights
    obj->step(batch_of(*src, 2), {0, 0, 5, 0});  // freezes the reference
    {
      dew::NoGradGuard g;
      for (auto& [n, t] : obj->parameters()) {
        std::vector<float> v = t.to_floats();
        std::mt19937 rng(uint32_t(n.size()));
        std::normal_distribution<float> noise(0.0f, 0.05f);
        for (float& x : v) x += noise(rng);
        t.copy_(Tensor::from_vector(v, t.shape(), ref()));
      }
    }
    dew::StepResult r = obj->step(batch_of(*src, 2), {1, 0, 5, 2});
    const std::vector<dew::Completion> cs = captured;
    const Rows rows = lay_out(prompts, cs, 4);
    const std::vector<double> a = advantages(capture_rewards(cs), 4, "group");
    const std::vector<double> w = token_weights(rows, "bnpo", 6);
    const std::vector<double> lp = token_logps(*obj->main_model(), rows), lr = token_logps(*start->main_model(), rows);
    const int64_t s = rows.width - 1;
    double expected = 0, kl = 0, tokens = 0;
    for (int64_t i = 0; i < rows.rows; ++i)
      for (int64_t j = 0; j < s; ++j) {
        if (!rows.mask[size_t(i * rows.width + j + 1)]) continue;
        const double dlt = lr[size_t(i * s + j)] - lp[size_t(i * s + j)], k3 = std::exp(dlt) - dlt - 1;
        expected += w[size_t(i * s + j)] * (-a[size_t(i)] + 0.2 * k3);
        kl += k3;
        tokens += 1;
      }
    CHECK(kl / tokens > 1e-5);  // the perturbed policy is not the reference
    CHECK(r.loss.item() == doctest::Approx(expected).epsilon(1e-5));
    CHECK(r.metrics.at("kl") == doctest::Approx(kl / tokens).epsilon(1e-4));
    CHECK(obj->state().back().first == "reference_ready");
  }
}

TEST_CASE("grpo refuses what it cannot run, each in one line") {
  ref();
  TempDir d("refuse");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_prompts(d.path, {{"\"ab:\"", "\"a\""}});
  auto src = prompt_source(path, bytes);
  auto refused = [&](const std::string& objective, const char* message) {
    dew::Config cfg = grpo_config(bytes, path, objective);
    CHECK_THROWS_WITH_AS(build_grpo(cfg, *src), doctest::Contains(message), dew::UsageError);
  };
  refused("", "option 'objective.rewards' is required");
  refused("rewards = nope", "unknown reward 'nope'");
  refused("rewards = accuracy\nnum_generations = 1", "num_generations' must be >= 2");
  refused("rewards = accuracy, contains\nreward_weights = 1", "has 1 weights for 2 reward functions");
  refused("rewards = accuracy\nloss_type = dapo", "must be bnpo, grpo or dr_grpo");
  refused("rewards = accuracy\nscale_rewards = rank", "must be group, batch or none");
  refused("rewards = format", "needs [reward] format_pattern");
  refused("rewards = accuracy\neos_token = ab", "objective.eos_token 'ab' is 2 tokens of this tokenizer, not one");
}

namespace {

// 8 prompts "<word>:" whose answers are the letters a-d: the target reward asks for the answer's letter, so the policy
// must learn a prompt-dependent choice. The same 8 lines twice: the first 8 are the val split, the rest train.
std::string write_letter_prompts(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> lines;
  const char* words[] = {"cat", "dog", "sun", "sea", "red", "fig", "owl", "ink"};
  for (int copy = 0; copy < 2; ++copy)
    for (int i = 0; i < 8; ++i)
      lines.push_back({"\"" + std::string(words[i]) + ":\"", "\"" + std::string(1, char('a' + i % 4)) + "\""});
  return write_prompts(dir, lines, "letters.jsonl");
}

dew::Config letters_config(const std::string& bytes, const std::string& path, int steps,
                           const std::string& extra = "") {
  return dew::Config::parse_ini(
      "[run]\nname = grpo-letters\nbackend = cpu\nseed = 3\n"
      "[model]\nplugin = causal_transformer\ndim = 32\nn_layers = 1\nn_heads = 2\n"
      "[objective]\nplugin = grpo\nrewards = target\nnum_generations = 8\nmax_completion_length = 4\n" +
      extra + "\n[data]\nsource = prompt_jsonl\nprompt_len = 8\nbatch_size = 4\nval_count = 8\npath = " + path +
      "\ntokenizer = " + bytes + "\n[optim]\nname = adamw\nlr = 0.003\n[trainer]\nsteps = " + std::to_string(steps) +
      "\nlog_every = 1\ncheckpoint_every = 2\neval_every = " + std::to_string(steps) + "\n");
}

// The values of `key` in a run's metrics.jsonl, in order (training lines, or with val the "val/" ones).
std::vector<double> metric(const fs::path& run, const std::string& key) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"" + key + "\":");
    if (at != std::string::npos) out.push_back(std::strtod(line.c_str() + at + key.size() + 3, nullptr));
  }
  return out;
}

}  // namespace

// A policy blind to the prompt scores at most 0.25 here (each letter answers 2 of the 8 prompts), an untrained one
// about 1/256: above 0.6 the policy reads the prompt. (Seeds 1-7 reach 0.75-1.0 in 200 updates at this rate; at twice
// the rate some collapse to 2 or 3 of the 4 letters, their other groups' rewards all equal and so without gradient.)
TEST_CASE("grpo training raises the reward: a prompt-dependent letter from near 0 to most of each completion") {
  ref();
  TempDir d("train");
  const std::string bytes = byte_folder(d.path), path = write_letter_prompts(d.path);
  dew::Config cfg = letters_config(bytes, path, 200);
  dew::TrainOptions o;
  o.run_dir = (d.path / "run").string();
  REQUIRE(dew::train(cfg, o) == 0);
  const std::vector<double> reward = metric(d.path / "run", "reward"), val = metric(d.path / "run", "val/reward");

  REQUIRE(reward.size() == 200);
  REQUIRE(val.size() >= 1);
  std::string trace;
  for (double r : reward) trace += std::to_string(r).substr(0, 4) + " ";
  MESSAGE("rewards ", trace, "validation ", val.back());
  CHECK(reward[0] + reward[1] + reward[2] < 0.1);
  CHECK(val.back() > 0.6);
}

TEST_CASE("grpo resume: 2 + 2 updates equal 4, bit for bit (the rollout keyed by the records' positions)") {
  ref();
  TempDir d("resume");
  const std::string bytes = byte_folder(d.path), path = write_letter_prompts(d.path);
  const std::string beta = "beta = 0.05";  // the reference copy travels in the checkpoint too
  dew::TrainOptions a;
  a.run_dir = (d.path / "straight").string();
  dew::Config straight = letters_config(bytes, path, 4, beta);
  REQUIRE(dew::train(straight, a) == 0);
  dew::TrainOptions b;
  b.run_dir = (d.path / "resumed").string();
  dew::Config first = letters_config(bytes, path, 2, beta);
  REQUIRE(dew::train(first, b) == 0);
  dew::Config second = letters_config(bytes, path, 4, beta);
  b.resume = true;
  REQUIRE(dew::train(second, b) == 0);
  const auto la = metric(d.path / "straight", "loss"), lb = metric(d.path / "resumed", "loss");
  REQUIRE(la.size() >= 4);
  CHECK(lb == la);
  CHECK(metric(d.path / "resumed", "kl") == metric(d.path / "straight", "kl"));
}
