// tools/dew-run/route_bodies.hpp — the JSON bodies of `dew-run serve`'s POST routes, parsed and checked
// without a model: /v1/completions (and /v1/chat/completions, once chat_completions.hpp has rendered it to
// a completions body) and /v1/images. serve.cpp answers with them; fuzz/http_routes.cpp fuzzes them.
// Every bad body is one HttpError (400, or 404 for another model's name) naming the field; nothing here
// throws anything else for any input.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dew/serve.hpp"
#include "dew/tokenizer.hpp"

namespace dew_run {

// A request error: HTTP status, OpenAI-style error type, message and the offending field.
struct HttpError {
  int status;
  std::string type, message, param;
};
HttpError bad(const std::string& message, const std::string& param = "");

// The body of a POST as JSON (request_limits.hpp), a 400 naming what is wrong otherwise.
nlohmann::json parse_json_body(const std::string& text);

// What the bodies are checked against: the served model's id and vocabulary, the server's limits.
struct RouteLimits {
  std::string model_id;
  int64_t vocab_size = 0;
  int64_t max_tokens = 4096, max_n = 16, max_steps = 1000;
  int64_t context = 0;  // the served context in tokens (0: unknown)
};

// What a request without max_tokens gets: /v1/completions OpenAI's 16; /v1/chat/completions a reply that runs to its
// end of turn, up to the context left after the prompt (as vLLM: OpenAI's chat has no default cap), at least 1.
// Both at most the server's --max-tokens.
enum class DefaultLength { completion, chat };

// A checked completion request.
struct Completion {
  std::vector<int32_t> prompt;
  std::string prompt_text;  // for echo
  dew::SamplingParams params;
  int64_t n = 1;
  bool stream = false, echo = false;
};
// POST /v1/completions. `tokenizer` encodes a string prompt (null: token ids only).
Completion parse_completion(const std::string& text, const RouteLimits& limits, const dew::Tokenizer* tokenizer,
                            DefaultLength length = DefaultLength::completion);

// POST /v1/images: {labels, n, steps, sampler, guidance, guidance_interval, guidance_rescale, seed,
// sampler_options, response_format, model, user} -> the objective's request keys (dew-run sample's) and
// the seed (drawn, below 2^40, when the body has none).
struct ImageRequest {
  std::map<std::string, std::string> keys;
  uint64_t seed = 0;
};
ImageRequest parse_image_request(const std::string& text, const RouteLimits& limits);

}  // namespace dew_run
