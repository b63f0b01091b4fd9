// core/autograd/autograd.cpp — the backward pass: ordering, gradient accumulation, graph release.
//
// Invariants: a tensor with a grad_fn is a non-leaf; leaves accumulate (+=) into .grad only when they
// require gradients; every node runs at most once per backward and is released afterwards (no
// retain_graph); the backward pass itself records nothing (it runs under NoGradGuard). With a leaf-ready
// hook (dew/autograd.hpp), each leaf is reported once, after the last of its incoming edges ran. A backward may
// add an input's gradient into the sum already gathered for it (accumulation_target) only when nothing else sees
// that sum, and returns it; the pass then adds nothing for that edge. A backward may write an input's gradient
// over the values it saved of that input (saved_values_expire) only when nothing else can read them afterwards.
// Edges name nodes and leaves, never an input's tensor, so the graph holds no values but what closures saved; a
// non-leaf's pending gradient is keyed by the node that made it (record() makes one node per output tensor).
#include "dew/autograd.hpp"

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "ops/kernel_call.hpp"

namespace dew {

namespace {
thread_local bool g_grad_enabled = true;

bool participates(const Tensor& t) { return t.defined() && (t.impl()->requires_grad || t.impl()->grad_fn); }

// A node the pass has consumed: its closure (and the values it saved) and its edges are dropped, and a second backward
// through it is refused instead of acting as a leaf. The node object itself stays while its output tensor lives.
std::vector<Tensor> consumed_backward(const Tensor&) {
  DEW_CHECK(false,
            "backward through a graph that a previous backward() already consumed; run the forward "
            "pass again (each forward supports one backward)");
  return {};
}
void release(Node& node) {
  node.inputs.clear();
  node.backward = consumed_backward;
  node.name = "released";
}

// The same storage (one control block), without taking a reference to a storage that may be gone.
bool same_storage(const std::weak_ptr<Storage>& a, const std::shared_ptr<Storage>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { g_grad_enabled = previous_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && participates(*t)) return true;
  return false;
}

void record(Tensor& out, std::vector<Tensor> inputs, std::function<std::vector<Tensor>(const Tensor&)> backward,
            const char* name) {
  auto node = std::make_shared<Node>();
  node->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!participates(t)) continue;  // nothing to propagate into
    Edge& e = node->inputs[i];
    const TensorImpl& impl = *t.impl();
    if (impl.grad_fn)
      e.producer = impl.grad_fn;
    else
      e.leaf = t.impl_ptr();
    e.shape = impl.shape;
    e.dtype = impl.dtype;
    e.backend = t.backend_ptr();
    e.storage = impl.storage;
  }
  node->backward = std::move(backward);
  node->name = name;
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
}

using PendingGrads = std::unordered_map<const Node*, std::shared_ptr<TensorImpl>>;  // a non-leaf's gradient so far

// accumulation_target's view of the node whose backward is running in this thread (a stack: checkpoint runs a
// backward inside a backward). `handed[i]` keeps the tensor given out for input i until the backward returns.
struct TargetContext {
  const Node* node = nullptr;
  const PendingGrads* grads = nullptr;
  std::vector<std::shared_ptr<TensorImpl>> handed;
};
thread_local TargetContext* g_target_context = nullptr;

// A non-leaf's pending sum that nothing else sees: the one reference to its impl and to its storage, not a view.
static bool exclusive(const std::shared_ptr<TensorImpl>& slot) {
  return slot.use_count() == 1 && slot->storage && slot->storage.use_count() == 1 && slot->offset == 0;
}

// Pending gradients of non-leaves: out of place, since an op's backward may return aliases of its
// incoming gradient (add returns g for both inputs); in place only when the pending sum is visible to
// nothing else (its impl and storage referenced only by this slot, not a view), which saves a buffer
// and keeps the sum in the lines just read.
static void accumulate(std::shared_ptr<TensorImpl>& slot, const Tensor& g) {
  if (!slot) {
    slot = g.impl_ptr();
    return;
  }
  if (exclusive(slot)) {
    Tensor existing(slot);
    DEW_INTERNAL_ASSERT(existing.shape() == g.shape());
    detail::kernels(g).binary(existing, g, existing, BinaryOp::add);
    return;
  }
  Tensor existing(slot);
  DEW_INTERNAL_ASSERT(existing.shape() == g.shape());
  Tensor sum = Tensor::empty(g.shape(), g.dtype(), g.backend_ptr());
  detail::kernels(g).binary(existing, g, sum, BinaryOp::add);
  slot = sum.impl_ptr();
}

// A leaf's .grad is owned by the leaf, so it is accumulated in place. On first arrival the gradient is
// adopted as is when nothing else can see it (the only reference to its impl and to its storage, not a
// view: typically the fresh dW of a matmul), as PyTorch's AccumulateGrad steals an unshared gradient;
// otherwise (an alias of another gradient, a view, a tensor the caller keeps) it is cloned.
static void accumulate_leaf(TensorImpl* leaf, const Tensor& g) {
  if (!leaf->grad) {
    const std::shared_ptr<TensorImpl>& gi = g.impl_ptr();
    const bool unshared =
        gi.use_count() == 1 && gi->storage && gi->storage.use_count() == 1 && gi->offset == 0 && !gi->grad_fn;
    leaf->grad = unshared ? gi : g.clone().impl_ptr();
    return;
  }
  Tensor existing(leaf->grad);
  detail::kernels(existing).binary(existing, g, existing, BinaryOp::add);
}

Tensor accumulation_target(size_t i) {
  TargetContext* const c = g_target_context;
  if (!c || i >= c->node->inputs.size()) return Tensor();
  if (c->handed[i]) return Tensor(c->handed[i]);
  const Edge& input = c->node->inputs[i];
  std::shared_ptr<TensorImpl> sum;
  if (input.producer) {
    const auto it = c->grads->find(input.producer.get());
    if (it == c->grads->end() || !exclusive(it->second)) return Tensor();
    sum = it->second;
  } else if (input.leaf) {
    if (!input.leaf->requires_grad || !input.leaf->grad || !exclusive(input.leaf->grad)) return Tensor();
    sum = input.leaf->grad;
  } else {
    return Tensor();
  }
  Tensor target(sum);
  if (target.shape() != input.shape || target.dtype() != input.dtype || target.backend_ptr() != input.backend)
    return Tensor();
  c->handed[i] = std::move(sum);
  return target;
}

// All of its storage, in plain row-major form: not a view into a larger buffer, not quantized, not in panels.
static bool whole_plain(const TensorImpl& t) {
  return t.storage && t.offset == 0 && !t.scales && t.panel == 0 &&
         size_t(numel_of(t.shape)) * dtype_size(t.dtype) == t.storage->bytes;
}

bool saved_values_expire(size_t i, const Tensor& saved) {
  TargetContext* const c = g_target_context;
  if (!c || i >= c->node->inputs.size() || !saved.defined()) return false;
  const Edge& input = c->node->inputs[i];
  if (!input.defined()) return false;  // not an edge of the graph: whoever made it may still hold it
  // saved alone holds the storage: the input's tensor is gone (it would hold it too), nothing else kept the values.
  const std::shared_ptr<TensorImpl>& s = saved.impl_ptr();
  return s.use_count() == 1 && whole_plain(*s) && s->storage.use_count() == 1 &&
         same_storage(input.storage, s->storage);
}

bool saved_values_expire(const Tensor& saved) {
  return g_target_context && saved.defined() && exclusive(saved.impl_ptr()) && whole_plain(*saved.impl());
}

namespace {
// Runs a node's backward with accumulation_target (and saved_values_expire) answering for it; `summed[i]` is the tensor
// handed out for input i (to recognise it among the returned gradients), or null. The references are dropped on return,
// so the pending sums are exclusive again for the pass's own accumulation. The closure is moved out of the node and
// destroyed before returning: the values it saved are freed as soon as it has run.
std::vector<Tensor> backward_of(Node& node, const Tensor& g, const PendingGrads& grads,
                                std::vector<const TensorImpl*>& summed) {
  TargetContext context;
  context.node = &node;
  context.grads = &grads;
  context.handed.resize(node.inputs.size());
  struct Scope {  // this thread's context while the backward runs, the enclosing one's again after (or on a throw)
    TargetContext* outer;
    explicit Scope(TargetContext* c) : outer(std::exchange(g_target_context, c)) {}
    ~Scope() { g_target_context = outer; }
  };
  std::vector<Tensor> in_grads;
  {
    const auto backward = std::exchange(node.backward, consumed_backward);
    Scope scope(&context);
    in_grads = backward(g);
  }
  summed.assign(node.inputs.size(), nullptr);
  for (size_t i = 0; i < summed.size(); ++i) summed[i] = context.handed[i].get();
  return in_grads;
}
}  // namespace

void run_backward(const Tensor& root, const Tensor& seed) { run_backward(root, seed, LeafReadyHook{}); }

void run_backward(const Tensor& root, const Tensor& seed, const LeafReadyHook& on_leaf_ready) {
  DEW_CHECK(root.defined() && participates(root), "backward() on a tensor that does not require gradients");
  DEW_CHECK(seed.shape() == root.shape(), "backward seed shape ", shape_str(seed.shape()),
            " != ", shape_str(root.shape()));
  NoGradGuard no_grad;
  if (!root.impl()->grad_fn) {  // a leaf root: the caller's seed is copied, never adopted
    accumulate_leaf(root.impl(), seed.clone());
    if (on_leaf_ready && root.impl()->requires_grad) on_leaf_ready(root);
    return;
  }

  // Reverse topological order over the nodes (iterative DFS, post-order). `order` owns each node until the pass has
  // run it: consumers drop their edges as they run, and a node whose output tensor is gone has no other owner.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<const Node*> visited;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
  // ---- leaf-ready hook: incoming edges still to be processed, per leaf that requires a gradient ----
  std::unordered_map<TensorImpl*, int64_t> pending_edges;
  auto leaf_edge_done = [&](const Edge& edge) {
    auto it = pending_edges.find(edge.leaf.get());
    if (it != pending_edges.end() && --it->second == 0) on_leaf_ready(Tensor(edge.leaf));
  };
  // ---- end leaf-ready hook ----
  auto push = [&](const std::shared_ptr<Node>& node) {
    if (!node || !visited.insert(node.get()).second) return;
    stack.push_back({node, 0});
  };
  push(root.impl()->grad_fn);
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const Edge& in = node->inputs[next++];
      if (on_leaf_ready && in.leaf && in.leaf->requires_grad)
        ++pending_edges[in.leaf.get()];  // leaf-ready hook: one more edge into this leaf
      push(in.producer);
    } else {
      order.push_back(std::move(node));
      stack.pop_back();
    }
  }

  PendingGrads grads;
  grads[root.impl()->grad_fn.get()] = seed.impl_ptr();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const std::shared_ptr<Node> node = std::move(*it);  // freed at the end of this iteration unless a tensor holds it
    auto git = grads.find(node.get());
    if (git == grads.end()) {  // no gradient flowed here
      if (on_leaf_ready)       // leaf-ready hook: these edges are done too
        for (const Edge& input : node->inputs)
          if (input.leaf) leaf_edge_done(input);
      release(*node);
      continue;
    }
    Tensor g(git->second);
    grads.erase(git);
    std::vector<const TensorImpl*> summed;
    std::vector<Tensor> in_grads = backward_of(*node, g, grads, summed);
    g = Tensor();
    DEW_INTERNAL_ASSERT(in_grads.size() == node->inputs.size());
    for (size_t i = 0; i < in_grads.size(); ++i) {
      const Edge& input = node->inputs[i];
      if (!input.defined()) continue;
      if (!in_grads[i].defined()) {
        if (on_leaf_ready && input.leaf) leaf_edge_done(input);  // leaf-ready hook
        continue;
      }
      DEW_CHECK(in_grads[i].shape() == input.shape, "internal error: ", node->name, " produced a gradient of shape ",
                shape_str(in_grads[i].shape()), " for an input of shape ", shape_str(input.shape));
      if (in_grads[i].impl() == summed[i]) {  // the backward added it into the pending sum (accumulation_target)
        if (on_leaf_ready && input.leaf) leaf_edge_done(input);  // leaf-ready hook
      } else if (input.producer) {
        accumulate(grads[input.producer.get()], in_grads[i]);
      } else if (input.leaf->requires_grad) {
        accumulate_leaf(input.leaf.get(), in_grads[i]);
        if (on_leaf_ready) leaf_edge_done(input);  // leaf-ready hook
      }
    }
    release(*node);
  }
}

void Tensor::backward() const {
  DEW_CHECK(numel() == 1, "backward() needs a one-element tensor (a loss); got shape ", shape_str(shape()));
  run_backward(*this, Tensor::full(shape(), 1.0, dtype(), backend_ptr()));
}

}  // namespace dew
