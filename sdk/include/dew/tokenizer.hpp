// dew/tokenizer.hpp — tokenizers (byte, byte-level BPE) and the token-file layout dew-tokenize writes.
//
// Tokenizers map text (bytes; UTF-8 expected but not required) to ids and back, losslessly:
// decode(encode(x)) == x for every byte string x, invalid UTF-8 included (tokenizer.json normalizers
// aside: see load_hf_tokenizer_json).
//  * byte: id = byte value, vocab 256; eos_id() == 255, the document token (byte 0xFF never occurs in
//    UTF-8 text, so it cannot be confused with text dew-tokenize accepts; it still decodes to 0xFF).
//  * bpe: byte-level BPE as in GPT-2. Text is cut into pre-tokens by GPT-2's pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    (Unicode letter/number classes from Unicode 14; a byte that is not part of valid UTF-8 counts as
//    "other"), then each pre-token's bytes are merged by rank (lowest rank first, leftmost first), as
//    Hugging Face `tokenizers` does. Added tokens (e.g. "<|endoftext|>") are matched literally in the
//    text before pre-tokenization. A trained tokenizer has ids 0..255 = the bytes, then the merged
//    tokens, then "<|endoftext|>" (its eos) as the last id.
// Files: Hugging Face tokenizer.json (BPE in GPT-2's, Llama 3's / Qwen2's and Llama 2's / Mistral's
// styles, see load_hf_tokenizer_json; anything else is refused by field) and GPT-2's vocab.json +
// merges.txt are read; tokenizer.json is written (it loads back to the same tokenizer, and into
// Hugging Face `tokenizers`).
//
// Token files (a folder, the nanoGPT layout): train.bin, val.bin (token ids, little-endian, dtype the
// smallest of uint8/uint16/uint32 holding the vocab; the validation split is the HEAD of the stream),
// meta.json {tokenizer, vocab_size, dtype, train_tokens, val_tokens, train_bytes, val_bytes, eos_id,
// documents} (bytes: the UTF-8 bytes of the documents' text each split covers, for bits per byte: no
// document token and no start-of-text token a tokenizer adds is counted), and tokenizer.json for bpe.
// Document boundaries: when meta.json has documents > 0, the stream is that many documents each ended
// (or, written with DocumentMarks::between, separated) by eos_id, so a document starts after every
// eos_id token (and at the start of a split); the tokens source's pack = true needs them.
//
// Errors: malformed or missing user files are dew::UsageError (exit status 2), naming the file.
// Tokenizers are immutable after construction; every method is thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dew {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;  // "byte" | "bpe"
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eos_id() const = 0;  // -1 when none
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Concatenates token_bytes of the ids: invalid UTF-8 stays as bytes (a tokenizer.json that adds a
  // BOS: see load_hf_tokenizer_json). An id outside [0, vocab_size()) throws dew::Error naming it.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The raw bytes of one token (an added token: its content, e.g. "<|endoftext|>"; an id the vocab
  // skips: ""). Throws for an id outside [0, vocab_size()).
  virtual std::string token_bytes(int32_t id) const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();  // vocab 256, eos -1

// Learns merges on the texts until the vocab (256 bytes + merged tokens + "<|endoftext|>") holds
// vocab_size tokens, or the corpus has no pair left (then the vocab is smaller). vocab_size >= 257.
// Pair counts over word frequencies with incremental updates: a few MB train in about a second.
std::unique_ptr<Tokenizer> train_bpe(const std::vector<std::string>& texts, int64_t vocab_size);

// Hugging Face tokenizer.json, model.type BPE, in one of three styles (anything else is refused,
// naming the field):
//  * GPT-2: ByteLevel pre-tokenizer (GPT-2's pattern), no normalizer.
//  * Llama 3 / Qwen2 / Qwen3: Sequence[Split(Llama 3's or Qwen2's pattern, see pretokenize_llama3),
//    ByteLevel(use_regex false)], normalizer null or NFC.
//  * Llama 2 / Mistral (SentencePiece converted): byte_fallback BPE over characters, normalizer
//    Sequence[Prepend("▁"), Replace(" ", "▁")] or pre-tokenizer Metaspace; "▁" decodes to " ",
//    "<0xNN>" to the byte NN; characters outside the vocab are encoded as their <0xNN> bytes.
// A TemplateProcessing post-processor "<bos> $A" makes encode() start with that token, and decode()
// drop it when the ids start with it (then, for SentencePiece, the space the normalizer put before
// the text is dropped too, the Strip decoder). decode(encode(x)) == x for every x, except that an
// NFC normalizer gives NFC(x), and a SentencePiece one turns "▁" in the text into " ".
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);
// GPT-2's vocab.json + merges.txt ("#version" line optional); eos: "<|endoftext|>" when in the vocab.
std::unique_ptr<Tokenizer> load_gpt2_vocab(const std::string& vocab_json, const std::string& merges_txt);
// Writes a BPE tokenizer as tokenizer.json (atomically), and the byte tokenizer as GPT-2's byte-level BPE with no
// merges (id = byte value: what Hugging Face's tokenizers then encodes); refuses other tokenizers.
void save_tokenizer_json(const Tokenizer& tokenizer, const std::string& path);

// GPT-2's pre-tokenizer: the pieces (views into text) BPE merges within. Concatenated they are text.
std::vector<std::string_view> pretokenize_gpt2(std::string_view text);
// Llama 3's (max_digits 3: \p{N}{1,3}) and Qwen2's (max_digits 1: \p{N}) Split pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with the classes of pretokenize_gpt2. Concatenated, the pieces are text.
std::vector<std::string_view> pretokenize_llama3(std::string_view text, int max_digits = 3);
// Unicode NFC (Unicode 14 tables); a byte that is not valid UTF-8 stays as it is.
std::string normalize_nfc(std::string_view text);
// True when the bytes are valid UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view bytes);

// ---- token files ----
struct TokenMeta {
  std::string tokenizer, dtype;
  int64_t vocab_size = 0, train_tokens = 0, val_tokens = 0, train_bytes = 0, val_bytes = 0;
  int32_t eos_id = -1;
  int64_t documents = 0;  // documents marked by eos_id in the stream; 0 = no document boundaries recorded
};

// "uint8" (vocab <= 256), "uint16" (<= 65536), else "uint32".
std::string token_dtype_for(int64_t vocab_size);
// Bytes per token of "uint8" | "uint16" | "uint32"; a UsageError otherwise.
int64_t token_dtype_size(const std::string& dtype);

// Reads <dir>/meta.json: clear usage errors for a missing or malformed file or field. Required:
// vocab_size, dtype, train_tokens, val_tokens; optional: tokenizer (""), train_bytes, val_bytes (0),
// eos_id (-1), documents (0).
TokenMeta read_token_meta(const std::string& dir);
void write_token_meta(const TokenMeta& meta, const std::string& dir);  // atomic

// Reads <dir>/meta.json (and <dir>/tokenizer.json for bpe) written by dew-tokenize; refuses a
// tokenizer whose vocab size disagrees with meta.json.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

// What dew-tokenize does after reading its inputs: encodes the documents (each on its own, so no
// pre-token spans two), joined by the eos token when eos_between_documents and the tokenizer has one
// (else plainly concatenated); the first floor(val_fraction * tokens) tokens are val.bin, the rest
// train.bin; writes meta.json last, tokenizer.json for bpe; every file atomically (temp + rename).
// Creates dir. Returns what meta.json says.
TokenMeta write_token_corpus(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                             const std::string& dir, double val_fraction = 0.05, bool eos_between_documents = false);
// How the documents are marked in the stream with the tokenizer's eos (its document token): none (plainly
// concatenated, no boundaries recorded), between (separated), end (every document ends with it: what
// dew-tokenize writes by default). With between or end and a tokenizer that has an eos, meta.json records
// documents = documents.size(). eos_between_documents = true above is DocumentMarks::between.
enum class DocumentMarks { none, between, end };
TokenMeta write_token_corpus(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                             const std::string& dir, double val_fraction, DocumentMarks marks);

}  // namespace dew
