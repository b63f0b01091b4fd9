// tests/autograd/test_nn_blocks.cpp — the nn blocks: gradient checks, forward values against compositions of
// ops, parameter names and initialisation.
//
// Precision choice: modules create f32 parameters on the default backend. For the gradient checks each
// module's public parameter members (Linear::weight, RMSNorm::weight, ...) are replaced by f64 leaves
// on ref, so the blocks are checked wholly in double at the same tolerances as the ops (an f32
// finite-difference check would need ~1e-2 tolerances and hide real errors; craft.md lesson 11).
// forward() reads those members, so swapping them is enough; named_parameters() still lists the
// original f32 tensors, which the naming tests use.
#include <cmath>
#include <set>

#include "gradcheck.hpp"

using namespace gc;
using dew::Tensor;
using V = std::vector<Tensor>;
namespace nn = dew::nn;

namespace {
struct UseRef {
  UseRef() { ref(); }  // loads ref and makes it the default backend before a module is built
};
// Random f64 leaf with the shape of an existing parameter.
Tensor like(const Tensor& p, uint64_t seed, double bound = 0.6) { return rnd(p.shape(), seed, -bound, bound); }
}  // namespace

TEST_CASE("nn::Attention gradcheck in double (GQA, qk_norm, partial rope, window, softcap)") {
  UseRef use;
  nn::AttentionConfig c;
  c.dim = 8;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.qk_norm = true;
  c.rotary_dim = 2;
  c.window = 2;
  c.softcap = 3.0f;
  c.bias = true;
  nn::Attention a(c);
  Tensor pos = ints({0, 1, 2}, {3});
  Tensor x = rnd({2, 3, 8}, 1);
  V params = {like(a.q_proj->weight, 2), like(a.q_proj->bias, 3),   like(a.k_proj->weight, 4),
              like(a.k_proj->bias, 5),   like(a.v_proj->weight, 6), like(a.v_proj->bias, 7),
              like(a.o_proj->weight, 8), rnd({2}, 9, 0.5, 1.5),     rnd({2}, 10, 0.5, 1.5)};
  V inputs = {x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  gradcheck(
      [&a, pos](const V& in) {
        a.q_proj->weight = in[1];
        a.q_proj->bias = in[2];
        a.k_proj->weight = in[3];
        a.k_proj->bias = in[4];
        a.v_proj->weight = in[5];
        a.v_proj->bias = in[6];
        a.o_proj->weight = in[7];
        a.q_norm->weight = in[8];
        a.k_norm->weight = in[9];
        return a.forward(in[0], pos);
      },
      inputs, "nn::Attention");

  // The same block written with ops gives the same output.
  Tensor q = dew::reshape(dew::linear(x, params[0], params[1]), {2, 3, 4, 2});
  Tensor k = dew::reshape(dew::linear(x, params[2], params[3]), {2, 3, 2, 2});
  Tensor v = dew::reshape(dew::linear(x, params[4], params[5]), {2, 3, 2, 2});
  q = dew::rope(dew::rms_norm(q, params[7]), pos, c.rope_theta, 2);
  k = dew::rope(dew::rms_norm(k, params[8]), pos, c.rope_theta, 2);
  dew::AttentionParams p;
  p.scale = 1.0f / std::sqrt(2.0f);
  p.causal = true;
  p.window = 2;
  p.softcap = 3.0f;
  Tensor o = dew::linear(dew::reshape(dew::attention(q, k, v, p), {2, 3, 8}), params[6]);
  check_close(a.forward(x, pos), o, 1e-13, 1e-12, "nn::Attention vs ops");
}

TEST_CASE("nn::Attention gradcheck, plain MHA with [B,T] positions and no rope") {
  UseRef use;
  nn::AttentionConfig c;
  c.dim = 8;
  c.num_heads = 2;
  c.causal = false;
  nn::Attention a(c);
  Tensor pos = ints({0, 1, 2, 3, 7, 4, 5, 6}, {2, 4});
  gradcheck(
      [&a, pos](const V& in) {
        a.q_proj->weight = in[1];
        a.k_proj->weight = in[2];
        a.v_proj->weight = in[3];
        a.o_proj->weight = in[4];
        return a.forward(in[0], pos);
      },
      {rnd({2, 4, 8}, 11), like(a.q_proj->weight, 12), like(a.k_proj->weight, 13), like(a.v_proj->weight, 14),
       like(a.o_proj->weight, 15)},
      "nn::Attention MHA rope [B,T]");
  c.rotary_dim = -1;
  nn::Attention b(c);
  gradcheck(
      [&b, pos](const V& in) {
        b.q_proj->weight = in[1];
        b.k_proj->weight = in[2];
        b.v_proj->weight = in[3];
        b.o_proj->weight = in[4];
        return b.forward(in[0], pos);
      },
      {rnd({2, 4, 8}, 16), like(b.q_proj->weight, 17), like(b.k_proj->weight, 18), like(b.v_proj->weight, 19),
       like(b.o_proj->weight, 20)},
      "nn::Attention no rope");
}

TEST_CASE("nn::GatedMLP gradcheck and value (SwiGLU, GeGLU)") {
  UseRef use;
  for (auto act : {dew::Activation::silu, dew::Activation::gelu_tanh}) {
    nn::GatedMLP m(4, 6, act, true);
    V p = {like(m.gate_proj->weight, 21), like(m.gate_proj->bias, 22),   like(m.up_proj->weight, 23),
           like(m.up_proj->bias, 24),     like(m.down_proj->weight, 25), like(m.down_proj->bias, 26)};
    Tensor x = rnd({2, 3, 4}, 27);
    gradcheck(
        [&m](const V& in) {
          m.gate_proj->weight = in[1];
          m.gate_proj->bias = in[2];
          m.up_proj->weight = in[3];
          m.up_proj->bias = in[4];
          m.down_proj->weight = in[5];
          m.down_proj->bias = in[6];
          return m.forward(in[0]);
        },
        {x, p[0], p[1], p[2], p[3], p[4], p[5]}, "nn::GatedMLP act " + std::to_string(int(act)));
    Tensor expect =
        dew::linear(dew::mul(dew::activation(dew::linear(x, p[0], p[1]), act), dew::linear(x, p[2], p[3])), p[4], p[5]);
    check_close(m.forward(x), expect, 1e-13, 1e-12, "GatedMLP vs ops");
  }
}

TEST_CASE("nn::AdaLNModulation + modulate: zero init, gradcheck, values") {
  UseRef use;
  nn::AdaLNModulation ada(5, 4, 3);
  Tensor c32 = Tensor::from_vector({0.5f, -1, 2, 0.25f, -0.75f, 1, 1, -2, 0.1f, 0.3f}, {2, 5}, ref());
  // adaLN-Zero: the modulation starts at exactly zero
  auto chunks = ada.forward(c32);
  REQUIRE(chunks.size() == 3);
  for (auto& ch : chunks) {
    CHECK(ch.shape() == dew::Shape{2, 4});
    for (double v : ch.to_doubles()) CHECK(v == 0.0);
  }
  Tensor x = rnd({2, 3, 4}, 30);
  gradcheck(
      [&ada](const V& in) {
        ada.linear->weight = in[2];
        ada.linear->bias = in[3];
        auto ch = ada.forward(in[1]);
        return dew::add(nn::modulate(in[0], ch[0], ch[1]), dew::reshape(ch[2], {2, 1, 4}));
      },
      {x, rnd({2, 5}, 31), like(ada.linear->weight, 32), like(ada.linear->bias, 33)}, "AdaLNModulation+modulate");
  gradcheck([](const V& in) { return nn::modulate(in[0], in[1], in[2]); }, {x, rnd({2, 4}, 34), rnd({2, 4}, 35)},
            "modulate");
  // values: x * (1 + scale[:, None]) + shift[:, None]
  Tensor sh = rnd({2, 4}, 36), sc = rnd({2, 4}, 37);
  const auto vx = x.to_doubles(), vsh = sh.to_doubles(), vsc = sc.to_doubles();
  std::vector<double> expect;
  for (int b = 0; b < 2; ++b)
    for (int n = 0; n < 3; ++n)
      for (int d = 0; d < 4; ++d)
        expect.push_back(vx[size_t((b * 3 + n) * 4 + d)] * (1 + vsc[size_t(b * 4 + d)]) + vsh[size_t(b * 4 + d)]);
  check_values(nn::modulate(x, sh, sc), expect, 1e-14, "modulate values");
}

namespace {
// DiT's channel-last patch order: [B, C, H, W] -> [B, h*w, p*p*C] with feature index (pi*p + pj)*C + c.
Tensor patchify(const Tensor& x, int64_t p) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2) / p, w = x.size(3) / p;
  Tensor y = dew::reshape(x, {b, c, h, p, w, p});
  y = dew::permute(y, {0, 2, 4, 3, 5, 1});  // [B, h, w, p, p, C]
  return dew::reshape(y, {b, h * w, p * p * c});
}
}  // namespace

TEST_CASE("nn::PatchEmbed / unpatchify round trip and gradcheck") {
  UseRef use;
  const int64_t C = 3, P = 2, H = 4, W = 6;
  Tensor x = rnd({2, C, H, W}, 40);
  // unpatchify inverts patchify exactly
  check_close(nn::unpatchify(patchify(x, P), C, P, H / P, W / P), x, 0, 0, "unpatchify(patchify(x))");
  gradcheck([](const V& in) { return nn::unpatchify(in[0], C, P, H / P, W / P); }, {rnd({2, 6, P * P * C}, 41)},
            "unpatchify");

  // A PatchEmbed whose conv picks pixel (pi, pj) of channel c into feature (pi*P + pj)*C + c is patchify,
  // so unpatchify(PatchEmbed(x)) == x exactly (products with 1 and sums with 0 are exact).
  nn::PatchEmbed pe(C, P * P * C, P);
  std::vector<double> w(size_t(P * P * C * C * P * P), 0.0);
  for (int64_t pi = 0; pi < P; ++pi)
    for (int64_t pj = 0; pj < P; ++pj)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t o = (pi * P + pj) * C + c;
        w[size_t(((o * C + c) * P + pi) * P + pj)] = 1.0;
      }
  pe.proj->weight = f64(w, {P * P * C, C, P, P});
  pe.proj->bias = f64(std::vector<double>(size_t(P * P * C), 0.0), {P * P * C});
  Tensor tokens = pe.forward(x);
  CHECK(tokens.shape() == dew::Shape{2, (H / P) * (W / P), P * P * C});
  check_close(nn::unpatchify(tokens, C, P, H / P, W / P), x, 0, 0, "unpatchify(PatchEmbed(x))");

  // and PatchEmbed's gradient, with random f64 conv parameters
  nn::PatchEmbed pe2(C, 5, P);
  gradcheck(
      [&pe2](const V& in) {
        pe2.proj->weight = in[1];
        pe2.proj->bias = in[2];
        return pe2.forward(in[0]);
      },
      {rnd({1, C, H, W}, 42), like(pe2.proj->weight, 43), like(pe2.proj->bias, 44)}, "PatchEmbed");
}

TEST_CASE("timestep_embedding values vs the DiT formula") {
  UseRef use;
  const std::vector<double> ts = {0.0, 1.5, 37.0, 999.0};
  for (int64_t dim : {8, 7}) {
    for (DType dt : {DType::f64, DType::f32}) {
      Tensor t = dt == DType::f64 ? f64(ts, {4}) : Tensor::from_vector({0.0f, 1.5f, 37.0f, 999.0f}, {4}, ref());
      Tensor e = nn::timestep_embedding(t, dim);
      REQUIRE(e.shape() == dew::Shape{4, dim});
      CHECK(e.dtype() == dt);
      const int64_t half = dim / 2;
      std::vector<double> expect;
      for (double tv : ts) {
        for (int64_t i = 0; i < half; ++i)
          expect.push_back(std::cos(tv * std::exp(-std::log(10000.0) * double(i) / double(half))));
        for (int64_t i = 0; i < half; ++i)
          expect.push_back(std::sin(tv * std::exp(-std::log(10000.0) * double(i) / double(half))));
        if (dim % 2) expect.push_back(0.0);
      }
      // The frequencies are computed in float (max_period is a float), so the angle t*f carries a relative
      // error of ~1e-7: at t = 999 that is ~1e-4 of phase; f32 adds the same again for the product.
      check_values(e, expect, 3e-4, "timestep_embedding dim " + std::to_string(dim) + " " + dew::dtype_name(dt));
    }
  }
  gradcheck([](const V& in) { return nn::timestep_embedding(in[0], 6); }, {rnd({3}, 50, 0, 5)}, "timestep_embedding");
}

TEST_CASE("Module::named_parameters gives Hugging Face names in registration order") {
  UseRef use;
  nn::AttentionConfig c;
  c.dim = 8;
  c.num_heads = 2;
  c.qk_norm = true;
  nn::Attention a(c);
  std::vector<std::string> names;
  for (auto& [n, t] : a.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                          "q_norm.weight", "k_norm.weight"});
  CHECK(a.num_parameters() == 4 * 64 + 2 * 4);
  for (auto& [n, t] : a.named_parameters()) {
    CHECK(t.requires_grad());
    CHECK(t.dtype() == DType::f32);
  }
  c.bias = true;
  nn::Attention ab(c);
  names.clear();
  for (auto& [n, t] : ab.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                          "v_proj.weight", "v_proj.bias", "o_proj.weight", "q_norm.weight",
                                          "k_norm.weight"});
  nn::GatedMLP mlp(4, 8);
  names.clear();
  for (auto& [n, t] : mlp.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"gate_proj.weight", "up_proj.weight", "down_proj.weight"});
}

TEST_CASE("Module::initialize is deterministic and independent of creation order") {
  UseRef use;
  nn::AttentionConfig c;
  c.dim = 8;
  c.num_heads = 2;
  c.qk_norm = true;
  nn::Attention a1(c);
  nn::GatedMLP between(8, 16);  // other modules created in between must not shift the streams
  nn::Linear between2(8, 8);
  between.initialize(99);
  nn::Attention a2(c);
  a2.initialize(5);  // initialised in the opposite order
  a1.initialize(5);
  auto p1 = a1.named_parameters(), p2 = a2.named_parameters();
  REQUIRE(p1.size() == p2.size());
  for (size_t i = 0; i < p1.size(); ++i) {
    CHECK(p1[i].first == p2[i].first);
    CHECK(p1[i].second.to_doubles() == p2[i].second.to_doubles());
  }
  // the same parameter name with the same seed gives the same values in a different module type
  nn::Linear l1(8, 8, false), l2(8, 8, false);
  l2.initialize(5);
  l1.initialize(5);
  CHECK(l1.weight.to_doubles() == l2.weight.to_doubles());
  // different names draw different streams; a different seed gives different values
  CHECK(p1[0].second.to_doubles() != p1[1].second.to_doubles());  // q_proj vs k_proj (same shape)
  a2.initialize(6);
  CHECK(p1[0].second.to_doubles() != a2.named_parameters()[0].second.to_doubles());
  // the init rules: Linear U(-1/sqrt(in), 1/sqrt(in)); RMSNorm ones
  for (double v : p1[0].second.to_doubles()) CHECK(std::fabs(v) <= 1.0 / std::sqrt(8.0) + 1e-7);
  for (double v : p1[4].second.to_doubles()) CHECK(v == 1.0);
  // initialize twice with one seed: identical
  const auto before = a1.named_parameters()[2].second.to_doubles();
  a1.initialize(5);
  CHECK(a1.named_parameters()[2].second.to_doubles() == before);
}
