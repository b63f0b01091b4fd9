// core/generate/sampling.cpp — the sampling chain of dew/generate.hpp: sample_token, sampling_distribution, validate,
// and token_logprob (a request's log-probabilities, through the same passes).
//
// The chain works on host doubles: logits -> repetition penalty -> (temperature 0: argmax) -> / T -> top_k ->
// softmax -> top_p -> min_p -> renormalise -> draw u = philox::uniform(seed, stream, draw) against the cumulative
// sum in descending probability (ties by id). That order makes the draw independent of the vocabulary order of
// equal-probability tokens and matches what "top" means in every filter.
// Invariants: nothing ranks the whole vocabulary (a heap scan or a radix select for top_k, radix selects for top_p
// and the draw, in-place compactions: O(vocab) per token), and the result is the token a full sort would give, up
// to the rounding of the weights and their sums (tests/lm: against a full-sort reference over 50,257 tokens).
// How: the tokens in play are three arrays (keys, weights, ids: a thread's scratch, reused so that a warm draw
// allocates nothing) in ascending id order. The keys are the penalised logits themselves (dividing by a positive
// temperature does not change their order); the temperature enters with the weights, e = exp((z - max z) / T),
// from an exp written here (vectorisable, within 1 ulp of libm's over [-708, 0]) instead of a libm call per token.
// Every pass over a vocabulary is a loop the compiler vectorises at each clone's width (min / max over ordered
// integer keys; sums as GCC vector code in a fixed lane order), compiled once per ISA and chosen at load
// (target_clones: x86-64-v4 = AVX-512, v3 = AVX2 + FMA, the baseline), with no contraction into FMAs
// (core/CMakeLists.txt: -ffp-contract=off) and none written, so every clone computes the same bits and a draw does
// not depend on the CPU it runs on (checked by building the chain for each ISA alone: the same distributions and
// draws over 13K settings).
// Measured (dew-bench kernels --only sampling, Emerald Rapids Xeon, 1 thread, 50,304 ids): a temperature draw
// 0.88-0.99 ms -> 0.18-0.24, top_k 50 0.83-0.88 -> 0.08, top_p 0.9 1.02-1.42 -> 0.26-0.35; the x86-64-v3 and baseline
// builds of the chain alone 0.27 and 0.41 ms a temperature draw. The libm calls were a fifth of the old chain, its
// array-of-structs passes and the nth_element most of the rest.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/random.hpp"

#if defined(DEW_SAMPLING_CLONES)  // set from outside: a build that checks one path alone
#elif defined(__SANITIZE_THREAD__)
// ThreadSanitizer: target_clones' ifunc resolvers run while the dynamic loader relocates libdew, before TSan's runtime
// is up, and their instrumented code crashed every TSan executable at load (tools/test.sh --tsan). One path there.
#define DEW_SAMPLING_CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DEW_SAMPLING_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DEW_SAMPLING_CLONES
#endif

#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vectors returned by always-inline helpers (sum_of's Lanes)

namespace dew {

namespace {

constexpr uint64_t kSampleStream = 0x73616d706c650000ull;  // "sample": keeps draws apart from other streams

// One token: z its key (the penalised logit; NaN made -inf), e its weight exp((z - max z) / T) in [0, 1] (its
// probability is e over the kept tokens' sum), id its index in the vocabulary.
struct Token {
  double z, e;
  int32_t id;
};

// The chain's order: higher z first, ties by lower id. A strict total order, so every selection under it puts the
// same tokens in the same places.
bool before(double az, int32_t aid, double bz, int32_t bid) { return az > bz || (az == bz && aid < bid); }
bool before(const Token& a, const Token& b) { return before(a.z, a.id, b.z, b.id); }

// Tokens as three arrays of n entries.
struct Tokens {
  double* z;
  double* e;
  int32_t* id;
  size_t n;
};

// The buffers a thread's draws reuse (a vocabulary's worth: 1 MB at 50,304 ids).
struct Scratch {
  std::vector<double> z, e, pool_z, pool_e;
  std::vector<int32_t> id, pool_id;
  std::vector<uint8_t> slice;
  std::vector<Token> leaf;
  std::vector<int32_t> repeated;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// ---- the vectorised passes (one clone per ISA; no reassociation, no contraction: the same bits in each) ----

// z[i] = logits[i] as a double, NaN made -inf.
DEW_SAMPLING_CLONES void widened_keys(const float* logits, size_t n, double* z) {
  for (size_t i = 0; i < n; ++i) {
    const double v = logits[i];
    z[i] = v == v ? v : -INFINITY;
  }
}

// Eight doubles as one GCC vector, for sums (the one pass whose bits depend on its order): AVX-512 code in the
// x86-64-v4 clone, two or four registers in the others (GCC splits + natively; it would not split compares or
// selects: those passes are plain loops), the same lane arithmetic in each. sum_of keeps four in flight (32
// running sums, by index mod 32), so that it does not wait on one chain of latencies.
typedef double Lanes __attribute__((vector_size(64)));
constexpr size_t kWidth = 8, kBlock = 32;
[[gnu::always_inline]] inline Lanes load_lanes(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline Lanes splat(double x) { return Lanes{x, x, x, x, x, x, x, x}; }

// Doubles (no NaN) as int64 keys in the same order, so that min / max reductions vectorise at each clone's own
// width (GCC keeps floating-point min / max reductions scalar without -ffinite-math-only, and 64-byte vector
// compares on AVX2 lane by lane): negative values have their magnitude bits flipped. Exact both ways.
inline int64_t order_key(double z) {
  const int64_t b = std::bit_cast<int64_t>(z);
  return b ^ ((b >> 63) & INT64_MAX);
}
inline double from_order_key(int64_t k) { return std::bit_cast<double>(k ^ ((k >> 63) & INT64_MAX)); }

// The largest z (z holds no NaN; -inf when n is 0).
DEW_SAMPLING_CLONES double max_of(const double* z, size_t n) {
  int64_t m = order_key(-INFINITY);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = order_key(z[i]);
    m = k > m ? k : m;
  }
  return from_order_key(m);
}

// exp(x) for x <= 0 (-inf included), within a few ulp: x = k ln2 + r (Cody-Waite: ln2's high part has 32 bits, so
// k ln2_hi is exact for |k| < 2^11), |r| <= ln2 / 2, exp(r) by its Taylor series to degree 13 (truncation below
// 2^-57), times 2^k built in the exponent field. Plain products and sums (no std::fma: the baseline clone would
// call libm's software fma, ~30x slower), so every clone computes the same bits. Below -708 (where 2^k would be
// subnormal) the weight is 0: such a token is over 300 orders of magnitude below the most likely one.
inline double exp_nonpositive(double x) {
  constexpr double kLog2e = 0x1.71547652b82fep0, kShifter = 0x1.8p52;
  constexpr double kLn2Hi = 0x1.62e42feep-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  const double xc = x < -708.0 ? -708.0 : x;  // -inf too
  const double t = xc * kLog2e + kShifter;    // k in t's low mantissa bits, rounded to nearest
  const double k = t - kShifter;
  const double r = (xc - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1 / 13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int64_t ki = std::bit_cast<int64_t>(t) - std::bit_cast<int64_t>(kShifter);  // k, in [-1022, 0]
  const double scale = std::bit_cast<double>(uint64_t(ki + 1023) << 52);
  return x < -708.0 ? 0.0 : p * scale;
}

// e[i] = exp((z[i] - top) / temperature), the division as a product by 1 / temperature.
DEW_SAMPLING_CLONES void weigh(const double* z, size_t n, double top, double inverse_temperature, double* e) {
  for (size_t i = 0; i < n; ++i) e[i] = exp_nonpositive((z[i] - top) * inverse_temperature);
}

// The sum of e in a fixed order (32 running sums by index mod 32, added in a fixed tree): the same bits in every
// clone.
DEW_SAMPLING_CLONES double sum_of(const double* e, size_t n) {
  Lanes s[4] = {splat(0), splat(0), splat(0), splat(0)};
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (size_t j = 0; j < 4; ++j) s[j] += load_lanes(e + i + kWidth * j);
  double tail = 0;
  for (; i < n; ++i) tail += e[i];
  const Lanes all = (s[0] + s[1]) + (s[2] + s[3]);
  return (((all[0] + all[1]) + (all[2] + all[3])) + ((all[4] + all[5]) + (all[6] + all[7]))) + tail;
}

// The range of z over the tokens of positive weight, and their count.
DEW_SAMPLING_CLONES size_t positive_range(const double* z, const double* e, size_t n, double* lo, double* hi) {
  int64_t l = order_key(INFINITY), h = order_key(-INFINITY), c = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool positive = e[i] > 0;
    const int64_t k = order_key(z[i]);
    const int64_t low = positive ? k : order_key(INFINITY), high = positive ? k : order_key(-INFINITY);
    l = low < l ? low : l;
    h = high > h ? high : h;
    c += positive;
  }
  *lo = from_order_key(l);
  *hi = from_order_key(h);
  return size_t(c);
}

// The first index from `from` on whose z exceeds `threshold` (n when none): eight branch-free compares a step.
DEW_SAMPLING_CLONES size_t first_above(const double* z, size_t from, size_t n, double threshold) {
  size_t i = from;
  for (; i + 8 <= n; i += 8) {
    bool any = false;
    for (size_t k = 0; k < 8; ++k) any |= z[i + k] > threshold;
    if (any) break;
  }
  for (; i < n; ++i)
    if (z[i] > threshold) return i;
  return n;
}

// slice[i] = which of 256 equal slices of [lo, hi] holds z[i], counted from the top (0 holds hi); z below lo (and
// -inf) in the last. Differences of halves, so that no range of finite keys overflows.
DEW_SAMPLING_CLONES void slice_keys(const double* z, size_t n, double hi, double per_slice, uint8_t* slice) {
  const double half_hi = hi * 0.5;
  for (size_t i = 0; i < n; ++i) {
    const double d = (half_hi - z[i] * 0.5) * per_slice;  // >= 0; +inf for z = -inf
    slice[i] = uint8_t(int32_t(d < 255.0 ? d : 255.0));
  }
}

// ---- the chain ----

// Keeps the tokens for which keep(z, e, id) holds, in their order; returns how many.
template <class Keep>
size_t keep_if(Tokens t, Keep keep) {
  size_t kept = 0;
  for (size_t i = 0; i < t.n; ++i)
    if (keep(t.z[i], t.e[i], t.id[i])) {
      t.z[kept] = t.z[i];
      t.e[kept] = t.e[i];
      t.id[kept] = t.id[i];
      ++kept;
    }
  return kept;
}

// The token at which the cumulative weight of `tokens` (any order), walked in the chain's order, first exceeds
// `target` (`or_equal`: first reaches it). A radix select on z: one pass sums the weight in each of 256 equal slices
// of the range of z, the slice holding the target is gathered and sliced again, until at most 64 tokens (or all of
// one z) are left, which are sorted and walked. Tokens of weight 0 never hold a target; when rounding puts the
// target past the whole weight, the last token of positive weight is the answer.
Token crossing(Tokens tokens, double target, bool or_equal) {
  constexpr int kSlices = 256;
  constexpr size_t kSortedLeaf = 64;
  const auto reached = [or_equal](double t, double cum) { return or_equal ? t <= cum : t < cum; };
  Scratch& s = scratch();
  Tokens from = tokens;  // the tokens still in play: `tokens`, then the pool
  while (true) {
    double lo, hi;
    const size_t n = positive_range(from.z, from.e, from.n, &lo, &hi);
    DEW_CHECK(n > 0, "sample_token: no token has a positive probability");
    const double per_slice = double(kSlices) / (hi * 0.5 - lo * 0.5);  // +inf when lo == hi
    if (n <= kSortedLeaf || !(per_slice < INFINITY)) {  // (or keys too close to slice: sorted as they are)
      s.leaf.clear();
      for (size_t i = 0; i < from.n; ++i)
        if (from.e[i] > 0) s.leaf.push_back({from.z[i], from.e[i], from.id[i]});
      std::sort(s.leaf.begin(), s.leaf.end(), [](const Token& a, const Token& b) { return before(a, b); });
      double cum = 0;
      for (const Token& t : s.leaf)
        if (reached(target, cum += t.e)) return t;
      return s.leaf.back();  // rounding: the target sits at the very end of the weight
    }
    s.slice.resize(from.n);
    slice_keys(from.z, from.n, hi, per_slice, s.slice.data());
    double mass[4][kSlices] = {};  // four partial histograms: consecutive tokens in one slice do not wait on each other
    size_t i = 0;
    for (; i + 4 <= from.n; i += 4)
      for (size_t j = 0; j < 4; ++j) mass[j][s.slice[i + j]] += from.e[i + j];
    for (; i < from.n; ++i) mass[0][s.slice[i]] += from.e[i];
    int at = 0;
    double cum = 0;
    while (true) {
      const double m = (mass[0][at] + mass[1][at]) + (mass[2][at] + mass[3][at]);
      if (at == kSlices - 1 || reached(target, cum + m)) break;
      cum += m;
      ++at;
    }
    target -= cum;
    if (from.z != s.pool_z.data()) {
      s.pool_z.resize(from.n);
      s.pool_e.resize(from.n);
      s.pool_id.resize(from.n);
    }
    size_t kept = 0;  // gathered in place when reading the pool itself: kept never passes the reading position
    const auto take = [&](size_t k) {
      if (s.slice[k] == at && from.e[k] > 0) {
        s.pool_z[kept] = from.z[k];
        s.pool_e[kept] = from.e[k];
        s.pool_id[kept] = from.id[k];
        ++kept;
      }
    };
    // Eight slice numbers at a time: a word holding no `at` (no zero byte once xor-ed with it) is skipped whole.
    constexpr uint64_t kOnes = 0x0101010101010101ull, kHighs = 0x8080808080808080ull;
    const uint64_t pattern = kOnes * uint64_t(at);
    size_t k = 0;
    for (; k + 8 <= from.n; k += 8) {
      uint64_t word;
      std::memcpy(&word, s.slice.data() + k, 8);
      const uint64_t x = word ^ pattern;
      if (((x - kOnes) & ~x & kHighs) == 0) continue;
      for (size_t j = k; j < k + 8; ++j) take(j);
    }
    for (; k < from.n; ++k) take(k);
    from = {s.pool_z.data(), s.pool_e.data(), s.pool_id.data(), kept};
  }
}

// Keys of the whole vocabulary (the thread's scratch z; ids and weights sized, not filled): the penalised logits,
// NaN made -inf. They rank the tokens as the penalised logits over the temperature do (a positive scale); the
// temperature enters with the weights (weigh()).
Tokens keys(const float* logits, size_t vocab, const SamplingParams& p, const std::vector<int32_t>& history) {
  Scratch& s = scratch();
  s.z.resize(vocab);
  s.e.resize(vocab);
  s.id.resize(vocab);
  widened_keys(logits, vocab, s.z.data());
  if (p.repetition_penalty != 1.0f) {
    s.repeated.clear();
    for (int32_t t : history)
      if (t >= 0 && size_t(t) < vocab) s.repeated.push_back(t);
    std::sort(s.repeated.begin(), s.repeated.end());
    s.repeated.erase(std::unique(s.repeated.begin(), s.repeated.end()), s.repeated.end());
    for (int32_t t : s.repeated) {
      double& v = s.z[size_t(t)];
      v = v < 0 ? v * p.repetition_penalty : v / p.repetition_penalty;  // NaN stays -inf
    }
  }
  return {s.z.data(), s.e.data(), s.id.data(), vocab};
}

// The first index of the vocabulary's keys holding `top`.
int32_t first_of(const Tokens& vocabulary, double top) {
  size_t i = 0;
  while (i + 1 < vocabulary.n && vocabulary.z[i] != top) ++i;
  return int32_t(i);
}

// top_k of at most this many tokens is a scan with a heap (best_of), above it a count select (crossing()).
constexpr size_t kHeapTopK = 4096;

// Keeps the k best tokens of the whole vocabulary (ids 0..n-1 in order) in ascending id order; returns k. One scan
// keeps the k best seen so far in a heap whose front is the worst of them: a later token (a higher id) enters only
// with a larger z, and first_above() skips the tokens that cannot, eight at a time.
size_t best_of(Tokens t, size_t k) {
  std::vector<Token>& heap = scratch().leaf;
  heap.clear();
  const auto worse_last = [](const Token& a, const Token& b) { return before(a, b); };  // front: the worst kept
  for (size_t i = 0; i < k; ++i) heap.push_back({t.z[i], 0, t.id[i]});
  std::make_heap(heap.begin(), heap.end(), worse_last);
  for (size_t i = first_above(t.z, k, t.n, heap.front().z); i < t.n; i = first_above(t.z, i + 1, t.n, heap.front().z)) {
    std::pop_heap(heap.begin(), heap.end(), worse_last);
    heap.back() = {t.z[i], 0, t.id[i]};
    std::push_heap(heap.begin(), heap.end(), worse_last);
  }
  std::sort(heap.begin(), heap.end(), [](const Token& a, const Token& b) { return a.id < b.id; });
  for (size_t i = 0; i < k; ++i) {
    t.z[i] = heap[i].z;
    t.id[i] = heap[i].id;
  }
  return k;
}

// The chain up to the draw, for temperature > 0: the tokens it keeps (in ascending id order, over the thread's
// scratch) with their weights, and the sum of the weights. top_k is a count select (a crossing() over weights of 1)
// and a compaction at its token, top_p a crossing() and a compaction at its token, min_p a threshold (e >= min_p:
// a probability >= min_p times the largest, whose e is 1).
Tokens filter(const float* logits, size_t vocab, const SamplingParams& p, const std::vector<int32_t>& history,
              double* total) {
  Tokens t = keys(logits, vocab, p, history);
  std::iota(t.id, t.id + t.n, 0);
  const double top = max_of(t.z, t.n);
  if (std::isinf(top)) {  // +inf takes all the weight; all -inf: the first id
    const int32_t first = top > 0 ? first_of(t, top) : 0;
    t.z[0] = top;
    t.e[0] = 1;
    t.id[0] = first;
    t.n = 1;
    *total = 1;
    return t;
  }
  if (p.top_k > 0 && size_t(p.top_k) < vocab) {
    if (size_t(p.top_k) <= kHeapTopK) {
      t.n = best_of(t, size_t(p.top_k));
    } else {  // count the tokens: the k-th in the chain's order is where the count reaches k
      std::fill(t.e, t.e + t.n, 1.0);
      const Token kth = crossing(t, double(p.top_k), true);
      t.n = keep_if(t, [&](double z, double, int32_t id) { return !before(kth.z, kth.id, z, id); });
    }
  }
  weigh(t.z, t.n, top, 1.0 / double(p.temperature), t.e);
  const size_t unfiltered = t.n;
  double sum = sum_of(t.e, t.n);
  if (p.top_p < 1.0f) {  // the smallest prefix with cumulative probability >= top_p (at least one token)
    const Token last = crossing(t, (double(p.top_p) - 1e-12) * sum, true);
    t.n = keep_if(t, [&](double z, double, int32_t id) { return !before(last.z, last.id, z, id); });
  }
  if (p.min_p > 0.0f)  // relative to the most likely token (probabilities after temperature)
    t.n = keep_if(t, [&](double, double e, int32_t) { return e >= double(p.min_p); });
  if (t.n != unfiltered) sum = sum_of(t.e, t.n);
  *total = sum;
  return t;
}

// Greedy: the first id of the largest penalised logit; NaN never wins, unless every logit is NaN (then id 0).
int32_t argmax_of(const float* logits, size_t vocab, const SamplingParams& p, const std::vector<int32_t>& history) {
  const Tokens t = keys(logits, vocab, p, history);
  const double top = max_of(t.z, t.n);
  if (top > -INFINITY) return first_of(t, top);
  for (size_t i = 0; i < vocab; ++i)  // every key -inf: the first that is not NaN
    if (!std::isnan(logits[i])) return int32_t(i);
  return 0;
}

}  // namespace

void validate(const SamplingParams& p) {
  DEW_USAGE_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
                  "sampling: temperature must be >= 0 (0 = greedy), got ", p.temperature);
  DEW_USAGE_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p must be in (0, 1], got ", p.top_p);
  DEW_USAGE_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "sampling: min_p must be in [0, 1], got ", p.min_p);
  DEW_USAGE_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
                  "sampling: repetition_penalty must be positive (1 = off), got ", p.repetition_penalty);
  DEW_USAGE_CHECK(p.top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got ", p.top_k);
  // An upper bound so a typo cannot run unbounded (2^24 tokens: days of decoding; their ids alone 64 MiB).
  constexpr int64_t kMaxNewTokens = int64_t(1) << 24;
  DEW_USAGE_CHECK(p.max_new_tokens >= 0 && p.max_new_tokens <= kMaxNewTokens,
                  "sampling: max_new_tokens must be in [0, ", kMaxNewTokens, "], got ", p.max_new_tokens);
  DEW_USAGE_CHECK(p.prefill_chunk >= 0, "sampling: prefill_chunk must be >= 0 (0 = whole prompts), got ",
                  p.prefill_chunk);
  for (const std::string& s : p.stop) DEW_USAGE_CHECK(!s.empty(), "sampling: a stop string is empty");
  DEW_USAGE_CHECK(p.logprobs >= -1 && p.logprobs <= kMaxLogprobs, "sampling: logprobs must be in [-1, ", kMaxLogprobs,
                  "] (-1 = none), got ", p.logprobs);
  DEW_USAGE_CHECK(!p.prompt_logprobs || p.logprobs >= 0, "sampling: prompt_logprobs needs logprobs >= 0");
  DEW_USAGE_CHECK(!p.prompt_logprobs || p.max_new_tokens >= 1,
                  "sampling: prompt_logprobs needs max_new_tokens >= 1 (the prompt is fed with the first draw)");
}

// The log-softmax through the chain's own passes (the thread's scratch, the vectorised exp and the fixed-order sum);
// the likeliest tokens by jumps to the next key above the list's last (first_above), ties kept in id order.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top) {
  DEW_CHECK(vocab > 0 && token >= 0 && token < vocab, "token_logprob: token ", token, " outside [0, ", vocab, ")");
  Scratch& s = scratch();
  const size_t n = size_t(vocab);
  s.z.resize(n);
  s.e.resize(n);
  widened_keys(logits, n, s.z.data());
  const double peak = max_of(s.z.data(), n);
  TokenLogprob out;
  out.token = token;
  if (!(peak > -INFINITY)) {  // no finite logit: nothing has a probability
    out.logprob = -INFINITY;
    return out;
  }
  weigh(s.z.data(), n, peak, 1.0, s.e.data());
  const double log_total = peak + std::log(sum_of(s.e.data(), n));
  out.logprob = s.z[size_t(token)] - log_total;
  std::vector<std::pair<int32_t, double>>& best = out.top;  // largest first, ties by the smaller id
  const size_t want = size_t(std::clamp<int64_t>(top, 0, std::min(vocab, kMaxLogprobs)));
  double threshold = -INFINITY;  // a key must exceed it to enter the list (the list's last once it is full)
  for (size_t i = 0; want > 0 && (i = first_above(s.z.data(), i, n, threshold)) < n; ++i) {
    const double x = s.z[i];
    best.insert(std::find_if(best.begin(), best.end(), [&](const auto& b) { return x > b.second; }), {int32_t(i), x});
    if (best.size() > want) best.pop_back();
    if (best.size() == want) threshold = best.back().second;
  }
  for (auto& b : best) b.second -= log_total;
  return out;
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params,
                                          const std::vector<int32_t>& history) {
  DEW_CHECK(vocab > 0, "sampling_distribution: empty logits");
  std::vector<double> out(size_t(vocab), 0.0);
  if (params.temperature <= 0.0f) {
    out[size_t(argmax_of(logits, size_t(vocab), params, history))] = 1.0;
    return out;
  }
  double total;
  const Tokens kept = filter(logits, size_t(vocab), params, history, &total);
  for (size_t i = 0; i < kept.n; ++i) out[size_t(kept.id[i])] = kept.e[i] / total;
  return out;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params,
                     const std::vector<int32_t>& history, uint64_t draw_index, uint64_t stream) {
  DEW_CHECK(vocab > 0, "sample_token: empty logits");
  if (params.temperature <= 0.0f) return argmax_of(logits, size_t(vocab), params, history);
  double total;
  const Tokens kept = filter(logits, size_t(vocab), params, history, &total);
  if (kept.n == 1) return kept.id[0];
  // The token whose interval of the kept tokens' cumulative distribution, in the chain's order, holds u.
  const double u = double(philox::uniform(params.seed, kSampleStream ^ stream, draw_index));
  return crossing(kept, u * total, false).id;
}

}  // namespace dew
