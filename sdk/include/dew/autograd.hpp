// dew/autograd.hpp — reverse-mode automatic differentiation.
//
// Each differentiable op (dew/ops.hpp) calls forward kernels and, when any input requires a gradient
// and grad mode is on, attaches to its output a Node: an edge per input it needs a gradient for and a
// backward closure that calls backward kernels. Tensor::backward() orders the graph reachable from the root
// (reverse topological order, the "tape"), runs each closure once, and accumulates (+=) into the .grad
// of leaf tensors that require gradients. The graph is freed as it is consumed. no_grad scopes
// (sampling, evaluation, optimizer updates) record nothing.
//
// What stays alive: an edge names where an input's gradient goes (the node that made the input, or the leaf), never
// the input's values, so an intermediate is freed as soon as nothing but the graph refers to it unless a backward
// closure saved it (as PyTorch's graph keeps only its saved tensors): the output of a product that only an add
// reads, for instance, is gone when the forward moves on. The backward pass frees each closure's saved values as it
// runs it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

struct Node;

// One input of a node, as the backward pass needs it: where its gradient goes and what it must look like.
struct Edge {
  std::shared_ptr<Node> producer;    // a non-leaf input: the node that made it (its gradient is gathered there)
  std::shared_ptr<TensorImpl> leaf;  // else a leaf that requires a gradient: its .grad is accumulated
  Shape shape;                       // the input's shape, dtype and backend: its gradient's
  DType dtype = DType::f32;
  BackendPtr backend;
  std::weak_ptr<Storage> storage;  // the input's storage, not kept: to recognise what a backward saved of it
  bool defined() const { return producer || leaf; }
};

struct Node {
  // One edge per input (undefined for inputs without grad), in the order the op listed its inputs.
  std::vector<Edge> inputs;
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

// Attaches a node to `out`: used by ops (and by plugins defining their own differentiable ops). `inputs` are the
// op's inputs (the node keeps an edge for each that takes part in the graph, not their values); what the backward
// reads of them it captures itself, detached (x.detach()), so that the graph keeps those values and no others.
void record(Tensor& out, std::vector<Tensor> inputs, std::function<std::vector<Tensor>(const Tensor&)> backward,
            const char* name);

// Runs backward from `root` seeded with `seed` (same shape as root).
void run_backward(const Tensor& root, const Tensor& seed);

// ---- gradients summed where they are made ----
// Inside a node's backward: the gradient already gathered for the node's input `input` when the backward may
// add its own contribution into it in place and return that very tensor as the input's gradient (the pass then
// adds nothing); undefined otherwise. A product writes there with beta = 1, so a tensor read by several ops (x by
// the q, k and v projections, a weight over micro-batches) gets its gradients summed inside the products instead
// of in a separate add pass over a fresh buffer. Defined only when nothing else can see the sum (so no operand of
// the backward can alias it): a non-leaf's pending gradient, or the .grad of a leaf that requires one, that is the
// only reference to its tensor and to its storage (not a view, not an alias another op returned, not a .grad the
// caller holds), with the input's shape, dtype and backend.
// Outside a backward, or for an input without a gradient so far, undefined. Taking it is optional: a backward
// that ignores it returns a fresh gradient and the pass adds it as before.
Tensor accumulation_target(size_t input);
// Inside a node's backward: true when `saved`, what the backward kept of its input `input` (that input's detach),
// holds values nothing can read after this backward, so the backward may write that input's gradient over them
// (an elementwise backward whose kernel allows it in place: the gated activation's dgate over gate). That is when
// saved covers all of the input's storage and is its one holder (the input's tensor is gone, no other op kept the
// values, no caller holds them), and the caller holds saved alone. False outside a backward.
bool saved_values_expire(size_t input, const Tensor& saved);
// The same for a tensor the node made itself in its forward and gave no one (a pre-activation it kept): true when
// saved is its storage's one holder and covers all of it. False outside a backward.
bool saved_values_expire(const Tensor& saved);
// ---- end gradients summed where they are made ----

// ---- leaf-ready hook (data-parallel gradient bucketing, core/dist) ----
// Called during run_backward with each leaf that requires a gradient and is reachable from the root,
// exactly once, as soon as its .grad holds every contribution of this backward pass (its .grad stays
// undefined when no gradient actually flowed into it). The pass counts each leaf's incoming edges while
// ordering the graph and calls the hook when the last one has been processed, so the hook runs while
// the rest of the backward pass is still to come. Leaves the root cannot reach are never reported.
using LeafReadyHook = std::function<void(const Tensor& leaf)>;
void run_backward(const Tensor& root, const Tensor& seed, const LeafReadyHook& on_leaf_ready);
// ---- end leaf-ready hook ----

// ---- activation recomputation (checkpointing; [trainer] recompute, docs/training.md) ----
// checkpoint(fn, inputs, params) returns fn(inputs) but keeps none of fn's intermediates: the forward runs
// the same ops in the same grad mode as without checkpointing (so every op takes the same path), its
// graph is dropped at once, and the result gets one node that holds only `inputs`, `params` and fn.
// Its backward runs fn again on the saved inputs (recording), back-propagates the incoming gradient
// through that graph, accumulates into the .grad of the parameters it reaches, and hands the inputs'
// gradients on; the recomputed graph is then freed. Peak activation memory drops from every block's
// intermediates to the block inputs plus one block's intermediates, for one more forward per block.
// Contract (what makes the gradients bit-identical to no checkpointing):
//  * fn is a pure function of `inputs`, the parameters and values it captures by value: randomness
//    (dropout) keyed by captured (seed, step) integers, as Model::random_key() gives them, never by a
//    counter that a second call would advance;
//  * every tensor fn reads that needs a gradient is in `inputs` (activations) or `params` (leaves:
//    nn::Module::parameters() of the block); captured tensors must not require gradients (positions,
//    masks). A parameter reached but not listed is refused with an error in the backward, since
//    data-parallel gradient bucketing learns of a leaf's gradient through the node's edges;
//  * fn returns one tensor. Without gradient recording (evaluation, no_grad) checkpoint just calls fn.
using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
Tensor checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& params,
                  const char* name = "checkpoint");

// What the blocks of a backbone do with their activations: keep them (none), or recompute each block in
// the backward (blocks). A thread's mode, like grad mode; the trainer sets it from [trainer] recompute for
// its updates, and a backbone asks through recompute_block().
enum class Recompute : uint8_t { none, blocks };
Recompute recompute_mode();
const char* recompute_name(Recompute mode);           // "none", "blocks"
Recompute recompute_from_name(const std::string& s);  // UsageError naming the choices
// RAII: sets this thread's recompute mode while alive; restores the previous one.
class RecomputeGuard {
 public:
  explicit RecomputeGuard(Recompute mode);
  ~RecomputeGuard();
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  Recompute previous_;
};
// A block's forward under the thread's mode: checkpoint(fn, inputs, params) when the mode is blocks and
// gradients are being recorded, else fn(inputs). This is what a backbone (in tree or a plugin) calls per
// block: x = recompute_block([=](const auto& in) { return layer->forward(in[0]); }, {x}, layer->parameters());
// It goes through run_block (dew/block_params.hpp), so under run.shard = parameters the block's
// parameters are gathered for its forward and its backward and freed in between: `params` must list them.
Tensor recompute_block(const CheckpointFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& params);
// How many blocks recompute_block() has checkpointed on this thread so far (what the trainer reports after its
// first update: a model whose backbone never calls recompute_block recomputes nothing under blocks).
int64_t recomputed_blocks();
// ---- end activation recomputation ----

}  // namespace dew
