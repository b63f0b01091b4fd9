// dew/kernel_contracts.hpp — the device-independent half of the kernels: argument checks and the
// strided-iteration plans that every backend (ref, cpu, cuda, a third party's) needs, written once.
//
// Each check throws dew::Error naming the caller (`who`, e.g. "cpu.strided_copy") and what is wrong;
// a backend calls them before touching memory, so every backend refuses the same bad arguments with the
// same words. Plans are pure functions of shapes and strides (no device memory is read).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"

namespace dew::contracts {

// A convolution's output length along one axis: (in + 2 pad - dilation (kernel - 1) - 1) / stride + 1, and 0 when
// the kernel's extent is past the padded input (C++ division rounds toward zero: written plainly, an extent one
// longer than the input gave 1 under a stride of 2 where PyTorch and cuDNN give none).
inline int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

// A tensor seen as [rows, last]: the last dimension (1 for a 0-d tensor) and the product of the others.
inline int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.shape().back(); }
inline int64_t rows_of(const Tensor& t) {
  const int64_t d = last_dim(t);
  return d == 0 ? 0 : t.numel() / d;
}

// layer_norm's weight groups (dew/kernel_table.hpp): G when the defined tensors of `params` (weight, bias; or
// weight, dweight, dbias) are all [G, D] with rows % G == 0, 1 when they are all [D] (or none is defined);
// anything else throws naming `who` ("cpu.layer_norm"). Row r then uses parameter row r / (rows / G).
inline int64_t norm_groups(const char* who, int64_t rows, int64_t dim, std::initializer_list<const Tensor*> params) {
  int64_t g = -1;
  for (const Tensor* t : params) {
    if (!t->defined()) continue;
    const int64_t tg = t->ndim() == 2 ? t->shape()[0] : 1;
    DEW_CHECK((t->ndim() == 1 || t->ndim() == 2) && t->shape().back() == dim && (g < 0 || tg == g), who,
              ": weight / bias (and their gradients) must all be [", dim, "] or all [G, ", dim, "], got ",
              shape_str(t->shape()));
    g = tg;
  }
  if (g < 0) return 1;
  DEW_CHECK(g > 0 && rows % g == 0, who, ": ", rows, " rows do not split into ", g, " equal groups");
  return g;
}

// The weight-only matmul form (dew/generate.hpp, store_matmul_weights_as): f32 activations `a` against a bf16
// weight `b`, or a quantized i8 one (b.quantized(): i8 with f32 scales, dew/tensor.hpp), f32 accumulation and
// output, the one matmul whose operands differ in dtype. The core lets it through linear() for inference only;
// a backend takes bf16 natively or widens the weight itself, and takes i8 when supports(matmul, i8) says so
// (otherwise the core hands it the dequantized f32 weight: core/ops/linalg.cpp).
// A weight in panels (dew/tensor.hpp: f32 or bf16, b.panel_rows() > 0, made for a backend that asked for them)
// takes the same form, f32 included.
inline bool is_weight_only_matmul(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == DType::f32 &&
         (b.dtype() == DType::bf16 || (b.dtype() == DType::i8 && b.quantized()) || b.panel_rows() > 0);
}

// The widened product (a backward's gradient product under autocast, core/ops/linalg.cpp product_gradient): half
// operands `a` and `b` of one dtype (bf16 or f16) into an f32 `out`, with no bias and no activation. The f32
// accumulation is stored as it is, not rounded to the half dtype (with beta, alpha acc + beta out in f32), so the
// gradient of an f32 operand that autocast lowered comes back in f32 without a half round trip and a cast pass. Every
// backend takes it (ref, cpu, cuda natively; a half dtype a backend does not support reaches its f32 kernel through
// the core's conversion, which widens the operands and keeps the f32 output: the same product).
inline bool is_widened_matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  const auto half = [](DType t) { return t == DType::bf16 || t == DType::f16; };
  return a.defined() && b.defined() && out.defined() && half(a.dtype()) && b.dtype() == a.dtype() &&
         out.dtype() == DType::f32;
}
// Throws naming `who` unless a widened product's call is one: no bias, no activation.
inline void check_widened_matmul(const std::string& who, const Tensor& bias, const MatmulParams& p) {
  DEW_CHECK(!bias.defined() && p.act == Activation::none, who,
            ": a widened product (half a and b, f32 out) takes no bias and no activation");
}

// A quantized weight as linear() multiplies it: i8 [n, k] (2-D, n rows of k) with f32 scales [n, G], G >= 1
// dividing k, on b's backend. Returns G.
inline int64_t check_quantized_weight(const std::string& who, const Tensor& b) {
  DEW_CHECK(b.dtype() == DType::i8 && b.quantized() && b.ndim() == 2, who, ": a quantized weight is a 2-D i8 tensor "
            "with scales; got ", dtype_name(b.dtype()), " ", shape_str(b.shape()), b.quantized() ? "" : " without scales");
  const Tensor s = b.scales();
  DEW_CHECK(s.dtype() == DType::f32 && s.ndim() == 2 && s.size(0) == b.size(0) && s.size(1) >= 1 &&
                b.size(1) % s.size(1) == 0 && s.backend_ptr() == b.backend_ptr(),
            who, ": the scales ", dtype_name(s.dtype()), " ", shape_str(s.shape()), " of a ", shape_str(b.shape()),
            " weight must be f32 [", b.size(0), ", G] with G dividing ", b.size(1), ", on the weight's backend");
  return s.size(1);
}

// A strided iteration over `shape` reading two operands with element strides a and b.
struct StridedPair {
  Shape shape;
  std::vector<int64_t> a, b;
};
// Drops unit axes and merges each axis into the next when both operands are contiguous across them
// (stride[i] == stride[i+1] * shape[i+1]); at least one axis remains (shape {1}, strides {1} when all
// axes were units). The iteration visits the same elements in the same order.
StridedPair coalesce(const Shape& shape, const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// Element strides of `in` broadcast (numpy rules, right-aligned) to `out`: 0 along broadcast axes.
// Throws when `in` has more axes than `out` or an axis that is neither equal nor 1.
std::vector<int64_t> broadcast_strides(const std::string& who, const Shape& in, const Shape& out);

// strided_copy: equal dtypes, one stride per axis on each side, and every address the copy touches
// inside its tensor (negative strides allowed). Returns the coalesced plan (src = a, dst = b); its
// shape is empty when there is nothing to copy.
StridedPair check_strided_copy(const std::string& who, const Tensor& src, const Tensor& dst,
                               const StridedCopyParams& p);
// The same without the dtype check, for buffers of src_numel and dst_numel elements.
StridedPair check_strided_copy(const std::string& who, const StridedCopyParams& p, int64_t src_numel,
                               int64_t dst_numel);

// gather_rows / scatter_add_rows: table [R, D] or [Bs, R, D] with Bs in {1, B}, idx i32 [K] or [B, K],
// rows (out / dout) of the table's dtype with B * K * D elements. The index values are checked by each
// backend where the indices live (host loop, device error word).
struct RowsShape {
  int64_t Bs, R, D, B, K;
};
RowsShape check_rows(const std::string& who, const Tensor& table, const Tensor& idx, const Tensor& rows);

// rope: the rotation frequency of pair i (0 <= i < rotary_dim / 2) in double, theta^(-2i/rotary_dim) rescaled by
// `scaling` (RopeScaling, dew/backend.hpp: Hugging Face's linear, llama3 and yarn formulas, in double where
// transformers computes in f32). Every backend builds its angles from it.
double rope_frequency(double theta, int64_t rotary_dim, int64_t i, const RopeScaling& scaling);
// Refuses a scaling no formula above defines (factor < 1, low_freq_factor >= high_freq_factor, ...), naming `who`.
void check_rope_scaling(const std::string& who, const RopeScaling& scaling);

// attention's segment_ids (AttentionParams): undefined, or i32 [B, S], contiguous, with q_offset >= 0 and
// q_offset + T <= S (query t's document is segment_ids[b, q_offset + t]). Returns whether they are given.
inline bool check_attention_segments(const std::string& who, const Tensor& segment_ids, int64_t B, int64_t T,
                                     int64_t S, int64_t q_offset) {
  if (!segment_ids.defined()) return false;
  DEW_CHECK(segment_ids.dtype() == DType::i32, who, ": segment_ids must be i32, got ", dtype_name(segment_ids.dtype()));
  DEW_CHECK(segment_ids.ndim() == 2 && segment_ids.size(0) == B && segment_ids.size(1) == S, who, ": segment_ids ",
            shape_str(segment_ids.shape()), " must be [B, S] = [", B, ", ", S, "]");
  DEW_CHECK(q_offset >= 0 && q_offset + T <= S, who, ": with segment_ids the queries (q_offset ", q_offset, ", T ", T,
            ") must lie inside the ", S, " keys");
  return true;
}

// gated_activation (+ backward): gate is defined and floating, and every other tensor named is defined, of
// gate's dtype and of its element count (the shapes may differ: the kernels are elementwise).
inline void check_gated(const std::string& who, const Tensor& gate,
                        std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  DEW_CHECK(gate.defined() && is_floating(gate.dtype()), who, ": gate must be a defined floating tensor");
  for (const auto& [t, name] : others) {
    DEW_CHECK(t->defined(), who, ": ", name, " is undefined");
    DEW_CHECK(t->dtype() == gate.dtype(), who, ": ", name, " is ", dtype_name(t->dtype()), ", gate is ",
              dtype_name(gate.dtype()));
    DEW_CHECK(t->numel() == gate.numel(), who, ": ", name, " ", shape_str(t->shape()), " and gate ",
              shape_str(gate.shape()), " differ in size");
  }
}

// unary_backward_sum: x is a defined floating tensor, dy and dx defined, of its dtype and element count, dsum
// defined, of its dtype, with last_dim(x) elements (x of no axes: one row of one).
inline void check_unary_backward_sum(const std::string& who, const Tensor& x, const Tensor& dy, const Tensor& dx,
                                     const Tensor& dsum) {
  DEW_CHECK(x.defined() && is_floating(x.dtype()), who, ": x must be a defined floating tensor");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&dy, "dy"}, {&dx, "dx"}}) {
    DEW_CHECK(t->defined() && t->dtype() == x.dtype() && t->numel() == x.numel(), who, ": ", name, " must be defined, ",
              dtype_name(x.dtype()), " with x's ", x.numel(), " elements");
  }
  DEW_CHECK(dsum.defined() && dsum.dtype() == x.dtype() && dsum.numel() == last_dim(x), who, ": dsum must be ",
            dtype_name(x.dtype()), " with ", last_dim(x), " elements (x's last axis), got ",
            dsum.defined() ? shape_str(dsum.shape()) : std::string("undefined"));
}

// gated_residual (+ backward): f is a defined floating [rows, D] tensor (D its last axis), gate a [G, D]
// tensor of f's dtype with G > 0 and rows % G == 0; every tensor of `same` is defined, of f's dtype and element
// count, every tensor of `like_gate` of gate's dtype and shape. Returns rows / G, the rows of one group.
inline int64_t gated_residual_group(const std::string& who, const Tensor& f, const Tensor& gate,
                                    std::initializer_list<std::pair<const Tensor*, const char*>> same,
                                    std::initializer_list<std::pair<const Tensor*, const char*>> like_gate) {
  DEW_CHECK(f.defined() && is_floating(f.dtype()), who, ": f must be a defined floating tensor");
  DEW_CHECK(gate.defined() && gate.dtype() == f.dtype(), who, ": gate must be defined and of f's dtype ",
            dtype_name(f.dtype()));
  const int64_t d = last_dim(f), rows = rows_of(f);
  DEW_CHECK(gate.ndim() == 2 && gate.shape()[1] == d && gate.shape()[0] > 0 && rows % gate.shape()[0] == 0, who,
            ": gate ", shape_str(gate.shape()), " must be [G, ", d, "] with G dividing the ", rows, " rows of f ",
            shape_str(f.shape()));
  for (const auto& [t, name] : same) {
    DEW_CHECK(t->defined(), who, ": ", name, " is undefined");
    DEW_CHECK(t->dtype() == f.dtype(), who, ": ", name, " is ", dtype_name(t->dtype()), ", f is ",
              dtype_name(f.dtype()));
    DEW_CHECK(t->numel() == f.numel(), who, ": ", name, " ", shape_str(t->shape()), " and f ", shape_str(f.shape()),
              " differ in size");
  }
  for (const auto& [t, name] : like_gate) {
    DEW_CHECK(t->defined() && t->dtype() == gate.dtype() && t->shape() == gate.shape(), who, ": ", name, " must be ",
              dtype_name(gate.dtype()), " ", shape_str(gate.shape()), " like gate");
  }
  return rows / gate.shape()[0];
}

}  // namespace dew::contracts
