// cpu/matmul.cpp — batched matmul through oneDNN 2.6 (`dnnl::matmul`), with the epilogue fused.
//
// out[b] = beta * out[b] + act(alpha * op(A[b]) @ op(B[b]) + bias): transposes are expressed as strides
// of plain memory descriptors (no copies, no reorders); a batch stride of 0 becomes a broadcast batch
// dim of 1; alpha is oneDNN's output scale, beta a `sum` post-op, act an `eltwise` post-op
// (gelu = gelu_erf, silu = swish with alpha 1). oneDNN scales the bias too, so with alpha != 1 the bias
// becomes a binary_add post-op instead. Weights stay plain row-major: they change every step,
// so packing them would cost a reorder per call.
// One primitive per (shape, strides, transposes, alpha, beta, act, bias?) is created and cached; a call
// then costs a hash lookup, re-pointing 3-4 cached memory objects at the caller's buffers and the
// execution: nothing is allocated per call.
// With matmul_precision = medium where bf16 products pay (bf16_matmul(): bf16_dot.cpp), A and B are first rounded
// to bf16 (nearest even, one pass over the span each matrix covers, into per-thread scratch kept across
// calls) and multiplied by oneDNN's bf16 kernel with f32 accumulation, f32 bias, epilogue and output:
// PyTorch's "medium" float32 matmul precision. It runs at twice the f32 rate on Zen 4 (oneDNN reads
// ~215 vs ~108 GFLOP/s per core); oneDNN 2.6 ignores fpmath_mode for f32 matmuls, hence the explicit
// copies. The conversion is hand-written (vcvtneps2bf16, 32 floats per instruction, OpenMP over chunks)
// because it sits on every matmul's path.
// Power-of-two row strides on AVX2 CPUs: there oneDNN runs f32 matmuls with gemm:jit, whose AVX2 sgemm
// takes its no-copy kernels (operands read in place) whenever 1/m + 1/n >= 0.0038 (m or n below ~526), and
// the operand those kernels walk along k — A stored [k, m] (trans_a, row stride m), B stored [k, n] (not
// trans_b, row stride n) — thrashes L1 sets when its row stride is a multiple of 256 floats (1 KiB).
// oneDNN's AVX-512 checker declines no-copy on such strides (BAD_LD_MULT = 256); the AVX2 one does not.
// So where the primitive oneDNN picks is "gemm:jit", oneDNN's ISA lacks avx512_core, the operands are f32,
// batch is 1 and the no-copy test holds, such an operand is first copied, row by row into per-thread
// scratch kept across calls, with its row stride padded by 16 floats (one cache line), and the primitive
// reads the copy — when the other operand brings at least 64 rows (A: n >= 64; B: m >= 64): below that,
// at a 1 KiB stride, the copy costs more than it saves. Decided once per cached primitive from the shape,
// oneDNN's implementation and ISA, never from timing, so every run on one machine multiplies the same way
// (the bits differ from the unpadded product's). AVX-512 CPUs (brg:avx512_core) are untouched.
// Measured (AMD EPYC, AVX2 only, 1 thread, 2 MiB-aligned operands as BlockCache hands out, median GFLOP/s
// with the copy; m x k x n as dew-bench --profile labels them): 1024x1024x256 At 34 -> 58, 256x1024x1024 At
// 33 -> 65, 256x1024x256 At 60 -> 65, 1024x1024x256 63 -> 71, 1024x256x256 68 -> 76, 512x512x512 49 -> 72,
// 64x1024x1024 39 -> 72; 16x1024x256 would lose 61 -> 52 (hence the 64). Copy-based shapes (1/m + 1/n <
// 0.0038, e.g. char-small's 384x2048x1024 At, 74 -> 71 padded) would only pay the copy, so they keep the
// caller's buffers.
// oneDNN 2.6's AMX kernel (brg:avx512_core_amx_bf16, Intel Xeon with AMX) gets batched bf16 products with
// B stored [n, k] (trans_b: weights layout acb) wrong at shapes such as 2 x 37x29 @ 29x53, with or without
// bias or an odd k; 2-D products with B [n, k] and batched ones with plain B are right (dew-conformance's
// matmul/bf16_* cases on an H200 machine's Xeon, session 18). So where oneDNN picks an AMX implementation
// for such a batch, the primitive is built for one matrix and executed once per matrix
// (MatmulEntry::run_matmul).
// Products split over the threads by dew (option matmul_split, on by default): at 2+ threads oneDNN 2.6 scales a
// weight gradient (A transposed: C = A^T B summed over the batch's k rows) with few rows of C poorly — 1.6-1.9x at 2
// threads on the Zen 5 for the DiT's and char-small's, where one single-thread primitive per thread over its own block
// of C reaches 2.1-2.4x (each block's working set stays in its core's cache) — and its bf16 products of every kind
// 1.6-1.9x (1.9-2.1x split). So an f32 product with A transposed, batch 1, m <= 512 and k >= 1024, and a bf16-operand
// product (bf16-mixed, matmul_precision = medium) of batch 1, 128+ rows and 2^24+ multiply-adds, is built as parts;
// so is an f32 product of A's rows (batch 1, A not transposed) with 512+ rows, m >= n and at most 2^28 multiply-adds,
// split by rows: the DiT's forward and input-gradient products (1024 rows of 256 or 1024), for the kernels after them
// more than for themselves — each thread then holds the rows its own core wrote, as the row-split kernels that read
// them next (bias column sums, the GELU backward with its bias sum, attention: a contiguous run of rows per thread)
// expect. Alternated `dew-bench train --config dit --threads 2 --profile`, 6 runs each, AMD EPYC Zen 5: the bias
// sums 2.17 -> 1.18 ms a step, the GELU backward 2.20 -> 1.87, the three split product shapes 28.8 -> 26.4, the rest
// within noise (the whole table 102.6 -> 100.2 ms). Char-small's larger products (2048 rows, 2^28.2+ multiply-adds)
// showed no gain (396 -> 401 ms, within noise), hence the bound. A split product is
// one primitive per thread, planned for one thread (oneDNN reads the thread count when a primitive is created), over
// a block of C's rows (m >= n) or columns, a multiple of 16 and at least 64 wide, reading A, B and C in place with the
// whole product's strides; each part takes a user scratchpad of its thread's and a stream of its own, so parts run
// concurrently without sharing oneDNN's library scratchpad. The rule is the shape, the thread count and oneDNN's ISA
// (AVX-512 only: split_parts), never timing; a part sums each element over all k, as the whole product does, but in
// oneDNN's blocking for the part's size, so its bits may differ from the unsplit product's (tests/backends_cpu: equal
// within the product's tolerance, f32, bf16 and medium). The primitive cache's key holds the thread count. Measured:
// docs/benchmarks.md, session 24 (`dew-bench kernels --only matmul`, the At rows, and `dew-bench train` at 2 threads).
// Products of at most 32 rows against a [n, k] weight (trans_b, batch 1, beta 0: Linear layers while
// decoding) take a hand-written row-wise path instead, whose rows do not depend on each other
// (matmul_rowwise.cpp, dispatched by ISA at run time), in f32 whatever the precision.
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <mutex>
#include <string>

#include "cpu_backend.hpp"
#include "matmul_rowwise.hpp"

namespace dew::cpu {

namespace {

using dnnl::memory;
using dims = memory::dims;

dnnl::algorithm eltwise_of(Activation act) {
  switch (act) {
    case Activation::relu:
      return dnnl::algorithm::eltwise_relu;
    case Activation::gelu:
      return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::gelu_tanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::silu:
      return dnnl::algorithm::eltwise_swish;
    default:
      break;
  }
  DEW_CHECK(false, "cpu matmul: unknown activation ", int(act));
  return dnnl::algorithm::undef;
}

}  // namespace

namespace {

// oneDNN's AVX2 sgemm (gemm:jit without avx512_core) takes its no-copy kernels, which read A and B in place,
// whenever 1/m + 1/n >= 0.0038 (nocopy_checker_avx2's first test, the same for any thread count; oneDNN's
// m and n are dew's n and m, which the test does not tell apart). The AVX-512 checker avoids no-copy on row
// strides that are multiples of 256 floats (its BAD_LD_MULT); the AVX2 one does not.
bool avx2_sgemm_nocopy(const dnnl::matmul::primitive_desc& pd, int64_t m, int64_t n) {
  constexpr unsigned kAvx512Core = unsigned(dnnl_cpu_isa_avx512_core);
  if ((unsigned(dnnl::get_effective_cpu_isa()) & kAvx512Core) == kAvx512Core) return false;
  if (std::strcmp(pd.impl_info_str(), "gemm:jit") != 0) return false;  // a const char* in oneDNN 2.6
  return 1.0 / double(m) + 1.0 / double(n) >= 0.0038;
}

// The padded row stride for an operand that the no-copy kernels walk along k with row stride `ld`, read
// against `other` columns (rows) of the other operand; 0 when it is read in place. One cache line more
// than a multiple of 256 floats moves each row to the next L1 set.
int64_t padded_ld(int64_t ld, int64_t other) { return ld % 256 == 0 && other >= 64 ? ld + 16 : 0; }

}  // namespace

namespace {

// Row strides (elements) a primitive reads its operands and writes C with, 0 = dense for its own shape: the padded
// copies (a_ld, b_ld: A stored [k, m] / B stored [k, n]) or a part of a split product (the whole product's strides;
// c_ld: C's row stride), and whether the primitive takes a user scratchpad (a part: run on a pool thread).
struct EntryLayout {
  int64_t a_ld = 0, b_ld = 0, c_ld = 0;
  bool user_scratchpad = false;
};

// The primitive for p in `layout`, its descriptors and bound arguments: the AMX and padding rules (top comment)
// apply here, the split is make_matmul's.
std::shared_ptr<MatmulEntry> make_entry(const Dnnl& d, const MatmulParams& p, bool has_bias, memory::data_type operands,
                                        memory::data_type output, const EntryLayout& layout) {
  auto e = std::make_shared<MatmulEntry>();
  const int64_t m = p.m, n = p.n, k = p.k;
  // oneDNN 2.x applies the output scale after the bias (alpha * (A B + bias)); to get alpha * A B + bias
  // the bias then moves to a binary_add post-op, which runs after the scale (and the sum).
  const bool bias_as_post_op = has_bias && p.alpha != 1.0f;
  bool one_matrix = p.batch == 1;  // a 2-D primitive (also for a batch, run once per matrix: e->batches)
  auto build = [&](int64_t a_ld, int64_t b_ld) {
    const dims a_inner_strides = p.trans_a ? dims{1, a_ld ? a_ld : m} : dims{k, 1};
    const dims b_inner_strides = p.trans_b ? dims{1, k} : dims{b_ld ? b_ld : n, 1};
    if (one_matrix) {
      e->a_md = memory::desc({m, k}, operands, a_inner_strides);
      e->b_md = memory::desc({k, n}, operands, b_inner_strides);
      e->c_md = memory::desc({m, n}, output, dims{layout.c_ld ? layout.c_ld : n, 1});
      if (has_bias) e->bias_md = memory::desc({1, n}, output, dims{n, 1});
    } else {
      const int64_t ab = p.a_batch_stride == 0 ? 1 : p.batch, bb = p.b_batch_stride == 0 ? 1 : p.batch;
      e->a_md =
          memory::desc({ab, m, k}, operands,
                       dims{p.a_batch_stride == 0 ? m * k : p.a_batch_stride, a_inner_strides[0], a_inner_strides[1]});
      e->b_md =
          memory::desc({bb, k, n}, operands,
                       dims{p.b_batch_stride == 0 ? k * n : p.b_batch_stride, b_inner_strides[0], b_inner_strides[1]});
      e->c_md = memory::desc({p.batch, m, n}, output, dims{m * n, n, 1});
      if (has_bias) e->bias_md = memory::desc({1, 1, n}, output, dims{n, n, 1});
    }
    dnnl::primitive_attr attr;
    if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
    dnnl::post_ops po;
    if (p.beta != 0.0f) po.append_sum(p.beta);
    if (bias_as_post_op) po.append_binary(dnnl::algorithm::binary_add, e->bias_md);
    if (p.act != Activation::none)
      po.append_eltwise(1.0f, eltwise_of(p.act), p.act == Activation::silu ? 1.0f : 0.0f, 0.0f);
    attr.set_post_ops(po);
    if (layout.user_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::matmul::desc desc = has_bias && !bias_as_post_op
                                        ? dnnl::matmul::desc(e->a_md, e->b_md, e->bias_md, e->c_md)
                                        : dnnl::matmul::desc(e->a_md, e->b_md, e->c_md);
    return dnnl::matmul::primitive_desc(desc, attr, d.eng);
  };
  dnnl::matmul::primitive_desc pd = build(layout.a_ld, layout.b_ld);
  // The AMX rule (top comment): batched bf16 with B stored [n, k] runs as one 2-D product per matrix.
  // DEW_CPU_MATMUL_PER_MATRIX=1 takes this path on any CPU (the test that runs it without AMX).
  static const bool forced = [] {
    const char* v = std::getenv("DEW_CPU_MATMUL_PER_MATRIX");
    return v != nullptr && std::string(v) == "1";
  }();
  if (p.batch > 1 && p.trans_b && operands == memory::data_type::bf16 &&
      (forced || std::string(pd.impl_info_str()).find("amx") != std::string::npos)) {
    one_matrix = true;
    pd = build(0, 0);
    const int64_t out_size = output == memory::data_type::bf16 ? 2 : 4;
    e->batches = p.batch;
    e->a_step = p.a_batch_stride * 2;
    e->b_step = p.b_batch_stride * 2;
    e->c_step = m * n * out_size;
  }
  // The padding rule (top comment): f32, one matrix, and oneDNN's AVX2 sgemm in its no-copy mode.
  if (operands == memory::data_type::f32 && p.batch == 1 && !layout.user_scratchpad && avx2_sgemm_nocopy(pd, m, n)) {
    e->a_ld = p.trans_a ? padded_ld(m, n) : 0;
    e->b_ld = p.trans_b ? 0 : padded_ld(n, m);
    if (e->a_ld || e->b_ld) pd = build(e->a_ld, e->b_ld);
  }
  e->prim = dnnl::matmul(pd);
  e->arg(d, DNNL_ARG_SRC, e->a_md);
  e->arg(d, DNNL_ARG_WEIGHTS, e->b_md);
  e->arg(d, DNNL_ARG_DST, e->c_md);
  if (has_bias) {
    e->bias_arg =
        bias_as_post_op ? (DNNL_ARG_ATTR_MULTIPLE_POST_OP(p.beta != 0.0f ? 1 : 0) | DNNL_ARG_SRC_1) : DNNL_ARG_BIAS;
    e->arg(d, e->bias_arg, e->bias_md);
  }
  if (layout.user_scratchpad) {
    const memory::desc sp = pd.scratchpad_desc();
    e->scratchpad_bytes = sp.get_size();
    if (e->scratchpad_bytes > 0) e->arg(d, DNNL_ARG_SCRATCHPAD, sp);
  }
  return e;
}

// The split rule (top comment), at 2+ threads and batch 1: an f32 weight gradient (A transposed: C = A^T B summed over
// k rows) of at most 512 rows of C over at least 1024 summed rows; any bf16-operand product of at least 2^24
// multiply-adds with 128+ rows of C; an f32 product of A's rows (not transposed) with 512+ rows of C, no more columns
// than rows and at most 2^28 multiply-adds (split by rows). Parts along the larger of C's two sides (rows on a tie), as
// many as the threads, of a multiple of 16 and at least 64 rows / columns each. 0 parts: no split. Only where oneDNN
// runs AVX-512 (its brgemm kernels): below that its gemm:jit parts read 1 KiB-strided operands in place (the padding
// rule above), and a split 384x2048x1024 At ran at 90 GFLOP/s against 177-188 whole (the Zen 5 capped to AVX2 by
// ONEDNN_MAX_CPU_ISA).
int64_t split_parts(const Dnnl& d, const MatmulParams& p, bool bf16, int64_t& part_size, bool& along_m) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  constexpr unsigned kAvx512Core = unsigned(dnnl_cpu_isa_avx512_core);
  if (!d.split_products || threads < 2 || p.batch != 1 ||
      (unsigned(dnnl::get_effective_cpu_isa()) & kAvx512Core) != kAvx512Core)
    return 0;
  const double macs = double(p.m) * double(p.n) * double(p.k);
  const bool weight_grad = p.trans_a && p.m <= 512 && p.k >= 1024;
  const bool bf16_product = bf16 && p.m >= 128 && macs >= double(1 << 24);
  const bool row_product = !bf16 && !p.trans_a && p.m >= 512 && p.m >= p.n && macs <= double(1 << 28);
  if (!weight_grad && !bf16_product && !row_product) return 0;
  along_m = p.m >= p.n;
  const int64_t side = along_m ? p.m : p.n;
  const int64_t parts = std::min<int64_t>(threads, side / 64);
  if (parts < 2) return 0;
  part_size = (side + parts - 1) / parts;
  part_size = (part_size + 15) / 16 * 16;
  return (side + part_size - 1) / part_size;
}

}  // namespace

// A and B of dtype `operands` (same strides either way), bias and C of dtype `output`.
std::shared_ptr<MatmulEntry> make_matmul(const Dnnl& d, const MatmulParams& p, bool has_bias,
                                         memory::data_type operands, memory::data_type output) {
  int64_t part_size = 0;
  bool along_m = true;
  const int64_t parts = split_parts(d, p, operands == memory::data_type::bf16, part_size, along_m);
  if (parts == 0) return make_entry(d, p, has_bias, operands, output, EntryLayout{});
  // A split product has no primitive of its own, only the parts (the AMX and padding rules never meet the split:
  // it takes batch 1 and oneDNN's avx512_core).
  auto e = std::make_shared<MatmulEntry>();
  e->parts_along_m = along_m;
  e->part_size = part_size;
  e->operand_bytes = operands == memory::data_type::bf16 ? 2 : 4;
  e->output_bytes = output == memory::data_type::bf16 ? 2 : 4;
  e->k = p.k;
  e->n = p.n;
  e->trans_a = p.trans_a;
  e->trans_b = p.trans_b;
  // Each part's primitive is planned for one thread (oneDNN reads the OpenMP thread count when it is created); the
  // caller's count comes back however this ends (oneDNN may throw).
  struct OneThread {
    int saved = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(saved); }
  } one_thread;
  for (int64_t i = 0; i < parts; ++i) {
    MatmulParams q = p;
    EntryLayout layout;
    layout.user_scratchpad = true;
    layout.a_ld = p.trans_a ? p.m : 0;  // A stored [k, m]: a block of its columns
    layout.b_ld = p.trans_b ? 0 : p.n;  // B stored [k, n]: a block of its columns
    layout.c_ld = p.n;
    (along_m ? q.m : q.n) = std::min(part_size, (along_m ? p.m : p.n) - i * part_size);
    e->parts.push_back(make_entry(d, q, has_bias, operands, output, layout));
  }
  return e;
}

Key matmul_key(int64_t family, const MatmulParams& p, bool has_bias) {
  Key key(family);
  key.add(p.batch)
      .add(p.m)
      .add(p.n)
      .add(p.k)
      .add(p.batch > 1 ? p.a_batch_stride : 0)
      .add(p.batch > 1 ? p.b_batch_stride : 0)
      .add(int64_t(p.trans_a) | int64_t(p.trans_b) << 1 | int64_t(has_bias) << 2)
      .add(p.alpha)
      .add(p.beta)
      .add(int64_t(p.act))
      .add(int64_t(omp_get_max_threads()));  // oneDNN plans a primitive for the threads it is created at
  return key;
}

void MatmulEntry::run_parts(Dnnl& d, const void* a, const void* b, void* c, const void* bias) {
  const int64_t count = int64_t(parts.size());
  auto run_part = [&](int64_t i) {
    MatmulEntry& part = *parts[size_t(i)];
    const int64_t at = i * part_size;  // the part's first row (along m) or column of C
    const char* pa = static_cast<const char*>(a);
    const char* pb = static_cast<const char*>(b);
    char* pc = static_cast<char*>(c);
    const char* pbias = static_cast<const char*>(bias);
    if (parts_along_m) {
      pa += (trans_a ? at : at * k) * operand_bytes;  // A stored [k, m]: columns; [m, k]: rows
      pc += at * n * output_bytes;
    } else {
      pb += (trans_b ? at * k : at) * operand_bytes;  // B stored [n, k]: rows; [k, n]: columns
      pc += at * output_bytes;
      if (pbias) pbias += at * output_bytes;
    }
    thread_local std::vector<char> scratchpad;  // 64 bytes more, for the alignment oneDNN's buffers expect
    if (scratchpad.size() < part.scratchpad_bytes + 64) scratchpad.resize(part.scratchpad_bytes + 64);
    void* sp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratchpad.data()) + 63) & ~uintptr_t(63));
    dnnl::stream strm(d.eng);  // a stream of this thread's own (creating one allocates a small object)
    part.run(strm, {{DNNL_ARG_SRC, pa},
                    {DNNL_ARG_WEIGHTS, pb},
                    {DNNL_ARG_DST, pc},
                    {part.bias_arg, pbias},
                    {part.scratchpad_bytes > 0 ? DNNL_ARG_SCRATCHPAD : 0, sp}});
  };
  if (omp_in_parallel() || omp_get_max_threads() < 2) {  // no team to split over: the parts in turn
    for (int64_t i = 0; i < count; ++i) run_part(i);
    return;
  }
  std::exception_ptr failure;  // an exception may not leave the region: the first is rethrown after it
  std::mutex failure_mu;
#pragma omp parallel num_threads(int(count))
  for (int64_t i = omp_get_thread_num(); i < count; i += omp_get_num_threads()) {
    try {
      run_part(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

float activate(float v, Activation act) {
  switch (act) {
    case Activation::relu:
      return v < 0.0f ? 0.0f : v;
    case Activation::gelu:
      return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case Activation::gelu_tanh:
      return 0.5f * v * (1.0f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case Activation::silu:
      return v / (1.0f + std::exp(-v));
    default:
      return v;
  }
}

namespace {

// dst[i] = src[i] rounded to bf16 (nearest even; NaN stays NaN; f32 denormals become 0, as vcvtneps2bf16
// does — unlike dew::f32_to_bf16, which keeps them), i < n.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void to_bf16_range(const float* src, uint16_t* dst,
                                                                                   int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, __m512i(v));
  }
  for (; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + i));
    _mm256_mask_storeu_epi16(dst + i, mask, __m256i(v));
  }
}

// Rounds n floats to bf16 into `scratch` (grown on demand, reused by later calls on this thread).
const uint16_t* to_bf16(const float* src, int64_t n, std::vector<uint16_t>& scratch) {
  if (int64_t(scratch.size()) < n) scratch.resize(size_t(n));
  uint16_t* dst = scratch.data();
  // a block per thread, or the caller's thread alone and no OpenMP region (~170 calls a DiT step; cpu_backend.hpp)
  for_blocks(n, parallel_worth(n), [=](int64_t lo, int64_t hi) { to_bf16_range(src + lo, dst + lo, hi - lo); });
  return dst;
}

// The operands rounded inside an operand_reuse bracket (dew/backend.hpp), per calling thread: a linear layer's
// backward rounds its gradient g once for dx = g W and dW = g^T x, where each product rounded it (7 % of the DiT's
// medium step went to rounding, ~15 % of that a second rounding of such a g), and qkv_attention rounds x once for its
// three projections (forward and dW) and each of dq, dk, dv once for its two products. An entry is (first element,
// element count) and its copy; a product finds its operand there by both, or rounds it into a free entry, or, with
// none free, into the least recently used one (never the other operand of the same product: that one was used last).
// Closing the bracket empties the table (the copies' memory is kept for the next one). Only pointers the bracket's
// products read are ever looked up, and the core promises no kernel writes them in between, so a copy found is the
// operand's rounding.
struct ReusedOperands {
  struct Entry {
    const float* src = nullptr;
    int64_t n = 0;
    uint64_t last_use = 0;
    std::vector<uint16_t> bf16;
  };
  bool open = false;
  int used = 0;
  uint64_t clock = 0;
  Entry entries[4];
};
thread_local ReusedOperands reused_operands;

const uint16_t* to_bf16_operand(const float* src, int64_t n, std::vector<uint16_t>& scratch) {
  ReusedOperands& r = reused_operands;
  if (!r.open) return to_bf16(src, n, scratch);
  ++r.clock;
  for (int i = 0; i < r.used; ++i)
    if (r.entries[i].src == src && r.entries[i].n == n) {
      r.entries[i].last_use = r.clock;
      return r.entries[i].bf16.data();
    }
  ReusedOperands::Entry* e = &r.entries[0];
  if (r.used < int(std::size(r.entries)))
    e = &r.entries[r.used++];
  else
    for (ReusedOperands::Entry& c : r.entries)
      if (c.last_use < e->last_use) e = &c;
  e->src = src;
  e->n = n;
  e->last_use = r.clock;
  return to_bf16(src, n, e->bf16);
}

// Copies `rows` rows of `cols` floats, row stride `ld` in src, into `scratch` (grown on demand, reused by
// later calls on this thread) with row stride `padded`; returns the copy, 64-byte aligned.
const float* to_padded(const float* src, int64_t rows, int64_t cols, int64_t ld, int64_t padded,
                       std::vector<float>& scratch) {
  const int64_t need = (rows - 1) * padded + cols + 16;
  if (int64_t(scratch.size()) < need) scratch.resize(size_t(need));
  const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
  float* dst = reinterpret_cast<float*>((base + 63) & ~uintptr_t(63));
  for_rows(rows, parallel_worth(rows * cols), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(dst + r * padded, src + r * ld, size_t(cols) * sizeof(float));
  });
  return dst;
}

}  // namespace

namespace {

// The row-wise path (matmul_rowwise.cpp): y[r, j] = act(alpha * dot(x[r, :], w[j, :]) + bias[j]) for
// m <= kRowwiseMaxM rows of x [m, k] against a row-major [n, k] weight (a Linear layer on a few tokens:
// decoding one token, or one token of each of a server's active sequences). The weight streams once for
// all m rows; every y[r, j] is computed with arithmetic that depends on neither m, nor r, nor the thread
// count, so a row's result is bit-equal whether it is decoded alone or batched with others (continuous
// batching relies on it). The dot products take the backend's ISA path (isa.hpp), and so does the epilogue,
// fused in (per element, vectorised; SiLU / GELU-tanh as the elementwise family computes them). Why
// hand-written: oneDNN 2.6 reaches ~13 GB/s on matrix-vector products on one core, and decoding is nothing
// but them.
constexpr int64_t kRowwiseMaxM = 32;

}  // namespace

namespace {

// Weight-only storage (dew/generate.hpp): f32 x [m, k] against a bf16 or quantized int8 weight [n, k], or an
// f32 / bf16 weight in panels (linear: batch 1, trans_b, beta 0), f32 accumulation and output. Every row takes
// the row-wise kernel, 32 rows per pass over the weight, or the panel kernel (matmul_rowwise.hpp) for a weight in
// panels (a prompt's prefill as well as each decode step), so a token's logits are the same whether it came in a
// prompt, alone or batched. Why not oneDNN: 2.6 multiplies bf16 only by bf16 and
// int8 only by int8 (u8/s8 activations), which would round the activations too.
void matmul_weight_only(Isa isa, const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                        const MatmulParams& p, bool prefetch_panels) {
  require_f32(a, "matmul", "a");
  require_f32(out, "matmul", "out");
  DEW_CHECK(p.batch == 1 && p.trans_b && !p.trans_a && p.beta == 0.0f, "cpu matmul: a ", dtype_name(b.dtype()),
            " weight against f32 activations takes linear()'s product only (batch 1, B transposed, beta 0)");
  DEW_CHECK(out.numel() == p.m * p.n && a.numel() >= p.m * p.k && b.numel() >= p.n * p.k,
            "cpu matmul: shapes do not match [", p.m, ", ", p.k, "] x [", p.n, ", ", p.k, "]^T");
  const float* bp = nullptr;
  if (bias.defined()) {
    require_f32(bias, "matmul", "bias");
    DEW_CHECK(bias.numel() == p.n, "cpu matmul: bias has ", bias.numel(), " elements for n = ", p.n);
    bp = bias.data_as<float>();
  }
  const float* x = a.data_as<float>();
  float* y = out.data_as<float>();
  if (b.panel_rows() > 0) {  // a weight in panels (decode_panel_rows): the panel kernel for every m
    DEW_CHECK(b.panel_rows() == kPanelRows && b.ndim() == 2 && b.size(0) == p.n && b.size(1) == p.k &&
                  (b.dtype() == DType::f32 || b.dtype() == DType::bf16),
              "cpu matmul: a weight in panels is f32 or bf16 [n, k] in panels of ", kPanelRows, " rows, got ",
              dtype_name(b.dtype()), " ", shape_str(b.shape()), " in panels of ", b.panel_rows());
    const RowwiseEpilogue ep{bp, p.alpha, p.act};
    if (b.dtype() == DType::f32)
      panel_dot_f32(isa, x, static_cast<const float*>(b.panel_data()), y, p.m, p.n, p.k, ep);
    else
      panel_dot_bf16(isa, x, static_cast<const uint16_t*>(b.panel_data()), y, p.m, p.n, p.k, ep, prefetch_panels);
    return;
  }
  QuantScales q;
  if (b.quantized()) {
    q.groups = contracts::check_quantized_weight("cpu matmul", b);
    DEW_CHECK(b.size(0) == p.n && b.size(1) == p.k, "cpu matmul: quantized weight ", shape_str(b.shape()),
              " is not [n, k] = [", p.n, ", ", p.k, "]");
    q.scales = b.scales().data_as<float>();
  }
  for (int64_t r = 0; r < p.m; r += kRowwiseMaxM) {
    const int64_t rows = std::min(kRowwiseMaxM, p.m - r);
    if (b.quantized())
      rowwise_dot_i8(isa, x + r * p.k, b.data_as<int8_t>(), q, y + r * p.n, rows, p.n, p.k, {bp, p.alpha, p.act});
    else
      rowwise_dot_bf16(isa, x + r * p.k, b.data_as<uint16_t>(), y + r * p.n, rows, p.n, p.k, {bp, p.alpha, p.act});
  }
}

}  // namespace

void check_matmul_shapes(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out,
                         const MatmulParams& p) {
  if (bias.defined())
    DEW_CHECK(bias.numel() == p.n, "cpu matmul: bias has ", bias.numel(), " elements for n = ", p.n);
  DEW_CHECK(p.batch >= 0 && p.m >= 0 && p.n >= 0 && p.k >= 0, "cpu matmul: negative dimension");
  DEW_CHECK(p.act == Activation::none || p.beta == 0.0f, "cpu matmul: an activation epilogue requires beta == 0");
  DEW_CHECK(out.numel() == p.batch * p.m * p.n, "cpu matmul: out ", shape_str(out.shape()), " is not [", p.batch, ", ",
            p.m, ", ", p.n, "]");
  auto span = [](int64_t batch, int64_t bs, int64_t mat) { return (batch - 1) * bs + mat; };
  DEW_CHECK(p.batch == 0 || span(p.batch, p.a_batch_stride, p.m * p.k) <= a.numel(), "cpu matmul: a ",
            shape_str(a.shape()), " is too small for the batch");
  DEW_CHECK(p.batch == 0 || span(p.batch, p.b_batch_stride, p.k * p.n) <= b.numel(), "cpu matmul: b ",
            shape_str(b.shape()), " is too small for the batch");
}

void CpuBackend::matmul_kernel(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                               const MatmulParams& p) {
  if (a.defined() && a.dtype() == DType::bf16) return matmul_bf16(*this, *dnnl_, a, b, bias, out, p);  // half.cpp
  if (contracts::is_weight_only_matmul(a, b) && p.k > 0)  // bf16 / int8 decode weights (matmul_rowwise.cpp)
    return matmul_weight_only(isa_, a, b, bias, out, p, prefetch_panels());
  require_f32(a, "matmul", "a");
  require_f32(b, "matmul", "b");
  require_f32(out, "matmul", "out");
  const bool has_bias = bias.defined();
  if (has_bias) require_f32(bias, "matmul", "bias");
  check_matmul_shapes(a, b, bias, out, p);
  auto span = [](int64_t batch, int64_t bs, int64_t mat) { return (batch - 1) * bs + mat; };
  if (out.numel() == 0) return;
  float* o = out.data_as<float>();
  if (p.k == 0) {  // empty inner product: out = beta * out + act(bias)
    const float* bp = has_bias ? bias.data_as<float>() : nullptr;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float v = activate(bp ? bp[i % p.n] : 0.0f, p.act);
      o[i] = p.beta == 0.0f ? v : p.beta * o[i] + v;
    }
    return;
  }
  if (p.batch == 1 && p.m <= kRowwiseMaxM && p.trans_b && !p.trans_a && p.beta == 0.0f) {
    rowwise_dot_f32(isa_, a.data_as<float>(), b.data_as<float>(), o, p.m, p.n, p.k,
                    {has_bias ? bias.data_as<float>() : nullptr, p.alpha, p.act});
    return;
  }
  const bool bf16 = bf16_matmul_;
  Key key = matmul_key(kMatmul, p, has_bias);
  key.add(int64_t(bf16));
  Dnnl& d = *dnnl_;
  const memory::data_type operands = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  auto e = d.cache.get<MatmulEntry>(key, [&] { return make_matmul(d, p, has_bias, operands, memory::data_type::f32); });
  const void* a_data = a.data();
  const void* b_data = b.data();
  if (bf16) {  // the elements A and B cover, rounded into per-thread scratch with the same strides
    thread_local std::vector<uint16_t> a_scratch, b_scratch;
    a_data = to_bf16_operand(a.data_as<float>(), span(p.batch, p.a_batch_stride, p.m * p.k), a_scratch);
    b_data = to_bf16_operand(b.data_as<float>(), span(p.batch, p.b_batch_stride, p.k * p.n), b_scratch);
  }
  if (e->a_ld != 0 || e->b_ld != 0) {  // padded copies (top comment; batch 1, f32, so never with bf16)
    thread_local std::vector<float> a_pad, b_pad;
    if (e->a_ld != 0) a_data = to_padded(a.data_as<float>(), p.k, p.m, p.m, e->a_ld, a_pad);
    if (e->b_ld != 0) b_data = to_padded(b.data_as<float>(), p.k, p.n, p.n, e->b_ld, b_pad);
  }
  e->run_matmul(d, a_data, b_data, o, has_bias ? bias.data() : nullptr);
}

// oneDNN 2.6's f32 products on avx512_core are brgemm kernels, whose sum post-op adds the finished f32 accumulator
// to out: the product's bits, then the add's (tests/autograd "a backend that declares ..." checks shapes up to
// k = 16384). Below avx512_core they are gemm:jit's sgemm, which applies beta to its first k block and adds each
// later block's partial sum into out: other bits. bf16 and f16 outputs round acc + out once.
bool CpuBackend::matmul_beta_adds_rounded(DType dtype) const {
  constexpr unsigned kAvx512Core = unsigned(dnnl_cpu_isa_avx512_core);
  return dtype == DType::f32 && (unsigned(dnnl::get_effective_cpu_isa()) & kAvx512Core) == kAvx512Core;
}

void CpuBackend::operand_reuse(bool open) {
  reused_operands.open = open;
  reused_operands.used = 0;
}

}  // namespace dew::cpu
