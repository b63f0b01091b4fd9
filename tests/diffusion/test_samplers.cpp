// tests/diffusion/test_samplers.cpp — the diffusion solvers plugin and dew/sampler.hpp.
// With the analytic denoiser of x0 ~ N(0, s^2 I) (E[x0 | x_t] = a s^2/(a^2 s^2 + sigma^2) x_t):
//  * every solver converges (mean within 0.05 of 0, std within 0.05 of 0.3; 256 samples, 100 steps) on
//    every family it accepts, on ref and cpu;
//  * on the closed-form ODE x(sigma) = x(sigma_max) sqrt(s^2 + sigma^2)/sqrt(s^2 + sigma_max^2) (ve) the
//    20-step errors order rk4 < heun < euler (and dpmpp_2m < euler); the same on flow;
//  * one ddpm step is the DDPM posterior (mean and variance, Ho et al. eq. 6-7) on a linear table;
//  * a seed reproduces a trajectory (bit-exact on one backend, close across ref and cpu), and a sample's
//    trajectory does not depend on the batch it is in (row b of a batch seeded s = a batch of one seeded s + b);
//  * sigma integrators refuse vp schedules;
//  * guidance: scale 1 is the conditional output, outside the interval the network sees only the B
//    conditional rows, inside it one doubled batch whose combination u + s (c - u) is converted once;
//    rescale matches the per-row std of the conditional output.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dew/diffusion.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/sampler.hpp"

using namespace dew::diffusion;
using dew::Tensor;

namespace {

dew::BackendPtr backend(const std::string& name) {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "diffusion_samplers"});
  dew::BackendPtr b = dew::create_backend(name);
  b->set_threads(1);  // tiny tensors: threads only add synchronisation on a shared machine
  return b;
}

std::shared_ptr<Sampler> sampler(const std::string& name, std::map<std::string, std::string> kv = {}) {
  backend("ref");
  dew::Options o(std::move(kv), "sampler");
  auto s = dew::Registry::global().create<Sampler>(name, o);
  o.check_all_used();
  return s;
}

Process process(std::map<std::string, std::string> kv) {
  return make_process(dew::Options(std::move(kv), "objective"));
}

// The optimal denoiser for x0 ~ N(0, s^2 I).
Denoiser analytic(const Process& p, double s) {
  return [p, s](const Tensor& x, const std::vector<double>& t) -> Denoised {
    const RowRates r = p.sample_rates(t);
    std::vector<double> kx(r.rows()), ke(r.rows());
    for (size_t i = 0; i < r.rows(); ++i) {
      const Rates rr = r.row(i);
      kx[i] = rr.alpha * s * s / (rr.alpha * rr.alpha * s * s + rr.sigma * rr.sigma);
      ke[i] = rr.sigma > 0 ? (1.0 - rr.alpha * kx[i]) / rr.sigma : 0.0;
    }
    return {lincomb(kx, x, {0.0}, Tensor()), lincomb(ke, x, {0.0}, Tensor())};
  };
}

std::pair<double, double> mean_std(const Tensor& x) {
  const auto v = x.to_doubles();
  double m = 0, m2 = 0;
  for (double e : v) m += e;
  m /= double(v.size());
  for (double e : v) m2 += (e - m) * (e - m);
  return {m, std::sqrt(m2 / double(v.size() - 1))};
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_doubles(), y = b.to_doubles();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

TEST_CASE("every sampler converges on the analytic denoiser of x0 ~ N(0, 0.3^2 I), on ref and cpu") {
  struct P {
    std::string label;
    std::map<std::string, std::string> kv;
    Family family;
  };
  const std::vector<P> processes = {
      {"linear table", {{"schedule", "linear"}}, Family::vp},
      {"cosine_continuous", {{"schedule", "cosine_continuous"}, {"prediction", "v"}}, Family::vp},
      {"karras", {{"preset", "karras"}}, Family::ve},
      {"edm (karras grid)", {{"preset", "edm"}, {"regime", "latent"}}, Family::ve},
      {"flow shift 3", {{"preset", "flow"}, {"shift", "3"}}, Family::flow},
  };
  struct S {
    std::string name;
    std::map<std::string, std::string> kv;
    std::vector<Family> families;
  };
  const std::vector<Family> all = {Family::vp, Family::ve, Family::flow};
  const std::vector<S> samplers = {
      {"ddpm", {}, all},
      {"ddpm", {{"variance", "large"}}, all},
      {"ddim", {}, all},
      {"ddim", {{"eta", "0.5"}}, all},
      {"euler", {}, all},
      {"euler_ancestral", {}, {Family::ve}},
      {"heun", {}, {Family::ve, Family::flow}},
      {"heun", {{"s_churn", "40"}, {"s_tmin", "0.05"}, {"s_tmax", "50"}}, {Family::ve}},
      {"rk4", {}, {Family::ve, Family::flow}},
      {"dpmpp_2m", {}, all},
  };
  for (const std::string be : {"ref", "cpu"}) {
    const dew::BackendPtr b = backend(be);
    for (const auto& pc : processes) {
      const Process p = process(pc.kv);
      const Tensor x_T = p.noise({256, 16}, dew::DType::f32, b, 1234);
      for (const auto& sc : samplers) {
        if (std::find(sc.families.begin(), sc.families.end(), pc.family) == sc.families.end()) continue;
        std::string opts;
        for (const auto& [k, v] : sc.kv) opts += " " + k + "=" + v;
        INFO(be, " / ", pc.label, " / ", sc.name, opts);
        const Tensor x = sampler(sc.name, sc.kv)->sample(analytic(p, 0.3), x_T, p, 100, 99);
        const auto [m, sd] = mean_std(x);
        CHECK(std::abs(m) < 0.05);
        CHECK(std::abs(sd - 0.3) < 0.05);
      }
    }
  }
}

TEST_CASE("order of accuracy on the closed-form ODE: rk4 < heun < euler over 20 steps (ve and flow)") {
  const dew::BackendPtr b = backend("ref");
  const double s = 0.5;
  for (const auto& kv : std::vector<std::map<std::string, std::string>>{{{"preset", "karras"}}, {{"preset", "flow"}}}) {
    const Process p = process(kv);
    INFO(p.describe());
    // 20 steps; on flow the grid's last point (sigma = 0, where every solver takes a first-order step)
    // is left out so the comparison measures each method's own order.
    std::vector<double> times = p.sample->times(20);
    if (p.sample->rates(times.back()).sigma == 0.0) {
      times = p.sample->times(21);
      times.pop_back();
    }
    REQUIRE(times.size() == 21);
    const double s0 = p.sample->rates(times.front()).sigma, s1 = p.sample->rates(times.back()).sigma;
    const double a0 = p.sample->rates(times.front()).alpha, a1 = p.sample->rates(times.back()).alpha;
    // std of x_t along the ODE: sqrt(a^2 s^2 + sigma^2); the flow end t = 0 is x0 itself.
    const double ratio = std::sqrt(a1 * a1 * s * s + s1 * s1) / std::sqrt(a0 * a0 * s * s + s0 * s0);
    const Tensor x_T = p.noise({64}, dew::DType::f64, b, 5);
    const Tensor exact = lincomb({ratio}, x_T, {0.0}, Tensor());
    std::map<std::string, double> err;
    for (const std::string name : {"euler", "heun", "rk4", "dpmpp_2m"}) {
      const Tensor x = sampler(name)->integrate(analytic(p, s), x_T, times, p, 0);
      err[name] = max_abs_diff(x, exact) / (std::abs(ratio) * 80.0);
      MESSAGE(p.sample->name(), " ", name, " relative error ", err[name]);
    }
    CHECK(err["rk4"] < err["heun"]);
    CHECK(err["heun"] < err["euler"]);
    CHECK(err["dpmpp_2m"] < err["euler"]);
    CHECK(err["rk4"] < 2e-3);
  }
}

TEST_CASE("one ddpm step is the DDPM posterior q(x_s | x_t, x0) on a linear table") {
  const dew::BackendPtr b = backend("ref");
  const Process p = process({{"schedule", "linear"}});
  const auto& table = dynamic_cast<const BetaTable&>(*p.sample);
  const double t = 500, s = 490;
  const double abar_t = table.alphas_cumprod()[500], abar_s = table.alphas_cumprod()[490];
  const double alpha_t = abar_t / abar_s, beta_t = 1 - alpha_t;  // the strided step's alpha and beta
  const Tensor x = Tensor::normal({8, 16}, 0, 1, 3, 1, b, dew::DType::f64);
  const Denoiser den = analytic(p, 0.3);
  const auto xv = x.to_doubles(), x0v = den(x, {t}).x0.to_doubles();
  for (const std::string variance : {"small", "large"}) {
    INFO("variance ", variance);
    const Tensor xn = sampler("ddpm", {{"variance", variance}})->integrate(den, x, {t, s}, p, 42);
    const auto z = step_noise(x, 42, 0).to_doubles();
    const auto out = xn.to_doubles();
    // Ho et al. eq. 7: mu = sqrt(abar_s) beta_t/(1 - abar_t) x0 + sqrt(alpha_t)(1 - abar_s)/(1 - abar_t) x_t
    const double c0 = std::sqrt(abar_s) * beta_t / (1 - abar_t), ct = std::sqrt(alpha_t) * (1 - abar_s) / (1 - abar_t);
    const double var = variance == "small" ? (1 - abar_s) / (1 - abar_t) * beta_t : beta_t;
    for (size_t i = 0; i < out.size(); ++i) {
      const double mu = c0 * x0v[i] + ct * xv[i];
      REQUIRE(out[i] == doctest::Approx(mu + std::sqrt(var) * z[i]).epsilon(1e-10).scale(1));
    }
  }
}

TEST_CASE("a seed reproduces a trajectory, another seed does not, ref and cpu agree") {
  const Process p = process({{"preset", "karras"}});
  for (const auto& [name, kv] : std::vector<std::pair<std::string, std::map<std::string, std::string>>>{
           {"ddpm", {}}, {"euler_ancestral", {}}, {"heun", {{"s_churn", "10"}}}, {"ddim", {{"eta", "1"}}}}) {
    INFO(name);
    auto smp = sampler(name, kv);
    const dew::BackendPtr ref = backend("ref"), cpu = backend("cpu");
    const Tensor x_T = p.noise({4, 3, 4, 4}, dew::DType::f32, ref, 8);
    const Tensor a = smp->sample(analytic(p, 0.3), x_T, p, 12, 7);
    const Tensor a2 = smp->sample(analytic(p, 0.3), x_T, p, 12, 7);
    const Tensor c = smp->sample(analytic(p, 0.3), x_T, p, 12, 8);
    CHECK(a.to_floats() == a2.to_floats());
    CHECK(max_abs_diff(a, c) > 1e-2);
    const Tensor on_cpu = smp->sample(analytic(p, 0.3), x_T.to(cpu), p, 12, 7);
    CHECK(max_abs_diff(a, on_cpu) < 1e-4);
    // The prior itself is keyed by the seed.
    CHECK(max_abs_diff(p.noise({16}, dew::DType::f32, ref, 1), p.noise({16}, dew::DType::f32, cpu, 1)) == 0.0);
  }
}

TEST_CASE(
    "a sample's trajectory does not depend on its batch: row b of a batch seeded s is a batch of one seeded s + b") {
  const Process p = process({{"preset", "karras"}});
  for (const auto& [name, kv] : std::vector<std::pair<std::string, std::map<std::string, std::string>>>{
           {"ddpm", {}}, {"euler_ancestral", {}}, {"heun", {{"s_churn", "10"}}}, {"ddim", {{"eta", "1"}}}}) {
    INFO(name);
    auto smp = sampler(name, kv);
    for (const std::string be : {"ref", "cpu"}) {
      INFO(be);
      const Tensor x_T = p.noise({4, 3, 4, 4}, dew::DType::f32, backend(be), 8);
      const Tensor whole = smp->sample(analytic(p, 0.3), x_T, p, 12, 7);
      // The same four rows as batches {0}, {1, 2}, {3}, each seeded 7 + its first row.
      const Tensor a = smp->sample(analytic(p, 0.3), x_T.slice0(0, 1), p, 12, 7);
      const Tensor b = smp->sample(analytic(p, 0.3), x_T.slice0(1, 3), p, 12, 8);
      const Tensor c = smp->sample(analytic(p, 0.3), x_T.slice0(3, 4), p, 12, 10);
      CHECK(max_abs_diff(whole.slice0(0, 1), a) < 1e-6);
      CHECK(max_abs_diff(whole.slice0(1, 3), b) < 1e-6);
      CHECK(max_abs_diff(whole.slice0(3, 4), c) < 1e-6);
      // A wrong row seed gives another trajectory (the check above can fail).
      CHECK(max_abs_diff(whole.slice0(3, 4), smp->sample(analytic(p, 0.3), x_T.slice0(3, 4), p, 12, 9)) > 1e-2);
    }
  }
}

TEST_CASE("sigma integrators refuse vp schedules, euler_ancestral and churn refuse flow") {
  const dew::BackendPtr b = backend("ref");
  const Process vp = process({{"preset", "cosine"}});
  const Process flow = process({{"preset", "flow"}});
  const Tensor x = Tensor::normal({2, 3}, 0, 1, 1, 1, b);
  auto refuses = [&](const std::string& name, std::map<std::string, std::string> kv, const Process& p,
                     const std::string& needle) {
    INFO(name, " on ", p.describe());
    bool thrown = false;
    try {
      sampler(name, kv)->sample(analytic(p, 0.3), x, p, 5, 0);
    } catch (const dew::Error& e) {
      thrown = true;
      CHECK(e.kind() == dew::ErrorKind::usage);
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK(thrown);
  };
  refuses("heun", {}, vp, "is vp");
  refuses("rk4", {}, vp, "is vp");
  refuses("euler_ancestral", {}, vp, "needs a ve");
  refuses("euler_ancestral", {}, flow, "needs a ve");
  refuses("heun", {{"s_churn", "1"}}, flow, "churn");
  // Option checks.
  CHECK_THROWS_AS(sampler("ddpm", {{"variance", "medium"}}), dew::Error);
  CHECK_THROWS_AS(sampler("ddim", {{"eta", "2"}}), dew::Error);
  CHECK_THROWS_AS(sampler("heun", {{"s_tmin", "5"}, {"s_tmax", "1"}}), dew::Error);
  // The solvers are registered under their names, with their options.
  for (const std::string n : {"ddpm", "ddim", "euler", "euler_ancestral", "heun", "rk4", "dpmpp_2m"})
    CHECK(dew::Registry::global().contains("sampler", n));
}

TEST_CASE("guidance: scale 1 is the conditional output, outside the interval the scale is 1, one doubled batch") {
  const dew::BackendPtr b = backend("ref");
  const Process p = process({{"preset", "karras"}});
  const int64_t B = 3, D = 8;
  const Tensor x = Tensor::normal({B, 2, 2, 2}, 0, 1, 4, 4, b, dew::DType::f64);
  const Tensor labels = Tensor::from_ints({0, 2, 1}, {B}, b);
  const int32_t null_label = 5;
  std::vector<int64_t> rows_seen;
  std::vector<std::vector<double>> times_seen;
  Tensor last_x_in;
  // A label-dependent "network": out = 0.5 x_in + 0.1 * label (per row).
  RawModel raw = [&](const Tensor& x_in, const Tensor& mt, const Tensor& lab) {
    rows_seen.push_back(x_in.shape()[0]);
    times_seen.push_back(mt.to_doubles());
    last_x_in = x_in;
    const auto l = lab.to_ints();
    std::vector<double> add(l.size());
    for (size_t i = 0; i < l.size(); ++i) add[i] = 0.1 * l[i];
    dew::Shape s(size_t(x_in.ndim()), 1);
    s[0] = x_in.shape()[0];
    Tensor addt = Tensor::from_host(add.data(), s, dew::DType::f64, x_in.backend_ptr());
    return dew::add(lincomb({0.5}, x_in, {0.0}, Tensor()), addt);
  };
  auto cond_only = [&](double t) {  // what the model says for the conditional rows, converted
    const RowRates r = p.sample_rates({t});
    const Tensor x_in = p.transform->scale_input(x, r);
    return p.transform->to_x0_eps(x, raw(x_in, Tensor::full({B}, p.sample->model_time(t), dew::DType::f32, b), labels),
                                  r);
  };
  auto uncond_only = [&](double t) {
    const RowRates r = p.sample_rates({t});
    const Tensor x_in = p.transform->scale_input(x, r);
    return p.transform->to_x0_eps(
        x,
        raw(x_in, Tensor::full({B}, p.sample->model_time(t), dew::DType::f32, b), Tensor::from_ints({5, 5, 5}, {B}, b)),
        r);
  };

  SUBCASE("scale 1 equals the conditional output, with one B-row call") {
    Denoiser d = make_denoiser(raw, p, labels, Guidance{1.0}, null_label);
    rows_seen.clear();
    const Denoised g = d(x, {0.5});
    CHECK(rows_seen == std::vector<int64_t>{B});
    const Denoised c = cond_only(0.5);
    CHECK(max_abs_diff(g.x0, c.x0) == 0.0);
    CHECK(max_abs_diff(g.eps, c.eps) == 0.0);
    // The network saw c_in * x_t and the schedule's model time.
    CHECK(max_abs_diff(last_x_in, p.transform->scale_input(x, p.sample_rates({0.5}))) == 0.0);
    CHECK(times_seen[0][0] == doctest::Approx(std::log(p.sample->rates(0.5).sigma) / 4).epsilon(1e-6));
    // guidance_combine at scale 1 is the conditional tensor.
    const Tensor u = Tensor::normal({B, D}, 0, 1, 9, 9, b, dew::DType::f64);
    const Tensor cc = Tensor::normal({B, D}, 0, 1, 9, 10, b, dew::DType::f64);
    CHECK(max_abs_diff(guidance_combine(cc, u, 1.0, 0.0), cc) < 1e-15);
  }
  SUBCASE("inside the interval: one doubled batch, u + s (c - u) converted once; outside: scale 1") {
    Guidance g{3.0, 0.2, 0.6, 0.0};  // progress = 1 - t
    Denoiser d = make_denoiser(raw, p, labels, g, null_label);
    rows_seen.clear();
    const Denoised in = d(x, {0.5});  // progress 0.5: guided
    CHECK(rows_seen == std::vector<int64_t>{2 * B});
    CHECK(times_seen.back().size() == size_t(2 * B));
    const Denoised c = cond_only(0.5), u = uncond_only(0.5);
    // The transform is linear, so combining outputs then converting equals combining (x0, eps).
    CHECK(max_abs_diff(in.x0, combine({{3.0, c.x0}, {-2.0, u.x0}})) < 1e-12);
    CHECK(max_abs_diff(in.eps, combine({{3.0, c.eps}, {-2.0, u.eps}})) < 1e-12);
    CHECK(max_abs_diff(in.x0, c.x0) > 1e-3);  // guidance did something
    rows_seen.clear();
    for (double t : {0.9, 0.1}) {  // progress 0.1 and 0.9: outside [0.2, 0.6]
      const Denoised out = d(x, {t});
      CHECK(max_abs_diff(out.x0, cond_only(t).x0) == 0.0);
    }
    CHECK(rows_seen == std::vector<int64_t>{B, B, B, B});  // two guided-free calls + two reference calls
  }
  SUBCASE("rescale 1 gives each row the conditional output's std") {
    const Tensor u = Tensor::normal({B, D}, 0, 1, 9, 9, b, dew::DType::f64);
    const Tensor cc = Tensor::normal({B, D}, 0, 2, 9, 10, b, dew::DType::f64);
    const Tensor full = guidance_combine(cc, u, 4.0, 1.0), none = guidance_combine(cc, u, 4.0, 0.0);
    const Tensor half = guidance_combine(cc, u, 4.0, 0.5);
    for (int64_t r = 0; r < B; ++r) {
      CHECK(mean_std(full.slice0(r, r + 1)).second == doctest::Approx(mean_std(cc.slice0(r, r + 1)).second));
      // rescale 0.5 averages the rescaled and the plain outputs
      const auto h = half.slice0(r, r + 1).to_doubles(), f = full.slice0(r, r + 1).to_doubles(),
                 n = none.slice0(r, r + 1).to_doubles();
      for (size_t i = 0; i < h.size(); ++i) CHECK(h[i] == doctest::Approx(0.5 * (f[i] + n[i])));
    }
  }
  SUBCASE("refusals") {
    CHECK_THROWS_AS(make_denoiser(raw, p, Tensor(), Guidance{2.0}), dew::Error);             // no labels
    CHECK_THROWS_AS(make_denoiser(raw, p, labels, Guidance{2.0}, -1), dew::Error);           // no null label
    CHECK_THROWS_AS(make_denoiser(raw, p, labels, Guidance{2.0, 0.7, 0.3}, 5), dew::Error);  // empty interval
  }
}

TEST_CASE("sample() through make_denoiser on an analytic raw model converges (edm preconditioning, guidance 1)") {
  // The raw model returns the Karras network output F that yields the analytic x0: F = (x0 - c_skip x_t)/c_out.
  const dew::BackendPtr b = backend("cpu");
  const Process p = process({{"preset", "edm"}, {"regime", "pixel"}});
  const double s = 0.3, sd = 0.5;
  RawModel raw = [&](const Tensor& x_in, const Tensor& mt, const Tensor&) {
    const double sigma = std::exp(4.0 * mt.to_doubles()[0]);
    const double v = sd * sd + sigma * sigma;
    const double cin = 1 / std::sqrt(v), cskip = sd * sd / v, cout = sigma * sd / std::sqrt(v);
    const double k = s * s / (s * s + sigma * sigma);  // x0 = k x_t
    return lincomb({(k - cskip) / cout / cin}, x_in, {0.0}, Tensor());
  };
  const Tensor x_T = p.noise({256, 8}, dew::DType::f32, b, 3);
  const Tensor x = sampler("heun")->sample(make_denoiser(raw, p), x_T, p, 40, 1);
  const auto [m, sdv] = mean_std(x);
  CHECK(std::abs(m) < 0.05);
  CHECK(std::abs(sdv - 0.3) < 0.05);
}
