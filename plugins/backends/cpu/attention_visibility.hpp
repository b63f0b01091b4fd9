// cpu/attention_visibility.hpp — which keys a block of queries can see, for both attention kernel files
// (attention.cpp, f32; attention_bf16.cpp, bf16 products): the one statement of the masking rules that decides
// which tile pairs are skipped, computed without a mask, or masked (dew/backend.hpp's AttentionParams and
// segment_ids contract).
// G is the kernel's problem description: it needs `causal`, `window` (0 = none), `seg` (segment ids [B, S] or
// nullptr) and `S`. Positions are absolute (q_offset applied by the caller).
// Included by a kernel file inside its own namespace and target region, like vec16.hpp: scalar always-inline
// templates only, no includes (<algorithm> comes from the including file's first pass).

enum Vis { kNone, kPartial, kFull };

// Visibility of keys [s0, s1) to query positions [pmin, pmax] (kNone may be conservative: a kPartial block
// with nothing visible is still correct).
template <class G>
[[gnu::always_inline]] inline Vis classify(const G& g, int64_t pmin, int64_t pmax, int64_t s0, int64_t s1) {
  if (g.causal && s0 > pmax) return kNone;
  if (g.window && pmin - (s1 - 1) >= g.window) return kNone;
  const bool full = (!g.causal || s1 - 1 <= pmin) && (!g.window || pmax - s0 < g.window);
  return full ? kFull : kPartial;
}

// Segment visibility of keys [s0, s1) to queries at positions [pmin, pmax] of batch row b: kNone when their
// segment ranges do not meet (or every query is padding), kFull when all are one nonzero segment.
template <class G>
[[gnu::always_inline]] inline Vis classify_segments(const G& g, int64_t b, int64_t pmin, int64_t pmax, int64_t s0,
                                                    int64_t s1) {
  if (!g.seg) return kFull;
  const int32_t* row = g.seg + b * g.S;
  int32_t qlo = row[pmin], qhi = row[pmin], klo = row[s0], khi = row[s0];
  for (int64_t i = pmin + 1; i <= pmax; ++i) qlo = std::min(qlo, row[i]), qhi = std::max(qhi, row[i]);
  for (int64_t i = s0 + 1; i < s1; ++i) klo = std::min(klo, row[i]), khi = std::max(khi, row[i]);
  if (qhi == 0 || qhi < klo || khi < qlo) return kNone;
  return qlo == qhi && klo == khi && qlo == klo ? kFull : kPartial;
}

// Both rules at once; *seg_mask tells whether the segment mask must be applied inside the pair.
template <class G>
[[gnu::always_inline]] inline Vis classify_all(const G& g, int64_t b, int64_t pmin, int64_t pmax, int64_t s0,
                                               int64_t s1, bool* seg_mask) {
  const Vis pv = classify(g, pmin, pmax, s0, s1);
  *seg_mask = false;
  if (pv == kNone) return kNone;
  const Vis sv = classify_segments(g, b, pmin, pmax, s0, s1);
  if (sv == kNone) return kNone;
  *seg_mask = sv == kPartial;
  return pv == kFull && sv == kFull ? kFull : kPartial;
}
