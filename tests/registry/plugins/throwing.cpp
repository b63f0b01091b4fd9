// tests/registry/plugins/throwing.cpp — registers greeter 'early' and then throws from its register
// function: the exception must stop at the C boundary and come back as "registration failed: <what>",
// and 'early' must not be registered.
#include <dew/registry.hpp>
#include <memory>
#include <stdexcept>

#include "../greeter.hpp"

namespace {
struct Early final : dew_test::Greeter {
  std::string hello() const override { return "early"; }
};
}  // namespace

DEW_PLUGIN("throwing", "0.1.0") {
  registrar.add<dew_test::Greeter>(
      {.name = "early", .factory = [](const dew::Options&) { return std::make_shared<Early>(); }});
  throw std::runtime_error("the greeting table is corrupt");
}
