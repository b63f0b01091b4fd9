// tests/autograd/gradcheck.hpp — finite-difference gradient checks in double on the `ref` backend.
//
// gradcheck(f, inputs) checks the analytic gradient of L = sum(f(inputs) * R), R a fixed random tensor of
// f's output shape (so every output element matters, with unequal weights), against central differences
// (L(x + h e_j) - L(x - h e_j)) / 2h for up to `max_checks` elements of every input, picked
// deterministically (evenly spaced, always including the first and last element).
//
// Tolerances (craft.md lesson 11): everything runs in f64 on ref, which accumulates in double and keeps
// f64 statistics. With h = 1e-6 the central difference has truncation error ~h^2 |f'''| ~ 1e-12 and
// rounding error ~eps |L| / h ~ 1e-16 * 100 / 1e-6 = 1e-8 for |L| <= 100, so |analytic - numeric| <=
// 1e-6 + 1e-4 |numeric| leaves two orders of magnitude of headroom while any real bug (a missing term,
// a wrong sign, a dropped broadcast) is off by O(1e-2) or more. Inputs are chosen away from kinks
// (relu/abs at 0, clamp bounds, max/min ties) by more than 1e3 h.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/nn.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

namespace gc {

using dew::BackendPtr;
using dew::DType;
using dew::Shape;
using dew::Tensor;

// The ref backend, loaded once from build/lib/dew/plugins (found next to build/bin); also made the
// default backend, where nn modules put their parameters.
inline const BackendPtr& ref() {
  static BackendPtr b = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref")) reg.discover(dew::Registry::default_plugin_dirs());
    BackendPtr be = dew::create_backend("ref");
    dew::set_default_backend(be);
    return be;
  }();
  return b;
}

// A small deterministic generator (splitmix64), independent of the backends under test.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * (1.0 / 9007199254740992.0); }
};

inline std::vector<double> rand_values(int64_t n, double lo, double hi, uint64_t seed) {
  Rng r(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}
// Magnitudes in [lo, hi] with random signs: keeps values away from 0 (kinks of relu/abs, poles of div).
inline std::vector<double> rand_signed_away(int64_t n, double lo, double hi, uint64_t seed) {
  Rng r(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const double m = r.uniform(lo, hi);
    x = (r.next() & 1) ? m : -m;
  }
  return v;
}
// Moves every value at least `margin` away from each of `points` (kinks), deterministically.
inline void nudge_away(std::vector<double>& v, const std::vector<double>& points, double margin) {
  for (auto& x : v) {
    for (int guard = 0; guard < 100; ++guard) {
      bool near = false;
      for (double p : points) near = near || std::fabs(x - p) < margin;
      if (!near) break;
      x += 2.0 * margin;
    }
  }
}

inline Tensor f64(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_host(v.data(), shape, DType::f64, ref());
}
inline Tensor ints(const std::vector<int32_t>& v, const Shape& shape) { return Tensor::from_ints(v, shape, ref()); }
// A uniform f64 tensor on ref in [lo, hi).
inline Tensor rnd(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return f64(rand_values(dew::numel_of(shape), lo, hi, seed), shape);
}
// f64 with magnitudes in [lo, hi] and random signs.
inline Tensor rnd_away(const Shape& shape, uint64_t seed, double lo = 0.2, double hi = 1.0) {
  return f64(rand_signed_away(dew::numel_of(shape), lo, hi, seed), shape);
}
// An f64 copy on ref of any floating tensor (no history).
inline Tensor to_f64(const Tensor& t) { return f64(t.to_doubles(), t.shape()); }

struct Options {
  int max_checks = 64;  // elements checked per input
  double h = 1e-6;      // central-difference step
  double atol = 1e-6;   // see the file comment
  double rtol = 1e-4;
  bool report = true;  // false: only count mismatches (the checker's own tests of wrong backwards)
};

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

inline std::vector<int64_t> pick_elements(int64_t n, int cap) {
  std::vector<int64_t> idx;
  if (n <= cap) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  for (int k = 0; k < cap; ++k) idx.push_back(int64_t(k) * (n - 1) / (cap - 1));  // 0 .. n-1, evenly spaced
  return idx;
}

inline void set_element(Tensor& t, int64_t j, double v) {
  REQUIRE(t.dtype() == DType::f64);
  t.backend().copy_from_host(static_cast<double*>(t.data()) + j, &v, sizeof(double));
}

// Checks d sum(f(inputs) * R) / d inputs. Every input must be an f64 leaf on ref; integer arguments are
// captured by f instead. Returns the number of mismatching elements (also reported through doctest).
inline int gradcheck(const Fn& f, std::vector<Tensor> inputs, const std::string& what, Options o = {}) {
  for (Tensor& x : inputs) {
    REQUIRE(x.defined());
    REQUIRE_MESSAGE(x.dtype() == DType::f64, what, ": gradcheck inputs must be f64");
    x.zero_grad();
    x.set_requires_grad(true);
  }
  // Analytic: one backward of L = sum(y * R).
  Tensor y = f(inputs);
  REQUIRE_MESSAGE(y.requires_grad(), what, ": output does not require gradients");
  REQUIRE(y.dtype() == DType::f64);
  const std::vector<double> r = rand_signed_away(y.numel(), 0.5, 1.5, 1234 + uint64_t(y.numel()));
  Tensor R = f64(r, y.shape());
  Tensor L = dew::sum(dew::mul(y, R));
  L.backward();
  std::vector<std::vector<double>> analytic;
  for (Tensor& x : inputs) {
    Tensor g = x.grad();
    if (g.defined()) {
      REQUIRE_MESSAGE(g.shape() == x.shape(), what, ": gradient shape ", dew::shape_str(g.shape()), " != input shape ",
                      dew::shape_str(x.shape()));
      analytic.push_back(g.to_doubles());
    } else {
      analytic.push_back(std::vector<double>(size_t(x.numel()), 0.0));  // no gradient arrived: must be zero
    }
  }
  // Numeric: L evaluated in double on the host, with recording off (this also runs the ops' no-grad paths,
  // e.g. linear's fused activation epilogue, against the recorded ones).
  auto loss = [&]() {
    dew::NoGradGuard ng;
    Tensor yy = f(inputs);
    REQUIRE(yy.shape() == y.shape());
    const std::vector<double> v = yy.to_doubles();
    double s = 0.0;
    for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
    return s;
  };
  int bad = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    const std::vector<double> host = x.to_doubles();
    int reported = 0;
    for (int64_t j : pick_elements(x.numel(), o.max_checks)) {
      const double x0 = host[size_t(j)];
      set_element(x, j, x0 + o.h);
      const double lp = loss();
      set_element(x, j, x0 - o.h);
      const double lm = loss();
      set_element(x, j, x0);
      const double num = (lp - lm) / (2.0 * o.h);
      const double ana = analytic[i][size_t(j)];
      const bool ok = std::isfinite(ana) && std::fabs(ana - num) <= o.atol + o.rtol * std::fabs(num);
      if (!ok) {
        ++bad;
        if (o.report && reported++ < 4)
          FAIL_CHECK(what << ": input " << i << " " << dew::shape_str(x.shape()) << " element " << j << ": analytic "
                          << ana << " vs numeric " << num);
      }
    }
  }
  if (o.report) CHECK_MESSAGE(bad == 0, what, ": ", bad, " gradient elements mismatch");
  for (Tensor& x : inputs) x.zero_grad();
  return bad;
}

// Elementwise comparison of two tensors' values (any floating dtype), reporting the first mismatches.
inline void check_close(const Tensor& a, const Tensor& b, double atol, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(a.shape() == b.shape(), what, ": shape ", dew::shape_str(a.shape()), " vs ",
                  dew::shape_str(b.shape()));
  const std::vector<double> va = a.to_doubles(), vb = b.to_doubles();
  int bad = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (!(std::fabs(va[i] - vb[i]) <= atol + rtol * std::fabs(vb[i]))) {
      if (bad++ < 4) FAIL_CHECK(what << ": element " << i << ": " << va[i] << " vs " << vb[i]);
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " elements differ");
}
inline void check_values(const Tensor& a, const std::vector<double>& expect, double atol, const std::string& what) {
  check_close(a, f64(expect, a.shape()), atol, 0.0, what);
}

}  // namespace gc
