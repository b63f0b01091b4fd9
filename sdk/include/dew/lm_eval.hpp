// dew/lm_eval.hpp — the language-model evaluation harness: the request shapes of lm-evaluation-harness
// (log-likelihood of a continuation, rolling log-likelihood, multiple choice, generate-until) and token
// file perplexity, over any causal model's full forward. The lm objective's `dew-run eval --task ...`
// is the front end (docs/eval.md); other objectives may reuse these functions.
//
// Scoring windows. A sequence's targets [t0, t1) (positions of tokens that are scored; t0 >= 1) are cut
// into consecutive blocks of at most `block` tokens (block <= max_length), aligned at t0. The block
// [a, b) is scored by ONE forward over inputs seq[s, b - 1) with s = max(0, b - 1 - max_length): the
// logits at input position p predict token p + 1, so every target gets the longest left context a
// window of max_length tokens allows, and each target is scored exactly once. With block = max_length
// this is lm-evaluation-harness's get_rolling_token_windows + make_disjoint_window (context_len 1);
// with block < max_length it is the strided sliding-window perplexity of the Transformers docs.
// Windows of different lengths share a batch right-padded with token 0: the model is causal, so the
// padding never reaches the scored positions.
// A target's log-probability is log_softmax(logits)[target] (fp32 on the backend, summed in double on
// the host); it is "greedy" when the logits' argmax (first index on ties) is the target.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dew/model.hpp"
#include "dew/tensor.hpp"

namespace dew::lm_eval {

// tokens i32 [B, W] -> logits f32 [B, W, V] of a causal model (no gradients needed).
using LogitsFn = std::function<Tensor(const Tensor& tokens)>;
// model.forward({{"tokens", tokens}}) under a NoGradGuard.
LogitsFn model_logits(Model& model);

// What scoring needs of a forward: per position of tokens [B, W] (row-major), the log-probability of targets[i]
// (B * W ids in [0, V)) and the argmax token.
struct TargetScores {
  std::vector<float> logprobs;
  std::vector<int32_t> argmax;
};
using ScoreFn = std::function<TargetScores(const Tensor& tokens, const std::vector<int32_t>& targets)>;
// From a LogitsFn: token_logprobs and argmax over the [B * W, V] logits.
ScoreFn scores_from_logits(LogitsFn logits);
// A model's scores: a dew::LinearHeadModel's head in chunks of chunk_mb MiB of f32 logits (linear_token_logprobs
// with predictions: a real vocabulary's [B * W, V] logits never whole); any other model through its logits.
ScoreFn model_scores(Model& model, double chunk_mb = 256.0);

// One forward window: inputs seq[begin, end - 1) scoring targets [first, end) (begin < first < end).
struct Window {
  int64_t begin = 0, first = 0, end = 0;
};
// The windows of targets [t0, t1) (see above); max_length >= 1, 1 <= block <= max_length, t0 >= 1.
std::vector<Window> plan_windows(int64_t t0, int64_t t1, int64_t max_length, int64_t block);

struct Scored {
  double logprob = 0.0;               // sum over the targets
  bool greedy = true;                 // every target is the argmax
  int64_t tokens = 0;                 // targets scored
  std::vector<float> token_logprobs;  // per target, in order
};

// Scores targets [t0[i], seqs[i].size()) of every sequence. batch_size: windows per forward.
std::vector<Scored> score(const ScoreFn& scores, const std::vector<std::vector<int32_t>>& seqs,
                          const std::vector<int64_t>& t0, int64_t max_length, int64_t block, int64_t batch_size);

// log P(continuation | context) per request; an empty context needs prefix_token >= 0 (it becomes the
// context, as lm-evaluation-harness does with the BOS/EOS token); an empty continuation is refused.
std::vector<Scored> loglikelihood(const ScoreFn& scores,
                                  const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& requests,
                                  int64_t max_length, int64_t batch_size, int32_t prefix_token = -1);

// The whole document scored once, the first token conditioned on prefix_token (>= 0 required, as in
// lm-evaluation-harness; use stride = max_length for its disjoint windows).
std::vector<Scored> loglikelihood_rolling(const ScoreFn& scores, const std::vector<std::vector<int32_t>>& docs,
                                          int32_t prefix_token, int64_t max_length, int64_t stride, int64_t batch_size);

// lm-evaluation-harness's pair encoding: trailing spaces of the context move to the continuation; the
// continuation's ids are those of encode(context + continuation) past encode(context).
std::pair<std::vector<int32_t>, std::vector<int32_t>> encode_pair(
    const std::function<std::vector<int32_t>(const std::string&)>& encode, const std::string& context,
    const std::string& continuation);

}  // namespace dew::lm_eval
