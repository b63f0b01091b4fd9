// tools/dew-run/request_limits.cpp — see request_limits.hpp. The scan tracks only string/escape state and
// the nesting depth, so it is linear in the body and allocates nothing.
#include "request_limits.hpp"

namespace dew_run {

void check_json_limits(const std::string& text) {
  int depth = 0;
  size_t elements = 0, string_start = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        if (i - string_start > kMaxJsonString)
          throw RequestRejected("a JSON string of " + std::to_string(i - string_start) + " bytes is longer than the " +
                                std::to_string(kMaxJsonString) + " allowed");
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      string_start = i;
      ++elements;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw RequestRejected("the JSON body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      ++elements;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',') {
      ++elements;
    }
    if (elements > kMaxJsonElements)
      throw RequestRejected("the JSON body holds more than " + std::to_string(kMaxJsonElements) + " values");
  }
  if (in_string && text.size() - string_start > kMaxJsonString)
    throw RequestRejected("an unterminated JSON string longer than " + std::to_string(kMaxJsonString) + " bytes");
}

nlohmann::json parse_request_json(const std::string& text) {
  check_json_limits(text);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw RequestRejected(std::string("malformed JSON: ") + e.what());
  }
}

}  // namespace dew_run
