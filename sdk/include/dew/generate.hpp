// dew/generate.hpp — text generation: the sampling chain, incremental (KV-cached) decoding, stop strings.
//
// Shared by the lm objective (`dew-run sample`, validation samples) and serving. Three pieces:
//  * sample_token(): one draw from a logits row through the Transformers-ordered chain
//      repetition_penalty -> temperature -> top_k -> top_p -> min_p -> draw
//    temperature 0 ends the chain in greedy argmax (after the repetition penalty). The draw is
//    philox::uniform(seed, stream, draw_index) against the cumulative distribution of the kept tokens
//    (in descending probability, ties by id), so a seeded draw reproduces exactly on every backend.
//  * CausalDecoder: the interface a backbone implements to decode with a KV cache (the
//    causal_transformer does); reach it with dynamic_cast<CausalDecoder*>(model). forward_cached()
//    feeds the next tokens of the sequences a cache holds and appends their keys/values, so one decode
//    step costs O(past length), not a full forward.
//  * generate(): prompts of any lengths. Every prompt is its own sequence with its own cache (batch 1):
//    a causal model without attention masks cannot share a batch between left-padded prompts
//    correctly, so correctness wins over batching. Each sequence: prefill the prompt in one call, then
//    one token per call. Sequence i draws from Philox stream i, draw index = tokens generated so far.
//    It stops at eos_id (not included), at max_new_tokens, or at a stop string (the decoded continuation
//    contains it: the text is cut before it and the tokens back to the shortest prefix whose text
//    reaches the stop string's start). With a context length C (the model's trained context), a prompt
//    longer than C is cut to its last C tokens, and a sequence that fills C continues over a fresh
//    cache re-fed with its last C/2 tokens (nanoGPT's crop to the context, amortised over C/2 tokens).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

class Tokenizer;  // dew/tokenizer.hpp

// The default prefill chunk (SamplingParams::prefill_chunk): llama.cpp's default micro-batch.
constexpr int64_t kPrefillChunk = 512;

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  float top_p = 1.0f;               // nucleus: the smallest set of tokens with cumulative probability >= top_p
  float min_p = 0.0f;               // drop tokens with probability < min_p * the largest probability
  float repetition_penalty = 1.0f;  // CTRL/Transformers: logits of tokens in `history` /= p (> 0) or *= p (< 0)
  int64_t top_k = 0;                // 0: off
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings (need a tokenizer to decode the text)
  int32_t eos_id = -1;            // -1: none
  int64_t max_new_tokens = 100;
  // Prompt tokens fed per model call: a longer prompt (or a context refill) goes in chunks of this many, cut at
  // multiples of it from its start, and the last chunk's last logits are drawn from (0: the whole prompt in one
  // call). Bounds a prefill's activations and, in serving, lets other sequences decode between the chunks; a
  // chunk's logits may differ in the last bits from a whole-prompt call's, so a served request equals a solo
  // generate() with the same chunk (the scheduler stamps its own, SchedulerOptions::prefill_chunk).
  int64_t prefill_chunk = kPrefillChunk;
  // >= 0: each drawn token's log-probability (Generation::logprobs) and those of the `logprobs` likeliest tokens (at
  // most kMaxLogprobs); -1: none. They are the model's own — the log-softmax of its logits over the drawable ids,
  // before repetition penalty, temperature and filters (what vLLM reports by default) — so they do not depend on how
  // the token was drawn.
  int64_t logprobs = -1;
  // With logprobs >= 0: also each prompt token's after the first (Generation::prompt_logprobs; OpenAI's `echo` with
  // `logprobs`, what a harness scores a continuation by), from the prompt feed's logits of every position, so the
  // decoder must return them all (decoder_start_every_position; a served request prefills the same way) and the
  // prompt must fit the context. The first token is then drawn from that feed's last row, which may differ in the
  // last bits from the last-position form's: such a request equals generate() with the same settings, bit for bit.
  bool prompt_logprobs = false;
};
inline constexpr int64_t kMaxLogprobs = 20;

// A drawn token's log-probability under the model, and the likeliest tokens' (largest first, ties by id).
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;
};
// `logits` [vocab] (host floats): log-softmax in double (max-shifted) at `token`, and the `top` likeliest ids'.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top);

// Checks the ranges (temperature >= 0, top_p in (0, 1], min_p in [0, 1], repetition_penalty > 0,
// top_k >= 0, 0 <= max_new_tokens <= 2^24, prefill_chunk >= 0, logprobs in [-1, kMaxLogprobs], prompt_logprobs only
// with logprobs >= 0 and max_new_tokens >= 1); throws a UsageError naming the field.
void validate(const SamplingParams& params);

// One token from `logits` [vocab] (host floats). `history`: the tokens the repetition penalty applies to
// (prompt + generated so far). Deterministic given (seed, stream, draw_index).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params,
                     const std::vector<int32_t>& history, uint64_t draw_index, uint64_t stream = 0);

// The probabilities the chain draws from (after penalty, temperature and the filters; 0 for dropped
// tokens; one-hot at the argmax when temperature is 0). For tests and for log-probabilities.
std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params,
                                          const std::vector<int32_t>& history);

// A model's incremental decoding state for a batch of sequences (its KV cache).
class DecodeCache {
 public:
  virtual ~DecodeCache() = default;
  virtual int64_t batch() const = 0;
  virtual int64_t length() const = 0;    // tokens fed so far (the next token's position)
  virtual int64_t capacity() const = 0;  // the most tokens it holds
};

// The decoding state of `slots()` independent sequences ("slots", the rows of one resident cache), each
// with its own length: what a continuous-batching server decodes. A slot is cleared when its sequence
// ends and is reused at once by the next one.
class SlotCache {
 public:
  virtual ~SlotCache() = default;
  virtual int64_t slots() const = 0;
  virtual int64_t capacity() const = 0;            // the most tokens one slot holds
  virtual int64_t length(int64_t slot) const = 0;  // tokens the slot holds (its next token's position)
  virtual void clear(int64_t slot) = 0;            // empties the slot (O(1): nothing is zeroed)
  // Makes slot `to` hold the first `length` tokens of slot `from` (0 <= length <= length(from)): their keys and
  // values bit for bit, and that length; `from == to` shortens the slot, forgetting what follows. Positions below
  // `begin` (0 <= begin <= length, begin <= length(to)) are not copied: the caller knows `to` holds the same there. A
  // scheduler gives a prompt this way the cache of another prompt it shares a prefix with instead of feeding those
  // tokens again (a system prompt common to many requests; the n completions of one prompt; GRPO's group). Returns
  // false where the cache cannot (the default): the tokens are then fed again, with the same result.
  virtual bool copy_prefix(int64_t from, int64_t to, int64_t length, int64_t begin) {
    (void)from;
    (void)to;
    (void)length;
    (void)begin;
    return false;
  }
  // Makes slot `to` hold what slot `from` holds.
  bool copy(int64_t from, int64_t to) { return copy_prefix(from, to, length(from), 0); }
};

// Implemented by backbones that decode incrementally (causal_transformer).
class CausalDecoder {
 public:
  virtual ~CausalDecoder() = default;
  virtual int64_t vocab_size() const = 0;
  // An empty cache for `batch` sequences of up to `capacity` tokens, on the model's backend.
  virtual std::unique_ptr<DecodeCache> make_cache(int64_t batch, int64_t capacity) const = 0;
  // tokens i32 [B, T] at positions cache.length() .. + T - 1: appends their keys/values to the cache and
  // returns their logits f32 [B, T, V] (equal to the matching rows of a full forward). Run it in a
  // NoGradGuard.
  virtual Tensor forward_cached(const Tensor& tokens, DecodeCache& cache) = 0;
  // forward_cached() for a decoder that reads only the last position's logits (a prefill: the next token's
  // draw): the same cache effect, logits f32 [B, 1, V] of the last position. A backbone overrides it to skip the
  // output projection of the other positions (T x vocab x dim multiply-adds and T x vocab floats: a quarter of
  // a 512-token gpt2-small prefill); the default slices forward_cached()'s. With T = 1 both forms are one call,
  // and whatever decodes a sequence takes this one throughout (decoder_start, serving's prefill through
  // forward_slots_last), so served and solo logits keep the same bits.
  virtual Tensor forward_cached_last(const Tensor& tokens, DecodeCache& cache);
  // FLOPs (2 x multiply-adds) of one forward pass over one sequence of `length` tokens.
  virtual double flops_per_sequence(int64_t length) const = 0;
  // The context the model was trained for (positions past it are extrapolated); 0: unlimited.
  virtual int64_t context_length() const { return 0; }
  // The dtype of the keys and values in the caches made from now on (make_cache, make_slot_cache): f32, the
  // default, or bf16, which halves the cache bytes a decode step reads: each key and value is rounded to bf16
  // (nearest even) once, when appended, and attention reads them with f32 arithmetic (the attention kernel's
  // f32-query / bf16-K/V form, dew/kernel_table.hpp). Caches made before keep theirs. Set with the decode
  // weights' dtype by store_decode_weights_as. The defaults hold f32 and refuse any other dtype.
  virtual void set_cache_dtype(DType dtype);
  virtual DType cache_dtype() const { return DType::f32; }

  // ---- slot decoding (continuous batching) ----
  // An empty cache of `slots` sequences of up to `capacity` tokens each.
  virtual std::unique_ptr<SlotCache> make_slot_cache(int64_t slots, int64_t capacity) const;
  // tokens i32 [N, T]: row i holds the next T tokens of slot slots[i] (N distinct slots, each at its own
  // length). Appends their keys/values and returns logits f32 [N, T, V]. Row i is bit-equal to what
  // forward_cached() returns for that sequence alone in a batch-1 cache, on backends whose kernels compute
  // each row on its own (ref; cpu for the matmul rows it routes to its row-wise path, see cpu/matmul.cpp):
  // this is what makes a served request reproduce its solo result. Run it in a NoGradGuard.
  // The defaults keep one batch-1 cache per slot and feed the rows one at a time (correct for every
  // decoder); a backbone overrides both to batch the rows (causal_transformer does for T == 1).
  virtual Tensor forward_slots(const Tensor& tokens, const std::vector<int64_t>& slots, SlotCache& cache);
  // forward_slots() returning each row's last position only, f32 [N, 1, V] (what forward_cached_last is to
  // forward_cached); the default slices forward_slots()'s.
  virtual Tensor forward_slots_last(const Tensor& tokens, const std::vector<int64_t>& slots, SlotCache& cache);
};

// Feeds one sequence's next tokens (i32 [1, T]) and returns the logits of the last of them, f32 [1, 1, V] (a
// DecodeFn written by hand may return all T positions, [1, T, V]: generate() reads the last).
using DecodeFn = std::function<Tensor(const Tensor& tokens)>;
// Starts a sequence: a DecodeFn over a fresh cache holding up to `capacity` tokens.
using StartFn = std::function<DecodeFn(int64_t capacity)>;

// A StartFn over a CausalDecoder (a batch-1 cache per sequence). With `replay` (the default) a sequence's
// one-token steps become a recorded step program once two of them have been recorded and a third agrees with
// its replay bit for bit: the same kernels on the same buffers, without the host work around them (its logits
// then live in the program's buffer until the next step). Eager wherever a program cannot be built; `report`
// (when given; it must outlive the sequences) counts the steps each way and keeps why a program was not built.
struct DecodeReplayReport {
  int64_t replayed_steps = 0, eager_steps = 0;  // over every sequence started (prefills count as eager)
  std::string eager_reason;                     // the last reason a sequence's program was not built or kept
};
StartFn decoder_start(CausalDecoder& model, bool replay = true, DecodeReplayReport* report = nullptr);
// A StartFn whose DecodeFn returns the logits of every position fed ([1, T, V], forward_cached), eager: what
// SamplingParams::prompt_logprobs needs. One-token steps are the same call as decoder_start's.
StartFn decoder_start_every_position(CausalDecoder& model);
// One feed of a prompt scored (SamplingParams::prompt_logprobs): the logits [1, fed, V] of its positions start ..
// start + fed - 1 score prompt tokens start + 1 .. start + fed (those inside the prompt) over the first `scored` ids,
// each with the `top` likeliest (token_logprob), appended to `out`. What generate() and the serving scheduler collect
// alike; a decoder that returned fewer rows than `fed` (the last-position form) is refused.
void append_prompt_logprobs(const Tensor& logits, int64_t fed, const std::vector<int32_t>& prompt, int64_t start,
                            int64_t scored, int64_t top, std::vector<TokenLogprob>& out);

struct Generation {
  std::vector<int32_t> tokens;  // the continuation (without the prompt, without EOS, cut at a stop string)
  std::string text;             // its decoded text (empty without a tokenizer), cut before a stop string
  std::string finish_reason;    // "eos" | "stop" | "length"
  std::vector<TokenLogprob> logprobs;  // one per token of `tokens` when SamplingParams::logprobs >= 0
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1 .. L-1, with SamplingParams::prompt_logprobs
};

// `prompts`: token ids (each non-empty). `tokenizer` may be null (then stop strings cannot apply: refused
// when params.stop is not empty); with one whose vocabulary is smaller than the logits (a vocabulary padded past
// the tokenizer's, as GPT-2's 50,257 to 50,304, or a byte corpus on a larger model), only its ids are drawn, as
// llm.c samples. `context` (> 0): the model's context length (see above); 0: unlimited.
std::vector<Generation> generate(const StartFn& start, const std::vector<std::vector<int32_t>>& prompts,
                                 const SamplingParams& params, const Tokenizer* tokenizer = nullptr,
                                 int64_t context = 0);

// Text in, text out, over the model's own context_length(): encodes each prompt with the tokenizer (an
// empty prompt starts from EOS when the tokenizer has one) and decodes each continuation.
std::vector<Generation> generate_text(CausalDecoder& model, const Tokenizer& tokenizer,
                                      const std::vector<std::string>& prompts, const SamplingParams& params);

// ---- weight-only storage for decoding (core/generate/weights.cpp) ----
// Stores the matmul weights of `params` in `dtype`, in place: every 2-D parameter whose name has no
// "embed" (token and position embeddings are lookups and stay f32), and a token embedding that is also the
// output projection (tied: "...embed_tokens.weight" without "lm_head.weight"): a decode token streams all of
// it, and the lookup widens its bf16 rows (nn::Embedding) or dequantizes its int8 ones (dew::embedding). The modules
// holding them see the new dtype, and linear() then multiplies f32 activations by the bf16 weight with f32
// accumulation: the weights are rounded once, nothing else is (inference only: such a linear records no gradient).
// DType::i8 quantizes them instead (quantize_int8, dew/ops.hpp: an f32 scale per block of 32 columns, per row when 32
// does not divide the width; a quarter of the f32 bytes); the tensors cast all go into one storage, back to back in the
// order of `params` (a decode step's: it streams them as one buffer). Any dtype also places the weights that multiply
// one input (q/k/v projections, gate/up) back to back in one storage, values unchanged, so a decode step makes one
// product per group (nn::Attention, nn::GatedMLP); f32 changes no value. Returns the tensors cast.
int64_t store_matmul_weights_as(const std::vector<std::pair<std::string, Tensor>>& params, DType dtype);
// What `--weights` chooses (dew-run eval|sample|serve, dew-bench generate|roofline), in one call:
// store_matmul_weights_as(params, dtype) and, when `decoder` is not null, its K/V cache in the same dtype
// (set_cache_dtype), so bf16 decoding streams bf16 weights and a bf16 cache; int8 weights get a bf16 cache.
// Returns the tensors cast.
int64_t store_decode_weights_as(CausalDecoder* decoder, const std::vector<std::pair<std::string, Tensor>>& params,
                                DType dtype);
// Lays the matmul weights of `params` (those store_matmul_weights_as stores: 2-D, no "embed" in the name) out in
// the panels their backend's decode products read fastest (Backend::decode_panel_rows; dew/tensor.hpp's tensors
// in panels), in place and values unchanged: a weight whose row count the panel does not divide, or on a backend
// that answers 0, keeps its rows. For inference only (dew-run sample / serve, eval with bf16 weights, dew-bench
// generate): such a weight is then read by linear() alone, through the backend's panel kernel at every row count,
// so call it after store_decode_weights_as and only for a model that decodes. Groups placed back to back stay so (whole
// panels). Returns the tensors laid out.
int64_t store_matmul_weights_in_panels(const std::vector<std::pair<std::string, Tensor>>& params);
// "f32" | "bf16" | "int8" -> the dtype of --weights (int8: DType::i8); anything else is one usage error naming
// `what`.
DType weights_dtype_from_name(const std::string& name, const char* what);
// "auto" | "f32" | "bf16" -> the K/V cache dtype of --kv-cache (auto: std::nullopt, the cache follows the weights);
// anything else is one usage error naming `what`.
std::optional<DType> kv_cache_dtype_from_name(const std::string& name, const char* what);

// The position of the first stop string in `text` at or after `from` (npos when none); `which` gets its index.
size_t find_stop(const std::string& text, const std::vector<std::string>& stop, size_t from = 0,
                 size_t* which = nullptr);

}  // namespace dew
