// core/autograd/block_params.cpp — run_block and the thread's block parameter hooks (dew/block_params.hpp).
#include "dew/block_params.hpp"

#include "dew/autograd.hpp"

namespace dew {

namespace {
thread_local BlockParameterHooks* t_hooks = nullptr;
}

BlockParameterHooks* block_parameter_hooks() { return t_hooks; }

BlockParameterHooksGuard::BlockParameterHooksGuard(BlockParameterHooks* hooks) : previous_(t_hooks) { t_hooks = hooks; }
BlockParameterHooksGuard::~BlockParameterHooksGuard() { t_hooks = previous_; }

Tensor run_block(const std::function<Tensor()>& forward, const std::vector<Tensor>& params) {
  BlockParameterHooks* hooks = t_hooks;
  if (!hooks) return forward();
  hooks->acquire(params);
  Tensor y = forward();
  hooks->release(params);
  if (!y.requires_grad() || !grad_enabled()) return y;
  // The identity node: its backward runs before the block's (which produced y) and gathers again.
  Tensor out = y.detach();
  record(
      out, {y},
      [hooks, params](const Tensor& g) {
        hooks->acquire(params);
        return std::vector<Tensor>{g};
      },
      "block_params.acquire");
  return out;
}

}  // namespace dew
