// core/eval/lm_tasks.cpp — `dew-run eval --task ...` for a causal language model (dew/lm_commands.hpp, docs/eval.md).
// Request files are JSONL: one JSON object per line (blank lines skipped); an error names the file and
// the line. Text fields need the run's tokenizer; the *_ids fields take token ids directly.
// Invariants: every request gets exactly one output line, in order; metrics are means over requests
// (or over tokens where said); every key of the request is read or the command refuses it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/lm_commands.hpp"
#include "dew/lm_eval.hpp"

namespace dew {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
namespace le = dew::lm_eval;

struct Line {
  json j;
  int64_t number = 0;
};

std::vector<Line> read_jsonl(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  DEW_USAGE_CHECK(in.good(), "eval: cannot read --requests file '", path, "'");
  std::vector<Line> out;
  std::string s;
  int64_t n = 0;
  while (std::getline(in, s)) {
    ++n;
    if (s.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      Line l{json::parse(s), n};
      DEW_USAGE_CHECK(l.j.is_object(), path, ":", n, ": a request must be a JSON object");
      out.push_back(std::move(l));
    } catch (const json::exception& e) {
      DEW_USAGE_CHECK(false, path, ":", n, ": not valid JSON: ", e.what());
    }
    if (limit > 0 && int64_t(out.size()) >= limit) break;
  }
  DEW_USAGE_CHECK(!out.empty(), "eval: --requests file '", path, "' holds no requests");
  return out;
}

std::string where(const std::string& path, const Line& l) { return path + ":" + std::to_string(l.number); }

std::vector<int32_t> ids_of(const json& v, const std::string& at, const std::string& key) {
  DEW_USAGE_CHECK(v.is_array(), at, ": '", key, "' must be a list of token ids");
  std::vector<int32_t> out;
  for (const auto& x : v) {
    DEW_USAGE_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX, at, ": '", key,
                    "' holds ", x.dump(), ", not a token id");
    out.push_back(int32_t(x.get<int64_t>()));
  }
  return out;
}

std::string str_of(const json& v, const std::string& at, const std::string& key) {
  DEW_USAGE_CHECK(v.is_string(), at, ": '", key, "' must be a string");
  return v.get<std::string>();
}

// The first present key of `keys`, or nullptr.
const json* field(const json& j, std::initializer_list<const char*> keys, std::string* name = nullptr) {
  for (const char* k : keys)
    if (j.contains(k)) {
      if (name) *name = k;
      return &j[k];
    }
  return nullptr;
}

class Harness {
 public:
  Harness(dew::Options& r, const LmCommandContext& c) : req_(r), c_(c) {
    DEW_USAGE_CHECK(c.model != nullptr, "eval: the ", c.objective, " objective has no model");
    const int64_t ctx = c.decoder ? c.decoder->context_length() : 0;
    max_length_ = req_.get_int("max_length", ctx > 0 ? ctx : 2048);
    DEW_USAGE_CHECK(max_length_ >= 1, "--max_length must be >= 1, got ", max_length_);
    batch_ = req_.get_int("batch_size", 8);
    DEW_USAGE_CHECK(batch_ >= 1, "--batch_size must be >= 1, got ", batch_);
    limit_ = req_.get_int("limit", 0);
    DEW_USAGE_CHECK(limit_ >= 0, "--limit must be >= 0 (0: every request), got ", limit_);
    const int64_t prefix = req_.get_int("prefix_token", c.tokenizer ? c.tokenizer->eos_id() : -1);
    const int64_t vocab = c.decoder ? c.decoder->vocab_size() : c.tokenizer ? c.tokenizer->vocab_size() : 0;
    DEW_USAGE_CHECK(prefix == -1 || (prefix >= 0 && (vocab == 0 || prefix < vocab)), "--prefix_token ", prefix,
                    " must be -1 (none) or a token id in [0, ", vocab, ")");
    prefix_ = int32_t(prefix);
    scores_ = le::model_scores(*c.model);
  }

  dew::ValidationResult run(const std::string& task) {
    if (task == "perplexity") return perplexity();
    if (task == "loglikelihood") return loglikelihood();
    if (task == "multiple_choice") return multiple_choice();
    if (task == "loglikelihood_rolling") return rolling();
    if (task == "generate_until") return generate_until();
    DEW_USAGE_CHECK(false, "eval: unknown --task '", task,
                    "' (perplexity, loglikelihood, multiple_choice, loglikelihood_rolling, generate_until)");
    return {};
  }

 private:
  std::vector<int32_t> encode(const std::string& text, const std::string& at) const {
    DEW_USAGE_CHECK(c_.tokenizer != nullptr, at,
                    ": a text request needs the run's tokenizer ([data] path with meta.json); this run has none: "
                    "use the *_ids fields");
    return c_.tokenizer->encode(text);
  }

  std::string requests_path() {
    DEW_USAGE_CHECK(req_.has("requests"), "eval: --task ", task_, " needs --requests FILE.jsonl");
    return req_.require_string("requests");
  }

  static dew::Artifact artifact(const std::string& task, const std::vector<json>& rows) {
    std::string body;
    for (const auto& r : rows) body += r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    return {task + ".jsonl", std::vector<unsigned char>(body.begin(), body.end())};
  }

  // ---- perplexity of a token file ----
  dew::ValidationResult perplexity() {
    task_ = "perplexity";
    const std::string dir = req_.get_string("data", c_.data_path);
    DEW_USAGE_CHECK(!dir.empty(),
                    "eval --task perplexity: give --data DIR (a dew-tokenize folder); the run has no "
                    "[data] path");
    const std::string split = req_.get_string("split", "val");
    DEW_USAGE_CHECK(split == "val" || split == "train", "--split must be val or train, got '", split, "'");
    const int64_t stride = req_.get_int("stride", max_length_);
    const int64_t max_tokens = req_.get_int("max_tokens", 0);
    DEW_USAGE_CHECK(max_tokens >= 0, "--max_tokens must be >= 0 (0: the whole split)");
    const dew::TokenMeta meta = dew::read_token_meta(dir);
    // The folder's tokens must be the run's: the same tokenizer (kind, vocabulary, and for BPE the same ids
    // for a probe text); else the scores are of other tokens than the model learnt, or ids past its vocabulary.
    if (c_.tokenizer && !meta.tokenizer.empty()) {
      const dew::Tokenizer& mine = *c_.tokenizer;
      DEW_USAGE_CHECK(meta.tokenizer == mine.name() && meta.vocab_size == mine.vocab_size(),
                      "eval --task perplexity: ", dir, " was tokenized by a ", meta.tokenizer, " tokenizer of ",
                      meta.vocab_size, " tokens; the run's is a ", mine.name(), " tokenizer of ", mine.vocab_size());
      if (meta.tokenizer == "bpe") {
        const std::string probe = "The quick brown fox jumps over 13 lazy dogs.\n\tÉté, naïve café: 日本語 ✓";
        DEW_USAGE_CHECK(dew::load_tokenizer(dir)->encode(probe) == mine.encode(probe), "eval --task perplexity: ", dir,
                        "'s tokenizer.json encodes text differently from the run's tokenizer");
      }
    }
    const int64_t total = split == "val" ? meta.val_tokens : meta.train_tokens;
    const int64_t n = max_tokens > 0 ? std::min(max_tokens, total) : total;
    DEW_USAGE_CHECK(n >= 2, "eval --task perplexity: ",
                    max_tokens > 0 && max_tokens < total ? "--max_tokens " + std::to_string(max_tokens) + " leaves "
                                                         : dir + "/" + split + ".bin holds ",
                    n, " tokens; at least 2 are needed");
    const int64_t width = dew::token_dtype_size(meta.dtype);
    const std::string file = (fs::path(dir) / (split + ".bin")).string();
    std::ifstream in(file, std::ios::binary);
    DEW_USAGE_CHECK(in.good(), "cannot read '", file, "'");
    std::vector<unsigned char> raw(static_cast<size_t>(n * width));
    in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()));
    DEW_USAGE_CHECK(in.gcount() == std::streamsize(raw.size()), file, " is shorter than meta.json says");
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v = 0;
      for (int64_t b = 0; b < width; ++b) v |= uint32_t(raw[size_t(i * width + b)]) << (8 * b);
      ids[size_t(i)] = int32_t(v);
      DEW_USAGE_CHECK(!c_.decoder || int64_t(v) < c_.decoder->vocab_size(), "eval --task perplexity: token ", i, " of ",
                      file, " is ", v, ", outside the model's vocabulary of ", c_.decoder->vocab_size());
    }
    // Every token but the first (no context) is scored once.
    const auto s = le::score(scores_, {ids}, {1}, max_length_, stride, batch_);
    const double nats = -s[0].logprob;
    const int64_t tokens = s[0].tokens;
    double bytes = 0;
    std::unique_ptr<dew::Tokenizer> tok;
    const dew::Tokenizer* t = c_.tokenizer;
    if (!t && (meta.tokenizer == "byte" || meta.tokenizer == "bpe")) {
      tok = dew::load_tokenizer(dir);
      t = tok.get();
    }
    if (t) {  // the scored tokens' text: document tokens (eos) carry none
      std::vector<int32_t> text_ids;
      for (auto it = ids.begin() + 1; it != ids.end(); ++it)
        if (meta.documents == 0 || *it != meta.eos_id) text_ids.push_back(*it);
      bytes = double(t->decode(text_ids).size());
    } else if (meta.tokenizer == "byte")
      bytes = double(tokens);
    else if ((split == "val" ? meta.val_bytes : meta.train_bytes) > 0)
      bytes = double(split == "val" ? meta.val_bytes : meta.train_bytes) * double(tokens) / double(total);
    dew::ValidationResult r;
    r.metrics["ce"] = nats / double(tokens);
    r.metrics["perplexity"] = std::exp(nats / double(tokens));
    if (bytes > 0) r.metrics["bits_per_byte"] = nats / std::log(2.0) / bytes;
    r.metrics["tokens"] = double(tokens);
    r.metrics["windows"] = double(le::plan_windows(1, n, max_length_, stride).size());
    return r;
  }

  // ---- log-likelihood of (context, continuation) pairs ----
  std::pair<std::vector<int32_t>, std::vector<int32_t>> pair_of(const json& j, const std::string& at,
                                                                const std::string& cont_key_text, const json* cont_text,
                                                                const json* cont_ids) {
    if (cont_ids) {
      const json* ctx = field(j, {"context_ids"});
      return {ctx ? ids_of(*ctx, at, "context_ids") : std::vector<int32_t>{},
              ids_of(*cont_ids, at, "continuation_ids")};
    }
    DEW_USAGE_CHECK(cont_text != nullptr, at, ": no continuation ('", cont_key_text, "' or its _ids form)");
    std::string ctx_key;
    const json* ctx = field(j, {"context", "query", "question"}, &ctx_key);
    const std::string context = ctx ? str_of(*ctx, at, ctx_key) : std::string();
    const std::string cont = str_of(*cont_text, at, cont_key_text);
    DEW_USAGE_CHECK(!cont.empty(), at, ": the continuation is empty");
    if (context.empty()) return {{}, encode(cont, at)};
    encode("", at);  // refuses when there is no tokenizer
    return le::encode_pair([this](const std::string& s) { return c_.tokenizer->encode(s); }, context, cont);
  }

  dew::ValidationResult loglikelihood() {
    task_ = "loglikelihood";
    const std::string path = requests_path();
    const auto lines = read_jsonl(path, limit_);
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> reqs;
    for (const auto& l : lines)
      reqs.push_back(
          pair_of(l.j, where(path, l), "continuation", field(l.j, {"continuation"}), field(l.j, {"continuation_ids"})));
    const auto s = le::loglikelihood(scores_, reqs, max_length_, batch_, prefix_);
    dew::ValidationResult r;
    std::vector<json> rows;
    double sum = 0;
    int64_t greedy = 0, tokens = 0;
    for (const auto& x : s) {
      rows.push_back({{"loglikelihood", x.logprob}, {"is_greedy", x.greedy}, {"tokens", x.tokens}});
      sum += x.logprob;
      greedy += x.greedy;
      tokens += x.tokens;
    }
    r.metrics["requests"] = double(s.size());
    r.metrics["loglikelihood_sum"] = sum;
    r.metrics["loglikelihood_mean"] = sum / double(s.size());
    r.metrics["greedy_fraction"] = double(greedy) / double(s.size());
    r.metrics["tokens"] = double(tokens);
    r.artifacts.push_back(artifact(task_, rows));
    return r;
  }

  // ---- multiple choice: the choice with the highest log-likelihood ----
  dew::ValidationResult multiple_choice() {
    task_ = "multiple_choice";
    const std::string path = requests_path();
    const std::string delim = req_.get_string("target_delimiter", " ");
    const auto lines = read_jsonl(path, limit_);
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> reqs;
    struct Q {
      size_t first = 0, count = 0;
      int64_t gold = -1;
      std::vector<double> norm;  // per choice: bytes (text) or tokens (ids)
    };
    std::vector<Q> qs;
    for (const auto& l : lines) {
      const std::string at = where(path, l);
      Q q;
      q.first = reqs.size();
      std::string gk;
      const json* g = field(l.j, {"gold", "answer", "label"}, &gk);
      DEW_USAGE_CHECK(g && g->is_number_integer(), at, ": needs an integer 'gold' (or 'answer' / 'label')");
      q.gold = g->get<int64_t>();
      if (const json* ci = field(l.j, {"choices_ids"})) {
        DEW_USAGE_CHECK(ci->is_array() && !ci->empty(), at, ": 'choices_ids' must be a non-empty list");
        const json* ctx = field(l.j, {"context_ids"});
        const std::vector<int32_t> c = ctx ? ids_of(*ctx, at, "context_ids") : std::vector<int32_t>{};
        for (const auto& ch : *ci) {
          reqs.emplace_back(c, ids_of(ch, at, "choices_ids"));
          q.norm.push_back(double(reqs.back().second.size()));
        }
      } else {
        const json* ch = field(l.j, {"choices"});
        DEW_USAGE_CHECK(ch && ch->is_array() && !ch->empty(), at, ": needs a non-empty 'choices' list");
        for (const auto& x : *ch) {
          const std::string choice = str_of(x, at, "choices");
          json one = l.j;
          one["continuation"] = delim + choice;
          reqs.push_back(pair_of(one, at, "continuation", &one["continuation"], nullptr));
          q.norm.push_back(double(std::max<size_t>(1, choice.size())));
        }
      }
      q.count = reqs.size() - q.first;
      DEW_USAGE_CHECK(q.gold >= 0 && q.gold < int64_t(q.count), at, ": gold ", q.gold, " is not a choice index (",
                      q.count, " choices)");
      qs.push_back(std::move(q));
    }
    const auto s = le::loglikelihood(scores_, reqs, max_length_, batch_, prefix_);
    double acc = 0, acc_norm = 0;
    std::vector<json> rows;
    for (const Q& q : qs) {
      size_t best = 0, best_norm = 0;
      std::vector<double> ll;
      for (size_t k = 0; k < q.count; ++k) {
        ll.push_back(s[q.first + k].logprob);
        if (ll[k] > ll[best]) best = k;
        if (ll[k] / q.norm[k] > ll[best_norm] / q.norm[best_norm]) best_norm = k;
      }
      acc += int64_t(best) == q.gold;
      acc_norm += int64_t(best_norm) == q.gold;
      rows.push_back({{"loglikelihoods", ll}, {"pred", best}, {"pred_norm", best_norm}, {"gold", q.gold}});
    }
    dew::ValidationResult r;
    r.metrics["questions"] = double(qs.size());
    r.metrics["acc"] = acc / double(qs.size());
    r.metrics["acc_norm"] = acc_norm / double(qs.size());
    r.artifacts.push_back(artifact(task_, rows));
    return r;
  }

  // ---- rolling log-likelihood of whole documents ----
  dew::ValidationResult rolling() {
    task_ = "loglikelihood_rolling";
    const std::string path = requests_path();
    const int64_t stride = req_.get_int("stride", max_length_);
    const auto lines = read_jsonl(path, limit_);
    std::vector<std::vector<int32_t>> docs;
    double bytes = 0, words = 0;
    bool text = true;
    for (const auto& l : lines) {
      const std::string at = where(path, l);
      if (const json* ids = field(l.j, {"ids", "text_ids"})) {
        docs.push_back(ids_of(*ids, at, "ids"));
        text = false;
      } else {
        const json* t = field(l.j, {"text", "page", "document"});
        DEW_USAGE_CHECK(t != nullptr, at, ": needs 'text' (or 'ids')");
        const std::string s = str_of(*t, at, "text");
        docs.push_back(encode(s, at));
        bytes += double(s.size());
        std::istringstream ws(s);
        for (std::string w; ws >> w;) ++words;
      }
      DEW_USAGE_CHECK(!docs.back().empty(), at, ": the document is empty");
    }
    const auto s = le::loglikelihood_rolling(scores_, docs, prefix_, max_length_, stride, batch_);
    double sum = 0;
    int64_t tokens = 0;
    std::vector<json> rows;
    for (const auto& x : s) {
      sum += x.logprob;
      tokens += x.tokens;
      rows.push_back({{"loglikelihood", x.logprob}, {"tokens", x.tokens}});
    }
    dew::ValidationResult r;
    r.metrics["documents"] = double(s.size());
    r.metrics["loglikelihood_sum"] = sum;
    r.metrics["tokens"] = double(tokens);
    r.metrics["token_perplexity"] = std::exp(-sum / double(tokens));
    if (text && bytes > 0) {
      r.metrics["bits_per_byte"] = -sum / std::log(2.0) / bytes;
      r.metrics["byte_perplexity"] = std::exp(-sum / bytes);
    }
    if (text && words > 0) r.metrics["word_perplexity"] = std::exp(-sum / words);
    r.artifacts.push_back(artifact(task_, rows));
    return r;
  }

  // ---- generation until a stop string ----
  dew::ValidationResult generate_until() {
    task_ = "generate_until";
    DEW_USAGE_CHECK(c_.decoder != nullptr, "eval --task generate_until: the backbone does not decode incrementally");
    const std::string path = requests_path();
    const int64_t default_max = req_.get_int("max_gen_toks", 256);
    const double temperature = req_.get_double("temperature", 0.0);
    const int64_t seed = req_.get_int("seed", 0);
    const bool ignore_eos = req_.get_bool("ignore_eos", false);
    DEW_USAGE_CHECK(seed >= 0, "--seed must not be negative");
    const auto lines = read_jsonl(path, limit_);
    std::vector<json> rows;
    double gen_tokens = 0, matches = 0, targets = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const auto& l = lines[i];
      const std::string at = where(path, l);
      std::vector<int32_t> prompt;
      if (const json* ci = field(l.j, {"context_ids"}))
        prompt = ids_of(*ci, at, "context_ids");
      else if (const json* ct = field(l.j, {"context", "query", "question"}))
        prompt = encode(str_of(*ct, at, "context"), at);
      if (prompt.empty()) {
        DEW_USAGE_CHECK(prefix_ >= 0, at, ": empty context and no prefix token (pass --prefix_token ID)");
        prompt.push_back(prefix_);
      }
      dew::SamplingParams sp;
      sp.temperature = float(temperature);
      sp.seed = uint64_t(seed);
      sp.eos_id = ignore_eos || !c_.tokenizer ? -1 : c_.tokenizer->eos_id();
      sp.max_new_tokens = default_max;
      if (const json* m = field(l.j, {"max_gen_toks", "max_new_tokens"})) {
        DEW_USAGE_CHECK(m->is_number_integer() && m->get<int64_t>() >= 0, at, ": max_gen_toks must be >= 0");
        sp.max_new_tokens = m->get<int64_t>();
      }
      if (const json* u = field(l.j, {"until", "stop"})) {
        if (u->is_string())
          sp.stop.push_back(u->get<std::string>());
        else {
          DEW_USAGE_CHECK(u->is_array(), at, ": 'until' must be a string or a list of strings");
          for (const auto& x : *u) sp.stop.push_back(str_of(x, at, "until"));
        }
        sp.stop.erase(std::remove(sp.stop.begin(), sp.stop.end(), std::string()), sp.stop.end());
        DEW_USAGE_CHECK(sp.stop.empty() || c_.tokenizer, at, ": stop strings need the run's tokenizer");
      }
      dew::validate(sp);
      // Sequence i draws from its own stream when sampling (temperature > 0).
      auto start = dew::decoder_start(*c_.decoder);
      dew::SamplingParams one = sp;
      one.seed = sp.seed + uint64_t(i);
      const auto g = dew::generate(start, {prompt}, one, c_.tokenizer, c_.decoder->context_length());
      json row = {{"generation", g[0].text}, {"tokens", g[0].tokens}, {"finish_reason", g[0].finish_reason}};
      gen_tokens += double(g[0].tokens.size());
      if (const json* t = field(l.j, {"target"})) {
        auto trim = [](std::string s) {
          const auto a = s.find_first_not_of(" \t\r\n");
          if (a == std::string::npos) return std::string();
          return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
        };
        const bool ok = trim(g[0].text) == trim(str_of(*t, at, "target"));
        row["exact_match"] = ok;
        matches += ok;
        ++targets;
      }
      rows.push_back(std::move(row));
    }
    dew::ValidationResult r;
    r.metrics["requests"] = double(lines.size());
    r.metrics["generated_tokens_mean"] = gen_tokens / double(lines.size());
    if (targets > 0) r.metrics["exact_match"] = matches / targets;
    r.artifacts.push_back(artifact(task_, rows));
    return r;
  }

  dew::Options& req_;
  const LmCommandContext& c_;
  std::string task_;
  int64_t max_length_ = 2048, batch_ = 8, limit_ = 0;
  int32_t prefix_ = -1;
  le::ScoreFn scores_;
};

}  // namespace

ValidationResult run_lm_task(const std::string& task, Options& request, const LmCommandContext& c) {
  const bool was_training = c.model && c.model->training();
  if (c.model) c.model->set_training(false);
  NoGradGuard no_grad;
  Harness h(request, c);
  ValidationResult r = h.run(task);
  c.model->set_training(was_training);
  return r;
}

}  // namespace dew
