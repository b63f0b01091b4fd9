// dew/nn.hpp — reusable model blocks with Hugging Face-style parameter names.
//
// A Module owns named parameters and child modules; named_parameters() walks them depth-first in
// registration order with dotted names ("layers.3.self_attn.q_proj.weight"), the flat, ordered tree
// checkpoints and exports use unchanged. A module takes its backend at construction (the default
// backend then), so a constructor may make buffers before its first parameter. Parameters are created
// on construction and initialised from their Init rule; initialize(seed) re-initialises every
// parameter with Philox stream = hash of its full name, so the values do not depend on creation order,
// thread count or backend.
//
// These are the blocks the bundled backbones are built from (causal_transformer, vit_encoder,
// jepa_predictor, dit, unet): a third-party backbone gets the same attention, MLPs, adaLN, time
// embedding and their parameter names by composing them.
#pragma once
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/ops.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew::nn {

struct Init {
  // automatic: the block's own default (PyTorch's U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for Linear/Conv2d).
  enum Kind { automatic, zeros, ones, constant, normal, uniform } kind = automatic;
  float a = 0.0f, b = 0.0f;  // constant: a; normal: mean a, std b; uniform: [a, b)
  static Init Zeros() { return {zeros, 0, 0}; }
  static Init Ones() { return {ones, 1, 0}; }
  static Init Constant(float v) { return {constant, v, 0}; }
  static Init Normal(float std, float mean = 0.0f) { return {normal, mean, std}; }
  static Init Uniform(float bound) { return {uniform, -bound, bound}; }
  // Glorot & Bengio's U(-sqrt(6 / (fan_in + fan_out)), +...) (PyTorch's xavier_uniform_).
  static Init XavierUniform(int64_t fan_in, int64_t fan_out) {
    return Uniform(std::sqrt(6.0f / float(fan_in + fan_out)));
  }
};

// The initialisation rules of a block's projections: the input ones (q/k/v or the fused qkv; fc1;
// gate_proj and up_proj) and the output one (o_proj or proj; fc2; down_proj), weights and biases apart.
// automatic: Linear's default U(-1/sqrt(in), 1/sqrt(in)).
struct ProjectionInit {
  Init weight, bias, out_weight, out_bias;
};

class Module {
 public:
  Module();  // takes default_backend() when one is set
  virtual ~Module() = default;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  void initialize(uint64_t seed);
  void set_training(bool on);
  bool training() const { return training_; }
  void zero_grad();
  // Calls fn(path, module) for this module ("" = prefix) and every descendant, depth-first in registration
  // order; path is the dotted prefix of the module's parameter names ("model.layers.0.self_attn.q_proj").
  void for_each_module(const std::function<void(const std::string& path, Module& m)>& fn,
                       const std::string& prefix = "");
  // Where this module's parameters and buffers live: the default backend at construction (a module made
  // before any default was set takes the default at its first parameter). Refuses, with a hint, when
  // there is none.
  const BackendPtr& backend() const;

 protected:
  Tensor register_parameter(const std::string& name, const Shape& shape, Init init);
  void remove_parameter(const std::string& name);  // the tensor lives on where it is still held
  // An empty name puts the child's parameters in this module's namespace (composition without a name
  // level: a block that is a norm plus an attention keeps "norm.weight", "qkv.weight", "proj.weight").
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }
  BackendPtr backend_;  // set at construction (default_backend() when one is set); see backend()
  DType dtype_ = DType::f32;

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    Init init;
  };
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_params(const std::string& prefix, std::vector<std::pair<std::string, const Param*>>& out) const;
  std::vector<Param> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Fills t from the rule with philox(seed, stream).
void init_tensor(Tensor& t, const Init& init, uint64_t seed, uint64_t stream);

// A module that only names its children: "mlp.0", "final_layer.linear" (PyTorch Sequential / ModuleDict
// checkpoint names).
class ModuleDict : public Module {
 public:
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

// The key of a training forward's randomness (dropout masks) as host integers: Model::random_key() (dew/model.hpp),
// which the trainer sets before every micro-batch's step.
struct RandomKey {
  uint64_t seed = 0;  // the run seed (31 bits)
  uint64_t step = 0;  // the micro-batch's position in the run (31 bits: update * 1024 + micro)
};

// y = x W^T + b; weight [out, in], bias [out]. Default init as PyTorch: U(-1/sqrt(in), 1/sqrt(in)).
// With a LoRA adapter (Hu et al. 2021; dew/lora.hpp attaches them by config): y = x W^T + b + s (x A^T) B^T,
// A = lora_A.weight [r, in] (Linear's default init, PEFT's too), B = lora_B.weight [out, r] (zeros, so the
// adapted layer starts as the plain one), s = alpha / r (or alpha / sqrt(r), rsLoRA). merge_lora() folds
// s B A into W and removes the adapter (PEFT's merge_and_unload): inference and export see a plain Linear.
// LoRA dropout (PEFT's lora_dropout p): while training, the adapter reads dropout(x) (the base product reads x),
// masks keyed by the owning model's RandomKey and the Linear's path, so a recomputed block and a resumed run draw
// the same masks.
// A block that reads `weight` itself (fused or packed products) must take Linear::forward instead while
// adapter_active(); tests/models/test_lora.cpp holds every bundled backbone to its merged forward.
// While a LoraAdaptersOff is alive in the thread, forwards skip the adapters (PEFT's disable_adapter()): the model
// runs as its base, on the base's own paths (a DPO reference pass without a second copy of the model).
bool lora_adapters_enabled();
class LoraAdaptersOff {
 public:
  LoraAdaptersOff();
  ~LoraAdaptersOff();
  LoraAdaptersOff(const LoraAdaptersOff&) = delete;
  LoraAdaptersOff& operator=(const LoraAdaptersOff&) = delete;

 private:
  bool previous_;
};

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, Init weight_init = {}, Init bias_init = {});
  Tensor forward(const Tensor& x, Activation act = Activation::none) const;
  // A's values come from philox(seed, the stream of `full_name` + ".lora_A.weight"), like initialize().
  void add_lora(int64_t rank, float scale, uint64_t seed, const std::string& full_name);
  // Dropout on the adapter's input with probability p in [0, 1), masks keyed by *key (which outlives this Linear:
  // its model's random_key()) and philox's stream of `full_name` + ".lora_dropout".
  void set_lora_dropout(float p, const RandomKey* key, const std::string& full_name);
  void merge_lora();
  bool has_lora() const { return lora_a.defined(); }
  bool adapter_active() const { return has_lora() && lora_adapters_enabled(); }  // attached and applied
  Tensor weight, bias;
  Tensor lora_a, lora_b;  // defined while an adapter is attached
  float lora_scale = 0.0f;
  float lora_dropout = 0.0f;
  const RandomKey* lora_key = nullptr;  // set_lora_dropout
  uint64_t lora_stream = 0;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Init init = Init::Normal(1.0f));
  Tensor forward(const Tensor& ids) const;  // i32 [...] -> [..., dim]
  Tensor weight;
};

// RMSNorm; weight_offset = 1 gives the (1 + w) scale (Gemma), with w initialised to 0.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, float eps = 1e-6f, float weight_offset = 0.0f);
  Tensor forward(const Tensor& x) const;
  Tensor weight;
  float eps, weight_offset;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f, bool affine = true, bool bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  float eps;
};

class GroupNorm : public Module {
 public:
  GroupNorm(int64_t groups, int64_t channels, float eps = 1e-5f);
  Tensor forward(const Tensor& x) const;  // NCHW
  Tensor weight, bias;
  int64_t groups;
  float eps;
};

// Default init as PyTorch: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * k * k.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, int64_t groups = 1,
         bool bias = true, Init weight_init = {}, Init bias_init = {});
  Tensor forward(const Tensor& x) const;  // NCHW
  Tensor weight, bias;
  Conv2dParams params;
};

// The parameter layout of an attention block.
enum class AttentionLayout {
  separate,  // q_proj, k_proj, v_proj, o_proj (Hugging Face Llama / Qwen / ViT-MAE names)
  fused,     // qkv [(H + 2 Hkv) Dh, dim] (q, k, v row blocks in that order) and proj (timm / DiT names)
};

struct AttentionConfig {
  int64_t dim = 0, num_heads = 1, num_kv_heads = 0, head_dim = 0;  // 0: num_heads / dim / num_heads
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // Hugging Face's rope_type (linear, llama3, yarn; YaRN's attention factor goes in scale)
  int64_t rotary_dim = 0;    // 0: the whole head; -1: no rotary positions
  bool qk_norm = false;    // RMSNorm over head_dim on q and k (Qwen3 / OLMo-2 style), before rotary positions
  float norm_eps = 1e-6f, norm_offset = 0.0f;  // of q_norm / k_norm (offset 1: the (1 + w) scale, Gemma)
  bool causal = true;
  int64_t window = 0;    // sliding window (0 = global)
  float softcap = 0.0f;  // attention logit softcap (Gemma 2)
  bool bias = false;     // q/k/v projection biases (Qwen2)
  bool o_bias = false;   // output projection bias (ViT, DiT; Llama's attention_bias with bias)
  float scale = 0.0f;    // 0: 1/sqrt(head_dim)
  ProjectionInit init;   // weight = q/k/v (or qkv), out_weight = the output projection
  AttentionLayout layout = AttentionLayout::separate;
};

// Multi-head self-attention with grouped-query heads, rotary positions, optional q/k norm, sliding
// window and softcap, through the fused attention op. Names (separate layout): q_proj, k_proj, v_proj,
// o_proj, q_norm, k_norm; fused layout: qkv, proj, q_norm, k_norm. The fused layout without q/k norm,
// rotary positions or grouped heads runs the projection inside qkv_attention (dew/ops.hpp).
// Decoding: forward_cached() writes the new keys and values into a cache and attends over its prefix
// (q_offset = the tokens already there); forward_slots() does one step of independent sequences, each
// in its own slot of a slot cache, exactly as that sequence's batch-1 forward_cached() would.
class Attention : public Module {
 public:
  explicit Attention(const AttentionConfig& cfg);
  // x [B, T, dim]; positions i32 [T] or [B, T] (unused, and may be undefined, without rotary
  // positions); segment_ids i32 [B, T] or undefined: packed documents, attention stays inside each
  // (dew/backend.hpp AttentionParams). Returns [B, T, dim].
  Tensor forward(const Tensor& x, const Tensor& positions, const Tensor& segment_ids = Tensor()) const;
  // k_cache, v_cache [B, S, Hkv, Dh]: the keys and values of x's T tokens are written at sequence
  // positions past .. past + T - 1 and the queries attend over the first past + T keys (causally, from
  // q_offset = past). positions are the tokens' own (past + i). A cache may be in another dtype than the
  // keys (a bf16 cache under f32 activations): they are cast to it (rounded once) as they are written, and
  // the queries attend over the cache as stored.
  Tensor forward_cached(const Tensor& x, const Tensor& positions, Tensor& k_cache, Tensor& v_cache, int64_t past) const;
  // One decode step of N slots: x [N, 1, dim], positions i32 [N, 1] (each row's own); k_slots, v_slots
  // [slots, S, Hkv, Dh]. Row i's key and value go into slot slots[i] at pasts[i], and its query attends
  // over that slot alone (one attention call per row).
  Tensor forward_slots(const Tensor& x, const Tensor& positions, Tensor& k_slots, Tensor& v_slots,
                       const std::vector<int64_t>& slots, const std::vector<int64_t>& pasts) const;
  // q [B, T, H, Dh], k and v [B, T, Hkv, Dh] of x [B, T, dim]: projections, q/k norm, rotary positions.
  std::tuple<Tensor, Tensor, Tensor> project(const Tensor& x, const Tensor& positions) const;
  AttentionParams params() const;  // scale, causal, window, softcap (q_offset 0)
  AttentionConfig cfg;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj;  // separate layout
  std::shared_ptr<Linear> qkv;                     // fused layout
  std::shared_ptr<Linear> o_proj;                  // the output projection ("o_proj", or "proj" when fused)
  std::shared_ptr<RMSNorm> q_norm, k_norm;
};

// Gated MLP (SwiGLU with silu, GeGLU with gelu): down(act(gate(x)) * up(x)), act and product one fused
// kernel (gated_activation). gated = false drops the gate: down(act(up(x))), the Llama-family names of a
// plain MLP. Names: gate_proj, up_proj, down_proj.
// init: weight / bias for gate_proj and up_proj, out_weight / out_bias for down_proj.
class GatedMLP : public Module {
 public:
  GatedMLP(int64_t dim, int64_t hidden, Activation act = Activation::silu, bool bias = false, ProjectionInit init = {},
           bool gated = true);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;  // gate_proj is null when not gated
  Activation act;
};

// Plain MLP: fc2(act(fc1(x))). Names: fc1, fc2. init: weight / bias for fc1, out_weight / out_bias for fc2.
class MLP : public Module {
 public:
  MLP(int64_t dim, int64_t hidden, int64_t out = 0, Activation act = Activation::gelu_tanh, bool bias = true,
      ProjectionInit init = {});
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> fc1, fc2;
  Activation act;
};

// adaLN-Zero modulation (DiT): silu(c) -> Linear(cond, chunks * dim), zero-initialised, split in chunks.
// Name: 1 (DiT's nn.Sequential(SiLU(), Linear) index: adaLN_modulation.1.weight).
class AdaLNModulation : public Module {
 public:
  AdaLNModulation(int64_t cond_dim, int64_t dim, int64_t chunks);
  std::vector<Tensor> forward(const Tensor& c) const;  // c [B, cond] -> chunks x [B, dim]
  // The same from silu(c) [B, cond], when one silu(c) feeds many modulations (DiT's blocks).
  std::vector<Tensor> forward_activated(const Tensor& silu_c) const;
  std::shared_ptr<Linear> linear;
  int64_t dim, chunks;
};
// x [B, N, D] * (1 + scale[:, None]) + shift[:, None]
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale);

// Patch embedding: Conv2d(in, dim, patch, stride patch) then flatten to tokens. Name: proj.
class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch);
  Tensor forward(const Tensor& x) const;  // [B, C, H, W] -> [B, (H/p)(W/p), dim]
  std::shared_ptr<Conv2d> proj;
  int64_t patch;
};
// x [B, h*w, p*p*C] -> [B, C, h*p, w*p] (the inverse of patchify, DiT's channel-last patch order).
Tensor unpatchify(const Tensor& x, int64_t channels, int64_t patch, int64_t h, int64_t w);

// ---- the time embedding of diffusion backbones: t [B] -> [B, freq_dim] = [cos(t f_i), sin(t f_i)] ----
//   sinusoidal: i < freq_dim / 2, f_i log-spaced from max_freq (f_0) down towards min_freq.
//               min_freq = 1e-4, max_freq = 1 is exactly DiT/ADM's timestep_embedding(max_period 10000).
//               The default max_freq = 1000 also resolves t in [0, 1] (continuous schedules) and
//               log-sigma (EDM) while the low frequencies keep table-schedule times in [0, 1000) smooth:
//               one embedding for every schedule's model time.
//   fourier:    f_i = 2 pi b_i, b_i ~ N(0, fourier_scale^2) = Philox (seed, stream_of("time_embedding.fourier"), i)
//               (the reference framework's FourierEmbedding(D, scale=16)); best for t in [0, 1].
// The frequencies are computed on the host in double and rounded to float once.
struct TimeEmbeddingConfig {
  std::string kind = "sinusoidal";  // sinusoidal | fourier
  int64_t freq_dim = 256;
  double min_freq = 1e-4, max_freq = 1000.0, fourier_scale = 16.0;
  uint64_t seed = 0;  // fourier
  // The [model] keys time_embedding, time_freq_dim, time_min_freq, time_max_freq, time_fourier_scale
  // (a UsageError names a bad one); option_specs() lists them for a backbone's registration.
  static TimeEmbeddingConfig from_options(const Options& o);
  static std::vector<OptionSpec> option_specs();
  std::map<std::string, std::string> describe() const;  // the same keys, for Model::describe()
  std::vector<float> frequencies() const;               // freq_dim / 2 angular frequencies f_i
};
// [cos(t f), sin(t f)] of t [B] as `dtype`: [B, 2 * freqs.size()]; differentiable in t.
Tensor time_features(const Tensor& t, const std::vector<float>& freqs, DType dtype);

// DiT's TimestepEmbedder: time features -> Linear(freq_dim, hidden) -> SiLU -> Linear(hidden, out).
// Names: mlp.0.{weight,bias}, mlp.2.{weight,bias}; weights N(0, 0.02), biases 0 (DiT's init).
class TimestepEmbedder : public Module {
 public:
  TimestepEmbedder(const TimeEmbeddingConfig& cfg, int64_t hidden, int64_t out);
  Tensor forward(const Tensor& t) const;  // t [B], the model time (data: not differentiated) -> [B, out]
  int64_t flops() const;                  // 2 x multiply-adds per sample
  TimeEmbeddingConfig cfg;
  std::vector<float> freqs;
  std::shared_ptr<Linear> fc1, fc2;
};

// DiT / ADM's timestep_embedding: t [B] -> [B, dim], the sinusoidal features with min_freq =
// 1 / max_period and max_freq = 1 (a zero column appended when dim is odd).
Tensor timestep_embedding(const Tensor& t, int64_t dim, float max_period = 10000.0f);
// The fourier features of t [B] -> [B, 2n] with fourier_scale = scale and the given seed.
Tensor fourier_features(const Tensor& t, int64_t n, float scale, uint64_t seed);
// 2-D sin-cos positions (MAE / DiT): [h*w, dim], host-computed, on `backend`.
Tensor sincos_2d_positions(int64_t h, int64_t w, int64_t dim, const BackendPtr& backend);

}  // namespace dew::nn
