// core/serve/scheduler.cpp — the continuous-batching scheduler of dew/serve.hpp.
//
// Each active request mirrors one sequence of dew::generate() (core/generate/generate.cpp) step for step:
// the same pending tokens (the prompt cropped to the context, then one token; a fresh slot re-fed with
// the last context/2 tokens when the context is full), the same draw (sample_token with the request's
// seed and stream, draw index = tokens drawn so far), the same EOS / stop-string / budget rules and the
// same cut at a stop string. Only where the logits come from differs: the rows of a shared slot cache, and, for a
// prompt's whole chunks that another prompt was fed in before, that slot's keys and values (prefix caching: a chunk's
// call gives the same bits after the same tokens, so a copy of them is what the feed would give).
// Locks: the scheduler mutex guards the queue and counters; each ticket's mutex guards what its client
// reads. step() never holds the scheduler mutex while the model runs.
#include <algorithm>
#include <exception>
#include <utility>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/serve.hpp"

namespace dew::serve {

namespace {

// The largest e <= limit such that text[0, e) does not end inside a UTF-8 character (invalid bytes count
// as complete characters).
size_t utf8_boundary(const std::string& text, size_t limit) {
  for (size_t back = 1; back <= 3 && back <= limit; ++back) {
    const auto c = static_cast<unsigned char>(text[limit - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back && c < 0xF8 ? limit - back : limit;
  }
  return limit;
}

}  // namespace

// ---------------------------------------------------------------- Ticket

Ticket::Update Ticket::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return safe_ > taken_ || done_; });
  Update u;
  u.text = text_.substr(taken_, safe_ - taken_);
  taken_ = safe_;
  u.logprobs.assign(logprobs_.begin() + long(logprobs_taken_), logprobs_.end());
  logprobs_taken_ = logprobs_.size();
  u.done = done_;
  return u;
}

Generation Ticket::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  return result_;
}

void Ticket::cancel() {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_ = true;
}

bool Ticket::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

std::string Ticket::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

// ---------------------------------------------------------------- Scheduler

struct Scheduler::Active {
  std::shared_ptr<Ticket> ticket;
  Request req;
  int64_t slot = -1;
  std::vector<int32_t> history, pending, tokens;
  std::vector<TokenLogprob> logprobs;         // per token, when asked for
  std::vector<TokenLogprob> prompt_logprobs;  // per prompt token after the first, when asked for
  // Still feeding its prompt, to be scored: nothing drawn yet (a scored prompt fits the context, so no refill comes
  // before the first draw; generate() scores its feed before its first draw alike).
  bool scoring_prompt() const { return req.params.prompt_logprobs && tokens.empty(); }
  std::string text;          // decoded continuation (no stop cut yet)
  std::vector<size_t> ends;  // text size after each token
  size_t checked = 0, longest_stop = 0;
  uint64_t admitted = 0;   // admission order
  int64_t chunks_fed = 0;  // prefill calls of its current prompt (or refill) so far
};

Scheduler::Scheduler(CausalDecoder& model, std::shared_ptr<const Tokenizer> tokenizer, const SchedulerOptions& options)
    : model_(model), tokenizer_(std::move(tokenizer)), options_(options) {
  DEW_USAGE_CHECK(options.slots > 0, "serve: --slots must be positive, got ", options.slots);
  DEW_USAGE_CHECK(options.max_queue >= 0, "serve: --queue must be >= 0, got ", options.max_queue);
  DEW_USAGE_CHECK(options.context >= 0, "serve: the context must be >= 0 (0 = the model's), got ", options.context);
  DEW_USAGE_CHECK(options.prefill_chunk >= 0, "serve: --prefill-chunk must be >= 0 (0 = whole prompts), got ",
                  options.prefill_chunk);
  context_ = options.context > 0 ? options.context : model.context_length();
  DEW_USAGE_CHECK(context_ > 0, "serve: the model has no context length: set one (--context)");
  vocab_ = model.vocab_size();
  drawable_ = tokenizer_ && tokenizer_->vocab_size() < vocab_ ? tokenizer_->vocab_size() : vocab_;  // as generate()
  backend_ = default_backend();
  cache_ = model.make_slot_cache(options.slots, context_);
  active_.resize(size_t(options.slots));
  prefix_.resize(size_t(options.slots));
  released_.resize(size_t(options.slots), 0);
  counters_.slots = options.slots;
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  for (auto& a : active_)
    if (a) finish(*a, "cancelled");
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [req, t] : queue_) {
    std::lock_guard<std::mutex> tl(t->mu_);
    t->done_ = true;
    t->result_.finish_reason = "cancelled";
    t->finished = Clock::now();
    t->cv_.notify_all();
  }
  queue_.clear();
}

Scheduler::Submitted Scheduler::submit(Request request) {
  validate(request.params);
  DEW_USAGE_CHECK(!request.prompt.empty(), "serve: the prompt has no tokens");
  for (int32_t t : request.prompt)
    DEW_USAGE_CHECK(t >= 0 && t < vocab_, "serve: prompt token ", t, " is outside the vocabulary [0, ", vocab_, ")");
  DEW_USAGE_CHECK(request.params.stop.empty() || tokenizer_, "serve: stop strings need a tokenizer");
  DEW_USAGE_CHECK(!request.params.prompt_logprobs || int64_t(request.prompt.size()) <= context_,
                  "serve: the prompt's log-probabilities need the whole prompt within the context (", context_,
                  " tokens); the prompt has ", request.prompt.size());
  request.params.prefill_chunk = options_.prefill_chunk;  // how this scheduler feeds prompts (its solo equivalent's)
  auto ticket = std::make_shared<Ticket>();
  ticket->prompt_tokens_ = int64_t(request.prompt.size());
  ticket->submitted = Clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (draining_ || stop_) return {Admission::draining, nullptr};
    if (int64_t(queue_.size()) + active_count_ >= options_.slots + options_.max_queue)
      return {Admission::queue_full, nullptr};
    queue_.emplace_back(std::move(request), ticket);
  }
  cv_.notify_all();
  return {Admission::accepted, ticket};
}

void Scheduler::finish(Active& a, const std::string& reason) {
  // The slot and the counters first, so that a client woken by its ticket sees them already updated.
  const std::shared_ptr<Ticket> ticket = a.ticket;
  Generation result;
  result.tokens = std::move(a.tokens);
  result.logprobs = std::move(a.logprobs);
  result.prompt_logprobs = std::move(a.prompt_logprobs);
  result.text = std::move(a.text);
  result.finish_reason = reason;
  const int64_t slot = a.slot;
  if (slot >= 0) {  // the slot keeps its cache (prefix caching) until start_in_slot() gives it to another request
    released_[size_t(slot)] = ++releases_;
    active_[size_t(slot)].reset();  // destroys `a`
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (slot >= 0) --active_count_;
    ++counters_.completed;
  }
  cv_.notify_all();
  Ticket& t = *ticket;
  {
    std::lock_guard<std::mutex> lk(t.mu_);
    t.text_ = result.text;
    t.safe_ = t.text_.size();
    t.taken_ = std::min(t.taken_, t.safe_);
    t.logprobs_ = result.logprobs;  // the final tokens' (a prefix of them was already handed out)
    t.logprobs_taken_ = std::min(t.logprobs_taken_, t.logprobs_.size());
    t.result_ = std::move(result);
    t.done_ = true;
    t.finished = Clock::now();
  }
  t.cv_.notify_all();
}

void Scheduler::fail_all(const std::string& message) {
  for (auto& a : active_)
    if (a) {
      {
        std::lock_guard<std::mutex> lk(a->ticket->mu_);
        a->ticket->error_ = message;
      }
      finish(*a, "error");
    }
}

bool Scheduler::step() {
  NoGradGuard no_grad;
  // ---- cancelled requests leave; waiting ones are admitted into free slots ----
  for (auto& a : active_)
    if (a) {
      bool cancelled;
      {
        std::lock_guard<std::mutex> lk(a->ticket->mu_);
        cancelled = a->ticket->cancelled_;
      }
      if (cancelled) finish(*a, "cancelled");
    }
  std::vector<std::unique_ptr<Active>> ended_at_admission;  // max_tokens 0: done without a slot
  std::vector<int64_t> admitted;                            // slots taken by this iteration's admissions
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      bool cancelled;
      {
        std::lock_guard<std::mutex> tl(it->second->mu_);
        cancelled = it->second->cancelled_;
      }
      if (cancelled) {
        auto a = std::make_unique<Active>();
        a->ticket = it->second;
        ended_at_admission.push_back(std::move(a));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    while (!queue_.empty() && active_count_ < options_.slots) {
      auto [req, ticket] = std::move(queue_.front());
      queue_.pop_front();
      auto a = std::make_unique<Active>();
      a->ticket = ticket;
      a->req = std::move(req);
      ticket->admitted = Clock::now();
      if (a->req.params.max_new_tokens <= 0) {  // nothing to generate: it ends without taking the slot
        ended_at_admission.push_back(std::move(a));
        continue;
      }
      a->admitted = admissions_++;
      a->history = a->req.prompt;
      a->pending = a->history;
      if (int64_t(a->pending.size()) > context_) a->pending.erase(a->pending.begin(), a->pending.end() - context_);
      for (const std::string& st : a->req.params.stop) a->longest_stop = std::max(a->longest_stop, st.size());
      a->slot = free_slot_for(a->pending);
      admitted.push_back(a->slot);
      active_[size_t(a->slot)] = std::move(a);
      ++active_count_;
    }
  }
  int64_t prefix_cached = 0;
  for (int64_t s : admitted) prefix_cached += start_in_slot(*active_[size_t(s)]);
  for (auto& a : ended_at_admission) {
    bool cancelled;
    {
      std::lock_guard<std::mutex> lk(a->ticket->mu_);
      cancelled = a->ticket->cancelled_;
    }
    finish(*a, cancelled ? "cancelled" : "length");
  }

  // ---- what each slot feeds: its prompt (prefill) or its last token (one batched decode row) ----
  std::vector<int64_t> decode_slots, prefill_slots;
  std::vector<int32_t> decode_tokens;
  for (size_t s = 0; s < active_.size(); ++s) {
    Active* a = active_[s].get();
    if (!a) continue;
    if (cache_->length(int64_t(s)) + int64_t(a->pending.size()) > context_) {
      // The context is full: the slot restarts with the last half of it (as generate() does).
      const int64_t keep = std::min<int64_t>(int64_t(a->history.size()), std::max<int64_t>(1, context_ / 2));
      a->pending.assign(a->history.end() - keep, a->history.end());
      a->chunks_fed = 0;
      cache_->clear(int64_t(s));
      prefix_[s].clear();
    }
    if (a->pending.size() == 1) {
      decode_slots.push_back(int64_t(s));
      decode_tokens.push_back(a->pending[0]);
    } else {
      prefill_slots.push_back(int64_t(s));
    }
  }
  if (decode_slots.empty() && prefill_slots.empty()) {
    std::lock_guard<std::mutex> lk(mu_);
    counters_.prefix_cached += prefix_cached;
    return !ended_at_admission.empty();
  }

  // ---- the model: one call per prefill, one for all decode rows; last-position logits per slot ----
  std::vector<std::pair<int64_t, std::vector<float>>> rows;  // (slot, logits of its last position)
  auto last_rows = [&](const Tensor& logits, const std::vector<int64_t>& slots) {
    DEW_CHECK(logits.ndim() == 3 && logits.shape()[0] == int64_t(slots.size()), "serve: the decoder returned logits ",
              shape_str(logits.shape()), " for ", slots.size(), " rows");
    const int64_t n = logits.shape()[0], t = logits.shape()[1], v = logits.shape()[2];
    DEW_CHECK(v == vocab_, "serve: the decoder returned ", v, " logits per token, its vocabulary is ", vocab_);
    Tensor last = t == 1 ? reshape(logits, {n, v}) : slice(logits, 1, t - 1, t);
    if (last.dtype() != DType::f32) last = cast(last, DType::f32);
    const std::vector<float> all = last.to_floats();
    for (int64_t i = 0; i < n; ++i)
      rows.emplace_back(slots[size_t(i)], std::vector<float>(all.begin() + i * v, all.begin() + (i + 1) * v));
  };
  // ---- one draw per row; rows end on EOS, a stop string or their budget ----
  int64_t drawn_rows = 0;
  auto draw = [&] {
    const Clock::time_point now = Clock::now();
    drawn_rows += int64_t(rows.size());
    for (auto& [s, logits] : rows) {
      Active& a = *active_[size_t(s)];
      const SamplingParams& sp = a.req.params;
      const uint64_t drawn = a.tokens.size();
      const int32_t tok = sample_token(logits.data(), drawable_, sp, a.history, drawn, a.req.stream);
      if (drawn == 0) {
        std::lock_guard<std::mutex> lk(a.ticket->mu_);
        a.ticket->first_token = now;
      }
      if (sp.eos_id >= 0 && tok == sp.eos_id) {
        finish(a, "eos");
        continue;
      }
      a.tokens.push_back(tok);
      a.history.push_back(tok);
      if (sp.logprobs >= 0) a.logprobs.push_back(token_logprob(logits.data(), drawable_, tok, sp.logprobs));
      size_t stop_at = std::string::npos;
      if (tokenizer_) {
        a.text += tokenizer_->token_bytes(tok);
        a.ends.push_back(a.text.size());
        if (!sp.stop.empty()) {
          const size_t from = a.checked > a.longest_stop ? a.checked - a.longest_stop : 0;
          stop_at = find_stop(a.text, sp.stop, from);
          a.checked = a.text.size();
        }
      }
      if (stop_at != std::string::npos) {
        // The shortest token prefix whose text covers everything before the stop string (generate()'s cut).
        size_t keep = 0;
        while (keep < a.tokens.size() && (keep == 0 ? 0 : a.ends[keep - 1]) < stop_at) ++keep;
        a.tokens.resize(keep);
        if (!a.logprobs.empty()) a.logprobs.resize(keep);
        a.text.resize(stop_at);
        finish(a, "stop");
        continue;
      }
      if (int64_t(a.tokens.size()) >= sp.max_new_tokens) {
        finish(a, "length");
        continue;
      }
      a.pending.assign(1, tok);
      {
        std::lock_guard<std::mutex> lk(a.ticket->mu_);
        Ticket& t = *a.ticket;
        t.text_.append(a.text, t.text_.size(), std::string::npos);  // text only grows until the end
        const size_t hold = a.longest_stop > 0 ? a.longest_stop - 1 : 0;
        const size_t limit = a.text.size() > hold ? a.text.size() - hold : 0;
        t.safe_ = std::max(t.safe_, utf8_boundary(a.text, limit));
        // The tokens whose text now lies within the final text (every token, without a tokenizer).
        while (t.logprobs_.size() < a.logprobs.size() && (!tokenizer_ || a.ends[t.logprobs_.size()] <= t.safe_))
          t.logprobs_.push_back(a.logprobs[t.logprobs_.size()]);
      }
      a.ticket->cv_.notify_all();
    }
    rows.clear();
  };
  // Prompts go in chunks of prefill_chunk tokens (generate()'s cuts), up to prefill_chunk prompt tokens an
  // iteration: the first waiting chunk always, then those that still fit, the slots with the fewest chunks fed
  // first (then by admission). A prompt's last chunk draws its first token, published at once (time to first
  // token); the rows of the batched decode follow.
  std::sort(prefill_slots.begin(), prefill_slots.end(), [&](int64_t x, int64_t y) {
    const Active &a = *active_[size_t(x)], &b = *active_[size_t(y)];
    return a.chunks_fed != b.chunks_fed ? a.chunks_fed < b.chunks_fed : a.admitted < b.admitted;
  });
  // A prompt fed whole into an empty slot also serves every other slot of this iteration waiting to feed the same
  // tokens into an empty cache: they get a copy of its keys and values (SlotCache::copy) and its last logits, the
  // bits a feed of their own would give, at no cost to the budget.
  const int64_t chunk = options_.prefill_chunk;
  int64_t prefill_tokens = 0, prefill_shared = 0;
  std::vector<bool> served(active_.size(), false);
  for (int64_t s : prefill_slots) {
    if (served[size_t(s)]) continue;
    Active& a = *active_[size_t(s)];
    prefix_cached += extend_from_other_slots(a);  // before the budget: a copy costs no feed
    const bool score = a.scoring_prompt();        // every position's logits, as generate()
    const int64_t n = chunk > 0 ? std::min<int64_t>(chunk, int64_t(a.pending.size())) : int64_t(a.pending.size());
    if (chunk > 0 && prefill_tokens > 0 && prefill_tokens + n > chunk) continue;  // the iteration's budget
    prefill_tokens += n;
    ++a.chunks_fed;
    const int64_t fed_at = cache_->length(s);
    const bool from_empty = fed_at == 0;
    const std::vector<int32_t> fed(a.pending.begin(), a.pending.begin() + n);
    const Tensor tokens = Tensor::from_ints(fed, {1, n}, backend_);
    const Tensor logits =
        score ? model_.forward_slots(tokens, {s}, *cache_) : model_.forward_slots_last(tokens, {s}, *cache_);
    if (score)
      append_prompt_logprobs(logits, n, a.req.prompt, fed_at, drawable_, a.req.params.logprobs, a.prompt_logprobs);
    std::vector<int32_t>& prefix = prefix_[size_t(s)];
    if (options_.prefix_cache && n == chunk && fed_at == int64_t(prefix.size()))  // a whole chunk after whole chunks
      prefix.insert(prefix.end(), fed.begin(), fed.end());
    if (n < int64_t(a.pending.size())) {  // more of the prompt to come: these logits are not drawn from
      a.pending.erase(a.pending.begin(), a.pending.begin() + n);
      continue;
    }
    last_rows(logits, {s});
    if (from_empty && !score)  // (a scored feed's last row is the every-position form's: not another request's)
      for (int64_t other : prefill_slots) {
        if (other == s || served[size_t(other)] || !active_[size_t(other)]) continue;  // itself, or drawn (maybe ended)
        Active& b = *active_[size_t(other)];
        if (b.pending != fed || cache_->length(other) != 0 || b.req.params.prompt_logprobs) continue;
        if (!cache_->copy(s, other)) break;
        prefix_[size_t(other)] = prefix;
        ++b.chunks_fed;
        served[size_t(other)] = true;
        rows.emplace_back(other, rows.front().second);
        ++prefill_shared;
      }
    draw();
  }
  if (!decode_slots.empty()) {
    last_rows(model_.forward_slots(Tensor::from_ints(decode_tokens, {int64_t(decode_tokens.size()), 1}, backend_),
                                   decode_slots, *cache_),
              decode_slots);
    draw();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.iterations;
    counters_.decode_rows += int64_t(decode_slots.size());
    counters_.prefill_tokens += prefill_tokens;
    counters_.prefill_shared += prefill_shared;
    counters_.prefix_cached += prefix_cached;
    counters_.generated_tokens += drawn_rows;
  }
  return true;
}

// Prefix caching. The whole chunks (prefill_chunk tokens each) of `pending` that slot `slot`'s cache holds from
// position `from` on (prefix_[slot]), leaving at least one token of `pending` to feed: a prompt's last feed draws.
int64_t Scheduler::shared_chunks(int64_t slot, int64_t from, const std::vector<int32_t>& pending) const {
  const int64_t chunk = options_.prefill_chunk;
  if (!options_.prefix_cache || chunk <= 0) return 0;
  const std::vector<int32_t>& held = prefix_[size_t(slot)];
  int64_t n = 0;
  while ((n + 1) * chunk < int64_t(pending.size()) && from + (n + 1) * chunk <= int64_t(held.size()) &&
         std::equal(pending.begin() + n * chunk, pending.begin() + (n + 1) * chunk, held.begin() + from + n * chunk))
    ++n;
  return n;
}

// The free slot for a request that will feed `pending`: of those whose cached chunks it shares all of (an unused slot
// among them), the one it shares the most with; else the one whose last request ended longest ago. So a request never
// overwrites a cache that holds more than it shares while another slot is free (it copies the shared chunks there
// instead: extend_from_other_slots), and the caches overwritten are the least recently used.
int64_t Scheduler::free_slot_for(const std::vector<int32_t>& pending) const {
  const int64_t chunk = std::max<int64_t>(options_.prefill_chunk, 1);
  int64_t best = -1, best_shared = -1, oldest = -1;
  for (size_t s = 0; s < active_.size(); ++s) {
    if (active_[s]) continue;
    if (oldest < 0 || released_[s] < released_[size_t(oldest)]) oldest = int64_t(s);
    const int64_t shared = shared_chunks(int64_t(s), 0, pending);
    if (shared != int64_t(prefix_[s].size()) / chunk) continue;  // it would overwrite some of this cache
    if (shared > best_shared || (shared == best_shared && released_[s] < released_[size_t(best)]))
      best = int64_t(s), best_shared = shared;
  }
  DEW_CHECK(oldest >= 0, "serve: no free slot for an admitted request");
  return best >= 0 ? best : oldest;
}

// A request starts in its slot: the slot's cache shortened to the chunks its prompt shares with it, else emptied.
// Returns the prompt tokens that need no feed.
int64_t Scheduler::start_in_slot(Active& a) {
  const int64_t s = a.slot;  // a prompt to be scored is fed whole: its positions' logits are what it asks for
  const int64_t keep = a.scoring_prompt() ? 0 : shared_chunks(s, 0, a.pending) * options_.prefill_chunk;
  std::vector<int32_t>& prefix = prefix_[size_t(s)];
  if (keep == 0 || !cache_->copy_prefix(s, s, keep, 0)) {
    cache_->clear(s);
    prefix.clear();
    return 0;
  }
  prefix.resize(size_t(keep));
  a.pending.erase(a.pending.begin(), a.pending.begin() + keep);
  a.chunks_fed = keep / options_.prefill_chunk;
  return keep;
}

// Before a slot's next feed: where another slot's cache holds the chunks the slot holds and more of its prompt after
// them, the most such chunks are copied in. Returns the prompt tokens that need no feed.
int64_t Scheduler::extend_from_other_slots(Active& a) {
  const int64_t s = a.slot, held = cache_->length(s);
  std::vector<int32_t>& prefix = prefix_[size_t(s)];
  if (held != int64_t(prefix.size())) return 0;  // its rows are not all whole chunks fed from an empty cache
  if (a.scoring_prompt()) return 0;              // a prompt to be scored is fed whole
  int64_t from = -1, most = 0;
  for (size_t o = 0; o < prefix_.size(); ++o) {
    const std::vector<int32_t>& other = prefix_[o];
    if (int64_t(o) == s || other.size() <= prefix.size() || !std::equal(prefix.begin(), prefix.end(), other.begin()))
      continue;
    const int64_t n = shared_chunks(int64_t(o), held, a.pending);
    if (n > most) from = int64_t(o), most = n;
  }
  const int64_t copied = most * options_.prefill_chunk;
  if (copied == 0 || !cache_->copy_prefix(from, s, held + copied, held)) return 0;  // its first `held` are the same
  prefix.insert(prefix.end(), a.pending.begin(), a.pending.begin() + copied);
  a.pending.erase(a.pending.begin(), a.pending.begin() + copied);
  a.chunks_fed += most;
  return copied;
}

// The loop of start() and run(): step() until stopped, sleeping while there is no work.
void Scheduler::loop() {
  for (;;) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      fail_all(e.what());
      worked = true;
    }
    std::unique_lock<std::mutex> lk(mu_);
    if (stop_) return;
    if (!worked) cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
  }
}

void Scheduler::start() {
  std::lock_guard<std::mutex> lk(mu_);
  DEW_CHECK(!loop_.joinable() && !running_, "serve: the scheduler is already running");
  loop_ = std::thread([this] { loop(); });
}

void Scheduler::run() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    DEW_CHECK(!loop_.joinable() && !running_, "serve: the scheduler is already running");
    if (draining_ || stop_) return;  // a drain() that found no loop runs (or ran) the iterations itself
    running_ = true;
  }
  loop();
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_ = false;
  }
  cv_.notify_all();
}

void Scheduler::drain() {
  bool looping;
  {
    std::lock_guard<std::mutex> lk(mu_);
    draining_ = true;
    looping = loop_.joinable() || running_;
  }
  cv_.notify_all();
  if (!looping) {  // no loop: the iterations run here, and a later run() returns at once
    while (step()) {
    }
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    return;
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return queue_.empty() && active_count_ == 0; });
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) {
    loop_.join();
  } else {  // run() on another thread: wait for it to return
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !running_; });
  }
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  SchedulerStats s = counters_;
  s.active = active_count_;
  s.queued = int64_t(queue_.size());
  s.draining = draining_;
  return s;
}

}  // namespace dew::serve
