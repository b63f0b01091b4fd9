// test_attention_emulated.cpp — the cuda backend's attention kernels, the tensor-core ones (plugins/backends/cuda/
// flash_attention.cuh) and the warp-per-row ones (attention.cuh: f32, other head widths, the bf16 decode cache,
// QK-Clip's max logit), their own source compiled for the CPU and run by cuda_emulation.hpp (every thread a fiber,
// mma.sync and ldmatrix gathered by the PTX layouts), against the `ref` backend in f32 on the same bf16-rounded
// inputs. Runs everywhere the cuda plugin is built, GPU or not: the GPU test (test_cuda_gpu.cpp) runs the same
// cases on the hardware where there is one.
// Cases: ragged edges (T, S not multiples of the tiles) with GQA; causal 192 x 192 (inner tiles unmasked); D 128
// with window, softcap and q_offset; short documents with a padding tail (rows that see no key: out 0, lse
// -inf); long documents (tile pairs skipped, unmasked and masked per element); not causal; two shapes whose
// visible range starts at a tile's last key or query, and two whose causal or window edge falls one key inside a
// tile pair; head width 32 (GQA ragged, and window + softcap over short documents). Every case also runs a mask probe
// (q = 0: lse = log of the visible keys, exactly), so an off-by-one in a tile range or in the unmasked-tile test fails
// (checked by mutating each bound by hand). Tolerances as the GPU test's: |err| <= rtol (|want| + rms(want)), 2e-2 for
// out (P is rounded to bf16 for P V), 1e-3 for lse, 5e-2 for the gradients (dS rounded too). Each emulated run goes
// twice, under cuda_emulation.hpp's two schedules, which must give the same bits: a missing barrier or cp.async wait
// shows (checked by deleting each one).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "attention_checks.hpp"
#include "dew/backend.hpp"
#include "dew/dtype.hpp"
#include "dew/options.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"
// After every other header: the emulation's macros (threadIdx, __shared__, ...) are for the kernels only.
#include "cuda_emulation.hpp"
// The kernels, after the emulation (it defines DEW_CUDA_EMULATION and their primitives).
#include "attention.cuh"
#include "flash_attention.cuh"

using namespace dew;

namespace {

BackendPtr ref() {
  static BackendPtr be = [] {
    Registry::global().load(DEW_REF_PLUGIN_PATH);
    return create_backend("ref");
  }();
  return be;
}

std::vector<float> host_uniform(int64_t n, uint64_t seed, float mul) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = bf16_to_f32(f32_to_bf16(mul * (2.0f * philox::uniform(seed, 11, uint64_t(i)) - 1.0f)));
  return v;
}

using attention_checks::Case;
using attention_checks::check_close;
using attention_checks::check_lse;

using cuda::bf16;
std::vector<bf16> to_bf16s(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = cuda::to_bf16(v[i]);
  return r;
}
std::vector<float> to_floats(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = cuda::bf16_value(v[i].bits);
  return r;
}

using Out = attention_checks::Result;

// The launchers of flash_attention.cu, with emu::launch for <<< >>>.
template <int D>
Out run_emulated(const cuda::AttnDims& d, const AttentionParams& p, const std::vector<float>& q,
                 const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& g,
                 const std::vector<int32_t>& seg) {
  using namespace cuda::flash;
  const std::vector<bf16> qb = to_bf16s(q), kb = to_bf16s(k), vb = to_bf16s(v), gb = to_bf16s(g);
  std::vector<bf16> out(q.size(), bf16{0x7fc0}), dq(q.size(), bf16{0x7fc0}), dk(k.size(), bf16{0x7fc0}),
      dv(v.size(), bf16{0x7fc0});  // NaN: an element no thread writes shows
  std::vector<float> lse(size_t(d.B * d.Hq * d.T), NAN), Di(lse.size(), NAN);
  const int32_t* sp = seg.empty() ? nullptr : seg.data();
  const unsigned qtiles = unsigned((d.T + kRowTile - 1) / kRowTile), ktiles = unsigned((d.S + kRowTile - 1) / kRowTile);
  emu::launch({unsigned(d.B * d.Hq), qtiles, 1}, kThreads, forward_smem<D>(),
              [&] { flash_forward_kernel<D>(qb.data(), kb.data(), vb.data(), sp, out.data(), lse.data(), d, p); });
  emu::launch({1, 1, 1}, kThreads, 0, [&] { flash_di_kernel<D>(out.data(), gb.data(), Di.data(), d); });
  emu::launch({unsigned(d.B * d.Hq), qtiles, 1}, kThreads, dq_smem<D>(), [&] {
    flash_dq_kernel<D>(qb.data(), kb.data(), vb.data(), sp, lse.data(), gb.data(), Di.data(), dq.data(), d, p);
  });
  emu::launch({unsigned(d.B * d.Hkv), ktiles, 1}, kThreads, dkdv_smem<D>(), [&] {
    flash_dkdv_kernel<D>(qb.data(), kb.data(), vb.data(), sp, lse.data(), gb.data(), Di.data(), dk.data(), dv.data(), d,
                         p);
  });
  return Out{to_floats(out), lse, to_floats(dq), to_floats(dk), to_floats(dv)};
}

}  // namespace

TEST_CASE("tensor-core attention kernels, emulated on the CPU, against ref (bf16 inputs, f32 oracle)") {
  // segments 0: none; 1: short documents and a padding tail; 2: long documents
  const Case cases[] = {
      {"D 64, causal, ragged 100 x 100, GQA 2", 1, 100, 100, 2, 1, 64, true, 0, 0.0f, 0},
      {"D 64, causal, 192 x 192 (unmasked inner tiles)", 1, 192, 192, 1, 1, 64, true, 0, 0.0f, 0},
      {"D 128, window 37, softcap 20, q_offset 80, GQA 2", 1, 70, 150, 2, 1, 128, true, 37, 20.0f, 0},
      {"D 64, short documents with a padding tail", 2, 130, 130, 1, 1, 64, true, 0, 0.0f, 1},
      {"D 64, long documents (skipped, unmasked and masked tiles)", 1, 320, 320, 1, 1, 64, true, 0, 0.0f, 2},
      {"D 128, not causal, 33 x 100", 1, 33, 100, 1, 1, 128, false, 0, 0.0f, 0},
      {"D 32, causal, ragged 150 x 150, GQA 2", 1, 150, 150, 4, 2, 32, true, 0, 0.0f, 0},
      {"D 32, window 40, softcap 10, short documents", 2, 100, 100, 1, 1, 32, true, 40, 10.0f, 1},
      // Range edges: the window's first key (63) ends a key tile (q_offset 80, rows 64.. start at 144 - 82 + 1);
      // q_offset 65: query 63 (position 128) is the last of the first 64-query tile and the only one of its
      // 32-query tile of dK/dV to see key 128, the first of a key tile.
      {"D 64, window 82 starting at a tile's last key", 1, 128, 208, 1, 1, 64, true, 82, 0.0f, 0},
      {"D 64, causal, q_offset 65", 1, 100, 165, 1, 1, 64, true, 0, 0.0f, 0},
      // Unmasked tiles at their edges: q_offset 62 puts the causal diagonal one key inside the first tile pair
      // (query 0 at position 62, key 63), and window 61 one key inside the pair (queries 64.., keys 128..).
      {"D 64, causal, q_offset 62", 1, 64, 126, 1, 1, 64, true, 0, 0.0f, 0},
      {"D 64, window 61 not causal, q_offset 62", 1, 192, 254, 1, 1, 64, false, 61, 0.0f, 0},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;  // a string: CAPTURE of a char* prints the pointer
    CAPTURE(what);
    const attention_checks::Sizes sz{c.B, c.T, c.S, c.Hq, c.Hkv, c.D};
    const AttentionParams p = attention_checks::params_of(sz, c.causal, c.window, c.softcap);
    const cuda::AttnDims d{c.B, c.T, c.S, c.Hq, c.Hkv, c.D, c.D};
    const auto qv = host_uniform(c.B * c.T * c.Hq * c.D, 31, 2.0f),
               kv = host_uniform(c.B * c.S * c.Hkv * c.D, 32, 2.0f);
    const auto vv = host_uniform(c.B * c.S * c.Hkv * c.D, 33, 1.0f),
               gv = host_uniform(c.B * c.T * c.Hq * c.D, 34, 1.0f);
    const std::vector<int32_t> seg = attention_checks::document_ids(c.segments, c.B, c.S);

    const auto ref_run = [&](const std::vector<float>& qv, const std::vector<float>& kv, const std::vector<float>& vv,
                             const std::vector<float>& gv) {
      return attention_checks::run_attention(ref(), DType::f32, sz, qv, kv, vv, gv, seg, p);
    };
    // Under both schedules (cuda_emulation.hpp: warps in lockstep with late copies, and skewed with early ones),
    // which must give the same bits: a missing barrier or wait shows as a difference.
    const auto emu_run = [&](const std::vector<float>& qv, const std::vector<float>& kv, const std::vector<float>& vv,
                             const std::vector<float>& gv) {
      const auto run = [&](emu::Schedule schedule) {
        emu::state().schedule = schedule;
        if (c.D == 32) return run_emulated<32>(d, p, qv, kv, vv, gv, seg);
        return c.D == 64 ? run_emulated<64>(d, p, qv, kv, vv, gv, seg) : run_emulated<128>(d, p, qv, kv, vv, gv, seg);
      };
      const Out lockstep = run(emu::Schedule::lockstep), skewed = run(emu::Schedule::skewed);
      const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      CHECK_MESSAGE(same(lockstep.o, skewed.o), "out differs between the lockstep and skewed schedules");
      CHECK_MESSAGE(same(lockstep.lse, skewed.lse), "lse differs between the schedules");
      CHECK_MESSAGE(same(lockstep.dq, skewed.dq), "dq differs between the schedules");
      CHECK_MESSAGE(same(lockstep.dk, skewed.dk), "dk differs between the schedules");
      CHECK_MESSAGE(same(lockstep.dv, skewed.dv), "dv differs between the schedules");
      return lockstep;
    };
    // Masks, exactly: with q = 0 every visible key weighs 1 / n, so lse = log n (n, the visible keys of the row)
    // and, with v = dO = 1, dV[s] = the sum of 1 / n_t over the queries t that see s: one key or query too many
    // or too few in any tile range shows far past the bf16 rounding of P (2^-9).
    {
      const std::vector<float> zeros(qv.size(), 0.0f), ones_k(kv.size(), 1.0f), ones_q(qv.size(), 1.0f);
      const Out pr = ref_run(zeros, kv, ones_k, ones_q), pe = emu_run(zeros, kv, ones_k, ones_q);
      check_lse(pe.lse, pr.lse, 1e-6, "mask probe: lse = log(visible keys)");
      check_close(pe.dv, pr.dv, 5e-3, "mask probe: dV = sum over the queries that see the key of 1 / n");
      check_close(pe.o, pr.o, 5e-3, "mask probe: out = 1 (0 without a visible key)");
    }
    const Out r = ref_run(qv, kv, vv, gv);
    const Out e = emu_run(qv, kv, vv, gv);
    check_close(e.o, r.o, 2e-2, "out");
    check_lse(e.lse, r.lse, 1e-3, "lse");
    check_close(e.dq, r.dq, 5e-2, "dq");
    check_close(e.dk, r.dk, 5e-2, "dk");
    check_close(e.dv, r.dv, 5e-2, "dv");
    if (c.segments != 0)  // padding queries: exact zeros
      attention_checks::check_zero_rows(e.o, c.B, c.T, c.Hq * c.D, attention_checks::padding_start(c.segments));
  }
}

// The warp-per-row kernels (attention.cuh), which take f32, other head widths and the decode cache (f32 q over
// bf16 K/V), against ref: f32 at 1e-5 (out, lse) and 1e-4 (gradients), as the GPU test holds them; bf16 storage
// at bf16 precision (outputs rounded once); the decode form forward; and attention_max_logit (QK-Clip), exactly.
// Small shapes: every key costs a warp reduction, which the emulation pays in fiber switches.
TEST_CASE("warp-per-row attention kernels, emulated on the CPU, against ref (f32, bf16, the bf16 decode cache)") {
  using namespace cuda::warp_attention;
  struct Case {
    const char* what;
    int64_t B, T, S, Hq, Hkv, D;
    bool causal;
    int64_t window;
    float softcap;
    bool segments, bf16;
  };
  const Case cases[] = {
      {"f32, GQA, causal, window 6, softcap 5, q_offset 4, D 40", 1, 20, 24, 4, 2, 40, true, 6, 5.0f, false, false},
      {"f32, documents, not causal, D 72", 1, 18, 18, 2, 1, 72, false, 0, 0.0f, true, false},
      {"bf16, causal, documents, D 32", 2, 16, 16, 2, 2, 32, true, 0, 0.0f, true, true},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;  // a string: CAPTURE of a char* prints the pointer
    CAPTURE(what);
    const attention_checks::Sizes sz{c.B, c.T, c.S, c.Hq, c.Hkv, c.D};
    const AttentionParams p = attention_checks::params_of(sz, c.causal, c.window, c.softcap);
    const cuda::AttnDims d{c.B, c.T, c.S, c.Hq, c.Hkv, c.D, c.D};
    // bf16-representable inputs, so the bf16 case's storage loses nothing on the way in
    const auto qv = host_uniform(c.B * c.T * c.Hq * c.D, 41, 2.0f),
               kv = host_uniform(c.B * c.S * c.Hkv * c.D, 42, 2.0f);
    const auto vv = host_uniform(c.B * c.S * c.Hkv * c.D, 43, 1.0f),
               gv = host_uniform(c.B * c.T * c.Hq * c.D, 44, 1.0f);
    const std::vector<int32_t> seg =
        c.segments ? attention_checks::three_documents(c.B, c.S, 13) : std::vector<int32_t>();
    const int32_t* sp = seg.empty() ? nullptr : seg.data();

    const Out r = attention_checks::run_attention(ref(), DType::f32, sz, qv, kv, vv, gv, seg, p);
    std::vector<float> r_max;
    {
      const BackendPtr be = ref();
      Tensor q = Tensor::from_vector(qv, {c.B, c.T, c.Hq, c.D}, be),
             k = Tensor::from_vector(kv, {c.B, c.S, c.Hkv, c.D}, be);
      Tensor sg = c.segments ? Tensor::from_ints(seg, {c.B, c.S}, be) : Tensor();
      Tensor mx = Tensor::empty({c.Hq}, DType::f32, be);
      be->attention_max_logit(q, k, sg, mx, p);
      r_max = mx.to_floats();
    }
    const int64_t qrows = d.B * d.Hq * d.T, krows = d.B * d.Hkv * d.S;
    const auto blocks = [](int64_t rows) { return emu::Dim3{unsigned(std::min<int64_t>((rows + 3) / 4, 8)), 1, 1}; };
    std::vector<float> lse(size_t(qrows), NAN), Di(size_t(qrows), NAN), rowmax(size_t(qrows), NAN), mx(size_t(c.Hq));
    Out e;
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> q(qv.size()), k(kv.size()), v(vv.size()), g(gv.size());
      const auto put = [](std::vector<T>& to, const std::vector<float>& from) {
        for (size_t i = 0; i < from.size(); ++i) cuda::st(to.data(), int64_t(i), from[i]);
      };
      put(q, qv), put(k, kv), put(v, vv), put(g, gv);
      std::vector<T> o(qv.size()), dq(qv.size()), dk(kv.size()), dv(vv.size());
      emu::launch(blocks(qrows), 128, 0,
                  [&] { attention_kernel<T, T>(q.data(), k.data(), v.data(), sp, o.data(), lse.data(), d, p); });
      emu::launch(blocks(qrows), 128, 0, [&] {
        attention_dq_kernel<T>(q.data(), k.data(), v.data(), sp, o.data(), lse.data(), g.data(), dq.data(), Di.data(),
                               d, p);
      });
      emu::launch(blocks(krows), 128, 0, [&] {
        attention_dkdv_kernel<T>(q.data(), k.data(), v.data(), sp, lse.data(), g.data(), Di.data(), dk.data(),
                                 dv.data(), d, p);
      });
      emu::launch(blocks(qrows), 128, 0,
                  [&] { attention_row_max_kernel<T>(q.data(), k.data(), sp, rowmax.data(), d, p); });
      emu::launch({1, 1, 1}, 128, 0, [&] { head_max_kernel(rowmax.data(), mx.data(), d); });
      const auto get = [](const std::vector<T>& from) {
        std::vector<float> to(from.size());
        for (size_t i = 0; i < from.size(); ++i) to[i] = cuda::ld(from.data(), int64_t(i));
        return to;
      };
      e = Out{get(o), lse, get(dq), get(dk), get(dv)};
    };
    emu::state().schedule = emu::Schedule::lockstep;
    if (c.bf16)
      run(cuda::bf16{});
    else
      run(0.0f);
    const double tol_o = c.bf16 ? 1e-2 : 1e-5, tol_g = c.bf16 ? 2e-2 : 1e-4;
    check_close(e.o, r.o, tol_o, "out");
    check_lse(e.lse, r.lse, c.bf16 ? 1e-4 : 1e-5, "lse");
    check_close(e.dq, r.dq, tol_g, "dq");
    check_close(e.dk, r.dk, tol_g, "dk");
    check_close(e.dv, r.dv, tol_g, "dv");
    check_close(mx, r_max, 1e-6, "max logit");

    // The decode form: f32 q against bf16 K/V (the inputs are bf16-exact, so it equals the f32 forward).
    if (!c.bf16) {
      std::vector<bf16> k16(kv.size()), v16(vv.size());
      for (size_t i = 0; i < kv.size(); ++i) k16[i] = cuda::to_bf16(kv[i]);
      for (size_t i = 0; i < vv.size(); ++i) v16[i] = cuda::to_bf16(vv[i]);
      std::vector<float> o(qv.size()), lse2(static_cast<size_t>(qrows));
      emu::launch(blocks(qrows), 128, 0, [&] {
        attention_kernel<float, bf16>(qv.data(), k16.data(), v16.data(), sp, o.data(), lse2.data(), d, p);
      });
      check_close(o, r.o, 1e-5, "decode form (bf16 K/V): out");
    }
  }
}

// The f32 attention by cuBLASLt products (attention_products.cpp / .cu) on the whole emulated plugin
// (backend "cuda-emulated": its row kernels by cuda_emulation.hpp, its products by emulation/fake_cublaslt.cpp),
// against `attention = warp` on the same plugin and inputs, and both against ref: f32 at 1e-5 (out, lse) and 1e-4
// (gradients). Cases: GQA with causal, window, softcap and q_offset; documents with padding rows (no visible key:
// out 0, lse -inf) under MQA, not causal; and a causal T = S = 512 call, which the products path cuts in four row
// chunks whose key ranges start past 0 (window) and end at the causal edge, with dK / dV added over the chunks.
TEST_CASE("f32 attention by products (cuda-emulated) against the warp kernel and ref") {
  static const bool loaded = [] {
    Registry::global().load(DEW_CUDA_EMULATED_PLUGIN_PATH);
    return true;
  }();
  (void)loaded;
  // segments 1: three_documents
  const Case cases[] = {
      {"GQA 4/2, causal, window 6, softcap 5, q_offset 4, D 40", 1, 20, 24, 4, 2, 40, true, 6, 5.0f, 0},
      {"MQA 3/1, documents with padding, not causal, D 72", 2, 18, 18, 3, 1, 72, false, 0, 0.0f, 1},
      {"causal 512 x 512 (four row chunks), window 40, softcap 30, GQA 2/1, D 16", 1, 512, 512, 2, 1, 16, true, 40,
       30.0f, 0},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    const attention_checks::Sizes sz{c.B, c.T, c.S, c.Hq, c.Hkv, c.D};
    const AttentionParams p = attention_checks::params_of(sz, c.causal, c.window, c.softcap);
    const auto qv = host_uniform(c.B * c.T * c.Hq * c.D, 51, 2.0f),
               kv = host_uniform(c.B * c.S * c.Hkv * c.D, 52, 2.0f);
    const auto vv = host_uniform(c.B * c.S * c.Hkv * c.D, 53, 1.0f),
               gv = host_uniform(c.B * c.T * c.Hq * c.D, 54, 1.0f);
    const std::vector<int32_t> seg =
        c.segments ? attention_checks::three_documents(c.B, c.S, 13) : std::vector<int32_t>();
    const auto run = [&](const BackendPtr& be) {
      return attention_checks::run_attention(be, DType::f32, sz, qv, kv, vv, gv, seg, p);
    };
    const Out r = run(ref());
    const Out w =
        run(create_backend("cuda-emulated", Options(std::map<std::string, std::string>{{"attention", "warp"}})));
    const Out e =
        run(create_backend("cuda-emulated", Options(std::map<std::string, std::string>{{"attention", "products"}})));
    const auto check_all = [](const Out& got, const Out& want, const std::string& vs) {
      check_close(got.o, want.o, 1e-5, "out " + vs);
      check_lse(got.lse, want.lse, 1e-5, "lse " + vs);
      check_close(got.dq, want.dq, 1e-4, "dq " + vs);
      check_close(got.dk, want.dk, 1e-4, "dk " + vs);
      check_close(got.dv, want.dv, 1e-4, "dv " + vs);
    };
    check_all(e, w, "products vs warp");
    check_all(e, r, "products vs ref");
    check_all(w, r, "warp vs ref");
    if (c.segments) attention_checks::check_zero_rows(e.o, c.B, c.T, c.Hq * c.D, c.T - 2);  // padding queries
  }
}

// attention_slots on the whole emulated plugin: a decode step over a slot cache (rows on their own slots, out of slot
// order, at their own positions; GQA; a window and softcap) in two launches (attention.cuh's slot kernels) against the
// contract's row-by-row form on the same backend (attention_slots_each: a write pair and attention per row, the warp
// kernel) — the same bits in out and in both caches, f32 and bf16 caches — and against ref within attention's
// tolerance. With `attention = products` the rows' solo calls take the cuBLASLt products, so the kernel must go row by
// row too: the same bits again (a fused launch there would give the warp kernel's, not the products').
TEST_CASE("attention_slots (cuda-emulated): each row the bits of its solo call, f32 and bf16 caches") {
  static const bool loaded = [] {
    Registry::global().load(DEW_CUDA_EMULATED_PLUGIN_PATH);
    return true;
  }();
  (void)loaded;
  const auto bits = [](const Tensor& t) {
    const std::vector<double> v = t.to_doubles();
    std::vector<uint64_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(double));
    return b;
  };
  const int64_t n_slots = 5, C = 40, Hq = 4, Hkv = 2, D = 32;
  const std::vector<int64_t> slots = {3, 0, 4, 1}, positions = {39, 0, 17, 6};
  const int64_t n = int64_t(slots.size());
  for (const std::string attention : {"warp", "products"})
    for (DType cache : {DType::f32, DType::bf16}) {
      if (attention == "products" && cache == DType::bf16) continue;  // a bf16 cache never takes the products
      const std::string dt = dtype_name(cache);
      CAPTURE(attention);
      CAPTURE(dt);
      AttentionParams p;
      p.scale = 0.2f;
      p.window = 12;
      p.softcap = 4.0f;
      const auto run = [&](const BackendPtr& be, bool fused) {
        const Tensor q = Tensor::from_vector(host_uniform(n * Hq * D, 61, 2.0f), {n, 1, Hq, D}, be);
        const Tensor kn = Tensor::from_vector(host_uniform(n * Hkv * D, 62, 2.0f), {n, 1, Hkv, D}, be, cache);
        const Tensor vn = Tensor::from_vector(host_uniform(n * Hkv * D, 63, 1.0f), {n, 1, Hkv, D}, be, cache);
        Tensor kc = Tensor::from_vector(host_uniform(n_slots * C * Hkv * D, 64, 2.0f), {n_slots, C, Hkv, D}, be, cache);
        Tensor vc = Tensor::from_vector(host_uniform(n_slots * C * Hkv * D, 65, 1.0f), {n_slots, C, Hkv, D}, be, cache);
        Tensor out = Tensor::zeros({n, 1, Hq, D}, DType::f32, be);
        if (fused)
          be->attention_slots(q, kn, vn, slots, positions, kc, vc, out, p);
        else
          attention_slots_each(*be, q, kn, vn, slots, positions, kc, vc, out, p);
        be->synchronize();
        return std::vector<Tensor>{out, kc, vc};
      };
      const BackendPtr be =
          create_backend("cuda-emulated", Options(std::map<std::string, std::string>{{"attention", attention}}));
      const std::vector<Tensor> got = run(be, true), each = run(be, false);
      CHECK(bits(got[0]) == bits(each[0]));
      CHECK(bits(got[1]) == bits(each[1]));
      CHECK(bits(got[2]) == bits(each[2]));
      if (cache == DType::f32) {  // ref has no bf16 cache form (the core widens around it)
        const std::vector<Tensor> want = run(ref(), false);
        check_close(got[0].to_floats(), want[0].to_floats(), 1e-5, "out vs ref");
        CHECK(bits(got[1]) == bits(want[1]));
      }
    }
}
