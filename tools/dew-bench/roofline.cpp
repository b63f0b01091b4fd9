// tools/dew-bench/roofline.cpp — `dew-bench roofline [--config C] [--threads N]`: this machine's limits,
// measured in the same run, and how close each workload of the config comes to them.
//
// Limits (nothing is written in for any CPU):
// * matmul peak: oneDNN 2.6 called directly (plain row-major memory, primitive made once) on every
//   product a training step of the config makes — for each [out, in] weight behind N_mm on B*T rows:
//   forward x W^T (B*T x in x out), dx = dy W (B*T x out x in) and dW = dy^T x (out x B*T x in) — in f32
//   and with bf16 operands (f32 accumulation); the peak is the best of them.
// * read bandwidth: a streaming sum over a buffer of each workload's working-set size, each thread its own
//   contiguous part, at 1 thread, at --threads and at every core; the loop is AVX-512, AVX2 or SSE2 as
//   the CPU allows (read_isa).
// Workloads (one JSON line each, `bench` names it; measured by the same code as `train` / `generate`):
// * roofline_train: FLOPs (the peers' formula, as `train`) at the matmul peak of the run's precision plus
//   the bytes the step must move outside its matmuls (the AdamW update reads p, g, m, v and writes p, m, v,
//   and zeroing writes g: 32 B per parameter) at the bandwidth of that working set: roofline_ms. The
//   phases do not overlap, hence the sum. matmul_ms: the step's products at the rate oneDNN reaches on
//   each one's own shape, the attention FLOPs at the peak: what the matmuls alone allow. Three rounds, each
//   a `train` measurement and the step's product rates right after it (`rounds`), as decode's below:
//   measured_ms, peak_gflops and both fractions are the medians of the rounds' (a peak read a minute after the
//   step moved the fraction 0.84 <-> 0.93 on the Emerald Rapids Xeon: its per-shape rates drift by ~5 %).
// * roofline_decode (weights f32, bf16 and int8 as `generate --weights` keeps them): the bytes one decode
//   token must read (every N_mm weight once as stored, int8's scales included, and the K/V cache, f32 with f32
//   weights and bf16 with the others, at the
//   mean position of the run) at the bandwidth of that working set, against the FLOPs at the f32 peak; the larger is
//   the roofline (both happen in the same streaming loops). Three rounds, each a decode measurement and the read
//   bandwidth at --threads right after it (`rounds`): measured_ms and bandwidth_gbs are their medians, fraction
//   the median of the rounds' fractions (on a shared host a limit read minutes away moved it by 20 %).
// fraction = roofline_ms / measured_ms (1 = at the limit). The figures are lower bounds: activations'
// traffic is not counted, so a fraction near 1 is the best this accounting allows.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "bench.hpp"
#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/train.hpp"

namespace dew_bench {

namespace {

using clock_type = std::chrono::steady_clock;

// A short timing protocol for the limits: they are many small measurements.
BenchOptions quick(const BenchOptions& opt) {
  BenchOptions q = opt;
  q.seconds = std::min(opt.seconds, 0.12);
  q.repeats = 3;
  return q;
}

// ---- streaming read loops: 4 independent accumulators, n a multiple of 64 floats.
__attribute__((target("avx512f"))) float read_sum_avx512(const float* p, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
__attribute__((target("avx2"))) float read_sum_avx2(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}
float read_sum_sse2(const float* p, size_t n) {
  __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 16) {
    s0 = _mm_add_ps(s0, _mm_load_ps(p + i));
    s1 = _mm_add_ps(s1, _mm_load_ps(p + i + 4));
    s2 = _mm_add_ps(s2, _mm_load_ps(p + i + 8));
    s3 = _mm_add_ps(s3, _mm_load_ps(p + i + 12));
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

using ReadFn = float (*)(const float*, size_t);
ReadFn read_loop(const char** isa) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    if (isa) *isa = "avx512";
    return read_sum_avx512;
  }
  if (__builtin_cpu_supports("avx2")) {
    if (isa) *isa = "avx2";
    return read_sum_avx2;
  }
  if (isa) *isa = "sse2";
  return read_sum_sse2;
}

std::string shape_name(int64_t m, int64_t k, int64_t n) {
  return std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
}

struct Product {
  int64_t m, k, n;
  bool operator<(const Product& o) const { return std::tie(m, k, n) < std::tie(o.m, o.k, o.n); }
};

// Every product of a training step with these weights on `rows` rows, with its multiplicity.
std::map<Product, int> step_products(const std::vector<std::pair<int64_t, int64_t>>& weights, int64_t rows) {
  std::map<Product, int> p;
  for (const auto& [out, in] : weights) {
    ++p[{rows, in, out}];  // forward
    ++p[{rows, out, in}];  // dx
    ++p[{out, rows, in}];  // dW
  }
  return p;
}

double mean_kv_bytes(const DecodeFigures& d) {
  // Token i (0-based) of the decode loop attends to prompt_len + i + 1 positions; K and V in the cache's dtype.
  const double first = double(d.prompt_len + 1), last = double(d.prompt_len + d.new_tokens - 1);
  const double bytes = d.kv_dtype == "bf16" ? 2.0 : 4.0;
  return 2.0 * double(d.layers) * double(d.kv_dim) * bytes * (first + last) / 2.0;
}

// One weights setting's decode rounds: the first round's figures, then per round ms/token and the read
// bandwidth measured right after it.
struct DecodeRounds {
  DecodeFigures fig;
  std::vector<double> ms, gbs;
};

}  // namespace

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      std::string m = colon == std::string::npos ? "" : line.substr(colon + 1);
      m.erase(0, m.find_first_not_of(" \t"));
      for (char& c : m)
        if (c == '"' || c == '\\') c = ' ';
      return m;
    }
  return "";
}

double onednn_matmul_gflops(int64_t m, int64_t k, int64_t n, bool bf16, const BenchOptions& opt) {
  using namespace dnnl;
  const memory::data_type ab = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  memory::desc a_md({m, k}, ab, memory::format_tag::ab);
  memory::desc b_md({k, n}, ab, memory::format_tag::ab);
  memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  std::unique_ptr<matmul> prim;
  try {
    prim = std::make_unique<matmul>(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), eng));
  } catch (const dnnl::error&) {
    return 0.0;  // no bf16 matmul on this CPU
  }
  const size_t elt = bf16 ? 2 : 4;
  std::vector<unsigned char> a(size_t(m * k) * elt), b(size_t(k * n) * elt);
  std::vector<float> c(size_t(m * n));
  // 0.5 and 0.25 in either type (bf16 = the high half of the f32 bits).
  auto fill = [&](std::vector<unsigned char>& v, float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    for (size_t i = 0; i < v.size(); i += elt)
      if (bf16) {
        const uint16_t h = uint16_t(bits >> 16);
        std::memcpy(&v[i], &h, 2);
      } else {
        std::memcpy(&v[i], &bits, 4);
      }
  };
  fill(a, 0.5f);
  fill(b, 0.25f);
  omp_set_num_threads(opt.threads);
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  const double secs = median_seconds(
      [&] {
        prim->execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        s.wait();
      },
      quick(opt));
  return 2.0 * double(m) * double(n) * double(k) / secs * 1e-9;
}

double onednn_peak_gflops(const std::vector<std::pair<int64_t, int64_t>>& weights, int64_t rows, bool bf16,
                          const BenchOptions& opt) {
  double best = 0;
  for (const auto& [p, count] : step_products(weights, rows))
    best = std::max(best, onednn_matmul_gflops(p.m, p.k, p.n, bf16, opt));
  // No bf16 matmul in oneDNN on this CPU (no AVX512-BF16): the cpu backend's bf16 products run in f32 there
  // (widened operands), so the f32 rate is the step's ceiling (and the JSON never divides by 0).
  if (bf16 && best == 0) return onednn_peak_gflops(weights, rows, false, opt);
  return best;
}

MachinePeak machine_peak(const std::shared_ptr<dew::Backend>& be,
                         const std::vector<std::pair<int64_t, int64_t>>& weights, int64_t rows, bool half,
                         dew::DType operands, const BenchOptions& opt) {
  if (be->host_accessible()) return {onednn_peak_gflops(weights, rows, half, opt), false, 0};
  // A device: no library to call around the backend, so dew::matmul on it, synchronised, at the step's own
  // products and at the backend's square peak size; the best of them.
  dew::NoGradGuard no_grad;
  double best = dew::measure_matmul_peak_gflops(be, operands);
  for (const auto& [p, count] : step_products(weights, rows)) {
    dew::Tensor a = dew::Tensor::uniform({p.m, p.k}, -1, 1, 7, 1, be),
                b = dew::Tensor::uniform({p.k, p.n}, -1, 1, 7, 2, be);
    if (operands != dew::DType::f32) a = dew::cast(a, operands), b = dew::cast(b, operands);
    const double secs =
        median_seconds([&] { dew::Tensor c = dew::matmul(a, b); }, quick(opt), [&] { be->synchronize(); });
    best = std::max(best, 2.0 * double(p.m) * double(p.k) * double(p.n) / secs * 1e-9);
  }
  return {best, true, dew::matmul_peak_size(*be)};
}

std::string machine_peak_json(const MachinePeak& peak, double achieved_gflops) {
  char buf[256];
  const double mfu = achieved_gflops / std::max(peak.gflops, 1e-9);
  if (peak.device)
    std::snprintf(buf, sizeof buf,
                  ",\"mfu_device\":%.4f,\"device_peak_gflops\":%.1f,\"device_peak\":\"dew::matmul on the device, "
                  "best of the step's product shapes and %lld^3\"",
                  mfu, peak.gflops, (long long)peak.square);
  else
    std::snprintf(buf, sizeof buf,
                  ",\"mfu_onednn\":%.4f,\"onednn_peak_gflops\":%.1f,\"onednn_peak\":\"oneDNN direct, best of the "
                  "step's product shapes\"",
                  mfu, peak.gflops);
  return buf;
}

double read_bandwidth_gbs(size_t bytes, int threads, const char** isa) {
  const ReadFn fn = read_loop(isa);
  threads = std::max(1, threads);
  const size_t per_thread = std::max<size_t>(64, (bytes / 4 / size_t(threads) + 63) / 64 * 64);  // floats
  const size_t total = per_thread * size_t(threads);
  float* buf = static_cast<float*>(std::aligned_alloc(64, total * sizeof(float)));
  DEW_CHECK(buf != nullptr, "dew-bench roofline: cannot allocate ", total * 4, " bytes");
#pragma omp parallel num_threads(threads)
  {  // first touch by the thread that reads the part
    const size_t t = size_t(omp_get_thread_num());
    for (size_t i = 0; i < per_thread; ++i) buf[t * per_thread + i] = 1.0f;
  }
  std::vector<float> sums(static_cast<size_t>(threads));  // kept, so the reads are not optimised away
  auto pass = [&](int reps) {
    const auto t0 = clock_type::now();
#pragma omp parallel num_threads(threads)
    {
      const size_t t = size_t(omp_get_thread_num());
      float s = 0;
      for (int r = 0; r < reps; ++r) s += fn(buf + t * per_thread, per_thread);
      sums[t] += s;
    }
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  pass(2);  // warm caches and pages
  int reps = 1;
  while (pass(reps) < 0.02 && reps < (1 << 24)) reps *= 2;
  std::vector<double> gbs;
  for (int i = 0; i < 5; ++i) gbs.push_back(double(total * 4) * reps / pass(reps) * 1e-9);
  std::free(buf);
  static volatile float sink;
  for (const float v : sums) sink = sink + v;
  return median(gbs);
}

int run_roofline(const LmOptions& lo, const BenchOptions& opt) {
  DEW_USAGE_CHECK(opt.threads >= 1, "dew-bench roofline: --threads must be >= 1");
  const bool bf16_run = opt.matmul_precision == "medium";
  const std::string cpu = cpu_model();
  const int cores = omp_get_num_procs();
  // The run precision's peak (bf16 falls back to f32 where oneDNN has no bf16 matmul).
  auto run_peak_of = [&](const double* pk) { return pk[int(bf16_run)] > 0 ? pk[int(bf16_run)] : pk[0]; };

  // Matmul limits at the step's own products, in f32 and bf16: the best rate of each precision and the
  // step's products at their own shapes' rates (attention's FLOPs at the best).
  struct Limits {
    double peak[2] = {0, 0}, matmul_s = 0;
    std::string peak_shape[2];
  };
  auto measure_limits = [&](const TrainFigures& tf) {
    Limits l;
    for (const auto& [p, count] : step_products(tf.matmul_weights, tf.batch * tf.seq_len))
      for (int bf = 0; bf < 2; ++bf) {
        const double g = onednn_matmul_gflops(p.m, p.k, p.n, bf == 1, opt);
        if (g > l.peak[bf]) {
          l.peak[bf] = g;
          l.peak_shape[bf] = shape_name(p.m, p.k, p.n);
        }
        if (bf == int(bf16_run) && g > 0)
          l.matmul_s += count * 2.0 * double(p.m) * double(p.k) * double(p.n) / (g * 1e9);
      }
    l.matmul_s += tf.attn_flops / (run_peak_of(l.peak) * 1e9);
    return l;
  };

  // Training: kTrainRounds rounds, each a `train` measurement and the limits right after it, so the two see
  // the same moment of a shared host (as decode's rounds below).
  constexpr int kTrainRounds = 3;
  std::vector<TrainFigures> train_rounds;
  std::vector<Limits> limit_rounds;
  for (int r = 0; r < kTrainRounds; ++r) {
    train_rounds.push_back(measure_train(lo, opt));
    limit_rounds.push_back(measure_limits(train_rounds.back()));
  }
  const TrainFigures& tf = train_rounds.front();
  // Decode: kDecodeRounds rounds, each a `generate` measurement and, right after it, the read bandwidth at its
  // working set (--threads): on a shared host the two then see the same moment, and the fraction is the
  // median of the per-round fractions (a limit measured minutes away moved it by 20 % on the AVX2 EPYC).
  constexpr int kDecodeRounds = 3;
  constexpr const char* kDecodeWeights[] = {"f32", "bf16", "int8"};
  constexpr int kStorages = int(std::size(kDecodeWeights));
  bool has_decode = true;
  DecodeRounds dr[kStorages];
  try {
    for (int r = 0; r < kDecodeRounds; ++r)
      for (int s = 0; s < kStorages; ++s) {
        LmOptions w = lo;
        w.weights = kDecodeWeights[s];
        const DecodeFigures f = measure_generate(w, opt);
        if (r == 0) dr[s].fig = f;
        dr[s].ms.push_back(f.ms_per_token);
        dr[s].gbs.push_back(read_bandwidth_gbs(size_t(f.weight_bytes + mean_kv_bytes(f)), opt.threads));
      }
  } catch (const dew::Error& e) {
    has_decode = false;  // a model without a KV-cached decode path: the training line only
    std::fprintf(stderr, "# roofline: no decode workload (%s)\n", e.what());
  }

  // The machine's peaks: the median round's (by the run precision's peak), its shapes with it.
  std::vector<size_t> by_peak(kTrainRounds);
  for (int r = 0; r < kTrainRounds; ++r) by_peak[size_t(r)] = size_t(r);
  std::sort(by_peak.begin(), by_peak.end(),
            [&](size_t a, size_t b) { return run_peak_of(limit_rounds[a].peak) < run_peak_of(limit_rounds[b].peak); });
  const Limits& mid = limit_rounds[by_peak[kTrainRounds / 2]];
  const double* peak = mid.peak;
  const std::string* peak_shape = mid.peak_shape;

  // Bandwidth at each workload's working set: 1 thread, --threads, every core.
  const char* isa = "";
  struct Bw {
    double one, run, all;
  };
  auto bandwidth = [&](double bytes) {
    Bw b;
    b.one = read_bandwidth_gbs(size_t(bytes), 1, &isa);
    b.run = opt.threads == 1 ? b.one : read_bandwidth_gbs(size_t(bytes), opt.threads);
    b.all = cores == 1 ? b.one : cores == opt.threads ? b.run : read_bandwidth_gbs(size_t(bytes), cores);
    return b;
  };
  const double train_bytes = 32.0 * double(tf.n_params);
  const Bw train_bw = bandwidth(16.0 * double(tf.n_params));  // p, g, m, v
  double decode_bytes[kStorages] = {};
  Bw decode_bw[kStorages] = {};
  if (has_decode)
    for (int s = 0; s < kStorages; ++s) {
      decode_bytes[s] = dr[s].fig.weight_bytes + mean_kv_bytes(dr[s].fig);
      decode_bw[s] = bandwidth(decode_bytes[s]);
    }

  std::printf(
      "{\"bench\":\"roofline_machine\",\"cpu\":\"%s\",\"cores\":%d,\"threads\":%d,\"f32_peak_gflops\":%.1f,"
      "\"f32_peak_shape\":\"%s\",\"bf16_peak_gflops\":%.1f,\"bf16_peak_shape\":\"%s\",\"read_isa\":\"%s\","
      "\"read_gbs\":[{\"what\":\"train optimizer state\",\"mb\":%.1f,\"threads_1\":%.1f,\"threads_run\":%.1f,"
      "\"threads_all\":%.1f}",
      cpu.c_str(), cores, opt.threads, peak[0], peak_shape[0].c_str(), peak[1], peak_shape[1].c_str(), isa,
      16.0 * double(tf.n_params) / 1e6, train_bw.one, train_bw.run, train_bw.all);
  if (has_decode)
    for (int s = 0; s < kStorages; ++s)
      std::printf(
          ",{\"what\":\"decode %s weights + kv\",\"mb\":%.1f,\"threads_1\":%.1f,\"threads_run\":%.1f,"
          "\"threads_all\":%.1f}",
          kDecodeWeights[s], decode_bytes[s] / 1e6, decode_bw[s].one, decode_bw[s].run, decode_bw[s].all);
  std::printf("]}\n");

  // Per round: the roofline at that round's peak over that round's step.
  const double t_memory = train_bytes / (train_bw.run * 1e9);
  std::vector<double> t_meas, t_median, t_peak, t_matmul, t_frac, t_mfrac;
  std::string train_rounds_json;
  for (int r = 0; r < kTrainRounds; ++r) {
    const TrainFigures& t = train_rounds[size_t(r)];
    const Limits& l = limit_rounds[size_t(r)];
    const double roof = t.flops / (run_peak_of(l.peak) * 1e9) + t_memory;
    t_meas.push_back(t.mean_s);
    t_median.push_back(t.median_s);
    t_peak.push_back(run_peak_of(l.peak));
    t_frac.push_back(roof / t.mean_s);
    t_matmul.push_back(l.matmul_s);
    t_mfrac.push_back(l.matmul_s / t.mean_s);
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "%s{\"measured_ms\":%.2f,\"peak_gflops\":%.1f,\"fraction\":%.3f,\"matmul_fraction\":%.3f}",
                  r ? "," : "", t.mean_s * 1e3, t_peak.back(), t_frac.back(), t_mfrac.back());
    train_rounds_json += buf;
  }
  const double run_peak = median(t_peak), measured_s = median(t_meas);
  const double t_compute = tf.flops / (run_peak * 1e9), t_roof = t_compute + t_memory;
  std::printf(
      "{\"bench\":\"roofline_train\",\"config\":\"%s\",\"cpu\":\"%s\",\"threads\":%d,\"matmul_precision\":\"%s\","
      "\"flops\":%.0f,\"bytes\":%.0f,\"peak_gflops\":%.1f,\"bandwidth_gbs\":%.1f,\"compute_ms\":%.2f,"
      "\"memory_ms\":%.2f,\"roofline_ms\":%.2f,\"matmul_ms\":%.2f,\"measured_ms\":%.2f,\"measured_ms_median\":%.2f,"
      "\"fraction\":%.3f,\"matmul_fraction\":%.3f,\"rounds\":[%s]}\n",
      tf.label.c_str(), cpu.c_str(), opt.threads, opt.matmul_precision.c_str(), tf.flops, train_bytes, run_peak,
      train_bw.run, t_compute * 1e3, t_memory * 1e3, t_roof * 1e3, median(t_matmul) * 1e3, measured_s * 1e3,
      median(t_median) * 1e3, median(t_frac), median(t_mfrac), train_rounds_json.c_str());
  auto decode_line = [&](const DecodeRounds& dd, double bytes) {
    const DecodeFigures& d = dd.fig;
    const double d_compute = d.flops_per_token / (peak[0] * 1e9);
    std::vector<double> fractions;
    std::string rounds;
    for (size_t r = 0; r < dd.ms.size(); ++r) {
      const double f = std::max(bytes / (dd.gbs[r] * 1e9), d_compute) / (dd.ms[r] * 1e-3);
      fractions.push_back(f);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s{\"measured_ms\":%.3f,\"bandwidth_gbs\":%.1f,\"fraction\":%.3f}", r ? "," : "",
                    dd.ms[r], dd.gbs[r], f);
      rounds += buf;
    }
    const double bw = median(dd.gbs), measured = median(dd.ms) * 1e-3;
    const double d_memory = bytes / (bw * 1e9), d_roof = std::max(d_memory, d_compute);
    std::printf(
        "{\"bench\":\"roofline_decode\",\"config\":\"%s\",\"cpu\":\"%s\",\"threads\":%d,\"weights\":\"%s\","
        "\"bytes_per_token\":%.0f,\"flops_per_token\":%.0f,\"bandwidth_gbs\":%.1f,\"peak_gflops\":%.1f,"
        "\"memory_ms\":%.3f,\"compute_ms\":%.3f,\"roofline_ms\":%.3f,\"measured_ms\":%.3f,\"fraction\":%.3f,"
        "\"achieved_gbs\":%.1f,\"rounds\":[%s]}\n",
        d.label.c_str(), cpu.c_str(), opt.threads, d.weights.c_str(), bytes, d.flops_per_token, bw, peak[0],
        d_memory * 1e3, d_compute * 1e3, d_roof * 1e3, measured * 1e3, median(fractions), bytes / measured * 1e-9,
        rounds.c_str());
  };
  if (has_decode)
    for (int s = 0; s < kStorages; ++s) decode_line(dr[s], decode_bytes[s]);
  std::fflush(stdout);
  return 0;
}

}  // namespace dew_bench
