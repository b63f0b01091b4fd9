// core/registry/builtins.cpp — the list of libdew's built-in components (optimizers, schedules).
// Registry::global() calls register_builtins() once, before any plugin loads, so a plugin that names a
// built-in is refused as a duplicate naming both origins.
#include "registry/builtins.hpp"

namespace dew {

void register_builtins(Registrar& registrar) {
  register_sgd_optimizer(registrar);
  register_adamw_optimizers(registrar);
  register_muon_optimizer(registrar);
  register_schedules(registrar);
}

}  // namespace dew
