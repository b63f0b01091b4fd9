// cpu/elementwise.cpp — unary (+ backward), the gated activation (+ backward), broadcasting binary,
// reduce and argmax (f32; unary and the gated activation also bf16).
//
// Hand-written because oneDNN 2.6 has no backward for binary/reduction and its eltwise set lacks
// softcap/affine-backward/etc.; these loops are memory-bound, so one fused pass per op is the goal.
// * unary: one `omp simd` loop per op; exp/tanh/sigmoid use fast_exp (<= 2 ulp) so they vectorise, silu and
//   gelu_tanh its unguarded form act_exp (the same bits on their arguments; they share one exp-based form,
//   forward and backward: see gelu_tanh_fwd);
//   log/sin/cos/pow/erf call libm per element. Output may alias the input.
// * gated_activation: the gated MLP's act(gate) * up in one pass, and its backward in one pass writing both
//   gradients. Each element is the expression the unfused ops compute (unary then binary mul; mul's
//   backward then unary_backward, whose incoming gradient is dy * up rounded to f32), so in f32 the fused
//   kernels give the unfused ops' bits (tests/backends_cpu checks it) while reading 2 and writing 1 tensor
//   forward (3 and 2 unfused: the activation's output round trip) and reading 3, writing 2 backward (6 and 3).
// * bf16 (unary, the gated activation, forward and backward): the same f32 loops over bf16 storage, run on chunks
//   widened in L1 (bf16_bits.hpp's map_chunks), so each output is the f32 kernel's value on the widened inputs,
//   rounded once.
// * unary_backward_sum: unary_backward and the column sums of its output (a bias gradient) in one pass over
//   blocks of rows; the bits of unary_backward then reduce (see the kernel), f32 and bf16 (the sums of the stored,
//   rounded dx: a bf16-mixed MLP's bias gradient no longer takes a reduce pass of its own).
// * binary: numpy broadcasting. Fast paths: equal shapes (one flat loop), a scalar operand, and the
//   general case after coalescing dimensions, whose innermost loop is contiguous for the common
//   [N, D] (+) [D] row broadcast. Comparisons write 1/0. maximum/minimum propagate NaN.
// * reduce [outer, reduce, inner]: sums accumulate in double; when outer*inner is too small to feed
//   every thread, the reduce axis is split over threads and the double partials are combined in order.
// * argmax: the first index of the largest value; the first NaN, if any, wins (as in ref).
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`. unary (forward, backward) and
//   binary compute one expression per element, contracted to FMA alike on avx512 and avx2: those two paths
//   give the same bits (tests/backends_cpu checks it); portable has no FMA and differs by its roundings.
//   reduce: sums in double over vector lanes whose count differs per path (the float result almost always
//   agrees, it is not guaranteed); max/min and argmax are exact on every path.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <immintrin.h>  // vec16.hpp's avx2 bf16 load

#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"
#include "dew/kernel_contracts.hpp"

#define DEW_CPU_ISA_SELF "elementwise.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(unary, (const Tensor& x, Tensor& out, const UnaryParams& p), (x, out, p))
DEW_CPU_ISA_KERNEL(unary_backward, (const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p), (x, dy, dx, p))
DEW_CPU_ISA_KERNEL(unary_backward_sum,
                   (const Tensor& x, const Tensor& dy, Tensor& dx, Tensor& dsum, const UnaryParams& p),
                   (x, dy, dx, dsum, p))
DEW_CPU_ISA_KERNEL(gated_activation, (const Tensor& gate, const Tensor& up, Tensor& out, Activation act),
                   (gate, up, out, act))
DEW_CPU_ISA_KERNEL(gated_activation_backward,
                   (const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup, Activation act),
                   (gate, up, dy, dgate, dup, act))
DEW_CPU_ISA_KERNEL(binary, (const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op), (a, b, out, op))
DEW_CPU_ISA_KERNEL(reduce, (const Tensor& x, Tensor& out, const ReduceParams& p), (x, out, p))
DEW_CPU_ISA_KERNEL(argmax, (const Tensor& x, Tensor& out), (x, out))

// reduce per tensor into its element (a call costs microseconds here).
void CpuBackend::sum_squares_group_kernel(const std::vector<Tensor>& xs, Tensor& out) {
  sum_squares_each_reduce(*this, xs, out);
}

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but
       // bf16_bits.hpp and vec16.hpp)

#include "bf16_bits.hpp"  // ld / st: an element of float or bf16 (uint16_t) storage, computed on in f32
#include "vec16.hpp"      // argmax's 16-lane pass: vf / vi, vload, vsel, iota (native on every path)

namespace {

constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kGeluC = 0.044715f;

// ---- the MLP activations GELU-tanh and SiLU, forward and backward (enough arithmetic per byte that the
// vector width shows). Both are written through e = exp(-z) and s = 1 / (1 + e):
//   gelu_tanh(v) = 0.5 v (1 + tanh(u)) = v s with z = 2u, u = sqrt(2/pi) (v + c v^3);
//     d/dv = s + v s (1 - s) 2u' = s + v (e s) s 2u'       (one exp and one division, no tanh)
//   silu(v) = v s with z = v;  d/dv = s (1 + v (1 - s)) = s + v (e s) s
// (1 - s) is formed as e s, so there is no cancellation where s -> 1. Elementwise: results do not depend
// on the slice or the thread count.
// e = exp(z) is capped at exp(80) (~5.5e34): past that s = 1/(1+e) and the activation are 0 to float
// precision anyway, while an overflowing e = inf would turn (e s) into inf * 0 = NaN in the backward
// (pre-activations below about -10 for GELU-tanh, -88 for SiLU). NaN stays NaN. e is act_exp(z), fast_exp's
// bits without its clamps and NaN select (0 below z = -87, where 1 + e = 1 anyway): these loops were ALU-bound
// on fast_exp (DiT step: 0.51 -> 0.27 ms forward, 0.63 -> 0.41 ms backward per [1024, 1024] on one Zen 5 thread).
// (act_arg, silu_value, gelu_tanh_value: cpu_backend.hpp, shared with the row-wise products' epilogue.)
template <class T>
void gelu_tanh_fwd(const T* x, T* o, int64_t n) {
  map_chunks(x, o, n, [](const float* xf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = gelu_tanh_value(xf[i]);
  });
}
// d * gelu_tanh'(v) and d * silu'(v): one expression each, shared by the backward loops below and
// unary_backward_sum's (the same contraction, so the same bits).
[[gnu::always_inline]] inline float gelu_tanh_grad(float v, float d) {
  const float e = act_exp(act_arg(-2.0f * kSqrt2OverPi * (v + kGeluC * v * v * v)));
  const float s = 1.0f / (1.0f + e);
  const float du2 = 2.0f * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * v * v);
  return d * (s + v * ((e * s) * s) * du2);
}
[[gnu::always_inline]] inline float silu_grad(float v, float d) {
  const float e = act_exp(act_arg(-v)), s = 1.0f / (1.0f + e);
  return d * (s + v * ((e * s) * s));
}
template <class T>
void gelu_tanh_bwd(const T* x, const T* dy, T* o, int64_t n) {
  map_chunks2(x, dy, o, n, [](const float* xf, const float* gf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = gelu_tanh_grad(xf[i], gf[i]);
  });
}
template <class T>
void silu_fwd(const T* x, T* o, int64_t n) {
  map_chunks(x, o, n, [](const float* xf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = silu_value(xf[i]);
  });
}
template <class T>
void silu_bwd(const T* x, const T* dy, T* o, int64_t n) {
  map_chunks2(x, dy, o, n, [](const float* xf, const float* gf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = silu_grad(xf[i], gf[i]);
  });
}
// Rows [r0, r1) of [*, d]: o = grad(x, dy) and acc[j] += double(o[j]) row by row, in one pass (the sums from
// the registers: dx is never read back).
template <class Grad>
void grad_rows_sum(const float* x, const float* dy, float* o, double* acc, int64_t d, int64_t r0, int64_t r1,
                   Grad grad) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    const float* gr = dy + r * d;
    float* orow = o + r * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      const float v = grad(xr[j], gr[j]);
      orow[j] = v;
      acc[j] += double(v);
    }
  }
}
// bf16 storage: each row in chunks widened in L1 (map_chunks2's form: the f32 loop is the one compiled code), each
// value rounded once as stored and its rounded value added (what reduce reads back from dx).
template <class Grad>
void grad_rows_sum(const uint16_t* x, const uint16_t* dy, uint16_t* o, double* acc, int64_t d, int64_t r0, int64_t r1,
                   Grad grad) {
  alignas(64) float xb[kMapChunk], gb[kMapChunk], ob[kMapChunk];
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t j0 = 0; j0 < d; j0 += kMapChunk) {
      const int64_t c = std::min(kMapChunk, d - j0), at = r * d + j0;
      widen_into(x + at, xb, c);
      widen_into(dy + at, gb, c);
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) ob[j] = grad(xb[j], gb[j]);
      uint16_t* orow = o + at;
      double* a = acc + j0;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) {
        const uint16_t h = round_bits(ob[j]);
        orow[j] = h;
        a[j] += double(widen_bits(h));
      }
    }
}

// o[i] = op(x[i]) (map1) and o[i] = op(x[i], y[i]) (map2) over [0, n), split over the team in contiguous
// slices when n is large. The functor takes values, not indices, and the loop bodies see only local
// pointers, so every `omp simd` loop vectorises (lambdas indexing captured pointers did not). T is the
// storage (float, or bf16 bits: widened on load, rounded once on store; bf16_bits.hpp).
template <class T, class Op>
inline void map1_slice(const T* x, T* o, int64_t n, Op op) {
  map_chunks(x, o, n, [op](const float* xf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = op(xf[i]);
  });
}
template <class T, class Op>
inline void map2_slice(const T* x, const T* y, T* o, int64_t n, Op op) {
  map_chunks2(x, y, o, n, [op](const float* xf, const float* yf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = op(xf[i], yf[i]);
  });
}
// Contiguous slices over the team when n is large (for_blocks, cpu_backend.hpp).
template <class Slice>
inline void split(int64_t n, Slice&& slice) {
  for_blocks(n, parallel_worth(n), slice);
}
// An op value outside the enum is refused here, on the caller's thread: the slices' own check would throw inside an
// OpenMP region (std::terminate).
void check_unary_op(const UnaryParams& p, const char* kernel) {
  DEW_CHECK(p.op <= UnaryOp::softcap, "cpu ", kernel, ": unknown op ", int(p.op));
}
void check_same_numel(const Tensor& a, const Tensor& b, const char* kernel) {
  DEW_CHECK(a.numel() == b.numel(), "cpu ", kernel, ": ", shape_str(a.shape()), " vs ", shape_str(b.shape()),
            " (element counts differ)");
}

}  // namespace

// ---------------------------------------------------------------- unary

namespace {
// out = op(x) over one contiguous range on the caller's thread (one expression per element: any split gives the
// same bits). T: float, or bf16 bits.
template <class T>
void unary_slice(const T* xs, T* o, int64_t n, const UnaryParams& p) {
  const float al = p.alpha, be = p.beta;
  switch (p.op) {
    case UnaryOp::neg:
      map1_slice(xs, o, n, [](float v) { return -v; });
      break;
    case UnaryOp::exp:
      map1_slice(xs, o, n, [](float v) { return fast_exp(v); });
      break;
    case UnaryOp::log:
      map1_slice(xs, o, n, [](float v) { return std::log(v); });
      break;
    case UnaryOp::sqrt:
      map1_slice(xs, o, n, [](float v) { return std::sqrt(v); });
      break;
    case UnaryOp::rsqrt:
      map1_slice(xs, o, n, [](float v) { return 1.0f / std::sqrt(v); });
      break;
    case UnaryOp::square:
      map1_slice(xs, o, n, [](float v) { return v * v; });
      break;
    case UnaryOp::abs:
      map1_slice(xs, o, n, [](float v) { return std::fabs(v); });
      break;
    case UnaryOp::tanh:
      map1_slice(xs, o, n, [](float v) { return fast_tanh(v); });
      break;
    case UnaryOp::sigmoid:
      map1_slice(xs, o, n, [](float v) { return fast_sigmoid(v); });
      break;
    case UnaryOp::relu:
      map1_slice(xs, o, n, [](float v) { return v < 0.0f ? 0.0f : v; });
      break;
    case UnaryOp::gelu:
      map1_slice(xs, o, n, [](float v) { return 0.5f * v * (1.0f + std::erf(v * kSqrt1_2)); });
      break;
    case UnaryOp::gelu_tanh:
      gelu_tanh_fwd(xs, o, n);
      break;
    case UnaryOp::silu:
      silu_fwd(xs, o, n);
      break;
    case UnaryOp::sin:
      map1_slice(xs, o, n, [](float v) { return std::sin(v); });
      break;
    case UnaryOp::cos:
      map1_slice(xs, o, n, [](float v) { return std::cos(v); });
      break;
    case UnaryOp::reciprocal:
      map1_slice(xs, o, n, [](float v) { return 1.0f / v; });
      break;
    case UnaryOp::affine:
      map1_slice(xs, o, n, [al, be](float v) { return al * v + be; });
      break;
    case UnaryOp::pow:
      if (al == 2.0f)
        map1_slice(xs, o, n, [](float v) { return v * v; });
      else if (al == 1.0f)
        map1_slice(xs, o, n, [](float v) { return v; });
      else if (al == 0.5f)
        map1_slice(xs, o, n, [](float v) { return std::sqrt(v); });
      else
        map1_slice(xs, o, n, [al](float v) { return std::pow(v, al); });
      break;
    case UnaryOp::clamp:
      map1_slice(xs, o, n, [al, be](float v) {
        v = v < al ? al : v;  // NaN stays NaN (both compares are false)
        return v > be ? be : v;
      });
      break;
    case UnaryOp::softcap: {
      const float inv = 1.0f / al;
      map1_slice(xs, o, n, [al, inv](float v) { return al * fast_tanh(v * inv); });
      break;
    }
    default:
      DEW_CHECK(false, "cpu unary: unknown op ", int(p.op));
  }
}
}  // namespace

void unary(CpuBackend&, const Tensor& x, Tensor& out, const UnaryParams& p) {
  check_unary_op(p, "unary");
  check_same_numel(x, out, "unary");
  const int64_t n = x.numel();
  if (is_bf16_call(x)) {  // bf16 storage, f32 arithmetic: the f32 kernel's bits on the widened x, rounded once
    require_bf16(out, "unary", "out");
    const uint16_t* xs = x.data_as<uint16_t>();
    uint16_t* o = out.data_as<uint16_t>();
    return split(n, [&](int64_t lo, int64_t hi) { unary_slice(xs + lo, o + lo, hi - lo, p); });
  }
  require_f32(x, "unary", "x");
  require_f32(out, "unary", "out");
  const float* xs = x.data_as<float>();
  float* o = out.data_as<float>();
  split(n, [&](int64_t lo, int64_t hi) { unary_slice(xs + lo, o + lo, hi - lo, p); });
}

namespace {
// dx = dy * op'(x) over one contiguous range on the caller's thread (unary_backward's elements: the same
// expression per element whatever the range, so any split gives the same bits).
template <class T>
void unary_backward_slice(const T* xs, const T* g, T* o, int64_t n, const UnaryParams& p) {
  // map2_slice hands (x, dy) to each lambda.
  const float al = p.alpha, be = p.beta;
  switch (p.op) {
    case UnaryOp::neg:
      map2_slice(xs, g, o, n, [](float, float d) { return -d; });
      break;
    case UnaryOp::exp:
      map2_slice(xs, g, o, n, [](float v, float d) { return d * fast_exp(v); });
      break;
    case UnaryOp::log:
      map2_slice(xs, g, o, n, [](float v, float d) { return d / v; });
      break;
    case UnaryOp::sqrt:
      map2_slice(xs, g, o, n, [](float v, float d) { return d * 0.5f / std::sqrt(v); });
      break;
    case UnaryOp::rsqrt:
      map2_slice(xs, g, o, n, [](float v, float d) {
        const float r = 1.0f / std::sqrt(v);
        return -0.5f * d * r * r * r;
      });
      break;
    case UnaryOp::square:
      map2_slice(xs, g, o, n, [](float v, float d) { return 2.0f * v * d; });
      break;
    case UnaryOp::abs:
      map2_slice(xs, g, o, n, [](float v, float d) { return v > 0.0f ? d : (v < 0.0f ? -d : 0.0f); });
      break;
    case UnaryOp::tanh:
      map2_slice(xs, g, o, n, [](float v, float d) {
        const float t = fast_tanh(v);
        return d * (1.0f - t * t);
      });
      break;
    case UnaryOp::sigmoid:
      map2_slice(xs, g, o, n, [](float v, float d) {
        const float s = fast_sigmoid(v);
        return d * s * (1.0f - s);
      });
      break;
    case UnaryOp::relu:
      map2_slice(xs, g, o, n, [](float v, float d) { return v > 0.0f ? d : 0.0f; });
      break;
    case UnaryOp::gelu:
      map2_slice(xs, g, o, n, [](float v, float d) {
        const float cdf = 0.5f * (1.0f + std::erf(v * kSqrt1_2));
        const float pdf = kInvSqrt2Pi * fast_exp(-0.5f * v * v);
        return d * (cdf + v * pdf);
      });
      break;
    case UnaryOp::gelu_tanh: {
      gelu_tanh_bwd(xs, g, o, n);
      break;
    }
    case UnaryOp::silu: {
      silu_bwd(xs, g, o, n);
      break;
    }
    case UnaryOp::sin:
      map2_slice(xs, g, o, n, [](float v, float d) { return d * std::cos(v); });
      break;
    case UnaryOp::cos:
      map2_slice(xs, g, o, n, [](float v, float d) { return -d * std::sin(v); });
      break;
    case UnaryOp::reciprocal:
      map2_slice(xs, g, o, n, [](float v, float d) {
        const float r = 1.0f / v;
        return -d * r * r;
      });
      break;
    case UnaryOp::affine:
      map2_slice(xs, g, o, n, [al](float, float d) { return al * d; });
      break;
    case UnaryOp::pow:
      if (al == 2.0f)
        map2_slice(xs, g, o, n, [](float v, float d) { return 2.0f * v * d; });
      else if (al == 1.0f)
        map2_slice(xs, g, o, n, [](float, float d) { return d; });
      else if (al == 0.0f)
        map2_slice(xs, g, o, n, [](float, float) { return 0.0f; });
      else
        map2_slice(xs, g, o, n, [al](float v, float d) { return d * al * std::pow(v, al - 1.0f); });
      break;
    case UnaryOp::clamp:
      map2_slice(xs, g, o, n, [al, be](float v, float d) { return (v > al && v < be) ? d : 0.0f; });
      break;
    case UnaryOp::softcap: {
      const float inv = 1.0f / al;
      map2_slice(xs, g, o, n, [inv](float v, float d) {
        const float t = fast_tanh(v * inv);
        return d * (1.0f - t * t);
      });
      break;
    }
    default:
      DEW_CHECK(false, "cpu unary_backward: unknown op ", int(p.op));
  }
}
}  // namespace

void unary_backward(CpuBackend&, const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p) {
  check_unary_op(p, "unary_backward");
  check_same_numel(x, dy, "unary_backward");
  check_same_numel(x, dx, "unary_backward");
  const int64_t n = x.numel();
  if (is_bf16_call(x)) {  // bf16 storage, f32 arithmetic (as unary)
    require_bf16(dy, "unary_backward", "dy");
    require_bf16(dx, "unary_backward", "dx");
    const uint16_t* xs = x.data_as<uint16_t>();
    const uint16_t* g = dy.data_as<uint16_t>();
    uint16_t* o = dx.data_as<uint16_t>();
    return split(n, [&](int64_t lo, int64_t hi) { unary_backward_slice(xs + lo, g + lo, o + lo, hi - lo, p); });
  }
  require_f32(x, "unary_backward", "x");
  require_f32(dy, "unary_backward", "dy");
  require_f32(dx, "unary_backward", "dx");
  const float* xs = x.data_as<float>();
  const float* g = dy.data_as<float>();
  float* o = dx.data_as<float>();
  split(n, [&](int64_t lo, int64_t hi) { unary_backward_slice(xs + lo, g + lo, o + lo, hi - lo, p); });
}

// ---------------------------------------------------------------- gated activation

namespace {

// Per activation: value(v) as `unary` computes it, and grad(v, d) = d * act'(v) as `unary_backward` does.
struct GatedSilu {
  [[gnu::always_inline]] static float value(float v) { return silu_value(v); }
  [[gnu::always_inline]] static float grad(float v, float d) {
    const float e = act_exp(act_arg(-v)), s = 1.0f / (1.0f + e);
    return d * (s + v * ((e * s) * s));
  }
};
struct GatedGeluTanh {
  [[gnu::always_inline]] static float value(float v) { return gelu_tanh_value(v); }
  [[gnu::always_inline]] static float grad(float v, float d) {
    const float e = act_exp(act_arg(-2.0f * kSqrt2OverPi * (v + kGeluC * v * v * v)));
    const float s = 1.0f / (1.0f + e);
    const float du2 = 2.0f * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * v * v);
    return d * (s + v * ((e * s) * s) * du2);
  }
};
struct GatedGelu {
  [[gnu::always_inline]] static float value(float v) { return 0.5f * v * (1.0f + std::erf(v * kSqrt1_2)); }
  [[gnu::always_inline]] static float grad(float v, float d) {
    const float cdf = 0.5f * (1.0f + std::erf(v * kSqrt1_2));
    const float pdf = kInvSqrt2Pi * fast_exp(-0.5f * v * v);
    return d * (cdf + v * pdf);
  }
};
struct GatedRelu {
  [[gnu::always_inline]] static float value(float v) { return v < 0.0f ? 0.0f : v; }
  [[gnu::always_inline]] static float grad(float v, float d) { return v > 0.0f ? d : 0.0f; }
};
struct GatedIdentity {  // Activation::none: the bilinear gate * up
  [[gnu::always_inline]] static float value(float v) { return v; }
  [[gnu::always_inline]] static float grad(float, float d) { return d; }
};

template <class A, class T>
void gated_fwd_slice(const T* g, const T* u, T* o, int64_t n) {
  map_chunks2(g, u, o, n, [](const float* gf, const float* uf, float* of, int64_t c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) of[i] = A::value(gf[i]) * uf[i];
  });
}
template <class A, class T>
void gated_bwd_slice(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n) {
  map_chunks3_2(g, u, dy, dg, du, n,
                [](const float* gf, const float* uf, const float* df, float* dgf, float* duf, int64_t c) {
#pragma omp simd
                  for (int64_t i = 0; i < c; ++i) {
                    const float v = gf[i], d = df[i], t = d * uf[i];  // every input of element i read before writing
                    duf[i] = d * A::value(v);
                    dgf[i] = A::grad(v, t);
                  }
                });
}

template <class F>
void with_gated_act(Activation act, F&& f) {
  switch (act) {
    case Activation::silu:
      return f(GatedSilu{});
    case Activation::gelu_tanh:
      return f(GatedGeluTanh{});
    case Activation::gelu:
      return f(GatedGelu{});
    case Activation::relu:
      return f(GatedRelu{});
    case Activation::none:
      return f(GatedIdentity{});
  }
  DEW_CHECK(false, "cpu gated_activation: unknown activation ", int(act));
}

}  // namespace

namespace {
template <class T>
void gated_activation_typed(const Tensor& gate, const Tensor& up, Tensor& out, Activation act) {
  const T* g = gate.data_as<T>();
  const T* u = up.data_as<T>();
  T* o = out.data_as<T>();
  with_gated_act(act, [&](auto a) {
    using A = decltype(a);
    split(gate.numel(), [&](int64_t lo, int64_t hi) { gated_fwd_slice<A>(g + lo, u + lo, o + lo, hi - lo); });
  });
}
template <class T>
void gated_activation_backward_typed(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup,
                                     Activation act) {
  const T* g = gate.data_as<T>();
  const T* u = up.data_as<T>();
  const T* d = dy.data_as<T>();
  T* dg = dgate.data_as<T>();
  T* du = dup.data_as<T>();
  with_gated_act(act, [&](auto a) {
    using A = decltype(a);
    split(gate.numel(), [&](int64_t lo, int64_t hi) {
      gated_bwd_slice<A>(g + lo, u + lo, d + lo, dg + lo, du + lo, hi - lo);
    });
  });
}
}  // namespace

void gated_activation(CpuBackend&, const Tensor& gate, const Tensor& up, Tensor& out, Activation act) {
  contracts::check_gated("cpu.gated_activation", gate, {{&up, "up"}, {&out, "out"}});
  if (is_bf16_call(gate)) {  // bf16 storage, f32 arithmetic: the f32 kernel's bits on widened inputs, rounded once
    for (const Tensor* t : std::initializer_list<const Tensor*>{&up, &out})
      require_bf16(*t, "gated_activation", "up / out");
    return gated_activation_typed<uint16_t>(gate, up, out, act);
  }
  require_f32(gate, "gated_activation", "gate");
  gated_activation_typed<float>(gate, up, out, act);
}

void gated_activation_backward(CpuBackend&, const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                               Tensor& dup, Activation act) {
  contracts::check_gated("cpu.gated_activation_backward", gate,
                         {{&up, "up"}, {&dy, "dy"}, {&dgate, "dgate"}, {&dup, "dup"}});
  if (is_bf16_call(gate)) {  // as gated_activation
    for (const Tensor* t : std::initializer_list<const Tensor*>{&up, &dy, &dgate, &dup})
      require_bf16(*t, "gated_activation_backward", "up / dy / dgate / dup");
    return gated_activation_backward_typed<uint16_t>(gate, up, dy, dgate, dup, act);
  }
  require_f32(gate, "gated_activation_backward", "gate");
  gated_activation_backward_typed<float>(gate, up, dy, dgate, dup, act);
}

// ---------------------------------------------------------------- binary

namespace {

template <BinaryOp op>
inline float bin(float a, float b) {
  if constexpr (op == BinaryOp::add)
    return a + b;
  else if constexpr (op == BinaryOp::sub)
    return a - b;
  else if constexpr (op == BinaryOp::mul)
    return a * b;
  else if constexpr (op == BinaryOp::div)
    return a / b;
  else if constexpr (op == BinaryOp::maximum) {
    const float r = a > b ? a : b;
    return a != a ? a : (b != b ? b : r);
  } else if constexpr (op == BinaryOp::minimum) {
    const float r = a < b ? a : b;
    return a != a ? a : (b != b ? b : r);
  } else if constexpr (op == BinaryOp::eq)
    return a == b ? 1.0f : 0.0f;
  else if constexpr (op == BinaryOp::gt)
    return a > b ? 1.0f : 0.0f;
  else
    return a < b ? 1.0f : 0.0f;
}

// out[i] = a[i*sa] op b[i*sb] for i < n, with sa, sb in {0, 1} specialised (the vectorisable cases).
template <BinaryOp op>
inline void bin_inner(const float* a, const float* b, float* o, int64_t n, int64_t sa, int64_t sb) {
  if (sa == 1 && sb == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = bin<op>(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = bin<op>(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = bin<op>(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = bin<op>(a[i * sa], b[i * sb]);
  }
}

template <BinaryOp op>
void binary_impl(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* ap = a.data_as<float>();
  const float* bp = b.data_as<float>();
  float* op_ = out.data_as<float>();
  const int64_t n = out.numel();
  const int64_t na = a.numel(), nb = b.numel();
  // Fast paths: same element count (same shape after broadcasting), or one scalar operand.
  if ((na == n && nb == n) || (na == n && nb == 1) || (na == 1 && nb == n)) {
    const int64_t sa = na == n ? 1 : 0, sb = nb == n ? 1 : 0;
    if (!parallel_worth(n)) {
      bin_inner<op>(ap, bp, op_, n, sa, sb);
      return;
    }
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = (n * t / nt) & ~int64_t(15), hi = t == nt - 1 ? n : (n * (t + 1) / nt) & ~int64_t(15);
      if (lo < hi) bin_inner<op>(ap + lo * sa, bp + lo * sb, op_ + lo, hi - lo, sa, sb);
    }
    return;
  }
  // General broadcasting: right-align, zero the strides of broadcast dims, coalesce.
  const Shape& os = out.shape();
  const contracts::StridedPair plan = contracts::coalesce(os, contracts::broadcast_strides("cpu.binary", a.shape(), os),
                                                           contracts::broadcast_strides("cpu.binary", b.shape(), os));
  const std::vector<int64_t>&shape = plan.shape, &sa = plan.a, &sb = plan.b;
  const int64_t inner = shape.back(), isa = sa.back(), isb = sb.back();
  const int64_t outer = n / inner;
  for_rows(outer, parallel_worth(n) && outer > 1, [&](int64_t begin, int64_t end) {
    walk_rows(shape, sa, sb, begin, end, [&](int64_t r, int64_t ao, int64_t bo) {
      bin_inner<op>(ap + ao, bp + bo, op_ + r * inner, inner, isa, isb);
    });
  });
}

}  // namespace

void binary(CpuBackend& self, const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  if (is_bf16_call(a)) return binary_bf16(self, a, b, out, op);  // half.cpp
  require_f32(a, "binary", "a");
  require_f32(b, "binary", "b");
  require_f32(out, "binary", "out");
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::add:
      binary_impl<BinaryOp::add>(a, b, out);
      break;
    case BinaryOp::sub:
      binary_impl<BinaryOp::sub>(a, b, out);
      break;
    case BinaryOp::mul:
      binary_impl<BinaryOp::mul>(a, b, out);
      break;
    case BinaryOp::div:
      binary_impl<BinaryOp::div>(a, b, out);
      break;
    case BinaryOp::maximum:
      binary_impl<BinaryOp::maximum>(a, b, out);
      break;
    case BinaryOp::minimum:
      binary_impl<BinaryOp::minimum>(a, b, out);
      break;
    case BinaryOp::eq:
      binary_impl<BinaryOp::eq>(a, b, out);
      break;
    case BinaryOp::gt:
      binary_impl<BinaryOp::gt>(a, b, out);
      break;
    case BinaryOp::lt:
      binary_impl<BinaryOp::lt>(a, b, out);
      break;
    default:
      DEW_CHECK(false, "cpu binary: unknown op ", int(op));
  }
}

// ---------------------------------------------------------------- reduce

namespace {

// Accumulator of one reduction: sums in double; max/min in float with a NaN flag (NaN wins).
struct Acc {
  double s = 0.0;
  float m = 0.0f;
  bool nan = false;
};

// Reduces x[r * inner] for r in [r0, r1) into acc (one output column), op-specific.
inline void reduce_strided(const float* x, int64_t r0, int64_t r1, int64_t inner, ReduceOp op, Acc& acc) {
  if (op == ReduceOp::max || op == ReduceOp::min) {
    float m = acc.m;
    bool nan = acc.nan;
    const bool mx = op == ReduceOp::max;
    if (inner == 1) {
#pragma omp simd reduction(|| : nan)
      for (int64_t r = r0; r < r1; ++r) nan = nan || x[r] != x[r];
      if (mx) {
#pragma omp simd reduction(max : m)
        for (int64_t r = r0; r < r1; ++r) m = x[r] > m ? x[r] : m;
      } else {
#pragma omp simd reduction(min : m)
        for (int64_t r = r0; r < r1; ++r) m = x[r] < m ? x[r] : m;
      }
    } else {
      for (int64_t r = r0; r < r1; ++r) {
        const float v = x[r * inner];
        nan = nan || v != v;
        m = mx ? std::max(m, v) : std::min(m, v);
      }
    }
    acc.m = m;
    acc.nan = nan;
    return;
  }
  double s = acc.s;
  if (op == ReduceOp::sumsq) {
    if (inner == 1) {
#pragma omp simd reduction(+ : s)
      for (int64_t r = r0; r < r1; ++r) s += double(x[r]) * double(x[r]);
    } else {
      for (int64_t r = r0; r < r1; ++r) s += double(x[r * inner]) * double(x[r * inner]);
    }
  } else {
    if (inner == 1) {
#pragma omp simd reduction(+ : s)
      for (int64_t r = r0; r < r1; ++r) s += double(x[r]);
    } else {
      for (int64_t r = r0; r < r1; ++r) s += double(x[r * inner]);
    }
  }
  acc.s = s;
}

inline float finish(const Acc& a, ReduceOp op, int64_t count) {
  switch (op) {
    case ReduceOp::max:
    case ReduceOp::min:
      return a.nan ? NAN : a.m;
    case ReduceOp::mean:
      return float(a.s / double(count));
    default:
      return float(a.s);
  }
}

inline Acc start(const float* x, ReduceOp op) {
  Acc a;
  if (op == ReduceOp::max || op == ReduceOp::min) a.m = x[0];
  return a;
}

// sp[j] += x[r, j0 + j] (squared when `sq`) for rows r in [r0, r1) in order, j < w, in double; rows are
// `inner` elements apart. The one accumulation of the column sums (reduce_columns, reduce_row_split). T: float or
// bf16 bits (widened exactly; each column is summed row by row, so the lanes do not change its order: a bf16 x
// sums to the bits of its widening).
template <class T>
void add_rows(const T* x, int64_t r0, int64_t r1, int64_t inner, int64_t j0, int64_t w, bool sq, double* sp) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * inner + j0;
    if (sq) {
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) sp[j] += double(ld(row[j])) * double(ld(row[j]));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) sp[j] += double(ld(row[j]));
    }
  }
}

// A block of columns [j0, j1) over all reduce rows, vectorised across columns (inner > 1). T: as add_rows (out
// rounded once).
template <class T>
void reduce_columns(const T* x, T* out, int64_t reduce, int64_t inner, int64_t j0, int64_t j1, ReduceOp op) {
  const int64_t w = j1 - j0;
  if (op == ReduceOp::max || op == ReduceOp::min) {
    std::vector<float> m(static_cast<size_t>(w));
    for (int64_t j = 0; j < w; ++j) m[size_t(j)] = ld(x[j0 + j]);
    std::vector<char> nan(size_t(w), 0);
    const bool mx = op == ReduceOp::max;
    for (int64_t r = 0; r < reduce; ++r) {
      const T* row = x + r * inner + j0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const float v = ld(row[j]);
        nan[size_t(j)] |= char(v != v);
        m[size_t(j)] = mx ? (v > m[size_t(j)] ? v : m[size_t(j)]) : (v < m[size_t(j)] ? v : m[size_t(j)]);
      }
    }
    for (int64_t j = 0; j < w; ++j) st(out + j0 + j, nan[size_t(j)] ? NAN : m[size_t(j)]);
    return;
  }
  std::vector<double> s(size_t(w), 0.0);
  double* sp = s.data();
  add_rows(x, 0, reduce, inner, j0, w, op == ReduceOp::sumsq, sp);
  const double scale = op == ReduceOp::mean ? 1.0 / double(reduce) : 1.0;
  for (int64_t j = 0; j < w; ++j) st(out + j0 + j, float(op == ReduceOp::mean ? sp[j] * scale : sp[j]));
}

// One sum over the rows of [red, inner] (a bias gradient) on `nthreads` threads: each thread sums its own
// contiguous block of rows into double partials for every column, and the partials are added in thread
// order, so the result depends on the thread count (the double partials round differently), like the
// inner == 1 split above; a run resumes bit for bit at the same count. Why not blocks of columns: every
// thread then walks every row (half of each, on 2 threads), rows the other core wrote last; on the AVX2 EPYC
// the DiT's 60 bias gradients per step took 4.4-7.1 ms at 2 threads that way against 4.5 at 1, and 2.1-3.6
// split by rows (`dew-bench train --config dit --threads 2 --profile`, alternated).
constexpr int64_t kRowSplitMaxInner = int64_t(1) << 16;  // partials: nthreads x inner doubles
template <class T>
void reduce_row_split(const T* x, T* out, int64_t red, int64_t inner, ReduceOp op, int nthreads) {
  ThreadPartials part(nthreads, inner);
  const bool sq = op == ReduceOp::sumsq;
#pragma omp parallel num_threads(nthreads)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    add_rows(x, red * t / nt, red * (t + 1) / nt, inner, 0, inner, sq, part.of(t));
  }
  const double scale = op == ReduceOp::mean ? 1.0 / double(red) : 1.0;
  for (int64_t j = 0; j < inner; ++j) {
    double s = part.of(0)[j];
    for (int t = 1; t < nthreads; ++t) s += part.of(t)[j];
    st(out + j, float(op == ReduceOp::mean ? s * scale : s));
  }
}

// Column reductions (inner > 1, red > 0) of float or bf16 storage: reduce_row_split for one outer row on several
// threads (sums), else blocks of columns. Every column is summed row by row in order, so a bf16 x gives the bits
// of its widening (then rounded once).
template <class T>
void reduce_inner(const T* xs, T* o, int64_t outer, int64_t red, int64_t inner, ReduceOp op) {
  const int nthreads = omp_get_max_threads();
  const bool par = parallel_worth(outer * red * inner);
  // one outer row (a bias gradient) on several threads: split the rows (reduce_row_split).
  if (par && outer == 1 && op != ReduceOp::max && op != ReduceOp::min && red >= 4 * nthreads &&
      inner <= kRowSplitMaxInner)
    return reduce_row_split(xs, o, red, inner, op, nthreads);
  // otherwise: columns are contiguous; tile them in blocks and parallelise over (outer, block). Blocks are
  // as wide as the threads allow (up to 8192 columns of double accumulators): a narrow column strip walks the rows
  // with a page-sized stride, whole rows stream sequentially (the bias gradient of a [1024, 1024] activation: 0.34 ->
  // 0.22 ms cold). At least 64 columns (256-byte pieces of each row): the bias gradients of d = 256 layers then split
  // over 2 threads too (with a 256-column minimum they ran on one, 3.2 ms per DiT step at 2 threads against 2.7 at
  // 1). Every column is still summed row by row in order: the blocking changes no result.
  const int64_t want = par ? std::max<int64_t>(1, (nthreads + outer - 1) / outer) : 1;  // blocks per outer row
  const int64_t kBlock = std::clamp<int64_t>(((inner + want - 1) / want + 15) / 16 * 16, 64, 8192);
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  for_rows(outer * blocks, par, [=](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t oi = t / blocks, bi = t % blocks;
      const int64_t j0 = bi * kBlock, j1 = std::min(inner, j0 + kBlock);
      reduce_columns(xs + oi * red * inner, o + oi * inner, red, inner, j0, j1, op);
    }
  });
}

}  // namespace

void reduce(CpuBackend& self, const Tensor& x, Tensor& out, const ReduceParams& p) {
  const int64_t outer = p.outer, red = p.reduce, inner = p.inner;
  DEW_CHECK(outer >= 0 && red >= 0 && inner >= 0 && outer * red * inner == x.numel() && outer * inner == out.numel(),
            "cpu reduce: [", outer, ", ", red, ", ", inner, "] does not match x ", shape_str(x.shape()), " and out ",
            shape_str(out.shape()));
  if (is_bf16_call(x)) {
    require_bf16(out, "reduce", "out");
    if (out.numel() == 0) return;
    // Column reductions (bias gradients) over bf16 storage; row reductions (inner == 1, lane-ordered sums) and an
    // empty axis through f32 copies (widen, the f32 kernel, round once): the f32 kernel's bits either way.
    if (inner > 1 && red > 0)
      return reduce_inner(x.data_as<uint16_t>(), out.data_as<uint16_t>(), outer, red, inner, p.op);
    Tensor wx = Tensor::empty(x.shape(), DType::f32, x.backend_ptr()),
           wo = Tensor::empty(out.shape(), DType::f32, out.backend_ptr());
    self.cast(x, wx);
    reduce(self, wx, wo, p);
    return self.cast(wo, out);
  }
  require_f32(x, "reduce", "x");
  require_f32(out, "reduce", "out");
  if (out.numel() == 0) return;
  const float* xs = x.data_as<float>();
  float* o = out.data_as<float>();
  const ReduceOp op = p.op;
  if (red == 0) {
    DEW_CHECK(op != ReduceOp::max && op != ReduceOp::min, "cpu reduce: max/min over an empty axis");
    std::fill(o, o + out.numel(), op == ReduceOp::mean ? NAN : 0.0f);  // mean of nothing = 0/0
    return;
  }
  const int nthreads = omp_get_max_threads();
  const int64_t total = x.numel();
  const bool par = parallel_worth(total);

  if (inner == 1) {
    if (par && outer < nthreads) {
      // Few long rows: split each row over the threads and combine the partials in thread order.
      for (int64_t oi = 0; oi < outer; ++oi) {
        const float* row = xs + oi * red;
        std::vector<Acc> part(size_t(nthreads), start(row, op));
#pragma omp parallel num_threads(nthreads)
        {
          const int nt = omp_get_num_threads(), t = omp_get_thread_num();
          const int64_t r0 = red * t / nt, r1 = red * (t + 1) / nt;
          if (r0 < r1) reduce_strided(row, r0, r1, 1, op, part[size_t(t)]);
        }
        Acc acc = start(row, op);
        for (const Acc& a : part) {
          acc.s += a.s;
          acc.nan = acc.nan || a.nan;
          acc.m = op == ReduceOp::max ? std::max(acc.m, a.m) : std::min(acc.m, a.m);
        }
        o[oi] = finish(acc, op, red);
      }
      return;
    }
    for_rows(outer, par, [=](int64_t lo, int64_t hi) {
      for (int64_t oi = lo; oi < hi; ++oi) {
        const float* row = xs + oi * red;
        Acc acc = start(row, op);
        reduce_strided(row, 0, red, 1, op, acc);
        o[oi] = finish(acc, op, red);
      }
    });
    return;
  }
  reduce_inner(xs, o, outer, red, inner, op);  // inner > 1
}

// ---------------------------------------------------------------- unary_backward_sum

// dx as unary_backward writes it and dsum as reduce(sum) over dx's rows would give, at the same thread count,
// in one pass: gelu_tanh and silu add each row's values into the double column sums as they are stored
// (grad_rows_sum); the other ops compute a block of rows (unary_backward_slice) and add it while in cache
// (add_rows). With reduce's own split (reduce_row_split: a contiguous block of rows per
// thread, the double partials added in thread order when red >= 4 threads, else one sequential sum) the bits
// equal unary_backward then reduce, thread count for thread count; on one thread no OpenMP region is entered.
// bf16: dx as unary_backward stores it (f32 arithmetic, rounded once), the sums over those stored values.
namespace {
template <class T>
void unary_backward_sum_of(const T* xs, const T* g, T* o, T* s, int64_t d, int64_t rows, const UnaryParams& p) {
  const int64_t n = rows * d;
  const int nthreads = omp_get_max_threads();
  const int parts = parallel_worth(n) && rows >= 4 * nthreads && d <= kRowSplitMaxInner ? nthreads : 1;
  ThreadPartials part(parts, d);
  const int64_t chunk = std::max<int64_t>(1, 8192 / d);  // rows per block: ~32 KB of f32 dx, re-read from cache
  auto rows_into = [=, &part](int64_t r0, int64_t r1, int t) {
    double* acc = part.of(t);
    if (p.op == UnaryOp::gelu_tanh) {  // the MLP activations: one pass, the sums from the registers
      grad_rows_sum(xs, g, o, acc, d, r0, r1, [](float v, float dd) { return gelu_tanh_grad(v, dd); });
      return;
    }
    if (p.op == UnaryOp::silu) {
      grad_rows_sum(xs, g, o, acc, d, r0, r1, [](float v, float dd) { return silu_grad(v, dd); });
      return;
    }
    for (int64_t r = r0; r < r1; r += chunk) {  // any other op: blocks of rows, each summed while in cache
      const int64_t r2 = std::min(r1, r + chunk);
      unary_backward_slice(xs + r * d, g + r * d, o + r * d, (r2 - r) * d, p);
      add_rows(o, r, r2, d, 0, d, false, acc);
    }
  };
  if (parts == 1) {
    rows_into(0, rows, 0);
  } else {
#pragma omp parallel num_threads(parts)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      rows_into(rows * t / nt, rows * (t + 1) / nt, t);
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    double v = part.of(0)[j];
    for (int t = 1; t < parts; ++t) v += part.of(t)[j];
    st(s + j, float(v));  // as reduce stores a sum: to float, then (bf16) rounded once more
  }
}
}  // namespace

void unary_backward_sum(CpuBackend& self, const Tensor& x, const Tensor& dy, Tensor& dx, Tensor& dsum,
                        const UnaryParams& p) {
  contracts::check_unary_backward_sum("cpu.unary_backward_sum", x, dy, dx, dsum);
  check_unary_op(p, "unary_backward_sum");
  const int64_t d = last_dim(x), rows = rows_of(x);
  if (d == 0) return;
  if (is_bf16_call(x)) {  // bf16 storage, f32 arithmetic (as unary_backward), the sums of the stored bf16 dx
    if (rows == 0) {
      std::fill_n(dsum.data_as<uint16_t>(), d, uint16_t(0));  // +0's bits
      return;
    }
    return unary_backward_sum_of(x.data_as<uint16_t>(), dy.data_as<uint16_t>(), dx.data_as<uint16_t>(),
                                 dsum.data_as<uint16_t>(), d, rows, p);
  }
  require_f32(x, "unary_backward_sum", "x");
  float* s = dsum.data_as<float>();
  if (rows == 0) {
    std::fill(s, s + d, 0.0f);
    return;
  }
  unary_backward_sum_of(x.data_as<float>(), dy.data_as<float>(), dx.data_as<float>(), s, d, rows, p);
}

// ---------------------------------------------------------------- argmax

namespace {

// The first index of the row's largest value, or of its first NaN when it holds one. One pass in 16 lanes: each
// lane keeps its largest value and that value's first index (only a strictly greater value replaces it) and its
// first NaN; then the lanes and the tail: any NaN gives the lowest NaN index, else the lowest index of the largest
// value. Exact on every path (comparisons only). It was a scalar loop with a branch per element: 2.6 GB/s over a
// 50,304-token vocabulary's logits (dew-bench kernels --only loss; the LM objective's token accuracy reads them
// every step).
int32_t row_argmax(const float* row, int64_t d) {
  constexpr int64_t L = 16;
  constexpr int32_t kNone = INT32_MAX;
  float best = row[0];
  int64_t at = 0, nan_at = best != best ? 0 : kNone;
  int64_t j = 0;
  if (d >= L) {
    alignas(64) static constexpr int32_t kNones[L] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone,
                                                      kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
    const vi none = viload(kNones);  // (a load: viset here was left out of line, a 64-byte return)
    vf lane_best = vload(row);
    vi lane_at = iota();
    vi lane_nan = vsel(lane_best != lane_best, iota(), none);
    for (j = L; j + L <= d; j += L) {
      const vf x = vload(row + j);
      const vi idx = iota() + int32_t(j);
      const vi greater = x > lane_best;
      lane_best = vsel(greater, x, lane_best);
      lane_at = vsel(greater, idx, lane_at);
      lane_nan = vsel((x != x) & (lane_nan == none), idx, lane_nan);
    }
    alignas(64) float bv[L];
    alignas(64) int32_t bi[L], bn[L];
    vstore(bv, lane_best);
    vstore(reinterpret_cast<float*>(bi), (vf)lane_at);
    vstore(reinterpret_cast<float*>(bn), (vf)lane_nan);
    best = -INFINITY;
    at = kNone;
    for (int64_t k = 0; k < L; ++k) {  // (a row of -inf: lane 0 ties best = -inf at the lowest index)
      nan_at = std::min<int64_t>(nan_at, bn[k]);
      if (bv[k] > best || (bv[k] == best && bi[k] < at)) best = bv[k], at = bi[k];
    }
  }
  for (; j < d; ++j) {  // the tail (or a row shorter than a vector), in order
    if (row[j] != row[j]) nan_at = std::min<int64_t>(nan_at, j);
    if (row[j] > best) best = row[j], at = j;
  }
  return int32_t(nan_at != kNone ? nan_at : at);
}

}  // namespace

void argmax(CpuBackend& self, const Tensor& x, Tensor& out) {
  require_f32(x, "argmax", "x");
  require_i32(out, "argmax", "out");
  const int64_t d = last_dim(x), rows = rows_of(x);
  DEW_CHECK(d > 0, "cpu argmax: empty last axis in ", shape_str(x.shape()));
  DEW_CHECK(d <= INT32_MAX, "cpu argmax: the last axis has ", d, " elements, more than an i32 index holds");
  DEW_CHECK(out.numel() == rows, "cpu argmax: out has ", out.numel(), " elements for ", rows, " rows");
  const float* xs = x.data_as<float>();
  int32_t* o = out.data_as<int32_t>();
  for_rows(rows, parallel_worth(x.numel()), [=](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) o[r] = row_argmax(xs + r * d, d);
  });
}

#endif  // DEW_CPU_ISA
