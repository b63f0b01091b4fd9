// cuda/checks.cpp — the host-side validation of the cuda backend: supports(), dtype and shape checks,
// the coalescing of strided copies and broadcasts, and fill's bit patterns. Nothing here touches the
// device, so it runs (and is unit-tested, tests/backends_cuda) on machines without a GPU.
// Invariants: every check throws dew::Error naming the kernel ("cuda.<kernel>: ...") before anything is
// enqueued; supports() gives the same reason compute_type() throws with.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda_backend.hpp"
#include "dew/kernel_contracts.hpp"

namespace dew::cuda {

Support support_of(Kernel k, DType dtype) {
  switch (k) {
    case Kernel::fill:
    case Kernel::cast:
    case Kernel::strided_copy:
    case Kernel::gather_rows:
      return Support::yes();
    case Kernel::count_:
      return Support::no("not a kernel");
    default:
      break;
  }
  if (dtype == DType::f32 || dtype == DType::bf16) return Support::yes();
  if (dtype == DType::f64)
    return Support::no(std::string("cuda computes ") + kernel_name(k) +
                       " in f32 and bf16; f64 (double-precision gradient checks) runs on the ref backend");
  if (dtype == DType::f16)
    return Support::no(std::string("cuda computes ") + kernel_name(k) +
                       " in f32 and bf16, not f16; use bf16 (the range of f32) or f32");
  return Support::no(std::string(kernel_name(k)) + " needs a floating dtype (f32 or bf16), got " + dtype_name(dtype));
}

ST compute_type(const Tensor& t, Kernel k, const char* what) {
  DEW_CHECK(t.defined(), "cuda.", kernel_name(k), ": ", what, " is undefined");
  if (t.dtype() == DType::f32) return ST::f32;
  if (t.dtype() == DType::bf16) return ST::bf16;
  DEW_CHECK(false, "cuda.", kernel_name(k), ": ", what, " is ", dtype_name(t.dtype()), ": ",
            support_of(k, t.dtype()).reason);
  return ST::f32;
}

void expect_same(const Tensor& t, const Tensor& like, int64_t numel, Kernel k, const char* what) {
  DEW_CHECK(t.defined(), "cuda.", kernel_name(k), ": ", what, " is undefined");
  DEW_CHECK(t.dtype() == like.dtype(), "cuda.", kernel_name(k), ": ", what, " has dtype ", dtype_name(t.dtype()),
            ", expected ", dtype_name(like.dtype()));
  DEW_CHECK(t.numel() == numel, "cuda.", kernel_name(k), ": ", what, " has shape ", shape_str(t.shape()), " (",
            t.numel(), " elements), expected ", numel, " elements");
}

void expect_f32(const Tensor& t, int64_t numel, Kernel k, const char* what) {
  DEW_CHECK(t.defined(), "cuda.", kernel_name(k), ": ", what, " is undefined");
  DEW_CHECK(t.dtype() == DType::f32, "cuda.", kernel_name(k), ": ", what, " must be f32 (statistics are f32), got ",
            dtype_name(t.dtype()));
  DEW_CHECK(t.numel() == numel, "cuda.", kernel_name(k), ": ", what, " has shape ", shape_str(t.shape()), ", expected ",
            numel, " elements");
}

void expect_i32(const Tensor& t, int64_t numel, Kernel k, const char* what) {
  DEW_CHECK(t.defined(), "cuda.", kernel_name(k), ": ", what, " is undefined");
  DEW_CHECK(t.dtype() == DType::i32, "cuda.", kernel_name(k), ": ", what, " must be i32, got ", dtype_name(t.dtype()));
  DEW_CHECK(t.numel() == numel, "cuda.", kernel_name(k), ": ", what, " has shape ", shape_str(t.shape()), ", expected ",
            numel, " elements");
}

RowsDims check_rows(const Tensor& table, const Tensor& idx, const Tensor& rows, Kernel k) {
  return contracts::check_rows(std::string("cuda.") + kernel_name(k), table, idx, rows);
}

AttnDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, Kernel kern) {
  DEW_CHECK(q.defined() && k.defined() && v.defined(), "cuda.", kernel_name(kern), ": q, k or v is undefined");
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "cuda.", kernel_name(kern), ": q ", shape_str(q.shape()),
            ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()), " are not all [B, len, heads, D]");
  AttnDims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  DEW_CHECK(k.size(0) == d.B && v.size(0) == d.B && v.size(1) == d.S && v.size(2) == d.Hkv && k.size(3) == d.Dk,
            "cuda.", kernel_name(kern), ": q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
            shape_str(v.shape()), " do not match");
  DEW_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, "cuda.", kernel_name(kern), ": ", d.Hq,
            " query heads are not a multiple of ", d.Hkv, " kv heads");
  // The forward also reads a bf16 K/V cache under f32 queries (dew/kernel_table.hpp, attention).
  const bool bf16_kv =
      kern == Kernel::attention && q.dtype() == DType::f32 && k.dtype() == DType::bf16 && v.dtype() == DType::bf16;
  DEW_CHECK(bf16_kv || (k.dtype() == q.dtype() && v.dtype() == q.dtype()), "cuda.", kernel_name(kern), ": q ",
            dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()), ": one dtype",
            kern == Kernel::attention ? ", or f32 q over bf16 k and v" : "");
  DEW_CHECK(d.Dk <= kAttnMaxHeadDim && d.Dv <= kAttnMaxHeadDim, "cuda.", kernel_name(kern), ": head width ",
            std::max(d.Dk, d.Dv), " is above the ", kAttnMaxHeadDim, " the cuda attention kernel handles");
  return d;
}

const int32_t* attention_segments(const Tensor& segment_ids, const AttnDims& d, const AttentionParams& p, Kernel kern) {
  const bool given = contracts::check_attention_segments(std::string("cuda.") + kernel_name(kern), segment_ids, d.B,
                                                         d.T, d.S, p.q_offset);
  return given ? segment_ids.data_as<int32_t>() : nullptr;
}

ConvDims check_conv(const Shape& x, const Tensor& w, const Shape& y, const Conv2dParams& p, Kernel k) {
  DEW_CHECK(w.defined(), "cuda.", kernel_name(k), ": w is undefined");
  DEW_CHECK(x.size() == 4 && w.ndim() == 4 && y.size() == 4, "cuda.", kernel_name(k), ": x ", shape_str(x), ", w ",
            shape_str(w.shape()), ", y ", shape_str(y), " are not all 4-D (NCHW)");
  DEW_CHECK(p.groups > 0 && p.stride_h > 0 && p.stride_w > 0 && p.dilation_h > 0 && p.dilation_w > 0 && p.pad_h >= 0 &&
                p.pad_w >= 0,
            "cuda.", kernel_name(k), ": bad stride/padding/dilation/groups");
  ConvDims d{x[0], x[1], x[2], x[3], w.size(0), w.size(1), w.size(2), w.size(3), 0, 0};
  DEW_CHECK(d.C == d.Cg * p.groups && d.O % p.groups == 0, "cuda.", kernel_name(k), ": w ", shape_str(w.shape()),
            " does not fit ", d.C, " input channels in ", p.groups, " groups");
  d.OH = contracts::conv_output_size(d.H, d.KH, p.stride_h, p.pad_h, p.dilation_h);
  d.OW = contracts::conv_output_size(d.W, d.KW, p.stride_w, p.pad_w, p.dilation_w);
  const Shape expected{d.N, d.O, d.OH, d.OW};
  DEW_CHECK(y == expected, "cuda.", kernel_name(k), ": y is ", shape_str(y), ", expected ", shape_str(expected),
            " for x ", shape_str(x), " and w ", shape_str(w.shape()));
  const int64_t big = std::numeric_limits<int>::max();
  for (int64_t v : {d.N, d.C, d.H, d.W, d.O, d.OH, d.OW, d.KH, d.KW})
    DEW_CHECK(v <= big, "cuda.", kernel_name(k), ": dimension ", v, " exceeds cuDNN's int range");
  return d;
}

void check_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, const MatmulParams& p) {
  constexpr Kernel K = Kernel::matmul;
  DEW_CHECK(a.defined() && b.defined() && out.defined(), "cuda.matmul: a, b or out is undefined");
  DEW_CHECK(p.batch >= 1 && p.m >= 0 && p.n >= 0 && p.k >= 0, "cuda.matmul: bad sizes batch=", p.batch, " m=", p.m,
            " n=", p.n, " k=", p.k);
  DEW_CHECK(p.a_batch_stride >= 0 && p.b_batch_stride >= 0, "cuda.matmul: negative batch stride");
  DEW_CHECK(p.act == Activation::none || p.beta == 0.0f, "cuda.matmul: an activation epilogue requires beta == 0");
  const bool widened = contracts::is_widened_matmul(a, b, out);  // bf16 a, b into f32 out (f16: the core converts)
  if (widened) contracts::check_widened_matmul("cuda.matmul", bias, p);
  DEW_CHECK(b.dtype() == a.dtype() && (out.dtype() == a.dtype() || widened),
            "cuda.matmul: dtypes a=", dtype_name(a.dtype()), " b=", dtype_name(b.dtype()),
            " out=", dtype_name(out.dtype()), " differ");
  compute_type(a, K, "a");
  DEW_CHECK((p.batch - 1) * p.a_batch_stride + p.m * p.k <= a.numel(), "cuda.matmul: a (", a.numel(),
            " elements) is too small for batch=", p.batch, " stride=", p.a_batch_stride, " [", p.m, "x", p.k, "]");
  DEW_CHECK((p.batch - 1) * p.b_batch_stride + p.k * p.n <= b.numel(), "cuda.matmul: b (", b.numel(),
            " elements) is too small for batch=", p.batch, " stride=", p.b_batch_stride, " [", p.k, "x", p.n, "]");
  if (widened)
    DEW_CHECK(out.numel() == p.batch * p.m * p.n, "cuda.matmul: out has ", out.numel(), " elements, not ",
              p.batch * p.m * p.n);
  else
    expect_same(out, a, p.batch * p.m * p.n, K, "out");
  if (bias.defined()) expect_same(bias, a, p.n, K, "bias");
}

namespace {
// A coalesced two-operand iteration as the device kernels take it (at most kMaxRank axes).
StridedDesc to_desc(const contracts::StridedPair& plan, const char* who) {
  DEW_CHECK(plan.shape.size() <= size_t(kMaxRank), who, ": ", plan.shape.size(), " non-mergeable axes (at most ",
            kMaxRank, ")");
  StridedDesc d{};
  d.rank = int(plan.shape.size());
  for (int i = 0; i < d.rank; ++i) {
    d.shape[i] = plan.shape[size_t(i)];
    d.a[i] = plan.a[size_t(i)];
    d.b[i] = plan.b[size_t(i)];
  }
  return d;
}
}  // namespace

StridedDesc coalesce_copy(const StridedCopyParams& p, int64_t src_numel, int64_t dst_numel) {
  const contracts::StridedPair plan = contracts::check_strided_copy("cuda.strided_copy", p, src_numel, dst_numel);
  if (plan.shape.empty()) return StridedDesc{};
  return to_desc(plan, "cuda.strided_copy");
}

StridedDesc broadcast_desc(const Shape& a, const Shape& b, const Shape& out) {
  return to_desc(contracts::coalesce(out, contracts::broadcast_strides("cuda.binary", a, out),
                                     contracts::broadcast_strides("cuda.binary", b, out)),
                 "cuda.binary");
}

namespace {
template <class I>
uint64_t int_pattern(double v) {
  I r;
  if (v != v) {
    r = I(0);
  } else if (v <= double(std::numeric_limits<I>::min())) {
    r = std::numeric_limits<I>::min();
  } else if (v >= std::ldexp(1.0, std::numeric_limits<I>::digits)) {
    r = std::numeric_limits<I>::max();
  } else {
    r = I(v);
  }
  uint64_t out = 0;
  std::memcpy(&out, &r, sizeof(I));
  return out;
}
}  // namespace

uint64_t fill_pattern(DType dt, double value) {
  uint64_t out = 0;
  switch (dt) {
    case DType::f32: {
      const float f = float(value);
      std::memcpy(&out, &f, 4);
      return out;
    }
    case DType::f64:
      std::memcpy(&out, &value, 8);
      return out;
    case DType::bf16:
      return f32_to_bf16(float(value)).bits;
    case DType::f16:
      return f32_to_f16(float(value)).bits;
    case DType::i32:
      return int_pattern<int32_t>(value);
    case DType::i64:
      return int_pattern<int64_t>(value);
    case DType::u8:
      return int_pattern<uint8_t>(value);
    case DType::i8:
      return int_pattern<int8_t>(value);
  }
  return out;
}

}  // namespace dew::cuda
