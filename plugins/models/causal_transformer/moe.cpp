// moe.cpp — the mixture-of-experts MLP of moe.hpp: routing on the host, each expert over its own rows.
// Each expert's rows are padded with zero rows to a multiple of kRowBucket (below it, to a power of two: a decode
// step's one row stays one row): its products then come in a few dozen shapes, whose kernels (oneDNN primitives,
// cuBLASLt plans) are built once and cached, where the exact count of a step's routing would give new shapes every step
// (on the cpu backend each new shape costs oneDNN a primitive, 1-12 ms: the unpadded gpt-mini-moe step spent ~40 % of
// its time there). A zero row's expert output is zero (the experts have no biases) and it is never read back, so it
// adds nothing to any output or gradient.
#include "moe.hpp"

#include <algorithm>
#include <dew/error.hpp>
#include <dew/ops.hpp>
#include <numeric>
#include <string>

namespace dew_ct {

using dew::Tensor;

namespace {
constexpr int64_t kRowBucket = 64;
int64_t bucketed(int64_t rows) {
  if (rows >= kRowBucket) return (rows + kRowBucket - 1) / kRowBucket * kRowBucket;
  int64_t p = 1;
  while (p < rows) p *= 2;
  return p;
}
}  // namespace

MoeMLP::MoeMLP(int64_t dim, int64_t hidden, int64_t n_experts, int64_t k, bool norm, dew::Activation act,
               dew::nn::ProjectionInit init)
    : top_k(k), norm_topk(norm) {
  DEW_USAGE_CHECK(n_experts >= 2, "model.moe_experts must be >= 2, got ", n_experts);
  DEW_USAGE_CHECK(k >= 1 && k <= n_experts, "model.moe_top_k must be in [1, moe_experts = ", n_experts, "], got ", k);
  gate = register_module("gate", std::make_shared<dew::nn::Linear>(dim, n_experts, false, init.weight));
  auto list = register_module("experts", std::make_shared<dew::nn::ModuleDict>());
  for (int64_t e = 0; e < n_experts; ++e)
    experts.push_back(list->add(std::to_string(e), std::make_shared<dew::nn::GatedMLP>(dim, hidden, act, false, init)));
}

Tensor MoeMLP::forward(const Tensor& x, MoeStats* stats) const {
  DEW_CHECK(x.ndim() == 3, "MoeMLP: input must be [B, T, dim], got ", dew::shape_str(x.shape()));
  const int64_t n = x.shape()[0] * x.shape()[1], d = x.shape()[2], e_count = int64_t(experts.size()), k = top_k;
  const Tensor rows = dew::reshape(x, {1, n, d});
  Tensor logits = gate->forward(rows);  // [1, n, E]
  if (logits.dtype() != dew::DType::f32) logits = dew::cast(logits, dew::DType::f32);
  const Tensor probs = dew::softmax(logits);
  // Top-k per token on the host (ties to the lower expert index), then the rows of each expert in token order.
  const std::vector<float> p = probs.to_floats();
  std::vector<int32_t> choice(static_cast<size_t>(n * k));  // [n, k] expert ids, by descending probability
  std::vector<int32_t> order(static_cast<size_t>(e_count));
  for (int64_t r = 0; r < n; ++r) {
    const float* pr = p.data() + r * e_count;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return pr[a] > pr[b] || (pr[a] == pr[b] && a < b); });
    std::copy(order.begin(), order.begin() + k, choice.begin() + r * k);
  }
  // The chosen probabilities (flat index r E + e of probs), differentiable; renormalised over the k.
  std::vector<int32_t> flat(static_cast<size_t>(n * k));
  for (int64_t s = 0; s < n * k; ++s) flat[size_t(s)] = int32_t((s / k) * e_count + choice[size_t(s)]);
  Tensor weights = dew::gather_rows(dew::reshape(probs, {1, n * e_count, 1}),
                                    Tensor::from_ints(flat, {1, n * k}, x.backend_ptr()));  // [1, n k, 1]
  if (norm_topk) {
    const Tensor w = dew::reshape(weights, {n, k});
    weights = dew::reshape(dew::div(w, dew::sum(w, -1, true)), {1, n * k, 1});
  }
  // Each expert over its rows (padded with row n, zeros, to bucketed()'s count); outputs stacked expert by
  // expert, then each slot's row read back in slot order.
  const Tensor padded = dew::concat({rows, Tensor::zeros({1, 1, d}, rows.dtype(), x.backend_ptr())}, 1);
  std::vector<int32_t> sorted_of_slot(static_cast<size_t>(n * k));
  std::vector<Tensor> outs;
  std::vector<double> slots(static_cast<size_t>(e_count), 0.0);
  int32_t stacked_rows = 0;
  for (int64_t e = 0; e < e_count; ++e) {
    std::vector<int32_t> token_rows;
    for (int64_t s = 0; s < n * k; ++s)
      if (choice[size_t(s)] == e) {
        sorted_of_slot[size_t(s)] = stacked_rows + int32_t(token_rows.size());
        token_rows.push_back(int32_t(s / k));
      }
    slots[size_t(e)] = double(token_rows.size());
    if (token_rows.empty()) continue;
    token_rows.resize(size_t(bucketed(int64_t(token_rows.size()))), int32_t(n));
    stacked_rows += int32_t(token_rows.size());
    const Tensor xe = dew::gather_rows(
        padded, Tensor::from_ints(token_rows, {1, int64_t(token_rows.size())}, x.backend_ptr()));  // [1, n_e+, d]
    outs.push_back(experts[size_t(e)]->forward(xe));
  }
  const Tensor stacked = outs.size() == 1 ? outs[0] : dew::concat(outs, 1);  // [1, padded rows, d]
  Tensor per_slot =
      dew::gather_rows(stacked, Tensor::from_ints(sorted_of_slot, {1, n * k}, x.backend_ptr()));  // [1, n k, d]
  if (weights.dtype() != per_slot.dtype()) weights = dew::cast(weights, per_slot.dtype());
  per_slot = dew::mul(per_slot, weights);
  const Tensor y = dew::sum(dew::reshape(per_slot, {n, k, d}), 1);  // [n, d]
  if (stats) {
    if (stats->slots.empty()) stats->slots.assign(size_t(e_count), 0.0);
    for (int64_t e = 0; e < e_count; ++e) stats->slots[size_t(e)] += slots[size_t(e)];
    const Tensor prob_sum = dew::sum(dew::reshape(probs, {n, e_count}), 0);  // [E]
    stats->prob_sum = stats->prob_sum.defined() ? dew::add(stats->prob_sum, prob_sum) : prob_sum;
    stats->tokens += double(n);
  }
  return dew::reshape(y, x.shape());
}

Tensor MoeStats::balancing_loss() const {
  if (!prob_sum.defined() || tokens <= 0) return Tensor();
  std::vector<float> f(slots.size());  // slots taken per token: sums to top_k (transformers' tokens_per_expert)
  for (size_t e = 0; e < slots.size(); ++e) f[e] = float(slots[e] / tokens);
  const Tensor share = Tensor::from_vector(f, {int64_t(f.size())}, prob_sum.backend_ptr());
  // E sum_e f_e P_e with P_e = prob_sum_e / tokens.
  return dew::scale(dew::sum(dew::mul(share, prob_sum)), float(double(slots.size()) / tokens));
}

}  // namespace dew_ct
