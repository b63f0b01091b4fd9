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
#include <map>
#include <set>

#include "dew/options.hpp"
#include "dew/random.hpp"
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

TEST_CASE("rope gradcheck in double under each rotary scaling (linear, llama3, yarn), partial and whole heads") {
  UseRef use;
  dew::RopeScaling linear, llama3, yarn;
  linear.kind = dew::RopeScalingKind::linear, linear.factor = 4;
  llama3.kind = dew::RopeScalingKind::llama3, llama3.factor = 8, llama3.original_max_position = 64;
  yarn.kind = dew::RopeScalingKind::yarn, yarn.factor = 4, yarn.original_max_position = 256, yarn.truncate = false;
  Tensor pos = ints({0, 7, 61, 300}, {4});
  for (const dew::RopeScaling& s : {linear, llama3, yarn})
    for (int64_t rd : {int64_t(0), int64_t(4)}) {
      Tensor x = rnd({2, 4, 3, 8}, 11);
      gradcheck([&](const V& in) { return dew::rope(in[0], pos, 100.0f, rd, s); }, V{x},
                std::string("rope ") + dew::rope_scaling_name(s.kind));
      // Scaling changes the rotation (the test would pass on an implementation that ignored it otherwise).
      Tensor plain = dew::rope(x, pos, 100.0f, rd), scaled = dew::rope(x, pos, 100.0f, rd, s);
      double diff = 0;
      const auto a = plain.to_floats(), b = scaled.to_floats();
      for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i])));
      CHECK(diff > 1e-3);
    }
  dew::RopeScaling bad = llama3;
  bad.high_freq_factor = 0.5;
  CHECK_THROWS_WITH(dew::rope(rnd({1, 2, 1, 4}, 3), ints({0, 1}, {2}), 100.0f, 0, bad),
                    doctest::Contains("low_freq_factor < high_freq_factor"));
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

namespace {
// A third-party style module: its constructor makes a buffer before its first parameter.
class BufferFirst : public nn::Module {
 public:
  BufferFirst() {
    positions = Tensor::zeros({4}, dtype_, backend_);  // a buffer, made before any parameter
    weight = register_parameter("weight", {4}, nn::Init::Ones());
  }
  Tensor positions, weight;
};
struct RestoreDefault {
  ~RestoreDefault() { dew::set_default_backend(ref()); }
};
}  // namespace

TEST_CASE("Module: the backend is known from construction (a buffer before the first parameter)") {
  UseRef use;
  BufferFirst m;
  CHECK(m.backend() == ref());
  CHECK(m.positions.backend_ptr() == ref());
  CHECK(m.weight.backend_ptr() == ref());
  // Without a default backend a module still constructs when it makes no tensor, and refuses with the
  // hint as soon as it needs one.
  RestoreDefault restore;
  dew::set_default_backend(nullptr);
  CHECK_FALSE(dew::has_default_backend());
  nn::ModuleDict empty;
  CHECK_THROWS_WITH_AS(empty.backend(), doctest::Contains("no default backend is set"), dew::Error);
  CHECK_THROWS_WITH_AS(nn::Linear(2, 2), doctest::Contains("no default backend is set"), dew::Error);
  // A module keeps the backend it was made with when the default changes afterwards.
  dew::set_default_backend(ref());
  BufferFirst kept;
  const BackendPtr other = dew::create_backend("ref");
  dew::set_default_backend(other);
  CHECK(kept.backend() == ref());
  BufferFirst fresh;
  CHECK(fresh.backend() == other);
  CHECK(fresh.positions.backend_ptr() == other);
}

TEST_CASE("Module: a child registered without a name joins its parent's namespace") {
  UseRef use;
  struct Block : nn::Module {
    Block() {
      register_module("norm", std::make_shared<nn::LayerNorm>(4));
      register_module("", std::make_shared<nn::MLP>(4, 8));
    }
  };
  struct Outer : nn::Module {
    Outer() { register_module("blocks.0", std::make_shared<Block>()); }
  } outer;
  std::vector<std::string> names;
  for (auto& [n, t] : outer.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.0.fc1.weight",
                                          "blocks.0.fc1.bias", "blocks.0.fc2.weight", "blocks.0.fc2.bias"});
  // initialize() hashes the full names: fc1.weight here draws like a top-level "blocks.0.fc1.weight"
  outer.initialize(3);
  struct Named : nn::Module {
    explicit Named(std::shared_ptr<nn::Linear> l) { register_module("blocks.0.fc1", std::move(l)); }
  };
  auto l = std::make_shared<nn::Linear>(4, 8);
  Named named(l);
  named.initialize(3);
  CHECK(outer.named_parameters()[2].second.to_doubles() == l->weight.to_doubles());
}

TEST_CASE("nn::Attention: per-projection init rules, output bias, norm eps and offset") {
  UseRef use;
  nn::AttentionConfig c;
  c.dim = 8;
  c.num_heads = 2;
  c.qk_norm = true;
  c.norm_eps = 1e-5f;
  c.norm_offset = 1.0f;
  c.bias = true;
  c.o_bias = true;
  c.init = {nn::Init::Constant(0.5f), nn::Init::Constant(-1.0f), nn::Init::Constant(2.0f), nn::Init::Constant(3.0f)};
  nn::Attention a(c);
  a.initialize(7);
  std::map<std::string, Tensor> p;
  for (auto& [n, t] : a.named_parameters()) p[n] = t;
  CHECK(p.size() == 10);
  for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight"})
    for (double v : p.at(n).to_doubles()) CHECK(v == 0.5);
  for (const char* n : {"q_proj.bias", "k_proj.bias", "v_proj.bias"})
    for (double v : p.at(n).to_doubles()) CHECK(v == -1.0);
  for (double v : p.at("o_proj.weight").to_doubles()) CHECK(v == 2.0);
  for (double v : p.at("o_proj.bias").to_doubles()) CHECK(v == 3.0);
  for (double v : p.at("q_norm.weight").to_doubles()) CHECK(v == 0.0);  // offset 1: w starts at 0
  CHECK(a.q_norm->eps == 1e-5f);
  CHECK(a.k_norm->weight_offset == 1.0f);
  // the output bias is applied: the block equals its composition with ops
  Tensor x = rnd({2, 3, 8}, 60);
  Tensor pos = ints({0, 1, 2}, {3});
  V w = {like(a.q_proj->weight, 61), like(a.q_proj->bias, 62), like(a.k_proj->weight, 63), like(a.k_proj->bias, 64),
         like(a.v_proj->weight, 65), like(a.v_proj->bias, 66), like(a.o_proj->weight, 67), like(a.o_proj->bias, 68),
         rnd({4}, 69, -0.5, 0.5),    rnd({4}, 70, -0.5, 0.5)};
  a.q_proj->weight = w[0], a.q_proj->bias = w[1], a.k_proj->weight = w[2], a.k_proj->bias = w[3];
  a.v_proj->weight = w[4], a.v_proj->bias = w[5], a.o_proj->weight = w[6], a.o_proj->bias = w[7];
  a.q_norm->weight = w[8], a.k_norm->weight = w[9];
  Tensor q = dew::reshape(dew::linear(x, w[0], w[1]), {2, 3, 2, 4});
  Tensor k = dew::reshape(dew::linear(x, w[2], w[3]), {2, 3, 2, 4});
  Tensor v = dew::reshape(dew::linear(x, w[4], w[5]), {2, 3, 2, 4});
  q = dew::rope(dew::rms_norm(q, w[8], 1e-5f, 1.0f), pos, c.rope_theta);
  k = dew::rope(dew::rms_norm(k, w[9], 1e-5f, 1.0f), pos, c.rope_theta);
  dew::AttentionParams ap;
  ap.scale = 0.5f;
  Tensor o = dew::linear(dew::reshape(dew::attention(q, k, v, ap), {2, 3, 8}), w[6], w[7]);
  check_close(a.forward(x, pos), o, 1e-13, 1e-12, "nn::Attention with o_bias vs ops");
}

TEST_CASE("nn::Attention: the fused layout equals the separate one, gradcheck with rope and GQA") {
  UseRef use;
  for (bool gqa : {false, true}) {
    CAPTURE(gqa);
    nn::AttentionConfig c;
    c.dim = 8;
    c.num_heads = 2;
    c.num_kv_heads = gqa ? 1 : 2;
    c.causal = false;
    c.rotary_dim = gqa ? 0 : -1;  // no rope and equal heads: the projection runs inside qkv_attention
    c.bias = c.o_bias = true;
    nn::Attention sep(c);
    c.layout = nn::AttentionLayout::fused;
    nn::Attention fus(c);
    std::vector<std::string> names;
    for (auto& [n, t] : fus.named_parameters()) names.push_back(n);
    CHECK(names == std::vector<std::string>{"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"});
    const int64_t dkv = c.num_kv_heads * 4;
    CHECK(fus.qkv->weight.shape() == dew::Shape{8 + 2 * dkv, 8});
    V w = {like(sep.q_proj->weight, 71), like(sep.q_proj->bias, 72),   like(sep.k_proj->weight, 73),
           like(sep.k_proj->bias, 74),   like(sep.v_proj->weight, 75), like(sep.v_proj->bias, 76),
           like(sep.o_proj->weight, 77), like(sep.o_proj->bias, 78)};
    sep.q_proj->weight = w[0], sep.q_proj->bias = w[1], sep.k_proj->weight = w[2], sep.k_proj->bias = w[3];
    sep.v_proj->weight = w[4], sep.v_proj->bias = w[5], sep.o_proj->weight = w[6], sep.o_proj->bias = w[7];
    fus.qkv->weight = dew::concat({w[0], w[2], w[4]}, 0);
    fus.qkv->bias = dew::concat({w[1], w[3], w[5]}, 0);
    fus.o_proj->weight = w[6];
    fus.o_proj->bias = w[7];
    Tensor x = rnd({2, 5, 8}, 79);
    Tensor pos = ints({0, 1, 2, 3, 4}, {5});
    check_close(fus.forward(x, pos), sep.forward(x, pos), 1e-13, 1e-12, "fused vs separate layout");
    gradcheck(
        [&fus, pos](const V& in) {
          fus.qkv->weight = in[1];
          fus.qkv->bias = in[2];
          fus.o_proj->weight = in[3];
          fus.o_proj->bias = in[4];
          return fus.forward(in[0], pos);
        },
        {x, like(fus.qkv->weight, 80), like(fus.qkv->bias, 81), like(fus.o_proj->weight, 82),
         like(fus.o_proj->bias, 83)},
        "nn::Attention fused layout");
  }
}

TEST_CASE("nn::Attention: the KV-cache and slot-cache paths equal the full forward (q_offset)") {
  UseRef use;
  for (auto layout : {nn::AttentionLayout::separate, nn::AttentionLayout::fused}) {
    nn::AttentionConfig c;
    c.dim = 8;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.qk_norm = true;
    c.window = 3;
    c.softcap = 4.0f;
    c.layout = layout;
    nn::Attention a(c);
    a.initialize(11);
    dew::NoGradGuard ng;
    const int64_t t = 6;
    Tensor x = dew::cast(rnd({2, t, 8}, 84), DType::f32);
    std::vector<int32_t> pv;
    for (int32_t i = 0; i < t; ++i) pv.push_back(i);
    const Tensor full = a.forward(x, ints(pv, {t}));
    // batch 2 through one cache: a prefill of 4, then one token at a time
    Tensor kc = Tensor::zeros({2, t, 2, 2}, DType::f32, ref()), vc = Tensor::zeros({2, t, 2, 2}, DType::f32, ref());
    std::vector<Tensor> steps{a.forward_cached(dew::slice(x, 1, 0, 4), ints({0, 1, 2, 3}, {4}), kc, vc, 0)};
    for (int32_t i = 4; i < t; ++i)
      steps.push_back(a.forward_cached(dew::slice(x, 1, i, i + 1), ints({i}, {1}), kc, vc, i));
    check_close(dew::concat(steps, 1), full, 1e-6, 1e-5, "forward_cached vs forward");
    // slots: row 0 in slot 1 and row 1 in slot 0 after prefills of different lengths, then one step each
    Tensor ks = Tensor::zeros({3, t, 2, 2}, DType::f32, ref()), vs = Tensor::zeros({3, t, 2, 2}, DType::f32, ref());
    Tensor k1 = ks.slice0(1, 2), v1 = vs.slice0(1, 2), k0 = ks.slice0(0, 1), v0 = vs.slice0(0, 1);
    a.forward_cached(dew::slice(x.slice0(0, 1), 1, 0, 3), ints({0, 1, 2}, {3}), k1, v1, 0);
    a.forward_cached(dew::slice(x.slice0(1, 2), 1, 0, 5), ints({0, 1, 2, 3, 4}, {5}), k0, v0, 0);
    const Tensor xs = dew::concat({dew::slice(x.slice0(0, 1), 1, 3, 4), dew::slice(x.slice0(1, 2), 1, 5, 6)}, 0);
    const Tensor got = a.forward_slots(xs, ints({3, 5}, {2, 1}), ks, vs, {1, 0}, {3, 5});
    const Tensor want =
        dew::concat({dew::slice(full.slice0(0, 1), 1, 3, 4), dew::slice(full.slice0(1, 2), 1, 5, 6)}, 0);
    check_close(got, want, 1e-6, 1e-5, "forward_slots vs forward");
    CHECK_THROWS_WITH_AS(a.forward_cached(dew::slice(x, 1, 0, 2), ints({5, 6}, {2}), kc, vc, 5),
                         doctest::Contains("cannot take 2 positions at 5"), dew::Error);
  }
}

namespace {
std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  t.copy_to_host(b.data());
  return b;
}
}  // namespace

// A bf16 K/V cache under f32 activations (CausalDecoder::set_cache_dtype): each key and value is rounded once,
// nearest even, as it is appended, so the cache holds exactly the f32 cache's contents cast to bf16 (not
// truncated, not at other positions, not left unrounded); and the queries read the cache as stored: a step's
// output is attention over the exactly widened cache, bit for bit, and within eps/2 (eps = 2^-7, bf16's
// epsilon: K and V's own relative rounding) of the largest output of the f32 cache (measured: 0.24 eps), never
// equal to it (the rounding is real).
TEST_CASE("nn::Attention: a bf16 K/V cache holds the keys and values rounded once and is read as stored") {
  UseRef use;
  nn::AttentionConfig c;
  c.dim = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;  // head_dim 8
  nn::Attention a(c);
  a.initialize(12);
  dew::NoGradGuard ng;
  const int64_t t = 7, hd = 8;
  const Tensor x = dew::cast(rnd({2, t, 32}, 85), DType::f32);
  auto cache = [&](DType dt) { return Tensor::zeros({2, t, 2, hd}, dt, ref()); };
  Tensor k32 = cache(DType::f32), v32 = cache(DType::f32), k16 = cache(DType::bf16), v16 = cache(DType::bf16);
  auto feed = [&](Tensor& kc, Tensor& vc, int32_t from, int32_t to) {  // tokens [from, to) after `from` cached
    std::vector<int32_t> pos;
    for (int32_t i = from; i < to; ++i) pos.push_back(i);
    return a.forward_cached(dew::slice(x, 1, from, to), ints(pos, {to - from}), kc, vc, from);
  };
  std::vector<Tensor> o32{feed(k32, v32, 0, 4)}, o16{feed(k16, v16, 0, 4)};  // a prefill, then single tokens
  for (int32_t i = 4; i < t; ++i) {
    o32.push_back(feed(k32, v32, i, i + 1));
    o16.push_back(feed(k16, v16, i, i + 1));
  }
  CHECK(k16.dtype() == DType::bf16);
  CHECK(bytes_of(k16) == bytes_of(dew::cast(k32, DType::bf16)));
  CHECK(bytes_of(v16) == bytes_of(dew::cast(v32, DType::bf16)));
  // The last step read the cache as stored: its query over the widened cache gives the same bits.
  auto [q, k_new, v_new] = a.project(dew::slice(x, 1, t - 1, t), ints({int32_t(t - 1)}, {1}));
  dew::AttentionParams p = a.params();
  p.q_offset = t - 1;
  const Tensor o = dew::attention(q, dew::cast(k16, DType::f32), dew::cast(v16, DType::f32), p);
  CHECK(bytes_of(o16.back()) == bytes_of(a.o_proj->forward(dew::reshape(o, {2, 1, 32}))));
  // Near the f32 cache: K and V carry a relative error of at most eps/2; so do the outputs, relative to the
  // largest one, and they differ.
  const double eps = 1.0 / 128.0;
  double worst = 0, largest = 0;
  for (size_t i = 0; i < o32.size(); ++i) {
    const std::vector<float> f = o32[i].to_floats(), h = o16[i].to_floats();
    for (size_t j = 0; j < f.size(); ++j) {
      worst = std::max(worst, std::fabs(double(f[j]) - double(h[j])));
      largest = std::max(largest, std::fabs(double(f[j])));
    }
  }
  CAPTURE(worst / (eps * largest));
  CHECK(worst > 0);
  CHECK(worst <= 0.5 * eps * largest);
  // Gradients never flow through a bf16 cache.
  dew::EnableGradGuard grad;
  Tensor qg = dew::cast(rnd({2, 1, 4, hd}, 86), DType::f32);
  qg.set_requires_grad(true);
  CHECK_THROWS_AS(dew::attention(qg, k16, v16, p), dew::Error);
}

TEST_CASE("nn::GatedMLP and nn::MLP: init rules, gated = false is down(act(up(x)))") {
  UseRef use;
  nn::ProjectionInit init{nn::Init::Constant(0.25f), nn::Init::Constant(1.0f), nn::Init::Constant(-0.5f),
                          nn::Init::Constant(2.0f)};
  nn::GatedMLP plain(4, 6, dew::Activation::gelu_tanh, true, init, false);
  std::vector<std::string> names;
  for (auto& [n, t] : plain.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"up_proj.weight", "up_proj.bias", "down_proj.weight", "down_proj.bias"});
  plain.initialize(1);
  for (double v : plain.up_proj->weight.to_doubles()) CHECK(v == 0.25);
  for (double v : plain.down_proj->bias.to_doubles()) CHECK(v == 2.0);
  V p = {like(plain.up_proj->weight, 90), like(plain.up_proj->bias, 91), like(plain.down_proj->weight, 92),
         like(plain.down_proj->bias, 93)};
  Tensor x = rnd({2, 3, 4}, 94);
  gradcheck(
      [&plain](const V& in) {
        plain.up_proj->weight = in[1];
        plain.up_proj->bias = in[2];
        plain.down_proj->weight = in[3];
        plain.down_proj->bias = in[4];
        return plain.forward(in[0]);
      },
      {x, p[0], p[1], p[2], p[3]}, "GatedMLP gated = false");
  check_close(plain.forward(x),
              dew::linear(dew::activation(dew::linear(x, p[0], p[1]), dew::Activation::gelu_tanh), p[2], p[3]), 1e-13,
              1e-12, "GatedMLP gated = false vs ops");
  nn::MLP mlp(4, 6, 3, dew::Activation::silu, true, init);
  mlp.initialize(1);
  for (double v : mlp.fc1->bias.to_doubles()) CHECK(v == 1.0);
  for (double v : mlp.fc2->weight.to_doubles()) CHECK(v == -0.5);
  CHECK(mlp.fc2->weight.shape() == dew::Shape{3, 6});
  // Init::XavierUniform is U(+-sqrt(6 / (fan_in + fan_out)))
  nn::Linear xl(40, 10, false, nn::Init::XavierUniform(40, 10));
  xl.initialize(2);
  double m = 0;
  for (double v : xl.weight.to_doubles()) m = std::max(m, std::fabs(v));
  CHECK(m <= std::sqrt(6.0 / 50.0));
  CHECK(m > 0.9 * std::sqrt(6.0 / 50.0));
}

TEST_CASE("nn::TimestepEmbedder and the time features: DiT's names, frequencies, options") {
  UseRef use;
  nn::TimeEmbeddingConfig c;
  c.freq_dim = 8;
  c.min_freq = 1e-4;
  c.max_freq = 1.0;
  const std::vector<float> f = c.frequencies();
  REQUIRE(f.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(f[i] == float(std::exp(-std::log(1e4) * double(i) / 4.0)));
  nn::TimestepEmbedder te(c, 6, 5);
  std::vector<std::string> names;
  for (auto& [n, t] : te.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"});
  CHECK(te.flops() == 2 * (8 * 6 + 6 * 5));
  const Tensor t = Tensor::from_vector({0.5f, 250.0f}, {2}, ref());
  CHECK(te.forward(t).shape() == dew::Shape{2, 5});
  // fourier: 2 pi scale N(0, 1) frequencies, fixed by the seed
  nn::TimeEmbeddingConfig fc;
  fc.kind = "fourier";
  fc.freq_dim = 6;
  fc.fourier_scale = 3.0;
  const std::vector<float> ff = fc.frequencies();
  const uint64_t stream = dew::philox::stream_of("time_embedding.fourier");
  for (size_t i = 0; i < ff.size(); ++i)
    CHECK(ff[i] == float(6.283185307179586 * 3.0 * dew::philox::normal(0, stream, i)));
  fc.seed = 1;
  CHECK(fc.frequencies() != ff);
  check_close(nn::fourier_features(t, 3, 3.0f, 0), nn::time_features(t, ff, DType::f32), 0, 0, "fourier_features");
  // options
  dew::Options o({{"time_embedding", "fourier"}, {"time_freq_dim", "12"}}, "model");
  const nn::TimeEmbeddingConfig oc = nn::TimeEmbeddingConfig::from_options(o);
  CHECK(oc.kind == "fourier");
  CHECK(oc.freq_dim == 12);
  CHECK(oc.describe().at("time_freq_dim") == "12");
  CHECK(nn::TimeEmbeddingConfig::option_specs().size() == 5);
  dew::Options bad({{"time_freq_dim", "7"}}, "model");
  CHECK_THROWS_WITH_AS(nn::TimeEmbeddingConfig::from_options(bad), doctest::Contains("time_freq_dim"), dew::UsageError);
}
