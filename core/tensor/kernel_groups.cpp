// core/tensor/kernel_groups.cpp — what every backend shares of the grouped kernels (dew/backend.hpp): the contract
// check of adamw_update_group and its slot-by-slot form.
// Invariant: a group is valid only if no byte one slot writes is read or written by another slot, so the slots
// may run in any order or all at once (a device's one launch) with the bits of adamw_update called in order.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"

namespace dew {

void check_adamw_group(const std::vector<AdamWSlot>& slots, const char* who) {
  std::vector<std::pair<uintptr_t, uintptr_t>> written;  // [begin, end) of every param, m and v
  written.reserve(3 * slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const AdamWSlot& s = slots[i];
    DEW_CHECK(s.param.defined() && s.grad.defined() && s.m.defined() && s.v.defined(), who,
              ".adamw_update_group: slot ", i, " lacks a tensor (param, grad, m and v are all needed)");
    DEW_CHECK(is_floating(s.param.dtype()), who, ".adamw_update_group: slot ", i, " has a ",
              dtype_name(s.param.dtype()), " param; parameters are floating");
    DEW_CHECK(s.param.dtype() == slots[0].param.dtype(), who, ".adamw_update_group: slot ", i, " is ",
              dtype_name(s.param.dtype()), " but slot 0 is ", dtype_name(slots[0].param.dtype()),
              "; a group has one dtype");
    for (const Tensor* t : {&s.grad, &s.m, &s.v})
      DEW_CHECK(t->dtype() == s.param.dtype() && t->numel() == s.param.numel(), who, ".adamw_update_group: slot ", i,
                ": grad, m and v must match its param (", dtype_name(s.param.dtype()), ", ", s.param.numel(),
                " elements); got ", dtype_name(t->dtype()), ", ", t->numel());
    if (s.param.numel() == 0) continue;
    for (const Tensor* t : {&s.param, &s.m, &s.v}) {
      const auto begin = reinterpret_cast<uintptr_t>(t->data());
      written.emplace_back(begin, begin + t->nbytes());
    }
  }
  std::sort(written.begin(), written.end());
  for (size_t i = 1; i < written.size(); ++i)
    DEW_CHECK(written[i].first >= written[i - 1].second, who,
              ".adamw_update_group: two of the tensors it writes (params, m, v) share memory; each slot needs its "
              "own param and state");
}

void adamw_update_each(Backend& be, std::vector<AdamWSlot>& slots, const AdamWParams& p) {
  check_adamw_group(slots, be.name().c_str());
  for (AdamWSlot& s : slots) {
    AdamWParams q = p;
    q.lr = s.lr;
    q.weight_decay = s.weight_decay;
    be.adamw_update(s.param, s.grad, s.m, s.v, q);
  }
}

}  // namespace dew
