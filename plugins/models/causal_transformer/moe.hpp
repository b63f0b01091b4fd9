// moe.hpp — the causal_transformer's mixture-of-experts MLP (Qwen3-MoE / OLMoE / Mixtral's token-choice top-k
// routing), Hugging Face names under the layer's "mlp": gate.weight [E, dim] (the router), experts.{e}.{gate,up,
// down}_proj.weight (E gated MLPs).
//
// Routing: p = softmax(x gate^T) in f32 over the E experts; each token goes to its top_k experts (ties to the lower
// index), weighted by their p (renormalised over the k when norm_topk, Qwen3-MoE's norm_topk_prob). The choice is
// made on the host from p (a [tokens, E] read per layer); each expert runs once over the rows routed to it, so the
// step computes top_k expert MLPs a token, never E. Gradients reach the router through the chosen weights (the
// routing itself is piecewise constant), the experts through their rows (gather_rows / its scatter-add).
// Load balancing (Switch / Mixtral's auxiliary loss, as transformers' load_balancing_loss_func over every layer
// of a forward): E * sum_e f_e P_e, f_e the routing slots expert e took per token and P_e its mean router
// probability, both over all tokens of all MoE layers (top_k when perfectly balanced); MoeStats gathers them across
// the layers of one forward.
#pragma once
#include <dew/nn.hpp>
#include <memory>
#include <vector>

namespace dew_ct {

// The routing statistics of one forward, summed over its MoE layers (for the load-balancing loss).
struct MoeStats {
  std::vector<double> slots;  // [E]: routing slots taken per expert (tokens x top_k over all layers)
  dew::Tensor prob_sum;       // [E] f32: the router probabilities summed over tokens and layers (differentiable)
  double tokens = 0;          // tokens x layers
  void reset() { slots.clear(), prob_sum = dew::Tensor(), tokens = 0; }
  // E * sum_e (slots_e / tokens) (prob_sum_e / tokens): undefined when no MoE layer ran.
  dew::Tensor balancing_loss() const;
};

class MoeMLP final : public dew::nn::Module {
 public:
  MoeMLP(int64_t dim, int64_t hidden, int64_t experts, int64_t top_k, bool norm_topk, dew::Activation act,
         dew::nn::ProjectionInit init);
  // x [B, T, dim] -> [B, T, dim]; adds this layer's routing to *stats when given.
  dew::Tensor forward(const dew::Tensor& x, MoeStats* stats = nullptr) const;
  std::shared_ptr<dew::nn::Linear> gate;  // the router [E, dim]
  std::vector<std::shared_ptr<dew::nn::GatedMLP>> experts;
  int64_t top_k = 2;
  bool norm_topk = true;
};

}  // namespace dew_ct
