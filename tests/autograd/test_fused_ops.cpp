// tests/autograd/test_fused_ops.cpp — the fused blocks of dew/ops.hpp (core/ops/fused.cpp):
// modulated_layer_norm, gated_residual, packed_attention and qkv_attention, and linear's activation-and-bias
// backward (unary_backward_sum, core/ops/linalg.cpp). Their gradients against central finite
// differences in double on ref; each equals the composition it fuses (on ref in f64, and qkv_attention
// against packed_attention(linear) on cpu, values and gradients, where it takes oneDNN); shapes are
// checked. (Moved from tests/diffusion_models with the ops, which were private to the dit and unet
// plugins before.)
#include <cmath>

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
      double worst = 0, scale = 0;
      for (size_t i = 0; i < got[0][t].size(); ++i) {
        worst = std::max(worst, double(std::fabs(got[0][t][i] - got[1][t][i])));
        scale = std::max(scale, double(std::fabs(got[0][t][i])));
      }
      CHECK_MESSAGE(scale > 0.1, "tensor ", t, " is degenerate");
      CHECK_MESSAGE(worst <= 1e-5 * std::max(1.0, scale), "bias ", with_bias, " tensor ", t, " differs by ", worst);
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
