// tools/dew-bench/lm.cpp — `dew-bench train` and `dew-bench generate`: the language-model workloads of
// the benchmark contract, on the protocol of the PyTorch peers (../shared/peers/torch_gpt_train.py and
// torch_generate.py) so the figures read side by side.
//
// train: the objective and model come from the config ([objective] lm + [model] causal_transformer) via
// the registry, the optimizer from [optim] via dew::make_optimizer (AdamW). Data: like the peer,
// `--batches` (4) synthetic batches of uniform random token ids [B, T + 1], made once on the device and
// cycled. Each step is what the trainer does per update: objective->step (forward + cross-entropy +
// accuracy), loss.item(), backward, optimizer update, zero grads, synchronize. The peer runs without
// gradient clipping (--grad-clip 0), so the global grad norm is left out (--grad-norm adds it, as the
// trainer computes it when clip_grad_norm > 0). `--warmup` (3) untimed steps, then `--steps` (10) timed
// ones; ms_per_step and tokens_per_sec are over the mean step (as the peer's), ms_per_step_median too.
// FLOPs per step (the peer's formula): 6 * N_mm * B * T + 12 * L * d * T^2 * B, N_mm = every matmul weight
// with the tied head counted once (a mixture's experts weighed by moe_top_k / moe_experts). mfu = achieved /
// dew::measure_matmul_peak_gflops in the step's operand dtype (the trainer's MFU: 512^3 on a CPU, 8192^3 on a device,
// through dew::matmul at the same thread count); mfu_onednn = achieved / the best rate oneDNN reaches when called
// directly on the step's own product shapes at the same thread count and precision; on a device backend mfu_device
// instead, the best of dew::matmul on it at those shapes and 8192^3 (measured on this machine, every run: no chip's
// peak is written in).
// --profile (train and dew-bench train --config dit): the kernels of the timed steps (profile_report), then each
// product shape run alone, operands hot, beside its time in the step (profile_products_alone, main.cpp).
//
// generate: greedy decoding (--temperature T > 0: every token drawn by dew::sample_token, seed 1) with the KV cache
// (dew::decoder_start over CausalDecoder::forward_cached_last, as
// dew-run sample decodes: with --replay on, the default, one-token steps after the first three are a recorded
// step program's replays, core/generate/step_program.hpp; off: every step eager; replayed_steps / eager_steps in
// the JSON line count them, and why a program was not used goes to stderr), the peer's protocol:
// a random prompt of --prompt-len (16) tokens prefilled in one call (--prefill-chunk C: in calls of C tokens, as
// dew-run sample and serve feed long prompts; its last logits give token 1), then
// --tokens - 1 single-token decode calls (default 256 new tokens, cache capacity prompt + tokens), argmax
// on the host. --warmup (1) untimed generation, then the median of --repeats (5). --weights bf16 keeps the
// matmul weights and the K/V cache in bf16, --weights int8 the weights in int8 (an f32 scale per block of 32)
// and the cache in bf16 (dew::store_decode_weights_as; kv_dtype in the JSON line).
// ms_per_token = decode time / (tokens - 1). --profile: the kernels of the timed decode loops only (not
// the prefills, not the warm-up), per token (profile_report: ms and calls per token, share of ms_per_token).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

#ifndef DEW_BENCH_SOURCE_DIR
#define DEW_BENCH_SOURCE_DIR "."
#endif

namespace dew_bench {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
// CPU seconds of the whole process (all threads): on a shared machine, decode CPU time per token is the
// figure that starvation does not inflate (the wall time does).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// A config name (char-small, gpt-mini) or a path to an .ini.
std::string resolve_config(const std::string& name) {
  if (fs::exists(name) && fs::is_regular_file(name)) return name;
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path() / ".." / ".." / "configs");
  roots.push_back(fs::path(DEW_BENCH_SOURCE_DIR) / "configs");
  roots.push_back("configs");
  for (const auto& r : roots)
    if (fs::exists(r / (name + ".ini"))) return (r / (name + ".ini")).lexically_normal().string();
  DEW_USAGE_CHECK(false, "no config '", name,
                  "' (a name in configs/ such as char-small or gpt-mini, or a "
                  "path to an .ini)");
  return {};
}

std::string config_label(const std::string& name) {
  if (fs::exists(name) && fs::is_regular_file(name)) return fs::path(name).stem().string();
  return name;
}

struct Built {
  dew::Config config;
  dew::BackendPtr backend;
  std::shared_ptr<dew::Objective> objective;
  int64_t batch = 0, seq_len = 0, vocab = 0, dim = 0, layers = 0;
  double expert_share = 1.0;  // a mixture of experts ([model] moe_experts): moe_top_k / moe_experts of them run
};

Built build(const LmOptions& lo, const BenchOptions& opt) {
  Built b;
  b.config = dew::Config::load_ini(resolve_config(lo.config));
  omp_set_num_threads(opt.threads);
  b.backend = make_backend(opt);
  b.backend->set_threads(opt.threads);
  dew::set_default_backend(b.backend);
  dew::Options& data = b.config.section("data");
  const auto& dv = data.values();
  b.seq_len = dv.count("seq_len") ? std::atoll(dv.at("seq_len").c_str()) : 0;
  b.batch = dv.count("batch_size") ? std::atoll(dv.at("batch_size").c_str()) : 0;
  DEW_USAGE_CHECK(b.seq_len > 0 && b.batch > 0, "dew-bench: the config needs [data] seq_len and batch_size");
  dew::Options& os = b.config.section("objective");
  b.objective = dew::Registry::global().create<dew::Objective>(os.get_string("plugin", "lm"), os);
  dew::ObjectiveContext ctx;
  ctx.config = &b.config;
  ctx.backend = b.backend;
  ctx.seed = uint64_t(b.config.section("run").get_int("seed", 0));
  ctx.train_source = nullptr;  // synthetic batches: the shapes come from [data]
  b.objective->build(ctx);
  const auto& mv = b.config.section("model").values();
  b.vocab = std::atoll(mv.at("vocab_size").c_str());
  b.dim = mv.count("dim") ? std::atoll(mv.at("dim").c_str()) : 512;
  b.layers = mv.count("n_layers") ? std::atoll(mv.at("n_layers").c_str()) : 8;
  const int64_t experts = mv.count("moe_experts") ? std::atoll(mv.at("moe_experts").c_str()) : 0;
  if (experts > 0)
    b.expert_share = double(mv.count("moe_top_k") ? std::atoll(mv.at("moe_top_k").c_str()) : 2) / double(experts);
  return b;
}

// N_mm of the peer: every matrix used in a matmul (2-D parameters), the token embedding counted once as
// the head when tied (it is the head), never as a lookup; a mixture's experts by the share of them a token runs
// (expert_share), as the model's own FLOP count weighs them.
double matmul_params(const dew::NamedTensors& params, int64_t vocab, int64_t dim, double expert_share) {
  double n = 0;
  bool untied = false;
  for (const auto& [name, p] : params) {
    if (name == "lm_head.weight") untied = true;
    if (p.ndim() == 2 && name != "model.embed_tokens.weight")
      n += double(p.numel()) * (name.find(".mlp.experts.") != std::string::npos ? expert_share : 1.0);
  }
  if (!untied) n += double(vocab * dim);
  return n;
}

// The [out, in] shapes behind N_mm: every 2-D parameter but the embedding, and the head once when tied.
std::vector<std::pair<int64_t, int64_t>> matmul_weights(const dew::NamedTensors& params, int64_t vocab, int64_t dim) {
  std::vector<std::pair<int64_t, int64_t>> w;
  bool untied = false;
  for (const auto& [name, p] : params) {
    if (name == "lm_head.weight") untied = true;
    if (p.ndim() == 2 && name != "model.embed_tokens.weight") w.emplace_back(p.shape()[0], p.shape()[1]);
  }
  if (!untied) w.emplace_back(vocab, dim);
  return w;
}

}  // namespace

double resident_mb() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? double(resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0) : 0;
}

std::string BenchMemory::json() const {
  if (!tracked) return "";
  const int64_t state = params + grads + optim;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                ",\"mem_params_mb\":%.2f,\"mem_grads_mb\":%.2f,\"mem_optim_mb\":%.2f,\"mem_peak_mb\":%.2f,"
                "\"mem_activations_mb\":%.2f",
                dew::mebibytes(params), dew::mebibytes(grads), dew::mebibytes(optim), dew::mebibytes(peak),
                dew::mebibytes(peak - state));
  return buf;
}

TrainFigures measure_train(const LmOptions& lo, const BenchOptions& opt) {
  Built b = build(lo, opt);
  dew::NamedTensors params = b.objective->parameters();
  std::shared_ptr<dew::Optimizer> optimizer = dew::make_optimizer(b.config.section("optim"), params);
  const double lr = b.config.section("optim").get_double("lr", 1e-3);

  // Synthetic data like the peer's: uniform random ids [B, T + 1], a few batches made once and cycled.
  std::mt19937 rng(1337);
  std::uniform_int_distribution<int32_t> id(0, int32_t(b.vocab - 1));
  std::vector<dew::Batch> batches;
  for (int i = 0; i < std::max(1, lo.batches); ++i) {
    std::vector<int32_t> ids(size_t(b.batch * (b.seq_len + 1)));
    for (auto& x : ids) x = id(rng);
    batches.push_back({{"text", dew::Tensor::from_ints(ids, {b.batch, b.seq_len + 1}, b.backend)}});
  }

  // --precision: the step's forward and loss under autocast, as the trainer runs them; f16-mixed scales
  // the loss by a fixed 2^16 (the trainer's dynamic scale starts there) and divides it out in the update.
  const dew::Precision precision = dew::precision_from_name(lo.precision);
  const float loss_scale = precision == dew::Precision::f16_mixed ? 65536.0f : 1.0f;
  std::vector<double> times;
  double loss_first = 0, loss_last = 0, activation_mb = 0;
  const dew::RecomputeGuard recompute(dew::recompute_from_name(lo.recompute));
  BenchMemory mem;
  for (int i = 0; i < lo.warmup + lo.steps; ++i) {
    if (i == lo.warmup) {
      profile_reset(b.backend);
      b.backend->reset_memory_peak();
    }
    const auto t0 = clock_type::now();
    const double rss_before = i == 0 && lo.activation_memory ? resident_mb() : 0;
    dew::StepResult r;
    {
      dew::AutocastGuard autocast(dew::compute_dtype(precision));
      r = b.objective->step(batches[size_t(i) % batches.size()], dew::StepInfo{i, 0, 0});
    }
    if (i == 0 && lo.activation_memory) activation_mb = resident_mb() - rss_before;
    const double lv = r.loss.item();
    (loss_scale == 1.0f ? r.loss : dew::scale(r.loss, loss_scale)).backward();
    if (i >= lo.warmup && !mem.measured) {
      const dew::TrainingStateMemory s = dew::training_state_memory(params, optimizer.get());
      mem.params = s.params, mem.grads = s.grads, mem.optim = s.optim, mem.measured = true;
    }
    if (lo.grad_norm) (void)dew::global_grad_norm(params);
    optimizer->update(float(lr), 1.0f / loss_scale, i + 1);
    for (auto& [k, p] : params) p.zero_grad();
    b.backend->synchronize();
    const double dt = seconds_since(t0);
    if (i == 0) loss_first = lv;
    loss_last = lv;
    if (i >= lo.warmup) times.push_back(dt);
    if (lo.verbose)
      std::fprintf(stderr, "# step %3d %s %9.1f ms loss %.9g\n", i, i < lo.warmup ? "warm" : "time", dt * 1e3, lv);
  }
  DEW_USAGE_CHECK(!times.empty(), "dew-bench train: --steps must be positive");

  TrainFigures f;
  f.label = config_label(lo.config);
  for (const auto& [k, p] : params) f.n_params += p.numel();
  f.n_mm = matmul_params(params, b.vocab, b.dim, b.expert_share);
  f.matmul_weights = matmul_weights(params, b.vocab, b.dim);
  const double tokens = double(b.batch * b.seq_len);
  f.attn_flops = 12.0 * double(b.layers) * double(b.dim) * double(b.seq_len) * double(b.seq_len) * double(b.batch);
  f.flops = 6.0 * f.n_mm * tokens + f.attn_flops;
  double total = 0;
  for (double t : times) total += t;
  f.mean_s = total / double(times.size());
  f.median_s = median(times);
  f.batch = b.batch;
  f.seq_len = b.seq_len;
  f.vocab = b.vocab;
  f.dim = b.dim;
  f.layers = b.layers;
  f.loss_first = loss_first;
  f.loss_last = loss_last;
  f.activation_rss_mb = activation_mb;
  profile_report(b.backend, int(times.size()), f.mean_s * 1e3);  // before the peak measurement's matmuls
  const dew::MemoryStats ms = b.backend->memory_stats();         // before the matmul-rate measurement allocates
  mem.tracked = ms.tracked;
  mem.peak = ms.peak;
  f.mem = mem;
  profile_products_alone(b.backend, int(times.size()), opt);  // (after the memory figures: it allocates)
  return f;
}

int run_train(const LmOptions& lo, const BenchOptions& opt) {
  const TrainFigures f = measure_train(lo, opt);
  const double mean = f.mean_s, median = f.median_s, flops = f.flops, n_mm = f.n_mm;
  const double tokens = double(f.batch * f.seq_len);
  const dew::BackendPtr be = dew::default_backend();
  const dew::DType operands = dew::compute_dtype(dew::precision_from_name(lo.precision));
  const double peak = dew::measure_matmul_peak_gflops(be, operands);  // the trainer's MFU denominator
  const std::string peak_label =
      "measured dew matmul " + std::to_string(dew::matmul_peak_size(*be)) + "^3" +
      (operands == dew::DType::f32 ? "" : std::string(", ") + dew::dtype_name(operands) + " operands");
  const double gflops = flops / mean * 1e-9;
  // The machine's matmul peak as measured now, at the step's own product shapes (oneDNN direct on a CPU).
  const MachinePeak mpeak = machine_peak(be, f.matmul_weights, f.batch * f.seq_len,
                                         opt.matmul_precision == "medium" || lo.precision != "f32", operands, opt);
  std::printf(
      "{\"bench\":\"gpt_train\",\"config\":\"%s\",\"backend\":\"%s\",\"matmul_precision\":\"%s\",\"isa\":\"%s\","
      "\"threads\":%d,"
      "\"tokens_per_sec\":%.1f,"
      "\"ms_per_step\":%.2f,\"ms_per_step_median\":%.2f,\"mfu\":%.4f,\"gflops\":%.1f,\"peak_gflops\":%.1f,"
      "\"peak\":\"%s\"%s,\"cpu\":\"%s\",\"params\":%lld,"
      "\"params_matmul\":%.0f,\"flops_per_step\":%.0f,\"flop_formula\":\"6*N_mm*B*T + 12*L*d*T^2*B\","
      "\"batch\":%lld,\"seq_len\":%lld,\"warmup\":%d,\"steps\":%d,\"grad_norm\":%s,\"recompute\":\"%s\","
      "\"loss_first\":%.9g,\"loss_last\":%.9g,\"precision\":\"%s\"%s%s}\n",
      f.label.c_str(), opt.backend.c_str(), opt.matmul_precision.c_str(), opt.isa.c_str(), opt.threads, tokens / mean,
      mean * 1e3, median * 1e3, gflops / peak, gflops, peak, peak_label.c_str(),
      machine_peak_json(mpeak, gflops).c_str(), cpu_model().c_str(), (long long)f.n_params, n_mm, flops,
      (long long)f.batch, (long long)f.seq_len, lo.warmup, lo.steps, lo.grad_norm ? "true" : "false",
      lo.recompute.c_str(), f.loss_first, f.loss_last, lo.precision.c_str(), f.mem.json().c_str(),
      lo.activation_memory ? (",\"activation_rss_mb\":" + std::to_string(f.activation_rss_mb)).c_str() : "");
  std::fflush(stdout);
  return 0;
}

DecodeFigures measure_generate(const LmOptions& lo, const BenchOptions& opt) {
  DEW_USAGE_CHECK(lo.replay == "on" || lo.replay == "off", "dew-bench generate: --replay is on or off, not '",
                  lo.replay, "'");
  Built b = build(lo, opt);
  dew::Model* model = b.objective->main_model();
  auto* decoder = dynamic_cast<dew::CausalDecoder*>(model);
  DEW_USAGE_CHECK(decoder != nullptr, "dew-bench generate: the config's model has no KV-cached decode path");
  model->set_training(false);
  dew::NoGradGuard no_grad;
  const dew::NamedTensors params = b.objective->parameters();
  dew::store_decode_weights_as(decoder, params, dew::weights_dtype_from_name(lo.weights, "--weights"));  // + K/V
  if (const auto cache = dew::kv_cache_dtype_from_name(lo.kv_cache, "dew-bench generate: --kv-cache"))
    decoder->set_cache_dtype(*cache);
  dew::store_matmul_weights_in_panels(params);  // the backend's decode layout (none on ref / cuda)
  const int64_t P = lo.prompt_len, N = lo.tokens, V = decoder->vocab_size();
  DEW_USAGE_CHECK(P > 0 && N > 1, "dew-bench generate: --prompt-len must be >= 1 and --tokens >= 2");
  DEW_USAGE_CHECK(lo.prefill_chunk >= 0, "dew-bench generate: --prefill-chunk must be >= 0, got ", lo.prefill_chunk);
  std::mt19937 rng(1337);
  std::uniform_int_distribution<int32_t> id(0, int32_t(V - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(P));
  for (auto& x : prompt) x = id(rng);

  DEW_USAGE_CHECK(std::isfinite(lo.temperature) && lo.temperature >= 0,
                  "dew-bench generate: --temperature must be >= 0, got ", lo.temperature);
  dew::SamplingParams sampling;
  sampling.temperature = lo.temperature;
  sampling.seed = 1;
  // The next token from the last row of the logits: the argmax, or a seeded draw through the sampling chain.
  auto next_token = [&](const dew::Tensor& logits, const std::vector<int32_t>& history) {
    const int64_t t = logits.shape()[1];
    const std::vector<float> row = dew::reshape(logits, {t, V}).slice0(t - 1, t).to_floats();
    if (lo.temperature == 0) return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    return dew::sample_token(row.data(), V, sampling, history, uint64_t(history.size()));
  };
  dew::DecodeReplayReport replay_report;
  const dew::StartFn start = dew::decoder_start(*decoder, lo.replay == "on", &replay_report);
  std::vector<double> pre, dec, dec_cpu;
  std::vector<int32_t> reference;
  for (int r = 0; r < lo.gen_warmup + lo.repeats; ++r) {
    const dew::DecodeFn step = start(P + N);
    std::vector<int32_t> out = prompt;
    const auto t0 = clock_type::now();
    dew::Tensor prefilled;  // the prompt in chunks of --prefill-chunk tokens (generate()'s cuts), or in one call
    const int64_t chunk = lo.prefill_chunk > 0 ? lo.prefill_chunk : P;
    for (int64_t at = 0; at < P; at += chunk) {
      const std::vector<int32_t> part(prompt.begin() + at, prompt.begin() + std::min(P, at + chunk));
      prefilled = step(dew::Tensor::from_ints(part, {1, int64_t(part.size())}, b.backend));
    }
    out.push_back(next_token(prefilled, out));
    if (r == lo.gen_warmup) profile_reset(b.backend);  // the first timed decode loop: start from zero
    if (r > lo.gen_warmup) profile_resume(b.backend);
    const auto t1 = clock_type::now();
    const double c1 = process_cpu_seconds();
    for (int64_t i = 1; i < N; ++i)
      out.push_back(next_token(step(dew::Tensor::from_ints({out.back()}, {1, 1}, b.backend)), out));
    b.backend->synchronize();
    profile_pause(b.backend);
    const double tp = std::chrono::duration<double>(t1 - t0).count(), td = seconds_since(t1);
    const double cd = process_cpu_seconds() - c1;
    if (reference.empty()) reference = out;
    DEW_CHECK(out == reference, "dew-bench generate: the generation is not deterministic");
    if (lo.verbose)
      std::fprintf(stderr, "# gen %d %s prefill %.2f ms decode %.1f ms (%.3f ms/token)\n", r,
                   r < lo.gen_warmup ? "warm" : "time", tp * 1e3, td * 1e3, td * 1e3 / double(N - 1));
    if (r >= lo.gen_warmup) {
      pre.push_back(tp);
      dec.push_back(td);
      dec_cpu.push_back(cd);
    }
  }
  DEW_USAGE_CHECK(!dec.empty(), "dew-bench generate: --repeats must be positive");
  if (lo.replay == "on" && !replay_report.eager_reason.empty())
    std::fprintf(stderr, "# decode program not used: %s\n", replay_report.eager_reason.c_str());
  const double dmed = median(dec), pmed = median(pre);
  double dsum = 0;
  for (double t : dec) dsum += t;
  profile_report(b.backend, int(dec.size()) * int(N - 1), dsum / double(dec.size()) / double(N - 1) * 1e3);
  const double n_mm = matmul_params(params, b.vocab, b.dim, b.expert_share);
  double dec_flops = 0;
  for (int64_t pos = P; pos < P + N - 1; ++pos)
    dec_flops += 2 * n_mm + 4.0 * double(b.layers * b.dim) * double(pos + 1);
  DecodeFigures f;
  f.label = config_label(lo.config);
  f.ms_per_token = dmed / double(N - 1) * 1e3;
  f.ms_min = *std::min_element(dec.begin(), dec.end()) / double(N - 1) * 1e3;
  f.ms_max = *std::max_element(dec.begin(), dec.end()) / double(N - 1) * 1e3;
  f.prefill_ms = pmed * 1e3;
  f.cpu_ms_per_token = median(dec_cpu) / double(N - 1) * 1e3;
  f.replayed_steps = replay_report.replayed_steps;
  f.eager_steps = replay_report.eager_steps;
  f.flops_per_token = dec_flops / double(N - 1);
  f.n_mm = n_mm;
  f.prompt_len = P;
  f.new_tokens = N;
  f.layers = b.layers;
  const auto& mv = b.config.section("model").values();
  const int64_t heads = mv.count("n_heads") ? std::atoll(mv.at("n_heads").c_str()) : 8;
  const int64_t kv_heads = mv.count("n_kv_heads") ? std::atoll(mv.at("n_kv_heads").c_str()) : heads;
  const int64_t head_dim = mv.count("head_dim") ? std::atoll(mv.at("head_dim").c_str()) : b.dim / heads;
  f.kv_dim = kv_heads * head_dim;
  f.weights = lo.weights;
  f.kv_dtype = dew::dtype_name(decoder->cache_dtype());
  bool untied = false;
  for (const auto& [name, p] : params) {
    if (name == "lm_head.weight") untied = true;
    if (p.ndim() == 2 && name != "model.embed_tokens.weight")
      f.weight_bytes += double(p.nbytes()) + (p.quantized() ? double(p.scales().nbytes()) : 0.0);  // int8: + scales
  }
  if (!untied)  // the tied head: the embedding as stored
    for (const auto& [name, p] : params)
      if (name == "model.embed_tokens.weight") f.weight_bytes += double(p.numel()) * double(dew::dtype_size(p.dtype()));
  return f;
}

int run_generate(const LmOptions& lo, const BenchOptions& opt) {
  const DecodeFigures f = measure_generate(lo, opt);
  std::printf(
      "{\"bench\":\"generate\",\"config\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"ms_per_token\":%.3f,"
      "\"ms_per_token_min\":%.3f,\"ms_per_token_max\":%.3f,\"prefill_ms\":%.2f,\"tokens_per_sec\":%.1f,"
      "\"decode_gflops\":%.2f,\"kv_cache\":true,\"prompt_len\":%lld,\"prefill_chunk\":%lld,\"new_tokens\":%lld,"
      "\"temperature\":%g,"
      "\"repeats\":%d,\"weights\":\"%s\",\"kv_dtype\":\"%s\",\"replay\":\"%s\",\"replayed_steps\":%lld,"
      "\"eager_steps\":%lld,\"weight_mb\":%.1f,\"cpu_ms_per_token\":%.3f,\"cpu\":\"%s\"}\n",
      f.label.c_str(), opt.backend.c_str(), opt.threads, f.ms_per_token, f.ms_min, f.ms_max, f.prefill_ms,
      1e3 / f.ms_per_token, f.flops_per_token / f.ms_per_token * 1e-6, (long long)f.prompt_len,
      (long long)lo.prefill_chunk, (long long)f.new_tokens, double(lo.temperature), lo.repeats, f.weights.c_str(),
      f.kv_dtype.c_str(), lo.replay.c_str(), (long long)f.replayed_steps, (long long)f.eager_steps,
      f.weight_bytes / 1e6, f.cpu_ms_per_token, cpu_model().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace dew_bench
