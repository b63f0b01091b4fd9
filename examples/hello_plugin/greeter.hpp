// examples/hello_plugin/greeter.hpp — the component interface this example plugin provides.
//
// Any interface with `static constexpr const char* kind` can be registered in dew's registry. A host
// that includes this header creates one with dew::Registry::global().create<Greeter>("hello").
#pragma once
#include <string>

namespace hello {

struct Greeter {
  static constexpr const char* kind = "greeter";
  virtual ~Greeter() = default;
  virtual std::string greet() const = 0;
};

}  // namespace hello
