// core/ops/nn_ops.cpp — softmax, normalisations, embeddings, rotary, attention, dropout, convolution,
// cross-entropy: each a forward kernel plus its backward kernel, with saved statistics (mean/rstd/lse)
// kept by the node. Statistics are f32 (f64 when the input is f64, for double-precision grad checks).
#include "dew/kernel_contracts.hpp"
#include "op_util.hpp"

namespace dew {

using namespace detail;

namespace {
int64_t rows_of(const Tensor& x) { return x.ndim() == 0 ? 1 : x.numel() / std::max<int64_t>(x.shape().back(), 1); }
Shape row_stats_shape(const Tensor& x) { return {rows_of(x)}; }
Tensor stats(const Tensor& x, const Shape& s) { return Tensor::empty(s, stat_dtype(x), x.backend_ptr()); }
Tensor maybe_empty_like(const Tensor& t, bool want) { return want && t.defined() ? empty_like(t) : Tensor(); }
void check_vector(const Tensor& t, int64_t n, const char* op, const char* what) {
  if (!t.defined()) return;
  DEW_CHECK(t.ndim() == 1 && t.shape()[0] == n, op, ": ", what, " must be [", n, "], got ", shape_str(t.shape()));
}
}  // namespace

// ---------------------------------------------------------------- softmax

static Tensor softmax_like(const Tensor& x, bool log) {
  Tensor y = empty_like(x);
  if (y.numel() > 0) log ? kernels(x).log_softmax(x, y) : kernels(x).softmax(x, y);
  if (needs_grad({&x})) {
    Tensor yd = y.detach();
    record(
        y, {x},
        [yd, log](const Tensor& g) {
          Tensor dx = empty_like(yd);
          if (dx.numel() > 0)
            log ? kernels(yd).log_softmax_backward(yd, g, dx) : kernels(yd).softmax_backward(yd, g, dx);
          return std::vector<Tensor>{dx};
        },
        log ? "log_softmax" : "softmax");
  }
  return y;
}
Tensor softmax(const Tensor& x) { return softmax_like(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_like(x, true); }

// ---------------------------------------------------------------- norms

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  if (autocast_differs(weight, x) || autocast_differs(bias, x))
    return layer_norm(x, autocast_like(weight, x), autocast_like(bias, x), eps);
  const int64_t d = x.shape().back();
  check_vector(weight, d, "layer_norm", "weight");
  check_vector(bias, d, "layer_norm", "bias");
  Tensor y = empty_like(x), mu = stats(x, row_stats_shape(x)), rstd = stats(x, row_stats_shape(x));
  kernels(x).layer_norm(x, weight.defined() ? weight.detach() : Tensor(), bias.defined() ? bias.detach() : Tensor(), y,
                         mu, rstd, eps);
  if (needs_grad({&x, &weight, &bias})) {
    Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor();
    const bool gw = needs_grad({&weight}), gb = needs_grad({&bias});
    const bool has_bias = bias.defined();
    record(
        y, {x, weight, bias},
        [xd, wd, mu, rstd, gw, gb, has_bias](const Tensor& g) {
          Tensor dx = empty_like(xd);
          Tensor dw = maybe_empty_like(wd, gw);
          Tensor db = gb && has_bias ? empty_as(xd, {xd.shape().back()}) : Tensor();
          kernels(xd).layer_norm_backward(xd, wd, mu, rstd, g, dx, dw, db);
          return std::vector<Tensor>{dx, dw, db};
        },
        "layer_norm");
  }
  return y;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset) {
  if (autocast_differs(weight, x)) return rms_norm(x, autocast_like(weight, x), eps, weight_offset);
  check_vector(weight, x.shape().back(), "rms_norm", "weight");
  Tensor y = empty_like(x), rstd = stats(x, row_stats_shape(x));
  kernels(x).rms_norm(x, weight.defined() ? weight.detach() : Tensor(), y, rstd, eps, weight_offset);
  if (needs_grad({&x, &weight})) {
    Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor();
    const bool gw = needs_grad({&weight});
    record(
        y, {x, weight},
        [xd, wd, rstd, gw, weight_offset](const Tensor& g) {
          // x's gradient gathered so far (a residual stream's, from the readers after the norm), when the pass
          // lets the kernel add this one into it: no fresh dx and no add pass (the same bits, so only where the
          // backend runs the dtype itself, not widened around its f32 kernel)
          Tensor dx =
              xd.backend().supports(Kernel::rms_norm_backward, xd.dtype()).ok ? accumulation_target(0) : Tensor();
          const bool accumulate = dx.defined();
          if (!accumulate) dx = empty_like(xd);
          Tensor dw = maybe_empty_like(wd, gw);
          kernels(xd).rms_norm_backward(xd, wd, rstd, g, dx, dw, weight_offset, accumulate);
          return std::vector<Tensor>{dx, dw};
        },
        "rms_norm");
  }
  return y;
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, float eps) {
  if (autocast_differs(weight, x) || autocast_differs(bias, x))
    return group_norm(x, groups, autocast_like(weight, x), autocast_like(bias, x), eps);
  DEW_CHECK(x.ndim() >= 2, "group_norm: input must be [N, C, ...], got ", shape_str(x.shape()));
  const int64_t c = x.shape()[1];
  DEW_CHECK(groups > 0 && c % groups == 0, "group_norm: ", c, " channels do not split into ", groups, " groups");
  check_vector(weight, c, "group_norm", "weight");
  check_vector(bias, c, "group_norm", "bias");
  Tensor y = empty_like(x), mu = stats(x, {x.shape()[0], groups}), rstd = stats(x, {x.shape()[0], groups});
  kernels(x).group_norm(x, weight.defined() ? weight.detach() : Tensor(), bias.defined() ? bias.detach() : Tensor(), y,
                         mu, rstd, groups, eps);
  if (needs_grad({&x, &weight, &bias})) {
    Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor();
    const bool gw = needs_grad({&weight}), gb = needs_grad({&bias});
    const bool has_bias = bias.defined();
    record(
        y, {x, weight, bias},
        [xd, wd, mu, rstd, gw, gb, has_bias, groups, c](const Tensor& g) {
          Tensor dx = empty_like(xd);
          Tensor dw = maybe_empty_like(wd, gw);
          Tensor db = gb && has_bias ? empty_as(xd, {c}) : Tensor();
          kernels(xd).group_norm_backward(xd, wd, mu, rstd, g, dx, dw, db, groups);
          return std::vector<Tensor>{dx, dw, db};
        },
        "group_norm");
  }
  return y;
}

// ---------------------------------------------------------------- indexing

Tensor gather_rows(const Tensor& x, const Tensor& idx) {
  DEW_CHECK(x.ndim() == 3, "gather_rows: x must be [B, T, D], got ", shape_str(x.shape()));
  DEW_CHECK(idx.dtype() == DType::i32 && idx.ndim() == 2, "gather_rows: idx must be i32 [B, K], got ",
            dtype_name(idx.dtype()), " ", shape_str(idx.shape()));
  const int64_t b = idx.shape()[0];
  DEW_CHECK(x.shape()[0] == b || x.shape()[0] == 1, "gather_rows: batch of x ", shape_str(x.shape()),
            " does not match idx ", shape_str(idx.shape()));
  Tensor out = empty_as(x, {b, idx.shape()[1], x.shape()[2]});
  if (out.numel() > 0) kernels(x).gather_rows(x.detach(), idx, out);
  if (needs_grad({&x})) {
    Tensor xd = x.detach();
    record(
        out, {x},
        [xd, idx](const Tensor& g) {
          Tensor dx = Tensor::zeros(xd.shape(), xd.dtype(), xd.backend_ptr());
          if (g.numel() > 0) kernels(xd).scatter_add_rows(g, idx, dx);
          return std::vector<Tensor>{dx};
        },
        "gather_rows");
  }
  return out;
}

Tensor embedding(const Tensor& table, const Tensor& ids) {
  DEW_CHECK(table.ndim() == 2, "embedding: table must be [V, D], got ", shape_str(table.shape()));
  Shape out_shape = ids.shape();
  out_shape.push_back(table.shape()[1]);
  if (table.quantized()) {  // int8 rows and their scales (a tied head stored for decoding): gathered, dequantized
    Tensor values = table.detach();
    values.impl()->scales.reset();  // the int8 values alone, rows of bytes to gather
    const Tensor scales = table.scales().detach();
    const Tensor flat_ids = reshape(ids, {1, ids.numel()});
    Tensor rows = reshape(gather_rows(reshape(values, {1, table.shape()[0], table.shape()[1]}), flat_ids),
                          {ids.numel(), table.shape()[1]});
    rows.impl()->scales = reshape(gather_rows(reshape(scales, {1, scales.shape()[0], scales.shape()[1]}), flat_ids),
                                  {ids.numel(), scales.shape()[1]})
                              .impl_ptr();
    return reshape(dequantize(rows), out_shape);
  }
  Tensor rows = gather_rows(reshape(table, {1, table.shape()[0], table.shape()[1]}), reshape(ids, {1, ids.numel()}));
  return autocast_lower(reshape(rows, out_shape));  // autocast: the rows in the half dtype
}

// ---------------------------------------------------------------- transformer pieces

Tensor rope(const Tensor& x, const Tensor& positions, float theta, int64_t rotary_dim, const RopeScaling& scaling) {
  DEW_CHECK(x.ndim() == 4, "rope: x must be [B, T, H, D], got ", shape_str(x.shape()));
  const int64_t d = x.shape()[3];
  const int64_t rd = rotary_dim == 0 ? d : rotary_dim;
  DEW_CHECK(rd > 0 && rd <= d && rd % 2 == 0, "rope: rotary_dim ", rd, " must be even and at most the head width ", d);
  DEW_CHECK(positions.dtype() == DType::i32, "rope: positions must be i32");
  const bool per_batch = positions.ndim() == 2;
  DEW_CHECK((positions.ndim() == 1 && positions.shape()[0] == x.shape()[1]) ||
                (per_batch && positions.shape()[0] == x.shape()[0] && positions.shape()[1] == x.shape()[1]),
            "rope: positions ", shape_str(positions.shape()), " do not match x ", shape_str(x.shape()));
  contracts::check_rope_scaling("rope", scaling);
  RopeParams p{theta, rd, false, scaling};
  Tensor out = empty_like(x);
  if (out.numel() > 0) kernels(x).rope(x.detach(), positions, out, p);
  if (needs_grad({&x})) {
    record(
        out, {x},
        [positions, p](const Tensor& g) {
          RopeParams inv = p;
          inv.inverse = true;
          Tensor dx = empty_like(g);
          if (dx.numel() > 0) kernels(g).rope(g, positions, dx, inv);
          return std::vector<Tensor>{dx};
        },
        "rope");
  }
  return out;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& segment_ids) {
  if (autocast_lowers({&q, &k, &v}))
    return attention(autocast_lower(q), autocast_lower(k), autocast_lower(v), p, segment_ids);
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "attention: q, k, v must be [B, T, H, D]");
  const int64_t b = q.shape()[0], t = q.shape()[1], hq = q.shape()[2], d = q.shape()[3];
  const int64_t s = k.shape()[1], hkv = k.shape()[2];
  DEW_CHECK(k.shape() == v.shape() && k.shape()[0] == b && k.shape()[3] == d, "attention: k ", shape_str(k.shape()),
            " and v ", shape_str(v.shape()), " do not match q ", shape_str(q.shape()));
  DEW_CHECK(hkv > 0 && hq % hkv == 0, "attention: ", hq, " query heads do not group over ", hkv, " key/value heads");
  check_same_backend(q, k, "attention");
  check_same_backend(q, v, "attention");
  // One dtype, or f32 queries over a bf16 K/V cache (decoding: the kernel widens K/V, f32 arithmetic).
  const bool bf16_kv = q.dtype() == DType::f32 && k.dtype() == DType::bf16 && v.dtype() == DType::bf16;
  DEW_CHECK(bf16_kv || (k.dtype() == q.dtype() && v.dtype() == q.dtype()), "attention: q ", dtype_name(q.dtype()),
            ", k ", dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()),
            ": one dtype, or f32 q with bf16 k and v (a bf16 decode cache)");
  DEW_CHECK(!bf16_kv || !needs_grad({&q, &k, &v}),
            "attention: f32 q over bf16 k and v is the decoding path (a bf16 K/V cache) and records no gradient");
  (void)s;
  const Tensor seg = segment_ids.defined() ? segment_ids.detach() : Tensor();
  if (seg.defined()) check_same_backend(q, seg, "attention");
  Tensor out = empty_like(q), lse = stats(q, {b, hq, t});
  if (out.numel() > 0) kernels(q).attention(q.detach(), k.detach(), v.detach(), seg, out, lse, p);
  if (needs_grad({&q, &k, &v})) {
    Tensor qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
    record(
        out, {q, k, v},
        [qd, kd, vd, seg, od, lse, p](const Tensor& g) {
          Tensor dq = empty_like(qd), dk = empty_like(kd), dv = empty_like(vd);
          kernels(qd).attention_backward(qd, kd, vd, seg, od, lse, g, dq, dk, dv, p);
          return std::vector<Tensor>{dq, dk, dv};
        },
        "attention");
  }
  return out;
}

Tensor attention_slots(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const std::vector<int64_t>& slots,
                       const std::vector<int64_t>& positions, Tensor& k_cache, Tensor& v_cache,
                       const AttentionParams& p) {
  DEW_CHECK(!needs_grad({&q, &k_new, &v_new}), "attention_slots: decoding over a cache records no gradient");
  for (const Tensor* t : {&k_new, &v_new, static_cast<const Tensor*>(&k_cache), static_cast<const Tensor*>(&v_cache)})
    check_same_backend(q, *t, "attention_slots");
  const auto in_cache_dtype = [&](const Tensor& t) {
    return t.dtype() == k_cache.dtype() ? t.detach() : cast(t, k_cache.dtype()).detach();
  };
  if (slots.empty()) return empty_like(q);  // nothing to write or attend
  const Tensor k = in_cache_dtype(k_new), v = in_cache_dtype(v_new);
  // Under autocast (a bf16-mixed run's GRPO rollout) q arrives lowered while the cache keeps its dtype, a form the
  // kernel does not take: each row writes its K/V and runs `attention` alone over its slot's prefix, which lowers that
  // prefix as a batch-1 step under autocast does.
  const DType cache = k_cache.dtype();
  if (!(q.dtype() == cache || (q.dtype() == DType::f32 && cache == DType::bf16))) {
    DEW_CHECK(k_cache.ndim() == 4 && v_cache.shape() == k_cache.shape() && positions.size() == slots.size(),
              "attention_slots: caches ", shape_str(k_cache.shape()), " and ", shape_str(v_cache.shape()), ", ",
              slots.size(), " slots and ", positions.size(), " positions");
    std::vector<Tensor> rows;
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t slot = slots[i], pos = positions[i];
      DEW_CHECK(slot >= 0 && slot < k_cache.size(0) && pos >= 0 && pos < k_cache.size(1), "attention_slots: row ", i,
                " at slot ", slot, ", position ", pos, " is outside the caches ", shape_str(k_cache.shape()));
      const auto [k_row, v_row] = write_slot_row(k_cache.backend(), k, v, int64_t(i), slot, pos, k_cache, v_cache);
      AttentionParams row_p = p;
      row_p.causal = true;
      row_p.q_offset = pos;
      rows.push_back(attention(q.slice0(int64_t(i), int64_t(i) + 1), k_row, v_row, row_p));
    }
    return rows.size() == 1 ? rows[0] : concat(rows, 0);
  }
  Tensor out = empty_like(q);
  // The contract (check_attention_slots) is checked by every backend's kernel.
  kernels(q).attention_slots(q.detach(), k, v, slots, positions, k_cache, v_cache, out, p);
  return out;
}

Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t offset) {
  DEW_CHECK(p >= 0.0f && p < 1.0f, "dropout: p = ", p, " must be in [0, 1)");
  if (p == 0.0f) return x;
  Tensor y = empty_like(x), mask = empty_like(x);
  if (y.numel() > 0) kernels(x).dropout(x.detach(), y, mask, DropoutParams{p, seed, stream, offset});
  if (needs_grad({&x})) {
    record(
        y, {x}, [mask](const Tensor& g) { return std::vector<Tensor>{mul(g, mask)}; }, "dropout");
  }
  return y;
}

Tensor attention_max_logit(const Tensor& q, const Tensor& k, const AttentionParams& p, const Tensor& segment_ids) {
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4, "attention_max_logit: q and k must be [B, T, H, D]");
  DEW_CHECK(k.shape()[0] == q.shape()[0] && k.shape()[3] == q.shape()[3], "attention_max_logit: k ",
            shape_str(k.shape()), " does not match q ", shape_str(q.shape()));
  DEW_CHECK(k.shape()[2] > 0 && q.shape()[2] % k.shape()[2] == 0, "attention_max_logit: ", q.shape()[2],
            " query heads do not group over ", k.shape()[2], " key/value heads");
  check_same_backend(q, k, "attention_max_logit");
  Tensor out = stats(q, {q.shape()[2]});
  if (segment_ids.defined()) check_same_backend(q, segment_ids, "attention_max_logit");
  // Through the kernel call (kernel_call.hpp): bf16 / f16 q and k (a bf16-mixed step's) take the core's conversion
  // where the backend has no half kernel for it; out is a statistic, f32 either way.
  kernels(q).attention_max_logit(q.detach(), k.detach(), segment_ids.defined() ? segment_ids.detach() : Tensor(), out,
                                 p);
  return out;
}

// ---------------------------------------------------------------- convolution

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t dil) {
  return contracts::conv_output_size(in, k, s, pad, dil);
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  if (autocast_lowers({&x, &w, &bias})) return conv2d(autocast_lower(x), autocast_lower(w), autocast_lower(bias), p);
  DEW_CHECK(x.ndim() == 4 && w.ndim() == 4, "conv2d: x must be [N, C, H, W] and w [O, C/groups, KH, KW]; got ",
            shape_str(x.shape()), " and ", shape_str(w.shape()));
  const int64_t n = x.shape()[0], c = x.shape()[1], o = w.shape()[0];
  DEW_CHECK(p.groups > 0 && c % p.groups == 0 && o % p.groups == 0 && w.shape()[1] * p.groups == c, "conv2d: weight ",
            shape_str(w.shape()), " does not fit input ", shape_str(x.shape()), " with groups ", p.groups);
  check_vector(bias, o, "conv2d", "bias");
  const int64_t oh = conv_out(x.shape()[2], w.shape()[2], p.stride_h, p.pad_h, p.dilation_h);
  const int64_t ow = conv_out(x.shape()[3], w.shape()[3], p.stride_w, p.pad_w, p.dilation_w);
  DEW_CHECK(oh > 0 && ow > 0, "conv2d: kernel ", shape_str(w.shape()), " larger than padded input ",
            shape_str(x.shape()));
  Tensor y = empty_as(x, {n, o, oh, ow});
  kernels(x).conv2d(x.detach(), w.detach(), bias.defined() ? bias.detach() : Tensor(), y, p);
  if (needs_grad({&x, &w, &bias})) {
    Tensor xd = x.detach(), wd = w.detach();
    const bool gx = needs_grad({&x}), gw = needs_grad({&w}), gb = needs_grad({&bias});
    record(
        y, {x, w, bias},
        [xd, wd, p, gx, gw, gb, o](const Tensor& g) {
          Tensor dx, dw, db;
          if (gx) {
            dx = empty_like(xd);
            kernels(xd).conv2d_backward_data(g, wd, dx, p);
          }
          if (gw || gb) {
            Tensor dw_buf = empty_like(wd);
            db = gb ? empty_as(xd, {o}) : Tensor();
            kernels(xd).conv2d_backward_weight(xd, g, dw_buf, db, p);
            if (gw) dw = dw_buf;
          }
          return std::vector<Tensor>{dx, dw, db};
        },
        "conv2d");
  }
  return y;
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p, int64_t oph,
                        int64_t opw) {
  if (autocast_lowers({&x, &w, &bias}))
    return conv_transpose2d(autocast_lower(x), autocast_lower(w), autocast_lower(bias), p, oph, opw);
  DEW_CHECK(x.ndim() == 4 && w.ndim() == 4, "conv_transpose2d: x must be [N, C, H, W] and w [C, O/groups, KH, KW]");
  const int64_t n = x.shape()[0], c = x.shape()[1];
  DEW_CHECK(w.shape()[0] == c && c % p.groups == 0, "conv_transpose2d: weight ", shape_str(w.shape()),
            " does not fit input ", shape_str(x.shape()));
  const int64_t o = w.shape()[1] * p.groups;
  const int64_t oh = (x.shape()[2] - 1) * p.stride_h - 2 * p.pad_h + p.dilation_h * (w.shape()[2] - 1) + oph + 1;
  const int64_t ow = (x.shape()[3] - 1) * p.stride_w - 2 * p.pad_w + p.dilation_w * (w.shape()[3] - 1) + opw + 1;
  DEW_CHECK(oh > 0 && ow > 0, "conv_transpose2d: empty output");
  // The transposed convolution is the data-gradient of the convolution that maps [N, O, oh, ow] to x.
  Tensor y = empty_as(x, {n, o, oh, ow});
  kernels(x).conv2d_backward_data(x.detach(), w.detach(), y, p);
  if (needs_grad({&x, &w})) {
    Tensor xd = x.detach(), wd = w.detach();
    const bool gx = needs_grad({&x}), gw = needs_grad({&w});
    record(
        y, {x, w},
        [xd, wd, p, gx, gw](const Tensor& g) {
          Tensor dx, dw;
          if (gx) {
            dx = empty_like(xd);
            kernels(xd).conv2d(g, wd, Tensor(), dx, p);
          }
          if (gw) {
            dw = empty_like(wd);
            Tensor no_bias;
            kernels(xd).conv2d_backward_weight(g, xd, dw, no_bias, p);
          }
          return std::vector<Tensor>{dx, dw};
        },
        "conv_transpose2d");
  }
  if (bias.defined()) {
    check_vector(bias, o, "conv_transpose2d", "bias");
    y = add(y, reshape(bias, {1, o, 1, 1}));
  }
  return y;
}

// ---------------------------------------------------------------- losses

// The mean's divisor: max(1, the number of targets that are not ignore_index), a [1] tensor of `dtype` on the
// targets' backend. On a host backend counted here; on a device counted there (targets widened to f32, exact
// below 2^24, compared with ignore_index and summed: a sum of ones, exact in any order), so a training step
// makes no device-to-host transfer for it. The same integer either way, so the mean total / divisor has the
// same bits. With no target counted the divisor is 1 and the mean 0: ignored rows add 0 to the total and get
// a zero gradient row from the kernels.
Tensor detail::cross_entropy_divisor(const Tensor& targets, int64_t ignore_index, DType dtype) {
  const int64_t n = targets.numel();
  constexpr int64_t kExactInF32 = int64_t(1) << 24;
  const bool count_here = targets.backend().host_accessible() || n >= kExactInF32 || ignore_index >= kExactInF32 ||
                          ignore_index <= -kExactInF32;
  if (count_here) {
    int64_t valid = 0;
    for (int32_t t : targets.to_ints()) valid += (t != ignore_index);
    return Tensor::full({1}, double(std::max<int64_t>(valid, 1)), dtype, targets.backend_ptr());
  }
  auto f32 = [&](double v) { return Tensor::full({1}, v, DType::f32, targets.backend_ptr()); };
  Tensor ignored = sum(compare(cast(targets, DType::f32), f32(double(ignore_index)), BinaryOp::eq));
  return cast(maximum(sub(f32(double(n)), ignored), f32(1.0)), dtype);
}

namespace {
// The cross_entropy kernel's rows for logits [N, V] and targets i32 [N] (checked under `op`'s name): loss [N] =
// lse - logits[target] (0 on an ignored row) and lse [N]; cross_entropy and token_logprobs are built on them.
struct CrossEntropyRows {
  Tensor loss, lse;
};
CrossEntropyRows cross_entropy_rows(const char* op, const Tensor& logits, const Tensor& targets,
                                    const CrossEntropyParams& p) {
  DEW_CHECK(logits.ndim() == 2, op, ": logits must be [N, V], got ", shape_str(logits.shape()));
  DEW_CHECK(targets.dtype() == DType::i32 && targets.ndim() == 1 && targets.shape()[0] == logits.shape()[0], op,
            ": targets must be i32 [", logits.shape()[0], "], got ", dtype_name(targets.dtype()), " ",
            shape_str(targets.shape()));
  const int64_t n = logits.shape()[0];
  CrossEntropyRows r{stats(logits, {n}), stats(logits, {n})};
  if (n > 0) kernels(logits).cross_entropy(logits.detach(), targets, r.loss, r.lse, p);
  return r;
}

// `out` (built on cross_entropy_rows) recording the rows' backward: dlogits = cross_entropy_backward with the per-row
// gradient dloss_of(g) [N] of the kernel's loss rows.
Tensor record_rows_backward(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const CrossEntropyParams& p, const char* name,
                            std::function<Tensor(const Tensor&)> dloss_of) {
  Tensor ld = logits.detach();
  Tensor result = out.detach();
  record(
      result, {logits},
      [ld, targets, lse, p, dloss_of = std::move(dloss_of)](const Tensor& g) {
        const Tensor dloss = dloss_of(g);
        Tensor dlogits = empty_like(ld);
        if (lse.numel() > 0) kernels(ld).cross_entropy_backward(ld, targets, lse, dloss, dlogits, p);
        return std::vector<Tensor>{dlogits};
      },
      name);
  return result;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const CrossEntropyParams p{ignore_index};
  const CrossEntropyRows rows = cross_entropy_rows("cross_entropy", logits, targets, p);
  const Tensor lse = rows.lse;
  const int64_t n = lse.numel();
  Tensor total = sum(rows.loss);
  const Tensor divisor = detail::cross_entropy_divisor(targets, ignore_index, total.dtype());
  Tensor out = div(total, divisor);
  if (out.dtype() != logits.dtype() && !autocast_enabled()) out = cast(out, logits.dtype());  // autocast: f32 loss
  if (!needs_grad({&logits})) return out;
  return record_rows_backward(out, logits, targets, lse, p, "cross_entropy", [lse, divisor, n](const Tensor& g) {
    return broadcast_to(reshape(div(cast(g, lse.dtype()), divisor), {1}), {n});  // the mean's g on every row
  });
}

Tensor token_logprobs(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const CrossEntropyParams p{ignore_index};
  const CrossEntropyRows rows = cross_entropy_rows("token_logprobs", logits, targets, p);
  const Tensor lse = rows.lse;
  Tensor out = neg(rows.loss);  // the kernel's per-row loss is lse - z[target] (0 on an ignored row)
  if (!needs_grad({&logits})) return out;
  return record_rows_backward(out, logits, targets, lse, p, "token_logprobs", [lse](const Tensor& g) {
    return contiguous_copy(neg(cast(g, lse.dtype())));  // d(-loss)
  });
}

}  // namespace dew
