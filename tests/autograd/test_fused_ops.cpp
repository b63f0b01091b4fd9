// tests/autograd/test_fused_ops.cpp — the fused blocks of dew/ops.hpp (core/ops/fused.cpp):
// modulated_layer_norm, packed_attention and qkv_attention. Their gradients against central finite
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
}
