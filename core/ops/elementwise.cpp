// core/ops/elementwise.cpp — differentiable unary and binary elementwise ops (numpy broadcasting), and the
// gated activation act(gate) * up (one kernel each way; it saves gate and up, not the activation).
// Binary backward reduces each incoming gradient to its input's shape with sum_to.
#include "op_util.hpp"

namespace dew {

using namespace detail;

Shape detail::broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DEW_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
              " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

static Tensor binary_forward(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  check_same_backend(a, b, name);
  check_same_dtype(a, b, name);
  Tensor out = empty_as(a, broadcast_shapes(a.shape(), b.shape(), name));
  if (out.numel() > 0) kernels(a).binary(a, b, out, op);
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  if (autocast_differs(a, b)) return add(autocast_widen(a, b), autocast_widen(b, a));
  Tensor out = binary_forward(a, b, BinaryOp::add, "add");
  if (needs_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    record(
        out, {a, b},
        [sa, sb](const Tensor& g) {
          return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
        },
        "add");
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (autocast_differs(a, b)) return sub(autocast_widen(a, b), autocast_widen(b, a));
  Tensor out = binary_forward(a, b, BinaryOp::sub, "sub");
  if (needs_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    record(
        out, {a, b},
        [sa, sb](const Tensor& g) {
          return std::vector<Tensor>{sum_to(g, sa), sum_to(neg(g), sb)};
        },
        "sub");
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (autocast_differs(a, b)) return mul(autocast_widen(a, b), autocast_widen(b, a));
  Tensor out = binary_forward(a, b, BinaryOp::mul, "mul");
  if (needs_grad({&a, &b})) {
    const bool ga = needs_grad({&a}), gb = needs_grad({&b});
    // Each factor is kept only for the other's gradient (x * mask keeps the mask, not x).
    const Tensor ad = gb ? a.detach() : Tensor(), bd = ga ? b.detach() : Tensor();
    record(
        out, {a, b},
        [ad, bd, sa = a.shape(), sb = b.shape()](const Tensor& g) {
          return std::vector<Tensor>{bd.defined() ? sum_to(mul(g, bd), sa) : Tensor(),
                                     ad.defined() ? sum_to(mul(g, ad), sb) : Tensor()};
        },
        "mul");
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (autocast_differs(a, b)) return div(autocast_widen(a, b), autocast_widen(b, a));
  Tensor out = binary_forward(a, b, BinaryOp::div, "div");
  if (needs_grad({&a, &b})) {
    const bool gb = needs_grad({&b});
    Tensor bd = b.detach(), od = out.detach();
    Shape sa = a.shape();
    record(
        out, {a, b},
        [bd, od, sa, gb](const Tensor& g) {
          Tensor ga = div(g, bd);
          return std::vector<Tensor>{sum_to(ga, sa), gb ? sum_to(neg(mul(ga, od)), bd.shape()) : Tensor()};
        },
        "div");
  }
  return out;
}

static Tensor extremum(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  if (autocast_differs(a, b)) return extremum(autocast_widen(a, b), autocast_widen(b, a), op, name);
  Tensor out = binary_forward(a, b, op, name);
  if (needs_grad({&a, &b})) {
    Tensor ad = a.detach(), bd = b.detach();
    const BinaryOp pick_a = op == BinaryOp::maximum ? BinaryOp::gt : BinaryOp::lt;
    record(
        out, {a, b},
        [ad, bd, pick_a](const Tensor& g) {
          Tensor mask_a = compare(ad, bd, pick_a);  // ties send the gradient to b
          Tensor ga = mul(g, mask_a);
          return std::vector<Tensor>{sum_to(ga, ad.shape()), sum_to(sub(g, ga), bd.shape())};
        },
        name);
  }
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(a, b, BinaryOp::maximum, "maximum"); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(a, b, BinaryOp::minimum, "minimum"); }

Tensor compare(const Tensor& a, const Tensor& b, BinaryOp op) {
  DEW_CHECK(op == BinaryOp::eq || op == BinaryOp::gt || op == BinaryOp::lt, "compare takes eq, gt or lt");
  if (autocast_differs(a, b)) return compare(autocast_widen(a, b), autocast_widen(b, a), op);
  return binary_forward(a.detach(), b.detach(), op, "compare");
}

Tensor unary(const Tensor& x, UnaryOp op, float alpha, float beta) {
  UnaryParams p{op, alpha, beta};
  Tensor out = empty_like(x);
  if (out.numel() > 0) kernels(x).unary(x, out, p);
  if (needs_grad({&x})) {
    Tensor xd = x.detach();
    record(
        out, {x},
        [xd, p](const Tensor& g) {
          Tensor dx = saved_values_expire(0, xd) ? xd : empty_like(xd);  // over x when nothing reads it after this
          if (dx.numel() > 0) kernels(xd).unary_backward(xd, g, dx, p);
          return std::vector<Tensor>{dx};
        },
        "unary");
  }
  return out;
}

Tensor neg(const Tensor& x) { return unary(x, UnaryOp::neg); }
Tensor exp(const Tensor& x) { return unary(x, UnaryOp::exp); }
Tensor log(const Tensor& x) { return unary(x, UnaryOp::log); }
Tensor sqrt(const Tensor& x) { return unary(x, UnaryOp::sqrt); }
Tensor rsqrt(const Tensor& x) { return unary(x, UnaryOp::rsqrt); }
Tensor square(const Tensor& x) { return unary(x, UnaryOp::square); }
Tensor abs(const Tensor& x) { return unary(x, UnaryOp::abs); }
Tensor tanh(const Tensor& x) { return unary(x, UnaryOp::tanh); }
Tensor sigmoid(const Tensor& x) { return unary(x, UnaryOp::sigmoid); }
Tensor relu(const Tensor& x) { return unary(x, UnaryOp::relu); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return unary(x, tanh_approximation ? UnaryOp::gelu_tanh : UnaryOp::gelu);
}
Tensor silu(const Tensor& x) { return unary(x, UnaryOp::silu); }
Tensor sin(const Tensor& x) { return unary(x, UnaryOp::sin); }
Tensor cos(const Tensor& x) { return unary(x, UnaryOp::cos); }
Tensor scale(const Tensor& x, float s) { return unary(x, UnaryOp::affine, s, 0.0f); }
Tensor add_scalar(const Tensor& x, float c) { return unary(x, UnaryOp::affine, 1.0f, c); }
Tensor pow(const Tensor& x, float p) { return unary(x, UnaryOp::pow, p); }
Tensor clamp(const Tensor& x, float lo, float hi) { return unary(x, UnaryOp::clamp, lo, hi); }
Tensor softcap(const Tensor& x, float cap) { return unary(x, UnaryOp::softcap, cap); }

Tensor activation(const Tensor& x, Activation act) { return act == Activation::none ? x : unary(x, unary_op_of(act)); }

Tensor gated_activation(const Tensor& gate, const Tensor& up, Activation act) {
  if (autocast_differs(gate, up)) return gated_activation(autocast_widen(gate, up), autocast_widen(up, gate), act);
  check_same_backend(gate, up, "gated_activation");
  check_same_dtype(gate, up, "gated_activation");
  DEW_CHECK(gate.shape() == up.shape(), "gated_activation: gate ", shape_str(gate.shape()), " and up ",
            shape_str(up.shape()), " differ in shape");
  Tensor out = empty_like(gate);
  if (out.numel() > 0) kernels(gate).gated_activation(gate, up, out, act);
  if (needs_grad({&gate, &up})) {
    Tensor gd = gate.detach(), ud = up.detach();
    record(
        out, {gate, up},
        [gd, ud, act](const Tensor& g) {
          // over gate and up when nothing reads them after this (the kernel allows it): no fresh buffers, and
          // the gradients are written into the lines just read
          Tensor dgate = saved_values_expire(0, gd) ? gd : empty_like(gd);
          Tensor dup = saved_values_expire(1, ud) ? ud : empty_like(ud);
          if (dgate.numel() > 0) kernels(gd).gated_activation_backward(gd, ud, g, dgate, dup, act);
          return std::vector<Tensor>{dgate, dup};
        },
        "gated_activation");
  }
  return out;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator*(const Tensor& a, float s) { return scale(a, s); }
Tensor operator*(float s, const Tensor& a) { return scale(a, s); }
Tensor operator+(const Tensor& a, float c) { return add_scalar(a, c); }
Tensor operator-(const Tensor& a) { return neg(a); }

// Under autocast the loss is computed in f32 (both operands widened).
Tensor mse(const Tensor& a, const Tensor& b) {
  if (autocast_enabled() && (a.dtype() != DType::f32 || b.dtype() != DType::f32) && a.dtype() != DType::f64)
    return mse(cast(a, DType::f32), cast(b, DType::f32));
  return mean(square(sub(a, b)));
}

}  // namespace dew
