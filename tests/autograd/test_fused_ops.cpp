// tests/autograd/test_fused_ops.cpp — the fused blocks of dew/ops.hpp (core/ops/fused.cpp):
// modulated_layer_norm, gated_residual, packed_attention, qkv_attention, linear_cross_entropy and
// linear_token_logprobs, and linear's
// activation-and-bias backward (unary_backward_sum, core/ops/linalg.cpp). Their gradients against central finite
// differences in double on ref; each equals the composition it fuses (on ref in f64, and qkv_attention
// against packed_attention(linear) on cpu, values and gradients, where it takes oneDNN); shapes are
// checked. (Moved from tests/diffusion_models with the ops, which were private to the dit and unet
// plugins before.)
#include <cmath>
#include <cstring>

#include "dew/autocast.hpp"
#include "gradcheck.hpp"

using namespace gc;
using dew::Tensor;
using V = std::vector<Tensor>;

namespace {
dew::AttentionParams bidirectional(int64_t head_dim) {
  dew::AttentionParams p;
  p.causal = false;
  p.scale = 1.0f / std::sqrt(float(head_dim));
  return p;
}
const BackendPtr& cpu() {
  static BackendPtr be = [] {
    ref();  // loads the plugins
    return dew::create_backend("cpu");
  }();
  return be;
}
// The largest |got - want| (taken in T) and the largest |want| over two equal-length vectors.
struct Deviation {
  double worst = 0, scale = 0;
};
template <class T>
Deviation deviation(const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  Deviation d;
  for (size_t i = 0; i < got.size(); ++i) {
    d.worst = std::max(d.worst, double(std::fabs(got[i] - want[i])));
    d.scale = std::max(d.scale, double(std::fabs(want[i])));
  }
  return d;
}
}  // namespace

TEST_CASE("fused ops: modulated_layer_norm, packed_attention, qkv_attention gradcheck in double") {
  gradcheck([](const V& in) { return dew::modulated_layer_norm(in[0], in[1], in[2], 1e-6f); },
            {rnd({2, 5, 8}, 1), rnd({2, 8}, 2), rnd({2, 8}, 3)}, "modulated_layer_norm");
  gradcheck([](const V& in) { return dew::gated_residual(in[0], in[1], in[2]); },
            {rnd({3, 5, 7}, 30), rnd({3, 5, 7}, 31), rnd({3, 7}, 32)}, "gated_residual");
  gradcheck([](const V& in) { return dew::packed_attention(in[0], 2, bidirectional(4)); }, {rnd({2, 5, 3 * 2 * 4}, 5)},
            "packed_attention");
  dew::AttentionParams causal = bidirectional(4);
  causal.causal = true;
  causal.softcap = 2.0f;
  gradcheck([causal](const V& in) { return dew::packed_attention(in[0], 2, causal); }, {rnd({2, 5, 3 * 2 * 4}, 6)},
            "packed_attention causal softcap");
  gradcheck([](const V& in) { return dew::qkv_attention(in[0], in[1], in[2], 2, bidirectional(4)); },
            {rnd({2, 5, 6}, 10), rnd({3 * 2 * 4, 6}, 11), rnd({3 * 2 * 4}, 12)}, "qkv_attention");
  gradcheck([](const V& in) { return dew::qkv_attention(in[0], in[1], Tensor(), 2, bidirectional(4)); },
            {rnd({2, 5, 6}, 13), rnd({3 * 2 * 4, 6}, 14)}, "qkv_attention without bias");
}

TEST_CASE("fused ops: each equals the composition it fuses (f64, ref)") {
  // modulated_layer_norm is LN(x) * (1 + scale) + shift
  const Tensor x = rnd({3, 4, 8}, 7), sh = rnd({3, 8}, 8), sc = rnd({3, 8}, 9);
  const Tensor want =
      dew::add(dew::mul(dew::layer_norm(x, {}, {}, 1e-6f), dew::reshape(dew::add_scalar(sc, 1), {3, 1, 8})),
               dew::reshape(sh, {3, 1, 8}));
  check_close(dew::modulated_layer_norm(x, sh, sc), want, 1e-12, 1e-10, "modulated_layer_norm vs ops");
  // gated_residual is x + f * gate (gate broadcast over the tokens), values and all three gradients
  {
    Tensor xr = rnd({3, 4, 8}, 40), fr = rnd({3, 4, 8}, 41), gr = rnd({3, 8}, 42);
    const Tensor r = rnd({3, 4, 8}, 43);
    std::vector<std::vector<double>> got[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor a = xr.detach(), f = fr.detach(), g = gr.detach();
      for (Tensor* t : {&a, &f, &g}) t->set_requires_grad(true);
      const Tensor y = fused ? dew::gated_residual(a, f, g) : dew::add(a, dew::mul(f, dew::reshape(g, {3, 1, 8})));
      dew::sum(dew::mul(y, r)).backward();
      got[fused] = {y.to_doubles(), a.grad().to_doubles(), f.grad().to_doubles(), g.grad().to_doubles()};
    }
    for (size_t t = 0; t < 4; ++t)
      for (size_t i = 0; i < got[0][t].size(); ++i)
        CHECK_MESSAGE(std::fabs(got[0][t][i] - got[1][t][i]) <= 1e-13 * (1 + std::fabs(got[0][t][i])),
                      "gated_residual vs ops: tensor ", t, " element ", i);
  }
  // packed_attention splits q, k, v along the last axis, in that order
  const Tensor qkv = rnd({2, 5, 3 * 2 * 4}, 20);
  auto part = [&](int j) { return dew::reshape(dew::slice(qkv, 2, j * 8, (j + 1) * 8), {2, 5, 2, 4}); };
  check_close(dew::packed_attention(qkv, 2, bidirectional(4)),
              dew::reshape(dew::attention(part(0), part(1), part(2), bidirectional(4)), {2, 5, 8}), 1e-13, 1e-12,
              "packed_attention vs attention");
  // qkv_attention is packed_attention(linear)
  const Tensor xi = rnd({2, 5, 6}, 21), w = rnd({24, 6}, 22), b = rnd({24}, 23);
  check_close(dew::qkv_attention(xi, w, b, 2, bidirectional(4)),
              dew::packed_attention(dew::linear(xi, w, b), 2, bidirectional(4)), 1e-13, 1e-12,
              "qkv_attention vs packed_attention(linear)");
}

TEST_CASE("fused ops: linear with a bias and an activation (unary_backward_sum) equals activation(linear)") {
  // With grad, linear(x, w, b, act) records one node whose backward takes the activation's derivative and the
  // bias gradient from one unary_backward_sum call (core/ops/linalg.cpp); values and every gradient equal the
  // two-node composition, on ref in f64 and, bit for bit, on cpu in f32 (the kernel's contract).
  using dew::Activation;
  for (auto act : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    CAPTURE(int(act));
    for (int on_cpu = 0; on_cpu < 2; ++on_cpu) {
      auto draw = [on_cpu](const dew::Shape& s, uint64_t stream) {
        return on_cpu ? Tensor::normal(s, 0.0f, 0.7f, 9, stream, cpu()) : rnd(s, stream);
      };
      const Tensor x0 = draw({3, 50, 24}, 70), w0 = draw({40, 24}, 71), b0 = draw({40}, 72), r = draw({3, 50, 40}, 73);
      std::vector<std::vector<double>> got[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
        for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
        const Tensor y = fused ? dew::linear(x, w, b, act) : dew::activation(dew::linear(x, w, b), act);
        dew::sum(dew::mul(y, r)).backward();
        got[fused] = {y.to_doubles(), x.grad().to_doubles(), w.grad().to_doubles(), b.grad().to_doubles()};
      }
      for (size_t t = 0; t < 4; ++t)
        for (size_t i = 0; i < got[0][t].size(); ++i)
          CHECK_MESSAGE(
              std::fabs(got[0][t][i] - got[1][t][i]) <= (on_cpu ? 0.0 : 1e-13 * (1 + std::fabs(got[0][t][i]))),
              "on cpu ", on_cpu, " tensor ", t, " element ", i);
    }
  }
}

TEST_CASE("fused ops: qkv_attention equals packed_attention(linear) on cpu, values and gradients") {
  // rows = 2 * 40 > 32, so linear takes oneDNN like the three block matmuls; with and without a bias.
  for (bool with_bias : {true, false}) {
    auto rnd32 = [](const dew::Shape& s, uint64_t stream) { return Tensor::normal(s, 0.0f, 0.5f, 5, stream, cpu()); };
    const Tensor x0 = rnd32({2, 40, 24}, 1), w0 = rnd32({3 * 32, 24}, 2), b0 = rnd32({3 * 32}, 3),
                 r = rnd32({2, 40, 32}, 4);
    std::vector<std::vector<float>> got[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = x0.detach(), w = w0.detach(), b = with_bias ? b0.detach() : Tensor();
      x.set_requires_grad(true);
      w.set_requires_grad(true);
      if (with_bias) b.set_requires_grad(true);
      const Tensor y = fused ? dew::qkv_attention(x, w, b, 4, bidirectional(8))
                             : dew::packed_attention(dew::linear(x, w, b), 4, bidirectional(8));
      dew::sum(dew::mul(y, r)).backward();
      got[fused] = {y.to_floats(), x.grad().to_floats(), w.grad().to_floats()};
      if (with_bias) got[fused].push_back(b.grad().to_floats());
    }
    for (size_t t = 0; t < got[0].size(); ++t) {
      const Deviation dv = deviation(got[1][t], got[0][t]);
      CHECK_MESSAGE(dv.scale > 0.1, "tensor ", t, " is degenerate");
      CHECK_MESSAGE(dv.worst <= 1e-5 * std::max(1.0, dv.scale), "bias ", with_bias, " tensor ", t, " differs by ",
                    dv.worst);
    }
  }
}

TEST_CASE("fused ops: bad shapes are refused by name") {
  const auto z = [](const dew::Shape& s) { return Tensor::zeros(s, DType::f64, ref()); };
  CHECK_THROWS_WITH_AS(dew::qkv_attention(z({2, 4, 8}), z({3 * 8, 6}), Tensor(), 2, bidirectional(4)),
                       doctest::Contains("qkv_attention: weight must be"), dew::Error);
  CHECK_THROWS_WITH_AS(dew::qkv_attention(z({2, 4, 6}), z({3 * 8, 6}), z({8}), 2, bidirectional(4)),
                       doctest::Contains("qkv_attention: bias must be [24]"), dew::Error);
  CHECK_THROWS_WITH_AS(dew::packed_attention(z({2, 4, 10}), 2, bidirectional(4)),
                       doctest::Contains("packed_attention: qkv must be"), dew::Error);
  CHECK_THROWS_WITH_AS(dew::modulated_layer_norm(z({2, 4, 8}), z({2, 8}), z({3, 8})),
                       doctest::Contains("modulated_layer_norm: shift and scale must be [2, 8]"), dew::Error);
  CHECK_THROWS_WITH_AS(dew::gated_residual(z({2, 4, 8}), z({2, 4, 8}), z({2, 4})),
                       doctest::Contains("gated_residual: gate must be [2, 8]"), dew::Error);
  CHECK_THROWS_WITH_AS(dew::gated_residual(z({2, 4, 8}), z({2, 5, 8}), z({2, 8})),
                       doctest::Contains("gated_residual: f [2, 5, 8] must have x's shape"), dew::Error);
}

namespace {
// cross_entropy(softcap(linear(h, w))) as the causal transformer and the lm objective compose it unfused.
Tensor unfused_head_loss(const Tensor& h, const Tensor& w, const Tensor& targets, int64_t ignore, float cap) {
  Tensor logits = dew::linear(h, w);
  if (logits.dtype() != DType::f32 && logits.dtype() != DType::f64) logits = dew::cast(logits, DType::f32);
  if (cap > 0) logits = dew::softcap(logits, cap);
  return dew::cross_entropy(logits, targets, ignore);
}
// Targets in [0, v) with every third row ignored (ignore = -1), and a run of ignored rows that fills a whole chunk
// of 3 (rows 3..5) so a chunk without a counted target is covered.
Tensor head_targets(int64_t n, int64_t v, const BackendPtr& be) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back((i >= 3 && i < 6) || i % 3 == 2 ? -1 : int32_t((i * 7 + 3) % v));
  return Tensor::from_ints(t, {n}, be);
}
// One run on fresh leaves h, w (copies of h0, w0) and the backward of g * loss: chunk_rows >= 0 runs
// linear_cross_entropy (its predictions kept), -1 the unfused composition (argmax of its logits).
struct HeadRun {
  Tensor loss, dh, dw, pred;
  const Tensor& tensor(size_t k) const { return k == 0 ? loss : k == 1 ? dh : dw; }
  std::vector<double> values(size_t k) const { return tensor(k).to_doubles(); }
};
HeadRun head_run(const Tensor& h0, const Tensor& w0, const Tensor& t, float cap, int64_t chunk_rows, double g = 1.0) {
  Tensor h = h0.detach(), w = w0.detach();
  h.set_requires_grad(true);
  w.set_requires_grad(true);
  HeadRun r;
  if (chunk_rows >= 0) {
    dew::LinearCrossEntropyOptions o;
    o.ignore_index = -1;
    o.softcap = cap;
    o.chunk_rows = chunk_rows;
    o.predictions = &r.pred;
    r.loss = dew::linear_cross_entropy(h, w, t, o);
  } else {
    r.loss = unfused_head_loss(h, w, t, -1, cap);
    dew::NoGradGuard no_grad;
    Tensor logits = dew::linear(h0, w0);
    if (cap > 0) logits = dew::softcap(logits, cap);
    r.pred = dew::argmax(logits);
  }
  (g == 1.0 ? r.loss : dew::scale(r.loss, float(g))).backward();
  r.dh = h.grad();
  r.dw = w.grad();
  return r;
}
}  // namespace

namespace {
// Gradchecks op(h [9, 5], w [11, 5], targets, options) in double on ref, with and without a softcap, in chunks of 3,
// of 5 and 4, and one (the inputs drawn from streams `stream` and `stream` + 1).
template <class Op>
void gradcheck_head(Op op, const char* what, uint64_t stream) {
  const Tensor t = head_targets(9, 11, ref());
  for (float cap : {0.0f, 1.5f})
    for (int64_t chunk : {int64_t(3), int64_t(5), int64_t(0)}) {
      CAPTURE(cap);
      CAPTURE(chunk);
      dew::LinearCrossEntropyOptions o;
      o.ignore_index = -1;
      o.softcap = cap;
      o.chunk_rows = chunk;
      gradcheck([&](const V& in) { return op(in[0], in[1], t, o); },
                {rnd({9, 5}, stream), rnd({11, 5}, stream + 1, -2.0, 2.0)}, what);
    }
}
}  // namespace

TEST_CASE("linear_cross_entropy: gradcheck in double, chunked, with and without softcap") {
  gradcheck_head([](const Tensor& h, const Tensor& w, const Tensor& t,
                    const dew::LinearCrossEntropyOptions& o) { return dew::linear_cross_entropy(h, w, t, o); },
                 "linear_cross_entropy", 60);
}

TEST_CASE("linear_cross_entropy equals cross_entropy(softcap(linear)) (f64, ref): loss, gradients, predictions") {
  const int64_t n = 10, d = 6, v = 13;
  const Tensor t = head_targets(n, v, ref()), h0 = rnd({n, d}, 62), w0 = rnd({v, d}, 63, -2.0, 2.0);
  for (float cap : {0.0f, 2.0f}) {
    // g = 1 (the loss's own backward: the op skips its scaling pass on a host backend) and g = 2.5
    for (double g : {1.0, 2.5}) {
      const HeadRun want = head_run(h0, w0, t, cap, -1, g);
      for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7), n}) {
        CAPTURE(cap);
        CAPTURE(g);
        CAPTURE(chunk);
        const HeadRun got = head_run(h0, w0, t, cap, chunk, g);
        for (size_t k = 0; k < 3; ++k) {
          const std::vector<double> a = got.values(k), b = want.values(k);
          REQUIRE(a.size() == b.size());
          for (size_t i = 0; i < a.size(); ++i)
            CHECK_MESSAGE(std::fabs(a[i] - b[i]) <= 1e-13 * (1 + std::fabs(b[i])), "tensor ", k, " element ", i, ": ",
                          a[i], " vs ", b[i]);
        }
        CHECK(got.pred.to_ints() == want.pred.to_ints());
      }
    }
  }
  // Every target ignored: the mean is 0 and so is every gradient (as cross_entropy's).
  const Tensor none = Tensor::from_ints(std::vector<int32_t>(size_t(n), -1), {n}, ref());
  const HeadRun ignored = head_run(h0, w0, none, 0.0f, 4);
  CHECK(ignored.loss.item() == 0.0);
  for (double x : ignored.dh.to_doubles()) CHECK(x == 0.0);
  for (double x : ignored.dw.to_doubles()) CHECK(x == 0.0);
  // Without a gradient: the same loss, nothing recorded.
  dew::NoGradGuard no_grad;
  dew::LinearCrossEntropyOptions o;
  o.ignore_index = -1;
  o.chunk_rows = 4;
  const Tensor plain = dew::linear_cross_entropy(h0, w0, t, o);
  CHECK_FALSE(plain.requires_grad());
  CHECK(plain.item() == doctest::Approx(unfused_head_loss(h0, w0, t, -1, 0.0f).item()).epsilon(1e-13));
}

TEST_CASE("linear_cross_entropy on cpu: one chunk is the composition bit for bit, more agree to rounding") {
  // 300 rows, a 1,000-token head of width 64: oneDNN's products (more than 32 rows), and chunks of 20 rows, which
  // take the row-wise products. With g = 1 one chunk runs the composition's kernels on the same operands.
  const int64_t n = 300, d = 64, v = 1000;
  auto draw = [](const dew::Shape& s, uint64_t stream, float sd) {
    return Tensor::normal(s, 0.0f, sd, 3, stream, cpu());
  };
  const Tensor h0 = draw({n, d}, 1, 1.0f), w0 = draw({v, d}, 2, 0.3f), t = head_targets(n, v, cpu());
  for (float cap : {0.0f, 5.0f}) {
    const HeadRun want = head_run(h0, w0, t, cap, -1);
    const std::vector<int32_t> want_pred = want.pred.to_ints();
    for (int64_t chunk : {n, int64_t(128), int64_t(20)}) {
      CAPTURE(cap);
      CAPTURE(chunk);
      const HeadRun got = head_run(h0, w0, t, cap, chunk);
      for (size_t k = 0; k < 3; ++k) {
        const std::vector<float> a = got.tensor(k).to_floats(), b = want.tensor(k).to_floats();
        REQUIRE(a.size() == b.size());
        if (chunk == n) {
          CHECK_MESSAGE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "tensor ", k);
          continue;
        }
        const Deviation dv = deviation(a, b);
        CHECK_MESSAGE(dv.scale > 1e-4, "tensor ", k, " is degenerate");
        CHECK_MESSAGE(dv.worst <= 2e-6 * std::max(1.0, dv.scale) + 1e-6 * dv.scale, "tensor ", k, " differs by ",
                      dv.worst, " (scale ", dv.scale, ")");
      }
      const std::vector<int32_t> p = got.pred.to_ints();
      if (chunk == n) {
        CHECK(p == want_pred);
        continue;
      }
      int64_t same = 0;
      for (size_t i = 0; i < p.size(); ++i) same += p[i] == want_pred[i];
      CHECK(same >= n - 2);  // a near-tie may flip under another product's rounding
    }
  }
}

TEST_CASE("linear_cross_entropy under bf16 autocast on cpu follows the unfused head") {
  // Autocast lowers h and w to bf16 as linear() does; the logits are widened to f32 (the causal transformer's
  // cast) before the loss. dW: per chunk in bf16, summed in f32, rounded once.
  const int64_t n = 96, d = 32, v = 500;
  auto draw = [](const dew::Shape& s, uint64_t stream, float sd) {
    return Tensor::normal(s, 0.0f, sd, 4, stream, cpu());
  };
  const Tensor h0 = draw({n, d}, 1, 1.0f), w0 = draw({v, d}, 2, 0.3f), t = head_targets(n, v, cpu());
  std::vector<std::vector<float>> got[2];
  for (int fused = 0; fused < 2; ++fused) {
    Tensor h = h0.detach(), w = w0.detach();
    h.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor loss;
    {
      dew::AutocastGuard autocast(DType::bf16);
      dew::LinearCrossEntropyOptions o;
      o.ignore_index = -1;
      o.chunk_rows = 40;
      loss = fused ? dew::linear_cross_entropy(h, w, t, o) : unfused_head_loss(h, w, t, -1, 0.0f);
    }
    CHECK(loss.dtype() == DType::f32);
    loss.backward();
    CHECK(h.grad().dtype() == DType::f32);
    CHECK(w.grad().dtype() == DType::f32);
    got[fused] = {loss.to_floats(), h.grad().to_floats(), w.grad().to_floats()};
  }
  CHECK(got[1][0][0] == doctest::Approx(got[0][0][0]).epsilon(1e-6));  // the same bf16 logits, summed alike
  for (size_t k = 1; k < 3; ++k) {
    const Deviation dv = deviation(got[1][k], got[0][k]);
    CHECK_MESSAGE(dv.scale > 1e-4, "tensor ", k, " is degenerate");
    CHECK_MESSAGE(dv.worst <= 1e-2 * dv.scale, "tensor ", k, " differs by ", dv.worst, " (scale ", dv.scale, ")");
  }
}

TEST_CASE("linear_token_logprobs: gradcheck in double, and token_logprobs(softcap(linear)) on ref and cpu") {
  gradcheck_head([](const Tensor& h, const Tensor& w, const Tensor& t,
                    const dew::LinearCrossEntropyOptions& o) { return dew::linear_token_logprobs(h, w, t, o); },
                 "linear_token_logprobs", 64);
  // Against the composition with unequal row gradients (a weighted sum of the rows): f64 on ref to 1e-13, f32 on
  // cpu to rounding (one chunk: the composition's kernels, bit for bit).
  for (int on_cpu = 0; on_cpu < 2; ++on_cpu) {
    const int64_t n = on_cpu ? 200 : 10, d = on_cpu ? 48 : 6, v = on_cpu ? 700 : 13;
    const BackendPtr& be = on_cpu ? cpu() : ref();
    auto draw = [&](const dew::Shape& s, uint64_t stream, float sd) {
      return on_cpu ? Tensor::normal(s, 0.0f, sd, 6, stream, cpu()) : rnd(s, stream, -sd, sd);
    };
    const Tensor h0 = draw({n, d}, 1, 1.0f), w0 = draw({v, d}, 2, on_cpu ? 0.3f : 2.0f), t2 = head_targets(n, v, be),
                 r = draw({n}, 3, 1.0f);
    for (float cap : {0.0f, 3.0f}) {
      std::vector<std::vector<double>> want;  // the composition's (chunk -1 comes first)
      for (int64_t chunk : {int64_t(-1), n, int64_t(7), int64_t(64)}) {
        CAPTURE(on_cpu);
        CAPTURE(cap);
        CAPTURE(chunk);
        Tensor h = h0.detach(), w = w0.detach();
        h.set_requires_grad(true);
        w.set_requires_grad(true);
        Tensor lp;
        if (chunk < 0) {
          Tensor logits = dew::linear(h, w);
          if (cap > 0) logits = dew::softcap(logits, cap);
          lp = dew::token_logprobs(logits, t2, -1);
        } else {
          dew::LinearCrossEntropyOptions o;
          o.ignore_index = -1;
          o.softcap = cap;
          o.chunk_rows = chunk;
          lp = dew::linear_token_logprobs(h, w, t2, o);
        }
        dew::sum(dew::mul(lp, r)).backward();
        const std::vector<std::vector<double>> got = {lp.to_doubles(), h.grad().to_doubles(), w.grad().to_doubles()};
        if (chunk < 0) {
          want = got;
          continue;
        }
        for (size_t k = 0; k < 3; ++k) {
          const Deviation dv = deviation(got[k], want[k]);
          CHECK_MESSAGE(dv.scale > 1e-3, "tensor ", k, " is degenerate");
          const double bound = !on_cpu ? 1e-13 * (1 + dv.scale) : chunk == n ? 0.0 : 2e-6 * std::max(1.0, dv.scale);
          CHECK_MESSAGE(dv.worst <= bound, "tensor ", k, " differs by ", dv.worst, " (scale ", dv.scale, ")");
        }
      }
    }
  }
}

TEST_CASE("linear_token_logprobs in f16 keeps its gradient (the backward holds the loss scale)") {
  // f16-mixed's reason to refuse linear_cross_entropy does not hold here: the rows' gradients, loss scale included,
  // arrive before any chunk gradient is formed. Against the same product in f32 on cpu.
  const Tensor h0 = Tensor::normal({64, 32}, 0.0f, 1.0f, 8, 1, cpu()),
               w0 = Tensor::normal({300, 32}, 0.0f, 0.3f, 8, 2, cpu());
  const Tensor t = head_targets(64, 300, cpu());
  std::vector<float> grads[2];
  for (int f16 = 0; f16 < 2; ++f16) {
    Tensor h = h0.detach(), w = w0.detach();
    h.set_requires_grad(true);
    w.set_requires_grad(true);
    dew::LinearCrossEntropyOptions o;
    o.ignore_index = -1;
    o.chunk_rows = 16;
    Tensor lp;
    {
      dew::AutocastGuard autocast(f16 ? DType::f16 : DType::f32);
      lp = dew::linear_token_logprobs(h, w, t, o);
    }
    dew::scale(dew::sum(lp), 1024.0f).backward();  // a loss scale
    grads[f16] = w.grad().to_floats();
  }
  int64_t zero_in_f16 = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) zero_in_f16 += grads[1][i] == 0.0f && grads[0][i] != 0.0f;
  CHECK(zero_in_f16 == 0);
  const Deviation dv = deviation(grads[1], grads[0]);
  CHECK_MESSAGE(dv.worst <= 5e-3 * dv.scale, "f16 differs by ", dv.worst, " (scale ", dv.scale, ")");
}

TEST_CASE("linear_token_logprobs' predictions: the argmax of each row's logits, chunk by chunk") {
  const Tensor h = rnd({10, 6}, 41), w = rnd({9, 6}, 42);
  const Tensor t = Tensor::from_ints({0, 1, 2, 3, 4, 5, 6, 7, 8, 0}, {10}, ref());
  const std::vector<int32_t> want = dew::argmax(dew::linear(h, w)).to_ints();
  for (const int64_t rows : {int64_t(3), int64_t(10)}) {
    CAPTURE(rows);
    dew::LinearCrossEntropyOptions o;
    o.chunk_rows = rows;
    Tensor pred;
    o.predictions = &pred;
    const Tensor lp = dew::linear_token_logprobs(h, w, t, o);
    REQUIRE(pred.defined());
    CHECK(pred.to_ints() == want);
    check_close(lp, dew::token_logprobs(dew::linear(h, w), t), 1e-13, 1e-13, "the log-probabilities");
  }
}

TEST_CASE("linear_cross_entropy: bad input is refused by name") {
  const auto z = [](const dew::Shape& s) { return Tensor::zeros(s, DType::f64, ref()); };
  const Tensor t = Tensor::from_ints({0, 1, 2, 3}, {4}, ref());
  CHECK_THROWS_WITH_AS(dew::linear_cross_entropy(z({4, 5}), z({7, 6}), t),
                       doctest::Contains("linear_cross_entropy: h must be [N, D] and w [V, D], got [4, 5] and [7, 6]"),
                       dew::Error);
  CHECK_THROWS_WITH_AS(dew::linear_cross_entropy(z({4, 5}), z({7, 5}), Tensor::from_ints({0, 1, 2}, {3}, ref())),
                       doctest::Contains("linear_cross_entropy: targets must be i32 [4], got i32 [3]"), dew::Error);
  CHECK_THROWS_WITH_AS(dew::linear_cross_entropy(z({4, 5}), Tensor::zeros({7, 5}, DType::f32, ref()), t),
                       doctest::Contains("linear_cross_entropy: h and w must have one float dtype"), dew::Error);
  {  // f16 with a gradient (its chunk gradients would underflow before the loss scale)
    Tensor h = Tensor::zeros({4, 5}, DType::f16, cpu()), w = Tensor::zeros({7, 5}, DType::f16, cpu());
    h.set_requires_grad(true);
    CHECK_THROWS_WITH_AS(dew::linear_cross_entropy(h, w, Tensor::from_ints({0, 1, 2, 3}, {4}, cpu())),
                         doctest::Contains("linear_cross_entropy: no gradient in f16"), dew::Error);
  }
  dew::LinearCrossEntropyOptions o;
  o.softcap = -1.0f;
  CHECK_THROWS_WITH_AS(dew::linear_cross_entropy(z({4, 5}), z({7, 5}), t, o), doctest::Contains("softcap must be >= 0"),
                       dew::Error);
  o.softcap = 0.0f;
  CHECK_THROWS_WITH_AS(dew::linear_token_logprobs(z({4, 5}), z({7, 6}), t),
                       doctest::Contains("linear_token_logprobs: h must be [N, D] and w [V, D]"), dew::Error);
  o.predictions = nullptr;
  o.chunk_rows = -2;
  CHECK_THROWS_WITH_AS(dew::linear_cross_entropy(z({4, 5}), z({7, 5}), t, o),
                       doctest::Contains("chunk_rows must be >= 0"), dew::Error);
  o.chunk_rows = 0;
  o.chunk_mb = 1e-9;  // less than a row: one row a chunk
  CHECK(dew::linear_cross_entropy_chunk_rows(4, 7, o) == 1);
  o.chunk_mb = 64.0;
  CHECK(dew::linear_cross_entropy_chunk_rows(999, 50304, o) == 333);   // 64 MiB / (50,304 x 4 bytes)
  CHECK(dew::linear_cross_entropy_chunk_rows(1000, 50304, o) == 250);  // 4 equal chunks, not 3 of 333 and 1 row
  CHECK(dew::linear_cross_entropy_chunk_rows(200, 50304, o) == 200);
  o.chunk_rows = 4;
  CHECK(dew::linear_cross_entropy_chunk_rows(10, 50304, o) == 4);  // 3 chunks: 4, 4, 2 (ceil(10 / 3) = 4)
  CHECK(dew::linear_cross_entropy_chunk_rows(9, 50304, o) == 3);
}
