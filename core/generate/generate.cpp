// core/generate/generate.cpp — the generation loop of dew/generate.hpp: decoding over a model's cache (eager, then
// a recorded step program), stop strings, the text front end. The sampling chain itself is sampling.cpp.
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

void append_prompt_logprobs(const Tensor& logits, int64_t fed, const std::vector<int32_t>& prompt, int64_t start,
                            int64_t scored, int64_t top, std::vector<TokenLogprob>& out) {
  DEW_CHECK(logits.ndim() == 3 && logits.shape()[0] == 1 && logits.shape()[1] == fed,
            "the prompt's log-probabilities need every position's logits (decoder_start_every_position, "
            "forward_slots); the decoder returned ",
            shape_str(logits.shape()), " for ", fed, " tokens");
  const int64_t v = logits.shape()[2];
  const std::vector<float> rows = (logits.dtype() == DType::f32 ? logits : cast(logits, DType::f32)).to_floats();
  for (int64_t j = 0; j < fed && size_t(start + j + 1) < prompt.size(); ++j) {
    const int32_t next = prompt[size_t(start + j + 1)];
    DEW_CHECK(next >= 0 && next < scored, "prompt token ", next, " is outside the scored vocabulary [0, ", scored, ")");
    out.push_back(token_logprob(rows.data() + j * v, scored, next, top));
  }
}

StartFn decoder_start_every_position(CausalDecoder& model) {
  return [&model](int64_t capacity) -> DecodeFn {
    std::shared_ptr<DecodeCache> cache = model.make_cache(1, capacity);
    return [&model, cache](const Tensor& tokens) { return model.forward_cached(tokens, *cache); };
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
  // Ids the tokenizer has no text for (a vocabulary padded past it, as GPT-2's 50,257 to 50,304) are never drawn.
  auto drawable_of = [&](int64_t vocab) {
    return tokenizer && tokenizer->vocab_size() < vocab ? tokenizer->vocab_size() : vocab;
  };
  size_t longest_stop = 0;
  for (const std::string& s : params.stop) longest_stop = std::max(longest_stop, s.size());
  std::vector<Generation> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    DEW_USAGE_CHECK(!prompts[i].empty(), "generate: prompt ", i, " has no tokens");
    DEW_USAGE_CHECK(!params.prompt_logprobs || context == 0 || int64_t(prompts[i].size()) <= context,
                    "generate: the prompt's log-probabilities need the whole prompt within the context (", context,
                    " tokens); prompt ", i, " has ", prompts[i].size());
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
      // Fed in chunks of prefill_chunk tokens (SamplingParams): the last chunk's logits are drawn from.
      const bool prompt_feed = n == 0;  // the prompt itself (later feeds: one token, or a refill)
      Tensor logits;
      for (size_t at = 0; at < pending.size();) {
        const size_t n = params.prefill_chunk > 0 ? std::min(pending.size() - at, size_t(params.prefill_chunk))
                                                  : pending.size() - at;
        const std::vector<int32_t> chunk(pending.begin() + long(at), pending.begin() + long(at + n));
        logits = step(Tensor::from_ints(chunk, {1, int64_t(n)}, default_backend()));
        if (params.prompt_logprobs && prompt_feed)  // the prompt (whole: it fits the context) at position `at`
          append_prompt_logprobs(logits, int64_t(n), pending, int64_t(at), drawable_of(logits.shape().back()),
                                 params.logprobs, g.prompt_logprobs);
        at += n;
      }
      fed += int64_t(pending.size());
      DEW_CHECK(logits.ndim() == 3 && logits.shape()[0] == 1, "generate: the decoder returned logits ",
                shape_str(logits.shape()), ", expected [1, T, V]");
      const int64_t t = logits.shape()[1], v = logits.shape()[2];
      Tensor last = reshape(logits, {t, v}).slice0(t - 1, t);
      const std::vector<float> row = last.dtype() == DType::f32 ? last.to_floats() : cast(last, DType::f32).to_floats();
      const int64_t drawable = drawable_of(v);
      const int32_t tok = sample_token(row.data(), drawable, params, history, uint64_t(n), uint64_t(i));
      if (params.eos_id >= 0 && tok == params.eos_id) {
        g.finish_reason = "eos";
        break;
      }
      g.tokens.push_back(tok);
      history.push_back(tok);
      if (params.logprobs >= 0) g.logprobs.push_back(token_logprob(row.data(), drawable, tok, params.logprobs));
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
      if (!g.logprobs.empty()) g.logprobs.resize(keep);
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
