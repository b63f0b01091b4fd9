// fuzz/http_body.cpp — libFuzzer target: a `dew-run serve` request body through the limits and the JSON
// parse every route uses (tools/dew-run/request_limits.cpp), then the value copied and dumped as the
// handlers do. Any body must end in a json value or a RequestRejected, never a crash or a deep recursion.
#include <cstdint>
#include <string>

#include "request_limits.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    nlohmann::json j = dew_run::parse_request_json(body);
    nlohmann::json copy = j;  // the handlers copy fields (the million-nested-arrays crash was here)
    (void)copy.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const dew_run::RequestRejected&) {
  }
  return 0;
}
