// tests/train/test_optim.cpp — the optimizers of core/train/optim_*.cpp against independent double
// computations: Muon's Newton–Schulz orthogonalisation (the iteration in double, and the singular values it
// produces), Muon's matrix step (the Moonlight-scaled formula in double), its AdamW groups (AdamW's update
// bit for bit), the parameter groups of adamw and sgd (the fused kernels with the group's lr and weight
// decay), and the RMS of a Muon step.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/optim.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

namespace {

dew::BackendPtr backend(const char* name) {
  dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu"});
  return dew::create_backend(name);
}

using Matrix = std::vector<double>;  // row-major

// C [m, n] = A [m, k] B [k, n], optionally with A or B transposed as stored.
Matrix matmul(const Matrix& a, const Matrix& b, int64_t m, int64_t n, int64_t k, bool ta = false, bool tb = false) {
  Matrix c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += (ta ? a[l * m + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * n + j]);
      c[size_t(i * n + j)] = s;
    }
  return c;
}

// The quintic Newton–Schulz iteration of Jordan et al., written out in double on [rows, cols] (with the
// coefficients and eps as the kernels receive them: rounded to float).
Matrix newton_schulz_reference(Matrix x, int64_t rows, int64_t cols, int steps) {
  const double a = double(3.4445f), b = double(-4.7750f), c = double(2.0315f);
  double norm = 0;
  for (double v : x) norm += v * v;
  norm = std::sqrt(norm) + double(1e-7f);
  for (double& v : x) v /= norm;
  const bool tall = rows > cols;
  const int64_t n = tall ? cols : rows;
  for (int s = 0; s < steps; ++s) {
    const Matrix g = tall ? matmul(x, x, n, n, rows, true, false) : matmul(x, x, n, n, cols, false, true);
    Matrix p = matmul(g, g, n, n, n);
    for (size_t i = 0; i < p.size(); ++i) p[i] = b * g[i] + c * p[i];
    const Matrix px = tall ? matmul(x, p, rows, cols, cols) : matmul(p, x, rows, cols, rows);
    for (size_t i = 0; i < x.size(); ++i) x[i] = a * x[i] + px[i];
  }
  return x;
}

// Eigenvalues of a symmetric n x n matrix (cyclic Jacobi rotations, double).
std::vector<double> symmetric_eigenvalues(Matrix s, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) off += s[p * n + q] * s[p * n + q];
    if (off < 1e-24) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = s[p * n + q];
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (s[q * n + q] - s[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double skp = s[k * n + p], skq = s[k * n + q];
          s[k * n + p] = c * skp - sn * skq;
          s[k * n + q] = sn * skp + c * skq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double spk = s[p * n + k], sqk = s[q * n + k];
          s[p * n + k] = c * spk - sn * sqk;
          s[q * n + k] = sn * spk + c * sqk;
        }
      }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ev[size_t(i)] = s[i * n + i];
  std::sort(ev.begin(), ev.end());
  return ev;
}

// Singular values of x [rows, cols] from the eigenvalues of its Gram matrix on the smaller side.
std::vector<double> singular_values(const Matrix& x, int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  const int64_t n = tall ? cols : rows;
  const Matrix g = tall ? matmul(x, x, n, n, rows, true, false) : matmul(x, x, n, n, cols, false, true);
  std::vector<double> sv = symmetric_eigenvalues(g, n);
  for (double& v : sv) v = std::sqrt(std::max(v, 0.0));
  return sv;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

dew::Options optim(std::map<std::string, std::string> kv) { return dew::Options(std::move(kv), "optim"); }

}  // namespace

TEST_CASE("newton_schulz5 equals the double-precision iteration and pushes the singular values into the band") {
  // wide, tall, very wide, and square (a square Gaussian matrix has tiny singular values: no band there)
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{48, 96}, {96, 48}, {24, 128}, {40, 40}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    const auto ref = backend("ref");
    const dew::Tensor g64 =
        dew::Tensor::normal({rows, cols}, 0.0f, 1.0f, 7, uint64_t(rows * 1000 + cols), ref, dew::DType::f64);
    const Matrix g = g64.to_doubles();
    const Matrix want = newton_schulz_reference(g, rows, cols, 5);

    // The premise of the band: the normalised input's singular values are >= 0.01 and far from 1.
    double fro = 0;
    for (double v : g) fro += v * v;
    std::vector<double> sg = singular_values(g, rows, cols);
    for (double& v : sg) v /= std::sqrt(fro);
    const bool in_band_premise = sg.front() >= 0.01;
    CHECK(in_band_premise == (rows != cols));
    CHECK(sg.back() < 0.5);

    // ref in f64: the same iteration to rounding.
    CHECK(max_abs_diff(dew::newton_schulz5(g64, 5).to_doubles(), want) < 1e-12);
    // ref and cpu in f32: the same up to f32 rounding through five iterations.
    for (const char* be : {"ref", "cpu"}) {
      CAPTURE(be);
      const dew::Tensor g32 =
          dew::Tensor::from_vector(std::vector<float>(g.begin(), g.end()), {rows, cols}, backend(be));
      const std::vector<float> got32 = dew::newton_schulz5(g32, 5).to_floats();
      const Matrix got(got32.begin(), got32.end());
      CHECK(max_abs_diff(got, want) < 5e-6);
      // Singular values in the documented band [0.68, 1.14] (dew/optim.hpp), all of them.
      const std::vector<double> so = singular_values(got, rows, cols);
      CHECK(so.back() <= 1.21);
      if (in_band_premise) {
        CHECK(so.front() >= 0.68);
        CHECK(so.back() <= 1.14);
      }
    }
    // A cubic Newton-Schulz (a, b, c) = (1.5, -0.5, 0) would differ: the comparison can tell iterations apart.
    CHECK(max_abs_diff(newton_schulz_reference(g, rows, cols, 4), want) > 1e-2);
  }
  CHECK_THROWS_AS(dew::newton_schulz5(dew::Tensor::zeros({4}, dew::DType::f32, backend("ref")), 5), dew::Error);
}

namespace {

struct Net {
  dew::NamedTensors params;
};

// A small "model": an embedding, a hidden matrix, a conv filter, a bias, a norm gain and a head.
Net make_net(const dew::BackendPtr& be, dew::DType dt) {
  Net n;
  const std::vector<std::pair<std::string, dew::Shape>> shapes = {
      {"tok_emb.weight", {16, 8}},   {"layers.0.weight", {12, 8}}, {"layers.0.bias", {12}},
      {"conv.weight", {6, 2, 3, 3}}, {"norm.weight", {8}},         {"lm_head.weight", {16, 8}}};
  uint64_t stream = 1;
  for (const auto& [name, shape] : shapes) {
    dew::Tensor p = dew::Tensor::normal(shape, 0.0f, 0.5f, 3, stream++, be, dt);
    p.set_requires_grad();
    n.params.emplace_back(name, p);
  }
  return n;
}

void set_grads(Net& n, uint64_t seed) {
  uint64_t stream = 100;
  for (auto& [name, p] : n.params)
    p.set_grad(dew::Tensor::normal(p.shape(), 0.0f, 1.0f, seed, stream++, p.backend_ptr(), p.dtype()));
}

}  // namespace

TEST_CASE("muon: the AdamW groups get adamw's update bit for bit, the matrices do not") {
  for (const char* be_name : {"ref", "cpu"}) {
    CAPTURE(be_name);
    const auto be = backend(be_name);
    Net a = make_net(be, dew::DType::f32), b = make_net(be, dew::DType::f32);
    const std::map<std::string, std::string> common = {{"weight_decay", "0.1"}, {"betas", "0.9, 0.95"}};
    auto mk = [&](const char* name, Net& n) {
      auto kv = common;
      kv["name"] = name;
      return dew::make_optimizer(optim(kv), n.params);
    };
    auto muon = mk("muon", a), adamw = mk("adamw", b);
    for (int64_t step = 1; step <= 3; ++step) {
      set_grads(a, uint64_t(step));
      set_grads(b, uint64_t(step));
      muon->update(3e-2f, step == 2 ? 0.5f : 1.0f, step);
      adamw->update(3e-2f, step == 2 ? 0.5f : 1.0f, step);
    }
    for (size_t i = 0; i < a.params.size(); ++i) {
      const std::string& name = a.params[i].first;
      CAPTURE(name);
      const bool matrix = name == "layers.0.weight" || name == "conv.weight";
      const auto pa = a.params[i].second.to_floats(), pb = b.params[i].second.to_floats();
      if (matrix)
        CHECK(pa != pb);
      else
        CHECK(pa == pb);  // exactly
    }
    const auto st = muon->state();
    REQUIRE(st.count("momentum"));
    CHECK(st.at("momentum").size() == 2);  // the matrix and the conv filter
    CHECK(st.at("m").size() == 4);
    CHECK(st.at("v").size() == 4);
  }
}

TEST_CASE("muon: one matrix step equals the Moonlight-scaled formula computed in double") {
  const auto ref = backend("ref");
  const int64_t rows = 12, cols = 8;
  dew::Tensor p = dew::Tensor::normal({rows, cols}, 0.0f, 0.5f, 5, 1, ref, dew::DType::f64);
  p.set_requires_grad();
  dew::NamedTensors params{{"layers.0.weight", p}};
  const double lr = 0.02, wd = 0.1, mu = 0.9, gscale = 0.75;
  auto opt = dew::make_optimizer(optim({{"name", "muon"}, {"weight_decay", "0.1"}, {"momentum", "0.9"}}), params);
  Matrix w = p.to_doubles(), buf(size_t(rows * cols), 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    const dew::Tensor g = dew::Tensor::normal({rows, cols}, 0.0f, 1.0f, 9, uint64_t(step), ref, dew::DType::f64);
    p.set_grad(g);
    opt->update(float(lr), float(gscale), step);
    // the formula of core/train/optim_muon.cpp, in double, from the same f32-rounded hyper-parameters
    const double flr = double(float(lr)), fwd = double(float(wd)), fmu = double(float(mu)), fgs = double(float(gscale));
    Matrix gv = g.to_doubles(), u(gv.size());
    for (size_t i = 0; i < gv.size(); ++i) {
      gv[i] *= fgs;
      buf[i] = fmu * buf[i] + gv[i];
      u[i] = gv[i] + fmu * buf[i];  // Nesterov
    }
    const Matrix o = newton_schulz_reference(u, rows, cols, 5);
    const double k = double(float(flr * double(float(0.2)) * std::sqrt(double(std::max(rows, cols)))));
    for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] * double(float(1.0 - flr * fwd)) - k * o[i];
    CHECK(max_abs_diff(p.to_doubles(), w) < 1e-6);
  }
  CHECK(max_abs_diff(opt->state().at("momentum")[0].second.to_doubles(), buf) < 1e-12);
}

TEST_CASE("muon: a step's RMS is about rms_scale * lr, the RMS of a typical AdamW step") {
  const auto cpu = backend("cpu");
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 128}, {256, 64}}) {
    dew::Tensor p = dew::Tensor::zeros({rows, cols}, dew::DType::f32, cpu);
    p.set_requires_grad();
    dew::NamedTensors params{{"layers.0.weight", p}};
    auto opt = dew::make_optimizer(optim({{"name", "muon"}, {"weight_decay", "0"}}), params);
    p.set_grad(dew::Tensor::normal({rows, cols}, 0.0f, 1.0f, 2, 2, cpu));
    opt->update(1.0f, 1.0f, 1);
    double ss = 0;
    for (float v : p.to_floats()) ss += double(v) * v;
    const double rms = std::sqrt(ss / double(rows * cols));
    CAPTURE(rms);
    CHECK(rms > 0.2 * 0.68);
    CHECK(rms < 0.2 * 1.14);
  }
}

TEST_CASE(
    "parameter groups: adamw and sgd use each group's lr scale and no weight decay on norms, biases, embeddings") {
  const auto ref = backend("ref");
  for (const char* name : {"adamw", "sgd"}) {
    CAPTURE(name);
    Net a = make_net(ref, dew::DType::f32), b = make_net(ref, dew::DType::f32);
    const bool sgd = std::string(name) == "sgd";
    std::map<std::string, std::string> kv = {{"name", name}, {"weight_decay", "0.1"}, {"lr_scale.head", "0.25"}};
    kv[sgd ? "momentum" : "betas"] = sgd ? "0.9" : "0.9, 0.99";
    auto opt = dew::make_optimizer(optim(kv), a.params);
    set_grads(a, 1);
    set_grads(b, 1);
    opt->update(0.1f, 1.0f, 1);
    for (size_t i = 0; i < b.params.size(); ++i) {
      const std::string& pname = b.params[i].first;
      CAPTURE(pname);
      dew::Tensor p = b.params[i].second;
      const dew::ParamRole role = dew::param_role(pname, p.shape());
      const bool decays = role == dew::ParamRole::matrix || role == dew::ParamRole::head;
      const float lr = role == dew::ParamRole::head ? 0.1f * 0.25f : 0.1f, wd = decays ? 0.1f : 0.0f;
      dew::Tensor m = dew::Tensor::zeros(p.shape(), p.dtype(), ref), v = m.clone();
      if (!sgd)
        ref->adamw_update(p, p.grad(), m, v, dew::AdamWParams{lr, 0.9f, 0.99f, 1e-8f, wd, 1.0f, 1});
      else
        ref->sgd_update(p, p.grad(), m, dew::SgdParams{lr, 0.9f, 0.0f, wd, 1.0f, false, 1});
      CHECK(a.params[i].second.to_floats() == p.to_floats());
    }
  }
  // no_decay = none puts weight decay back on every role.
  Net n = make_net(ref, dew::DType::f32);
  for (const auto& p : dew::optim_params(optim({{"no_decay", "none"}}), n.params)) CHECK(p.weight_decay_scale == 1.0f);
}
