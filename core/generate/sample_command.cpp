// core/generate/sample_command.cpp — `dew-run sample` for a causal language model (dew/lm_commands.hpp): --prompt,
// --prompts_file or --prompt_ids, the sampling keys, text (or token ids) to stdout.
// Invariants: every key is read before anything is generated (a misspelt key is refused first); the model runs in
// evaluation mode without gradients; a prompt's samples come out in order, each under its own header when there are
// several.
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/lm_commands.hpp"

namespace dew {

namespace {

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

// The sampling keys both forms share.
SamplingParams sampling_keys(Options& req, const LmCommandContext& c) {
  SamplingParams sp;
  sp.max_new_tokens = req.get_int("max_new_tokens", c.default_new_tokens > 0 ? c.default_new_tokens : 200);
  sp.temperature = float(req.get_double("temperature", 1.0));
  sp.top_k = req.get_int("top_k", 0);
  sp.top_p = float(req.get_double("top_p", 1.0));
  sp.min_p = float(req.get_double("min_p", 0.0));
  sp.repetition_penalty = float(req.get_double("repetition_penalty", 1.0));
  sp.prefill_chunk = req.get_int("prefill_chunk", kPrefillChunk);
  const int64_t seed = req.get_int("seed", 0);
  DEW_USAGE_CHECK(seed >= 0, "--seed must not be negative");
  sp.seed = uint64_t(seed);
  return sp;
}

// --prompt_ids 1,2,3: token ids in, token ids out (and text when there is a tokenizer).
void sample_ids(Options& req, const LmCommandContext& c) {
  std::vector<int32_t> prompt;
  for (double v : req.get_doubles("prompt_ids", {})) {
    DEW_USAGE_CHECK(v >= 0 && v < double(c.decoder->vocab_size()) && v == std::floor(v), "--prompt_ids: ", v,
                    " is not a token id of this model (vocabulary ", c.decoder->vocab_size(), ")");
    prompt.push_back(int32_t(v));
  }
  DEW_USAGE_CHECK(!prompt.empty(), "--prompt_ids is empty");
  SamplingParams sp = sampling_keys(req, c);
  sp.eos_id = int32_t(req.get_int("eos_id", c.tokenizer ? c.tokenizer->eos_id() : -1));
  req.check_all_used();
  validate(sp);
  c.model->set_training(false);
  NoGradGuard no_grad;
  const auto g = generate(decoder_start(*c.decoder), {prompt}, sp, nullptr, c.decoder->context_length());
  std::ostringstream os;
  for (size_t i = 0; i < g[0].tokens.size(); ++i) os << (i ? " " : "") << g[0].tokens[i];
  std::cout << os.str() << "\n";
  if (c.tokenizer) std::cout << c.tokenizer->decode(g[0].tokens) << "\n";
  std::cout.flush();
}

}  // namespace

std::string unescape_text_option(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char n = s[i + 1];
      if (n == 'n' || n == 't' || n == '\\') {
        out += n == 'n' ? '\n' : n == 't' ? '\t' : '\\';
        ++i;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

void sample_text(Options& req, const LmCommandContext& c) {
  DEW_CHECK(c.model, c.objective, ": sample() before build()");
  DEW_USAGE_CHECK(c.decoder, c.objective, ": the model does not decode incrementally (no CausalDecoder)");
  if (req.has("prompt_ids")) {
    sample_ids(req, c);
    return;
  }
  DEW_USAGE_CHECK(c.tokenizer, c.objective,
                  ": sampling text needs a tokenizer: the run's data has no meta.json (pass --prompt_ids 1,2,3 to "
                  "sample token ids)");
  std::vector<std::string> prompts;
  const std::string file = req.get_string("prompts_file", "");
  if (!file.empty()) {
    std::ifstream in(file);
    DEW_USAGE_CHECK(in.good(), c.objective, ": cannot read --prompts_file '", file, "'");
    std::string line;
    while (std::getline(in, line)) prompts.push_back(unescape_text_option(line));
    DEW_USAGE_CHECK(!prompts.empty(), c.objective, ": --prompts_file '", file, "' has no lines");
  }
  const bool has_prompt = req.has("prompt");
  const std::string prompt = unescape_text_option(req.get_string("prompt", c.default_prompt));
  if (prompts.empty() || has_prompt) prompts.insert(prompts.begin(), prompt);
  SamplingParams sp = sampling_keys(req, c);
  const std::string stop = req.get_string("stop", "");
  if (!stop.empty())
    for (const std::string& s : split_list(stop, ','))
      if (!s.empty()) sp.stop.push_back(unescape_text_option(s));
  sp.eos_id = req.get_bool("ignore_eos", false) ? -1 : c.tokenizer->eos_id();
  const int64_t num = req.get_int("num_samples", 1);
  DEW_USAGE_CHECK(num >= 1, "--num_samples must be at least 1, got ", num);
  const bool echo = req.get_bool("echo_prompt", true);
  req.check_all_used();  // refuse a misspelt key before generating
  validate(sp);

  std::vector<std::string> all;
  for (const std::string& p : prompts)
    for (int64_t k = 0; k < num; ++k) all.push_back(p);
  c.model->set_training(false);
  NoGradGuard no_grad;
  const std::vector<Generation> out = generate_text(*c.decoder, *c.tokenizer, all, sp);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.size() > 1) std::cout << "=== sample " << i + 1 << " of " << out.size() << " ===\n";
    std::cout << (echo ? all[i] : std::string()) << out[i].text << "\n";
    std::cout.flush();
  }
}

}  // namespace dew
