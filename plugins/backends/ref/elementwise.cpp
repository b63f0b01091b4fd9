// elementwise.cpp — unary ops and their derivatives (and a derivative with its column sums), the gated
// activation act(gate) * up and its derivatives, the gated residual x + gate * f and its derivatives,
// broadcasting binary ops, reductions and argmax.
// The gated activation rounds as the unfused ops do (act(gate) and dy * up stored in the dtype before the
// next product), so a model that called unary + mul gives the same bits on ref (tests/models' fixtures).
// Invariants: every element is computed in double and rounded once to the output type; out may alias
// an input of the same shape (each element is read before it is written); NaN propagates through
// maximum/minimum/max/min/clamp/relu; argmax returns the first maximum (the first NaN, if any).
#include <algorithm>
#include <limits>
#include <numbers>

#include "dew/kernel_contracts.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluTanhC = 0.044715;

double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

double unary_value(UnaryOp op, double x, double alpha, double beta) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return std::log(x);
    case UnaryOp::sqrt:
      return std::sqrt(x);
    case UnaryOp::rsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryOp::square:
      return x * x;
    case UnaryOp::abs:
      return std::fabs(x);
    case UnaryOp::tanh:
      return std::tanh(x);
    case UnaryOp::sigmoid:
      return sigmoid(x);
    case UnaryOp::relu:
      return std::isnan(x) ? x : std::max(x, 0.0);
    case UnaryOp::gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
    case UnaryOp::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluTanhC * x * x * x)));
    case UnaryOp::silu:
      return x * sigmoid(x);
    case UnaryOp::sin:
      return std::sin(x);
    case UnaryOp::cos:
      return std::cos(x);
    case UnaryOp::reciprocal:
      return 1.0 / x;
    case UnaryOp::affine:
      return alpha * x + beta;
    case UnaryOp::pow:
      return std::pow(x, alpha);
    case UnaryOp::clamp:
      return std::isnan(x) ? x : std::min(std::max(x, alpha), beta);
    case UnaryOp::softcap:
      return alpha * std::tanh(x / alpha);
  }
  DEW_CHECK(false, "ref.unary: unknown op ", int(op));
  return 0;
}

// d op(x) / dx.
double unary_derivative(UnaryOp op, double x, double alpha, double beta) {
  switch (op) {
    case UnaryOp::neg:
      return -1.0;
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return 1.0 / x;
    case UnaryOp::sqrt:
      return 0.5 / std::sqrt(x);
    case UnaryOp::rsqrt:
      return -0.5 / (x * std::sqrt(x));
    case UnaryOp::square:
      return 2.0 * x;
    case UnaryOp::abs:
      return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0);
    case UnaryOp::tanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    case UnaryOp::sigmoid: {
      const double s = sigmoid(x);
      return s * (1.0 - s);
    }
    case UnaryOp::relu:
      return x > 0 ? 1.0 : 0.0;
    case UnaryOp::gelu: {  // Phi(x) + x * phi(x)
      const double cdf = 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2));
      const double pdf = std::exp(-0.5 * x * x) * (std::numbers::inv_sqrtpi / std::numbers::sqrt2);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const double t = std::tanh(kSqrt2OverPi * (x + kGeluTanhC * x * x * x));
      const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluTanhC * x * x);
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
    }
    case UnaryOp::silu: {
      const double s = sigmoid(x);
      return s * (1.0 + x * (1.0 - s));
    }
    case UnaryOp::sin:
      return std::cos(x);
    case UnaryOp::cos:
      return -std::sin(x);
    case UnaryOp::reciprocal:
      return -1.0 / (x * x);
    case UnaryOp::affine:
      return alpha;
    case UnaryOp::pow:
      return alpha == 0.0 ? 0.0 : alpha * std::pow(x, alpha - 1.0);
    case UnaryOp::clamp:
      return (x > alpha && x < beta) ? 1.0 : 0.0;
    case UnaryOp::softcap: {
      const double t = std::tanh(x / alpha);
      return 1.0 - t * t;
    }
  }
  DEW_CHECK(false, "ref.unary_backward: unknown op ", int(op));
  return 0;
}

bool is_comparison(BinaryOp op) { return op == BinaryOp::eq || op == BinaryOp::gt || op == BinaryOp::lt; }

double binary_value(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    case BinaryOp::div:
      return a / b;
    case BinaryOp::maximum:
      return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
    case BinaryOp::minimum:
      return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : std::min(a, b);
    case BinaryOp::eq:
      return a == b ? 1.0 : 0.0;
    case BinaryOp::gt:
      return a > b ? 1.0 : 0.0;
    case BinaryOp::lt:
      return a < b ? 1.0 : 0.0;
  }
  DEW_CHECK(false, "ref.binary: unknown op ", int(op));
  return 0;
}


}  // namespace

// ---------------------------------------------------------------- unary

void RefBackend::unary(const Tensor& x, Tensor& out, const UnaryParams& p) {
  dispatch_float(x.dtype(), Kernel::unary, [&](auto tag) {
    using T = typename decltype(tag)::type;
    expect(out, x.dtype(), x.numel(), Kernel::unary, "out");
    const T* xs = x.data_as<T>();
    T* o = out.data_as<T>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = T(unary_value(p.op, double(xs[i]), p.alpha, p.beta));
  });
}

void RefBackend::unary_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p) {
  dispatch_float(x.dtype(), Kernel::unary_backward, [&](auto tag) {
    using T = typename decltype(tag)::type;
    expect(dy, x.dtype(), x.numel(), Kernel::unary_backward, "dy");
    expect(dx, x.dtype(), x.numel(), Kernel::unary_backward, "dx");
    const T* xs = x.data_as<T>();
    const T* g = dy.data_as<T>();
    T* o = dx.data_as<T>();
    for (int64_t i = 0; i < x.numel(); ++i)
      o[i] = T(double(g[i]) * unary_derivative(p.op, double(xs[i]), p.alpha, p.beta));
  });
}

// unary_backward's dx, then its column sums in double, row by row (reduce's order).
void RefBackend::unary_backward_sum(const Tensor& x, const Tensor& dy, Tensor& dx, Tensor& dsum, const UnaryParams& p) {
  contracts::check_unary_backward_sum("ref.unary_backward_sum", x, dy, dx, dsum);
  unary_backward(x, dy, dx, p);
  dispatch_float(x.dtype(), Kernel::unary_backward_sum, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t d = contracts::last_dim(x), rows = contracts::rows_of(x);
    const T* o = dx.data_as<T>();
    T* s = dsum.data_as<T>();
    std::vector<double> acc(size_t(d), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < d; ++j) acc[size_t(j)] += double(o[r * d + j]);
    for (int64_t j = 0; j < d; ++j) s[j] = T(acc[size_t(j)]);
  });
}

// ---------------------------------------------------------------- gated activation

namespace {

// The unary op computing an activation (Activation::none is the identity).
UnaryOp unary_of(Activation act) {
  switch (act) {
    case Activation::relu:
      return UnaryOp::relu;
    case Activation::gelu:
      return UnaryOp::gelu;
    case Activation::gelu_tanh:
      return UnaryOp::gelu_tanh;
    case Activation::silu:
      return UnaryOp::silu;
    case Activation::none:
      break;
  }
  DEW_CHECK(false, "ref.gated_activation: unknown activation ", int(act));
  return UnaryOp::neg;
}
double act_value(Activation act, double x) { return act == Activation::none ? x : unary_value(unary_of(act), x, 1, 0); }
double act_derivative(Activation act, double x) {
  return act == Activation::none ? 1.0 : unary_derivative(unary_of(act), x, 1, 0);
}

}  // namespace

void RefBackend::gated_activation(const Tensor& gate, const Tensor& up, Tensor& out, Activation act) {
  contracts::check_gated("ref.gated_activation", gate, {{&up, "up"}, {&out, "out"}});
  dispatch_float(gate.dtype(), Kernel::gated_activation, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = gate.data_as<T>();
    const T* u = up.data_as<T>();
    T* o = out.data_as<T>();
    for (int64_t i = 0; i < gate.numel(); ++i) o[i] = T(double(T(act_value(act, double(g[i])))) * double(u[i]));
  });
}

void RefBackend::gated_activation_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                                           Tensor& dup, Activation act) {
  contracts::check_gated("ref.gated_activation_backward", gate,
                         {{&up, "up"}, {&dy, "dy"}, {&dgate, "dgate"}, {&dup, "dup"}});
  dispatch_float(gate.dtype(), Kernel::gated_activation_backward, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = gate.data_as<T>();
    const T* u = up.data_as<T>();
    const T* d = dy.data_as<T>();
    T* dg = dgate.data_as<T>();
    T* du = dup.data_as<T>();
    for (int64_t i = 0; i < gate.numel(); ++i) {
      const double v = double(g[i]), dd = double(d[i]), uu = double(u[i]);
      const double da = double(T(dd * uu)), a = double(T(act_value(act, v)));  // the unfused ops' roundings
      dg[i] = T(da * act_derivative(act, v));
      du[i] = T(dd * a);
    }
  });
}

// ---------------------------------------------------------------- gated residual

// y = x + gate[g] * f with the unfused ops' roundings (the product rounded to T, then the sum); the backward's
// gate gradient sums the rounded products dy * f of each group's rows in double, row by row, as reduce does.
void RefBackend::gated_residual(const Tensor& x, const Tensor& f, const Tensor& gate, Tensor& y) {
  const int64_t per = contracts::gated_residual_group("ref.gated_residual", f, gate, {{&x, "x"}, {&y, "y"}}, {});
  dispatch_float(f.dtype(), Kernel::gated_residual, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = x.data_as<T>();
    const T* fs = f.data_as<T>();
    const T* g = gate.data_as<T>();
    T* o = y.data_as<T>();
    const int64_t d = gate.shape()[1];
    for (int64_t i = 0; i < f.numel(); ++i) {
      const int64_t gi = (i / d) / per;
      o[i] = T(double(xs[i]) + double(T(double(fs[i]) * double(g[gi * d + i % d]))));
    }
  });
}

void RefBackend::gated_residual_backward(const Tensor& f, const Tensor& gate, const Tensor& dy, Tensor& df,
                                         Tensor& dgate) {
  const int64_t per = contracts::gated_residual_group("ref.gated_residual_backward", f, gate,
                                                      {{&dy, "dy"}, {&df, "df"}}, {{&dgate, "dgate"}});
  dispatch_float(f.dtype(), Kernel::gated_residual_backward, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* fs = f.data_as<T>();
    const T* g = gate.data_as<T>();
    const T* d = dy.data_as<T>();
    T* o = df.data_as<T>();
    T* dg = dgate.data_as<T>();
    const int64_t groups = gate.shape()[0], dim = gate.shape()[1];
    std::vector<double> acc(static_cast<size_t>(dim));
    for (int64_t gi = 0; gi < groups; ++gi) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t r = gi * per; r < (gi + 1) * per; ++r)
        for (int64_t j = 0; j < dim; ++j) {
          const int64_t i = r * dim + j;
          acc[size_t(j)] += double(T(double(d[i]) * double(fs[i])));
          o[i] = T(double(d[i]) * double(g[gi * dim + j]));
        }
      for (int64_t j = 0; j < dim; ++j) dg[gi * dim + j] = T(acc[size_t(j)]);
    }
  });
}

// ---------------------------------------------------------------- binary

void RefBackend::binary(const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  dispatch_float(a.dtype(), Kernel::binary, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DEW_CHECK(b.dtype() == a.dtype(), "ref.binary: a is ", dtype_name(a.dtype()), ", b is ", dtype_name(b.dtype()));
    // Comparisons may write any dtype; arithmetic writes a's dtype.
    DEW_CHECK(is_comparison(op) || out.dtype() == a.dtype(), "ref.binary: out is ", dtype_name(out.dtype()),
              ", inputs are ", dtype_name(a.dtype()));
    const Shape& shape = out.shape();
    DEW_CHECK(shape.size() <= 8, "ref.binary: out ", shape_str(shape), " has more than 8 axes");
    const std::vector<int64_t> sa = contracts::broadcast_strides("ref.binary", a.shape(), shape);
    const std::vector<int64_t> sb = contracts::broadcast_strides("ref.binary", b.shape(), shape);
    const T* pa = a.data_as<T>();
    const T* pb = b.data_as<T>();
    const size_t r = shape.size();
    std::vector<int64_t> idx(r, 0);
    for (int64_t i = 0; i < out.numel(); ++i) {
      int64_t ia = 0, ib = 0;
      for (size_t d = 0; d < r; ++d) {
        ia += idx[d] * sa[d];
        ib += idx[d] * sb[d];
      }
      store_any(out.dtype(), out.data(), i, binary_value(op, double(pa[ia]), double(pb[ib])));
      for (size_t d = r; d-- > 0;) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  });
}

// ---------------------------------------------------------------- reduce, argmax

// The definition of the group: reduce per tensor.
void RefBackend::sum_squares_group(const std::vector<Tensor>& xs, Tensor& out) {
  sum_squares_each_reduce(*this, xs, out);
}

void RefBackend::reduce(const Tensor& x, Tensor& out, const ReduceParams& p) {
  dispatch_float(x.dtype(), Kernel::reduce, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DEW_CHECK(p.outer >= 0 && p.reduce >= 0 && p.inner >= 0 && x.numel() == p.outer * p.reduce * p.inner,
              "ref.reduce: x ", shape_str(x.shape()), " is not [", p.outer, ", ", p.reduce, ", ", p.inner, "]");
    expect(out, x.dtype(), p.outer * p.inner, Kernel::reduce, "out");
    DEW_CHECK(p.reduce > 0 || (p.op != ReduceOp::max && p.op != ReduceOp::min),
              "ref.reduce: max/min over an empty axis");
    const T* xs = x.data_as<T>();
    T* o = out.data_as<T>();
    for (int64_t a = 0; a < p.outer; ++a) {
      for (int64_t c = 0; c < p.inner; ++c) {
        double acc = 0;
        for (int64_t r = 0; r < p.reduce; ++r) {
          const double v = double(xs[(a * p.reduce + r) * p.inner + c]);
          switch (p.op) {
            case ReduceOp::sum:
            case ReduceOp::mean:
              acc += v;
              break;
            case ReduceOp::sumsq:
              acc += v * v;
              break;
            case ReduceOp::max:  // NaN wins and stays
              if (r == 0 || std::isnan(v) || (!std::isnan(acc) && v > acc)) acc = v;
              break;
            case ReduceOp::min:
              if (r == 0 || std::isnan(v) || (!std::isnan(acc) && v < acc)) acc = v;
              break;
          }
        }
        if (p.op == ReduceOp::mean) acc /= double(p.reduce);
        o[a * p.inner + c] = T(acc);
      }
    }
  });
}

void RefBackend::argmax(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), Kernel::argmax, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DEW_CHECK(x.ndim() >= 1 && x.size(-1) > 0, "ref.argmax: x ", shape_str(x.shape()), " has no last axis to scan");
    const int64_t D = x.size(-1), rows = x.numel() / D;
    expect(out, DType::i32, rows, Kernel::argmax, "out");
    const T* xs = x.data_as<T>();
    int32_t* o = out.data_as<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = xs + r * D;
      int64_t best = 0;
      for (int64_t j = 1; j < D && !std::isnan(row[best]); ++j)
        if (std::isnan(row[j]) || row[j] > row[best]) best = j;
      o[r] = int32_t(best);
    }
  });
}

}  // namespace dew::ref
