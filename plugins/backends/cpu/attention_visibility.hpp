// cpu/attention_visibility.hpp — which keys a block of queries can see, for both attention kernel files
// (attention.cpp, f32; attention_bf16.cpp, bf16 products): the one statement of the masking rules that decides
// which tile pairs are skipped, computed without a mask, or masked (dew/backend.hpp's AttentionParams and
// segment_ids contract); and, from the same rules, which task orders give every thread a run of equal cost (runs of
// batches, at the end).
// G is the kernel's problem description: it needs `causal`, `window` (0 = none), `seg` (segment ids [B, S] or
// nullptr), `S`, and for the runs `B` and `Hq`. Positions are absolute (q_offset applied by the caller).
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

// Runs of batches. At 2+ threads attention's tasks are split into one contiguous run of batches per thread (static
// schedule over the tasks in (batch, head, query block) order) instead of handed out one at a time (dynamic), wherever
// the runs cost the same: no segments (packed documents make a task's cost depend on its batch), and for the forward
// either tasks of one cost (no causal mask or window, or one block of queries a head) or a (batch, head) count the
// threads divide (each thread then gets whole (batch, head)s, which all cost the same, causal or not); the backward's
// (batch, kv head) tasks cost the same causal or not. The products around attention split their rows in contiguous
// blocks per thread too (oneDNN's and dew's), so a thread reads the q, k, v rows its own core wrote and writes the rows
// its core's next product reads, instead of half of them from the other core's cache. At 2 threads, medians of
// alternated `dew-bench train --profile` runs on the AMD EPYC Zen 5 (every static run faster than every dynamic one):
// the DiT (B16 H4 T64 D64) forward 2.80 -> 2.09 ms a step and backward 5.08 -> 4.08 (8 runs each), bf16-mixed 5.0 ->
// 4.1 both together; char-small's causal forward (B8 H6 T256) 12.96 -> 10.40 (5 each; its backward moved within
// noise). Which thread runs a task changes none of its bits.
// The forward's tasks are numbered longest query block first (task = block-from-the-end * B * Hq + b * Hq + h, with
// query_blocks blocks a head); these take them in (batch, head, block) order instead.
template <class G>
[[gnu::always_inline]] inline bool static_forward_runs(const G& g, int64_t query_blocks, int threads) {
  return !g.seg && ((!g.causal && g.window == 0) || query_blocks <= 1 || (g.B * g.Hq) % threads == 0);
}
template <class G>
[[gnu::always_inline]] inline int64_t forward_task_in_batch_order(const G& g, int64_t i, int64_t query_blocks) {
  return (query_blocks - 1 - i % query_blocks) * (g.B * g.Hq) + i / query_blocks;
}
// The backward's (batch, kv head) tasks each run every key and query block of theirs: one cost without segments.
template <class G>
[[gnu::always_inline]] inline bool static_backward_runs(const G& g) {
  return !g.seg;
}
