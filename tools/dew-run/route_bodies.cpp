// tools/dew-run/route_bodies.cpp — the POST routes' bodies, checked (route_bodies.hpp): every field's
// type and range, unknown fields refused by name, prompts encoded and their token ids range-checked.
#include "route_bodies.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>

#include "request_limits.hpp"

namespace dew_run {

using json = nlohmann::json;

HttpError bad(const std::string& message, const std::string& param) {
  return {400, "invalid_request_error", message, param};
}

// The body of a POST as JSON (request_limits.hpp), a 400 naming what is wrong otherwise.
json parse_json_body(const std::string& text) {
  json body;
  try {
    body = parse_request_json(text);
  } catch (const RequestRejected& e) {
    throw bad(e.what());
  }
  // A field sent as null is a field not sent, as OpenAI's API reads it (client libraries send nulls).
  if (body.is_object())
    for (auto it = body.begin(); it != body.end();) it = it->is_null() ? body.erase(it) : std::next(it);
  return body;
}

namespace {

// The fields of POST /v1/completions (OpenAI's, plus top_k, min_p, repetition_penalty, ignore_eos).
const std::set<std::string> kCompletionFields = {
    "model", "prompt", "max_tokens", "temperature",        "top_p",      "top_k", "min_p", "seed",
    "stop",  "stream", "echo",       "repetition_penalty", "ignore_eos", "n",     "user",  "logprobs"};

std::string field_list() {
  std::string s;
  for (const std::string& f : kCompletionFields) s += (s.empty() ? "" : ", ") + f;
  return s;
}

double number(const json& body, const char* key, double def, double lo, double hi, bool lo_open = false) {
  if (!body.contains(key)) return def;
  const json& v = body.at(key);
  if (!v.is_number()) throw bad(std::string("'") + key + "' must be a number", key);
  const double x = v.get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (below || !(x <= hi) || !std::isfinite(x)) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
    throw bad(std::string("'") + key + "' must be in " + range + ", got " + v.dump(), key);
  }
  return x;
}

int64_t integer(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!body.contains(key)) return def;
  const json& v = body.at(key);
  if (!v.is_number_integer()) throw bad(std::string("'") + key + "' must be an integer", key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw bad(std::string("'") + key + "' is too large", key);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw bad(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                  std::to_string(x),
              key);
  return x;
}

bool boolean(const json& body, const char* key, bool def) {
  if (!body.contains(key)) return def;
  if (!body.at(key).is_boolean()) throw bad(std::string("'") + key + "' must be true or false", key);
  return body.at(key).get<bool>();
}

}  // namespace

Completion parse_completion(const std::string& text, const RouteLimits& limits, const dew::Tokenizer* tok,
                            DefaultLength length) {
  json body = parse_json_body(text);
  if (!body.is_object()) throw bad("the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!kCompletionFields.count(it.key()))
      throw bad("unknown field '" + it.key() + "' (known: " + field_list() + ")", it.key());
  if (body.contains("model") && (!body["model"].is_string() || body["model"].get<std::string>() != limits.model_id))
    throw HttpError{404, "invalid_request_error",
                    "model " + body["model"].dump() + " is not served here (this server serves '" + limits.model_id + "')",
                    "model"};
  if (body.contains("user") && !body["user"].is_string()) throw bad("'user' must be a string", "user");
  Completion c;
  if (!body.contains("prompt")) throw bad("'prompt' is required", "prompt");
  json prompt = body["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) prompt = prompt[0];
  if (prompt.is_string()) {
    if (!tok) throw bad("this model has no tokenizer: send 'prompt' as an array of token ids", "prompt");
    c.prompt_text = prompt.get<std::string>();
    c.prompt = tok->encode(c.prompt_text);
    if (c.prompt.empty()) {
      if (tok->eos_id() < 0)
        throw bad("'prompt' is empty and the tokenizer has no end-of-text token to start from", "prompt");
      c.prompt.push_back(tok->eos_id());
    }
  } else if (prompt.is_array() && !prompt.empty()) {
    for (const json& t : prompt) {
      if (!t.is_number_integer()) throw bad("'prompt' must be a string or an array of token ids", "prompt");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= limits.vocab_size)
        throw bad("prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                      std::to_string(limits.vocab_size) + ")",
                  "prompt");
      c.prompt.push_back(int32_t(id));
    }
    if (tok) c.prompt_text = tok->decode(c.prompt);
  } else {
    throw bad("'prompt' must be a string or a non-empty array of token ids", "prompt");
  }
  dew::SamplingParams& sp = c.params;
  const int64_t to_context =
      limits.context > 0 ? std::max<int64_t>(1, limits.context - int64_t(c.prompt.size())) : limits.max_tokens;
  const int64_t default_length = std::min<int64_t>(length == DefaultLength::chat ? to_context : 16, limits.max_tokens);
  sp.max_new_tokens = integer(body, "max_tokens", default_length, 0, limits.max_tokens);
  sp.temperature = float(number(body, "temperature", 1.0, 0.0, 1e6));
  sp.top_p = float(number(body, "top_p", 1.0, 0.0, 1.0, true));
  sp.top_k = integer(body, "top_k", 0, -1, std::numeric_limits<int32_t>::max());
  if (sp.top_k < 0) sp.top_k = 0;  // -1: off, as vLLM spells it
  sp.min_p = float(number(body, "min_p", 0.0, 0.0, 1.0));
  sp.repetition_penalty = float(number(body, "repetition_penalty", 1.0, 0.0, 1e6, true));
  if (body.contains("seed")) {
    sp.seed = uint64_t(integer(body, "seed", 0, 0, std::numeric_limits<int64_t>::max()));
  } else {  // drawn: at most 2^53 - 1, so a JSON client (JavaScript numbers) replays it exactly
    std::random_device rd;
    sp.seed = ((uint64_t(rd()) << 32) ^ rd()) & ((uint64_t(1) << 53) - 1);
  }
  if (body.contains("stop")) {
    const json& st = body["stop"];
    std::vector<std::string> stops;
    if (st.is_string()) {
      stops.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      for (const json& s : st) {
        if (!s.is_string()) throw bad("'stop' must be a string or an array of strings", "stop");
        stops.push_back(s.get<std::string>());
      }
    } else if (!st.is_null()) {
      throw bad("'stop' must be a string or an array of strings", "stop");
    }
    if (stops.size() > 16) throw bad("'stop' holds at most 16 strings", "stop");
    for (const std::string& s : stops)
      if (s.empty()) throw bad("a 'stop' string is empty", "stop");
    if (!stops.empty() && !tok) throw bad("stop strings need a tokenizer; this model has none", "stop");
    sp.stop = stops;
  }
  c.stream = boolean(body, "stream", false);
  c.echo = boolean(body, "echo", false);
  sp.eos_id = boolean(body, "ignore_eos", false) || !tok ? -1 : tok->eos_id();
  c.n = integer(body, "n", 1, 1, limits.max_n);
  sp.logprobs = integer(body, "logprobs", -1, 0, dew::kMaxLogprobs);
  if (sp.logprobs >= 0 && c.echo) {  // the prompt's log-probabilities too (what a harness scores a continuation by)
    if (c.stream) throw bad("'logprobs' with 'echo' (the prompt's log-probabilities) is not streamed", "stream");
    if (sp.max_new_tokens < 1)
      throw bad("'logprobs' with 'echo' needs max_tokens >= 1 (the prompt is scored with the first token's draw)",
                "max_tokens");
    if (limits.context > 0 && int64_t(c.prompt.size()) > limits.context)
      throw bad("'logprobs' with 'echo' needs the whole prompt within the context (" + std::to_string(limits.context) +
                    " tokens); it has " + std::to_string(c.prompt.size()),
                "prompt");
    sp.prompt_logprobs = true;
  }
  return c;
}

ImageRequest parse_image_request(const std::string& text, const RouteLimits& limits) {
  json body = parse_json_body(text);
  if (!body.is_object()) throw bad("the request body must be a JSON object");
  static const std::set<std::string> fields = {"model",
                                               "labels",
                                               "n",
                                               "steps",
                                               "sampler",
                                               "guidance",
                                               "seed",
                                               "guidance_interval",
                                               "guidance_rescale",
                                               "sampler_options",
                                               "response_format",
                                               "user"};
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!fields.count(it.key())) {
      std::string known;
      for (const std::string& f : fields) known += (known.empty() ? "" : ", ") + f;
      throw bad("unknown field '" + it.key() + "' (known: " + known + ")", it.key());
    }
  if (body.contains("model") && (!body["model"].is_string() || body["model"].get<std::string>() != limits.model_id))
    throw HttpError{404, "invalid_request_error",
                    "model " + body["model"].dump() + " is not served here (this server serves '" + limits.model_id + "')",
                    "model"};
  if (body.contains("user") && !body["user"].is_string()) throw bad("'user' must be a string", "user");
  if (body.contains("response_format") &&
      (!body["response_format"].is_string() || body["response_format"].get<std::string>() != "b64_json"))
    throw bad("'response_format' must be \"b64_json\" (no URLs are served)", "response_format");
  ImageRequest out;
  std::map<std::string, std::string>& request = out.keys;
  if (body.contains("labels")) {
    const json& l = body["labels"];
    if (!l.is_array() || l.empty()) throw bad("'labels' must be a non-empty array of class ids", "labels");
    std::string list;
    for (const json& v : l) {
      if (!v.is_number_integer()) throw bad("'labels' must be a non-empty array of class ids", "labels");
      list += (list.empty() ? "" : ",") + std::to_string(v.get<int64_t>());
    }
    request["labels"] = list;
  }
  request["n"] = std::to_string(integer(body, "n", 1, 1, limits.max_n));
  if (body.contains("steps")) request["steps"] = std::to_string(integer(body, "steps", 0, 1, limits.max_steps));
  if (body.contains("sampler")) {
    if (!body["sampler"].is_string()) throw bad("'sampler' must be a string", "sampler");
    request["sampler"] = body["sampler"].get<std::string>();
  }
  auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", x);
    return std::string(b);
  };
  if (body.contains("guidance")) request["guidance"] = num(number(body, "guidance", 1.0, 0.0, 1e3));
  if (body.contains("guidance_rescale"))
    request["guidance_rescale"] = num(number(body, "guidance_rescale", 0.0, 0.0, 1.0));
  if (body.contains("guidance_interval")) {
    const json& g = body["guidance_interval"];
    if (!g.is_array() || g.size() != 2 || !g[0].is_number() || !g[1].is_number())
      throw bad("'guidance_interval' must be [start, stop] in [0, 1]", "guidance_interval");
    request["guidance_interval"] = num(g[0].get<double>()) + "," + num(g[1].get<double>());
  }
  uint64_t& seed = out.seed;
  if (body.contains("seed")) {
    seed = uint64_t(integer(body, "seed", 0, 0, (int64_t(1) << 40)));
  } else {
    std::random_device rd;
    seed = ((uint64_t(rd()) << 32) ^ rd()) & ((uint64_t(1) << 40) - 1);
  }
  request["seed"] = std::to_string(seed);
  if (body.contains("sampler_options")) {  // the solver's own keys: {"eta": 0.5, "s_churn": 10}
    const json& so = body["sampler_options"];
    if (!so.is_object()) throw bad("'sampler_options' must be an object of solver keys", "sampler_options");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (fields.count(it.key()) || it.key() == "out" || it.key() == "batch")
        throw bad("'sampler_options' may not set '" + it.key() + "'", "sampler_options");
      const json& v = it.value();
      if (v.is_number())
        request[it.key()] = num(v.get<double>());
      else if (v.is_string())
        request[it.key()] = v.get<std::string>();
      else if (v.is_boolean())
        request[it.key()] = v.get<bool>() ? "true" : "false";
      else
        throw bad("'sampler_options." + it.key() + "' must be a number, string or boolean", "sampler_options");
    }
  }
  return out;
}

}  // namespace dew_run
