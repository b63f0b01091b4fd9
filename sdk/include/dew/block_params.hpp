// dew/block_params.hpp — where a block's parameters must hold their values: the hook through which
// sharded data parallel ([run] shard = parameters, core/dist) gathers a block's weights just before its
// forward, frees them after it, and gathers them again just before the block's backward.
//
// A backbone runs each block through run_block (or through dew::recompute_block, which does so); with
// no hooks installed (one process, any other shard mode) run_block is simply forward().
//
// Contract:
//  * acquire(params) returns once every tensor of `params` holds its values; release(params) says the
//    block's forward is done, so the hooks may drop the storage of those they do not keep (a tensor
//    keeps its shape and identity; only its bytes go);
//  * when the block's result records gradients, it passes through an identity node whose backward calls
//    acquire(params) again: it runs before the block's own backward nodes (they produced its input), so
//    they read whole parameters; when to free them in the backward pass is the hooks' business (the
//    data-parallel hooks free each one once its gradient is complete);
//  * every process of a job calls run_block in the same order with the same parameters (the hooks
//    communicate): the blocks' structure must not depend on the data. The hooks may also rely on the
//    order repeating from one pass to the next: the data-parallel hooks gather the block acquired next
//    (in the previous pass's order) while the current one computes, and fall back to gathering on the
//    spot when the order changes.
#pragma once
#include <functional>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

class BlockParameterHooks {
 public:
  virtual ~BlockParameterHooks() = default;
  virtual void acquire(const std::vector<Tensor>& params) = 0;
  virtual void release(const std::vector<Tensor>& params) = 0;
};

// This thread's hooks (null: none).
BlockParameterHooks* block_parameter_hooks();

// RAII: installs `hooks` for this thread while alive (the trainer, around an update's passes); restores
// the previous ones.
class BlockParameterHooksGuard {
 public:
  explicit BlockParameterHooksGuard(BlockParameterHooks* hooks);
  ~BlockParameterHooksGuard();
  BlockParameterHooksGuard(const BlockParameterHooksGuard&) = delete;
  BlockParameterHooksGuard& operator=(const BlockParameterHooksGuard&) = delete;

 private:
  BlockParameterHooks* previous_;
};

// One block's forward with its parameters whole (see the contract above).
Tensor run_block(const std::function<Tensor()>& forward, const std::vector<Tensor>& params);

}  // namespace dew
