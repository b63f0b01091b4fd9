// core/autograd/checkpoint.cpp — activation recomputation: checkpoint(), the thread's recompute mode and
// recompute_block() (dew/autograd.hpp).
//
// Invariants: the forward of a checkpointed block runs the same ops in the same grad mode, on stand-ins
// that require gradients exactly where the real inputs do, so every op takes the path it takes without
// checkpointing (linear's fused epilogue is a no-grad-only path, for instance) and the output is bit for
// bit the same; its graph is dropped before checkpoint() returns. The backward recomputes on fresh
// stand-ins of the saved inputs with the recompute mode off (a nested block is not recomputed twice),
// back-propagates through the recomputed graph with the same engine (same accumulation order), and
// refuses a leaf it reaches that was not declared. The recomputation runs under the autocast dtype the forward
// ran under (dew/autocast.hpp): backward closures otherwise run outside the guard, and a block recomputed in f32
// would be another graph (a bf16-mixed block's bf16 activations meeting f32 weights: an error, or other bits).
// Parameters' gradients accumulate in that inner pass; the node returns none for them, so the outer pass counts their
// edges (leaf-ready hook) without adding twice.
#include <unordered_set>

#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/block_params.hpp"
#include "dew/error.hpp"

namespace dew {

namespace {
thread_local Recompute g_recompute = Recompute::none;
thread_local int64_t g_recomputed = 0;  // recomputed_blocks()

bool participates(const Tensor& t) { return t.defined() && (t.impl()->requires_grad || t.impl()->grad_fn); }

// Detached copies of `values` (same storage) that require a gradient where `needs[i]`.
std::vector<Tensor> stand_ins(const std::vector<Tensor>& values, const std::vector<char>& needs) {
  std::vector<Tensor> out;
  out.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined()) {
      out.emplace_back();
      continue;
    }
    Tensor s = values[i].detach();
    if (needs[i]) s.set_requires_grad(true);
    out.push_back(std::move(s));
  }
  return out;
}
}  // namespace

Recompute recompute_mode() { return g_recompute; }
int64_t recomputed_blocks() { return g_recomputed; }

const char* recompute_name(Recompute mode) { return mode == Recompute::blocks ? "blocks" : "none"; }

Recompute recompute_from_name(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "blocks") return Recompute::blocks;
  DEW_USAGE_CHECK(false, "option 'trainer.recompute' must be none or blocks, got '", s, "'");
  return Recompute::none;
}

RecomputeGuard::RecomputeGuard(Recompute mode) : previous_(g_recompute) { g_recompute = mode; }
RecomputeGuard::~RecomputeGuard() { g_recompute = previous_; }

Tensor checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& params,
                  const char* name) {
  bool any = false;
  std::vector<char> needs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) any = (needs[i] = participates(inputs[i])) || any;
  for (const Tensor& p : params) any = any || participates(p);
  if (!grad_enabled() || !any) return fn(inputs);

  std::vector<Tensor> saved;  // the inputs' values, without their history (the node's edges keep that)
  saved.reserve(inputs.size());
  for (const Tensor& t : inputs) saved.push_back(t.defined() ? t.detach() : Tensor());
  Tensor out;
  {
    RecomputeGuard flat(Recompute::none);
    const Tensor y = fn(stand_ins(saved, needs));
    DEW_CHECK(y.defined(), name, ": the checkpointed function returned no tensor");
    out = y.detach();  // y's graph (every intermediate of the block) is released here
  }
  std::vector<Tensor> edges = inputs;
  edges.insert(edges.end(), params.begin(), params.end());
  const size_t n_inputs = inputs.size(), n_params = params.size();
  std::vector<TensorImpl*> declared;  // the parameters the inner backward may reach
  for (const Tensor& p : params)
    if (p.defined()) declared.push_back(p.impl());
  const Shape out_shape = out.shape();
  const DType autocast = autocast_dtype();  // restored around the recomputation
  record(
      out, std::move(edges),
      [fn = std::move(fn), saved = std::move(saved), needs = std::move(needs), declared = std::move(declared), n_inputs,
       n_params, out_shape, autocast, name](const Tensor& g) {
        std::vector<Tensor> grads(n_inputs + n_params);
        RecomputeGuard flat(Recompute::none);
        EnableGradGuard recording;
        std::vector<Tensor> xs = stand_ins(saved, needs);
        const Tensor y = [&] {
          AutocastGuard as_forward(autocast);  // the forward's ops, not f32 ones (the run_backward below: outside)
          return fn(xs);
        }();
        DEW_CHECK(y.defined() && y.shape() == out_shape, name, ": the recomputed block returned ",
                  y.defined() ? shape_str(y.shape()) : std::string("nothing"), ", the forward ", shape_str(out_shape),
                  " (the function must be pure)");
        if (!participates(y)) return grads;
        std::unordered_set<const TensorImpl*> allowed(declared.begin(), declared.end());
        for (const Tensor& x : xs)
          if (x.defined()) allowed.insert(x.impl());
        run_backward(y, g, [&](const Tensor& leaf) {
          DEW_CHECK(allowed.count(leaf.impl()) > 0, name,
                    ": the recomputed block reached a tensor that requires a gradient but was passed neither as "
                    "an input nor as a parameter (shape ",
                    shape_str(leaf.shape()), "); list every parameter the block uses");
        });
        for (size_t i = 0; i < n_inputs; ++i)
          if (xs[i].defined() && needs[i]) grads[i] = xs[i].grad();
        return grads;  // the parameters' gradients were accumulated into their .grad by the pass above
      },
      name);
  return out;
}

Tensor recompute_block(const CheckpointFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& params) {
  // Under sharded parameters (run.shard = parameters) run_block gathers the block's parameters around its
  // forward and again before its backward (dew/block_params.hpp); otherwise it is just the call.
  return run_block(
      [&] {
        if (g_recompute == Recompute::blocks && grad_enabled()) {
          ++g_recomputed;
          return checkpoint(fn, inputs, params, "recompute_block");
        }
        return fn(inputs);
      },
      params);
}

}  // namespace dew
