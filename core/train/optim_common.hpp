// core/train/optim_common.hpp — option readers the built-in optimizers share.
#pragma once
#include <utility>

#include "dew/options.hpp"

namespace dew {

// [optim] betas = b1, b2 (each in [0, 1)); UsageError naming the key otherwise.
std::pair<float, float> read_betas(const Options& o, double b1, double b2);

}  // namespace dew
