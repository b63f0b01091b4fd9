// dew/sampler.hpp — diffusion samplers (plugin kind "sampler"), denoisers and classifier-free guidance.
//
// A Denoiser maps (x_t [B, ...], t) to the clean estimate x0 and the noise estimate eps, with
// x_t = alpha(t) x0 + sigma(t) eps on the process's *sampling* schedule; t holds one time per row or
// one time for every row. make_denoiser() builds one from a raw network call, with classifier-free
// guidance on ONE doubled batch (conditional rows, then null-label rows).
//
// A Sampler (the plugin samplers/diffusion registers ddpm, ddim, euler, euler_ancestral, heun, rk4 and
// dpmpp_2m) integrates the reverse process on a descending time grid. Contract of every solver:
//  * integrate(denoise, x, times, process, seed) starts from x at times[0] and returns x at times.back();
//  * step i (from times[i] to times[i+1]) draws its noise as N(0, I) from Philox (seed, step_stream(i)),
//    element by element in x's row-major order, so a seed reproduces a trajectory on every backend and
//    row b's noise does not depend on how many rows follow it;
//  * it runs without gradients and allocates nothing on the host per element.
// Sampler::sample() builds the grid with process.sample->times(steps), integrates, and (final_denoise)
// replaces x by the denoiser's x0 at the last grid point unless sigma is 0 there already.
// "Sigma integrators" (euler_ancestral, heun, rk4) integrate dx/dsigma = eps + (dalpha/dsigma) x0, which
// is linear in sigma only for ve (alpha = 1) and flow (alpha = 1 - sigma): they refuse vp schedules.
//
// A plugin adds a solver:
//   class MySolver final : public dew::diffusion::Sampler { ... integrate(...) ... };
//   DEW_PLUGIN("mysolvers", "0.1.0") {
//     registrar.add<dew::diffusion::Sampler>({.name = "mine", .description = "...",
//         .factory = [](const dew::Options& o) { return std::make_shared<MySolver>(o); },
//         .options = {{"order", "2", "..."}}});
//   }
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dew/diffusion.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew::diffusion {

// t: one time per row of x_t, or a single time for every row.
using Denoiser = std::function<Denoised(const Tensor& x_t, const std::vector<double>& t)>;

// The network call: x_in = c_in * x_t [N, ...], model_time f32 [N], labels i32 [N] (undefined for an
// unconditional model) -> output [N, ...] (same shape as x_in) in the process's parameterisation.
using RawModel = std::function<Tensor(const Tensor& x_in, const Tensor& model_time, const Tensor& labels)>;

// Classifier-free guidance (Ho & Salimans 2022): out = u + scale (c - u) while
// start <= progress <= stop, progress = clip(1 - t/T, 0, 1) (0 = pure noise; the guidance interval of
// Kynkaanniemi et al. 2024), scale 1 elsewhere; then rescale (Lin et al. 2023): out = rescale * r +
// (1 - rescale) * out with r = out * std(c)/std(out) (unbiased std per row over the non-batch axes).
struct Guidance {
  double scale = 1.0;
  double start = 0.0, stop = 1.0;  // the interval, in progress
  double rescale = 0.0;
  double scale_at(double progress) const { return progress >= start && progress <= stop ? scale : 1.0; }
  void check() const;  // UsageError for scale < 0, 0 <= start <= stop <= 1 violated, rescale outside [0, 1]
};

// Combines the raw conditional and unconditional outputs [B, ...] (guidance maths only).
Tensor guidance_combine(const Tensor& cond, const Tensor& uncond, double scale, double rescale);

// A Denoiser over a raw network call. labels: i32 [B] (or undefined for an unconditional model). Where
// the guidance scale at t differs from 1 the network runs once on the doubled batch [x; x] with labels
// [labels; null_label], the raw outputs are combined, then converted to (x0, eps) once; elsewhere it runs
// on the B conditional rows only. Model times come from process.sample->model_time(t).
Denoiser make_denoiser(RawModel raw, const Process& process, Tensor labels = {}, Guidance guidance = {},
                       int32_t null_label = -1);

class Sampler {
 public:
  static constexpr const char* kind = "sampler";
  virtual ~Sampler() = default;
  virtual std::string name() const = 0;
  // Refuses (UsageError, naming the sampler and the schedule) a process it cannot integrate.
  virtual void check(const Process& process) const { (void)process; }
  // Integrates from x at times[0] along the descending grid `times` (>= 2 points); returns x at times.back().
  virtual Tensor integrate(const Denoiser& denoise, const Tensor& x, const std::vector<double>& times,
                           const Process& process, uint64_t seed) const = 0;
  // The full run on the process's sampling grid: checks, integrates `steps` steps from x_T, final denoise.
  Tensor sample(const Denoiser& denoise, const Tensor& x_T, const Process& process, int64_t steps, uint64_t seed,
                bool final_denoise = true) const;
};

// ---- helpers for solver authors ----
uint64_t step_stream(int64_t step);  // Philox stream of step i's noise
// N(0, I) shaped like `like`; row b (the leading axis) is drawn with seed + b, exactly what a batch of one
// with that seed draws, so a caller that gives the batch starting at sample i the seed base + i makes every
// sample's noise independent of how the samples were batched.
Tensor step_noise(const Tensor& like, uint64_t seed, int64_t step);
// Refuses a vp sampling schedule (sigma integrators).
void require_sigma_schedule(const Process& process, const std::string& sampler);
// dx/dsigma of the probability-flow ODE: eps (ve), eps - x0 (flow).
Tensor sigma_derivative(const Denoised& d, Family family);

}  // namespace dew::diffusion
