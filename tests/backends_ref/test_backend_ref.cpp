// test_backend_ref.cpp — the `ref` backend against hand-computed and analytic values.
// Every expected number here is derived by hand (or from a closed form), not from another backend, so
// a wrong kernel fails; gradient finite-difference checks and cross-backend conformance live elsewhere.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

using namespace dew;
using Vec = std::vector<double>;

namespace {

BackendPtr ref() {
  static BackendPtr backend = [] {
    if (!Registry::global().contains(Backend::kind, "ref")) Registry::global().load(DEW_REF_PLUGIN_PATH);
    return create_backend("ref");
  }();
  return backend;
}

// A tensor of `dt` holding `v` (converted from double on the host, so f64 keeps full precision).
Tensor make(const Vec& v, const Shape& shape, DType dt = DType::f32) {
  Tensor d = Tensor::from_host(v.data(), shape, DType::f64, ref());
  if (dt == DType::f64) return d;
  Tensor t = Tensor::empty(shape, dt, ref());
  ref()->cast(d, t);
  return t;
}
Tensor ints(const std::vector<int32_t>& v, const Shape& shape) { return Tensor::from_ints(v, shape, ref()); }
Tensor empty(const Shape& shape, DType dt = DType::f32) { return Tensor::empty(shape, dt, ref()); }

void check_close(const Tensor& t, const Vec& want, double tol = 1e-6) {
  const Vec got = t.to_doubles();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element ", i, ": got ", got[i], ", want ", want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
  }
}

}  // namespace

// ---------------------------------------------------------------- plumbing

TEST_CASE("ref: identity and supports()") {
  CHECK(ref()->name() == "ref");
  CHECK(ref()->host_accessible());
  CHECK(ref()->supports(Kernel::matmul, DType::f32).ok);
  CHECK(ref()->supports(Kernel::attention, DType::f64).ok);
  CHECK(ref()->supports(Kernel::cast, DType::bf16).ok);
  CHECK(ref()->supports(Kernel::strided_copy, DType::u8).ok);
  const Support no = ref()->supports(Kernel::matmul, DType::bf16);
  CHECK_FALSE(no.ok);
  CHECK(no.reason.find("f32") != std::string::npos);
  CHECK_FALSE(ref()->supports(Kernel::binary, DType::i32).ok);
  // A declined dtype throws rather than computing garbage.
  Tensor a = make({1, 2}, {1, 2}, DType::bf16), out = empty({1, 2}, DType::bf16);
  CHECK_THROWS_AS(ref()->unary(a, out, {}), dew::Error);
}

TEST_CASE("ref: fill and cast across dtypes") {
  Tensor x = make({-2.7, 2.7, 300.0, -5.0, 1e10, std::numeric_limits<double>::quiet_NaN()}, {6});
  Tensor i32 = empty({6}, DType::i32), u8 = empty({6}, DType::u8);
  ref()->cast(x, i32);
  ref()->cast(x, u8);
  // Truncation toward zero, saturation, NaN -> 0.
  check_close(i32, {-2, 2, 300, -5, 2147483647.0, 0});
  check_close(u8, {0, 2, 255, 0, 255, 0});

  Tensor pi = make({3.14159265358979}, {1}, DType::f64), b = empty({1}, DType::bf16), h = empty({1}, DType::f16);
  ref()->cast(pi, b);
  ref()->cast(pi, h);
  check_close(b, {3.140625}, 0);  // bf16: 8 significant bits
  check_close(h, {3.140625}, 0);  // f16 nearest to pi is 3.140625 (0x4248)
  Tensor big = empty({1}, DType::i64), back = empty({1}, DType::f64);
  ref()->fill(big, 4294967296.0 * 3);
  ref()->cast(big, back);
  check_close(back, {12884901888.0}, 0);
  Tensor f = empty({3}, DType::f16);
  ref()->fill(f, 0.5);
  check_close(f, {0.5, 0.5, 0.5}, 0);
}

TEST_CASE("ref: strided_copy transposes and slices") {
  Tensor src = make({1, 2, 3, 4, 5, 6}, {2, 3}), dst = empty({3, 2});
  StridedCopyParams p;
  p.shape = {3, 2};
  p.src_strides = {1, 3};  // dst[i, j] = src[j, i]
  p.dst_strides = {2, 1};
  ref()->strided_copy(src, dst, p);
  check_close(dst, {1, 4, 2, 5, 3, 6}, 0);
  // Column 1 of src into a [2] tensor.
  Tensor col = empty({2});
  StridedCopyParams q;
  q.shape = {2};
  q.src_strides = {3};
  q.dst_strides = {1};
  q.src_offset = 1;
  ref()->strided_copy(src, col, q);
  check_close(col, {2, 5}, 0);
  q.src_offset = 3;  // would read element 6 of 6
  CHECK_THROWS_AS(ref()->strided_copy(src, col, q), dew::Error);
}

// ---------------------------------------------------------------- matmul

TEST_CASE("ref: matmul 2x3 @ 3x2 and its transposed storages") {
  const Vec A = {1, 2, 3, 4, 5, 6}, B = {7, 8, 9, 10, 11, 12};
  const Vec AT = {1, 4, 2, 5, 3, 6}, BT = {7, 9, 11, 8, 10, 12};
  const Vec want = {58, 64, 139, 154};
  for (DType dt : {DType::f32, DType::f64}) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool ta = variant & 1, tb = variant & 2;
      MatmulParams p;
      p.m = 2;
      p.n = 2;
      p.k = 3;
      p.trans_a = ta;
      p.trans_b = tb;
      Tensor a = make(ta ? AT : A, ta ? Shape{3, 2} : Shape{2, 3}, dt);
      Tensor b = make(tb ? BT : B, tb ? Shape{2, 3} : Shape{3, 2}, dt);
      Tensor out = empty({2, 2}, dt);
      ref()->matmul(a, b, Tensor(), out, p);
      INFO("trans_a=", ta, " trans_b=", tb);
      check_close(out, want, 0);
    }
  }
}

TEST_CASE("ref: matmul epilogue, beta and batch broadcast") {
  // Two batches of A, one shared B (stride 0): out = relu(0.5 * A B + bias).
  Tensor a = make({1, 0, 0, 1, -1, 0, 0, -1}, {2, 2, 2}), b = make({2, 4, 6, 8}, {2, 2});
  Tensor bias = make({1, -3}, {2}), out = empty({2, 2, 2});
  MatmulParams p;
  p.batch = 2;
  p.m = 2;
  p.n = 2;
  p.k = 2;
  p.a_batch_stride = 4;
  p.b_batch_stride = 0;
  p.alpha = 0.5f;
  p.act = Activation::relu;
  ref()->matmul(a, b, bias, out, p);
  // batch 0: 0.5*[[2,4],[6,8]] + [1,-3] = [[2,-1],[4,1]] -> relu; batch 1: [[0,-5],[-2,-7]] -> relu
  check_close(out, {2, 0, 4, 1, 0, 0, 0, 0}, 0);

  // beta accumulates into out; beta together with an activation is refused.
  Tensor c = make({10, 20, 30, 40}, {2, 2});
  MatmulParams q;
  q.m = 2;
  q.n = 2;
  q.k = 2;
  q.beta = 1.0f;
  ref()->matmul(make({1, 0, 0, 1}, {2, 2}), b, Tensor(), c, q);
  check_close(c, {12, 24, 36, 48}, 0);
  q.act = Activation::gelu;
  CHECK_THROWS_AS(ref()->matmul(make({1, 0, 0, 1}, {2, 2}), b, Tensor(), c, q), dew::Error);
}

// ---------------------------------------------------------------- elementwise

TEST_CASE("ref: unary ops on known values") {
  Tensor x = make({1.0}, {1}, DType::f64), y = empty({1}, DType::f64);
  auto run = [&](UnaryOp op, float alpha = 1, float beta = 0) {
    ref()->unary(x, y, {op, alpha, beta});
    return y.item();
  };
  CHECK(run(UnaryOp::gelu) == doctest::Approx(0.8413447460685429).epsilon(1e-14));
  CHECK(run(UnaryOp::gelu_tanh) == doctest::Approx(0.8411919906082768).epsilon(1e-14));
  CHECK(run(UnaryOp::silu) == doctest::Approx(0.7310585786300049).epsilon(1e-14));
  CHECK(run(UnaryOp::sigmoid) == doctest::Approx(0.7310585786300049).epsilon(1e-14));
  CHECK(run(UnaryOp::softcap, 2.0f) == doctest::Approx(2 * std::tanh(0.5)).epsilon(1e-14));
  CHECK(run(UnaryOp::affine, 3.0f, -1.0f) == 2.0);
  CHECK(run(UnaryOp::pow, 3.0f) == 1.0);
  CHECK(run(UnaryOp::clamp, -0.5f, 0.5f) == 0.5);
  CHECK(run(UnaryOp::rsqrt) == 1.0);
  // In place: out aliases x.
  Tensor z = make({-1, 0, 2}, {3});
  ref()->unary(z, z, {UnaryOp::relu});
  check_close(z, {0, 0, 2}, 0);
}

TEST_CASE("ref: unary_backward gives the exact derivatives") {
  Tensor x = make({0.0, 1.0, 3.0}, {3}, DType::f64), dy = make({1, 1, 2}, {3}, DType::f64);
  Tensor dx = empty({3}, DType::f64);
  auto run = [&](UnaryOp op, float alpha = 1, float beta = 0) {
    ref()->unary_backward(x, dy, dx, {op, alpha, beta});
    return dx.to_doubles();
  };
  const double phi1 = std::exp(-0.5) / std::sqrt(2 * std::numbers::pi);  // standard normal pdf at 1
  Vec g = run(UnaryOp::gelu);
  CHECK(g[0] == doctest::Approx(0.5));
  CHECK(g[1] == doctest::Approx(0.8413447460685429 + phi1).epsilon(1e-13));
  g = run(UnaryOp::sigmoid);
  CHECK(g[0] == doctest::Approx(0.25));
  g = run(UnaryOp::silu);
  CHECK(g[0] == doctest::Approx(0.5));
  g = run(UnaryOp::pow, 2.0f);  // 2x * dy
  CHECK(g == Vec{0, 2, 12});
  g = run(UnaryOp::clamp, 0.0f, 2.0f);  // dy strictly inside (alpha, beta), 0 at or outside
  CHECK(g == Vec{0, 1, 0});
  g = run(UnaryOp::softcap, 2.0f);  // 1 - tanh^2(x / c)
  CHECK(g[1] == doctest::Approx(1 - std::pow(std::tanh(0.5), 2)).epsilon(1e-13));
  g = run(UnaryOp::gelu_tanh);
  CHECK(g[0] == doctest::Approx(0.5));
  // gelu_tanh'(1) by a central difference of the closed form (a check of the formula, not of ref).
  auto gt = [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
  };
  CHECK(g[1] == doctest::Approx((gt(1 + 1e-6) - gt(1 - 1e-6)) / 2e-6).epsilon(1e-8));
}

TEST_CASE("ref: binary broadcasting and comparisons") {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}), row = make({10, 20, 30}, {3}), col = make({100, 200}, {2, 1});
  Tensor out = empty({2, 3});
  ref()->binary(a, row, out, BinaryOp::add);
  check_close(out, {11, 22, 33, 14, 25, 36}, 0);
  ref()->binary(a, col, out, BinaryOp::mul);
  check_close(out, {100, 200, 300, 800, 1000, 1200}, 0);
  ref()->binary(row, a, out, BinaryOp::sub);  // broadcast on the left operand
  check_close(out, {9, 18, 27, 6, 15, 24}, 0);
  Tensor three = make({3}, {1});
  ref()->binary(a, three, out, BinaryOp::gt);
  check_close(out, {0, 0, 0, 1, 1, 1}, 0);
  ref()->binary(a, three, out, BinaryOp::eq);
  check_close(out, {0, 0, 1, 0, 0, 0}, 0);
  Tensor bad = make({1, 2}, {2});
  CHECK_THROWS_AS(ref()->binary(a, bad, out, BinaryOp::add), dew::Error);
}

TEST_CASE("ref: reduce over the middle axis and argmax") {
  // x [2, 3, 2]; reduce the 3.
  Tensor x = make({1, -1, 2, -2, 3, -3, 4, 0, 5, 0, 6, 0}, {2, 3, 2}), out = empty({2, 2});
  ref()->reduce(x, out, {ReduceOp::sum, 2, 3, 2});
  check_close(out, {6, -6, 15, 0}, 0);
  ref()->reduce(x, out, {ReduceOp::mean, 2, 3, 2});
  check_close(out, {2, -2, 5, 0}, 0);
  ref()->reduce(x, out, {ReduceOp::max, 2, 3, 2});
  check_close(out, {3, -1, 6, 0}, 0);
  ref()->reduce(x, out, {ReduceOp::sumsq, 2, 3, 2});
  check_close(out, {14, 14, 77, 0}, 0);

  Tensor s = make({1, 3, 3, 2, -1, -1, -5, -2}, {2, 4}), idx = empty({2}, DType::i32);
  ref()->argmax(s, idx);
  CHECK(idx.to_ints() == std::vector<int32_t>{1, 0});
}

// ---------------------------------------------------------------- softmax and norms

TEST_CASE("ref: softmax and log_softmax rows") {
  Tensor x = make({1, 2, 3, 0, 0, 0}, {2, 3}), y = empty({2, 3}), ly = empty({2, 3});
  ref()->softmax(x, y);
  check_close(y, {0.09003057317038046, 0.24472847105479764, 0.6652409557748219, 1. / 3, 1. / 3, 1. / 3});
  ref()->log_softmax(x, ly);
  const double l = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  check_close(ly, {1 - l, 2 - l, 3 - l, -std::log(3.0), -std::log(3.0), -std::log(3.0)});
  // Large logits stay finite (max-shifted).
  Tensor big = make({1000, 1000}, {1, 2}), yb = empty({1, 2});
  ref()->softmax(big, yb);
  check_close(yb, {0.5, 0.5});
}

TEST_CASE("ref: softmax and log_softmax backward") {
  Tensor y = make({0.5, 0.5}, {1, 2}), dy = make({1, 0}, {1, 2}), dx = empty({1, 2});
  ref()->softmax_backward(y, dy, dx);  // y * (dy - sum(dy y)) = [.5 * .5, .5 * -.5]
  check_close(dx, {0.25, -0.25});
  Tensor ly = make({std::log(0.25), std::log(0.75)}, {1, 2}), dly = make({1, 1}, {1, 2});
  ref()->log_softmax_backward(ly, dly, dx);  // dy - exp(y) sum(dy) = 1 - 2 p
  check_close(dx, {0.5, -0.5});
}

TEST_CASE("ref: layer_norm of a known vector, f32 and f64 statistics") {
  const double rs = 1 / std::sqrt(1.25 + double(1e-5f));
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = make({1, 2, 3, 4}, {1, 4}, dt), w = make({2, 2, 2, 2}, {4}, dt), b = make({1, 1, 1, 1}, {4}, dt);
    Tensor y = empty({1, 4}, dt), mean = empty({1}, dt), rstd = empty({1}, dt);
    ref()->layer_norm(x, w, b, y, mean, rstd, 1e-5f);
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    check_close(mean, {2.5}, tol);
    check_close(rstd, {rs}, tol);
    check_close(y, {1 - 3 * rs, 1 - rs, 1 + rs, 1 + 3 * rs}, tol);
    // Undefined weight and bias: plain normalisation.
    ref()->layer_norm(x, Tensor(), Tensor(), y, mean, rstd, 1e-5f);
    check_close(y, {-1.5 * rs, -0.5 * rs, 0.5 * rs, 1.5 * rs}, tol);
  }
}

TEST_CASE("ref: layer_norm_backward on analytic cases") {
  // Two rows; dy = 1 everywhere: dx = rstd (1 - 1 - xhat * mean(xhat)) = 0; dbias = rows; dweight = sum xhat = 0.
  Tensor x = make({1, 2, 3, 4, 0, 0, 2, 2}, {2, 4}, DType::f64);
  Tensor y = empty({2, 4}, DType::f64), mean = empty({2}, DType::f64), rstd = empty({2}, DType::f64);
  ref()->layer_norm(x, Tensor(), Tensor(), y, mean, rstd, 0.0f);
  Tensor dy = make(Vec(8, 1.0), {2, 4}, DType::f64), dx = empty({2, 4}, DType::f64);
  Tensor dw = make({9, 9, 9, 9}, {4}, DType::f64), db = make({9, 9, 9, 9}, {4}, DType::f64);
  ref()->layer_norm_backward(x, make({1, 1, 1, 1}, {4}, DType::f64), mean, rstd, dy, dx, dw, db);
  check_close(dx, Vec(8, 0.0), 1e-12);
  check_close(db, {2, 2, 2, 2}, 0);  // overwritten, not accumulated
  // xhat rows: [-3,-1,1,3]/sqrt(5) and [-1,-1,1,1]
  const double s5 = std::sqrt(5.0);
  check_close(dw, {-3 / s5 - 1, -1 / s5 - 1, 1 / s5 + 1, 3 / s5 + 1}, 1e-12);
  // dy = xhat of row 1 (a pure scale direction): dx = rstd (xhat - xhat * mean(xhat^2)) = 0.
  Tensor dy2 = make({0, 0, 0, 0, -1, -1, 1, 1}, {2, 4}, DType::f64);
  ref()->layer_norm_backward(x, Tensor(), mean, rstd, dy2, dx, dw, db);
  check_close(dx, Vec(8, 0.0), 1e-12);
}

TEST_CASE("ref: layer_norm with [G, D] weight / bias is one call per group of rows") {
  // 3 groups of 2 rows of 4 (x [3, 2, 4]); each group's parameter row differs, so reading the wrong row shows.
  Vec xv(24), wv(12), bv(12), gv(24);
  for (size_t i = 0; i < 24; ++i) {
    xv[i] = std::sin(double(i) * 1.7) + 0.1 * double(i);
    gv[i] = std::cos(double(i) * 0.9);
  }
  for (size_t i = 0; i < 12; ++i) {
    wv[i] = 0.5 + 0.1 * double(i);
    bv[i] = -0.3 + 0.05 * double(i);
  }
  const DType dt = DType::f64;
  Tensor x = make(xv, {3, 2, 4}, dt), w = make(wv, {3, 4}, dt), b = make(bv, {3, 4}, dt), dy = make(gv, {3, 2, 4}, dt);
  Tensor y = empty({3, 2, 4}, dt), mean = empty({6}, dt), rstd = empty({6}, dt);
  ref()->layer_norm(x, w, b, y, mean, rstd, 1e-5f);
  Tensor dx = empty({3, 2, 4}, dt), dw = empty({3, 4}, dt), db = empty({3, 4}, dt);
  ref()->layer_norm_backward(x, w, mean, rstd, dy, dx, dw, db);
  for (int64_t g = 0; g < 3; ++g) {
    auto part = [&](const Vec& v, int64_t n) { return Vec(v.begin() + g * n, v.begin() + (g + 1) * n); };
    Tensor xg = make(part(xv, 8), {2, 4}, dt), wg = make(part(wv, 4), {4}, dt), bg = make(part(bv, 4), {4}, dt);
    Tensor yg = empty({2, 4}, dt), mg = empty({2}, dt), rg = empty({2}, dt);
    ref()->layer_norm(xg, wg, bg, yg, mg, rg, 1e-5f);
    Tensor dxg = empty({2, 4}, dt), dwg = empty({4}, dt), dbg = empty({4}, dt);
    ref()->layer_norm_backward(xg, wg, mg, rg, make(part(gv, 8), {2, 4}, dt), dxg, dwg, dbg);
    const double* yp = y.data_as<double>() + g * 8;
    const double* dxp = dx.data_as<double>() + g * 8;
    for (int64_t i = 0; i < 8; ++i) {
      CHECK(yp[i] == yg.data_as<double>()[i]);
      CHECK(dxp[i] == dxg.data_as<double>()[i]);
    }
    for (int64_t j = 0; j < 4; ++j) {
      CHECK(dw.data_as<double>()[g * 4 + j] == dwg.data_as<double>()[j]);
      CHECK(db.data_as<double>()[g * 4 + j] == dbg.data_as<double>()[j]);
    }
  }
  // Groups that do not divide the rows, or parameters of two shapes, are refused.
  Tensor w4 = make(Vec(16, 1.0), {4, 4}, dt), y2 = empty({3, 2, 4}, dt);
  CHECK_THROWS_WITH_AS(ref()->layer_norm(x, w4, Tensor(), y2, mean, rstd, 1e-5f),
                       doctest::Contains("do not split into 4 equal groups"), dew::Error);
  CHECK_THROWS_WITH_AS(ref()->layer_norm(x, w, make(Vec(4, 0.0), {4}, dt), y2, mean, rstd, 1e-5f),
                       doctest::Contains("must all be [4] or all [G, 4]"), dew::Error);
}

TEST_CASE("ref: rms_norm and its backward") {
  Tensor x = make({3, 4}, {1, 2}, DType::f64), y = empty({1, 2}, DType::f64), rstd = empty({1}, DType::f64);
  // weight 0 with offset 1 scales by 1 (Gemma-style (1 + w)).
  ref()->rms_norm(x, make({0, 0}, {2}, DType::f64), y, rstd, 0.0f, 1.0f);
  const double r = 1 / std::sqrt(12.5);
  check_close(rstd, {r}, 1e-14);
  check_close(y, {3 * r, 4 * r}, 1e-14);
  // dy along x (the radial direction) has no gradient; dweight = dy * xhat.
  Tensor dy = make({3, 4}, {1, 2}, DType::f64), dx = empty({1, 2}, DType::f64), dw = empty({2}, DType::f64);
  ref()->rms_norm_backward(x, make({0, 0}, {2}, DType::f64), rstd, dy, dx, dw, 1.0f, false);
  check_close(dx, {0, 0}, 1e-12);
  check_close(dw, {9 * r, 16 * r}, 1e-12);
}

TEST_CASE("ref: group_norm over NCHW") {
  // N=1, C=2, HW=2: channel 0 = [0, 2], channel 1 = [4, 6].
  Tensor x = make({0, 2, 4, 6}, {1, 2, 2, 1}, DType::f64), y = empty({1, 2, 2, 1}, DType::f64);
  Tensor m1 = empty({1, 1}, DType::f64), r1 = empty({1, 1}, DType::f64);
  ref()->group_norm(x, Tensor(), Tensor(), y, m1, r1, 1, 0.0f);  // one group: mean 3, var 5
  check_close(m1, {3}, 1e-14);
  const double s5 = std::sqrt(5.0);
  check_close(y, {-3 / s5, -1 / s5, 1 / s5, 3 / s5}, 1e-14);
  Tensor m2 = empty({1, 2}, DType::f64), r2 = empty({1, 2}, DType::f64);
  ref()->group_norm(x, make({1, 10}, {2}, DType::f64), make({0, 100}, {2}, DType::f64), y, m2, r2, 2, 0.0f);
  check_close(m2, {1, 5}, 1e-14);  // per channel: var 1
  check_close(y, {-1, 1, 90, 110}, 1e-14);
  // Backward with dy = 1: dx = 0, dbias = HW per channel, dweight = sum xhat = 0.
  Tensor dx = empty({1, 2, 2, 1}, DType::f64), dw = empty({2}, DType::f64), db = empty({2}, DType::f64);
  ref()->group_norm_backward(x, make({1, 10}, {2}, DType::f64), m2, r2, make(Vec(4, 1.0), {1, 2, 2, 1}, DType::f64), dx,
                             dw, db, 2);
  check_close(dx, {0, 0, 0, 0}, 1e-12);
  check_close(dw, {0, 0}, 1e-12);
  check_close(db, {2, 2}, 0);
}

// ---------------------------------------------------------------- indexing and rope

TEST_CASE("ref: gather_rows, scatter_add_rows and the index check") {
  Tensor table = make({0, 1, 10, 11, 20, 21}, {3, 2}), idx = ints({2, 0, 2}, {1, 3}), out = empty({1, 3, 2});
  ref()->gather_rows(table, idx, out);
  check_close(out, {20, 21, 0, 1, 20, 21}, 0);

  Tensor dsrc = make({1, 1, 1, 1, 1, 1}, {3, 2});
  ref()->scatter_add_rows(make({1, 2, 3, 4, 5, 6}, {1, 3, 2}), idx, dsrc);  // += ; row 2 twice
  check_close(dsrc, {4, 5, 1, 1, 7, 9}, 0);

  Tensor bad = ints({0, 3}, {1, 2}), out2 = empty({1, 2, 2});
  try {
    ref()->gather_rows(table, bad, out2);
    FAIL("no error for an out-of-range index");
  } catch (const dew::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("index 3") != std::string::npos);
    CHECK(msg.find("[0, 3)") != std::string::npos);
  }
  CHECK_THROWS_AS(ref()->scatter_add_rows(out2, ints({-1, 0}, {1, 2}), dsrc), dew::Error);
  check_close(dsrc, {4, 5, 1, 1, 7, 9}, 0);  // untouched by the refused call
}

TEST_CASE("ref: rope rotates half pairs by position * theta^(-2i/d)") {
  // x [B=1, T=2, H=1, D=4], rotary_dim 4 -> pairs (0,2), (1,3) with freqs 1 and theta^-0.5 = 0.01.
  Tensor x = make({1, 1, 0, 0, 1, 1, 0, 0}, {1, 2, 1, 4}, DType::f64), y = empty({1, 2, 1, 4}, DType::f64);
  Tensor pos = ints({0, 1}, {2});
  RopeParams p;  // theta 10000
  ref()->rope(x, pos, y, p);
  check_close(y, {1, 1, 0, 0, std::cos(1.0), std::cos(0.01), std::sin(1.0), std::sin(0.01)}, 1e-12);
  Tensor back = empty({1, 2, 1, 4}, DType::f64);
  p.inverse = true;
  ref()->rope(y, pos, back, p);
  check_close(back, x.to_doubles(), 1e-12);
  // rotary_dim 2: only features 0, 1 rotate; 2, 3 are copied. Positions per batch [B, T].
  Tensor x2 = make({1, 0, 7, 8, 1, 0, 7, 8}, {2, 1, 1, 4}, DType::f64), y2 = empty({2, 1, 1, 4}, DType::f64);
  RopeParams q;
  q.rotary_dim = 2;
  ref()->rope(x2, ints({0, 2}, {2, 1}), y2, q);
  check_close(y2, {1, 0, 7, 8, std::cos(2.0), std::sin(2.0), 7, 8}, 1e-12);
}

// ---------------------------------------------------------------- attention

namespace {
struct Attn {
  Tensor out, lse;
};
Attn attend(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  const Shape& qs = q.shape();
  Attn r{empty({qs[0], qs[1], qs[2], v.size(3)}, q.dtype()), empty({qs[0], qs[2], qs[1]}, q.dtype())};
  ref()->attention(q, k, v, Tensor(), r.out, r.lse, p);
  return r;
}
}  // namespace

TEST_CASE("ref: attention with one key returns v") {
  Tensor q = make({0.3, -0.7}, {1, 1, 1, 2}, DType::f64), k = make({2, 5}, {1, 1, 1, 2}, DType::f64);
  Tensor v = make({4, -2}, {1, 1, 1, 2}, DType::f64);
  AttentionParams p;
  p.scale = 0.5f;
  Attn r = attend(q, k, v, p);
  check_close(r.out, {4, -2}, 1e-14);
  check_close(r.lse, {0.5 * (0.6 - 3.5)}, 1e-14);  // the lone score
  // Backward: P = 1 -> dv = dout, and dS = dP - rowsum(dO * O) = 0 -> dq = dk = 0.
  Tensor dout = make({1, 3}, {1, 1, 1, 2}, DType::f64);
  Tensor dq = empty({1, 1, 1, 2}, DType::f64), dk = empty({1, 1, 1, 2}, DType::f64),
         dv = empty({1, 1, 1, 2}, DType::f64);
  ref()->attention_backward(q, k, v, Tensor(), r.out, r.lse, dout, dq, dk, dv, p);
  check_close(dv, {1, 3}, 1e-14);
  check_close(dq, {0, 0}, 1e-14);
  check_close(dk, {0, 0}, 1e-14);
}

TEST_CASE("ref: causal attention T = S = 2 by hand, and its backward") {
  // D = 1, scale 1: q = [1, 1], k = [0, ln 3] -> row 1 weights [1/4, 3/4]; row 0 sees key 0 only.
  const double l3 = std::log(3.0);
  Tensor q = make({1, 1}, {1, 2, 1, 1}, DType::f64), k = make({0, l3}, {1, 2, 1, 1}, DType::f64);
  Tensor v = make({10, 20}, {1, 2, 1, 1}, DType::f64);
  AttentionParams p;  // causal, scale 1
  Attn r = attend(q, k, v, p);
  check_close(r.out, {10, 0.25 * 10 + 0.75 * 20}, 1e-14);
  check_close(r.lse, {0, std::log(4.0)}, 1e-14);
  // dout = [0, 1]: dv = P^T dO = [1/4, 3/4]; row 1: dP = [10, 20], Di = 17.5, dS = P (dP - Di) = [-15/8, 15/8];
  // dq1 = sum dS k = 15/8 ln 3; dk = dS q1 = [-15/8, 15/8].
  Tensor dout = make({0, 1}, {1, 2, 1, 1}, DType::f64);
  Tensor dq = empty({1, 2, 1, 1}, DType::f64), dk = empty({1, 2, 1, 1}, DType::f64),
         dv = empty({1, 2, 1, 1}, DType::f64);
  ref()->attention_backward(q, k, v, Tensor(), r.out, r.lse, dout, dq, dk, dv, p);
  check_close(dv, {0.25, 0.75}, 1e-14);
  check_close(dq, {0, 15.0 / 8 * l3}, 1e-13);
  check_close(dk, {-15.0 / 8, 15.0 / 8}, 1e-13);
  // Non-causal: row 0 also sees key 1.
  p.causal = false;
  check_close(attend(q, k, v, p).out, {17.5, 17.5}, 1e-14);
}

TEST_CASE("ref: attention window, q_offset, GQA and softcap") {
  // T = S = 3, D = 1, all scores 0: window 2 averages the current and previous key.
  Tensor z = make({0, 0, 0}, {1, 3, 1, 1}, DType::f64), v = make({3, 6, 9}, {1, 3, 1, 1}, DType::f64);
  AttentionParams w;
  w.window = 2;
  check_close(attend(z, z, v, w).out, {3, 4.5, 7.5}, 1e-14);
  // One query at position 2 (q_offset 2) of a causal cache of 3 keys sees all three.
  AttentionParams off;
  off.q_offset = 2;
  check_close(attend(make({0}, {1, 1, 1, 1}, DType::f64), z, v, off).out, {6}, 1e-14);
  // Causal with q_offset -1: position -1 sees no key, so the row outputs 0 and lse = -inf.
  off.q_offset = -1;
  Attn none = attend(make({0}, {1, 1, 1, 1}, DType::f64), z, v, off);
  check_close(none.out, {0}, 0);
  CHECK(std::isinf(none.lse.item()));
  CHECK(none.lse.item() < 0);
  // GQA: Hq = 2, Hkv = 1 -> both query heads read the single kv head.
  Tensor q2 = make({1, 1}, {1, 1, 2, 1}, DType::f64), k1 = make({5}, {1, 1, 1, 1}, DType::f64);
  Tensor v1 = make({7}, {1, 1, 1, 1}, DType::f64);
  check_close(attend(q2, k1, v1, AttentionParams{}).out, {7, 7}, 1e-14);
  // Softcap 1: raw scores [0, 2] become [0, tanh 2].
  Tensor q = make({1}, {1, 1, 1, 1}, DType::f64), k = make({0, 2}, {1, 2, 1, 1}, DType::f64);
  Tensor v2 = make({0, 1}, {1, 2, 1, 1}, DType::f64);
  AttentionParams c;
  c.causal = false;
  c.softcap = 1.0f;
  const double e = std::exp(std::tanh(2.0));
  Attn rc = attend(q, k, v2, c);
  check_close(rc.out, {e / (1 + e)}, 1e-14);
  check_close(rc.lse, {std::log(1 + e)}, 1e-14);
}

// ---------------------------------------------------------------- conv2d

TEST_CASE("ref: conv2d 3x3 on a known 4x4 input, with padding and stride") {
  Vec xs(16);
  for (int i = 0; i < 16; ++i) xs[size_t(i)] = i + 1;
  Tensor x = make(xs, {1, 1, 4, 4}), w = make(Vec(9, 1.0), {1, 1, 3, 3}), y = empty({1, 1, 2, 2});
  ref()->conv2d(x, w, make({0.5}, {1}), y, {});
  check_close(y, {54.5, 63.5, 90.5, 99.5}, 0);  // 3x3 window sums + bias
  Conv2dParams sp;
  sp.pad_h = sp.pad_w = 1;
  sp.stride_h = sp.stride_w = 2;
  ref()->conv2d(x, w, Tensor(), y, sp);
  check_close(y, {14, 30, 57, 99}, 0);
  // Dilation 2 on a 5x5 with a 2x2 kernel of ones picks x[i,j] + x[i,j+2] + x[i+2,j] + x[i+2,j+2].
  Vec x5(25);
  for (int i = 0; i < 25; ++i) x5[size_t(i)] = i;
  Conv2dParams dp;
  dp.dilation_h = dp.dilation_w = 2;
  Tensor y3 = empty({1, 1, 3, 3});
  ref()->conv2d(make(x5, {1, 1, 5, 5}), make(Vec(4, 1.0), {1, 1, 2, 2}), Tensor(), y3, dp);
  check_close(y3, {24, 28, 32, 44, 48, 52, 64, 68, 72}, 0);
}

TEST_CASE("ref: conv2d backwards and groups") {
  Vec xs(16);
  for (int i = 0; i < 16; ++i) xs[size_t(i)] = i + 1;
  Tensor x = make(xs, {1, 1, 4, 4}), w = make(Vec(9, 1.0), {1, 1, 3, 3}), dy = make(Vec(4, 1.0), {1, 1, 2, 2});
  Tensor dx = empty({1, 1, 4, 4});
  ref()->conv2d_backward_data(dy, w, dx, {});  // how many windows cover each pixel
  check_close(dx, {1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1}, 0);
  Tensor dw = empty({1, 1, 3, 3}), db = empty({1});
  ref()->conv2d_backward_weight(x, dy, dw, db, {});  // 2x2 sums of x shifted by (kh, kw)
  check_close(dw, {14, 18, 22, 30, 34, 38, 46, 50, 54}, 0);
  check_close(db, {4}, 0);
  // groups = 2 (depthwise): channel c only sees input channel c.
  Tensor x2 = make({1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2}), w2 = make({1, 0, 0, 0, 0, 0, 0, 1}, {2, 1, 2, 2});
  Tensor y2 = empty({1, 2, 1, 1});
  Conv2dParams g;
  g.groups = 2;
  ref()->conv2d(x2, w2, Tensor(), y2, g);
  check_close(y2, {1, 40}, 0);
}

// ---------------------------------------------------------------- loss and optimizers

TEST_CASE("ref: cross_entropy of uniform logits is log V, backward, ignore_index") {
  Tensor logits = make({0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}, {3, 4}), t = ints({1, -100, 3}, {3});
  Tensor loss = empty({3}), lse = empty({3});
  CrossEntropyParams p;
  ref()->cross_entropy(logits, t, loss, lse, p);
  const double l = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0));
  check_close(loss, {std::log(4.0), 0, l - 4});
  check_close(lse, {std::log(4.0), std::log(4.0), l});
  Tensor dl = empty({3, 4});
  ref()->cross_entropy_backward(logits, t, lse, make({2, 1, 1}, {3}), dl, p);
  Vec want = {0.5, 0.5 - 2, 0.5, 0.5, 0, 0, 0, 0};
  for (int j = 0; j < 4; ++j) want.push_back(std::exp(j + 1 - l) - (j == 3 ? 1 : 0));
  check_close(dl, want);
  CHECK_THROWS_AS(ref()->cross_entropy(logits, ints({4, 0, 0}, {3}), loss, lse, p), dew::Error);
}

TEST_CASE("ref: adamw first step moves by lr * sign(g), with decoupled decay") {
  Tensor param = make({1, 1, -2}, {3}), grad = make({0.5, -3, 1e-3}, {3}), m = make({0, 0, 0}, {3}),
         v = make({0, 0, 0}, {3});
  AdamWParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.5f;
  ref()->adamw_update(param, grad, m, v, p);
  // p = p (1 - lr wd) - lr g / (|g| + eps')  with m_hat = g, v_hat = g^2.
  check_close(param, {0.95 - 0.1, 0.95 + 0.1, -1.9 - 0.1}, 1e-5);
  check_close(m, {0.05, -0.3, 1e-4}, 1e-6);
  check_close(v, {0.00025, 0.009, 1e-9}, 1e-6);
  // Second step with the same gradient: m_hat = g, v_hat = g^2 again -> the same move (no decay here).
  p.step = 2;
  p.weight_decay = 0;
  ref()->adamw_update(param, grad, m, v, p);
  check_close(param, {0.75, 1.15, -2.1}, 1e-5);
  // grad_scale folds in before the moments.
  Tensor p2 = make({0}, {1}), m2 = make({0}, {1}), v2 = make({0}, {1});
  AdamWParams s;
  s.grad_scale = 0.5f;
  ref()->adamw_update(p2, make({4}, {1}), m2, v2, s);
  check_close(m2, {0.2}, 1e-6);
}

TEST_CASE("ref: sgd momentum / nesterov and lamb trust ratio") {
  Tensor param = make({1}, {1}), buf = make({123}, {1});
  SgdParams p;
  p.lr = 0.1f;
  p.momentum = 0.9f;
  p.weight_decay = 0.1f;
  ref()->sgd_update(param, make({1}, {1}), buf, p);  // g = 1 + 0.1; buf = g (step 1); p = 1 - 0.11
  check_close(buf, {1.1});
  check_close(param, {0.89});
  p.step = 2;
  p.nesterov = true;
  ref()->sgd_update(param, make({1}, {1}), buf, p);  // g = 1.089; buf = 0.99 + 1.089; g' = g + 0.9 buf
  const double g = 1.089, b = 0.9 * 1.1 + g;
  check_close(buf, {b});
  check_close(param, {0.89 - 0.1 * (g + 0.9 * b)});
  Tensor plain = make({1}, {1}), no_buffer;
  SgdParams q;  // momentum 0: no buffer needed
  ref()->sgd_update(plain, make({2}, {1}), no_buffer, q);
  check_close(plain, {0.98});

  // LAMB step 1: r = sign(g) (|g| >> eps), ||p|| = 5, ||r|| = sqrt 2 -> p -= lr * 5 / sqrt 2 * sign(g).
  Tensor lp = make({3, 4}, {2}), lm = make({0, 0}, {2}), lv = make({0, 0}, {2});
  LambParams l;
  l.lr = 0.01f;
  ref()->lamb_update(lp, make({1, -2}, {2}), lm, lv, l);
  const double step = 0.01 * 5 / std::sqrt(2.0);
  check_close(lp, {3 - step, 4 + step}, 1e-5);
}

// ---------------------------------------------------------------- random

TEST_CASE("ref: random and dropout follow dew::philox exactly") {
  Tensor u = empty({10});
  RandomParams p;
  p.seed = 42;
  p.stream = 7;
  p.offset = 5;
  ref()->random(u, p);
  const Vec got = u.to_doubles();
  for (int i = 0; i < 10; ++i) CHECK(got[size_t(i)] == double(philox::uniform(42, 7, 5 + uint64_t(i))));
  Tensor n = empty({6}, DType::f64);
  p.dist = Distribution::normal;
  p.a = 1.0f;
  p.b = 2.0f;
  ref()->random(n, p);
  const Vec gn = n.to_doubles();
  for (int i = 0; i < 6; ++i) CHECK(gn[size_t(i)] == 1.0 + 2.0 * double(philox::normal(42, 7, 5 + uint64_t(i))));

  Tensor x = make(Vec(64, 3.0), {64}), y = empty({64}), mask = empty({64});
  DropoutParams d;
  d.p = 0.25f;
  d.seed = 9;
  d.stream = 1;
  d.offset = 100;
  ref()->dropout(x, y, mask, d);
  const Vec ys = y.to_doubles(), ms = mask.to_doubles();
  int kept = 0;
  for (int i = 0; i < 64; ++i) {
    const bool keep = philox::uniform(9, 1, 100 + uint64_t(i)) >= 0.25f;
    kept += keep;
    CHECK(ms[size_t(i)] == doctest::Approx(keep ? 4.0 / 3.0 : 0.0));
    CHECK(ys[size_t(i)] == doctest::Approx(keep ? 4.0 : 0.0));
  }
  CHECK(kept > 32);  // ~48 expected
  CHECK(kept < 64);
}
