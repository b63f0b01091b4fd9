// dew/autograd.hpp — reverse-mode automatic differentiation.
//
// Each differentiable op (dew/ops.hpp) calls forward kernels and, when any input requires a gradient
// and grad mode is on, attaches to its output a Node: the inputs it needs gradients for and a backward
// closure that calls backward kernels. Tensor::backward() orders the graph reachable from the root
// (reverse topological order, the "tape"), runs each closure once, and accumulates (+=) into the .grad
// of leaf tensors that require gradients. The graph is freed as it is consumed. no_grad scopes
// (sampling, evaluation, optimizer updates) record nothing.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

struct Node {
  // The inputs whose gradients this node computes (entries may be undefined for inputs without grad).
  std::vector<Tensor> inputs;
  // Given the gradient of the output, returns one gradient per input (undefined where none is needed).
  std::function<std::vector<Tensor>(const Tensor& grad_output)> backward;
  const char* name = "op";
};

bool grad_enabled();

// RAII: disables gradient recording in this thread while alive.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// RAII: turns gradient recording on in this thread while alive, also inside a NoGradGuard (e.g. a probe
// fitted during evaluation); restores the previous mode.
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// True when an op with these inputs must record a node.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// Attaches a node to `out`: used by ops (and by plugins defining their own differentiable ops).
void record(Tensor& out, std::vector<Tensor> inputs, std::function<std::vector<Tensor>(const Tensor&)> backward,
            const char* name);

// Runs backward from `root` seeded with `seed` (same shape as root).
void run_backward(const Tensor& root, const Tensor& seed);

// ---- leaf-ready hook (data-parallel gradient bucketing, core/dist) ----
// Called during run_backward with each leaf that requires a gradient and is reachable from the root,
// exactly once, as soon as its .grad holds every contribution of this backward pass (its .grad stays
// undefined when no gradient actually flowed into it). The pass counts each leaf's incoming edges while
// ordering the graph and calls the hook when the last one has been processed, so the hook runs while
// the rest of the backward pass is still to come. Leaves the root cannot reach are never reported.
using LeafReadyHook = std::function<void(const Tensor& leaf)>;
void run_backward(const Tensor& root, const Tensor& seed, const LeafReadyHook& on_leaf_ready);
// ---- end leaf-ready hook ----

}  // namespace dew
