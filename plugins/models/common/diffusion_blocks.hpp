// plugins/models/common/diffusion_blocks.hpp — pieces shared by the diffusion backbones (dit, unet):
// time embedding, label checking, and two fused differentiable ops written against the kernel
// algebra (header-only; included by the plugins and by their tests, never by the core).
//
// Time features (t f32 [B] -> [B, freq_dim], then an MLP):
//   sinusoidal: [cos(t f_i), sin(t f_i)], i < freq_dim / 2, with f_i log-spaced from max_freq down to
//               min_freq (f_0 = max_freq). min_freq = 1e-4, max_freq = 1 is exactly DiT/ADM's
//               timestep_embedding(max_period 10000). dew's default max_freq = 1000 also resolves
//               t in [0, 1] (continuous schedules) and log-sigma (EDM) while the low frequencies keep
//               table-schedule times in [0, 1000) smooth: one embedding for every schedule's model time.
//   fourier:    [cos(2 pi t b_i), sin(2 pi t b_i)], b_i ~ N(0, fourier_scale^2) fixed by a Philox stream
//               (the reference framework's FourierEmbedding(D, scale=16)); best for t in [0, 1].
// Labels: "label" i32 [B] in [0, num_classes]; num_classes is the learned null class (classifier-free
// guidance). Anything else is refused before a kernel reads it.
//
// modulated_layer_norm(x [B, N, D], shift [B, D], scale [B, D]) = LN(x) * (1 + scale) + shift
// (no LN affine): one layer_norm kernel call per sample with weight 1 + scale_b and bias shift_b, so the
// modulation costs no extra pass and its gradients come out of layer_norm_backward directly.
// packed_attention(qkv [B, T, 3 H Dh]) -> [B, T, H Dh]: bidirectional multi-head attention straight from
// one fused q/k/v projection (q, k, v each [B, T, H, Dh] in that order along the last axis, the
// DiT / timm layout); the backward writes dq, dk, dv into one [B, T, 3 H Dh] gradient, no zero-fill.
// qkv_attention(x, w [3 H Dh, D], bias, heads) = packed_attention(linear(x, w, bias), heads) with the
// projection fused in: q, k, v come straight out of three matmuls (no packed tensor, no copies).
#pragma once
#include <cmath>
#include <cstdint>
#include <dew/autograd.hpp>
#include <dew/backend.hpp>
#include <dew/error.hpp>
#include <dew/nn.hpp>
#include <dew/ops.hpp>
#include <dew/options.hpp>
#include <dew/random.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dew_diffusion {

using dew::Tensor;

// A module that only names its children (the "mlp.0", "mlp.2" style of PyTorch Sequential checkpoints).
class Named final : public dew::nn::Module {
 public:
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

struct TimeConfig {
  std::string kind = "sinusoidal";  // sinusoidal | fourier
  int64_t freq_dim = 256;
  double min_freq = 1e-4, max_freq = 1000.0, fourier_scale = 16.0;
};

inline TimeConfig read_time_config(const dew::Options& o) {
  TimeConfig c;
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

inline std::vector<dew::OptionSpec> time_option_specs() {
  return {{"time_embedding", "sinusoidal", "time features: sinusoidal (log-spaced frequencies) or fourier (random)"},
          {"time_freq_dim", "256", "number of time features fed to the time MLP (even)"},
          {"time_min_freq", "1e-4", "sinusoidal: lowest frequency (DiT: 1e-4)"},
          {"time_max_freq", "1000", "sinusoidal: highest frequency (DiT: 1; 1000 also resolves t in [0, 1])"},
          {"time_fourier_scale", "16", "fourier: std of the random frequencies"}};
}

// The image keys both backbones read (the diffusion objective fills the first three from the data).
inline std::vector<dew::OptionSpec> image_option_specs() {
  return {{"image_size", "32", "image side or 'height,width' (set by the diffusion objective from the data)"},
          {"in_channels", "3", "image channels (set by the diffusion objective)"},
          {"out_channels", "", "output channels (default in_channels; 2 x in_channels for a learned variance)"},
          {"num_classes", "0", "classes for label conditioning (0 = unconditional); label num_classes = null class"}};
}

inline std::map<std::string, std::string> describe_time(const TimeConfig& c) {
  return {{"time_embedding", c.kind},
          {"time_freq_dim", std::to_string(c.freq_dim)},
          {"time_min_freq", std::to_string(c.min_freq)},
          {"time_max_freq", std::to_string(c.max_freq)},
          {"time_fourier_scale", std::to_string(c.fourier_scale)}};
}

// The frequencies (angular, per unit of t) of the time features, host side.
inline std::vector<float> time_frequencies(const TimeConfig& c) {
  const int64_t half = c.freq_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  if (c.kind == "fourier") {
    const uint64_t stream = dew::philox::stream_of("time_embedding.fourier");
    for (int64_t i = 0; i < half; ++i)
      f[size_t(i)] = float(6.283185307179586 * c.fourier_scale * dew::philox::normal(0, stream, uint64_t(i)));
  } else {
    const double lo = std::log(c.min_freq), hi = std::log(c.max_freq);
    for (int64_t i = 0; i < half; ++i)
      f[size_t(i)] = float(std::exp(hi - (hi - lo) * double(i) / double(half)));  // DiT: exp(-ln(1e4) i / half)
  }
  return f;
}

// t [B] -> [B, freq_dim] = [cos(t f), sin(t f)] (not differentiable in t: model time is data).
inline Tensor time_features(const Tensor& t, const std::vector<float>& freqs, dew::DType dtype) {
  DEW_CHECK(t.ndim() == 1, "time features: 't' must be [B], got ", dew::shape_str(t.shape()));
  const int64_t half = int64_t(freqs.size());
  Tensor tf = dew::cast(t.detach(), dtype);
  Tensor f = Tensor::from_vector(freqs, {1, half}, t.backend_ptr(), dtype);
  Tensor args = dew::mul(dew::reshape(tf, {-1, 1}), f);
  return dew::concat({dew::cos(args), dew::sin(args)}, 1);
}

// Time MLP (DiT's TimestepEmbedder): features -> Linear(freq_dim, out) -> SiLU -> Linear(out, out).
// Names: mlp.0.{weight,bias}, mlp.2.{weight,bias}; weights N(0, 0.02), biases 0 (DiT's init).
class TimeEmbedder final : public dew::nn::Module {
 public:
  TimeEmbedder(const TimeConfig& c, int64_t hidden, int64_t out) : cfg(c), freqs(time_frequencies(c)) {
    auto mlp = register_module("mlp", std::make_shared<Named>());
    const auto w = dew::nn::Init::Normal(0.02f);
    fc1 = mlp->add("0", std::make_shared<dew::nn::Linear>(c.freq_dim, hidden, true, w, dew::nn::Init::Zeros()));
    fc2 = mlp->add("2", std::make_shared<dew::nn::Linear>(hidden, out, true, w, dew::nn::Init::Zeros()));
  }
  Tensor forward(const Tensor& t) const {
    return fc2->forward(fc1->forward(time_features(t, freqs, fc1->weight.dtype()), dew::Activation::silu));
  }
  int64_t flops() const { return 2 * (fc1->weight.numel() + fc2->weight.numel()); }
  TimeConfig cfg;
  std::vector<float> freqs;
  std::shared_ptr<dew::nn::Linear> fc1, fc2;
};

// Reads and checks the optional "label" input: i32 [B] in [0, num_classes] (num_classes = null).
// Returns an undefined tensor when there is no label. An unconditional model (num_classes 0) accepts
// only the null label 0.
inline Tensor checked_label(const std::map<std::string, Tensor>& in, int64_t batch, int64_t num_classes,
                            const char* model) {
  auto it = in.find("label");
  if (it == in.end()) return {};
  Tensor l = it->second;
  DEW_CHECK(l.numel() == batch, model, ": 'label' has ", l.numel(), " entries for a batch of ", batch);
  if (l.dtype() != dew::DType::i32) l = dew::cast(l.detach(), dew::DType::i32);
  l = dew::reshape(l, {batch});
  for (int32_t v : l.to_ints())
    DEW_CHECK(v >= 0 && v <= num_classes, model, ": label ", v, " is outside [0, ", num_classes, "] (", num_classes,
              num_classes == 0 ? " is the null label of this unconditional model: model.num_classes = 0)"
                               : " is the null label; model.num_classes must cover every label)");
  return l;
}

// ---------------------------------------------------------------- fused ops

namespace detail {
inline dew::DType stat_dtype(const Tensor& x) {
  return x.dtype() == dew::DType::f64 ? dew::DType::f64 : dew::DType::f32;
}
inline Tensor row(const Tensor& t, int64_t b, const dew::Shape& shape) {
  return t.slice0(b, b + 1).reshape(shape);  // a view (t is detached: no graph)
}
}  // namespace detail

inline Tensor modulated_layer_norm(const Tensor& x, const Tensor& shift, const Tensor& scale, float eps = 1e-6f) {
  DEW_CHECK(x.ndim() == 3, "modulated_layer_norm: x must be [B, N, D], got ", dew::shape_str(x.shape()));
  const int64_t b = x.shape()[0], n = x.shape()[1], d = x.shape()[2];
  DEW_CHECK(shift.shape() == dew::Shape({b, d}) && scale.shape() == dew::Shape({b, d}),
            "modulated_layer_norm: shift and scale must be [", b, ", ", d, "], got ", dew::shape_str(shift.shape()),
            " and ", dew::shape_str(scale.shape()));
  dew::Backend& be = x.backend();
  const Tensor xd = x.detach(), sd = shift.detach();
  Tensor w = Tensor::empty({b, d}, x.dtype(), x.backend_ptr());
  be.unary(scale.detach(), w, dew::UnaryParams{dew::UnaryOp::affine, 1.0f, 1.0f});  // 1 + scale
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.backend_ptr());
  Tensor mean = Tensor::empty({b, n}, detail::stat_dtype(x), x.backend_ptr());
  Tensor rstd = Tensor::empty({b, n}, detail::stat_dtype(x), x.backend_ptr());
  for (int64_t i = 0; i < b; ++i) {
    Tensor yi = detail::row(y, i, {n, d}), mi = detail::row(mean, i, {n}), ri = detail::row(rstd, i, {n});
    be.layer_norm(detail::row(xd, i, {n, d}), detail::row(w, i, {d}), detail::row(sd, i, {d}), yi, mi, ri, eps);
  }
  if (dew::needs_grad({&x, &shift, &scale})) {
    dew::record(
        y, {x, shift, scale},
        [xd, w, mean, rstd, b, n, d](const Tensor& g) {
          dew::Backend& bk = xd.backend();
          Tensor dx = Tensor::empty(xd.shape(), xd.dtype(), xd.backend_ptr());
          Tensor dscale = Tensor::empty({b, d}, xd.dtype(), xd.backend_ptr());
          Tensor dshift = Tensor::empty({b, d}, xd.dtype(), xd.backend_ptr());
          for (int64_t i = 0; i < b; ++i) {
            Tensor dxi = detail::row(dx, i, {n, d}), dwi = detail::row(dscale, i, {d}),
                   dbi = detail::row(dshift, i, {d});
            bk.layer_norm_backward(detail::row(xd, i, {n, d}), detail::row(w, i, {d}), detail::row(mean, i, {n}),
                                   detail::row(rstd, i, {n}), detail::row(g, i, {n, d}), dxi, dwi, dbi);
          }
          return std::vector<Tensor>{dx, dshift, dscale};
        },
        "modulated_layer_norm");
  }
  return y;
}

inline Tensor packed_attention(const Tensor& qkv, int64_t heads, float scale = 0.0f) {
  DEW_CHECK(qkv.ndim() == 3 && qkv.shape()[2] % (3 * heads) == 0, "packed_attention: qkv must be [B, T, 3 * ", heads,
            " * head_dim], got ", dew::shape_str(qkv.shape()));
  const int64_t b = qkv.shape()[0], t = qkv.shape()[1], dm = qkv.shape()[2] / 3, hd = dm / heads;
  dew::AttentionParams p;
  p.causal = false;
  p.scale = scale > 0.0f ? scale : 1.0f / std::sqrt(float(hd));
  dew::Backend& be = qkv.backend();
  const Tensor src = qkv.detach();
  auto part = [&](int j) {
    Tensor out = Tensor::empty({b, t, heads, hd}, qkv.dtype(), qkv.backend_ptr());
    dew::StridedCopyParams c;
    c.shape = {b, t, dm};
    c.src_strides = {t * 3 * dm, 3 * dm, 1};
    c.dst_strides = {t * dm, dm, 1};
    c.src_offset = j * dm;
    be.strided_copy(src, out, c);
    return out;
  };
  const Tensor q = part(0), k = part(1), v = part(2);
  Tensor out = Tensor::empty({b, t, heads, hd}, qkv.dtype(), qkv.backend_ptr());
  Tensor lse = Tensor::empty({b, heads, t}, detail::stat_dtype(qkv), qkv.backend_ptr());
  be.attention(q, k, v, out, lse, p);
  Tensor y = out.reshape({b, t, dm});
  if (dew::needs_grad({&qkv})) {
    const Tensor od = out;
    dew::record(
        y, {qkv},
        [q, k, v, od, lse, p, b, t, dm, heads, hd](const Tensor& g) {
          dew::Backend& bk = q.backend();
          Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          Tensor dk = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          Tensor dv = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          bk.attention_backward(q, k, v, od, lse, g.reshape({b, t, heads, hd}), dq, dk, dv, p);
          Tensor dqkv = Tensor::empty({b, t, 3 * dm}, q.dtype(), q.backend_ptr());
          const Tensor* parts[3] = {&dq, &dk, &dv};
          for (int j = 0; j < 3; ++j) {
            dew::StridedCopyParams c;
            c.shape = {b, t, dm};
            c.src_strides = {t * dm, dm, 1};
            c.dst_strides = {t * 3 * dm, 3 * dm, 1};
            c.dst_offset = j * dm;
            bk.strided_copy(*parts[j], dqkv, c);
          }
          return std::vector<Tensor>{dqkv};
        },
        "packed_attention");
  }
  return y;
}

// qkv_attention(x [B, T, Din], w [3 H Dh, Din], bias [3 H Dh] or undefined, heads) -> [B, T, H Dh]:
// exactly packed_attention(linear(x, w, bias), heads), without the packed [B, T, 3 H Dh] tensor. q, k and
// v are three matmuls against the row blocks of w (free views) written straight into the attention's
// contiguous inputs; the backward writes the row blocks of dw and db in place and sums dx over the three
// blocks (matmul beta = 1). This saves the strided copies that split qkv into q, k, v and reassemble
// dqkv (and their buffers): the training step is memory-bound on CPUs.
inline Tensor qkv_attention(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t heads, float scale = 0.0f) {
  DEW_CHECK(x.ndim() == 3, "qkv_attention: x must be [B, T, D], got ", dew::shape_str(x.shape()));
  const int64_t b = x.shape()[0], t = x.shape()[1], din = x.shape()[2], rows = b * t;
  DEW_CHECK(heads > 0 && w.ndim() == 2 && w.shape()[1] == din && w.shape()[0] % (3 * heads) == 0,
            "qkv_attention: weight must be [3 * ", heads, " * head_dim, ", din, "], got ", dew::shape_str(w.shape()));
  const int64_t dm = w.shape()[0] / 3, hd = dm / heads;
  DEW_CHECK(!bias.defined() || bias.shape() == dew::Shape({3 * dm}), "qkv_attention: bias must be [", 3 * dm, "], got ",
            dew::shape_str(bias.defined() ? bias.shape() : dew::Shape{}));
  DEW_CHECK(w.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
            "qkv_attention: x, weight and bias must have one dtype");
  dew::AttentionParams p;
  p.causal = false;
  p.scale = scale > 0.0f ? scale : 1.0f / std::sqrt(float(hd));
  dew::Backend& be = x.backend();
  const Tensor xd = x.detach().reshape({rows, din}), wd = w.detach(), bd = bias.defined() ? bias.detach() : Tensor();
  Tensor parts[3];
  for (int j = 0; j < 3; ++j) {
    parts[j] = Tensor::empty({b, t, heads, hd}, x.dtype(), x.backend_ptr());
    dew::MatmulParams mp;
    mp.m = rows;
    mp.n = dm;
    mp.k = din;
    mp.trans_b = true;
    be.matmul(xd, wd.slice0(j * dm, (j + 1) * dm), bd.defined() ? bd.slice0(j * dm, (j + 1) * dm) : Tensor(), parts[j],
              mp);
  }
  Tensor out = Tensor::empty({b, t, heads, hd}, x.dtype(), x.backend_ptr());
  Tensor lse = Tensor::empty({b, heads, t}, detail::stat_dtype(x), x.backend_ptr());
  be.attention(parts[0], parts[1], parts[2], out, lse, p);
  Tensor y = out.reshape({b, t, dm});
  if (dew::needs_grad({&x, &w, &bias})) {
    const Tensor q = parts[0], k = parts[1], v = parts[2], od = out;
    const bool gx = dew::needs_grad({&x}), gw = dew::needs_grad({&w}), gb = dew::needs_grad({&bias});
    const dew::Shape xs = x.shape();
    dew::record(
        y, {x, w, bias},
        [xd, wd, q, k, v, od, lse, p, xs, rows, din, dm, gx, gw, gb](const Tensor& g) {
          dew::Backend& bk = xd.backend();
          Tensor dparts[3];
          for (int j = 0; j < 3; ++j) dparts[j] = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          bk.attention_backward(q, k, v, od, lse, g.reshape(q.shape()), dparts[0], dparts[1], dparts[2], p);
          Tensor dx, dw, db;
          if (gx) {
            dx = Tensor::empty({rows, din}, xd.dtype(), xd.backend_ptr());
            for (int j = 0; j < 3; ++j) {  // dx = dq Wq + dk Wk + dv Wv
              dew::MatmulParams mp;
              mp.m = rows;
              mp.n = din;
              mp.k = dm;
              mp.beta = j == 0 ? 0.0f : 1.0f;
              bk.matmul(dparts[j].reshape({rows, dm}), wd.slice0(j * dm, (j + 1) * dm), Tensor(), dx, mp);
            }
            dx = dx.reshape(xs);
          }
          if (gw) {
            dw = Tensor::empty(wd.shape(), wd.dtype(), wd.backend_ptr());
            for (int j = 0; j < 3; ++j) {  // dW_j = d_j^T x
              Tensor block = dw.slice0(j * dm, (j + 1) * dm);
              dew::MatmulParams mp;
              mp.m = dm;
              mp.n = din;
              mp.k = rows;
              mp.trans_a = true;
              bk.matmul(dparts[j].reshape({rows, dm}), xd, Tensor(), block, mp);
            }
          }
          if (gb) {
            db = Tensor::empty({3 * dm}, xd.dtype(), xd.backend_ptr());
            for (int j = 0; j < 3; ++j) {  // db_j = column sums of d_j
              Tensor block = db.slice0(j * dm, (j + 1) * dm);
              dew::ReduceParams rp;
              rp.op = dew::ReduceOp::sum;
              rp.outer = 1;
              rp.reduce = rows;
              rp.inner = dm;
              bk.reduce(dparts[j], block, rp);
            }
          }
          return std::vector<Tensor>{dx, dw, db};
        },
        "qkv_attention");
  }
  return y;
}

}  // namespace dew_diffusion
