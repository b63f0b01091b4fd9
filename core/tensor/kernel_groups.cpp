// core/tensor/kernel_groups.cpp — what every backend shares of the grouped kernels (dew/backend.hpp): the contract
// checks of adamw_update_group and sum_squares_group, and their one-tensor-at-a-time forms.
// Invariant: a group is valid only if no byte one slot writes is read or written by another slot, so the slots
// may run in any order or all at once (a device's one launch) with the bits of the one-tensor kernel.
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

void check_sum_squares_group(const std::vector<Tensor>& xs, const Tensor& out, const char* who) {
  DEW_CHECK(out.defined() && out.numel() == int64_t(xs.size()), who, ".sum_squares_group: out must hold one value per input (",
            xs.size(), ")");
  const auto out_begin = reinterpret_cast<uintptr_t>(out.data()), out_end = out_begin + out.nbytes();
  for (size_t i = 0; i < xs.size(); ++i) {
    DEW_CHECK(xs[i].defined() && xs[i].dtype() == out.dtype() && is_floating(out.dtype()), who,
              ".sum_squares_group: input ", i, " must be a defined ", dtype_name(out.dtype()),
              " tensor (out's dtype, floating)");
    if (xs[i].numel() == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(xs[i].data());
    DEW_CHECK(begin + xs[i].nbytes() <= out_begin || begin >= out_end, who, ".sum_squares_group: input ", i,
              " overlaps out");
  }
}

void sum_squares_each_reduce(Backend& be, const std::vector<Tensor>& xs, Tensor& out) {
  check_sum_squares_group(xs, out, be.name().c_str());
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor slot = out.slice0(int64_t(i), int64_t(i) + 1);
    if (xs[i].numel() == 0)
      be.fill(slot, 0.0);
    else
      be.reduce(xs[i], slot, ReduceParams{ReduceOp::sumsq, 1, xs[i].numel(), 1});
  }
}

}  // namespace dew
