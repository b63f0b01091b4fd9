// dew/backend.hpp — the Backend interface: memory and the kernel algebra (the table in dew/kernel_table.hpp,
// version DEW_KERNEL_ALGEBRA_VERSION in dew/plugin.h, part of every plugin's build fingerprint).
//
// A backend is a device plugin. The core allocates every output before calling a kernel, so kernels
// never allocate tensors; all tensors handed to a kernel are contiguous row-major (data() already
// points at the first element), except a decode weight in panels that the backend asked for
// (decode_panel_rows), which only matmul is handed. Unless a kernel says otherwise:
//  * inputs and outputs have the same floating dtype; index tensors are i32; saved statistics
//    (mean, rstd, lse) are f32 even for f64 inputs on `ref`, except that `ref` keeps them in f64
//    when the inputs are f64 (gradient checks run wholly in double);
//  * outputs are overwritten, never accumulated into ("+=" only where the comment says so);
//  * an output never aliases an input, except the elementwise kernels (unary, binary, cast with equal
//    dtype) whose output may be the same buffer as an input of the same shape, and cross_entropy_backward,
//    whose dlogits may be its logits;
//  * a kernel given a dtype or shape it does not handle throws dew::Error; supports() says so first.
// Shape comments use B batch, T query length, S key length, H heads, D head/feature width, V vocab.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dew/kernel_table.hpp"
#include "dew/plugin.h"  // DEW_KERNEL_ALGEBRA_VERSION
#include "dew/tensor.hpp"

namespace dew {

// The kernels of the algebra, in table order (dew/kernel_table.hpp), then count_.
enum class Kernel : uint16_t {
#define DEW_KERNEL_ENUM_ENTRY_(name, params, args) name,
  DEW_KERNEL_TABLE(DEW_KERNEL_ENUM_ENTRY_)
#undef DEW_KERNEL_ENUM_ENTRY_
  count_
};
const char* kernel_name(Kernel k);
Kernel kernel_from_name(const std::string& name);  // throws UsageError listing the names

// "yes", or "no" with the reason (shown by the conformance suite and the trainer).
struct Support {
  bool ok = true;
  std::string reason;
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

// ---------------------------------------------------------------- kernel parameters

// Activation epilogues of matmul (and the differentiable activations of UnaryOp).
enum class Activation : uint8_t { none, relu, gelu, gelu_tanh, silu };

// out[b] = beta * out[b] + act(alpha * op(A[b]) @ op(B[b]) + bias)   (act != none requires beta == 0)
// A[b] starts at a + b * a_batch_stride; op(A) is [m, k] (stored [k, m] when trans_a).
// B[b] starts at b + b * b_batch_stride; op(B) is [k, n] (stored [n, k] when trans_b).
// A batch stride of 0 broadcasts that operand. out is [batch, m, n] contiguous; bias is [n] or undefined.
struct MatmulParams {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // in elements
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  Activation act = Activation::none;
};

enum class UnaryOp : uint8_t {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  square,
  abs,
  tanh,
  sigmoid,
  relu,
  gelu,
  gelu_tanh,
  silu,
  sin,
  cos,
  reciprocal,
  affine,   // alpha * x + beta
  pow,      // x ^ alpha
  clamp,    // min(max(x, alpha), beta)
  softcap,  // alpha * tanh(x / alpha)
};
struct UnaryParams {
  UnaryOp op = UnaryOp::neg;
  float alpha = 1.0f, beta = 0.0f;
};

// Elementwise with numpy broadcasting: a and b are broadcast (right-aligned) to out's shape.
// Comparisons (eq, gt, lt) write 1 or 0 in out's dtype.
enum class BinaryOp : uint8_t { add, sub, mul, div, maximum, minimum, eq, gt, lt };

// x viewed as [outer, reduce, inner] -> out [outer, inner]. mean divides by reduce; sumsq = sum of squares.
enum class ReduceOp : uint8_t { sum, mean, max, min, sumsq };
struct ReduceParams {
  ReduceOp op = ReduceOp::sum;
  int64_t outer = 1, reduce = 1, inner = 1;
};
// The ops' names as the conformance tool and the profiler print them ("gelu_tanh", "maximum", "sumsq"; "?"
// for a value outside the enum).
const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
const char* reduce_op_name(ReduceOp op);

// A general strided copy between two buffers of the same dtype: for every index tuple of `shape`,
// dst[dst_offset + sum(idx*dst_strides)] = src[src_offset + sum(idx*src_strides)]. Covers permute,
// slice, concat and broadcast-materialise. Offsets and strides are in elements, relative to data().
struct StridedCopyParams {
  Shape shape;
  std::vector<int64_t> src_strides, dst_strides;
  int64_t src_offset = 0, dst_offset = 0;
};

// Rotary frequency scaling for contexts past the pretraining one (Hugging Face's rope_type): each pair's
// frequency theta^(-2i/rotary_dim) is rescaled, the rotation itself is unchanged. linear: every
// frequency / factor (position interpolation). llama3 (Llama 3.1+): wavelengths above
// original_max_position / low_freq_factor divided by factor, below original_max_position / high_freq_factor
// kept, a smooth blend between. yarn: NTK-by-parts, a ramp between interpolation (/ factor) and extrapolation over
// the pairs that turn between beta_fast and beta_slow times within original_max_position (ends rounded to
// whole pairs when truncate). YaRN's attention factor scales the scores, not the rotation: the model sets
// it in AttentionParams::scale (contracts::rope_frequency in dew/kernel_contracts.hpp is the one formula).
enum class RopeScalingKind : int32_t { none, linear, llama3, yarn };
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_position = 8192.0;                 // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  bool truncate = true;                                  // yarn
  bool operator==(const RopeScaling& o) const {          // spelt out: the .cu files read this header as C++17
    return kind == o.kind && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position == o.original_max_position &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow && truncate == o.truncate;
  }
};
const char* rope_scaling_name(RopeScalingKind kind);  // "none", "linear", "llama3", "yarn"

// Rotary embedding on x [B, T, H, D]; rotates the first rotary_dim features of each head in the
// "rotate half" (GPT-NeoX / Hugging Face Llama) pairing: (i, i + rotary_dim/2), frequency
// theta^(-2i/rotary_dim) under `scaling`. positions is i32 [T] (shared by the batch) or [B, T].
// inverse = rotate by -angle (the backward). Features past rotary_dim are copied.
struct RopeParams {
  float theta = 10000.0f;
  int64_t rotary_dim = 0;  // 0 = the whole head
  bool inverse = false;
  RopeScaling scaling;
};

// Scaled dot-product attention. q [B, T, Hq, D]; k, v [B, S, Hkv, D] with Hq % Hkv == 0 (grouped
// query: head h reads kv head h / (Hq/Hkv)); out [B, T, Hq, D]; lse [B, Hq, T] = log-sum-exp of the
// (scaled, capped) scores of each query row, saved for the backward.
// Query t sits at absolute position q_offset + t; key s at position s. Key s is visible to query t when
// (!causal || s <= pos(t)) && (window == 0 || pos(t) - s < window). score = scale * q.k, then
// softcap * tanh(score / softcap) when softcap > 0. A row with no visible key outputs zeros, lse -inf.
// Document masking (packed rows): segment_ids, when defined, is i32 [B, S] (contiguous; q_offset + T <= S)
// giving each key's document; query t belongs to segment_ids[b, q_offset + t], and key s is visible to it
// only when, besides the rule above, seg(s) == seg(t) and seg(t) != 0 (0 = padding, which sees nothing and
// is seen by nothing). Undefined segment_ids = one document. Checked by contracts::check_attention_segments.
// Dtypes: q, k, v, out of one floating dtype; or (forward only) f32 q and out over bf16 k and v, a bf16 decode
// cache (CausalDecoder::set_cache_dtype): K/V are widened exactly as they are read and the arithmetic is that
// of the f32 kernel. supports(attention, bf16) answers for both bf16 forms; a backend that declines bf16 gets
// the core's conversion (k and v widened into f32 temporaries, core/ops/kernel_call.hpp), as ref does.
struct AttentionParams {
  float scale = 1.0f;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  int64_t q_offset = 0;
};

// NCHW convolution. x [N, C, H, W]; w [O, C/groups, KH, KW]; bias [O] or undefined; y [N, O, OH, OW].
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1;
};

// logits [N, V] (f32); targets i32 [N]; loss f32 [N] = lse - logit[target] (0 where target == ignore_index);
// lse f32 [N]. Backward: dlogits = (softmax(logits) - onehot(target)) * dloss[n]; 0 rows where ignored.
struct CrossEntropyParams {
  int64_t ignore_index = -100;
};

// Fused optimizer updates, in place on param and state. grad is multiplied by grad_scale first (global
// norm clipping folds in here). step counts from 1. Decoupled weight decay (AdamW, LAMB).
struct AdamWParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f, grad_scale = 1.0f;
  int64_t step = 1;
};
// One parameter of adamw_update_group: its tensors (as adamw_update's) and its own lr and weight decay (its
// parameter group's); the group's AdamWParams give the rest (betas, eps, grad_scale, step).
struct AdamWSlot {
  Tensor param, grad, m, v;
  float lr = 1e-3f, weight_decay = 0.0f;
};
// One tensor pair of lerp_group: `average` moves toward `target` (an EMA of a model's weights, JEPA's target encoder).
struct LerpSlot {
  Tensor average, target;
};
// PyTorch semantics: g += wd * p; buf = step == 1 ? g : momentum * buf + (1 - dampening) * g;
// g = nesterov ? g + momentum * buf : buf; p -= lr * g. momentum == 0 needs no buffer.
struct SgdParams {
  float lr = 1e-2f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f, grad_scale = 1.0f;
  bool nesterov = false;
  int64_t step = 1;
};
// LAMB (You et al. 2019): the AdamW direction r = m_hat / (sqrt(v_hat) + eps) + wd * p, scaled by the
// trust ratio ||p|| / ||r|| (1 when either norm is 0), p -= lr * ratio * r.
struct LambParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f, weight_decay = 0.0f, grad_scale = 1.0f;
  int64_t step = 1;
};

enum class Distribution : uint8_t { uniform, normal };
// out[i] = philox draw for index offset + i (see dew/random.hpp); uniform in [a, b), normal with mean a, std b.
struct RandomParams {
  Distribution dist = Distribution::uniform;
  uint64_t seed = 0, stream = 0, offset = 0;
  float a = 0.0f, b = 1.0f;
};
// Dropout: element i is kept when philox::uniform(seed, stream, offset + i) >= p; mask[i] = kept ? 1/(1-p) : 0;
// y = x * mask. The backward is dy * mask (a binary mul), so no dropout_backward kernel exists.
struct DropoutParams {
  float p = 0.0f;
  uint64_t seed = 0, stream = 0, offset = 0;
};

// ---------------------------------------------------------------- memory accounting (not kernels)

// What a backend's allocator holds, in bytes as the allocator rounds them (the memory really taken):
// in_use = handed out by allocate() and not yet deallocated; peak = the high-water mark of in_use since
// the backend was made or reset_memory_peak(); reserved = in_use plus what the allocator keeps cached for
// reuse (cpu's block cache, cuda's caching allocator). tracked is false for a backend that does not count
// (a plugin that leaves memory_stats() at its default): then the other fields are 0.
struct MemoryStats {
  bool tracked = false;
  int64_t in_use = 0, peak = 0, reserved = 0;
};

// The counter a backend keeps: allocated()/freed() from its allocate()/deallocate() with the rounded
// sizes; lock-free and thread-safe (data-loader threads may allocate while the step runs).
class MemoryCounter {
 public:
  void allocated(size_t bytes) {
    const int64_t now = in_use_.fetch_add(int64_t(bytes), std::memory_order_relaxed) + int64_t(bytes);
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  void freed(size_t bytes) { in_use_.fetch_sub(int64_t(bytes), std::memory_order_relaxed); }
  void reset_peak() { peak_.store(in_use_.load(std::memory_order_relaxed), std::memory_order_relaxed); }
  // The stats, with `cached` bytes held by the allocator beyond those in use.
  MemoryStats stats(int64_t cached = 0) const {
    MemoryStats s;
    s.tracked = true;
    s.in_use = in_use_.load(std::memory_order_relaxed);
    s.peak = peak_.load(std::memory_order_relaxed);
    s.reserved = s.in_use + cached;
    return s;
  }

 private:
  std::atomic<int64_t> in_use_{0}, peak_{0};
};

// ---------------------------------------------------------------- the interface

class Backend {
 public:
  static constexpr const char* kind = "backend";
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // True when data() pointers are ordinary host memory (ref, cpu).
  virtual bool host_accessible() const = 0;
  virtual Support supports(Kernel k, DType dtype) const = 0;
  virtual void set_threads(int threads) { (void)threads; }
  virtual void synchronize() {}

  // ---- memory ----
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_device(void* dst, const void* src, size_t bytes) = 0;
  // Memory accounting (above): the in-tree backends count every allocate()/deallocate(); the defaults
  // say "not tracked", so a backend plugin that predates them still builds and loads.
  virtual MemoryStats memory_stats() const { return {}; }
  virtual void reset_memory_peak() {}

  // ---- decode weights ----
  // Rows per panel in which this backend's weight-only matmul reads a `dtype` weight fastest (dew/tensor.hpp's
  // tensors in panels; dew/generate.hpp store_matmul_weights_in_panels), or 0 when it multiplies row-major
  // weights only (the default). A backend that answers P > 0 takes such a weight wherever is_weight_only_matmul
  // lets it through (dew/kernel_contracts.hpp), for every m.
  virtual int64_t decode_panel_rows(DType dtype) const {
    (void)dtype;
    return 0;
  }
  // store_matmul_weights_in_panels tells the backend the bytes of the model's matrices (in panels or not, a tied
  // head's embedding included): about what one decode token streams. A backend may read a stream larger than its
  // caches differently (cpu: bf16 panels prefetched ahead, matmul_rowwise.hpp). Values never depend on it.
  // Default: nothing.
  virtual void decode_weights_placed(int64_t bytes) { (void)bytes; }

  // ---- device clock (asynchronous backends; the profiler's) ----
  // device_mark() records a point on the backend's queue without waiting and returns its handle, or -1 when
  // the backend has no device clock (the default: the profiler then synchronises around each call and reads
  // the wall clock). After synchronize(), device_elapsed_ms(a, b) is the device time from mark a to mark b;
  // device_marks_release() lets every handle be reused.
  virtual int64_t device_mark() { return -1; }
  virtual double device_elapsed_ms(int64_t from, int64_t to) {
    (void)from;
    (void)to;
    return 0.0;
  }
  virtual void device_marks_release() {}

  // ---- operands read again ----
  // operand_reuse(true) ... operand_reuse(false) brackets products that read the same operands (a linear layer's
  // backward: dx = g W and dW = g^T x both read g): the core promises that in between no kernel writes memory a matmul
  // of the bracket reads (outputs are fresh tensors, operands stay alive), so a backend may keep work it did on an
  // operand for a later product of the bracket (cpu under matmul_precision = medium: the operand rounded to bf16) and
  // must drop it at operand_reuse(false). Brackets do not nest; the calls come from the thread that runs the products.
  // Default: nothing.
  virtual void operand_reuse(bool open) { (void)open; }

  // ---- sums in products ----
  // True when matmul with beta = 1 (alpha 1, no bias or activation) into an output of `dtype` gives exactly the bits
  // of the product rounded to `dtype` and then added to the output by binary add, for every shape. The core then
  // sums gradients inside backward products (dew/autograd.hpp, accumulation_target) instead of separate add passes,
  // which changes no result; where false it keeps the add. Default false (ref answers true for f64, cpu for f32 on
  // oneDNN's AVX-512 kernels; cuda false until its cuBLASLt epilogue is checked on a GPU).
  virtual bool matmul_beta_adds_rounded(DType dtype) const {
    (void)dtype;
    return false;
  }

  // ---- kernel algebra: one pure virtual per entry of dew/kernel_table.hpp (contracts there) ----
#define DEW_KERNEL_PURE_VIRTUAL_(name, params, args) virtual void name params = 0;
  DEW_KERNEL_TABLE(DEW_KERNEL_PURE_VIRTUAL_)
#undef DEW_KERNEL_PURE_VIRTUAL_
};

// ---- grouped kernels: the shared parts (core/tensor/kernel_groups.cpp) ----
// adamw_update_group's contract, checked alike on every backend: each slot's param, grad, m, v defined, of one float
// dtype and one element count; one dtype across the slots; and no memory written by the call (a param, m or v)
// reached twice (no slot's tensors overlapping another's or each other). Throws dew::Error naming `who`.
void check_adamw_group(const std::vector<AdamWSlot>& slots, const char* who);
// adamw_update_group as adamw_update slot by slot, in order (the same bits by construction): the form of a backend
// whose per-call cost is nothing to save (ref; cpu, where a call costs microseconds next to the memory it streams).
void adamw_update_each(Backend& be, std::vector<AdamWSlot>& slots, const AdamWParams& p);
// lerp_group's contract, checked alike on every backend: each slot's average and target defined, of one float dtype and
// one element count; one dtype across the slots; no average overlapping another slot's average or any target (a
// target may be read by several slots). Throws dew::Error naming `who`.
void check_lerp_group(const std::vector<LerpSlot>& slots, const char* who);
// lerp_group as its definition, slot by slot: binary sub, unary affine (weight, 0), binary add, each rounded to the
// dtype (the same bits by construction): ref's form, and every backend's for a dtype it has no fused pass for.
void lerp_each(Backend& be, std::vector<LerpSlot>& slots, float weight);
// sum_squares_group's contract (one float dtype, out [xs.size()] of it, no input overlapping out). Throws dew::Error.
void check_sum_squares_group(const std::vector<Tensor>& xs, const Tensor& out, const char* who);
// sum_squares_group as reduce per tensor into its element of out (the same bits by construction): ref's and cpu's.
void sum_squares_each_reduce(Backend& be, const std::vector<Tensor>& xs, Tensor& out);
// attention_slots' contract (dew/kernel_table.hpp), checked alike on every backend: the shapes, one float dtype or f32
// q over a bf16 cache, N distinct slots in range and each position inside the cache. Throws dew::Error naming `who`.
void check_attention_slots(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const std::vector<int64_t>& slots,
                           const std::vector<int64_t>& positions, const Tensor& k_cache, const Tensor& v_cache,
                           const Tensor& out, const char* who);
// attention_slots as its definition, row by row: strided_copy of row n's k_new, v_new into its slot, then `attention`
// on q[n] over views of the slot's first positions[n] + 1 keys (causal, q_offset positions[n]): the solo call's
// bits by construction. ref's and cuda's form, and cpu's for the dtypes its fused row tasks do not take.
void attention_slots_each(Backend& be, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                          const std::vector<int64_t>& slots, const std::vector<int64_t>& positions, Tensor& k_cache,
                          Tensor& v_cache, Tensor& out, const AttentionParams& p);
// One row of that definition up to its attention: row i of k_new, v_new (the caches' dtype) written at [slot, pos]
// of the caches [slots, C, Hkv, D] (strided_copy), and views of the slot's first pos + 1 keys and values,
// [1, pos + 1, Hkv, D]. Unchecked: its callers check the rows first.
std::pair<Tensor, Tensor> write_slot_row(Backend& be, const Tensor& k_new, const Tensor& v_new, int64_t i, int64_t slot,
                                         int64_t pos, Tensor& k_cache, Tensor& v_cache);

}  // namespace dew
