// causal_transformer.cpp — the `causal_transformer` backbone: a Llama-style decoder-only transformer
// (Llama / Qwen3 / Gemma options), with Hugging Face parameter names and a KV-cached decode path.
//
// forward({"tokens": i32 [B, T]}) -> logits f32 [B, T, V]. Packed rows add "positions" i32 [B, T] (rotary
// positions, restarting per document) and "segment_ids" i32 [B, T] (attention stays inside each document;
// dew/backend.hpp AttentionParams); either may come alone. Dropout (when dropout > 0 and the module is
// training) is keyed by the Model's random_key() (seed, step), which the objective sets: the mask of site s
// in layer i is philox(seed, stream_of("dropout.<i>.<s>") + step * golden, k).
//
// Block (pre-norm):  x = x + drop(self_attn(input_layernorm(x)));  x = x + drop(mlp(post_attention_layernorm(x)))
// With sandwich_norm (Gemma 2/3):  x = x + drop(post_attention_layernorm(self_attn(input_layernorm(x))));
//                                  x = x + drop(post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))))
// With [trainer] recompute = blocks each block of a training forward goes through dew::recompute_block
// (dew/autograd.hpp): only its input is kept and it runs again, with the same dropout masks, in the backward.
// Head: norm(x) @ embed_tokens^T (tied) or lm_head(norm(x)); optional final logit softcap
// cap * tanh(z / cap). Embeddings optionally scaled by sqrt(dim) (Gemma). Attention: q/k/v projections,
// optional RMSNorm over head_dim on q and k (before RoPE), rotary positions in the rotate-half pairing on
// the first partial_rotary * head_dim features, GQA, a causal mask, a sliding window on "local" layers,
// optional attention-logit softcap. Built from the SDK blocks (dew/nn.hpp): nn::Attention (its KV-cache
// and slot-cache paths serve forward_cached and forward_slots), nn::GatedMLP, nn::RMSNorm, nn::Embedding.
// The K/V caches hold f32, or bf16 after set_cache_dtype(bf16) (what `--weights bf16` asks for, through
// dew::store_decode_weights_as); the embedding's dtype plays no part in it.
//
// Parameter names (exactly the Hugging Face Llama/Qwen3 layout):
//   model.embed_tokens.weight [V, D]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight   (+ q_norm.weight, k_norm.weight [head_dim];
//                                                        + .bias with qkv_bias / o_bias / mlp_bias)
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight     (mlp = gelu: up_proj, down_proj only)
//   model.layers.{i}.input_layernorm.weight, model.layers.{i}.post_attention_layernorm.weight
//   (+ pre_feedforward_layernorm.weight, post_feedforward_layernorm.weight with sandwich_norm)
//   model.norm.weight, lm_head.weight [V, D] (only when tie_embeddings = false)
// Init: every matrix and the embedding N(0, init_std = 0.02); o_proj and down_proj N(0, 0.02 / sqrt(2 L))
// (GPT-2's residual scaling); norm weights 1 (0 with norm_offset = 1, the "(1 + w)" scale).
//
// Options ([model]): vocab_size (required; the lm objective fills it from the tokenizer), dim (512),
// n_layers (8), n_heads (8), n_kv_heads (= n_heads), head_dim (= dim / n_heads), mlp (swiglu | geglu |
// gelu), mlp_hidden (gated: 8 dim / 3 rounded up to a multiple of 64; gelu: 4 dim), norm_eps (1e-5),
// norm_offset (0 | 1), rope_theta (10000), rope_scaling (none | linear | llama3 | yarn, with rope_factor,
// rope_original_max_position, rope_low/high_freq_factor, rope_beta_fast/slow, rope_truncate,
// rope_attention_factor: Hugging Face's rope_scaling fields), rope_local_theta (0: local layers rotate like the
// others; > 0 their own base, unscaled: Gemma 3), query_pre_attn_scalar (0: scores / sqrt(head_dim); > 0: / its
// square root), sandwich_norm (false), partial_rotary (1), qk_norm (false), qkv_bias / o_bias /
// mlp_bias (false: biases, initialised to 0, on q/k/v, o_proj, the MLP), sliding_window (0),
// layer_pattern ("global"; a comma list of global | local cycled over the layers; local layers use
// sliding_window), attn_softcap (0), final_softcap (0), tie_embeddings (true), embed_scale (false),
// dropout (0), init_std (0.02), max_seq_len (2048: the context length FLOPs are counted for,
// max_position_embeddings and the context generation keeps to; the lm objective sets it to the data's
// sequence length).
//
// FLOPs (flops_per_sample, for one sequence of max_seq_len = T tokens, forward only):
//   2 * T * (non-embedding parameters + V * D)          (every matmul weight once per token; the head
//                                                        reads V x D whether tied or not)
// + 4 * T^2 * H * head_dim per layer                     (q.k and p.v over the full T x T square, the
//                                                        PaLM / nanoGPT convention; window layers count
//                                                        T * min(T, window))
#include <cmath>
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/generate.hpp>
#include <dew/kernel_contracts.hpp>
#include <dew/model.hpp>
#include <dew/random.hpp>
#include <dew/registry.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "moe.hpp"

namespace {

using dew::Activation;
using dew::Options;
using dew::Tensor;
using dew::nn::Init;

struct Config {
  int64_t vocab = 0, dim = 512, layers = 8, heads = 8, kv_heads = 0, head_dim = 0, hidden = 0;
  std::string mlp = "swiglu";
  double norm_eps = 1e-5;
  float norm_offset = 0.0f;
  double rope_theta = 10000.0, partial_rotary = 1.0;
  dew::RopeScaling rope_scaling;       // rope_scaling and its rope_* parameters
  double rope_attention_factor = 1.0;  // yarn: q and k scaled by it (the scores by its square)
  double rope_local_theta = 0;         // > 0: local layers' rotary base, unscaled (Gemma 3's rope_local_base_freq)
  double query_pre_attn_scalar = 0;    // > 0: scores scaled by its -1/2 power instead of head_dim's (Gemma)
  bool sandwich_norm = false;          // Gemma 2/3: the attention and MLP outputs normed before their residual adds
  int64_t moe_experts = 0, moe_top_k = 2, moe_hidden = 0;  // > 0 experts: every layer's MLP a mixture (moe.hpp)
  bool moe_norm_topk = true;
  double moe_aux_loss = 0.001;  // the load-balancing loss's weight (transformers' router_aux_loss_coef)
  int64_t rotary_dim = 0;
  bool qk_norm = false;
  bool qkv_bias = false, o_bias = false, mlp_bias = false;  // Qwen2: qkv; Llama/Qwen3 attention_bias: qkv + o
  int64_t window = 0;
  std::vector<bool> local;  // per layer
  std::string pattern = "global";
  double attn_softcap = 0, final_softcap = 0;
  bool tie = true, embed_scale = false;
  double dropout = 0, init_std = 0.02;
  int64_t max_seq_len = 2048;
};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// rope_scaling = none | linear | llama3 | yarn and the parameters its kind reads (Hugging Face's rope_scaling
// fields; a parameter the kind does not read is refused, so a typo cannot pass as a setting).
void read_rope_scaling(const Options& o, Config& c) {
  const std::string kind = o.get_string("rope_scaling", "none");
  dew::RopeScaling& s = c.rope_scaling;
  if (kind == "none")
    s.kind = dew::RopeScalingKind::none;
  else if (kind == "linear")
    s.kind = dew::RopeScalingKind::linear;
  else if (kind == "llama3")
    s.kind = dew::RopeScalingKind::llama3;
  else if (kind == "yarn")
    s.kind = dew::RopeScalingKind::yarn;
  else
    DEW_USAGE_CHECK(false, "option 'model.rope_scaling' must be none, linear, llama3 or yarn, got '", kind, "'");
  const bool llama3 = s.kind == dew::RopeScalingKind::llama3, yarn = s.kind == dew::RopeScalingKind::yarn;
  const std::pair<const char*, bool> readers[] = {{"rope_factor", s.kind != dew::RopeScalingKind::none},
                                                  {"rope_original_max_position", llama3 || yarn},
                                                  {"rope_low_freq_factor", llama3},
                                                  {"rope_high_freq_factor", llama3},
                                                  {"rope_beta_fast", yarn},
                                                  {"rope_beta_slow", yarn},
                                                  {"rope_truncate", yarn},
                                                  {"rope_attention_factor", yarn}};
  for (const auto& [key, read] : readers)
    DEW_USAGE_CHECK(read || !o.has(key), "option 'model.", key, "' is not read under model.rope_scaling = ", kind);
  if (s.kind == dew::RopeScalingKind::none) return;
  DEW_USAGE_CHECK(o.has("rope_factor"), "model.rope_scaling = ", kind, " needs model.rope_factor");
  s.factor = o.get_double("rope_factor", 1.0);
  if (llama3 || yarn) {
    DEW_USAGE_CHECK(o.has("rope_original_max_position"), "model.rope_scaling = ", kind,
                    " needs model.rope_original_max_position (the pretraining context length)");
    s.original_max_position = double(o.get_int("rope_original_max_position", 0));
  }
  s.low_freq_factor = o.get_double("rope_low_freq_factor", 1.0);
  s.high_freq_factor = o.get_double("rope_high_freq_factor", 4.0);
  s.beta_fast = o.get_double("rope_beta_fast", 32.0);
  s.beta_slow = o.get_double("rope_beta_slow", 1.0);
  s.truncate = o.get_bool("rope_truncate", true);
  try {
    dew::contracts::check_rope_scaling("model.rope_scaling", s);
  } catch (const dew::Error& e) {
    DEW_USAGE_CHECK(false, e.what());
  }
  // YaRN's default: 0.1 ln(factor) + 1 (transformers' get_mscale; 1 at factor 1).
  c.rope_attention_factor =
      yarn ? o.get_double("rope_attention_factor", s.factor <= 1.0 ? 1.0 : 0.1 * std::log(s.factor) + 1.0) : 1.0;
  DEW_USAGE_CHECK(std::isfinite(c.rope_attention_factor) && c.rope_attention_factor > 0,
                  "option 'model.rope_attention_factor' must be positive, got ", c.rope_attention_factor);
}

Config read_config(const Options& o) {
  Config c;
  DEW_USAGE_CHECK(o.has("vocab_size"),
                  "causal_transformer: missing option 'model.vocab_size' (the lm objective sets it "
                  "from the tokenizer's meta.json)");
  c.vocab = o.get_int("vocab_size", 0);
  DEW_USAGE_CHECK(c.vocab > 0, "option 'model.vocab_size' must be positive, got ", c.vocab);
  c.dim = o.get_int("dim", 512);
  c.layers = o.get_int("n_layers", 8);
  c.heads = o.get_int("n_heads", 8);
  DEW_USAGE_CHECK(c.dim > 0, "option 'model.dim' must be positive, got ", c.dim);
  DEW_USAGE_CHECK(c.layers > 0, "option 'model.n_layers' must be positive, got ", c.layers);
  DEW_USAGE_CHECK(c.heads > 0, "option 'model.n_heads' must be positive, got ", c.heads);
  c.kv_heads = o.get_int("n_kv_heads", c.heads);
  DEW_USAGE_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0, "option 'model.n_kv_heads' (", c.kv_heads,
                  ") must divide model.n_heads (", c.heads, ")");
  const int64_t default_hd = c.dim % c.heads == 0 ? c.dim / c.heads : 0;
  c.head_dim = o.get_int("head_dim", default_hd);
  DEW_USAGE_CHECK(c.head_dim > 0, "model.dim ", c.dim, " is not a multiple of model.n_heads ", c.heads,
                  ": set model.head_dim");
  c.mlp = o.get_string("mlp", "swiglu");
  DEW_USAGE_CHECK(c.mlp == "swiglu" || c.mlp == "geglu" || c.mlp == "gelu",
                  "option 'model.mlp' must be swiglu, geglu "
                  "or gelu, got '",
                  c.mlp, "'");
  const int64_t default_hidden = c.mlp == "gelu" ? 4 * c.dim : round_up((8 * c.dim + 2) / 3, 64);
  c.hidden = o.get_int("mlp_hidden", default_hidden);
  DEW_USAGE_CHECK(c.hidden > 0, "option 'model.mlp_hidden' must be positive, got ", c.hidden);
  c.moe_experts = o.get_int("moe_experts", 0);
  DEW_USAGE_CHECK(c.moe_experts == 0 || c.moe_experts >= 2,
                  "option 'model.moe_experts' must be 0 (a dense MLP) or >= 2, got ", c.moe_experts);
  c.moe_top_k = o.get_int("moe_top_k", 2);
  c.moe_hidden = o.get_int("moe_hidden", c.hidden);
  c.moe_norm_topk = o.get_bool("moe_norm_topk", true);
  c.moe_aux_loss = o.get_double("moe_aux_loss", 0.001);
  if (c.moe_experts > 0) {
    DEW_USAGE_CHECK(c.moe_top_k >= 1 && c.moe_top_k <= c.moe_experts, "option 'model.moe_top_k' must be in [1, ",
                    c.moe_experts, "], got ", c.moe_top_k);
    DEW_USAGE_CHECK(c.moe_hidden > 0, "option 'model.moe_hidden' must be positive, got ", c.moe_hidden);
    DEW_USAGE_CHECK(c.moe_aux_loss >= 0, "option 'model.moe_aux_loss' must be >= 0, got ", c.moe_aux_loss);
    DEW_USAGE_CHECK(c.mlp != "gelu", "model.moe_experts needs a gated MLP (swiglu or geglu), got mlp = gelu");
  }
  c.norm_eps = o.get_double("norm_eps", 1e-5);
  DEW_USAGE_CHECK(c.norm_eps > 0, "option 'model.norm_eps' must be positive, got ", c.norm_eps);
  const double off = o.get_double("norm_offset", 0.0);
  DEW_USAGE_CHECK(off == 0.0 || off == 1.0, "option 'model.norm_offset' must be 0 (w) or 1 ((1 + w), Gemma), got ",
                  off);
  c.norm_offset = float(off);
  c.rope_theta = o.get_double("rope_theta", 10000.0);
  DEW_USAGE_CHECK(c.rope_theta > 0, "option 'model.rope_theta' must be positive, got ", c.rope_theta);
  read_rope_scaling(o, c);
  c.partial_rotary = o.get_double("partial_rotary", 1.0);
  DEW_USAGE_CHECK(c.partial_rotary >= 0 && c.partial_rotary <= 1,
                  "option 'model.partial_rotary' must be in [0, 1], got ", c.partial_rotary);
  const int64_t rd = int64_t(std::floor(c.partial_rotary * double(c.head_dim) / 2.0)) * 2;
  DEW_USAGE_CHECK(c.partial_rotary == 0 || rd > 0, "model.partial_rotary ", c.partial_rotary, " of head_dim ",
                  c.head_dim, " rotates no feature pair");
  DEW_USAGE_CHECK(c.partial_rotary == 0 || c.head_dim % 2 == 0, "rotary positions need an even head_dim, got ",
                  c.head_dim);
  c.rotary_dim = c.partial_rotary == 0 ? -1 : (rd == c.head_dim ? 0 : rd);
  c.qk_norm = o.get_bool("qk_norm", false);
  c.qkv_bias = o.get_bool("qkv_bias", false);
  c.o_bias = o.get_bool("o_bias", false);
  c.mlp_bias = o.get_bool("mlp_bias", false);
  c.window = o.get_int("sliding_window", 0);
  DEW_USAGE_CHECK(c.window >= 0, "option 'model.sliding_window' must be >= 0, got ", c.window);
  c.pattern = o.get_string("layer_pattern", "global");
  std::vector<bool> kinds;
  for (const std::string& k : o.get_strings("layer_pattern", {"global"})) {
    if (k == "global" || k == "full" || k == "full_attention")
      kinds.push_back(false);
    else if (k == "local" || k == "sliding" || k == "sliding_attention")
      kinds.push_back(true);
    else
      DEW_USAGE_CHECK(false, "option 'model.layer_pattern': '", k, "' is not global or local");
  }
  DEW_USAGE_CHECK(!kinds.empty(), "option 'model.layer_pattern' is empty");
  for (int64_t i = 0; i < c.layers; ++i) c.local.push_back(kinds[size_t(i) % kinds.size()]);
  bool any_local = false;
  for (bool l : c.local) any_local = any_local || l;
  DEW_USAGE_CHECK(!any_local || c.window > 0, "model.layer_pattern has local layers but model.sliding_window is 0");
  c.attn_softcap = o.get_double("attn_softcap", 0.0);
  c.final_softcap = o.get_double("final_softcap", 0.0);
  DEW_USAGE_CHECK(c.attn_softcap >= 0 && c.final_softcap >= 0,
                  "model.attn_softcap and model.final_softcap must be >= 0");
  c.rope_local_theta = o.get_double("rope_local_theta", 0.0);
  DEW_USAGE_CHECK(c.rope_local_theta >= 0, "option 'model.rope_local_theta' must be >= 0, got ", c.rope_local_theta);
  c.query_pre_attn_scalar = o.get_double("query_pre_attn_scalar", 0.0);
  DEW_USAGE_CHECK(c.query_pre_attn_scalar >= 0, "option 'model.query_pre_attn_scalar' must be >= 0, got ",
                  c.query_pre_attn_scalar);
  c.sandwich_norm = o.get_bool("sandwich_norm", false);
  c.tie = o.get_bool("tie_embeddings", true);
  c.embed_scale = o.get_bool("embed_scale", false);
  c.dropout = o.get_double("dropout", 0.0);
  DEW_USAGE_CHECK(c.dropout >= 0 && c.dropout < 1, "option 'model.dropout' must be in [0, 1), got ", c.dropout);
  c.init_std = o.get_double("init_std", 0.02);
  DEW_USAGE_CHECK(c.init_std > 0, "option 'model.init_std' must be positive, got ", c.init_std);
  c.max_seq_len = o.get_int("max_seq_len", 2048);
  DEW_USAGE_CHECK(c.max_seq_len > 0, "option 'model.max_seq_len' must be positive, got ", c.max_seq_len);
  return c;
}

// Every matrix N(0, init_std); the output projections N(0, init_std / sqrt(2 L)); biases 0 (Hugging
// Face's _init_weights).
dew::nn::ProjectionInit projection_init(const Config& c) {
  const Init w = Init::Normal(float(c.init_std));
  const Init wo = Init::Normal(float(c.init_std / std::sqrt(2.0 * double(c.layers))));
  return {w, Init::Zeros(), wo, Init::Zeros()};
}

// Per-layer K/V of a batch: [B, capacity, Hkv, D] each, filled up to `length`.
class KVCache final : public dew::DecodeCache {
 public:
  int64_t batch() const override { return batch_; }
  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  int64_t batch_ = 0, length_ = 0, capacity_ = 0;
  std::vector<Tensor> k, v;
};

// Slot decoding (continuous batching): per-layer K/V of `slots` independent sequences, [slots, capacity,
// Hkv, D] each, slot s filled up to lengths[s]. Slot s alone is the batch-1 cache of its sequence (a view).
class SlotKV final : public dew::SlotCache {
 public:
  int64_t slots() const override { return int64_t(lengths.size()); }
  int64_t capacity() const override { return capacity_; }
  int64_t length(int64_t slot) const override { return lengths.at(size_t(check(slot))); }
  void clear(int64_t slot) override { lengths.at(size_t(check(slot))) = 0; }
  // Positions [begin, length) of every layer's keys and values (one contiguous block per slot and layer).
  bool copy_prefix(int64_t from, int64_t to, int64_t length, int64_t begin) override {
    const int64_t held = lengths.at(size_t(check(from)));
    check(to);
    DEW_CHECK(length >= 0 && length <= held, "causal_transformer: slot ", from, " holds ", held,
              " tokens; cannot copy its first ", length);
    DEW_CHECK(begin >= 0 && begin <= length && begin <= lengths[size_t(to)],
              "causal_transformer: copying from position ", begin, " into slot ", to, ", which holds ",
              lengths[size_t(to)], " tokens");
    if (from != to && length > begin)
      for (size_t l = 0; l < k.size(); ++l)
        for (std::vector<Tensor>* kv : {&k, &v}) {
          const Tensor& t = (*kv)[l];
          const dew::Shape per = {t.shape()[1], t.shape()[2], t.shape()[3]};
          dew::reshape(t.slice0(to, to + 1), per)
              .slice0(begin, length)
              .copy_(dew::reshape(t.slice0(from, from + 1), per).slice0(begin, length));
        }
    lengths[size_t(to)] = length;
    return true;
  }
  int64_t check(int64_t slot) const {
    DEW_CHECK(slot >= 0 && slot < slots(), "causal_transformer: slot ", slot, " is outside [0, ", slots(), ")");
    return slot;
  }
  int64_t capacity_ = 0;
  std::vector<int64_t> lengths;
  std::vector<Tensor> k, v;
};

// The rows of one decode step over a SlotKV: row i is slot slots[i] at position positions[i].
struct SlotRows {
  SlotKV* cache = nullptr;
  std::vector<int64_t> slots, positions;
};

// One layer's attention: the SDK block with this model's options (window on local layers).
std::shared_ptr<dew::nn::Attention> make_attention(const Config& c, bool local) {
  dew::nn::AttentionConfig a;
  a.dim = c.dim;
  a.num_heads = c.heads;
  a.num_kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  // Gemma 3's local layers rotate on their own base, unscaled; every other layer on rope_theta and rope_scaling.
  const bool own_local_rope = local && c.rope_local_theta > 0;
  a.rope_theta = float(own_local_rope ? c.rope_local_theta : c.rope_theta);
  a.rope_scaling = own_local_rope ? dew::RopeScaling{} : c.rope_scaling;
  a.rotary_dim = c.rotary_dim;
  // Scores: q.k / sqrt(query_pre_attn_scalar or head_dim); YaRN scales cos and sin by its attention factor m
  // (transformers), i.e. q.k by m^2: folded into the scale.
  const double m = own_local_rope ? 1.0 : c.rope_attention_factor;
  const double base = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(c.head_dim);
  if (m != 1.0 || c.query_pre_attn_scalar > 0) a.scale = float(m * m / std::sqrt(base));
  a.qk_norm = c.qk_norm;
  a.norm_eps = float(c.norm_eps);
  a.norm_offset = c.norm_offset;
  a.causal = true;
  a.window = local ? c.window : 0;
  a.softcap = float(c.attn_softcap);
  a.bias = c.qkv_bias;
  a.o_bias = c.o_bias;
  a.init = projection_init(c);
  return std::make_shared<dew::nn::Attention>(a);
}

class DecoderLayer final : public dew::nn::Module {
 public:
  DecoderLayer(const Config& c, int64_t index) {
    self_attn = register_module("self_attn", make_attention(c, c.local[size_t(index)]));
    const Activation act = c.mlp == "swiglu" ? Activation::silu : Activation::gelu_tanh;
    if (c.moe_experts > 0)
      moe = register_module("mlp", std::make_shared<dew_ct::MoeMLP>(c.dim, c.moe_hidden, c.moe_experts, c.moe_top_k,
                                                                    c.moe_norm_topk, act, projection_init(c)));
    else
      mlp = register_module("mlp", std::make_shared<dew::nn::GatedMLP>(c.dim, c.hidden, act, c.mlp_bias,
                                                                       projection_init(c), c.mlp != "gelu"));
    input_layernorm =
        register_module("input_layernorm", std::make_shared<dew::nn::RMSNorm>(c.dim, float(c.norm_eps), c.norm_offset));
    post_attention_layernorm = register_module(
        "post_attention_layernorm", std::make_shared<dew::nn::RMSNorm>(c.dim, float(c.norm_eps), c.norm_offset));
    if (c.sandwich_norm) {
      pre_feedforward_layernorm = register_module(
          "pre_feedforward_layernorm", std::make_shared<dew::nn::RMSNorm>(c.dim, float(c.norm_eps), c.norm_offset));
      post_feedforward_layernorm = register_module(
          "post_feedforward_layernorm", std::make_shared<dew::nn::RMSNorm>(c.dim, float(c.norm_eps), c.norm_offset));
    }
  }
  // The MLP branch of x (after the attention's residual add): its norm, the MLP and, with sandwich norms, the
  // output norm. (Hugging Face's names: post_attention_layernorm is the pre-MLP norm of Llama / Qwen and the
  // attention output's norm of Gemma, whose pre-MLP norm is pre_feedforward_layernorm.)
  // A mixture of experts adds its routing to *stats (the load-balancing loss) when given.
  Tensor mlp_branch(const Tensor& x, dew_ct::MoeStats* stats = nullptr) const {
    auto run = [&](const Tensor& h) { return moe ? moe->forward(h, stats) : mlp->forward(h); };
    if (!pre_feedforward_layernorm) return run(post_attention_layernorm->forward(x));
    return post_feedforward_layernorm->forward(run(pre_feedforward_layernorm->forward(x)));
  }
  // The attention output a as it joins the residual stream: normed under sandwich norms.
  Tensor attention_out(const Tensor& a) const {
    return pre_feedforward_layernorm ? post_attention_layernorm->forward(a) : a;
  }
  std::shared_ptr<dew::nn::Attention> self_attn;
  std::shared_ptr<dew::nn::GatedMLP> mlp;  // null with moe_experts
  std::shared_ptr<dew_ct::MoeMLP> moe;     // moe_experts > 0
  std::shared_ptr<dew::nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<dew::nn::RMSNorm> pre_feedforward_layernorm, post_feedforward_layernorm;  // sandwich_norm
};

// A container whose children are named "0", "1", ...
class LayerList final : public dew::nn::Module {
 public:
  std::shared_ptr<DecoderLayer> add(std::shared_ptr<DecoderLayer> l) {
    items.push_back(register_module(std::to_string(items.size()), std::move(l)));
    return items.back();
  }
  std::vector<std::shared_ptr<DecoderLayer>> items;
};

class Decoder final : public dew::nn::Module {
 public:
  explicit Decoder(const Config& c) {
    embed_tokens = register_module(
        "embed_tokens", std::make_shared<dew::nn::Embedding>(c.vocab, c.dim, Init::Normal(float(c.init_std))));
    layers = register_module("layers", std::make_shared<LayerList>());
    for (int64_t i = 0; i < c.layers; ++i) layers->add(std::make_shared<DecoderLayer>(c, i));
    norm = register_module("norm", std::make_shared<dew::nn::RMSNorm>(c.dim, float(c.norm_eps), c.norm_offset));
  }
  std::shared_ptr<dew::nn::Embedding> embed_tokens;
  std::shared_ptr<LayerList> layers;
  std::shared_ptr<dew::nn::RMSNorm> norm;
};

class CausalTransformer final : public dew::Model, public dew::CausalDecoder, public dew::LinearHeadModel {
 public:
  explicit CausalTransformer(const Options& o) : c_(read_config(o)) {
    model_ = register_module("model", std::make_shared<Decoder>(c_));
    if (!c_.tie)
      lm_head_ = register_module(
          "lm_head", std::make_shared<dew::nn::Linear>(c_.dim, c_.vocab, false, Init::Normal(float(c_.init_std))));
  }

  Tensor forward(const dew::Batch& inputs) override {
    const dew::HiddenAndHead o = forward_hidden(inputs);
    return head(o.hidden);
  }

  // ---- LinearHeadModel: the final norm's output and the head, for a loss that fuses the head ----
  dew::HiddenAndHead forward_hidden(const dew::Batch& inputs) override {
    auto it = inputs.find("tokens");
    DEW_CHECK(it != inputs.end(), "causal_transformer: forward needs a 'tokens' input (i32 [B, T])");
    const Tensor& tokens = it->second;
    check_tokens(tokens);
    // Packed rows: per-document positions and the documents' segment ids, both i32 [B, T].
    Packing packed;
    for (auto [name, field] : {std::pair{"positions", &packed.positions}, std::pair{"segment_ids", &packed.segments}}) {
      auto f = inputs.find(name);
      if (f == inputs.end()) continue;
      DEW_CHECK(f->second.shape() == tokens.shape() && f->second.dtype() == dew::DType::i32, "causal_transformer: '",
                name, "' must be i32 ", dew::shape_str(tokens.shape()), " like the tokens, got ",
                dew::dtype_name(f->second.dtype()), " ", dew::shape_str(f->second.shape()));
      *field = f->second;
    }
    uint64_t seed = 0, step = 0;
    if (c_.dropout > 0 && training()) {
      seed = random_key().seed;
      step = random_key().step;
    }
    return {hidden(tokens, nullptr, seed, step, nullptr, &packed), head_weight(), float(c_.final_softcap)};
  }

  // ---- CausalDecoder ----
  int64_t vocab_size() const override { return c_.vocab; }

  // f32 (the default) or bf16: the keys and values of the caches made from now on (nn::Attention rounds them
  // when it appends them; attention reads a bf16 cache with f32 arithmetic).
  void set_cache_dtype(dew::DType dtype) override {
    DEW_USAGE_CHECK(dtype == dew::DType::f32 || dtype == dew::DType::bf16,
                    "causal_transformer: the K/V cache is f32 or bf16, not ", dew::dtype_name(dtype));
    cache_dtype_ = dtype;
  }
  dew::DType cache_dtype() const override { return cache_dtype_; }

  std::unique_ptr<dew::DecodeCache> make_cache(int64_t batch, int64_t capacity) const override {
    DEW_CHECK(batch > 0 && capacity > 0, "causal_transformer: a cache needs a positive batch and capacity");
    auto cache = std::make_unique<KVCache>();
    cache->batch_ = batch;
    cache->capacity_ = capacity;
    const auto& be = model_->embed_tokens->weight.backend_ptr();
    const dew::DType dt = cache_dtype_;
    for (int64_t i = 0; i < c_.layers; ++i) {
      cache->k.push_back(Tensor::zeros({batch, capacity, c_.kv_heads, c_.head_dim}, dt, be));
      cache->v.push_back(Tensor::zeros({batch, capacity, c_.kv_heads, c_.head_dim}, dt, be));
    }
    return cache;
  }

  Tensor forward_cached(const Tensor& tokens, dew::DecodeCache& cache) override { return cached(tokens, cache, false); }
  Tensor forward_cached_last(const Tensor& tokens, dew::DecodeCache& cache) override {
    return cached(tokens, cache, true);
  }
  // `last_only`: the logits of the last position alone ([B, 1, V]: the other positions skip the head).
  Tensor cached(const Tensor& tokens, dew::DecodeCache& cache, bool last_only) {
    auto* kv = dynamic_cast<KVCache*>(&cache);
    DEW_CHECK(kv != nullptr, "causal_transformer: forward_cached needs a cache made by this model's make_cache()");
    check_tokens(tokens);
    DEW_CHECK(tokens.shape()[0] == kv->batch_, "causal_transformer: ", tokens.shape()[0],
              " sequences fed to a cache of batch ", kv->batch_);
    DEW_CHECK(kv->length_ + tokens.shape()[1] <= kv->capacity_, "causal_transformer: the cache holds ", kv->capacity_,
              " tokens; ", kv->length_, " are in it and ", tokens.shape()[1], " more were fed");
    Tensor logits = run(tokens, kv, 0, 0, nullptr, nullptr, last_only);
    kv->length_ += tokens.shape()[1];
    return logits;
  }

  std::unique_ptr<dew::SlotCache> make_slot_cache(int64_t slots, int64_t capacity) const override {
    DEW_CHECK(slots > 0 && capacity > 0, "causal_transformer: a slot cache needs positive slots and capacity");
    auto cache = std::make_unique<SlotKV>();
    cache->capacity_ = capacity;
    cache->lengths.assign(size_t(slots), 0);
    const auto& be = model_->embed_tokens->weight.backend_ptr();
    const dew::DType dt = cache_dtype_;
    for (int64_t i = 0; i < c_.layers; ++i) {
      cache->k.push_back(Tensor::zeros({slots, capacity, c_.kv_heads, c_.head_dim}, dt, be));
      cache->v.push_back(Tensor::zeros({slots, capacity, c_.kv_heads, c_.head_dim}, dt, be));
    }
    return cache;
  }

  // T == 1: one batched step over the rows (per-row positions and attention). T > 1 (prefill): each row
  // through the batch-1 path on its slot's view of the cache.
  Tensor forward_slots(const Tensor& tokens, const std::vector<int64_t>& slots, dew::SlotCache& cache) override {
    return slot_step(tokens, slots, cache, false);
  }
  Tensor forward_slots_last(const Tensor& tokens, const std::vector<int64_t>& slots, dew::SlotCache& cache) override {
    return slot_step(tokens, slots, cache, true);
  }
  Tensor slot_step(const Tensor& tokens, const std::vector<int64_t>& slots, dew::SlotCache& cache, bool last_only) {
    auto* kv = dynamic_cast<SlotKV*>(&cache);
    DEW_CHECK(kv != nullptr, "causal_transformer: forward_slots needs a cache made by this model's make_slot_cache()");
    check_tokens(tokens);
    const int64_t n = tokens.shape()[0], t = tokens.shape()[1];
    DEW_CHECK(int64_t(slots.size()) == n, "causal_transformer: ", n, " token rows for ", slots.size(), " slots");
    SlotRows rows{kv, slots, {}};
    for (size_t i = 0; i < slots.size(); ++i) {
      kv->check(slots[i]);
      for (size_t j = 0; j < i; ++j)
        DEW_CHECK(slots[j] != slots[i], "causal_transformer: slot ", slots[i], " fed twice in one step");
      const int64_t len = kv->lengths[size_t(slots[i])];
      DEW_CHECK(len + t <= kv->capacity_, "causal_transformer: slot ", slots[i], " holds ", kv->capacity_, " tokens; ",
                len, " are in it and ", t, " more were fed");
      rows.positions.push_back(len);
    }
    Tensor logits;
    if (t == 1) {
      logits = run(tokens, nullptr, 0, 0, &rows);
    } else {
      std::vector<Tensor> out;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = slots[size_t(i)];
        KVCache one;  // the slot's batch-1 view of the resident cache
        one.batch_ = 1;
        one.capacity_ = kv->capacity_;
        one.length_ = kv->lengths[size_t(s)];
        for (int64_t l = 0; l < c_.layers; ++l) {
          one.k.push_back(kv->k[size_t(l)].slice0(s, s + 1));
          one.v.push_back(kv->v[size_t(l)].slice0(s, s + 1));
        }
        out.push_back(run(tokens.slice0(i, i + 1), &one, 0, 0, nullptr, nullptr, last_only));
      }
      logits = n == 1 ? out[0] : dew::concat(out, 0);
    }
    for (int64_t s : slots) kv->lengths[size_t(s)] += t;
    return logits;
  }

  double flops_per_sequence(int64_t t) const override {
    double weights = 0;
    for (const auto& [name, p] : named_parameters())  // a mixture's experts: top_k of them run per token
      if (p.ndim() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight")
        weights +=
            double(p.numel()) *
            (name.find(".mlp.experts.") != std::string::npos ? double(c_.moe_top_k) / double(c_.moe_experts) : 1.0);
    weights += double(c_.vocab * c_.dim);  // the head
    double attn = 0;
    for (int64_t i = 0; i < c_.layers; ++i) {
      const double keys = c_.local[size_t(i)] ? double(std::min(t, c_.window)) : double(t);
      attn += 4.0 * double(t) * keys * double(c_.heads * c_.head_dim);
    }
    return 2.0 * double(t) * weights + attn;
  }

  int64_t context_length() const override { return c_.max_seq_len; }

  // ---- Model ----
  double flops_per_sample() const override { return flops_per_sequence(c_.max_seq_len); }

  std::map<std::string, std::string> describe() const override {
    auto num = [](double v) {  // the shortest text that reads back as the same double
      std::ostringstream s;
      for (int digits = 6; digits <= 17; ++digits) {
        s.str("");
        s.precision(digits);
        s << v;
        if (std::stod(s.str()) == v) break;
      }
      return s.str();
    };
    std::string types;
    for (bool l : c_.local)
      types += std::string(types.empty() ? "" : ",") + (l ? "sliding_attention" : "full_attention");
    std::map<std::string, std::string> d{
        {"model_type", c_.qk_norm ? "qwen3" : "llama"},
        {"vocab_size", std::to_string(c_.vocab)},
        {"hidden_size", std::to_string(c_.dim)},
        {"num_hidden_layers", std::to_string(c_.layers)},
        {"num_attention_heads", std::to_string(c_.heads)},
        {"num_key_value_heads", std::to_string(c_.kv_heads)},
        {"head_dim", std::to_string(c_.head_dim)},
        {"intermediate_size", std::to_string(c_.hidden)},
        {"hidden_act", c_.mlp == "swiglu" ? "silu" : "gelu_pytorch_tanh"},
        {"mlp", c_.mlp},
        {"rms_norm_eps", num(c_.norm_eps)},
        {"rope_theta", num(c_.rope_theta)},
        {"rope_type", dew::rope_scaling_name(c_.rope_scaling.kind)},
        {"rope_factor", num(c_.rope_scaling.factor)},
        {"rope_low_freq_factor", num(c_.rope_scaling.low_freq_factor)},
        {"rope_high_freq_factor", num(c_.rope_scaling.high_freq_factor)},
        {"rope_original_max_position", num(c_.rope_scaling.original_max_position)},
        {"rope_beta_fast", num(c_.rope_scaling.beta_fast)},
        {"rope_beta_slow", num(c_.rope_scaling.beta_slow)},
        {"rope_truncate", c_.rope_scaling.truncate ? "true" : "false"},
        {"rope_attention_factor", num(c_.rope_attention_factor)},
        {"partial_rotary_factor", num(c_.partial_rotary)},
        {"tie_word_embeddings", c_.tie ? "true" : "false"},
        {"max_position_embeddings", std::to_string(c_.max_seq_len)},
        {"attention_bias", c_.qkv_bias || c_.o_bias ? "true" : "false"},
        {"qkv_bias", c_.qkv_bias ? "true" : "false"},
        {"o_bias", c_.o_bias ? "true" : "false"},
        {"mlp_bias", c_.mlp_bias ? "true" : "false"},
        {"qk_norm", c_.qk_norm ? "true" : "false"},
        {"norm_offset", num(c_.norm_offset)},
        {"embed_scale", c_.embed_scale ? "true" : "false"},
        {"sandwich_norm", c_.sandwich_norm ? "true" : "false"},
        {"moe_experts", std::to_string(c_.moe_experts)},
        {"moe_top_k", std::to_string(c_.moe_top_k)},
        {"moe_hidden", std::to_string(c_.moe_hidden)},
        {"moe_norm_topk", c_.moe_norm_topk ? "true" : "false"},
        {"moe_aux_loss", num(c_.moe_aux_loss)},
        {"rope_local_theta", num(c_.rope_local_theta)},
        {"query_pre_attn_scalar", num(c_.query_pre_attn_scalar)},
        {"torch_dtype", "float32"},
        {"num_parameters", std::to_string(num_parameters())},
    };
    // Only what is in use (Hugging Face reads a present sliding_window / softcap as enabled).
    bool any_local = false;
    for (bool l : c_.local) any_local = any_local || l;
    if (any_local) {
      d["sliding_window"] = std::to_string(c_.window);
      d["layer_types"] = types;
    }
    if (c_.attn_softcap > 0) d["attn_logit_softcapping"] = num(c_.attn_softcap);
    if (c_.final_softcap > 0) d["final_logit_softcapping"] = num(c_.final_softcap);
    return d;
  }

 private:
  void check_tokens(const Tensor& tokens) const {
    DEW_CHECK(tokens.ndim() == 2 && tokens.dtype() == dew::DType::i32,
              "causal_transformer: 'tokens' must be i32 [B, T], got ", dew::dtype_name(tokens.dtype()), " ",
              dew::shape_str(tokens.shape()));
    DEW_CHECK(tokens.shape()[1] > 0, "causal_transformer: 'tokens' is empty");
  }

  Tensor drop(const Tensor& x, int64_t layer, const char* site, uint64_t seed, uint64_t step) const {
    if (c_.dropout <= 0 || !training()) return x;
    const std::string name = "dropout." + std::to_string(layer) + "." + site;
    const uint64_t stream = dew::philox::stream_of(name.c_str()) + step * 0x9E3779B97F4A7C15ull;
    return dew::dropout(x, float(c_.dropout), seed, stream, 0);
  }

  // Packed training rows (forward's optional inputs): positions restart per document, attention stays in it.
  struct Packing {
    Tensor positions, segments;
  };

  // One pre-norm layer without a cache: a pure function of x and (positions, segments, seed, step), so it
  // can be recomputed in the backward with the same dropout masks.
  Tensor layer_forward(const DecoderLayer& l, int64_t i, const Tensor& x0, const Tensor& positions,
                       const Tensor& segments, uint64_t seed, uint64_t step, dew_ct::MoeStats* stats) const {
    const Tensor a = l.attention_out(l.self_attn->forward(l.input_layernorm->forward(x0), positions, segments));
    const Tensor x = dew::add(x0, drop(a, i, "attn", seed, step));
    return dew::add(x, drop(l.mlp_branch(x, stats), i, "mlp", seed, step));
  }

  // `rows` (slot decoding, T == 1): row i is a slot at its own position (positions [N, 1]). `last_only`: the
  // final norm and the head see the last position alone (logits [B, 1, V]).
  Tensor run(const Tensor& tokens, KVCache* cache, uint64_t seed, uint64_t step, const SlotRows* rows = nullptr,
             const Packing* packed = nullptr, bool last_only = false) const {
    return head(hidden(tokens, cache, seed, step, rows, packed, last_only));
  }
  const Tensor& head_weight() const { return c_.tie ? model_->embed_tokens->weight : lm_head_->weight; }
  // logits f32 = softcap(x @ head^T), the last step of run()
  Tensor head(const Tensor& x) const {
    Tensor logits = dew::linear(x, head_weight());
    if (logits.dtype() != dew::DType::f32) logits = dew::cast(logits, dew::DType::f32);
    if (c_.final_softcap > 0) logits = dew::softcap(logits, float(c_.final_softcap));
    return logits;
  }
  // The final norm's output [B, T, D] (run() without the head).
  Tensor hidden(const Tensor& tokens, KVCache* cache, uint64_t seed, uint64_t step, const SlotRows* rows = nullptr,
                const Packing* packed = nullptr, bool last_only = false) const {
    const int64_t t = tokens.shape()[1];
    const int64_t past = cache ? cache->length_ : 0;
    std::vector<int32_t> pos(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) pos[size_t(i)] = int32_t(past + i);
    if (rows) pos.assign(rows->positions.begin(), rows->positions.end());
    const Tensor positions = packed && packed->positions.defined() ? packed->positions
                             : rows ? Tensor::from_ints(pos, {int64_t(pos.size()), 1}, tokens.backend_ptr())
                                    : Tensor::from_ints(pos, {t}, tokens.backend_ptr());
    const Tensor segments = packed ? packed->segments : Tensor();
    // A training forward of a mixture of experts gathers its routing for the load-balancing loss.
    moe_stats_.reset();
    aux_loss_ = Tensor();
    const bool balance = c_.moe_experts > 0 && c_.moe_aux_loss > 0 && training();
    DEW_USAGE_CHECK(!balance || !dew::grad_enabled() || dew::recompute_mode() == dew::Recompute::none,
                    "causal_transformer: [trainer] recompute = blocks with model.moe_experts and moe_aux_loss > 0 is "
                    "not supported (the recomputed blocks would lose the load-balancing loss's gradient): set "
                    "model.moe_aux_loss = 0 or recompute = none");
    dew_ct::MoeStats* stats = balance ? &moe_stats_ : nullptr;
    Tensor x = model_->embed_tokens->forward(tokens);
    if (c_.embed_scale) x = dew::scale(x, std::sqrt(float(c_.dim)));
    x = drop(x, -1, "embed", seed, step);
    for (int64_t i = 0; i < c_.layers; ++i) {
      const DecoderLayer& l = *model_->layers->items[size_t(i)];
      if (!cache && !rows) {  // training / full forward: each layer may be recomputed ([trainer] recompute)
        const DecoderLayer* lp = &l;
        x = dew::recompute_block(
            [this, lp, i, positions, segments, seed, step, stats](const std::vector<Tensor>& in) {
              return layer_forward(*lp, i, in[0], positions, segments, seed, step, stats);
            },
            {x}, l.parameters());
        continue;
      }
      Tensor* kc = cache ? &cache->k[size_t(i)] : nullptr;
      Tensor* vc = cache ? &cache->v[size_t(i)] : nullptr;
      const Tensor h = l.input_layernorm->forward(x);
      Tensor a = rows ? l.self_attn->forward_slots(h, positions, rows->cache->k[size_t(i)], rows->cache->v[size_t(i)],
                                                   rows->slots, rows->positions)
                 : l.self_attn->forward_cached(h, positions, *kc, *vc, past);
      x = dew::add(x, drop(l.attention_out(a), i, "attn", seed, step));
      x = dew::add(x, drop(l.mlp_branch(x), i, "mlp", seed, step));
    }
    if (stats) {
      const Tensor loss = moe_stats_.balancing_loss();
      if (loss.defined()) aux_loss_ = dew::scale(loss, float(c_.moe_aux_loss));
    }
    if (last_only && t > 1) x = dew::slice(x, 1, t - 1, t);
    return model_->norm->forward(x);
  }

  // ---- Model: the load-balancing loss of the last training forward (weighted by moe_aux_loss) ----
  Tensor auxiliary_loss() const override { return aux_loss_; }

  Config c_;
  mutable dew_ct::MoeStats moe_stats_;  // the routing of the last training forward
  mutable Tensor aux_loss_;
  dew::DType cache_dtype_ = dew::DType::f32;  // set_cache_dtype
  std::shared_ptr<Decoder> model_;
  std::shared_ptr<dew::nn::Linear> lm_head_;
};

}  // namespace

// hf_converter.cpp: Hugging Face config.json <-> [model] for llama, mistral, qwen2, qwen3 (dew/interop.hpp).
void register_hf_converter(dew::Registrar& registrar);

DEW_PLUGIN("causal_transformer", "0.1.0") {
  register_hf_converter(registrar);
  registrar.add<dew::Model>({
      .name = "causal_transformer",
      .description = "Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU; qk-norm, sliding window, softcaps; "
                     "Hugging Face names) with a KV-cached decode path",
      .factory = [](const dew::Options& o) { return std::make_shared<CausalTransformer>(o); },
      .options = {{"vocab_size", "", "vocabulary size (set by the lm objective from the tokenizer)"},
                  {"dim", "512", "model width"},
                  {"n_layers", "8", "decoder layers"},
                  {"n_heads", "8", "query heads"},
                  {"n_kv_heads", "", "key/value heads (default n_heads; fewer = grouped-query attention)"},
                  {"head_dim", "", "per-head width (default dim / n_heads)"},
                  {"mlp", "swiglu", "swiglu | geglu | gelu"},
                  {"mlp_hidden", "", "MLP width (gated: 8 dim / 3 rounded up to 64; gelu: 4 dim)"},
                  {"norm_eps", "1e-5", "RMSNorm epsilon"},
                  {"norm_offset", "0", "1: norms scale by (1 + w) with w initialised to 0 (Gemma)"},
                  {"rope_theta", "10000", "rotary base"},
                  {"rope_scaling", "none", "none | linear | llama3 | yarn: rotary frequencies for a longer context"},
                  {"rope_factor", "", "context extension factor (every rope_scaling)"},
                  {"rope_original_max_position", "", "pretraining context length (llama3, yarn)"},
                  {"rope_low_freq_factor", "1", "llama3: wavelengths above original / this are interpolated"},
                  {"rope_high_freq_factor", "4", "llama3: wavelengths below original / this are kept"},
                  {"rope_beta_fast", "32", "yarn: rotations where the ramp starts (kept above)"},
                  {"rope_beta_slow", "1", "yarn: rotations where the ramp ends (interpolated below)"},
                  {"rope_truncate", "true", "yarn: round the ramp's ends to whole feature pairs"},
                  {"rope_attention_factor", "", "yarn: q and k scale (0.1 ln(factor) + 1)"},
                  {"partial_rotary", "1", "fraction of head_dim that rotates (0: no positions)"},
                  {"qk_norm", "false", "RMSNorm on queries and keys per head (Qwen3)"},
                  {"qkv_bias", "false", "biases on the q/k/v projections (Qwen2)"},
                  {"o_bias", "false", "bias on the output projection (Llama/Qwen3 attention_bias with qkv_bias)"},
                  {"mlp_bias", "false", "biases on the MLP projections (Llama mlp_bias)"},
                  {"sliding_window", "0", "window of local layers (keys attended, including its own)"},
                  {"layer_pattern", "global", "layer kinds cycled over the layers, e.g. local,local,global"},
                  {"attn_softcap", "0", "attention logit softcap (Gemma 2)"},
                  {"final_softcap", "0", "output logit softcap"},
                  {"tie_embeddings", "true", "output projection = the token embedding"},
                  {"embed_scale", "false", "multiply embeddings by sqrt(dim) (Gemma)"},
                  {"moe_experts", "0", "> 0: every layer's MLP a mixture of this many experts (Qwen3-MoE names)"},
                  {"moe_top_k", "2", "experts each token is routed to"},
                  {"moe_hidden", "", "each expert's MLP width (default mlp_hidden)"},
                  {"moe_norm_topk", "true", "renormalise the chosen experts' router probabilities over the k"},
                  {"moe_aux_loss", "0.001", "weight of the load-balancing loss added in training"},
                  {"sandwich_norm", "false",
                   "norm the attention and MLP outputs before their residual adds (Gemma 2/3)"},
                  {"query_pre_attn_scalar", "0", "> 0: scores scaled by its -1/2 power, not head_dim's (Gemma)"},
                  {"rope_local_theta", "0", "> 0: local layers' rotary base, without rope_scaling (Gemma 3)"},
                  {"dropout", "0", "dropout on embeddings and residual branches"},
                  {"init_std", "0.02", "std of the normal init (output projections / sqrt(2 n_layers))"},
                  {"max_seq_len", "2048", "context length (FLOP count, max_position_embeddings)"}},
  });
}
