// tests/registry/plugins/good.cpp — a well-formed test plugin: registers greeter 'hello' (and records
// the line of its registration in the description, so the test can check the recorded provenance).
#include <dew/registry.hpp>
#include <memory>
#include <string>

#include "../greeter.hpp"

namespace {

struct HelloGreeter final : dew_test::Greeter {
  explicit HelloGreeter(std::string who) : who_(std::move(who)) {}
  std::string hello() const override { return "hello, " + who_; }
  std::string who_;
};

}  // namespace

DEW_PLUGIN_WITH_NOTES("good", "1.2.3", "built for the registry tests") {
  dew::Component<dew_test::Greeter> c;
  c.name = "hello";
  c.factory = [](const dew::Options& o) { return std::make_shared<HelloGreeter>(o.get_string("who", "world")); };
  c.options = {{"who", "world", "whom to greet"}};
  c.description = "registered at line " + std::to_string(__LINE__ + 1);
  registrar.add(std::move(c));
}
