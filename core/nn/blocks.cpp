// core/nn/blocks.cpp — the standard blocks (Linear, Embedding, norms, Conv2d, attention with its KV-cache
// and slot-cache paths, MLPs, adaLN-Zero, patch embedding, the time embedding, positional embeddings).
// Shapes are documented in dew/nn.hpp. The bundled backbones are built from these, and the backbone
// fixtures (tests/models) hold them to the bits those backbones produced before: keep the op sequence
// of a forward when changing one. Decoding: weights that store_matmul_weights_as packed back to back (q/k/v,
// gate/up) are multiplied as one weight for inputs of at most 32 rows without autograd (the bits of the
// separate products; see "decode-step fusion" below); everything else keeps the separate products.
#include <cmath>

#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/nn.hpp"
#include "dew/qk_clip.hpp"
#include "dew/random.hpp"
#include "ops/kernel_call.hpp"

namespace dew::nn {

static Init or_default(Init i, Init fallback) { return i.kind == Init::automatic ? fallback : i; }

// ---------------------------------------------------------------- Linear, Embedding, norms, conv

Linear::Linear(int64_t in, int64_t out, bool has_bias, Init weight_init, Init bias_init) {
  DEW_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  const float bound = 1.0f / std::sqrt(float(in));
  weight = register_parameter("weight", {out, in}, or_default(weight_init, Init::Uniform(bound)));
  if (has_bias) bias = register_parameter("bias", {out}, or_default(bias_init, Init::Uniform(bound)));
}
Tensor Linear::forward(const Tensor& x, Activation act) const {
  if (!adapter_active()) return linear(x, weight, bias, act);
  // s applied to the [rows, r] product (a scale keeps its input for the backward), and the base and adapter
  // products summed under one node (linear_sum): the backward keeps x and the [rows, r] product only.
  // LoRA dropout: the adapter's input only, in training (PEFT's lora_dropout), keyed like the backbones' dropout.
  const Tensor xa =
      lora_dropout > 0 && training() && lora_key
          ? dropout(x, lora_dropout, lora_key->seed, lora_stream + lora_key->step * 0x9E3779B97F4A7C15ull, 0)
          : x;
  const Tensor y = linear_sum(x, weight, bias, scale(linear(xa, lora_a), lora_scale), lora_b);
  return act == Activation::none ? y : activation(y, act);
}

void Linear::add_lora(int64_t rank, float s, uint64_t seed, const std::string& full_name) {
  DEW_CHECK(!has_lora(), "Linear '", full_name, "' already has a LoRA adapter");
  DEW_CHECK(rank > 0, "LoRA rank must be positive, got ", rank);
  const int64_t in = weight.shape()[1], out = weight.shape()[0];
  const Init a_init = Init::Uniform(1.0f / std::sqrt(float(in)));  // Linear's default, PEFT's kaiming_uniform(a=sqrt 5)
  lora_a = register_parameter("lora_A.weight", {rank, in}, a_init);
  init_tensor(lora_a, a_init, seed, philox::stream_of((full_name + ".lora_A.weight").c_str()));
  lora_b = register_parameter("lora_B.weight", {out, rank}, Init::Zeros());
  lora_scale = s;
}

void Linear::set_lora_dropout(float p, const RandomKey* key, const std::string& full_name) {
  DEW_CHECK(has_lora(), "Linear '", full_name, "': LoRA dropout without an adapter");
  DEW_CHECK(p >= 0.0f && p < 1.0f, "LoRA dropout must be in [0, 1), got ", p);
  DEW_CHECK(p == 0.0f || key != nullptr, "Linear '", full_name, "': LoRA dropout needs its model's random key");
  lora_dropout = p;
  lora_key = key;
  lora_stream = philox::stream_of((full_name + ".lora_dropout").c_str());
}

void Linear::merge_lora() {
  if (!has_lora()) return;
  {
    NoGradGuard no_grad;
    const Tensor delta = scale(matmul(lora_b, lora_a), lora_scale);  // [out, in]
    weight.copy_(add(weight, cast(delta, weight.dtype())));
  }
  remove_parameter("lora_A.weight");
  remove_parameter("lora_B.weight");
  lora_a = lora_b = Tensor();
  lora_scale = 0.0f;
  lora_dropout = 0.0f;
  lora_key = nullptr;
}

Embedding::Embedding(int64_t num, int64_t dim, Init init) {
  weight = register_parameter("weight", {num, dim}, or_default(init, Init::Normal(1.0f)));
}
Tensor Embedding::forward(const Tensor& ids) const {
  const Tensor rows = embedding(weight, ids);
  // A table kept in bf16 for decoding (a tied head, store_matmul_weights_as): its rows widened to f32, exactly,
  // as the f32 activations after it expect (under autocast the rows stay in the half dtype).
  if (weight.dtype() == DType::bf16 && !weight.requires_grad() && !autocast_enabled()) return cast(rows, DType::f32);
  return rows;
}

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

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, int64_t groups, bool has_bias,
               Init weight_init, Init bias_init) {
  DEW_CHECK(in % groups == 0 && out % groups == 0, "Conv2d: channels ", in, "->", out, " do not split into ", groups,
            " groups");
  params.stride_h = params.stride_w = stride;
  params.pad_h = params.pad_w = padding;
  params.groups = groups;
  const float bound = 1.0f / std::sqrt(float(in / groups * kernel * kernel));
  weight =
      register_parameter("weight", {out, in / groups, kernel, kernel}, or_default(weight_init, Init::Uniform(bound)));
  if (has_bias) bias = register_parameter("bias", {out}, or_default(bias_init, Init::Uniform(bound)));
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
  const int64_t dq = cfg.num_heads * cfg.head_dim, dkv = cfg.num_kv_heads * cfg.head_dim;
  const ProjectionInit& in = cfg.init;
  if (cfg.layout == AttentionLayout::fused) {
    qkv = register_module("qkv", std::make_shared<Linear>(cfg.dim, dq + 2 * dkv, cfg.bias, in.weight, in.bias));
    o_proj = register_module("proj", std::make_shared<Linear>(dq, cfg.dim, cfg.o_bias, in.out_weight, in.out_bias));
  } else {
    q_proj = register_module("q_proj", std::make_shared<Linear>(cfg.dim, dq, cfg.bias, in.weight, in.bias));
    k_proj = register_module("k_proj", std::make_shared<Linear>(cfg.dim, dkv, cfg.bias, in.weight, in.bias));
    v_proj = register_module("v_proj", std::make_shared<Linear>(cfg.dim, dkv, cfg.bias, in.weight, in.bias));
    o_proj = register_module("o_proj", std::make_shared<Linear>(dq, cfg.dim, cfg.o_bias, in.out_weight, in.out_bias));
  }
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(cfg.head_dim, cfg.norm_eps, cfg.norm_offset));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(cfg.head_dim, cfg.norm_eps, cfg.norm_offset));
  }
}

AttentionParams Attention::params() const {
  AttentionParams p;
  p.scale = cfg.scale;
  p.causal = cfg.causal;
  p.window = cfg.window;
  p.softcap = cfg.softcap;
  return p;
}

// ---- decode-step fusion: weights that multiply one input, placed back to back by store_matmul_weights_as
// (core/generate/weights.cpp), are multiplied as one [sum of rows, in] weight: one product, one weight stream.
// Taken only without autograd, without biases, and for at most kFusedMaxRows rows (a decode step, a slot step,
// a short prefill): the backends' row-wise products (cpu: matmul_rowwise.cpp), whose every output column is
// summed the same way whatever the weight's other rows are, so the fused product's columns are the bits of
// the separate products'. Longer inputs (eval, long prefills) keep the separate products.
namespace {
constexpr int64_t kFusedMaxRows = 32;

// A [sum rows, cols] view over the tensors `ts` when they are defined, 2-D, of one dtype, width and layout, and lie
// back to back in one storage, in order (a quantized group's scales too); an undefined tensor otherwise.
Tensor adjacent_rows(const std::vector<const TensorImpl*>& ts) {
  const TensorImpl* f = ts.front();
  if (!f || f->shape.size() != 2) return Tensor();
  const int64_t cols = f->shape[1];
  int64_t rows = 0;
  for (const TensorImpl* t : ts) {
    if (!t || t->shape.size() != 2 || t->shape[1] != cols || t->dtype != f->dtype || t->storage != f->storage ||
        t->offset != f->offset + size_t(rows * cols) || (t->scales == nullptr) != (f->scales == nullptr) ||
        t->panel != f->panel)
      return Tensor();
    rows += t->shape[0];
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = f->storage;
  impl->offset = f->offset;
  impl->shape = {rows, cols};
  impl->dtype = f->dtype;
  impl->panel = f->panel;  // whole panels back to back are the group's panels (dew/tensor.hpp)
  if (f->scales) {
    std::vector<const TensorImpl*> scales;
    for (const TensorImpl* t : ts) scales.push_back(t->scales.get());
    const Tensor s = adjacent_rows(scales);
    if (!s.defined()) return Tensor();
    impl->scales = s.impl_ptr();
  }
  return Tensor(impl);
}

// The weights of unbiased linears `ls` as one view (adjacent_rows), or an undefined tensor.
Tensor adjacent_weights(std::initializer_list<const Linear*> ls) {
  std::vector<const TensorImpl*> ts;
  for (const Linear* l : ls) {
    if (l->bias.defined() || l->adapter_active()) return Tensor();
    ts.push_back(l->weight.impl());
  }
  return adjacent_rows(ts);
}

bool fusable_rows(const Tensor& x) {
  return !grad_enabled() && x.ndim() >= 2 && x.numel() / x.shape().back() <= kFusedMaxRows;
}

// Columns [begin, end) of y's last axis, shaped `shape`: a view when y has one row, else a copy.
Tensor columns(const Tensor& y, int64_t begin, int64_t end, const Shape& shape) {
  const int64_t n = y.shape().back();
  if (y.numel() == n) return reshape(reshape(y, {n}).slice0(begin, end), shape);
  return reshape(slice(y, -1, begin, end), shape);
}
}  // namespace

std::tuple<Tensor, Tensor, Tensor> Attention::project(const Tensor& x, const Tensor& positions) const {
  DEW_CHECK(x.ndim() == 3 && x.shape()[2] == cfg.dim, "Attention: input must be [B, T, ", cfg.dim, "], got ",
            shape_str(x.shape()));
  const int64_t b = x.shape()[0], t = x.shape()[1], hd = cfg.head_dim;
  const int64_t dq = cfg.num_heads * hd, dkv = cfg.num_kv_heads * hd;
  Tensor q, k, v;
  const Tensor packed =
      !qkv && fusable_rows(x) ? adjacent_weights({q_proj.get(), k_proj.get(), v_proj.get()}) : Tensor();
  if (packed.defined()) {  // q/k/v placed back to back (decoding): one product
    const Tensor y = linear(x, packed);
    q = columns(y, 0, dq, {b, t, cfg.num_heads, hd});
    k = columns(y, dq, dq + dkv, {b, t, cfg.num_kv_heads, hd});
    v = columns(y, dq + dkv, dq + 2 * dkv, {b, t, cfg.num_kv_heads, hd});
  } else if (qkv) {
    const Tensor y = qkv->forward(x);
    q = reshape(slice(y, -1, 0, dq), {b, t, cfg.num_heads, hd});
    k = reshape(slice(y, -1, dq, dq + dkv), {b, t, cfg.num_kv_heads, hd});
    v = reshape(slice(y, -1, dq + dkv, dq + 2 * dkv), {b, t, cfg.num_kv_heads, hd});
  } else {
    q = reshape(q_proj->forward(x), {b, t, cfg.num_heads, hd});
    k = reshape(k_proj->forward(x), {b, t, cfg.num_kv_heads, hd});
    v = reshape(v_proj->forward(x), {b, t, cfg.num_kv_heads, hd});
  }
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  if (cfg.rotary_dim >= 0) {
    DEW_CHECK(positions.defined(), "Attention: rotary positions need the tokens' positions");
    q = rope(q, positions, cfg.rope_theta, cfg.rotary_dim, cfg.rope_scaling);
    k = rope(k, positions, cfg.rope_theta, cfg.rotary_dim, cfg.rope_scaling);
  }
  return {q, k, v};
}

Tensor Attention::forward(const Tensor& x, const Tensor& positions, const Tensor& segment_ids) const {
  // QK-Clip's statistic (dew/qk_clip.hpp) needs q and k: a recorded training forward takes project().
  MaxLogitRecorder* const recorder = grad_enabled() ? MaxLogitRecorder::active() : nullptr;
  if (!recorder && qkv && !qkv->adapter_active() && !q_norm && cfg.rotary_dim < 0 &&
      cfg.num_kv_heads == cfg.num_heads) {  // fused in
    DEW_CHECK(x.ndim() == 3 && x.shape()[2] == cfg.dim, "Attention: input must be [B, T, ", cfg.dim, "], got ",
              shape_str(x.shape()));
    return o_proj->forward(qkv_attention(x, qkv->weight, qkv->bias, cfg.num_heads, params(), segment_ids));
  }
  const int64_t b = x.ndim() == 3 ? x.shape()[0] : 0, t = x.ndim() == 3 ? x.shape()[1] : 0;
  auto [q, k, v] = project(x, positions);
  if (recorder) recorder->record(*this, q, k, params(), segment_ids);
  return o_proj->forward(
      reshape(attention(q, k, v, params(), segment_ids), {b, t, cfg.num_heads * cfg.head_dim}));
}

namespace {
// src in the cache's dtype: unchanged for an f32 cache (the same tensor, so the same bits), rounded to bf16
// (nearest even) once here, as it is appended, for a bf16 cache.
Tensor as_cache_dtype(const Tensor& src, const Tensor& cache) {
  return src.dtype() == cache.dtype() ? src : cast(src, cache.dtype());
}

// Checks that a cache dst [B, S, Hkv, D] can take src [B, T, Hkv, D] at sequence position `at`.
void check_cache_rows(const Tensor& src, const Tensor& dst, int64_t at) {
  const int64_t b = src.shape()[0], t = src.shape()[1], row = src.shape()[2] * src.shape()[3];
  DEW_CHECK(dst.ndim() == 4 && dst.shape()[0] == b && dst.shape()[2] * dst.shape()[3] == row && at >= 0 &&
                at + t <= dst.shape()[1],
            "Attention: a cache ", shape_str(dst.shape()), " cannot take ", t, " positions at ", at, " of ",
            shape_str(src.shape()));
}

// Writes src [B, T, Hkv, D] into dst [B, S, Hkv, D] at sequence position `at` (no autograd: a cache).
void write_rows(const Tensor& src, Tensor& dst, int64_t at) {
  check_cache_rows(src, dst, at);
  const int64_t b = src.shape()[0], t = src.shape()[1], row = src.shape()[2] * src.shape()[3];
  const int64_t s = dst.shape()[1];
  StridedCopyParams p;
  p.shape = {b, t, row};
  p.src_strides = {t * row, row, 1};
  p.dst_strides = {s * row, row, 1};
  p.dst_offset = at * row;
  detail::kernels(dst).strided_copy(src, dst, p);
}

// Appends src [B, T, Hkv, D] (f32) to a cache [B, S, Hkv, D] at position `at`, in the cache's dtype: for one
// sequence the T rows are contiguous in the cache, so one cast kernel writes them there (rounding once for a bf16
// cache, a copy for f32: the bits of as_cache_dtype + write_rows, without the temporary and the second call, twice
// a layer in every decode step); several sequences take as_cache_dtype + write_rows.
void append_rows(const Tensor& src, Tensor& cache, int64_t at) {
  if (src.shape()[0] != 1 || cache.ndim() != 4 || cache.shape()[0] != 1)
    return write_rows(as_cache_dtype(src, cache), cache, at);
  check_cache_rows(src, cache, at);
  const int64_t t = src.shape()[1], row = src.shape()[2] * src.shape()[3], s = cache.shape()[1];
  Tensor dst = reshape(cache, {s, row}).slice0(at, at + t);
  detail::kernels(cache).cast(reshape(src, {t, row}), dst);
}

// The first n positions of a cache tensor [B, S, Hkv, D]: a view when B == 1, else a copy.
Tensor prefix(const Tensor& cache, int64_t n) {
  const Shape& s = cache.shape();
  if (n == s[1]) return cache;
  if (s[0] == 1) return reshape(reshape(cache, {s[1], s[2], s[3]}).slice0(0, n), {1, n, s[2], s[3]});
  return slice(cache, 1, 0, n);
}
}  // namespace

Tensor Attention::forward_cached(const Tensor& x, const Tensor& positions, Tensor& k_cache, Tensor& v_cache,
                                 int64_t past) const {
  auto [q, k, v] = project(x, positions);
  const int64_t b = x.shape()[0], t = x.shape()[1];
  append_rows(k, k_cache, past);
  append_rows(v, v_cache, past);
  AttentionParams p = params();
  p.q_offset = past;
  const Tensor o = attention(q, prefix(k_cache, past + t), prefix(v_cache, past + t), p);
  return o_proj->forward(reshape(o, {b, t, cfg.num_heads * cfg.head_dim}));
}

Tensor Attention::forward_slots(const Tensor& x, const Tensor& positions, Tensor& k_slots, Tensor& v_slots,
                                const std::vector<int64_t>& slots, const std::vector<int64_t>& pasts) const {
  const int64_t n = x.shape()[0];
  DEW_CHECK(x.ndim() == 3 && x.shape()[1] == 1 && int64_t(slots.size()) == n && int64_t(pasts.size()) == n,
            "Attention: a slot step takes x [N, 1, dim] and N slots and positions, got ", shape_str(x.shape()), ", ",
            slots.size(), " slots and ", pasts.size(), " positions");
  auto [q, k_new, v_new] = project(x, positions);
  // Every row's cache write and attention in one kernel call (attention_slots: each row the bits of its solo step).
  const Tensor o = attention_slots(q, k_new, v_new, slots, pasts, k_slots, v_slots, params());
  return o_proj->forward(reshape(o, {n, 1, cfg.num_heads * cfg.head_dim}));
}

// ---------------------------------------------------------------- MLPs

GatedMLP::GatedMLP(int64_t dim, int64_t hidden, Activation a, bool bias, ProjectionInit init, bool gated) : act(a) {
  if (gated)
    gate_proj = register_module("gate_proj", std::make_shared<Linear>(dim, hidden, bias, init.weight, init.bias));
  up_proj = register_module("up_proj", std::make_shared<Linear>(dim, hidden, bias, init.weight, init.bias));
  down_proj = register_module("down_proj", std::make_shared<Linear>(hidden, dim, bias, init.out_weight, init.out_bias));
}
Tensor GatedMLP::forward(const Tensor& x) const {
  if (!gate_proj) return down_proj->forward(up_proj->forward(x, act));
  const Tensor packed = fusable_rows(x) ? adjacent_weights({gate_proj.get(), up_proj.get()}) : Tensor();
  if (packed.defined()) {  // gate/up placed back to back (decoding): one product, the activation after it
    const Tensor y = linear(x, packed);
    const int64_t h = gate_proj->weight.shape()[0];
    Shape s = x.shape();
    s.back() = h;
    return down_proj->forward(gated_activation(columns(y, 0, h, s), columns(y, h, 2 * h, s), act));
  }
  // Training: one fused kernel each way, act(gate) never stored. Without gradients the activation rides in
  // the gate product's epilogue, then one mul (the same passes, and the bits served decoding always had).
  if (!grad_enabled()) return down_proj->forward(mul(gate_proj->forward(x, act), up_proj->forward(x)));
  return down_proj->forward(gated_activation(gate_proj->forward(x), up_proj->forward(x), act));
}

MLP::MLP(int64_t dim, int64_t hidden, int64_t out, Activation a, bool bias, ProjectionInit init) : act(a) {
  fc1 = register_module("fc1", std::make_shared<Linear>(dim, hidden, bias, init.weight, init.bias));
  fc2 = register_module("fc2",
                        std::make_shared<Linear>(hidden, out == 0 ? dim : out, bias, init.out_weight, init.out_bias));
}
Tensor MLP::forward(const Tensor& x) const { return fc2->forward(fc1->forward(x, act)); }

// ---------------------------------------------------------------- DiT pieces

AdaLNModulation::AdaLNModulation(int64_t cond_dim, int64_t d, int64_t n) : dim(d), chunks(n) {
  linear = register_module("1", std::make_shared<Linear>(cond_dim, n * d, true, Init::Zeros(), Init::Zeros()));
}
std::vector<Tensor> AdaLNModulation::forward(const Tensor& c) const { return forward_activated(silu(c)); }
std::vector<Tensor> AdaLNModulation::forward_activated(const Tensor& silu_c) const {
  Tensor m = linear->forward(silu_c);
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

// ---------------------------------------------------------------- the time embedding

TimeEmbeddingConfig TimeEmbeddingConfig::from_options(const Options& o) {
  TimeEmbeddingConfig c;
  c.kind = o.get_string("time_embedding", c.kind);
  DEW_USAGE_CHECK(c.kind == "sinusoidal" || c.kind == "fourier",
                  "option 'model.time_embedding' must be sinusoidal or fourier, got '", c.kind, "'");
  c.freq_dim = o.get_int("time_freq_dim", c.freq_dim);
  DEW_USAGE_CHECK(c.freq_dim >= 2 && c.freq_dim % 2 == 0, "option 'model.time_freq_dim' must be even and >= 2, got ",
                  c.freq_dim);
  c.min_freq = o.get_double("time_min_freq", c.min_freq);
  c.max_freq = o.get_double("time_max_freq", c.max_freq);
  DEW_USAGE_CHECK(c.min_freq > 0 && c.max_freq >= c.min_freq,
                  "options 'model.time_min_freq' and 'model.time_max_freq' must satisfy 0 < min <= max, got ",
                  c.min_freq, " and ", c.max_freq);
  c.fourier_scale = o.get_double("time_fourier_scale", c.fourier_scale);
  DEW_USAGE_CHECK(c.fourier_scale > 0, "option 'model.time_fourier_scale' must be positive, got ", c.fourier_scale);
  return c;
}

std::vector<OptionSpec> TimeEmbeddingConfig::option_specs() {
  return {{"time_embedding", "sinusoidal", "time features: sinusoidal (log-spaced frequencies) or fourier (random)"},
          {"time_freq_dim", "256", "number of time features fed to the time MLP (even)"},
          {"time_min_freq", "1e-4", "sinusoidal: lowest frequency (DiT: 1e-4)"},
          {"time_max_freq", "1000", "sinusoidal: highest frequency (DiT: 1; 1000 also resolves t in [0, 1])"},
          {"time_fourier_scale", "16", "fourier: std of the random frequencies"}};
}

std::map<std::string, std::string> TimeEmbeddingConfig::describe() const {
  return {{"time_embedding", kind},
          {"time_freq_dim", std::to_string(freq_dim)},
          {"time_min_freq", std::to_string(min_freq)},
          {"time_max_freq", std::to_string(max_freq)},
          {"time_fourier_scale", std::to_string(fourier_scale)}};
}

std::vector<float> TimeEmbeddingConfig::frequencies() const {
  const int64_t half = freq_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  if (kind == "fourier") {
    const uint64_t stream = philox::stream_of("time_embedding.fourier");
    for (int64_t i = 0; i < half; ++i)
      f[size_t(i)] = float(6.283185307179586 * fourier_scale * philox::normal(seed, stream, uint64_t(i)));
  } else {
    const double lo = std::log(min_freq), hi = std::log(max_freq);
    for (int64_t i = 0; i < half; ++i)
      f[size_t(i)] = float(std::exp(hi - (hi - lo) * double(i) / double(half)));  // DiT: exp(-ln(1e4) i / half)
  }
  return f;
}

Tensor time_features(const Tensor& t, const std::vector<float>& freqs, DType dtype) {
  DEW_CHECK(t.ndim() == 1, "time features: 't' must be [B], got ", shape_str(t.shape()));
  const int64_t half = int64_t(freqs.size());
  Tensor tf = cast(t, dtype);
  Tensor f = Tensor::from_vector(freqs, {1, half}, t.backend_ptr(), dtype);
  Tensor args = mul(reshape(tf, {-1, 1}), f);
  return concat({cos(args), sin(args)}, 1);
}

TimestepEmbedder::TimestepEmbedder(const TimeEmbeddingConfig& c, int64_t hidden, int64_t out)
    : cfg(c), freqs(c.frequencies()) {
  auto mlp = register_module("mlp", std::make_shared<ModuleDict>());
  const Init w = Init::Normal(0.02f);
  fc1 = mlp->add("0", std::make_shared<Linear>(c.freq_dim, hidden, true, w, Init::Zeros()));
  fc2 = mlp->add("2", std::make_shared<Linear>(hidden, out, true, w, Init::Zeros()));
}
Tensor TimestepEmbedder::forward(const Tensor& t) const {
  return fc2->forward(fc1->forward(time_features(t.detach(), freqs, fc1->weight.dtype()), Activation::silu));
}
int64_t TimestepEmbedder::flops() const { return 2 * (fc1->weight.numel() + fc2->weight.numel()); }

Tensor timestep_embedding(const Tensor& t, int64_t dim, float max_period) {
  DEW_CHECK(t.ndim() == 1, "timestep_embedding: t must be [B]");
  DEW_CHECK(dim >= 2 && max_period > 0, "timestep_embedding: dim ", dim, " must be >= 2 and max_period ", max_period,
            " positive");
  TimeEmbeddingConfig c;
  c.freq_dim = dim / 2 * 2;
  c.min_freq = 1.0 / double(max_period);
  c.max_freq = 1.0;
  Tensor emb = time_features(t, c.frequencies(), t.dtype());
  if (dim % 2) emb = concat({emb, Tensor::zeros({t.shape()[0], 1}, t.dtype(), t.backend_ptr())}, 1);
  return emb;
}

Tensor fourier_features(const Tensor& t, int64_t n, float scale_, uint64_t seed) {
  DEW_CHECK(n > 0 && scale_ > 0, "fourier_features: n ", n, " and scale ", scale_, " must be positive");
  TimeEmbeddingConfig c;
  c.kind = "fourier";
  c.freq_dim = 2 * n;
  c.fourier_scale = scale_;
  c.seed = seed;
  return time_features(t, c.frequencies(), t.dtype());
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
