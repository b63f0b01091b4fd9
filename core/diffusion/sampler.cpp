// core/diffusion/sampler.cpp — the SDK side of samplers: Sampler::sample (grid, integration, final denoise),
// the per-step Philox noise (row b of a batch keyed by seed + b), classifier-free guidance and make_denoiser.
// Invariants: everything runs under NoGradGuard; guidance runs the network ONCE per call (on the doubled
// batch where the scale differs from 1, on the conditional rows elsewhere) and converts to (x0, eps) once.
#include "dew/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"

namespace dew::diffusion {

uint64_t step_stream(int64_t step) { return philox::stream_of("dew.diffusion.step") + uint64_t(step); }

Tensor step_noise(const Tensor& like, uint64_t seed, int64_t step) {
  const uint64_t stream = step_stream(step);
  if (like.ndim() == 0 || like.shape()[0] <= 1)
    return Tensor::normal(like.shape(), 0.0f, 1.0f, seed, stream, like.backend_ptr(), like.dtype());
  // Row b draws what a batch of one seeded seed + b would: a sample's noise never depends on its batch.
  Tensor z = Tensor::empty(like.shape(), like.dtype(), like.backend_ptr());
  RandomParams p;
  p.dist = Distribution::normal;
  p.stream = stream;
  p.a = 0.0f;
  p.b = 1.0f;
  for (int64_t b = 0; b < like.shape()[0]; ++b) {
    Tensor row = z.slice0(b, b + 1);
    p.seed = seed + uint64_t(b);
    like.backend().random(row, p);
  }
  return z;
}

void require_sigma_schedule(const Process& process, const std::string& sampler) {
  DEW_USAGE_CHECK(process.sample && process.sample->family() != Family::vp, "sampler '", sampler,
                  "' integrates in sigma and needs a ve (karras, edm) or flow sampling schedule; ",
                  process.sample ? process.sample->describe() : std::string("none"),
                  " is vp: use ddpm, ddim, euler or dpmpp_2m");
}

Tensor sigma_derivative(const Denoised& d, Family family) {
  DEW_CHECK(family != Family::vp, "sigma_derivative: a vp schedule is not linear in sigma");
  return family == Family::ve ? d.eps : sub(d.eps, d.x0);
}

Tensor Sampler::sample(const Denoiser& denoise, const Tensor& x_T, const Process& process, int64_t steps, uint64_t seed,
                       bool final_denoise) const {
  DEW_CHECK(denoise, "sampler '", name(), "': no denoiser");
  DEW_CHECK(process.sample, "sampler '", name(), "': the process has no sampling schedule");
  NoGradGuard no_grad;
  check(process);
  const std::vector<double> times = process.sample->times(steps);
  Tensor x = integrate(denoise, x_T, times, process, seed);
  if (final_denoise && process.sample->rates(times.back()).sigma > 0.0) x = denoise(x, {times.back()}).x0;
  return x;
}

// ---------------------------------------------------------------- guidance

void Guidance::check() const {
  DEW_USAGE_CHECK(std::isfinite(scale) && scale >= 0, "guidance scale must be a finite number >= 0, got ", scale);
  DEW_USAGE_CHECK(start >= 0 && start <= stop && stop <= 1,
                  "the guidance interval needs 0 <= start <= stop <= 1 (in progress, 0 = pure noise), got [", start,
                  ", ", stop, "]");
  DEW_USAGE_CHECK(rescale >= 0 && rescale <= 1, "guidance rescale must lie in [0, 1], got ", rescale);
}

namespace {

// Unbiased standard deviation of each row over the non-batch axes, shaped [B, 1, ..., 1].
Tensor row_std(const Tensor& x) {
  const int64_t B = x.shape()[0], D = x.numel() / std::max<int64_t>(B, 1);
  DEW_CHECK(D >= 2, "guidance rescale needs at least 2 values per row, got ", D);
  Tensor flat = reshape(x, {B, D});
  Tensor centred = sub(flat, mean(flat, 1, true));
  Tensor var = sum(square(centred), 1, true);
  Shape s(size_t(x.ndim()), 1);
  s[0] = B;
  return reshape(sqrt(lincomb({1.0 / double(D - 1)}, var, {0.0}, Tensor())), s);
}

Tensor combine_rows(const Tensor& cond, const Tensor& uncond, const std::vector<double>& scale, double rescale) {
  std::vector<double> one_minus(scale.size());
  for (size_t i = 0; i < scale.size(); ++i) one_minus[i] = 1.0 - scale[i];
  Tensor out = lincomb(scale, cond, one_minus, uncond);  // u + s (c - u)
  if (rescale > 0.0) {
    Tensor ratio = div(row_std(cond), row_std(out));
    Tensor factor = lincomb({rescale}, ratio, {0.0}, Tensor());
    if (rescale < 1.0) factor = add(factor, row_scalars({1.0 - rescale}, factor));
    out = mul(out, factor);
  }
  return out;
}

}  // namespace

Tensor guidance_combine(const Tensor& cond, const Tensor& uncond, double scale, double rescale) {
  DEW_CHECK(cond.shape() == uncond.shape(), "guidance: conditional ", shape_str(cond.shape()), " and unconditional ",
            shape_str(uncond.shape()), " outputs differ");
  return combine_rows(cond, uncond, {scale}, rescale);
}

Denoiser make_denoiser(RawModel raw, const Process& process, Tensor labels, Guidance guidance, int32_t null_label) {
  DEW_CHECK(raw, "make_denoiser: no model");
  process.check();
  guidance.check();
  if (guidance.scale != 1.0) {
    DEW_USAGE_CHECK(labels.defined(), "classifier-free guidance (scale ", guidance.scale,
                    ") needs class labels; an unconditional model takes guidance scale 1");
    DEW_USAGE_CHECK(null_label >= 0, "classifier-free guidance needs the null (unconditional) label id, got ",
                    null_label);
  }
  if (labels.defined()) {
    DEW_CHECK(labels.ndim() == 1 && labels.dtype() == DType::i32, "make_denoiser: labels must be i32 [B], got ",
              shape_str(labels.shape()));
  }
  return [raw = std::move(raw), process, labels, guidance, null_label](const Tensor& x,
                                                                       const std::vector<double>& t) -> Denoised {
    NoGradGuard no_grad;
    const int64_t B = x.shape()[0];
    DEW_CHECK(t.size() == 1 || int64_t(t.size()) == B, "denoiser: ", t.size(), " times for ", B, " rows");
    if (labels.defined())
      DEW_CHECK(labels.shape()[0] == B, "denoiser: ", labels.shape()[0], " labels for ", B, " rows");
    const RowRates r = process.sample_rates(t);
    const double T = process.sample->T();
    std::vector<double> scales(t.size());
    bool guided = false;
    for (size_t i = 0; i < t.size(); ++i) {
      scales[i] = guidance.scale_at(std::clamp(1.0 - t[i] / T, 0.0, 1.0));
      guided = guided || scales[i] != 1.0;
    }
    std::vector<float> mt(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) mt[size_t(b)] = float(process.sample->model_time(t[t.size() == 1 ? 0 : size_t(b)]));
    Tensor x_in = process.transform->scale_input(x, r);
    Tensor out;
    if (!guided) {
      out = raw(x_in, Tensor::from_vector(mt, {B}, x.backend_ptr()), labels);
    } else {
      std::vector<float> mt2 = mt;
      mt2.insert(mt2.end(), mt.begin(), mt.end());
      Tensor nulls = Tensor::full({B}, double(null_label), DType::i32, labels.backend_ptr());
      Tensor out2 =
          raw(concat({x_in, x_in}, 0), Tensor::from_vector(mt2, {2 * B}, x.backend_ptr()), concat({labels, nulls}, 0));
      DEW_CHECK(out2.ndim() >= 1 && out2.shape()[0] == 2 * B, "denoiser: the model returned ", shape_str(out2.shape()),
                " for a doubled batch of ", 2 * B, " rows");
      out = combine_rows(out2.slice0(0, B), out2.slice0(B, 2 * B), scales, guidance.rescale);
    }
    return process.transform->to_x0_eps(x, out, r);
  };
}

}  // namespace dew::diffusion
