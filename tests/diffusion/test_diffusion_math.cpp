// tests/diffusion/test_diffusion_math.cpp — dew/diffusion.hpp: schedules, transforms, weightings, presets.
// Schedules: SNR strictly decreasing; vp alpha^2 + sigma^2 = 1, flow alpha + sigma = 1, ve alpha = 1; the
// cosine table equals Nichol & Dhariwal's formula; Karras/flow time-of-sigma inverses; EDM's log-normal
// statistics; training times stay in their domains. Transforms: from (x_t, the output that produces the
// target) recover (x0, eps) on ref (f64) and cpu (f32); target_error_scale = 1/(d x0/d output)^2;
// min-SNR formulas. Presets: what they build, and the bad combinations they refuse.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "dew/diffusion.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"

using namespace dew::diffusion;
using dew::Tensor;

namespace {

dew::BackendPtr backend(const std::string& name) {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref")) reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu"});
  dew::BackendPtr b = dew::create_backend(name);
  b->set_threads(1);  // tiny tensors: threads only add synchronisation on a shared machine
  return b;
}

struct Named {
  std::string label;
  std::shared_ptr<Schedule> s;
};
std::vector<Named> all_schedules() {
  return {
      {"linear", std::make_shared<BetaTable>("linear", linear_betas(1000))},
      {"cosine", std::make_shared<BetaTable>("cosine", cosine_betas(1000))},
      {"cosine beta_end 1", std::make_shared<BetaTable>("cosine", cosine_betas(1000, 0.008, 1.0))},
      {"exp", std::make_shared<BetaTable>("exp", exp_betas(1000))},
      {"cosine_continuous", std::make_shared<CosineContinuous>()},
      {"sqrt", std::make_shared<SqrtSchedule>()},
      {"karras", std::make_shared<KarrasVE>()},
      {"edm", KarrasVE::edm(-1.2, 1.2)},
      {"flow", std::make_shared<FlowSchedule>()},
      {"flow shift 3", std::make_shared<FlowSchedule>(3.0)},
  };
}

// Times covering [0, T]: every table entry, or 2001 points of a continuous schedule.
std::vector<double> dense_times(const Schedule& s) {
  std::vector<double> t;
  if (dynamic_cast<const BetaTable*>(&s)) {
    for (int i = 0; i < int(s.T()); ++i) t.push_back(i);
  } else {
    for (int i = 0; i <= 2000; ++i) t.push_back(s.T() * i / 2000.0);
  }
  return t;
}

template <class F>
void expect_usage_error(F&& f, const std::string& needle) {
  bool thrown = false;
  try {
    f();
  } catch (const dew::Error& e) {
    thrown = true;
    CHECK(e.kind() == dew::ErrorKind::usage);
    INFO("message: ", e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
  CHECK_MESSAGE(thrown, "expected a usage error mentioning '", needle, "'");
}

Process process(std::map<std::string, std::string> kv) {
  dew::Options o(std::move(kv), "objective");
  Process p = make_process(o);
  o.check_all_used();  // make_process read every key it was given
  return p;
}

}  // namespace

TEST_CASE("every schedule: SNR strictly decreases and the family invariant holds") {
  for (const auto& [label, s] : all_schedules()) {
    INFO("schedule ", label);
    const std::vector<double> t = dense_times(*s);
    double prev = INFINITY;
    for (size_t i = 0; i < t.size(); ++i) {
      const Rates r = s->rates(t[i]);
      const double snr = r.snr();
      if (i > 0) {
        CHECK_MESSAGE(snr < prev, "SNR not decreasing at t = ", t[i], ": ", snr, " >= ", prev);
        if (!(snr < prev)) break;
      }
      prev = snr;
      switch (s->family()) {
        case Family::vp:
          REQUIRE(r.alpha * r.alpha + r.sigma * r.sigma == doctest::Approx(1.0).epsilon(1e-12));
          break;
        case Family::flow:
          REQUIRE(r.alpha + r.sigma == doctest::Approx(1.0).epsilon(1e-12));
          break;
        case Family::ve:
          REQUIRE(r.alpha == 1.0);
          break;
      }
    }
    // The sampling grid descends from the noise end to 0.
    const std::vector<double> g = s->times(50);
    REQUIRE(g.size() == 51);
    CHECK(g.back() == 0.0);
    CHECK(g.front() == (dynamic_cast<BetaTable*>(s.get()) ? s->T() - 1 : s->T()));
    for (size_t i = 0; i + 1 < g.size(); ++i) CHECK(g[i + 1] < g[i]);
  }
}

TEST_CASE("beta tables: the cosine table is Nichol & Dhariwal's eq. 17, the last entry is read at t = T") {
  const int T = 1000;
  const double s = 0.008;
  auto f = [&](double t) {
    const double c = std::cos((t / T + s) / (1 + s) * std::numbers::pi / 2);
    return c * c;
  };
  BetaTable table("cosine", cosine_betas(T, s, 0.999));
  const auto& abar = table.alphas_cumprod();
  for (int i = 0; i < T - 1; ++i) REQUIRE(abar[size_t(i)] == doctest::Approx(f(i + 1) / f(0)).epsilon(1e-10));
  // Only the last beta is clipped (at 0.999).
  CHECK(table.betas().back() == 0.999);
  CHECK(abar[T - 1] == doctest::Approx(abar[T - 2] * 0.001).epsilon(1e-12));
  CHECK(table.rates(T).alpha == table.rates(T - 1).alpha);
  CHECK(table.rates(T - 1).alpha == doctest::Approx(std::sqrt(abar[T - 1])));
  CHECK(table.rates(0.7).alpha == table.rates(0).alpha);  // floor(t)

  // DDPM's linear table: betas 1e-4 .. 0.02, abar_T = prod(1 - beta).
  const auto lb = linear_betas(1000);
  CHECK(lb.front() == doctest::Approx(1e-4));
  CHECK(lb.back() == doctest::Approx(0.02));
  BetaTable lin("linear", lb);
  double prod = 1;
  for (double b : lb) prod *= 1 - b;
  CHECK(lin.alphas_cumprod().back() == doctest::Approx(prod).epsilon(1e-12));
  CHECK(prod == doctest::Approx(4.0358e-5).epsilon(1e-3));  // sqrt(abar_T) = 0.00635 (Ho et al.'s table)
  // 250 steps scale betas by 1000/T.
  CHECK(linear_betas(250).back() == doctest::Approx(0.08));

  // Training times are integers in [0, T); the default P2 weight is 1/(1 + SNR).
  const auto ts = lin.sample_t(3, 4, 4096);
  double lo = 1e9, hi = -1;
  for (double t : ts) {
    REQUIRE(t == std::floor(t));
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  CHECK(lo >= 0);
  CHECK(hi <= T - 1);
  CHECK(hi > 990);
  CHECK(lin.weight(100) == doctest::Approx(1.0 / (1.0 + lin.snr(100))));
  BetaTable p2("linear", lb, 1.0, 0.0);
  CHECK(p2.weight(100) == 1.0);
  // Grids never revisit an entry: steps are capped at T - 1.
  CHECK(lin.times(5000).size() == size_t(T));
}

TEST_CASE("continuous VP schedules: cosine and sqrt formulas") {
  CosineContinuous c;
  CHECK(c.rates(0.5).alpha == doctest::Approx(std::cos(std::numbers::pi / 4)));
  CHECK(c.rates(1.0).alpha == 0.0);
  CHECK(c.weight(0.3) == doctest::Approx(1.0 / (1.0 + c.snr(0.3))));
  CHECK(c.model_time(0.25) == doctest::Approx(250.0));
  SqrtSchedule q(1e-4);
  const double abar = (1 - std::sqrt(0.36 + 1e-4)) / (1 - std::sqrt(1e-4));
  CHECK(q.rates(0.36).alpha == doctest::Approx(std::sqrt(abar)));
  CHECK(q.rates(0.0).sigma == 0.0);
  for (double t : c.sample_t(1, 2, 1000)) REQUIRE((t >= 0.0 && t < 1.0));
}

TEST_CASE("Karras VE and EDM: grid ends, t_of_sigma, c_noise, EDM lambda, log-normal training sigmas") {
  KarrasVE k(0.002, 80.0, 7.0, 0.5);
  CHECK(k.sigma(0.0) == doctest::Approx(0.002));
  CHECK(k.sigma(1.0) == doctest::Approx(80.0));
  CHECK(k.prior_scale() == 80.0);
  for (double t : {0.0, 0.1, 0.5, 0.93, 1.0, 1.05})
    CHECK(k.t_of_sigma(k.sigma(t)) == doctest::Approx(t).epsilon(1e-12));
  CHECK(k.model_time(0.4) == doctest::Approx(std::log(k.sigma(0.4)) / 4));
  CHECK(k.weight(0.0) == doctest::Approx(1 / 0.25 + 1 / (0.002 * 0.002)));  // 250004, no halving
  // rho = 7: the midpoint of the ramp in sigma^(1/7).
  const double mid = std::pow((std::pow(80.0, 1 / 7.0) + std::pow(0.002, 1 / 7.0)) / 2, 7.0);
  CHECK(k.sigma(0.5) == doctest::Approx(mid));

  for (auto [Pm, Ps] : {std::pair{-1.2, 1.2}, std::pair{-0.4, 1.0}}) {
    auto e = KarrasVE::edm(Pm, Ps);
    const auto ts = e->sample_t(11, 5, 20000);
    double m = 0, m2 = 0;
    for (double t : ts) {
      const double l = std::log(e->sigma(t));
      m += l;
      m2 += l * l;
    }
    m /= double(ts.size());
    const double sd = std::sqrt(m2 / double(ts.size()) - m * m);
    CHECK(std::abs(m - Pm) < 0.05);
    CHECK(std::abs(sd - Ps) < 0.05);
  }
}

TEST_CASE("flow: shift, t_of_sigma, model time and the training densities") {
  FlowSchedule f(3.0);
  CHECK(f.shifted(0.5) == doctest::Approx(1.5 / 2.0));
  CHECK(f.rates(0.5).sigma == doctest::Approx(0.75));
  for (double t : {0.0, 0.2, 0.5, 0.9, 1.0}) CHECK(f.t_of_sigma(f.rates(t).sigma) == doctest::Approx(t).epsilon(1e-12));
  CHECK(f.model_time(0.5) == doctest::Approx(750.0));
  // logit-normal: logit(t) ~ N(mean, std).
  FlowSchedule ln(1.0, FlowSchedule::Density::logit_normal, 0.5, 0.8);
  double m = 0, m2 = 0;
  const auto ts = ln.sample_t(2, 9, 20000);
  for (double t : ts) {
    REQUIRE((t > 0.0 && t < 1.0));
    const double l = std::log(t / (1 - t));
    m += l;
    m2 += l * l;
  }
  m /= double(ts.size());
  CHECK(std::abs(m - 0.5) < 0.03);
  CHECK(std::abs(std::sqrt(m2 / double(ts.size()) - m * m) - 0.8) < 0.03);
  // mode with scale 0 is 1 - u (uniform); cosmap and uniform stay in [0, 1].
  FlowSchedule mode0(1.0, FlowSchedule::Density::mode, 0, 1, 0.0);
  const auto mt = mode0.sample_t(4, 4, 8);
  for (size_t i = 0; i < mt.size(); ++i) CHECK(mt[i] == doctest::Approx(1.0 - dew::philox::uniform(4, 4, i)));
  for (auto d : {FlowSchedule::Density::mode, FlowSchedule::Density::cosmap, FlowSchedule::Density::uniform})
    for (double t : FlowSchedule(1.0, d).sample_t(1, 1, 2000)) REQUIRE((t >= 0.0 && t <= 1.0));
  CHECK(resolution_shift(256) == doctest::Approx(std::exp(0.5)));
  CHECK(resolution_shift(4096) == doctest::Approx(std::exp(1.15)));
}

TEST_CASE("transforms: recover the (x0, eps) that produced the target, on ref (f64) and cpu (f32)") {
  struct Case {
    std::shared_ptr<Schedule> s;
    std::vector<std::string> predictions;
  };
  const std::vector<Case> cases = {
      {std::make_shared<BetaTable>("linear", linear_betas(1000)), {"epsilon", "x0", "v"}},
      {std::make_shared<BetaTable>("cosine", cosine_betas(1000, 0.008, 1.0)), {"x0", "v"}},
      {std::make_shared<CosineContinuous>(), {"x0", "v"}},
      {std::make_shared<SqrtSchedule>(), {"x0", "v"}},
      {std::make_shared<KarrasVE>(), {"karras", "epsilon", "x0", "v"}},
      {std::make_shared<FlowSchedule>(2.0), {"flow", "x0", "v"}},
  };
  for (const std::string be : {"ref", "cpu"}) {
    const dew::BackendPtr b = backend(be);
    const dew::DType dt = be == "ref" ? dew::DType::f64 : dew::DType::f32;
    const double tol = be == "ref" ? 1e-9 : 2e-4;
    const int64_t B = 6, D = 5;
    for (const auto& c : cases)
      for (const auto& pname : c.predictions) {
        INFO(be, " ", c.s->describe(), " prediction ", pname);
        auto tr = make_transform(pname);
        // Times spread over the grid, away from the ends where x0 is ill-conditioned in f32.
        std::vector<double> t(B);
        for (int64_t i = 0; i < B; ++i) t[size_t(i)] = c.s->T() * (0.05 + 0.9 * double(i) / double(B - 1));
        std::vector<double> a(B), sg(B);
        for (int64_t i = 0; i < B; ++i) {
          a[size_t(i)] = c.s->rates(t[size_t(i)]).alpha;
          sg[size_t(i)] = c.s->rates(t[size_t(i)]).sigma;
        }
        const RowRates r(a, sg);
        Tensor x0 = Tensor::normal({B, D}, 0, 1, 1, 2, b, dt);
        Tensor eps = Tensor::normal({B, D}, 0, 1, 1, 3, b, dt);
        const Diffused d = tr->forward_diffusion(x0, eps, r);
        // The output that produces the target: predict(x_t, out) = target, i.e. out = (target - p.a x_t)/p.b.
        std::vector<double> pa(B), pb(B);
        for (int64_t i = 0; i < B; ++i) {
          const Coefs p = tr->prediction(r.row(size_t(i)));
          pa[size_t(i)] = -p.a / p.b;
          pb[size_t(i)] = 1.0 / p.b;
        }
        Tensor out = lincomb(pa, d.x_t, pb, d.target);
        const Denoised back = tr->to_x0_eps(d.x_t, out, r);
        const auto X0 = x0.to_doubles(), E = eps.to_doubles(), XT = d.x_t.to_doubles();
        const auto RX = back.x0.to_doubles(), RE = back.eps.to_doubles();
        const auto C = d.c_in.to_doubles();
        for (int64_t i = 0; i < B; ++i) {
          const Rates rr = r.row(size_t(i));
          CHECK(C[size_t(i)] == doctest::Approx(tr->c_in(rr)).epsilon(1e-6));
          for (int64_t j = 0; j < D; ++j) {
            const size_t k = size_t(i * D + j);
            REQUIRE(XT[k] == doctest::Approx(rr.alpha * X0[k] + rr.sigma * E[k]).epsilon(tol).scale(1));
            REQUIRE(std::abs(RX[k] - X0[k]) < tol * 10 * (1 + std::abs(X0[k])));
            REQUIRE(std::abs(RE[k] - E[k]) < tol * 10 * (1 + std::abs(E[k])));
          }
        }
        // target_error_scale(SNR) = 1 / (d x0 / d output)^2: the loss in target space is SNR-scaled x0 error.
        for (int64_t i = 0; i < B; ++i) {
          const Rates rr = r.row(size_t(i));
          const double bx = tr->x0_from_output(rr).b;
          CHECK(tr->target_error_scale(rr.snr()) == doctest::Approx(1.0 / (bx * bx)).epsilon(1e-9));
        }
      }
  }
}

TEST_CASE("transforms: known coefficients (epsilon, v, flow, Karras)") {
  const Rates r{0.6, 0.8};
  CHECK(EpsilonTransform().x0_from_output(r).a == doctest::Approx(1 / 0.6));
  CHECK(EpsilonTransform().x0_from_output(r).b == doctest::Approx(-0.8 / 0.6));
  // v = alpha eps - sigma x0 on VP (var = 1).
  CHECK(VTransform().target(r).a == doctest::Approx(-0.8));
  CHECK(VTransform().target(r).b == doctest::Approx(0.6));
  CHECK(FlowTransform().target({0.3, 0.7}).a == -1.0);
  KarrasTransform k(0.5);
  const Rates ve{1.0, 2.0};
  CHECK(k.c_in(ve) == doctest::Approx(1 / std::sqrt(4.25)));
  CHECK(k.x0_from_output(ve).a == doctest::Approx(0.25 / 4.25));
  CHECK(k.x0_from_output(ve).b == doctest::Approx(1.0 / std::sqrt(4.25)));
  CHECK(X0Transform().eps_from_output({1.0, 0.0}).a == 0.0);  // clean input: no noise
  CHECK_THROWS_AS(EpsilonTransform().x0_from_output({0.0, 1.0}), dew::Error);
}

TEST_CASE("weightings: min-SNR-gamma over the transform's error scale, the schedule weight otherwise") {
  CosineContinuous s;
  const double t = 0.2, snr = s.snr(t);
  REQUIRE(snr > 5);
  EpsilonTransform eps;
  VTransform v;
  KarrasTransform k(0.5);
  MinSnrWeighting w5(5.0), winf(INFINITY);
  CHECK(w5.weight(t, s, eps) == doctest::Approx(5.0 / snr));
  CHECK(w5.weight(t, s, v) == doctest::Approx(5.0 / (snr + 1)));
  CHECK(w5.weight(t, s, k) == doctest::Approx(5.0 / (4.0 + snr)));
  CHECK(winf.weight(t, s, eps) == doctest::Approx(1.0));  // gamma = inf: unweighted epsilon loss
  const double t2 = 0.9;                                  // SNR < 5: not capped
  CHECK(w5.weight(t2, s, eps) == doctest::Approx(1.0));
  // Monotone: the capped weight never increases as noise decreases (epsilon).
  double prev = 0;
  for (int i = 100; i >= 1; --i) {
    const double wi = w5.weight(i / 100.0, s, eps);
    CHECK(wi <= 1.0 + 1e-12);
    if (i < 100) CHECK(wi <= prev + 1e-12);
    prev = wi;
  }
  CHECK(ScheduleWeighting().weight(t, s, eps) == doctest::Approx(1.0 / (1.0 + snr)));
}

TEST_CASE("presets build the documented processes") {
  Process edm = process({{"preset", "edm"}, {"regime", "pixel"}});
  CHECK(edm.train->name() == "edm");
  CHECK(edm.sample->name() == "karras");
  CHECK(edm.transform->name() == "karras");
  CHECK(edm.weighting->name() == "schedule");
  CHECK(edm.sample->prior_scale() == 80.0);
  CHECK(edm.describe().find("P_mean=-1.2") != std::string::npos);

  Process kar = process({{"preset", "karras"}, {"sigma_max", "40"}, {"sigma_data", "1.0"}});
  CHECK(kar.sample->prior_scale() == 40.0);
  CHECK(dynamic_cast<const KarrasTransform&>(*kar.transform).sigma_data() == 1.0);

  Process cos = process({{"preset", "cosine"}});
  CHECK(cos.train->name() == "cosine");
  CHECK(cos.transform->name() == "v");
  CHECK(cos.train->rates(999).alpha < 1e-6);  // beta_end 1: zero terminal SNR
  // P2 default makes the v loss an x0 loss: w * (target_error_scale) == 1 (error in x0 units).
  for (double t : {10.0, 300.0, 700.0}) {
    const double snr = cos.train->snr(t);
    CHECK(cos.weights({t})[0] * cos.transform->target_error_scale(snr) == doctest::Approx(1.0));
  }

  Process flow = process({{"preset", "flow"}, {"shift", "3"}, {"density", "mode"}, {"mode_scale", "0.5"}});
  CHECK(flow.transform->name() == "flow");
  CHECK(flow.train->rates(0.5).sigma == doctest::Approx(0.75));

  Process msnr = process({{"schedule", "linear"}, {"min_snr_gamma", "5"}});
  CHECK(msnr.transform->name() == "epsilon");
  CHECK(msnr.weighting->name() == "min_snr(gamma=5)");
  Process xo = process({{"schedule", "cosine_continuous"}, {"prediction", "v"}});
  CHECK(xo.transform->name() == "v");
  Process ep = process({{"preset", "edm"}, {"P_mean", "-0.4"}, {"P_std", "1.0"}});
  CHECK(ep.train->describe().find("P_std=1") != std::string::npos);
}

TEST_CASE("presets refuse bad combinations with a clear message") {
  expect_usage_error([] { process({{"preset", "edm"}}); }, "regime");
  expect_usage_error([] { process({{"preset", "edm"}, {"P_mean", "-1"}}); }, "only P_mean");
  expect_usage_error([] { process({{"preset", "edm"}, {"regime", "pixel"}, {"P_std", "1"}}); }, "either regime");
  expect_usage_error([] { process({{"preset", "edm"}, {"regime", "video"}}); }, "unknown regime");
  expect_usage_error(
      [] {
        process({{"preset", "edm"}, {"regime", "pixel"}, {"shift", "3"}});
      },
      "'shift' applies to schedule = flow");
  expect_usage_error([] { process({{"preset", "cosine"}, {"prediction", "flow"}}); }, "needs a flow schedule");
  expect_usage_error([] { process({{"preset", "flow"}, {"prediction", "epsilon"}}); }, "alpha reaches 0");
  expect_usage_error([] { process({{"schedule", "linear"}, {"prediction", "karras"}}); }, "needs a ve schedule");
  expect_usage_error([] { process({{"preset", "sd3"}}); }, "unknown diffusion preset");
  expect_usage_error([] { process({{"schedule", "quadratic"}}); }, "unknown diffusion schedule");
  expect_usage_error([] { process({}); }, "set preset");
  expect_usage_error(
      [] {
        process({{"preset", "flow"}, {"logit_mean", "0.5"}, {"density", "uniform"}});
      },
      "logit_mean and logit_std apply to density = logit_normal");
  expect_usage_error([] { process({{"preset", "flow"}, {"sigma_data", "0.5"}}); }, "sigma_data");
  expect_usage_error([] { process({{"preset", "flow"}, {"density", "beta"}}); }, "unknown flow density");
  expect_usage_error([] { process({{"preset", "karras"}, {"sigma_min", "5"}, {"sigma_max", "1"}}); }, "sigma_min");
  expect_usage_error([] { process({{"preset", "cosine"}, {"min_snr_gamma", "0"}}); }, "min_snr_gamma");
  expect_usage_error([] { process({{"preset", "flow"}, {"mode_scale", "3"}, {"density", "mode"}}); }, "mode_scale");
  // An unrelated key is left for the caller's check_all_used.
  dew::Options o({{"preset", "flow"}, {"lr_typo", "1"}}, "objective");
  make_process(o);
  CHECK_THROWS_AS(o.check_all_used(), dew::Error);
}
