// dew/serve.hpp — a continuous-batching scheduler for text generation (what `dew-run serve` runs).
//
// A fixed number of slots share one resident cache (CausalDecoder::make_slot_cache). Each iteration
// (step()) drops cancelled requests, admits waiting requests into free slots (first come, first served),
// feeds prompts in chunks (up to SchedulerOptions::prefill_chunk prompt tokens an iteration; a prompt's last
// chunk draws its first token) and decodes one token for every other active slot in one batched call
// (CausalDecoder::forward_slots), then draws one token per row. A slot frees when its request ends (EOS,
// a stop string, its budget, or cancel()) and is reused in the same iteration's admission of the next.
//
// Invariant: a request's tokens and text are exactly those of dew::generate() for the same prompt and
// SamplingParams alone, its prefill_chunk the scheduler's (draws keyed by the request's own seed, Philox stream and
// token index, never by slot or batch; the same prompt cropping, context refill, EOS and stop-string rules), given a
// decoder whose forward_slots rows are bit-equal to solo decoding (see dew/generate.hpp).
//
// Threads: submit(), Ticket methods and stats() are thread-safe; step() runs on one thread at a time
// (start() runs it on a background thread while there is work). The model is only touched by step().
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dew/generate.hpp"
#include "dew/tokenizer.hpp"

namespace dew::serve {

using Clock = std::chrono::steady_clock;

struct Request {
  std::vector<int32_t> prompt;  // token ids (non-empty)
  SamplingParams params;        // stop strings need the scheduler's tokenizer
  uint64_t stream = 0;          // the Philox stream of the draws: generate() gives prompt i stream i
};

// One request's progress, shared by the scheduler and the client waiting on it.
class Ticket {
 public:
  // Text made final since the last call (never a byte a stop string could still remove, never half of a
  // UTF-8 character until the request ends), and whether the request has ended. Blocks until there is
  // new text or the end, or until `timeout` passes (then returns what there is, possibly nothing).
  // With SamplingParams::logprobs, `logprobs` holds the entries of the tokens whose text became final with it.
  struct Update {
    std::string text;
    bool done = false;
    std::vector<TokenLogprob> logprobs;
  };
  Update next(std::chrono::milliseconds timeout = std::chrono::milliseconds(1000));
  // Blocks until the request ends and returns its generation (finish_reason eos | stop | length, or
  // "cancelled" / "error": see error()).
  Generation wait();
  // Ends the request at the next iteration (the client went away); its slot is freed.
  void cancel();
  bool done() const;
  std::string error() const;
  int64_t prompt_tokens() const { return prompt_tokens_; }
  // When it was submitted, admitted into a slot, produced its first token and ended (zero until then).
  Clock::time_point submitted, admitted, first_token, finished;

 private:
  friend class Scheduler;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Generation result_;  // set when the request ends
  std::string text_;   // everything decoded so far (before any stop cut)
  size_t safe_ = 0;    // text_[0, safe_) is final
  size_t taken_ = 0;   // next() has handed out text_[0, taken_)
  std::vector<TokenLogprob> logprobs_;  // the entries of the tokens whose text is final (all of them at the end)
  size_t logprobs_taken_ = 0;           // next() has handed out logprobs_[0, logprobs_taken_)
  bool done_ = false, cancelled_ = false;
  std::string error_;
  int64_t prompt_tokens_ = 0;
};

struct SchedulerOptions {
  int64_t slots = 8;       // sequences decoded together
  int64_t context = 0;     // tokens per slot; 0: the model's context_length() (required when it has none)
  int64_t max_queue = 64;  // requests waiting for a slot; submit() refuses more
  // Prompt tokens per prefill call, stamped on every request's SamplingParams::prefill_chunk (0: whole prompts),
  // and the prompt tokens an iteration prefills before its decode rows run: the first waiting prefill always
  // goes, then others whose next chunk still fits, those with the fewest chunks fed first (a new short prompt
  // before the rest of a long one), so a long prompt delays the other slots' next tokens by one chunk's time.
  int64_t prefill_chunk = kPrefillChunk;
  // Prefix caching: a prompt whose first whole chunks are those another prompt was fed in (a system prompt common to
  // many requests, a conversation's earlier turns) gets that slot's keys and values for them (SlotCache::copy_prefix)
  // instead of a feed of its own — the same bits, since a chunk's call sees the same tokens at the same positions
  // after the same rows. A slot keeps its cache after its request ends, until a request needs the slot; a request
  // takes the free slot whose cache shares the most chunks with its prompt, else the one left longest ago. Needs
  // prefill_chunk > 0 (whole prompts share no cut).
  bool prefix_cache = true;
};

struct SchedulerStats {
  int64_t slots = 0, active = 0, queued = 0;
  int64_t iterations = 0, decode_rows = 0, prefill_tokens = 0, generated_tokens = 0, completed = 0;
  int64_t prefill_shared = 0;  // prompts given another slot's cache of the same prompt instead of a feed of their own
  int64_t prefix_cached = 0;   // prompt tokens not fed: a slot's cache of the same first chunks was reused
  bool draining = false;
};

class Scheduler {
 public:
  // `tokenizer` may be null (then no stop strings and no text). The model must outlive the scheduler;
  // token tensors are made on the default backend of the time of construction.
  Scheduler(CausalDecoder& model, std::shared_ptr<const Tokenizer> tokenizer, const SchedulerOptions& options);
  ~Scheduler();  // stops the background thread; requests still running end as "cancelled"
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admission { accepted, queue_full, draining };
  struct Submitted {
    Admission status = Admission::accepted;
    std::shared_ptr<Ticket> ticket;  // null unless accepted
  };
  // Queues a request. Throws dew::UsageError for an empty prompt, out-of-range sampling parameters, a
  // token outside the vocabulary or stop strings without a tokenizer.
  Submitted submit(Request request);

  // One iteration (see the top of this file). Returns false when there was nothing to do.
  bool step();

  // Runs step() on a background thread, sleeping while there is no work.
  void start();
  // The same loop on the calling thread, until drain() (from another thread) has let every request finish:
  // for a server whose model runs on the thread that loaded it (one OpenMP pool in the process; see the cpu
  // backend's cpu_backend.hpp). Returns at once once drain() has begun without a loop (drain() then runs
  // the iterations itself).
  void run();
  // Refuses new requests, lets every queued and running one finish, then stops the loop (start()'s thread or
  // run()) and waits for it.
  void drain();

  SchedulerStats stats() const;
  int64_t context() const { return context_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  struct Active;
  void finish(Active& a, const std::string& reason);
  int64_t shared_chunks(int64_t slot, int64_t from, const std::vector<int32_t>& pending) const;
  int64_t free_slot_for(const std::vector<int32_t>& pending) const;
  int64_t start_in_slot(Active& a);
  int64_t extend_from_other_slots(Active& a);
  void fail_all(const std::string& message);
  void loop();

  CausalDecoder& model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  SchedulerOptions options_;
  int64_t context_ = 0, vocab_ = 0, drawable_ = 0;  // drawable_: ids drawn (the tokenizer's, when smaller)
  BackendPtr backend_;
  std::unique_ptr<SlotCache> cache_;

  mutable std::mutex mu_;  // guards queue_, draining_, stop_, running_, the stats counters and active_count_
  std::condition_variable cv_;
  std::deque<std::pair<Request, std::shared_ptr<Ticket>>> queue_;
  std::vector<std::unique_ptr<Active>> active_;  // by slot (null: free); step() only
  // By slot, step() only: the tokens whose keys and values fill its first rows as whole chunks fed from an empty cache
  // (prefix caching; kept after its request ends), and when its last request ended (0: never used).
  std::vector<std::vector<int32_t>> prefix_;
  std::vector<uint64_t> released_;
  uint64_t releases_ = 0;
  uint64_t admissions_ = 0;                      // requests admitted so far (their order); step() only
  int64_t active_count_ = 0;
  bool draining_ = false, stop_ = false;
  bool running_ = false;  // run() is looping on some thread
  SchedulerStats counters_;
  std::thread loop_;
};

}  // namespace dew::serve
