// test_cuda_gpu.cpp — the `cuda` backend on a GPU, against the `ref` backend (the oracle): Philox streams
// bit for bit, the matmul paths (plain, transposed, batched with a shared operand, bias + activation
// epilogues, bf16), the attention kernels (warp-per-row, tensor-core, f32 by products), the caching allocator's reuse,
// staged host->device copies, and index errors raised at the next synchronisation. The exhaustive kernel-by-kernel
// comparison is conformance_cuda. Without a usable GPU it prints the probe's reason and exits 77 (CTest: skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_checks.hpp"
#include "dew/backend.hpp"
#include "dew/dtype.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

using namespace dew;

namespace {

BackendPtr g_cuda, g_ref;

std::vector<float> host_uniform(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = lo + (hi - lo) * philox::uniform(seed, 11, uint64_t(i));
  return v;
}

using attention_checks::Case;
using attention_checks::check_close;

void matmul_case(const MatmulParams& p, const Shape& as, const Shape& bs, bool with_bias, DType dt, double rtol,
                 const char* what) {
  const auto av = host_uniform(numel_of(as), 1), bv = host_uniform(numel_of(bs), 2), cv = host_uniform(p.n, 3);
  const Shape os{p.batch, p.m, p.n};
  auto run = [&](const BackendPtr& be, DType d) {
    Tensor a = Tensor::from_vector(av, as, be, d), b = Tensor::from_vector(bv, bs, be, d);
    Tensor bias = with_bias ? Tensor::from_vector(cv, {p.n}, be, d) : Tensor();
    Tensor out = Tensor::full(os, 0.25, d, be);
    be->matmul(a, b, bias, out, p);
    return out.to_floats();
  };
  // The oracle computes in f32 on the same (bf16-rounded, when bf16) inputs.
  std::vector<float> want;
  if (dt == DType::bf16) {
    auto round = [](std::vector<float> v) {
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
      return v;
    };
    const auto ar = round(av), br = round(bv), cr = round(cv);
    Tensor a = Tensor::from_vector(ar, as, g_ref), b = Tensor::from_vector(br, bs, g_ref);
    Tensor bias = with_bias ? Tensor::from_vector(cr, {p.n}, g_ref) : Tensor();
    Tensor out = Tensor::full(os, 0.25, DType::f32, g_ref);
    g_ref->matmul(a, b, bias, out, p);
    want = out.to_floats();
  } else {
    want = run(g_ref, DType::f32);
  }
  check_close(run(g_cuda, dt), want, rtol, what);
}

}  // namespace

TEST_CASE("Philox: uniform streams and dropout masks equal ref's bit for bit, normal within an ulp") {
  for (uint64_t offset : {uint64_t(0), uint64_t(5), (uint64_t(1) << 33) + 3}) {
    RandomParams p;
    p.seed = 0x1234567890abull;
    p.stream = 77;
    p.offset = offset;
    p.a = -2.0f;
    p.b = 3.0f;
    Tensor c = Tensor::empty({4099}, DType::f32, g_cuda), r = Tensor::empty({4099}, DType::f32, g_ref);
    g_cuda->random(c, p);
    g_ref->random(r, p);
    CHECK(c.to_floats() == r.to_floats());
    p.dist = Distribution::normal;
    p.a = 0.0f;
    p.b = 1.0f;
    g_cuda->random(c, p);
    g_ref->random(r, p);
    const auto cn = c.to_floats(), rn = r.to_floats();
    size_t differ = 0;
    for (size_t i = 0; i < cn.size(); ++i)
      if (cn[i] != rn[i]) {
        ++differ;
        CHECK(std::fabs(cn[i] - rn[i]) <= 2e-7f * (1.0f + std::fabs(rn[i])));
      }
    CHECK(differ <= 2);
  }
  DropoutParams d;
  d.p = 0.3f;
  d.seed = 9;
  d.stream = 4;
  d.offset = 17;
  const auto xv = host_uniform(3001, 5);
  Tensor xc = Tensor::from_vector(xv, {3001}, g_cuda), xr = Tensor::from_vector(xv, {3001}, g_ref);
  Tensor yc = Tensor::empty({3001}, DType::f32, g_cuda), mc = Tensor::empty({3001}, DType::f32, g_cuda);
  Tensor yr = Tensor::empty({3001}, DType::f32, g_ref), mr = Tensor::empty({3001}, DType::f32, g_ref);
  g_cuda->dropout(xc, yc, mc, d);
  g_ref->dropout(xr, yr, mr, d);
  CHECK(mc.to_floats() == mr.to_floats());
  CHECK(yc.to_floats() == yr.to_floats());
}

TEST_CASE("matmul: plain, transposed, batched with a shared b (folded), epilogues, beta, bf16") {
  MatmulParams p;
  p.m = 67;
  p.n = 45;
  p.k = 129;
  matmul_case(p, {67, 129}, {129, 45}, false, DType::f32, 1e-5, "plain f32");
  MatmulParams t = p;
  t.trans_a = t.trans_b = true;
  matmul_case(t, {129, 67}, {45, 129}, true, DType::f32, 1e-5, "trans_a trans_b + bias");
  MatmulParams b = p;
  b.batch = 3;
  b.a_batch_stride = 67 * 129;
  b.b_batch_stride = 0;
  b.act = Activation::gelu;
  matmul_case(b, {3, 67, 129}, {129, 45}, true, DType::f32, 1e-5, "batched shared b + bias + gelu");
  MatmulParams s = p;
  s.batch = 2;
  s.a_batch_stride = 0;  // shared a, batched b: no folding
  s.b_batch_stride = 129 * 45;
  s.act = Activation::relu;
  matmul_case(s, {67, 129}, {2, 129, 45}, true, DType::f32, 1e-5, "shared a + bias + relu");
  MatmulParams acc = p;
  acc.alpha = 0.5f;
  acc.beta = 1.0f;  // out starts as 0.25 everywhere
  matmul_case(acc, {67, 129}, {129, 45}, false, DType::f32, 1e-5, "alpha 0.5 beta 1");
  MatmulParams k0 = p;
  k0.k = 0;
  k0.act = Activation::silu;
  matmul_case(k0, {67, 0}, {0, 45}, true, DType::f32, 1e-6, "k = 0: silu(bias)");
  matmul_case(p, {67, 129}, {129, 45}, true, DType::bf16, 2e-2, "bf16 with f32 accumulation");
}

TEST_CASE("allocator: a freed block is reused for the same size, staged copies survive the source") {
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({1 << 20}, DType::f32, g_cuda);
    first = a.data();
  }
  Tensor b = Tensor::empty({1 << 20}, DType::f32, g_cuda);
  CHECK(b.data() == first);
  // Many small uploads whose host buffers die at once: every value must arrive.
  std::vector<Tensor> ts;
  for (int i = 0; i < 40; ++i) {
    std::vector<float> v(1000 + size_t(i), float(i));
    ts.push_back(Tensor::from_vector(v, {int64_t(v.size())}, g_cuda));
  }
  for (int i = 0; i < 40; ++i) {
    const auto v = ts[size_t(i)].to_floats();
    CHECK(v.size() == size_t(1000 + i));
    CHECK(v.front() == float(i));
    CHECK(v.back() == float(i));
  }
}

TEST_CASE("memory accounting: bytes in use at the allocator's rounded size, the high-water mark, the cache") {
  const dew::MemoryStats start = g_cuda->memory_stats();
  REQUIRE(start.tracked);
  g_cuda->reset_memory_peak();
  {
    Tensor small = Tensor::empty({1000}, DType::f32, g_cuda);  // 4000 bytes -> a 4096-byte class (512-byte steps)
    CHECK(g_cuda->memory_stats().in_use - start.in_use == 4096);
    Tensor big = Tensor::empty({3 << 20}, DType::f32, g_cuda);  // 12 MiB -> 12 MiB (2 MiB classes)
    CHECK(g_cuda->memory_stats().in_use - start.in_use == 4096 + (12 << 20));
  }
  const dew::MemoryStats after = g_cuda->memory_stats();
  CHECK(after.in_use == start.in_use);
  CHECK(after.peak - start.in_use == 4096 + (12 << 20));
  CHECK(after.reserved - after.in_use >= (12 << 20));  // the freed blocks stay cached
}

TEST_CASE("an index out of range is raised at the next synchronisation, naming the kernel") {
  Tensor table = Tensor::from_vector(host_uniform(40, 3), {10, 4}, g_cuda);
  Tensor idx = Tensor::from_ints({1, 2, 10, 3}, {4}, g_cuda);
  Tensor out = Tensor::empty({4, 4}, DType::f32, g_cuda);
  g_cuda->gather_rows(table, idx, out);
  std::string msg;
  try {
    g_cuda->synchronize();
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("gather_rows") != std::string::npos);
  CHECK(msg.find("index 10") != std::string::npos);
  CHECK_NOTHROW(g_cuda->synchronize());  // reported once
}

TEST_CASE("attention forward and backward against ref (GQA, causal, window, softcap, q_offset)") {
  const int64_t B = 2, T = 9, S = 13, Hq = 4, Hkv = 2, D = 40;
  const attention_checks::Sizes sz{B, T, S, Hq, Hkv, D};
  AttentionParams p = attention_checks::params_of(sz, true, 6, 5.0f);
  p.scale = 0.2f;
  const auto qv = host_uniform(B * T * Hq * D, 21), kv = host_uniform(B * S * Hkv * D, 22),
             vv = host_uniform(B * S * Hkv * D, 23), gv = host_uniform(B * T * Hq * D, 24);
  const auto run = [&](const BackendPtr& be) {
    return attention_checks::run_attention(be, DType::f32, sz, qv, kv, vv, gv, {}, p);
  };
  const attention_checks::Result c = run(g_cuda), r = run(g_ref);
  check_close(c.o, r.o, 1e-5, "out");
  check_close(c.lse, r.lse, 1e-5, "lse");
  check_close(c.dq, r.dq, 1e-4, "dq");
  check_close(c.dk, r.dk, 1e-4, "dk");
  check_close(c.dv, r.dv, 1e-4, "dv");
}

// The tensor-core kernels (flash_attention.cu: bf16, head width 32, 64 or 128) against ref in f32 on the same
// bf16-rounded inputs, at shapes with ragged edges (T, S not multiples of the 64-row tiles), GQA, causal, sliding
// window with softcap and q_offset, documents (segment ids, with padding rows that see no key: out 0, lse -inf;
// short ones, and long ones whose tiles are skipped, unmasked or masked per element), non-causal, and a shape
// whose inner tiles take the unmasked fast path. The warp-per-row kernel (`attention =
// warp`) runs the same bf16 call against the same ref, tighter (it rounds nothing but its outputs), and the two
// cuda results must differ somewhere: the option really switches the kernel. Tolerances: |err| <= rtol (|want| +
// rms(want)); the tensor-core path rounds P and dS to bf16 before their second products (FlashAttention-2's
// numerics), so 2e-2 for out and 5e-2 for the gradients; lse comes from f32 scores: 1e-3. The warp kernel's
// gradients: 3e-2 — its backward reads the bf16-rounded out (D = rowsum(dO * O)) where ref has f32, and on an
// H200 (session 18) dq of the 192 x 192 case needed rtol 0.027 (9 of 24576 elements over 2e-2).
TEST_CASE("tensor-core attention (bf16, head width 32, 64 and 128) against ref; the warp kernel on the same call") {
  // segments 0: none; 1: short documents and a padding tail; 2: long documents (64-row tiles inside one, across two,
  // and hidden: query documents no key tile shares)
  const Case cases[] = {
      {"D 64, causal, ragged 100 x 100, GQA 2", 2, 100, 100, 4, 2, 64, true, 0, 0.0f, 0},
      {"D 64, causal, 192 x 192 (full inner tiles)", 1, 192, 192, 2, 1, 64, true, 0, 0.0f, 0},
      {"D 128, window 37, softcap 20, q_offset 80, GQA 4", 2, 70, 150, 4, 1, 128, true, 37, 20.0f, 0},
      {"D 64, documents with a padding tail", 2, 130, 130, 2, 2, 64, true, 0, 0.0f, 1},
      {"D 64, long documents (whole, mixed and hidden tiles)", 1, 320, 320, 2, 2, 64, true, 0, 0.0f, 2},
      {"D 128, not causal, 33 x 200", 1, 33, 200, 2, 2, 128, false, 0, 0.0f, 0},
      {"D 32, causal, ragged 150 x 150, GQA 2", 2, 150, 150, 4, 2, 32, true, 0, 0.0f, 0},
  };
  BackendPtr warp_cuda = create_backend("cuda", Options({{"attention", "warp"}}, "test"));
  for (const Case& c : cases) {
    const std::string what = c.what;  // a string: CAPTURE of a char* prints the pointer
    CAPTURE(what);
    const attention_checks::Sizes sz{c.B, c.T, c.S, c.Hq, c.Hkv, c.D};
    const AttentionParams p = attention_checks::params_of(sz, c.causal, c.window, c.softcap);
    auto rounded = [](std::vector<float> v, float mul) {
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x * mul));
      return v;
    };
    const auto qv = rounded(host_uniform(c.B * c.T * c.Hq * c.D, 31), 2.0f);
    const auto kv = rounded(host_uniform(c.B * c.S * c.Hkv * c.D, 32), 2.0f);
    const auto vv = rounded(host_uniform(c.B * c.S * c.Hkv * c.D, 33), 1.0f);
    const auto gv = rounded(host_uniform(c.B * c.T * c.Hq * c.D, 34), 1.0f);
    const std::vector<int32_t> seg = attention_checks::document_ids(c.segments, c.B, c.S);
    using Out = attention_checks::Result;
    const auto run = [&](const BackendPtr& be, DType dt) {
      return attention_checks::run_attention(be, dt, sz, qv, kv, vv, gv, seg, p);
    };
    const Out r = run(g_ref, DType::f32);
    const Out tc = run(g_cuda, DType::bf16);
    check_close(tc.o, r.o, 2e-2, "tensor cores: out");
    attention_checks::check_lse(tc.lse, r.lse, 1e-3, "tensor cores: lse");
    check_close(tc.dq, r.dq, 5e-2, "tensor cores: dq");
    check_close(tc.dk, r.dk, 5e-2, "tensor cores: dk");
    check_close(tc.dv, r.dv, 5e-2, "tensor cores: dv");
    const Out w = run(warp_cuda, DType::bf16);
    check_close(w.o, r.o, 1e-2, "warp: out");
    attention_checks::check_lse(w.lse, r.lse, 1e-4, "warp: lse");
    check_close(w.dq, r.dq, 3e-2, "warp: dq");
    check_close(w.dk, r.dk, 3e-2, "warp: dk");
    check_close(w.dv, r.dv, 3e-2, "warp: dv");
    CHECK_MESSAGE(tc.o != w.o, "the tensor-core and warp kernels gave the same bits: is `attention` switching?");
    if (c.segments != 0)  // padding queries see no key: zeros (and lse -inf, checked above)
      attention_checks::check_zero_rows(tc.o, c.B, c.T, c.Hq * c.D, attention_checks::padding_start(c.segments));
  }
}

// The f32 attention by cuBLASLt products (attention_products.cpp; `attention = products` takes every f32 call, auto
// those with T * S >= 2^15) against ref, and the warp kernel (`attention = warp`) on the same calls: GQA with window,
// softcap and q_offset; documents with padding rows (out 0, lse -inf) under MQA; and GPT-2-small's head shape
// (T 1024, D 64, causal: four row chunks of 256, each multiplying the keys up to its causal edge). Tolerances (passed
// on an H200, session 19): out 2e-5, lse 1e-5, gradients 2e-4 of |want| + rms(want) (the emulated plugin, whose
// products sum in double, passes at half of each).
TEST_CASE("f32 attention by cuBLASLt products against ref, and the warp kernel on the same calls") {
  // segments 1: three_documents
  const Case cases[] = {
      {"GQA 4/2, causal, window 6, softcap 5, q_offset 4, D 40", 2, 20, 24, 4, 2, 40, true, 6, 5.0f, 0},
      {"MQA 3/1, documents with padding, not causal, D 72", 2, 150, 150, 3, 1, 72, false, 0, 0.0f, 1},
      {"GPT-2 small's heads: causal 1024 x 1024, D 64", 1, 1024, 1024, 2, 2, 64, true, 0, 0.0f, 0},
  };
  BackendPtr products = create_backend("cuda", Options({{"attention", "products"}}, "test"));
  BackendPtr warp = create_backend("cuda", Options({{"attention", "warp"}}, "test"));
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    const attention_checks::Sizes sz{c.B, c.T, c.S, c.Hq, c.Hkv, c.D};
    const AttentionParams p = attention_checks::params_of(sz, c.causal, c.window, c.softcap);
    const auto qv = host_uniform(c.B * c.T * c.Hq * c.D, 61, -2.0f, 2.0f),
               kv = host_uniform(c.B * c.S * c.Hkv * c.D, 62, -2.0f, 2.0f);
    const auto vv = host_uniform(c.B * c.S * c.Hkv * c.D, 63), gv = host_uniform(c.B * c.T * c.Hq * c.D, 64);
    const std::vector<int32_t> seg =
        c.segments ? attention_checks::three_documents(c.B, c.S, 70) : std::vector<int32_t>();
    const auto run = [&](const BackendPtr& be) {
      return attention_checks::run_attention(be, DType::f32, sz, qv, kv, vv, gv, seg, p);
    };
    const attention_checks::Result r = run(g_ref), e = run(products), w = run(warp);
    for (const auto& [got, name] : {std::pair{&e, "products"}, std::pair{&w, "warp"}}) {
      const std::string n = name;
      check_close(got->o, r.o, 2e-5, n + ": out");
      attention_checks::check_lse(got->lse, r.lse, 1e-5, n + ": lse");
      check_close(got->dq, r.dq, 2e-4, n + ": dq");
      check_close(got->dk, r.dk, 2e-4, n + ": dk");
      check_close(got->dv, r.dv, 2e-4, n + ": dv");
    }
    CHECK_MESSAGE(e.o != w.o, "products and the warp kernel gave the same bits: is `attention` switching?");
    if (c.segments) attention_checks::check_zero_rows(e.o, c.B, c.T, c.Hq * c.D, c.T - 2);  // padding queries
  }
}

int main(int argc, char** argv) {
  try {
    auto& reg = Registry::global();
    // The plugin folders dew-run uses (DEW_PLUGIN_PATH, then bin/../lib/dew/plugins): the build tree and
    // tools/device-bundle.sh's bundle alike, where the build's absolute paths do not exist.
    reg.discover(Registry::default_plugin_dirs(), {"ref", "cuda"});
    const Support s = reg.find(Backend::kind, "cuda").probe();
    if (!s.ok) {
      std::printf("test_backend_cuda_gpu: skipped: the cuda backend cannot run here: %s\n", s.reason.c_str());
      return 77;
    }
    g_ref = create_backend("ref");
    g_cuda = create_backend("cuda");
  } catch (const Error& e) {
    std::fprintf(stderr, "test_backend_cuda_gpu: %s\n", e.describe().c_str());
    return 1;
  }
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  g_cuda.reset();
  g_ref.reset();
  return rc;
}
