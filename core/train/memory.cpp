// core/train/memory.cpp — training_state_memory (dew/train.hpp): the bytes of parameters, gradients and
// optimizer state a process holds, from the storages actually allocated.
//
// Invariants: each storage counts once, in the first category that names it (params, then grads, then
// optim), at Storage::bytes (what the backend was asked for; its rounding is in memory_stats()); nothing
// is assumed about an optimizer's state (its slots come from Optimizer::state()).
#include <unordered_set>

#include "dew/train.hpp"

namespace dew {

namespace {
// Adds the storage bytes of `t` to `sum` unless that storage was already counted.
void count_storage(const Tensor& t, std::unordered_set<const Storage*>& seen, int64_t& sum) {
  if (!t.defined() || !t.impl()->storage) return;
  const Storage* s = t.impl()->storage.get();
  if (seen.insert(s).second) sum += int64_t(s->bytes);
}
}  // namespace

TrainingStateMemory training_state_memory(const NamedTensors& params, const Optimizer* optimizer,
                                          const NamedTensors& extra_state) {
  TrainingStateMemory m;
  std::unordered_set<const Storage*> seen;
  for (const auto& [name, p] : params) count_storage(p, seen, m.params);
  for (const auto& [name, p] : params) count_storage(p.grad(), seen, m.grads);
  if (optimizer)
    for (const auto& [slot, tensors] : optimizer->state())
      for (const auto& [name, t] : tensors) count_storage(t, seen, m.optim);
  for (const auto& [name, t] : extra_state) count_storage(t, seen, m.optim);
  return m;
}

}  // namespace dew
