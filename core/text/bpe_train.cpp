// core/text/bpe_train.cpp — learning byte-level BPE merges.
//
// The corpus is pre-tokenized (pretokenize_gpt2) into words, counted: the work is over distinct words
// weighted by frequency. Pair counts and, per pair, the words it occurs in, are built once; each merge
// then rewrites only the words holding the best pair and updates the counts of the pairs around each
// rewrite (-freq for the pairs that disappear, +freq for the new ones). The best pair comes from a
// max-heap with lazy deletion: an entry whose count is out of date is pushed again with the current
// count. Ties go to the smaller (left id, right id), so training is deterministic. As in Hugging Face
// `tokenizers`, a merge whose bytes already are a token reuses that id. The end-of-text token
// "<|endoftext|>" is the last id; literal occurrences of it in the texts are not learned from.
#include <algorithm>
#include <queue>
#include <unordered_map>

#include "dew/error.hpp"
#include "text/text_internal.hpp"

namespace dew {

namespace {
constexpr const char* kEos = "<|endoftext|>";
}

std::unique_ptr<Tokenizer> train_bpe(const std::vector<std::string>& texts, int64_t vocab_size) {
  using namespace text;
  DEW_USAGE_CHECK(vocab_size >= 257 && vocab_size <= (int64_t(1) << 24), "BPE vocab_size must be in [257, 2^24] ",
                  "(256 bytes + merges + <|endoftext|>), got ", vocab_size);

  // ---- distinct words and their frequencies ----
  std::unordered_map<std::string, int64_t> freq;
  const std::string_view eos_text(kEos);
  for (const std::string& t : texts) {
    std::string_view rest(t);
    while (!rest.empty()) {
      const size_t p = rest.find(eos_text);
      const std::string_view part = rest.substr(0, p);
      text::for_each_chunk(part, [&](std::string_view chunk) {
        for (std::string_view w : pretokenize_gpt2(chunk)) ++freq[std::string(w)];
      });
      if (p == std::string_view::npos) break;
      rest.remove_prefix(p + eos_text.size());
    }
  }
  struct Word {
    std::vector<int32_t> sym;
    int64_t freq;
  };
  std::vector<Word> words;
  words.reserve(freq.size());
  {
    // A fixed order (by bytes) so that nothing depends on the hash map's iteration order.
    std::vector<std::pair<std::string, int64_t>> sorted(freq.begin(), freq.end());
    freq.clear();
    std::sort(sorted.begin(), sorted.end());
    for (auto& [w, f] : sorted) {
      if (w.size() < 2) continue;  // nothing to merge
      Word word;
      word.freq = f;
      word.sym.reserve(w.size());
      for (char c : w) word.sym.push_back(static_cast<unsigned char>(c));
      words.push_back(std::move(word));
    }
  }

  // ---- pair counts and where each pair occurs ----
  std::unordered_map<uint64_t, int64_t> count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  count.reserve(1 << 16);
  where.reserve(1 << 16);
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].sym;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      count[k] += words[w].freq;
      auto& list = where[k];
      if (list.empty() || list.back() != int32_t(w)) list.push_back(int32_t(w));
    }
  }
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [k, c] : count) heap.push({c, k});

  // ---- merge ----
  std::vector<std::string> tokens;
  tokens.reserve(size_t(vocab_size));
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, char(b));
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) id_of.emplace(tokens[size_t(b)], b);
  std::vector<std::array<int32_t, 3>> merges;
  std::vector<int32_t> stamp(words.size(), -1);
  std::vector<uint64_t> grown;
  const auto target = size_t(vocab_size - 1);  // the last id is <|endoftext|>
  while (tokens.size() < target && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    auto cit = count.find(top.key);
    const int64_t current = cit == count.end() ? 0 : cit->second;
    if (current != top.count) {
      if (current > 0) heap.push({current, top.key});
      continue;
    }
    if (current <= 0) continue;
    const auto a = int32_t(top.key >> 32), b = int32_t(uint32_t(top.key));
    std::string merged_bytes = tokens[size_t(a)] + tokens[size_t(b)];
    int32_t merged;
    if (auto it = id_of.find(merged_bytes); it != id_of.end()) {
      merged = it->second;
    } else {
      merged = int32_t(tokens.size());
      id_of.emplace(merged_bytes, merged);
      tokens.push_back(std::move(merged_bytes));
    }
    const auto mi = int32_t(merges.size());
    merges.push_back({a, b, merged});

    grown.clear();
    auto add = [&](int32_t x, int32_t y, int64_t f, int32_t w) {
      const uint64_t k = pair_key(x, y);
      int64_t& c = count[k];
      c += f;
      if (f > 0) {
        grown.push_back(k);
        auto& list = where[k];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    };
    std::vector<int32_t> holders = std::move(where[top.key]);
    where.erase(top.key);
    for (int32_t w : holders) {
      if (stamp[size_t(w)] == mi) continue;
      stamp[size_t(w)] = mi;
      auto& s = words[size_t(w)].sym;
      const int64_t f = words[size_t(w)].freq;
      const size_t n = s.size();
      size_t j = 0;
      for (size_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
          if (j > 0) {
            add(s[j - 1], a, -f, w);
            add(s[j - 1], merged, f, w);
          }
          if (i + 2 < n) {
            add(b, s[i + 2], -f, w);
            add(merged, s[i + 2], f, w);
          }
          add(a, b, -f, w);
          s[j++] = merged;
          i += 2;
        } else {
          s[j++] = s[i++];
        }
      }
      s.resize(j);
    }
    count.erase(top.key);
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t k : grown) {
      auto it = count.find(k);
      if (it != count.end() && it->second > 0) heap.push({it->second, k});
    }
  }

  const auto eos = int32_t(tokens.size());
  tokens.emplace_back(kEos);
  std::vector<bool> present(tokens.size(), true);
  std::vector<AddedToken> added{{eos, kEos, true}};
  return std::make_unique<BpeTokenizer>(std::move(tokens), std::move(present), std::move(merges), std::move(added), eos,
                                        false, false, "train_bpe");
}

}  // namespace dew
