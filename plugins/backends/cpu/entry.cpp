// cpu/entry.cpp — registration of the `cpu` backend, its construction, supports() and threading.
//
// The plugin registers one Backend, "cpu", which runs on any x86-64: its hand-written kernels are compiled
// per instruction-set path and chosen at construction (isa.hpp, option `isa`). supports() says yes to f32 for every
// kernel, to every dtype for the memory kernels (fill, cast, strided_copy, gather_rows), bf16 for the kernels half.cpp
// implements (natively where bf16_dot.cpp finds bf16 arithmetic pays on this CPU, else widened to f32 inside the
// backend), and no with a reason for the rest. Threads: OpenMP's team size; oneDNN (built on the OpenMP runtime)
// follows it.
#include <cstdlib>
#include <dew/registry.hpp>
#include <fstream>
#include <string>

#include "attention.hpp"
#include "attention_bf16.hpp"
#include "cpu_backend.hpp"
#include "matmul_rowwise.hpp"  // kPanelRows

namespace dew::cpu {

void require_f32(const Tensor& t, const char* kernel, const char* arg) {
  DEW_CHECK(t.defined(), "cpu ", kernel, ": ", arg, " is undefined");
  DEW_CHECK(t.dtype() == DType::f32, "cpu ", kernel, ": ", arg, " is ", dtype_name(t.dtype()),
            "; the cpu backend computes in f32 only (use the ref backend for f64)");
}
void require_bf16(const Tensor& t, const char* kernel, const char* arg) {
  DEW_CHECK(t.defined(), "cpu ", kernel, ": ", arg, " is undefined");
  DEW_CHECK(t.dtype() == DType::bf16, "cpu ", kernel, " (bf16): ", arg, " is ", dtype_name(t.dtype()),
            "; a bf16 call takes every data tensor in bf16");
}
void require_bf16_if_defined(std::initializer_list<const Tensor*> ts, const char* kernel) {
  for (const Tensor* t : ts)
    DEW_CHECK(!t->defined() || t->dtype() == DType::bf16, "cpu ", kernel, " (bf16): a data tensor is ",
              dtype_name(t->dtype()), "; a bf16 call takes every data tensor in bf16 (statistics in f32)");
}
void require_i32(const Tensor& t, const char* kernel, const char* arg) {
  DEW_CHECK(t.defined(), "cpu ", kernel, ": ", arg, " is undefined");
  DEW_CHECK(t.dtype() == DType::i32, "cpu ", kernel, ": ", arg, " must be i32, got ", dtype_name(t.dtype()));
}

CpuBackend::CpuBackend(const Options& options) : dnnl_(std::make_unique<Dnnl>()) {
  threads_.store(omp_get_max_threads(), std::memory_order_relaxed);  // the creating thread's (OMP_NUM_THREADS)
  const int64_t threads = options.get_int("threads", 0);
  DEW_USAGE_CHECK(threads >= 0, "cpu backend: threads = ", threads, " must be >= 0 (0 = OpenMP default)");
  if (threads > 0) set_threads(int(threads));
  const int64_t cache_mb = options.get_int("cache_mb", 1024);
  DEW_USAGE_CHECK(cache_mb >= 0, "cpu backend: cache_mb = ", cache_mb, " must be >= 0 (0 = no block cache)");
  blocks_ = std::make_unique<BlockCache>(size_t(cache_mb) << 20);
  const std::string precision = options.get_string("matmul_precision", "highest");
  DEW_USAGE_CHECK(precision == "highest" || precision == "high" || precision == "medium",
                  "cpu backend: option 'matmul_precision' = '", precision, "' is not one of highest, high, medium");
  // high (TF32) has no CPU counterpart: f32. medium is a permission: bf16 operands only where bf16 products
  // out-run f32 ones on this CPU (bf16_dot.cpp: AVX512-BF16 at Zen 5's rate, or AMX); elsewhere (no AVX512-BF16,
  // or Intel's half-rate vdpbf16ps without AMX) they would be slower than f32, so it stays f32.
  bf16_ = bf16_choice(options.get_string("bf16_dot", "auto"));
  bf16_matmul_ = precision == "medium" && bf16_.products;
  const std::string isa = options.get_string("isa", "best");
  std::string why = check_max_isa_env();
  DEW_USAGE_CHECK(why.empty(), "cpu backend: ", why);
  DEW_USAGE_CHECK(parse_isa(isa, isa_, why), "cpu backend: option 'isa' = ", why);
  const std::string panels = options.get_string("decode_panels", "on");
  DEW_USAGE_CHECK(panels == "on" || panels == "off", "cpu backend: option 'decode_panels' = '", panels,
                  "' is not one of on, off");
  decode_panels_ = panels == "on";
  const std::string slot_attention = options.get_string("slot_attention", "fused");
  DEW_USAGE_CHECK(slot_attention == "fused" || slot_attention == "rows", "cpu backend: option 'slot_attention' = '",
                  slot_attention, "' is not one of fused, rows");
  fused_slot_attention_ = slot_attention == "fused";
  decode_prefetch_ = options.get_string("decode_prefetch", "auto");
  DEW_USAGE_CHECK(decode_prefetch_ == "auto" || decode_prefetch_ == "on" || decode_prefetch_ == "off",
                  "cpu backend: option 'decode_prefetch' = '", decode_prefetch_, "' is not one of auto, on, off");
  prefetch_panels_ = decode_prefetch_ == "on";
  const std::string split = options.get_string("matmul_split", "on");
  DEW_USAGE_CHECK(split == "on" || split == "off", "cpu backend: option 'matmul_split' = '", split,
                  "' is not one of on, off");
  dnnl_->split_products = split == "on";
}

// Decode weights in panels of kPanelRows rows (matmul_rowwise.hpp): f32 and bf16 weights on the avx512 and avx2
// paths; int8 keeps its rows, and so does every weight on the portable path (slower there: matmul_rowwise.cpp).
int64_t CpuBackend::decode_panel_rows(DType dtype) const {
  return decode_panels_ && isa_ != Isa::portable && (dtype == DType::f32 || dtype == DType::bf16) ? kPanelRows : 0;
}
namespace {
// The last-level cache's size, from sysfs (the highest cache level of cpu0), or 32 MiB when it cannot be read.
int64_t last_level_cache_bytes() {
  int64_t best = 0;
  int best_level = -1;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || size.empty()) continue;
    int64_t bytes = std::atoll(size.c_str());
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    if (level > best_level && bytes > 0) best = bytes, best_level = level;
  }
  return best > 0 ? best : int64_t(32) << 20;
}
}  // namespace

void CpuBackend::decode_weights_placed(int64_t bytes) {
  if (decode_prefetch_ != "auto") return;
  static const int64_t llc = last_level_cache_bytes();
  prefetch_panels_ = bytes > llc / 4 * 3;
}

CpuBackend::~CpuBackend() = default;

// The count every kernel call runs on, from whichever thread (bind_calling_thread); the caller's now.
void CpuBackend::set_threads(int threads) {
  DEW_CHECK(threads > 0, "cpu backend: set_threads(", threads, "): need at least one thread");
  threads_.store(threads, std::memory_order_relaxed);
  omp_set_num_threads(threads);
}

Support CpuBackend::supports(Kernel k, DType dtype) const {
  switch (k) {
    case Kernel::fill:
    case Kernel::cast:
    case Kernel::strided_copy:
    case Kernel::gather_rows:
      return Support::yes();
    default:
      break;
  }
  if (dtype == DType::f32) return Support::yes();
  if (dtype == DType::bf16) return bf16_support(k);  // half.cpp
  if (dtype == DType::i8 && k == Kernel::matmul) return Support::yes();  // int8 decode weights (matmul_rowwise.cpp)
  if (dtype == DType::f16)
    return Support::no(std::string("cpu has no f16 ") + kernel_name(k) +
                       " kernel; f16-mixed runs it through the core's conversion around the f32 kernel "
                       "(core/ops/kernel_call.hpp); bf16 has native cpu kernels");
  if (!is_floating(dtype))
    return Support::no(std::string(kernel_name(k)) + " takes floating tensors; got " + dtype_name(dtype));
  return Support::no(std::string("cpu computes ") + kernel_name(k) + " on f32 tensors only (got " + dtype_name(dtype) +
                     "); cast to f32 ([run] matmul_precision = medium rounds matmul operands to bf16 on CPUs with "
                     "AVX512-BF16), or use the ref backend for f64 gradient checks");
}

// ---- attention: implemented in attention.cpp ----
void CpuBackend::attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                  Tensor& out, Tensor& lse, const AttentionParams& p) {
  if (is_bf16_call(q)) return attention_bf16(isa_, bf16_.attention, q, k, v, segment_ids, out, lse, p);      // half.cpp
  if (bf16_matmul_ && bf16_.attention && attention_medium(isa_, q, k, v, segment_ids, out, lse, p)) return;  // half.cpp
  attention_forward(q, k, v, segment_ids, out, lse, p, isa_);  // f32 q; k, v f32 or bf16 (a bf16 decode cache)
}
void CpuBackend::attention_backward_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                           const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq,
                                           Tensor& dk, Tensor& dv, const AttentionParams& p) {
  if (is_bf16_call(q))
    return attention_backward_bf16(isa_, bf16_.attention, q, k, v, segment_ids, out, lse, dout, dq, dk, dv, p);
  if (bf16_matmul_ && bf16_.attention &&
      attention_backward_medium(isa_, q, k, v, segment_ids, out, lse, dout, dq, dk, dv, p))
    return;
  cpu::attention_backward(q, k, v, segment_ids, out, lse, dout, dq, dk, dv, p, isa_);
}
// f32 q over an f32 or bf16 cache (a decode step, the served rows): every row in one call (attention.cpp); a bf16 q
// (a model computing in bf16), or option slot_attention = rows, row by row through attention_kernel above.
void CpuBackend::attention_slots_kernel(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                                        const std::vector<int64_t>& slots, const std::vector<int64_t>& positions,
                                        Tensor& k_cache, Tensor& v_cache, Tensor& out, const AttentionParams& p) {
  if (is_bf16_call(q) || !fused_slot_attention_)
    return attention_slots_each(*this, q, k_new, v_new, slots, positions, k_cache, v_cache, out, p);
  check_attention_slots(q, k_new, v_new, slots, positions, k_cache, v_cache, out, "cpu");
  attention_slots_forward(q, k_new, v_new, slots, positions, k_cache, v_cache, out, p, isa_);
}
void CpuBackend::attention_max_logit_kernel(const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,
                                            const AttentionParams& p) {
  cpu::attention_max_logit(q, k, segment_ids, out, p, isa_);
}

// Which instruction-set path each kernel family takes on this CPU, for `dew-run plugins`: every hand-written
// family follows isa.hpp (the CPU's widest path by default; a backend's `isa` option can force a narrower
// one). oneDNN's primitives (matmul, conv, layer norm, softmax) pick their own ISA at run time.
std::string kernel_paths() {
  const char* path = isa_name(best_isa());
  std::string s = "kernel paths on this CPU (option isa = best):";
  const char* families[] = {"matmul_rowwise", "attention", "elementwise",   "activations", "reduce",
                            "norms",          "softmax",   "cross_entropy", "optimizers",  "rope",
                            "embedding",      "casts",     "gated_residual"};
  for (size_t i = 0; i < sizeof families / sizeof *families; ++i)
    s += std::string(i ? ", " : " ") + families[i] + " " + path;
  // bf16 attention (and f32 attention under matmul_precision = medium): attention_bf16.cpp's vdpbf16ps kernels on
  // the avx512 path where they pay (bf16_dot.cpp), else the f32 kernel (on widened samples for bf16; half.cpp)
  s += std::string(", attention bf16 (and f32 under matmul_precision = medium) ") +
       (best_isa() == Isa::avx512 && bf16_attention_pays() ? "avx512bf16" : std::string("widened ") + path);
  s += "; " + bf16_dot_summary();
  s += std::string("; decode weights in panels of ") + std::to_string(kPanelRows) +
       " rows (f32, bf16, avx512 / avx2 paths; option decode_panels)";
  return s +
         "; oneDNN matmul/conv/layer_norm/softmax: its own run-time choice (weight gradients and bf16 products "
         "split over the threads by dew: option matmul_split)";
}

}  // namespace dew::cpu

#define DEW_CPU_ONEDNN_VERSION \
  "oneDNN " DEW_STR(DNNL_VERSION_MAJOR) "." DEW_STR(DNNL_VERSION_MINOR) "." DEW_STR(DNNL_VERSION_PATCH)

DEW_PLUGIN_WITH_NOTES("cpu", "0.1.0", DEW_CPU_ONEDNN_VERSION) {
  registrar.add<dew::Backend>({
      .name = "cpu",
      .description =
          "host backend: oneDNN " DEW_STR(DNNL_VERSION_MAJOR) "." DEW_STR(
              DNNL_VERSION_MINOR) " matmul/conv/norm/softmax + OpenMP kernels (f32; bf16 for mixed precision); " +
          dew::cpu::kernel_paths(),
      .factory = [](const dew::Options& o) { return std::make_shared<dew::cpu::CpuBackend>(o); },
      .probe = []() -> dew::Support {
        return dew::Support::yes();  // any x86-64: the portable path needs nothing past the baseline
      },
      .options =
          {{"threads", "0", "OpenMP threads for cpu kernels and oneDNN (0 = OMP_NUM_THREADS / all cores)"},
           {"cache_mb", "1024",
            "MiB the freed blocks kept for reuse by size may add to the peak of memory in use (0 = no cache)"},
           {"matmul_precision", "highest",
            "f32 matmul/conv precision: highest and high = f32; medium = inputs rounded to bf16, f32 "
            "accumulation, where bf16 products out-run f32 ones on this CPU (option bf16_dot; f32 elsewhere); set "
            "from [run] matmul_precision"},
           {"bf16_dot", "auto",
            "bf16 arithmetic (bf16-mixed tensors, matmul_precision = medium): auto = natively where it out-runs f32 "
            "on this CPU (vdpbf16ps measured against the f32 FMA at load, or oneDNN with AMX), else widened to f32 "
            "(medium then stays f32) | native (needs AVX512-BF16) | widened"},
           {"isa", "best",
            "instruction-set path of the hand-written kernels (every family but oneDNN's): best (the CPU's "
            "widest) | avx512 | avx2 | portable; a path this CPU cannot run is refused"},
           {"decode_panels", "on",
            "on: decode weights (dew-run sample / serve, eval with bf16 weights, dew-bench generate) are laid "
            "out in panels of 32 rows, read as one stream by the decode products; off: they stay row-major"},
           {"slot_attention", "fused",
            "a decode step over a slot cache (dew-run serve's batch, GRPO's rollout): fused = every row's cache "
            "write and attention in one call, the rows' tasks over the threads | rows = row by row through the "
            "attention kernel (the same bits; for measuring)"},
           {"decode_prefetch", "auto",
            "bf16 decode weights in panels prefetched ahead (a hint: no value changes): auto = when the model's "
            "matrices exceed 3/4 of the last-level cache (streamed from memory, not the cache) | on | off"},
           {"matmul_split", "on",
            "on: at 2+ threads an f32 weight gradient's product (A transposed, <= 512 rows of C, >= 1024 summed) "
            "and a bf16-operand product (128+ rows, 2^24+ multiply-adds) run as one single-thread oneDNN product "
            "per thread over a block of C; off: oneDNN splits them"}},
  });
}
