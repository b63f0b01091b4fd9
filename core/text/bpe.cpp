// core/text/bpe.cpp — byte-level BPE encoding and decoding.
//
// encode: added tokens are cut out first (leftmost match, the longest at a position); each piece in
// between is pre-tokenized (pretokenize_gpt2) and every pre-token's bytes are merged as Hugging Face
// `tokenizers` does: a heap of adjacent pairs ordered by (merge rank, position); the lowest is merged,
// stale entries are skipped, the pairs with the new neighbours are pushed. O(n log n) per pre-token, so
// long runs (a line of 10^5 '=') stay fast. Pre-tokens are cached per tokenizer (bounded, mutex).
// The style (BpeStyle) picks the pre-tokenizer (GPT-2's, Llama 3's / Qwen2's, none, Metaspace's),
// an NFC normalizer, SentencePiece's "▁" + byte fallback over characters, and a BOS encode() starts
// with and decode() drops again.
#include <algorithm>
#include <cstdio>
#include <queue>

#include "dew/error.hpp"
#include "text/text_internal.hpp"

namespace dew::text {

namespace {
constexpr size_t kCacheEntries = size_t(1) << 20;
constexpr size_t kCacheWordBytes = 256;
}  // namespace

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens, std::vector<bool> present,
                           std::vector<std::array<int32_t, 3>> merges, std::vector<AddedToken> added, int32_t eos,
                           bool add_prefix_space, bool ignore_merges, const std::string& origin, BpeStyle style)
    : tokens_(std::move(tokens)),
      present_(std::move(present)),
      merges_(std::move(merges)),
      added_(std::move(added)),
      eos_(eos),
      add_prefix_space_(add_prefix_space),
      ignore_merges_(ignore_merges),
      style_(std::move(style)) {
  DEW_INTERNAL_ASSERT(tokens_.size() == present_.size());
  const auto n = int64_t(tokens_.size());
  DEW_USAGE_CHECK(n > 0 && n < (int64_t(1) << 31), origin, ": bad vocabulary size ", n);
  DEW_USAGE_CHECK(eos_ >= -1 && eos_ < n, origin, ": eos id ", eos_, " is outside the vocabulary");
  DEW_USAGE_CHECK(style_.bos >= -1 && style_.bos < n, origin, ": bos id ", style_.bos, " is outside the vocabulary");
  std::vector<bool> is_added(tokens_.size(), false);
  for (const AddedToken& a : added_) {
    DEW_USAGE_CHECK(a.id >= 0 && a.id < n, origin, ": added token '", a.content, "' has id ", a.id,
                    " outside the vocabulary");
    DEW_USAGE_CHECK(!a.content.empty(), origin, ": added token ", a.id, " is empty");
    is_added[size_t(a.id)] = true;
  }
  byte_id_.fill(-1);
  if (style_.sentencepiece) {
    DEW_INTERNAL_ASSERT(!ignore_merges_ && !add_prefix_space_);
    for (int32_t id : style_.byte_fallback) DEW_INTERNAL_ASSERT(id >= 0 && id < n);
    for (const auto& [c, id] : style_.sp_chars) DEW_INTERNAL_ASSERT(id >= 0 && id < n);
  }
  for (int64_t id = 0; id < n && !style_.sentencepiece; ++id) {
    const std::string& t = tokens_[size_t(id)];
    if (!present_[size_t(id)] || is_added[size_t(id)]) continue;
    if (t.size() == 1 && byte_id_[static_cast<unsigned char>(t[0])] < 0)
      byte_id_[static_cast<unsigned char>(t[0])] = int32_t(id);
    if (ignore_merges_) ids_.emplace(t, int32_t(id));
  }
  for (int b = 0; b < 256 && !style_.sentencepiece; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", b);
    DEW_USAGE_CHECK(byte_id_[size_t(b)] >= 0, origin, ": the vocabulary has no token for byte ", hex,
                    "; a byte-level BPE vocabulary holds all 256 bytes");
  }
  rank_.reserve(merges_.size() * 2);
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto& m = merges_[r];
    for (int32_t x : m) DEW_INTERNAL_ASSERT(x >= 0 && x < n);
    rank_.emplace(pair_key(m[0], m[1]), std::make_pair(int32_t(r), m[2]));  // a repeated pair keeps its first rank
  }
}

void BpeTokenizer::encode_word(std::string_view w, std::vector<int32_t>& out) const {
  if (!style_.sentencepiece) {
    if (w.size() == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(w[0])]);
      return;
    }
    if (ignore_merges_) {
      auto it = ids_.find(std::string(w));
      if (it != ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
  }
  const bool cacheable = w.size() <= kCacheWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(std::string(w));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(w.size());
  if (!style_.sentencepiece) {
    for (char c : w) ids.push_back(byte_id_[static_cast<unsigned char>(c)]);
  } else {
    // Characters (an invalid byte is one of its own); one without a piece: its bytes' <0xNN>.
    std::string ch;
    for (size_t i = 0; i < w.size();) {
      uint32_t cp;
      bool valid;
      const auto len = size_t(utf8_decode(w, i, &cp, &valid));
      ch.assign(w.substr(i, len));
      auto it = valid ? style_.sp_chars.find(ch) : style_.sp_chars.end();
      if (it != style_.sp_chars.end())
        ids.push_back(it->second);
      else
        for (char c : ch) ids.push_back(style_.byte_fallback[static_cast<unsigned char>(c)]);
      i += len;
    }
  }
  const size_t at = out.size();
  merge_symbols(ids, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(std::string(w), std::vector<int32_t>(out.begin() + std::ptrdiff_t(at), out.end()));
  }
}

void BpeTokenizer::merge_symbols(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id, prev, next;
  };
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = int32_t(ids.size());
  if (n == 0) return;
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) sym[size_t(i)] = {ids[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    const int32_t a = sym[size_t(pos)].id, b = sym[size_t(nx)].id;
    auto it = rank_.find(pair_key(a, b));
    if (it != rank_.end()) heap.push({it->second.first, pos, a, b, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& s = sym[size_t(c.pos)];
    if (s.id != c.left || s.next < 0 || sym[size_t(s.next)].id != c.right) continue;  // stale
    const int32_t gone = s.next;
    s.id = c.merged;
    s.next = sym[size_t(gone)].next;
    if (s.next >= 0) sym[size_t(s.next)].prev = c.pos;
    sym[size_t(gone)].id = -1;
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

void BpeTokenizer::encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (style_.nfc) {
    normalized = normalize_nfc(text);
    text = normalized;
  }
  if (style_.sentencepiece) {
    static constexpr std::string_view kMark = "\xE2\x96\x81";  // U+2581 "▁"
    std::string t;
    t.reserve(text.size() + text.size() / 4 + 3);
    for (char c : text) {
      if (c == ' ')
        t += kMark;
      else
        t += c;
    }
    const bool prepend = style_.sp_prepend == Prepend::always || (style_.sp_prepend == Prepend::first && at_start);
    if (prepend && !(style_.sp_prepend_unless_marked && t.compare(0, kMark.size(), kMark) == 0)) t.insert(0, kMark);
    if (style_.pretok != PreTok::metaspace_split) {
      encode_word(t, out);
      return;
    }
    // Metaspace split: a word starts at every "▁".
    const std::string_view v(t);
    size_t from = 0;
    for (size_t p = v.find(kMark, 1); p != std::string_view::npos; p = v.find(kMark, p + 1)) {
      encode_word(v.substr(from, p - from), out);
      from = p;
    }
    encode_word(v.substr(from), out);
    return;
  }
  std::string prefixed;
  if (add_prefix_space_ && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;
    text = prefixed;
  }
  for_each_chunk(text, [&](std::string_view chunk) {
    switch (style_.pretok) {
      case PreTok::llama3:
        for (std::string_view piece : pretokenize_llama3(chunk, 3)) encode_word(piece, out);
        break;
      case PreTok::qwen2:
        for (std::string_view piece : pretokenize_llama3(chunk, 1)) encode_word(piece, out);
        break;
      default:
        for (std::string_view piece : pretokenize_gpt2(chunk)) encode_word(piece, out);
    }
  });
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (style_.bos >= 0) out.push_back(style_.bos);
  if (added_.empty()) {
    encode_segment(text, true, out);
    return out;
  }
  struct Match {
    size_t pos, len;
    int32_t id;
  };
  std::vector<Match> matches;
  for (const AddedToken& a : added_)
    for (size_t p = text.find(a.content); p != std::string_view::npos; p = text.find(a.content, p + 1))
      matches.push_back({p, a.content.size(), a.id});
  std::sort(matches.begin(), matches.end(),
            [](const Match& x, const Match& y) { return x.pos != y.pos ? x.pos < y.pos : x.len > y.len; });
  size_t at = 0;
  for (const Match& m : matches) {
    if (m.pos < at) continue;  // overlaps the previous match
    encode_segment(text.substr(at, m.pos - at), at == 0, out);
    out.push_back(m.id);
    at = m.pos + m.len;
  }
  encode_segment(text.substr(at), at == 0, out);
  return out;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  DEW_CHECK(id >= 0 && int64_t(id) < vocab_size(), "bpe tokenizer: id ", id, " is outside [0, ", vocab_size(), ")");
  return tokens_[size_t(id)];
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  // The BOS encode() put first is dropped; then the ids start a text, whose leading space (put there
  // by the SentencePiece normalizer) the Strip decoder drops.
  size_t first = 0;
  bool text_start = style_.bos < 0;
  if (style_.bos >= 0 && !ids.empty() && ids[0] == style_.bos) {
    first = 1;
    text_start = true;
  }
  for (size_t i = first; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    DEW_CHECK(id >= 0 && int64_t(id) < vocab_size(), "bpe tokenizer: id ", id, " (at ", i, ") is outside [0, ",
              vocab_size(), ")");
    out += tokens_[size_t(id)];
  }
  if (text_start && style_.sp_strip > 0) {
    size_t k = 0;
    while (k < out.size() && k < size_t(style_.sp_strip) && out[k] == ' ') ++k;
    out.erase(0, k);
  }
  return out;
}

int32_t find_eos(const std::unordered_map<std::string, int32_t>& token_to_id) {
  for (const char* name : {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>"}) {
    auto it = token_to_id.find(name);
    if (it != token_to_id.end()) return it->second;
  }
  return -1;
}

}  // namespace dew::text
