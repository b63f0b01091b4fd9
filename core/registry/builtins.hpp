// core/registry/builtins.hpp — the components libdew itself provides, registered through the registry's
// built-in registrar (origin "core") when the registry is first used. One function per family; each
// lives next to the code it registers.
#pragma once
#include "dew/registry.hpp"

namespace dew {

void register_builtins(Registrar& registrar);  // all of the below, once

void register_adamw_optimizers(Registrar& registrar);  // adamw, lamb  (core/train/optim_adamw.cpp)
void register_sgd_optimizer(Registrar& registrar);     // sgd          (core/train/optim_sgd.cpp)
void register_muon_optimizer(Registrar& registrar);    // muon         (core/train/optim_muon.cpp)
void register_schedules(Registrar& registrar);         // constant, cosine, linear, wsd, exponential,
                                                       // one_cycle, power (core/train/schedules.cpp)

}  // namespace dew
