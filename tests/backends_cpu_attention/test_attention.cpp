// test_attention.cpp — the cpu backend's fused attention (dew::cpu::attention_forward/backward) against a
// naive double-precision reference written here, straight from the AttentionParams comment in
// dew/backend.hpp: every config is run on every instruction-set path this CPU has (each has its own register
// blocking) at 1, 2 and 3 OpenMP threads (3 exercises the backward's split with per-thread dq buffers), and
// out, lse, dq, dk, dv must agree to 1e-4 (absolute).
// bf16 K/V under f32 q (a bf16 decode cache): on every instruction-set path this CPU runs, the forward equals
// the f32 kernel on the exactly widened K/V bit for bit (the decode row path widens in registers, a prefill
// widens once and takes the lane path), at 1 to 3 threads; k and v of two dtypes, and the backward, are refused.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention.hpp"
#include "dew/backend.hpp"
#include "dew/dtype.hpp"
#include "dew/error.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

using namespace dew;

namespace {

BackendPtr host() {
  static BackendPtr backend = [] {
    if (!Registry::global().contains(Backend::kind, "ref")) Registry::global().load(DEW_REF_PLUGIN_PATH);
    return create_backend("ref");
  }();
  return backend;
}

struct Config {
  std::string name;
  int64_t B, T, S, Hq, Hkv, D;
  bool causal;
  int64_t window;
  float softcap;
  int64_t q_offset;
  float scale = 0.0f;  // 0: 1 / sqrt(D)
};

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

// Naive attention in double, one query row at a time.
Ref reference(const Config& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& dout, double scale) {
  const int64_t G = c.Hq / c.Hkv, D = c.D;
  Ref r;
  r.out.assign(size_t(c.B * c.T * c.Hq * D), 0.0);
  r.lse.assign(size_t(c.B * c.Hq * c.T), -std::numeric_limits<double>::infinity());
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(size_t(c.B * c.S * c.Hkv * D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  std::vector<double> s(size_t(c.S)), th(size_t(c.S)), p(size_t(c.S));
  std::vector<char> vis(size_t(c.S));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t hk = h / G, pos = c.q_offset + t;
        const size_t qrow = size_t(((b * c.T + t) * c.Hq + h) * D);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < c.S; ++j) {
          vis[size_t(j)] = (!c.causal || j <= pos) && (c.window == 0 || pos - j < c.window);
          if (!vis[size_t(j)]) continue;
          const size_t krow = size_t(((b * c.S + j) * c.Hkv + hk) * D);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[qrow + size_t(d)]) * double(k[krow + size_t(d)]);
          double sc = scale * dot;
          if (c.softcap > 0) {
            th[size_t(j)] = std::tanh(sc / c.softcap);
            sc = c.softcap * th[size_t(j)];
          }
          s[size_t(j)] = sc;
          mx = std::max(mx, sc);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no visible key: zeros, -inf, no grads
        double l = 0;
        for (int64_t j = 0; j < c.S; ++j) l += vis[size_t(j)] ? std::exp(s[size_t(j)] - mx) : 0.0;
        const double lse = mx + std::log(l);
        r.lse[size_t((b * c.Hq + h) * c.T + t)] = lse;
        for (int64_t j = 0; j < c.S; ++j) p[size_t(j)] = vis[size_t(j)] ? std::exp(s[size_t(j)] - lse) : 0.0;
        for (int64_t j = 0; j < c.S; ++j) {
          if (!vis[size_t(j)]) continue;
          const size_t krow = size_t(((b * c.S + j) * c.Hkv + hk) * D);
          for (int64_t d = 0; d < D; ++d) r.out[qrow + size_t(d)] += p[size_t(j)] * v[krow + size_t(d)];
        }
        double di = 0;
        for (int64_t d = 0; d < D; ++d) di += double(dout[qrow + size_t(d)]) * r.out[qrow + size_t(d)];
        for (int64_t j = 0; j < c.S; ++j) {
          if (!vis[size_t(j)]) continue;
          const size_t krow = size_t(((b * c.S + j) * c.Hkv + hk) * D);
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += double(dout[qrow + size_t(d)]) * double(v[krow + size_t(d)]);
          double ds = p[size_t(j)] * (dp - di);
          if (c.softcap > 0) ds *= 1.0 - th[size_t(j)] * th[size_t(j)];
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qrow + size_t(d)] += scale * ds * k[krow + size_t(d)];
            r.dk[krow + size_t(d)] += scale * ds * q[qrow + size_t(d)];
            r.dv[krow + size_t(d)] += p[size_t(j)] * dout[qrow + size_t(d)];
          }
        }
      }
  return r;
}

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = u(gen);
  return x;
}

// Max |got - want| (infinite when a non-finite value disagrees); equal infinities count as 0.
double max_err(const Tensor& got_t, const std::vector<double>& want) {
  const std::vector<float> got = got_t.to_floats();
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (double(got[i]) != want[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= e)) e = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return e;
}

void run(const Config& c) {
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  const Shape qs{c.B, c.T, c.Hq, c.D}, ks{c.B, c.S, c.Hkv, c.D};
  const auto qv = random_vec(size_t(numel_of(qs)), 1), kv = random_vec(size_t(numel_of(ks)), 2),
             vv = random_vec(size_t(numel_of(ks)), 3), dov = random_vec(size_t(numel_of(qs)), 4);
  const Ref want = reference(c, qv, kv, vv, dov, scale);

  const BackendPtr be = host();
  const Tensor q = Tensor::from_vector(qv, qs, be), k = Tensor::from_vector(kv, ks, be),
               v = Tensor::from_vector(vv, ks, be), dout = Tensor::from_vector(dov, qs, be);
  AttentionParams p;
  p.scale = float(scale);
  p.causal = c.causal;
  p.window = c.window;
  p.softcap = c.softcap;
  p.q_offset = c.q_offset;

  const int saved = omp_get_max_threads();
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::portable})  // each path its own blocking
    for (int threads : {1, 2, 3}) {
      if (int(isa) > int(cpu::best_isa())) continue;  // a path this CPU lacks
      omp_set_num_threads(threads);
      Tensor out = Tensor::empty(qs, DType::f32, be), lse = Tensor::empty({c.B, c.Hq, c.T}, DType::f32, be);
      Tensor dq = Tensor::full(qs, 7.0, DType::f32, be), dk = Tensor::full(ks, 7.0, DType::f32, be),
             dv = Tensor::full(ks, 7.0, DType::f32, be);  // poisoned: the kernel must overwrite
      cpu::attention_forward(q, k, v, Tensor(), out, lse, p, isa);
      cpu::attention_backward(q, k, v, Tensor(), out, lse, dout, dq, dk, dv, p, isa);
      INFO(c.name, " isa=", std::string(cpu::isa_name(isa)), " threads=", threads);
      CHECK(max_err(out, want.out) < 1e-4);
      CHECK(max_err(lse, want.lse) < 1e-4);
      CHECK(max_err(dq, want.dq) < 1e-4);
      CHECK(max_err(dk, want.dk) < 1e-4);
      CHECK(max_err(dv, want.dv) < 1e-4);
    }
  omp_set_num_threads(saved);
}

}  // namespace

TEST_CASE("cpu attention: causal, T not a multiple of the 64 block") {
  run({"causal B2 T70 H3 D64", 2, 70, 70, 3, 3, 64, true, 0, 0.0f, 0});
  run({"causal B1 T200 H1 D64", 1, 200, 200, 1, 1, 64, true, 0, 0.0f, 0});
}

TEST_CASE("cpu attention: not causal, T != S, D = 16") {
  run({"full B2 T33 S50 H2 D16", 2, 33, 50, 2, 2, 16, false, 0, 0.0f, 0});
  run({"full B1 T130 S7 H2 D16", 1, 130, 7, 2, 2, 16, false, 0, 0.0f, 0});
}

TEST_CASE("cpu attention: grouped-query heads (Hq = 4, Hkv = 2)") {
  run({"gqa causal T100 D64", 2, 100, 100, 4, 2, 64, true, 0, 0.0f, 0});
  run({"gqa full T40 S90 D16", 1, 40, 90, 4, 2, 16, false, 0, 0.0f, 0});
  run({"mqa causal T80 H4/1 D64", 1, 80, 80, 4, 1, 64, true, 0, 0.0f, 0});
}

TEST_CASE("cpu attention: sliding window") {
  run({"window 3 causal T40 D16", 2, 40, 40, 2, 1, 16, true, 3, 0.0f, 0});
  run({"window 3 not causal T70 D64", 1, 70, 70, 2, 2, 64, false, 3, 0.0f, 0});
  run({"window 50 causal T150 D64", 1, 150, 150, 2, 2, 64, true, 50, 0.0f, 0});
}

TEST_CASE("cpu attention: softcap") {
  run({"softcap 5 causal T70 D64 scale 1", 1, 70, 70, 2, 2, 64, true, 0, 5.0f, 0, 1.0f});
  run({"softcap 5 full T20 S40 D16", 2, 20, 40, 4, 2, 16, false, 0, 5.0f, 0});
}

TEST_CASE("cpu attention: q_offset with T < S (prefill on a cache, decoding)") {
  run({"offset 70 T20 S90 gqa", 1, 20, 90, 4, 2, 64, true, 0, 0.0f, 70});
  run({"offset 120 T80 S200 window 64", 1, 80, 200, 2, 1, 64, true, 64, 0.0f, 120});
  run({"decode T1 S77", 2, 1, 77, 4, 2, 64, true, 0, 0.0f, 76});
  run({"decode T3 S77 window 20 softcap", 1, 3, 77, 2, 2, 16, true, 20, 5.0f, 74});
}

TEST_CASE("cpu attention: odd head width (D = 24, 40) and fully masked rows") {
  run({"D24 causal T65 S130 window 50", 1, 65, 130, 2, 2, 24, true, 50, 0.0f, 65});
  run({"D40 gqa full T19 S33", 1, 19, 33, 2, 1, 40, false, 0, 0.0f, 0});
  run({"negative offset: rows without keys", 1, 70, 70, 2, 2, 64, true, 0, 0.0f, -5});
  run({"decode with no key visible", 1, 2, 10, 2, 2, 16, true, 0, 0.0f, -1});
}

TEST_CASE("cpu attention: refuses non-f32 and mismatched shapes") {
  const BackendPtr be = host();
  AttentionParams p;
  Tensor q = Tensor::zeros({1, 4, 2, 8}, DType::f64, be), k = Tensor::zeros({1, 4, 2, 8}, DType::f64, be);
  Tensor out = Tensor::empty({1, 4, 2, 8}, DType::f64, be), lse = Tensor::empty({1, 2, 4}, DType::f32, be);
  CHECK_THROWS_AS(cpu::attention_forward(q, k, k, Tensor(), out, lse, p), Error);
  Tensor qf = Tensor::zeros({1, 4, 3, 8}, DType::f32, be), kf = Tensor::zeros({1, 4, 2, 8}, DType::f32, be);
  Tensor outf = Tensor::empty({1, 4, 3, 8}, DType::f32, be), lsef = Tensor::empty({1, 3, 4}, DType::f32, be);
  CHECK_THROWS_AS(cpu::attention_forward(qf, kf, kf, Tensor(), outf, lsef, p), Error);  // 3 heads over 2 kv heads
}

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// The bf16 K/V forward of `c` against the f32 forward on the same K/V widened: the same bits, on `isa`.
void run_bf16_kv(const Config& c, cpu::Isa isa) {
  const Shape qs{c.B, c.T, c.Hq, c.D}, ks{c.B, c.S, c.Hkv, c.D};
  const BackendPtr be = host();
  const Tensor q = Tensor::from_vector(random_vec(size_t(numel_of(qs)), 5), qs, be);
  // K/V drawn in f32, rounded to bf16 (Tensor::from_vector rounds nearest even), and widened back exactly.
  const Tensor k16 = Tensor::from_vector(random_vec(size_t(numel_of(ks)), 6), ks, be, DType::bf16);
  const Tensor v16 = Tensor::from_vector(random_vec(size_t(numel_of(ks)), 7), ks, be, DType::bf16);
  const Tensor k32 = Tensor::from_vector(k16.to_floats(), ks, be), v32 = Tensor::from_vector(v16.to_floats(), ks, be);
  AttentionParams p;
  p.scale = float(1.0 / std::sqrt(double(c.D)));
  p.causal = c.causal;
  p.window = c.window;
  p.softcap = c.softcap;
  p.q_offset = c.q_offset;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tensor out = Tensor::full(qs, 7.0, DType::f32, be), lse = Tensor::full({c.B, c.Hq, c.T}, 7.0, DType::f32, be);
    Tensor want = Tensor::empty(qs, DType::f32, be), want_lse = Tensor::empty({c.B, c.Hq, c.T}, DType::f32, be);
    cpu::attention_forward(q, k16, v16, Tensor(), out, lse, p, isa);
    cpu::attention_forward(q, k32, v32, Tensor(), want, want_lse, p, isa);
    INFO(c.name, " isa=", std::string(cpu::isa_name(isa)), " threads=", threads);
    CHECK(same_bits(out, want));
    CHECK(same_bits(lse, want_lse));
  }
  omp_set_num_threads(saved);
}

}  // namespace

TEST_CASE("cpu attention: bf16 K/V under f32 q equal the f32 kernel on the widened K/V, bit for bit, every path") {
  const std::vector<Config> cs = {
      {"decode T1 S77 gqa", 2, 1, 77, 4, 2, 64, true, 0, 0.0f, 76},
      {"decode T1 S300 mqa D24", 1, 1, 300, 4, 1, 24, true, 0, 0.0f, 299},
      {"decode T3 S40 window softcap D16", 1, 3, 40, 2, 2, 16, true, 20, 5.0f, 37},
      {"decode T4 S9 D40", 3, 4, 9, 2, 1, 40, true, 0, 0.0f, 5},
      {"prefill T20 S90 (lane path)", 1, 20, 90, 4, 2, 64, true, 0, 0.0f, 70},
      {"prefill T70 S70 not causal", 2, 70, 70, 2, 2, 16, false, 0, 0.0f, 0},
  };
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::portable}) {
    if (int(isa) > int(cpu::best_isa())) continue;  // a path this CPU lacks
    for (const Config& c : cs) run_bf16_kv(c, isa);
  }
  // The bf16 rows really are read as bf16: their bits reinterpreted as f32 would not give these values.
  const BackendPtr be = host();
  AttentionParams p;
  p.scale = 0.25f;
  p.q_offset = 7;
  const Shape qs{1, 1, 2, 16}, ks{1, 8, 2, 16};
  const Tensor q = Tensor::from_vector(random_vec(32, 8), qs, be);
  const Tensor k16 = Tensor::from_vector(random_vec(256, 9), ks, be, DType::bf16);
  const Tensor v16 = Tensor::from_vector(random_vec(256, 10), ks, be, DType::bf16);
  Tensor out = Tensor::empty(qs, DType::f32, be), lse = Tensor::empty({1, 2, 1}, DType::f32, be);
  cpu::attention_forward(q, k16, v16, Tensor(), out, lse, p);
  for (float o : out.to_floats()) CHECK(std::fabs(o) <= 1.0f);  // a convex mix of values in [-1, 1]
  // Refusals: k and v of two dtypes; bf16 K/V in the backward and max_logit; bf16 q over f32 K/V.
  const Tensor v32 = Tensor::from_vector(v16.to_floats(), ks, be);
  CHECK_THROWS_AS(cpu::attention_forward(q, k16, v32, Tensor(), out, lse, p), Error);
  Tensor dq = Tensor::empty(qs, DType::f32, be), dk = Tensor::empty(ks, DType::f32, be),
         dv = Tensor::empty(ks, DType::f32, be);
  CHECK_THROWS_AS(cpu::attention_backward(q, k16, v16, Tensor(), out, lse, out, dq, dk, dv, p), Error);
  Tensor heads = Tensor::empty({2}, DType::f32, be);
  CHECK_THROWS_AS(cpu::attention_max_logit(q, k16, Tensor(), heads, p), Error);
  const Tensor q16 = Tensor::from_vector(random_vec(32, 8), qs, be, DType::bf16);
  CHECK_THROWS_AS(cpu::attention_forward(q16, v32, v32, Tensor(), out, lse, p), Error);
}

// Row tasks (T <= 4) walk a group of query heads together, as many heads per task as the thread count allows
// (at most 16): the grouping must change no bit, and more than 16 heads split into several groups.
TEST_CASE("cpu attention: row tasks over head groups, the same bits at every thread count") {
  run({"decode T1 S150 H20/5 (two head groups at 1 thread)", 1, 1, 150, 20, 5, 64, true, 0, 0.0f, 149});
  run({"decode T2 B3 S40 H6 D24", 3, 2, 40, 6, 6, 24, true, 0, 0.0f, 38});
  const BackendPtr be = host();
  for (DType kv : {DType::f32, DType::bf16}) {
    const Shape qs{2, 1, 20, 64}, ks{2, 150, 5, 64};
    const Tensor q = Tensor::from_vector(random_vec(size_t(numel_of(qs)), 11), qs, be);
    const Tensor k = Tensor::from_vector(random_vec(size_t(numel_of(ks)), 12), ks, be, kv);
    const Tensor v = Tensor::from_vector(random_vec(size_t(numel_of(ks)), 13), ks, be, kv);
    AttentionParams p;
    p.scale = 0.125f;
    p.q_offset = 120;
    const int saved = omp_get_max_threads();
    Tensor first_out, first_lse;
    for (int threads : {1, 2, 3, 5, 40}) {  // 40 threads: one head per task
      omp_set_num_threads(threads);
      Tensor out = Tensor::full(qs, 7.0, DType::f32, be), lse = Tensor::full({2, 20, 1}, 7.0, DType::f32, be);
      cpu::attention_forward(q, k, v, Tensor(), out, lse, p);
      if (threads == 1) {
        first_out = out;
        first_lse = lse;
        continue;
      }
      INFO(dtype_name(kv), " threads=", threads);
      CHECK(same_bits(out, first_out));
      CHECK(same_bits(lse, first_lse));
    }
    omp_set_num_threads(saved);
  }
}
