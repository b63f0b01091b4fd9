// cpu/half.cpp — the cpu backend's bf16 kernels (mixed precision, docs/precision.md), apart from the f32
// kernel files so those stay as they are.
//
// supports(k, bf16) says yes to the kernels below on every CPU; for the others the core converts around the
// f32 kernel (core/ops/kernel_call.hpp). How the bf16 matmul and attention run is decided at run time by the CPU
// (bf16_dot.cpp: AVX512-BF16 and whether its vdpbf16ps out-runs the f32 FMA here; the backend's bf16_products() and
// bf16_attention()), never by the build machine's flags, and results never depend on which path ran beyond the
// rounding the conformance suite bounds.
// Contract of a bf16 call (as cuda's): every data tensor (a, b, bias, out) is bf16; the statistics
// (mean, rstd, lse, losses) stay f32; arithmetic is f32 and each output is rounded once (nearest even).
//  * matmul: where bf16 products pay (AVX512-BF16 at Zen 5's rate, or AMX), oneDNN's bf16 matmul, bf16 src /
//    weights / bias / dst, f32 accumulation: matmul.cpp's primitive (make_matmul, the same fused epilogue: alpha,
//    beta as a sum post-op, activation) built for bf16 operands and output. Elsewhere (AVX2 CPUs, AVX-512 before
//    Cooper Lake / Zen 4, Intel's half-rate vdpbf16ps without AMX) the operands are widened exactly into f32
//    temporaries, the f32 product runs and the output is rounded once:
//    the bits of the core's conversion, done here so that the form this backend has a kernel for on every CPU,
//    f32 activations against a bf16 weight (weight-only decode storage, matmul.cpp), is never taken for it: the
//    core would widen every bf16 weight to f32 on every call (per decode token, 4x the weight bytes streamed:
//    bf16 decode ran at 0.19 of its bandwidth roofline on an AVX2 EPYC, slower than f32 decode).
//    The widened product (bf16 a and b into an f32 out, a gradient under autocast: dew/kernel_contracts.hpp) is
//    the same primitive with an f32 destination, or the f32 product of the widened operands, stored unrounded.
//  * unary (+ backward), the gated activation (+ backward), RMS norm (+ backward), the layer norm with [G, D]
//    parameters (+ backward), RoPE, reduce's column sums and the gated residual (+ backward) are not here: their
//    kernels are written once over the storage type (bf16_bits.hpp) and read / write bf16 directly, computing
//    what the f32 kernel computes on the widened inputs (tests/backends_cpu checks it bit for bit); at
//    char-small's bf16-mixed step that took the first five from 35 to 22 ms (docs/benchmarks.md, session 22).
//  * attention on the avx512 path where vdpbf16ps pays: attention_bf16.cpp's kernels where they cover the
//    call (attention_bf16 below says which), bf16 product operands (P and dS rounded to bf16) with f32 sums.
//  * the other memory-bound kernels (binary broadcasts, the layer norm with [D] parameters, softmax,
//    cross-entropy, attention otherwise): the f32 kernel of this backend on blocks of rows (a few samples for
//    attention) widened into f32 scratch of at most ~256 KiB per tensor, so the f32 copies stay in cache and
//    memory traffic is the bf16 bytes; outputs are rounded once. Layer norm's weight / bias gradients (sums over
//    rows) add the blocks' f32 partials in f32 and round once at the end. Each block's result is the f32 kernel's
//    result on those rows, so a bf16 kernel is exactly "widen, run the f32 kernel, round" (conformance bounds it).
#include "attention.hpp"
#include "attention_bf16.hpp"
#include "cpu_backend.hpp"

namespace dew::cpu {

Support bf16_support(Kernel k) {
  switch (k) {
    case Kernel::matmul:  // every CPU: oneDNN's bf16 kernel with AVX512-BF16, else widened here (matmul_bf16)
    case Kernel::unary:
    case Kernel::unary_backward:
    case Kernel::unary_backward_sum:
    case Kernel::binary:
    case Kernel::gated_activation:
    case Kernel::gated_activation_backward:
    case Kernel::softmax:
    case Kernel::softmax_backward:
    case Kernel::log_softmax:
    case Kernel::log_softmax_backward:
    case Kernel::layer_norm:
    case Kernel::layer_norm_backward:
    case Kernel::rms_norm:
    case Kernel::rms_norm_backward:
    case Kernel::rope:
    case Kernel::attention:
    case Kernel::attention_backward:
    case Kernel::attention_slots:  // f32 q over a bf16 cache: the row tasks (attention.cpp); bf16 q: row by row
    case Kernel::cross_entropy:
    case Kernel::cross_entropy_backward:
    case Kernel::reduce:
    case Kernel::gated_residual:
    case Kernel::gated_residual_backward:
      return Support::yes();
    default:
      return Support::no(std::string("cpu has no bf16 ") + kernel_name(k) +
                         " kernel; the core converts around the f32 one (core/ops/kernel_call.hpp)");
  }
}

namespace {

using dnnl::memory;
using dims = memory::dims;

}  // namespace

void matmul_bf16(CpuBackend& be, Dnnl& d, const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                 const MatmulParams& p) {
  require_bf16(a, "matmul", "a");
  require_bf16(b, "matmul", "b");
  const bool widened = contracts::is_widened_matmul(a, b, out);  // f32 out, stored unrounded
  if (widened)
    contracts::check_widened_matmul("cpu.matmul", bias, p);
  else
    require_bf16(out, "matmul", "out");
  const bool has_bias = bias.defined();
  if (has_bias) require_bf16(bias, "matmul", "bias");
  check_matmul_shapes(a, b, bias, out, p);
  if (out.numel() == 0) return;
  if (!be.bf16_products()) {  // widened exactly, the f32 product (same fused epilogue), rounded once
    auto wide = [&](const Tensor& t) {
      Tensor w = Tensor::empty(t.shape(), DType::f32, t.backend_ptr());
      be.cast(t, w);
      return w;
    };
    Tensor out32 = widened          ? out
                   : p.beta != 0.0f ? wide(out)
                                    : Tensor::empty(out.shape(), DType::f32, out.backend_ptr());
    be.matmul(wide(a), wide(b), has_bias ? wide(bias) : Tensor(), out32, p);
    if (!widened) be.cast(out32, out);
    return;
  }
  if (p.k == 0 && widened) {  // empty inner product: out = beta * out
    float* o = out.data_as<float>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = p.beta == 0.0f ? 0.0f : p.beta * o[i];
    return;
  }
  if (p.k == 0) {  // empty inner product: out = beta * out + act(bias), through f32
    uint16_t* o = out.data_as<uint16_t>();
    const uint16_t* bp = has_bias ? bias.data_as<uint16_t>() : nullptr;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float v = activate(bp ? bf16_to_f32(bf16_t{bp[i % p.n]}) : 0.0f, p.act);
      o[i] = f32_to_bf16(p.beta == 0.0f ? v : p.beta * bf16_to_f32(bf16_t{o[i]}) + v).bits;
    }
    return;
  }
  const Key key = matmul_key(widened ? kMatmulBf16Widened : kMatmulBf16, p, has_bias);
  auto e = d.cache.get<MatmulEntry>(key, [&] {
    return make_matmul(d, p, has_bias, memory::data_type::bf16,
                       widened ? memory::data_type::f32 : memory::data_type::bf16);
  });
  e->run_matmul(d, a.data(), b.data(), out.data(), has_bias ? bias.data() : nullptr);
}

// ---------------------------------------------------------------- blocked bf16 around the f32 kernels

namespace {

bool bf(const Tensor& t) { return t.defined() && t.dtype() == DType::bf16; }

// An f32 copy of a bf16 tensor (a view is fine: cast reads its elements).
Tensor widen(Isa isa, const Tensor& h) {
  Tensor w = Tensor::empty(h.shape(), DType::f32, h.backend_ptr());
  DEW_INTERNAL_ASSERT(cast_bf16_fast(isa, h, w));
  return w;
}
Tensor widen_opt(Isa isa, const Tensor& h) { return h.defined() ? widen(isa, h) : Tensor(); }
Tensor scratch_like(const Tensor& h) { return Tensor::empty(h.shape(), DType::f32, h.backend_ptr()); }
void narrow_into(Isa isa, const Tensor& w, const Tensor& h) {
  Tensor out = h;
  DEW_INTERNAL_ASSERT(cast_bf16_fast(isa, w, out));
}
// A bf16 copy of an f32 tensor (nearest even).
Tensor narrow(Isa isa, const Tensor& w) {
  Tensor h = Tensor::empty(w.shape(), DType::bf16, w.backend_ptr());
  DEW_INTERNAL_ASSERT(cast_bf16_fast(isa, w, h));
  return h;
}
// Rows [lo, hi) of t seen as [numel / width, width] (a view).
Tensor rows(const Tensor& t, int64_t width, int64_t lo, int64_t hi) {
  return t.reshape({t.numel() / width, width}).slice0(lo, hi);
}
Tensor elems(const Tensor& t, int64_t lo, int64_t hi) { return t.reshape({t.numel()}).slice0(lo, hi); }

constexpr int64_t kBlockElems = int64_t(1) << 16;  // 256 KiB of f32 per tensor and block
int64_t block_rows(int64_t width) { return std::max<int64_t>(1, kBlockElems / std::max<int64_t>(width, 1)); }
template <class F>
void for_row_blocks(int64_t n_rows, int64_t width, F&& body) {
  const int64_t step = block_rows(width);
  for (int64_t lo = 0; lo < n_rows; lo += step) body(lo, std::min(n_rows, lo + step));
}

void require_all_bf16(std::initializer_list<const Tensor*> ts, Kernel k) {
  require_bf16_if_defined(ts, kernel_name(k));
}

// acc (f32) += part (f32), both [D].
void accumulate(CpuBackend& be, Tensor& acc, const Tensor& part) { be.binary(acc, part, acc, BinaryOp::add); }

}  // namespace

bool is_bf16_call(const Tensor& t) { return bf(t); }

void binary_bf16(CpuBackend& be, const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  require_all_bf16({&a, &b, &out}, Kernel::binary);
  if (binary_bf16_same_shape(be.isa(), a, b, out, op)) return;  // convert.cpp
  const int64_t n = out.numel();
  // Blocks of rows when each operand is either out's size or one row of it ([D] against [N, D], or a
  // scalar); any other broadcast runs the f32 kernel on whole widened tensors.
  auto row_operand = [&](const Tensor& t, int64_t width) {
    if (t.numel() == n) return 0;
    if (t.numel() == 1) return 1;
    if (t.numel() == width && t.ndim() <= out.ndim()) {
      for (int i = 0; i < t.ndim(); ++i)
        if (t.shape()[size_t(t.ndim() - 1 - i)] != out.shape()[size_t(out.ndim() - 1 - i)]) return -1;
      return 1;
    }
    return -1;
  };
  const int64_t width = out.ndim() == 0 ? 1 : std::max<int64_t>(a.numel() == n ? b.numel() : a.numel(), 1);
  const int ka = row_operand(a, width), kb = row_operand(b, width);
  if (ka < 0 || kb < 0 || n % width != 0) {
    Tensor wa = widen(be.isa(), a), wb = widen(be.isa(), b), wo = scratch_like(out);
    be.binary(wa, wb, wo, op);
    narrow_into(be.isa(), wo, out);
    return;
  }
  const Tensor fa = ka ? widen(be.isa(), a) : Tensor(), fb = kb ? widen(be.isa(), b) : Tensor();
  const int64_t w = ka || kb ? width : 1;
  for_row_blocks(n / w, w, [&](int64_t lo, int64_t hi) {
    const Tensor wa = ka ? fa : widen(be.isa(), rows(a, w, lo, hi)).reshape({hi - lo, w});
    const Tensor wb = kb ? fb : widen(be.isa(), rows(b, w, lo, hi)).reshape({hi - lo, w});
    Tensor wo = Tensor::empty({hi - lo, w}, DType::f32, out.backend_ptr());
    be.binary(ka ? wa.reshape(a.numel() == 1 ? Shape{1} : Shape{w}) : wa,
              kb ? wb.reshape(b.numel() == 1 ? Shape{1} : Shape{w}) : wb, wo, op);
    narrow_into(be.isa(), wo, rows(out, w, lo, hi));
  });
}

void softmax_like_bf16(CpuBackend& be, const Tensor& x, Tensor& y, bool log) {
  require_all_bf16({&x, &y}, log ? Kernel::log_softmax : Kernel::softmax);
  const int64_t d = x.ndim() == 0 ? 1 : x.shape().back();
  for_row_blocks(x.numel() / std::max<int64_t>(d, 1), d, [&](int64_t lo, int64_t hi) {
    Tensor w = widen(be.isa(), rows(x, d, lo, hi)), o = scratch_like(w);
    log ? be.log_softmax(w, o) : be.softmax(w, o);
    narrow_into(be.isa(), o, rows(y, d, lo, hi));
  });
}

void softmax_like_backward_bf16(CpuBackend& be, const Tensor& y, const Tensor& dy, Tensor& dx, bool log) {
  require_all_bf16({&y, &dy, &dx}, log ? Kernel::log_softmax_backward : Kernel::softmax_backward);
  const int64_t d = y.ndim() == 0 ? 1 : y.shape().back();
  for_row_blocks(y.numel() / std::max<int64_t>(d, 1), d, [&](int64_t lo, int64_t hi) {
    Tensor wy = widen(be.isa(), rows(y, d, lo, hi)), wd = widen(be.isa(), rows(dy, d, lo, hi)), o = scratch_like(wy);
    log ? be.log_softmax_backward(wy, wd, o) : be.softmax_backward(wy, wd, o);
    narrow_into(be.isa(), o, rows(dx, d, lo, hi));
  });
}

void layer_norm_bf16(CpuBackend& be, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                     Tensor& rstd, float eps) {
  require_all_bf16({&x, &weight, &bias, &y}, Kernel::layer_norm);
  const int64_t d = x.shape().back(), n = x.numel() / std::max<int64_t>(d, 1);
  const Tensor w = widen_opt(be.isa(), weight), b = widen_opt(be.isa(), bias);
  for_row_blocks(n, d, [&](int64_t lo, int64_t hi) {
    Tensor wx = widen(be.isa(), rows(x, d, lo, hi)), o = scratch_like(wx);
    Tensor m = mean.slice0(lo, hi), r = rstd.slice0(lo, hi);
    be.layer_norm(wx, w, b, o, m, r, eps);
    narrow_into(be.isa(), o, rows(y, d, lo, hi));
  });
}

void layer_norm_backward_bf16(CpuBackend& be, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  require_all_bf16({&x, &weight, &dy, &dx, &dweight, &dbias}, Kernel::layer_norm_backward);
  const int64_t d = x.shape().back(), n = x.numel() / std::max<int64_t>(d, 1);
  const Tensor w = widen_opt(be.isa(), weight);
  Tensor dw_sum = dweight.defined() ? Tensor::zeros({d}, DType::f32, x.backend_ptr()) : Tensor();
  Tensor db_sum = dbias.defined() ? Tensor::zeros({d}, DType::f32, x.backend_ptr()) : Tensor();
  for_row_blocks(n, d, [&](int64_t lo, int64_t hi) {
    Tensor wx = widen(be.isa(), rows(x, d, lo, hi)), wd = widen(be.isa(), rows(dy, d, lo, hi)), o = scratch_like(wx);
    Tensor dw = dweight.defined() ? scratch_like(dw_sum) : Tensor(), db = dbias.defined() ? scratch_like(db_sum) : Tensor();
    be.layer_norm_backward(wx, w, mean.slice0(lo, hi), rstd.slice0(lo, hi), wd, o, dw, db);
    narrow_into(be.isa(), o, rows(dx, d, lo, hi));
    if (dw.defined()) accumulate(be, dw_sum, dw);
    if (db.defined()) accumulate(be, db_sum, db);
  });
  if (dweight.defined()) narrow_into(be.isa(), dw_sum, dweight);
  if (dbias.defined()) narrow_into(be.isa(), db_sum, dbias);
}

void cross_entropy_bf16(CpuBackend& be, const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                        const CrossEntropyParams& p) {
  require_all_bf16({&logits}, Kernel::cross_entropy);
  DEW_CHECK(logits.ndim() == 2, "cpu cross_entropy: logits ", shape_str(logits.shape()), " are not [N, V]");
  const int64_t v = logits.shape()[1];
  for_row_blocks(logits.shape()[0], v, [&](int64_t lo, int64_t hi) {
    Tensor l = loss.slice0(lo, hi), s = lse.slice0(lo, hi);
    be.cross_entropy(widen(be.isa(), logits.slice0(lo, hi)), targets.slice0(lo, hi), l, s, p);
  });
}

void cross_entropy_backward_bf16(CpuBackend& be, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p) {
  require_all_bf16({&logits, &dlogits}, Kernel::cross_entropy_backward);
  DEW_CHECK(logits.ndim() == 2, "cpu cross_entropy_backward: logits ", shape_str(logits.shape()), " are not [N, V]");
  const int64_t v = logits.shape()[1];
  for_row_blocks(logits.shape()[0], v, [&](int64_t lo, int64_t hi) {
    Tensor wl = widen(be.isa(), logits.slice0(lo, hi)), o = scratch_like(wl);
    be.cross_entropy_backward(wl, targets.slice0(lo, hi), lse.slice0(lo, hi), dloss.slice0(lo, hi), o, p);
    narrow_into(be.isa(), o, dlogits.reshape(logits.shape()).slice0(lo, hi));
  });
}

// On the avx512 path of a CPU with AVX512-BF16, calls attention_bf16.cpp covers (D % 16 == 0, D <= 256, T > 4; the
// backward also needs enough (batch, kv head) tasks for the threads) take its vdpbf16ps kernels, bf16 operands with
// f32 sums (P and dS rounded to bf16 as product operands), the whole batch in one call. Otherwise a few samples at a
// time (attention_samples_per_call): q, k, v, out [B, ...], segment_ids [B, S] and lse [B, H, T] all split on the
// batch axis, widened, the f32 kernel, rounded once.
namespace {
// Samples per widened call: enough tasks for 4 per thread (one sample of the DiT is 4 (batch, kv head) tasks: at
// 2 threads the f32 kernel ran 16 one-sample calls slower than at 1, session 22), while a chunk's f32 copy of one
// tensor stays under ~1 MiB (2^18 floats).
int64_t attention_samples_per_call(const Tensor& q, int64_t tasks_per_sample) {
  const int64_t threads = omp_get_max_threads(), per_sample = std::max<int64_t>(q.numel() / q.shape()[0], 1);
  if (threads <= 1 || tasks_per_sample <= 0) return 1;
  const int64_t want = (4 * threads + tasks_per_sample - 1) / tasks_per_sample;
  return std::clamp<int64_t>(std::min(want, (int64_t(1) << 18) / per_sample), 1, q.shape()[0]);
}
}  // namespace

void attention_bf16(Isa isa, bool native, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                    Tensor& out, Tensor& lse, const AttentionParams& p) {
  require_all_bf16({&q, &k, &v, &out}, Kernel::attention);
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "cpu attention: q, k, v must be [B, T, H, D]");
  if (native && isa == Isa::avx512 && attention_bf16_fast_covers(q, k, p))
    return attention_bf16_fast_forward(q, k, v, segment_ids, out, lse, p);
  const int64_t B = q.shape()[0], T = q.shape()[1], H = q.shape()[2];
  const int64_t step = attention_samples_per_call(q, H * ((T + 63) / 64));  // forward tasks: (head, 64 queries)
  for (int64_t b = 0; b < B; b += step) {
    const int64_t e = std::min(B, b + step);
    Tensor wq = widen(isa, q.slice0(b, e)), wk = widen(isa, k.slice0(b, e)), wv = widen(isa, v.slice0(b, e));
    Tensor o = scratch_like(wq), l = lse.slice0(b, e);
    attention_forward(wq, wk, wv, segment_ids.defined() ? segment_ids.slice0(b, e) : Tensor(), o, l, p, isa);
    narrow_into(isa, o, out.reshape(q.shape()).slice0(b, e));
  }
}

void attention_backward_bf16(Isa isa, bool native, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& segment_ids, const Tensor& out, const Tensor& lse, const Tensor& dout,
                             Tensor& dq, Tensor& dk, Tensor& dv, const AttentionParams& p) {
  require_all_bf16({&q, &k, &v, &out, &dout, &dq, &dk, &dv}, Kernel::attention_backward);
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "cpu attention_backward: q, k, v must be [B, T, H, D]");
  if (native && isa == Isa::avx512 && attention_bf16_fast_backward_covers(q, k, p, omp_get_max_threads()))
    return attention_bf16_fast_backward(q, k, v, segment_ids, out, lse, dout, dq, dk, dv, p);
  const int64_t B = q.shape()[0];
  const int64_t step = attention_samples_per_call(q, k.shape()[2]);  // backward tasks: (batch, kv head)
  for (int64_t b = 0; b < B; b += step) {
    const int64_t e = std::min(B, b + step);
    Tensor wq = widen(isa, q.slice0(b, e)), wk = widen(isa, k.slice0(b, e)), wv = widen(isa, v.slice0(b, e));
    Tensor wo = widen(isa, out.slice0(b, e)), wd = widen(isa, dout.slice0(b, e));
    Tensor gq = scratch_like(wq), gk = scratch_like(wk), gv = scratch_like(wv);
    cpu::attention_backward(wq, wk, wv, segment_ids.defined() ? segment_ids.slice0(b, e) : Tensor(), wo,
                            lse.slice0(b, e), wd, gq, gk, gv, p, isa);
    narrow_into(isa, gq, dq.reshape(q.shape()).slice0(b, e));
    narrow_into(isa, gk, dk.reshape(k.shape()).slice0(b, e));
    narrow_into(isa, gv, dv.reshape(v.shape()).slice0(b, e));
  }
}

// matmul_precision = medium (CpuBackend::bf16_matmul()): attention on f32 tensors whose products take bf16 operands
// with f32 sums, as the medium matmuls' do (PyTorch's bf16 autocast runs its attention in bf16 throughout): q, k, v
// (and the backward's out, dout) are rounded to bf16 once (nearest even, into temporaries), attention_bf16.cpp's
// vdpbf16ps kernels run (P and dS rounded to bf16 as operands, softmax and statistics in f32), and out, dq, dk, dv
// are their f32 sums, unrounded: round(medium's out) is the bf16 kernel's out on the rounded inputs, bit for bit
// (tests/backends_cpu_attention). Only where those kernels cover the call (avx512 path, AVX512-BF16, f32 q, k, v,
// D % 16 == 0, D <= 256, T > 4) and cover its backward too (the thread rule), forward and backward alike, so that a
// backward recomputes P from the scores its forward's lse came from; elsewhere (decode rows, odd D, AVX2 CPUs) the
// f32 kernel runs, as medium's matmuls stay f32 where oneDNN has no bf16 kernel. Measured: docs/benchmarks.md,
// session 29.
namespace {
bool medium_covers(Isa isa, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  return isa == Isa::avx512 && v.defined() && v.dtype() == DType::f32 &&
         attention_bf16_fast_backward_covers(q, k, p, omp_get_max_threads());  // the forward's conditions and more
}
}  // namespace

bool attention_medium(Isa isa, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                      Tensor& out, Tensor& lse, const AttentionParams& p) {
  if (!medium_covers(isa, q, k, v, p)) return false;
  attention_bf16_fast_forward(narrow(isa, q), narrow(isa, k), narrow(isa, v), segment_ids, out, lse, p);
  return true;
}

bool attention_backward_medium(Isa isa, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                               const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                               Tensor& dv, const AttentionParams& p) {
  if (!medium_covers(isa, q, k, v, p)) return false;
  attention_bf16_fast_backward(narrow(isa, q), narrow(isa, k), narrow(isa, v), segment_ids, narrow(isa, out), lse,
                               narrow(isa, dout), dq, dk, dv, p);
  return true;
}

}  // namespace dew::cpu
