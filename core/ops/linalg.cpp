// core/ops/linalg.cpp — matmul and linear, with their backward passes as further matmuls.
// Invariant: weights are [out, in] (PyTorch/Hugging Face Linear layout); linear flattens leading dims
// to rows so that dW is one [out, N] @ [N, in] product, never a batched sum. A backward product whose input
// already has a gradient gathered (accumulation_target, dew/autograd.hpp) adds into it with beta = 1 where the
// backend's beta adds the rounded product (the same bits as an add pass).
#include "op_util.hpp"

#include "dew/kernel_contracts.hpp"  // is_weight_only_matmul

namespace dew {

using namespace detail;

namespace {

struct MatmulShape {
  MatmulParams p;
  Shape out_shape;
};

MatmulShape plan_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  DEW_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "matmul: operands need at least 2 dims, got ", shape_str(a.shape()),
            " and ", shape_str(b.shape()));
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const int64_t ar = sa[sa.size() - 2], ac = sa.back(), br = sb[sb.size() - 2], bc = sb.back();
  MatmulShape r;
  MatmulParams& p = r.p;
  p.m = ta ? ac : ar;
  p.k = ta ? ar : ac;
  const int64_t kb = tb ? bc : br;
  p.n = tb ? br : bc;
  DEW_CHECK(p.k == kb, "matmul: inner dimensions differ: ", shape_str(sa), (ta ? "^T" : ""), " @ ", shape_str(sb),
            (tb ? "^T" : ""));
  p.trans_a = ta;
  p.trans_b = tb;
  Shape batch_a(sa.begin(), sa.end() - 2), batch_b(sb.begin(), sb.end() - 2);
  const int64_t na = numel_of(batch_a), nb = numel_of(batch_b);
  Shape batch;
  if (batch_b.empty() || nb == 1) {
    batch = batch_a;
  } else if (batch_a.empty() || na == 1) {
    batch = batch_b;
  } else {
    DEW_CHECK(batch_a == batch_b, "matmul: batch dims ", shape_str(batch_a), " and ", shape_str(batch_b), " differ");
    batch = batch_a;
  }
  p.batch = numel_of(batch);
  p.a_batch_stride = na > 1 ? ar * ac : 0;
  p.b_batch_stride = nb > 1 ? br * bc : 0;
  r.out_shape = batch;
  r.out_shape.push_back(p.m);
  r.out_shape.push_back(p.n);
  return r;
}

// op(a) op(b) (+ bias, act) into a fresh tensor of a's dtype, or of `out_dtype`: f32 for the widened product of half
// a and b (dew/kernel_contracts.hpp; no bias or activation), which product_gradient asks for.
Tensor matmul_raw(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias, Activation act,
                  DType out_dtype) {
  check_same_backend(a, b, "matmul");
  if (b.quantized()) {  // int8 decode weights: the backend's own kernel, or the f32 product of their values
    contracts::check_quantized_weight("matmul", b);
    DEW_CHECK(!ta && tb && a.dtype() == DType::f32, "matmul: a quantized weight takes linear()'s product (f32 x, "
              "the weight transposed)");
    if (!b.backend().supports(Kernel::matmul, DType::i8).ok)
      return matmul_raw(a, dequantize(b), ta, tb, bias, act, out_dtype);
  }
  DEW_CHECK(!a.quantized(), "matmul: a quantized tensor is a weight (the second operand of linear())");
  DEW_CHECK(a.panel_rows() == 0, "matmul: a weight in panels is the second operand of linear()");
  // Decode weights in panels (dew/tensor.hpp): linear()'s form, on the backend that asked for them.
  if (b.panel_rows() > 0)
    DEW_CHECK(!ta && tb && a.dtype() == DType::f32 && b.panel_rows() == b.backend().decode_panel_rows(b.dtype()),
              "matmul: a weight in panels of ", b.panel_rows(), " rows takes linear()'s product (f32 x, the ",
              "weight transposed) on the backend that laid it out");
  if (!contracts::is_weight_only_matmul(a, b)) check_same_dtype(a, b, "matmul");
  MatmulShape plan = plan_matmul(a, b, ta, tb);
  plan.p.act = act;
  Tensor out = Tensor::empty(plan.out_shape, out_dtype, a.backend_ptr());
  if (out.numel() == 0) return out;
  if (plan.p.k == 0) {
    kernels(a).fill(out, 0.0);
    return out;
  }
  kernels(a).matmul(a, b, bias, out, plan.p);
  return out;
}
// The product in a's dtype.
Tensor matmul_raw(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias, Activation act) {
  return matmul_raw(a, b, ta, tb, bias, act, a.dtype());
}

// A backward's product op(a) op(b) as the gradient of the node's input `input` (shaped `shape`): added into the
// sum the pass has already gathered for that input (accumulation_target, beta = 1) where the backend gives that
// the bits of the product and a separate add (Backend::matmul_beta_adds_rounded), else a fresh tensor. The
// gradients a tensor gets from several products (x from the q/k/v or gate/up projections, a weight over
// micro-batches) are then summed inside the products, with the same results.
// `want` is the input's dtype: a's, or f32 for an f32 input that autocast lowered (lower_operand, op_util.hpp):
// then the widened product (dew/kernel_contracts.hpp) stores its f32 accumulation as the gradient, a fresh tensor.
Tensor product_gradient(size_t input, const Tensor& a, const Tensor& b, bool ta, bool tb, const Shape& shape,
                        DType want) {
  if (want != a.dtype()) {
    DEW_INTERNAL_ASSERT(want == DType::f32 && is_half(a.dtype()) && !b.quantized() && b.panel_rows() == 0);
    return reshape(matmul_raw(a, b, ta, tb, Tensor(), Activation::none, want), shape);
  }
  Tensor target;
  if (a.backend().matmul_beta_adds_rounded(a.dtype()) && !b.quantized() && b.panel_rows() == 0)
    target = accumulation_target(input);
  if (!target.defined() || target.dtype() != a.dtype())
    return reshape(matmul_raw(a, b, ta, tb, Tensor(), Activation::none), shape);
  MatmulShape plan = plan_matmul(a, b, ta, tb);
  DEW_INTERNAL_ASSERT(numel_of(plan.out_shape) == target.numel());
  if (target.numel() == 0 || plan.p.k == 0) return target;
  plan.p.beta = 1.0f;
  Tensor out = reshape(target, plan.out_shape);
  kernels(a).matmul(a, b, Tensor(), out, plan.p);
  return target;
}

}  // namespace

// matmul's body: the product of a and b (one dtype), recorded as a node on `graph` (a and b themselves, or under
// autocast the f32 operands they were lowered from: lower_operand), whose gradients come back in its inputs' dtypes.
static Tensor matmul_of(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& ga_t, const Tensor& gb_t) {
  Tensor out = matmul_raw(a.detach(), b.detach(), ta, tb, Tensor(), Activation::none);
  if (needs_grad({&ga_t, &gb_t})) {
    Tensor ad = a.detach(), bd = b.detach();
    const bool ga = needs_grad({&ga_t}), gb = needs_grad({&gb_t});
    const DType wa = ga_t.dtype(), wb = gb_t.dtype();
    record(
        out, {ga_t, gb_t},
        [ad, bd, ta, tb, ga, gb, wa, wb](const Tensor& g) {
          Tensor da, db;
          OperandReuse reuse(g, ga && gb);
          if (ga && ad.ndim() == 2 && g.ndim() == 2) {
            da = ta ? product_gradient(0, bd, g, tb, true, ad.shape(), wa)     // (op(B) g^T) stored as [K, M]
                    : product_gradient(0, g, bd, false, !tb, ad.shape(), wa);  // g op(B)^T
          } else if (ga) {
            da = ta ? matmul_raw(bd, g, tb, true, Tensor(), Activation::none)
                    : matmul_raw(g, bd, false, !tb, Tensor(), Activation::none);
            da = cast(sum_to(da, ad.shape()), wa);
          }
          if (gb) {
            if (!ta && bd.ndim() == 2 && ad.ndim() > 2) {  // shared weight: fold the batch into rows
              Tensor a2 = reshape(ad, {-1, ad.shape().back()});
              Tensor g2 = reshape(g, {-1, g.shape().back()});
              db = tb ? product_gradient(1, g2, a2, true, false, bd.shape(), wb)
                      : product_gradient(1, a2, g2, true, false, bd.shape(), wb);
            } else if (bd.ndim() == 2 && g.ndim() == 2) {
              db = tb ? product_gradient(1, g, ad, true, ta, bd.shape(), wb)     // g^T op(A) stored as [N, K]
                      : product_gradient(1, ad, g, !ta, false, bd.shape(), wb);  // op(A)^T g
            } else {
              db = tb ? matmul_raw(g, ad, true, ta, Tensor(), Activation::none)     // g^T op(A) stored as [N, K]
                      : matmul_raw(ad, g, !ta, false, Tensor(), Activation::none);  // op(A)^T g
              db = cast(sum_to(db, bd.shape()), wb);
            }
          }
          return std::vector<Tensor>{da, db};
        },
        "matmul");
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return matmul_of(lower_operand(a), lower_operand(b), ta, tb, a, b);  // lowered under autocast, else a and b
}

// What a linear node records as its inputs: x, w and bias themselves, or under autocast the f32 tensors the
// computed ones were lowered from (lower_operand), whose gradients then come back in f32 (product_gradient's `want`;
// the bias's column sums cast once).
struct LinearGraph {
  const Tensor& x;
  const Tensor& w;
  const Tensor& bias;
};

// act(x W^T + b) recording one node, for a bias that needs its gradient: the backward's activation derivative and
// the bias gradient (its column sums) come out of one unary_backward_sum pass, where activation(linear(...))
// would read the derivative back for the bias's sum(g, 0). The same values as that composition
// (dew/kernel_table.hpp: dx as unary_backward, dsum as reduce sums).
static Tensor linear_activation_with_bias(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                                          const LinearGraph& graph) {
  const UnaryParams up{unary_op_of(act), 1.0f, 0.0f};
  Shape out_shape = x.shape();
  out_shape.back() = w.shape()[0];
  const Tensor x2 = reshape(x.detach(), {-1, x.shape().back()}), wd = w.detach();
  const Tensor pre = matmul_raw(x2, wd, false, true, bias.detach(), Activation::none);  // [rows, out]
  Tensor y = empty_like(pre);
  if (y.numel() > 0) kernels(pre).unary(pre, y, up);
  Tensor out = reshape(y, out_shape);
  const bool gx = needs_grad({&graph.x}), gw = needs_grad({&graph.w});
  const Shape xs = x.shape();
  const DType wx = graph.x.dtype(), ww = graph.w.dtype(), wb = graph.bias.dtype();
  record(
      out, {graph.x, graph.w, graph.bias},
      [x2, wd, pre, up, xs, gx, gw, wx, ww, wb](const Tensor& g) {
        const Tensor g2 = reshape(g, {-1, g.shape().back()});
        Tensor dpre = saved_values_expire(pre) ? pre : empty_like(pre);  // over pre: read here last
        Tensor db = Tensor::empty({pre.shape()[1]}, pre.dtype(), pre.backend_ptr());
        if (pre.numel() > 0)
          kernels(pre).unary_backward_sum(pre, g2, dpre, db, up);
        else if (db.numel() > 0)
          kernels(db).fill(db, 0.0);
        Tensor dx, dw;
        {
          OperandReuse reuse(dpre, gx && gw);
          if (gx) dx = product_gradient(0, dpre, wd, false, false, xs, wx);
          if (gw) dw = product_gradient(1, dpre, x2, true, false, wd.shape(), ww);
        }
        return std::vector<Tensor>{dx, dw, cast(db, wb)};
      },
      "linear");
  return out;
}

// linear's body on x, w, bias of one dtype, recorded on `graph` (see LinearGraph).
static Tensor linear_of(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                        const LinearGraph& graph) {
  DEW_CHECK(w.ndim() == 2, "linear: weight must be [out, in], got ", shape_str(w.shape()));
  DEW_CHECK(x.ndim() >= 1 && x.shape().back() == w.shape()[1], "linear: input ", shape_str(x.shape()),
            " does not match weight ", shape_str(w.shape()));
  DEW_CHECK(!bias.defined() || (bias.ndim() == 1 && bias.shape()[0] == w.shape()[0]), "linear: bias ",
            shape_str(bias.defined() ? bias.shape() : Shape{}), " does not match weight ", shape_str(w.shape()));
  const bool grad = needs_grad({&graph.x, &graph.w, &graph.bias});
  DEW_CHECK(!grad || !contracts::is_weight_only_matmul(x, w), "linear: f32 input against a ", dtype_name(w.dtype()),
            " weight is the decoding path (weight-only storage) and records no gradient");
  if (grad && act != Activation::none) {
    if (!needs_grad({&graph.bias}) || !x.backend().supports(Kernel::unary_backward_sum, x.dtype()).ok)
      return activation(linear_of(x, w, bias, Activation::none, graph), act);
    return linear_activation_with_bias(x, w, bias, act, graph);
  }

  Shape out_shape = x.shape();
  out_shape.back() = w.shape()[0];
  Tensor x2 = reshape(x.detach(), {-1, x.shape().back()});
  Tensor out =
      reshape(matmul_raw(x2, w.detach(), false, true, bias.defined() ? bias.detach() : Tensor(), act), out_shape);
  if (grad) {
    const bool gx = needs_grad({&graph.x}), gw = needs_grad({&graph.w}), gbias = needs_grad({&graph.bias});
    // Each operand is kept only for the other's gradient (a frozen weight's layer keeps no input).
    const Tensor wd = gx ? w.detach() : Tensor();
    if (!gw) x2 = Tensor();
    const DType wx = graph.x.dtype(), ww = graph.w.dtype(), wb = gbias ? graph.bias.dtype() : w.dtype();
    Shape xs = x.shape(), ws = w.shape();
    record(
        out, {graph.x, graph.w, graph.bias},
        [x2, wd, xs, ws, gx, gw, gbias, wx, ww, wb](const Tensor& g) {
          Tensor g2 = reshape(g, {-1, g.shape().back()});
          Tensor dx, dw, db;
          {
            OperandReuse reuse(g2, gx && gw);
            if (gx) dx = product_gradient(0, g2, wd, false, false, xs, wx);
            if (gw) dw = product_gradient(1, g2, x2, true, false, ws, ww);
          }
          if (gbias) db = cast(sum(g2, 0), wb);
          return std::vector<Tensor>{dx, dw, db};
        },
        "linear");
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act) {
  return linear_of(lower_operand(x), lower_operand(w), lower_operand(bias), act, LinearGraph{x, w, bias});
}

// The two products summed into one output under one node (add() of two linear() calls records three): its backward
// keeps x and h (and the weights), never a [rows, out] product.
Tensor linear_sum(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& h, const Tensor& v) {
  const Tensor lx = lower_operand(x), lw = lower_operand(w), lb = lower_operand(bias), lh = lower_operand(h),
               lv = lower_operand(v);
  DEW_CHECK(x.ndim() >= 1 && w.ndim() == 2 && x.shape().back() == w.shape()[1], "linear_sum: input ",
            shape_str(x.shape()), " does not match weight ", shape_str(w.shape()));
  DEW_CHECK(h.ndim() == x.ndim() && v.ndim() == 2 && h.shape().back() == v.shape()[1] && v.shape()[0] == w.shape()[0],
            "linear_sum: the second product's input ", shape_str(h.shape()), " and weight ", shape_str(v.shape()),
            " do not match the first's ", shape_str(x.shape()), ", ", shape_str(w.shape()));
  DEW_CHECK(x.numel() / x.shape().back() == h.numel() / h.shape().back(), "linear_sum: ", shape_str(x.shape()), " and ",
            shape_str(h.shape()), " have different rows");
  Shape out_shape = x.shape();
  out_shape.back() = w.shape()[0];
  const Tensor x2 = reshape(lx.detach(), {-1, x.shape().back()}), h2 = reshape(lh.detach(), {-1, h.shape().back()});
  Tensor out;
  {
    NoGradGuard no_grad;
    out = reshape(add(matmul_raw(x2, lw.detach(), false, true, lb.defined() ? lb.detach() : Tensor(), Activation::none),
                      matmul_raw(h2, lv.detach(), false, true, Tensor(), Activation::none)),
                  out_shape);
  }
  if (needs_grad({&x, &w, &bias, &h, &v})) {
    const Tensor wd = lw.detach(), vd = lv.detach();
    const bool gx = needs_grad({&x}), gw = needs_grad({&w}), gb = needs_grad({&bias}), gh = needs_grad({&h}),
               gv = needs_grad({&v});
    const DType tx = x.dtype(), tw = w.dtype(), tb = gb ? bias.dtype() : w.dtype(), th = h.dtype(), tv = v.dtype();
    const Shape xs = x.shape(), hs = h.shape();
    record(
        out, {x, w, bias, h, v},
        [x2, h2, wd, vd, xs, hs, gx, gw, gb, gh, gv, tx, tw, tb, th, tv](const Tensor& g) {
          const Tensor g2 = reshape(g, {-1, g.shape().back()});
          Tensor dx, dw, db, dh, dv;
          if (gx) dx = product_gradient(0, g2, wd, false, false, xs, tx);
          if (gw) dw = product_gradient(1, g2, x2, true, false, wd.shape(), tw);
          if (gb) db = cast(sum(g2, 0), tb);
          if (gh) dh = product_gradient(3, g2, vd, false, false, hs, th);
          if (gv) dv = product_gradient(4, g2, h2, true, false, vd.shape(), tv);
          return std::vector<Tensor>{dx, dw, db, dh, dv};
        },
        "linear_sum");
  }
  return out;
}

}  // namespace dew
