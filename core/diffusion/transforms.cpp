// core/diffusion/transforms.cpp — prediction transforms, weightings and the per-row tensor helpers.
// Invariants: every transform is a per-row linear map given by host coefficients (computed in double);
// the tensor side is row_scalars/lincomb on the input's backend and dtype through dew ops, so it is
// differentiable (the training loss flows through predict()) and runs on any backend.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "dew/diffusion.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"

namespace dew::diffusion {

// ---------------------------------------------------------------- tensor helpers

Tensor row_scalars(const std::vector<double>& v, const Tensor& like) {
  DEW_CHECK(!v.empty(), "row_scalars: no values");
  Shape shape{1};
  if (v.size() > 1) {
    DEW_CHECK(like.ndim() >= 1 && like.shape()[0] == int64_t(v.size()), "per-row values: ", v.size(),
              " values for a tensor of shape ", shape_str(like.shape()));
    shape.assign(size_t(like.ndim()), 1);
    shape[0] = int64_t(v.size());
  }
  if (like.dtype() == DType::f64) return Tensor::from_host(v.data(), shape, DType::f64, like.backend_ptr());
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(f, shape, like.backend_ptr(), like.dtype());
}

namespace {
bool all_equal(const std::vector<double>& v) {
  for (double x : v)
    if (x != v[0]) return false;
  return true;
}
// c * x for a per-row (or shared) c; nullopt-like undefined Tensor when c is all zero.
Tensor scaled(const std::vector<double>& c, const Tensor& x) {
  if (all_equal(c)) {
    const double s = c[0];
    if (s == 0.0) return {};
    if (s == 1.0) return x;
    if (x.dtype() != DType::f64) return scale(x, float(s));
    return mul(x, row_scalars({s}, x));
  }
  return mul(x, row_scalars(c, x));
}
}  // namespace

Tensor lincomb(const std::vector<double>& a, const Tensor& x, const std::vector<double>& b, const Tensor& y) {
  Tensor ax = scaled(a, x);
  Tensor by = y.defined() ? scaled(b, y) : Tensor();
  DEW_CHECK(y.defined() || (all_equal(b) && b[0] == 0.0), "lincomb: a non-zero coefficient on an undefined tensor");
  if (ax.defined() && by.defined()) return add(ax, by);
  if (ax.defined()) return ax;
  if (by.defined()) return by;
  return scale(x, 0.0f);
}

Tensor combine(const std::vector<std::pair<double, Tensor>>& terms) {
  DEW_CHECK(!terms.empty(), "combine: no terms");
  Tensor acc;
  for (const auto& [c, x] : terms) {
    Tensor t = scaled({c}, x);
    if (!t.defined()) continue;
    acc = acc.defined() ? add(acc, t) : t;
  }
  return acc.defined() ? acc : scale(terms[0].second, 0.0f);
}

// ---------------------------------------------------------------- transforms: tensor maps

namespace {
template <class F>
void per_row(const RowRates& r, std::vector<double>& a, std::vector<double>& b, F&& coefs) {
  a.resize(r.rows());
  b.resize(r.rows());
  for (size_t i = 0; i < r.rows(); ++i) {
    const Coefs c = coefs(r.row(i));
    DEW_CHECK(std::isfinite(c.a) && std::isfinite(c.b),
              "diffusion transform: non-finite coefficient at alpha = ", r.row(i).alpha, ", sigma = ", r.row(i).sigma);
    a[i] = c.a;
    b[i] = c.b;
  }
}
}  // namespace

Diffused Transform::forward_diffusion(const Tensor& x0, const Tensor& eps, const RowRates& r) const {
  DEW_CHECK(x0.shape() == eps.shape(), "forward_diffusion: x0 ", shape_str(x0.shape()), " and eps ",
            shape_str(eps.shape()), " differ");
  Diffused d;
  d.x_t = lincomb(r.alpha, x0, r.sigma, eps);
  std::vector<double> cin(r.rows()), ta, tb;
  for (size_t i = 0; i < r.rows(); ++i) cin[i] = c_in(r.row(i));
  d.c_in = row_scalars(cin, x0);
  per_row(r, ta, tb, [&](Rates rr) { return target(rr); });
  d.target = lincomb(ta, x0, tb, eps);
  return d;
}

Tensor Transform::scale_input(const Tensor& x_t, const RowRates& r) const {
  std::vector<double> cin(r.rows());
  for (size_t i = 0; i < r.rows(); ++i) cin[i] = c_in(r.row(i));
  return lincomb(cin, x_t, {0.0}, Tensor());
}

Denoised Transform::to_x0_eps(const Tensor& x_t, const Tensor& output, const RowRates& r) const {
  DEW_CHECK(x_t.shape() == output.shape(), "to_x0_eps: x_t ", shape_str(x_t.shape()), " and the model output ",
            shape_str(output.shape()), " differ");
  std::vector<double> xa, xb, ea, eb;
  per_row(r, xa, xb, [&](Rates rr) { return x0_from_output(rr); });
  per_row(r, ea, eb, [&](Rates rr) { return eps_from_output(rr); });
  return {lincomb(xa, x_t, xb, output), lincomb(ea, x_t, eb, output)};
}

Tensor Transform::predict(const Tensor& x_t, const Tensor& output, const RowRates& r) const {
  std::vector<double> a, b;
  per_row(r, a, b, [&](Rates rr) { return prediction(rr); });
  return lincomb(a, x_t, b, output);
}

double Transform::c_in(Rates r) const { return 1.0 / std::sqrt(r.alpha * r.alpha + r.sigma * r.sigma); }

// ---------------------------------------------------------------- transforms: coefficients

Coefs EpsilonTransform::x0_from_output(Rates r) const {
  DEW_CHECK(r.alpha > 0, "epsilon prediction cannot recover x0 where alpha = 0 (sigma = ", r.sigma,
            "): use v, x0 or flow prediction with this schedule");
  return {1.0 / r.alpha, -r.sigma / r.alpha};
}

void EpsilonTransform::check(const Schedule& s) const {
  DEW_USAGE_CHECK(s.rates(s.T()).alpha > 0, "prediction = epsilon cannot be used with schedule ", s.describe(),
                  ": alpha reaches 0 at t = T, where x0 = (x_t - sigma eps)/alpha is undefined; use prediction = v, "
                  "x0 or flow");
}

Coefs X0Transform::eps_from_output(Rates r) const {
  if (r.sigma == 0.0) return {0.0, 0.0};  // no noise in a clean x_t
  return {1.0 / r.sigma, -r.alpha / r.sigma};
}

Coefs VTransform::target(Rates r) const {
  const double sv = std::sqrt(r.alpha * r.alpha + r.sigma * r.sigma);
  return {-r.sigma / sv, r.alpha / sv};
}
Coefs VTransform::x0_from_output(Rates r) const {
  const double var = r.alpha * r.alpha + r.sigma * r.sigma, sv = std::sqrt(var);
  return {r.alpha / var, -r.sigma / sv};
}
Coefs VTransform::eps_from_output(Rates r) const {
  const double var = r.alpha * r.alpha + r.sigma * r.sigma, sv = std::sqrt(var);
  return {r.sigma / var, r.alpha / sv};
}

double FlowTransform::target_error_scale(double snr) const {
  const double q = 1.0 + std::sqrt(snr);
  return q * q;
}
void FlowTransform::check(const Schedule& s) const {
  DEW_USAGE_CHECK(s.family() == Family::flow, "prediction = flow needs a flow schedule (alpha + sigma = 1), not ",
                  s.describe(), " (", family_name(s.family()), ")");
}

double KarrasTransform::c_in(Rates r) const { return 1.0 / std::sqrt(sd_ * sd_ + r.sigma * r.sigma); }
Coefs KarrasTransform::x0_from_output(Rates r) const {
  const double v = sd_ * sd_ + r.sigma * r.sigma;
  return {sd_ * sd_ / v, r.sigma * sd_ / std::sqrt(v)};
}
Coefs KarrasTransform::eps_from_output(Rates r) const {
  // eps = (x_t - x0)/sigma = sigma/(sd^2 + sigma^2) x_t - sd/sqrt(sd^2 + sigma^2) F (defined at sigma = 0 too).
  const double v = sd_ * sd_ + r.sigma * r.sigma;
  return {r.sigma / v, -sd_ / std::sqrt(v)};
}
void KarrasTransform::check(const Schedule& s) const {
  DEW_USAGE_CHECK(s.family() == Family::ve,
                  "prediction = karras (EDM preconditioning) needs a ve schedule (karras or "
                  "edm), not ",
                  s.describe(), " (", family_name(s.family()), ")");
}

std::shared_ptr<Transform> make_transform(const std::string& name, double sigma_data) {
  if (name == "epsilon" || name == "eps") return std::make_shared<EpsilonTransform>();
  if (name == "x0") return std::make_shared<X0Transform>();
  if (name == "v") return std::make_shared<VTransform>();
  if (name == "flow") return std::make_shared<FlowTransform>();
  if (name == "karras" || name == "edm") {
    DEW_USAGE_CHECK(sigma_data > 0, "sigma_data must be positive, got ", sigma_data);
    return std::make_shared<KarrasTransform>(sigma_data);
  }
  DEW_USAGE_CHECK(false, "unknown prediction '", name, "' (known: epsilon, x0, v, flow, karras)");
  return nullptr;
}

// ---------------------------------------------------------------- weightings

MinSnrWeighting::MinSnrWeighting(double gamma) : gamma_(gamma) {
  DEW_USAGE_CHECK(gamma > 0, "min_snr_gamma must be positive (inf: no cap), got ", gamma);
}
std::string MinSnrWeighting::name() const {
  std::ostringstream os;
  os << "min_snr(gamma=" << gamma_ << ")";
  return os.str();
}
double MinSnrWeighting::weight(double t, const Schedule& s, const Transform& tr) const {
  const double snr = s.snr(t);
  const double scale = tr.target_error_scale(snr);
  if (std::isinf(snr)) return std::isinf(gamma_) ? 1.0 : 0.0;  // a clean sample carries no loss
  if (scale == 0.0) return 1.0;                                // SNR = 0 with epsilon: the limit of min(SNR, gamma)/SNR
  return std::min(snr, gamma_) / scale;
}

}  // namespace dew::diffusion
