// tools/dew-bench/main.cpp — `dew-bench <suite> [options]`: prints one JSON line per measurement.
// Suites: kernels (matmul through dew's API next to oneDNN called directly; fused attention fwd+bwd; decode
// products; sampling), train (a language-model training step on a named config, lm.cpp), generate (KV-cached
// decoding, greedy or sampled),
// roofline (this machine's matmul peak and read bandwidth, and each workload's fraction of them,
// roofline.cpp), serve (a load generator for `dew-run serve`, serve.cpp).
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "bench.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/registry.hpp"

namespace po = boost::program_options;

namespace {
// The parts of `dew-bench kernels` (--only), written once: the usage, the option's help and its check read it.
#define DEW_BENCH_KERNEL_PARTS "matmul|attention|decode|slots|loss|sampling|ema|activations|widened"
const char* kUsage =
    "usage: dew-bench kernels [--threads N] [--backend cpu|ref|cuda] [--matmul-precision P] [--seconds S] [--repeats "
    "R] "
    "[--only " DEW_BENCH_KERNEL_PARTS
    "]\n"
    "       dew-bench train --config char-small|gpt-mini|dit|PATH.ini [--threads N] [--backend cpu|cuda] "
    "[--matmul-precision highest|high|medium] [--isa best|avx512|avx2|portable] [--precision f32|bf16-mixed|f16-mixed] "
    "[--activation-memory] [--steps S] "
    "[--warmup W] [--grad-norm] [--profile] [-v]\n"
    "       (every suite: [--backend-option KEY=VALUE ...], e.g. attention=warp on cuda)\n"
    "       dew-bench generate --config char-small|PATH.ini [--threads N] [--tokens 256] [--prompt-len 16] "
    "[--prefill-chunk C] [--repeats 5] [--weights f32|bf16|int8] [--kv-cache auto|f32|bf16] [--replay on|off] "
    "[--temperature T] [--profile] [-v]\n"
    "       dew-bench roofline --config char-small|gpt-mini|PATH.ini [--threads N] [--matmul-precision P] "
    "[--steps S]\n"
    "       dew-bench serve --url http://127.0.0.1:PORT [--clients 1,4,16] [--requests 16] [--max-tokens 64] "
    "[--prompt-len 16] [--shared-prefix 0] [--config LABEL]\n";
}

namespace dew_bench {
std::shared_ptr<dew::Backend> make_backend(const BenchOptions& opt) {
  dew::Options options;
  if (opt.matmul_precision != "highest") options.set("matmul_precision", opt.matmul_precision);
  if (opt.no_block_cache && opt.backend == "cpu") options.set("cache_mb", "0");
  if (opt.isa != "best") options.set("isa", opt.isa);
  std::vector<std::string> asked;  // --backend-option's keys
  for (const std::string& kv : opt.backend_options) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw dew::UsageError("--backend-option takes KEY=VALUE (e.g. attention=warp for cuda), not '" + kv + "'");
    asked.push_back(kv.substr(0, eq));
    options.set(asked.back(), kv.substr(eq + 1));
  }
  dew::BackendPtr be = dew::create_backend(opt.backend, options);
  // A key asked for by --backend-option that the backend never read is a typo (or another backend's); the keys
  // set above from --matmul-precision and --isa stay permissions, as dew-run's [run] matmul_precision is.
  for (const std::string& key : asked)
    if (!options.was_read(key))
      throw dew::UsageError("--backend-option " + key + ": backend '" + opt.backend + "' has no such option");
  if (opt.profile) return std::make_shared<dew::ProfilingBackend>(be);
  return be;
}
void profile_reset(const std::shared_ptr<dew::Backend>& be) {
  if (auto* p = dynamic_cast<dew::ProfilingBackend*>(be.get())) p->start();
}
void profile_pause(const std::shared_ptr<dew::Backend>& be) {
  if (auto* p = dynamic_cast<dew::ProfilingBackend*>(be.get())) p->stop();
}
void profile_resume(const std::shared_ptr<dew::Backend>& be) {
  if (auto* p = dynamic_cast<dew::ProfilingBackend*>(be.get())) p->resume();
}
void profile_report(const std::shared_ptr<dew::Backend>& be, int steps, double step_ms) {
  auto* p = dynamic_cast<dew::ProfilingBackend*>(be.get());
  if (!p) return;
  p->stop();
  std::istringstream lines(p->report(steps, step_ms));
  for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "# %s\n", line.c_str());
}
// Each product shape of the profiled steps run alone on the wrapped backend, over and over on the same operands
// (hot in the cache, as `dew-bench kernels` times them), against its time in the step: what the step's products
// lose to their setting (operands that earlier kernels pushed out of the cache, the step's other traffic). Only
// the float products a training step makes (a and b of one dtype, none empty); alpha, beta and the epilogue as
// recorded, out starting at zeros.
void profile_products_alone(const std::shared_ptr<dew::Backend>& be, int steps, const BenchOptions& opt) {
  auto* prof = dynamic_cast<dew::ProfilingBackend*>(be.get());
  if (!prof) return;
  const dew::BackendPtr& inner = prof->inner();
  BenchOptions quick = opt;
  quick.seconds = std::min(opt.seconds, 0.1), quick.repeats = 3;  // ~0.4 s a shape (device-check profiles too)
  const double n = double(std::max(steps, 1));
  double in_step = 0, alone = 0;
  std::vector<std::pair<double, std::string>> rows;
  for (const dew::ProfilingBackend::Product& q : prof->products()) {
    const dew::MatmulParams& p = q.params;
    if (q.a != q.b || !dew::is_floating(q.a) || q.calls == 0 || p.batch * p.m * p.n * p.k == 0) continue;
    const auto span = [&](int64_t stride, int64_t mat) { return (p.batch - 1) * stride + mat; };
    const dew::Tensor a = dew::cast(dew::Tensor::uniform({span(p.a_batch_stride, p.m * p.k)}, -1, 1, 5, 1, inner), q.a);
    const dew::Tensor b = dew::cast(dew::Tensor::uniform({span(p.b_batch_stride, p.k * p.n)}, -1, 1, 5, 2, inner), q.b);
    const dew::Tensor bias =
        q.has_bias ? dew::cast(dew::Tensor::uniform({p.n}, -1, 1, 5, 3, inner), q.bias) : dew::Tensor();
    dew::Tensor out = dew::Tensor::zeros({p.batch * p.m * p.n}, q.out, inner);
    const double s = median_seconds([&] { inner->matmul(a, b, bias, out, p); }, quick, [&] { inner->synchronize(); });
    const double step_ms = q.seconds * 1e3 / n, alone_ms = s * 1e3 * double(q.calls) / n;
    in_step += step_ms, alone += alone_ms;
    char line[256];
    std::snprintf(line, sizeof line, "%9.3f %9.3f %6.2f  %s", step_ms, alone_ms, alone_ms / step_ms, q.label.c_str());
    rows.emplace_back(step_ms, line);
  }
  if (rows.empty()) return;
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(stderr, "# products alone: each shape run on its own, its operands hot in the cache (ms per step)\n");
  std::fprintf(stderr, "# %9s %9s %6s  %s\n", "in step", "alone", "ratio", "product");
  for (const auto& [ms, line] : rows) std::fprintf(stderr, "# %s\n", line.c_str());
  std::fprintf(stderr, "# %9.3f %9.3f %6.2f  all products (alone / in the step)\n", in_step, alone, alone / in_step);
}
}  // namespace dew_bench

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string suite = argv[1];
  if (suite == "serve") {  // its own options (serve.cpp)
    try {
      return dew_bench::run_serve(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::cerr << "dew-bench serve: " << e.what() << "\n";
      return 2;
    }
  }
  dew_bench::BenchOptions opt;
  dew_bench::LmOptions lm;
  std::vector<std::string> plugin_dirs;
  po::options_description d("dew-bench");
  d.add_options()("threads", po::value(&opt.threads)->default_value(1), "threads")(
      "backend", po::value(&opt.backend)->default_value("cpu"), "backend")(
      "matmul-precision", po::value(&opt.matmul_precision)->default_value("highest"),
      "highest | high | medium ([run] matmul_precision; cpu: medium = bf16 operands where they pay: bf16_dot)")(
      "isa", po::value(&opt.isa)->default_value("best"),
      "cpu: path of the hand-written kernels, best | avx512 | avx2 | portable (the backend's isa option)")(
      "backend-option", po::value(&opt.backend_options)->composing(),
      "KEY=VALUE for the backend, repeatable (cuda: attention=auto|warp, matmul_precision=...; cpu: isa=..., "
      "bf16_dot=auto|native|widened)")("seconds", po::value(&opt.seconds)->default_value(0.3),
                                       "kernels: seconds per repeat")(
      "only", po::value(&opt.only), "kernels: one part alone, " DEW_BENCH_KERNEL_PARTS)(
      "repeats", po::value<int>(), "kernels: repeats (the median is printed; 5); generate: timed generations (5)")(
      "config", po::value(&lm.config)->default_value("char-small"), "train/generate: config name or .ini path")(
      "steps", po::value(&lm.steps)->default_value(10), "train: timed steps")(
      "warmup", po::value<int>(), "train: untimed steps (3); generate: untimed generations (1)")(
      "batches", po::value(&lm.batches)->default_value(4), "train: synthetic batches cycled")(
      "precision", po::value(&lm.precision)->default_value("f32"),
      "train: f32 | bf16-mixed | f16-mixed ([run] precision: half activations and matmul operands, f32 master "
      "weights)")("activation-memory", po::bool_switch(&lm.activation_memory),
                  "train: print the resident memory the first forward adds (cpu backend without its block cache)")(
      "grad-norm", po::bool_switch(&lm.grad_norm), "train: also compute the global grad norm (clipping)")(
      "profile", po::bool_switch(&opt.profile),
      "train / generate: time every kernel call and print where a step (a decoded token) goes")(
      "recompute", po::value(&lm.recompute)->default_value("none"),
      "train: none | blocks (recompute each block in the backward, [trainer] recompute)")(
      "tokens", po::value(&lm.tokens)->default_value(256), "generate: new tokens")(
      "prompt-len", po::value(&lm.prompt_len)->default_value(16), "generate: prompt tokens")(
      "prefill-chunk", po::value(&lm.prefill_chunk)->default_value(0),
      "generate: the prompt fed in chunks of this many tokens, as dew-run sample / serve --prefill-chunk (0: one "
      "call)")("weights", po::value(&lm.weights)->default_value("f32"),
               "generate: decode weights stored as f32 | bf16 | int8 (K/V cache f32 | bf16 | bf16; f32 activations and "
               "accumulation)")("kv-cache", po::value(&lm.kv_cache)->default_value("auto"),
                                "generate: the K/V cache's dtype: auto (as --weights) | f32 | bf16")(
      "replay", po::value(&lm.replay)->default_value("on"),
      "generate: on = one-token steps replayed as a recorded step program after the first three "
      "(dew::decoder_start, as dew-run sample); off = every step eager")(
      "temperature", po::value(&lm.temperature)->default_value(0.0f),
      "generate: 0 = greedy; > 0 = every token drawn through the sampling chain (dew::sample_token), as "
      "dew-run sample and serve draw")("verbose,v", po::bool_switch(&lm.verbose), "per-step lines on stderr")(
      "plugin-dir", po::value(&plugin_dirs)->composing(), "extra plugin folder");
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(std::vector<std::string>(argv + 2, argv + argc)).options(d).positional({}).run(),
              vm);
    po::notify(vm);
    if (vm.count("repeats")) opt.repeats = lm.repeats = vm["repeats"].as<int>();
    if (vm.count("warmup")) lm.warmup = lm.gen_warmup = vm["warmup"].as<int>();
    opt.no_block_cache = lm.activation_memory;
    for (const auto& p : dew::Registry::default_plugin_dirs()) plugin_dirs.push_back(p);
    dew::Registry::global().discover(plugin_dirs);
    if (!opt.only.empty() &&
        std::string("|" DEW_BENCH_KERNEL_PARTS "|").find("|" + opt.only + "|") == std::string::npos)
      throw dew::UsageError("--only takes one of " DEW_BENCH_KERNEL_PARTS ", not '" + opt.only + "'");
    if (suite == "kernels") return dew_bench::run_kernels(opt);
    if (suite == "train" && lm.config == "dit") return dew_bench::run_dit_train(lm, opt);
    if (suite == "train") return dew_bench::run_train(lm, opt);
    if (suite == "generate") return dew_bench::run_generate(lm, opt);
    if (suite == "roofline") return dew_bench::run_roofline(lm, opt);
    std::cerr << "dew-bench: unknown suite '" << suite << "' (known: kernels, train, generate, roofline, serve)\n"
              << kUsage;
    return 2;
  } catch (const po::error& e) {
    std::cerr << "dew-bench: " << e.what() << "\n";
    return 2;
  } catch (const dew::Error& e) {
    std::cerr << "dew-bench: " << e.describe() << "\n";
    return e.kind() == dew::ErrorKind::usage ? 2 : 1;
  }
}
