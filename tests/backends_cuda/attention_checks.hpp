// tests/backends_cuda/attention_checks.hpp — what the cuda attention tests (test_cuda_gpu.cpp on a device,
// test_attention_emulated.cpp on the CPU) hold results to, written once: the closeness rule, the lse rule (rows
// with no visible key at -inf in both), and the tensor-core cases' document layouts.
// Include after doctest.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace attention_checks
