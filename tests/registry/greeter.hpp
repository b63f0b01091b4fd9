// tests/registry/greeter.hpp — a tiny component interface shared by test_registry and its test plugins.
//
// The registry is generic over kinds: any interface with `static constexpr const char* kind` can be
// registered by a plugin and created by the host. Greeter is that interface for the tests.
#pragma once
#include <string>

namespace dew_test {

struct Greeter {
  static constexpr const char* kind = "greeter";
  virtual ~Greeter() = default;
  virtual std::string hello() const = 0;
};

}  // namespace dew_test
