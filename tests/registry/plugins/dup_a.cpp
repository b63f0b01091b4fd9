// tests/registry/plugins/dup_a.cpp — registers greeter 'twin' (loaded first: it keeps the name).
#include <dew/registry.hpp>
#include <memory>

#include "../greeter.hpp"

namespace {
struct TwinA final : dew_test::Greeter {
  std::string hello() const override { return "twin from a"; }
};
}  // namespace

DEW_PLUGIN("dup_a", "0.1.0") {
  registrar.add<dew_test::Greeter>(
      {.name = "twin", .factory = [](const dew::Options&) { return std::make_shared<TwinA>(); }});
}
