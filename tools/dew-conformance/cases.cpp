// tools/dew-conformance/cases.cpp — the case table: every kernel of dew/backend.hpp x shapes x params x dtype.
//
// Each family below adds Cases (conformance.hpp). Inputs are Philox draws (seeded by the case id, one
// stream per tensor) made on the oracle backend; backward cases take their saved statistics (mean, rstd,
// lse, out) from the oracle's forward, so both backends see the same bytes.
//
// Tolerances (Check): rtol = k_store * eps(out) + k * eps(f32) * sqrt(K), atol = rtol * rms(ref), NMSE <= rtol^2.
// k per kernel family, and why:
//   exact   fill, cast, strided_copy, gather_rows, random, dropout mask, argmax, reduce max/min: pure data
//           movement / selection / the Philox contract, no rounding freedom.
//   k = 0   binary add/sub/mul/div/max/min/compare: one correctly rounded operation (k_store = 2 covers a
//           backend that divides through a reciprocal); gated_residual and its df (mul then add's roundings).
//   k = 8   unary / unary_backward, gated_activation (+ backward) (K = 1): transcendental functions, a few
//           ulp for vectorised exp/log/tanh/erf.
//   k = 4   reduce sum/mean/sumsq, K = reduce length: a plain accumulation (blocked or sequential).
//   k = 8   matmul (K = k), conv2d (K = C/g*KH*KW, O/g*KH*KW or N*OH*OW), softmax/log_softmax and their
//           backward (K = row length), cross_entropy (K = V), optimizers (K = 1; LAMB's norms K = numel).
//   k = 16  layer/rms/group norm (K = D or group size; dweight/dbias K = rows): two reductions (mean, var)
//           feed rsqrt and a second pass; attention (K = S + D forward, T*group + D backward): a dot
//           product, an exp, a softmax sum and a weighted sum chained.
//   rope    rtol = eps * (2 + 4 * max_position): the angle pos * theta^(-2i/d) carries a relative error of a
//           few ulp, i.e. an absolute error proportional to the position (PyTorch computes it in f32 too).
//   scatter_add_rows k = 4 with K = the number of rows added into one destination row.
//   dropout y: k = 0 (one multiplication), and its zero pattern must equal the oracle's exactly.
// Loosened on purpose (each says why at its case): rope's rtol above. Left out on purpose: rms_norm_backward
// on one-wide rows (ill-conditioned in f32, see add_rms_norm).
// add_large() repeats the cheap kernels at >= 2^18 elements so that threaded backends run their parallel paths.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "conformance.hpp"
#include "dew/random.hpp"

namespace dew::conformance {

// ---------------------------------------------------------------- Gen

Tensor Gen::uniform(const Shape& s, float lo, float hi, DType dt) {
  return Tensor::uniform(s, lo, hi, seed_, next_stream(), be_, dt);
}
Tensor Gen::normal(const Shape& s, float mean, float std, DType dt) {
  return Tensor::normal(s, mean, std, seed_, next_stream(), be_, dt);
}
std::vector<float> Gen::uniform_host(int64_t n, float lo, float hi) {
  const uint64_t stream = next_stream();
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = lo + (hi - lo) * philox::uniform(seed_, stream, uint64_t(i));
  return v;
}
Tensor Gen::ints(const Shape& s, int32_t lo, int32_t hi) {
  const uint64_t stream = next_stream();
  const int64_t n = numel_of(s);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = philox::uniform(seed_, stream, uint64_t(i));
    v[size_t(i)] = std::min(hi - 1, lo + int32_t(std::floor(u * double(hi - lo))));
  }
  return Tensor::from_ints(v, s, be_);
}
Tensor Gen::quantized(const Shape& s, float lo, float hi, float step, DType dt) {
  std::vector<float> v = uniform_host(numel_of(s), lo, hi);
  for (float& x : v) x = std::round(x / step) * step;
  return Tensor::from_vector(v, s, be_, dt);
}
Tensor Gen::from_floats(const std::vector<float>& v, const Shape& s, DType dt) {
  return Tensor::from_vector(v, s, be_, dt);
}
Tensor Gen::from_ints(const std::vector<int32_t>& v, const Shape& s) { return Tensor::from_ints(v, s, be_); }

namespace {

using DT = DType;
using In = std::vector<Tensor>;
using Out = std::vector<Tensor>;

std::string dims(const Shape& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "x" : "") + std::to_string(s[i]);
  return r.empty() ? "scalar" : r;
}
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  std::string s = b;
  for (char& c : s)
    if (c == '+') c = 'p';
  return s;
}
const char* act_name(Activation a) {
  switch (a) {
    case Activation::none:
      return "none";
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::silu:
      return "silu";
  }
  return "?";
}
OutSpec out(std::string name, Shape shape, DT dt, Check c, int init_from = -1) {
  OutSpec o;
  o.name = std::move(name);
  o.shape = std::move(shape);
  o.dtype = dt;
  o.check = c;
  o.init_from = init_from;
  return o;
}
OutSpec undefined_out(std::string name) {
  OutSpec o;
  o.name = std::move(name);
  o.defined = false;
  return o;
}

Tensor undef() { return Tensor(); }

std::vector<int32_t> arange(int64_t n, int32_t start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + int32_t(i);
  return v;
}

struct Table {
  std::vector<Case> cases;
  void add(std::string id, Kernel k, std::vector<DT> dts, std::function<In(Gen&)> in, std::vector<OutSpec> outs,
           std::function<void(Backend&, In&, Out&)> call) {
    Case c;
    c.id = std::move(id);
    c.kernel = k;
    c.dtypes = std::move(dts);
    c.inputs = std::move(in);
    c.outs = std::move(outs);
    c.call = std::move(call);
    cases.push_back(std::move(c));
  }
};

// ---------------------------------------------------------------- fill, cast, strided_copy

void add_fill(Table& t) {
  struct F {
    DT dt;
    double value;
    Shape shape;
  };
  const F fs[] = {{DT::f32, 0.5, {1031}},  {DT::f32, -3.25, {7, 129}}, {DT::f32, 0.0, {513}}, {DT::f32, 1e-3, {1}},
                  {DT::bf16, 0.1, {1031}}, {DT::f16, 0.1, {1031}},     {DT::f64, 0.1, {257}}, {DT::i32, 7, {1031}},
                  {DT::i32, -3, {5, 7}},   {DT::i64, -5, {33}},        {DT::u8, 200, {1031}}};
  for (const F& f : fs) {
    Check c = exact();
    c.zeros_ok = f.value == 0.0;
    t.add(
        "fill/" + dims(f.shape) + "_v" + fmt(f.value) + "/" + dtype_name(f.dt), Kernel::fill, {f.dt},
        [](Gen&) { return In{}; }, {out("out", f.shape, f.dt, c)},
        [v = f.value](Backend& be, In&, Out& o) { be.fill(o[0], v); });
  }
}

void add_cast(Table& t) {
  struct C {
    DT from, to;
    float lo, hi;
    Shape shape;
  };
  const C cs[] = {{DT::f32, DT::bf16, -10, 10, {1031}},
                  {DT::bf16, DT::f32, -10, 10, {1031}},
                  {DT::f32, DT::f16, -10, 10, {1031}},
                  {DT::f16, DT::f32, -10, 10, {1031}},
                  {DT::f32, DT::f64, -10, 10, {1031}},
                  {DT::f64, DT::f32, -10, 10, {1031}},
                  {DT::bf16, DT::f16, -10, 10, {257}},
                  {DT::f32, DT::i32, -100, 100, {1031}},
                  {DT::f32, DT::f32, -10, 10, {7, 129}},
                  // multiples of 8 (cuda moves them 16 bytes at a time)
                  {DT::f32, DT::bf16, -10, 10, {24, 40}},
                  {DT::bf16, DT::f32, -10, 10, {24, 40}},
                  {DT::f64, DT::bf16, -10, 10, {1032}},
                  {DT::f32, DT::i32, -100, 100, {1032}}};
  for (const C& c : cs) {
    t.add(
        std::string("cast/") + dims(c.shape) + "_" + dtype_name(c.from) + "_to_" + dtype_name(c.to) + "/" +
            dtype_name(c.from),
        Kernel::cast, {c.from, c.to},
        [c](Gen& g) {
          // f64 inputs: draw f32 then widen (the generator's cast is exact for that direction).
          Tensor x = g.uniform(c.shape, c.lo, c.hi, c.from == DT::f64 ? DT::f32 : c.from);
          if (c.from == DT::f64) {
            Tensor y = Tensor::empty(c.shape, DT::f64, g.backend());
            g.backend()->cast(x, y);
            x = y;
          }
          return In{x};
        },
        {out("out", c.shape, c.to, exact())}, [](Backend& be, In& in, Out& o) { be.cast(in[0], o[0]); });
  }
  // Integers to floats: exact when representable; large ints into bf16 round to nearest even.
  t.add(
      "cast/1031_i32_to_f32/i32", Kernel::cast, {DT::i32, DT::f32},
      [](Gen& g) { return In{g.ints({1031}, -100000, 100000)}; }, {out("out", {1031}, DT::f32, exact())},
      [](Backend& be, In& in, Out& o) { be.cast(in[0], o[0]); });
  t.add(
      "cast/1031_i32_to_bf16/i32", Kernel::cast, {DT::i32, DT::bf16},
      [](Gen& g) { return In{g.ints({1031}, -100000, 100000)}; }, {out("out", {1031}, DT::bf16, exact())},
      [](Backend& be, In& in, Out& o) { be.cast(in[0], o[0]); });
  // In place (allowed for equal dtypes): out aliases x.
  t.add(
      "cast/inplace_1031_f32_to_f32/f32", Kernel::cast, {DT::f32},
      [](Gen& g) { return In{g.uniform({1031}, -10, 10)}; }, {out("out", {1031}, DT::f32, exact(), 0)},
      [](Backend& be, In&, Out& o) { be.cast(o[0], o[0]); });
  // Special values: signed zeros, infinities, NaN, subnormals, round-to-nearest-even ties, overflow.
  auto specials = [] {
    const uint32_t bits[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u,
                             0x007fffffu, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f804000u, 0x7f7fffffu,
                             0xff7fffffu, 0x477fe000u, 0x477ff000u, 0x47800000u, 0x33800000u, 0x33000000u,
                             0x38800000u, 0x387fc000u, 0x3f800001u, 0xbf808001u, 0x3dcccccdu, 0x42c80000u};
    std::vector<float> v;
    for (uint32_t b : bits) v.push_back(f32_from_bits(b));
    return v;
  };
  for (DT to : {DT::bf16, DT::f16}) {
    t.add(
        std::string("cast/specials_f32_to_") + dtype_name(to) + "/f32", Kernel::cast, {DT::f32, to},
        [specials](Gen& g) {
          auto v = specials();
          return In{g.from_floats(v, {int64_t(v.size())})};
        },
        {out("out", {24}, to, exact())}, [](Backend& be, In& in, Out& o) { be.cast(in[0], o[0]); });
  }
}

void add_strided_copy(Table& t) {
  // Permute: dst contiguous in the permuted shape, src read through permuted strides.
  auto permute = [&t](const Shape& s, std::vector<int> perm, DT dt, const std::string& what) {
    Shape ds;
    std::vector<int64_t> ss(s.size()), cs(s.size());
    int64_t st = 1;
    for (int i = int(s.size()) - 1; i >= 0; --i) {
      cs[size_t(i)] = st;
      st *= s[size_t(i)];
    }
    for (int p : perm) {
      ds.push_back(s[size_t(p)]);
    }
    for (size_t i = 0; i < perm.size(); ++i) ss[i] = cs[size_t(perm[i])];
    std::vector<int64_t> dstr(ds.size());
    st = 1;
    for (int i = int(ds.size()) - 1; i >= 0; --i) {
      dstr[size_t(i)] = st;
      st *= ds[size_t(i)];
    }
    StridedCopyParams p{ds, ss, dstr, 0, 0};
    t.add(
        "strided_copy/" + what + "_" + dims(s) + "/" + dtype_name(dt), Kernel::strided_copy, {dt},
        [s, dt](Gen& g) {
          if (dt == DT::i32) return In{g.ints(s, -1000, 1000)};
          return In{g.uniform(s, -1, 1, dt)};
        },
        {out("dst", ds, dt, exact())}, [p](Backend& be, In& in, Out& o) { be.strided_copy(in[0], o[0], p); });
  };
  permute({2, 3, 4, 5}, {0, 2, 1, 3}, DT::f32, "perm0213");
  permute({4, 5, 6, 7}, {3, 2, 1, 0}, DT::f32, "perm3210");
  permute({37, 53}, {1, 0}, DT::f32, "transpose");
  permute({2, 3, 4, 5}, {0, 2, 1, 3}, DT::bf16, "perm0213");
  permute({3, 4, 5}, {2, 0, 1}, DT::i32, "perm201");
  permute({2, 256, 6, 64}, {0, 2, 1, 3}, DT::f32, "headsplit");
  // Slice: rows 2..6, columns 3..8 of a [10, 12] source.
  t.add(
      "strided_copy/slice_10x12_to_5x6/f32", Kernel::strided_copy, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({10, 12}, -1, 1)};
      },
      {out("dst", {5, 6}, DT::f32, exact())},
      [](Backend& be, In& in, Out& o) {
        be.strided_copy(in[0], o[0], StridedCopyParams{{5, 6}, {12, 1}, {6, 1}, 2 * 12 + 3, 0});
      });
  // Concat: a [4, 3] block into columns 5..7 of an existing [4, 10]; the other columns must stay.
  t.add(
      "strided_copy/concat_4x3_into_4x10/f32", Kernel::strided_copy, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({4, 3}, -1, 1), g.uniform({4, 10}, 2, 3)};
      },
      {out("dst", {4, 10}, DT::f32, exact(), 1)},
      [](Backend& be, In& in, Out& o) {
        be.strided_copy(in[0], o[0], StridedCopyParams{{4, 3}, {3, 1}, {10, 1}, 0, 5});
      });
  // Broadcast-materialise: a [1, 16] row to [8, 16] through a zero stride.
  t.add(
      "strided_copy/broadcast_1x16_to_8x16/f32", Kernel::strided_copy, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({1, 16}, -1, 1)};
      },
      {out("dst", {8, 16}, DT::f32, exact())},
      [](Backend& be, In& in, Out& o) {
        be.strided_copy(in[0], o[0], StridedCopyParams{{8, 16}, {0, 1}, {16, 1}, 0, 0});
      });
}

// ---------------------------------------------------------------- matmul

struct MM {
  std::string what;
  int64_t batch, m, n, k;
  bool ta = false, tb = false, bias = false, a_bcast = false, b_bcast = false;
  float alpha = 1.0f, beta = 0.0f;
  Activation act = Activation::none;
  DT dt = DT::f32;
  bool widened = false;  // half a and b into an f32 out (dew/kernel_contracts.hpp): checked at f32's tolerance
};

void add_matmul_case(Table& t, const MM& c) {
  MatmulParams p;
  p.batch = c.batch;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.trans_a = c.ta;
  p.trans_b = c.tb;
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.act = c.act;
  p.a_batch_stride = c.a_bcast ? 0 : c.m * c.k;
  p.b_batch_stride = c.b_bcast ? 0 : c.k * c.n;
  const int64_t na = (c.a_bcast ? 1 : c.batch) * c.m * c.k, nb = (c.b_bcast ? 1 : c.batch) * c.k * c.n;
  std::string id = "matmul/" + c.what + "_b" + std::to_string(c.batch) + "m" + std::to_string(c.m) + "n" +
                   std::to_string(c.n) + "k" + std::to_string(c.k);
  if (c.ta) id += "_ta";
  if (c.tb) id += "_tb";
  if (c.a_bcast) id += "_abcast";
  if (c.b_bcast) id += "_bbcast";
  if (c.bias) id += "_bias";
  if (c.act != Activation::none) id += std::string("_") + act_name(c.act);
  if (c.alpha != 1.0f) id += "_alpha" + fmt(c.alpha);
  if (c.beta != 0.0f) id += "_beta" + fmt(c.beta);
  if (c.widened) id += "_widened";
  id += std::string("/") + dtype_name(c.dt);
  Check ch = tol(8, double(c.k));
  ch.zeros_ok = c.act == Activation::relu;
  const Shape os{c.batch, c.m, c.n};
  const DT out_dt = c.widened ? DT::f32 : c.dt;
  t.add(
      id, Kernel::matmul, {c.dt},
      [c, na, nb, os, out_dt](Gen& g) {
        In in{g.uniform({na}, -1, 1, c.dt), g.uniform({nb}, -1, 1, c.dt),
              c.bias ? g.uniform({c.n}, -1, 1, c.dt) : undef()};
        if (c.beta != 0.0f) in.push_back(g.uniform(os, -1, 1, out_dt));
        return in;
      },
      {out("out", os, out_dt, ch, c.beta != 0.0f ? 3 : -1)},
      [p](Backend& be, In& in, Out& o) { be.matmul(in[0], in[1], in[2], o[0], p); });
}

void add_matmul(Table& t) {
  const std::vector<MM> cs = {
      {"square", 1, 64, 64, 64},
      {"odd", 1, 37, 53, 29},
      {"trans", 1, 48, 40, 33, true, false},
      {"trans", 1, 48, 40, 33, false, true},
      {"trans", 1, 48, 40, 33, true, true},
      {"batched", 3, 16, 24, 20},
      {"batched", 3, 17, 9, 31, false, true},
      {"shared_weight", 4, 16, 24, 20, false, false, false, false, true},
      {"shared_weight", 4, 16, 24, 20, false, true, false, false, true},
      {"shared_input", 3, 16, 24, 20, false, false, false, true, false},
      {"bias", 1, 37, 53, 29, false, false, true},
      {"bias", 2, 37, 53, 29, false, true, true},
      {"act", 1, 33, 65, 47, false, false, true, false, false, 1.0f, 0.0f, Activation::relu},
      {"act", 1, 33, 65, 47, false, false, true, false, false, 1.0f, 0.0f, Activation::gelu},
      {"act", 1, 33, 65, 47, false, false, true, false, false, 1.0f, 0.0f, Activation::gelu_tanh},
      {"act", 1, 33, 65, 47, false, false, true, false, false, 1.0f, 0.0f, Activation::silu},
      {"act", 1, 33, 65, 47, false, true, false, false, false, 1.0f, 0.0f, Activation::relu},
      {"act", 2, 33, 65, 47, false, true, true, false, false, 0.5f, 0.0f, Activation::gelu},
      {"alpha", 1, 37, 53, 29, false, false, false, false, false, 0.5f},
      {"accumulate", 1, 37, 53, 29, false, false, false, false, false, 1.0f, 1.0f},
      {"accumulate", 2, 37, 53, 29, true, false, true, false, false, 1.0f, 1.0f},
      {"accumulate", 1, 37, 53, 29, false, true, false, false, false, 0.25f, 0.5f},
      {"gemv", 1, 1, 256, 384},
      {"gemv", 1, 256, 1, 384, false, true},
      // Decoding: one row against a [n, k] Linear weight (cpu's hand-written matrix-vector path).
      {"decode", 1, 1, 1152, 384, false, true},
      {"decode", 1, 1, 257, 1031, false, true, true, false, false, 0.5f},
      {"decode", 1, 1, 3, 7, false, true, true},
      // Decoding a server's active sequences: a few rows against a weight (cpu's row-wise path), with
      // the epilogues a Linear layer fuses.
      {"decode_rows", 1, 16, 1152, 384, false, true},
      {"decode_rows", 1, 7, 257, 1031, false, true, true, false, false, 0.5f},
      {"decode_rows", 1, 5, 1024, 384, false, true, false, false, false, 1.0f, 0.0f, Activation::silu},
      {"decode_rows", 1, 32, 97, 40, false, true, true, false, false, 1.0f, 0.0f, Activation::gelu_tanh},
      {"decode_rows", 1, 33, 96, 40, false, true, true},
      {"outer", 1, 64, 48, 1},
      {"tiny", 1, 1, 1, 1},
      // Transformer-sized (char-small: d 384, qkv 1152, T 256, head 64).
      {"qkv", 1, 256, 1152, 384},
      {"linear", 1, 512, 1152, 384, false, true, true},
      {"dweight", 1, 384, 1152, 256, true, false},
      {"scores", 12, 128, 128, 64, false, true},
      // Row strides that are multiples of 256 floats (cpu on AVX2 CPUs reads padded copies of A when
      // transposed and of B when not, matmul.cpp's top comment): DiT's weight gradients, then smaller
      // shapes with every epilogue, the 64-row boundary and a batch (which keeps the caller's buffers).
      {"pow2_stride", 1, 1024, 256, 256, true, false},
      {"pow2_stride", 1, 256, 1024, 256, true, false},
      {"pow2_stride", 1, 1024, 256, 96, false, false},
      {"pow2_stride", 1, 512, 512, 37, true, false, true, false, false, 0.5f, 1.0f},
      {"pow2_stride", 1, 256, 1024, 40, true, false, true, false, false, 1.0f, 0.0f, Activation::gelu_tanh},
      {"pow2_stride", 1, 768, 256, 33, true, true, false, false, false, 1.0f, 0.5f},
      {"pow2_stride", 1, 64, 512, 50, false, false, true},
      {"pow2_stride", 1, 63, 512, 50, false, false},
      {"pow2_stride", 1, 256, 64, 70, true, false, false, false, false, 2.0f},
      {"pow2_stride", 1, 256, 63, 70, true, false},
      {"pow2_stride", 2, 256, 256, 48, true, false, true, false, false, 1.0f, 1.0f},
      {"bf16", 1, 64, 64, 64, false, false, false, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 2, 37, 53, 29, false, true, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      // Batched with a bias, around the case above (oneDNN 2.6's AMX kernel got it wrong on an Intel Xeon with
      // AMX, session 18): which of batch, transposed B, odd k and the bias it takes.
      {"bf16", 2, 37, 53, 29, false, false, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 2, 37, 53, 29, false, true, false, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 2, 37, 53, 32, false, true, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 2, 64, 64, 64, false, true, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 1, 37, 53, 29, false, true, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 3, 37, 53, 29, true, false, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"bf16", 2, 37, 53, 29, false, true, true, false, true, 1.0f, 0.0f, Activation::none, DT::bf16},
      // Mixed precision (docs/precision.md): the products of a bf16 / f16 training step.
      {"linear", 1, 512, 1152, 384, false, true, true, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"dweight", 1, 384, 1152, 256, true, false, false, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"act", 1, 33, 65, 47, false, true, true, false, false, 1.0f, 0.0f, Activation::silu, DT::bf16},
      {"accumulate", 2, 37, 53, 29, true, false, false, false, false, 1.0f, 1.0f, Activation::none, DT::bf16},
      {"scores", 12, 128, 128, 64, false, true, false, false, false, 0.125f, 0.0f, Activation::none, DT::bf16},
      {"f16", 1, 64, 64, 64, false, false, false, false, false, 1.0f, 0.0f, Activation::none, DT::f16},
      {"f16", 2, 37, 53, 29, false, true, true, false, false, 1.0f, 0.0f, Activation::none, DT::f16},
  };
  for (const MM& c : cs) add_matmul_case(t, c);
  // The widened product: a training step's gradient products under autocast, the f32 accumulation stored unrounded
  // (a backend that rounds it to the half dtype first is off by ~2^-9 relative, far past f32's tolerance here).
  const std::vector<MM> widened = {
      {"dweight", 1, 384, 1152, 256, true, false, false, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"dinput", 1, 256, 384, 1152, false, false, false, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"odd", 1, 37, 53, 29, false, true, false, false, false, 1.0f, 0.0f, Activation::none, DT::bf16},
      {"accumulate", 1, 37, 53, 29, true, false, false, false, false, 1.0f, 1.0f, Activation::none, DT::bf16},
      {"batched", 2, 37, 53, 29, false, true, false, false, false, 0.5f, 0.0f, Activation::none, DT::bf16},
  };
  for (MM c : widened) {
    c.widened = true;
    add_matmul_case(t, c);
  }
}

// ---------------------------------------------------------------- unary, binary, reduce

struct UnarySpec {
  UnaryOp op;
  float alpha, beta, lo, hi;
  std::string tag;  // distinguishes several params of one op
};

std::vector<UnarySpec> unary_specs() {
  return {{UnaryOp::neg, 1, 0, -3, 3, ""},
          {UnaryOp::exp, 1, 0, -5, 5, ""},
          {UnaryOp::log, 1, 0, 0.05f, 8, ""},
          {UnaryOp::sqrt, 1, 0, 0, 9, ""},
          {UnaryOp::rsqrt, 1, 0, 0.05f, 9, ""},
          {UnaryOp::square, 1, 0, -3, 3, ""},
          {UnaryOp::abs, 1, 0, -3, 3, ""},
          {UnaryOp::tanh, 1, 0, -4, 4, ""},
          {UnaryOp::sigmoid, 1, 0, -8, 8, ""},
          {UnaryOp::relu, 1, 0, -2, 2, ""},
          {UnaryOp::gelu, 1, 0, -5, 5, ""},
          {UnaryOp::gelu_tanh, 1, 0, -5, 5, ""},
          // past the tails of cpu's act_exp (e^z is taken as 0 below z = -87: v > ~9.6 for GELU-tanh, v > 87 for
          // SiLU; capped at e^80 above: v < ~-9.2, v < -80), so a lost cap or cut-off shows
          {UnaryOp::gelu_tanh, 1, 0, -12, 12, "wide"},
          {UnaryOp::silu, 1, 0, -6, 6, ""},
          {UnaryOp::silu, 1, 0, -100, 100, "wide"},
          {UnaryOp::sin, 1, 0, -6, 6, ""},
          {UnaryOp::cos, 1, 0, -6, 6, ""},
          {UnaryOp::reciprocal, 1, 0, 0.2f, 4, ""},
          {UnaryOp::reciprocal, 1, 0, -4, -0.2f, "neg"},
          {UnaryOp::affine, 1.5f, -0.25f, -3, 3, ""},
          {UnaryOp::pow, 2.5f, 0, 0.1f, 3, "a2.5"},
          {UnaryOp::pow, -0.5f, 0, 0.1f, 3, "a-0.5"},
          {UnaryOp::pow, 2.0f, 0, -2, 2, "a2_negbase"},
          {UnaryOp::pow, 3.0f, 0, -2, 2, "a3_negbase"},
          {UnaryOp::clamp, -0.5f, 0.5f, -2, 2, ""},
          {UnaryOp::softcap, 2.0f, 0, -6, 6, ""}};
}

void add_unary(Table& t) {
  for (const UnarySpec& s : unary_specs()) {
    const UnaryParams p{s.op, s.alpha, s.beta};
    const std::string name = std::string(unary_op_name(s.op)) + (s.tag.empty() ? "" : "_" + s.tag);
    Check c = tol(8);
    // sigmoid's derivative s (1 - s) loses f32 bits to 1 - s as s nears 1 (relative error ~ eps / (1 - s)): one
    // element of the 1032 draw needs 8.4 of these units.
    Check cb = tol(s.op == UnaryOp::sigmoid ? 16 : 8);
    // relu zeroes half of its inputs; clamp's and relu's backward zero the gradient outside the linear part.
    c.zeros_ok = s.op == UnaryOp::relu;
    cb.zeros_ok = s.op == UnaryOp::relu || s.op == UnaryOp::clamp;
    // 1031 elements, and 1032 (a multiple of 8: cuda's 16-byte path)
    for (const int64_t n : {int64_t(1031), int64_t(1032)}) {
      const std::string sz = "_" + std::to_string(n);
      t.add(
          "unary/" + name + sz + "/f32", Kernel::unary, {DT::f32},
          [s, n](Gen& g) { return In{g.uniform({n}, s.lo, s.hi)}; }, {out("out", {n}, DT::f32, c)},
          [p](Backend& be, In& in, Out& o) { be.unary(in[0], o[0], p); });
      t.add(
          "unary_backward/" + name + sz + "/f32", Kernel::unary_backward, {DT::f32},
          [s, n](Gen& g) {
            return In{g.uniform({n}, s.lo, s.hi), g.uniform({n}, -1, 1)};
          },
          {out("dx", {n}, DT::f32, cb)},
          [p](Backend& be, In& in, Out& o) { be.unary_backward(in[0], in[1], o[0], p); });
    }
  }
  // A 2-D shape, in-place (out aliases x, allowed for elementwise kernels), and bf16.
  for (UnaryOp op : {UnaryOp::exp, UnaryOp::gelu, UnaryOp::silu}) {
    const UnaryParams p{op, 1, 0};
    t.add(
        std::string("unary/") + unary_op_name(op) + "_7x37/f32", Kernel::unary, {DT::f32},
        [](Gen& g) {
          return In{g.uniform({7, 37}, -3, 3)};
        },
        {out("out", {7, 37}, DT::f32, tol(8))}, [p](Backend& be, In& in, Out& o) { be.unary(in[0], o[0], p); });
    t.add(
        std::string("unary/") + unary_op_name(op) + "_inplace_1031/f32", Kernel::unary, {DT::f32},
        [](Gen& g) { return In{g.uniform({1031}, -3, 3)}; }, {out("out", {1031}, DT::f32, tol(8), 0)},
        [p](Backend& be, In&, Out& o) { be.unary(o[0], o[0], p); });
    t.add(
        std::string("unary/") + unary_op_name(op) + "_1031/bf16", Kernel::unary, {DT::bf16},
        [](Gen& g) { return In{g.uniform({1031}, -3, 3, DT::bf16)}; }, {out("out", {1031}, DT::bf16, tol(8))},
        [p](Backend& be, In& in, Out& o) { be.unary(in[0], o[0], p); });
  }
  t.add(
      "unary_backward/silu_inplace_1031/f32", Kernel::unary_backward, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({1031}, -3, 3), g.uniform({1031}, -1, 1)};
      },
      {out("dx", {1031}, DT::f32, tol(8), 1)},
      [](Backend& be, In& in, Out& o) { be.unary_backward(in[0], o[0], o[0], UnaryParams{UnaryOp::silu}); });
}

// act(gate) * up and its two gradients, for every activation (none: the bilinear product), on a 1-D and a
// 2-D shape, in place (out over gate; dgate over gate and dup over up), and at >= 2^18 elements (the
// threaded path). k = 8 as unary: one transcendental and two products per element.
void add_gated(Table& t) {
  const Activation acts[] = {Activation::none, Activation::relu, Activation::gelu, Activation::gelu_tanh,
                             Activation::silu};
  const char* names[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
  for (size_t a = 0; a < std::size(acts); ++a) {
    const Activation act = acts[a];
    Check c = tol(8);
    c.zeros_ok = act == Activation::relu;  // relu zeroes half of the products and of dgate
    for (const Shape& sh : {Shape{1031}, Shape{7, 37}, Shape{1 << 18}}) {
      const std::string shape = sh.size() == 2 ? "7x37" : std::to_string(sh[0]);
      t.add(
          std::string("gated_activation/") + names[a] + "_" + shape + "/f32", Kernel::gated_activation, {DT::f32},
          [sh](Gen& g) { return In{g.uniform(sh, -4, 4), g.uniform(sh, -2, 2)}; }, {out("out", sh, DT::f32, c)},
          [act](Backend& be, In& in, Out& o) { be.gated_activation(in[0], in[1], o[0], act); });
      t.add(
          std::string("gated_activation_backward/") + names[a] + "_" + shape + "/f32",
          Kernel::gated_activation_backward, {DT::f32},
          [sh](Gen& g) {
            return In{g.uniform(sh, -4, 4), g.uniform(sh, -2, 2), g.uniform(sh, -1, 1)};
          },
          {out("dgate", sh, DT::f32, c), out("dup", sh, DT::f32, c)},
          [act](Backend& be, In& in, Out& o) { be.gated_activation_backward(in[0], in[1], in[2], o[0], o[1], act); });
    }
    t.add(
        std::string("gated_activation/") + names[a] + "_inplace_1031/f32", Kernel::gated_activation, {DT::f32},
        [](Gen& g) { return In{g.uniform({1031}, -4, 4), g.uniform({1031}, -2, 2)}; },
        {out("out", {1031}, DT::f32, c, 0)},
        [act](Backend& be, In& in, Out& o) { be.gated_activation(o[0], in[1], o[0], act); });
    t.add(
        std::string("gated_activation_backward/") + names[a] + "_inplace_1031/f32", Kernel::gated_activation_backward,
        {DT::f32},
        [](Gen& g) {
          return In{g.uniform({1031}, -4, 4), g.uniform({1031}, -2, 2), g.uniform({1031}, -1, 1)};
        },
        {out("dgate", {1031}, DT::f32, c, 0), out("dup", {1031}, DT::f32, c, 1)},
        [act](Backend& be, In& in, Out& o) { be.gated_activation_backward(o[0], o[1], in[2], o[0], o[1], act); });
  }
}

// unary_backward and the column sums of its dx (a bias gradient) in one call: the DiT MLP's activations on
// odd shapes (one row, rows of 33), a 3-D input, relu (half the derivatives zero), and 300 x 1024 (>= 2^18
// elements: the threaded path, rows split over the team). dx k = 8 as unary_backward; dsum k = 8 with K = rows
// (a sum of rows terms, each a few ulp off).
void add_unary_backward_sum(Table& t) {
  struct U {
    Shape shape;
    UnaryOp op;
    const char* name;
  };
  const U us[] = {{{5, 33}, UnaryOp::gelu_tanh, "gelu_tanh"},
                  {{1, 65}, UnaryOp::gelu, "gelu"},
                  {{3, 4, 100}, UnaryOp::silu, "silu"},
                  {{9, 17}, UnaryOp::relu, "relu"},
                  {{300, 1024}, UnaryOp::gelu_tanh, "gelu_tanh"}};
  for (const U& u : us) {
    const int64_t D = u.shape.back(), rows = numel_of(u.shape) / D;
    Check c = tol(8), cs = tol(8, double(rows));
    c.zeros_ok = u.op == UnaryOp::relu;
    const UnaryParams p{u.op, 1, 0};
    t.add(
        std::string("unary_backward_sum/") + u.name + "_" + dims(u.shape) + "/f32", Kernel::unary_backward_sum,
        {DT::f32},
        [u](Gen& g) {
          return In{g.uniform(u.shape, -3, 3), g.uniform(u.shape, -1, 1)};
        },
        {out("dx", u.shape, DT::f32, c), out("dsum", {D}, DT::f32, cs)},
        [p](Backend& be, In& in, Out& o) { be.unary_backward_sum(in[0], in[1], o[0], o[1], p); });
  }
}

// adaLN-Zero's gated residual y = x + gate[g] * f and its backward (df = dy * gate[g], dgate[g] = the column sums
// of dy * f over group g's rows). Every gate row is a distinct draw, so a backend that reads one gate row for
// every group, picks the row by r % G, or sums every group into one dgate row fails: 4x7x96 groups by sample
// (the DiT), 6x5x33 has groups of 10 rows that cross the samples and an odd D, 3x1031 one row a group, 16x64x256
// is the DiT's shape at >= 2^18 elements (the threaded path); y over x and over f in place. k = 0 forward
// (two correctly rounded operations, as mul then add), dgate k = 4 with K = the rows of a group (reduce's sum).
void add_gated_residual(Table& t) {
  struct R {
    Shape shape;
    int64_t groups;
  };
  const R rs[] = {{{4, 7, 96}, 4}, {{6, 5, 33}, 3}, {{3, 1031}, 3}, {{2, 9, 40}, 1}, {{16, 64, 256}, 16}};
  for (const R& r : rs) {
    const int64_t D = r.shape.back(), rows = numel_of(r.shape) / D, per = rows / r.groups;
    const Shape gs{r.groups, D};
    const std::string sh = dims(r.shape) + "_groups" + std::to_string(r.groups);
    t.add(
        "gated_residual/" + sh + "/f32", Kernel::gated_residual, {DT::f32},
        [r, gs](Gen& g) {
          return In{g.uniform(r.shape, -2, 2), g.uniform(r.shape, -2, 2), g.uniform(gs, -1.5f, 1.5f)};
        },
        {out("y", r.shape, DT::f32, tol(0))},
        [](Backend& be, In& in, Out& o) { be.gated_residual(in[0], in[1], in[2], o[0]); });
    t.add(
        "gated_residual_backward/" + sh + "/f32", Kernel::gated_residual_backward, {DT::f32},
        [r, gs](Gen& g) {
          return In{g.uniform(r.shape, -2, 2), g.uniform(gs, -1.5f, 1.5f), g.uniform(r.shape, -1, 1)};
        },
        {out("df", r.shape, DT::f32, tol(0)), out("dgate", gs, DT::f32, tol(4, double(per)))},
        [](Backend& be, In& in, Out& o) { be.gated_residual_backward(in[0], in[1], in[2], o[0], o[1]); });
  }
  t.add(
      "gated_residual/4x7x96_groups4_inplace_x/f32", Kernel::gated_residual, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({4, 7, 96}, -2, 2), g.uniform({4, 7, 96}, -2, 2), g.uniform({4, 96}, -1, 1)};
      },
      {out("y", {4, 7, 96}, DT::f32, tol(0), 0)},
      [](Backend& be, In& in, Out& o) { be.gated_residual(o[0], in[1], in[2], o[0]); });
  t.add(
      "gated_residual/4x7x96_groups4_inplace_f/f32", Kernel::gated_residual, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({4, 7, 96}, -2, 2), g.uniform({4, 7, 96}, -2, 2), g.uniform({4, 96}, -1, 1)};
      },
      {out("y", {4, 7, 96}, DT::f32, tol(0), 1)},
      [](Backend& be, In& in, Out& o) { be.gated_residual(in[0], o[0], in[2], o[0]); });
}

void add_binary(Table& t) {
  struct Layout {
    std::string name;
    Shape a, b, out;
  };
  const std::vector<Layout> layouts = {
      {"same", {7, 129}, {7, 129}, {7, 129}}, {"row", {13, 64}, {64}, {13, 64}},
      {"left", {64}, {13, 64}, {13, 64}},     {"b1d_bt1", {3, 1, 24}, {3, 5, 1}, {3, 5, 24}},
      {"scalar", {5, 33}, {1}, {5, 33}},      {"col", {6, 40}, {6, 1}, {6, 40}}};
  const BinaryOp ops[] = {BinaryOp::add,     BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum,
                          BinaryOp::minimum, BinaryOp::eq,  BinaryOp::gt,  BinaryOp::lt};
  for (BinaryOp op : ops) {
    const bool cmp = op == BinaryOp::eq || op == BinaryOp::gt || op == BinaryOp::lt;
    for (const Layout& l : layouts) {
      Check c = tol(0);
      c.zeros_ok = cmp;
      t.add(
          std::string("binary/") + binary_op_name(op) + "_" + l.name + "_" + dims(l.a) + "_" + dims(l.b) + "/f32",
          Kernel::binary, {DT::f32},
          [l, op, cmp](Gen& g) {
            // Comparisons and max/min get quantized inputs so that ties occur.
            if (cmp || op == BinaryOp::maximum || op == BinaryOp::minimum)
              return In{g.quantized(l.a, -2, 2, 0.5f), g.quantized(l.b, -2, 2, 0.5f)};
            if (op == BinaryOp::div) return In{g.uniform(l.a, -2, 2), g.uniform(l.b, 0.5f, 2)};
            return In{g.uniform(l.a, -2, 2), g.uniform(l.b, -2, 2)};
          },
          {out("out", l.out, DT::f32, c)}, [op](Backend& be, In& in, Out& o) { be.binary(in[0], in[1], o[0], op); });
    }
  }
  // In place: out aliases a (same shape).
  for (BinaryOp op : {BinaryOp::add, BinaryOp::mul}) {
    t.add(
        std::string("binary/") + binary_op_name(op) + "_inplace_row_13x64_64/f32", Kernel::binary, {DT::f32},
        [](Gen& g) {
          return In{g.uniform({13, 64}, -2, 2), g.uniform({64}, -2, 2)};
        },
        {out("out", {13, 64}, DT::f32, tol(0), 0)},
        [op](Backend& be, In& in, Out& o) { be.binary(o[0], in[1], o[0], op); });
  }
  for (BinaryOp op : {BinaryOp::add, BinaryOp::mul}) {
    for (const Layout& l : {layouts[0], layouts[1]}) {
      t.add(
          std::string("binary/") + binary_op_name(op) + "_" + l.name + "_" + dims(l.a) + "_" + dims(l.b) + "/bf16",
          Kernel::binary, {DT::bf16},
          [l](Gen& g) {
            return In{g.uniform(l.a, -2, 2, DT::bf16), g.uniform(l.b, -2, 2, DT::bf16)};
          },
          {out("out", l.out, DT::bf16, tol(0))},
          [op](Backend& be, In& in, Out& o) { be.binary(in[0], in[1], o[0], op); });
    }
  }
}

void add_reduce(Table& t) {
  struct L {
    int64_t outer, reduce, inner;
  };
  // {3, 70001, 1}: a few long rows (cuda reduces them in slices, two stages)
  const L ls[] = {{1, 1000, 1}, {7, 13, 5},   {4, 1, 9},    {3, 300, 64},
                  {64, 64, 1},  {1, 64, 128}, {2, 4097, 1}, {3, 70001, 1}};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min, ReduceOp::sumsq};
  for (ReduceOp op : ops) {
    for (const L& l : ls) {
      const ReduceParams p{op, l.outer, l.reduce, l.inner};
      const Check c = (op == ReduceOp::max || op == ReduceOp::min) ? exact() : tol(4, double(l.reduce));
      const std::string id = std::string("reduce/") + reduce_op_name(op) + "_o" + std::to_string(l.outer) + "r" +
                             std::to_string(l.reduce) + "i" + std::to_string(l.inner) + "/f32";
      t.add(
          id, Kernel::reduce, {DT::f32},
          [l](Gen& g) {
            return In{g.uniform({l.outer, l.reduce, l.inner}, -1, 1)};
          },
          {out("out", {l.outer, l.inner}, DT::f32, c)},
          [p](Backend& be, In& in, Out& o) { be.reduce(in[0], o[0], p); });
    }
  }
  // sum_squares_group: tensors of every size class the device splits differently (under 64 elements, one block, the
  // sliced long rows) and an empty one, 70 in all (two launches of 64 on cuda).
  {
    std::vector<int64_t> ns = {0, 1, 63, 64, 1000, 65535, 65536, 200003};
    for (int i = 0; i < 62; ++i) ns.push_back(1 + (i * 53) % 700);
    std::vector<OutSpec> outs = {out("out", {int64_t(ns.size())}, DT::f32, tol(4, 200003.0))};
    t.add(
        "sum_squares_group/70_tensors/f32", Kernel::sum_squares_group, {DT::f32},
        [ns](Gen& g) {
          In in;
          for (int64_t n : ns) in.push_back(g.uniform({n}, -1, 1));
          return in;
        },
        outs, [](Backend& be, In& in, Out& o) { be.sum_squares_group(in, o[0]); });
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    const ReduceParams p{op, 3, 300, 64};
    t.add(
        std::string("reduce/") + reduce_op_name(op) + "_o3r300i64/bf16", Kernel::reduce, {DT::bf16},
        [](Gen& g) {
          return In{g.uniform({3, 300, 64}, -1, 1, DT::bf16)};
        },
        {out("out", {3, 64}, DT::bf16, op == ReduceOp::max ? exact() : tol(4, 300))},
        [p](Backend& be, In& in, Out& o) { be.reduce(in[0], o[0], p); });
  }
}

// ---------------------------------------------------------------- softmax, norms

void add_softmax(Table& t) {
  struct S {
    Shape shape;
    float lo, hi;
  };
  const S ss[] = {{{5, 37}, -3, 3}, {{8, 1000}, -5, 5}, {{3, 1}, -3, 3}, {{16, 256}, -40, 40}, {{2, 3, 4099}, -8, 8}};
  for (const S& s : ss) {
    const double D = double(s.shape.back());
    const std::string sh = dims(s.shape) + (s.hi > 10 ? "_wide" : "");
    // A one-wide row is all zeros under log_softmax (and its backward), by definition.
    Check c = tol(8, D);
    c.zeros_ok = D == 1;
    t.add(
        "softmax/" + sh + "/f32", Kernel::softmax, {DT::f32},
        [s](Gen& g) { return In{g.uniform(s.shape, s.lo, s.hi)}; }, {out("y", s.shape, DT::f32, c)},
        [](Backend& be, In& in, Out& o) { be.softmax(in[0], o[0]); });
    t.add(
        "log_softmax/" + sh + "/f32", Kernel::log_softmax, {DT::f32},
        [s](Gen& g) { return In{g.uniform(s.shape, s.lo, s.hi)}; }, {out("y", s.shape, DT::f32, c)},
        [](Backend& be, In& in, Out& o) { be.log_softmax(in[0], o[0]); });
    t.add(
        "softmax_backward/" + sh + "/f32", Kernel::softmax_backward, {DT::f32},
        [s](Gen& g) {
          Tensor x = g.uniform(s.shape, s.lo, s.hi);
          Tensor y = Tensor::empty(s.shape, DT::f32, g.backend());
          g.backend()->softmax(x, y);
          return In{y, g.uniform(s.shape, -1, 1)};
        },
        {out("dx", s.shape, DT::f32, c)}, [](Backend& be, In& in, Out& o) { be.softmax_backward(in[0], in[1], o[0]); });
    t.add(
        "log_softmax_backward/" + sh + "/f32", Kernel::log_softmax_backward, {DT::f32},
        [s](Gen& g) {
          Tensor x = g.uniform(s.shape, s.lo, s.hi);
          Tensor y = Tensor::empty(s.shape, DT::f32, g.backend());
          g.backend()->log_softmax(x, y);
          return In{y, g.uniform(s.shape, -1, 1)};
        },
        {out("dx", s.shape, DT::f32, c)},
        [](Backend& be, In& in, Out& o) { be.log_softmax_backward(in[0], in[1], o[0]); });
  }
  for (Kernel k : {Kernel::softmax, Kernel::log_softmax}) {
    t.add(
        std::string(kernel_name(k)) + "/8x1000/bf16", k, {DT::bf16},
        [](Gen& g) {
          return In{g.uniform({8, 1000}, -5, 5, DT::bf16)};
        },
        {out("y", {8, 1000}, DT::bf16, tol(8, 1000))},
        [k](Backend& be, In& in, Out& o) {
          if (k == Kernel::softmax)
            be.softmax(in[0], o[0]);
          else
            be.log_softmax(in[0], o[0]);
        });
  }
}

void add_layer_norm(Table& t) {
  struct L {
    Shape shape;
    bool w, b;
    float mean;
    int64_t groups = 1;  // > 1: weight / bias [groups, D], one parameter row per run of rows / groups rows
  };
  // The grouped cases have distinct parameter rows (uniform draws), so a backend that reads one row for every
  // group, or sums the gradients of all groups into one, fails them; 4x7x96 splits [B, N, D] by sample (adaLN),
  // 6x5x33 (rows 30 in 3 groups of 10) crosses the samples and has an odd D.
  const L ls[] = {{{4, 7, 96}, true, true, 0},        {{6, 33}, false, false, 0},     {{4, 384}, true, false, 0},
                  {{8, 384}, true, true, 4.0f},       {{3, 1024}, true, true, 0},     {{5, 1}, true, true, 0},
                  {{4, 7, 96}, true, true, 0, 4},     {{6, 5, 33}, true, true, 0, 3}, {{4, 16, 64}, false, true, 0, 4},
                  {{2, 8, 256}, true, false, 1.0f, 2}};
  const float eps = 1e-5f;
  for (const L& l : ls) {
    const int64_t D = l.shape.back(), rows = numel_of(l.shape) / D;
    const Shape ps = l.groups > 1 ? Shape{l.groups, D} : Shape{D};  // weight / bias and their gradients
    std::string sh = dims(l.shape) + (l.w ? "_w" : "") + (l.b ? "_b" : "") +
                     (l.mean != 0 ? "_mean" + fmt(l.mean) : "") +
                     (l.groups > 1 ? "_groups" + std::to_string(l.groups) : "");
    // D == 1: x - mean is exactly 0, so y is the bias (or 0) and rstd is 1/sqrt(eps).
    Check c = tol(16, double(D));
    c.zeros_ok = D == 1;
    Check cw = tol(16, double(rows));
    cw.zeros_ok = D == 1;
    t.add(
        "layer_norm/" + sh + "/f32", Kernel::layer_norm, {DT::f32},
        [l, ps](Gen& g) {
          return In{g.uniform(l.shape, l.mean - 1, l.mean + 1), l.w ? g.uniform(ps, 0.5f, 1.5f) : undef(),
                    l.b ? g.uniform(ps, -0.5f, 0.5f) : undef()};
        },
        {out("y", l.shape, DT::f32, c), out("mean", {rows}, DT::f32, tol(16, double(D))),
         out("rstd", {rows}, DT::f32, tol(16, double(D)))},
        [eps](Backend& be, In& in, Out& o) { be.layer_norm(in[0], in[1], in[2], o[0], o[1], o[2], eps); });
    std::vector<OutSpec> bo{out("dx", l.shape, DT::f32, c)};
    bo.push_back(l.w ? out("dweight", ps, DT::f32, cw) : undefined_out("dweight"));
    bo.push_back(l.b ? out("dbias", ps, DT::f32, tol(16, double(rows))) : undefined_out("dbias"));
    t.add(
        "layer_norm_backward/" + sh + "/f32", Kernel::layer_norm_backward, {DT::f32},
        [l, ps, rows, eps](Gen& g) {
          Tensor x = g.uniform(l.shape, l.mean - 1, l.mean + 1);
          Tensor w = l.w ? g.uniform(ps, 0.5f, 1.5f) : undef();
          Tensor b = l.b ? g.uniform(ps, -0.5f, 0.5f) : undef();
          Tensor y = Tensor::empty(l.shape, DT::f32, g.backend());
          Tensor mean = Tensor::empty({rows}, DT::f32, g.backend()), rstd = Tensor::empty({rows}, DT::f32, g.backend());
          g.backend()->layer_norm(x, w, b, y, mean, rstd, eps);
          return In{x, w, mean, rstd, g.uniform(l.shape, -1, 1)};
        },
        bo,
        [](Backend& be, In& in, Out& o) {
          be.layer_norm_backward(in[0], in[1], in[2], in[3], in[4], o[0], o[1], o[2]);
        });
  }
  // weight defined but only dweight asked for (dbias undefined).
  t.add(
      "layer_norm_backward/4x96_w_b_nodbias/f32", Kernel::layer_norm_backward, {DT::f32},
      [eps](Gen& g) {
        Tensor x = g.uniform({4, 96}, -1, 1), w = g.uniform({96}, 0.5f, 1.5f);
        Tensor y = Tensor::empty({4, 96}, DT::f32, g.backend());
        Tensor mean = Tensor::empty({4}, DT::f32, g.backend()), rstd = Tensor::empty({4}, DT::f32, g.backend());
        g.backend()->layer_norm(x, w, Tensor(), y, mean, rstd, eps);
        return In{x, w, mean, rstd, g.uniform({4, 96}, -1, 1)};
      },
      {out("dx", {4, 96}, DT::f32, tol(16, 96)), out("dweight", {96}, DT::f32, tol(16, 4)), undefined_out("dbias")},
      [](Backend& be, In& in, Out& o) { be.layer_norm_backward(in[0], in[1], in[2], in[3], in[4], o[0], o[1], o[2]); });
  t.add(
      "layer_norm/4x7x96_w_b/bf16", Kernel::layer_norm, {DT::bf16},
      [](Gen& g) {
        return In{g.uniform({4, 7, 96}, -1, 1, DT::bf16), g.uniform({96}, 0.5f, 1.5f, DT::bf16),
                  g.uniform({96}, -0.5f, 0.5f, DT::bf16)};
      },
      {out("y", {4, 7, 96}, DT::bf16, tol(16, 96)), out("mean", {28}, DT::f32, tol(16, 96)),
       out("rstd", {28}, DT::f32, tol(16, 96))},
      [eps](Backend& be, In& in, Out& o) { be.layer_norm(in[0], in[1], in[2], o[0], o[1], o[2], eps); });
  t.add(
      "layer_norm/4x7x96_w_b_groups4/bf16", Kernel::layer_norm, {DT::bf16},
      [](Gen& g) {
        return In{g.uniform({4, 7, 96}, -1, 1, DT::bf16), g.uniform({4, 96}, 0.5f, 1.5f, DT::bf16),
                  g.uniform({4, 96}, -0.5f, 0.5f, DT::bf16)};
      },
      {out("y", {4, 7, 96}, DT::bf16, tol(16, 96)), out("mean", {28}, DT::f32, tol(16, 96)),
       out("rstd", {28}, DT::f32, tol(16, 96))},
      [eps](Backend& be, In& in, Out& o) { be.layer_norm(in[0], in[1], in[2], o[0], o[1], o[2], eps); });
}

void add_rms_norm(Table& t) {
  struct R {
    Shape shape;
    bool w;
    float offset;
  };
  // No one-wide rows here: there dx = dy * w * eps / (x^2 + eps)^1.5 comes from 1 - xhat^2, a cancellation
  // that f32 cannot resolve (ill-conditioned, not a backend bug); layer_norm covers D == 1.
  const R rs[] = {{{4, 7, 96}, true, 0}, {{6, 33}, false, 0}, {{4, 384}, true, 1}, {{3, 1024}, true, 0}};
  const float eps = 1e-6f;
  for (const R& r : rs) {
    const int64_t D = r.shape.back(), rows = numel_of(r.shape) / D;
    const std::string sh = dims(r.shape) + (r.w ? "_w" : "") + (r.offset != 0 ? "_offset" + fmt(r.offset) : "");
    const float off = r.offset;
    t.add(
        "rms_norm/" + sh + "/f32", Kernel::rms_norm, {DT::f32},
        [r, D](Gen& g) {
          // With weight_offset 1 the stored weight is a small delta around 0 (Gemma's convention).
          return In{g.uniform(r.shape, -1, 1),
                    r.w ? (r.offset != 0 ? g.uniform({D}, -0.5f, 0.5f) : g.uniform({D}, 0.5f, 1.5f)) : undef()};
        },
        {out("y", r.shape, DT::f32, tol(16, double(D))), out("rstd", {rows}, DT::f32, tol(16, double(D)))},
        [eps, off](Backend& be, In& in, Out& o) { be.rms_norm(in[0], in[1], o[0], o[1], eps, off); });
    // acc: dx starts as a gradient already gathered (in[4], copied in) and gets the call's added
    for (const bool acc : {false, true})
      t.add(
          "rms_norm_backward/" + sh + (acc ? "_accumulate" : "") + "/f32", Kernel::rms_norm_backward, {DT::f32},
          [r, D, rows, eps](Gen& g) {
            Tensor x = g.uniform(r.shape, -1, 1);
            Tensor w = r.w ? (r.offset != 0 ? g.uniform({D}, -0.5f, 0.5f) : g.uniform({D}, 0.5f, 1.5f)) : undef();
            Tensor y = Tensor::empty(r.shape, DT::f32, g.backend()), rstd = Tensor::empty({rows}, DT::f32, g.backend());
            g.backend()->rms_norm(x, w, y, rstd, eps, r.offset);
            return In{x, w, rstd, g.uniform(r.shape, -1, 1), g.uniform(r.shape, -2, 2)};
          },
          {out("dx", r.shape, DT::f32, tol(16, double(D))),
           r.w ? out("dweight", {D}, DT::f32, tol(16, double(rows))) : undefined_out("dweight")},
          [off, acc](Backend& be, In& in, Out& o) {
            if (acc) be.copy_device(o[0].data(), in[4].data(), in[4].nbytes());
            be.rms_norm_backward(in[0], in[1], in[2], in[3], o[0], o[1], off, acc);
          });
  }
  // bf16 rows whose width is a multiple of 8 (cuda reads them 16 bytes at a time) and rows that are not (element by
  // element, the tail of each lane's last chunk empty).
  for (const Shape& sh : {Shape{4, 7, 96}, Shape{5, 33}}) {
    const int64_t D = sh.back(), rows = numel_of(sh) / D;
    t.add(
        "rms_norm/" + dims(sh) + "_w/bf16", Kernel::rms_norm, {DT::bf16},
        [sh, D](Gen& g) {
          return In{g.uniform(sh, -1, 1, DT::bf16), g.uniform({D}, 0.5f, 1.5f, DT::bf16)};
        },
        {out("y", sh, DT::bf16, tol(16, double(D))), out("rstd", {rows}, DT::f32, tol(16, double(D)))},
        [eps](Backend& be, In& in, Out& o) { be.rms_norm(in[0], in[1], o[0], o[1], eps, 0.0f); });
  }
}

void add_group_norm(Table& t) {
  struct G {
    Shape shape;
    int64_t groups;
  };
  const G gs[] = {{{2, 8, 5, 5}, 4}, {{2, 6, 7}, 3}, {{3, 32, 8, 8}, 8}, {{2, 4, 3, 3}, 4}, {{2, 6, 4, 4}, 1}};
  const float eps = 1e-5f;
  for (const G& gg : gs) {
    const int64_t N = gg.shape[0], C = gg.shape[1], G = gg.groups;
    const int64_t HW = numel_of(gg.shape) / (N * C), per = C / G * HW;
    const std::string sh = dims(gg.shape) + "_g" + std::to_string(G);
    t.add(
        "group_norm/" + sh + "/f32", Kernel::group_norm, {DT::f32},
        [gg, C](Gen& g) {
          return In{g.uniform(gg.shape, -1, 1), g.uniform({C}, 0.5f, 1.5f), g.uniform({C}, -0.5f, 0.5f)};
        },
        {out("y", gg.shape, DT::f32, tol(16, double(per))), out("mean", {N, G}, DT::f32, tol(16, double(per))),
         out("rstd", {N, G}, DT::f32, tol(16, double(per)))},
        [G, eps](Backend& be, In& in, Out& o) { be.group_norm(in[0], in[1], in[2], o[0], o[1], o[2], G, eps); });
    t.add(
        "group_norm_backward/" + sh + "/f32", Kernel::group_norm_backward, {DT::f32},
        [gg, C, N, G, eps](Gen& g) {
          Tensor x = g.uniform(gg.shape, -1, 1), w = g.uniform({C}, 0.5f, 1.5f), b = g.uniform({C}, -0.5f, 0.5f);
          Tensor y = Tensor::empty(gg.shape, DT::f32, g.backend());
          Tensor mean = Tensor::empty({N, G}, DT::f32, g.backend()), rstd = Tensor::empty({N, G}, DT::f32, g.backend());
          g.backend()->group_norm(x, w, b, y, mean, rstd, G, eps);
          return In{x, w, mean, rstd, g.uniform(gg.shape, -1, 1)};
        },
        {out("dx", gg.shape, DT::f32, tol(16, double(per))), out("dweight", {C}, DT::f32, tol(16, double(N * HW))),
         out("dbias", {C}, DT::f32, tol(16, double(N * HW)))},
        [G](Backend& be, In& in, Out& o) {
          be.group_norm_backward(in[0], in[1], in[2], in[3], in[4], o[0], o[1], o[2], G);
        });
  }
}

// ---------------------------------------------------------------- gather / scatter, rope

void add_gather_scatter(Table& t) {
  struct GS {
    int64_t Bs, R, D, B, K;
    DT dt;
  };
  const GS gs[] = {{1, 50, 24, 2, 9, DT::f32},     {2, 10, 33, 2, 17, DT::f32}, {1, 5, 1, 3, 7, DT::f32},
                   {1, 256, 384, 8, 256, DT::f32}, {1, 50, 24, 2, 9, DT::bf16}, {2, 10, 33, 2, 17, DT::i32}};
  for (const GS& s : gs) {
    const std::string sh = "src" + dims({s.Bs, s.R, s.D}) + "_idx" + dims({s.B, s.K});
    t.add(
        "gather_rows/" + sh + "/" + dtype_name(s.dt), Kernel::gather_rows, {s.dt},
        [s](Gen& g) {
          Tensor src =
              s.dt == DT::i32 ? g.ints({s.Bs, s.R, s.D}, -1000, 1000) : g.uniform({s.Bs, s.R, s.D}, -1, 1, s.dt);
          return In{src, g.ints({s.B, s.K}, 0, int32_t(s.R))};
        },
        {out("out", {s.B, s.K, s.D}, s.dt, exact())},
        [](Backend& be, In& in, Out& o) { be.gather_rows(in[0], in[1], o[0]); });
    if (s.dt != DT::f32) continue;
    // Every destination row receives about B*K/R rows (duplicate indices are the point).
    const double per_row = std::max(1.0, double(s.B * s.K) / double(s.R) * 3.0);
    t.add(
        "scatter_add_rows/" + sh + "/f32", Kernel::scatter_add_rows, {DT::f32},
        [s](Gen& g) {
          return In{g.uniform({s.B, s.K, s.D}, -1, 1), g.ints({s.B, s.K}, 0, int32_t(s.R)),
                    g.uniform({s.Bs, s.R, s.D}, -1, 1)};
        },
        {out("dsrc", {s.Bs, s.R, s.D}, DT::f32, tol(4, per_row), 2)},
        [](Backend& be, In& in, Out& o) { be.scatter_add_rows(in[0], in[1], o[0]); });
  }
}

void add_rope(Table& t) {
  struct R {
    std::string what;
    Shape x;
    bool batch_pos;
    int32_t pos_lo, pos_hi;
    int64_t rotary;
    bool inverse;
    float theta;
    RopeScaling scaling = {};
  };
  RopeScaling llama3, yarn, linear;  // Llama 3.1's and a YaRN over a 256-position original, every band
  llama3.kind = RopeScalingKind::llama3, llama3.factor = 8, llama3.original_max_position = 64;
  yarn.kind = RopeScalingKind::yarn, yarn.factor = 4, yarn.original_max_position = 256;
  linear.kind = RopeScalingKind::linear, linear.factor = 2;
  const R rs[] = {{"llama3", {2, 9, 3, 16}, true, 0, 512, 0, false, 10000, llama3},
                  {"yarn_inverse", {2, 9, 2, 16}, true, 0, 512, 0, true, 10000, yarn},
                  {"linear_partial", {2, 7, 3, 16}, false, 0, 7, 8, false, 10000, linear},
                  {"full", {2, 7, 3, 16}, false, 0, 7, 0, false, 10000},
                  {"full_inverse", {2, 7, 3, 16}, false, 0, 7, 0, true, 10000},
                  {"batchpos", {2, 7, 3, 16}, true, 0, 64, 0, false, 10000},
                  {"partial", {2, 7, 3, 16}, false, 0, 7, 8, false, 10000},
                  {"partial_inverse", {2, 9, 2, 24}, true, 0, 64, 16, true, 10000},
                  {"theta5e5", {1, 64, 6, 64}, false, 0, 64, 0, false, 500000},
                  {"decode", {2, 7, 4, 32}, false, 1000, 1007, 0, false, 10000},
                  {"transformer", {2, 256, 6, 64}, false, 0, 256, 0, false, 10000},
                  {"heads12", {2, 9, 12, 16}, false, 0, 9, 12, false, 10000}};  // heads in groups (cuda)
  for (const R& r : rs) {
    const int64_t B = r.x[0], T = r.x[1];
    RopeParams p{r.theta, r.rotary, r.inverse, r.scaling};
    Check c;
    c.rtol_override = dtype_epsilon(DT::f32) * (2.0 + 4.0 * double(std::max(1, r.pos_hi - 1)));
    t.add(
        "rope/" + r.what + "_" + dims(r.x) + "/f32", Kernel::rope, {DT::f32},
        [r, B, T](Gen& g) {
          Tensor pos = r.batch_pos                         ? g.ints({B, T}, r.pos_lo, r.pos_hi)
                       : r.pos_hi - r.pos_lo == int32_t(T) ? g.from_ints(arange(T, r.pos_lo), {T})
                                                           : g.ints({T}, r.pos_lo, r.pos_hi);
          return In{g.uniform(r.x, -1, 1), pos};
        },
        {out("out", r.x, DT::f32, c)}, [p](Backend& be, In& in, Out& o) { be.rope(in[0], in[1], o[0], p); });
  }
}

// ---------------------------------------------------------------- attention

struct Att {
  std::string what;
  int64_t B, T, S, Hq, Hkv, D;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  int64_t q_offset = 0;
  float scale = 0.0f;  // 0: 1/sqrt(D)
  float range = 1.0f;  // q, k uniform in [-range, range]
  bool empty_rows = false;
  int64_t doc_len = 0;  // > 0: segment ids [B, S] of packed documents of about this many tokens (1 to 2 doc_len - 1)
  bool pad = false;     // with doc_len: the last S / 8 keys are padding (segment 0)
};

// Segment ids of packed rows: runs of lengths drawn in [1, 2 doc_len), numbered from 1 per row; with pad the
// tail is segment 0. Deterministic in the generator's seed.
Tensor packed_segments(Gen& g, const Att& a) {
  std::vector<int32_t> seg(size_t(a.B * a.S));
  const std::vector<float> u = g.uniform_host(a.B * a.S, 0.0f, 1.0f);
  for (int64_t b = 0; b < a.B; ++b) {
    int32_t id = 1;
    int64_t left = 0;
    const int64_t real = a.pad ? a.S - a.S / 8 : a.S;
    for (int64_t s = 0; s < a.S; ++s) {
      if (left == 0) {
        left = 1 + int64_t(u[size_t(b * a.S + s)] * float(2 * a.doc_len - 1));
        if (s > 0) ++id;
      }
      seg[size_t(b * a.S + s)] = s < real ? id : 0;
      --left;
    }
  }
  return g.from_ints(seg, {a.B, a.S});
}

void add_attention(Table& t) {
  const std::vector<Att> as = {
      {"causal", 2, 16, 16, 4, 4, 16},
      {"noncausal", 2, 16, 16, 4, 4, 16, false},
      {"cross", 2, 12, 20, 2, 2, 16, false},
      {"gqa", 2, 24, 24, 8, 2, 32},
      {"mqa", 1, 17, 17, 4, 1, 16},
      {"window", 2, 32, 32, 2, 2, 16, true, 5},
      {"window_noncausal", 1, 20, 20, 2, 2, 8, false, 6},
      {"softcap", 2, 16, 16, 2, 2, 16, true, 0, 3.0f, 0, 1.0f, 1.5f},
      {"qoffset", 2, 5, 37, 4, 2, 16, true, 0, 0.0f, 32},
      {"qoffset_window", 1, 4, 40, 2, 2, 16, true, 16, 0.0f, 36},
      {"odd", 2, 37, 37, 3, 3, 24},
      {"odd_headdim", 1, 19, 19, 2, 1, 13, false},
      {"empty_rows", 1, 8, 8, 2, 2, 16, true, 4, 0.0f, 5, 0.0f, 1.0f, true},
      {"gpt_mini", 2, 128, 128, 4, 4, 32},
      {"char_small", 1, 256, 256, 6, 6, 64},
      // the DiT's rows (64 tokens, heads of 64, bidirectional); long bidirectional rows with a short last block (cpu:
      // several rescaled key blocks into query-row O, dq / dk / dv set by their first product); a causal query
      // block at an offset that is no multiple of 64 (cpu: its backward query blocks straddle the dq blocks); odd
      // head widths over several blocks (cpu: padded V and K copies)
      {"dit", 2, 64, 64, 4, 4, 64, false},
      {"noncausal_long", 1, 200, 200, 2, 2, 64, false},
      {"qoffset_long", 1, 150, 230, 4, 2, 32, true, 0, 0.0f, 80},
      {"odd_headdim_long", 1, 100, 100, 2, 2, 24, false},
      // document masking (segment ids): short and long documents, padding, grouped heads, decoding rows,
      // a window, and rows long enough that most 64 x 64 tiles are skipped
      {"segments", 2, 40, 40, 4, 4, 16, true, 0, 0.0f, 0, 0.0f, 1.0f, false, 6},
      {"segments_noncausal_pad", 2, 33, 33, 2, 2, 16, false, 0, 0.0f, 0, 0.0f, 1.0f, false, 5, true},
      {"segments_gqa_pad", 2, 150, 150, 4, 2, 32, true, 0, 0.0f, 0, 0.0f, 1.0f, false, 20, true},
      {"segments_window_softcap", 1, 70, 70, 2, 2, 16, true, 12, 3.0f, 0, 0.0f, 1.5f, false, 15},
      {"segments_decode", 2, 3, 40, 4, 2, 16, true, 0, 0.0f, 37, 0.0f, 1.0f, false, 8},
      {"segments_long", 1, 320, 320, 2, 2, 64, true, 0, 0.0f, 0, 0.0f, 1.0f, false, 40},
      {"segments_one_doc", 1, 130, 130, 2, 2, 16, true, 0, 0.0f, 0, 0.0f, 1.0f, false, 1000},
  };
  for (const Att& a : as) {
    AttentionParams p;
    p.scale = a.scale > 0 ? a.scale : float(1.0 / std::sqrt(double(a.D)));
    p.causal = a.causal;
    p.window = a.window;
    p.softcap = a.softcap;
    p.q_offset = a.q_offset;
    const Shape qs{a.B, a.T, a.Hq, a.D}, ks{a.B, a.S, a.Hkv, a.D}, ls{a.B, a.Hq, a.T};
    const std::string sh = a.what + "_B" + std::to_string(a.B) + "T" + std::to_string(a.T) + "S" + std::to_string(a.S) +
                           "H" + std::to_string(a.Hq) + "kv" + std::to_string(a.Hkv) + "D" + std::to_string(a.D);
    Check co = tol(16, double(a.S + a.D)), cl = tol(16, double(a.S + a.D));
    const double group = double(a.Hq / a.Hkv);
    Check ckv = tol(16, double(a.T) * group + double(a.D));
    // With a window or a query block at the end of a longer key range, most keys are seen by no query.
    ckv.zeros_ok = a.window > 0 || a.T < a.S || a.empty_rows || a.pad;
    Check co_seg = co;
    co_seg.zeros_ok = co.zeros_ok || a.pad;
    // q, k, v and the segment ids (undefined without documents)
    auto make_qkv = [a, qs, ks](Gen& g) {
      In in{g.uniform(qs, -a.range, a.range), g.uniform(ks, -a.range, a.range), g.uniform(ks, -1, 1)};
      in.push_back(a.doc_len > 0 ? packed_segments(g, a) : Tensor());
      return in;
    };
    t.add("attention/" + sh + "/f32", Kernel::attention, {DT::f32}, make_qkv,
          {out("out", qs, DT::f32, co_seg), out("lse", ls, DT::f32, cl)},
          [p](Backend& be, In& in, Out& o) { be.attention(in[0], in[1], in[2], in[3], o[0], o[1], p); });
    t.add(
        "attention_backward/" + sh + "/f32", Kernel::attention_backward, {DT::f32},
        [make_qkv, qs, ls, p](Gen& g) {
          In in = make_qkv(g);
          Tensor o = Tensor::empty(qs, DT::f32, g.backend()), lse = Tensor::empty(ls, DT::f32, g.backend());
          g.backend()->attention(in[0], in[1], in[2], in[3], o, lse, p);
          in.push_back(o);
          in.push_back(lse);
          in.push_back(g.uniform(qs, -1, 1));
          return in;
        },
        {out("dq", qs, DT::f32, tol(16, double(a.S + a.D))), out("dk", ks, DT::f32, ckv), out("dv", ks, DT::f32, ckv)},
        [p](Backend& be, In& in, Out& o) {
          be.attention_backward(in[0], in[1], in[2], in[3], in[4], in[5], in[6], o[0], o[1], o[2], p);
        });
  }
  {
    AttentionParams p;
    p.scale = 0.25f;
    const Shape qs{2, 16, 4, 16}, ls{2, 4, 16};
    t.add(
        "attention/causal_B2T16S16H4kv4D16/bf16", Kernel::attention, {DT::bf16},
        [qs](Gen& g) {
          return In{g.uniform(qs, -1, 1, DT::bf16), g.uniform(qs, -1, 1, DT::bf16), g.uniform(qs, -1, 1, DT::bf16)};
        },
        {out("out", qs, DT::bf16, tol(16, 32)), out("lse", ls, DT::f32, tol(16, 32))},
        [p](Backend& be, In& in, Out& o) { be.attention(in[0], in[1], in[2], Tensor(), o[0], o[1], p); });
  }
  // f32 q over bf16 k and v (a bf16 decode cache, CausalDecoder::set_cache_dtype): decode rows (cpu's row
  // path: one row, a few with a window and softcap) and a prefill on the cache (T > 4: cpu widens K/V and
  // takes its lane path). Asked as supports(attention, bf16); an oracle without bf16 (ref) runs f32 on the
  // exactly widened K/V, so out and lse, both f32, keep the f32 cases' tolerance (K = S + D).
  const std::vector<Att> cached = {
      {"bf16kv_decode", 2, 1, 77, 4, 2, 64, true, 0, 0.0f, 76},
      {"bf16kv_rows_window_softcap", 1, 3, 40, 4, 2, 16, true, 20, 5.0f, 37, 0.0f, 1.5f},
      {"bf16kv_prefill", 1, 20, 90, 4, 2, 64, true, 0, 0.0f, 70},
      {"bf16kv_odd_headdim", 2, 2, 33, 3, 1, 24, true, 0, 0.0f, 31},
  };
  for (const Att& a : cached) {
    AttentionParams p;
    p.scale = float(1.0 / std::sqrt(double(a.D)));
    p.causal = a.causal;
    p.window = a.window;
    p.softcap = a.softcap;
    p.q_offset = a.q_offset;
    const Shape qs{a.B, a.T, a.Hq, a.D}, ks{a.B, a.S, a.Hkv, a.D}, ls{a.B, a.Hq, a.T};
    const std::string sh = a.what + "_B" + std::to_string(a.B) + "T" + std::to_string(a.T) + "S" + std::to_string(a.S) +
                           "H" + std::to_string(a.Hq) + "kv" + std::to_string(a.Hkv) + "D" + std::to_string(a.D);
    t.add(
        "attention/" + sh + "/f32_bf16kv", Kernel::attention, {DT::bf16},
        [a, qs, ks](Gen& g) {
          return In{g.uniform(qs, -a.range, a.range), g.uniform(ks, -a.range, a.range, DT::bf16),
                    g.uniform(ks, -1, 1, DT::bf16), Tensor()};
        },
        {out("out", qs, DT::f32, tol(16, double(a.S + a.D))), out("lse", ls, DT::f32, tol(16, double(a.S + a.D)))},
        [p](Backend& be, In& in, Out& o) { be.attention(in[0], in[1], in[2], in[3], o[0], o[1], p); });
  }
}

// ---------------------------------------------------------------- attention_slots
// Decoding rows over a slot cache: each row writes its new K/V row into its slot, then attends over that slot up to
// its position (K = position + D, attention's tolerance). The caches start as drawn inputs (init_from) and are
// checked whole: the written rows are copies and every other byte must be left as it was (exact). Rows out of slot
// order, a row at position 0, one near the capacity, grouped heads; the cpu row tasks' avx512 blocks (D = 64) and
// their scalar path (D = 24, a window and softcap); f32 q over a bf16 cache (asked as supports(attention_slots, bf16)).
void add_attention_slots(Table& t) {
  struct Slots {
    std::string what;
    int64_t n_slots, C, Hq, Hkv, D;
    std::vector<int64_t> slots, positions;
    int64_t window = 0;
    float softcap = 0.0f;
    bool bf16_cache = false;
  };
  const std::vector<Slots> ss = {
      {"rows", 5, 80, 4, 2, 64, {3, 0, 4}, {77, 0, 40}},
      {"one_row", 2, 48, 6, 6, 64, {1}, {33}},
      {"window_softcap", 4, 40, 4, 1, 24, {2, 1, 0, 3}, {39, 5, 20, 31}, 8, 4.0f},
      {"bf16_cache", 4, 70, 4, 2, 64, {1, 3, 2}, {69, 17, 2}, 0, 0.0f, true},
  };
  for (const Slots& c : ss) {
    AttentionParams p;
    p.scale = float(1.0 / std::sqrt(double(c.D)));
    p.window = c.window;
    p.softcap = c.softcap;
    const int64_t n = int64_t(c.slots.size());
    const Shape qs{n, 1, c.Hq, c.D}, news{n, 1, c.Hkv, c.D}, caches{c.n_slots, c.C, c.Hkv, c.D};
    const DT kv = c.bf16_cache ? DT::bf16 : DT::f32;
    const std::string sh = c.what + "_N" + std::to_string(n) + "C" + std::to_string(c.C) + "H" + std::to_string(c.Hq) +
                           "kv" + std::to_string(c.Hkv) + "D" + std::to_string(c.D);
    const Check co = tol(16, double(c.C + c.D));
    t.add(
        "attention_slots/" + sh + (c.bf16_cache ? "/f32_bf16kv" : "/f32"), Kernel::attention_slots, {kv},
        [qs, news, caches, kv](Gen& g) {
          return In{g.uniform(qs, -2, 2), g.uniform(news, -2, 2, kv), g.uniform(news, -1, 1, kv),
                    g.uniform(caches, -2, 2, kv), g.uniform(caches, -1, 1, kv)};
        },
        {out("k_cache", caches, kv, exact(), 3), out("v_cache", caches, kv, exact(), 4), out("out", qs, DT::f32, co)},
        [c, p](Backend& be, In& in, Out& o) {
          be.attention_slots(in[0], in[1], in[2], c.slots, c.positions, o[0], o[1], o[2], p);
        });
  }
}

// ---------------------------------------------------------------- attention_max_logit
// QK-Clip's statistic: per query head the largest visible raw score (a dot product of D terms: k = 8, K = D).
// q and k span [-range, range] so that the maxima differ clearly between heads; the shapes cross the cpu
// kernel's 64-query blocks and 16-key sub-tiles (causal diagonal, windows, q_offset, grouped heads, a head
// width that is not a multiple of 16), documents of packed rows (segment ids, padding), and "hidden" has no
// visible key at all (-inf everywhere).
void add_attention_max_logit(Table& t) {
  const std::vector<Att> ms = {
      {"causal", 2, 16, 16, 4, 4, 16},
      {"noncausal", 2, 12, 20, 2, 2, 16, false},
      {"gqa", 2, 80, 80, 8, 2, 32},
      {"window", 2, 100, 100, 2, 2, 16, true, 7},
      {"softcap_ignored", 1, 33, 33, 2, 1, 16, true, 0, 2.0f},
      {"qoffset", 2, 5, 37, 4, 2, 16, true, 0, 0.0f, 32},
      {"odd_headdim", 1, 70, 70, 3, 1, 13},
      {"hidden", 1, 4, 8, 2, 2, 16, true, 0, 0.0f, -10},
      {"gpt_mini", 2, 128, 128, 4, 4, 32},
      {"segments", 2, 40, 40, 4, 4, 16, true, 0, 0.0f, 0, 0.0f, 2.0f, false, 6},
      {"segments_gqa_pad", 2, 150, 150, 4, 2, 32, true, 0, 0.0f, 0, 0.0f, 2.0f, false, 20, true},
      {"segments_noncausal_pad", 2, 33, 33, 2, 2, 16, false, 0, 0.0f, 0, 0.0f, 2.0f, false, 5, true},
      {"segments_window", 1, 70, 70, 2, 2, 16, true, 12, 0.0f, 0, 0.0f, 2.0f, false, 15},
  };
  for (const Att& m : ms) {
    AttentionParams p;
    p.scale = float(1.0 / std::sqrt(double(m.D)));
    p.causal = m.causal;
    p.window = m.window;
    p.softcap = m.softcap;
    p.q_offset = m.q_offset;
    const Shape qs{m.B, m.T, m.Hq, m.D}, ks{m.B, m.S, m.Hkv, m.D};
    const std::string sh = m.what + "_B" + std::to_string(m.B) + "T" + std::to_string(m.T) + "S" + std::to_string(m.S) +
                           "H" + std::to_string(m.Hq) + "kv" + std::to_string(m.Hkv) + "D" + std::to_string(m.D);
    const float r = m.doc_len > 0 ? m.range : 2.0f;
    t.add("attention_max_logit/" + sh + "/f32", Kernel::attention_max_logit, {DT::f32},
          [m, qs, ks, r](Gen& g) {
            In in{g.uniform(qs, -r, r), g.uniform(ks, -r, r)};
            in.push_back(m.doc_len > 0 ? packed_segments(g, m) : Tensor());
            return in;
          },
          {out("out", {m.Hq}, DT::f32, tol(8, double(m.D)))},
          [p](Backend& be, In& in, Out& o) { be.attention_max_logit(in[0], in[1], in[2], o[0], p); });
  }
}

// ---------------------------------------------------------------- conv2d

struct Conv {
  std::string what;
  int64_t N, C, H, W, O, KH, KW;
  Conv2dParams p;
  bool bias;
};

void add_conv(Table& t) {
  auto P = [](int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t g) {
    return Conv2dParams{sh, sw, ph, pw, dh, dw, g};
  };
  const std::vector<Conv> cs = {
      {"3x3_pad1", 2, 3, 9, 9, 4, 3, 3, P(1, 1, 1, 1, 1, 1, 1), true},
      {"3x3_stride2_pad1", 2, 4, 10, 10, 6, 3, 3, P(2, 2, 1, 1, 1, 1, 1), false},
      {"3x3_stride2_odd", 2, 3, 9, 11, 5, 3, 3, P(2, 2, 0, 0, 1, 1, 1), true},
      {"3x3_dilation2_pad2", 2, 3, 12, 12, 5, 3, 3, P(1, 1, 2, 2, 2, 2, 1), true},
      {"3x3_groups2", 2, 4, 8, 8, 6, 3, 3, P(1, 1, 1, 1, 1, 1, 2), true},
      {"3x3_depthwise", 2, 6, 8, 8, 12, 3, 3, P(1, 1, 1, 1, 1, 1, 6), false},
      {"1x1", 2, 16, 7, 7, 8, 1, 1, P(1, 1, 0, 0, 1, 1, 1), true},
      {"1x1_stride2", 2, 8, 8, 8, 16, 1, 1, P(2, 2, 0, 0, 1, 1, 1), false},
      {"3x2_asym", 2, 3, 9, 8, 4, 3, 2, P(2, 1, 0, 1, 1, 2, 1), true},
      {"patchify4", 2, 3, 32, 32, 64, 4, 4, P(4, 4, 0, 0, 1, 1, 1), true},
      {"unet", 2, 32, 16, 16, 64, 3, 3, P(1, 1, 1, 1, 1, 1, 1), true},
  };
  for (const Conv& c : cs) {
    const int64_t OH = (c.H + 2 * c.p.pad_h - c.p.dilation_h * (c.KH - 1) - 1) / c.p.stride_h + 1;
    const int64_t OW = (c.W + 2 * c.p.pad_w - c.p.dilation_w * (c.KW - 1) - 1) / c.p.stride_w + 1;
    const int64_t g = c.p.groups;
    const Shape xs{c.N, c.C, c.H, c.W}, ws{c.O, c.C / g, c.KH, c.KW}, ys{c.N, c.O, OH, OW};
    const std::string sh = c.what + "_x" + dims(xs) + "_w" + dims(ws) + (c.bias ? "_bias" : "");
    const Conv2dParams p = c.p;
    t.add(
        "conv2d/" + sh + "/f32", Kernel::conv2d, {DT::f32},
        [c, xs, ws](Gen& gen) {
          return In{gen.uniform(xs, -1, 1), gen.uniform(ws, -1, 1), c.bias ? gen.uniform({c.O}, -1, 1) : undef()};
        },
        {out("y", ys, DT::f32, tol(8, double(c.C / g * c.KH * c.KW)))},
        [p](Backend& be, In& in, Out& o) { be.conv2d(in[0], in[1], in[2], o[0], p); });
    // Strides larger than the kernel leave input pixels no output reads: their gradient is 0.
    Check cdx = tol(8, double(c.O / g * c.KH * c.KW));
    cdx.zeros_ok = c.p.stride_h > c.KH || c.p.stride_w > c.KW;
    t.add(
        "conv2d_backward_data/" + sh + "/f32", Kernel::conv2d_backward_data, {DT::f32},
        [ys, ws](Gen& gen) {
          return In{gen.uniform(ys, -1, 1), gen.uniform(ws, -1, 1)};
        },
        {out("dx", xs, DT::f32, cdx)},
        [p](Backend& be, In& in, Out& o) { be.conv2d_backward_data(in[0], in[1], o[0], p); });
    t.add(
        "conv2d_backward_weight/" + sh + "/f32", Kernel::conv2d_backward_weight, {DT::f32},
        [xs, ys](Gen& gen) {
          return In{gen.uniform(xs, -1, 1), gen.uniform(ys, -1, 1)};
        },
        {out("dw", ws, DT::f32, tol(8, double(c.N * OH * OW))),
         c.bias ? out("dbias", {c.O}, DT::f32, tol(8, double(c.N * OH * OW))) : undefined_out("dbias")},
        [p](Backend& be, In& in, Out& o) { be.conv2d_backward_weight(in[0], in[1], o[0], o[1], p); });
  }
}

// ---------------------------------------------------------------- cross entropy, optimizers

void add_cross_entropy(Table& t) {
  struct CE {
    int64_t N, V;
    float range;
    int64_t ignore_index;
    int n_ignored;
  };
  const CE cs[] = {{8, 50, 5, -100, 2},   {16, 1000, 5, -100, 0}, {64, 256, 5, -100, 5},
                   {12, 40, 50, -100, 1}, {10, 30, 5, 3, 3},      {4, 7, 5, -100, 4}};
  for (const CE& c : cs) {
    const std::string sh = dims({c.N, c.V}) + "_ignore" + fmt(double(c.ignore_index)) + "x" +
                           std::to_string(c.n_ignored) + (c.range > 10 ? "_wide" : "");
    const CrossEntropyParams p{c.ignore_index};
    auto make = [c](Gen& g) {
      Tensor logits = g.uniform({c.N, c.V}, -c.range, c.range);
      std::vector<int32_t> tg = g.ints({c.N}, 0, int32_t(c.V)).to_ints();
      // Spread the ignored rows; a custom ignore_index that is a real class also appears as a target.
      for (int i = 0; i < c.n_ignored; ++i) tg[size_t((i * 7 + 1) % c.N)] = int32_t(c.ignore_index);
      return In{logits, g.from_ints(tg, {c.N})};
    };
    Check cl = tol(8, double(c.V));
    cl.zeros_ok = 2 * c.n_ignored > c.N;
    Check cd = tol(8, double(c.V));
    cd.zeros_ok = 2 * c.n_ignored > c.N;
    t.add("cross_entropy/" + sh + "/f32", Kernel::cross_entropy, {DT::f32}, make,
          {out("loss", {c.N}, DT::f32, cl), out("lse", {c.N}, DT::f32, tol(8, double(c.V)))},
          [p](Backend& be, In& in, Out& o) { be.cross_entropy(in[0], in[1], o[0], o[1], p); });
    // logits, targets, the forward's lse and per-row incoming gradients
    auto make_backward = [make, c, p](Gen& g) {
      In in = make(g);
      Tensor loss = Tensor::empty({c.N}, DT::f32, g.backend()), lse = Tensor::empty({c.N}, DT::f32, g.backend());
      g.backend()->cross_entropy(in[0], in[1], loss, lse, p);
      in.push_back(lse);
      in.push_back(g.uniform({c.N}, 0.1f, 1));
      return in;
    };
    t.add("cross_entropy_backward/" + sh + "/f32", Kernel::cross_entropy_backward, {DT::f32}, make_backward,
          {out("dlogits", {c.N, c.V}, DT::f32, cd)},
          [p](Backend& be, In& in, Out& o) { be.cross_entropy_backward(in[0], in[1], in[2], in[3], o[0], p); });
    if (c.N != 64) continue;
    // In place (dlogits over logits, as linear_cross_entropy's chunks call it): each element read before written.
    t.add("cross_entropy_backward/" + sh + "_inplace/f32", Kernel::cross_entropy_backward, {DT::f32}, make_backward,
          {out("dlogits", {c.N, c.V}, DT::f32, cd, 0)},
          [p](Backend& be, In& in, Out& o) { be.cross_entropy_backward(o[0], in[1], in[2], in[3], o[0], p); });
  }
}

void add_optimizers(Table& t) {
  // Inputs: param, grad, m, v (m, v >= 0 where needed); the outputs are the in-place param and states.
  auto state = [](const Shape& s) {
    return [s](Gen& g) {
      return In{g.uniform(s, -1, 1), g.uniform(s, -1, 1), g.uniform(s, -0.1f, 0.1f), g.uniform(s, 0, 0.01f)};
    };
  };
  struct A {
    Shape s;
    AdamWParams p;
    std::string what;
  };
  const A as[] = {{{1031}, AdamWParams{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1}, "step1"},
                  {{64, 96}, AdamWParams{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 10}, "step10_wd_scale"},
                  {{257}, AdamWParams{3e-4f, 0.8f, 0.99f, 1e-6f, 0.01f, 1.0f, 1000}, "step1000"}};
  for (const A& a : as) {
    const AdamWParams p = a.p;
    t.add("adamw_update/" + a.what + "_" + dims(a.s) + "/f32", Kernel::adamw_update, {DT::f32}, state(a.s),
          {out("param", a.s, DT::f32, tol(8), 0), out("m", a.s, DT::f32, tol(8), 2), out("v", a.s, DT::f32, tol(8), 3)},
          [p](Backend& be, In& in, Out& o) { be.adamw_update(o[0], in[1], o[1], o[2], p); });
  }
  // The group: slots of the vector path's sizes and others (odd, tiny, several device blocks), each with its own lr
  // and weight decay; 50 slots take more than one launch on cuda (48 a launch). Inputs per slot: param, grad, m, v.
  struct G {
    std::vector<Shape> shapes;
    std::string what;
  };
  std::vector<Shape> many;
  for (int i = 0; i < 50; ++i) many.push_back({int64_t(1 + (i * 37) % 300)});
  const G gs[] = {{{{1031}, {64, 96}, {8}, {20000}}, "4_slots"}, {many, "50_slots"}};
  for (const G& gr : gs) {
    const std::vector<Shape> shapes = gr.shapes;
    std::vector<OutSpec> outs;
    for (size_t j = 0; j < shapes.size(); ++j) {
      const int base = int(4 * j);
      outs.push_back(out("param" + std::to_string(j), shapes[j], DT::f32, tol(8), base));
      outs.push_back(out("m" + std::to_string(j), shapes[j], DT::f32, tol(8), base + 2));
      outs.push_back(out("v" + std::to_string(j), shapes[j], DT::f32, tol(8), base + 3));
    }
    t.add(
        "adamw_update_group/" + gr.what + "/f32", Kernel::adamw_update_group, {DT::f32},
        [shapes](Gen& g) {
          In in;
          for (const Shape& s : shapes)
            for (Tensor x :
                 {g.uniform(s, -1, 1), g.uniform(s, -1, 1), g.uniform(s, -0.1f, 0.1f), g.uniform(s, 0, 0.01f)})
              in.push_back(x);
          return in;
        },
        outs,
        [shapes](Backend& be, In& in, Out& o) {
          std::vector<AdamWSlot> slots;
          for (size_t j = 0; j < shapes.size(); ++j)
            slots.push_back(
                {o[3 * j], in[4 * j + 1], o[3 * j + 1], o[3 * j + 2], 1e-3f * float(1 + j % 3), j % 2 ? 0.1f : 0.0f});
          be.adamw_update_group(slots, AdamWParams{9e-9f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.7f, 17});
        });
  }
  // lerp_group (a model's EMA): averages of odd, tiny and several-block sizes, and 100 slots, more than one cuda
  // launch (96 a launch). Inputs per slot: average, target.
  std::vector<Shape> hundred;
  for (int i = 0; i < 100; ++i) hundred.push_back({int64_t(1 + (i * 41) % 500)});
  const G lerp_groups[] = {{{{1031}, {64, 96}, {8}, {20000}}, "4_slots"}, {hundred, "100_slots"}};
  for (const G& gr : lerp_groups) {
    const std::vector<Shape> shapes = gr.shapes;
    std::vector<OutSpec> outs;
    for (size_t j = 0; j < shapes.size(); ++j)
      outs.push_back(out("average" + std::to_string(j), shapes[j], DT::f32, tol(4), int(2 * j)));
    t.add(
        "lerp_group/" + gr.what + "/f32", Kernel::lerp_group, {DT::f32},
        [shapes](Gen& g) {
          In in;
          for (const Shape& s : shapes)
            for (Tensor x : {g.uniform(s, -1, 1), g.uniform(s, -1, 1)}) in.push_back(x);
          return in;
        },
        outs,
        [shapes](Backend& be, In& in, Out& o) {
          std::vector<LerpSlot> slots;
          for (size_t j = 0; j < shapes.size(); ++j) slots.push_back({o[j], in[2 * j + 1]});
          be.lerp_group(slots, 0.0011f);
        });
  }
  struct S {
    Shape s;
    SgdParams p;
    std::string what;
  };
  const S ss[] = {{{1031}, SgdParams{1e-2f, 0.0f, 0.0f, 0.01f, 1.0f, false, 1}, "plain_wd"},
                  {{1031}, SgdParams{1e-2f, 0.9f, 0.0f, 0.0f, 1.0f, false, 1}, "momentum_step1"},
                  {{64, 96}, SgdParams{1e-2f, 0.9f, 0.1f, 0.0f, 1.0f, false, 5}, "momentum_dampening_step5"},
                  {{257}, SgdParams{1e-2f, 0.9f, 0.0f, 0.01f, 0.5f, true, 3}, "nesterov_wd_scale_step3"},
                  {{257}, SgdParams{1e-2f, 0.9f, 0.0f, 0.0f, 1.0f, true, 1}, "nesterov_step1"}};
  for (const S& s : ss) {
    const SgdParams p = s.p;
    const bool mom = p.momentum != 0.0f;
    t.add("sgd_update/" + s.what + "_" + dims(s.s) + "/f32", Kernel::sgd_update, {DT::f32}, state(s.s),
          {out("param", s.s, DT::f32, tol(8), 0),
           mom ? out("momentum_buf", s.s, DT::f32, tol(8), 2) : undefined_out("momentum_buf")},
          [p](Backend& be, In& in, Out& o) { be.sgd_update(o[0], in[1], o[1], p); });
  }
  struct L {
    Shape s;
    LambParams p;
    std::string what;
  };
  const L ls[] = {{{1031}, LambParams{1e-2f, 0.9f, 0.999f, 1e-6f, 0.0f, 1.0f, 1}, "step1"},
                  {{64, 96}, LambParams{1e-2f, 0.9f, 0.999f, 1e-6f, 0.01f, 0.5f, 7}, "step7_wd_scale"}};
  for (const L& l : ls) {
    const LambParams p = l.p;
    // The trust ratio takes two norms over the whole tensor.
    t.add("lamb_update/" + l.what + "_" + dims(l.s) + "/f32", Kernel::lamb_update, {DT::f32}, state(l.s),
          {out("param", l.s, DT::f32, tol(8, double(numel_of(l.s))), 0), out("m", l.s, DT::f32, tol(8), 2),
           out("v", l.s, DT::f32, tol(8), 3)},
          [p](Backend& be, In& in, Out& o) { be.lamb_update(o[0], in[1], o[1], o[2], p); });
  }
  // LAMB with a zero parameter: ||p|| = 0 makes the trust ratio 1.
  t.add(
      "lamb_update/zero_param_257/f32", Kernel::lamb_update, {DT::f32},
      [](Gen& g) {
        return In{Tensor::zeros({257}, DT::f32, g.backend()), g.uniform({257}, -1, 1), g.uniform({257}, -0.1f, 0.1f),
                  g.uniform({257}, 0, 0.01f)};
      },
      {out("param", {257}, DT::f32, tol(8, 257), 0), out("m", {257}, DT::f32, tol(8), 2),
       out("v", {257}, DT::f32, tol(8), 3)},
      [](Backend& be, In& in, Out& o) { be.lamb_update(o[0], in[1], o[1], o[2], LambParams{}); });
}

// ---------------------------------------------------------------- random, dropout, argmax

void add_random(Table& t) {
  struct R {
    Shape s;
    Distribution d;
    uint64_t seed, stream, offset;
    float a, b;
    DT dt;
  };
  const R rs[] = {{{1031}, Distribution::uniform, 1234, 0, 0, 0, 1, DT::f32},
                  {{7, 129}, Distribution::uniform, (1ull << 40) + 5, 77, 7, -2, 3, DT::f32},
                  {{65536}, Distribution::uniform, 7, (1ull << 35) + 9, (1ull << 34) + 3, 0, 1, DT::f32},
                  {{1031}, Distribution::normal, 42, 3, 0, 0, 1, DT::f32},
                  {{513}, Distribution::normal, 9, 1ull << 33, 3, 1, 2, DT::f32},
                  {{4096}, Distribution::normal, 0xdeadbeefcafeull, 5, 1000001, 0, 0.02f, DT::f32},
                  {{1031}, Distribution::uniform, 1234, 0, 0, -1, 1, DT::bf16},
                  {{1031}, Distribution::normal, 42, 3, 5, 0, 1, DT::bf16}};
  for (const R& r : rs) {
    const RandomParams p{r.d, r.seed, r.stream, r.offset, r.a, r.b};
    const std::string id = std::string("random/") + (r.d == Distribution::uniform ? "uniform" : "normal") + "_" +
                           dims(r.s) + "_seed" + std::to_string(r.seed) + "_stream" + std::to_string(r.stream) +
                           "_offset" + std::to_string(r.offset) + "_a" + fmt(r.a) + "_b" + fmt(r.b) + "/" +
                           dtype_name(r.dt);
    t.add(
        id, Kernel::random, {r.dt}, [](Gen&) { return In{}; }, {out("out", r.s, r.dt, exact())},
        [p](Backend& be, In&, Out& o) { be.random(o[0], p); });
  }
}

void add_dropout(Table& t) {
  struct D {
    Shape s;
    float p;
    uint64_t seed, stream, offset;
  };
  const D ds[] = {{{1031}, 0.1f, 5, 1, 0},
                  {{7, 129}, 0.5f, 11, 2, 13},
                  {{257}, 0.0f, 3, 0, 0},
                  {{4096}, 0.25f, 99, 1ull << 33, (1ull << 32) + 1}};
  for (const D& d : ds) {
    const DropoutParams p{d.p, d.seed, d.stream, d.offset};
    // The mask is the Philox contract: bit-exact. y = x * mask: one rounding.
    Check cy = tol(0);
    cy.zero_pattern = true;
    cy.zeros_ok = d.p >= 0.4f;
    Check cm = exact();
    cm.zeros_ok = d.p >= 0.4f;
    t.add(
        "dropout/" + dims(d.s) + "_p" + fmt(d.p) + "_seed" + std::to_string(d.seed) + "_stream" +
            std::to_string(d.stream) + "_offset" + std::to_string(d.offset) + "/f32",
        Kernel::dropout, {DT::f32}, [d](Gen& g) { return In{g.uniform(d.s, -1, 1)}; },
        {out("y", d.s, DT::f32, cy), out("mask", d.s, DT::f32, cm)},
        [p](Backend& be, In& in, Out& o) { be.dropout(in[0], o[0], o[1], p); });
  }
}

void add_argmax(Table& t) {
  struct A {
    Shape s;
    float step;
  };
  const A as[] = {{{8, 1000}, 0}, {{5, 37}, 0}, {{3, 1}, 0}, {{16, 64}, 0.25f}, {{2, 3, 50}, 0}, {{4, 7}, 2.0f}};
  for (const A& a : as) {
    const int64_t rows = numel_of(a.s) / a.s.back();
    Check c = exact();
    c.zeros_ok = true;  // index 0 is a legitimate answer (one-wide rows, ties at the front)
    t.add(
        "argmax/" + dims(a.s) + (a.step > 0 ? "_ties" : "") + "/f32", Kernel::argmax, {DT::f32},
        [a](Gen& g) { return In{a.step > 0 ? g.quantized(a.s, 0, 1, a.step) : g.uniform(a.s, -1, 1)}; },
        {out("out", {rows}, DT::i32, c)}, [](Backend& be, In& in, Out& o) { be.argmax(in[0], o[0]); });
  }
}

// ---------------------------------------------------------------- large shapes
// Big enough (>= 2^18 elements or many rows) that a threaded backend takes its parallel path, with
// sizes that are not multiples of any vector width.
void add_large(Table& t) {
  const int64_t n = (1 << 18) + 5;
  for (UnaryOp op : {UnaryOp::exp, UnaryOp::gelu, UnaryOp::tanh}) {
    const UnaryParams p{op, 1, 0};
    t.add(
        std::string("unary/") + unary_op_name(op) + "_large_" + std::to_string(n) + "/f32", Kernel::unary, {DT::f32},
        [n](Gen& g) { return In{g.uniform({n}, -4, 4)}; }, {out("out", {n}, DT::f32, tol(8))},
        [p](Backend& be, In& in, Out& o) { be.unary(in[0], o[0], p); });
    t.add(
        std::string("unary_backward/") + unary_op_name(op) + "_large_" + std::to_string(n) + "/f32",
        Kernel::unary_backward, {DT::f32},
        [n](Gen& g) {
          return In{g.uniform({n}, -4, 4), g.uniform({n}, -1, 1)};
        },
        {out("dx", {n}, DT::f32, tol(8))},
        [p](Backend& be, In& in, Out& o) { be.unary_backward(in[0], in[1], o[0], p); });
  }
  for (BinaryOp op : {BinaryOp::add, BinaryOp::mul, BinaryOp::div}) {
    t.add(
        std::string("binary/") + binary_op_name(op) + "_large_row_1031x257_257/f32", Kernel::binary, {DT::f32},
        [](Gen& g) {
          return In{g.uniform({1031, 257}, -2, 2), g.uniform({257}, 0.5f, 2)};
        },
        {out("out", {1031, 257}, DT::f32, tol(0))},
        [op](Backend& be, In& in, Out& o) { be.binary(in[0], in[1], o[0], op); });
    t.add(
        std::string("binary/") + binary_op_name(op) + "_large_b1d_bt1_8x1x1031_8x67x1/f32", Kernel::binary, {DT::f32},
        [](Gen& g) {
          return In{g.uniform({8, 1, 1031}, -2, 2), g.uniform({8, 67, 1}, 0.5f, 2)};
        },
        {out("out", {8, 67, 1031}, DT::f32, tol(0))},
        [op](Backend& be, In& in, Out& o) { be.binary(in[0], in[1], o[0], op); });
  }
  struct L {
    int64_t outer, reduce, inner;
  };
  for (const L& l : {L{1, 1 << 20, 1}, L{512, 1031, 1}, L{1, 2053, 384}, L{7, 4099, 33}}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::sumsq}) {
      const ReduceParams p{op, l.outer, l.reduce, l.inner};
      t.add(
          std::string("reduce/") + reduce_op_name(op) + "_large_o" + std::to_string(l.outer) + "r" +
              std::to_string(l.reduce) + "i" + std::to_string(l.inner) + "/f32",
          Kernel::reduce, {DT::f32},
          [l](Gen& g) {
            return In{g.uniform({l.outer, l.reduce, l.inner}, -1, 1)};
          },
          {out("out", {l.outer, l.inner}, DT::f32, op == ReduceOp::max ? exact() : tol(4, double(l.reduce)))},
          [p](Backend& be, In& in, Out& o) { be.reduce(in[0], o[0], p); });
    }
  }
  t.add(
      "softmax/large_1031x1152/f32", Kernel::softmax, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({1031, 1152}, -6, 6)};
      },
      {out("y", {1031, 1152}, DT::f32, tol(8, 1152))}, [](Backend& be, In& in, Out& o) { be.softmax(in[0], o[0]); });
  t.add(
      "layer_norm/large_2048x384_w_b/f32", Kernel::layer_norm, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({2048, 384}, -1, 1), g.uniform({384}, 0.5f, 1.5f), g.uniform({384}, -0.5f, 0.5f)};
      },
      {out("y", {2048, 384}, DT::f32, tol(16, 384)), out("mean", {2048}, DT::f32, tol(16, 384)),
       out("rstd", {2048}, DT::f32, tol(16, 384))},
      [](Backend& be, In& in, Out& o) { be.layer_norm(in[0], in[1], in[2], o[0], o[1], o[2], 1e-5f); });
  t.add(
      "rms_norm_backward/large_2048x384_w/f32", Kernel::rms_norm_backward, {DT::f32},
      [](Gen& g) {
        Tensor x = g.uniform({2048, 384}, -1, 1), w = g.uniform({384}, 0.5f, 1.5f);
        Tensor y = Tensor::empty({2048, 384}, DT::f32, g.backend()), rstd = Tensor::empty({2048}, DT::f32, g.backend());
        g.backend()->rms_norm(x, w, y, rstd, 1e-6f, 0.0f);
        return In{x, w, rstd, g.uniform({2048, 384}, -1, 1)};
      },
      {out("dx", {2048, 384}, DT::f32, tol(16, 384)), out("dweight", {384}, DT::f32, tol(16, 2048))},
      [](Backend& be, In& in, Out& o) { be.rms_norm_backward(in[0], in[1], in[2], in[3], o[0], o[1], 0.0f, false); });
  t.add(
      "cross_entropy/large_512x1031_ignore-100x9/f32", Kernel::cross_entropy, {DT::f32},
      [](Gen& g) {
        std::vector<int32_t> tg = g.ints({512}, 0, 1031).to_ints();
        for (int i = 0; i < 9; ++i) tg[size_t(i * 53)] = -100;
        return In{g.uniform({512, 1031}, -5, 5), g.from_ints(tg, {512})};
      },
      {out("loss", {512}, DT::f32, tol(8, 1031)), out("lse", {512}, DT::f32, tol(8, 1031))},
      [](Backend& be, In& in, Out& o) { be.cross_entropy(in[0], in[1], o[0], o[1], CrossEntropyParams{}); });
  t.add(
      "adamw_update/large_" + std::to_string(n) + "/f32", Kernel::adamw_update, {DT::f32},
      [n](Gen& g) {
        return In{g.uniform({n}, -1, 1), g.uniform({n}, -1, 1), g.uniform({n}, -0.1f, 0.1f), g.uniform({n}, 0, 0.01f)};
      },
      {out("param", {n}, DT::f32, tol(8), 0), out("m", {n}, DT::f32, tol(8), 2), out("v", {n}, DT::f32, tol(8), 3)},
      [](Backend& be, In& in, Out& o) {
        be.adamw_update(o[0], in[1], o[1], o[2], AdamWParams{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 123});
      });
  t.add(
      "lamb_update/large_" + std::to_string(n) + "/f32", Kernel::lamb_update, {DT::f32},
      [n](Gen& g) {
        return In{g.uniform({n}, -1, 1), g.uniform({n}, -1, 1), g.uniform({n}, -0.1f, 0.1f), g.uniform({n}, 0, 0.01f)};
      },
      {out("param", {n}, DT::f32, tol(8, double(n)), 0), out("m", {n}, DT::f32, tol(8), 2),
       out("v", {n}, DT::f32, tol(8), 3)},
      [](Backend& be, In& in, Out& o) {
        be.lamb_update(o[0], in[1], o[1], o[2], LambParams{1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, 1.0f, 9});
      });
  for (Distribution d : {Distribution::uniform, Distribution::normal}) {
    const RandomParams p{d, 31337, 12, 1000003, -0.5f, 2.0f};
    t.add(
        std::string("random/") + (d == Distribution::uniform ? "uniform" : "normal") + "_large_" + std::to_string(n) +
            "_offset1000003/f32",
        Kernel::random, {DT::f32}, [](Gen&) { return In{}; }, {out("out", {n}, DT::f32, exact())},
        [p](Backend& be, In&, Out& o) { be.random(o[0], p); });
  }
  {
    const DropoutParams p{0.2f, 8, 3, 77};
    Check cy = tol(0);
    cy.zero_pattern = true;
    t.add(
        "dropout/large_" + std::to_string(n) + "_p0.2/f32", Kernel::dropout, {DT::f32},
        [n](Gen& g) { return In{g.uniform({n}, -1, 1)}; },
        {out("y", {n}, DT::f32, cy), out("mask", {n}, DT::f32, exact())},
        [p](Backend& be, In& in, Out& o) { be.dropout(in[0], o[0], o[1], p); });
  }
  t.add(
      "cast/large_" + std::to_string(n) + "_f32_to_bf16/f32", Kernel::cast, {DT::f32, DT::bf16},
      [n](Gen& g) { return In{g.normal({n}, 0, 3)}; }, {out("out", {n}, DT::bf16, exact())},
      [](Backend& be, In& in, Out& o) { be.cast(in[0], o[0]); });
  t.add(
      "argmax/large_512x1031/f32", Kernel::argmax, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({512, 1031}, -1, 1)};
      },
      {out("out", {512}, DT::i32, zeros_ok(exact()))}, [](Backend& be, In& in, Out& o) { be.argmax(in[0], o[0]); });
  t.add(
      "scatter_add_rows/large_src1x512x384_idx8x256/f32", Kernel::scatter_add_rows, {DT::f32},
      [](Gen& g) {
        return In{g.uniform({8, 256, 384}, -1, 1), g.ints({8, 256}, 0, 512), g.uniform({1, 512, 384}, -1, 1)};
      },
      {out("dsrc", {1, 512, 384}, DT::f32, tol(4, 16), 2)},
      [](Backend& be, In& in, Out& o) { be.scatter_add_rows(in[0], in[1], o[0]); });
}

}  // namespace

// ---------------------------------------------------------------- bf16 / f16 (mixed precision)

// The half-precision variants of the kernels a bf16-mixed / f16-mixed step calls (docs/precision.md),
// backward passes included. Inputs are drawn in the half dtype; saved statistics (mean, rstd, lse) and
// forward outputs a backward reads come from the oracle's f32 forward on the exactly widened inputs
// (then rounded to the half dtype where the kernel takes them in it). The driver compares against the
// oracle in f32 on the same widened inputs (ref runs no half arithmetic) at the half dtype's tolerance:
// rtol = k_store * eps(bf16 or f16) + k * eps(f32) * sqrt(K), i.e. about two half ulps. The shapes reach
// past 2^16 elements where cpu works in blocks of rows, so block edges and the blocks' summed norm weight
// gradients are checked too.
Tensor to_dtype(Gen& g, const Tensor& x, DT dt) {
  if (x.dtype() == dt) return x;
  Tensor y = Tensor::empty(x.shape(), dt, g.backend());
  g.backend()->cast(x, y);
  return y;
}

void add_half(Table& t) {
  for (DT dt : {DT::bf16, DT::f16}) {
    const std::string tag = std::string("/") + dtype_name(dt);
    for (UnaryOp op : {UnaryOp::exp, UnaryOp::silu, UnaryOp::gelu_tanh, UnaryOp::gelu}) {
      const UnaryParams p{op, 1, 0};
      t.add(
          std::string("unary_backward/") + unary_op_name(op) + "_1031" + tag, Kernel::unary_backward, {dt},
          [dt](Gen& g) { return In{g.uniform({1031}, -3, 3, dt), g.uniform({1031}, -1, 1, dt)}; },
          {out("dx", {1031}, dt, tol(8))}, [p](Backend& be, In& in, Out& o) { be.unary_backward(in[0], in[1], o[0], p); });
    }
    for (Activation act : {Activation::silu, Activation::gelu_tanh}) {
      const std::string a = act == Activation::silu ? "silu" : "gelu_tanh";
      t.add(
          "gated_activation/" + a + "_100003" + tag, Kernel::gated_activation, {dt},
          [dt](Gen& g) { return In{g.uniform({100003}, -4, 4, dt), g.uniform({100003}, -2, 2, dt)}; },
          {out("out", {100003}, dt, tol(8))},
          [act](Backend& be, In& in, Out& o) { be.gated_activation(in[0], in[1], o[0], act); });
      t.add(
          "gated_activation_backward/" + a + "_100003" + tag, Kernel::gated_activation_backward, {dt},
          [dt](Gen& g) {
            return In{g.uniform({100003}, -4, 4, dt), g.uniform({100003}, -2, 2, dt), g.uniform({100003}, -1, 1, dt)};
          },
          {out("dgate", {100003}, dt, tol(8)), out("dup", {100003}, dt, tol(8))},
          [act](Backend& be, In& in, Out& o) { be.gated_activation_backward(in[0], in[1], in[2], o[0], o[1], act); });
    }
    t.add(
        "unary_backward_sum/gelu_tanh_40x96" + tag, Kernel::unary_backward_sum, {dt},
        [dt](Gen& g) {
          return In{g.uniform({40, 96}, -3, 3, dt), g.uniform({40, 96}, -1, 1, dt)};
        },
        {out("dx", {40, 96}, dt, tol(8)), out("dsum", {96}, dt, tol(8, 40))},
        [](Backend& be, In& in, Out& o) {
          be.unary_backward_sum(in[0], in[1], o[0], o[1], UnaryParams{UnaryOp::gelu_tanh, 1, 0});
        });
    t.add(
        "gated_residual/4x7x96_groups4" + tag, Kernel::gated_residual, {dt},
        [dt](Gen& g) {
          return In{g.uniform({4, 7, 96}, -2, 2, dt), g.uniform({4, 7, 96}, -2, 2, dt), g.uniform({4, 96}, -1, 1, dt)};
        },
        {out("y", {4, 7, 96}, dt, tol(2))},
        [](Backend& be, In& in, Out& o) { be.gated_residual(in[0], in[1], in[2], o[0]); });
    t.add(
        "gated_residual_backward/4x7x96_groups4" + tag, Kernel::gated_residual_backward, {dt},
        [dt](Gen& g) {
          return In{g.uniform({4, 7, 96}, -2, 2, dt), g.uniform({4, 96}, -1, 1, dt), g.uniform({4, 7, 96}, -1, 1, dt)};
        },
        {out("df", {4, 7, 96}, dt, tol(2)), out("dgate", {4, 96}, dt, tol(4, 7))},
        [](Backend& be, In& in, Out& o) { be.gated_residual_backward(in[0], in[1], in[2], o[0], o[1]); });
    t.add(
        "unary/silu_100003" + tag, Kernel::unary, {dt}, [dt](Gen& g) { return In{g.uniform({100003}, -4, 4, dt)}; },
        {out("out", {100003}, dt, tol(8))},
        [](Backend& be, In& in, Out& o) { be.unary(in[0], o[0], UnaryParams{UnaryOp::silu, 1, 0}); });
    for (BinaryOp op : {BinaryOp::add, BinaryOp::mul}) {
      t.add(
          std::string("binary/") + binary_op_name(op) + "_300x384" + tag, Kernel::binary, {dt},
          [dt](Gen& g) { return In{g.uniform({300, 384}, -2, 2, dt), g.uniform({300, 384}, -2, 2, dt)}; },
          {out("out", {300, 384}, dt, tol(0))}, [op](Backend& be, In& in, Out& o) { be.binary(in[0], in[1], o[0], op); });
      t.add(
          std::string("binary/") + binary_op_name(op) + "_row_300x384_384" + tag, Kernel::binary, {dt},
          [dt](Gen& g) { return In{g.uniform({300, 384}, -2, 2, dt), g.uniform({384}, -2, 2, dt)}; },
          {out("out", {300, 384}, dt, tol(0))}, [op](Backend& be, In& in, Out& o) { be.binary(in[0], in[1], o[0], op); });
    }
    for (Kernel k : {Kernel::softmax_backward, Kernel::log_softmax_backward}) {
      const bool lg = k == Kernel::log_softmax_backward;
      t.add(
          std::string(kernel_name(k)) + "/8x1000" + tag, k, {dt},
          [dt, lg](Gen& g) {
            Tensor x = g.uniform({8, 1000}, -5, 5), y = Tensor::empty({8, 1000}, DT::f32, g.backend());
            lg ? g.backend()->log_softmax(x, y) : g.backend()->softmax(x, y);
            return In{to_dtype(g, y, dt), g.uniform({8, 1000}, -1, 1, dt)};
          },
          {out("dx", {8, 1000}, dt, tol(8, 1000))},
          [lg](Backend& be, In& in, Out& o) {
            lg ? be.log_softmax_backward(in[0], in[1], o[0]) : be.softmax_backward(in[0], in[1], o[0]);
          });
    }
    // Norms: a small shape and one of 300 rows of 384 (two blocks on cpu).
    for (const Shape& sh : {Shape{4, 7, 96}, Shape{300, 384}}) {
      const int64_t D = sh.back(), rows = numel_of(sh) / D;
      const float eps = 1e-5f;
      t.add(
          "layer_norm_backward/" + dims(sh) + "_w_b" + tag, Kernel::layer_norm_backward, {dt},
          [sh, D, rows, dt, eps](Gen& g) {
            Tensor x = g.uniform(sh, -1, 1, dt), w = g.uniform({D}, 0.5f, 1.5f, dt), b = g.uniform({D}, -0.5f, 0.5f, dt);
            Tensor y = Tensor::empty(sh, DT::f32, g.backend());
            Tensor mean = Tensor::empty({rows}, DT::f32, g.backend()), rstd = Tensor::empty({rows}, DT::f32, g.backend());
            g.backend()->layer_norm(to_dtype(g, x, DT::f32), to_dtype(g, w, DT::f32), to_dtype(g, b, DT::f32), y, mean,
                                    rstd, eps);
            return In{x, w, mean, rstd, g.uniform(sh, -1, 1, dt)};
          },
          {out("dx", sh, dt, tol(16, double(D))), out("dweight", {D}, dt, tol(16, double(rows))),
           out("dbias", {D}, dt, tol(16, double(rows)))},
          [](Backend& be, In& in, Out& o) { be.layer_norm_backward(in[0], in[1], in[2], in[3], in[4], o[0], o[1], o[2]); });
      t.add(
          "rms_norm/" + dims(sh) + "_w_blocks" + tag, Kernel::rms_norm, {dt},
          [sh, D, dt](Gen& g) { return In{g.uniform(sh, -1, 1, dt), g.uniform({D}, 0.5f, 1.5f, dt)}; },
          {out("y", sh, dt, tol(16, double(D))), out("rstd", {rows}, DT::f32, tol(16, double(D)))},
          [](Backend& be, In& in, Out& o) { be.rms_norm(in[0], in[1], o[0], o[1], 1e-6f, 0.0f); });
      for (const bool acc : {false, true})  // acc: as the f32 cases above
        t.add(
            "rms_norm_backward/" + dims(sh) + "_w" + (acc ? "_accumulate" : "") + tag, Kernel::rms_norm_backward, {dt},
            [sh, D, rows, dt](Gen& g) {
              Tensor x = g.uniform(sh, -1, 1, dt), w = g.uniform({D}, 0.5f, 1.5f, dt);
              Tensor y = Tensor::empty(sh, DT::f32, g.backend()), rstd = Tensor::empty({rows}, DT::f32, g.backend());
              g.backend()->rms_norm(to_dtype(g, x, DT::f32), to_dtype(g, w, DT::f32), y, rstd, 1e-6f, 0.0f);
              return In{x, w, rstd, g.uniform(sh, -1, 1, dt), g.uniform(sh, -2, 2, dt)};
            },
            {out("dx", sh, dt, tol(16, double(D))), out("dweight", {D}, dt, tol(16, double(rows)))},
            [acc](Backend& be, In& in, Out& o) {
              if (acc) be.copy_device(o[0].data(), in[4].data(), in[4].nbytes());
              be.rms_norm_backward(in[0], in[1], in[2], in[3], o[0], o[1], 0.0f, acc);
            });
    }
    for (bool batch_pos : {false, true}) {
      const Shape xs{2, 16, 4, 32};
      RopeParams p{10000.0f, 0, false};
      Check c;
      c.rtol_override = 2 * dtype_epsilon(dt) + dtype_epsilon(DT::f32) * (2.0 + 4.0 * 63);
      t.add(
          std::string("rope/") + (batch_pos ? "batchpos" : "full") + "_" + dims(xs) + tag, Kernel::rope, {dt},
          [xs, dt, batch_pos](Gen& g) {
            return In{g.uniform(xs, -1, 1, dt), batch_pos ? g.ints({2, 16}, 0, 64) : g.from_ints(arange(16), {16})};
          },
          {out("out", xs, dt, c)}, [p](Backend& be, In& in, Out& o) { be.rope(in[0], in[1], o[0], p); });
    }
    // Attention: causal MHA and a grouped-query shape, forward and backward.
    struct A {
      std::string what;
      int64_t B, T, H, Hkv, D;
      bool packed;         // segment ids: documents of 20 tokens (packed rows)
      bool causal = true;  // false: bidirectional (the DiT's rows; cpu's vdpbf16ps kernel without masks)
    };
    // Undefined, or i32 [B, T] with a new document every 20 positions.
    auto segments = [](Gen& g, int64_t B, int64_t T, bool packed) {
      if (!packed) return Tensor();
      std::vector<int32_t> v(size_t(B * T));
      for (int64_t i = 0; i < B * T; ++i) v[size_t(i)] = int32_t((i % T) / 20);
      return g.from_ints(v, {B, T});
    };
    // Head widths 64 and 128 are where cuda's tensor-core kernels take bf16 (flash_attention.cu): ragged tiles, GQA,
    // documents straddling its 64-row tiles. Bidirectional rows too (the DiT's; with GQA, documents and odd T), and
    // all but the one-kv-head D 128 backward at 2+ threads reach cpu's vdpbf16ps kernel (attention_bf16.cpp).
    for (const A& a :
         {A{"causal", 2, 16, 4, 4, 16, false}, A{"causal_gqa", 2, 64, 4, 2, 32, false},
          A{"causal_packed", 2, 64, 4, 2, 32, true}, A{"causal_gqa_d64", 1, 96, 4, 2, 64, false},
          A{"causal_packed_d128", 1, 80, 2, 1, 128, true}, A{"noncausal_d64", 2, 64, 4, 4, 64, false, false},
          A{"noncausal_gqa_packed_odd", 2, 70, 4, 2, 32, true, false}}) {
      AttentionParams p;
      p.scale = 1.0f / std::sqrt(float(a.D));
      p.causal = a.causal;
      const Shape qs{a.B, a.T, a.H, a.D}, ks{a.B, a.T, a.Hkv, a.D}, ls{a.B, a.H, a.T};
      const std::string sh = a.what + "_B" + std::to_string(a.B) + "T" + std::to_string(a.T) + "H" + std::to_string(a.H) +
                             "kv" + std::to_string(a.Hkv) + "D" + std::to_string(a.D);
      const double K = double(a.T + a.D), Kkv = double(a.T * (a.H / a.Hkv) + a.D);
      // Gradients at six half ulps instead of two: a tensor-core kernel rounds P and dS to the half dtype before
      // their second products (FlashAttention-2's form, cuda's flash_attention.cu), an error of about one half ulp
      // of each row's own scale (0.2-0.4 % of a row's norm, against 0.2 % for the output's rounding alone), and the
      // rows near the causal start, seeing few keys, have gradients 4-5 times the whole output's rms, which sets
      // atol (found by the emulated cuda run: 1.56 of the two-ulp tolerance at D 64, 1.04 of three ulps).
      auto grad_tol = [](double KK) {
        Check c = tol(16, KK);
        c.k_store = 6;
        return c;
      };
      if (a.what != "causal")  // the plain causal forward has its bf16 case in add_attention
        t.add(
            "attention/" + sh + tag, Kernel::attention, {dt},
            [qs, ks, dt, a, segments](Gen& g) {
              return In{g.uniform(qs, -1, 1, dt), g.uniform(ks, -1, 1, dt), g.uniform(ks, -1, 1, dt),
                        segments(g, a.B, a.T, a.packed)};
            },
            {out("out", qs, dt, tol(16, K)), out("lse", ls, DT::f32, tol(16, K))},
            [p](Backend& be, In& in, Out& o) { be.attention(in[0], in[1], in[2], in[3], o[0], o[1], p); });
      t.add(
          "attention_backward/" + sh + tag, Kernel::attention_backward, {dt},
          [qs, ks, ls, dt, p, a, segments](Gen& g) {
            Tensor q = g.uniform(qs, -1, 1, dt), k = g.uniform(ks, -1, 1, dt), v = g.uniform(ks, -1, 1, dt);
            Tensor seg = segments(g, a.B, a.T, a.packed);
            Tensor o = Tensor::empty(qs, DT::f32, g.backend()), lse = Tensor::empty(ls, DT::f32, g.backend());
            g.backend()->attention(to_dtype(g, q, DT::f32), to_dtype(g, k, DT::f32), to_dtype(g, v, DT::f32), seg, o, lse,
                                   p);
            return In{q, k, v, seg, to_dtype(g, o, dt), lse, g.uniform(qs, -1, 1, dt)};
          },
          {out("dq", qs, dt, grad_tol(K)), out("dk", ks, dt, grad_tol(Kkv)), out("dv", ks, dt, grad_tol(Kkv))},
          [p](Backend& be, In& in, Out& o) {
            be.attention_backward(in[0], in[1], in[2], in[3], in[4], in[5], in[6], o[0], o[1], o[2], p);
          });
    }
    // Cross-entropy over 300 rows of a 256-token vocabulary (two blocks on cpu), a few rows ignored.
    {
      const int64_t N = 300, V = 256;
      const CrossEntropyParams p{-100};
      auto make = [dt](Gen& g) {
        std::vector<int32_t> tg = g.ints({N}, 0, int32_t(V)).to_ints();
        for (int i = 0; i < 7; ++i) tg[size_t(i * 41 + 3)] = -100;
        return In{g.uniform({N, V}, -5, 5, dt), g.from_ints(tg, {N})};
      };
      t.add("cross_entropy/300x256_ignore-100x7" + tag, Kernel::cross_entropy, {dt}, make,
            {out("loss", {N}, DT::f32, tol(8, double(V))), out("lse", {N}, DT::f32, tol(8, double(V)))},
            [p](Backend& be, In& in, Out& o) { be.cross_entropy(in[0], in[1], o[0], o[1], p); });
      t.add(
          "cross_entropy_backward/300x256_ignore-100x7" + tag, Kernel::cross_entropy_backward, {dt},
          [make, p](Gen& g) {
            In in = make(g);
            Tensor loss = Tensor::empty({N}, DT::f32, g.backend()), lse = Tensor::empty({N}, DT::f32, g.backend());
            g.backend()->cross_entropy(to_dtype(g, in[0], DT::f32), in[1], loss, lse, p);
            in.push_back(lse);
            in.push_back(g.uniform({N}, 0.1f, 1));
            return in;
          },
          {out("dlogits", {N, V}, dt, tol(8, double(V)))},
          [p](Backend& be, In& in, Out& o) { be.cross_entropy_backward(in[0], in[1], in[2], in[3], o[0], p); });
    }
  }
}

std::vector<Case> all_cases() {
  Table t;
  add_fill(t);
  add_cast(t);
  add_strided_copy(t);
  add_matmul(t);
  add_unary(t);
  add_gated(t);
  add_gated_residual(t);
  add_unary_backward_sum(t);
  add_binary(t);
  add_reduce(t);
  add_softmax(t);
  add_layer_norm(t);
  add_rms_norm(t);
  add_group_norm(t);
  add_gather_scatter(t);
  add_rope(t);
  add_attention(t);
  add_conv(t);
  add_cross_entropy(t);
  add_optimizers(t);
  add_random(t);
  add_dropout(t);
  add_argmax(t);
  add_attention_max_logit(t);
  add_attention_slots(t);
  add_large(t);
  add_half(t);
  return std::move(t.cases);
}

}  // namespace dew::conformance
