// core/eval/lm_harness.cpp — scoring windows and the log-likelihood requests of dew/lm_eval.hpp.
// Invariants: every target of a request is scored exactly once (plan_windows partitions [t0, t1));
// windows are batched longest first, right-padded with token 0 (causal: padding is never attended by
// a scored position); results come back in request order. A model with a linear head is scored with the head in
// chunks (model_scores): no [rows, V] logits.
#include <algorithm>
#include <numeric>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/lm_eval.hpp"
#include "dew/ops.hpp"

namespace dew::lm_eval {

LogitsFn model_logits(Model& model) {
  return [&model](const Tensor& tokens) {
    NoGradGuard no_grad;
    return model.forward({{"tokens", tokens}});
  };
}

namespace {
void check_targets(const std::vector<int32_t>& targets, int64_t rows, int64_t v) {
  DEW_CHECK(int64_t(targets.size()) == rows, "lm_eval: ", targets.size(), " targets for ", rows, " positions");
  for (int32_t t : targets)
    DEW_CHECK(t >= 0 && t < v, "lm_eval: token id ", t, " is outside the vocabulary [0, ", v, ")");
}
}  // namespace

ScoreFn scores_from_logits(LogitsFn logits) {
  return [logits = std::move(logits)](const Tensor& tokens, const std::vector<int32_t>& targets) {
    NoGradGuard no_grad;
    const int64_t n = tokens.shape()[0], width = tokens.shape()[1], rows = n * width;
    Tensor lg = logits(tokens);
    DEW_CHECK(lg.ndim() == 3 && lg.shape()[0] == n && lg.shape()[1] == width, "lm_eval: the model returned ",
              shape_str(lg.shape()), " logits for tokens [", n, ", ", width, "]");
    const int64_t v = lg.shape()[2];
    if (lg.dtype() != DType::f32) lg = cast(lg, DType::f32);
    check_targets(targets, rows, v);
    const Tensor flat = reshape(lg, {rows, v});
    // each target's log-probability from the cross-entropy kernel's row (no [rows, V] log-softmax)
    return TargetScores{token_logprobs(flat, Tensor::from_ints(targets, {rows}, lg.backend_ptr())).to_floats(),
                        argmax(flat).to_ints()};
  };
}

ScoreFn model_scores(Model& model, double chunk_mb) {
  DEW_CHECK(chunk_mb > 0, "lm_eval: chunk_mb must be > 0, got ", chunk_mb);
  auto* head = dynamic_cast<LinearHeadModel*>(&model);
  if (!head) return scores_from_logits(model_logits(model));
  return [head, chunk_mb](const Tensor& tokens, const std::vector<int32_t>& targets) {
    NoGradGuard no_grad;
    const int64_t rows = tokens.shape()[0] * tokens.shape()[1];
    const HiddenAndHead o = head->forward_rows({{"tokens", tokens}}, rows);
    check_targets(targets, rows, o.weight.shape()[0]);
    Tensor h = o.hidden, w = o.weight;
    if (h.dtype() != DType::f32) h = cast(h, DType::f32);  // scored in f32, as the logits path scores its logits
    if (w.dtype() != DType::f32) w = cast(w, DType::f32);
    LinearCrossEntropyOptions lo;
    lo.softcap = o.softcap;
    lo.chunk_mb = chunk_mb;
    Tensor predictions;
    lo.predictions = &predictions;
    const Tensor lp = linear_token_logprobs(h, w, Tensor::from_ints(targets, {rows}, h.backend_ptr()), lo);
    return TargetScores{lp.to_floats(), predictions.to_ints()};
  };
}

std::vector<Window> plan_windows(int64_t t0, int64_t t1, int64_t max_length, int64_t block) {
  DEW_CHECK(max_length >= 1, "lm_eval: max_length must be >= 1, got ", max_length);
  DEW_CHECK(block >= 1 && block <= max_length, "lm_eval: the block (stride) must be in [1, max_length = ", max_length,
            "], got ", block);
  DEW_CHECK(t0 >= 1 && t1 >= t0, "lm_eval: targets [", t0, ", ", t1, ") need t0 >= 1 (the first token has no context)");
  std::vector<Window> out;
  for (int64_t a = t0; a < t1; a += block) {
    const int64_t b = std::min(t1, a + block);
    out.push_back({std::max<int64_t>(0, b - 1 - max_length), a, b});
  }
  return out;
}

std::vector<Scored> score(const ScoreFn& scores, const std::vector<std::vector<int32_t>>& seqs,
                          const std::vector<int64_t>& t0, int64_t max_length, int64_t block, int64_t batch_size) {
  DEW_CHECK(seqs.size() == t0.size(), "lm_eval::score: ", seqs.size(), " sequences but ", t0.size(), " starts");
  DEW_CHECK(batch_size >= 1, "lm_eval: batch_size must be >= 1, got ", batch_size);
  struct Job {
    size_t seq;
    Window w;
  };
  std::vector<Job> jobs;
  std::vector<Scored> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    for (const Window& w : plan_windows(t0[i], int64_t(seqs[i].size()), max_length, block)) jobs.push_back({i, w});
  // Longest inputs first (fewest padded positions); stable, so equal lengths keep request order.
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  auto len = [&](size_t j) { return jobs[j].w.end - 1 - jobs[j].w.begin; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return len(a) > len(b); });
  // Per-job target log-probs, filled batch by batch, then accumulated in plan order per sequence.
  std::vector<std::vector<float>> lp(jobs.size());
  std::vector<std::vector<uint8_t>> greedy(jobs.size());
  BackendPtr backend = default_backend();
  for (size_t start = 0; start < order.size(); start += size_t(batch_size)) {
    const size_t n = std::min(order.size() - start, size_t(batch_size));
    const int64_t width = len(order[start]);
    std::vector<int32_t> ids(n * size_t(width), 0), targets(n * size_t(width), 0);
    for (size_t r = 0; r < n; ++r) {
      const Job& j = jobs[order[start + r]];
      const auto& s = seqs[j.seq];
      for (int64_t p = j.w.begin; p < j.w.end - 1; ++p) {
        ids[r * size_t(width) + size_t(p - j.w.begin)] = s[size_t(p)];
        targets[r * size_t(width) + size_t(p - j.w.begin)] = s[size_t(p + 1)];
      }
    }
    const TargetScores sc = scores(Tensor::from_ints(ids, {int64_t(n), width}, backend), targets);
    DEW_CHECK(sc.logprobs.size() == targets.size() && sc.argmax.size() == targets.size(),
              "lm_eval: ", sc.logprobs.size(), " scores for ", targets.size(), " targets");
    const std::vector<float>& vals = sc.logprobs;
    const std::vector<int32_t>& am = sc.argmax;
    for (size_t r = 0; r < n; ++r) {
      const size_t jid = order[start + r];
      const Job& j = jobs[jid];
      for (int64_t t = j.w.first; t < j.w.end; ++t) {
        const size_t row = r * size_t(width) + size_t(t - 1 - j.w.begin);
        lp[jid].push_back(vals[row]);
        greedy[jid].push_back(am[row] == targets[row]);
      }
    }
  }
  for (size_t jid = 0; jid < jobs.size(); ++jid) {
    Scored& s = out[jobs[jid].seq];
    for (size_t k = 0; k < lp[jid].size(); ++k) {
      s.logprob += double(lp[jid][k]);
      s.greedy = s.greedy && greedy[jid][k];
      s.token_logprobs.push_back(lp[jid][k]);
      ++s.tokens;
    }
  }
  return out;
}

std::vector<Scored> loglikelihood(const ScoreFn& scores,
                                  const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& requests,
                                  int64_t max_length, int64_t batch_size, int32_t prefix_token) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> t0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& [ctx, cont] = requests[i];
    DEW_USAGE_CHECK(!cont.empty(), "loglikelihood request ", i, ": the continuation is empty");
    std::vector<int32_t> s = ctx;
    if (s.empty()) {
      DEW_USAGE_CHECK(prefix_token >= 0, "loglikelihood request ", i,
                      ": the context is empty and there is no prefix token (the tokenizer has no EOS; pass "
                      "--prefix_token ID)");
      s.push_back(prefix_token);
    }
    t0.push_back(int64_t(s.size()));
    s.insert(s.end(), cont.begin(), cont.end());
    seqs.push_back(std::move(s));
  }
  return score(scores, seqs, t0, max_length, max_length, batch_size);
}

std::vector<Scored> loglikelihood_rolling(const ScoreFn& scores, const std::vector<std::vector<int32_t>>& docs,
                                          int32_t prefix_token, int64_t max_length, int64_t stride,
                                          int64_t batch_size) {
  DEW_USAGE_CHECK(prefix_token >= 0,
                  "rolling log-likelihood needs a prefix token for the first token (the tokenizer has no EOS; pass "
                  "--prefix_token ID)");
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> t0;
  for (const auto& d : docs) {
    std::vector<int32_t> s{prefix_token};
    s.insert(s.end(), d.begin(), d.end());
    seqs.push_back(std::move(s));
    t0.push_back(1);
  }
  return score(scores, seqs, t0, max_length, stride, batch_size);
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> encode_pair(
    const std::function<std::vector<int32_t>(const std::string&)>& encode, const std::string& context,
    const std::string& continuation) {
  std::string ctx = context, cont = continuation;
  size_t keep = ctx.size();
  while (keep > 0 && (ctx[keep - 1] == ' ' || ctx[keep - 1] == '\t' || ctx[keep - 1] == '\n' || ctx[keep - 1] == '\r'))
    --keep;
  if (keep < ctx.size()) {
    cont = ctx.substr(keep) + cont;
    ctx.resize(keep);
  }
  const std::vector<int32_t> whole = encode(ctx + cont);
  const std::vector<int32_t> c = encode(ctx);
  // As lm-evaluation-harness: the continuation is whole[len(encode(context)):].
  const size_t cut = std::min(c.size(), whole.size());
  return {c, std::vector<int32_t>(whole.begin() + std::ptrdiff_t(cut), whole.end())};
}

}  // namespace dew::lm_eval
