// core/generate/generate.cpp — the sampling chain and the generation loop of dew/generate.hpp.
//
// The chain works on host doubles: logits -> repetition penalty -> (temperature 0: argmax) -> / T ->
// top_k -> softmax -> top_p -> min_p -> renormalise -> draw u = philox::uniform(seed, stream, draw)
// against the cumulative sum in descending probability (ties by id). That order makes the draw independent
// of the vocabulary order of equal-probability tokens and matches what "top" means in every filter.
// Invariant: nothing ranks the whole vocabulary (a selection, radix selects and partitions: O(vocab) per
// token), and the result is the token a full sort would give, up to the rounding of the cumulative sums
// (tests/lm: against a full-sort reference over 50,257 tokens).
#include "dew/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"
#include "dew/tokenizer.hpp"
#include "step_program.hpp"

namespace dew {

namespace {

constexpr uint64_t kSampleStream = 0x73616d706c650000ull;  // "sample": keeps draws apart from other streams

// A token in the chain: z its key (the penalised logit over the temperature; NaN made -inf) and e its weight
// exp(z - max z), in [0, 1]: its probability is e over the kept tokens' sum.
struct Token {
  double z, e;
  int32_t id;
};

// The buffers a thread's draws reuse (a vocabulary's worth of tokens: 1.2 MB at 50,304 ids), so that a draw
// allocates nothing once warm: fresh buffers of that size cost page faults at every token.
struct Scratch {
  std::vector<double> z;
  std::vector<Token> tokens, pool;
  std::vector<int32_t> repeated;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Logits after the repetition penalty, as doubles (the thread's scratch z).
const std::vector<double>& penalised(const float* logits, int64_t vocab, const SamplingParams& p,
                                     const std::vector<int32_t>& history) {
  Scratch& s = scratch();
  s.z.assign(logits, logits + vocab);
  if (p.repetition_penalty != 1.0f) {
    s.repeated.clear();
    for (int32_t t : history)
      if (t >= 0 && t < vocab) s.repeated.push_back(t);
    std::sort(s.repeated.begin(), s.repeated.end());
    s.repeated.erase(std::unique(s.repeated.begin(), s.repeated.end()), s.repeated.end());
    for (int32_t t : s.repeated) {
      double& v = s.z[size_t(t)];
      v = v < 0 ? v * p.repetition_penalty : v / p.repetition_penalty;
    }
  }
  return s.z;
}

int64_t argmax_of(const std::vector<double>& z) {
  int64_t best = 0;
  for (int64_t i = 1; i < int64_t(z.size()); ++i)
    if (z[size_t(i)] > z[size_t(best)] || (std::isnan(z[size_t(best)]) && !std::isnan(z[size_t(i)]))) best = i;
  return best;
}

// The chain's order: higher z first, ties by lower id. A strict total order, so every selection or sort under
// it puts the same tokens in the same places.
bool before(const Token& a, const Token& b) { return a.z > b.z || (a.z == b.z && a.id < b.id); }

double mass_of(const std::vector<Token>& tokens) {
  double s = 0;
  for (const Token& t : tokens) s += t.e;
  return s;
}

// The token at which the cumulative weight of `tokens` (any arrangement), walked in the chain's order, first
// exceeds `target` (`or_equal`: first reaches it). A radix select on z: one pass sums the weight in each of
// 256 equal slices of the range of z, the slice holding the target is gathered and sliced again, until at
// most 64 tokens (or all of one z) are left, which are sorted and walked: O(n) per token where ranking every
// token (a sort) is O(n log n) — 5.5-6.9 ms for a 50,304-token vocabulary on the Emerald Rapids Xeon, at
// every token drawn. Tokens of weight 0 (z far below the top, or -inf) never hold a target; when rounding
// puts the target past the whole weight, the last token of positive weight is the answer.
Token crossing(const std::vector<Token>& tokens, double target, bool or_equal) {
  constexpr int kSlices = 256;
  constexpr size_t kSortedLeaf = 64;
  const auto reached = [or_equal](double t, double cum) { return or_equal ? t <= cum : t < cum; };
  std::vector<Token>& pool = scratch().pool;
  const std::vector<Token>* from = &tokens;  // the tokens still in play: `tokens` (those of positive weight), then pool
  while (true) {
    double lo = INFINITY, hi = -INFINITY;
    size_t n = 0;
    for (const Token& t : *from)
      if (t.e > 0) {
        lo = std::min(lo, t.z);
        hi = std::max(hi, t.z);
        ++n;
      }
    DEW_CHECK(n > 0, "sample_token: no token has a positive probability");
    if (n <= kSortedLeaf || lo == hi) {
      if (from != &pool) pool.assign(tokens.begin(), tokens.end());
      pool.erase(std::remove_if(pool.begin(), pool.end(), [](const Token& t) { return !(t.e > 0); }), pool.end());
      std::sort(pool.begin(), pool.end(), before);
      double cum = 0;
      for (const Token& t : pool)
        if (reached(target, cum += t.e)) return t;
      return pool.back();  // rounding: the target sits at the very end of the weight
    }
    const double per_slice = double(kSlices) / (hi - lo);
    const auto slice_of = [&](double z) { return std::min(kSlices - 1, int((hi - z) * per_slice)); };  // 0: top
    double mass[kSlices] = {};
    for (const Token& t : *from)
      if (t.e > 0) mass[slice_of(t.z)] += t.e;
    int s = 0;
    double cum = 0;
    while (s < kSlices - 1 && !reached(target, cum + mass[s])) cum += mass[s++];
    target -= cum;
    size_t kept = 0;  // gathered in place when reading the pool itself: kept never passes the reading position
    if (from != &pool) pool.resize(from->size());
    for (const Token& t : *from)
      if (t.e > 0 && slice_of(t.z) == s) pool[kept++] = t;
    pool.resize(kept);
    from = &pool;
  }
}

// The chain up to the draw, for temperature > 0: the tokens it keeps (the thread's scratch tokens, in no order)
// and the sum of their weights. Nothing ranks the whole vocabulary: top_k is a selection (nth_element), top_p a
// crossing() and a partition at its token, min_p a threshold (e >= min_p: a probability >= min_p times the
// largest, whose e is 1).
double filter(const std::vector<double>& penalised_logits, const SamplingParams& p, std::vector<Token>& tokens) {
  const size_t vocab = penalised_logits.size();
  tokens.resize(vocab);
  Token first{INFINITY, 0, -1};
  for (size_t i = 0; i < vocab; ++i) {
    Token& t = tokens[i];
    t.z = penalised_logits[i] / double(p.temperature);
    if (std::isnan(t.z)) t.z = -INFINITY;
    t.id = int32_t(i);
    if (first.id < 0 || before(t, first)) first = t;
  }
  const double top = first.z;
  if (std::isinf(top)) {  // +inf takes all the weight; all -inf: the first id
    first.e = 1;
    tokens.assign(1, first);
    return 1;
  }
  if (p.top_k > 0 && size_t(p.top_k) < vocab) {
    std::nth_element(tokens.begin(), tokens.begin() + long(p.top_k), tokens.end(), before);
    tokens.resize(size_t(p.top_k));
  }
  for (Token& t : tokens) t.e = std::exp(t.z - top);
  const size_t unfiltered = tokens.size();
  double total = mass_of(tokens);
  if (p.top_p < 1.0f) {  // the smallest prefix with cumulative probability >= top_p (at least one token)
    const Token last = crossing(tokens, (double(p.top_p) - 1e-12) * total, true);
    tokens.erase(std::partition(tokens.begin(), tokens.end(), [&](const Token& t) { return !before(last, t); }),
                 tokens.end());
  }
  if (p.min_p > 0.0f)  // relative to the most likely token (probabilities after temperature)
    tokens.erase(std::partition(tokens.begin(), tokens.end(), [&](const Token& t) { return t.e >= double(p.min_p); }),
                 tokens.end());
  if (tokens.size() != unfiltered) total = mass_of(tokens);
  return total;
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
  for (const std::string& s : p.stop) DEW_USAGE_CHECK(!s.empty(), "sampling: a stop string is empty");
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params,
                                          const std::vector<int32_t>& history) {
  DEW_CHECK(vocab > 0, "sampling_distribution: empty logits");
  const std::vector<double>& z = penalised(logits, vocab, params, history);
  std::vector<double> out(size_t(vocab), 0.0);
  if (params.temperature <= 0.0f) {
    out[size_t(argmax_of(z))] = 1.0;
    return out;
  }
  std::vector<Token>& kept = scratch().tokens;
  const double total = filter(z, params, kept);
  for (const Token& t : kept) out[size_t(t.id)] = t.e / total;
  return out;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params,
                     const std::vector<int32_t>& history, uint64_t draw_index, uint64_t stream) {
  DEW_CHECK(vocab > 0, "sample_token: empty logits");
  const std::vector<double>& z = penalised(logits, vocab, params, history);
  if (params.temperature <= 0.0f) return int32_t(argmax_of(z));
  std::vector<Token>& kept = scratch().tokens;
  const double total = filter(z, params, kept);
  if (kept.size() == 1) return kept[0].id;
  // The token whose interval of the kept tokens' cumulative distribution, in the chain's order, holds u.
  const double u = double(philox::uniform(params.seed, kSampleStream ^ stream, draw_index));
  return crossing(kept, u * total, false).id;
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stop, size_t from, size_t* which) {
  size_t best = std::string::npos;
  for (size_t i = 0; i < stop.size(); ++i) {
    const size_t at = text.find(stop[i], from);
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      if (which) *which = i;
    }
  }
  return best;
}

namespace {

// One sequence's decoding over its cache: eager (model.forward_cached_last) until a step program
// (step_program.hpp) is recorded from two one-token steps and checked bit for bit against a third, eager one;
// then every later one-token step is a replay. A program that cannot be built, or differs, leaves decoding eager.
class ReplayingDecoder {
 public:
  ReplayingDecoder(CausalDecoder& model, std::shared_ptr<DecodeCache> cache, DecodeReplayReport* report)
      : model_(model), cache_(std::move(cache)), report_(report) {}

  Tensor step(const Tensor& tokens) {
    const bool replays = program_ != nullptr;
    if (report_) ++(replays ? report_->replayed_steps : report_->eager_steps);
    return replays ? replay(tokens) : eager_step(tokens);
  }

 private:
  struct Recording {
    Tensor in, out;
    std::unique_ptr<detail::StepRecorder> rec;
  };

  static bool one_token(const Tensor& tokens) {
    return tokens.ndim() == 2 && tokens.shape()[0] == 1 && tokens.shape()[1] == 1;
  }

  Tensor replay(const Tensor& tokens) {
    DEW_CHECK(one_token(tokens), "decode program: a sequence being replayed takes one token a step, got ",
              shape_str(tokens.shape()));
    const int64_t i = next_++;
    DEW_CHECK(base_ + i < cache_->capacity(), "decode: the cache holds ", cache_->capacity(), " tokens; ", base_ + i,
              " are in it and 1 more was fed");
    return program_->run(tokens, i);
  }

  Tensor eager_step(const Tensor& tokens) {
    if (eager_ || !one_token(tokens) ||
        cache_->length() + 1 >= cache_->capacity()) {  // (a prefill restarts the recording)
      recorded_.clear();
      candidate_.reset();
      return model_.forward_cached_last(tokens, *cache_);
    }
    if (candidate_) return check(tokens);
    // Record this step (it runs as usual); two make a candidate program.
    if (recorded_.empty()) base_ = cache_->length();
    Recording r;
    r.in = tokens;
    r.rec = std::make_unique<detail::StepRecorder>();
    {
      detail::StepRecording on(r.rec.get());
      r.out = model_.forward_cached_last(tokens, *cache_);
    }
    const Tensor out = r.out;
    recorded_.push_back(std::move(r));
    if (recorded_.size() == 2) {
      Recording& a = recorded_[0];
      Recording& b = recorded_[1];
      std::string why;
      candidate_ = detail::DecodeProgram::build(*a.rec, a.in, a.out, *b.rec, b.in, b.out, &why);
      recorded_.clear();
      if (!candidate_) give_up(why);
    }
    return out;
  }

  // The third step, replayed and then eager: the program is kept only if the two agree bit for bit. The
  // replay goes first: the only state outliving a step that it writes is the cache rows of this position
  // (moving views), which the eager step then writes again, so a wrong program leaves no trace.
  Tensor check(const Tensor& tokens) {
    const Tensor replayed = candidate_->run(tokens, 2);
    std::vector<unsigned char> got(replayed.nbytes());
    replayed.copy_to_host(got.data());
    const Tensor eager = model_.forward_cached_last(tokens, *cache_);
    std::vector<unsigned char> want(eager.nbytes());
    eager.copy_to_host(want.data());
    if (replayed.shape() == eager.shape() && replayed.dtype() == eager.dtype() && want == got) {
      program_ = std::move(candidate_);
      next_ = 3;
    } else {
      candidate_.reset();
      give_up("the replayed step differs from the eager one");
    }
    return eager;
  }

  void give_up(const std::string& why) {
    eager_ = true;
    if (report_) report_->eager_reason = why;
  }

  CausalDecoder& model_;
  std::shared_ptr<DecodeCache> cache_;
  DecodeReplayReport* report_;
  std::vector<Recording> recorded_;
  std::unique_ptr<detail::DecodeProgram> candidate_, program_;
  int64_t base_ = 0, next_ = 0;  // the cache position of the first recorded step; the next replay's step index
  bool eager_ = false;
};

}  // namespace

StartFn decoder_start(CausalDecoder& model, bool replay, DecodeReplayReport* report) {
  return [&model, replay, report](int64_t capacity) -> DecodeFn {
    std::shared_ptr<DecodeCache> cache = model.make_cache(1, capacity);
    if (!replay)
      return [&model, cache, report](const Tensor& tokens) {
        if (report) ++report->eager_steps;
        return model.forward_cached_last(tokens, *cache);
      };
    auto decoder = std::make_shared<ReplayingDecoder>(model, cache, report);
    return [decoder](const Tensor& tokens) { return decoder->step(tokens); };
  };
}

std::vector<Generation> generate(const StartFn& start, const std::vector<std::vector<int32_t>>& prompts,
                                 const SamplingParams& params, const Tokenizer* tokenizer, int64_t context) {
  validate(params);
  DEW_USAGE_CHECK(params.stop.empty() || tokenizer, "sampling: stop strings need a tokenizer to decode the text");
  DEW_USAGE_CHECK(context >= 0, "generate: the context length must be >= 0 (0 = unlimited), got ", context);
  NoGradGuard no_grad;
  AutocastGuard f32(DType::f32);  // decoding runs in f32 (its KV caches take the weights' dtype), also inside a
                                  // bf16-mixed validation (docs/precision.md)
  size_t longest_stop = 0;
  for (const std::string& s : params.stop) longest_stop = std::max(longest_stop, s.size());
  std::vector<Generation> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    DEW_USAGE_CHECK(!prompts[i].empty(), "generate: prompt ", i, " has no tokens");
    Generation& g = out[i];
    g.finish_reason = "length";
    const int64_t budget = params.max_new_tokens;
    if (budget <= 0) continue;
    std::vector<int32_t> history = prompts[i];
    // The tokens to feed next: the prompt (its last `context` tokens when longer), then one token a step.
    std::vector<int32_t> pending = history;
    if (context > 0 && int64_t(pending.size()) > context) pending.erase(pending.begin(), pending.end() - context);
    auto capacity = [&](int64_t first) {
      const int64_t want = first + budget;
      return context > 0 ? std::min(want, context) : want;
    };
    DecodeFn step = start(capacity(int64_t(pending.size())));
    int64_t fed = 0;  // tokens in the current cache
    std::string text;
    size_t checked = 0;  // stop strings were searched in text[0, checked)
    size_t stop_at = std::string::npos;
    for (int64_t n = 0; n < budget; ++n) {
      if (context > 0 && fed + int64_t(pending.size()) > context) {
        // The context is full: a fresh cache re-fed with the last half of it (nanoGPT's crop, amortised).
        const int64_t keep = std::min<int64_t>(int64_t(history.size()), std::max<int64_t>(1, context / 2));
        pending.assign(history.end() - keep, history.end());
        step = start(context);
        fed = 0;
      }
      Tensor logits = step(Tensor::from_ints(pending, {1, int64_t(pending.size())}, default_backend()));
      fed += int64_t(pending.size());
      DEW_CHECK(logits.ndim() == 3 && logits.shape()[0] == 1, "generate: the decoder returned logits ",
                shape_str(logits.shape()), ", expected [1, T, V]");
      const int64_t t = logits.shape()[1], v = logits.shape()[2];
      Tensor last = reshape(logits, {t, v}).slice0(t - 1, t);
      const std::vector<float> row = last.dtype() == DType::f32 ? last.to_floats() : cast(last, DType::f32).to_floats();
      const int32_t tok = sample_token(row.data(), v, params, history, uint64_t(n), uint64_t(i));
      if (params.eos_id >= 0 && tok == params.eos_id) {
        g.finish_reason = "eos";
        break;
      }
      g.tokens.push_back(tok);
      history.push_back(tok);
      if (!params.stop.empty()) {
        text = tokenizer->decode(g.tokens);
        const size_t from = checked > longest_stop ? checked - longest_stop : 0;
        stop_at = find_stop(text, params.stop, from);
        checked = text.size();
        if (stop_at != std::string::npos) {
          g.finish_reason = "stop";
          break;
        }
      }
      pending.assign(1, tok);
    }
    if (stop_at != std::string::npos) {
      // The shortest token prefix whose text covers everything before the stop string.
      size_t keep = 0;
      while (keep < g.tokens.size() &&
             tokenizer->decode(std::vector<int32_t>(g.tokens.begin(), g.tokens.begin() + keep)).size() < stop_at)
        ++keep;
      g.tokens.resize(keep);
      g.text = text.substr(0, stop_at);
    } else if (tokenizer) {
      g.text = tokenizer->decode(g.tokens);
    }
  }
  return out;
}

std::vector<Generation> generate_text(CausalDecoder& model, const Tokenizer& tokenizer,
                                      const std::vector<std::string>& prompts, const SamplingParams& params) {
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) {
    std::vector<int32_t> t = tokenizer.encode(p);
    if (t.empty()) {
      DEW_USAGE_CHECK(tokenizer.eos_id() >= 0, "generate: an empty prompt needs a tokenizer with an end-of-text token");
      t.push_back(int32_t(tokenizer.eos_id()));
    }
    ids.push_back(std::move(t));
  }
  return generate(decoder_start(model), ids, params, &tokenizer, model.context_length());
}

}  // namespace dew
