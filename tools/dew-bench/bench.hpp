// tools/dew-bench/bench.hpp — shared timing helpers of dew-bench (median of repeats, JSON lines).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dew/dtype.hpp"

namespace dew {
class Backend;
}

namespace dew_bench {

struct BenchOptions {
  int threads = 1;
  std::string backend = "cpu";
  double seconds = 0.3;  // per repeat
  int repeats = 5;
  std::string matmul_precision = "highest";  // the backend's matmul_precision option ([run] matmul_precision)
  std::string isa = "best";                  // cpu: the backend's isa option (path of the hand-written kernels)
  std::vector<std::string> backend_options;  // --backend-option KEY=VALUE, passed to the backend as they are
  bool profile = false;                      // train / generate: time every kernel (dew/profile.hpp) and print a table
  bool no_block_cache = false;               // cpu: cache_mb = 0 (train --activation-memory)
  std::string only;                          // kernels: "matmul" or "attention" runs that part alone
};

// The median of v (the upper of the two middle values when v has an even size); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs fn in repeats of ~opt.seconds each; returns the median seconds per call. `sync` (when given)
// waits for queued device work before each clock read, so asynchronous backends (cuda) are timed by
// completion, not by enqueueing.
inline double median_seconds(const std::function<void()>& fn, const BenchOptions& opt,
                             const std::function<void()>& sync = {}) {
  using clock = std::chrono::steady_clock;
  fn();  // warm-up (primitive creation, caches)
  if (sync) sync();
  int iters = 1;
  for (;;) {  // calibrate
    const auto t0 = clock::now();
    for (int i = 0; i < iters; ++i) fn();
    if (sync) sync();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (s > opt.seconds * 0.5 || iters > (1 << 20)) {
      iters = std::max(1, int(iters * opt.seconds / std::max(s, 1e-9)));
      break;
    }
    iters *= 2;
  }
  std::vector<double> per_call;
  for (int r = 0; r < opt.repeats; ++r) {
    const auto t0 = clock::now();
    for (int i = 0; i < iters; ++i) fn();
    if (sync) sync();
    per_call.push_back(std::chrono::duration<double>(clock::now() - t0).count() / iters);
  }
  return median(per_call);
}

// train / generate (lm.cpp): the language-model workloads on the peers' protocol.
struct LmOptions {
  std::string config = "char-small";        // a name in configs/ or a path to an .ini
  int warmup = 3, steps = 10, batches = 4;  // train: the peer's defaults
  bool grad_norm = false;                   // train: also the global grad norm (the peer does not clip)
  int prompt_len = 16, tokens = 256;        // generate: the peer's defaults
  int gen_warmup = 1, repeats = 5;
  std::string weights = "f32";     // generate: the decode weights' storage (f32 | bf16 | int8, dew/generate.hpp)
  std::string kv_cache = "auto";   // generate: the K/V cache's dtype (auto: as the weights | f32 | bf16)
  std::string replay = "on";       // generate: one-token steps as a recorded step program (dew::decoder_start)
  float temperature = 0;           // generate: 0 = greedy (argmax), else every token drawn by dew::sample_token
  int64_t prefill_chunk = 0;       // generate: the prompt fed in chunks of this many tokens (0: one call)
  bool verbose = false;            // per-step lines on stderr
  std::string precision = "f32";   // train: [run] precision (f32 | bf16-mixed | f16-mixed; dew/autocast.hpp)
  bool activation_memory = false;  // train: the RSS the first forward adds (cpu with cache_mb = 0; lm and dit)
  std::string recompute = "none";  // train: activation recomputation of the blocks (none | blocks)
};

// Resident memory of this process (MiB), from /proc/self/statm: what --activation-memory reads around the first
// forward (lm.cpp, dit.cpp).
double resident_mb();

// Memory accounting of a train benchmark (lm.cpp): the training state measured once (after the first timed
// backward, gradients in place) and the backend's high-water mark over the timed steps (reset after the
// warm-up). json() gives the fields mem_params_mb, mem_grads_mb, mem_optim_mb, mem_peak_mb and
// mem_activations_mb (peak minus the three states), with a leading comma; nothing for an untracked backend.
struct BenchMemory {
  int64_t params = 0, grads = 0, optim = 0, peak = 0;
  bool measured = false, tracked = false;
  std::string json() const;
};

// The backend opt names, with its matmul_precision when it is not the default, wrapped in a
// ProfilingBackend when opt.profile (main.cpp).
std::shared_ptr<dew::Backend> make_backend(const BenchOptions& opt);

// After the warm-up steps: restarts the profile of `be` when it is a ProfilingBackend (no-op otherwise);
// at the end, prints its report to stderr.
void profile_reset(const std::shared_ptr<dew::Backend>& be);
void profile_report(const std::shared_ptr<dew::Backend>& be, int steps, double step_ms);
// After a training step's profile_report: its products replayed alone (main.cpp), against their time in the step.
void profile_products_alone(const std::shared_ptr<dew::Backend>& be, int steps, const BenchOptions& opt);
// Stops counting without clearing, and goes on counting (generate: only the decode loops are profiled).
void profile_pause(const std::shared_ptr<dew::Backend>& be);
void profile_resume(const std::shared_ptr<dew::Backend>& be);

// What one `train` / `generate` run measured, for the roofline suite (roofline.cpp) to set against the
// machine's limits. Shapes are [rows, cols] of the 2-D weights each step multiplies (N_mm's matrices).
struct TrainFigures {
  std::string label;
  double mean_s = 0, median_s = 0, flops = 0, n_mm = 0, attn_flops = 0;
  int64_t n_params = 0, batch = 0, seq_len = 0, vocab = 0, dim = 0, layers = 0;
  std::vector<std::pair<int64_t, int64_t>> matmul_weights;  // [out, in], the tied head included once
  double loss_first = 0, loss_last = 0;
  double activation_rss_mb = 0;  // --activation-memory: RSS added by the first step's forward
  BenchMemory mem;
};
struct DecodeFigures {
  std::string label;
  double ms_per_token = 0, ms_min = 0, ms_max = 0, prefill_ms = 0, flops_per_token = 0, n_mm = 0;
  double cpu_ms_per_token = 0;  // process CPU time of the decode loop per token (median)
  int64_t prompt_len = 0, new_tokens = 0, layers = 0, kv_dim = 0;  // kv_dim: n_kv_heads * head_dim
  std::string weights = "f32";
  std::string kv_dtype = "f32";  // the K/V cache's dtype (bf16 with --weights bf16)
  double weight_bytes = 0;       // the bytes of N_mm's matrices as stored (a tied head stays f32)
  int64_t replayed_steps = 0, eager_steps = 0;  // decode steps as step-program replays / eager (warm-up included)
};
TrainFigures measure_train(const LmOptions& lo, const BenchOptions& opt);
DecodeFigures measure_generate(const LmOptions& lo, const BenchOptions& opt);

// Machine limits (roofline.cpp), measured at opt.threads: oneDNN 2.6 called directly on plain row-major
// memory (f32, or bf16 operands with f32 accumulation), and a streaming read of a buffer.
double onednn_matmul_gflops(int64_t m, int64_t k, int64_t n, bool bf16, const BenchOptions& opt);
// The best oneDNN rate over the products a training step makes with these [out, in] weights on `rows`
// rows (forward x W^T, dx = dy W, dW = dy^T x); bf16 = bf16 operands (the f32 rate on a CPU where oneDNN
// has no bf16 matmul: dew runs those products in f32 there).
double onednn_peak_gflops(const std::vector<std::pair<int64_t, int64_t>>& weights, int64_t rows, bool bf16,
                          const BenchOptions& opt);
// The machine's matmul ceiling for a training step with these weights on `rows` rows, measured now: on a host
// backend oneDNN called directly at the step's products (onednn_peak_gflops; half = bf16 operands); on a device
// backend dew::matmul on it at those products and at dew::measure_matmul_peak_gflops's size, in `operands`.
struct MachinePeak {
  double gflops = 0;
  bool device = false;
  int64_t square = 0;  // device: the side of the square product among those measured (dew::matmul_peak_size)
};
MachinePeak machine_peak(const std::shared_ptr<dew::Backend>& be,
                         const std::vector<std::pair<int64_t, int64_t>>& weights, int64_t rows, bool half,
                         dew::DType operands, const BenchOptions& opt);
// The JSON fields of achieved / peak: ,"mfu_onednn":..,"onednn_peak_gflops":..,"onednn_peak":".." on a host
// backend; ,"mfu_device":..,"device_peak_gflops":..,"device_peak":".." on a device.
std::string machine_peak_json(const MachinePeak& peak, double achieved_gflops);
// GB/s reading `bytes` (split over `threads` threads, each its own contiguous part) again and again;
// isa names the read loop taken (avx512 | avx2 | sse2).
double read_bandwidth_gbs(size_t bytes, int threads, const char** isa = nullptr);
// "model name" of /proc/cpuinfo (empty when unknown).
std::string cpu_model();

int run_kernels(const BenchOptions& opt);
// roofline (roofline.cpp): the machine's limits and, per workload of the config (training step, decode
// token), the roofline time, the measured time and their ratio.
int run_roofline(const LmOptions& lo, const BenchOptions& opt);
// serve (serve.cpp): TTFT and tokens/s of a running `dew-run serve` at several client counts; parses its
// own options.
int run_serve(const std::vector<std::string>& args);
int run_train(const LmOptions& lo, const BenchOptions& opt);
int run_generate(const LmOptions& lo, const BenchOptions& opt);
// train --config dit (dit.cpp): the DiT step of ../shared/peers/torch_dit_train.py on the dit plugin.
int run_dit_train(const LmOptions& lo, const BenchOptions& opt);

}  // namespace dew_bench
