// tools/dew-bench/dit.cpp — `dew-bench train --config dit`: the DiT training step of
// ../shared/peers/torch_dit_train.py, on the `dit` backbone plugin.
//
// Same protocol as the peer: 32x32x3 synthetic images in [-1, 1] (a few batches made once and cycled),
// patch 4, d 256, 6 blocks, 4 heads, batch 16; epsilon prediction on the cosine schedule (Nichol &
// Dhariwal, 1000 steps, t ~ U{0..999}), x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, MSE; AdamW lr 1e-4.
// The model and the loss are written here directly (no objective plugin), so the figure is the
// backbone's own. FLOPs per step by the peer's formula 6 (N_tok B N + N_img B) + 12 L d N^2 B, which
// equals 3 x dit's flops_per_sample() x B. Prints one JSON line with the peer's field names.
// --precision bf16-mixed / f16-mixed runs the step under autocast (the trainer's [run] precision: half
// activations and matmul operands, f32 master weights), the counterpart of the peer's bf16 autocast
// (tools/bench/torch_dit_autocast.py); --matmul-precision medium rounds only the matmul operands.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include "bench.hpp"
#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/model.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

namespace dew_bench {

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
// CPU seconds used by the whole process (all threads): on a shared machine, cpu_ms_per_step_median /
// threads close to ms_per_step_median means the step was not starved; far below it means it was.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// abar(t) of the cosine schedule, t = 0..T-1, betas clipped at 0.999 (the peer's cosine_alpha_bar).
std::vector<double> cosine_alpha_bar(int T, double s = 0.008) {
  std::vector<double> f(static_cast<size_t>(T) + 1), abar(static_cast<size_t>(T));
  for (int i = 0; i <= T; ++i) {
    const double c = std::cos((double(i) / T + s) / (1 + s) * M_PI / 2);
    f[size_t(i)] = c * c;
  }
  double prod = 1.0;
  for (int i = 0; i < T; ++i) {
    const double beta = std::min(1.0 - f[size_t(i) + 1] / f[size_t(i)], 0.999);
    prod *= 1.0 - beta;
    abar[size_t(i)] = prod;
  }
  return abar;
}

}  // namespace

int run_dit_train(const LmOptions& lo, const BenchOptions& opt) {
  const int64_t B = 16, C = 3, S = 32, T = 1000;
  omp_set_num_threads(opt.threads);
  dew::BackendPtr be = make_backend(opt);
  be->set_threads(opt.threads);
  dew::set_default_backend(be);
  dew::Options mo(
      {{"image_size", "32"}, {"in_channels", "3"}, {"patch", "4"}, {"dim", "256"}, {"depth", "6"}, {"heads", "4"}},
      "model");
  auto model = dew::Registry::global().create<dew::Model>("dit", mo);
  mo.check_all_used();
  model->initialize(0);
  dew::NamedTensors params = model->named_parameters();
  dew::Config cfg = dew::Config::parse_ini("[optim]\nname = adamw\nlr = 1e-4\nweight_decay = 0\n");
  auto optimizer = dew::make_optimizer(cfg.section("optim"), params);
  const std::vector<double> abar = cosine_alpha_bar(int(T));

  std::vector<dew::Tensor> data;
  for (int i = 0; i < std::max(1, lo.batches); ++i)
    data.push_back(dew::Tensor::uniform({B, C, S, S}, -1.0f, 1.0f, 1337, uint64_t(i), be));

  // --precision: the forward and the loss under autocast, as the trainer runs them (f16-mixed: a fixed loss
  // scale of 2^16, divided out in the update, as in lm.cpp).
  const dew::Precision precision = dew::precision_from_name(lo.precision);
  const float loss_scale = precision == dew::Precision::f16_mixed ? 65536.0f : 1.0f;
  std::vector<double> times, cpu_times;
  double loss_first = 0, loss_last = 0, activation_mb = 0;
  const dew::RecomputeGuard recompute(dew::recompute_from_name(lo.recompute));
  BenchMemory mem;
  for (int i = 0; i < lo.warmup + lo.steps; ++i) {
    if (i == lo.warmup) {
      profile_reset(be);
      be->reset_memory_peak();
    }
    const auto t0 = clock_type::now();
    const double c0 = process_cpu_seconds();
    std::vector<float> t(static_cast<size_t>(B)), a(static_cast<size_t>(B)), s(static_cast<size_t>(B));
    for (int64_t j = 0; j < B; ++j) {
      const int64_t k = std::min<int64_t>(T - 1, int64_t(dew::philox::uniform(7, uint64_t(i), uint64_t(j)) * T));
      t[size_t(j)] = float(k);
      a[size_t(j)] = float(std::sqrt(abar[size_t(k)]));
      s[size_t(j)] = float(std::sqrt(1.0 - abar[size_t(k)]));
    }
    const dew::Tensor& x0 = data[size_t(i) % data.size()];
    dew::Tensor eps = dew::Tensor::normal({B, C, S, S}, 0.0f, 1.0f, 11, uint64_t(i), be);
    dew::Tensor xt = dew::add(dew::mul(x0, dew::Tensor::from_vector(a, {B, 1, 1, 1}, be)),
                              dew::mul(eps, dew::Tensor::from_vector(s, {B, 1, 1, 1}, be)));
    dew::Tensor loss;
    const dew::Tensor steps = dew::Tensor::from_vector(t, {B}, be);
    const double rss_before = i == 0 && lo.activation_memory ? resident_mb() : 0;
    {
      dew::AutocastGuard autocast(dew::compute_dtype(precision));
      loss = dew::mse(model->forward({{"x", xt}, {"t", steps}}), eps);
    }
    if (i == 0 && lo.activation_memory) activation_mb = resident_mb() - rss_before;
    (loss_scale == 1.0f ? loss : dew::scale(loss, loss_scale)).backward();
    if (i >= lo.warmup && !mem.measured) {
      const dew::TrainingStateMemory st = dew::training_state_memory(params, optimizer.get());
      mem.params = st.params, mem.grads = st.grads, mem.optim = st.optim, mem.measured = true;
    }
    optimizer->update(1e-4f, 1.0f / loss_scale, i + 1);
    for (auto& [k, p] : params) p.zero_grad();
    const double lv = loss.item();
    be->synchronize();
    const double dt = seconds_since(t0), dc = process_cpu_seconds() - c0;
    if (i == 0) loss_first = lv;
    loss_last = lv;
    if (i >= lo.warmup) {
      times.push_back(dt);
      cpu_times.push_back(dc);
    }
    if (lo.verbose)
      std::fprintf(stderr, "# step %3d %s %9.1f ms loss %.4f\n", i, i < lo.warmup ? "warm" : "time", dt * 1e3, lv);
  }
  DEW_USAGE_CHECK(!times.empty(), "dew-bench train: --steps must be positive");
  double total = 0;
  for (double x : times) total += x;
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double mean = total / double(times.size());
  std::sort(cpu_times.begin(), cpu_times.end());
  const double flops = 3.0 * model->flops_per_sample() * double(B);
  profile_report(be, int(times.size()), mean * 1e3);
  const dew::MemoryStats ms = be->memory_stats();
  mem.tracked = ms.tracked;
  mem.peak = ms.peak;
  profile_products_alone(be, int(times.size()), opt);  // (after the memory figures: it allocates)
  // MFU against this machine's measured peak at the step's products (B * tokens rows): oneDNN direct on a CPU.
  std::vector<std::pair<int64_t, int64_t>> weights;
  for (const auto& [name, p] : params)
    if (p.ndim() == 2) weights.emplace_back(p.shape()[0], p.shape()[1]);
  const int64_t tokens = (S / 4) * (S / 4);
  const MachinePeak mpeak =
      machine_peak(be, weights, B * tokens, opt.matmul_precision == "medium" || precision != dew::Precision::f32,
                   dew::compute_dtype(precision), opt);
  std::printf(
      "{\"bench\":\"dit_train\",\"config\":\"dit-s4-32\",\"backend\":\"%s\",\"matmul_precision\":\"%s\","
      "\"threads\":%d,\"images_per_sec\":%.2f,"
      "\"ms_per_step\":%.2f,\"ms_per_step_median\":%.2f,\"ms_per_step_min\":%.2f,\"cpu_ms_per_step_median\":%.2f,"
      "\"gflops\":%.1f,"
      "%s,\"cpu\":\"%s\",\"params\":%lld,\"flops_per_step\":%.0f,"
      "\"flop_formula\":\"6*(N_tok*B*N + N_img*B) + 12*L*d*N^2*B\",\"batch\":%lld,\"warmup\":%d,\"steps\":%d,"
      "\"recompute\":\"%s\",\"precision\":\"%s\",\"loss_first\":%.9g,\"loss_last\":%.9g%s%s}\n",
      opt.backend.c_str(), opt.matmul_precision.c_str(), opt.threads, double(B) / mean, mean * 1e3,
      sorted[sorted.size() / 2] * 1e3, sorted.front() * 1e3, cpu_times[cpu_times.size() / 2] * 1e3, flops / mean * 1e-9,
      machine_peak_json(mpeak, flops / mean * 1e-9).c_str() + 1, cpu_model().c_str(),
      (long long)model->num_parameters(), flops, (long long)B, lo.warmup, lo.steps, lo.recompute.c_str(),
      lo.precision.c_str(), loss_first, loss_last, mem.json().c_str(),
      lo.activation_memory ? (",\"activation_rss_mb\":" + std::to_string(activation_mb)).c_str() : "");
  std::fflush(stdout);
  return 0;
}

}  // namespace dew_bench
