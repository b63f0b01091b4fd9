// tests/train/test_qk_clip.cpp — QK-Clip (dew/qk_clip.hpp, kernel attention_max_logit) against independent
// host computations:
//   * the kernel's per-head max logit equals max over visible (b, t, s) of scale * q.k computed in double,
//     on every backend that loads here (ref, cpu; cuda where a GPU is present), for causal, windowed,
//     offset, grouped-query, softcapped (the raw score counts) and document-masked (segment ids) attention;
//   * an attention block's forward inside a recorder scope reports exactly that of its own q and k (after
//     rotary positions; both projection layouts), keeps the max over several forwards, and records nothing
//     without gradients or without a scope;
//   * qk_clip multiplies only the q rows of the query heads of groups whose max exceeds tau, and the k rows
//     of their kv head (weights and biases), by sqrt(tau / s) computed here, bit for bit; every other
//     element is unchanged; after the clip the group's max logit is tau.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/nn.hpp"
#include "dew/ops.hpp"
#include "dew/qk_clip.hpp"
#include "dew/registry.hpp"

namespace {

// ref and cpu, and cuda where it was built (not in a build without CUDA, such as tools/test.sh --sanitize's)
// and runs (its probe refuses machines without a GPU).
const std::vector<std::pair<std::string, dew::BackendPtr>>& backends() {
  static const std::vector<std::pair<std::string, dew::BackendPtr>> all = [] {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu"});
    std::vector<std::pair<std::string, dew::BackendPtr>> out;
    for (const char* name : {"ref", "cpu", "cuda"}) {
      try {
        if (std::string(name) == "cuda") dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"cuda"});
        out.emplace_back(name, dew::create_backend(name));
      } catch (const dew::Error& e) {
        if (std::string(name) != "cuda") throw;
        MESSAGE("cuda not tested here: " << std::string(e.what()));
      }
    }
    return out;
  }();
  return all;
}

// max over b, t and visible s of scale * q.k (q [B, T, Hq, D], k [B, S, Hkv, D] as host doubles; seg [B, S]
// the documents, or empty for one).
std::vector<double> host_max_logit(const std::vector<double>& q, const std::vector<double>& k, int64_t B, int64_t T,
                                   int64_t S, int64_t Hq, int64_t Hkv, int64_t D, const dew::AttentionParams& p,
                                   const std::vector<int32_t>& seg = {}) {
  std::vector<double> m(size_t(Hq), -std::numeric_limits<double>::infinity());
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t pos = p.q_offset + t;
          if ((p.causal && s > pos) || (p.window > 0 && pos - s >= p.window)) continue;
          if (!seg.empty() && (seg[size_t(b * S + pos)] == 0 || seg[size_t(b * S + s)] != seg[size_t(b * S + pos)]))
            continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[size_t(((b * T + t) * Hq + h) * D + d)] * k[size_t(((b * S + s) * Hkv + h / (Hq / Hkv)) * D + d)];
          m[size_t(h)] = std::max(m[size_t(h)], double(p.scale) * dot);
        }
  return m;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
      continue;
    }
    CHECK(std::fabs(got[i] - want[i]) <= rtol * (1.0 + std::fabs(want[i])));
  }
}

dew::nn::AttentionConfig block_config(dew::nn::AttentionLayout layout, int64_t heads, int64_t kv_heads, bool rotary,
                                      bool bias) {
  dew::nn::AttentionConfig c;
  c.dim = 32;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 8;
  c.rotary_dim = rotary ? 0 : -1;
  c.bias = bias;
  c.layout = layout;
  return c;
}

}  // namespace

TEST_CASE("attention_max_logit equals max scale * q.k over the visible pairs, computed in double, on every backend") {
  struct Case {
    const char* what;
    int64_t B, T, S, Hq, Hkv, D;
    bool causal;
    int64_t window, q_offset;
    float softcap;
    int64_t doc = 0;  // > 0: packed documents of this many tokens, the last S / 8 keys padding (segment 0)
  };
  const Case cases[] = {
      {"causal, 2 query blocks", 2, 70, 70, 4, 4, 16, true, 0, 0, 0.0f},
      {"grouped heads, head width 13", 1, 40, 40, 6, 2, 13, true, 0, 0, 0.0f},
      {"window", 2, 90, 90, 2, 1, 16, true, 9, 0, 0.0f},
      {"non-causal cross", 1, 12, 30, 2, 2, 32, false, 0, 0, 0.0f},
      {"q_offset", 2, 5, 37, 4, 2, 16, true, 0, 32, 0.0f},
      {"softcap is not applied to the statistic", 1, 20, 20, 2, 2, 16, true, 0, 0, 1.5f},
      {"nothing visible", 1, 3, 8, 2, 2, 16, true, 0, -5, 0.0f},
      {"documents of a packed row, padding", 2, 80, 80, 4, 2, 16, true, 0, 0, 0.0f, 7},
      {"documents, non-causal", 1, 40, 40, 2, 2, 16, false, 0, 0, 0.0f, 9},
  };
  // bf16 q and k as well (bf16-mixed training with MuonClip): a backend without a bf16 kernel gets the core's
  // conversion (the values are exact in f32, so the same double reference holds).
  for (const auto& [name, be] : backends())
    for (const dew::DType dtype : {dew::DType::f32, dew::DType::bf16})
      for (const Case& c : cases) {
        CAPTURE(name);
        const std::string dtype_name = dew::dtype_name(dtype);
        CAPTURE(dtype_name);
        CAPTURE(c.what);
        dew::AttentionParams p;
        p.scale = 0.3f;
        p.causal = c.causal;
        p.window = c.window;
        p.q_offset = c.q_offset;
        p.softcap = c.softcap;
        const dew::Tensor q = dew::cast(dew::Tensor::uniform({c.B, c.T, c.Hq, c.D}, -2, 2, 11, 1, be), dtype);
        const dew::Tensor k = dew::cast(dew::Tensor::uniform({c.B, c.S, c.Hkv, c.D}, -2, 2, 11, 2, be), dtype);
        std::vector<int32_t> seg;
        dew::Tensor segment_ids;
        if (c.doc > 0) {
          for (int64_t b = 0; b < c.B; ++b)
            for (int64_t s = 0; s < c.S; ++s) seg.push_back(s >= c.S - c.S / 8 ? 0 : int32_t(1 + (s + 3 * b) / c.doc));
          segment_ids = dew::Tensor::from_ints(seg, {c.B, c.S}, be);
        }
        const std::vector<double> want =
            host_max_logit(q.to_doubles(), k.to_doubles(), c.B, c.T, c.S, c.Hq, c.Hkv, c.D, p, seg);
        const dew::Tensor got = dew::attention_max_logit(q, k, p, segment_ids);
        CHECK(got.shape() == dew::Shape{c.Hq});
        check_close(got.to_doubles(), want, 2e-6);
        // The heads differ (a kernel that mixed heads up or reduced over the wrong axis would show it).
        if (!std::isinf(want[0])) CHECK(want[0] != want[1]);
        // Documents matter: the unsegmented maxima are larger for some head (keys of other documents count).
        if (c.doc > 0) {
          const std::vector<double> all =
              host_max_logit(q.to_doubles(), k.to_doubles(), c.B, c.T, c.S, c.Hq, c.Hkv, c.D, p);
          bool larger = false;
          for (size_t h = 0; h < all.size(); ++h) larger = larger || all[h] > want[h];
          CHECK(larger);
        }
      }
}

TEST_CASE("an attention block reports its heads' max logit inside a recorder scope, only there") {
  using dew::nn::AttentionLayout;
  for (const auto& [name, be] : backends()) {
    CAPTURE(name);
    dew::set_default_backend(be);
    for (AttentionLayout layout : {AttentionLayout::separate, AttentionLayout::fused})
      for (bool rotary : {true, false}) {
        const int64_t kv = layout == AttentionLayout::fused && !rotary ? 4 : 2;  // fused + MHA: the fused op path
        CAPTURE(int(layout));
        CAPTURE(rotary);
        dew::nn::Attention block(block_config(layout, 4, kv, rotary, true));
        block.initialize(5);
        const dew::Tensor x1 = dew::Tensor::uniform({2, 24, 32}, -1, 1, 9, 1, be);
        const dew::Tensor x2 = dew::Tensor::uniform({2, 24, 32}, -3, 3, 9, 2, be);
        std::vector<int32_t> pos(24);
        for (int i = 0; i < 24; ++i) pos[size_t(i)] = i;
        const dew::Tensor positions = dew::Tensor::from_ints(pos, {24}, be);
        auto expected = [&](const dew::Tensor& x) {
          dew::NoGradGuard no_grad;
          auto [q, k, v] = block.project(x, positions);
          return host_max_logit(q.to_doubles(), k.to_doubles(), 2, 24, 24, 4, kv, 8, block.params());
        };
        const std::vector<double> m1 = expected(x1), m2 = expected(x2);
        dew::MaxLogitRecorder rec;
        {
          dew::MaxLogitRecorder::Scope scope(&rec);
          block.forward(x1, positions);
          REQUIRE(rec.sites().size() == 1);
          CHECK(rec.sites()[0].attention == &block);
          check_close(rec.sites()[0].max_logit.to_doubles(), m1, 2e-6);
          block.forward(x2, positions);  // a second micro-batch: the running max
          std::vector<double> both(4);
          for (size_t h = 0; h < 4; ++h) both[h] = std::max(m1[h], m2[h]);
          REQUIRE(rec.sites().size() == 1);
          check_close(rec.sites()[0].max_logit.to_doubles(), both, 2e-6);
          rec.reset();
          dew::NoGradGuard no_grad;  // a frozen / no-grad forward is not recorded
          block.forward(x1, positions);
          CHECK_FALSE(rec.sites()[0].max_logit.defined());
        }
        block.forward(x1, positions);  // outside the scope
        CHECK_FALSE(rec.sites()[0].max_logit.defined());
      }
  }
}

TEST_CASE("qk_clip scales exactly the q/k rows of the groups above tau by sqrt(tau / s), the rest is untouched") {
  using dew::nn::AttentionLayout;
  const double tau = 2.0;
  for (const auto& [name, be] : backends()) {
    CAPTURE(name);
    dew::set_default_backend(be);
    for (AttentionLayout layout : {AttentionLayout::separate, AttentionLayout::fused}) {
      CAPTURE(int(layout));
      const int64_t H = 6, KV = 3, G = H / KV, hd = 8;
      dew::nn::Attention block(block_config(layout, H, KV, true, true));
      block.initialize(3);
      // group 0: heads 0, 1 (max 5 > tau); group 1: heads 2, 3 (<= tau: untouched); group 2: heads 4, 5 (max 9)
      const std::vector<double> head_max = {1.0, 5.0, 2.0, -1.0, 9.0, 3.0};
      const std::vector<double> group_max = {5.0, 2.0, 9.0};
      CHECK(dew::qk_group_max(head_max, KV) == group_max);
      auto factor_q = [&](int64_t row) {  // independent of the implementation: row -> head -> group
        const double s = group_max[size_t(row / hd / G)];
        return s > tau ? float(std::sqrt(tau / s)) : 1.0f;
      };
      auto factor_k = [&](int64_t row) {
        const double s = group_max[size_t(row / hd)];
        return s > tau ? float(std::sqrt(tau / s)) : 1.0f;
      };
      auto factor = [&](int64_t row) {  // a row of the projection(s): q block, k block, then v (fused)
        if (row < H * hd) return factor_q(row);
        if (row < (H + KV) * hd) return factor_k(row - H * hd);
        return 1.0f;
      };
      std::vector<dew::Tensor> tensors;
      if (layout == AttentionLayout::fused) {
        tensors = {block.qkv->weight, block.qkv->bias};
      } else {
        tensors = {block.q_proj->weight, block.q_proj->bias, block.k_proj->weight, block.k_proj->bias,
                   block.v_proj->weight, block.o_proj->weight};
      }
      std::vector<std::vector<float>> before;
      for (const dew::Tensor& t : tensors) before.push_back(t.to_floats());
      CHECK(dew::qk_clip(block, head_max, tau) == 2);
      for (size_t i = 0; i < tensors.size(); ++i) {
        const dew::Tensor& t = tensors[i];
        const std::vector<float> after = t.to_floats();
        const int64_t cols = t.ndim() == 2 ? t.shape()[1] : 1;
        int64_t changed = 0;
        for (int64_t e = 0; e < t.numel(); ++e) {
          const int64_t row = e / cols;
          float f = 1.0f;
          if (layout == AttentionLayout::fused) f = factor(row);
          else if (i < 2) f = factor_q(row);
          else if (i < 4) f = factor_k(row);
          const float want = before[i][size_t(e)] * f;
          if (after[size_t(e)] != before[i][size_t(e)]) ++changed;
          if (after[size_t(e)] != want) {
            FAIL_CHECK("tensor " << i << " element " << e << " (row " << row << "): " << after[size_t(e)]
                                  << ", want " << want);
            break;
          }
        }
        if (layout == AttentionLayout::separate && i >= 4) CHECK(changed == 0);  // v and o never change
      }
      CHECK(dew::qk_clip(block, {1.0, 2.0, 0.5, 2.0, -3.0, 1.5}, tau) == 0);  // nothing above tau: no change
    }
  }
}

TEST_CASE("after qk_clip a clipped group's max logit is tau, the other groups keep theirs") {
  for (const auto& [name, be] : backends()) {
    CAPTURE(name);
    dew::set_default_backend(be);
    dew::nn::Attention block(block_config(dew::nn::AttentionLayout::separate, 4, 2, true, false));
    block.initialize(8);
    const dew::Tensor x = dew::Tensor::uniform({1, 32, 32}, -4, 4, 2, 1, be);
    std::vector<int32_t> pos(32);
    for (int i = 0; i < 32; ++i) pos[size_t(i)] = i;
    const dew::Tensor positions = dew::Tensor::from_ints(pos, {32}, be);
    auto group_max = [&] {
      dew::MaxLogitRecorder rec;
      dew::MaxLogitRecorder::Scope scope(&rec);
      block.forward(x, positions);
      return std::make_pair(rec.sites()[0].max_logit.to_doubles(), dew::qk_group_max(rec.sites()[0].max_logit.to_doubles(), 2));
    };
    const auto [heads, groups] = group_max();
    const double tau = 0.5 * (groups[0] + groups[1]);  // between the two groups: exactly one is clipped
    REQUIRE(groups[0] != groups[1]);
    CHECK(dew::qk_clip(block, heads, tau) == 1);
    const auto [heads2, groups2] = group_max();
    const size_t hi = groups[0] > groups[1] ? 0 : 1, lo = 1 - hi;
    CHECK(groups2[hi] == doctest::Approx(tau).epsilon(1e-5));
    CHECK(groups2[lo] == doctest::Approx(groups[lo]).epsilon(1e-6));
  }
}

TEST_CASE("qk_clip refuses a block with q/k norm and a non-positive tau") {
  dew::set_default_backend(backends()[0].second);
  auto c = block_config(dew::nn::AttentionLayout::separate, 2, 2, true, false);
  c.qk_norm = true;
  dew::nn::Attention normed(c);
  CHECK_THROWS_AS(dew::qk_clip(normed, {10.0, 10.0}, 1.0), dew::UsageError);
  dew::nn::Attention plain(block_config(dew::nn::AttentionLayout::separate, 2, 2, true, false));
  CHECK_THROWS_AS(dew::qk_clip(plain, {10.0, 10.0}, 0.0), dew::UsageError);
}
