// core/ops/fused.cpp — fused differentiable blocks (dew/ops.hpp): modulated_layer_norm, gated_residual,
// packed_attention, qkv_attention, linear_cross_entropy, linear_token_logprobs. Each is the composition its comment
// names, computed with fewer passes over memory (the training step is memory-bound on CPUs); the gradient checks
// against finite differences and the equality with the unfused composition are in tests/autograd/test_fused_ops.cpp.
// Their forwards call the backend directly (not through call_kernel), so a step program's recording that meets one is
// marked opaque (step_record.hpp): such a step is never replayed.
#include <algorithm>
#include <cmath>

#include "op_util.hpp"  // (and kernel_call.hpp: the step recorder)

namespace dew {

using detail::stat_dtype;

Tensor modulated_layer_norm(const Tensor& x, const Tensor& shift, const Tensor& scale, float eps) {
  detail::mark_step_opaque();  // direct calls below
  if (detail::autocast_differs(shift, x) || detail::autocast_differs(scale, x))
    return modulated_layer_norm(x, detail::autocast_like(shift, x), detail::autocast_like(scale, x), eps);
  DEW_CHECK(x.ndim() == 3, "modulated_layer_norm: x must be [B, N, D], got ", shape_str(x.shape()));
  const int64_t b = x.shape()[0], n = x.shape()[1], d = x.shape()[2];
  DEW_CHECK(shift.shape() == Shape({b, d}) && scale.shape() == Shape({b, d}),
            "modulated_layer_norm: shift and scale must be [", b, ", ", d, "], got ", shape_str(shift.shape()), " and ",
            shape_str(scale.shape()));
  detail::check_same_backend(x, shift, "modulated_layer_norm");
  detail::check_same_backend(x, scale, "modulated_layer_norm");
  detail::KernelCall be = detail::kernels(x);
  const Tensor xd = x.detach(), sd = shift.detach();
  Tensor w = Tensor::empty({b, d}, x.dtype(), x.backend_ptr());
  be.unary(scale.detach(), w, UnaryParams{UnaryOp::affine, 1.0f, 1.0f});  // 1 + scale
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.backend_ptr());
  Tensor mean = Tensor::empty({b, n}, stat_dtype(x), x.backend_ptr());
  Tensor rstd = Tensor::empty({b, n}, stat_dtype(x), x.backend_ptr());
  if (b > 0) be.layer_norm(xd, w, sd, y, mean, rstd, eps);  // [B, D] weight / bias: row group i = sample i
  if (needs_grad({&x, &shift, &scale})) {
    record(
        y, {x, shift, scale},
        [xd, w, mean, rstd, b, d](const Tensor& g) {
          detail::KernelCall bk = detail::kernels(xd);
          Tensor dx = Tensor::empty(xd.shape(), xd.dtype(), xd.backend_ptr());
          Tensor dscale = Tensor::empty({b, d}, xd.dtype(), xd.backend_ptr());
          Tensor dshift = Tensor::empty({b, d}, xd.dtype(), xd.backend_ptr());
          if (b > 0) bk.layer_norm_backward(xd, w, mean, rstd, g, dx, dscale, dshift);
          return std::vector<Tensor>{dx, dshift, dscale};
        },
        "modulated_layer_norm");
  }
  return y;
}

Tensor gated_residual(const Tensor& x, const Tensor& f, const Tensor& gate) {
  // Elementwise promotion under autocast, as add and mul: a half operand meeting an f32 one is widened.
  if (detail::autocast_differs(f, x) || detail::autocast_differs(gate, x) || detail::autocast_differs(gate, f)) {
    const bool wide = x.dtype() == DType::f32 || f.dtype() == DType::f32 || gate.dtype() == DType::f32;
    auto w = [wide](const Tensor& t) { return wide && t.dtype() != DType::f32 ? cast(t, DType::f32) : t; };
    if (wide) return gated_residual(w(x), w(f), w(gate));
  }
  DEW_CHECK(x.ndim() == 3, "gated_residual: x must be [B, N, D], got ", shape_str(x.shape()));
  const int64_t b = x.shape()[0], d = x.shape()[2];
  DEW_CHECK(f.shape() == x.shape(), "gated_residual: f ", shape_str(f.shape()), " must have x's shape ",
            shape_str(x.shape()));
  DEW_CHECK(gate.shape() == Shape({b, d}), "gated_residual: gate must be [", b, ", ", d, "], got ",
            shape_str(gate.shape()));
  DEW_CHECK(f.dtype() == x.dtype() && gate.dtype() == x.dtype(),
            "gated_residual: x, f and gate must have one dtype, got ", dtype_name(x.dtype()), ", ",
            dtype_name(f.dtype()), " and ", dtype_name(gate.dtype()));
  detail::check_same_backend(x, f, "gated_residual");
  detail::check_same_backend(x, gate, "gated_residual");
  // A backend without the kernel in this dtype gets the composition the kernel fuses (its own mul and add, or the
  // core's conversion around them).
  if (!x.backend().supports(Kernel::gated_residual, x.dtype()).ok ||
      !x.backend().supports(Kernel::gated_residual_backward, x.dtype()).ok)
    return add(x, mul(f, reshape(gate, {b, 1, d})));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.backend_ptr());
  if (b == 0) return y;
  const Tensor fd = f.detach(), gd = gate.detach();
  detail::kernels(x).gated_residual(x.detach(), fd, gd, y);
  if (needs_grad({&x, &f, &gate})) {
    const bool gf = needs_grad({&f}), gg = needs_grad({&gate});
    record(
        y, {x, f, gate},
        [fd, gd, gf, gg](const Tensor& g) {
          Tensor df, dgate;
          if (gf || gg) {
            df = Tensor::empty(fd.shape(), fd.dtype(), fd.backend_ptr());
            dgate = Tensor::empty(gd.shape(), gd.dtype(), gd.backend_ptr());
            detail::kernels(fd).gated_residual_backward(fd, gd, g, df, dgate);
          }
          return std::vector<Tensor>{g, gf ? df : Tensor(), gg ? dgate : Tensor()};
        },
        "gated_residual");
  }
  return y;
}

Tensor packed_attention(const Tensor& qkv, int64_t heads, const AttentionParams& p, const Tensor& segment_ids) {
  detail::mark_step_opaque();  // direct calls below
  if (detail::autocast_lowers({&qkv})) return packed_attention(detail::autocast_lower(qkv), heads, p, segment_ids);
  DEW_CHECK(heads > 0 && qkv.ndim() == 3 && qkv.shape()[2] % (3 * heads) == 0,
            "packed_attention: qkv must be [B, T, 3 * ", heads, " * head_dim], got ", shape_str(qkv.shape()));
  const int64_t b = qkv.shape()[0], t = qkv.shape()[1], dm = qkv.shape()[2] / 3, hd = dm / heads;
  detail::KernelCall be = detail::kernels(qkv);
  const Tensor src = qkv.detach();
  auto part = [&](int j) {
    Tensor out = Tensor::empty({b, t, heads, hd}, qkv.dtype(), qkv.backend_ptr());
    StridedCopyParams c;
    c.shape = {b, t, dm};
    c.src_strides = {t * 3 * dm, 3 * dm, 1};
    c.dst_strides = {t * dm, dm, 1};
    c.src_offset = j * dm;
    be.strided_copy(src, out, c);
    return out;
  };
  const Tensor q = part(0), k = part(1), v = part(2);
  Tensor out = Tensor::empty({b, t, heads, hd}, qkv.dtype(), qkv.backend_ptr());
  Tensor lse = Tensor::empty({b, heads, t}, stat_dtype(qkv), qkv.backend_ptr());
  const Tensor seg = segment_ids.defined() ? segment_ids.detach() : Tensor();
  be.attention(q, k, v, seg, out, lse, p);
  Tensor y = out.reshape({b, t, dm});
  if (needs_grad({&qkv})) {
    const Tensor od = out;
    record(
        y, {qkv},
        [q, k, v, seg, od, lse, p, b, t, dm, heads, hd](const Tensor& g) {
          detail::KernelCall bk = detail::kernels(q);
          Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          Tensor dk = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          Tensor dv = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          bk.attention_backward(q, k, v, seg, od, lse, g.reshape({b, t, heads, hd}), dq, dk, dv, p);
          Tensor dqkv = Tensor::empty({b, t, 3 * dm}, q.dtype(), q.backend_ptr());
          const Tensor* parts[3] = {&dq, &dk, &dv};
          for (int j = 0; j < 3; ++j) {
            StridedCopyParams c;
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

// qkv_attention on x, w, bias of one dtype, recorded on x_g, w_g, b_g: the same tensors, or under autocast the f32
// ones they were lowered from (lower_operand), whose gradients then come back in f32 (widened products; the bias's
// column sums cast once).
static Tensor qkv_attention_of(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t heads,
                               const AttentionParams& p, const Tensor& segment_ids, const Tensor& x_g,
                               const Tensor& w_g, const Tensor& b_g) {
  DEW_CHECK(x.ndim() == 3, "qkv_attention: x must be [B, T, D], got ", shape_str(x.shape()));
  const int64_t b = x.shape()[0], t = x.shape()[1], din = x.shape()[2], rows = b * t;
  DEW_CHECK(heads > 0 && w.ndim() == 2 && w.shape()[1] == din && w.shape()[0] % (3 * heads) == 0,
            "qkv_attention: weight must be [3 * ", heads, " * head_dim, ", din, "], got ", shape_str(w.shape()));
  const int64_t dm = w.shape()[0] / 3, hd = dm / heads;
  DEW_CHECK(!bias.defined() || bias.shape() == Shape({3 * dm}), "qkv_attention: bias must be [", 3 * dm, "], got ",
            shape_str(bias.defined() ? bias.shape() : Shape{}));
  DEW_CHECK(w.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
            "qkv_attention: x, weight and bias must have one dtype");
  detail::check_same_backend(x, w, "qkv_attention");
  if (bias.defined()) detail::check_same_backend(x, bias, "qkv_attention");
  detail::KernelCall be = detail::kernels(x);
  const Tensor xd = x.detach().reshape({rows, din}), wd = w.detach(), bd = bias.defined() ? bias.detach() : Tensor();
  Tensor parts[3];
  {
    detail::OperandReuse reuse(x, true);  // the three projections read x
    for (int j = 0; j < 3; ++j) {
      parts[j] = Tensor::empty({b, t, heads, hd}, x.dtype(), x.backend_ptr());
      MatmulParams mp;
      mp.m = rows;
      mp.n = dm;
      mp.k = din;
      mp.trans_b = true;
      be.matmul(xd, wd.slice0(j * dm, (j + 1) * dm), bd.defined() ? bd.slice0(j * dm, (j + 1) * dm) : Tensor(),
                parts[j], mp);
    }
  }
  Tensor out = Tensor::empty({b, t, heads, hd}, x.dtype(), x.backend_ptr());
  Tensor lse = Tensor::empty({b, heads, t}, stat_dtype(x), x.backend_ptr());
  const Tensor seg = segment_ids.defined() ? segment_ids.detach() : Tensor();
  be.attention(parts[0], parts[1], parts[2], seg, out, lse, p);
  Tensor y = out.reshape({b, t, dm});
  if (needs_grad({&x_g, &w_g, &b_g})) {
    const Tensor q = parts[0], k = parts[1], v = parts[2], od = out;
    const bool gx = needs_grad({&x_g}), gw = needs_grad({&w_g}), gb = needs_grad({&b_g});
    const DType tx = x_g.dtype(), tw = w_g.dtype(), tb = gb ? b_g.dtype() : x.dtype();
    const Shape xs = x.shape();
    record(
        y, {x_g, w_g, b_g},
        [xd, wd, q, k, v, seg, od, lse, p, xs, rows, din, dm, gx, gw, gb, tx, tw, tb](const Tensor& g) {
          detail::KernelCall bk = detail::kernels(xd);
          Tensor dparts[3];
          for (int j = 0; j < 3; ++j) dparts[j] = Tensor::empty(q.shape(), q.dtype(), q.backend_ptr());
          bk.attention_backward(q, k, v, seg, od, lse, g.reshape(q.shape()), dparts[0], dparts[1], dparts[2], p);
          Tensor dx, dw, db;
          if (gx) dx = Tensor::empty({rows, din}, tx, xd.backend_ptr());  // f32 for a lowered x: widened products
          if (gw) dw = Tensor::empty(wd.shape(), tw, wd.backend_ptr());
          {
            // each of dq, dk, dv is read by its two products, x by the three dW_j: one bracket, part by part, so the
            // backend's table of operands (4 on cpu) still holds x and the part when their second reader comes
            detail::OperandReuse reuse(xd, gx || gw);
            for (int j = 0; j < 3; ++j) {
              const Tensor dpart = dparts[j].reshape({rows, dm});
              if (gw) {  // dW_j = d_j^T x
                Tensor block = dw.slice0(j * dm, (j + 1) * dm);
                MatmulParams mp;
                mp.m = dm;
                mp.n = din;
                mp.k = rows;
                mp.trans_a = true;
                bk.matmul(dpart, xd, Tensor(), block, mp);
              }
              if (gx) {  // dx = dq Wq + dk Wk + dv Wv
                MatmulParams mp;
                mp.m = rows;
                mp.n = din;
                mp.k = dm;
                mp.beta = j == 0 ? 0.0f : 1.0f;
                bk.matmul(dpart, wd.slice0(j * dm, (j + 1) * dm), Tensor(), dx, mp);
              }
            }
          }
          if (gx) dx = dx.reshape(xs);
          if (gb) {
            db = Tensor::empty({3 * dm}, xd.dtype(), xd.backend_ptr());
            for (int j = 0; j < 3; ++j) {  // db_j = column sums of d_j
              Tensor block = db.slice0(j * dm, (j + 1) * dm);
              ReduceParams rp;
              rp.op = ReduceOp::sum;
              rp.outer = 1;
              rp.reduce = rows;
              rp.inner = dm;
              bk.reduce(dparts[j], block, rp);
            }
            db = cast(db, tb);
          }
          return std::vector<Tensor>{dx, dw, db};
        },
        "qkv_attention");
  }
  return y;
}

Tensor qkv_attention(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t heads, const AttentionParams& p,
                     const Tensor& segment_ids) {
  detail::mark_step_opaque();  // direct calls below
  return qkv_attention_of(detail::lower_operand(x), detail::lower_operand(w), detail::lower_operand(bias), heads, p,
                          segment_ids, x, w, bias);
}

// ---------------------------------------------------------------- linear_cross_entropy

int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t vocab, const LinearCrossEntropyOptions& o) {
  DEW_USAGE_CHECK(o.chunk_rows >= 0 && o.chunk_mb > 0, "linear_cross_entropy: chunk_rows must be >= 0 and chunk_mb > 0",
                  " (got ", o.chunk_rows, ", ", o.chunk_mb, ")");
  const int64_t fit = int64_t(o.chunk_mb * 1048576.0 / (4.0 * double(std::max<int64_t>(vocab, 1))));
  const int64_t most = std::clamp<int64_t>(o.chunk_rows > 0 ? o.chunk_rows : fit, 1, std::max<int64_t>(rows, 1));
  // as few chunks as `most` allows, of equal rows: no short last chunk, whose products run far below the others'
  // rate (2,048 rows of a 50,304-token head: 7 chunks of 293 rows, not 6 of 333 and one of 50)
  const int64_t chunks = (std::max<int64_t>(rows, 1) + most - 1) / most;
  return (std::max<int64_t>(rows, 1) + chunks - 1) / chunks;
}

namespace {

// What linear_cross_entropy and linear_token_logprobs share: h [N, D] and w [V, D] checked and detached, the dtypes,
// and the two halves of a chunk's work.
//   logits(r0, r1): z = h_c w^T in the products' dtype (widened to f32 for a half dtype, as the causal transformer's
//     head does) and zc = softcap(z) (zc is z without a softcap).
//   backward(chunk, dloss_c): dzc = cross_entropy_backward(zc) over zc, dz = softcap's backward over z (the kernels'
//     contract allows both in place: one [rows, V] chunk alive, two with a softcap), then dh_c = dz w into its rows
//     of dh and dw += dz^T h_c (beta = 1 after the first chunk; a half dtype's chunk products widened and summed in
//     f32 into dw, rounded once by the caller).
struct LinearHead {
  struct Chunk {
    int64_t r0, r1;
    Tensor z, zc;
  };
  LinearHead(const char* op, const Tensor& h, const Tensor& w, const Tensor& targets, float softcap)
      : be(detail::kernels(h)), cap{UnaryOp::softcap, softcap, 0.0f} {
    DEW_CHECK(h.ndim() == 2 && w.ndim() == 2 && h.shape()[1] == w.shape()[1], op, ": h must be [N, D] and w [V, D], ",
              "got ", shape_str(h.shape()), " and ", shape_str(w.shape()));
    DEW_CHECK(is_floating(h.dtype()) && h.dtype() == w.dtype(), op, ": h and w must have one float dtype, got ",
              dtype_name(h.dtype()), " and ", dtype_name(w.dtype()));
    DEW_CHECK(targets.dtype() == DType::i32 && targets.ndim() == 1 && targets.shape()[0] == h.shape()[0], op,
              ": targets must be i32 [", h.shape()[0], "], got ", dtype_name(targets.dtype()), " ",
              shape_str(targets.shape()));
    DEW_CHECK(softcap >= 0.0f, op, ": softcap must be >= 0, got ", softcap);
    detail::check_same_backend(h, w, op);
    detail::check_same_backend(h, targets, op);
    hd = h.detach();
    wd = w.detach();
    n = h.shape()[0];
    d = h.shape()[1];
    v = w.shape()[0];
    dt = h.dtype();
    lt = dt == DType::f64 ? DType::f64 : DType::f32;
    half = dt != lt;
  }
  Chunk logits(int64_t r0, int64_t r1) {
    const BackendPtr& bp = hd.backend_ptr();
    Chunk c{r0, r1, Tensor::empty({r1 - r0, v}, dt, bp), Tensor()};
    MatmulParams mp;
    mp.m = r1 - r0;
    mp.n = v;
    mp.k = d;
    mp.trans_b = true;
    be.matmul(hd.slice0(r0, r1), wd, Tensor(), c.z, mp);
    if (half) {
      Tensor wide = Tensor::empty({r1 - r0, v}, lt, bp);
      be.cast(c.z, wide);
      c.z = wide;
    }
    c.zc = c.z;
    if (cap.alpha > 0.0f) {
      c.zc = Tensor::empty({r1 - r0, v}, lt, bp);
      be.unary(c.z, c.zc, cap);
    }
    return c;
  }
  // The chunk's logits and its rows of cross_entropy (loss_c, lse_c), and its argmax rows into `predictions` [N]
  // when that is defined: the forward both fused heads share.
  Chunk scored(int64_t r0, int64_t r1, const Tensor& targets, const CrossEntropyParams& p, Tensor& loss_c,
               Tensor& lse_c, const Tensor& predictions) {
    Chunk c = logits(r0, r1);
    be.cross_entropy(c.zc, targets.slice0(r0, r1), loss_c, lse_c, p);
    if (predictions.defined()) {
      Tensor pc = predictions.slice0(r0, r1);
      be.argmax(c.zc, pc);
    }
    return c;
  }
  void backward(Chunk& c, const Tensor& targets_c, const Tensor& lse_c, const Tensor& dloss_c,
                const CrossEntropyParams& p, Tensor& dh, Tensor& dw) {
    const BackendPtr& bp = hd.backend_ptr();
    const int64_t m = c.r1 - c.r0;
    be.cross_entropy_backward(c.zc, targets_c, lse_c, dloss_c, c.zc, p);
    Tensor dz = c.zc;
    if (cap.alpha > 0.0f) {
      be.unary_backward(c.z, c.zc, c.z, cap);
      dz = c.z;
    }
    if (half) {
      Tensor narrow = Tensor::empty({m, v}, dt, bp);
      be.cast(dz, narrow);
      dz = narrow;
    }
    if (dh.defined()) {  // dh_c = dz w
      Tensor dhc = dh.slice0(c.r0, c.r1);
      MatmulParams mp;
      mp.m = m;
      mp.n = d;
      mp.k = v;
      be.matmul(dz, wd, Tensor(), dhc, mp);
    }
    if (dw.defined()) {  // dw += dz^T h_c
      const Tensor hc = hd.slice0(c.r0, c.r1);
      MatmulParams mp;
      mp.m = v;
      mp.n = d;
      mp.k = m;
      mp.trans_a = true;
      mp.beta = c.r0 == 0 ? 0.0f : 1.0f;  // a half dtype: the widened product, the chunks summed in f32
      be.matmul(dz, hc, Tensor(), dw, mp);
    }
  }
  // dh [N, D] in `dh_dtype` (the products' dtype, or f32 for an h autocast lowered: the widened product), dw [V, D] in
  // the logits' (f32 for a half dtype), those asked for.
  void gradients(bool gh, bool gw, DType dh_dtype, Tensor& dh, Tensor& dw) const {
    if (gh) dh = Tensor::empty({n, d}, dh_dtype, hd.backend_ptr());
    if (gw) dw = Tensor::empty({v, d}, lt, hd.backend_ptr());
  }
  detail::KernelCall be;
  UnaryParams cap;
  Tensor hd, wd;
  int64_t n = 0, d = 0, v = 0;
  DType dt = DType::f32, lt = DType::f32;  // the products' dtype; the logits', the loss's and lse's
  bool half = false;
};

}  // namespace

// Per chunk: the logits, the per-row losses and lse of cross_entropy, argmax when asked, and with a gradient the
// chunk's backward for dloss = 1 / divisor (the mean's g = 1). The backward multiplies dh and dw by g, unless g is 1
// on a host backend (a pass over [V, D] saved).
// Under autocast both heads compute on h and w lowered (lower_operand) and record the f32 h_graph and w_graph, whose
// gradients come back in f32 (dw summed over the chunks in f32 and never rounded to the half dtype).
static Tensor linear_cross_entropy_of(const Tensor& h, const Tensor& w, const Tensor& targets,
                                      const LinearCrossEntropyOptions& o, const Tensor& h_graph,
                                      const Tensor& w_graph) {
  LinearHead head("linear_cross_entropy", h, w, targets, o.softcap);
  const int64_t n = head.n, chunk = linear_cross_entropy_chunk_rows(n, head.v, o);
  const DType lt = head.lt;
  const BackendPtr& bp = h.backend_ptr();
  const bool gh = needs_grad({&h_graph}), gw = needs_grad({&w_graph});
  // The chunk gradients are formed before the loss scale arrives (the backward's g): in f16 their entries (about
  // softmax / tokens) would flush to zero, which is what f16-mixed's loss scale exists to prevent.
  DEW_CHECK(
      head.dt != DType::f16 || (!gh && !gw), "linear_cross_entropy: no gradient in f16 (the chunks' gradients ",
      "would underflow before the loss scale reaches them); use the unfused head, bf16, or linear_token_logprobs");
  const CrossEntropyParams cp{o.ignore_index};
  Tensor loss_rows = Tensor::empty({n}, lt, bp);
  Tensor predictions;
  if (o.predictions) predictions = Tensor::empty({n}, DType::i32, bp);
  const Tensor divisor = detail::cross_entropy_divisor(targets, o.ignore_index, lt);
  Tensor dloss, dh, dw;  // dloss [n]: 1 / divisor in every row
  if (gh || gw) {
    NoGradGuard no_grad;
    dloss = contiguous_copy(broadcast_to(div(Tensor::full({1}, 1.0, lt, bp), divisor), {n}));
    head.gradients(gh, gw, h_graph.dtype(), dh, dw);
  }
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t r1 = std::min(n, r0 + chunk);
    Tensor lse = Tensor::empty({r1 - r0}, lt, bp), loss_c = loss_rows.slice0(r0, r1);
    LinearHead::Chunk c = head.scored(r0, r1, targets, cp, loss_c, lse, predictions);
    if (gh || gw) head.backward(c, targets.slice0(r0, r1), lse, dloss.slice0(r0, r1), cp, dh, dw);
  }
  if (o.predictions) *o.predictions = predictions;
  Tensor out;
  {
    NoGradGuard no_grad;
    out = div(sum(loss_rows), divisor);
  }
  if (gh || gw) {
    const DType dt = w_graph.dtype();
    record(
        out, {h_graph, w_graph},
        [dh, dw, dt](const Tensor& g) {
          const bool one = g.backend().host_accessible() && g.numel() == 1 && g.item() == 1.0;
          Tensor dhs = dh, dws = dw;
          if (!one) {
            if (dhs.defined()) dhs = mul(dhs, cast(g.reshape({1}), dhs.dtype()));
            if (dws.defined()) dws = mul(dws, cast(g.reshape({1}), dws.dtype()));
          }
          if (dws.defined() && dws.dtype() != dt) dws = cast(dws, dt);  // a half w's f32 sum, rounded once
          return std::vector<Tensor>{dhs, dws};
        },
        "linear_cross_entropy");
  }
  return out;
}

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                            const LinearCrossEntropyOptions& o) {
  detail::mark_step_opaque();  // direct calls below
  return linear_cross_entropy_of(detail::lower_operand(h), detail::lower_operand(w), targets, o, h, w);
}

// Forward: per chunk the logits and cross_entropy's rows (logp = -loss; lse kept, N numbers). Backward, with the
// rows' incoming gradients g: per chunk the logits again and the chunk's backward for dloss = -g.
static Tensor linear_token_logprobs_of(const Tensor& h, const Tensor& w, const Tensor& targets,
                                       const LinearCrossEntropyOptions& o, const Tensor& h_graph,
                                       const Tensor& w_graph) {
  auto head = std::make_shared<LinearHead>("linear_token_logprobs", h, w, targets, o.softcap);
  const int64_t n = head->n, chunk = linear_cross_entropy_chunk_rows(n, head->v, o);
  const BackendPtr& bp = h.backend_ptr();
  const CrossEntropyParams cp{o.ignore_index};
  Tensor loss_rows = Tensor::empty({n}, head->lt, bp), lse = Tensor::empty({n}, head->lt, bp);
  Tensor predictions;
  if (o.predictions) predictions = Tensor::empty({n}, DType::i32, bp);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t r1 = std::min(n, r0 + chunk);
    Tensor loss_c = loss_rows.slice0(r0, r1), lse_c = lse.slice0(r0, r1);
    head->scored(r0, r1, targets, cp, loss_c, lse_c, predictions);
  }
  if (o.predictions) *o.predictions = predictions;
  Tensor out;
  {
    NoGradGuard no_grad;
    out = neg(loss_rows);
  }
  const bool gh = needs_grad({&h_graph}), gw = needs_grad({&w_graph});
  if (gh || gw) {
    const DType dh_dtype = h_graph.dtype(), dw_dtype = w_graph.dtype();
    record(
        out, {h_graph, w_graph},
        [head, targets, lse, cp, chunk, gh, gw, dh_dtype, dw_dtype](const Tensor& g) {
          NoGradGuard no_grad;
          const Tensor dloss = contiguous_copy(neg(cast(g, head->lt)));
          Tensor dh, dw;
          head->gradients(gh, gw, dh_dtype, dh, dw);
          for (int64_t r0 = 0; r0 < head->n; r0 += chunk) {
            const int64_t r1 = std::min(head->n, r0 + chunk);
            LinearHead::Chunk c = head->logits(r0, r1);
            head->backward(c, targets.slice0(r0, r1), lse.slice0(r0, r1), dloss.slice0(r0, r1), cp, dh, dw);
          }
          if (dw.defined() && dw.dtype() != dw_dtype) dw = cast(dw, dw_dtype);  // a half w's f32 sum, rounded once
          return std::vector<Tensor>{dh, dw};
        },
        "linear_token_logprobs");
  }
  return out;
}

Tensor linear_token_logprobs(const Tensor& h, const Tensor& w, const Tensor& targets,
                             const LinearCrossEntropyOptions& o) {
  detail::mark_step_opaque();  // direct calls below
  return linear_token_logprobs_of(detail::lower_operand(h), detail::lower_operand(w), targets, o, h, w);
}

}  // namespace dew
