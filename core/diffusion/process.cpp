// core/diffusion/process.cpp — Process (train/sample schedules + transform + weighting) and the presets.
// Invariants: make_process reads only the keys of process_option_specs(); a key that does not apply to
// the chosen schedule (or density) and a contradictory combination are refused with a UsageError that
// names the key and says why, never ignored.
#include <cmath>
#include <map>
#include <set>

#include "dew/diffusion.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"

namespace dew::diffusion {

// ---------------------------------------------------------------- Process

std::string Process::describe() const {
  std::string d = "train " + (train ? train->describe() : std::string("?"));
  if (sample && sample != train) d += ", sample " + sample->describe();
  d += ", prediction " + (transform ? transform->name() : std::string("?"));
  d += ", weighting " + (weighting ? weighting->name() : std::string("?"));
  return d;
}

void Process::check() const {
  DEW_CHECK(train && sample && transform && weighting, "diffusion process: schedule, sampling schedule, transform and ",
            "weighting must all be set");
  transform->check(*train);
  if (sample != train) transform->check(*sample);
}

RowRates Process::train_rates(const std::vector<double>& t) const {
  std::vector<double> a(t.size()), s(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const Rates r = train->rates(t[i]);
    a[i] = r.alpha;
    s[i] = r.sigma;
  }
  return {std::move(a), std::move(s)};
}

RowRates Process::sample_rates(const std::vector<double>& t) const {
  std::vector<double> a(t.size()), s(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const Rates r = sample->rates(t[i]);
    a[i] = r.alpha;
    s[i] = r.sigma;
  }
  return {std::move(a), std::move(s)};
}

std::vector<double> Process::weights(const std::vector<double>& t) const {
  std::vector<double> w(t.size());
  for (size_t i = 0; i < t.size(); ++i) w[i] = weighting->weight(t[i], *train, *transform);
  return w;
}

uint64_t Process::prior_stream() { return philox::stream_of("dew.diffusion.prior"); }

Tensor Process::noise(const Shape& shape, DType dtype, const BackendPtr& backend, uint64_t seed) const {
  return Tensor::normal(shape, 0.0f, float(sample->prior_scale()), seed, prior_stream(), backend, dtype);
}

// ---------------------------------------------------------------- presets

namespace {

// Which schedules each schedule-specific key applies to.
const std::map<std::string, std::set<std::string>>& key_scope() {
  static const std::map<std::string, std::set<std::string>> m = {
      {"timesteps", {"linear", "cosine", "exp"}},
      {"p2_k", {"linear", "cosine", "exp"}},
      {"p2_gamma", {"linear", "cosine", "exp"}},
      {"beta_start", {"linear"}},
      {"beta_end", {"linear", "cosine", "exp"}},
      {"cosine_s", {"cosine"}},
      {"sqrt_s", {"sqrt"}},
      {"sigma_min", {"karras", "edm"}},
      {"sigma_max", {"karras", "edm"}},
      {"rho", {"karras", "edm"}},
      {"regime", {"edm"}},
      {"P_mean", {"edm"}},
      {"P_std", {"edm"}},
      {"shift", {"flow"}},
      {"density", {"flow"}},
      {"logit_mean", {"flow"}},
      {"logit_std", {"flow"}},
      {"mode_scale", {"flow"}},
  };
  return m;
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : " | ") + x;
  return out;
}

}  // namespace

std::vector<OptionSpec> process_option_specs() {
  return {
      {"preset", "", "diffusion preset: edm | karras | cosine | flow (schedule= and prediction= override)"},
      {"schedule", "", "linear | cosine | exp | cosine_continuous | sqrt | karras | edm | flow"},
      {"prediction", "", "epsilon | x0 | v | flow | karras (default: the preset's; vp epsilon, ve karras, flow flow)"},
      {"min_snr_gamma", "", "min-SNR-gamma weighting min(SNR, gamma)/target_error_scale (inf: uncapped)"},
      {"timesteps", "1000", "beta tables: number of entries T"},
      {"beta_start", "0.0001", "linear table: first beta (times 1000/T)"},
      {"beta_end", "0.02 (linear), 0.999 (cosine, exp; cosine preset 1.0)", "tables: last beta / beta clip"},
      {"cosine_s", "0.008", "cosine table: offset s of Nichol & Dhariwal eq. 17"},
      {"p2_k", "1", "tables: P2 weight (p2_k + SNR)^-p2_gamma"},
      {"p2_gamma", "1", "tables: P2 weight exponent (0: weight 1)"},
      {"sqrt_s", "0.0001", "sqrt schedule offset"},
      {"sigma_min", "0.002", "karras/edm: smallest sigma of the sampling grid"},
      {"sigma_max", "80", "karras/edm: largest sigma (prior scale)"},
      {"rho", "7", "karras/edm: grid warping"},
      {"sigma_data", "0.5", "karras/edm: data standard deviation (preconditioning and weight)"},
      {"regime", "", "edm: pixel (P_mean -1.2, P_std 1.2) | latent (-0.4, 1.0)"},
      {"P_mean", "", "edm: mean of ln(sigma) in training (with P_std, instead of regime)"},
      {"P_std", "", "edm: standard deviation of ln(sigma) in training"},
      {"shift", "1", "flow: time shift t' = shift t / (1 + (shift - 1) t)"},
      {"density", "logit_normal", "flow: training time density logit_normal | mode | cosmap | uniform"},
      {"logit_mean", "0", "flow logit_normal: mean"},
      {"logit_std", "1", "flow logit_normal: standard deviation"},
      {"mode_scale", "1.29", "flow mode density: scale in [-1, 2/(pi-2)]"},
  };
}

Process make_process(const Options& o) {
  const std::string preset = o.get_string("preset", "");
  std::string schedule, prediction;
  if (!preset.empty()) {
    if (preset == "edm") {
      schedule = "edm";
      prediction = "karras";
    } else if (preset == "karras") {
      schedule = "karras";
      prediction = "karras";
    } else if (preset == "cosine") {
      schedule = "cosine";
      prediction = "v";
    } else if (preset == "flow") {
      schedule = "flow";
      prediction = "flow";
    } else {
      DEW_USAGE_CHECK(false, "unknown diffusion preset '", preset, "' (known: edm, karras, cosine, flow)");
    }
  }
  schedule = o.get_string("schedule", schedule);
  DEW_USAGE_CHECK(!schedule.empty(),
                  "diffusion: set preset = edm | karras | cosine | flow, or schedule = linear | cosine | exp | "
                  "cosine_continuous | sqrt | karras | edm | flow");
  static const std::set<std::string> known = {"linear", "cosine", "exp", "cosine_continuous",
                                              "sqrt",   "karras", "edm", "flow"};
  DEW_USAGE_CHECK(known.count(schedule), "unknown diffusion schedule '", schedule, "' (known: ", join(known), ")");

  for (const auto& [key, scope] : key_scope())
    DEW_USAGE_CHECK(!o.has(key) || scope.count(schedule), "diffusion option '", key,
                    "' applies to schedule = ", join(scope), ", not ", schedule);

  const double sigma_data = o.get_double("sigma_data", 0.5);
  std::shared_ptr<const Schedule> train, sample;
  if (schedule == "linear" || schedule == "cosine" || schedule == "exp") {
    const int64_t T = o.get_int("timesteps", 1000);
    DEW_USAGE_CHECK(T >= 2, "diffusion option 'timesteps' must be at least 2, got ", T);
    std::vector<double> betas;
    if (schedule == "linear") {
      betas = linear_betas(T, o.get_double("beta_start", 1e-4), o.get_double("beta_end", 0.02));
    } else if (schedule == "cosine") {
      // The cosine preset keeps the last beta at 1 (zero terminal SNR, paired with v-prediction).
      betas =
          cosine_betas(T, o.get_double("cosine_s", 0.008), o.get_double("beta_end", preset == "cosine" ? 1.0 : 0.999));
    } else {
      betas = exp_betas(T, o.get_double("beta_end", 0.999));
    }
    train = std::make_shared<BetaTable>(schedule, std::move(betas), o.get_double("p2_k", 1.0),
                                        o.get_double("p2_gamma", 1.0));
  } else if (schedule == "cosine_continuous") {
    train = std::make_shared<CosineContinuous>();
  } else if (schedule == "sqrt") {
    const double s = o.get_double("sqrt_s", 1e-4);
    DEW_USAGE_CHECK(s > 0 && s < 1, "diffusion option 'sqrt_s' must lie in (0, 1), got ", s);
    train = std::make_shared<SqrtSchedule>(s);
  } else if (schedule == "karras" || schedule == "edm") {
    const double smin = o.get_double("sigma_min", 0.002), smax = o.get_double("sigma_max", 80.0),
                 rho = o.get_double("rho", 7.0);
    auto karras = std::make_shared<KarrasVE>(smin, smax, rho, sigma_data);
    if (schedule == "karras") {
      train = karras;
    } else {
      const bool has_regime = o.has("regime"), has_mean = o.has("P_mean"), has_std = o.has("P_std");
      DEW_USAGE_CHECK(!(has_regime && (has_mean || has_std)),
                      "edm: give either regime or both P_mean and P_std, not both (regime fixes P_mean and P_std)");
      double P_mean = 0, P_std = 1;
      if (has_regime) {
        const std::string regime = o.get_string("regime", "");
        if (regime == "pixel") {
          P_mean = -1.2;
          P_std = 1.2;
        } else if (regime == "latent") {
          P_mean = -0.4;
          P_std = 1.0;
        } else {
          DEW_USAGE_CHECK(false, "edm: unknown regime '", regime, "' (known: pixel, latent)");
        }
      } else {
        DEW_USAGE_CHECK(has_mean && has_std,
                        "edm: the training noise level needs regime = pixel (P_mean -1.2, P_std 1.2) or latent "
                        "(P_mean -0.4, P_std 1.0), or both P_mean and P_std",
                        has_mean || has_std ? std::string(" (only ") + (has_mean ? "P_mean" : "P_std") + " was given)"
                                            : std::string());
        P_mean = o.get_double("P_mean", 0.0);
        P_std = o.get_double("P_std", 1.0);
      }
      train = KarrasVE::edm(P_mean, P_std, smin, smax, rho, sigma_data);
      sample = karras;  // EDM samples on the Karras grid
    }
  } else {  // flow
    const std::string density = o.get_string("density", "logit_normal");
    const FlowSchedule::Density d = flow_density_from_name(density);
    DEW_USAGE_CHECK(d == FlowSchedule::Density::logit_normal || !(o.has("logit_mean") || o.has("logit_std")),
                    "flow: logit_mean and logit_std apply to density = logit_normal, not ", density);
    DEW_USAGE_CHECK(d == FlowSchedule::Density::mode || !o.has("mode_scale"),
                    "flow: mode_scale applies to density = mode, not ", density);
    train = std::make_shared<FlowSchedule>(o.get_double("shift", 1.0), d, o.get_double("logit_mean", 0.0),
                                           o.get_double("logit_std", 1.0), o.get_double("mode_scale", 1.29));
  }
  if (!sample) sample = train;

  if (prediction.empty()) {
    switch (train->family()) {
      case Family::vp:
        prediction = "epsilon";
        break;
      case Family::ve:
        prediction = "karras";
        break;
      case Family::flow:
        prediction = "flow";
        break;
    }
  }
  prediction = o.get_string("prediction", prediction);
  DEW_USAGE_CHECK(!o.has("sigma_data") || schedule == "karras" || schedule == "edm" || prediction == "karras",
                  "diffusion option 'sigma_data' applies to karras/edm schedules and prediction = karras");

  Process p;
  p.train = train;
  p.sample = sample;
  p.transform = make_transform(prediction, sigma_data);
  if (o.has("min_snr_gamma"))
    p.weighting = std::make_shared<MinSnrWeighting>(o.get_double("min_snr_gamma", 5.0));
  else
    p.weighting = std::make_shared<ScheduleWeighting>();
  p.check();
  return p;
}

}  // namespace dew::diffusion
