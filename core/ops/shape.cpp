// core/ops/shape.cpp — views, permutes, slices, concatenation, broadcast/sum_to, casts and reductions.
// Views (reshape, slice0) share storage; everything else is one strided_copy or reduce kernel call.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_util.hpp"

namespace dew {

using namespace detail;

// ---------------------------------------------------------------- views

static Shape infer_shape(const Shape& shape, int64_t numel) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      DEW_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(shape));
      infer = int(i);
    } else {
      DEW_CHECK(out[i] >= 0, "reshape: bad dimension in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    DEW_CHECK(known > 0 && numel % known == 0, "reshape: cannot infer -1 in ", shape_str(shape), " for ", numel,
              " elements");
    out[size_t(infer)] = numel / known;
  }
  DEW_CHECK(numel_of(out) == numel, "reshape: ", numel, " elements cannot take shape ", shape_str(shape));
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape target = infer_shape(shape, x.numel());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl()->storage;
  impl->offset = x.impl()->offset;
  impl->shape = target;
  impl->dtype = x.dtype();
  if (x.quantized()) {  // rows stay rows only when the last axis does (dew/tensor.hpp)
    DEW_CHECK(x.ndim() >= 1 && !target.empty() && target.back() == x.shape().back(), "reshape: a quantized ",
              shape_str(x.shape()), " tensor keeps its last axis; ", shape_str(target), " does not");
    impl->scales = x.impl()->scales;
  }
  if (x.panel_rows() > 0) {  // panels are of a [n, k] tensor (dew/tensor.hpp)
    DEW_CHECK(target == x.shape(), "reshape: a weight in panels ", shape_str(x.shape()), " keeps its shape; ",
              shape_str(target), " does not");
    impl->panel = x.panel_rows();
  }
  Tensor out(std::move(impl));
  if (needs_grad({&x})) {
    Shape original = x.shape();
    record(
        out, {x}, [original](const Tensor& g) { return std::vector<Tensor>{reshape(g, original)}; }, "reshape");
  }
  return out;
}
Tensor Tensor::reshape(const Shape& shape) const { return dew::reshape(*this, shape); }

// Copies g into rows [begin, end) of a zero tensor of `shape` (the adjoint of slicing), along `axis`.
static Tensor embed_slice(const Tensor& g, const Shape& shape, int axis, int64_t begin) {
  Tensor out = Tensor::zeros(shape, g.dtype(), g.backend_ptr());
  if (g.numel() == 0) return out;
  StridedCopyParams p;
  p.shape = g.shape();
  p.src_strides = contiguous_strides(g.shape());
  p.dst_strides = contiguous_strides(shape);
  p.dst_offset = begin * p.dst_strides[size_t(axis)];
  kernels(g).strided_copy(g, out, p);
  return out;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  DEW_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape()[0], "slice0: [", begin, ", ", end,
            ") out of range for shape ", shape_str(shape()));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->dtype = impl_->dtype;
  impl->shape = impl_->shape;
  impl->shape[0] = end - begin;
  impl->offset = impl_->offset + size_t(begin * (numel() / std::max<int64_t>(shape()[0], 1)));
  if (quantized()) {  // the scales of the rows kept (rows of the last axis per leading index)
    DEW_CHECK(ndim() >= 2, "slice0: a 1-D quantized tensor is one row; it cannot be sliced");
    const int64_t per_lead = shape()[0] == 0 ? 0 : numel() / shape()[0] / shape().back();
    impl->scales = scales().slice0(begin * per_lead, end * per_lead).impl_ptr();
  }
  if (panel_rows() > 0) {  // whole panels only: their rows are where the row-major rows would be
    DEW_CHECK(begin % panel_rows() == 0 && end % panel_rows() == 0, "slice0: rows [", begin, ", ", end,
              ") of a weight in panels of ", panel_rows(), " rows cut a panel");
    impl->panel = panel_rows();
  }
  Tensor out(std::move(impl));
  if (needs_grad({this})) {
    Shape original = shape();
    record(
        out, {*this},
        [original, begin](const Tensor& g) { return std::vector<Tensor>{embed_slice(g, original, 0, begin)}; },
        "slice0");
  }
  return out;
}

// ---------------------------------------------------------------- copies

Tensor contiguous_copy(const Tensor& x) {
  Tensor out = x.clone();
  if (needs_grad({&x}))
    record(
        out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; }, "copy");
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  const int n = x.ndim();
  DEW_CHECK(int(dims.size()) == n, "permute: ", dims.size(), " dims for a ", n, "-d tensor");
  std::vector<int> inverse(size_t(n), -1);
  Shape out_shape(static_cast<size_t>(n));
  const auto src_st = contiguous_strides(x.shape());
  StridedCopyParams p;
  p.src_strides.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    const int d = norm_axis(dims[size_t(i)], n, "permute");
    DEW_CHECK(inverse[size_t(d)] < 0, "permute: axis ", d, " repeated");
    inverse[size_t(d)] = i;
    out_shape[size_t(i)] = x.shape()[size_t(d)];
    p.src_strides[size_t(i)] = src_st[size_t(d)];
  }
  p.shape = out_shape;
  p.dst_strides = contiguous_strides(out_shape);
  Tensor out = empty_as(x, out_shape);
  if (out.numel() > 0) kernels(x).strided_copy(x, out, p);
  if (needs_grad({&x})) {
    record(
        out, {x}, [inverse](const Tensor& g) { return std::vector<Tensor>{permute(g, inverse)}; }, "permute");
  }
  return out;
}

Tensor transpose(const Tensor& x, int a, int b) {
  std::vector<int> dims(size_t(x.ndim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[size_t(norm_axis(a, x.ndim(), "transpose"))], dims[size_t(norm_axis(b, x.ndim(), "transpose"))]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int axis, int64_t begin, int64_t end) {
  const int ax = norm_axis(axis, x.ndim(), "slice");
  const int64_t len = x.shape()[size_t(ax)];
  DEW_CHECK(0 <= begin && begin <= end && end <= len, "slice: [", begin, ", ", end, ") out of range for axis ", axis,
            " of shape ", shape_str(x.shape()));
  if (ax == 0) return x.slice0(begin, end);
  Shape out_shape = x.shape();
  out_shape[size_t(ax)] = end - begin;
  StridedCopyParams p;
  p.shape = out_shape;
  p.src_strides = contiguous_strides(x.shape());
  p.dst_strides = contiguous_strides(out_shape);
  p.src_offset = begin * p.src_strides[size_t(ax)];
  Tensor out = empty_as(x, out_shape);
  if (out.numel() > 0) kernels(x).strided_copy(x, out, p);
  if (needs_grad({&x})) {
    Shape original = x.shape();
    record(
        out, {x},
        [original, ax, begin](const Tensor& g) { return std::vector<Tensor>{embed_slice(g, original, ax, begin)}; },
        "slice");
  }
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  DEW_CHECK(!xs.empty(), "concat of nothing");
  const int ax = norm_axis(axis, xs[0].ndim(), "concat");
  Shape out_shape = xs[0].shape();
  out_shape[size_t(ax)] = 0;
  for (const Tensor& t : xs) {
    check_same_backend(t, xs[0], "concat");
    check_same_dtype(t, xs[0], "concat");
    DEW_CHECK(t.ndim() == xs[0].ndim(), "concat: rank mismatch");
    for (int i = 0; i < t.ndim(); ++i)
      DEW_CHECK(i == ax || t.shape()[size_t(i)] == xs[0].shape()[size_t(i)], "concat: shapes ", shape_str(t.shape()),
                " and ", shape_str(xs[0].shape()), " differ off axis ", axis);
    out_shape[size_t(ax)] += t.shape()[size_t(ax)];
  }
  Tensor out = empty_as(xs[0], out_shape);
  const auto dst_st = contiguous_strides(out_shape);
  int64_t at = 0;
  std::vector<int64_t> starts;
  bool grad = false;
  for (const Tensor& t : xs) {
    starts.push_back(at);
    grad = grad || needs_grad({&t});
    if (t.numel() > 0) {
      StridedCopyParams p;
      p.shape = t.shape();
      p.src_strides = contiguous_strides(t.shape());
      p.dst_strides = dst_st;
      p.dst_offset = at * dst_st[size_t(ax)];
      kernels(t).strided_copy(t, out, p);
    }
    at += t.shape()[size_t(ax)];
  }
  if (grad) {
    std::vector<int64_t> lens;
    for (const Tensor& t : xs) lens.push_back(t.shape()[size_t(ax)]);
    record(
        out, xs,
        [ax, starts, lens](const Tensor& g) {
          std::vector<Tensor> out;
          for (size_t i = 0; i < starts.size(); ++i) out.push_back(slice(g, ax, starts[i], starts[i] + lens[i]));
          return out;
        },
        "concat");
  }
  return out;
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  DEW_CHECK(shape.size() >= x.shape().size(), "broadcast_to: cannot broadcast ", shape_str(x.shape()), " to ",
            shape_str(shape));
  const size_t lead = shape.size() - x.shape().size();
  const auto src_st = contiguous_strides(x.shape());
  StridedCopyParams p;
  p.shape = shape;
  p.src_strides.assign(shape.size(), 0);
  for (size_t i = lead; i < shape.size(); ++i) {
    const int64_t d = x.shape()[i - lead];
    DEW_CHECK(d == shape[i] || d == 1, "broadcast_to: cannot broadcast ", shape_str(x.shape()), " to ",
              shape_str(shape));
    p.src_strides[i] = d == 1 ? 0 : src_st[i - lead];
  }
  p.dst_strides = contiguous_strides(shape);
  Tensor out = empty_as(x, shape);
  if (out.numel() > 0) kernels(x).strided_copy(x, out, p);
  if (needs_grad({&x})) {
    Shape original = x.shape();
    record(
        out, {x}, [original](const Tensor& g) { return std::vector<Tensor>{sum_to(g, original)}; }, "broadcast_to");
  }
  return out;
}

// The reduce kernel into `out` (allocated by the caller, x's dtype); an empty reduced axis gives zeros.
static void reduce_into(const Tensor& x, ReduceOp op, int64_t outer, int64_t r, int64_t inner, Tensor& out) {
  if (out.numel() == 0) return;
  if (r == 0)
    kernels(x).fill(out, 0.0);
  else
    kernels(x).reduce(x, out, ReduceParams{op, outer, r, inner});
}

static Tensor reduce_raw(const Tensor& x, ReduceOp op, int64_t outer, int64_t r, int64_t inner,
                         const Shape& out_shape) {
  Tensor out = empty_as(x, out_shape);
  reduce_into(x, op, outer, r, inner, out);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  DEW_CHECK(x.shape().size() >= shape.size(), "sum_to: cannot reduce ", shape_str(x.shape()), " to ", shape_str(shape));
  Tensor cur = x.detach();
  const size_t lead = x.shape().size() - shape.size();
  if (lead > 0) {
    int64_t lead_n = 1;
    for (size_t i = 0; i < lead; ++i) lead_n *= x.shape()[i];
    Shape rest(x.shape().begin() + long(lead), x.shape().end());
    cur = reduce_raw(cur, ReduceOp::sum, 1, lead_n, numel_of(rest), rest);
  }
  Shape cs = cur.shape();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (cs[i] == shape[i]) continue;
    DEW_CHECK(shape[i] == 1, "sum_to: cannot reduce ", shape_str(x.shape()), " to ", shape_str(shape));
    int64_t outer = 1, inner = 1;
    for (size_t j = 0; j < i; ++j) outer *= cs[j];
    for (size_t j = i + 1; j < cs.size(); ++j) inner *= cs[j];
    Shape next = cs;
    next[i] = 1;
    cur = reduce_raw(cur, ReduceOp::sum, outer, cs[i], inner, next);
    cs = next;
  }
  if (needs_grad({&x})) {
    Shape original = x.shape();
    record(
        cur, {x}, [original](const Tensor& g) { return std::vector<Tensor>{broadcast_to(g, original)}; }, "sum_to");
  }
  return cur;
}

Tensor quantize_int8(const Tensor& x, int64_t groups) {
  DEW_CHECK(x.ndim() >= 1 && is_floating(x.dtype()) && !x.quantized(), "quantize_int8: takes a floating tensor, got ",
            dtype_name(x.dtype()), " ", shape_str(x.shape()));
  const int64_t k = x.shape().back(), rows = k == 0 ? 0 : x.numel() / k;
  DEW_CHECK(groups >= 1 && k % groups == 0, "quantize_int8: ", groups, " groups do not divide the last axis (", k, ")");
  const int64_t per = k / groups;
  const std::vector<float> w = x.to_floats();
  std::vector<int8_t> q(w.size());
  std::vector<float> scales(size_t(rows * groups));
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float* src = w.data() + g * per;
    float amax = 0.0f;
    for (int64_t i = 0; i < per; ++i) {
      DEW_CHECK(std::isfinite(src[i]), "quantize_int8: row ", g / groups, " holds a value that is not finite");
      amax = std::max(amax, std::fabs(src[i]));
    }
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    scales[size_t(g)] = scale;
    for (int64_t i = 0; i < per; ++i)
      q[size_t(g * per + i)] = int8_t(std::clamp(std::nearbyint(src[i] / scale), -127.0f, 127.0f));
  }
  Tensor out = Tensor::from_host(q.data(), x.shape(), DType::i8, x.backend_ptr());
  out.impl()->scales = Tensor::from_host(scales.data(), {rows, groups}, DType::f32, x.backend_ptr()).impl_ptr();
  return out;
}

Tensor dequantize(const Tensor& x) {
  DEW_CHECK(x.quantized(), "dequantize: a ", dtype_name(x.dtype()), " tensor without scales is not quantized");
  Tensor raw = x.detach();
  raw.impl()->scales.reset();
  Tensor q = Tensor::empty(x.shape(), DType::f32, x.backend_ptr());
  if (q.numel() == 0) return q;
  kernels(x).cast(raw, q);
  const int64_t k = x.shape().back(), groups = x.scales().shape().back();
  return reshape(mul(reshape(q, {-1, groups, k / groups}), reshape(x.scales().detach(), {-1, groups, 1})), x.shape());
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.quantized()) return cast(dequantize(x), dtype);
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.backend_ptr());
  if (out.numel() > 0) kernels(x).cast(x, out);
  if (needs_grad({&x}) && is_floating(dtype)) {
    const DType from = x.dtype();
    record(
        out, {x}, [from](const Tensor& g) { return std::vector<Tensor>{cast(g, from)}; }, "cast");
  }
  return out;
}

// ---------------------------------------------------------------- reductions

static Tensor reduce_axis(const Tensor& x, int axis, bool keepdim, ReduceOp op, const char* name) {
  const int ax = norm_axis(axis, x.ndim(), name);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < ax; ++i) outer *= x.shape()[size_t(i)];
  for (int i = ax + 1; i < x.ndim(); ++i) inner *= x.shape()[size_t(i)];
  const int64_t r = x.shape()[size_t(ax)];
  Shape kept = x.shape();
  kept[size_t(ax)] = 1;
  Shape out_shape = kept;
  if (!keepdim) out_shape.erase(out_shape.begin() + ax);
  Tensor out = reduce_raw(x.detach(), op, outer, r, inner, out_shape);
  if ((op == ReduceOp::sum || op == ReduceOp::mean) && needs_grad({&x})) {
    Shape original = x.shape();
    // mean divides by the count in the gradient's own dtype: a float factor (scale) would round 1/r to f32
    // and cap f64 gradients at ~1e-8 relative accuracy.
    const double count = op == ReduceOp::mean ? double(std::max<int64_t>(r, 1)) : 1.0;
    record(
        out, {x},
        [original, kept, count](const Tensor& g) {
          Tensor gb = broadcast_to(reshape(g, kept), original);
          return std::vector<Tensor>{count == 1.0 ? gb : div_scalar(gb, count)};
        },
        name);
  }
  return out;
}

Tensor sum(const Tensor& x, int axis, bool keepdim) { return reduce_axis(x, axis, keepdim, ReduceOp::sum, "sum"); }
Tensor mean(const Tensor& x, int axis, bool keepdim) { return reduce_axis(x, axis, keepdim, ReduceOp::mean, "mean"); }
Tensor amax(const Tensor& x, int axis, bool keepdim) {
  return reduce_axis(x.detach(), axis, keepdim, ReduceOp::max, "amax");
}
Tensor sum(const Tensor& x) { return sum(reshape(x, {x.numel()}), 0, true); }
Tensor mean(const Tensor& x) { return mean(reshape(x, {x.numel()}), 0, true); }
Tensor sum_squares(const Tensor& x) { return reduce_raw(x.detach(), ReduceOp::sumsq, 1, x.numel(), 1, {1}); }

Tensor sum_squares_each(const std::vector<Tensor>& xs) {
  DEW_CHECK(!xs.empty(), "sum_squares_each of nothing");
  const DType dt = xs[0].dtype();
  const bool one_kind = std::all_of(
      xs.begin(), xs.end(), [&](const Tensor& x) { return x.dtype() == dt && x.backend_ptr() == xs[0].backend_ptr(); });
  if (one_kind && (dt == DType::f32 || dt == DType::f64) &&
      xs[0].backend().supports(Kernel::sum_squares_group, dt).ok) {
    Tensor out = Tensor::empty({int64_t(xs.size())}, dt, xs[0].backend_ptr());
    std::vector<Tensor> values;
    for (const Tensor& x : xs) values.push_back(x.detach());
    kernels(out).sum_squares_group(values, out);  // the bits of the reduces below, in one call
    return out;
  }
  const bool wide = std::any_of(xs.begin(), xs.end(), [](const Tensor& x) { return x.dtype() == DType::f64; });
  Tensor out = Tensor::empty({int64_t(xs.size())}, wide ? DType::f64 : DType::f32, xs[0].backend_ptr());
  for (size_t i = 0; i < xs.size(); ++i) {
    check_same_backend(xs[i], xs[0], "sum_squares_each");
    Tensor slot = out.slice0(int64_t(i), int64_t(i) + 1);
    if (xs[i].dtype() != out.dtype())  // its own dtype's sum, converted once into the slot (cast's rule)
      kernels(slot).cast(sum_squares(xs[i]), slot);
    else  // sum_squares' reduce, written into the slot
      reduce_into(xs[i].detach(), ReduceOp::sumsq, 1, xs[i].numel(), 1, slot);
  }
  return out;
}

Tensor argmax(const Tensor& x) {
  DEW_CHECK(x.ndim() >= 1, "argmax of a scalar");
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  Tensor out = Tensor::empty(out_shape, DType::i32, x.backend_ptr());
  if (out.numel() > 0) kernels(x).argmax(x, out);
  return out;
}

}  // namespace dew
