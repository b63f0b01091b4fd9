// samplers.cpp — the diffusion solvers (Sampler "ddpm", "ddim", "euler", "euler_ancestral", "heun", "rk4",
// "dpmpp_2m"), written against dew/sampler.hpp.
//
// Notation: step i goes from t = times[i] to s = times[i+1]; (a_t, s_t) and (a_s, s_s) are the sampling
// schedule's (alpha, sigma) there; (x0, eps) the denoiser's estimates; z ~ N(0, I) is step_noise(x, seed, i).
//  * ddpm (variance small | large): x = a_s x0 + (s_s^2 a_t)/(s_t a_s) eps + g z, the Gaussian posterior
//    q(x_s | x_t, x0) with g^2 = s_s^2 (1 - SNR_t/SNR_s) (small) or s_t^2 - (a_t/a_s)^2 s_s^2 (large:
//    beta_t on a VP table); no noise where s_s = 0.
//  * ddim (eta): st = eta * (the small posterior std); x = a_s x0 + sqrt(s_s^2 - st^2) eps + st z.
//  * euler: the first-order step of the probability-flow ODE in sigma, x = a_s x0 + (s_s/s_t)(x - a_t x0)
//    (for ve: x + (s_s - s_t)(x - x0)/s_t; for flow: x + (s_s - s_t)(eps - x0); equal to ddim eta 0).
//  * euler_ancestral (ve; eta, s_noise): k-diffusion's ancestral step, s_up = min(s_s, eta sqrt(s_s^2 (s_t^2 -
//    s_s^2)/s_t^2)), s_down = sqrt(s_s^2 - s_up^2), x + (x - x0)/s_t (s_down - s_t) + s_noise s_up z.
//  * heun (ve, flow; s_churn, s_tmin, s_tmax, s_noise): Karras et al. 2022 Algorithm 2 on dx/dsigma; an
//    Euler step where s_s = 0; churn (ve only) gamma = min(s_churn/N, sqrt2 - 1) for s_tmin <= s_t <= s_tmax.
//  * rk4 (ve, flow): classical RK4 on dx/dsigma with the two midpoint calls at t_of_sigma((s_t + s_s)/2);
//    an Euler step where s_s = 0.
//  * dpmpp_2m: DPM-Solver++(2M) (Lu et al. 2022) in lambda = log(alpha/sigma): x = (s_s/s_t) x - a_s expm1(-h) D
//    with D = (1 + 1/(2r)) x0 - 1/(2r) x0_prev, r = h_prev/h; first order at the first step, where lambda
//    is infinite (alpha = 0 at the flow noise end) and where s_s = 0. Any family.
#include <cmath>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/sampler.hpp>
#include <limits>
#include <string>

namespace {

using dew::Tensor;
using namespace dew::diffusion;

double nonneg_sqrt(double v) { return std::sqrt(std::max(v, 0.0)); }

// The small-variance posterior std of x_s given x_t and x0: s_s sqrt(1 - SNR_t/SNR_s).
double posterior_std(Rates rt, Rates rs) {
  if (rs.sigma == 0.0) return 0.0;
  const double q = (rt.alpha * rt.alpha * rs.sigma * rs.sigma) / (rs.alpha * rs.alpha * rt.sigma * rt.sigma);
  return rs.sigma * nonneg_sqrt(1.0 - q);
}

void check_grid(const std::vector<double>& times, const std::string& name) {
  DEW_CHECK(times.size() >= 2, "sampler '", name, "': the time grid needs at least 2 points, got ", times.size());
  for (size_t i = 0; i + 1 < times.size(); ++i)
    DEW_CHECK(times[i + 1] < times[i], "sampler '", name, "': the time grid must strictly descend (t[", i,
              "] = ", times[i], ", t[", i + 1, "] = ", times[i + 1], ")");
}

// ---------------------------------------------------------------- DDPM

class Ddpm final : public Sampler {
 public:
  explicit Ddpm(const dew::Options& o) {
    const std::string v = o.get_string("variance", "small");
    DEW_USAGE_CHECK(v == "small" || v == "large", "ddpm: variance must be small or large, got '", v, "'");
    large_ = v == "large";
  }
  std::string name() const override { return "ddpm"; }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t seed) const override {
    check_grid(times, name());
    Tensor x = x_in;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const Rates rt = p.sample->rates(times[i]), rs = p.sample->rates(times[i + 1]);
      DEW_CHECK(rt.sigma > 0 && rs.alpha > 0, "ddpm: degenerate rates at t = ", times[i]);
      const Denoised d = denoise(x, {times[i]});
      const double ce = rs.sigma * rs.sigma * rt.alpha / (rt.sigma * rs.alpha);
      double g = 0.0;
      if (rs.sigma > 0.0) {
        const double r = rt.alpha / rs.alpha;
        g = large_ ? nonneg_sqrt(rt.sigma * rt.sigma - r * r * rs.sigma * rs.sigma) : posterior_std(rt, rs);
      }
      std::vector<std::pair<double, Tensor>> terms = {{rs.alpha, d.x0}, {ce, d.eps}};
      if (g > 0.0) terms.push_back({g, step_noise(x, seed, int64_t(i))});
      x = combine(terms);
    }
    return x;
  }

 private:
  bool large_ = false;
};

// ---------------------------------------------------------------- DDIM

class Ddim final : public Sampler {
 public:
  explicit Ddim(const dew::Options& o) : eta_(o.get_double("eta", 0.0)) {
    DEW_USAGE_CHECK(eta_ >= 0.0 && eta_ <= 1.0, "ddim: eta must lie in [0, 1], got ", eta_);
  }
  std::string name() const override { return "ddim"; }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t seed) const override {
    check_grid(times, name());
    Tensor x = x_in;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const Rates rt = p.sample->rates(times[i]), rs = p.sample->rates(times[i + 1]);
      const Denoised d = denoise(x, {times[i]});
      const double st = eta_ > 0.0 ? eta_ * posterior_std(rt, rs) : 0.0;
      std::vector<std::pair<double, Tensor>> terms = {{rs.alpha, d.x0},
                                                      {nonneg_sqrt(rs.sigma * rs.sigma - st * st), d.eps}};
      if (st > 0.0) terms.push_back({st, step_noise(x, seed, int64_t(i))});
      x = combine(terms);
    }
    return x;
  }

 private:
  double eta_;
};

// ---------------------------------------------------------------- Euler

class Euler final : public Sampler {
 public:
  explicit Euler(const dew::Options&) {}
  std::string name() const override { return "euler"; }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t) const override {
    check_grid(times, name());
    Tensor x = x_in;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const Rates rt = p.sample->rates(times[i]), rs = p.sample->rates(times[i + 1]);
      DEW_CHECK(rt.sigma > 0, "euler: sigma is 0 at t = ", times[i]);
      const Denoised d = denoise(x, {times[i]});
      const double ratio = rs.sigma / rt.sigma;
      x = combine({{ratio, x}, {rs.alpha - rt.alpha * ratio, d.x0}});
    }
    return x;
  }
};

// ---------------------------------------------------------------- Euler ancestral

class EulerAncestral final : public Sampler {
 public:
  explicit EulerAncestral(const dew::Options& o)
      : eta_(o.get_double("eta", 1.0)), s_noise_(o.get_double("s_noise", 1.0)) {
    DEW_USAGE_CHECK(eta_ >= 0.0, "euler_ancestral: eta must be >= 0, got ", eta_);
    DEW_USAGE_CHECK(s_noise_ >= 0.0, "euler_ancestral: s_noise must be >= 0, got ", s_noise_);
  }
  std::string name() const override { return "euler_ancestral"; }
  void check(const Process& p) const override {
    DEW_USAGE_CHECK(p.sample && p.sample->family() == Family::ve,
                    "sampler 'euler_ancestral' needs a ve sampling "
                    "schedule (karras, edm), not ",
                    p.sample ? p.sample->describe() : std::string("none"), ": use ddpm or ddim with eta > 0");
  }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t seed) const override {
    check(p);
    check_grid(times, name());
    Tensor x = x_in;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const double st = p.sample->rates(times[i]).sigma, ss = p.sample->rates(times[i + 1]).sigma;
      const Denoised d = denoise(x, {times[i]});
      const double su = std::min(ss, eta_ * nonneg_sqrt(ss * ss * (st * st - ss * ss) / (st * st)));
      const double sd = nonneg_sqrt(ss * ss - su * su);
      // x + (x - x0)/st * (sd - st) = (sd/st) x + (1 - sd/st) x0
      std::vector<std::pair<double, Tensor>> terms = {{sd / st, x}, {1.0 - sd / st, d.x0}};
      if (su > 0.0 && s_noise_ > 0.0) terms.push_back({su * s_noise_, step_noise(x, seed, int64_t(i))});
      x = combine(terms);
    }
    return x;
  }

 private:
  double eta_, s_noise_;
};

// ---------------------------------------------------------------- Heun (Karras Alg. 2)

class Heun final : public Sampler {
 public:
  explicit Heun(const dew::Options& o)
      : s_churn_(o.get_double("s_churn", 0.0)),
        s_tmin_(o.get_double("s_tmin", 0.0)),
        s_tmax_(o.get_double("s_tmax", std::numeric_limits<double>::infinity())),
        s_noise_(o.get_double("s_noise", 1.0)) {
    DEW_USAGE_CHECK(s_churn_ >= 0.0, "heun: s_churn must be >= 0, got ", s_churn_);
    DEW_USAGE_CHECK(s_tmin_ <= s_tmax_, "heun: s_tmin (", s_tmin_, ") must not exceed s_tmax (", s_tmax_, ")");
    DEW_USAGE_CHECK(s_noise_ >= 0.0, "heun: s_noise must be >= 0, got ", s_noise_);
  }
  std::string name() const override { return "heun"; }
  void check(const Process& p) const override {
    require_sigma_schedule(p, name());
    DEW_USAGE_CHECK(s_churn_ == 0.0 || p.sample->family() == Family::ve,
                    "heun: churn (s_churn > 0) re-noises in sigma and needs a ve schedule, not ", p.sample->describe());
  }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t seed) const override {
    check(p);
    check_grid(times, name());
    const Family fam = p.sample->family();
    const double n = double(times.size() - 1);
    Tensor x = x_in;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const double st = p.sample->rates(times[i]).sigma, ss = p.sample->rates(times[i + 1]).sigma;
      double gamma = 0.0;
      if (s_churn_ > 0.0 && st >= s_tmin_ && st <= s_tmax_) gamma = std::min(s_churn_ / n, std::sqrt(2.0) - 1.0);
      const double sh = st * (1.0 + gamma);
      double th = times[i];
      Tensor xh = x;
      if (gamma > 0.0) {
        xh = combine({{1.0, x}, {nonneg_sqrt(sh * sh - st * st) * s_noise_, step_noise(x, seed, int64_t(i))}});
        th = p.sample->t_of_sigma(sh);
      }
      const Tensor d1 = sigma_derivative(denoise(xh, {th}), fam);
      const double h = ss - sh;
      Tensor xn = combine({{1.0, xh}, {h, d1}});
      if (ss > 0.0) {
        const Tensor d2 = sigma_derivative(denoise(xn, {times[i + 1]}), fam);
        xn = combine({{1.0, xh}, {h / 2.0, d1}, {h / 2.0, d2}});
      }
      x = xn;
    }
    return x;
  }

 private:
  double s_churn_, s_tmin_, s_tmax_, s_noise_;
};

// ---------------------------------------------------------------- RK4

class Rk4 final : public Sampler {
 public:
  explicit Rk4(const dew::Options&) {}
  std::string name() const override { return "rk4"; }
  void check(const Process& p) const override { require_sigma_schedule(p, name()); }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t) const override {
    check(p);
    check_grid(times, name());
    const Family fam = p.sample->family();
    Tensor x = x_in;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const double st = p.sample->rates(times[i]).sigma, ss = p.sample->rates(times[i + 1]).sigma;
      const double h = ss - st;
      const Tensor k1 = sigma_derivative(denoise(x, {times[i]}), fam);
      if (ss == 0.0) {
        x = combine({{1.0, x}, {h, k1}});
        continue;
      }
      const double tm = p.sample->t_of_sigma(st + h / 2.0);
      const Tensor k2 = sigma_derivative(denoise(combine({{1.0, x}, {h / 2.0, k1}}), {tm}), fam);
      const Tensor k3 = sigma_derivative(denoise(combine({{1.0, x}, {h / 2.0, k2}}), {tm}), fam);
      const Tensor k4 = sigma_derivative(denoise(combine({{1.0, x}, {h, k3}}), {times[i + 1]}), fam);
      x = combine({{1.0, x}, {h / 6.0, k1}, {h / 3.0, k2}, {h / 3.0, k3}, {h / 6.0, k4}});
    }
    return x;
  }
};

// ---------------------------------------------------------------- DPM-Solver++(2M)

class DpmPp2m final : public Sampler {
 public:
  explicit DpmPp2m(const dew::Options&) {}
  std::string name() const override { return "dpmpp_2m"; }
  Tensor integrate(const Denoiser& denoise, const Tensor& x_in, const std::vector<double>& times, const Process& p,
                   uint64_t) const override {
    check_grid(times, name());
    Tensor x = x_in, prev_x0;
    double h_prev = std::numeric_limits<double>::quiet_NaN();
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      const Rates rt = p.sample->rates(times[i]), rs = p.sample->rates(times[i + 1]);
      DEW_CHECK(rt.sigma > 0, "dpmpp_2m: sigma is 0 at t = ", times[i]);
      const Denoised d = denoise(x, {times[i]});
      const double lt = std::log(rt.alpha) - std::log(rt.sigma);  // -inf where alpha = 0
      const double ls = std::log(rs.alpha) - std::log(rs.sigma);  // +inf where sigma = 0
      const double h = ls - lt;
      const double ratio = rs.sigma / rt.sigma;
      // a_s (1 - e^-h), with e^-h = (a_t s_s)/(s_t a_s); expm1 keeps small steps accurate.
      const double phi = std::isfinite(h) ? -rs.alpha * std::expm1(-h) : rs.alpha - rt.alpha * ratio;
      Tensor D = d.x0;
      if (prev_x0.defined() && std::isfinite(h_prev) && std::isfinite(h) && rs.sigma > 0.0) {
        const double r = h_prev / h;
        D = combine({{1.0 + 1.0 / (2.0 * r), d.x0}, {-1.0 / (2.0 * r), prev_x0}});
      }
      x = combine({{ratio, x}, {phi, D}});
      prev_x0 = d.x0;
      h_prev = h;
    }
    return x;
  }
};

}  // namespace

DEW_PLUGIN("diffusion_samplers", "0.1.0") {
  registrar.add<Sampler>({
      .name = "ddpm",
      .description = "ancestral DDPM: the Gaussian posterior q(x_s | x_t, x0) (Ho et al. 2020), any schedule",
      .factory = [](const dew::Options& o) { return std::make_shared<Ddpm>(o); },
      .options = {{"variance", "small", "small (posterior variance) | large (beta_t)"}},
  });
  registrar.add<Sampler>({
      .name = "ddim",
      .description = "DDIM (Song et al. 2021); eta 0 is deterministic, eta 1 is ancestral",
      .factory = [](const dew::Options& o) { return std::make_shared<Ddim>(o); },
      .options = {{"eta", "0", "stochasticity in [0, 1]"}},
  });
  registrar.add<Sampler>({
      .name = "euler",
      .description = "first-order probability-flow ODE step in sigma, any schedule",
      .factory = [](const dew::Options& o) { return std::make_shared<Euler>(o); },
  });
  registrar.add<Sampler>({
      .name = "euler_ancestral",
      .description = "k-diffusion's Euler ancestral step (ve schedules)",
      .factory = [](const dew::Options& o) { return std::make_shared<EulerAncestral>(o); },
      .options = {{"eta", "1", "ancestral noise fraction"}, {"s_noise", "1", "noise multiplier"}},
  });
  registrar.add<Sampler>({
      .name = "heun",
      .description = "Heun's second-order method with churn (Karras et al. 2022, Alg. 2; ve and flow schedules)",
      .factory = [](const dew::Options& o) { return std::make_shared<Heun>(o); },
      .options = {{"s_churn", "0", "total churn (gamma = min(s_churn/N, sqrt2 - 1)); ve only"},
                  {"s_tmin", "0", "churn only for sigma >= s_tmin"},
                  {"s_tmax", "inf", "churn only for sigma <= s_tmax"},
                  {"s_noise", "1", "churn noise multiplier"}},
  });
  registrar.add<Sampler>({
      .name = "rk4",
      .description = "classical fourth-order Runge-Kutta on dx/dsigma (ve and flow schedules)",
      .factory = [](const dew::Options& o) { return std::make_shared<Rk4>(o); },
  });
  registrar.add<Sampler>({
      .name = "dpmpp_2m",
      .description = "DPM-Solver++(2M) (Lu et al. 2022), second-order multistep in log-SNR, any schedule",
      .factory = [](const dew::Options& o) { return std::make_shared<DpmPp2m>(o); },
  });
}
