// tests/registry/plugins/dup_self.cpp — registers greeter 'same' twice within one plugin.
#include <dew/registry.hpp>
#include <memory>

#include "../greeter.hpp"

namespace {
struct Same final : dew_test::Greeter {
  std::string hello() const override { return "same"; }
};
}  // namespace

DEW_PLUGIN("dup_self", "0.1.0") {
  registrar.add<dew_test::Greeter>(
      {.name = "same", .factory = [](const dew::Options&) { return std::make_shared<Same>(); }});
  registrar.add<dew_test::Greeter>(
      {.name = "same", .factory = [](const dew::Options&) { return std::make_shared<Same>(); }});
}
