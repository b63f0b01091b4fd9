// core/diffusion/schedules.cpp — the noise schedules of dew/diffusion.hpp (host doubles).
// Invariants: rates(t) is defined for every t in [0, T()]; SNR strictly decreases along t on the
// sampling grid; training times come from Philox (seed, stream, i), so they match on every backend.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "dew/diffusion.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"

namespace dew::diffusion {

namespace {
constexpr double kPi = std::numbers::pi;
std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
std::vector<double> betas_from_abar(const std::vector<double>& f, double max_beta) {
  // f has T + 1 entries, f[0] the clean end; beta_i = clip(1 - f[i+1]/f[i], 0, max_beta).
  std::vector<double> betas(f.size() - 1);
  for (size_t i = 0; i + 1 < f.size(); ++i) betas[i] = std::clamp(1.0 - f[i + 1] / f[i], 0.0, max_beta);
  return betas;
}
}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::vp:
      return "vp";
    case Family::ve:
      return "ve";
    case Family::flow:
      return "flow";
  }
  return "?";
}

RowRates::RowRates(std::vector<double> a, std::vector<double> s) : alpha(std::move(a)), sigma(std::move(s)) {
  DEW_CHECK(alpha.size() == sigma.size() && !alpha.empty(), "RowRates: alpha and sigma need the same non-zero length (",
            alpha.size(), " vs ", sigma.size(), ")");
}

// ---------------------------------------------------------------- base

std::string Schedule::describe() const { return name(); }

std::vector<double> Schedule::sample_t(uint64_t seed, uint64_t stream, int64_t n) const {
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = double(philox::uniform(seed, stream, uint64_t(i))) * T();
  return t;
}

std::vector<double> Schedule::times(int64_t steps) const {
  DEW_USAGE_CHECK(steps >= 1, "diffusion sampling needs at least one step, got ", steps);
  std::vector<double> t(size_t(steps) + 1);
  for (int64_t i = 0; i <= steps; ++i) t[size_t(i)] = T() * double(steps - i) / double(steps);
  t.back() = 0.0;
  return t;
}

double Schedule::t_of_sigma(double) const {
  DEW_USAGE_CHECK(false, "schedule '", name(), "' has no time-of-sigma map (only ve and flow schedules do)");
  return 0.0;
}

// ---------------------------------------------------------------- beta tables

std::vector<double> linear_betas(int64_t T, double beta_start, double beta_end) {
  DEW_USAGE_CHECK(T >= 2, "a beta table needs at least 2 timesteps, got ", T);
  const double scale = 1000.0 / double(T);
  const double b0 = beta_start * scale, b1 = beta_end * scale;
  DEW_USAGE_CHECK(b0 > 0 && b1 < 1 && b0 <= b1,
                  "linear betas need 0 < beta_start <= beta_end and beta_end * 1000/T < 1", " (got ", b0, " .. ", b1,
                  " after scaling by 1000/T)");
  std::vector<double> b(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) b[size_t(i)] = b0 + (b1 - b0) * double(i) / double(T - 1);
  return b;
}

std::vector<double> cosine_betas(int64_t T, double s, double max_beta) {
  DEW_USAGE_CHECK(T >= 2, "a beta table needs at least 2 timesteps, got ", T);
  DEW_USAGE_CHECK(s >= 0 && max_beta > 0 && max_beta <= 1, "cosine betas need s >= 0 and 0 < max_beta <= 1");
  std::vector<double> f(size_t(T) + 1);
  for (int64_t i = 0; i <= T; ++i) {
    const double u = double(i) / double(T);
    const double c = std::cos((u + s) / (1.0 + s) * kPi / 2.0);
    f[size_t(i)] = c * c;
  }
  const double f0 = f[0];
  for (double& v : f) v /= f0;
  return betas_from_abar(f, max_beta);
}

std::vector<double> exp_betas(int64_t T, double max_beta) {
  DEW_USAGE_CHECK(T >= 2, "a beta table needs at least 2 timesteps, got ", T);
  std::vector<double> f(size_t(T) + 1);
  for (int64_t i = 0; i <= T; ++i) f[size_t(i)] = std::exp(-12.0 * double(i) / double(T));
  return betas_from_abar(f, max_beta);
}

BetaTable::BetaTable(std::string name, std::vector<double> betas, double p2_k, double p2_gamma)
    : name_(std::move(name)), betas_(std::move(betas)), p2_k_(p2_k), p2_gamma_(p2_gamma) {
  DEW_USAGE_CHECK(betas_.size() >= 2, "a beta table needs at least 2 entries");
  abar_.resize(betas_.size());
  double prod = 1.0;
  for (size_t i = 0; i < betas_.size(); ++i) {
    DEW_USAGE_CHECK(betas_[i] > 0 && betas_[i] <= 1, "beta[", i, "] = ", betas_[i], " is outside (0, 1]");
    prod *= 1.0 - betas_[i];
    abar_[i] = prod;
  }
  DEW_USAGE_CHECK(p2_k_ > 0 || p2_gamma_ == 0, "P2 weighting needs p2_k > 0");
}

std::string BetaTable::describe() const {
  return name_ + " table (T=" + std::to_string(betas_.size()) + ", p2_k=" + fmt(p2_k_) +
         ", p2_gamma=" + fmt(p2_gamma_) + ")";
}

Rates BetaTable::rates(double t) const {
  const int64_t n = int64_t(abar_.size());
  const int64_t i = std::clamp<int64_t>(int64_t(std::floor(t)), 0, n - 1);
  const double a = abar_[size_t(i)];
  return {std::sqrt(a), std::sqrt(1.0 - a)};
}

double BetaTable::weight(double t) const {
  if (p2_gamma_ == 0.0) return 1.0;
  return std::pow(p2_k_ + snr(t), -p2_gamma_);
}

std::vector<double> BetaTable::sample_t(uint64_t seed, uint64_t stream, int64_t n) const {
  const double T = this->T();
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i)
    t[size_t(i)] = std::min(std::floor(double(philox::uniform(seed, stream, uint64_t(i))) * T), T - 1);
  return t;
}

std::vector<double> BetaTable::times(int64_t steps) const {
  DEW_USAGE_CHECK(steps >= 1, "diffusion sampling needs at least one step, got ", steps);
  const int64_t last = int64_t(betas_.size()) - 1;
  const int64_t n = std::min(steps, last);
  std::vector<double> t(size_t(n) + 1);
  for (int64_t i = 0; i <= n; ++i) t[size_t(i)] = double(last) * double(n - i) / double(n);
  t.back() = 0.0;
  return t;
}

// ---------------------------------------------------------------- continuous VP

Rates CosineContinuous::rates(double t) const {
  const double u = std::clamp(t, 0.0, 1.0) * kPi / 2.0;
  // cos(pi/2) in double is 6e-17, not 0: make the noise end exact.
  return t >= 1.0 ? Rates{0.0, 1.0} : Rates{std::cos(u), std::sin(u)};
}

double CosineContinuous::weight(double t) const {
  const Rates r = rates(t);
  return r.sigma * r.sigma / (r.alpha * r.alpha + r.sigma * r.sigma);  // 1 / (1 + SNR)
}

std::string SqrtSchedule::describe() const { return "sqrt (s=" + fmt(s_) + ")"; }

Rates SqrtSchedule::rates(double t) const {
  const double tc = std::clamp(t, 0.0, 1.0);
  const double abar = std::clamp((1.0 - std::sqrt(tc + s_)) / (1.0 - std::sqrt(s_)), 0.0, 1.0);
  return {std::sqrt(abar), std::sqrt(1.0 - abar)};
}

// ---------------------------------------------------------------- Karras VE / EDM

KarrasVE::KarrasVE(double sigma_min, double sigma_max, double rho, double sigma_data)
    : sigma_min_(sigma_min), sigma_max_(sigma_max), rho_(rho), sigma_data_(sigma_data) {
  DEW_USAGE_CHECK(sigma_min > 0 && sigma_max > sigma_min,
                  "karras: need 0 < sigma_min < sigma_max (got sigma_min = ", sigma_min, ", sigma_max = ", sigma_max,
                  ")");
  DEW_USAGE_CHECK(rho > 0, "karras: rho must be positive, got ", rho);
  DEW_USAGE_CHECK(sigma_data > 0, "karras: sigma_data must be positive, got ", sigma_data);
}

std::shared_ptr<KarrasVE> KarrasVE::edm(double P_mean, double P_std, double sigma_min, double sigma_max, double rho,
                                        double sigma_data) {
  DEW_USAGE_CHECK(P_std > 0, "edm: P_std must be positive, got ", P_std);
  auto s = std::make_shared<KarrasVE>(sigma_min, sigma_max, rho, sigma_data);
  s->lognormal_ = true;
  s->P_mean_ = P_mean;
  s->P_std_ = P_std;
  return s;
}

std::string KarrasVE::describe() const {
  std::string d = name() + " (sigma_min=" + fmt(sigma_min_) + ", sigma_max=" + fmt(sigma_max_) + ", rho=" + fmt(rho_) +
                  ", sigma_data=" + fmt(sigma_data_);
  if (lognormal_) d += ", P_mean=" + fmt(P_mean_) + ", P_std=" + fmt(P_std_);
  return d + ")";
}

double KarrasVE::sigma(double t) const {
  const double a = std::pow(sigma_max_, 1.0 / rho_), b = std::pow(sigma_min_, 1.0 / rho_);
  const double base = a + (1.0 - t) * (b - a);
  return base <= 0.0 ? 0.0 : std::pow(base, rho_);
}

double KarrasVE::t_of_sigma(double sigma) const {
  DEW_CHECK(sigma >= 0, "karras: t_of_sigma of a negative sigma (", sigma, ")");
  const double a = std::pow(sigma_max_, 1.0 / rho_), b = std::pow(sigma_min_, 1.0 / rho_);
  return 1.0 - (std::pow(sigma, 1.0 / rho_) - a) / (b - a);
}

double KarrasVE::model_time(double t) const { return std::log(sigma(t)) / 4.0; }

double KarrasVE::weight(double t) const {
  const double s = sigma(t);
  return 1.0 / (sigma_data_ * sigma_data_) + 1.0 / (s * s);
}

std::vector<double> KarrasVE::sample_t(uint64_t seed, uint64_t stream, int64_t n) const {
  if (!lognormal_) return Schedule::sample_t(seed, stream, n);
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i)
    t[size_t(i)] = t_of_sigma(std::exp(P_mean_ + P_std_ * double(philox::normal(seed, stream, uint64_t(i)))));
  return t;
}

// ---------------------------------------------------------------- flow

FlowSchedule::Density flow_density_from_name(const std::string& name) {
  if (name == "logit_normal") return FlowSchedule::Density::logit_normal;
  if (name == "mode") return FlowSchedule::Density::mode;
  if (name == "cosmap") return FlowSchedule::Density::cosmap;
  if (name == "uniform") return FlowSchedule::Density::uniform;
  DEW_USAGE_CHECK(false, "unknown flow density '", name, "' (known: logit_normal, mode, cosmap, uniform)");
  return FlowSchedule::Density::uniform;
}

FlowSchedule::FlowSchedule(double shift, Density density, double logit_mean, double logit_std, double mode_scale)
    : shift_(shift), density_(density), logit_mean_(logit_mean), logit_std_(logit_std), mode_scale_(mode_scale) {
  DEW_USAGE_CHECK(shift > 0 && std::isfinite(shift), "flow: shift must be positive and finite, got ", shift);
  DEW_USAGE_CHECK(logit_std > 0, "flow: logit_std must be positive, got ", logit_std);
  DEW_USAGE_CHECK(mode_scale >= -1.0 && mode_scale <= 2.0 / (kPi - 2.0),
                  "flow: mode_scale must lie in [-1, 2/(pi-2) = 1.752] so the mode density stays monotone, got ",
                  mode_scale);
}

std::string FlowSchedule::describe() const {
  static const char* names[] = {"logit_normal", "mode", "cosmap", "uniform"};
  std::string d = "flow (shift=" + fmt(shift_) + ", density=" + names[int(density_)];
  if (density_ == Density::logit_normal) d += ", logit_mean=" + fmt(logit_mean_) + ", logit_std=" + fmt(logit_std_);
  if (density_ == Density::mode) d += ", mode_scale=" + fmt(mode_scale_);
  return d + ")";
}

double FlowSchedule::shifted(double t) const { return shift_ * t / (1.0 + (shift_ - 1.0) * t); }

Rates FlowSchedule::rates(double t) const {
  const double s = std::clamp(shifted(std::clamp(t, 0.0, 1.0)), 0.0, 1.0);
  return {1.0 - s, s};
}

double FlowSchedule::t_of_sigma(double sigma) const {
  DEW_CHECK(sigma >= 0 && sigma <= 1, "flow: t_of_sigma needs sigma in [0, 1], got ", sigma);
  return sigma / (shift_ - (shift_ - 1.0) * sigma);
}

std::vector<double> FlowSchedule::sample_t(uint64_t seed, uint64_t stream, int64_t n) const {
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    double v = 0.0;
    if (density_ == Density::logit_normal) {
      const double z = logit_mean_ + logit_std_ * double(philox::normal(seed, stream, uint64_t(i)));
      v = 1.0 / (1.0 + std::exp(-z));
    } else {
      const double u = double(philox::uniform(seed, stream, uint64_t(i)));
      if (density_ == Density::mode) {
        const double c = std::cos(kPi * u / 2.0);
        v = 1.0 - u - mode_scale_ * (c * c - 1.0 + u);
      } else if (density_ == Density::cosmap) {
        v = 1.0 - 1.0 / (std::tan(kPi * u / 2.0) + 1.0);
      } else {
        v = u;
      }
    }
    t[size_t(i)] = std::clamp(v, 0.0, 1.0);
  }
  return t;
}

double resolution_shift(double tokens, double base_shift, double max_shift, double base_tokens, double max_tokens) {
  DEW_USAGE_CHECK(max_tokens != base_tokens, "resolution shift: max_tokens must differ from base_tokens");
  const double slope = (max_shift - base_shift) / (max_tokens - base_tokens);
  return std::exp(tokens * slope + (base_shift - slope * base_tokens));
}

}  // namespace dew::diffusion
