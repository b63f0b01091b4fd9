// tests/text/test_text.cpp — tokenizers (core/text), dew-tokenize, and the tokens data source.
//
// Tokenizers must be lossless on every byte string (invalid UTF-8 included); the pre-tokenizer must cut
// text as GPT-2's regex does; a trained BPE must have the vocab asked for and compress; a tokenizer
// saved as tokenizer.json must load back to the same encodings; a GPT-2 vocab.json + merges.txt must
// give GPT-2's ids. dew-tokenize must take the validation split from the head, skip binary files and
// count the bytes each split covers. The tokens source must return exactly the file's windows and refuse
// files that disagree with meta.json.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/tokenizer.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace fs = std::filesystem;
using namespace dew;

namespace {

using dew_test::TempDir;

void write_file(const fs::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary);
  out << content;
  REQUIRE(out.good());
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <class F>
std::string error_of(F&& f, ErrorKind want = ErrorKind::usage) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == want);
    return e.what();
  }
  FAIL("no dew::Error was thrown");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A deterministic generator (no implementation-defined distributions).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return size_t(next() % n); }
};

// English-like text with some Unicode, numbers and punctuation.
std::string generated_text(size_t bytes, uint64_t seed) {
  static const std::vector<std::string> words = {
      "the",    "of",      "and",   "to",        "in",     "is",    "that",  "for",        "it",       "as",
      "was",    "with",    "be",    "by",        "on",     "not",   "he",    "this",       "are",      "or",
      "his",    "from",    "at",    "which",     "but",    "have",  "an",    "they",       "you",      "were",
      "her",    "one",     "all",   "we",        "can",    "their", "there", "been",       "if",       "more",
      "when",   "will",    "would", "who",       "so",     "model", "token", "language",   "training", "gradient",
      "loss",   "batch",   "layer", "attention", "vector", "café",  "naïve", "über",       "日本語",   "テキスト",
      "привет", "мир",     "😀",     "👍🏽",  "١٢٣",    "42",    "2024",  "3.14",       "don't",    "it's",
      "we'll",  "they've", "I'm",   "(see",      "below)", "e.g.,", "--",    "\"quoted\"", "x=y+1;"};
  Rng r(seed);
  std::string out;
  while (out.size() < bytes) {
    const size_t n = 4 + r.below(12);
    for (size_t i = 0; i < n; ++i) {
      std::string w = words[r.below(words.size())];
      if (i == 0 && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 'a' + 'A');
      out += w;
      out += i + 1 < n ? " " : (r.below(8) == 0 ? ".\n\n" : r.below(8) == 0 ? ".\n" : ". ");
    }
  }
  return out;
}

// Arbitrary strings: Unicode of every class, whitespace runs, emoji, invalid UTF-8.
std::string random_string(Rng& r) {
  static const std::vector<std::string> pieces = {"a",
                                                  "b",
                                                  "Z",
                                                  "hello",
                                                  " ",
                                                  "  ",
                                                  "   ",
                                                  "\t",
                                                  "\n",
                                                  "\r\n",
                                                  "\n\n",
                                                  "'s",
                                                  "'ll",
                                                  "'",
                                                  "0",
                                                  "123",
                                                  "!",
                                                  "?!",
                                                  ".",
                                                  "é",
                                                  "ü",
                                                  "ß",
                                                  "日",
                                                  "本",
                                                  "😀",
                                                  "👍🏽",
                                                  "🏳️‍🌈",
                                                  "\u00a0",
                                                  "\u2003",
                                                  "\u3000",
                                                  "\u0301",
                                                  "न",
                                                  "्",
                                                  "ت",
                                                  "١",
                                                  "½",
                                                  "\xff",
                                                  "\xc3",
                                                  "\xe2\x82",
                                                  "\xed\xa0\x80",
                                                  "\xf4\x90\x80\x80",
                                                  std::string(1, '\0'),
                                                  "\x7f"};
  std::string s;
  const size_t n = r.below(24);
  for (size_t i = 0; i < n; ++i) s += pieces[r.below(pieces.size())];
  return s;
}

const std::vector<std::string>& small_corpus() {
  static const std::vector<std::string> c = {generated_text(60000, 1), generated_text(30000, 2),
                                             "The quick brown fox jumps over the lazy dog.\n"};
  return c;
}

// ---- GPT-2 fixtures ----
// GPT-2's bytes_to_unicode, in its order: GPT-2's ids 0..255.
std::vector<std::pair<int, std::string>> gpt2_byte_tokens() {
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  std::vector<std::pair<int, std::string>> out;
  for (size_t i = 0; i < bs.size(); ++i) {
    std::string u;
    const auto cp = uint32_t(cs[i]);
    if (cp < 0x80) {
      u += char(cp);
    } else {
      u += char(0xC0 | (cp >> 6));
      u += char(0x80 | (cp & 0x3F));
    }
    out.emplace_back(bs[i], u);
  }
  return out;
}

const std::vector<std::pair<std::string, std::string>> kFixtureMerges = {
    {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"H", "e"}, {"l", "l"}, {"He", "ll"}};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// vocab.json: 256 byte tokens (GPT-2 ids), the merges' results 256..263, <|endoftext|> 264.
std::string fixture_vocab_json() {
  std::string j = "{";
  int id = 0;
  for (const auto& [b, u] : gpt2_byte_tokens()) {
    j += std::string(id ? ", " : "") + "\"" + json_escape(u) + "\": " + std::to_string(id);
    ++id;
  }
  for (const auto& [a, b] : kFixtureMerges) {
    j += ", \"" + json_escape(a + b) + "\": " + std::to_string(id);
    ++id;
  }
  j += ", \"<|endoftext|>\": " + std::to_string(id) + "}";
  return j;
}

std::string fixture_merges_txt() {
  std::string m = "#version: 0.2\n";
  for (const auto& [a, b] : kFixtureMerges) m += a + " " + b + "\n";
  return m;
}

std::string fixture_tokenizer_json(
    const std::string& pre_tokenizer =
        R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})",
    const std::string& normalizer = "null", const std::string& model_type = "BPE") {
  std::string merges;
  for (const auto& [a, b] : kFixtureMerges) merges += (merges.empty() ? "\"" : ", \"") + a + " " + b + "\"";
  return R"({"version": "1.0", "added_tokens": [{"id": 264, "content": "<|endoftext|>", "special": true}],
  "normalizer": )" +
         normalizer + R"(, "pre_tokenizer": )" + pre_tokenizer +
         R"(, "decoder": {"type": "ByteLevel"},
  "model": {"type": ")" +
         model_type + R"(", "dropout": null, "unk_token": null, "vocab": )" + fixture_vocab_json() +
         R"(, "merges": [)" + merges + "]}}";
}

// ---- token folders ----
void write_bin(const fs::path& p, const std::vector<uint32_t>& ids, int width) {
  std::string bytes;
  for (uint32_t v : ids)
    for (int b = 0; b < width; ++b) bytes += char((v >> (8 * b)) & 0xFF);
  write_file(p, bytes);
}

void make_token_dir(const fs::path& dir, const std::string& dtype, int64_t vocab, const std::vector<uint32_t>& train,
                    const std::vector<uint32_t>& val) {
  fs::create_directories(dir);
  const int width = int(token_dtype_size(dtype));
  write_bin(dir / "train.bin", train, width);
  write_bin(dir / "val.bin", val, width);
  TokenMeta m;
  m.tokenizer = "byte";
  m.dtype = dtype;
  m.vocab_size = vocab;
  m.train_tokens = int64_t(train.size());
  m.val_tokens = int64_t(val.size());
  write_token_meta(m, dir.string());
}

std::vector<uint32_t> iota_ids(uint32_t from, size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + uint32_t(i);
  return v;
}

std::vector<int32_t> text_of(const Record& r) {
  const HostArray& a = r.at("text");
  REQUIRE(a.dtype == DType::i32);
  REQUIRE(a.shape.size() == 1);
  return std::vector<int32_t>(a.as<int32_t>(), a.as<int32_t>() + a.numel());
}

}  // namespace

// ================================================================ byte tokenizer
TEST_CASE("byte tokenizer: ids are the bytes, every byte string round-trips") {
  auto t = make_byte_tokenizer();
  CHECK(t->name() == "byte");
  CHECK(t->vocab_size() == 256);
  CHECK(t->eos_id() == 255);  // the document token: a byte UTF-8 text never holds
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  const auto ids = t->encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[size_t(b)] == b);
  CHECK(t->decode(ids) == all);
  Rng r(5);
  for (int i = 0; i < 200; ++i) {
    const std::string s = random_string(r);
    CHECK(t->decode(t->encode(s)) == s);
  }
  CHECK(t->token_bytes(0xC3) == std::string(1, '\xC3'));
  CHECK(contains(error_of([&] { t->decode({1, 256}); }, ErrorKind::runtime), "256"));
  error_of([&] { t->token_bytes(-1); }, ErrorKind::runtime);
}

// ================================================================ pre-tokenizer
TEST_CASE("pretokenize_gpt2 cuts as GPT-2's regex does") {
  auto cut = [](std::string_view s) {
    std::vector<std::string> out;
    for (auto p : pretokenize_gpt2(s)) out.emplace_back(p);
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(cut("Hello world!") == V{"Hello", " world", "!"});
  CHECK(cut("it's they'll I'M") == V{"it", "'s", " they", "'ll", " I", "'", "M"});
  CHECK(cut("a   b") == V{"a", "  ", " b"});
  CHECK(cut("\n\nHello") == V{"\n", "\n", "Hello"});
  CHECK(cut("x  \n") == V{"x", "  \n"});
  CHECK(cut("abc123 456 7a") == V{"abc", "123", " 456", " 7", "a"});
  CHECK(cut("naïve café 日本語") == V{"naïve", " café", " 日本語"});
  CHECK(cut("hi 😀😀!") == V{"hi", " 😀😀!"});
  CHECK(cut("a\u00a0b") == V{"a", "\u00a0", "b"});  // NBSP is white space, not a prefix space
  CHECK(cut("½ ²") == V{"½", " ²"});                // \p{N} includes No
  CHECK(cut("").empty());
  Rng r(9);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_string(r);
    std::string joined;
    for (auto p : pretokenize_gpt2(s)) {
      CHECK(!p.empty());
      joined += p;
    }
    CHECK(joined == s);
  }
  CHECK(is_valid_utf8("naïve 日本 😀"));
  CHECK_FALSE(is_valid_utf8("\xff"));
  CHECK_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong
  CHECK_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  CHECK_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  CHECK_FALSE(is_valid_utf8("\xe2\x82"));          // cut short
}

// ================================================================ BPE
TEST_CASE("train_bpe: the vocab asked for, lossless, compresses, deterministic") {
  auto t = train_bpe(small_corpus(), 600);
  CHECK(t->name() == "bpe");
  CHECK(t->vocab_size() == 600);
  CHECK(t->eos_id() == 599);
  CHECK(t->token_bytes(599) == "<|endoftext|>");
  for (int b = 0; b < 256; ++b) CHECK(t->token_bytes(b) == std::string(1, char(b)));

  const std::string& text = small_corpus()[0];
  const auto ids = t->encode(text);
  CHECK(t->decode(ids) == text);
  MESSAGE("600-token BPE: ", text.size(), " bytes -> ", ids.size(), " tokens");
  CHECK(double(ids.size()) < 0.5 * double(text.size()));
  for (int32_t id : ids) CHECK((id >= 0 && id < 599));

  Rng r(11);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = random_string(r);
    const auto e = t->encode(s);
    REQUIRE(t->decode(e) == s);
  }
  for (const char* s : {"", " ", "    ", "\n\n\n", "😀", "emoji 👍🏽 and flags 🏳️‍🌈",
                        "tabs\t\tand  spaces   ", "日本語のテキスト", "a<|endoftext|>b", "<|endoftext|>"})
    CHECK(t->decode(t->encode(s)) == s);
  // The eos text is the eos token.
  CHECK(t->encode("a<|endoftext|>b") == std::vector<int32_t>{t->encode("a")[0], 599, t->encode("b")[0]});

  auto again = train_bpe(small_corpus(), 600);
  CHECK(again->encode(text) == ids);
  for (int id = 0; id < 600; ++id) CHECK(again->token_bytes(id) == t->token_bytes(id));

  CHECK(contains(error_of([] { train_bpe({"abc"}, 100); }), "vocab_size"));
  // A corpus that runs out of pairs gives a smaller vocab.
  auto tiny = train_bpe({"ab ab ab"}, 1000);
  CHECK(tiny->vocab_size() < 1000);
  CHECK(tiny->decode(tiny->encode("ab ab ba")) == "ab ab ba");
}

TEST_CASE("a long text is encoded as its pre-tokens are") {
  // Texts over 1.5 MB are pre-tokenized in chunks cut where GPT-2's pattern cuts anyway.
  auto t = train_bpe(small_corpus(), 400);
  const std::string big = generated_text(3'500'000, 23) + "  tail \n";
  const auto ids = t->encode(big);
  std::vector<int32_t> by_piece;
  for (std::string_view piece : pretokenize_gpt2(big)) {
    const auto e = t->encode(piece);
    by_piece.insert(by_piece.end(), e.begin(), e.end());
  }
  CHECK(ids == by_piece);
  CHECK(t->decode(ids) == big);
}

TEST_CASE("save_tokenizer_json -> load_hf_tokenizer_json gives the same tokenizer") {
  TempDir dir("json");
  auto t = train_bpe(small_corpus(), 700);
  save_tokenizer_json(*t, (dir / "tokenizer.json"));
  auto u = load_hf_tokenizer_json((dir / "tokenizer.json"));
  CHECK(u->name() == "bpe");
  CHECK(u->vocab_size() == t->vocab_size());
  CHECK(u->eos_id() == t->eos_id());
  for (int id = 0; id < t->vocab_size(); ++id) CHECK(u->token_bytes(id) == t->token_bytes(id));
  CHECK(u->encode(small_corpus()[1]) == t->encode(small_corpus()[1]));
  Rng r(13);
  for (int i = 0; i < 1000; ++i) {
    const std::string s = random_string(r);
    REQUIRE(u->encode(s) == t->encode(s));
  }
  // Saved again, the file is the same.
  save_tokenizer_json(*u, (dir / "again.json"));
  CHECK(read_file(dir.path / "again.json") == read_file(dir.path / "tokenizer.json"));
  // The byte tokenizer's form: a byte-level BPE without merges that encodes every string to its bytes.
  save_tokenizer_json(*make_byte_tokenizer(), (dir / "b.json"));
  auto b = load_hf_tokenizer_json((dir / "b.json"));
  CHECK(b->vocab_size() == 256);
  auto bytes = make_byte_tokenizer();
  for (int i = 0; i < 1000; ++i) {
    const std::string s = random_string(r);
    REQUIRE(b->encode(s) == bytes->encode(s));
    REQUIRE(b->decode(b->encode(s)) == s);
  }
}

TEST_CASE("GPT-2 vocab.json + merges.txt and tokenizer.json give GPT-2's ids") {
  TempDir dir("gpt2");
  write_file(dir.path / "vocab.json", fixture_vocab_json());
  write_file(dir.path / "merges.txt", fixture_merges_txt());
  write_file(dir.path / "tokenizer.json", fixture_tokenizer_json());
  auto a = load_gpt2_vocab((dir / "vocab.json"), (dir / "merges.txt"));
  auto b = load_hf_tokenizer_json((dir / "tokenizer.json"));
  for (const auto* t : {a.get(), b.get()}) {
    CHECK(t->vocab_size() == 265);
    CHECK(t->eos_id() == 264);
    // GPT-2's own ids for bytes: "!" 0, "H" 39, "o" 78, "x" 87, " " 220.
    CHECK(t->encode("!") == std::vector<int32_t>{0});
    CHECK(t->encode(" ") == std::vector<int32_t>{220});
    // "Hello": H e -> He, l l -> ll, He ll -> Hell; "Hell" "o" has no merge. " world" merges whole.
    CHECK(t->encode("Hello world!") == std::vector<int32_t>{263, 78, 260, 0});
    CHECK(t->encode("Hello world<|endoftext|>  x") == std::vector<int32_t>{263, 78, 260, 264, 220, 220, 87});
    CHECK(t->decode({263, 78, 260, 0}) == "Hello world!");
    CHECK(t->token_bytes(220) == " ");
    CHECK(t->token_bytes(256) == " w");
  }
  // Saved and loaded again: the same ids.
  save_tokenizer_json(*a, (dir / "saved.json"));
  CHECK(load_hf_tokenizer_json((dir / "saved.json"))->encode("Hello world! world") == a->encode("Hello world! world"));

  // Other tokenizer kinds are refused by name.
  write_file(dir.path / "wp.json", fixture_tokenizer_json(R"({"type": "ByteLevel"})", "null", "WordPiece"));
  CHECK(contains(error_of([&] { load_hf_tokenizer_json((dir / "wp.json")); }), "WordPiece"));
  write_file(dir.path / "ms.json", fixture_tokenizer_json(R"({"type": "Metaspace", "replacement": "▁"})"));
  CHECK(contains(error_of([&] { load_hf_tokenizer_json((dir / "ms.json")); }), "Metaspace"));
  write_file(dir.path / "nfkc.json", fixture_tokenizer_json(R"({"type": "ByteLevel"})", R"({"type": "NFKC"})"));
  CHECK(contains(error_of([&] { load_hf_tokenizer_json((dir / "nfkc.json")); }), "NFKC"));
  write_file(dir.path / "bad.json", "{\"model\": ");
  CHECK(contains(error_of([&] { load_hf_tokenizer_json((dir / "bad.json")); }), "not valid JSON"));
  CHECK(contains(error_of([&] { load_hf_tokenizer_json((dir / "none.json")); }), "does not exist"));
  write_file(dir.path / "merges_bad.txt", "#version: 0.2\nH e\nq zz\n");
  CHECK(contains(error_of([&] { load_gpt2_vocab((dir / "vocab.json"), (dir / "merges_bad.txt")); }), "merge 3"));
}

// ================================================================ meta.json
TEST_CASE("token dtype by vocab size, meta.json reading") {
  CHECK(token_dtype_for(256) == "uint8");
  CHECK(token_dtype_for(257) == "uint16");
  CHECK(token_dtype_for(50000) == "uint16");
  CHECK(token_dtype_for(65536) == "uint16");
  CHECK(token_dtype_for(65537) == "uint32");
  CHECK(token_dtype_for(70000) == "uint32");
  CHECK(token_dtype_size("uint16") == 2);
  error_of([] { token_dtype_size("int16"); });

  TempDir dir("meta");
  TokenMeta m;
  m.tokenizer = "bpe";
  m.dtype = "uint16";
  m.vocab_size = 50000;
  m.train_tokens = 10;
  m.val_tokens = 2;
  m.train_bytes = 40;
  m.val_bytes = 9;
  m.eos_id = 49999;
  write_token_meta(m, dir.str());
  const TokenMeta r = read_token_meta(dir.str());
  CHECK(r.tokenizer == "bpe");
  CHECK(r.dtype == "uint16");
  CHECK(r.vocab_size == 50000);
  CHECK(r.train_tokens == 10);
  CHECK(r.val_tokens == 2);
  CHECK(r.train_bytes == 40);
  CHECK(r.val_bytes == 9);
  CHECK(r.eos_id == 49999);

  CHECK(contains(error_of([&] { read_token_meta((dir / "nope")); }), "does not exist"));
  fs::create_directories(dir.path / "empty");
  CHECK(contains(error_of([&] { read_token_meta((dir / "empty")); }), "meta.json"));
  write_file(dir.path / "meta.json", "{\"vocab_size\": 5,");
  CHECK(contains(error_of([&] { read_token_meta(dir.str()); }), "not valid JSON"));
  // A number JSON cannot hold (fuzz/regressions/token_files): one dew error, not nlohmann's out_of_range.
  write_file(dir.path / "meta.json", R"({"vocab_size": 1e5003, "train_tokens": 5, "val_tokens": 1})");
  CHECK(contains(error_of([&] { read_token_meta(dir.str()); }), "not valid JSON"));
  write_file(dir.path / "meta.json", R"({"vocab_size": 300, "dtype": "uint16", "train_tokens": 5})");
  CHECK(contains(error_of([&] { read_token_meta(dir.str()); }), "val_tokens"));
  write_file(dir.path / "meta.json", R"({"vocab_size": 300, "dtype": "uint8", "train_tokens": 5, "val_tokens": 1})");
  CHECK(contains(error_of([&] { read_token_meta(dir.str()); }), "does not fit"));
  write_file(dir.path / "meta.json", R"({"vocab_size": 300, "dtype": "float", "train_tokens": 5, "val_tokens": 1})");
  CHECK(contains(error_of([&] { read_token_meta(dir.str()); }), "float"));
  write_file(dir.path / "meta.json", R"({"vocab_size": "300", "dtype": "uint16", "train_tokens": 5, "val_tokens": 1})");
  CHECK(contains(error_of([&] { read_token_meta(dir.str()); }), "integer"));
  // Minimal meta (no tokenizer or byte counts) is accepted.
  write_file(dir.path / "meta.json", R"({"vocab_size": 300, "dtype": "uint16", "train_tokens": 5, "val_tokens": 1})");
  CHECK(read_token_meta(dir.str()).eos_id == -1);
  CHECK(contains(error_of([&] { load_tokenizer(dir.str()); }), "tokenizer ''"));
}

TEST_CASE("write_token_corpus + load_tokenizer") {
  TempDir dir("corpus");
  auto t = train_bpe(small_corpus(), 500);
  const std::vector<std::string> docs = {"first document.\n", "second one, naïve café\n", "third 😀\n"};
  const TokenMeta m = write_token_corpus(*t, docs, dir.str(), 0.25, true);
  CHECK(m.tokenizer == "bpe");
  CHECK(m.dtype == "uint16");
  CHECK(m.eos_id == 499);
  int64_t text_bytes = 0;
  for (const auto& d : docs) text_bytes += int64_t(d.size());
  CHECK(m.train_bytes + m.val_bytes == text_bytes);
  auto u = load_tokenizer(dir.str());
  CHECK(u->vocab_size() == 500);
  const std::string val = read_file(dir.path / "val.bin"), train = read_file(dir.path / "train.bin");
  CHECK(int64_t(val.size()) == 2 * m.val_tokens);
  CHECK(int64_t(train.size()) == 2 * m.train_tokens);
  std::vector<int32_t> ids;
  for (const std::string* s : {&val, &train})
    for (size_t i = 0; i + 1 < s->size(); i += 2)
      ids.push_back(int32_t(uint8_t((*s)[i]) | (uint8_t((*s)[i + 1]) << 8)));
  CHECK(u->decode(ids) == docs[0] + "<|endoftext|>" + docs[1] + "<|endoftext|>" + docs[2]);
  CHECK(m.val_tokens == int64_t(std::floor(0.25 * double(ids.size()))));

  // meta.json that disagrees with tokenizer.json is refused.
  TokenMeta bad = m;
  bad.vocab_size = 501;
  write_token_meta(bad, dir.str());
  CHECK(contains(error_of([&] { load_tokenizer(dir.str()); }), "vocab_size 501"));
}

// ================================================================ dew-tokenize
#ifdef DEW_TOKENIZE_EXE
namespace {
int run_tool(const std::string& args, std::string* output) {
  const std::string log =
      (fs::temp_directory_path() / ("dew_test_text_log_" + std::to_string(::getpid()) + ".txt")).string();
  const std::string cmd = std::string(DEW_TOKENIZE_EXE) + " " + args + " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  *output = read_file(log);
  fs::remove(log);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

std::vector<uint32_t> read_ids(const fs::path& p, int width) {
  const std::string s = read_file(p);
  std::vector<uint32_t> ids;
  for (size_t i = 0; i + size_t(width) <= s.size(); i += size_t(width)) {
    uint32_t v = 0;
    for (int b = 0; b < width; ++b) v |= uint32_t(uint8_t(s[i + size_t(b)])) << (8 * b);
    ids.push_back(v);
  }
  return ids;
}
}  // namespace

TEST_CASE("dew-tokenize end to end: byte and bpe, val from the head, binary files skipped") {
  TempDir dir("tool");
  fs::create_directories(dir.path / "in");
  const std::string a = generated_text(20000, 3), b = "the second file, ünïcödé 😀\n";
  write_file(dir.path / "in" / "b.txt", b);
  write_file(dir.path / "in" / "a.txt", a);
  write_file(dir.path / "in" / "c.dat", std::string("\0\0\0\x02\x10", 5));  // like fortune's .dat
  write_file(dir.path / "in" / "d.txt", "bad \xff utf-8\n");
  fs::create_symlink(dir.path / "in" / "a.txt", dir.path / "in" / "e.u8");
  std::string out;

  // byte: the files in name order, val = the first 10% of the bytes (no document tokens here).
  REQUIRE(run_tool("--input " + (dir / "in") + " --out " + (dir / "byte") + " --val-fraction 0.1 --document-token none",
                   &out) == 0);
  CHECK(contains(out, "skipping"));
  CHECK(contains(out, "c.dat"));
  CHECK(contains(out, "d.txt"));
  CHECK_FALSE(contains(out, "e.u8"));
  {
    const TokenMeta m = read_token_meta((dir / "byte"));
    const std::string all = a + b;
    CHECK(m.tokenizer == "byte");
    CHECK(m.vocab_size == 256);
    CHECK(m.dtype == "uint8");
    CHECK(m.eos_id == 255);
    CHECK(m.documents == 0);
    CHECK(m.val_tokens == int64_t(std::floor(0.1 * double(all.size()))));
    CHECK(m.train_tokens + m.val_tokens == int64_t(all.size()));
    CHECK(m.val_bytes == m.val_tokens);
    CHECK(m.train_bytes == m.train_tokens);
    CHECK(read_file(dir.path / "byte" / "val.bin") == all.substr(0, size_t(m.val_tokens)));
    CHECK(read_file(dir.path / "byte" / "train.bin") == all.substr(size_t(m.val_tokens)));
    CHECK_FALSE(fs::exists(dir.path / "byte" / "tokenizer.json"));
    for (const auto& e : fs::directory_iterator(dir.path / "byte"))
      CHECK_FALSE(contains(e.path().filename().string(), ".tmp"));
  }

  // bpe trained here, documents separated by eos.
  REQUIRE(run_tool("--input " + (dir / "in") + " --out " + (dir / "bpe") +
                       " --tokenizer bpe --vocab-size 400 --val-fraction 0.2 --eos-between-files",
                   &out) == 0);
  CHECK(contains(out, "trained a BPE of 400 tokens"));
  {
    const TokenMeta m = read_token_meta((dir / "bpe"));
    CHECK(m.tokenizer == "bpe");
    CHECK(m.vocab_size == 400);
    CHECK(m.dtype == "uint16");
    CHECK(m.eos_id == 399);
    CHECK(m.train_bytes + m.val_bytes == int64_t(a.size() + b.size()));
    auto t = load_tokenizer((dir / "bpe"));
    std::vector<uint32_t> val = read_ids(dir.path / "bpe" / "val.bin", 2),
                          train = read_ids(dir.path / "bpe" / "train.bin", 2);
    CHECK(int64_t(val.size()) == m.val_tokens);
    CHECK(int64_t(train.size()) == m.train_tokens);
    CHECK(m.val_tokens == int64_t(std::floor(0.2 * double(m.val_tokens + m.train_tokens))));
    std::vector<int32_t> ids(val.begin(), val.end());
    ids.insert(ids.end(), train.begin(), train.end());
    CHECK(t->decode(ids) == a + "<|endoftext|>" + b);
    std::vector<int32_t> head(val.begin(), val.end());
    CHECK(int64_t(t->decode(head).size()) == m.val_bytes);
    CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(val.size())) == head);
  }

  // The saved tokenizer.json used on its own: the same ids, without eos this time.
  REQUIRE(run_tool("--input " + (dir / "in/a.txt") + " --input " + (dir / "in/b.txt") + " --out " + (dir / "json") +
                       " --tokenizer-json " + (dir / "bpe/tokenizer.json") + " --val-fraction 0 --document-token none",
                   &out) == 0);
  {
    const TokenMeta m = read_token_meta((dir / "json"));
    CHECK(m.val_tokens == 0);
    auto t = load_tokenizer((dir / "json"));
    const auto train = read_ids(dir.path / "json" / "train.bin", 2);
    CHECK(t->decode(std::vector<int32_t>(train.begin(), train.end())) == a + b);
    auto expected = t->encode(a);
    const auto eb = t->encode(b);
    expected.insert(expected.end(), eb.begin(), eb.end());
    CHECK(std::vector<int32_t>(train.begin(), train.end()) == expected);
  }

  // Usage errors exit with 2.
  CHECK(run_tool("--input " + (dir / "missing") + " --out " + (dir / "x"), &out) == 2);
  CHECK(contains(out, "does not exist"));
  CHECK(run_tool("--input " + (dir / "in") + " --out " + (dir / "x") + " --tokenizer wordpiece", &out) == 2);
  CHECK(run_tool("--input " + (dir / "in/c.dat") + " --out " + (dir / "x"), &out) == 2);
  CHECK(contains(out, "not UTF-8 text"));
  CHECK(run_tool("--input " + (dir / "in") + " --out " + (dir / "x") + " --val-fraction 1.5", &out) == 2);
  CHECK(run_tool("--input " + (dir / "in") + " --out " + (dir / "x") + " --tokenizer bpe --vocab-size 10", &out) == 2);
  CHECK(run_tool("--input " + (dir / "in") + " --out " + (dir / "x") + " --vocab " + (dir / "v.json"), &out) == 2);
  CHECK(run_tool("--bogus", &out) == 2);
  CHECK(run_tool("--help", &out) == 0);
}

// Document boundaries: one document per file, per .jsonl line, or per --separator run (the fortune files'
// "%" lines), each ended by the document token and counted in meta.json; byte counts exclude the tokens.
TEST_CASE("dew-tokenize records documents: files, .jsonl lines, separator lines, the document token ends each") {
  TempDir dir("docs");
  fs::create_directories(dir.path / "in");
  write_file(dir.path / "in" / "a.txt", "first fortune\n%\nsecond one\nhas two lines\n%\n%\nthird\n");
  write_file(dir.path / "in" / "b.jsonl",
             "{\"text\": \"json one\"}\n\n{\"text\": \"json \\u00e9 two\", \"id\": 7}\n{\"text\": \"%\"}\n");
  std::string out;
  REQUIRE(run_tool("--input " + (dir / "in") + " --out " + (dir / "byte") + " --val-fraction 0 --separator %", &out) ==
          0);
  const std::vector<std::string> docs = {"first fortune\n", "second one\nhas two lines\n", "third\n", "json one",
                                         "json \xC3\xA9 two", "%"};
  std::string stream;
  int64_t text_bytes = 0;
  for (const auto& d : docs) stream += d + "\xff", text_bytes += int64_t(d.size());
  {
    const TokenMeta m = read_token_meta((dir / "byte"));
    CHECK(m.eos_id == 255);
    CHECK(m.documents == 6);
    CHECK(m.train_tokens == int64_t(stream.size()));
    CHECK(m.train_bytes == text_bytes);  // the document tokens carry no text
    CHECK(read_file(dir.path / "byte" / "train.bin") == stream);
    CHECK(contains(out, "6 document(s) (6 marked)"));
  }
  // between: separators only; none: no boundaries recorded.
  REQUIRE(run_tool("--input " + (dir / "in/a.txt") + " --out " + (dir / "between") +
                       " --val-fraction 0 --separator % --eos-between-files",
                   &out) == 0);
  CHECK(read_file(dir.path / "between" / "train.bin") == "first fortune\n\xffsecond one\nhas two lines\n\xffthird\n");
  CHECK(read_token_meta((dir / "between")).documents == 3);
  REQUIRE(
      run_tool("--input " + (dir / "in/a.txt") + " --out " + (dir / "none") + " --val-fraction 0 --document-token none",
               &out) == 0);
  CHECK(read_token_meta((dir / "none")).documents == 0);
  CHECK(read_file(dir.path / "none" / "train.bin") == read_file(dir.path / "in" / "a.txt"));
  // A bad .jsonl line is one usage error naming the line.
  write_file(dir.path / "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  CHECK(run_tool("--input " + (dir / "bad.jsonl") + " --out " + (dir / "bad"), &out) == 2);
  CHECK(contains(out, "line 2"));
  CHECK(run_tool("--input " + (dir / "in") + " --out " + (dir / "bad2") + " --document-token sometimes", &out) == 2);
}
#endif

// ================================================================ the tokens source
#ifdef DEW_TOKENS_PLUGIN_PATH
namespace {
std::shared_ptr<DataSource> tokens_source(std::map<std::string, std::string> o) {
  if (!Registry::global().contains(DataSource::kind, "tokens")) Registry::global().load(DEW_TOKENS_PLUGIN_PATH);
  return Registry::global().create<DataSource>("tokens", Options(std::move(o), "data"));
}
}  // namespace

TEST_CASE("tokens source: windows are the file's ids, stride, splits, dtypes") {
  TempDir dir("src");
  const auto train = iota_ids(0, 100), val = iota_ids(100, 30);
  make_token_dir(dir.path / "u16", "uint16", 1000, train, val);
  auto s = tokens_source({{"path", (dir / "u16")}, {"seq_len", "8"}, {"split", "train"}});
  CHECK(s->size() == (100 - 9) / 8 + 1);
  for (int64_t i = 0; i < s->size(); ++i) {
    const auto t = text_of(s->get(i));
    REQUIRE(t.size() == 9);
    for (int64_t k = 0; k < 9; ++k) CHECK(t[size_t(k)] == int32_t(train[size_t(i * 8 + k)]));
  }
  CHECK(s->identity() == "tokens:" + (fs::weakly_canonical(dir.path / "u16") / "train.bin").string());
  error_of([&] { s->get(s->size()); }, ErrorKind::runtime);

  auto strided = tokens_source({{"path", (dir / "u16")}, {"seq_len", "8"}, {"stride", "3"}, {"split", "train"}});
  CHECK(strided->size() == (100 - 9) / 3 + 1);
  const auto last = text_of(strided->get(strided->size() - 1));
  CHECK(last.front() == 90);
  CHECK(last.back() == 98);

  auto v = tokens_source({{"path", (dir / "u16")}, {"seq_len", "8"}, {"split", "val"}});
  CHECK(v->size() == 3);
  CHECK(text_of(v->get(0)).front() == 100);
  CHECK(contains(v->identity(), "val.bin"));

  // uint8 and uint32 (ids above 65535).
  make_token_dir(dir.path / "u8", "uint8", 256, iota_ids(200, 50), iota_ids(0, 10));
  CHECK(text_of(tokens_source({{"path", (dir / "u8")}, {"seq_len", "4"}})->get(1)) ==
        std::vector<int32_t>{204, 205, 206, 207, 208});
  make_token_dir(dir.path / "u32", "uint32", 70000, iota_ids(69990, 10), iota_ids(0, 10));
  CHECK(text_of(tokens_source({{"path", (dir / "u32")}, {"seq_len", "3"}})->get(2)) ==
        std::vector<int32_t>{69996, 69997, 69998, 69999});

  // Through the loader: a [data] section with the source's keys.
  Options section(
      {{"source", "tokens"}, {"path", (dir / "u16")}, {"seq_len", "8"}, {"batch_size", "4"}, {"shuffle", "false"}},
      "data");
  tokens_source({{"path", (dir / "u16")}, {"seq_len", "8"}});  // loads the plugin
  auto loader = make_loader(section, "train", 0);
  const HostBatch batch = loader->next();
  const HostArray& text = batch.at("text");
  CHECK(text.shape == Shape{4, 9});
  CHECK(text.as<int32_t>()[9] == 8);  // row 1 starts at token 8
}

TEST_CASE("tokens source refuses files that disagree with meta.json") {
  TempDir dir("srcbad");
  make_token_dir(dir.path, "uint16", 1000, iota_ids(0, 100), iota_ids(100, 30));
  const std::string file = (fs::weakly_canonical(dir.path) / "train.bin").string();

  // meta.json says more tokens than the file holds
  TokenMeta m = read_token_meta(dir.str());
  m.train_tokens = 101;
  write_token_meta(m, dir.str());
  CHECK(contains(error_of([&] {
                   tokens_source({{"path", dir.str()}, {"seq_len", "8"}});
                 }),
                 "'" + file + "' holds 200 bytes, meta.json says 101 tokens of uint16 (202 bytes)"));
  m.train_tokens = 100;
  write_token_meta(m, dir.str());
  tokens_source({{"path", dir.str()}, {"seq_len", "8"}});

  // a truncated file
  fs::resize_file(file, 151);
  CHECK(contains(error_of([&] { tokens_source({{"path", dir.str()}, {"seq_len", "8"}}); }), "holds 151 bytes"));
  write_bin(file, iota_ids(0, 100), 2);

  // seq_len larger than the split
  CHECK(contains(error_of([&] {
                   tokens_source({{"path", dir.str()}, {"seq_len", "30"}, {"split", "val"}});
                 }),
                 "too large for the val split"));
  tokens_source({{"path", dir.str()}, {"seq_len", "29"}, {"split", "val"}});

  // missing pieces and bad options
  fs::remove(dir.path / "val.bin");
  CHECK(contains(error_of([&] {
                   tokens_source({{"path", dir.str()}, {"seq_len", "8"}, {"split", "val"}});
                 }),
                 "val.bin' does not exist"));
  CHECK(contains(error_of([&] { tokens_source({{"path", (dir / "none")}, {"seq_len", "8"}}); }), "does not exist"));
  CHECK(contains(error_of([&] { tokens_source({{"seq_len", "8"}}); }), "'data.path'"));
  CHECK(contains(error_of([&] { tokens_source({{"path", dir.str()}}); }), "'data.seq_len'"));
  CHECK(contains(error_of([&] { tokens_source({{"path", dir.str()}, {"seq_len", "0"}}); }), "positive"));
  CHECK(contains(error_of([&] {
                   tokens_source({{"path", dir.str()}, {"seq_len", "8"}, {"split", "test"}});
                 }),
                 "train or val"));

  // an id outside the vocab is found when read
  write_bin(file, std::vector<uint32_t>(100, 1000), 2);
  auto s = tokens_source({{"path", dir.str()}, {"seq_len", "8"}});
  CHECK(contains(error_of([&] { s->get(0); }, ErrorKind::runtime), "vocab_size 1000"));
}

// pack = true: the same windows, with the documents each row cuts as segment ids (1, 2, ... per row) and
// positions restarting at each document (and at the row start). A document is read as [the document token
// that ended the previous one, its text], so the token that ends document d opens document d + 1 (the
// first document has no start token). Checked against the documents' own offsets in the stream, not
// against the source's scan for the document token.
TEST_CASE("tokens source pack = true: segment ids and positions of the documents each row cuts") {
  TempDir dir("pack");
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back(std::string(size_t(1 + (i * 7) % 23), char('a' + i % 26)));
  auto tok = make_byte_tokenizer();
  write_token_corpus(*tok, docs, (dir / "c"), 0.0, DocumentMarks::end);
  std::vector<int64_t> doc_of;  // the document each stream token starts or belongs to as an input
  std::vector<int64_t> start_of;  // where each document (its start token) begins in the stream
  for (size_t d = 0; d < docs.size(); ++d) {
    start_of.push_back(d == 0 ? 0 : int64_t(doc_of.size()) - 1);
    doc_of.insert(doc_of.end(), docs[d].size(), int64_t(d));
    doc_of.push_back(int64_t(d) + 1);  // the 0xFF that ends document d starts document d + 1
  }
  start_of.push_back(int64_t(doc_of.size()) - 1);
  const int64_t seq = 16;
  auto plain = tokens_source({{"path", (dir / "c")}, {"seq_len", "16"}});
  auto packed = tokens_source({{"path", (dir / "c")}, {"seq_len", "16"}, {"pack", "true"}});
  REQUIRE(packed->size() == plain->size());
  int64_t rows_from_a_start_token = 0;  // the case of a row whose first token is a document token
  for (int64_t i = 0; i < packed->size(); ++i) {
    const Record r = packed->get(i);
    CHECK(text_of(r) == text_of(plain->get(i)));  // the same rows: nothing padded or dropped
    rows_from_a_start_token += i > 0 && text_of(r)[0] == 255;
    REQUIRE(r.count("text_segment_ids") == 1);
    const HostArray& seg = r.at("text_segment_ids");
    const HostArray& pos = r.at("text_positions");
    REQUIRE(seg.shape == Shape{seq + 1});
    REQUIRE(pos.shape == Shape{seq + 1});
    const int64_t row = i * seq;
    for (int64_t k = 0; k <= seq; ++k) {
      const int64_t j = row + k, d = doc_of[size_t(j)];
      CHECK(seg.as<int32_t>()[k] == int32_t(d - doc_of[size_t(row)] + 1));
      CHECK(pos.as<int32_t>()[k] == int32_t(j - std::max(start_of[size_t(d)], row)));
    }
  }
  CHECK(rows_from_a_start_token > 0);
  CHECK(plain->get(0).count("text_segment_ids") == 0);
  // Through the loader (shuffled, past one epoch: the reshuffle too) packed batches are the unpacked
  // batches' rows in the same order: packing changes the masks, not the data order.
  auto loader_of = [&](const char* pack) {
    Options d({{"source", "tokens"}, {"path", (dir / "c")}, {"seq_len", "16"}, {"batch_size", "3"}, {"pack", pack}},
              "data");
    return make_loader(d, "train", 7);
  };
  auto ints = [](const HostArray& a) { return std::vector<int32_t>(a.as<int32_t>(), a.as<int32_t>() + a.numel()); };
  auto lp = loader_of("true"), lu = loader_of("false");
  for (int64_t k = 0; k < packed->size(); ++k) {
    const HostBatch bp = lp->next(), bu = lu->next();
    REQUIRE(bp.count("text_segment_ids") == 1);
    CHECK(bu.count("text_segment_ids") == 0);
    CHECK(ints(bp.at("text")) == ints(bu.at("text")));
  }
  // A folder without document boundaries refuses pack, in one line.
  write_token_corpus(*tok, docs, (dir / "plain"), 0.0, DocumentMarks::none);
  const std::string e = error_of([&] {
    tokens_source({{"path", (dir / "plain")}, {"seq_len", "8"}, {"pack", "true"}});
  });
  CHECK(contains(e, "needs document boundaries"));
  CHECK(e.find('\n') == std::string::npos);
}
#endif

// ================================================================ speed
TEST_CASE("BPE speed: 2 MB of text trains a vocab of 1024 well within 30 s") {
  std::vector<std::string> texts;
  size_t bytes = 0;
  const fs::path fortunes = "/usr/share/games/fortunes";
  std::error_code ec;
  if (fs::is_directory(fortunes, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(fortunes))
      if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string s = read_file(f);
      if (bytes >= 2'000'000 || s.find('\0') != std::string::npos || !is_valid_utf8(s)) continue;
      bytes += s.size();
      texts.push_back(std::move(s));
    }
  }
  const std::string source = texts.empty() ? "generated" : "fortunes";
  if (bytes < 2'000'000) {
    texts.push_back(generated_text(2'000'000 - bytes, 17));
    bytes = 2'000'000;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto t = train_bpe(texts, 1024);
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t1 = std::chrono::steady_clock::now();
  size_t tokens = 0;
  for (const auto& s : texts) tokens += t->encode(s).size();
  const double encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  MESSAGE("BPE on ", bytes, " bytes (", source, "): trained vocab 1024 in ", train_s, " s; encoded in ", encode_s,
          " s to ", tokens, " tokens");
  CHECK(t->vocab_size() == 1024);
  CHECK(train_s < 30.0);
  CHECK(encode_s < 30.0);
  CHECK(tokens < bytes / 2);
}
