// dew/lm_commands.hpp — what `dew-run sample` and `dew-run eval --task ...` do with a causal language model, for
// every objective whose main model is one (lm, dpo: a model trained on preference pairs samples and is scored as the
// lm objective's). Sampling (core/generate/sample_command.cpp): --prompt / --prompts_file text, or --prompt_ids token
// ids, with the sampling keys of docs/eval.md, to stdout. The evaluation harness front end (core/eval/lm_tasks.cpp,
// docs/eval.md): reads the request keys and the JSONL request files, runs dew/lm_eval.hpp, returns flat metrics plus
// one artifact <task>.jsonl (one JSON object per request, in request order) for <run-dir>/eval/.
// Both read every key they take from the request and refuse one they do not know (Options::check_all_used); both run
// the model in evaluation mode without gradients.
#pragma once
#include <cstdint>
#include <string>

#include "dew/generate.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/options.hpp"
#include "dew/tokenizer.hpp"

namespace dew {

struct LmCommandContext {
  Model* model = nullptr;
  CausalDecoder* decoder = nullptr;      // null: generation (sample, generate_until) is refused
  const Tokenizer* tokenizer = nullptr;  // null: text requests are refused (token-id requests work)
  std::string data_path;                 // the run's [data] path ("" when none): the default --data of perplexity
  std::string default_prompt = "The ";   // sample's --prompt when none is given
  int64_t default_new_tokens = 200;      // sample's --max_new_tokens when none is given
  const char* objective = "lm";          // names the objective in errors
};

// `dew-run sample`: generates from `c.model` and prints the text (with --prompt_ids: the token ids, then the text
// when there is a tokenizer).
void sample_text(Options& request, const LmCommandContext& c);

// `dew-run eval --task T`: T is perplexity | loglikelihood | multiple_choice | loglikelihood_rolling | generate_until.
ValidationResult run_lm_task(const std::string& task, Options& request, const LmCommandContext& c);

// A text option as configs and command lines spell it: "\n", "\t" and "\\" escapes; a value in double quotes keeps
// its spaces (config values are trimmed): sample_prompt = "The ".
std::string unescape_text_option(std::string s);

}  // namespace dew
