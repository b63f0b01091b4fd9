// fuzz/http_routes.cpp — libFuzzer target: the request bodies of every POST route of `dew-run serve`,
// checked as the server checks them before anything reaches the model (tools/dew-run/route_bodies.cpp,
// chat_completions.cpp; the body limits of request_limits.cpp first). The first byte picks the route:
// /v1/completions with the byte tokenizer, /v1/completions of a model without a tokenizer (token ids),
// /v1/chat/completions (rendered with dew's default template, then checked as a completions body), and
// /v1/images. Every body must give a checked request or one HttpError with a 4xx status — never another
// exception, a crash or a deep recursion; a checked request stays inside the server's limits.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "chat_completions.hpp"
#include "route_bodies.hpp"

namespace {
void check(const dew_run::Completion& c, const dew_run::RouteLimits& lim) {
  if (c.prompt.empty() || c.n < 1 || c.n > lim.max_n) __builtin_trap();
  if (c.params.max_new_tokens < 0 || c.params.max_new_tokens > lim.max_tokens) __builtin_trap();
  for (int32_t id : c.prompt)
    if (id < 0 || id >= lim.vocab_size) __builtin_trap();
  if (!(c.params.temperature >= 0) || !(c.params.top_p > 0 && c.params.top_p <= 1)) __builtin_trap();
  if (c.params.seed > (uint64_t(1) << 63)) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const auto bytes = dew::make_byte_tokenizer();
  static const dew_run::chat::ChatSetup chat = dew_run::chat::setup_from_folder_or_file("");
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  dew_run::RouteLimits lim{"fuzz-model", 256, 64, 4, 50};
  try {
    switch (data[0] % 4) {
      case 0:
        check(dew_run::parse_completion(body, lim, bytes.get()), lim);
        break;
      case 1:
        lim.vocab_size = 1000;
        check(dew_run::parse_completion(body, lim, nullptr), lim);
        break;
      case 2: {
        nlohmann::json completion;
        try {
          completion = dew_run::chat::to_completion_body(dew_run::parse_json_body(body), chat);
        } catch (const std::invalid_argument&) {  // serve.cpp answers these 400, naming the field
          return 0;
        }
        check(dew_run::parse_completion(completion.dump(), lim, bytes.get()), lim);
        break;
      }
      default: {
        const dew_run::ImageRequest r = dew_run::parse_image_request(body, lim);
        if (!r.keys.count("n") || !r.keys.count("seed") || r.seed >= (uint64_t(1) << 41)) __builtin_trap();
        break;
      }
    }
  } catch (const dew_run::HttpError& e) {
    if (e.status < 400 || e.status > 499 || e.message.empty()) __builtin_trap();
  }
  return 0;
}
