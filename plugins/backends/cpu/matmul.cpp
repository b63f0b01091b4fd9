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
// Products of at most 32 rows against a [n, k] weight (trans_b, batch 1, beta 0: Linear layers while
// decoding) take a hand-written row-wise path instead, whose rows do not depend on each other
// (rowwise_matmul below).
#include <cstring>

#include "cpu_backend.hpp"

namespace dew::cpu {

namespace {

using dnnl::memory;
using dims = memory::dims;

struct MatmulEntry : BoundPrimitive {
  memory::desc a_md, b_md, c_md, bias_md;
  int bias_arg = 0;  // DNNL_ARG_BIAS, or the binary_add post-op's source when alpha != 1
};

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

std::shared_ptr<MatmulEntry> make_matmul(const Dnnl& d, const MatmulParams& p, bool has_bias) {
  auto e = std::make_shared<MatmulEntry>();
  const memory::data_type f32 = memory::data_type::f32;
  const int64_t m = p.m, n = p.n, k = p.k;
  const dims a_inner_strides = p.trans_a ? dims{1, m} : dims{k, 1};
  const dims b_inner_strides = p.trans_b ? dims{1, k} : dims{n, 1};
  if (p.batch == 1) {
    e->a_md = memory::desc({m, k}, f32, a_inner_strides);
    e->b_md = memory::desc({k, n}, f32, b_inner_strides);
    e->c_md = memory::desc({m, n}, f32, dims{n, 1});
    if (has_bias) e->bias_md = memory::desc({1, n}, f32, dims{n, 1});
  } else {
    const int64_t ab = p.a_batch_stride == 0 ? 1 : p.batch, bb = p.b_batch_stride == 0 ? 1 : p.batch;
    e->a_md =
        memory::desc({ab, m, k}, f32,
                     dims{p.a_batch_stride == 0 ? m * k : p.a_batch_stride, a_inner_strides[0], a_inner_strides[1]});
    e->b_md =
        memory::desc({bb, k, n}, f32,
                     dims{p.b_batch_stride == 0 ? k * n : p.b_batch_stride, b_inner_strides[0], b_inner_strides[1]});
    e->c_md = memory::desc({p.batch, m, n}, f32, dims{m * n, n, 1});
    if (has_bias) e->bias_md = memory::desc({1, 1, n}, f32, dims{n, n, 1});
  }
  // oneDNN 2.x applies the output scale after the bias (alpha * (A B + bias)); to get alpha * A B + bias
  // the bias then moves to a binary_add post-op, which runs after the scale (and the sum).
  const bool bias_as_post_op = has_bias && p.alpha != 1.0f;
  dnnl::primitive_attr attr;
  if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
  dnnl::post_ops po;
  if (p.beta != 0.0f) po.append_sum(p.beta);
  if (bias_as_post_op) po.append_binary(dnnl::algorithm::binary_add, e->bias_md);
  if (p.act != Activation::none)
    po.append_eltwise(1.0f, eltwise_of(p.act), p.act == Activation::silu ? 1.0f : 0.0f, 0.0f);
  attr.set_post_ops(po);
  const dnnl::matmul::desc desc = has_bias && !bias_as_post_op
                                      ? dnnl::matmul::desc(e->a_md, e->b_md, e->bias_md, e->c_md)
                                      : dnnl::matmul::desc(e->a_md, e->b_md, e->c_md);
  e->prim = dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, d.eng));
  e->arg(d, DNNL_ARG_SRC, e->a_md);
  e->arg(d, DNNL_ARG_WEIGHTS, e->b_md);
  e->arg(d, DNNL_ARG_DST, e->c_md);
  if (has_bias) {
    e->bias_arg =
        bias_as_post_op ? (DNNL_ARG_ATTR_MULTIPLE_POST_OP(p.beta != 0.0f ? 1 : 0) | DNNL_ARG_SRC_1) : DNNL_ARG_BIAS;
    e->arg(d, e->bias_arg, e->bias_md);
  }
  return e;
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

}  // namespace

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* ptr) {
  v8 v;
  std::memcpy(&v, ptr, sizeof v);
  return v;
}

// acc[r][j] = dot(x[r, :], w[j, :]) for R rows of x and J rows of w (both row-major with k columns).
// Each sum is formed the same way whatever R and J are: one 8-wide accumulator over blocks of 8 (FMA),
// then its 8 lanes in order, then the tail in order. R and J only decide how many products share a
// load, never a sum's arithmetic.
template <int R, int J>
inline void dot_block(const float* x, const float* w, int64_t k, float (&acc)[R][J]) {
  v8 s[R][J] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    v8 wv[J];
    for (int j = 0; j < J; ++j) wv[j] = load8(w + j * k + i);
    for (int r = 0; r < R; ++r) {
      const v8 xv = load8(x + r * k + i);
      for (int j = 0; j < J; ++j) s[r][j] += xv * wv[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      float a = 0.0f;
      for (int lane = 0; lane < 8; ++lane) a += s[r][j][lane];
      for (int64_t t = i; t < k; ++t) a += x[r * k + t] * w[j * k + t];
      acc[r][j] = a;
    }
}

// y[r, j0 .. j0 + J) for all m rows: rows in blocks of 3, then the 1-2 left.
template <int J>
inline void column_block(const float* x, const float* w, const float* bias, float alpha, Activation act, float* y,
                         int64_t m, int64_t n, int64_t k, int64_t j0) {
  auto store = [&](int64_t r0, auto& acc, int rows) {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < J; ++j)
        y[(r0 + r) * n + j0 + j] = activate(alpha * acc[r][j] + (bias ? bias[j0 + j] : 0.0f), act);
  };
  const float* wj = w + j0 * k;
  int64_t r = 0;
  for (; r + 3 <= m; r += 3) {
    float acc[3][J];
    dot_block<3, J>(x + r * k, wj, k, acc);
    store(r, acc, 3);
  }
  if (m - r == 2) {
    float acc[2][J];
    dot_block<2, J>(x + r * k, wj, k, acc);
    store(r, acc, 2);
  } else if (m - r == 1) {
    float acc[1][J];
    dot_block<1, J>(x + r * k, wj, k, acc);
    store(r, acc, 1);
  }
}

// The row-wise path: y[r, j] = act(alpha * dot(x[r, :], w[j, :]) + bias[j]) for m <= kRowwiseMaxM rows
// of x [m, k] against a row-major [n, k] weight (a Linear layer on a few tokens: decoding one token, or
// one token of each of a server's active sequences). It streams the weight once for all m rows (blocks
// of 4 weight rows x 3 rows of x share their loads), parallel over blocks of output columns. Every
// y[r, j] is computed by one thread with arithmetic that depends on neither m, nor r's place in a block,
// nor the thread count, so a row's result is bit-equal whether it is decoded alone or batched with
// others (continuous batching relies on it). Why hand-written: oneDNN 2.6 reaches ~13 GB/s on
// matrix-vector products on one core here, and decoding is nothing but them.
constexpr int64_t kRowwiseMaxM = 32;

void rowwise_matmul(const float* x, const float* w, const float* bias, float alpha, Activation act, float* y, int64_t m,
                    int64_t n, int64_t k) {
  const int64_t blocks = n / 4;
#pragma omp parallel for schedule(static) if (m * n * k >= (int64_t(1) << 16))
  for (int64_t b = 0; b < blocks; ++b) column_block<4>(x, w, bias, alpha, act, y, m, n, k, b * 4);
  for (int64_t j = blocks * 4; j < n; ++j) column_block<1>(x, w, bias, alpha, act, y, m, n, k, j);
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p) {
  require_f32(a, "matmul", "a");
  require_f32(b, "matmul", "b");
  require_f32(out, "matmul", "out");
  const bool has_bias = bias.defined();
  if (has_bias) {
    require_f32(bias, "matmul", "bias");
    DEW_CHECK(bias.numel() == p.n, "cpu matmul: bias has ", bias.numel(), " elements for n = ", p.n);
  }
  DEW_CHECK(p.batch >= 0 && p.m >= 0 && p.n >= 0 && p.k >= 0, "cpu matmul: negative dimension");
  DEW_CHECK(p.act == Activation::none || p.beta == 0.0f, "cpu matmul: an activation epilogue requires beta == 0");
  DEW_CHECK(out.numel() == p.batch * p.m * p.n, "cpu matmul: out ", shape_str(out.shape()), " is not [", p.batch, ", ",
            p.m, ", ", p.n, "]");
  auto span = [](int64_t batch, int64_t bs, int64_t mat) { return (batch - 1) * bs + mat; };
  DEW_CHECK(p.batch == 0 || span(p.batch, p.a_batch_stride, p.m * p.k) <= a.numel(), "cpu matmul: a ",
            shape_str(a.shape()), " is too small for the batch");
  DEW_CHECK(p.batch == 0 || span(p.batch, p.b_batch_stride, p.k * p.n) <= b.numel(), "cpu matmul: b ",
            shape_str(b.shape()), " is too small for the batch");
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
    rowwise_matmul(a.data_as<float>(), b.data_as<float>(), has_bias ? bias.data_as<float>() : nullptr, p.alpha, p.act,
                   o, p.m, p.n, p.k);
    return;
  }
  Key key(kMatmul);
  key.add(p.batch)
      .add(p.m)
      .add(p.n)
      .add(p.k)
      .add(p.batch > 1 ? p.a_batch_stride : 0)
      .add(p.batch > 1 ? p.b_batch_stride : 0)
      .add(int64_t(p.trans_a) | int64_t(p.trans_b) << 1 | int64_t(has_bias) << 2)
      .add(p.alpha)
      .add(p.beta)
      .add(int64_t(p.act));
  Dnnl& d = *dnnl_;
  auto e = d.cache.get<MatmulEntry>(key, [&] { return make_matmul(d, p, has_bias); });
  e->run(d, {{DNNL_ARG_SRC, a.data()},
             {DNNL_ARG_WEIGHTS, b.data()},
             {DNNL_ARG_DST, o},
             {e->bias_arg, has_bias ? bias.data() : nullptr}});
}

}  // namespace dew::cpu
