// tests/text/test_hf_tokenizer.cpp — tokenizer.json styles beyond GPT-2: Llama 3 / Qwen2 (a Split
// pre-tokenizer before ByteLevel, NFC, a BOS template) and Llama 2 / Mistral (SentencePiece converted:
// byte_fallback BPE over characters with "▁"), plus NFC normalization and refusals by field name.
//
// The fixtures are tiny hand-made tokenizer.json files; the Python `tokenizers` package is not
// installed, so every expected id is derived by hand from the vocab and merge ranks, in the comments.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <dew/error.hpp>
#include <dew/tokenizer.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "temp_dir.hpp"

namespace fs = std::filesystem;
using namespace dew;
using Ids = std::vector<int32_t>;
using V = std::vector<std::string>;

namespace {

using dew_test::TempDir;

std::string write(const TempDir& d, const std::string& name, const std::string& content) {
  const fs::path p = d.path / name;
  std::ofstream out(p, std::ios::binary);
  out << content;
  REQUIRE(out.good());
  return p.string();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::usage);
    return e.what();
  }
  FAIL("no dew::Error was thrown");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

// GPT-2's bytes_to_unicode, written out again: printable bytes map to themselves, the others to 256+.
std::string mapped(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    uint32_t cp = b;
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable) {
      uint32_t n = 256;
      for (int c = 0; c < b; ++c)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++n;
      cp = n;
    }
    if (cp < 0x80) {
      out += char(cp);
    } else {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

const char* kLlama3Re =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Re =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// ---- byte-level fixture (Llama 3 / Qwen2 layout) ----
// ids 0..255: the bytes (id = byte value). Merges, in rank order, and the ids they make:
//   r0 " t" 256, r1 "he" 257, r2 " t"+"he" = " the" 258, r3 "12" 259, r4 "12"+"3" = "123" 260,
//   r5 "'s" 261, r6 "\n\n" 262, r7 "  " 263, r8 "é" (C3 A9) 264, r9 "ca" 265, r10 "'S" 269.
// Added tokens (not in model.vocab, as in Llama 3): 266 <|begin_of_text|>, 267 <|end_of_text|>,
// 268 <|im_start|>.
std::string byte_level_json(const std::string& pattern, const std::string& normalizer, const std::string& post,
                            const std::string& model_extra = "",
                            const std::string& decoder = R"({"type": "ByteLevel"})") {
  std::string vocab;
  for (int b = 0; b < 256; ++b)
    vocab += (b ? ", " : "") + quote(mapped(std::string(1, char(b)))) + ": " + std::to_string(b);
  const std::vector<std::pair<std::string, std::string>> merges = {
      {" ", "t"},   {"h", "e"}, {" t", "he"},     {"1", "2"}, {"12", "3"}, {"'", "s"},
      {"\n", "\n"}, {" ", " "}, {"\xC3", "\xA9"}, {"c", "a"}, {"'", "S"}};
  const int ids[] = {256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 269};
  std::string ms;
  for (size_t i = 0; i < merges.size(); ++i) {
    vocab += ", " + quote(mapped(merges[i].first + merges[i].second)) + ": " + std::to_string(ids[i]);
    ms += (i ? ", " : "") + quote(mapped(merges[i].first) + " " + mapped(merges[i].second));
  }
  auto added = [](int id, const char* c) {
    return std::string(R"({"id": )") + std::to_string(id) + R"(, "content": ")" + c +
           R"(", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})";
  };
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)" +
         added(266, "<|begin_of_text|>") + ", " + added(267, "<|end_of_text|>") + ", " + added(268, "<|im_start|>") +
         R"(], "normalizer": )" + normalizer +
         R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
         quote(pattern) +
         R"(}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}, "post_processor": )" +
         post + R"(, "decoder": )" + decoder +
         R"(, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true)" +
         model_extra + R"(, "vocab": {)" + vocab + R"(}, "merges": [)" + ms + "]}}";
}

const std::string kLlama3Post =
    R"({"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}, {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [266], "tokens": ["<|begin_of_text|>"]}}}]})";
const std::string kQwenPost =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})";

// ---- SentencePiece fixture (Llama 2 / Mistral layout) ----
// 0 <unk>, 1 <s>, 2 </s>, 3 + b: <0xNN> for byte b (Llama 2's layout), then the characters
// 259 "▁", 260 t, 261 h, 262 e, 263 l, 264 o, 265 H, 266 w, 267 r, 268 d, 269 é, and merges in rank order:
//   r0 ▁+t 270, r1 h+e 271, r2 ▁t+he 272, r3 l+l 273, r4 e+ll 274, r5 H+ell 275, r6 Hell+o 276,
//   r7 ▁+Hello 277, r8 ▁+w 278, r9 o+r 279, r10 ▁w+or 280, r11 l+d 281, r12 ▁wor+ld 282, r13 ▁+▁ 283,
//   r14 ▁+é 284.
const std::string kMark = "\xE2\x96\x81";
std::string sp_json(const std::string& normalizer, const std::string& pre, const std::string& decoder_tail = "",
                    int drop_byte = -1) {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    if (b != drop_byte) vocab += ", " + quote(hex) + ": " + std::to_string(3 + b);
  }
  const V chars = {kMark, "t", "h", "e", "l", "o", "H", "w", "r", "d", "\xC3\xA9"};
  for (size_t i = 0; i < chars.size(); ++i) vocab += ", " + quote(chars[i]) + ": " + std::to_string(259 + i);
  const std::vector<std::pair<std::string, std::string>> merges = {
      {kMark, "t"},        {"h", "e"},    {kMark + "t", "he"},   {"l", "l"},     {"e", "ll"},
      {"H", "ell"},        {"Hell", "o"}, {kMark, "Hello"},      {kMark, "w"},   {"o", "r"},
      {kMark + "w", "or"}, {"l", "d"},    {kMark + "wor", "ld"}, {kMark, kMark}, {kMark, "\xC3\xA9"}};
  std::string ms;
  for (size_t i = 0; i < merges.size(); ++i) {
    vocab += ", " + quote(merges[i].first + merges[i].second) + ": " + std::to_string(270 + i);
    ms += (i ? ", " : "") + quote(merges[i].first + " " + merges[i].second);
  }
  auto added = [](int id, const char* c) {
    return std::string(R"({"id": )") + std::to_string(id) + R"(, "content": ")" + c +
           R"(", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})";
  };
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)" + added(0, "<unk>") + ", " +
         added(1, "<s>") + ", " + added(2, "</s>") + R"(], "normalizer": )" + normalizer + R"(, "pre_tokenizer": )" +
         pre +
         R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})" +
         R"(, "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": ")" + kMark +
         R"("}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"})" + decoder_tail +
         R"(]}, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "vocab": {)" +
         vocab + R"(}, "merges": [)" + ms + "]}}";
}
const std::string kStrip = R"(, {"type": "Strip", "content": " ", "start": 1, "stop": 0})";
const std::string kLegacyNormalizer = R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": ")" +
                                      kMark + R"("}, {"type": "Replace", "pattern": {"String": " "}, "content": ")" +
                                      kMark + R"("}]})";
const std::string kMetaspace =
    R"({"type": "Metaspace", "replacement": ")" + kMark + R"(", "prepend_scheme": "first", "split": false})";

std::vector<std::string> samples() {
  return {"",
          "Hello world",
          " the",
          "Hello  world\n\n",
          "it's IT'S 12345",
          "café naïve 日本語",
          "a\r\n\tb  ",
          "x.\n\ny",
          "😀 emoji 👍🏽",
          "   ",
          "<|im_start|>",
          "(see $100)"};
}

}  // namespace

// ================================================================ pre-tokenizer
TEST_CASE("pretokenize_llama3 cuts as Llama 3's and Qwen2's Split regex do") {
  auto cut = [](std::string_view s, int digits = 3) {
    V out;
    for (auto p : pretokenize_llama3(s, digits)) out.emplace_back(p);
    return out;
  };
  CHECK(cut("Hello world!") == V{"Hello", " world", "!"});
  // (?i:'s|...): case-insensitive contractions, tried before anything else; U+017F folds to 's'.
  CHECK(cut("it's IT'S they'RE don't") == V{"it", "'s", " IT", "'S", " they", "'RE", " don", "'t"});
  CHECK(cut("'sup x'\xC5\xBF") == V{"'s", "up", " x", "'\xC5\xBF"});
  // \p{N}{1,3} (Llama 3) vs \p{N} (Qwen2); a space before a digit is its own piece (\s+ alone).
  CHECK(cut("12345 6") == V{"123", "45", " ", "6"});
  CHECK(cut("12345 6", 1) == V{"1", "2", "3", "4", "5", " ", "6"});
  CHECK(cut("$100") == V{"$", "100"});
  // \s*[\r\n]+ keeps newlines together, up to the last one of a run of white space.
  CHECK(cut("a\n\nb") == V{"a", "\n\n", "b"});
  CHECK(cut("  \n x") == V{"  \n", " x"});
  CHECK(cut("a \n") == V{"a", " \n"});
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*': punctuation takes the newlines after it.
  CHECK(cut("x.\n\ny") == V{"x", ".\n\n", "y"});
  CHECK(cut("hi!!\r\nok") == V{"hi", "!!\r\n", "ok"});
  // \s+(?!\S): runs of spaces leave their last one to the next word; at the end they stay whole.
  CHECK(cut("a   the") == V{"a", "  ", " the"});
  CHECK(cut("a   ") == V{"a", "   "});
  // [^\r\n\p{L}\p{N}]?\p{L}+: any one non-letter, non-digit, non-newline character prefixes a word.
  CHECK(cut("(café) naïve 日本語") == V{"(café", ")", " naïve", " 日本語"});
  CHECK(cut("\tfoo\nbar") == V{"\tfoo", "\n", "bar"});
  CHECK(cut("").empty());
  // The pieces always cover the text, invalid UTF-8 included.
  const std::string odd = "a\xff\xfe b\xc3 12\n\n\xe2\x82 x";
  std::string joined;
  for (auto p : pretokenize_llama3(odd)) joined += p;
  CHECK(joined == odd);
}

TEST_CASE("normalize_nfc composes, reorders and keeps what is already NFC") {
  CHECK(normalize_nfc("plain ascii") == "plain ascii");
  CHECK(normalize_nfc("cafe\xCC\x81") == "caf\xC3\xA9");               // e + U+0301 -> é
  CHECK(normalize_nfc("caf\xC3\xA9") == "caf\xC3\xA9");                // already NFC
  CHECK(normalize_nfc("e\xCC\x82\xCC\xA3") == "\xE1\xBB\x87");         // e U+0302 U+0323 -> reorder -> U+1EC7
  CHECK(normalize_nfc("\xE2\x84\xAB") == "\xC3\x85");                  // U+212B ANGSTROM SIGN -> U+00C5
  CHECK(normalize_nfc("\xE1\x84\x80\xE1\x85\xA1") == "\xEA\xB0\x80");  // Hangul L + V -> U+AC00
  CHECK(normalize_nfc("\xEA\xB0\x80\xE1\x86\xA8") == "\xEA\xB0\x81");  // LV + T -> U+AC01
  CHECK(normalize_nfc("\xCC\x81"
                      "a") ==
        "\xCC\x81"
        "a");  // a leading mark stays
  CHECK(normalize_nfc("\xff"
                      "e\xCC\x81") == "\xff\xC3\xA9");  // invalid byte kept
}

// ================================================================ Llama 3 / Qwen2
TEST_CASE("Llama 3 style tokenizer.json: Split pattern, ByteLevel, BOS template") {
  TempDir d;
  auto t = load_hf_tokenizer_json(write(d, "llama3.json", byte_level_json(kLlama3Re, "null", kLlama3Post)));
  CHECK(t->vocab_size() == 270);
  CHECK(t->eos_id() == 267);  // <|end_of_text|>
  // Every encode starts with <|begin_of_text|> (266), from the TemplateProcessing post-processor.
  CHECK(t->encode("") == Ids{266});
  // "123" "45": r3 1+2, r4 12+3 -> 260; "4" "5" stay bytes 52 53.
  CHECK(t->encode("12345") == Ids{266, 260, 52, 53});
  // "it" "'s" " IT" "'S": i t = 105 116, 's r5 261, " IT" = 32 73 84 (no merge), 'S r10 269.
  CHECK(t->encode("it's IT'S") == Ids{266, 105, 116, 261, 32, 73, 84, 269});
  // "\n\n" is one piece -> r6 262 (GPT-2's pattern would cut it in two and give 10 10).
  CHECK(t->encode("a\n\nb") == Ids{266, 97, 262, 98});
  CHECK(t->encode("x.\n\ny") == Ids{266, 120, 46, 262, 121});  // ".\n\n": '.' then r6
  CHECK(t->encode("  \n x") == Ids{266, 263, 10, 32, 120});    // "  \n": r7 "  " then 10; " x"
  // "a" "  " " the": r7 263; " the" = r0 " t", r1 "he", r2 -> 258. At the end the run stays whole:
  // "   " -> r7 on the leftmost pair -> 263 32.
  CHECK(t->encode("a   the") == Ids{266, 97, 263, 258});
  CHECK(t->encode("a   ") == Ids{266, 97, 263, 32});
  // "café": c a r9 265, f 102, é (C3 A9) r8 264. No normalizer: e + U+0301 stays e, CC 81 (U+0301 is
  // not a letter: its own piece).
  CHECK(t->encode("café") == Ids{266, 265, 102, 264});
  CHECK(t->encode("cafe\xCC\x81") == Ids{266, 265, 102, 101, 204, 129});
  // Added tokens are cut out first, anywhere in the text.
  CHECK(t->encode("a<|im_start|>b<|end_of_text|>") == Ids{266, 97, 268, 98, 267});
  // decode drops the BOS it added (only at the start), and is lossless.
  CHECK(t->decode({266, 105, 116, 261}) == "it's");
  CHECK(t->decode({105, 266}) == "i<|begin_of_text|>");
  CHECK(t->token_bytes(258) == " the");
  for (const std::string& s : samples()) CHECK(t->decode(t->encode(s)) == s);
  // Saved: the same file (not rewritten in GPT-2's form), which loads to the same tokenizer.
  save_tokenizer_json(*t, (d.path / "saved.json").string());
  auto u = load_hf_tokenizer_json((d.path / "saved.json").string());
  for (const std::string& s : samples()) CHECK(u->encode(s) == t->encode(s));
}

TEST_CASE("Qwen2 style tokenizer.json: single digits, NFC, no BOS") {
  TempDir d;
  auto t = load_hf_tokenizer_json(write(d, "qwen2.json", byte_level_json(kQwen2Re, R"({"type": "NFC"})", kQwenPost)));
  CHECK(t->encode("") == Ids{});
  // \p{N}: one digit a piece, so r3/r4 never apply.
  CHECK(t->encode("12345") == Ids{49, 50, 51, 52, 53});
  // NFC first: e + U+0301 -> é (C3 A9) -> r8 264.
  CHECK(t->encode("cafe\xCC\x81") == Ids{265, 102, 264});
  CHECK(t->encode("café") == Ids{265, 102, 264});
  CHECK(t->encode("<|im_start|>it's") == Ids{268, 105, 116, 261});
  for (const std::string& s : samples()) CHECK(t->decode(t->encode(s)) == normalize_nfc(s));
  CHECK(t->decode(t->encode("cafe\xCC\x81")) == "caf\xC3\xA9");
}

// ================================================================ Llama 2 / Mistral
TEST_CASE("Llama 2 style tokenizer.json: Prepend + Replace normalizer, byte fallback, BOS, Strip") {
  TempDir d;
  auto t = load_hf_tokenizer_json(write(d, "llama2.json", sp_json(kLegacyNormalizer, "null", kStrip)));
  CHECK(t->vocab_size() == 285);
  CHECK(t->eos_id() == 2);
  // "▁Hello▁world": r3 ll, r4 ell, r5 Hell, r6 Hello, r7 ▁Hello 277; r8 ▁w, r9 or, r10 ▁wor, r11 ld,
  // r12 ▁world 282. BOS <s> 1 first.
  CHECK(t->encode("Hello world") == Ids{1, 277, 282});
  CHECK(t->decode({1, 277, 282}) == "Hello world");  // BOS dropped, the prepended space stripped
  // " the" -> "▁▁the": ranks, not position: r0 joins the second ▁ with t (▁▁ is r13, later), then
  // r1 he, r2 ▁the 272; the first ▁ is 259.
  CHECK(t->encode(" the") == Ids{1, 259, 272});
  CHECK(t->decode(t->encode(" the")) == " the");
  // Two spaces: "▁Hello▁▁world" -> ▁Hello 277, ▁ 259, ▁world 282.
  CHECK(t->encode("Hello  world") == Ids{1, 277, 259, 282});
  // Byte fallback: "i" and "\n" are not pieces -> <0x69> = 3 + 0x69 = 108, <0x0A> = 13.
  CHECK(t->encode("Hi\n") == Ids{1, 259, 265, 108, 13});
  CHECK(t->decode({1, 259, 265, 108, 13}) == "Hi\n");
  // é is a piece (r14 ▁é 284); 日 (E6 97 A5) is not: 3 + 0xE6, 3 + 0x97, 3 + 0xA5.
  CHECK(t->encode("é日") == Ids{1, 284, 233, 154, 168});
  // Special tokens in the middle: each segment gets its own "▁" (Prepend, as `tokenizers` does), so
  // "the" after </s> is ▁the 272, and decodes with a space before it, as Hugging Face's does.
  CHECK(t->encode("Hello</s>the") == Ids{1, 277, 2, 272});
  CHECK(t->decode({1, 277, 2, 272}) == "Hello</s> the");
  // Without the BOS the ids are a continuation: no space is stripped (streaming = decode).
  CHECK(t->decode({282}) == " world");
  CHECK(t->token_bytes(282) == " world");
  CHECK(t->token_bytes(13) == "\n");
  CHECK(t->encode("") == Ids{1});
  for (const std::string& s : {"Hello world", " the", "Hello  world\n\n", "é日 😀", "a\r\n\tb  ", "   ", "x"})
    CHECK(t->decode(t->encode(s)) == s);
  // Invalid UTF-8: each bad byte is a character of its own, byte-fallen-back, and comes back.
  CHECK(t->decode(t->encode("H\xff\xc3")) == "H\xff\xc3");
  // Saved: the file itself.
  save_tokenizer_json(*t, (d.path / "saved.json").string());
  CHECK(load_hf_tokenizer_json((d.path / "saved.json").string())->encode("Hello</s>the") == Ids{1, 277, 2, 272});
}

TEST_CASE("Mistral / newer Llama style: Metaspace pre-tokenizer, prepend_scheme first") {
  TempDir d;
  auto t = load_hf_tokenizer_json(write(d, "metaspace.json", sp_json("null", kMetaspace, kStrip)));
  CHECK(t->encode("Hello world") == Ids{1, 277, 282});
  // first: only the segment at the start gets "▁": "the" after </s> is t 260, he 271 (r1).
  CHECK(t->encode("Hello</s>the") == Ids{1, 277, 2, 260, 271});
  CHECK(t->decode(t->encode("Hello</s>the")) == "Hello</s>the");
  // Metaspace does not prepend to a text that starts with "▁" already: " the" -> "▁the" 272, which
  // decodes (Strip) to "the", as Hugging Face's does.
  CHECK(t->encode(" the") == Ids{1, 272});
  CHECK(t->decode({1, 272}) == "the");
  // split true: words cut before every "▁"; with these merges, the same ids.
  auto s = load_hf_tokenizer_json(write(
      d, "split.json",
      sp_json("null",
              R"({"type": "Metaspace", "replacement": ")" + kMark + R"(", "prepend_scheme": "always", "split": true})",
              kStrip)));
  CHECK(s->encode("Hello  world") == Ids{1, 277, 259, 282});
  // Split at "▁": "▁▁" can not form across words, "▁" + "▁the" stay 259 272 either way.
  CHECK(s->encode("Hello</s>the") == Ids{1, 277, 2, 272});  // always: every segment gets "▁"
}

// ================================================================ refusals
TEST_CASE("tokenizer.json: what dew does not implement is refused by field") {
  TempDir d;
  auto refused = [&](const std::string& json) {
    return error_of([&] { load_hf_tokenizer_json(write(d, "bad.json", json)); });
  };
  // An unknown Split pattern is quoted.
  const std::string other = R"(\p{L}+|\p{N}+|\s+)";
  const std::string e1 = refused(byte_level_json(other, "null", "null"));
  CHECK(contains(e1, "pre_tokenizer.Split.pattern"));
  CHECK(contains(e1, R"(\\p{L}+|\\p{N}+|\\s+)"));
  CHECK(contains(refused(byte_level_json(kLlama3Re, R"({"type": "NFKC"})", "null")), "normalizer"));
  CHECK(contains(refused(byte_level_json(kLlama3Re, "null", "null", R"(, "fancy": 1)")), "model.fancy"));
  CHECK(contains(refused(byte_level_json(kLlama3Re, "null", "null", "", R"({"type": "WordPiece"})")), "decoder"));
  CHECK(contains(refused(byte_level_json(kLlama3Re, "null", R"({"type": "RobertaProcessing"})")), "post_processor"));
  const std::string eos_after =
      R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|end_of_text|>", "type_id": 0}}], "special_tokens": {}})";
  CHECK(contains(refused(byte_level_json(kLlama3Re, "null", eos_after)), "post_processor.TemplateProcessing.single"));
  std::string lstrip = byte_level_json(kLlama3Re, "null", "null");
  lstrip.replace(lstrip.find(R"("lstrip": false)"), 15, R"("lstrip": true)");
  CHECK(contains(refused(lstrip), "added_tokens[<|begin_of_text|>].lstrip"));
  // SentencePiece style.
  CHECK(contains(
      refused(sp_json(kLegacyNormalizer, "null", R"(, {"type": "Strip", "content": " ", "start": 1, "stop": 1})")),
      "decoder.Strip"));
  CHECK(contains(refused(sp_json(kLegacyNormalizer, "null", kStrip, 0x41)), "<0x41>"));
  CHECK(contains(refused(sp_json("null", "null", kStrip)), "byte_fallback"));
  CHECK(contains(refused(sp_json(R"({"type": "Lowercase"})", "null", kStrip)), "normalizer"));
  CHECK(contains(refused(sp_json("null", R"({"type": "Whitespace"})", kStrip)), "pre_tokenizer"));
  CHECK(contains(
      refused(sp_json("null", R"({"type": "Metaspace", "replacement": "_", "prepend_scheme": "first"})", kStrip)),
      "pre_tokenizer.Metaspace.replacement"));
}

// meta.json's byte counts (bits per byte) are the documents' own bytes: not the start-of-text token a
// tokenizer.json's TemplateProcessing adds to every document (17 bytes of "<|begin_of_text|>" each), nor
// SentencePiece's leading "▁", nor the document token dew puts after each document.
TEST_CASE("write_token_corpus: byte counts are the text's, whatever the tokenizer adds to a document") {
  TempDir d;
  const std::vector<std::string> docs = {"the cat's 123\n", "café ca\n\n", "x", "the the the the the\n"};
  int64_t text_bytes = 0;
  for (const auto& s : docs) text_bytes += int64_t(s.size());
  auto llama3 = load_hf_tokenizer_json(write(d, "llama3.json", byte_level_json(kLlama3Re, "null", kLlama3Post)));
  REQUIRE(llama3->encode("x").front() == 266);  // the fixture adds <|begin_of_text|>
  auto llama2 = load_hf_tokenizer_json(write(d, "llama2.json", sp_json(kLegacyNormalizer, "null", kStrip)));
  for (const Tokenizer* t : {llama3.get(), llama2.get()}) {
    for (DocumentMarks marks : {DocumentMarks::none, DocumentMarks::between, DocumentMarks::end}) {
      const TokenMeta m = write_token_corpus(*t, docs, (d.path / "corpus").string(), 0.0, marks);
      CHECK(m.train_bytes == text_bytes);
      CHECK(m.val_bytes == 0);
    }
    // With a validation split the two halves still add up to the text.
    const TokenMeta m = write_token_corpus(*t, docs, (d.path / "corpus").string(), 0.5, DocumentMarks::end);
    CHECK(m.train_bytes + m.val_bytes == text_bytes);
    CHECK(m.val_bytes > 0);
  }
}
