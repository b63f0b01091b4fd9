// dew/nn.hpp — reusable model blocks with Hugging Face-style parameter names.
//
// A Module owns named parameters and child modules; named_parameters() walks them depth-first in
// registration order with dotted names ("layers.3.self_attn.q_proj.weight"), the flat, ordered tree
// checkpoints and exports use unchanged. Parameters are created on construction (on the default
// backend unless one is given) and initialised from their Init rule; initialize(seed) re-initialises
// every parameter with Philox stream = hash of its full name, so the values do not depend on creation
// order, thread count or backend.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/ops.hpp"
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
};

class Module {
 public:
  virtual ~Module() = default;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  void initialize(uint64_t seed);
  void set_training(bool on);
  bool training() const { return training_; }
  void zero_grad();

 protected:
  Tensor register_parameter(const std::string& name, const Shape& shape, Init init);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }
  BackendPtr backend_;  // where this module's parameters live (default_backend() at construction)
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

// y = x W^T + b; weight [out, in], bias [out]. Default init as PyTorch: U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, Init weight_init = {}, Init bias_init = {});
  Tensor forward(const Tensor& x, Activation act = Activation::none) const;
  Tensor weight, bias;
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

class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, int64_t groups = 1,
         bool bias = true);
  Tensor forward(const Tensor& x) const;  // NCHW
  Tensor weight, bias;
  Conv2dParams params;
};

struct AttentionConfig {
  int64_t dim = 0, num_heads = 1, num_kv_heads = 0, head_dim = 0;  // 0: num_heads / dim / num_heads
  float rope_theta = 10000.0f;
  int64_t rotary_dim = 0;  // 0: the whole head; -1: no rotary positions
  bool qk_norm = false;    // RMSNorm over head_dim on q and k (Qwen3 / OLMo-2 style)
  bool causal = true;
  int64_t window = 0;    // sliding window (0 = global)
  float softcap = 0.0f;  // attention logit softcap (Gemma 2)
  bool bias = false;     // q/k/v projection biases (Qwen2)
  float scale = 0.0f;    // 0: 1/sqrt(head_dim)
};

// Multi-head self-attention with grouped-query heads, rotary positions, optional q/k norm, sliding
// window and softcap. Names: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm.
class Attention : public Module {
 public:
  explicit Attention(const AttentionConfig& cfg);
  // x [B, T, dim]; positions i32 [T] or [B, T]. Returns [B, T, dim].
  Tensor forward(const Tensor& x, const Tensor& positions) const;
  AttentionConfig cfg;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;
};

// Gated MLP (SwiGLU with silu, GeGLU with gelu): down(act(gate(x)) * up(x)). Names: gate_proj, up_proj, down_proj.
class GatedMLP : public Module {
 public:
  GatedMLP(int64_t dim, int64_t hidden, Activation act = Activation::silu, bool bias = false);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  Activation act;
};

// Plain MLP: fc2(act(fc1(x))). Names: fc1, fc2.
class MLP : public Module {
 public:
  MLP(int64_t dim, int64_t hidden, int64_t out = 0, Activation act = Activation::gelu_tanh, bool bias = true);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> fc1, fc2;
  Activation act;
};

// adaLN-Zero modulation (DiT): silu(c) -> Linear(cond, chunks * dim), zero-initialised, split in chunks.
class AdaLNModulation : public Module {
 public:
  AdaLNModulation(int64_t cond_dim, int64_t dim, int64_t chunks);
  std::vector<Tensor> forward(const Tensor& c) const;  // c [B, cond] -> chunks x [B, dim]
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

// Sinusoidal timestep embedding (DiT / ADM): t [B] -> [B, dim] = [cos(t f_i), sin(t f_i)], f_i = max_period^(-i/half).
Tensor timestep_embedding(const Tensor& t, int64_t dim, float max_period = 10000.0f);
// Random Fourier features: [cos(2 pi t b_i), sin(2 pi t b_i)], b_i ~ N(0, scale^2) fixed by seed; t [B] -> [B, 2n].
Tensor fourier_features(const Tensor& t, int64_t n, float scale, uint64_t seed);
// 2-D sin-cos positions (MAE / DiT): [h*w, dim], host-computed, on `backend`.
Tensor sincos_2d_positions(int64_t h, int64_t w, int64_t dim, const BackendPtr& backend);

}  // namespace dew::nn
