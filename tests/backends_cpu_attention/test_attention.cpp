// test_attention.cpp — the cpu backend's fused attention (dew::cpu::attention_forward/backward) against a
// naive double-precision reference written here, straight from the AttentionParams comment in
// dew/backend.hpp: every config is run on every instruction-set path this CPU has (each has its own register
// blocking) at 1, 2 and 3 OpenMP threads (3 exercises the backward's split with per-thread dq buffers), and
// out, lse, dq, dk, dv must agree to 1e-4 (absolute).
// bf16 K/V under f32 q (a bf16 decode cache): on every instruction-set path this CPU runs, the forward equals
// the f32 kernel on the exactly widened K/V bit for bit (the decode row path widens in registers, a prefill
// widens once and takes the lane path), at 1 to 3 threads; k and v of two dtypes, and the backward, are refused.
// bf16 q, k, v on AVX512-BF16 (attention_bf16.cpp's vdpbf16ps kernels): against the reference on the bf16-rounded
// inputs within bounds in bf16 epsilons (see that section), the same bits at 1 to 3 threads; their f32-output (medium)
// form rounds to the bf16 outputs bit for bit; skipped without the ISA.
// attention_slots (a decode step over a slot cache): each row equal to attention_forward alone on its slot's prefix.
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
#include "attention_bf16.hpp"
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
// seg: segment ids [B, S] (packed documents: a key is also hidden unless its segment equals the query's and that
// is not 0), or nullptr.
Ref reference(const Config& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& dout, double scale, const std::vector<int32_t>* seg = nullptr) {
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
          if (seg) {
            const int32_t qs = (*seg)[size_t(b * c.S + pos)], ks = (*seg)[size_t(b * c.S + j)];
            vis[size_t(j)] = vis[size_t(j)] && qs == ks && qs != 0;
          }
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
  // the row path's P V sums held in registers, HC heads at a time over blocks of 32 positions (D = 32, 64, 128):
  // chunks of heads that are whole and partial, position counts that are not a multiple of the block
  run({"decode T1 S150 H6 D64", 1, 1, 150, 6, 6, 64, true, 0, 0.0f, 149});
  run({"decode T1 S100 H12/3 D32 window 70", 2, 1, 100, 12, 3, 32, true, 70, 0.0f, 99});
  run({"decode T2 S130 H6/2 D128 softcap", 1, 2, 130, 6, 2, 128, true, 0, 5.0f, 120});
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

// attention_slots (a server's decode step: rows on their own slots and positions, one call): each row's out equals
// attention_forward on that row alone over a copy of its slot's first position + 1 keys, bit for bit, on every path
// this CPU has and at 1 to 3 threads (enough K/V that 2 and 3 threads split the rows' tasks); the caches change only
// at the rows written, which hold k_new / v_new exactly; f32 and bf16 caches; misuse refused.
namespace {

struct SlotsConfig {
  std::string name;
  int64_t n_slots, C, Hq, Hkv, D;
  std::vector<int64_t> slots, positions;
  int64_t window = 0;
  float softcap = 0.0f;
};

void run_slots(const SlotsConfig& c, DType kv, cpu::Isa isa) {
  const BackendPtr be = host();
  const int64_t n = int64_t(c.slots.size()), row = c.Hkv * c.D;
  const Shape qs{n, 1, c.Hq, c.D}, news{n, 1, c.Hkv, c.D}, caches{c.n_slots, c.C, c.Hkv, c.D};
  const Tensor q = Tensor::from_vector(random_vec(size_t(numel_of(qs)), 21), qs, be);
  const Tensor k_new = Tensor::from_vector(random_vec(size_t(numel_of(news)), 22), news, be, kv);
  const Tensor v_new = Tensor::from_vector(random_vec(size_t(numel_of(news)), 23), news, be, kv);
  const std::vector<float> k0 = random_vec(size_t(numel_of(caches)), 24), v0 = random_vec(size_t(numel_of(caches)), 25);
  AttentionParams p;
  p.scale = float(1.0 / std::sqrt(double(c.D)));
  p.window = c.window;
  p.softcap = c.softcap;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    INFO(c.name, " ", dtype_name(kv), " isa=", std::string(cpu::isa_name(isa)), " threads=", threads);
    Tensor k_cache = Tensor::from_vector(k0, caches, be, kv), v_cache = Tensor::from_vector(v0, caches, be, kv);
    const std::vector<float> k_before = k_cache.to_floats(), v_before = v_cache.to_floats();
    Tensor out = Tensor::full(qs, 7.0, DType::f32, be);
    check_attention_slots(q, k_new, v_new, c.slots, c.positions, k_cache, v_cache, out, "test");
    cpu::attention_slots_forward(q, k_new, v_new, c.slots, c.positions, k_cache, v_cache, out, p, isa);
    // The caches: the written rows hold the new rows, every other element is as it was.
    std::vector<float> k_want = k_before, v_want = v_before;
    const std::vector<float> kn = k_new.to_floats(), vn = v_new.to_floats();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < row; ++e) {
        const size_t at = size_t((c.slots[size_t(i)] * c.C + c.positions[size_t(i)]) * row + e);
        k_want[at] = kn[size_t(i * row + e)];
        v_want[at] = vn[size_t(i * row + e)];
      }
    const std::vector<float> k_after = k_cache.to_floats(), v_after = v_cache.to_floats();
    CHECK(std::memcmp(k_after.data(), k_want.data(), k_want.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(v_after.data(), v_want.data(), v_want.size() * sizeof(float)) == 0);
    // Each row against attention_forward alone on a copy of its slot's prefix.
    const std::vector<float> got = out.to_floats();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = c.slots[size_t(i)], len = c.positions[size_t(i)] + 1;
      const Shape ps{1, len, c.Hkv, c.D}, q1s{1, 1, c.Hq, c.D};
      const auto prefix = [&](const std::vector<float>& cache) {
        const auto begin = cache.begin() + slot * c.C * row;
        return Tensor::from_vector(std::vector<float>(begin, begin + len * row), ps, be, kv);  // exact: bf16 values
      };
      const std::vector<float> qv = q.to_floats();
      const Tensor q1 = Tensor::from_vector(
          std::vector<float>(qv.begin() + i * c.Hq * c.D, qv.begin() + (i + 1) * c.Hq * c.D), q1s, be);
      Tensor want = Tensor::empty(q1s, DType::f32, be), lse = Tensor::empty({1, c.Hq, 1}, DType::f32, be);
      AttentionParams solo = p;
      solo.q_offset = len - 1;
      cpu::attention_forward(q1, prefix(k_after), prefix(v_after), Tensor(), want, lse, solo, isa);
      const std::vector<float> w = want.to_floats();
      INFO("row ", i, " slot ", slot, " position ", len - 1);
      CHECK(std::memcmp(got.data() + i * c.Hq * c.D, w.data(), w.size() * sizeof(float)) == 0);
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace

TEST_CASE("cpu attention_slots: each row the bits of attention alone over its slot's prefix, every path, 1-3 threads") {
  const std::vector<SlotsConfig> cs = {
      {"gqa, rows out of slot order, position 0 and the last", 6, 300, 8, 2, 64, {4, 1, 5, 0, 2}, {299, 0, 150, 77, 1}},
      {"window softcap D24", 4, 90, 4, 1, 24, {2, 0, 3}, {89, 30, 5}, 16, 5.0f},
      {"one row, 20 heads (two head groups)", 3, 200, 20, 5, 64, {2}, {180}},
  };
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::portable}) {
    if (int(isa) > int(cpu::best_isa())) continue;
    for (const SlotsConfig& c : cs)
      for (DType kv : {DType::f32, DType::bf16}) run_slots(c, kv, isa);
  }
  // Misuse: a slot twice, a slot or a position outside the cache, rows and positions of two lengths.
  const BackendPtr be = host();
  const Tensor q = Tensor::zeros({2, 1, 2, 16}, DType::f32, be), kn = Tensor::zeros({2, 1, 2, 16}, DType::f32, be);
  Tensor kc = Tensor::zeros({3, 8, 2, 16}, DType::f32, be), vc = Tensor::zeros({3, 8, 2, 16}, DType::f32, be);
  Tensor out = Tensor::empty({2, 1, 2, 16}, DType::f32, be);
  CHECK_THROWS_AS(check_attention_slots(q, kn, kn, {1, 1}, {0, 1}, kc, vc, out, "test"), Error);
  CHECK_THROWS_AS(check_attention_slots(q, kn, kn, {1, 3}, {0, 1}, kc, vc, out, "test"), Error);
  CHECK_THROWS_AS(check_attention_slots(q, kn, kn, {1, 2}, {0, 8}, kc, vc, out, "test"), Error);
  CHECK_THROWS_AS(check_attention_slots(q, kn, kn, {1, 2}, {0}, kc, vc, out, "test"), Error);
  const Tensor kn16 = Tensor::zeros({2, 1, 2, 16}, DType::bf16, be);
  CHECK_THROWS_AS(check_attention_slots(q, kn16, kn16, {1, 2}, {0, 1}, kc, vc, out, "test"), Error);  // new rows' dtype
  CHECK_NOTHROW(check_attention_slots(q, kn, kn, {2, 0}, {7, 0}, kc, vc, out, "test"));
}

// ---------------------------------------------------------------- bf16 on vdpbf16ps (attention_bf16.cpp)
//
// The kernel against the double reference of attention on the bf16-rounded inputs (q, k, v, dout rounded to bf16,
// then exact arithmetic). Its products are exact bf16 x bf16 products summed in f32 (~1e-6 relative), so the error
// is the bf16 roundings (eps = 2^-8; one rounding is at most eps / 2 relative):
//   out = sum_j P_j V_j / l with each P_j rounded to bf16 as a product operand (each term off by <= eps / 2
//     relative, |sum of errors| <= eps / 2 * max |V| since the P_j / l sum to 1), then out rounded once (eps / 2 of
//     |out| <= max |V|): |error| <= eps * max |V| = eps here (V in [-1, 1]), plus f32 sums and exp (~1e-6): checked
//     absolute at 1.01 eps.
//   lse: f32 from f32 scores: 1e-4 (the f32 kernel's tolerance).
//   dv = sum_i P_ij dO_i: P rounded (eps / 2 per term) and dv rounded once; dk = sum_i dS_ij Q_i and
//     dq = sum_j dS_ij K_j with dS = P (dP - Dsum) computed in f32 and rounded once as an operand, Dsum computed
//     from the rounded out (the reference's from the exact one): a few eps / 2 per term. The terms have
//     mixed signs, so the error is measured against the tensor's largest |want| (its scale): err <= 4 eps max |want|.
//     (Measured on a Zen 5: 0.6-1.6 eps; the MESSAGE lines print it.)
// Every check runs at 1, 2 and 3 threads, and the results must be the same bits at every thread count (tasks own
// their outputs). The widened path (the f32 kernel on the widened inputs, rounded once: today's fallback) must agree
// with the fast path within the same tolerance.
namespace {

constexpr double kBf16Eps = 1.0 / 256.0;

struct Bf16Case {
  Config c;
  int64_t doc_len = 0;  // > 0: packed documents of 1 .. 2 doc_len - 1 tokens, the last S / 8 keys padding (segment 0)
};

// max |got - want| / max(max |want|, tiny); infinite on a non-finite mismatch
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double e = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (double(got[i]) != want[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    scale = std::max(scale, std::fabs(want[i]));
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= e)) e = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return e / scale;
}
std::vector<double> to_doubles(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

std::vector<int32_t> packed_docs(int64_t B, int64_t S, int64_t doc_len, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> len(1, 2 * doc_len - 1);
  std::vector<int32_t> seg(size_t(B * S));
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    for (int64_t s = 0, left = 0; s < S; ++s, --left) {
      if (left == 0) left = len(gen), ++id;
      seg[size_t(b * S + s)] = s < S - S / 8 ? id : 0;
    }
  }
  return seg;
}

struct Bf16Out {
  Tensor out, lse, dq, dk, dv;
};

void run_bf16(const Bf16Case& bc) {
  const Config& c = bc.c;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  const Shape qs{c.B, c.T, c.Hq, c.D}, ks{c.B, c.S, c.Hkv, c.D}, ls{c.B, c.Hq, c.T};
  const BackendPtr be = host();
  const Tensor q = Tensor::from_vector(random_vec(size_t(numel_of(qs)), 21), qs, be, DType::bf16);
  const Tensor k = Tensor::from_vector(random_vec(size_t(numel_of(ks)), 22), ks, be, DType::bf16);
  const Tensor v = Tensor::from_vector(random_vec(size_t(numel_of(ks)), 23), ks, be, DType::bf16);
  const Tensor dout = Tensor::from_vector(random_vec(size_t(numel_of(qs)), 24), qs, be, DType::bf16);
  std::vector<int32_t> segv;
  Tensor seg;
  if (bc.doc_len > 0) {
    segv = packed_docs(c.B, c.S, bc.doc_len, 25);
    seg = Tensor::from_ints(segv, {c.B, c.S}, be);
  }
  const Ref want = reference(c, q.to_floats(), k.to_floats(), v.to_floats(), dout.to_floats(), scale,
                             segv.empty() ? nullptr : &segv);
  AttentionParams p;
  p.scale = float(scale);
  p.causal = c.causal;
  p.window = c.window;
  p.softcap = c.softcap;
  p.q_offset = c.q_offset;
  REQUIRE(cpu::attention_bf16_fast_covers(q, k, p));

  const int saved = omp_get_max_threads();
  Bf16Out first;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Bf16Out r{Tensor::full(qs, 7.0, DType::bf16, be), Tensor::full(ls, 7.0, DType::f32, be),
              Tensor::full(qs, 7.0, DType::bf16, be), Tensor::full(ks, 7.0, DType::bf16, be),
              Tensor::full(ks, 7.0, DType::bf16, be)};  // poisoned: the kernel must overwrite
    cpu::attention_bf16_fast_forward(q, k, v, seg, r.out, r.lse, p);
    cpu::attention_bf16_fast_backward(q, k, v, seg, r.out, r.lse, dout, r.dq, r.dk, r.dv, p);
    INFO(c.name, " threads=", threads);
    const double eo = max_err(r.out, want.out), eq = rel_err(r.dq.to_floats(), want.dq),
                 ek = rel_err(r.dk.to_floats(), want.dk), ev = rel_err(r.dv.to_floats(), want.dv);
    if (threads == 1)
      MESSAGE(c.name, ": |error| of out, and error / max|want| of dq, dk, dv, in bf16 eps: out ", eo / kBf16Eps,
              ", dq ", eq / kBf16Eps, ", dk ", ek / kBf16Eps, ", dv ", ev / kBf16Eps);
    CHECK(eo < 1.01 * kBf16Eps);
    CHECK(max_err(r.lse, want.lse) < 1e-4);
    CHECK(eq < 4 * kBf16Eps);
    CHECK(ek < 4 * kBf16Eps);
    CHECK(ev < 4 * kBf16Eps);
    // the medium form (f32 outputs, matmul_precision = medium): the same f32 sums unrounded, so rounding them gives
    // the bf16 outputs bit for bit (the backward reads the bf16 out, as medium's entry rounds its f32 out)
    Bf16Out m{Tensor::full(qs, 7.0, DType::f32, be), Tensor::full(ls, 7.0, DType::f32, be),
              Tensor::full(qs, 7.0, DType::f32, be), Tensor::full(ks, 7.0, DType::f32, be),
              Tensor::full(ks, 7.0, DType::f32, be)};
    cpu::attention_bf16_fast_forward(q, k, v, seg, m.out, m.lse, p);
    cpu::attention_bf16_fast_backward(q, k, v, seg, r.out, r.lse, dout, m.dq, m.dk, m.dv, p);
    const auto rounded = [&](const Tensor& t) {
      return Tensor::from_vector(t.to_floats(), t.shape(), be, DType::bf16);
    };
    CHECK(same_bits(rounded(m.out), r.out));
    CHECK(same_bits(m.lse, r.lse));
    CHECK(same_bits(rounded(m.dq), r.dq));
    CHECK(same_bits(rounded(m.dk), r.dk));
    CHECK(same_bits(rounded(m.dv), r.dv));
    CHECK_THROWS_AS(cpu::attention_bf16_fast_backward(q, k, v, seg, r.out, r.lse, dout, m.dq, r.dk, m.dv, p), Error);
    if (threads == 1) {
      first = r;
      // today's widened path: the f32 kernel on the widened inputs (its outputs compared before rounding)
      const auto wide = [&](const Tensor& t) { return Tensor::from_vector(t.to_floats(), t.shape(), be); };
      const Tensor wq = wide(q), wk = wide(k), wv = wide(v), wd = wide(dout);
      Tensor wo = Tensor::empty(qs, DType::f32, be), wl = Tensor::empty(ls, DType::f32, be);
      Tensor gq = Tensor::empty(qs, DType::f32, be), gk = Tensor::empty(ks, DType::f32, be),
             gv = Tensor::empty(ks, DType::f32, be);
      cpu::attention_forward(wq, wk, wv, seg, wo, wl, p);
      cpu::attention_backward(wq, wk, wv, seg, wide(r.out), r.lse, wd, gq, gk, gv, p);
      CHECK(max_err(r.out, to_doubles(wo.to_floats())) < 1.01 * kBf16Eps);
      CHECK(max_err(r.lse, to_doubles(wl.to_floats())) < 1e-4);
      CHECK(rel_err(r.dq.to_floats(), to_doubles(gq.to_floats())) < 4 * kBf16Eps);
      CHECK(rel_err(r.dk.to_floats(), to_doubles(gk.to_floats())) < 4 * kBf16Eps);
      CHECK(rel_err(r.dv.to_floats(), to_doubles(gv.to_floats())) < 4 * kBf16Eps);
    } else {
      CHECK(same_bits(r.out, first.out));
      CHECK(same_bits(r.lse, first.lse));
      CHECK(same_bits(r.dq, first.dq));
      CHECK(same_bits(r.dk, first.dk));
      CHECK(same_bits(r.dv, first.dv));
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace

TEST_CASE("cpu attention bf16 (vdpbf16ps): against the double reference on the rounded inputs, 1-3 threads") {
  if (!cpu::attention_bf16_fast_cpu()) {
    MESSAGE("skipped: this CPU has no AVX512-BF16 (the bf16 calls take the widened f32 kernel)");
    return;
  }
  //       name                                  B   T    S   Hq Hkv  D   causal win softcap qoff [scale]
  const std::vector<Bf16Case> cases = {
      {{"char-small causal B2 T256 H6 D64", 2, 256, 256, 6, 6, 64, true, 0, 0.0f, 0}},
      {{"DiT noncausal B3 T64 H4 D64", 3, 64, 64, 4, 4, 64, false, 0, 0.0f, 0}},
      {{"causal T70 H3 D32 (T % 64 != 0)", 2, 70, 70, 3, 3, 32, true, 0, 0.0f, 0}},
      {{"noncausal T37 S45 D128 (odd T, S)", 2, 37, 45, 2, 2, 128, false, 0, 0.0f, 0}},
      {{"gqa causal T100 H4/2 D64", 2, 100, 100, 4, 2, 64, true, 0, 0.0f, 0}},
      {{"mqa noncausal T80 S90 H4/1 D32", 1, 80, 90, 4, 1, 32, false, 0, 0.0f, 0}},
      {{"window 50 causal T150 D64", 1, 150, 150, 2, 2, 64, true, 50, 0.0f, 0}},
      {{"window 7 noncausal T70 D16", 2, 70, 70, 2, 1, 16, false, 7, 0.0f, 0}},
      {{"softcap 5 causal T70 D64 scale 1", 1, 70, 70, 2, 2, 64, true, 0, 5.0f, 0, 1.0f}},
      {{"q_offset 70 T20 S90 gqa", 1, 20, 90, 4, 2, 64, true, 0, 0.0f, 70}},
      {{"q_offset 33 T67 S100 window 40", 1, 67, 100, 2, 2, 32, true, 40, 0.0f, 33}},
      {{"negative offset: rows without keys", 1, 70, 70, 2, 2, 64, true, 0, 0.0f, -5}},
      {{"segments causal T150 docs ~20 + padding", 2, 150, 150, 2, 2, 64, true, 0, 0.0f, 0}, 20},
      {{"segments gqa noncausal T130 docs ~9", 2, 130, 130, 4, 2, 32, false, 0, 0.0f, 0}, 9},
      {{"segments window softcap T90", 1, 90, 90, 2, 2, 64, true, 12, 3.0f, 0}, 15},
  };
  for (const Bf16Case& bc : cases) run_bf16(bc);
}

TEST_CASE("cpu attention bf16 (vdpbf16ps): coverage") {
  const BackendPtr be = host();
  AttentionParams p;
  const auto t = [&](Shape s, DType dt = DType::bf16) { return Tensor::empty(s, dt, be); };
  const bool cpu_ok = cpu::attention_bf16_fast_cpu();
  CHECK(cpu::attention_bf16_fast_covers(t({2, 64, 4, 64}), t({2, 64, 4, 64}), p) == cpu_ok);
  CHECK_FALSE(cpu::attention_bf16_fast_covers(t({2, 4, 4, 64}), t({2, 64, 4, 64}), p));     // T <= 4: decode rows
  CHECK_FALSE(cpu::attention_bf16_fast_covers(t({2, 64, 4, 24}), t({2, 64, 4, 24}), p));    // D % 16 != 0
  CHECK_FALSE(cpu::attention_bf16_fast_covers(t({2, 64, 4, 512}), t({2, 64, 4, 512}), p));  // D > 256
  CHECK_FALSE(cpu::attention_bf16_fast_covers(t({2, 64, 4, 64}, DType::f32), t({2, 64, 4, 64}), p));
  // the backward at 2 threads: 1 (batch, kv head) task over 2 key blocks leaves a thread idle
  CHECK_FALSE(cpu::attention_bf16_fast_backward_covers(t({1, 128, 1, 64}), t({1, 128, 1, 64}), p, 2));
  CHECK(cpu::attention_bf16_fast_backward_covers(t({8, 256, 6, 64}), t({8, 256, 6, 64}), p, 2) == cpu_ok);
}
