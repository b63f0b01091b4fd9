// dew/diffusion.hpp — diffusion maths: noise schedules, prediction transforms, loss weightings, processes.
//
// Usable on its own (no plugin needed). Conventions, shared by every piece:
//  * x_t = alpha(t) * x0 + sigma(t) * eps, eps ~ N(0, I). Time runs from 0 (clean) to T() (pure noise);
//    SNR(t) = (alpha/sigma)^2 strictly decreases along t.
//  * Families: vp (alpha^2 + sigma^2 = 1: beta tables, continuous cosine, sqrt), ve (alpha = 1: Karras,
//    EDM), flow (alpha + sigma = 1: rectified flow). Integrators in sigma refuse vp (see dew/sampler.hpp).
//  * Schedules work on host doubles. Tensors are [B, ...] (e.g. [B, C, H, W]); per-row rates are host
//    vectors of B values (or 1 value for every row) broadcast over the trailing axes on the tensor's own
//    backend through dew ops (dew/ops.hpp), so the same code runs on ref, cpu and cuda and is
//    differentiable where the training loss needs it.
//  * Random draws are Philox (dew/random.hpp) keyed by (seed, stream, index): a seed gives the same
//    training times and noise on every backend and thread count.
//  * Transforms are per-row linear maps: the network input is c_in * x_t; the training target is
//    a*x0 + b*eps; the clean estimate and the noise estimate are a*x_t + b*output. A new transform only
//    supplies these host coefficients.
// References: Ho et al. 2020 (DDPM), Nichol & Dhariwal 2021 (cosine table, eq. 17), Salimans & Ho 2022
// (v), Karras et al. 2022 (EDM), Lipman et al. 2023 / Esser et al. 2024 (flow, shift, densities),
// Hang et al. 2023 (min-SNR-gamma), Choi et al. 2022 (P2 weighting).
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew::diffusion {

enum class Family { vp, ve, flow };
const char* family_name(Family f);  // "vp" | "ve" | "flow"

struct Rates {
  double alpha = 1.0, sigma = 0.0;
  double snr() const { return sigma == 0.0 ? INFINITY : (alpha * alpha) / (sigma * sigma); }
};

// One (alpha, sigma) per batch row, or a single pair shared by every row.
struct RowRates {
  std::vector<double> alpha, sigma;
  RowRates() = default;
  RowRates(Rates r) : alpha{r.alpha}, sigma{r.sigma} {}  // NOLINT: a shared pair converts implicitly
  RowRates(std::vector<double> a, std::vector<double> s);
  size_t rows() const { return alpha.size(); }
  Rates row(size_t i) const { return rows() == 1 ? Rates{alpha[0], sigma[0]} : Rates{alpha[i], sigma[i]}; }
};

// ---------------------------------------------------------------- schedules

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual std::string name() const = 0;  // "cosine", "karras", ...
  virtual std::string describe() const;  // name and parameters, for logs
  virtual Family family() const = 0;
  // The noise end of the time axis: 1000 (the table length) for beta tables, 1 for continuous schedules.
  virtual double T() const = 0;
  virtual Rates rates(double t) const = 0;
  double snr(double t) const { return rates(t).snr(); }
  // The scalar the network is conditioned on (tables: the index t; continuous VP: 1000 t; Karras/EDM:
  // ln(sigma)/4 (EDM's c_noise); flow: 1000 t').
  virtual double model_time(double t) const = 0;
  // The schedule's own loss weight (see each schedule).
  virtual double weight(double t) const = 0;
  // The standard deviation of the prior x_T: 1 for vp and flow, sigma_max for ve.
  virtual double prior_scale() const { return 1.0; }
  // n training times drawn from the schedule's density: element i uses Philox (seed, stream, i...).
  virtual std::vector<double> sample_t(uint64_t seed, uint64_t stream, int64_t n) const;
  // The sampling grid: steps + 1 descending times from the noise end to 0 (linspace(T, 0); tables:
  // linspace(T - 1, 0) with steps capped at T - 1, so no two grid points read the same table entry).
  virtual std::vector<double> times(int64_t steps) const;
  // The time at which sigma(t) = sigma (ve and flow); has_t_of_sigma() says whether it exists.
  virtual bool has_t_of_sigma() const { return false; }
  virtual double t_of_sigma(double sigma) const;
};

// A discrete VP table (DDPM): abar = cumprod(1 - beta) in double; rates(t) = (sqrt(abar[i]),
// sqrt(1 - abar[i])) with i = clamp(floor(t), 0, T - 1), so t = T reads the last entry; sample_t draws
// integers in [0, T); weight = P2 (p2_k + SNR)^-p2_gamma (the defaults give 1 / (1 + SNR)).
class BetaTable : public Schedule {
 public:
  BetaTable(std::string name, std::vector<double> betas, double p2_k = 1.0, double p2_gamma = 1.0);
  std::string name() const override { return name_; }
  std::string describe() const override;
  Family family() const override { return Family::vp; }
  double T() const override { return double(betas_.size()); }
  Rates rates(double t) const override;
  double model_time(double t) const override { return t; }
  double weight(double t) const override;
  std::vector<double> sample_t(uint64_t seed, uint64_t stream, int64_t n) const override;
  std::vector<double> times(int64_t steps) const override;
  const std::vector<double>& betas() const { return betas_; }
  const std::vector<double>& alphas_cumprod() const { return abar_; }

 private:
  std::string name_;
  std::vector<double> betas_, abar_;
  double p2_k_, p2_gamma_;
};
// DDPM's linear betas, scaled by 1000 / T (improved-diffusion): beta_start * 1000/T .. beta_end * 1000/T.
std::vector<double> linear_betas(int64_t T, double beta_start = 1e-4, double beta_end = 0.02);
// Nichol & Dhariwal eq. 17: f(u) = cos((u + s)/(1 + s) * pi/2)^2 on linspace(0, 1, T + 1), abar = f/f(0),
// beta = clip(1 - abar[i+1]/abar[i], 0, max_beta).
std::vector<double> cosine_betas(int64_t T, double s = 0.008, double max_beta = 0.999);
// abar = exp(-12 u) on the same grid, betas derived the same way (clipped at max_beta).
std::vector<double> exp_betas(int64_t T, double max_beta = 0.999);

// Continuous cosine VP: alpha = cos(pi t / 2), sigma = sin(pi t / 2), t in [0, 1]; weight 1 / (1 + SNR).
class CosineContinuous : public Schedule {
 public:
  std::string name() const override { return "cosine_continuous"; }
  Family family() const override { return Family::vp; }
  double T() const override { return 1.0; }
  Rates rates(double t) const override;
  double model_time(double t) const override { return 1000.0 * t; }
  double weight(double t) const override;
};

// Diffusion-LM's sqrt VP schedule: abar = clip((1 - sqrt(t + s)) / (1 - sqrt(s)), 0, 1), t in [0, 1]; weight 1.
class SqrtSchedule : public Schedule {
 public:
  explicit SqrtSchedule(double s = 1e-4) : s_(s) {}
  std::string name() const override { return "sqrt"; }
  std::string describe() const override;
  Family family() const override { return Family::vp; }
  double T() const override { return 1.0; }
  Rates rates(double t) const override;
  double model_time(double t) const override { return 1000.0 * t; }
  double weight(double) const override { return 1.0; }

 private:
  double s_;
};

// Karras VE (EDM's sampling grid): alpha = 1, sigma(t) = (smax^(1/rho) + (1 - t)(smin^(1/rho) - smax^(1/rho)))^rho,
// t in [0, 1] (t = 0: sigma_min, t = 1: sigma_max; outside [0, 1] the ramp extrapolates, so a churned
// sigma above sigma_max still has a time). weight = EDM's lambda = 1/sigma_data^2 + 1/sigma^2;
// model_time = ln(sigma)/4. sample_t: uniform on [0, 1), or with lognormal() EDM's training density
// sigma = exp(P_mean + P_std n), n ~ N(0, 1), mapped to t through t_of_sigma.
class KarrasVE : public Schedule {
 public:
  KarrasVE(double sigma_min = 0.002, double sigma_max = 80.0, double rho = 7.0, double sigma_data = 0.5);
  // EDM's training density (the "edm" schedule).
  static std::shared_ptr<KarrasVE> edm(double P_mean, double P_std, double sigma_min = 0.002, double sigma_max = 80.0,
                                       double rho = 7.0, double sigma_data = 0.5);
  std::string name() const override { return lognormal_ ? "edm" : "karras"; }
  std::string describe() const override;
  Family family() const override { return Family::ve; }
  double T() const override { return 1.0; }
  Rates rates(double t) const override { return {1.0, sigma(t)}; }
  double sigma(double t) const;
  double model_time(double t) const override;
  double weight(double t) const override;
  double prior_scale() const override { return sigma_max_; }
  std::vector<double> sample_t(uint64_t seed, uint64_t stream, int64_t n) const override;
  bool has_t_of_sigma() const override { return true; }
  double t_of_sigma(double sigma) const override;
  double sigma_min() const { return sigma_min_; }
  double sigma_max() const { return sigma_max_; }
  double sigma_data() const { return sigma_data_; }

 private:
  double sigma_min_, sigma_max_, rho_, sigma_data_;
  bool lognormal_ = false;
  double P_mean_ = 0.0, P_std_ = 1.0;
};

// Rectified flow: t' = shift t / (1 + (shift - 1) t), rates (1 - t', t'), weight 1, model_time 1000 t'.
// Training densities: logit_normal t = sigmoid(mean + std n); mode t = 1 - u - s (cos^2(pi u / 2) - 1 + u)
// (s = mode_scale in [-1, 2/(pi - 2)]); cosmap t = 1 - 1/(tan(pi u / 2) + 1); uniform t = u.
class FlowSchedule : public Schedule {
 public:
  enum class Density { logit_normal, mode, cosmap, uniform };
  FlowSchedule(double shift = 1.0, Density density = Density::logit_normal, double logit_mean = 0.0,
               double logit_std = 1.0, double mode_scale = 1.29);
  std::string name() const override { return "flow"; }
  std::string describe() const override;
  Family family() const override { return Family::flow; }
  double T() const override { return 1.0; }
  double shifted(double t) const;  // t'
  Rates rates(double t) const override;
  double model_time(double t) const override { return 1000.0 * shifted(t); }
  double weight(double) const override { return 1.0; }
  std::vector<double> sample_t(uint64_t seed, uint64_t stream, int64_t n) const override;
  bool has_t_of_sigma() const override { return true; }
  double t_of_sigma(double sigma) const override;
  double shift() const { return shift_; }

 private:
  double shift_;
  Density density_;
  double logit_mean_, logit_std_, mode_scale_;
};
FlowSchedule::Density flow_density_from_name(const std::string& name);  // UsageError listing the names

// SD3's resolution-dependent shift: mu = tokens * slope + (base_shift - slope * base_tokens),
// slope = (max_shift - base_shift) / (max_tokens - base_tokens); returns exp(mu). Tokens are counted on
// 16x16-pixel cells (or latent patches).
double resolution_shift(double tokens, double base_shift = 0.5, double max_shift = 1.15, double base_tokens = 256,
                        double max_tokens = 4096);

// ---------------------------------------------------------------- prediction transforms

struct Coefs {
  double a = 0.0, b = 0.0;  // result = a * first + b * second
};

struct Diffused {
  Tensor x_t;     // alpha * x0 + sigma * eps
  Tensor c_in;    // [B, 1, ...] (or [1]): the network sees x_t * c_in
  Tensor target;  // what prediction(x_t, output) is trained towards
};
struct Denoised {
  Tensor x0, eps;
};

class Transform {
 public:
  virtual ~Transform() = default;
  virtual std::string name() const = 0;  // "epsilon" | "x0" | "v" | "flow" | "karras"
  // ---- per-row host coefficients (what a new transform implements) ----
  virtual double c_in(Rates r) const;                           // default 1/sqrt(alpha^2 + sigma^2)
  virtual Coefs target(Rates r) const = 0;                      // target = a x0 + b eps
  virtual Coefs x0_from_output(Rates r) const = 0;              // x0 = a x_t + b output
  virtual Coefs eps_from_output(Rates r) const = 0;             // eps = a x_t + b output
  virtual Coefs prediction(Rates) const { return {0.0, 1.0}; }  // what the loss compares: a x_t + b output
  // The scale of the target's error relative to the x0 error at this SNR (min-SNR divides by it).
  virtual double target_error_scale(double snr) const = 0;
  // Refuses (UsageError) a schedule this parameterisation cannot be used with.
  virtual void check(const Schedule& schedule) const { (void)schedule; }

  // ---- tensor maps (libdew; rates per row or shared) ----
  Diffused forward_diffusion(const Tensor& x0, const Tensor& eps, const RowRates& r) const;
  Tensor scale_input(const Tensor& x_t, const RowRates& r) const;  // x_t * c_in
  Denoised to_x0_eps(const Tensor& x_t, const Tensor& output, const RowRates& r) const;
  Tensor predict(const Tensor& x_t, const Tensor& output, const RowRates& r) const;  // compared with target
};

// eps-prediction: target eps; x0 = (x_t - sigma p)/alpha (refused where alpha = 0); error scale SNR.
class EpsilonTransform : public Transform {
 public:
  std::string name() const override { return "epsilon"; }
  Coefs target(Rates) const override { return {0.0, 1.0}; }
  Coefs x0_from_output(Rates r) const override;
  Coefs eps_from_output(Rates) const override { return {0.0, 1.0}; }
  double target_error_scale(double snr) const override { return snr; }
  void check(const Schedule& schedule) const override;
};
// x0-prediction: target x0; eps = (x_t - alpha p)/sigma (0 where sigma = 0); error scale 1.
class X0Transform : public Transform {
 public:
  std::string name() const override { return "x0"; }
  Coefs target(Rates) const override { return {1.0, 0.0}; }
  Coefs x0_from_output(Rates) const override { return {0.0, 1.0}; }
  Coefs eps_from_output(Rates r) const override;
  double target_error_scale(double) const override { return 1.0; }
};
// v-prediction: target v/sqrt(var), v = alpha eps - sigma x0, var = alpha^2 + sigma^2;
// x0 = (alpha x_t - sigma v)/var, eps = (alpha v + sigma x_t)/var with v = p sqrt(var); error scale SNR + 1.
class VTransform : public Transform {
 public:
  std::string name() const override { return "v"; }
  Coefs target(Rates r) const override;
  Coefs x0_from_output(Rates r) const override;
  Coefs eps_from_output(Rates r) const override;
  double target_error_scale(double snr) const override { return snr + 1.0; }
};
// Flow velocity: target u = eps - x0; x0 = x_t - sigma p, eps = x_t + alpha p (needs alpha + sigma = 1);
// error scale (1 + sqrt(SNR))^2.
class FlowTransform : public Transform {
 public:
  std::string name() const override { return "flow"; }
  Coefs target(Rates) const override { return {-1.0, 1.0}; }
  Coefs x0_from_output(Rates r) const override { return {1.0, -r.sigma}; }
  Coefs eps_from_output(Rates r) const override { return {1.0, r.alpha}; }
  double target_error_scale(double snr) const override;
  void check(const Schedule& schedule) const override;
};
// Karras/EDM preconditioning (ve only): c_in = 1/sqrt(sd^2 + sigma^2), c_skip = sd^2/(sd^2 + sigma^2),
// c_out = sigma sd/sqrt(sd^2 + sigma^2); x0 = c_skip x_t + c_out F; target x0 (the loss compares
// c_skip x_t + c_out F with x0); error scale 1/sd^2 + SNR.
class KarrasTransform : public Transform {
 public:
  explicit KarrasTransform(double sigma_data = 0.5) : sd_(sigma_data) {}
  std::string name() const override { return "karras"; }
  double c_in(Rates r) const override;
  Coefs target(Rates) const override { return {1.0, 0.0}; }
  Coefs x0_from_output(Rates r) const override;
  Coefs eps_from_output(Rates r) const override;
  Coefs prediction(Rates r) const override { return x0_from_output(r); }
  double target_error_scale(double snr) const override { return 1.0 / (sd_ * sd_) + snr; }
  void check(const Schedule& schedule) const override;
  double sigma_data() const { return sd_; }

 private:
  double sd_;
};

// "epsilon" | "x0" | "v" | "flow" | "karras" (sigma_data for karras); UsageError listing the names.
std::shared_ptr<Transform> make_transform(const std::string& name, double sigma_data = 0.5);

// ---------------------------------------------------------------- weightings

class Weighting {
 public:
  virtual ~Weighting() = default;
  virtual std::string name() const = 0;
  virtual double weight(double t, const Schedule& schedule, const Transform& transform) const = 0;
};
// The schedule's own weight(t).
class ScheduleWeighting : public Weighting {
 public:
  std::string name() const override { return "schedule"; }
  double weight(double t, const Schedule& s, const Transform&) const override { return s.weight(t); }
};
// Min-SNR-gamma: min(SNR, gamma) / transform.target_error_scale(SNR) (replaces the schedule's weight).
class MinSnrWeighting : public Weighting {
 public:
  explicit MinSnrWeighting(double gamma);
  std::string name() const override;
  double weight(double t, const Schedule& s, const Transform& tr) const override;
  double gamma() const { return gamma_; }

 private:
  double gamma_;
};

// ---------------------------------------------------------------- processes and presets

struct Process {
  std::shared_ptr<const Schedule> train;   // training times, rates and weights
  std::shared_ptr<const Schedule> sample;  // sampling grid and the rates the denoiser reads
  std::shared_ptr<const Transform> transform;
  std::shared_ptr<const Weighting> weighting;

  std::string describe() const;  // one line: schedules, prediction, weighting
  void check() const;            // all four set; the transform accepts both schedules
  RowRates train_rates(const std::vector<double>& t) const;
  RowRates sample_rates(const std::vector<double>& t) const;
  std::vector<double> weights(const std::vector<double>& t) const;  // per training time
  // The prior x_T ~ N(0, prior_scale^2 I), Philox (seed, prior_stream()).
  Tensor noise(const Shape& shape, DType dtype, const BackendPtr& backend, uint64_t seed) const;
  static uint64_t prior_stream();
};

// Builds a process from options (one config section). Either `preset` or `schedule` is required:
//   preset    = edm | karras | cosine | flow
//   schedule  = linear | cosine | exp | cosine_continuous | sqrt | karras | edm | flow (overrides the preset's)
//   prediction = epsilon | x0 | v | flow | karras   (default: the preset's, else by family: vp epsilon,
//                                                   ve karras, flow flow)
//   min_snr_gamma (replaces the schedule weighting), timesteps, beta_start, beta_end, p2_k, p2_gamma,
//   sigma_min, sigma_max, rho, sigma_data, regime (pixel | latent), P_mean, P_std, shift, density,
//   logit_mean, logit_std, mode_scale.
// Keys that do not apply to the chosen schedule and contradictory combinations are refused with a
// UsageError that says why. Only the keys above are read (the caller checks the rest).
Process make_process(const Options& options);
// The keys make_process reads, for a component's `.options` list (dew-run train --help).
std::vector<OptionSpec> process_option_specs();

// ---------------------------------------------------------------- the backbone contract
//
// A diffusion backbone (dit, unet, or a plugin's) reads forward({"x": [B, C, H, W] (c_in * x_t as the
// objective feeds it), "t": f32 [B] (the schedule's model time, any range), "label": i32 [B] (optional)})
// and returns [B, out_channels, H, W]. Labels are in [0, num_classes]: num_classes is the learned null
// class of classifier-free guidance and a missing label means null. Its time embedding is
// nn::TimestepEmbedder over nn::TimeEmbeddingConfig (dew/nn.hpp), so every backbone reads the same
// time_* keys.

// The image keys every diffusion backbone reads (the diffusion objective fills the first three from the
// data), for a backbone's `.options` list.
std::vector<OptionSpec> backbone_image_option_specs();
// Reads and checks the optional "label" input: [B] in [0, num_classes] (num_classes = null), as i32.
// Returns an undefined tensor when there is no label. An unconditional model (num_classes 0) accepts only
// the null label 0. Anything else is refused, naming `model`, before a kernel reads it.
Tensor checked_label(const std::map<std::string, Tensor>& inputs, int64_t batch, int64_t num_classes,
                     const char* model);

// ---------------------------------------------------------------- tensor helpers

// v as a tensor of like's dtype and backend shaped [B, 1, ..., 1] (like's rank) for B = v.size() rows,
// or [1] for a single value.
Tensor row_scalars(const std::vector<double>& v, const Tensor& like);
// a * x + b * y with a, b per row (size B or 1); a zero coefficient skips its term (y may then be undefined).
Tensor lincomb(const std::vector<double>& a, const Tensor& x, const std::vector<double>& b, const Tensor& y);
// sum of c_i * x_i for host scalars (zero terms skipped; at least one term non-zero or the first kept).
Tensor combine(const std::vector<std::pair<double, Tensor>>& terms);

}  // namespace dew::diffusion
