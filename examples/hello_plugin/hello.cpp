// examples/hello_plugin/hello.cpp — the whole plugin: one DEW_PLUGIN block registering greeter 'hello'.
#include <dew/registry.hpp>
#include <memory>
#include <string>

#include "greeter.hpp"

namespace {

class HelloGreeter final : public hello::Greeter {
 public:
  explicit HelloGreeter(std::string who) : who_(std::move(who)) {}
  std::string greet() const override { return "hello, " + who_ + "!"; }

 private:
  std::string who_;
};

}  // namespace

DEW_PLUGIN("hello", "0.1.0") {
  registrar.add<hello::Greeter>({
      .name = "hello",
      .description = "says hello (an out-of-tree example plugin)",
      .factory = [](const dew::Options& o) { return std::make_shared<HelloGreeter>(o.get_string("who", "world")); },
      .options = {{"who", "world", "whom to greet"}},
  });
}
