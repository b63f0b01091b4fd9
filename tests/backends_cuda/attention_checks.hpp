// tests/backends_cuda/attention_checks.hpp — what the cuda attention tests (test_cuda_gpu.cpp on a device,
// test_attention_emulated.cpp on the CPU) hold results to, written once: the closeness rule, the lse rule (rows
// with no visible key at -inf in both), the cases' document layouts and parameters, and one attention forward and
// backward on a backend, read back.
// Include after doctest.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"

namespace attention_checks {

// |got - want| <= rtol * (|want| + rms(want)) everywhere.
inline void check_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                        const std::string& what) {
  REQUIRE(got.size() == want.size());
  double ss = 0;
  for (float w : want) ss += double(w) * w;
  const double rms = want.empty() ? 0 : std::sqrt(ss / double(want.size()));
  size_t bad = 0;
  double worst = 0, worst_ratio = 0;  // the largest error, and the largest err / (|want| + rms): the rtol it needs
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double scale = std::fabs(double(want[i])) + rms;
    if (!(err <= rtol * scale)) ++bad;
    worst = std::max(worst, err);
    if (scale > 0) worst_ratio = std::max(worst_ratio, err / scale);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " elements out of tolerance (worst error ", worst,
                "; it would pass at rtol ", worst_ratio, ", rms(want) ", rms, ")");
}

// lse: the same rows at -inf (no visible key), none NaN (unwritten), the finite rest close.
inline void check_lse(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                      const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::vector<float> g, w;
  size_t mismatched = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) != std::isinf(got[i]) || std::isnan(got[i])) ++mismatched;
    if (std::isfinite(want[i]) && std::isfinite(got[i])) g.push_back(got[i]), w.push_back(want[i]);
  }
  CHECK_MESSAGE(mismatched == 0, what, ": ", mismatched, " rows differ in having a visible key (or were not written)");
  check_close(g, w, rtol, what);
}

// The tensor-core cases' segment ids [B, S] (empty for kind 0), and the first padding position (segment 0):
//   kind 1: documents of 1, 20, 57 and 40 tokens (the last one's id per batch row), then padding from 118;
//   kind 2: 100 and 190 tokens, then padding from 290: with 64-row tiles, queries 128.. x keys 0..63 are
//           skipped, queries 192..255 x keys 128..191 unmasked, queries 256.. (some padding) x keys 128..191 masked.
inline int64_t padding_start(int kind) { return kind == 1 ? 118 : 290; }
inline std::vector<int32_t> document_ids(int kind, int64_t B, int64_t S) {
  std::vector<int32_t> seg;
  for (int64_t b = 0; b < B && kind != 0; ++b)
    for (int64_t s = 0; s < S; ++s)
      if (kind == 1)
        seg.push_back(s < 1 ? 1 : s < 21 ? 2 : s < 78 ? 3 : s < padding_start(1) ? 4 + int32_t(b) : 0);
      else
        seg.push_back(s < 100 ? 7 : s < padding_start(2) ? 9 : 0);
  return seg;
}

// Documents [B, S] of the warp-kernel and products cases: keys [0, 5) one document, [5, second_end) a second (its id
// differs per batch row), a third up to the last two keys, which are padding (id 0: their queries see no key).
inline std::vector<int32_t> three_documents(int64_t B, int64_t S, int64_t second_end) {
  std::vector<int32_t> seg;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) seg.push_back(s < 5 ? 1 : s < second_end ? 2 + int32_t(b) : s < S - 2 ? 3 : 0);
  return seg;
}

// out [B, T, width]: the rows t >= from of every batch row are exact zeros (padding queries see no key).
inline void check_zero_rows(const std::vector<float>& out, int64_t B, int64_t T, int64_t width, int64_t from) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = from; t < T; ++t)
      for (int64_t i = 0; i < width; ++i) CHECK(out[size_t((b * T + t) * width + i)] == 0.0f);
}

// A case's sizes: q and dO [B, T, Hq, D], k and v [B, S, Hkv, D].
struct Sizes {
  int64_t B, T, S, Hq, Hkv, D;
};

// One attention case of the tensor-core and products tests: sizes, mask and documents (segments 0: none; else the
// test's layout: document_ids' kind 1 or 2 in the tensor-core tests, three_documents in the products tests).
struct Case {
  const char* what;
  int64_t B, T, S, Hq, Hkv, D;
  bool causal;
  int64_t window;
  float softcap;
  int segments;
};

// The cases' parameters: scale 1 / sqrt(D), the queries at the last T of the S positions (q_offset = S - T).
inline dew::AttentionParams params_of(const Sizes& s, bool causal, int64_t window, float softcap) {
  dew::AttentionParams p;
  p.scale = 1.0f / std::sqrt(float(s.D));
  p.causal = causal;
  p.window = window;
  p.softcap = softcap;
  p.q_offset = s.S - s.T;
  return p;
}

// One attention forward and backward, read back as f32.
struct Result {
  std::vector<float> o, lse, dq, dk, dv;
};

// attention then attention_backward on `be`, q, k, v, dO and the results in dt (lse in f32), with segment ids [B, S]
// where `seg` is not empty.
inline Result run_attention(const dew::BackendPtr& be, dew::DType dt, const Sizes& s, const std::vector<float>& qv,
                            const std::vector<float>& kv, const std::vector<float>& vv, const std::vector<float>& gv,
                            const std::vector<int32_t>& seg, const dew::AttentionParams& p) {
  using dew::Tensor;
  Tensor q = Tensor::from_vector(qv, {s.B, s.T, s.Hq, s.D}, be, dt);
  Tensor k = Tensor::from_vector(kv, {s.B, s.S, s.Hkv, s.D}, be, dt);
  Tensor v = Tensor::from_vector(vv, {s.B, s.S, s.Hkv, s.D}, be, dt);
  Tensor g = Tensor::from_vector(gv, {s.B, s.T, s.Hq, s.D}, be, dt);
  Tensor sg = seg.empty() ? Tensor() : Tensor::from_ints(seg, {s.B, s.S}, be);
  Tensor o = Tensor::empty(q.shape(), dt, be), lse = Tensor::empty({s.B, s.Hq, s.T}, dew::DType::f32, be);
  Tensor dq = Tensor::empty(q.shape(), dt, be), dk = Tensor::empty(k.shape(), dt, be);
  Tensor dv = Tensor::empty(v.shape(), dt, be);
  be->attention(q, k, v, sg, o, lse, p);
  be->attention_backward(q, k, v, sg, o, lse, g, dq, dk, dv, p);
  be->synchronize();
  return Result{o.to_floats(), lse.to_floats(), dq.to_floats(), dk.to_floats(), dv.to_floats()};
}

}  // namespace attention_checks
