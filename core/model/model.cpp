// core/model/model.cpp — dew::create_model: the [model] section names a backbone plugin; the registry
// makes it with the section itself as its options. And LinearHeadModel::forward_rows, the one shape check of
// every fused-head caller (the lm and dpo objectives, the eval harness).
//
// The factory receives the very Options object of the section (not a copy), so the keys the backbone
// reads are marked used in the run config and Config::check_all_used() refuses only real leftovers.
#include "dew/model.hpp"

#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"

namespace dew {

std::shared_ptr<Model> create_model(Options& section) {
  DEW_USAGE_CHECK(section.has("plugin"), "missing required option '",
                  section.context().empty() ? std::string("model") : section.context(),
                  ".plugin' (the backbone to build, e.g. plugin = convnet)");
  const std::string plugin = section.require_string("plugin");
  return Registry::global().create<Model>(plugin, section);
}

HiddenAndHead LinearHeadModel::forward_rows(const Batch& inputs, int64_t rows, int64_t vocab) {
  HiddenAndHead o = forward_hidden(inputs);
  DEW_CHECK(o.hidden.ndim() == 3 && o.hidden.shape()[0] * o.hidden.shape()[1] == rows && o.weight.ndim() == 2 &&
                o.weight.shape()[1] == o.hidden.shape()[2] && (vocab < 0 || o.weight.shape()[0] == vocab),
            "the model's hidden states ", shape_str(o.hidden.shape()), " and linear head ", shape_str(o.weight.shape()),
            " do not give [", rows, ", ", vocab < 0 ? std::string("V") : std::to_string(vocab), "] logits");
  o.hidden = reshape(o.hidden, {rows, o.hidden.shape()[2]});
  return o;
}

}  // namespace dew

dew::Tensor dew::Model::features(const Batch&) {
  DEW_CHECK(false, "this model does not expose features (the representation before its output head)");
  return {};
}
