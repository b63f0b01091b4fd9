// core/train/optim_common.hpp — what the built-in optimizers share: option readers, and AdamW updates gathered
// into groups.
#pragma once
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/options.hpp"

namespace dew {

// [optim] betas = b1, b2 (each in [0, 1)); UsageError naming the key otherwise.
std::pair<float, float> read_betas(const Options& o, double b1, double b2);

// AdamW updates gathered for adamw_update_group (one call for many tensors; on a device a few launches instead of
// one per tensor): add() the parameters in order, then run() hands each run of consecutive slots on one backend and
// dtype to that backend's group kernel, in order. The bits are adamw_update's on each tensor.
class AdamWGroups {
 public:
  void add(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, float lr, float weight_decay) {
    slots_.push_back({param, grad, m, v, lr, weight_decay});
  }
  // shared: betas, eps, grad_scale and step (each slot brings its lr and weight decay). Empties the list.
  void run(const AdamWParams& shared);

 private:
  std::vector<AdamWSlot> slots_;
};

}  // namespace dew
