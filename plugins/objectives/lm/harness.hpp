// harness.hpp — the lm objective's `dew-run eval --task ...` front end (harness.cpp; docs/eval.md):
// reads the request keys and the JSONL request files, runs dew/lm_eval.hpp, returns flat metrics plus
// one artifact <task>.jsonl (one JSON object per request, in request order) for <run-dir>/eval/.
#pragma once
#include <dew/generate.hpp>
#include <dew/model.hpp>
#include <dew/objective.hpp>
#include <dew/options.hpp>
#include <dew/tokenizer.hpp>
#include <string>

namespace lm_harness {

struct Context {
  dew::Model* model = nullptr;
  dew::CausalDecoder* decoder = nullptr;      // null: generate_until is refused
  const dew::Tokenizer* tokenizer = nullptr;  // null: text requests are refused (token-id requests work)
  std::string data_path;                      // the run's [data] path ("" when none): the default --data of perplexity
};

// Runs --task (perplexity | loglikelihood | multiple_choice | loglikelihood_rolling | generate_until).
dew::ValidationResult run(const std::string& task, dew::Options& request, const Context& c);

}  // namespace lm_harness
