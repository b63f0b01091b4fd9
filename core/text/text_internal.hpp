// core/text/text_internal.hpp — what the tokenizer sources share: UTF-8 decoding and character
// classes (pretokenize.cpp), GPT-2's byte <-> unicode mapping, the BPE tokenizer class (bpe.cpp), and
// atomic file writes (token_files.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dew/tokenizer.hpp"

namespace dew::text {

// ---- UTF-8 and character classes ----
enum class CharClass : uint8_t { other = 0, letter = 1, number = 2, space = 3 };

// Length (1..4) of the valid UTF-8 sequence at s[i] and its code point; an invalid byte has length 1
// and *valid = false.
int utf8_decode(std::string_view s, size_t i, uint32_t* cp, bool* valid);
CharClass class_of(uint32_t cp);
void append_utf8(std::string& out, uint32_t cp);

// Calls f(chunk) for consecutive chunks of text (about `target` bytes each) cut only where GPT-2's
// pre-tokenizer cuts anyway (after "\n" between two ASCII non-space characters), so pre-tokenizing
// the chunks one by one gives the pieces of the whole text with bounded memory.
template <class F>
void for_each_chunk(std::string_view text, F&& f, size_t target = size_t(1) << 20) {
  auto is_plain = [](char c) { return static_cast<unsigned char>(c) < 0x80 && c != ' ' && (c < 0x09 || c > 0x0D); };
  size_t start = 0;
  while (text.size() - start > target + target / 2) {
    size_t cut = 0;
    for (size_t b = start + target; b < text.size() && b < start + 2 * target; ++b)
      if (text[b - 1] == '\n' && is_plain(text[b - 2]) && is_plain(text[b])) {
        cut = b;
        break;
      }
    if (cut == 0) break;  // no safe cut nearby: the rest in one piece
    f(text.substr(start, cut - start));
    start = cut;
  }
  f(text.substr(start));
}

// ---- GPT-2's bytes_to_unicode: every byte as a printable code point ----
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};              // byte -> code point
  std::unordered_map<uint32_t, uint8_t> to_byte;  // code point -> byte
  static const ByteMap& get();
};
std::string bytes_to_mapped(std::string_view bytes);  // "Ġhello" for " hello"
// The bytes a mapped string stands for; false when a code point is not one of the 256.
bool mapped_to_bytes(std::string_view mapped, std::string* bytes);

// ---- byte-level BPE ----
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = true;
};

// How a tokenizer.json cuts and normalizes text, beyond GPT-2's byte-level BPE (the default).
enum class PreTok : uint8_t { gpt2, llama3, qwen2, none, metaspace_split };
enum class Prepend : uint8_t { never, first, always };
struct BpeStyle {
  PreTok pretok = PreTok::gpt2;
  bool nfc = false;  // NFC normalizer, per segment between added tokens
  // SentencePiece (byte_fallback): the BPE runs over the characters of the text with " " -> "▁";
  // a character without a vocab entry becomes its UTF-8 bytes' <0xNN> tokens.
  bool sentencepiece = false;
  Prepend sp_prepend = Prepend::never;                // "▁" before a segment (first: the one at offset 0)
  bool sp_prepend_unless_marked = false;              // Metaspace: not when the segment already starts with "▁"
  int sp_strip = 0;                                   // decode: up to this many leading spaces dropped
  std::unordered_map<std::string, int32_t> sp_chars;  // single-character pieces (the file's spelling) -> id
  std::array<int32_t, 256> byte_fallback{};           // <0xNN> ids
  int32_t bos = -1;                                   // encode() starts with it (TemplateProcessing)
  std::string source_json;  // non-GPT-2 styles: the file, which save_tokenizer_json writes back
};

class BpeTokenizer final : public Tokenizer {
 public:
  // tokens: id -> bytes (ids without a token: empty and absent from `present`); merges in rank order
  // as (left id, right id, merged id); added tokens are also in `tokens`.
  BpeTokenizer(std::vector<std::string> tokens, std::vector<bool> present, std::vector<std::array<int32_t, 3>> merges,
               std::vector<AddedToken> added, int32_t eos, bool add_prefix_space, bool ignore_merges,
               const std::string& origin, BpeStyle style = {});

  std::string name() const override { return "bpe"; }
  int64_t vocab_size() const override { return int64_t(tokens_.size()); }
  int32_t eos_id() const override { return eos_; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id) const override;

  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<bool>& present() const { return present_; }
  const std::vector<std::array<int32_t, 3>>& merges() const { return merges_; }
  const std::vector<AddedToken>& added() const { return added_; }
  bool add_prefix_space() const { return add_prefix_space_; }
  bool ignore_merges() const { return ignore_merges_; }
  const BpeStyle& style() const { return style_; }

 private:
  void encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // Merges adjacent symbols by rank (lowest first, leftmost first); appends the result.
  void merge_symbols(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<bool> present_;
  std::vector<std::array<int32_t, 3>> merges_;
  std::vector<AddedToken> added_;
  int32_t eos_ = -1;
  bool add_prefix_space_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> rank_;  // (left, right) -> (rank, merged)
  std::unordered_map<std::string, int32_t> ids_;                    // bytes -> id (ignore_merges only)
  BpeStyle style_;
  // Per-word cache: pre-token bytes -> ids (bounded; cleared when full).
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// The ids the usual end-of-text token names have, tried in order: "<|endoftext|>", "</s>", ...
int32_t find_eos(const std::unordered_map<std::string, int32_t>& token_to_id);

// ---- files ----
// Writes path via "<path>.tmp-<pid>" + fsync + rename; throws dew::Error naming the file.
void write_file_atomic(const std::string& path, const void* data, size_t size);
std::string read_text_file(const std::string& path, const char* what);  // UsageError when unreadable

}  // namespace dew::text
