// tests/autograd/test_elementwise.cpp — gradient checks of the binary (with numpy broadcasting) and unary ops,
// and of the gated activation.
#include "gradcheck.hpp"

using namespace gc;
using dew::Tensor;

namespace {

using BinFn = Tensor (*)(const Tensor&, const Tensor&);

// The two broadcasting layouts of the brief, plus equal shapes: [3,4] with [4], [2,1,4] with [3,1],
// and [4] with [3,4] (broadcasting on the left operand). `positive_b` keeps b away from 0 (div).
void check_binary(BinFn op, const char* name, bool positive_b) {
  const std::vector<std::pair<dew::Shape, dew::Shape>> cases = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{4}, {3, 4}}};
  uint64_t seed = 10;
  for (const auto& [sa, sb] : cases) {
    Tensor a = rnd(sa, seed++, -1.5, 1.5);
    Tensor b = positive_b ? rnd_away(sb, seed++, 0.5, 1.5) : rnd(sb, seed++, -1.5, 1.5);
    gradcheck([op](const std::vector<Tensor>& x) { return op(x[0], x[1]); }, {a, b},
              std::string(name) + " " + dew::shape_str(sa) + " with " + dew::shape_str(sb));
  }
}

// maximum/minimum: values chosen so that no pair that meets under broadcasting is within 0.05 (no ties).
void check_extremum(BinFn op, const char* name) {
  {  // [3,4] with [4]: each a[i, j] meets b[j] only
    std::vector<double> b = {-0.6, -0.1, 0.3, 0.8};
    std::vector<double> a = rand_values(12, -1.0, 1.0, 77);
    for (size_t i = 0; i < a.size(); ++i) {
      std::vector<double> bj = {b[i % 4]};
      std::vector<double> one = {a[i]};
      nudge_away(one, bj, 0.05);
      a[i] = one[0];
    }
    gradcheck([op](const std::vector<Tensor>& x) { return op(x[0], x[1]); }, {f64(a, {3, 4}), f64(b, {4})},
              std::string(name) + " [3,4] with [4]");
  }
  {  // [2,1,4] with [3,1]: each a element meets all three b values
    std::vector<double> b = {-0.5, 0.0, 0.5};
    std::vector<double> a = rand_values(8, -1.0, 1.0, 78);
    nudge_away(a, b, 0.05);
    gradcheck([op](const std::vector<Tensor>& x) { return op(x[0], x[1]); }, {f64(a, {2, 1, 4}), f64(b, {3, 1})},
              std::string(name) + " [2,1,4] with [3,1]");
  }
}

using UnFn = std::function<Tensor(const Tensor&)>;
void check_unary(const UnFn& op, const std::string& name, const Tensor& x) {
  gradcheck([op](const std::vector<Tensor>& in) { return op(in[0]); }, {x}, name);
}

}  // namespace

TEST_CASE("gradcheck add (broadcasting)") { check_binary(dew::add, "add", false); }
TEST_CASE("gradcheck sub (broadcasting)") { check_binary(dew::sub, "sub", false); }
TEST_CASE("gradcheck mul (broadcasting)") { check_binary(dew::mul, "mul", false); }
TEST_CASE("gradcheck div (broadcasting)") { check_binary(dew::div, "div", true); }
TEST_CASE("gradcheck maximum (broadcasting)") { check_extremum(dew::maximum, "maximum"); }
TEST_CASE("gradcheck minimum (broadcasting)") { check_extremum(dew::minimum, "minimum"); }

TEST_CASE("gradcheck binary ops with one operand constant") {
  // Only a requires a gradient: b's slot must stay empty and a's gradient is still right.
  Tensor b = rnd_away({4}, 5, 0.5, 1.5);
  gradcheck([b](const std::vector<Tensor>& x) { return dew::div(dew::mul(x[0], b), b + 0.5f); }, {rnd({3, 4}, 6)},
            "mul/div by a constant");
  CHECK_FALSE(b.grad().defined());
  CHECK_FALSE(b.requires_grad());
}

TEST_CASE("gradcheck operators (+ - * / scalar)") {
  gradcheck(
      [](const std::vector<Tensor>& x) { return (x[0] + x[1]) * x[0] - x[1] / (x[0] * x[0] + 1.0f) * 0.5f + (-x[1]); },
      {rnd({2, 3}, 1), rnd({3}, 2)}, "operator expression");
}

TEST_CASE("gradcheck neg") {
  check_unary([](const Tensor& x) { return dew::neg(x); }, "neg", rnd({3, 5}, 20));
}
TEST_CASE("gradcheck exp") {
  check_unary([](const Tensor& x) { return dew::exp(x); }, "exp", rnd({3, 5}, 21, -2, 2));
}
TEST_CASE("gradcheck log (positive inputs)") {
  check_unary([](const Tensor& x) { return dew::log(x); }, "log", rnd({3, 5}, 22, 0.2, 3.0));
}
TEST_CASE("gradcheck sqrt (positive inputs)") {
  check_unary([](const Tensor& x) { return dew::sqrt(x); }, "sqrt", rnd({3, 5}, 23, 0.2, 3.0));
}
TEST_CASE("gradcheck rsqrt (positive inputs)") {
  check_unary([](const Tensor& x) { return dew::rsqrt(x); }, "rsqrt", rnd({3, 5}, 24, 0.2, 3.0));
}
TEST_CASE("gradcheck square") {
  check_unary([](const Tensor& x) { return dew::square(x); }, "square", rnd({3, 5}, 25));
}
TEST_CASE("gradcheck abs (away from 0)") {
  check_unary([](const Tensor& x) { return dew::abs(x); }, "abs", rnd_away({3, 5}, 26, 0.1, 2.0));
}
TEST_CASE("gradcheck tanh") {
  check_unary([](const Tensor& x) { return dew::tanh(x); }, "tanh", rnd({3, 5}, 27, -2, 2));
}
TEST_CASE("gradcheck sigmoid") {
  check_unary([](const Tensor& x) { return dew::sigmoid(x); }, "sigmoid", rnd({3, 5}, 28, -3, 3));
}
TEST_CASE("gradcheck relu (away from 0)") {
  check_unary([](const Tensor& x) { return dew::relu(x); }, "relu", rnd_away({3, 5}, 29, 0.1, 2.0));
}
TEST_CASE("gradcheck gelu (erf)") {
  check_unary([](const Tensor& x) { return dew::gelu(x, false); }, "gelu", rnd({3, 5}, 30, -3, 3));
}
TEST_CASE("gradcheck gelu_tanh") {
  check_unary([](const Tensor& x) { return dew::gelu(x, true); }, "gelu_tanh", rnd({3, 5}, 31, -3, 3));
}
TEST_CASE("gradcheck silu") {
  check_unary([](const Tensor& x) { return dew::silu(x); }, "silu", rnd({3, 5}, 32, -3, 3));
}
TEST_CASE("gradcheck sin") {
  check_unary([](const Tensor& x) { return dew::sin(x); }, "sin", rnd({3, 5}, 33, -3, 3));
}
TEST_CASE("gradcheck cos") {
  check_unary([](const Tensor& x) { return dew::cos(x); }, "cos", rnd({3, 5}, 34, -3, 3));
}
TEST_CASE("gradcheck reciprocal (unary op)") {
  check_unary([](const Tensor& x) { return dew::unary(x, dew::UnaryOp::reciprocal); }, "reciprocal",
              rnd_away({3, 5}, 35, 0.3, 2.0));
}
TEST_CASE("gradcheck scale") {
  check_unary([](const Tensor& x) { return dew::scale(x, -1.75f); }, "scale", rnd({3, 5}, 36));
}
TEST_CASE("gradcheck add_scalar") {
  check_unary([](const Tensor& x) { return dew::add_scalar(x, 0.625f); }, "add_scalar", rnd({3, 5}, 37));
}
TEST_CASE("gradcheck affine (unary op)") {
  check_unary([](const Tensor& x) { return dew::unary(x, dew::UnaryOp::affine, 1.5f, -0.25f); }, "affine",
              rnd({3, 5}, 38));
}
TEST_CASE("gradcheck pow") {
  check_unary([](const Tensor& x) { return dew::pow(x, 2.5f); }, "pow 2.5 (positive)", rnd({3, 5}, 39, 0.2, 2.0));
  check_unary([](const Tensor& x) { return dew::pow(x, 3.0f); }, "pow 3 (any sign)", rnd({3, 5}, 40, -2.0, 2.0));
  check_unary([](const Tensor& x) { return dew::pow(x, -1.5f); }, "pow -1.5", rnd({3, 5}, 41, 0.3, 2.0));
}
TEST_CASE("gradcheck clamp (away from the bounds)") {
  // Values on both sides of both bounds, none within 0.05 of -0.5 or 0.5.
  std::vector<double> v = rand_values(20, -1.5, 1.5, 42);
  nudge_away(v, {-0.5, 0.5}, 0.05);
  Tensor x = f64(v, {4, 5});
  check_unary([](const Tensor& t) { return dew::clamp(t, -0.5f, 0.5f); }, "clamp", x);
  // the gradient is exactly the indicator of lo < x < hi
  Tensor xr = f64(v, {4, 5}).set_requires_grad(true);
  dew::sum(dew::clamp(xr, -0.5f, 0.5f)).backward();
  std::vector<double> expect;
  for (double t : v) expect.push_back(t > -0.5 && t < 0.5 ? 1.0 : 0.0);
  check_values(xr.grad(), expect, 0.0, "clamp gradient mask");
}
TEST_CASE("gradcheck softcap") {
  check_unary([](const Tensor& x) { return dew::softcap(x, 2.0f); }, "softcap", rnd({3, 5}, 43, -5, 5));
}
TEST_CASE("gradcheck activation()") {
  for (auto act : {dew::Activation::none, dew::Activation::relu, dew::Activation::gelu, dew::Activation::gelu_tanh,
                   dew::Activation::silu}) {
    check_unary([act](const Tensor& x) { return dew::activation(x, act); }, "activation " + std::to_string(int(act)),
                rnd_away({3, 4}, 44, 0.1, 2.0));
  }
}

TEST_CASE("gradcheck gated_activation, and its value against activation then mul") {
  for (auto act : {dew::Activation::none, dew::Activation::relu, dew::Activation::gelu, dew::Activation::gelu_tanh,
                   dew::Activation::silu}) {
    const std::string name = "gated_activation " + std::to_string(int(act));
    // gate away from relu's kink; up of either sign
    Tensor gate = rnd_away({3, 4}, 47, 0.1, 2.0), up = rnd({3, 4}, 48, -1.5, 1.5);
    gradcheck([act](const std::vector<Tensor>& x) { return dew::gated_activation(x[0], x[1], act); }, {gate, up},
              name);
    const auto fused = dew::gated_activation(gate, up, act).to_doubles();
    const auto unfused = dew::mul(dew::activation(gate, act), up).to_doubles();
    for (size_t i = 0; i < fused.size(); ++i) CHECK(fused[i] == doctest::Approx(unfused[i]).epsilon(1e-14));
  }
  CHECK_THROWS_WITH(dew::gated_activation(rnd({3, 4}, 1), rnd({4, 3}, 2), dew::Activation::silu),
                    doctest::Contains("differ in shape"));
}

TEST_CASE("mse: value and gradcheck") {
  Tensor a = rnd({3, 4}, 45), b = rnd({3, 4}, 46);
  gradcheck([](const std::vector<Tensor>& x) { return dew::mse(x[0], x[1]); }, {a, b}, "mse");
  const auto va = a.to_doubles(), vb = b.to_doubles();
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += (va[i] - vb[i]) * (va[i] - vb[i]);
  CHECK(dew::mse(a, b).item() == doctest::Approx(s / 12.0).epsilon(1e-12));
}
