// tests/registry/plugins/dup_b.cpp — registers greeter 'solo_b' and then greeter 'twin', which dup_a
// already has: the whole plugin must be refused (neither name from here is registered).
#include <dew/registry.hpp>
#include <memory>

#include "../greeter.hpp"

namespace {
struct B final : dew_test::Greeter {
  std::string hello() const override { return "from b"; }
};
}  // namespace

DEW_PLUGIN("dup_b", "0.1.0") {
  registrar.add<dew_test::Greeter>(
      {.name = "solo_b", .factory = [](const dew::Options&) { return std::make_shared<B>(); }});
  registrar.add<dew_test::Greeter>(
      {.name = "twin", .factory = [](const dew::Options&) { return std::make_shared<B>(); }});
}
