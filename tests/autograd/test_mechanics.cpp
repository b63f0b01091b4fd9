// tests/autograd/test_mechanics.cpp — the autograd machinery itself: accumulation, reuse, no_grad, errors,
// zero_grad, detach and gradient aliasing, gradients summed in place (accumulation_target), gradients written over
// saved values that expire (saved_values_expire), which values the graph keeps and when the backward frees them, the
// profiler's record of the products. Values are exact (small integers and powers of two in f64), or compared bit for
// bit against the same computation done apart.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <map>

#include "dew/profile.hpp"
#include "gradcheck.hpp"

using namespace gc;
using dew::Tensor;

namespace {
Tensor leaf(const std::vector<double>& v, const dew::Shape& s) { return f64(v, s).set_requires_grad(true); }
bool message_has(const dew::Error& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("the ref backend loads from the default plugin folder") {
  REQUIRE(ref() != nullptr);
  CHECK(ref()->name() == "ref");
  CHECK(ref()->supports(dew::Kernel::attention_backward, DType::f64).ok);
}

TEST_CASE("gradients accumulate across two backward calls") {
  Tensor x = leaf({1, -2, 3}, {3});
  dew::sum(x * 3.0f).backward();
  check_values(x.grad(), {3, 3, 3}, 0, "first backward");
  dew::sum(x * 3.0f).backward();
  check_values(x.grad(), {6, 6, 6}, 0, "second backward doubles");
}

TEST_CASE("a tensor used twice: d(x*x)/dx = 2x") {
  Tensor x = leaf({1, -2, 3.5}, {3});
  dew::sum(x * x).backward();
  check_values(x.grad(), {2, -4, 7}, 0, "x*x");
  x.zero_grad();
  // deeper reuse: y = x*x; z = y + y*x = x^2 + x^3  -> dz/dx = 2x + 3x^2
  Tensor y = x * x;
  dew::sum(y + y * x).backward();
  check_values(x.grad(), {2 + 3, -4 + 12, 7 + 36.75}, 1e-14, "y + y*x");
}

TEST_CASE("no_grad records nothing") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  {
    dew::NoGradGuard ng;
    CHECK_FALSE(dew::grad_enabled());
    y = dew::sum(x * x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.impl()->grad_fn == nullptr);
    { dew::NoGradGuard nested; }
    CHECK_FALSE(dew::grad_enabled());  // a nested guard restores "off", not "on"
  }
  CHECK(dew::grad_enabled());
  try {
    y.backward();
    FAIL("backward through a no_grad result must throw");
  } catch (const dew::Error& e) {
    CHECK(message_has(e, "does not require gradients"));
  }
  CHECK_FALSE(x.grad().defined());
  // ops on tensors that need no gradient record nothing either
  Tensor c = f64({1, 2}, {2});
  Tensor z = dew::exp(c) + c;
  CHECK_FALSE(z.requires_grad());
  CHECK(z.impl()->grad_fn == nullptr);
}

TEST_CASE("backward on a non-scalar throws") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x * 2.0f;
  try {
    y.backward();
    FAIL("backward on a [3] tensor must throw");
  } catch (const dew::Error& e) {
    CHECK(message_has(e, "one-element"));
  }
  CHECK_FALSE(x.grad().defined());
  // run_backward with an explicit seed works for non-scalars (vector-Jacobian product)
  dew::run_backward(y, f64({1, 10, 100}, {3}));
  check_values(x.grad(), {2, 20, 200}, 0, "seeded backward");
  // a seed of the wrong shape is refused
  CHECK_THROWS_AS(dew::run_backward(x * 2.0f, f64({1, 2}, {2})), dew::Error);
}

TEST_CASE("zero_grad drops the gradient and the next backward starts fresh") {
  Tensor x = leaf({1, 2}, {2});
  dew::sum(x * 5.0f).backward();
  check_values(x.grad(), {5, 5}, 0, "before zero_grad");
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
  dew::sum(x * 2.0f).backward();
  check_values(x.grad(), {2, 2}, 0, "after zero_grad");
  // Module::zero_grad clears every parameter
  ref();
  dew::nn::Linear lin(2, 3);
  Tensor in = Tensor::from_vector({1, 2}, {1, 2}, ref());
  dew::sum(lin.forward(in)).backward();
  CHECK(lin.weight.grad().defined());
  CHECK(lin.bias.grad().defined());
  lin.zero_grad();
  CHECK_FALSE(lin.weight.grad().defined());
  CHECK_FALSE(lin.bias.grad().defined());
}

TEST_CASE("detach stops gradients") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.data() == x.data());  // same storage
  dew::sum(d * x).backward();   // only the non-detached factor contributes: grad = d = x
  check_values(x.grad(), {1, 2, 3}, 0, "x.detach() * x");
  // detaching an intermediate cuts the graph behind it
  Tensor w = leaf({2, 2, 2}, {3});
  Tensor y = (w * w).detach();
  dew::sum(y * x).backward();
  CHECK_FALSE(w.grad().defined());
  check_values(x.grad(), {1 + 4, 2 + 4, 3 + 4}, 0, "accumulated over a detached product");
}

TEST_CASE("leaf gradients are never aliased with op outputs or with each other") {
  // add returns the incoming gradient for both inputs: the leaf must own a copy.
  Tensor x = leaf({1, 2}, {2});
  dew::sum(x + x).backward();
  check_values(x.grad(), {2, 2}, 0, "y = x + x");
  // two leaves that receive the very same gradient tensor do not share it
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2});
  Tensor s = a + b;
  dew::run_backward(s, f64({1, 1}, {2}));
  REQUIRE(a.grad().defined());
  REQUIRE(b.grad().defined());
  CHECK(a.grad().data() != b.grad().data());
  double v = 100;
  a.grad().copy_from_host(std::vector<double>{v, v}.data());
  check_values(b.grad(), {1, 1}, 0, "b.grad unchanged after writing a.grad");
  // the seed is not aliased either: a leaf root gets its own copy
  Tensor r = leaf({7}, {1});
  Tensor seed = f64({1}, {1});
  dew::run_backward(r, seed);
  CHECK(r.grad().data() != seed.data());
  r.grad().copy_from_host(std::vector<double>{5}.data());
  CHECK(seed.item() == 1.0);
  // accumulation into an existing gradient writes the leaf's own buffer, not the incoming one
  Tensor p = leaf({1, 1}, {2});
  Tensor g1 = f64({1, 2}, {2});
  dew::run_backward(p * 1.0f, g1);
  dew::run_backward(p * 1.0f, g1);
  check_values(p.grad(), {2, 4}, 0, "accumulated");
  check_values(g1, {1, 2}, 0, "seed untouched");
}

TEST_CASE("adopted leaf gradients and in-place pending sums stay exact") {
  // dW of a matmul is fresh and unshared: the leaf adopts it; the next backward accumulates into it.
  Tensor w = leaf({1, 2, 3, 4}, {2, 2});
  const Tensor x = f64({1, 2, 3, 4}, {2, 2});
  dew::sum(dew::matmul(x, w)).backward();
  check_values(w.grad(), {4, 4, 6, 6}, 0, "x^T 1");
  dew::sum(dew::matmul(x, w)).backward();
  check_values(w.grad(), {8, 8, 12, 12}, 0, "accumulated");
  // y has three consumers with fresh gradients: the pending sum is formed in place, exactly once each.
  Tensor a = leaf({1, -2}, {2});
  Tensor y = a * 2.0f;
  dew::sum(y * 3.0f + y * 5.0f + y * y).backward();  // d/dy = 3 + 5 + 2y, dy/da = 2
  check_values(a.grad(), {2 * (8 + 4), 2 * (8 - 8)}, 0, "three paths");
}

TEST_CASE("gradients do not reach inputs that do not require them and non-leaves keep no .grad") {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = f64({3, 4}, {2});
  Tensor h = x * c;  // a non-leaf
  dew::sum(h * h).backward();
  check_values(x.grad(), {2 * 9 * 1, 2 * 16 * 2}, 0, "d sum((x c)^2)/dx = 2 c^2 x");
  CHECK_FALSE(c.grad().defined());
  CHECK_FALSE(h.grad().defined());
  CHECK(std::string(h.impl()->grad_fn->name) == "released");  // the graph is released after the backward
}

TEST_CASE("integer tensors cannot require gradients") {
  Tensor i = ints({1, 2}, {2});
  CHECK_THROWS_AS(i.set_requires_grad(true), dew::Error);
}

TEST_CASE("a diamond graph sums both paths once") {
  Tensor x = leaf({0.5, -1.5}, {2});
  Tensor a = dew::exp(x), b = x * 3.0f;
  Tensor y = a * b + a;  // dy/dx = e^x (3x) + e^x 3 + e^x
  dew::sum(y).backward();
  const auto vx = x.to_doubles();
  std::vector<double> expect;
  for (double t : vx) expect.push_back(std::exp(t) * (3 * t + 3 + 1));
  check_values(x.grad(), expect, 1e-14, "diamond");
}

// The checker itself: a deliberately wrong backward (d(2x)/dx reported as 3) must be caught.
TEST_CASE("gradcheck catches a wrong backward") {
  Options quiet;
  quiet.report = false;
  const int bad = gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor out = dew::scale(in[0].detach(), 2.0f);
        if (dew::needs_grad({&in[0]}))
          dew::record(
              out, {in[0]}, [](const Tensor& g) { return std::vector<Tensor>{dew::scale(g, 3.0f)}; }, "wrong");
        return out;
      },
      {rnd({3}, 1)}, "deliberately wrong backward", quiet);
  CHECK(bad == 3);
}

// A transposed gradient has the right shape and sum but the wrong elements: caught thanks to R.
TEST_CASE("gradcheck catches a permuted gradient") {
  Options quiet;
  quiet.report = false;
  const int bad = gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor out = dew::mul(in[0].detach(), in[0].detach());
        if (dew::needs_grad({&in[0]})) {
          Tensor xd = in[0].detach();
          dew::record(
              out, {in[0]},
              [xd](const Tensor& g) {
                return std::vector<Tensor>{dew::reshape(dew::transpose(dew::mul(g, xd * 2.0f), 0, 1), {2, 2})};
              },
              "permuted");
        }
        return out;
      },
      {rnd({2, 2}, 2)}, "permuted gradient", quiet);
  CHECK(bad == 2);  // the two off-diagonal elements
}

TEST_CASE("a second backward through a consumed graph is refused and leaves the leaf gradients unchanged") {
  // dew keeps no retain_graph: the graph is released by the first backward.
  Tensor x = leaf({1, 2}, {2});
  Tensor h = x * x;
  Tensor loss = dew::sum(h);
  loss.backward();
  check_values(x.grad(), {2, 4}, 0, "first backward");
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("already consumed"), dew::Error);
  // An intermediate of the consumed graph reused in a new graph must not act as a silent leaf.
  CHECK_THROWS_WITH_AS(dew::sum(h * 2.0f).backward(), doctest::Contains("already consumed"), dew::Error);
  check_values(x.grad(), {2, 4}, 0, "after the refused backwards");
}

namespace {
const dew::BackendPtr& cpu_backend() {
  static const dew::BackendPtr be = [] {
    ref();  // loads the plugins
    return dew::create_backend("cpu");
  }();
  return be;
}

// An op of the test's own, y = c * x, whose backward takes accumulation_target and records what it saw: with
// `use`, it adds c * g into the offered sum and returns that sum; else it returns a fresh c * g.
struct TargetProbe {
  bool offered = false;
  std::vector<double> seen;  // the offered sum's values before the backward wrote
};
Tensor scaled(const Tensor& x, double c, bool use, TargetProbe& probe) {
  Tensor out = x.detach() * float(c);
  dew::record(
      out, {x},
      [c, use, &probe](const Tensor& g) {
        Tensor target = dew::accumulation_target(0);
        probe.offered = target.defined();
        if (!target.defined()) return std::vector<Tensor>{g * float(c)};
        probe.seen = target.to_doubles();
        CHECK(dew::accumulation_target(0).data() == target.data());  // asked twice: the same tensor
        if (!use) return std::vector<Tensor>{g * float(c)};
        const Tensor add = g * float(c);
        const std::vector<double> a = add.to_doubles();
        std::vector<double> sum = target.to_doubles();
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += a[i];
        target.copy_from_host(sum.data());
        return std::vector<Tensor>{target};
      },
      "scaled");
  return out;
}
}  // namespace

TEST_CASE("accumulation_target offers a pending sum only where nothing else sees it") {
  CHECK_FALSE(dew::accumulation_target(0).defined());  // outside a backward
  for (const bool use : {true, false}) {
    CAPTURE(use);
    // y (a non-leaf) has two consumers; the second backward to run is offered the first one's gradient.
    Tensor a = leaf({1, -2}, {2});
    Tensor y = a * 2.0f;
    TargetProbe p1, p2;
    Tensor z = scaled(y, 3, use, p1) + scaled(y, 5, use, p2) * 7.0f;
    dew::sum(z).backward();
    CHECK(p1.offered != p2.offered);  // exactly one runs second
    const TargetProbe& second = p1.offered ? p1 : p2;
    const double first = p1.offered ? 35 : 3;  // the other consumer's gradient of y
    CHECK(second.seen == std::vector<double>{first, first});
    check_values(a.grad(), {2 * 38, 2 * 38}, 0, "3 + 5 * 7, summed once");
  }
  {  // the pending sum is the alias add's backward returned for both of its inputs: not offered
    Tensor a = leaf({1, -2}, {2});
    Tensor y = a * 2.0f;
    TargetProbe p;
    const Tensor seed = f64({1, 0.5}, {2});
    dew::run_backward(y + scaled(y, 3, true, p), seed);  // add hands the seed itself to y and to the scaled branch
    CHECK_FALSE(p.offered);
    check_values(a.grad(), {8, 4}, 0, "2 * (1 + 3) * seed");
    check_values(seed, {1, 0.5}, 0, "the caller's seed untouched");
  }
  {  // a leaf's .grad from an earlier backward is offered (it is accumulated in place anyway)
    Tensor a = leaf({1, -2}, {2});
    TargetProbe p;
    dew::sum(scaled(a, 3, true, p)).backward();
    CHECK_FALSE(p.offered);
    dew::sum(scaled(a, 3, true, p)).backward();
    CHECK(p.offered);
    CHECK(p.seen == std::vector<double>{3, 3});
    check_values(a.grad(), {6, 6}, 0, "two backwards");
    const Tensor held = a.grad();  // the caller keeps the .grad (it could be an operand): not offered
    dew::sum(scaled(a, 3, true, p)).backward();
    CHECK_FALSE(p.offered);
    check_values(a.grad(), {9, 9}, 0, "three backwards");
  }
}

namespace {
// out = x * x whose backward asks saved_values_expire of its saved x and, when told yes, writes the gradient 2 x g
// over it (as an in-place elementwise backward does).
struct ExpireProbe {
  bool asked = false, expire = false;
};
Tensor squared(const Tensor& x, ExpireProbe& probe) {
  const Tensor xd = x.detach();
  Tensor out = xd * xd;
  dew::record(
      out, {x},
      [xd, &probe](const Tensor& g) {
        probe.asked = true;
        probe.expire = dew::saved_values_expire(0, xd);
        const Tensor grad = xd * g * 2.0f;
        if (!probe.expire) return std::vector<Tensor>{grad};
        Tensor over = xd;  // the saved values, written over
        over.copy_from_host(grad.to_doubles().data());
        return std::vector<Tensor>{over};
      },
      "squared");
  return out;
}
}  // namespace

TEST_CASE("saved_values_expire: only values no op, caller or view can read after the backward") {
  CHECK_FALSE(dew::saved_values_expire(0, f64({1}, {1})));  // outside a backward
  {  // a temporary read by one op: its values expire, and the gradient written over them is right
    Tensor a = leaf({1, -2}, {2});
    ExpireProbe p;
    const Tensor l = dew::sum(squared(a * 3.0f, p));  // (the temporary a * 3 dies here, before the backward)
    l.backward();
    CHECK(p.expire);
    check_values(a.grad(), {2 * 3 * 3, -2 * 2 * 3 * 3}, 0, "d(3a)^2/da = 18 a");
  }
  {  // the caller holds it: kept, and its values unchanged
    Tensor a = leaf({1, -2}, {2});
    const Tensor y = a * 3.0f;
    ExpireProbe p;
    dew::sum(squared(y, p)).backward();
    CHECK(p.asked);
    CHECK_FALSE(p.expire);
    check_values(y, {3, -6}, 0, "the caller's tensor");
    check_values(a.grad(), {18, -36}, 0, "18 a");
  }
  {  // another op saved it too: kept while that op's backward is still to run (the first of two readers to run
     // sees the other's saved values; the second its own alone), and every backward reads the right values
    Tensor a = leaf({1, -2}, {2});
    ExpireProbe p1, p2;
    Tensor y = a * 3.0f;
    const Tensor l = dew::sum(squared(y, p1) + squared(y, p2) * 5.0f);
    y = Tensor();
    l.backward();
    CHECK(p1.asked);
    CHECK(p2.asked);
    CHECK(p1.expire != p2.expire);
    check_values(a.grad(), {6 * 18, -6 * 36}, 0, "(1 + 5) 18 a");
    Tensor b = leaf({5, 7}, {2}), c = leaf({1, -2}, {2});
    ExpireProbe p3;
    Tensor z = c * 3.0f;
    const Tensor m = dew::sum(squared(z, p3) + z * b);  // mul keeps z: whichever backward runs first, right values
    z = Tensor();
    m.backward();
    check_values(c.grad(), {18 + 15, -36 + 21}, 0, "18 c + 3 b");
    check_values(b.grad(), {3, -6}, 0, "3 c");
  }
  {  // a leaf (its owner holds it) and a view (a slice of a larger buffer): kept
    Tensor a = leaf({1, -2}, {2});
    ExpireProbe p1, p2;
    dew::sum(squared(a, p1)).backward();
    CHECK(p1.asked);
    CHECK_FALSE(p1.expire);
    check_values(a, {1, -2}, 0, "the leaf's values");
    Tensor c = leaf({1, -2, 4}, {3});
    const Tensor l = dew::sum(squared(dew::slice(c * 1.0f, 0, 0, 2), p2));
    l.backward();
    CHECK(p2.asked);
    CHECK_FALSE(p2.expire);
    check_values(c.grad(), {2, -4, 0}, 0, "2 c on the slice");
  }
}

namespace {
// out = x (a copy) whose backward records, when it runs, which of `watched` storages are still alive (the list is
// read then, by reference).
Tensor watcher(const Tensor& x, const std::vector<std::weak_ptr<dew::Storage>>& watched, std::vector<bool>& alive) {
  Tensor out = x.detach() * 1.0f;
  dew::record(
      out, {x},
      [&watched, &alive](const Tensor& g) {
        alive.clear();
        for (const auto& w : watched) alive.push_back(!w.expired());
        return std::vector<Tensor>{g};
      },
      "watcher");
  return out;
}
}  // namespace

TEST_CASE("the graph keeps only the values its backwards saved, and the backward frees them as it goes") {
  // y is read only by add, whose backward reads no values: once the caller drops y, its storage is gone, and the
  // gradients are the same.
  Tensor a = leaf({1, -2}, {2}), b = leaf({4, 5}, {2});
  Tensor y = a * 3.0f;
  const std::weak_ptr<dew::Storage> y_values = y.impl()->storage;
  Tensor z = y + b;
  y = Tensor();
  CHECK(y_values.expired());
  // mul keeps what its backward reads: z (the other factor's gradient needs it), held by the graph alone
  Tensor c = leaf({2, 2}, {2});
  const std::weak_ptr<dew::Storage> z_values = z.impl()->storage;
  Tensor l = dew::sum(z * c);
  z = Tensor();
  CHECK_FALSE(z_values.expired());
  l.backward();
  CHECK(z_values.expired());  // freed with mul's node once its backward ran
  check_values(a.grad(), {6, 6}, 0, "3 c");
  check_values(b.grad(), {2, 2}, 0, "c");
  check_values(c.grad(), {7, -1}, 0, "3 a + b");

  // A factor or operand is kept only for the other's gradient: x * mask and a frozen weight's linear keep no x.
  {
    Tensor h = leaf({1, 2, 3, 4}, {2, 2}) * 1.0f;
    const std::weak_ptr<dew::Storage> h_values = h.impl()->storage;
    const Tensor masked = h * f64({0, 1, 1, 0}, {2, 2});
    const Tensor frozen = dew::linear(h, f64({1, 0, 0, 1}, {2, 2}));
    h = Tensor();
    CHECK(h_values.expired());
    Tensor trained = leaf({1, 0, 0, 1}, {2, 2});
    Tensor h2 = leaf({1, 2, 3, 4}, {2, 2}) * 1.0f;
    const std::weak_ptr<dew::Storage> h2_values = h2.impl()->storage;
    const Tensor kept = dew::linear(h2, trained);
    h2 = Tensor();
    CHECK_FALSE(h2_values.expired());  // the weight's gradient reads it
  }

  // A chain x -> p (the watcher) -> q = 2 p -> u = q q -> v = u u: when the watcher's backward runs (last), the
  // values the upper backwards saved (q's, u's) are gone, though those tensors were inputs of nodes of the graph.
  Tensor x = leaf({1, -2}, {2});
  std::vector<bool> alive;
  std::vector<std::weak_ptr<dew::Storage>> watched;
  {
    Tensor q = watcher(x, watched, alive) * 2.0f;
    watched.push_back(q.impl()->storage);
    Tensor u = q * q;
    watched.push_back(u.impl()->storage);
    Tensor l = dew::sum(u * u);
    q = u = Tensor();
    CHECK_FALSE(watched[0].expired());  // saved by q * q's backward
    CHECK_FALSE(watched[1].expired());  // saved by u * u's backward
    l.backward();
  }
  REQUIRE(alive.size() == 2);
  CHECK_FALSE(alive[0]);
  CHECK_FALSE(alive[1]);
  check_values(x.grad(), {64, -512}, 0, "d(2x)^4/dx = 64 x^3");
}

TEST_CASE("elementwise backwards over their inputs' values: the gradients of fresh buffers, bit for bit") {
  // The gated activation (dgate over gate, dup over up), unary (dx over x) and the linear layer with an activation
  // and a bias (its derivative over the kept pre-activation): on temporaries they write over the values they saved;
  // with the caller holding the intermediates (unary, gated: nothing written over) or as the unfused composition
  // (linear + activation) the gradients must be the same bits, and the held values unchanged.
  for (const DType dt : {DType::f64, DType::f32}) {
    const std::string dtype = dew::dtype_name(dt);
    CAPTURE(dtype);
    const dew::BackendPtr& be = dt == DType::f64 ? ref() : cpu_backend();
    auto make = [&](const dew::Shape& s, uint64_t seed) {
      const std::vector<double> v = rand_values(dew::numel_of(s), -1, 1, seed);
      if (dt == DType::f64) return Tensor::from_host(v.data(), s, dt, be);
      return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), s, be);
    };
    const Tensor x0 = make({3, 8}, 11), wg0 = make({12, 8}, 12), wu0 = make({12, 8}, 13), b0 = make({12}, 15);
    const Tensor c = make({3, 12}, 14);
    for (const std::string op : {"gated_activation", "unary", "linear_activation_bias"}) {
      CAPTURE(op);
      std::vector<std::vector<double>> grads[2];
      for (const bool hold : {false, true}) {
        Tensor x = x0.clone().set_requires_grad(true), wg = wg0.clone().set_requires_grad(true);
        Tensor wu = wu0.clone().set_requires_grad(true), b = b0.clone().set_requires_grad(true);
        Tensor gate, up, l;
        const dew::Activation silu = dew::Activation::silu, gelu = dew::Activation::gelu_tanh;
        if (op == "gated_activation" && hold) {
          gate = dew::linear(x, wg), up = dew::linear(x, wu);
          l = dew::sum(dew::gated_activation(gate, up, silu) * c);
        } else if (op == "gated_activation") {
          l = dew::sum(dew::gated_activation(dew::linear(x, wg), dew::linear(x, wu), silu) * c);
        } else if (op == "unary" && hold) {
          gate = dew::linear(x, wg);
          l = dew::sum(dew::gelu(gate, true) * c);
        } else if (op == "unary") {
          l = dew::sum(dew::gelu(dew::linear(x, wg), true) * c);
        } else if (hold) {  // the composition the fused layer stands for, its pre-activation held
          gate = dew::linear(x, wg, b);
          l = dew::sum(dew::activation(gate, gelu) * c);
        } else {
          l = dew::sum(dew::linear(x, wg, b, gelu) * c);
        }
        const std::vector<double> held = hold ? gate.to_doubles() : std::vector<double>();
        l.backward();
        if (hold) CHECK(gate.to_doubles() == held);
        grads[hold] = {x.grad().to_doubles(), wg.grad().to_doubles()};
        if (op == "gated_activation") grads[hold].push_back(wu.grad().to_doubles());
        if (op == "linear_activation_bias") grads[hold].push_back(b.grad().to_doubles());
      }
      CHECK(grads[0] == grads[1]);
    }
  }
  {  // a node's own intermediate: expires when the backward's capture is its one holder
    Tensor a = leaf({1, -2}, {2});
    bool private_expires = false, shared_expires = true;
    const Tensor kept = f64({4, 5}, {2});
    Tensor out = a.detach() * 1.0f;
    const Tensor mine = f64({2, 3}, {2});
    dew::record(
        out, {a},
        [mine, kept, &private_expires, &shared_expires](const Tensor& g) {
          private_expires = dew::saved_values_expire(mine);
          shared_expires = dew::saved_values_expire(kept);  // the test holds it too
          return std::vector<Tensor>{g};
        },
        "private");
    CHECK_FALSE(dew::saved_values_expire(mine));  // outside a backward
    dew::sum(out).backward();
    CHECK_FALSE(private_expires);  // the test's `mine` is a second holder
    CHECK_FALSE(shared_expires);
  }
  {
    Tensor a = leaf({1, -2}, {2});
    bool expires = false;
    Tensor out = a.detach() * 1.0f;
    dew::record(
        out, {a},
        [mine = f64({2, 3}, {2}), &expires](const Tensor& g) {
          expires = dew::saved_values_expire(mine);
          return std::vector<Tensor>{g};
        },
        "private");
    dew::sum(out).backward();
    CHECK(expires);
  }
}

TEST_CASE("a backend that declares matmul_beta_adds_rounded gives the product's bits plus add's") {
  // ref in f64 and cpu in f32 (on AVX-512) declare it; ref in f32 (double accumulation, one rounding) does not.
  const dew::BackendPtr& cpu = cpu_backend();
  CHECK(ref()->matmul_beta_adds_rounded(DType::f64));
  CHECK_FALSE(ref()->matmul_beta_adds_rounded(DType::f32));
  CHECK_FALSE(cpu->matmul_beta_adds_rounded(DType::bf16));
  struct Shape3 {
    int64_t m, k, n;
    bool ta, tb;
  };
  // the backward products of linear (dx plain, dW with A transposed), a forward-like B^T, odd sizes, a deep k
  const std::vector<Shape3> shapes = {{96, 64, 48, false, false},
                                      {48, 96, 64, true, false},
                                      {37, 29, 53, false, true},
                                      {64, 4096, 48, true, false},
                                      {33, 16384, 17, true, false}};
  for (const auto& [be, dt] : {std::make_pair(ref(), DType::f64), std::make_pair(cpu, DType::f32)}) {
    if (!be->matmul_beta_adds_rounded(dt)) continue;
    for (const Shape3& s : shapes) {
      if (be == ref() && s.k > 4096) continue;  // ref's triple loop: the deep case on cpu only
      CAPTURE(be->name());
      CAPTURE(s.m);
      CAPTURE(s.k);
      auto make = [&](const dew::Shape& shape, uint64_t stream) {
        return dew::cast(Tensor::normal(shape, 0, 1, 7, stream, be), dt);
      };
      const Tensor a = make(s.ta ? dew::Shape{s.k, s.m} : dew::Shape{s.m, s.k}, 1);
      const Tensor b = make(s.tb ? dew::Shape{s.n, s.k} : dew::Shape{s.k, s.n}, 2);
      const Tensor c = make({s.m, s.n}, 3);
      dew::MatmulParams p;
      p.m = s.m, p.k = s.k, p.n = s.n, p.trans_a = s.ta, p.trans_b = s.tb;
      Tensor product = Tensor::empty({s.m, s.n}, dt, be);
      be->matmul(a, b, Tensor(), product, p);
      const Tensor apart = c + product;
      Tensor summed = c.clone();
      p.beta = 1.0f;
      be->matmul(a, b, Tensor(), summed, p);
      CHECK(summed.to_doubles() == apart.to_doubles());
    }
  }
}

TEST_CASE("products sum the gradients of a shared input in place: the values of a separate add, no add") {
  // h = x * 1 (a non-leaf) read by two linears (gate/up), the weights and x over two backward passes
  // (micro-batches): x.grad and the weights' .grad equal the gradients computed apart and added, bit for bit, and
  // where the backend declares matmul_beta_adds_rounded (ref f64, cpu f32) no add kernel runs for them.
  const dew::BackendPtr& cpu = cpu_backend();
  for (const auto& [be, dt] :
       {std::make_pair(ref(), DType::f64), std::make_pair(cpu, DType::f32), std::make_pair(ref(), DType::f32)}) {
    CAPTURE(be->name());
    const std::string dtype = dew::dtype_name(dt);
    CAPTURE(dtype);
    const bool sums = be->matmul_beta_adds_rounded(dt);
    auto prof = std::make_shared<dew::ProfilingBackend>(be);
    auto make = [&](const dew::Shape& s, uint64_t seed) {
      const std::vector<double> v = rand_values(dew::numel_of(s), -1, 1, seed);
      if (dt == DType::f64) return Tensor::from_host(v.data(), s, dt, prof);
      return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), s, prof);
    };
    const Tensor x0 = make({2, 5, 16}, 1), w10 = make({24, 16}, 2), w20 = make({24, 16}, 3);
    const Tensor c1 = make({2, 5, 24}, 4), c2 = make({2, 5, 24}, 5);
    auto backward = [&](const Tensor& x, const Tensor& w1, const Tensor& w2, bool first, bool second) {
      const Tensor h = x * 1.0f;
      Tensor l;
      if (first) l = dew::sum(dew::linear(h, w1) * c1);
      if (second) l = l.defined() ? l + dew::sum(dew::linear(h, w2) * c2) : dew::sum(dew::linear(h, w2) * c2);
      prof->start();
      l.backward();
      prof->stop();
    };
    auto leaves = [&] {
      return std::vector<Tensor>{x0.clone().set_requires_grad(true), w10.clone().set_requires_grad(true),
                                 w20.clone().set_requires_grad(true)};
    };
    std::vector<Tensor> one = leaves(), two = leaves();
    backward(one[0], one[1], one[2], true, false);
    backward(two[0], two[1], two[2], false, true);
    const Tensor x_apart = one[0].grad() + two[0].grad();
    std::vector<Tensor> both = leaves();
    backward(both[0], both[1], both[2], true, true);
    CHECK(prof->calls("binary add") == (sums ? 0 : 1));  // h's two gradients: summed by the second product
    CHECK(both[0].grad().to_doubles() == x_apart.to_doubles());
    CHECK(both[1].grad().to_doubles() == one[1].grad().to_doubles());
    CHECK(both[2].grad().to_doubles() == two[2].grad().to_doubles());
    backward(both[0], both[1], both[2], true, true);  // a second micro-batch: every leaf's .grad exists
    CHECK(prof->calls("binary add") == (sums ? 1 : 4));  // x's through x * 1; h's and the weights' in the products
    CHECK(both[0].grad().to_doubles() == (x_apart + x_apart).to_doubles());
    CHECK(both[1].grad().to_doubles() == (one[1].grad() + one[1].grad()).to_doubles());
    CHECK(both[2].grad().to_doubles() == (two[2].grad() + two[2].grad()).to_doubles());
  }
}

TEST_CASE("ProfilingBackend::products: each product shape once, with its first call's parameters, calls and time") {
  // Two linears with a bias and a bare product of the same shape (another label: no bias), forward and backward:
  // every product the profiler timed is listed once under its label, with the parameters a replay needs (m, k, n,
  // transposes, bias, dtypes) and the label's calls.
  auto prof = std::make_shared<dew::ProfilingBackend>(ref());
  const auto rand_floats = [](int64_t n, uint64_t seed) {
    const std::vector<double> v = rand_values(n, -1, 1, seed);
    return std::vector<float>(v.begin(), v.end());
  };
  const Tensor x = Tensor::from_vector(rand_floats(3 * 8, 1), {3, 8}, prof).set_requires_grad(true);
  const Tensor w1 = Tensor::from_vector(rand_floats(5 * 8, 2), {5, 8}, prof).set_requires_grad(true);
  const Tensor w2 = Tensor::from_vector(rand_floats(5 * 8, 3), {5, 8}, prof).set_requires_grad(true);
  const Tensor b = Tensor::from_vector(rand_floats(5, 4), {5}, prof);
  prof->start();
  const Tensor l = dew::sum(dew::linear(x, w1, b)) + dew::sum(dew::linear(x, w2, b)) +
                   dew::sum(dew::matmul(x, dew::transpose(w1, 0, 1)));
  l.backward();
  prof->stop();
  std::map<std::string, dew::ProfilingBackend::Product> by_label;
  int64_t calls = 0;
  for (const auto& p : prof->products()) {
    by_label[p.label] = p;
    calls += p.calls;
    CHECK(p.calls == prof->calls(p.label));
    CHECK(p.seconds >= 0);
    CHECK(p.a == DType::f32);
    CHECK(p.out == DType::f32);
  }
  REQUIRE(by_label.count("matmul 3x8x5 Bt +bias"));  // the two linears' forward: one label, two calls
  const dew::ProfilingBackend::Product& fwd = by_label["matmul 3x8x5 Bt +bias"];
  CHECK(fwd.calls == 2);
  CHECK(fwd.has_bias);
  CHECK((fwd.params.m == 3 && fwd.params.k == 8 && fwd.params.n == 5 && fwd.params.trans_b && !fwd.params.trans_a));
  int64_t all_matmuls = 0;  // the profiler's own count of matmul calls, label by label
  for (const auto& [label, p] : by_label) all_matmuls += prof->calls(label);
  CHECK(calls == all_matmuls);
  CHECK(calls >= 3 + 2 * 2);  // 3 forward products; dx and dw of each linear (the bare matmul's too)
  prof->start();              // a restart forgets them
  CHECK(prof->products().empty());
}
