// core/nn/blocks.cpp — the standard blocks (Linear, Embedding, norms, Conv2d, attention, MLPs,
// adaLN-Zero, patch embedding, positional embeddings). Shapes are documented in dew/nn.hpp.
#include <cmath>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/nn.hpp"
#include "dew/random.hpp"

namespace dew::nn {

static Init or_default(Init i, Init fallback) { return i.kind == Init::automatic ? fallback : i; }

// ---------------------------------------------------------------- Linear, Embedding, norms, conv

Linear::Linear(int64_t in, int64_t out, bool has_bias, Init weight_init, Init bias_init) {
  DEW_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  const float bound = 1.0f / std::sqrt(float(in));
  weight = register_parameter("weight", {out, in}, or_default(weight_init, Init::Uniform(bound)));
  if (has_bias) bias = register_parameter("bias", {out}, or_default(bias_init, Init::Uniform(bound)));
}
Tensor Linear::forward(const Tensor& x, Activation act) const { return linear(x, weight, bias, act); }

Embedding::Embedding(int64_t num, int64_t dim, Init init) {
  weight = register_parameter("weight", {num, dim}, or_default(init, Init::Normal(1.0f)));
}
Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

RMSNorm::RMSNorm(int64_t dim, float e, float offset) : eps(e), weight_offset(offset) {
  weight = register_parameter("weight", {dim}, offset != 0.0f ? Init::Zeros() : Init::Ones());
}
Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight, eps, weight_offset); }

LayerNorm::LayerNorm(int64_t dim, float e, bool affine, bool has_bias) : eps(e) {
  if (affine) weight = register_parameter("weight", {dim}, Init::Ones());
  if (affine && has_bias) bias = register_parameter("bias", {dim}, Init::Zeros());
}
Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

GroupNorm::GroupNorm(int64_t g, int64_t channels, float e) : groups(g), eps(e) {
  DEW_CHECK(g > 0 && channels % g == 0, "GroupNorm: ", channels, " channels do not split into ", g, " groups");
  weight = register_parameter("weight", {channels}, Init::Ones());
  bias = register_parameter("bias", {channels}, Init::Zeros());
}
Tensor GroupNorm::forward(const Tensor& x) const { return group_norm(x, groups, weight, bias, eps); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, int64_t groups,
               bool has_bias) {
  DEW_CHECK(in % groups == 0 && out % groups == 0, "Conv2d: channels ", in, "->", out, " do not split into ", groups,
            " groups");
  params.stride_h = params.stride_w = stride;
  params.pad_h = params.pad_w = padding;
  params.groups = groups;
  const float bound = 1.0f / std::sqrt(float(in / groups * kernel * kernel));
  weight = register_parameter("weight", {out, in / groups, kernel, kernel}, Init::Uniform(bound));
  if (has_bias) bias = register_parameter("bias", {out}, Init::Uniform(bound));
}
Tensor Conv2d::forward(const Tensor& x) const { return conv2d(x, weight, bias, params); }

// ---------------------------------------------------------------- attention

Attention::Attention(const AttentionConfig& c) : cfg(c) {
  DEW_CHECK(cfg.dim > 0 && cfg.num_heads > 0, "Attention: dim and num_heads must be positive");
  if (cfg.num_kv_heads == 0) cfg.num_kv_heads = cfg.num_heads;
  if (cfg.head_dim == 0) {
    DEW_CHECK(cfg.dim % cfg.num_heads == 0, "Attention: dim ", cfg.dim, " is not a multiple of ", cfg.num_heads,
              " heads");
    cfg.head_dim = cfg.dim / cfg.num_heads;
  }
  DEW_CHECK(cfg.num_heads % cfg.num_kv_heads == 0, "Attention: ", cfg.num_heads, " heads do not group over ",
            cfg.num_kv_heads, " key/value heads");
  if (cfg.scale == 0.0f) cfg.scale = 1.0f / std::sqrt(float(cfg.head_dim));
  q_proj = register_module("q_proj", std::make_shared<Linear>(cfg.dim, cfg.num_heads * cfg.head_dim, cfg.bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(cfg.dim, cfg.num_kv_heads * cfg.head_dim, cfg.bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(cfg.dim, cfg.num_kv_heads * cfg.head_dim, cfg.bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(cfg.num_heads * cfg.head_dim, cfg.dim, false));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(cfg.head_dim));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(cfg.head_dim));
  }
}

Tensor Attention::forward(const Tensor& x, const Tensor& positions) const {
  DEW_CHECK(x.ndim() == 3 && x.shape()[2] == cfg.dim, "Attention: input must be [B, T, ", cfg.dim, "], got ",
            shape_str(x.shape()));
  const int64_t b = x.shape()[0], t = x.shape()[1];
  Tensor q = reshape(q_proj->forward(x), {b, t, cfg.num_heads, cfg.head_dim});
  Tensor k = reshape(k_proj->forward(x), {b, t, cfg.num_kv_heads, cfg.head_dim});
  Tensor v = reshape(v_proj->forward(x), {b, t, cfg.num_kv_heads, cfg.head_dim});
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  if (cfg.rotary_dim >= 0) {
    q = rope(q, positions, cfg.rope_theta, cfg.rotary_dim);
    k = rope(k, positions, cfg.rope_theta, cfg.rotary_dim);
  }
  AttentionParams p;
  p.scale = cfg.scale;
  p.causal = cfg.causal;
  p.window = cfg.window;
  p.softcap = cfg.softcap;
  Tensor o = attention(q, k, v, p);
  return o_proj->forward(reshape(o, {b, t, cfg.num_heads * cfg.head_dim}));
}

// ---------------------------------------------------------------- MLPs

GatedMLP::GatedMLP(int64_t dim, int64_t hidden, Activation a, bool bias) : act(a) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(dim, hidden, bias));
  up_proj = register_module("up_proj", std::make_shared<Linear>(dim, hidden, bias));
  down_proj = register_module("down_proj", std::make_shared<Linear>(hidden, dim, bias));
}
Tensor GatedMLP::forward(const Tensor& x) const {
  return down_proj->forward(mul(gate_proj->forward(x, act), up_proj->forward(x)));
}

MLP::MLP(int64_t dim, int64_t hidden, int64_t out, Activation a, bool bias) : act(a) {
  fc1 = register_module("fc1", std::make_shared<Linear>(dim, hidden, bias));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, out == 0 ? dim : out, bias));
}
Tensor MLP::forward(const Tensor& x) const { return fc2->forward(fc1->forward(x, act)); }

// ---------------------------------------------------------------- DiT pieces

AdaLNModulation::AdaLNModulation(int64_t cond_dim, int64_t d, int64_t n) : dim(d), chunks(n) {
  linear = register_module("linear", std::make_shared<Linear>(cond_dim, n * d, true, Init::Zeros(), Init::Zeros()));
}
std::vector<Tensor> AdaLNModulation::forward(const Tensor& c) const {
  Tensor m = linear->forward(silu(c));
  std::vector<Tensor> out;
  for (int64_t i = 0; i < chunks; ++i) out.push_back(slice(m, -1, i * dim, (i + 1) * dim));
  return out;
}

Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale_) {
  const int64_t b = shift.shape()[0], d = shift.shape()[1];
  return add(mul(x, add_scalar(reshape(scale_, {b, 1, d}), 1.0f)), reshape(shift, {b, 1, d}));
}

PatchEmbed::PatchEmbed(int64_t in_channels, int64_t dim, int64_t p) : patch(p) {
  proj = register_module("proj", std::make_shared<Conv2d>(in_channels, dim, p, p, 0));
}
Tensor PatchEmbed::forward(const Tensor& x) const {
  DEW_CHECK(x.ndim() == 4 && x.shape()[2] % patch == 0 && x.shape()[3] % patch == 0, "PatchEmbed: input ",
            shape_str(x.shape()), " is not [B, C, H, W] with H, W multiples of ", patch);
  Tensor y = proj->forward(x);  // [B, D, h, w]
  const int64_t b = y.shape()[0], d = y.shape()[1];
  return transpose(reshape(y, {b, d, -1}), 1, 2);
}

Tensor unpatchify(const Tensor& x, int64_t c, int64_t p, int64_t h, int64_t w) {
  const int64_t b = x.shape()[0];
  DEW_CHECK(x.ndim() == 3 && x.shape()[1] == h * w && x.shape()[2] == p * p * c, "unpatchify: input ",
            shape_str(x.shape()), " is not [B, ", h * w, ", ", p * p * c, "]");
  Tensor y = reshape(x, {b, h, w, p, p, c});
  y = permute(y, {0, 5, 1, 3, 2, 4});  // [B, C, h, p, w, p]
  return reshape(y, {b, c, h * p, w * p});
}

Tensor timestep_embedding(const Tensor& t, int64_t dim, float max_period) {
  DEW_CHECK(t.ndim() == 1, "timestep_embedding: t must be [B]");
  const int64_t half = dim / 2;
  std::vector<float> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) freqs[size_t(i)] = std::exp(-std::log(max_period) * float(i) / float(half));
  Tensor f = Tensor::from_vector(freqs, {1, half}, t.backend_ptr(), t.dtype());
  Tensor args = mul(reshape(t, {-1, 1}), f);
  Tensor emb = concat({cos(args), sin(args)}, 1);
  if (dim % 2) emb = concat({emb, Tensor::zeros({t.shape()[0], 1}, t.dtype(), t.backend_ptr())}, 1);
  return emb;
}

Tensor fourier_features(const Tensor& t, int64_t n, float scale_, uint64_t seed) {
  Tensor bfreq = Tensor::normal({1, n}, 0.0f, scale_ * 6.283185307f, seed, philox::stream_of("fourier_features"),
                                t.backend_ptr(), t.dtype());
  Tensor args = mul(reshape(t, {-1, 1}), bfreq);
  return concat({cos(args), sin(args)}, 1);
}

Tensor sincos_2d_positions(int64_t h, int64_t w, int64_t dim, const BackendPtr& backend) {
  DEW_CHECK(dim % 4 == 0, "sincos_2d_positions: dim ", dim, " must be a multiple of 4");
  const int64_t quarter = dim / 4;
  std::vector<float> out(size_t(h * w * dim));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      float* row = out.data() + (y * w + x) * dim;
      // first half encodes the column (x), second half the row (y), as in MAE's get_2d_sincos_pos_embed
      for (int64_t i = 0; i < quarter; ++i) {
        const double omega = 1.0 / std::pow(10000.0, double(i) / double(quarter));
        row[i] = float(std::sin(double(x) * omega));
        row[quarter + i] = float(std::cos(double(x) * omega));
        row[2 * quarter + i] = float(std::sin(double(y) * omega));
        row[3 * quarter + i] = float(std::cos(double(y) * omega));
      }
    }
  return Tensor::from_vector(out, {h * w, dim}, backend);
}

}  // namespace dew::nn
