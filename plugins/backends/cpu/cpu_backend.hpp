// cpu/cpu_backend.hpp — the `cpu` backend's class and the helpers its kernel files share (internal).
//
// The fast host backend: oneDNN 2.6 primitives for matmul, convolution, layer norm and (log-)softmax,
// hand-written OpenMP + `omp simd` kernels for everything oneDNN 2.6 lacks or does poorly. One file per
// kernel family (entry, memory, elementwise, matmul, conv, norm, softmax, embedding_rope, loss, optim,
// random, residual); attention lives in attention.cpp behind attention.hpp.
// Invariants:
//  * floating kernels compute in f32 (statistics and long reductions accumulate in double); only the
//    dtype-agnostic memory kernels (fill, cast, strided_copy, gather_rows) take other dtypes;
//  * oneDNN primitives are created once per (kernel, shape, params) key and cached in a PrimitiveCache,
//    with their memory objects, which are re-pointed at the caller's buffers on each call (no oneDNN
//    object is created per call); only convolution reorders, into blocked layouts (see conv.cpp);
//  * kernels are deterministic for a given thread count (no atomics; reductions combine per-thread
//    partials in a fixed order);
//  * a kernel runs on the calling thread's OpenMP team, of the backend's thread count whichever thread calls
//    (every entry binds its caller: bind_calling_thread). OpenMP keeps one pool of workers per thread that
//    starts parallel regions, and two pools on a 2-core machine make libgomp stop spinning (a futex sleep and
//    wake per region, ~5x slower regions): a process should run its kernels from one thread (dew-run serve
//    runs its model on the thread that loaded it).
// Built at the x86-64 baseline (loads on any x86-64); the hand-written families are compiled once more per
// instruction-set path and chosen per backend by CPU features and the `isa` option (isa.hpp, isa_clones.hpp).
// The one exception to "f32 in, f32 out at f32 precision": with matmul_precision = medium (PyTorch's
// float32 matmul precision), matmuls and convolutions on CPUs with AVX512-BF16 round their inputs to bf16
// and accumulate in f32.
#pragma once
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "dew/backend.hpp"
#include "dew/dtype.hpp"
#include "dew/error.hpp"
#include "dew/kernel_contracts.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"
#include "isa.hpp"

namespace dew::cpu {

// ---------------------------------------------------------------- primitive cache

// A cache key: a family tag followed by the integers (dims, flags, bit patterns of float params) that
// decide a primitive. Fixed capacity, built on the stack per call: no allocation on the hot path.
struct Key {
  static constexpr int kCapacity = 40;
  std::array<int64_t, kCapacity> v;
  int n = 0;
  explicit Key(int64_t family) { v[size_t(n++)] = family; }
  Key& add(int64_t x) {
    DEW_INTERNAL_ASSERT(n < kCapacity);
    v[size_t(n++)] = x;
    return *this;
  }
  Key& add(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return add(int64_t(u));
  }
  Key& add(const Shape& s) {
    add(int64_t(s.size()));
    for (int64_t d : s) add(d);
    return *this;
  }
  bool operator==(const Key& o) const { return n == o.n && std::equal(v.begin(), v.begin() + n, o.v.begin()); }
};
struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < k.n; ++i) {
      h ^= uint64_t(k.v[size_t(i)]);
      h *= 0x100000001b3ull;
      h ^= h >> 29;
    }
    return size_t(h);
  }
};
enum Family : int64_t { kMatmul = 1, kConvFwd, kConvBwdData, kConvBwdWeight, kLnFwd, kLnBwd, kSoftmaxFwd, kSoftmaxBwd };
// Families of the bf16 kernels (half.cpp), numbered apart so the f32 list can grow.
enum HalfFamily : int64_t { kMatmulBf16 = 1001, kMatmulBf16Widened = 1002 };

// Type-erased, thread-safe map from Key to a cached entry (a struct holding primitives and descs).
// Entries are never evicted: a training run uses a fixed, small set of shapes.
class PrimitiveCache {
 public:
  template <class T, class Make>
  std::shared_ptr<T> get(const Key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return std::static_pointer_cast<T>(it->second);
    std::shared_ptr<T> e = make();
    map_.emplace(key, e);
    return e;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<void>, KeyHash> map_;
};

// The oneDNN state a backend owns: one CPU engine, one in-order stream, the primitive cache.
struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  PrimitiveCache cache;
  // Products split over the threads by dew: f32 weight gradients, bf16 products (matmul.cpp's top comment;
  // option matmul_split).
  bool split_products = true;
};

// A cached primitive with its execution arguments: the memory objects are created once (without data)
// and re-pointed at the caller's buffers on every call, so a call allocates nothing. The mutex makes
// concurrent calls on the same entry safe (they serialise; oneDNN already uses every thread).
struct BoundPrimitive {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  std::mutex mu;
  void arg(const Dnnl& d, int id, const dnnl::memory::desc& md) {
    args.emplace(id, dnnl::memory(md, d.eng, DNNL_MEMORY_NONE));
  }
  // Under `mu`: point every argument at its buffer (pairs with id 0 are absent optional arguments),
  // execute on `strm` (the backend's, or a thread's own: MatmulEntry::run_parts), wait.
  void run(dnnl::stream& strm, std::initializer_list<std::pair<int, const void*>> buffers) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [id, p] : buffers)
      if (id != 0) args.at(id).set_data_handle(const_cast<void*>(p));
    prim.execute(strm, args);
    strm.wait();
  }
  void run(Dnnl& d, std::initializer_list<std::pair<int, const void*>> buffers) { run(d.strm, buffers); }
};

// cos/sin of pos * theta^(-2i/rotary_dim) (under the RoPE scaling) for pos in [0, positions), i in
// [0, rotary_dim/2), computed in double once per (theta, rotary_dim, scaling) and grown on demand; rows are
// [cos(half) | sin(half)].
struct RopeTable {
  int64_t positions = 0, half = 0;
  std::vector<float> cs;
};
class RopeTables {
 public:
  // A table covering positions [0, max_pos]; shared_ptr so a concurrent grow cannot free it under a reader.
  std::shared_ptr<const RopeTable> get(float theta, int64_t rotary_dim, const RopeScaling& scaling, int64_t max_pos);

 private:
  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const RopeTable>, KeyHash> tables_;
};

// ---------------------------------------------------------------- shared helpers

// Work (in elements) below which a kernel stays on one thread: a parallel region costs ~1-5 us.
inline constexpr int64_t kParallelGrain = 1 << 14;
inline bool parallel_worth(int64_t work) { return work >= kParallelGrain && omp_get_max_threads() > 1; }
// Whether a region asked for (`wanted`) would have more than one thread. A region costs even when its `if`
// clause is false or the team is one thread: libgomp still builds a team, and the barrier that closes it
// wakes waiters with a futex system call (unconditionally), which measured ~7 % of a bf16-weight decode token
// on the Zen 5 VM of session 20 (docs/benchmarks.md; perf: rope, rms_norm, strided_copy, attention). So the
// kernels on a decode token's path run their body on the caller's thread, entering no OpenMP construct, unless
// this holds (the same arithmetic per row or task either way: only who computes what changes).
inline bool team_of_many(bool wanted) { return wanted && omp_get_max_threads() > 1; }
// Per-thread double partials of `width` columns (a column sum split by rows: each thread adds its rows into its own
// copy, and the copies are added in thread order). Each copy starts on its own 64-byte line and spans whole lines, so
// two threads never write one cache line: in a plain [threads x width] array whose base is not line-aligned the line
// at each boundary is shared, and a kernel that updates every column once a row wrote it from both cores on every row
// (char-small's rms_norm_backward, [2048, 384]: 3.76 ms a step at 1 thread, 4.40 at 2 before, 3.39 after).
class ThreadPartials {
 public:
  ThreadPartials(int threads, int64_t width)
      : stride_((std::max<int64_t>(width, 1) + 7) / 8 * 8), buf_(size_t(threads) * size_t(stride_) + 8, 0.0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(buf_.data());
    base_ = buf_.data() + ((64 - at % 64) % 64) / sizeof(double);  // the first 64-byte boundary
  }
  ThreadPartials(const ThreadPartials&) = delete;  // base_ points into buf_
  ThreadPartials& operator=(const ThreadPartials&) = delete;
  double* of(int thread) const { return base_ + size_t(thread) * size_t(stride_); }

 private:
  int64_t stride_;
  std::vector<double> buf_;
  double* base_;
};

// Calls body(lo, hi) over [0, n): one contiguous block per OpenMP thread when team_of_many(parallel), else
// body(0, n) on the caller's thread (no region). For rows, tasks: blocks start anywhere (for_blocks: elements).
template <class F>
inline void for_rows(int64_t n, bool parallel, F&& body) {
  if (!team_of_many(parallel)) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    if (lo < hi) body(lo, hi);
  }
}
// Calls body(lo, hi) over [0, n): on one contiguous block per OpenMP thread when `parallel` (blocks start
// at multiples of 16 elements), else once on the caller's thread. Let the body call a function that takes
// its pointers and scalars by value and carries the `#pragma omp simd` loop: floats captured by a lambda
// that also goes to a parallel region are address-taken, may alias the loop's float stores, and GCC 12 then
// leaves the loop scalar — as it did the serial path of `#pragma omp parallel for simd if (...)`, which made
// AdamW 3.6x slower on one thread (17.6 against 4.9 ms for the DiT's 7.4 M parameters).
template <class F>
inline void for_blocks(int64_t n, bool parallel, F&& body) {
  if (!parallel || omp_get_max_threads() == 1) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = t == 0 ? 0 : (n * t / nt) & ~int64_t(15);
    const int64_t hi = t == nt - 1 ? n : (n * (t + 1) / nt) & ~int64_t(15);
    if (lo < hi) body(lo, hi);
  }
}

// Rows [begin, end) of a coalesced two-operand walk (dew/kernel_contracts.hpp's StridedPair: every axis but the
// last is an outer one, the last the row): calls row(r, a, b) with row r's offsets along plan.a and plan.b, in
// order. `begin` is decomposed once into the outer multi-index, which then steps like an odometer (strided_copy,
// the broadcasting binary kernel).
template <class F>
inline void walk_rows(const std::vector<int64_t>& shape, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb,
                      int64_t begin, int64_t end, F&& row) {
  const int m = int(shape.size());
  std::vector<int64_t> idx(size_t(std::max(m - 1, 1)), 0);
  int64_t rem = begin, ao = 0, bo = 0;
  for (int d = m - 2; d >= 0; --d) {
    idx[size_t(d)] = rem % shape[size_t(d)];
    rem /= shape[size_t(d)];
    ao += idx[size_t(d)] * sa[size_t(d)];
    bo += idx[size_t(d)] * sb[size_t(d)];
  }
  for (int64_t r = begin; r < end; ++r) {
    row(r, ao, bo);
    for (int d = m - 2; d >= 0; --d) {
      ++idx[size_t(d)];
      ao += sa[size_t(d)];
      bo += sb[size_t(d)];
      if (idx[size_t(d)] < shape[size_t(d)]) break;
      ao -= sa[size_t(d)] * shape[size_t(d)];
      bo -= sb[size_t(d)] * shape[size_t(d)];
      idx[size_t(d)] = 0;
    }
  }
}

// Throws unless t is defined and f32 (the dtype every compute kernel of this backend takes).
void require_f32(const Tensor& t, const char* kernel, const char* arg);
// Throws unless t is defined and bf16 (every data tensor of a bf16 call; half.cpp).
void require_bf16(const Tensor& t, const char* kernel, const char* arg);
// Throws unless every defined tensor of `ts` is bf16 (a bf16 call's data tensors, optional ones included).
void require_bf16_if_defined(std::initializer_list<const Tensor*> ts, const char* kernel);
void require_i32(const Tensor& t, const char* kernel, const char* arg);
// ---- bf16 arithmetic on this CPU (bf16_dot.cpp: the measurement and why) ----
// The CPU runs AVX512-BF16 (with the F, BW and VL subsets).
bool cpu_has_avx512_bf16();
// ... and oneDNN may use it for bf16 products (its ISA cap counts).
bool cpu_has_bf16_dot();
// vdpbf16ps's flop rate over vfmadd231ps's on this core, measured once per process (0 without AVX512-BF16).
double bf16_dot_rate();
// oneDNN's products may use AMX tiles on this CPU.
bool onednn_has_amx();
// bf16 arithmetic runs natively where vdpbf16ps reaches this multiple of the f32 FMA flop rate (Zen 5: ~2; Emerald
// Rapids without AMX: 0.49).
constexpr double kNativeBf16Rate = 1.25;
// oneDNN's bf16 products beat the f32 products of their widened operands here (the rate above, or AMX).
bool bf16_products_pay();
// attention_bf16.cpp's vdpbf16ps kernels beat the f32 kernel on widened operands here (the rate above).
bool bf16_attention_pays();
// Which bf16 work a backend runs natively: option bf16_dot = auto (the two above), native (both, on a CPU with
// AVX512-BF16 that oneDNN may use; refused elsewhere) or widened (neither).
struct Bf16Choice {
  bool products = false, attention = false;
};
Bf16Choice bf16_choice(const std::string& option);
// One line for `dew-run plugins`: what auto chooses here and the measured rate.
std::string bf16_dot_summary();
// One line naming the ISA path each kernel family takes on this CPU (entry.cpp; `dew-run plugins`).
std::string kernel_paths();
// Product of the leading dims ("rows") and the last dim of t (dew/kernel_contracts.hpp).
using contracts::last_dim;
using contracts::rows_of;

// e^x / 2^n for x = n ln 2 + r (n the integer nearest x log2 e): Cephes' two-part ln 2 reduction and degree-6
// polynomial, shared by fast_exp and act_exp (the same operations, so the same bits).
[[gnu::always_inline]] inline float exp_reduced(float x, float n) {
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}
// exp(x) for f32 that vectorises under `omp simd` (Cephes-style range reduction + degree-6 polynomial,
// ~1-2 ulp); overflow -> inf, gradual underflow to denormals and 0, NaN -> NaN. Branch-free.
[[gnu::always_inline]] inline float fast_exp(float x) {
  float xc = x > -104.0f ? x : -104.0f;  // NaN -> -104 here; restored by the last select
  xc = xc < 88.8f ? xc : 88.8f;
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  const float p = exp_reduced(xc, n);
  // 2^n as two normal factors so n in [-150, 128] needs no special cases.
  const int32_t ni = int32_t(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  const float res = (p * s1) * s2;
  return x == x ? res : x;
}
// tanh (Cephes tanhf, ~2 ulp): an odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above;
// exact limits at +-inf, NaN -> NaN. Both branches are computed and blended, so it vectorises.
[[gnu::always_inline]] inline float fast_tanh(float x) {
  const float ax = std::fabs(x);
  const float s = x * x;
  const float poly =
      ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s + 1.33314422036e-1f) * s -
       3.33332819422e-1f) *
          s * x +
      x;
  const float big = std::copysign(1.0f - 2.0f / (fast_exp(2.0f * ax) + 1.0f), x);
  return ax < 0.625f ? poly : big;
}
[[gnu::always_inline]] inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// The forward of the MLP activations SiLU and GELU-tanh as the elementwise family computes them
// (elementwise.cpp: v s with s = 1 / (1 + exp(-z)), z = v for SiLU, z = 2 sqrt(2/pi) (v + c v^3) for
// GELU-tanh; exp(-z) capped at exp(80)); the row-wise products' epilogue (matmul_rowwise.cpp) uses the same
// expressions, so a fused activation gives the elementwise op's bits.
// act_arg(NaN) is 80, so act_exp never sees a NaN (a NaN v still gives NaN: v / (1 + e)).
[[gnu::always_inline]] inline float act_arg(float z) { return z < 80.0f ? z : 80.0f; }
// e^z for z = act_arg(...) <= 80: fast_exp's range reduction and polynomial without its guards (no clamps, no NaN
// select, one scale 2^n instead of two: 2^n's bits are those of the rounding sum t shifted, n in [-126, 116]),
// and 0 below -87. For z in [-87, 80] these are fast_exp's bits (the one product p 2^n rounds as fast_exp's
// two do: the first of those is exact); below, fast_exp gives at most e^-87 ~ 1.6e-38, which 1 + e and every
// gradient term drop anyway (an element's result differs only past |v| ~ 1e10). About half the instructions
// of fast_exp's vector loop: GELU-tanh forward and backward were ALU-bound on it (DiT step, session 19).
[[gnu::always_inline]] inline float act_exp(float z) {
  const float kRound = 12582912.0f;  // 1.5 * 2^23: t's low mantissa bits hold n + 0x400000
  const float t = z * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const float p = exp_reduced(z, n);
  uint32_t tb;
  std::memcpy(&tb, &t, 4);
  const uint32_t sb = (tb + 127u) << 23;  // (0x4B400000 + n + 127) << 23 = (n + 127) << 23 (mod 2^32)
  float scale;
  std::memcpy(&scale, &sb, 4);
  const float e = p * scale;
  return z < -87.0f ? 0.0f : e;
}
[[gnu::always_inline]] inline float silu_value(float v) { return v / (1.0f + act_exp(act_arg(-v))); }
[[gnu::always_inline]] inline float gelu_tanh_value(float v) {
  return v / (1.0f + act_exp(act_arg(-2.0f * 0.79788456080286536f * (v + 0.044715f * v * v * v))));
}

// ---------------------------------------------------------------- the backend

// Reuses freed blocks of the same rounded size (>= kMinBytes: every block, sizes being multiples of 64)
// instead of returning them to the C library: a training step allocates the same sizes every step, and
// fresh large blocks cost page faults (~7 % of a char-small step measured with perf; with a 50,304-token
// vocabulary the kernel's page clearing was 22 % of the step, its logits and their gradient 412 MB each); a
// decode token makes ~100 small tensors (a row of activations, scores, positions), which then come from here
// instead of malloc / free (whose consolidation of freed chunks showed up at ~3.5 % of a bf16 decode token).
// What it keeps (limit 0: nothing): every freed block, while the footprint (memory in use plus cached) stays
// within the high-water mark of the memory in use plus `limit` (the cache's own mark: reset_memory_peak() lowers
// the backend's reported peak, not this, so a validation after a reset does not evict a step's blocks): a free does
// not change the footprint, and before
// a block that is not cached is made fresh, make_room() frees cached blocks, the largest first, until the
// footprint with the new block fits again. The slack is needed because the cache reuses a block for its own size
// only: a step's sizes peak at different times. A steady training step thus takes every block from the cache
// (with a 50,304-token vocabulary the old rule, at most `limit` cached whatever the peak, freed the logits'
// gradient at every step), and a run whose sizes change (serving, evaluation) never holds more than its peak
// need plus `limit`. When the system still refuses a fresh block, release() frees everything cached and the
// allocation is tried again. Thread-safe. Frees everything it holds when destroyed (the backend outlives every
// Storage: each holds a reference to it).
class BlockCache {
 public:
  static constexpr size_t kMinBytes = 64;
  explicit BlockCache(size_t limit) : limit_(limit) {}
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  void* take(size_t rounded);          // nullptr when none is cached
  bool give(void* p, size_t rounded);  // false: not cached (no cache), the caller frees it
  // Before a fresh block of `rounded` bytes, with `in_use` bytes handed out: frees cached blocks until the
  // footprint with it fits the cap (or nothing is cached).
  void make_room(size_t rounded, size_t in_use);
  void note_in_use(size_t in_use);  // after an allocation: the high-water mark
  void release();                   // frees every cached block
  size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0, limit_;
  std::atomic<size_t> high_water_{0};
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Options& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }
  Support supports(Kernel k, DType dtype) const override;
  void set_threads(int threads) override;
  void synchronize() override {}

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;
  // In use: blocks handed out (at their rounded size); reserved adds the blocks the BlockCache keeps.
  MemoryStats memory_stats() const override { return memory_.stats(int64_t(blocks_->cached_bytes())); }
  void reset_memory_peak() override { memory_.reset_peak(); }
  // f32 and bf16 decode weights in panels of kPanelRows (matmul_rowwise.hpp), unless option decode_panels = off.
  int64_t decode_panel_rows(DType dtype) const override;
  // Option decode_prefetch = auto: bf16 panels are prefetched ahead once the model's matrices exceed 3/4 of the
  // last-level cache (entry.cpp, last_level_cache_bytes; matmul_rowwise.hpp, panel_dot_bf16); on / off: always / never.
  void decode_weights_placed(int64_t bytes) override;
  bool prefetch_panels() const { return prefetch_panels_.load(std::memory_order_relaxed); }
  // Under matmul_precision = medium, a bracket's products reuse an operand's bf16 rounding (matmul.cpp).
  void operand_reuse(bool open) override;
  bool matmul_beta_adds_rounded(DType dtype) const override;

  // The kernel algebra, one entry per kernel of dew/kernel_table.hpp: the override binds the calling thread, then
  // runs <kernel>_kernel, defined in the family files.
#define DEW_CPU_KERNEL_ENTRY_(name, params, args) \
  void name params override {                     \
    bind_calling_thread();                        \
    name##_kernel args;                           \
  }                                               \
  void name##_kernel params;
  DEW_KERNEL_TABLE(DEW_CPU_KERNEL_ENTRY_)
#undef DEW_CPU_KERNEL_ENTRY_

  // OpenMP's team size is a setting of each thread (omp_set_num_threads sets the caller's only), so a kernel
  // called from another thread than the one that called set_threads (serve's scheduler, a test's worker) would
  // run on OMP_NUM_THREADS or every core. Every entry first gives its caller this backend's count (one
  // thread-local read when it already has it). Inside a parallel region it leaves the region's setting alone.
  void bind_calling_thread() const {
    const int t = threads_.load(std::memory_order_relaxed);
    if (omp_get_max_threads() != t && !omp_in_parallel()) omp_set_num_threads(t);
  }

  Dnnl& dnnl() { return *dnnl_; }
  // True when matmuls and convolutions round their inputs to bf16 ([run] matmul_precision = medium where bf16
  // products pay: bf16_choice; see matmul.cpp, conv.cpp).
  bool bf16_matmul() const { return bf16_matmul_; }
  // bf16 products (bf16 tensors, medium's rounded operands) on oneDNN's bf16 kernels, else widened to f32.
  bool bf16_products() const { return bf16_.products; }
  // bf16 attention (bf16 tensors, medium's rounded q, k, v) on attention_bf16.cpp's kernels, else widened to f32.
  bool bf16_attention() const { return bf16_.attention; }
  // The instruction-set path of the kernels that dispatch per backend (the row-wise matmul): the widest
  // this CPU runs, capped by the `isa` option (isa.hpp).
  Isa isa() const { return isa_; }
  RopeTables& rope_tables() { return rope_tables_; }

 private:
  std::unique_ptr<Dnnl> dnnl_;
  std::atomic<int> threads_{1};  // the team size of every kernel call (set_threads; bind_calling_thread)
  bool bf16_matmul_ = false;
  Bf16Choice bf16_;
  Isa isa_ = Isa::portable;
  bool decode_panels_ = true;
  bool fused_slot_attention_ = true;  // option slot_attention: attention_slots' rows in one call (attention.cpp)
  std::string decode_prefetch_ = "auto";      // option decode_prefetch: auto | on | off
  std::atomic<bool> prefetch_panels_{false};  // decode_weights_placed's choice (read by every decode product)
  std::unique_ptr<BlockCache> blocks_;
  MemoryCounter memory_;
  RopeTables rope_tables_;
};

// ---------------------------------------------------------------- bf16 kernels (half.cpp)
// What cpu runs natively in bf16 (decided at run time by the CPU's features); supports() answers with it.
Support bf16_support(Kernel k);
// cast between f32 and bf16, vectorised, on ISA path `isa` (convert.cpp); false for other dtype pairs.
bool cast_bf16_fast(Isa isa, const Tensor& x, Tensor& out);
// out = a (add | sub | mul) b for bf16 tensors of one size, in f32 per element (convert.cpp); false otherwise.
bool binary_bf16_same_shape(Isa isa, const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op);
// The dtype-independent checks of a matmul call (bias length, dimensions, epilogue, out and batch sizes);
// the f32 path (matmul.cpp) and the bf16 path (half.cpp) check their dtypes first, then call this.
void check_matmul_shapes(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out,
                         const MatmulParams& p);
// The cached oneDNN matmul primitive with the fused epilogue (matmul.cpp's top comment), for A and B of
// dtype `operands` and bias and C of dtype `output`: f32 / f32 (the f32 path), bf16 / f32 (matmul_precision
// = medium), bf16 / bf16 (half.cpp's bf16 kernel).
struct MatmulEntry : BoundPrimitive {
  dnnl::memory::desc a_md, b_md, c_md, bias_md;
  int bias_arg = 0;  // DNNL_ARG_BIAS, or the binary_add post-op's source when alpha != 1
  // Row strides (floats) of padded scratch copies the primitive reads A / B from instead of the caller's
  // buffers; 0 where the caller's buffer is read as is (matmul.cpp's top comment: oneDNN's AVX2 no-copy
  // sgemm on row strides that are multiples of 256 floats).
  int64_t a_ld = 0, b_ld = 0;
  // > 0: the primitive multiplies one matrix and run_matmul calls it this many times, stepping A, B and C by
  // these byte strides (matmul.cpp's top comment: oneDNN 2.6's AMX kernel on batched B stored [n, k]).
  int64_t batches = 0, a_step = 0, b_step = 0, c_step = 0;
  // Non-empty: the product runs as these parts instead, part i on OpenMP thread i, each a primitive planned for
  // one thread over a block of C's rows (parts_along_m) or columns, part_size of them (the last part takes the
  // rest), reading A, B and C in place with the whole product's strides (matmul.cpp's top comment: products
  // split over the threads). A part's primitive takes a user scratchpad of scratchpad_bytes (per thread).
  std::vector<std::shared_ptr<MatmulEntry>> parts;
  bool parts_along_m = true;
  int64_t part_size = 0;
  size_t scratchpad_bytes = 0;
  // A split product's: element sizes in bytes of A and B (the operands) and of C and the bias (the output), its
  // k, n and transposes: the parts' offsets.
  int64_t operand_bytes = 4, output_bytes = 4, k = 0, n = 0;
  bool trans_a = false, trans_b = false;
  // out = A B (+ bias): one execution, `batches` of them, or the parts over the threads.
  void run_matmul(Dnnl& d, const void* a, const void* b, void* c, const void* bias) {
    if (!parts.empty()) return run_parts(d, a, b, c, bias);
    if (batches == 0) return run(d, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {bias_arg, bias}});
    for (int64_t i = 0; i < batches; ++i)
      run(d, {{DNNL_ARG_SRC, static_cast<const char*>(a) + i * a_step},
              {DNNL_ARG_WEIGHTS, static_cast<const char*>(b) + i * b_step},
              {DNNL_ARG_DST, static_cast<char*>(c) + i * c_step},
              {bias_arg, bias}});
  }
  // The parts, one per thread of an OpenMP team (in turn on fewer threads, e.g. inside a parallel region).
  void run_parts(Dnnl& d, const void* a, const void* b, void* c, const void* bias);
};
std::shared_ptr<MatmulEntry> make_matmul(const Dnnl& d, const MatmulParams& p, bool has_bias,
                                         dnnl::memory::data_type operands, dnnl::memory::data_type output);
// The primitive cache's key of a matmul call in kernel family `family` (the f32 path's, the bf16 kernel's): its
// shape, strides, transposes, bias, epilogue and the thread count (oneDNN plans a primitive for its threads).
Key matmul_key(int64_t family, const MatmulParams& p, bool has_bias);
// The epilogue's activation of one f32 value (the k = 0 paths, which oneDNN does not run).
float activate(float v, Activation act);
// The memory-bound kernels in bf16 that are not written over their storage type (bf16_bits.hpp): blocks of rows
// widened around this backend's f32 kernels (half.cpp), and the bf16 matmul (oneDNN's bf16 kernel, or widened around
// the f32 product where bf16 products do not pay: CpuBackend::bf16_products()).
class CpuBackend;
void matmul_bf16(CpuBackend& be, Dnnl& d, const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                 const MatmulParams& p);
bool is_bf16_call(const Tensor& t);  // t is defined and bf16: the kernel forwards to its *_bf16 variant
void binary_bf16(CpuBackend& be, const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op);
void softmax_like_bf16(CpuBackend& be, const Tensor& x, Tensor& y, bool log);
void softmax_like_backward_bf16(CpuBackend& be, const Tensor& y, const Tensor& dy, Tensor& dx, bool log);
void layer_norm_bf16(CpuBackend& be, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                     Tensor& rstd, float eps);
void layer_norm_backward_bf16(CpuBackend& be, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias);
void cross_entropy_bf16(CpuBackend& be, const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                        const CrossEntropyParams& p);
void cross_entropy_backward_bf16(CpuBackend& be, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p);
// `native`: attention_bf16.cpp's kernels where they cover the call (the backend's bf16_attention()); else, and always
// when false, the f32 kernel on widened samples.
void attention_bf16(Isa isa, bool native, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                    Tensor& out, Tensor& lse, const AttentionParams& p);
void attention_backward_bf16(Isa isa, bool native, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& segment_ids, const Tensor& out, const Tensor& lse, const Tensor& dout,
                             Tensor& dq, Tensor& dk, Tensor& dv, const AttentionParams& p);
// matmul_precision = medium: f32 attention whose products take bf16 operands (half.cpp). Each returns false, having
// done nothing, where the vdpbf16ps kernels do not cover the call (the caller then runs the f32 kernel).
bool attention_medium(Isa isa, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                      Tensor& out, Tensor& lse, const AttentionParams& p);
bool attention_backward_medium(Isa isa, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                               const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                               Tensor& dv, const AttentionParams& p);

}  // namespace dew::cpu
