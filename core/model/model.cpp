// core/model/model.cpp — dew::create_model: the [model] section names a backbone plugin; the registry
// makes it with the section itself as its options.
//
// The factory receives the very Options object of the section (not a copy), so the keys the backbone
// reads are marked used in the run config and Config::check_all_used() refuses only real leftovers.
#include "dew/model.hpp"

#include "dew/error.hpp"
#include "dew/registry.hpp"

namespace dew {

std::shared_ptr<Model> create_model(Options& section) {
  DEW_USAGE_CHECK(section.has("plugin"), "missing required option '",
                  section.context().empty() ? std::string("model") : section.context(),
                  ".plugin' (the backbone to build, e.g. plugin = convnet)");
  const std::string plugin = section.require_string("plugin");
  return Registry::global().create<Model>(plugin, section);
}

}  // namespace dew

dew::Tensor dew::Model::features(const Batch&) {
  DEW_CHECK(false, "this model does not expose features (the representation before its output head)");
  return {};
}
