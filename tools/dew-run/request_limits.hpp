// tools/dew-run/request_limits.hpp — limits on a `dew-run serve` request body, checked in one linear pass
// before nlohmann::json builds anything (issue 20), and the parse that applies them. Every route's body goes
// through parse_request_json; a rejected body is a RequestRejected whose message names the limit (the
// server answers 400 with it). Also a fuzz target (fuzz/http_body.cpp).
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace dew_run {

inline constexpr int kMaxJsonDepth = 32;                    // nesting of arrays/objects in one body
inline constexpr size_t kMaxJsonString = size_t(4) << 20;   // bytes of one JSON string (a prompt)
inline constexpr size_t kMaxJsonElements = size_t(1) << 20;  // values in one body (token-id prompts included)

struct RequestRejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Refuses nesting deeper than kMaxJsonDepth (a million nested arrays overflowed the stack when the
// parsed value was copied or destroyed), strings longer than kMaxJsonString, more than kMaxJsonElements.
void check_json_limits(const std::string& text);

// check_json_limits, then json::parse; any nlohmann error (malformed, 1e999 out of range) is rejected too.
nlohmann::json parse_request_json(const std::string& text);

}  // namespace dew_run
